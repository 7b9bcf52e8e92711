//! The claim key led by `biz_id`: `UNIQUE (biz_id, biz_type, consumer_group, execute_time)`
//! instead of the first shape's `(consumer_group, biz_type, biz_id, execute_time)` beside an
//! index on `biz_id` alone.
//!
//! The same four columns, so the same keys collide and `ON CONFLICT (…)` names the same key
//! (PostgreSQL matches a conflict target to a unique index by its set of columns); led by
//! `biz_id`, the key also serves every read by bizId (the trace, replay), and the index on
//! `biz_id` alone, about 41 bytes a claim, goes. The key keeps its name on every backend, so
//! the violations MySQL/MariaDB report name it as before.
//!
//! A claim table moves while consumers write, one bounded step per call ([`step`]), each safe to
//! repeat after a crash:
//! - PostgreSQL: the new unique index is built concurrently; one catalog-only statement swaps
//!   it in under the old key's constraint name (`DROP CONSTRAINT …, ADD CONSTRAINT … UNIQUE
//!   USING INDEX …`, its lock wait bounded); the index on `biz_id` is dropped concurrently; the
//!   key, the primary key and the time index get `fillfactor = 100` (claims are never updated,
//!   so no page needs room for a newer version of a row: ascending keys fill their pages,
//!   random ones split them in half whatever the fillfactor).
//! - MariaDB/MySQL: one online `ALTER TABLE … ALGORITHM=INPLACE, LOCK=NONE` redefines the key
//!   under its name and drops the index on `biz_id` (InnoDB keeps the old key enforcing while
//!   the new one is built, writes going on).
//! - SQLite keeps its first shape: its key is part of the table's definition, which only a copy
//!   of the table could change, and its databases are the small ones.
//!
//! This module owns the claim tables' key DDL. It must not take the archive lease (its callers
//! hold it).

use sqlx::{AnyConnection, AssertSqlSafe, Executor, Row};

use crate::store::ddl::{LOCK_WAIT, Step, connection, lock_wait_ended, pg_drop_unfinished};
use crate::store::{Backend, Store};

/// The claim key's columns, in the order the key now has them.
const LED: [&str; 4] = ["biz_id", "biz_type", "consumer_group", "execute_time"];
/// The first shape's key.
const FIRST: [&str; 4] = ["consumer_group", "biz_type", "biz_id", "execute_time"];

/// What a claim table's indexes are, read from the catalog.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct KeyShape {
    /// The unique key of the first shape, by its constraint's (PostgreSQL) or index's name.
    pub first_key: Option<String>,
    /// The unique index led by `biz_id`, and whether it is valid (PostgreSQL: a concurrent
    /// build that did not finish leaves an invalid one).
    pub led_key: Option<(String, bool)>,
    /// The index on `biz_id` alone.
    pub biz_id_index: Option<String>,
    /// PostgreSQL: the key, the primary key and the time index not yet at `fillfactor = 100`.
    pub not_full: Vec<String>,
}

impl KeyShape {
    /// True when the table has its final shape.
    pub fn is_led(&self) -> bool {
        self.first_key.is_none()
            && self.biz_id_index.is_none()
            && self.not_full.is_empty()
            && matches!(self.led_key, Some((_, true)))
    }
}

impl KeyShape {
    /// What is left to move, in words.
    pub fn describe(&self) -> String {
        let mut left = Vec::new();
        if let Some(first) = &self.first_key {
            left.push(format!("the key {first} is led by consumer_group"));
        }
        match &self.led_key {
            Some((name, false)) => left.push(format!("the index {name} was left unfinished")),
            Some((name, true)) if self.first_key.is_some() => left.push(format!("the index {name} is built")),
            _ => {}
        }
        if let Some(index) = &self.biz_id_index {
            left.push(format!("the index {index} on biz_id alone is still there"));
        }
        if !self.not_full.is_empty() {
            left.push(format!("{} split at the default fillfactor", self.not_full.join(", ")));
        }
        if left.is_empty() { "nothing left: the key is led by biz_id".to_owned() } else { left.join("; ") }
    }
}

/// One index of a table: its name, its columns in order, unique, valid, its constraint, its
/// `fillfactor`.
struct Index {
    name: String,
    columns: Vec<String>,
    unique: bool,
    primary: bool,
    valid: bool,
    constraint: Option<String>,
    fillfactor: Option<String>,
}

/// The key shape of claim table `table`; SQLite's is reported as moved, since it keeps its own.
pub async fn shape(store: &Store, table: &str) -> Result<KeyShape, sqlx::Error> {
    let mut conn = store.pool().acquire().await?;
    let indexes = match store.backend() {
        Backend::Sqlite => {
            return Ok(KeyShape { led_key: Some((String::new(), true)), ..KeyShape::default() });
        }
        Backend::Postgres => pg_indexes(&mut conn, table).await?,
        Backend::MySql => my_indexes(&mut conn, table).await?,
    };
    Ok(read_shape(&indexes))
}

fn read_shape(indexes: &[Index]) -> KeyShape {
    let is = |i: &Index, cols: &[&str]| i.columns.iter().map(String::as_str).eq(cols.iter().copied());
    let mut shape = KeyShape::default();
    for i in indexes {
        if i.unique && is(i, &FIRST) {
            shape.first_key = Some(i.constraint.clone().unwrap_or_else(|| i.name.clone()));
        } else if i.unique && is(i, &LED) {
            shape.led_key = Some((i.name.clone(), i.valid));
        } else if !i.unique && is(i, &["biz_id"]) {
            shape.biz_id_index = Some(i.name.clone());
        }
        // Claims are inserted and deleted, never updated: no page of these needs room for a
        // row's newer version. An index whose keys ascend (the id, the time, most bizIds) then
        // fills its pages; one whose keys arrive at random splits its pages in half whatever
        // the fillfactor.
        let insert_only = i.primary || (!i.unique && is(i, &["claimed_at_ms"])) || (i.unique && is(i, &LED));
        if insert_only && i.fillfactor.as_deref().is_some_and(|f| f != "100") {
            shape.not_full.push(i.name.clone());
        }
    }
    shape
}

async fn pg_indexes(conn: &mut AnyConnection, table: &str) -> Result<Vec<Index>, sqlx::Error> {
    let rows = sqlx::query(
        "SELECT c.relname::text, \
                (SELECT string_agg(a.attname::text, ',' ORDER BY k.n) \
                 FROM unnest(i.indkey::int2[]) WITH ORDINALITY AS k(attnum, n) \
                 JOIN pg_attribute a ON a.attrelid = i.indrelid AND a.attnum = k.attnum), \
                i.indisunique, i.indisprimary, i.indisvalid, \
                (SELECT con.conname::text FROM pg_constraint con WHERE con.conindid = i.indexrelid \
                 AND con.conrelid = i.indrelid LIMIT 1), \
                COALESCE((SELECT split_part(o, '=', 2) FROM unnest(c.reloptions) o \
                          WHERE o LIKE 'fillfactor=%'), '90') \
         FROM pg_index i JOIN pg_class c ON c.oid = i.indexrelid \
         WHERE i.indrelid = to_regclass($1) ORDER BY c.relname",
    )
    .bind(table.to_owned())
    .fetch_all(&mut *conn)
    .await?;
    rows.iter()
        .map(|r| {
            let columns: Option<String> = r.try_get(1)?;
            Ok(Index {
                name: r.try_get(0)?,
                columns: columns.unwrap_or_default().split(',').map(str::to_owned).collect(),
                unique: r.try_get(2)?,
                primary: r.try_get(3)?,
                valid: r.try_get(4)?,
                constraint: r.try_get(5)?,
                fillfactor: Some(r.try_get(6)?),
            })
        })
        .collect()
}

async fn my_indexes(conn: &mut AnyConnection, table: &str) -> Result<Vec<Index>, sqlx::Error> {
    let rows = sqlx::query(
        "SELECT INDEX_NAME, CAST(MAX(NON_UNIQUE) AS SIGNED), \
                GROUP_CONCAT(COLUMN_NAME ORDER BY SEQ_IN_INDEX SEPARATOR ',') \
         FROM information_schema.STATISTICS WHERE TABLE_SCHEMA = DATABASE() AND TABLE_NAME = ? \
         GROUP BY INDEX_NAME ORDER BY INDEX_NAME",
    )
    .bind(table.to_owned())
    .fetch_all(&mut *conn)
    .await?;
    rows.iter()
        .map(|r| {
            let name: String = r.try_get(0)?;
            let non_unique: i64 = r.try_get(1)?;
            let columns: String = r.try_get(2)?;
            Ok(Index {
                primary: name == "PRIMARY",
                constraint: Some(name.clone()),
                name,
                columns: columns.split(',').map(str::to_owned).collect(),
                unique: non_unique == 0,
                valid: true,
                fillfactor: None,
            })
        })
        .collect()
}

/// Takes the next step of moving claim table `table` to the key led by `biz_id`: call it until
/// it says [`Step::Done`], holding the archive lease so no two processes take steps at once.
pub async fn step(store: &Store, table: &str) -> Result<Step, sqlx::Error> {
    let done = match store.backend() {
        Backend::Sqlite => return Ok(Step::Done),
        Backend::Postgres => pg_step(store, table).await,
        Backend::MySql => my_step(store, table).await,
    };
    match done {
        Err(e) if lock_wait_ended(&e) => Ok(Step::Waiting(format!(
            "{table}: a lock was held past {} s; the next run tries again",
            LOCK_WAIT.as_secs()
        ))),
        other => other,
    }
}

async fn pg_step(store: &Store, table: &str) -> Result<Step, sqlx::Error> {
    let shape = shape(store, table).await?;
    // Names of at most 63 bytes: the longest table is idempotent_record_archive (25).
    let building = format!("{table}_key_by_biz_id");
    match (&shape.first_key, &shape.led_key) {
        // A build killed half-way leaves an invalid index: dropped and built again, unless
        // another session is still building it.
        (_, Some((name, false))) => {
            let mut conn = connection(store, None).await?;
            return pg_drop_unfinished(&mut conn, name).await;
        }
        (Some(_), None) => {
            let mut conn = connection(store, None).await?;
            conn.execute(AssertSqlSafe(format!(
                "CREATE UNIQUE INDEX CONCURRENTLY {building} ON {table} ({})",
                LED.join(", ")
            )))
            .await?;
            return Ok(Step::More(format!("{table}: built the key led by biz_id concurrently")));
        }
        (Some(first), Some((led, true))) => {
            // One statement, catalog only: the old key's index goes, the new one becomes the
            // constraint under the old name (and takes that name).
            let mut conn = connection(store, Some(LOCK_WAIT)).await?;
            conn.execute(AssertSqlSafe(format!(
                "ALTER TABLE {table} DROP CONSTRAINT {first}, ADD CONSTRAINT {first} UNIQUE USING INDEX {led}"
            )))
            .await?;
            return Ok(Step::More(format!("{table}: {first} is now led by biz_id")));
        }
        (None, Some((_, true))) => {}
        (None, None) => return Err(no_key(table)),
    }
    if let Some(index) = &shape.biz_id_index {
        let mut conn = connection(store, None).await?;
        conn.execute(AssertSqlSafe(format!("DROP INDEX CONCURRENTLY IF EXISTS {index}"))).await?;
        return Ok(Step::More(format!("{table}: dropped {index}, which the key now serves")));
    }
    if !shape.not_full.is_empty() {
        let mut conn = connection(store, Some(LOCK_WAIT)).await?;
        for index in &shape.not_full {
            conn.execute(AssertSqlSafe(format!("ALTER INDEX {index} SET (fillfactor = 100)"))).await?;
        }
        return Ok(Step::More(format!("{table}: {} split full from now on", shape.not_full.join(", "))));
    }
    Ok(Step::Done)
}

async fn my_step(store: &Store, table: &str) -> Result<Step, sqlx::Error> {
    let shape = shape(store, table).await?;
    if shape.first_key.is_none() && shape.led_key.is_none() {
        return Err(no_key(table));
    }
    let mut changes = Vec::new();
    if let Some(first) = &shape.first_key {
        changes.push(format!("DROP INDEX {first}, ADD UNIQUE KEY {first} ({})", LED.join(", ")));
    }
    if let Some(index) = &shape.biz_id_index {
        changes.push(format!("DROP INDEX {index}"));
    }
    if changes.is_empty() {
        return Ok(Step::Done);
    }
    let mut conn = connection(store, Some(LOCK_WAIT)).await?;
    conn.execute(AssertSqlSafe(format!(
        "ALTER TABLE {table} {}, ALGORITHM=INPLACE, LOCK=NONE",
        changes.join(", ")
    )))
    .await?;
    Ok(Step::More(format!("{table}: the claim key is led by biz_id and the index on biz_id alone is gone")))
}

/// A claim table with neither key: nothing is changed on it (its index on biz_id is all its
/// readers have), and the error says so.
fn no_key(table: &str) -> sqlx::Error {
    sqlx::Error::Protocol(format!(
        "{table} has no unique key on (consumer_group, biz_type, biz_id, execute_time) in either order; \
         it is left as it is"
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn index(name: &str, columns: &str, unique: bool) -> Index {
        Index {
            name: name.into(),
            columns: columns.split(',').map(str::to_owned).collect(),
            unique,
            primary: name.ends_with("pkey"),
            valid: true,
            constraint: unique.then(|| name.into()),
            fillfactor: Some("90".into()),
        }
    }

    #[test]
    fn the_first_shape_and_the_led_one_are_told_apart_by_their_columns_in_order() {
        let first = [
            index("t_pkey", "id", true),
            index("t_claim_key", "consumer_group,biz_type,biz_id,execute_time", true),
            index("t_biz_id", "biz_id", false),
            index("t_claimed_at", "claimed_at_ms", false),
        ];
        let shape = read_shape(&first);
        assert_eq!(shape.first_key.as_deref(), Some("t_claim_key"));
        assert_eq!(shape.biz_id_index.as_deref(), Some("t_biz_id"));
        assert_eq!(shape.led_key, None);
        assert_eq!(shape.not_full, ["t_pkey", "t_claimed_at"]);
        assert!(!shape.is_led());
        assert_eq!(
            shape.describe(),
            "the key t_claim_key is led by consumer_group; the index t_biz_id on biz_id alone is still there; \
             t_pkey, t_claimed_at split at the default fillfactor"
        );

        let mut led = [
            index("t_pkey", "id", true),
            index("t_claim_key", "biz_id,biz_type,consumer_group,execute_time", true),
            index("t_claimed_at", "claimed_at_ms", false),
        ];
        for i in &mut led {
            i.fillfactor = Some("100".into());
        }
        let shape = read_shape(&led);
        assert_eq!(shape.led_key, Some(("t_claim_key".into(), true)));
        assert!(shape.is_led(), "{shape:?}");
        assert_eq!(shape.describe(), "nothing left: the key is led by biz_id");
    }
}
