//! Statements: written once with `?` placeholders and renumbered once for PostgreSQL
//! ([`Sql`]), built at run time for multi-row inserts ([`query_built`], [`values_list`]),
//! bound with their values for people and for plans ([`Bound`]), and the insert that answers
//! "already there" in each backend's own form ([`InsertIfAbsent`]).

use std::fmt;
use std::sync::OnceLock;

use sqlx::{AssertSqlSafe, SqlSafeStr, SqlStr};

use super::backend::Backend;

/// A statement written once with `?` placeholders.
///
/// PostgreSQL wants `$1, $2, …`; the numbered text is made on first use and kept, so a hot
/// statement costs one pointer load, not a rewrite.
pub struct Sql {
    portable: &'static str,
    mysql: Option<&'static str>,
    numbered: OnceLock<SqlStr>,
}

impl Sql {
    pub const fn new(portable: &'static str) -> Self {
        Self { portable, mysql: None, numbered: OnceLock::new() }
    }

    /// The statement, and the same statement as MySQL/MariaDB should run it: the same
    /// placeholders in the same order, with an index hint where its planner picks a worse
    /// index than the others do.
    pub(crate) const fn with_mysql(portable: &'static str, mysql: &'static str) -> Self {
        Self { portable, mysql: Some(mysql), numbered: OnceLock::new() }
    }

    /// The statement as written, with `?` placeholders.
    pub(crate) fn portable(&self) -> &'static str {
        self.portable
    }

    /// The statement as `backend` runs it, with `?` placeholders.
    pub fn written_for(&self, backend: Backend) -> &'static str {
        match (backend, self.mysql) {
            (Backend::MySql, Some(mysql)) => mysql,
            _ => self.portable,
        }
    }

    /// The statement's text for `backend`.
    pub fn text(&self, backend: Backend) -> SqlStr {
        match backend {
            Backend::Postgres => self
                .numbered
                .get_or_init(|| AssertSqlSafe(number_placeholders(self.portable)).into_sql_str())
                .clone(),
            Backend::Sqlite | Backend::MySql => self.written_for(backend).into_sql_str(),
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
pub fn number_placeholders(sql: &str) -> String {
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

/// A statement written at run time, from configuration rather than code, with its text made
/// once for each placeholder style: `?` for SQLite and MySQL/MariaDB, `$1, $2, …` for
/// PostgreSQL. Whoever builds one has found its placeholders itself (outside string literals,
/// where [`number_placeholders`] would not look), so both texts are given. Cheap to clone.
#[derive(Clone)]
pub struct Written {
    portable: SqlStr,
    numbered: SqlStr,
}

impl Written {
    /// The statement with `?` placeholders and the same with `$n` ones. Their text must hold
    /// no value: every value is bound.
    pub fn new(portable: String, numbered: String) -> Self {
        Self {
            portable: AssertSqlSafe(portable).into_sql_str(),
            numbered: AssertSqlSafe(numbered).into_sql_str(),
        }
    }

    /// The statement with `?` placeholders.
    #[cfg(test)]
    pub(crate) fn portable(&self) -> &str {
        self.portable.as_str()
    }

    /// The statement's text for `backend`.
    pub fn text(&self, backend: Backend) -> SqlStr {
        match backend {
            Backend::Postgres => self.numbered.clone(),
            Backend::Sqlite | Backend::MySql => self.portable.clone(),
        }
    }

    /// A query of this statement for `backend`, its values yet to be bound.
    pub fn query(&self, backend: Backend) -> AnyQuery {
        sqlx::query(self.text(backend))
    }
}

impl fmt::Debug for Written {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_tuple("Written").field(&self.portable.as_str()).finish()
    }
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

// Other crates name the macro at the crate root, where `#[macro_export]` puts it; this crate
// names it through its module, `crate::store::insert_if_absent`.
pub(crate) use insert_if_absent;

impl InsertIfAbsent {
    #[doc(hidden)]
    pub const fn new(plain: &'static str, on_conflict: &'static str, index: &'static str) -> Self {
        Self { plain: Sql::new(plain), on_conflict: Sql::new(on_conflict), index }
    }

    /// Runs the insert with the arguments `bind` adds. True when the row was inserted, false
    /// when the unique index already held the key.
    pub async fn execute(
        &self,
        conn: &mut sqlx::AnyConnection,
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
    super::unique::mysql_duplicate_key(message).is_some_and(|(_, name)| name == index)
}

/// A query on the `Any` driver.
pub type AnyQuery = sqlx::query::Query<'static, sqlx::Any, sqlx::any::AnyArguments>;

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

/// The fixed lengths a statement's list of keys is padded to: a group of up to 64 deliveries
/// makes at most seven texts of one statement, which every connection's statement cache keeps,
/// instead of one text per count.
const PADDED_LENGTHS: [usize; 7] = [1, 2, 4, 8, 16, 32, 64];

/// The length a list of `n` keys is padded to: the next of [`PADDED_LENGTHS`], or `n` itself
/// beyond them.
pub fn padded(n: usize) -> usize {
    PADDED_LENGTHS.into_iter().find(|&len| len >= n).unwrap_or(n)
}

/// How a multi-row insert is padded to a length of [`PADDED_LENGTHS`], so that the statement
/// cache keeps a few texts of it, not one per count of rows.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Pad {
    /// A `VALUES` list with the last row repeated: for an insert that skips a key already there
    /// (`ON CONFLICT DO NOTHING`, `INSERT IGNORE`), which skips the copy like any taken key.
    Repeat,
    /// Rows that a filter drops ([`filtered_insert`]): for a plain insert, where a repeated row
    /// would be written twice or fail.
    Filter,
}

/// `VALUES` rows for a [`Pad::Repeat`] insert of `rows` rows of `columns` values.
pub fn padded_values(columns: usize, rows: usize) -> String {
    values_list(columns, padded(rows))
}

/// `INSERT INTO table (a, b) SELECT a, b FROM (SELECT ? AS a, ? AS b, ? AS keep_row UNION ALL
/// SELECT ?, ?, ? …) AS padded_rows WHERE keep_row = 1`: a [`Pad::Filter`] insert of `rows`
/// rows, padded; [`bind_rows`] binds each row's values and its `keep_row`. Every backend runs
/// this form (MariaDB names the columns of a bare `VALUES` list after its first row, so the
/// rows are `SELECT`s).
pub fn filtered_insert(table: &str, columns: &[&str], rows: usize) -> String {
    let names = columns.join(", ");
    let first = columns.iter().map(|c| format!("? AS {c}")).collect::<Vec<_>>().join(", ");
    let other = format!("SELECT {}", vec!["?"; columns.len() + 1].join(", "));
    let mut selects = vec![format!("SELECT {first}, ? AS keep_row")];
    selects.extend(std::iter::repeat_n(other, padded(rows) - 1));
    format!(
        "INSERT INTO {table} ({names}) SELECT {names} FROM ({}) AS padded_rows WHERE keep_row = 1",
        selects.join(" UNION ALL ")
    )
}

/// Binds `rows` with `bind`, then `pad` until the padded length; under [`Pad::Filter`] each row
/// is followed by its `keep_row` (1 for a row, 0 for padding). `pad` is a real row (the last,
/// for [`Pad::Repeat`]) or a cheaper row of the same types.
pub fn bind_rows<T>(
    mut q: AnyQuery,
    rows: &[T],
    pad: &T,
    style: Pad,
    bind: impl Fn(AnyQuery, &T) -> AnyQuery,
) -> AnyQuery {
    for (i, row) in rows.iter().chain(std::iter::repeat(pad)).take(padded(rows.len())).enumerate() {
        q = bind(q, row);
        if style == Pad::Filter {
            q = q.bind(i64::from(i < rows.len()));
        }
    }
    q
}

/// `?, ?, …`: `n` placeholders, comma-separated, for an `IN (…)` list.
pub fn placeholders(n: usize) -> String {
    vec!["?"; n].join(", ")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lists_are_padded_to_a_few_fixed_lengths() {
        let lengths: std::collections::BTreeSet<usize> = (1..=64).map(padded).collect();
        assert_eq!(lengths.into_iter().collect::<Vec<_>>(), [1, 2, 4, 8, 16, 32, 64]);
        assert_eq!((padded(3), padded(33), padded(65)), (4, 64, 65));
        assert_eq!(placeholders(3), "?, ?, ?");
    }

    #[test]
    fn a_filtered_insert_pads_with_rows_it_drops() {
        assert_eq!(
            filtered_insert("t", &["a", "b"], 3),
            "INSERT INTO t (a, b) SELECT a, b FROM (SELECT ? AS a, ? AS b, ? AS keep_row UNION ALL \
             SELECT ?, ?, ? UNION ALL SELECT ?, ?, ? UNION ALL SELECT ?, ?, ?) AS padded_rows WHERE keep_row = 1"
        );
        assert_eq!(padded_values(2, 3), "(?, ?), (?, ?), (?, ?), (?, ?)");
    }

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
}
