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
mod settings;

pub use settings::DatabaseSettings;

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
    pub fn from_version(version: &str) -> Self {
        if !version.to_ascii_lowercase().contains("mariadb") {
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

/// A pool on one backend. Cheap to clone.
#[derive(Clone)]
pub struct Store {
    pool: AnyPool,
    backend: Backend,
    /// On `Backend::MySql`, which server it is; `None` on the others.
    mysql_flavour: Option<MySqlFlavour>,
}

impl fmt::Debug for Store {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Store")
            .field("backend", &self.backend)
            .field("mysql_flavour", &self.mysql_flavour)
            .finish_non_exhaustive()
    }
}

/// How to open a [`Store`].
#[derive(Debug, Clone)]
pub struct StoreOptions {
    pub max_connections: u32,
    pub acquire_timeout: Duration,
    /// A server-side limit on every statement of the pool's connections (PostgreSQL
    /// `statement_timeout`, MariaDB `max_statement_time`), set when each connection opens. A
    /// query abandoned by its caller then also stops on the server. SQLite has no such limit.
    pub statement_timeout: Option<Duration>,
}

impl Default for StoreOptions {
    fn default() -> Self {
        Self { max_connections: 16, acquire_timeout: Duration::from_secs(10), statement_timeout: None }
    }
}

impl Store {
    /// Connects without migrating.
    pub async fn connect(url: &str, options: &StoreOptions) -> Result<Self, StoreError> {
        install_default_drivers();
        let backend = Backend::from_url(url)?;
        let mut pool_options = AnyPoolOptions::new()
            .max_connections(options.max_connections)
            .acquire_timeout(options.acquire_timeout);
        if let Some(limit) = options.statement_timeout.and_then(|t| statement_timeout(backend, t)) {
            pool_options = pool_options.after_connect(move |conn, _| {
                let limit = limit.clone();
                Box::pin(async move {
                    conn.execute(AssertSqlSafe(limit)).await?;
                    Ok(())
                })
            });
        }
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
        let mysql_flavour = match backend {
            Backend::MySql => {
                use sqlx::Row;
                let version: String = sqlx::query("SELECT VERSION()").fetch_one(&pool).await?.try_get(0)?;
                let flavour = MySqlFlavour::from_version(&version);
                tracing::debug!(%version, flavour = flavour.name(), "connected to a MySQL-protocol server");
                Some(flavour)
            }
            Backend::Sqlite | Backend::Postgres => None,
        };
        Ok(Self { pool, backend, mysql_flavour })
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

    /// On MySQL/MariaDB, which of the two the server is; `None` on SQLite and PostgreSQL.
    pub fn mysql_flavour(&self) -> Option<MySqlFlavour> {
        self.mysql_flavour
    }

    /// True when an `INSERT` can return the rows it inserted (`RETURNING`): PostgreSQL,
    /// SQLite and MariaDB 10.5+, not MySQL.
    pub fn insert_returns_rows(&self) -> bool {
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

/// The session statement that bounds every later statement of a connection to `limit`, on
/// the servers that have one. The value is a number this process formats, never outside text.
fn statement_timeout(backend: Backend, limit: Duration) -> Option<String> {
    match backend {
        Backend::Postgres => Some(format!("SET statement_timeout = {}", limit.as_millis())),
        Backend::MySql => Some(format!("SET SESSION max_statement_time = {:.3}", limit.as_secs_f64())),
        Backend::Sqlite => None,
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

/// Hides the secrets of a database or Redis URL, for logs, error messages and `idemgate
/// config`: the password of `user:password@`, and the value of every query parameter whose
/// name looks secret ([`is_secret_parameter`]: `password`, `sslpassword`, `token`, …; the name
/// compared percent-decoded and in any case).
///
/// It errs towards hiding: everything before the last `@` ahead of the query is taken as the
/// user information, so a password with a raw `/` or `@` is still masked.
pub fn redact_url(url: &str) -> String {
    let (url, fragment) = match url.split_once('#') {
        Some((u, f)) => (u, Some(f)),
        None => (url, None),
    };
    let (base, query) = match url.split_once('?') {
        Some((b, q)) => (b, Some(q)),
        None => (url, None),
    };
    let mut out = match base.split_once("://") {
        Some((scheme, rest)) => match rest.rsplit_once('@') {
            Some((userinfo, host_and_path)) => match userinfo.split_once(':') {
                Some((user, _)) => format!("{scheme}://{user}:***@{host_and_path}"),
                None => base.to_owned(),
            },
            None => base.to_owned(),
        },
        None => base.to_owned(),
    };
    if let Some(query) = query {
        out.push('?');
        let pairs: Vec<String> = query
            .split('&')
            .map(|pair| match pair.split_once('=') {
                Some((name, value)) if !value.is_empty() && is_secret_parameter(name) => {
                    format!("{name}=***")
                }
                _ => pair.to_owned(),
            })
            .collect();
        out.push_str(&pairs.join("&"));
    }
    if let Some(fragment) = fragment {
        out.push('#');
        out.push_str(fragment);
    }
    out
}

/// The parts of a URL query parameter's name that mark its value as a secret.
const SECRET_NAME_PARTS: [&str; 9] =
    ["pass", "pwd", "secret", "token", "key", "auth", "credential", "cert", "private"];

/// True when a URL query parameter's name (as written: percent-encoded, `+` for a space) looks
/// like it carries a secret, whatever its case.
pub fn is_secret_parameter(name: &str) -> bool {
    let name = percent_decode(&name.replace('+', " ")).to_lowercase();
    SECRET_NAME_PARTS.iter().any(|part| name.contains(part))
}

/// `%XX` sequences decoded; malformed ones kept as written.
fn percent_decode(text: &str) -> String {
    let bytes = text.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        let hex = bytes.get(i + 1..i + 3).and_then(|h| std::str::from_utf8(h).ok());
        match (bytes[i], hex.and_then(|h| u8::from_str_radix(h, 16).ok())) {
            (b'%', Some(byte)) => {
                out.push(byte);
                i += 3;
            }
            (byte, _) => {
                out.push(byte);
                i += 1;
            }
        }
    }
    String::from_utf8_lossy(&out).into_owned()
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
        assert_eq!(redact_url("postgres://a:b/c@h/x"), "postgres://a:***@h/x", "a raw / in the password");
        assert_eq!(redact_url("redis://:s3cret@cache:6379/0"), "redis://:***@cache:6379/0");
        assert_eq!(redact_url("postgres://db/x"), "postgres://db/x");
        assert_eq!(redact_url("not a url"), "not a url");
    }

    #[test]
    fn a_password_in_the_query_string_is_masked_too() {
        assert_eq!(
            redact_url("postgres://u@127.0.0.1/x?password=hunter2"),
            "postgres://u@127.0.0.1/x?password=***"
        );
        assert_eq!(
            redact_url("postgres://u:p@h/x?sslmode=require&PassWord=hunter2&application_name=gate"),
            "postgres://u:***@h/x?sslmode=require&PassWord=***&application_name=gate",
            "several parameters, any case: only the secret one is masked"
        );
        for name in ["passwd", "pwd", "sslpassword", "token", "auth_token", "secret", "api-key", "sslkey"] {
            let shown = redact_url(&format!("mysql://root@h/test?{name}=hunter2&charset=utf8mb4"));
            assert_eq!(shown, format!("mysql://root@h/test?{name}=***&charset=utf8mb4"));
        }
        assert_eq!(
            redact_url("postgres://u@h/x?pass%77ord=hunter2&%50WD=hunter2"),
            "postgres://u@h/x?pass%77ord=***&%50WD=***",
            "names are compared percent-decoded"
        );
        assert_eq!(
            redact_url("postgres://u@h/x?password=hun@ter2&password=a%26b"),
            "postgres://u@h/x?password=***&password=***",
            "an @ in a query value is not the user information's"
        );
        assert_eq!(
            redact_url("postgres://u:p%40ss@h/x?password=&mode=x"),
            "postgres://u:***@h/x?password=&mode=x",
            "an empty value has nothing to hide"
        );
        assert_eq!(redact_url("sqlite://demo.db"), "sqlite://demo.db", "no query");
        assert_eq!(redact_url("sqlite://demo.db?"), "sqlite://demo.db?");
        assert_eq!(redact_url("sqlite:demo.db?key=k3y#frag"), "sqlite:demo.db?key=***#frag");
    }
}
