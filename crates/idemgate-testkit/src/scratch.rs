//! Throwaway databases for benchmarks and tests: a fresh database on a PostgreSQL or MariaDB
//! server (or a SQLite file in a temporary folder), migrated, and dropped afterwards.
//!
//! It needs an admin URL that may create databases. It must never be pointed at a production
//! server's real database: it only ever creates and drops databases named `idemgate_scratch_*`.
//!
//! [`galera`](crate::galera) starts a private three-node MariaDB Galera cluster (and HAProxy in front of it),
//! whose admin URLs a scratch database can be created on ([`ScratchDb::create_at`]).

use std::sync::atomic::{AtomicU32, Ordering};

use sqlx::{AnyPool, AssertSqlSafe, Executor};

use sqlx::Row;

use idemgate::store::{Backend, Sql, Store, StoreError, StoreOptions};

/// The admin URLs of the machine's services, as the tests and benchmarks default to them.
pub(crate) const POSTGRES_ADMIN_URL: &str = "postgres://postgres@127.0.0.1:5432/postgres";
pub(crate) const MYSQL_ADMIN_URL: &str = "mysql://root@127.0.0.1:3306/test";

/// The name prefix of every scratch database.
pub(crate) const PREFIX: &str = "idemgate_scratch_";

/// The admin URL for `backend`: `IDEMGATE_TEST_POSTGRES_URL` / `IDEMGATE_TEST_MYSQL_URL`, or
/// the local default.
pub(crate) fn admin_url(backend: Backend) -> Option<String> {
    let (var, default) = match backend {
        Backend::Postgres => ("IDEMGATE_TEST_POSTGRES_URL", POSTGRES_ADMIN_URL),
        Backend::MySql => ("IDEMGATE_TEST_MYSQL_URL", MYSQL_ADMIN_URL),
        Backend::Sqlite => return None,
    };
    Some(std::env::var(var).unwrap_or_else(|_| default.to_owned()))
}

/// A fresh, migrated database.
pub struct ScratchDb {
    pub store: Store,
    pub url: String,
    backend: Backend,
    name: String,
    /// The admin URL it was created on, to drop it with; `None` for SQLite.
    admin: Option<String>,
    _dir: Option<tempfile::TempDir>,
}

static NEXT: AtomicU32 = AtomicU32::new(0);

/// Every table the service's migrations make, sorted, and nothing else: what the tests expect
/// to find in a business database the service has started on (besides the business's own and
/// the claim shards of `dedup.shards`).
pub const SERVICE_TABLES: [&str; 11] = [
    "_sqlx_migrations",
    "archive_lease",
    "archive_run",
    "consumer_event",
    "consumer_instance",
    "dedup_layout",
    "delivery_log",
    "idempotent_record",
    "idempotent_record_archive",
    "reconcile_anomaly",
    "reconcile_run",
];

// A partitioned table once: its partitions (the delivery log's days) are part of it.
static TABLES_POSTGRES: Sql = Sql::new(
    "SELECT CAST(relname AS TEXT) FROM pg_class \
     WHERE relnamespace = CAST(current_schema() AS regnamespace) AND relkind IN ('r', 'p') AND NOT relispartition",
);
static TABLES_MYSQL: Sql = Sql::new(
    "SELECT CAST(table_name AS CHAR) FROM information_schema.tables \
     WHERE table_schema = DATABASE() AND table_type = 'BASE TABLE'",
);
static TABLES_SQLITE: Sql =
    Sql::new("SELECT name FROM sqlite_master WHERE type = 'table' AND name NOT LIKE 'sqlite_%'");

#[derive(Debug, thiserror::Error)]
pub enum ScratchError {
    #[error("{backend} is needed here and is not reachable at {url}: {source}")]
    Unreachable {
        backend: Backend,
        url: String,
        #[source]
        source: sqlx::Error,
    },
    #[error("could not create a scratch database: {0}")]
    Create(#[source] sqlx::Error),
    #[error("could not create a temporary folder: {0}")]
    TempDir(#[source] std::io::Error),
    #[error(transparent)]
    Store(#[from] StoreError),
    #[error("creating the example shop's tables: {0}")]
    Shop(#[source] sqlx::migrate::MigrateError),
}

impl ScratchDb {
    /// Creates a scratch database on `backend`'s server, with the service's tables and the
    /// example shop's, which the tests and benchmarks run.
    pub async fn create(backend: Backend, options: &StoreOptions) -> Result<Self, ScratchError> {
        Self::create_empty(backend, options).await?.migrated().await
    }

    /// This database with the service's tables and the example shop's.
    async fn migrated(self) -> Result<Self, ScratchError> {
        self.store.migrate().await?;
        idemgate_shop::migrate(&self.store).await.map_err(ScratchError::Shop)?;
        Ok(self)
    }

    /// Creates a scratch database on `backend`'s server with no table at all: what a
    /// deployment's new business database is before the service first starts on it.
    pub async fn create_empty(backend: Backend, options: &StoreOptions) -> Result<Self, ScratchError> {
        match admin_url(backend) {
            Some(admin) => Self::create_unmigrated(backend, &admin, options).await,
            None => {
                let dir = tempfile::tempdir().map_err(ScratchError::TempDir)?;
                let url = format!("sqlite://{}?mode=rwc", dir.path().join("idemgate.db").display());
                let store = Store::connect(&url, options).await?;
                Ok(Self { store, url, backend, name: String::new(), admin: None, _dir: Some(dir) })
            }
        }
    }

    /// [`ScratchDb::create`] on the PostgreSQL or MySQL-protocol server that `admin` (a URL
    /// that may create databases) points at.
    pub async fn create_at(
        backend: Backend,
        admin: &str,
        options: &StoreOptions,
    ) -> Result<Self, ScratchError> {
        Self::create_unmigrated(backend, admin, options).await?.migrated().await
    }

    async fn create_unmigrated(
        backend: Backend,
        admin: &str,
        options: &StoreOptions,
    ) -> Result<Self, ScratchError> {
        sqlx::any::install_default_drivers();
        let name = format!(
            "{PREFIX}{}_{}_{}",
            std::process::id(),
            NEXT.fetch_add(1, Ordering::Relaxed),
            rand::random::<u16>()
        );
        let pool = AnyPool::connect(admin).await.map_err(|source| ScratchError::Unreachable {
            backend,
            url: idemgate::store::redact_url(admin),
            source,
        })?;
        pool.execute(AssertSqlSafe(format!("CREATE DATABASE {name}"))).await.map_err(ScratchError::Create)?;
        pool.close().await;
        let base = admin.rsplit_once('/').map(|(b, _)| b).unwrap_or(admin);
        let url = format!("{base}/{name}");
        let store = Store::connect(&url, options).await?;
        Ok(Self { store, url, backend, name, admin: Some(admin.to_owned()), _dir: None })
    }

    /// A second, independent pool on the same database, with `options`: another process, as far
    /// as the database can tell.
    pub async fn second_store(&self, options: &StoreOptions) -> Result<Store, StoreError> {
        Store::connect(&self.url, options).await
    }

    /// The names of the database's tables, sorted; a partitioned table once, by its own name.
    pub async fn tables(&self) -> Result<Vec<String>, sqlx::Error> {
        let sql = match self.backend {
            Backend::Postgres => &TABLES_POSTGRES,
            Backend::MySql => &TABLES_MYSQL,
            Backend::Sqlite => &TABLES_SQLITE,
        };
        let rows = self.store.query(sql).fetch_all(self.store.pool()).await?;
        let mut names = rows.iter().map(|r| r.try_get::<String, _>(0)).collect::<Result<Vec<_>, _>>()?;
        names.sort();
        Ok(names)
    }

    /// The database's name on its server (empty for SQLite).
    pub fn name(&self) -> &str {
        &self.name
    }

    pub fn backend(&self) -> Backend {
        self.backend
    }

    /// Closes the pool and leaves the database (a SQLite file's folder too) in place, for study;
    /// returns its URL, password masked.
    pub async fn keep(mut self) -> String {
        self.store.close().await;
        if let Some(dir) = self._dir.take() {
            let _ = dir.keep();
        }
        idemgate::store::redact_url(&self.url)
    }

    /// Closes the pool and drops the database.
    pub async fn drop_now(self) {
        self.store.close().await;
        if let Some(admin) = &self.admin {
            drop_database(self.backend, admin, &self.name).await;
        }
    }
}

async fn drop_database(backend: Backend, admin: &str, name: &str) {
    let Ok(pool) = AnyPool::connect(admin).await else {
        return;
    };
    if backend == Backend::MySql {
        // MariaDB has no DROP … FORCE: a session left inside a transaction (a test that
        // panicked with its service running) would hold the drop forever. End them first.
        let sessions = sqlx::query("SELECT CAST(ID AS SIGNED) FROM information_schema.PROCESSLIST WHERE DB = ? AND ID <> CONNECTION_ID()")
            .bind(name)
            .fetch_all(&pool)
            .await
            .unwrap_or_default();
        for session in sessions {
            if let Ok(id) = sqlx::Row::try_get::<i64, _>(&session, 0) {
                let _ = pool.execute(AssertSqlSafe(format!("KILL {id}"))).await;
            }
        }
    }
    let sql = match backend {
        Backend::Postgres => format!("DROP DATABASE IF EXISTS {name} WITH (FORCE)"),
        _ => format!("DROP DATABASE IF EXISTS {name}"),
    };
    if let Err(e) = pool.execute(AssertSqlSafe(sql)).await {
        tracing::warn!(error = %e, database = name, "could not drop a scratch database");
    }
    pool.close().await;
}

impl Drop for ScratchDb {
    /// A scratch database not dropped with [`ScratchDb::drop_now`] (a test that panicked) is
    /// dropped here, from a thread with a runtime of its own: the current runtime cannot be
    /// blocked on.
    fn drop(&mut self) {
        let Some(admin) = self.admin.clone() else {
            return;
        };
        if self.store.pool().is_closed() {
            return;
        }
        // The pool is not closed here: closing waits for connections whose return to the pool
        // is a task of the runtime this drop blocks. Dropping the database ends them instead.
        let (backend, name) = (self.backend, self.name.clone());
        let _ = std::thread::spawn(move || {
            let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().ok()?;
            rt.block_on(drop_database(backend, &admin, &name));
            Some(())
        })
        .join();
    }
}
