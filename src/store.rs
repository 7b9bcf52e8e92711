//! The database behind the gate: one connection pool for SQLite, PostgreSQL or MySQL/MariaDB,
//! chosen by the URL's scheme, plus the migrations of each backend.
//!
//! Everything runs through sqlx's `Any` driver so that the gate, the delivery log and the
//! handlers are written once. The price is the `Any` type set (integers, floats, text, bytes):
//! times are stored as epoch milliseconds, flags as SMALLINT. Statements are written with `?`
//! placeholders and renumbered once for PostgreSQL ([`Sql`]); where the dialects really differ
//! (insert-if-absent, transaction start) the module that owns the statement says why.
//!
//! [`galera`] holds what a MariaDB Galera node asks of the service: causal reads on
//! every connection, and the start-up checks of primary keys and auto-increment ids.
//!
//! This module owns connecting and migrating. It must not know about claims or deliveries.

use std::fmt;
use std::time::Duration;

use sqlx::any::{AnyPoolOptions, install_default_drivers};
use sqlx::{AnyConnection, AnyPool, AssertSqlSafe, Executor};

mod backend;
pub mod ddl;
pub mod galera;
pub mod migrations;
mod redact;
mod settings;
mod sql;
mod unique;

pub use backend::Backend;
pub(crate) use backend::DatabaseUrl;
pub(crate) use backend::UnknownScheme;
pub use redact::redact_url;
pub(crate) use settings::DatabaseSettings;
pub use sql::Written;
pub(crate) use sql::insert_if_absent;
pub use sql::values_list;
pub use sql::{AnyQuery, bind_all};
pub use sql::{Arg, Bound, InsertIfAbsent};
pub use sql::{Pad, bind_rows, filtered_insert, number_placeholders, padded, padded_values, placeholders};
pub use sql::{Sql, query, query_built};
pub(crate) use unique::{UniqueKey, Violated, unique_keys};

#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    #[error(transparent)]
    UnknownScheme(#[from] UnknownScheme),
    #[error("could not connect to the {backend} database at {url}")]
    Connect {
        backend: Backend,
        url: String,
        #[source]
        source: sqlx::Error,
    },
    #[error("migrating the {backend} database failed")]
    Migrate {
        backend: Backend,
        #[source]
        source: sqlx::migrate::MigrateError,
    },
    #[error(transparent)]
    Database(#[from] sqlx::Error),
}

crate::labelled::labelled! {
    /// Why a transaction was started again: the kinds of transient conflict [`is_transient`]
    /// accepts, a closed set (a metric label).
    TransientCause {
        /// A deadlock between two transactions of one server.
        Deadlock => "deadlock",
        /// On a Galera node: another node's write set won. The node reports a failed certification
        /// at COMMIT, and a brute-force abort by an applied write set, with the same error (1213,
        /// SQLSTATE 40001, "Deadlock found when trying to get lock") as a local InnoDB deadlock,
        /// which it cannot be told apart from: on a Galera node every 1213 counts here.
        Certification => "certification",
        /// PostgreSQL's serialization failure.
        Serialization => "serialization",
        /// A lock wait that ran to its bound: PostgreSQL's `lock_timeout`, MySQL/MariaDB's
        /// `innodb_lock_wait_timeout` (a claim behind another transaction's uncommitted claim of
        /// the same key, a handler's statement behind a row lock).
        LockWait => "lock_wait",
        /// A busy or locked SQLite file.
        Busy => "busy",
        /// The pool had no connection in time, or a connection broke.
        Connection => "connection",
    }
}

/// The transient conflicts one piece of work was retried after, by cause.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Retries([u32; TransientCause::ALL.len()]);

impl Retries {
    /// Every retry, whatever its cause.
    pub fn count(&self) -> u32 {
        self.0.iter().sum()
    }

    /// The causes with at least one retry, and how many.
    pub fn by_cause(&self) -> impl Iterator<Item = (TransientCause, u32)> + '_ {
        TransientCause::ALL.iter().map(|c| (*c, self.0[c.index()])).filter(|(_, n)| *n > 0)
    }

    /// One retry after `cause`.
    pub(crate) fn of(cause: TransientCause) -> Self {
        let mut retries = Self::default();
        retries.add(cause);
        retries
    }

    fn add(&mut self, cause: TransientCause) {
        self.0[cause.index()] += 1;
    }
}

/// Which server answers a `mysql://` URL. MariaDB and MySQL share a protocol and most of the
/// dialect but part ways on a few statements; the store reads `SELECT VERSION()` once at connect
/// and keeps the answer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MySqlFlavour {
    /// MariaDB 10.5 or later: has `INSERT … RETURNING`.
    MariaDb,
    /// MySQL, or a MariaDB older than 10.5: no `INSERT … RETURNING`.
    MySql,
}

impl MySqlFlavour {
    /// Reads a server's `VERSION()`, such as `10.11.6-MariaDB-0+deb12u1` or `8.0.36`.
    pub(crate) fn from_version(version: &str) -> Self {
        if !is_mariadb(version) {
            return Self::MySql;
        }
        let mut parts = version.split(|c: char| !c.is_ascii_digit()).map(|p| p.parse::<u32>().ok());
        match (parts.next().flatten(), parts.next().flatten()) {
            (Some(major), Some(minor)) if (major, minor) >= (10, 5) => Self::MariaDb,
            _ => Self::MySql,
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            Self::MariaDb => "mariadb",
            Self::MySql => "mysql",
        }
    }
}

/// True when a MySQL-protocol server's `VERSION()` is MariaDB's (`10.11.6-MariaDB-0+deb12u1`,
/// or `5.5.5-10.11.6-MariaDB` through some proxies), whatever its version; MySQL says only
/// its number (`8.0.36`).
fn is_mariadb(version: &str) -> bool {
    version.to_ascii_lowercase().contains("mariadb")
}

/// The connection's server's `VERSION()`.
async fn server_version(conn: &mut AnyConnection) -> Result<String, sqlx::Error> {
    use sqlx::Row;
    conn.fetch_one("SELECT VERSION()").await?.try_get(0)
}

/// A pool on one backend. Cheap to clone.
#[derive(Clone)]
pub struct Store {
    pool: AnyPool,
    backend: Backend,
    /// On `Backend::MySql`, which server it is; `None` on the others.
    mysql_flavour: Option<MySqlFlavour>,
    /// A MariaDB Galera node (`wsrep_on`) answers the URL.
    galera: bool,
    /// An in-memory SQLite database ([`DatabaseUrl::in_memory`]): it lives in this pool only.
    in_memory: bool,
}

impl fmt::Debug for Store {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Store")
            .field("backend", &self.backend)
            .field("mysql_flavour", &self.mysql_flavour)
            .field("galera", &self.galera)
            .finish_non_exhaustive()
    }
}

/// How to open a [`Store`].
#[derive(Debug, Clone)]
pub struct StoreOptions {
    pub max_connections: u32,
    pub acquire_timeout: Duration,
    /// A server-side limit on every statement of the pool's connections (PostgreSQL
    /// `statement_timeout`, MariaDB `max_statement_time`; MySQL's `max_execution_time` bounds
    /// read-only SELECTs only), set when each connection opens. A query abandoned by its caller
    /// then also stops on the server. SQLite has no such limit.
    pub statement_timeout: Option<Duration>,
    /// The longest a statement of the pool's connections waits for a lock before it fails
    /// (see `lock_timeout`), set when each connection opens. `None` leaves the server's own:
    /// forever on PostgreSQL, 50 s on InnoDB, 5 s on SQLite (sqlx's busy timeout).
    pub lock_timeout: Option<Duration>,
    /// The longest a connection's transaction may sit idle, between statements, before the
    /// server ends the session and rolls it back (PostgreSQL
    /// `idle_in_transaction_session_timeout`, MariaDB `idle_transaction_timeout`, in whole
    /// seconds rounded up), set when each connection opens. A client cut off from the server by
    /// the network cannot roll back its open transaction; this is what keeps the server from
    /// holding that transaction's locks (and the claims other instances wait for) until the
    /// operating system gives up on the socket, hours later. MySQL has no such limit; SQLite has
    /// no network. `None` leaves the server's own (none by default).
    pub idle_in_transaction_timeout: Option<Duration>,
}

impl Default for StoreOptions {
    fn default() -> Self {
        Self {
            max_connections: 16,
            acquire_timeout: Duration::from_secs(10),
            statement_timeout: None,
            lock_timeout: None,
            idle_in_transaction_timeout: None,
        }
    }
}

impl Store {
    /// Connects without migrating.
    pub async fn connect(url: &str, options: &StoreOptions) -> Result<Self, StoreError> {
        install_default_drivers();
        let DatabaseUrl { backend, in_memory } = DatabaseUrl::read(url)?;
        let limit = options.statement_timeout;
        let lock_limit = options.lock_timeout.map(|t| lock_timeout(backend, t));
        let idle_limit = options.idle_in_transaction_timeout;
        let pool_options = AnyPoolOptions::new()
            .max_connections(options.max_connections)
            .acquire_timeout(options.acquire_timeout)
            .after_connect(move |conn, _| {
                let lock_limit = lock_limit.clone();
                Box::pin(async move {
                    if let Some(limit) = limit {
                        limit_statements(conn, backend, limit).await?;
                    }
                    if let Some(lock_limit) = lock_limit {
                        conn.execute(AssertSqlSafe(lock_limit)).await?;
                    }
                    if let Some(idle_limit) = idle_limit {
                        limit_idle_transactions(conn, backend, idle_limit).await?;
                    }
                    if backend == Backend::MySql {
                        // Behind a proxy, each connection may reach another node: ask each.
                        galera::prepare_connection(conn).await?;
                    }
                    Ok(())
                })
            });
        let pool = pool_options.connect(url).await.map_err(|source| StoreError::Connect {
            backend,
            url: redact_url(url),
            source,
        })?;
        if backend == Backend::Sqlite {
            // WAL lets readers (the UI, the reconciler) run beside the single writer. The
            // setting is stored in the file, so once is enough.
            pool.execute("PRAGMA journal_mode = WAL").await?;
        }
        let (mysql_flavour, galera) = match backend {
            Backend::MySql => {
                let mut conn = pool.acquire().await?;
                let version = server_version(&mut conn).await?;
                let flavour = MySqlFlavour::from_version(&version);
                let galera = galera::is_node(&mut conn).await?;
                tracing::debug!(%version, flavour = flavour.name(), galera, "connected to a MySQL-protocol server");
                (Some(flavour), galera)
            }
            Backend::Sqlite | Backend::Postgres => (None, false),
        };
        Ok(Self { pool, backend, mysql_flavour, galera, in_memory })
    }

    /// Connects and applies this backend's migrations.
    pub async fn open(url: &str, options: &StoreOptions) -> Result<Self, StoreError> {
        let store = Self::connect(url, options).await?;
        store.migrate().await?;
        Ok(store)
    }

    /// Applies the pending migrations of `migrations/<backend>/`. Applied ones are checked
    /// against their checksums, so an edited migration is refused: they are append-only
    /// ([`migrations`] says how three versions changed their text once, and still validate).
    pub async fn migrate(&self) -> Result<(), StoreError> {
        migrations::service(self.backend)
            .run(&self.pool)
            .await
            .map_err(|source| StoreError::Migrate { backend: self.backend, source })
    }

    pub fn backend(&self) -> Backend {
        self.backend
    }

    /// True when the database is an in-memory SQLite one, which exists in this pool only: a
    /// second pool on its URL would open another, empty database.
    pub(crate) fn is_in_memory(&self) -> bool {
        self.in_memory
    }

    /// On MySQL/MariaDB, which of the two the server is; `None` on SQLite and PostgreSQL.
    pub fn mysql_flavour(&self) -> Option<MySqlFlavour> {
        self.mysql_flavour
    }

    /// True when the server is a MariaDB Galera node: conflicts with other nodes' writes show up
    /// as [`TransientCause::Certification`], and [`galera::check`] applies at start.
    pub(crate) fn is_galera(&self) -> bool {
        self.galera
    }

    /// [`retry_transient`] with this store's causes: on a Galera node a deadlock is a failed
    /// certification.
    pub(crate) async fn retry_transient<T, F: Future<Output = Result<T, sqlx::Error>>>(
        &self,
        limit: u32,
        base_ms: u64,
        attempt: impl FnMut() -> F,
    ) -> (Result<T, sqlx::Error>, Retries) {
        retry_transient(self.galera, limit, base_ms, attempt).await
    }

    /// True when an `INSERT` can return the rows it inserted (`RETURNING`): PostgreSQL,
    /// SQLite and MariaDB 10.5+, not MySQL.
    pub(crate) fn insert_returns_rows(&self) -> bool {
        self.mysql_flavour != Some(MySqlFlavour::MySql)
    }

    /// This store, taking its MySQL-protocol server for `flavour` whatever `VERSION()` said: the
    /// way to run MySQL's statements on MariaDB in tests. No effect on SQLite and PostgreSQL.
    #[doc(hidden)]
    pub fn assuming_mysql_flavour(mut self, flavour: MySqlFlavour) -> Self {
        if self.backend == Backend::MySql {
            self.mysql_flavour = Some(flavour);
        }
        self
    }

    pub fn pool(&self) -> &AnyPool {
        &self.pool
    }

    /// Opens a write transaction with the backend's own begin statement.
    pub async fn begin(&self) -> Result<sqlx::Transaction<'static, sqlx::Any>, sqlx::Error> {
        // sqlx reports every statement it runs as a `sqlx::query` event but `BEGIN`: report it
        // the same way, so that whoever counts statements counts this one too.
        tracing::debug!(target: "sqlx::query", summary = "BEGIN", "begin");
        self.pool.begin_with(self.backend.begin_statement()).await
    }

    /// A query for `sql` in this backend's placeholder style.
    pub fn query(&self, sql: &Sql) -> AnyQuery {
        sqlx::query(sql.text(self.backend))
    }

    /// Inserts one row and returns its generated id: `returning` (the insert with
    /// `RETURNING id`) on PostgreSQL and SQLite, whose drivers report no last-insert id through
    /// `Any`; `plain` and the reported `LAST_INSERT_ID()` on MySQL/MariaDB, which has no
    /// RETURNING. `bind` binds the same values to either.
    pub(crate) async fn insert_returning_id(
        &self,
        returning: &Sql,
        plain: &Sql,
        bind: impl FnOnce(AnyQuery) -> AnyQuery,
    ) -> Result<i64, sqlx::Error> {
        use sqlx::Row;
        match self.backend {
            Backend::Postgres | Backend::Sqlite => {
                bind(self.query(returning)).fetch_one(self.pool()).await?.try_get(0)
            }
            Backend::MySql => bind(self.query(plain))
                .execute(self.pool())
                .await?
                .last_insert_id()
                .ok_or_else(|| sqlx::Error::Protocol("the insert reported no id for the new row".into())),
        }
    }

    pub async fn close(&self) {
        self.pool.close().await;
    }
}

/// The session statement that bounds every later statement of a connection to `limit`, on
/// the servers that have one; `version` is a MySQL-protocol server's `VERSION()`. The value is
/// a number this process formats, never outside text.
fn statement_timeout(backend: Backend, version: Option<&str>, limit: Duration) -> Option<String> {
    match backend {
        Backend::Postgres => Some(format!("SET statement_timeout = {}", limit.as_millis())),
        // MariaDB's limit is in seconds and bounds every statement.
        Backend::MySql if version.is_some_and(is_mariadb) => {
            Some(format!("SET SESSION max_statement_time = {:.3}", limit.as_secs_f64()))
        }
        // MySQL has no max_statement_time: its max_execution_time is in milliseconds and
        // bounds read-only SELECTs only.
        Backend::MySql => Some(format!("SET SESSION max_execution_time = {}", limit.as_millis())),
        Backend::Sqlite => None,
    }
}

/// The session statement that ends a connection whose transaction sits idle longer than
/// `limit` ([`StoreOptions::idle_in_transaction_timeout`]), on the servers that have one;
/// `version` is a MySQL-protocol server's `VERSION()`. The value is a number this process
/// formats, never outside text.
fn idle_transaction_timeout(backend: Backend, version: Option<&str>, limit: Duration) -> Option<String> {
    match backend {
        Backend::Postgres => {
            Some(format!("SET idle_in_transaction_session_timeout = {}", limit.as_millis().max(1)))
        }
        // MariaDB 10.3 and later count it in whole seconds.
        Backend::MySql if version.is_some_and(is_mariadb) => Some(format!(
            "SET SESSION idle_transaction_timeout = {}",
            limit.as_millis().div_ceil(1_000).max(1)
        )),
        Backend::MySql | Backend::Sqlite => None,
    }
}

/// Bounds how long a transaction of `conn` may sit idle ([`idle_transaction_timeout`]).
async fn limit_idle_transactions(
    conn: &mut AnyConnection,
    backend: Backend,
    limit: Duration,
) -> Result<(), sqlx::Error> {
    set_session_limit(conn, backend, limit, idle_transaction_timeout).await
}

/// Runs the session statement `statement` gives for `limit` on `conn`, if the server has one,
/// asking a MySQL-protocol server first which one it is: behind a proxy each connection may
/// reach another server.
async fn set_session_limit(
    conn: &mut AnyConnection,
    backend: Backend,
    limit: Duration,
    statement: fn(Backend, Option<&str>, Duration) -> Option<String>,
) -> Result<(), sqlx::Error> {
    let version = match backend {
        Backend::MySql => Some(server_version(conn).await?),
        Backend::Postgres | Backend::Sqlite => None,
    };
    if let Some(statement) = statement(backend, version.as_deref(), limit) {
        conn.execute(AssertSqlSafe(statement)).await?;
    }
    Ok(())
}

/// The session statement that bounds every later lock wait of a connection to `limit`: a
/// statement that waits longer fails with a transient error ([`TransientCause::LockWait`];
/// [`TransientCause::Busy`] on SQLite, whose busy timeout it sets). InnoDB counts its
/// `innodb_lock_wait_timeout` in whole seconds, so there `limit` is rounded up
/// ([`effective_lock_timeout`]). The value is a number this process formats, never outside text.
fn lock_timeout(backend: Backend, limit: Duration) -> String {
    let limit = effective_lock_timeout(backend, limit);
    match backend {
        Backend::Postgres => format!("SET lock_timeout = {}", limit.as_millis()),
        Backend::MySql => format!("SET SESSION innodb_lock_wait_timeout = {}", limit.as_secs()),
        Backend::Sqlite => format!("PRAGMA busy_timeout = {}", limit.as_millis()),
    }
}

/// The lock wait `backend` allows for `limit`: on MySQL/MariaDB whole seconds, rounded up (at
/// least one); `limit` itself elsewhere.
pub(crate) fn effective_lock_timeout(backend: Backend, limit: Duration) -> Duration {
    match backend {
        Backend::MySql => Duration::from_secs(limit.as_millis().div_ceil(1_000).max(1) as u64),
        Backend::Postgres | Backend::Sqlite => limit,
    }
}

/// Bounds every later statement of `conn` to `limit` on the server ([`statement_timeout`]),
/// asking a MySQL-protocol server first which one it is: behind a proxy each connection may
/// reach another server.
pub async fn limit_statements(
    conn: &mut AnyConnection,
    backend: Backend,
    limit: Duration,
) -> Result<(), sqlx::Error> {
    set_session_limit(conn, backend, limit, statement_timeout).await
}

impl Bound {
    /// The statement with its values, ready to run on `store`.
    pub fn query(&self, store: &Store) -> AnyQuery {
        self.bind(store.query(self.sql))
    }
}

/// A connection handed to code that runs inside the gate's transaction.
pub type Conn = AnyConnection;

/// True where an error is a transient conflict between transactions (deadlock, serialization
/// failure, a failed Galera certification, a busy SQLite file) that is worth retrying at once.
pub(crate) fn is_transient(err: &sqlx::Error) -> bool {
    transient_cause(err, false).is_some()
}

/// Which transient conflict `err` is, if it is one; `galera` when the server is a Galera node.
pub(crate) fn transient_cause(err: &sqlx::Error, galera: bool) -> Option<TransientCause> {
    match err {
        sqlx::Error::Database(db) => match db.code().as_deref() {
            // PostgreSQL: deadlock_detected.
            Some("40P01") => Some(TransientCause::Deadlock),
            // PostgreSQL: lock_not_available, the connection's `lock_timeout` ran out.
            Some("55P03") => Some(TransientCause::LockWait),
            // MySQL/MariaDB report SQLSTATE 40001 (error 1213) for deadlocks, a Galera node for a
            // failed certification too; PostgreSQL for a serialization failure.
            Some("40001") if galera => Some(TransientCause::Certification),
            Some("40001") if db.message().starts_with("Deadlock") => Some(TransientCause::Deadlock),
            Some("40001") => Some(TransientCause::Serialization),
            // SQLite: SQLITE_BUSY (5), SQLITE_LOCKED (6) and their extended codes.
            Some("5" | "6" | "261" | "262" | "517" | "773") => Some(TransientCause::Busy),
            // The lock wait timeout is HY000.
            _ if db.message().contains("Lock wait timeout exceeded") => Some(TransientCause::LockWait),
            _ => None,
        },
        sqlx::Error::PoolTimedOut | sqlx::Error::Io(_) => Some(TransientCause::Connection),
        _ => None,
    }
}

/// True when `err` says the connection itself is gone, so that a statement already sent may or
/// may not have taken effect: the socket failed or reached its end (`Io`: a reset, a broken
/// pipe, an end of stream in the middle of an answer), the pool was closed, the driver's
/// worker died, or the server said it is ending the session (SQLSTATE class 08, a connection
/// exception; PostgreSQL's 57P01–57P03, an administrator's or a crash's shutdown; MariaDB's
/// 70100, a killed connection). A COMMIT that fails so is ambiguous: the server may have
/// committed before the answer was lost.
///
/// A `Protocol` error is not among them: it says the driver read something it did not expect
/// from a connection still open (a bug or a corrupted stream), not that the server went away.
/// Nor is a pool timeout: no connection was had, so nothing was sent.
pub fn connection_lost(err: &sqlx::Error) -> bool {
    match err {
        sqlx::Error::Io(_) | sqlx::Error::PoolClosed | sqlx::Error::WorkerCrashed => true,
        sqlx::Error::Database(db) => matches!(
            db.code().as_deref(),
            Some(code) if code.starts_with("08") || matches!(code, "57P01" | "57P02" | "57P03" | "70100")
        ),
        _ => false,
    }
}

/// The longest pause before one retry of a transient conflict, however many came before.
pub(crate) const MAX_RETRY_PAUSE: Duration = Duration::from_secs(1);

/// The longest pause before retry `n` (from 1): `base_ms << n` milliseconds, at most
/// [`MAX_RETRY_PAUSE`].
fn longest_pause_ms(base_ms: u64, n: u32) -> u64 {
    let cap = MAX_RETRY_PAUSE.as_millis() as u64;
    base_ms.saturating_mul(1u64.checked_shl(n).unwrap_or(u64::MAX)).min(cap)
}

/// What the pauses before `limit` retries add up to at most, with [`retry_transient`]'s
/// `base_ms`.
pub(crate) fn longest_pauses(limit: u32, base_ms: u64) -> Duration {
    Duration::from_millis((1..=limit).map(|n| longest_pause_ms(base_ms, n)).sum())
}

/// Runs `attempt` until it succeeds, fails for another reason than a transient conflict
/// ([`transient_cause`]; `galera` when the server is a Galera node), or has been retried
/// `limit` times. Before retry n it waits a random pause of up to `base_ms << n` milliseconds,
/// never more than [`MAX_RETRY_PAUSE`], so that two transactions that collided do not collide
/// again in step. Returns the last result and the retries made, by cause.
pub(crate) async fn retry_transient<T, F: Future<Output = Result<T, sqlx::Error>>>(
    galera: bool,
    limit: u32,
    base_ms: u64,
    mut attempt: impl FnMut() -> F,
) -> (Result<T, sqlx::Error>, Retries) {
    let mut retries = Retries::default();
    loop {
        let result = attempt().await;
        let cause = match &result {
            Err(e) if retries.count() < limit => transient_cause(e, galera).map(|cause| (cause, e)),
            _ => None,
        };
        let Some((cause, e)) = cause else { return (result, retries) };
        retries.add(cause);
        let n = retries.count();
        tracing::debug!(error = %e, retries = n, %cause, "a transient conflict between transactions; retrying");
        let pause = rand::random_range(0..=longest_pause_ms(base_ms, n));
        tokio::time::sleep(Duration::from_millis(pause)).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn transient_conflicts_are_retried_up_to_the_limit_and_others_not_at_all() {
        let mut calls = 0;
        let (result, retries) = retry_transient(false, 3, 0, || {
            calls += 1;
            std::future::ready(Err::<(), _>(sqlx::Error::PoolTimedOut))
        })
        .await;
        assert!(matches!(result, Err(sqlx::Error::PoolTimedOut)));
        assert_eq!((calls, retries.count()), (4, 3));
        assert_eq!(retries.by_cause().collect::<Vec<_>>(), [(TransientCause::Connection, 3)]);

        let mut calls = 0;
        let (result, retries) = retry_transient(false, 3, 0, || {
            calls += 1;
            std::future::ready(Err::<(), _>(sqlx::Error::RowNotFound))
        })
        .await;
        assert!(matches!(result, Err(sqlx::Error::RowNotFound)));
        assert_eq!((calls, retries.count()), (1, 0));

        let mut calls = 0;
        let (result, retries) = retry_transient(false, 3, 0, || {
            calls += 1;
            std::future::ready(if calls < 3 { Err(sqlx::Error::PoolTimedOut) } else { Ok(calls) })
        })
        .await;
        assert_eq!((result.ok(), retries.count()), (Some(3), 2));
    }

    #[test]
    fn only_a_dead_connection_counts_as_lost() {
        use std::io::{Error, ErrorKind};
        for kind in
            [ErrorKind::UnexpectedEof, ErrorKind::ConnectionReset, ErrorKind::BrokenPipe, ErrorKind::TimedOut]
        {
            assert!(connection_lost(&sqlx::Error::Io(Error::new(kind, "cut"))), "{kind:?}");
        }
        assert!(connection_lost(&sqlx::Error::PoolClosed));
        assert!(connection_lost(&sqlx::Error::WorkerCrashed));
        // Nothing was sent without a connection; a driver's surprise is not the server leaving.
        assert!(!connection_lost(&sqlx::Error::PoolTimedOut));
        assert!(!connection_lost(&sqlx::Error::Protocol("unexpected message type 'X'".into())));
        assert!(!connection_lost(&sqlx::Error::RowNotFound));
        assert!(!connection_lost(&sqlx::Error::Configuration("bad url".into())));
    }

    #[test]
    fn the_pause_before_a_retry_doubles_up_to_a_cap_however_many_retries_came_before() {
        assert_eq!(
            [1, 2, 3, 7, 8, 20, 64, 200].map(|n| longest_pause_ms(5, n)),
            [10, 20, 40, 640, 1_000, 1_000, 1_000, 1_000]
        );
        assert_eq!(longest_pauses(3, 5), Duration::from_millis(70));
        assert_eq!(longest_pauses(10, 5), Duration::from_millis(4_270));
        // Twenty retries used to be able to wait 87 minutes in all.
        assert_eq!(longest_pauses(20, 5), Duration::from_millis(14_270));
        assert_eq!(longest_pauses(0, 5), Duration::ZERO);
    }

    #[tokio::test]
    async fn a_retry_never_pauses_longer_than_the_cap() {
        // A base of 1000 s: uncapped, the one pause would be up to 33 minutes.
        let retried = retry_transient(false, 1, 1_000_000, || {
            std::future::ready(Err::<(), _>(sqlx::Error::PoolTimedOut))
        });
        let (result, retries) = tokio::time::timeout(MAX_RETRY_PAUSE + Duration::from_millis(500), retried)
            .await
            .expect("the pause is capped");
        assert!(result.is_err());
        assert_eq!(retries.count(), 1);
    }

    #[test]
    fn the_lock_wait_is_bounded_in_each_backends_own_words() {
        let limit = Duration::from_millis(1_500);
        assert_eq!(lock_timeout(Backend::Postgres, limit), "SET lock_timeout = 1500");
        assert_eq!(lock_timeout(Backend::MySql, limit), "SET SESSION innodb_lock_wait_timeout = 2");
        assert_eq!(lock_timeout(Backend::Sqlite, limit), "PRAGMA busy_timeout = 1500");
        assert_eq!(effective_lock_timeout(Backend::MySql, Duration::from_millis(1)), Duration::from_secs(1));
        assert_eq!(
            effective_lock_timeout(Backend::MySql, Duration::from_millis(3_000)),
            Duration::from_secs(3)
        );
    }

    #[test]
    fn the_mysql_flavour_is_read_from_the_server_version() {
        assert_eq!(MySqlFlavour::from_version("10.11.6-MariaDB-0+deb12u1"), MySqlFlavour::MariaDb);
        assert_eq!(MySqlFlavour::from_version("11.4.2-MariaDB"), MySqlFlavour::MariaDb);
        assert_eq!(MySqlFlavour::from_version("10.5.0-MariaDB-log"), MySqlFlavour::MariaDb);
        // Before 10.5 MariaDB had no INSERT … RETURNING either.
        assert_eq!(MySqlFlavour::from_version("10.4.34-MariaDB"), MySqlFlavour::MySql);
        assert_eq!(MySqlFlavour::from_version("8.0.36"), MySqlFlavour::MySql);
        assert_eq!(MySqlFlavour::from_version("8.4.0-0ubuntu0.24.04.1"), MySqlFlavour::MySql);
        assert_eq!(MySqlFlavour::from_version(""), MySqlFlavour::MySql);
    }

    #[test]
    fn the_statement_limit_is_chosen_by_the_server_mariadb_or_mysql() {
        let limit = Duration::from_millis(1_500);
        let mysql = |version: &str| statement_timeout(Backend::MySql, Some(version), limit);
        for mariadb in
            ["10.11.6-MariaDB-0+deb12u1", "10.4.34-MariaDB", "5.5.5-10.11.6-MariaDB-log", "11.4.2-mariadb"]
        {
            assert_eq!(
                mysql(mariadb).as_deref(),
                Some("SET SESSION max_statement_time = 1.500"),
                "{mariadb}"
            );
        }
        for mysql_8 in ["8.0.36", "8.4.0-0ubuntu0.24.04.1", "8.0.36-28 Percona Server"] {
            assert_eq!(mysql(mysql_8).as_deref(), Some("SET SESSION max_execution_time = 1500"), "{mysql_8}");
        }
        assert_eq!(
            statement_timeout(Backend::Postgres, None, limit).as_deref(),
            Some("SET statement_timeout = 1500")
        );
        assert_eq!(statement_timeout(Backend::Sqlite, None, limit), None);
    }

    #[test]
    fn an_idle_transaction_is_bounded_where_the_server_can_bound_it() {
        let limit = Duration::from_millis(11_200);
        assert_eq!(
            idle_transaction_timeout(Backend::Postgres, None, limit).as_deref(),
            Some("SET idle_in_transaction_session_timeout = 11200")
        );
        // MariaDB counts whole seconds: rounded up, never below the limit asked for.
        assert_eq!(
            idle_transaction_timeout(Backend::MySql, Some("10.11.6-MariaDB-0+deb12u1"), limit).as_deref(),
            Some("SET SESSION idle_transaction_timeout = 12")
        );
        assert_eq!(idle_transaction_timeout(Backend::MySql, Some("8.0.36"), limit), None);
        assert_eq!(idle_transaction_timeout(Backend::Sqlite, None, limit), None);
    }
}
