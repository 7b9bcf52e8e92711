//! Unique keys: which one a unique violation names, read the way each backend reports it
//! ([`Violated::of`]), and the unique keys a database's catalog holds ([`unique_keys`]).
//!
//! The backends say it differently:
//! - PostgreSQL names the constraint (a unique index's own name, `wallet_ledger_pkey`) and its
//!   table in fields of the error;
//! - MySQL and MariaDB write the index in the message, `Duplicate entry 'x' for key 'name'`
//!   (MariaDB, MySQL before 8.0.19) or `… for key 'table.name'` (MySQL 8.0.19 and later); the
//!   primary key's index is `PRIMARY` on every table;
//! - SQLite names no constraint: `UNIQUE constraint failed: table.col1, table.col2`, or
//!   `… failed: index 'name'` for an index on expressions.
//!
//! This module only reads; what a violation means is its caller's business.

use sqlx::error::DatabaseError;
use sqlx::{AnyConnection, Row};

use super::backend::Backend;

/// A unique key of a table, as the catalog holds it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct UniqueKey {
    pub table: String,
    /// The constraint's or index's name; `None` for SQLite's rowid primary key
    /// (`INTEGER PRIMARY KEY`), which has no index.
    pub name: Option<String>,
    /// Its columns in the index's order; an expression's part is `None`.
    pub columns: Vec<Option<String>>,
}

impl UniqueKey {
    /// `name (table(col, …))`, or `table(col, …)` without a name, for people.
    pub(crate) fn describe(&self) -> String {
        let columns: Vec<&str> =
            self.columns.iter().map(|c| c.as_deref().unwrap_or("(expression)")).collect();
        let on = format!("{}({})", self.table, columns.join(", "));
        match &self.name {
            Some(name) => format!("{name} on {on}"),
            None => on,
        }
    }

    /// True when `violated` names this key. `writes` is the table the failed statement writes,
    /// for a report that does not name the table (MariaDB's). Names compare in any ASCII case.
    pub(crate) fn is_named_by(&self, violated: &Violated, writes: Option<&str>) -> bool {
        let same = |a: &str, b: &str| a.eq_ignore_ascii_case(b);
        let Some(table) = violated.table.as_deref().or(writes) else { return false };
        if !same(table, &self.table) {
            return false;
        }
        match (&violated.name, &self.name) {
            (Some(reported), Some(name)) => same(reported, name),
            (Some(_), None) => false,
            (None, _) => {
                !violated.columns.is_empty()
                    && violated.columns.len() == self.columns.len()
                    && violated
                        .columns
                        .iter()
                        .zip(&self.columns)
                        .all(|(v, c)| c.as_deref().is_some_and(|c| same(v, c)))
            }
        }
    }
}

/// What a unique violation says about the key it broke; any part may be missing.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct Violated {
    pub table: Option<String>,
    pub name: Option<String>,
    /// SQLite's column list, in the index's order.
    pub columns: Vec<String>,
}

impl Violated {
    /// What `error` says of the key it broke, when it is a unique violation at all.
    pub(crate) fn of(backend: Backend, error: &dyn DatabaseError) -> Option<Self> {
        if !error.is_unique_violation() {
            return None;
        }
        Some(match backend {
            Backend::Postgres => Self {
                table: error.table().map(str::to_owned),
                name: error.constraint().map(str::to_owned),
                columns: Vec::new(),
            },
            Backend::MySql => match mysql_duplicate_key(error.message()) {
                Some((table, name)) => {
                    Self { table: table.map(str::to_owned), name: Some(name.to_owned()), columns: Vec::new() }
                }
                None => Self::default(),
            },
            Backend::Sqlite => sqlite_failed_key(error.message()),
        })
    }
}

/// The index a MySQL/MariaDB duplicate-key message names, and its table where the message
/// says it: `… for key 'name'`, or `… for key 'table.name'` on MySQL 8.0.19 and later. The
/// last `for key '` is the one read, so a duplicate value that holds those words cannot pose
/// as the index.
pub(crate) fn mysql_duplicate_key(message: &str) -> Option<(Option<&str>, &str)> {
    let (_, key) = message.rsplit_once("for key '")?;
    let key = key.strip_suffix('\'')?;
    Some(match key.rsplit_once('.') {
        Some((table, name)) => (Some(table), name),
        None => (None, key),
    })
}

/// What SQLite's `UNIQUE constraint failed: t.a, t.b` (or `… failed: index 'name'`) names.
fn sqlite_failed_key(message: &str) -> Violated {
    let Some((_, what)) = message.split_once("constraint failed: ") else { return Violated::default() };
    if let Some(name) = what.strip_prefix("index '").and_then(|n| n.strip_suffix('\'')) {
        return Violated { table: None, name: Some(name.to_owned()), columns: Vec::new() };
    }
    let mut table = None;
    let mut columns = Vec::new();
    for part in what.split(", ") {
        let Some((t, column)) = part.split_once('.') else { return Violated::default() };
        if table.is_some_and(|seen| seen != t) {
            return Violated::default();
        }
        table = Some(t);
        columns.push(column.to_owned());
    }
    Violated { table: table.map(str::to_owned), name: None, columns }
}

/// Every unique index (and so every primary key and unique constraint) of the tables in the
/// connection's schema (PostgreSQL: its search path; MySQL/MariaDB: the current database), with
/// its columns; on SQLite also each table's rowid primary key.
pub(crate) async fn unique_keys(
    conn: &mut AnyConnection,
    backend: Backend,
) -> Result<Vec<UniqueKey>, sqlx::Error> {
    let columns = sqlx::query(match backend {
        Backend::Postgres => PG_UNIQUE_COLUMNS,
        Backend::MySql => MYSQL_UNIQUE_COLUMNS,
        Backend::Sqlite => SQLITE_UNIQUE_COLUMNS,
    })
    .fetch_all(&mut *conn)
    .await?;
    let mut keys: Vec<UniqueKey> = Vec::new();
    for row in columns {
        let (table, name): (String, String) = (row.try_get(0)?, row.try_get(1)?);
        let column: Option<String> = row.try_get(2)?;
        match keys.last_mut() {
            Some(k) if k.table == table && k.name.as_deref() == Some(name.as_str()) => k.columns.push(column),
            _ => keys.push(UniqueKey { table, name: Some(name), columns: vec![column] }),
        }
    }
    if backend == Backend::Sqlite {
        keys.extend(sqlite_rowid_keys(conn).await?);
    }
    Ok(keys)
}

/// Table, index and column of each unique index, in order: PostgreSQL, the schemas of the
/// search path. An expression's part has no column.
const PG_UNIQUE_COLUMNS: &str = "SELECT t.relname::text, i.relname::text, a.attname::text \
     FROM pg_index x \
     JOIN pg_class i ON i.oid = x.indexrelid \
     JOIN pg_class t ON t.oid = x.indrelid \
     JOIN pg_namespace n ON n.oid = t.relnamespace \
     CROSS JOIN LATERAL unnest(x.indkey::int2[]) WITH ORDINALITY AS k(attnum, position) \
     LEFT JOIN pg_attribute a ON a.attrelid = t.oid AND a.attnum = k.attnum AND k.attnum > 0 \
     WHERE x.indisunique AND n.nspname = ANY (current_schemas(false)) \
     ORDER BY 1, 2, k.position";

/// The same on MySQL/MariaDB, the current database.
const MYSQL_UNIQUE_COLUMNS: &str = "SELECT TABLE_NAME, INDEX_NAME, COLUMN_NAME FROM information_schema.STATISTICS \
     WHERE TABLE_SCHEMA = DATABASE() AND NON_UNIQUE = 0 ORDER BY TABLE_NAME, INDEX_NAME, SEQ_IN_INDEX";

/// The same on SQLite: primary keys and unique constraints have automatic indexes
/// (`sqlite_autoindex_<table>_<n>`), listed with the others.
const SQLITE_UNIQUE_COLUMNS: &str = "SELECT m.name, l.name, i.name FROM sqlite_master m \
     JOIN pragma_index_list(m.name) l JOIN pragma_index_info(l.name) i \
     WHERE m.type = 'table' AND l.\"unique\" = 1 ORDER BY m.name, l.name, i.seqno";

/// Each table whose primary key is one column: that column, its declared type, and how many
/// indexes the key has (none when it is the rowid).
const SQLITE_ONE_COLUMN_PRIMARY_KEYS: &str = "SELECT m.name, MIN(p.name), MIN(p.type), \
     (SELECT COUNT(*) FROM pragma_index_list(m.name) l WHERE l.origin = 'pk') \
     FROM sqlite_master m JOIN pragma_table_info(m.name) p \
     WHERE m.type = 'table' AND p.pk > 0 GROUP BY m.name HAVING COUNT(*) = 1";

/// SQLite's `INTEGER PRIMARY KEY`s: the rowid under a name, unique without an index.
async fn sqlite_rowid_keys(conn: &mut AnyConnection) -> Result<Vec<UniqueKey>, sqlx::Error> {
    let mut keys = Vec::new();
    for row in sqlx::query(SQLITE_ONE_COLUMN_PRIMARY_KEYS).fetch_all(&mut *conn).await? {
        let (kind, indexes): (String, i64) = (row.try_get(2)?, row.try_get(3)?);
        if indexes == 0 && kind.eq_ignore_ascii_case("INTEGER") {
            keys.push(UniqueKey { table: row.try_get(0)?, name: None, columns: vec![Some(row.try_get(1)?)] });
        }
    }
    Ok(keys)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(table: &str, name: Option<&str>, columns: &[&str]) -> UniqueKey {
        UniqueKey {
            table: table.into(),
            name: name.map(Into::into),
            columns: columns.iter().map(|c| Some((*c).to_owned())).collect(),
        }
    }

    #[tokio::test]
    async fn sqlite_lists_its_automatic_and_named_indexes_and_the_rowid_key() {
        use sqlx::{Connection, Executor};
        sqlx::any::install_default_drivers();
        let mut conn = AnyConnection::connect("sqlite::memory:").await.expect("sqlite");
        conn.execute(
            "CREATE TABLE event (no INTEGER PRIMARY KEY, credit TEXT NOT NULL, a TEXT, b TEXT, UNIQUE (a, b)); \
             CREATE UNIQUE INDEX event_credit ON event (credit); \
             CREATE UNIQUE INDEX event_lower ON event (lower(a)); \
             CREATE INDEX event_b ON event (b); \
             CREATE TABLE pair (x TEXT, y TEXT, PRIMARY KEY (x, y))",
        )
        .await
        .expect("tables");
        let mut keys: Vec<String> = unique_keys(&mut conn, Backend::Sqlite)
            .await
            .expect("keys")
            .iter()
            .map(UniqueKey::describe)
            .collect();
        keys.sort();
        assert_eq!(
            keys,
            [
                "event(no)",
                "event_credit on event(credit)",
                "event_lower on event((expression))",
                "sqlite_autoindex_event_1 on event(a, b)",
                "sqlite_autoindex_pair_1 on pair(x, y)",
            ]
        );
    }

    #[test]
    fn mysql_and_mariadb_name_the_index_with_or_without_its_table() {
        assert_eq!(
            mysql_duplicate_key("Duplicate entry 'CR-1' for key 'PRIMARY'"),
            Some((None, "PRIMARY")),
            "MariaDB"
        );
        assert_eq!(
            mysql_duplicate_key("Duplicate entry 'CR-1' for key 'wallet_ledger.PRIMARY'"),
            Some((Some("wallet_ledger"), "PRIMARY")),
            "MySQL 8.0.19 and later"
        );
        assert_eq!(
            mysql_duplicate_key("Duplicate entry 'x' for key 'PRIMARY'' for key 'uq_note'"),
            Some((None, "uq_note")),
            "a value holding the words cannot pose as the index"
        );
        assert_eq!(mysql_duplicate_key("Can't write; duplicate key in table 't'"), None);
    }

    #[test]
    fn sqlite_names_columns_or_an_expression_index() {
        assert_eq!(
            sqlite_failed_key("UNIQUE constraint failed: wallet_ledger.user_id, wallet_ledger.note"),
            Violated {
                table: Some("wallet_ledger".into()),
                name: None,
                columns: vec!["user_id".into(), "note".into()]
            }
        );
        assert_eq!(
            sqlite_failed_key("UNIQUE constraint failed: index 'ledger_lower_note'"),
            Violated { table: None, name: Some("ledger_lower_note".into()), columns: vec![] }
        );
        assert_eq!(sqlite_failed_key("database is locked"), Violated::default());
    }

    #[test]
    fn a_key_is_named_by_its_own_table_and_name_or_columns_only() {
        let ledger_pk = key("wallet_ledger", Some("PRIMARY"), &["credit_id"]);
        let mariadb = Violated { table: None, name: Some("PRIMARY".into()), columns: vec![] };
        assert!(ledger_pk.is_named_by(&mariadb, Some("wallet_ledger")));
        assert!(ledger_pk.is_named_by(&mariadb, Some("WALLET_LEDGER")), "any case");
        assert!(!ledger_pk.is_named_by(&mariadb, Some("wallet")), "another table's PRIMARY");
        assert!(!ledger_pk.is_named_by(&mariadb, None), "a table nobody knows");
        let mysql8 = Violated { table: Some("wallet".into()), ..mariadb.clone() };
        assert!(!ledger_pk.is_named_by(&mysql8, Some("wallet_ledger")), "the message's table wins");

        let sqlite_pk = key("wallet_ledger", Some("sqlite_autoindex_wallet_ledger_1"), &["credit_id"]);
        let by_columns = |columns: &[&str]| Violated {
            table: Some("wallet_ledger".into()),
            name: None,
            columns: columns.iter().map(|c| (*c).to_owned()).collect(),
        };
        assert!(sqlite_pk.is_named_by(&by_columns(&["credit_id"]), None));
        assert!(!sqlite_pk.is_named_by(&by_columns(&["msg_id"]), None));
        assert!(!sqlite_pk.is_named_by(&by_columns(&["credit_id", "msg_id"]), None));
        assert!(!sqlite_pk.is_named_by(&Violated::default(), Some("wallet_ledger")), "nothing said");
    }
}
