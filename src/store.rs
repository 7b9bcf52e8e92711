//! The database behind the gate: one connection pool for SQLite, PostgreSQL or MySQL/MariaDB,
//! chosen by the URL's scheme, plus the migrations of each backend.
//!
//! Everything runs through sqlx's `Any` driver so that the gate, the delivery log and the
//! handlers are written once. The price is the `Any` type set (integers, floats, text, bytes):
//! times are stored as epoch milliseconds, flags as SMALLINT. Statements are written with `?`
//! placeholders and renumbered once for PostgreSQL ([`Sql`]); where the dialects really differ
//! (insert-if-absent, transaction start) the module that owns the statement says why.
//!
//! [`plan`] reads what the database would do with a statement, for the readers' tests and
//! benchmarks.
//!
//! This module owns connecting and migrating. It must not know about claims or deliveries.

use std::fmt;
use std::str::FromStr;
use std::sync::OnceLock;
use std::time::Duration;

use sqlx::any::{AnyPoolOptions, install_default_drivers};
use sqlx::migrate::Migrator;
use sqlx::{AnyConnection, AnyPool, AssertSqlSafe, Executor, SqlSafeStr, SqlStr};

pub mod plan;

static POSTGRES_MIGRATIONS: Migrator = sqlx::migrate!("migrations/postgres");
static MYSQL_MIGRATIONS: Migrator = sqlx::migrate!("migrations/mysql");
static SQLITE_MIGRATIONS: Migrator = sqlx::migrate!("migrations/sqlite");

/// Which database a URL points at. The gate's dialect choices hang off this.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Backend {
    Sqlite,
    Postgres,
    MySql,
}

impl Backend {
    /// Reads the backend from a database URL's scheme.
    pub fn from_url(url: &str) -> Result<Self, StoreError> {
        let scheme = url.split_once(':').map(|(s, _)| s).unwrap_or("");
        match scheme {
            "sqlite" => Ok(Self::Sqlite),
            "postgres" | "postgresql" => Ok(Self::Postgres),
            "mysql" | "mariadb" => Ok(Self::MySql),
            _ => Err(StoreError::UnknownScheme(scheme.to_owned())),
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            Self::Sqlite => "sqlite",
            Self::Postgres => "postgres",
            Self::MySql => "mysql",
        }
    }

    fn migrator(self) -> &'static Migrator {
        match self {
            Self::Sqlite => &SQLITE_MIGRATIONS,
            Self::Postgres => &POSTGRES_MIGRATIONS,
            Self::MySql => &MYSQL_MIGRATIONS,
        }
    }

    /// The statement that opens a write transaction.
    ///
    /// SQLite takes its write lock up front (`BEGIN IMMEDIATE`): a deferred transaction that
    /// has read first cannot wait for the lock and fails with SQLITE_BUSY instead. The servers
    /// lock rows, so a plain BEGIN is right there.
    pub(crate) fn begin_statement(self) -> &'static str {
        match self {
            Self::Sqlite => "BEGIN IMMEDIATE",
            Self::Postgres | Self::MySql => "BEGIN",
        }
    }
}

impl fmt::Display for Backend {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for Backend {
    type Err = StoreError;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "sqlite" => Ok(Self::Sqlite),
            "postgres" | "postgresql" | "pg" => Ok(Self::Postgres),
            "mysql" | "mariadb" => Ok(Self::MySql),
            _ => Err(StoreError::UnknownScheme(s.to_owned())),
        }
    }
}

#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    #[error(
        "database URL scheme {0:?} is not supported: use sqlite://, postgres:// or mysql:// (MariaDB too)"
    )]
    UnknownScheme(String),
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

/// A statement written once with `?` placeholders.
///
/// PostgreSQL wants `$1, $2, …`; the numbered text is made on first use and kept, so a hot
/// statement costs one pointer load, not a rewrite.
pub struct Sql {
    portable: &'static str,
    numbered: OnceLock<SqlStr>,
}

impl Sql {
    pub const fn new(portable: &'static str) -> Self {
        Self { portable, numbered: OnceLock::new() }
    }

    /// The statement as written, with `?` placeholders.
    pub fn portable(&self) -> &'static str {
        self.portable
    }

    /// The statement's text for `backend`.
    pub fn text(&self, backend: Backend) -> SqlStr {
        match backend {
            Backend::Postgres => self
                .numbered
                .get_or_init(|| AssertSqlSafe(number_placeholders(self.portable)).into_sql_str())
                .clone(),
            Backend::Sqlite | Backend::MySql => self.portable.into_sql_str(),
        }
    }
}

impl fmt::Debug for Sql {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_tuple("Sql").field(&self.portable).finish()
    }
}

/// Rewrites `?` placeholders as `$1, $2, …`. The statements in this crate hold no `?` inside
/// string literals, which this relies on.
pub(crate) fn number_placeholders(sql: &str) -> String {
    let mut out = String::with_capacity(sql.len() + 16);
    let mut n = 0;
    for c in sql.chars() {
        if c == '?' {
            n += 1;
            out.push('$');
            out.push_str(&n.to_string());
        } else {
            out.push(c);
        }
    }
    out
}

/// An insert that answers "already there" instead of failing, in each backend's own form.
///
/// PostgreSQL aborts the whole transaction on a unique violation, so it (and SQLite) use
/// `ON CONFLICT (target) DO NOTHING` and read the affected row count. MySQL/MariaDB run the
/// plain insert and recognise the duplicate-key error (1062) of the named index: `INSERT IGNORE`
/// would also swallow truncation and foreign-key errors. In InnoDB a failed statement leaves
/// the transaction usable. Build one with [`insert_if_absent!`](crate::insert_if_absent).
pub struct InsertIfAbsent {
    plain: Sql,
    on_conflict: Sql,
    index: &'static str,
}

/// Declares an [`InsertIfAbsent`]: the plain insert, the conflict target and the unique index.
#[macro_export]
macro_rules! insert_if_absent {
    ($insert:literal, conflict = $target:literal, index = $index:literal) => {
        $crate::store::InsertIfAbsent::new(
            $insert,
            concat!($insert, " ON CONFLICT ", $target, " DO NOTHING"),
            $index,
        )
    };
}

impl InsertIfAbsent {
    #[doc(hidden)]
    pub const fn new(plain: &'static str, on_conflict: &'static str, index: &'static str) -> Self {
        Self { plain: Sql::new(plain), on_conflict: Sql::new(on_conflict), index }
    }

    /// Runs the insert with the arguments `bind` adds. True when the row was inserted, false
    /// when the unique index already held the key.
    pub async fn execute(
        &self,
        conn: &mut AnyConnection,
        backend: Backend,
        bind: impl FnOnce(AnyQuery) -> AnyQuery,
    ) -> Result<bool, sqlx::Error> {
        match backend {
            Backend::Postgres | Backend::Sqlite => {
                let done = bind(query(backend, &self.on_conflict)).execute(&mut *conn).await?;
                Ok(done.rows_affected() == 1)
            }
            Backend::MySql => match bind(query(backend, &self.plain)).execute(&mut *conn).await {
                Ok(_) => Ok(true),
                Err(sqlx::Error::Database(db))
                    if db.is_unique_violation() && names_index(db.message(), self.index) =>
                {
                    Ok(false)
                }
                Err(e) => Err(e),
            },
        }
    }
}

/// True when a MySQL/MariaDB duplicate-key message ("… for key 'idx'", or 'table.idx' on
/// MySQL 8) names `index`.
fn names_index(message: &str, index: &str) -> bool {
    message
        .strip_suffix('\'')
        .and_then(|m| m.strip_suffix(index))
        .is_some_and(|m| m.ends_with('\'') || m.ends_with('.'))
}

/// A query on the `Any` driver.
pub type AnyQuery = sqlx::query::Query<'static, sqlx::Any, sqlx::any::AnyArguments>;

/// A pool on one backend. Cheap to clone.
#[derive(Clone)]
pub struct Store {
    pool: AnyPool,
    backend: Backend,
}

impl fmt::Debug for Store {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Store").field("backend", &self.backend).finish_non_exhaustive()
    }
}

/// How to open a [`Store`].
#[derive(Debug, Clone)]
pub struct StoreOptions {
    pub max_connections: u32,
    pub acquire_timeout: Duration,
}

impl Default for StoreOptions {
    fn default() -> Self {
        Self { max_connections: 16, acquire_timeout: Duration::from_secs(10) }
    }
}

impl Store {
    /// Connects without migrating.
    pub async fn connect(url: &str, options: &StoreOptions) -> Result<Self, StoreError> {
        install_default_drivers();
        let backend = Backend::from_url(url)?;
        let pool = AnyPoolOptions::new()
            .max_connections(options.max_connections)
            .acquire_timeout(options.acquire_timeout)
            .connect(url)
            .await
            .map_err(|source| StoreError::Connect { backend, url: redact_url(url), source })?;
        if backend == Backend::Sqlite {
            // WAL lets readers (the UI, the reconciler) run beside the single writer. The
            // setting is stored in the file, so once is enough.
            pool.execute("PRAGMA journal_mode = WAL").await?;
        }
        Ok(Self { pool, backend })
    }

    /// Connects and applies this backend's migrations.
    pub async fn open(url: &str, options: &StoreOptions) -> Result<Self, StoreError> {
        let store = Self::connect(url, options).await?;
        store.migrate().await?;
        Ok(store)
    }

    /// Applies the pending migrations of `migrations/<backend>/`. Applied ones are checked
    /// against their checksums, so an edited migration is refused: they are append-only.
    pub async fn migrate(&self) -> Result<(), StoreError> {
        self.backend
            .migrator()
            .run(&self.pool)
            .await
            .map_err(|source| StoreError::Migrate { backend: self.backend, source })
    }

    pub fn backend(&self) -> Backend {
        self.backend
    }

    pub fn pool(&self) -> &AnyPool {
        &self.pool
    }

    /// Opens a write transaction with the backend's own begin statement.
    pub async fn begin(&self) -> Result<sqlx::Transaction<'static, sqlx::Any>, sqlx::Error> {
        crate::telemetry::count_unreported_statement();
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
    pub async fn insert_returning_id(
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

/// A value bound to a [`Bound`] statement.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Arg {
    Int(i64),
    Text(String),
    /// An integer column's NULL (PostgreSQL types every parameter).
    NullInt,
    NullText,
}

/// A statement with its values, named for people: what a reader runs, and what
/// [`plan::reads`] reads the plan of, so that the plan checked is the plan run.
#[derive(Debug, Clone)]
pub struct Bound {
    pub name: &'static str,
    pub sql: &'static Sql,
    pub args: Vec<Arg>,
}

impl Bound {
    pub fn new(name: &'static str, sql: &'static Sql, args: Vec<Arg>) -> Self {
        Self { name, sql, args }
    }

    /// The statement with its values, ready to run on `store`.
    pub fn query(&self, store: &Store) -> AnyQuery {
        self.bind(store.query(self.sql))
    }

    /// `query` (this statement's text, or one built around it) with this statement's values.
    pub fn bind(&self, query: AnyQuery) -> AnyQuery {
        bind_all(query, &self.args)
    }
}

/// `query` with `args` bound in order.
pub fn bind_all(query: AnyQuery, args: &[Arg]) -> AnyQuery {
    args.iter().fold(query, |q, arg| match arg {
        Arg::Int(v) => q.bind(*v),
        Arg::Text(v) => q.bind(v.clone()),
        Arg::NullInt => q.bind(None::<i64>),
        Arg::NullText => q.bind(None::<String>),
    })
}

/// A query for `sql` in `backend`'s placeholder style, for code that holds a connection (a
/// handler inside the gate's transaction) rather than the store.
pub fn query(backend: Backend, sql: &Sql) -> AnyQuery {
    sqlx::query(sql.text(backend))
}

/// A query for a statement built at run time (a multi-row insert whose row count varies),
/// written with `?` placeholders like [`Sql`]. Its text must hold only identifiers this crate
/// chose and placeholders: every value is bound.
pub fn query_built(backend: Backend, portable: String) -> AnyQuery {
    let text = match backend {
        Backend::Postgres => number_placeholders(&portable),
        Backend::Sqlite | Backend::MySql => portable,
    };
    sqlx::query(AssertSqlSafe(text))
}

/// `(?, ?, …)` with `columns` placeholders, repeated `rows` times and comma-separated: the
/// VALUES list of a multi-row insert.
pub fn values_list(columns: usize, rows: usize) -> String {
    let one = format!("({})", vec!["?"; columns].join(", "));
    vec![one; rows].join(", ")
}

/// A connection handed to code that runs inside the gate's transaction.
pub type Conn = AnyConnection;

/// Hides the password of a database URL, for logs and error messages.
pub fn redact_url(url: &str) -> String {
    let Some((scheme, rest)) = url.split_once("://") else {
        return url.to_owned();
    };
    let (authority, path) = match rest.find('/') {
        Some(i) => rest.split_at(i),
        None => (rest, ""),
    };
    match authority.rsplit_once('@') {
        Some((userinfo, host)) => {
            let user = userinfo.split(':').next().unwrap_or("");
            if userinfo.contains(':') {
                format!("{scheme}://{user}:***@{host}{path}")
            } else {
                format!("{scheme}://{user}@{host}{path}")
            }
        }
        None => url.to_owned(),
    }
}

/// True where an error is a transient conflict between transactions (deadlock, serialization
/// failure, a busy SQLite file) that is worth retrying at once.
pub fn is_transient(err: &sqlx::Error) -> bool {
    match err {
        sqlx::Error::Database(db) => {
            let code = db.code();
            matches!(
                code.as_deref(),
                // PostgreSQL: serialization_failure, deadlock_detected.
                Some("40001") | Some("40P01")
                // MySQL/MariaDB report SQLSTATE 40001 for deadlocks; the lock wait timeout is HY000.
                // SQLite: SQLITE_BUSY (5), SQLITE_LOCKED (6) and their extended codes.
                | Some("5") | Some("6") | Some("261") | Some("262") | Some("517") | Some("773")
            ) || db.message().contains("Lock wait timeout exceeded")
        }
        sqlx::Error::PoolTimedOut | sqlx::Error::Io(_) => true,
        _ => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_values_list_has_one_group_per_row() {
        assert_eq!(values_list(2, 3), "(?, ?), (?, ?), (?, ?)");
        assert_eq!(number_placeholders(&values_list(2, 2)), "($1, $2), ($3, $4)");
    }

    #[test]
    fn placeholders_are_numbered_in_order() {
        assert_eq!(
            number_placeholders("SELECT ? , ?, x FROM t WHERE y = ?"),
            "SELECT $1 , $2, x FROM t WHERE y = $3"
        );
        assert_eq!(number_placeholders("SELECT 1"), "SELECT 1");
    }

    #[test]
    fn a_duplicate_key_message_is_matched_to_its_index_only() {
        let m = "Duplicate entry 'g-t-PRIMARY-0' for key 'idempotent_record_claim_key'";
        assert!(names_index(m, "idempotent_record_claim_key"));
        assert!(!names_index(m, "PRIMARY"));
        assert!(names_index("Duplicate entry 'x' for key 'shop_order.PRIMARY'", "PRIMARY"));
        assert!(names_index("Duplicate entry 'x' for key 'PRIMARY'", "PRIMARY"));
    }

    #[test]
    fn backend_is_read_from_the_url_scheme() {
        assert_eq!(Backend::from_url("sqlite://x.db").unwrap(), Backend::Sqlite);
        assert_eq!(Backend::from_url("postgres://u@h/db").unwrap(), Backend::Postgres);
        assert_eq!(Backend::from_url("postgresql://u@h/db").unwrap(), Backend::Postgres);
        assert_eq!(Backend::from_url("mysql://root@h/test").unwrap(), Backend::MySql);
        let err = Backend::from_url("oracle://x").unwrap_err().to_string();
        assert!(err.contains("\"oracle\""), "{err}");
    }

    #[test]
    fn passwords_never_reach_a_log_line() {
        assert_eq!(redact_url("postgres://app:s3cret@db:5432/x"), "postgres://app:***@db:5432/x");
        assert_eq!(redact_url("mysql://root@127.0.0.1/test"), "mysql://root@127.0.0.1/test");
        assert_eq!(redact_url("sqlite://demo.db?mode=rwc"), "sqlite://demo.db?mode=rwc");
        assert_eq!(redact_url("postgres://a:b@c@h/x"), "postgres://a:***@h/x");
    }
}
