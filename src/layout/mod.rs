//! Where the claims live: the single table `idempotent_record`, or N shard tables
//! `idempotent_record_00` … `idempotent_record_{N-1}` chosen by a stable hash of the key.
//!
//! The layout is fixed when the first process runs on a database and recorded in
//! `dedup_layout`; a later start that asks for another N is refused, because a key would then
//! be claimed in another table than its earlier claim and the unique index would no longer see
//! the duplicate. Readers (trace, lists, reconcile, metrics) never pick a shard: they read the
//! view `idempotent_record_all`, the UNION ALL of every claim table. The archive walks each
//! table in turn ([`Layout::tables`]).
//!
//! Each shard has the same columns and indexes as `idempotent_record`, and ids that never meet
//! another table's, so that the archive (keyed by the live row's id) can hold claims of every
//! shard: PostgreSQL shards share the main table's sequence, MySQL/MariaDB and SQLite shards
//! count from `(k + 1) · 10^15`.
//!
//! This module owns the layout, its DDL and the per-table claim statements. It must not claim.

pub mod key;

use std::collections::HashMap;
use std::sync::{Mutex, OnceLock};

use sqlx::{AssertSqlSafe, Executor, Row};

use crate::store::{Backend, InsertIfAbsent, Sql, Store};

/// The most shards a layout may have (two-digit table suffixes).
pub(crate) const MAX_SHARDS: u16 = 100;
/// The unsharded claim table.
pub(crate) const MAIN_TABLE: &str = "idempotent_record";
/// The view of every live claim, for readers.
pub(crate) const ALL_CLAIMS_VIEW: &str = "idempotent_record_all";
/// The first id of shard `k` on MySQL/MariaDB and SQLite is `(k + 1) * SHARD_ID_SPAN + 1`.
const SHARD_ID_SPAN: i64 = 1_000_000_000_000_000;
const LAYOUT_ROW: &str = "idempotent_record";

/// How the claims of one database are laid out.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Layout {
    shards: u16,
}

impl Layout {
    /// The single table `idempotent_record`.
    pub const SINGLE: Layout = Layout { shards: 0 };

    /// `shards` tables; 0 is the single table. Checked against [`MAX_SHARDS`] by the settings.
    pub fn sharded(shards: u16) -> Self {
        Self { shards }
    }

    pub fn shards(self) -> u16 {
        self.shards
    }

    /// The claim tables, in shard order.
    pub fn tables(self) -> Vec<String> {
        if self.shards == 0 {
            return vec![MAIN_TABLE.to_owned()];
        }
        (0..self.shards).map(shard_name).collect()
    }

    /// The statements of the table that holds `key`'s claim.
    pub fn table_for(
        self,
        consumer_group: &str,
        biz_type: &str,
        biz_id: &str,
        execute_time: i64,
    ) -> &'static ClaimTable {
        if self.shards == 0 {
            return claim_table(MAIN_TABLE);
        }
        let shard = shard_of(consumer_group, biz_type, biz_id, execute_time, self.shards);
        claim_table(&shard_name(shard))
    }
}

impl std::fmt::Display for Layout {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self.shards {
            0 => f.write_str("the single table idempotent_record"),
            n => write!(f, "{n} shards (idempotent_record_00 … {})", shard_name(n - 1)),
        }
    }
}

fn shard_name(k: u16) -> String {
    format!("{MAIN_TABLE}_{k:02}")
}

/// The shard of a key: FNV-1a (64 bit) over the group, biz_type, biz_id and execute_time,
/// separated by 0x1F, modulo `shards`. Stable across versions and platforms: a claim's shard
/// is a fact stored in the data, so this function must never change.
pub fn shard_of(consumer_group: &str, biz_type: &str, biz_id: &str, execute_time: i64, shards: u16) -> u16 {
    const OFFSET: u64 = 0xcbf2_9ce4_8422_2325;
    const PRIME: u64 = 0x0000_0100_0000_01b3;
    let mut h = OFFSET;
    let mut eat = |bytes: &[u8]| {
        for b in bytes {
            h ^= u64::from(*b);
            h = h.wrapping_mul(PRIME);
        }
    };
    eat(consumer_group.as_bytes());
    eat(&[0x1f]);
    eat(biz_type.as_bytes());
    eat(&[0x1f]);
    eat(biz_id.as_bytes());
    eat(&[0x1f]);
    eat(execute_time.to_string().as_bytes());
    (h % u64::from(shards.max(1))) as u16
}

/// `sql` with every correlated subquery on the view (`(SELECT … FROM idempotent_record_all r
/// WHERE …)`, whose conditions name columns of the outer query) rewritten as the `UNION ALL` of
/// the same subquery on each claim table: MariaDB materializes the whole view for a correlated
/// subquery instead of pushing the outer row's values into it, which would read every claim;
/// on the tables themselves each branch is one lookup on the unique index. The single table's
/// view merges into the query on every backend, so `sql` is returned as it is there. Made once
/// per statement and layout.
pub(crate) fn correlated(sql: &'static Sql, layout: Layout) -> &'static Sql {
    if layout.shards == 0 {
        return sql;
    }
    static MADE: OnceLock<Mutex<HashMap<(usize, u16), &'static Sql>>> = OnceLock::new();
    let key = (sql as *const Sql as usize, layout.shards);
    let mut made = MADE.get_or_init(Default::default).lock().unwrap_or_else(|p| p.into_inner());
    if let Some(s) = made.get(&key) {
        return s;
    }
    let text = expand_view(sql.portable(), &layout.tables());
    let rewritten: &'static Sql = Box::leak(Box::new(Sql::new(Box::leak(text.into_boxed_str()))));
    made.insert(key, rewritten);
    rewritten
}

/// `sql`, which reads the view as its driving table (`FROM idempotent_record_all c `), once per
/// claim table: MariaDB materializes the whole view of a sharded layout before it filters it,
/// so a statement that reads the claims of a time window must read each table by its own
/// index. The caller runs each and adds up the rows. The single table's view merges into the
/// query, so that layout gets `sql` itself. Correlated subqueries on the view are rewritten as
/// by [`correlated`]. Made once per statement and layout.
pub(crate) fn each_table(sql: &'static Sql, layout: Layout) -> Vec<&'static Sql> {
    if layout.shards == 0 {
        return vec![sql];
    }
    type PerTable = HashMap<(usize, u16), Vec<&'static Sql>>;
    static MADE: OnceLock<Mutex<PerTable>> = OnceLock::new();
    let key = (sql as *const Sql as usize, layout.shards);
    let mut made = MADE.get_or_init(Default::default).lock().unwrap_or_else(|p| p.into_inner());
    made.entry(key)
        .or_insert_with(|| {
            let tables = layout.tables();
            let correlated = expand_view(sql.portable(), &tables);
            tables
                .iter()
                .map(|t| {
                    let text = correlated.replace("FROM idempotent_record_all c ", &format!("FROM {t} c "));
                    &*Box::leak(Box::new(Sql::new(Box::leak(text.into_boxed_str()))))
                })
                .collect()
        })
        .clone()
}

/// Replaces each parenthesised subquery that reads `idempotent_record_all r` by the union of
/// that subquery over `tables`.
fn expand_view(sql: &str, tables: &[String]) -> String {
    const VIEW: &str = "FROM idempotent_record_all r ";
    let mut out = String::with_capacity(sql.len() * tables.len());
    let mut rest = sql;
    while let Some(at) = rest.find(VIEW) {
        // The subquery starts after the nearest unmatched '(' before the view…
        let mut depth = 0;
        let open = rest[..at]
            .char_indices()
            .rev()
            .find(|(_, c)| {
                match c {
                    ')' => depth += 1,
                    '(' if depth == 0 => return true,
                    '(' => depth -= 1,
                    _ => {}
                }
                false
            })
            .map_or(0, |(i, _)| i + 1);
        // …and ends before the ')' that closes it.
        let mut depth = 0;
        let close = rest[at..]
            .char_indices()
            .find(|(_, c)| {
                match c {
                    '(' => depth += 1,
                    ')' if depth == 0 => return true,
                    ')' => depth -= 1,
                    _ => {}
                }
                false
            })
            .map_or(rest.len(), |(i, _)| at + i);
        let subquery = &rest[open..close];
        out.push_str(&rest[..open]);
        let union = tables
            .iter()
            .map(|t| subquery.replace("idempotent_record_all r ", &format!("{t} r ")))
            .collect::<Vec<_>>()
            .join(" UNION ALL ");
        out.push_str(&union);
        rest = &rest[close..];
    }
    out.push_str(rest);
    out
}

/// The claim statements of one table.
pub struct ClaimTable {
    pub name: &'static str,
    pub claim: InsertIfAbsent,
    pub find: Sql,
    /// Deletes one claim: a group commit takes back the claim of a delivery whose handler
    /// failed, inside the group's transaction.
    pub release: Sql,
}

/// The statements of `table`, made once per process (a table's statements live as long as the
/// process, like the crate's static ones; there are at most [`MAX_SHARDS`] + 1 tables).
fn claim_table(table: &str) -> &'static ClaimTable {
    static TABLES: OnceLock<Mutex<HashMap<String, &'static ClaimTable>>> = OnceLock::new();
    let mut tables = TABLES.get_or_init(Default::default).lock().unwrap_or_else(|p| p.into_inner());
    if let Some(t) = tables.get(table) {
        return t;
    }
    let leak = |s: String| -> &'static str { Box::leak(s.into_boxed_str()) };
    let insert = format!(
        "INSERT INTO {table} (consumer_group, biz_type, biz_id, execute_time, msg_id, uniq_key, \
         payload_hash, instance_id, claimed_at_ms) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)"
    );
    let on_conflict =
        format!("{insert} ON CONFLICT (consumer_group, biz_type, biz_id, execute_time) DO NOTHING");
    let made: &'static ClaimTable = Box::leak(Box::new(ClaimTable {
        name: leak(table.to_owned()),
        claim: InsertIfAbsent::new(leak(insert), leak(on_conflict), "idempotent_record_claim_key"),
        find: Sql::new(leak(format!(
            "SELECT msg_id, uniq_key, payload_hash FROM {table} \
             WHERE consumer_group = ? AND biz_type = ? AND biz_id = ? AND execute_time = ?"
        ))),
        release: Sql::new(leak(format!(
            "DELETE FROM {table} WHERE consumer_group = ? AND biz_type = ? AND biz_id = ? AND execute_time = ?"
        ))),
    }));
    tables.insert(table.to_owned(), made);
    made
}

/// The recorded layout disagrees with the configured one, or cannot be set up.
#[derive(Debug, thiserror::Error)]
pub enum LayoutError {
    #[error(
        "configuration key dedup.shards: this database's claims are laid out in {recorded} (recorded at {at} by {by}); \
         dedup.shards = {wanted} would claim keys in other tables than their earlier claims and let duplicates \
         through. Set dedup.shards = {} or use another database",
        recorded.shards()
    )]
    Mismatch { recorded: Layout, wanted: u16, at: String, by: String },
    #[error(
        "configuration key dedup.shards: idempotent_record already holds claims, so this database cannot be \
         sharded (the existing claims would not be seen by the shards); keep dedup.shards = 0 or start the \
         sharded layout on a new database"
    )]
    NotEmpty,
    #[error("setting up the claim tables failed")]
    Database(#[from] sqlx::Error),
}

static READ_LAYOUT: Sql =
    Sql::new("SELECT shards, created_at_ms, created_by FROM dedup_layout WHERE name = ?");
static RECORD_LAYOUT: InsertIfAbsent = crate::store::insert_if_absent!(
    "INSERT INTO dedup_layout (name, shards, created_at_ms, created_by) VALUES (?, ?, ?, ?)",
    conflict = "(name)",
    index = "PRIMARY"
);
static ANY_MAIN_CLAIM: Sql = Sql::new("SELECT 1 FROM idempotent_record LIMIT 1");

struct Recorded {
    layout: Layout,
    at_ms: i64,
    by: String,
}

async fn read(store: &Store) -> Result<Option<Recorded>, sqlx::Error> {
    let row = store.query(&READ_LAYOUT).bind(LAYOUT_ROW).fetch_optional(store.pool()).await?;
    row.map(|r| {
        let shards: i32 = r.try_get(0)?;
        Ok(Recorded {
            layout: Layout { shards: u16::try_from(shards).unwrap_or(0) },
            at_ms: r.try_get(1)?,
            by: r.try_get(2)?,
        })
    })
    .transpose()
}

/// The layout recorded for this database, read only: the single table when none is recorded
/// yet. For readers that must not write (the metrics).
pub async fn current(store: &Store) -> Result<Layout, sqlx::Error> {
    Ok(read(store).await?.map_or(Layout::SINGLE, |r| r.layout))
}

/// The layout recorded for this database; a database that has none yet is recorded as the
/// single table (the layout every database had before sharding existed).
pub(crate) async fn recorded(store: &Store) -> Result<Layout, sqlx::Error> {
    if let Some(r) = read(store).await? {
        return Ok(r.layout);
    }
    match ensure(store, 0, "gate").await {
        Ok(layout) => Ok(layout),
        Err(LayoutError::Database(e)) => Err(e),
        // Another process recorded a sharded layout meanwhile: that one holds.
        Err(LayoutError::Mismatch { recorded, .. }) => Ok(recorded),
        Err(LayoutError::NotEmpty) => Ok(Layout::SINGLE),
    }
}

/// Makes sure the database's claims are laid out in `wanted` shards (0: the single table):
/// records the layout on first use, creating the shard tables and the readers' view, and
/// refuses a database already laid out otherwise.
pub async fn ensure(store: &Store, wanted: u16, by: &str) -> Result<Layout, LayoutError> {
    let mismatch = |r: Recorded| LayoutError::Mismatch {
        recorded: r.layout,
        wanted,
        at: crate::clock::format_ms(r.at_ms),
        by: r.by,
    };
    if let Some(r) = read(store).await? {
        if r.layout.shards != wanted {
            return Err(mismatch(r));
        }
        if wanted > 0 {
            // Also finishes a set-up that a crash interrupted after the row was written.
            create_shards(store, wanted).await?;
        }
        return Ok(r.layout);
    }
    if wanted > 0 {
        if store.query(&ANY_MAIN_CLAIM).fetch_optional(store.pool()).await?.is_some() {
            return Err(LayoutError::NotEmpty);
        }
        create_shards(store, wanted).await?;
    }
    let mut conn = store.pool().acquire().await?;
    RECORD_LAYOUT
        .execute(&mut conn, store.backend(), |q| {
            q.bind(LAYOUT_ROW).bind(i32::from(wanted)).bind(crate::clock::now_ms()).bind(by.to_owned())
        })
        .await?;
    drop(conn);
    match read(store).await? {
        Some(r) if r.layout.shards == wanted => Ok(r.layout),
        Some(r) => Err(mismatch(r)),
        None => Err(LayoutError::Database(sqlx::Error::RowNotFound)),
    }
}

const COLUMNS: &str = "id, consumer_group, biz_type, biz_id, execute_time, msg_id, uniq_key, payload_hash, instance_id, claimed_at_ms";

/// Creates the shard tables that are missing and points the view at all of them.
async fn create_shards(store: &Store, shards: u16) -> Result<(), sqlx::Error> {
    let backend = store.backend();
    let pool = store.pool();
    for k in 0..shards {
        let table = shard_name(k);
        let first_id = (i64::from(k) + 1) * SHARD_ID_SPAN;
        match backend {
            // LIKE … INCLUDING ALL copies the columns, the unique key, the indexes and the id's
            // default, so every shard draws its ids from idempotent_record's sequence.
            Backend::Postgres => {
                pool.execute(AssertSqlSafe(format!(
                    "CREATE TABLE IF NOT EXISTS {table} (LIKE {MAIN_TABLE} INCLUDING ALL)"
                )))
                .await?;
            }
            Backend::MySql => {
                pool.execute(AssertSqlSafe(format!("CREATE TABLE IF NOT EXISTS {table} LIKE {MAIN_TABLE}")))
                    .await?;
                // Only a shard whose counter is still below its range is altered: an ALTER takes
                // the table's metadata lock, which a restart must not take from live consumers.
                let counter: Option<i64> = sqlx::query(
                    "SELECT CAST(AUTO_INCREMENT AS SIGNED) FROM information_schema.TABLES \
                     WHERE TABLE_SCHEMA = DATABASE() AND TABLE_NAME = ?",
                )
                .bind(table.clone())
                .fetch_one(pool)
                .await?
                .try_get(0)?;
                if counter.is_none_or(|next| next <= first_id) {
                    pool.execute(AssertSqlSafe(format!(
                        "ALTER TABLE {table} AUTO_INCREMENT = {}",
                        first_id + 1
                    )))
                    .await?;
                }
            }
            // SQLite has no CREATE TABLE … LIKE: the main table's own DDL (and its indexes'),
            // as SQLite keeps it, with the table's name in place of the main one's.
            Backend::Sqlite => {
                let ddl = sqlx::query(
                    "SELECT sql FROM sqlite_master WHERE tbl_name = 'idempotent_record' AND sql IS NOT NULL \
                     ORDER BY type DESC",
                )
                .fetch_all(pool)
                .await?;
                let mut statements = Vec::with_capacity(ddl.len() + 1);
                for row in &ddl {
                    let sql: String = row.try_get(0)?;
                    statements.push(
                        sql.replace(MAIN_TABLE, &table)
                            .replacen("CREATE TABLE ", "CREATE TABLE IF NOT EXISTS ", 1)
                            .replacen("CREATE INDEX ", "CREATE INDEX IF NOT EXISTS ", 1),
                    );
                }
                statements.push(format!(
                    "INSERT INTO sqlite_sequence (name, seq) SELECT '{table}', {first_id} \
                     WHERE NOT EXISTS (SELECT 1 FROM sqlite_sequence WHERE name = '{table}')"
                ));
                pool.execute(AssertSqlSafe(statements.join(";\n"))).await?;
            }
        }
    }
    let union = std::iter::once(MAIN_TABLE.to_owned())
        .chain((0..shards).map(shard_name))
        .map(|t| format!("SELECT {COLUMNS} FROM {t}"))
        .collect::<Vec<_>>()
        .join(" UNION ALL ");
    let view = match backend {
        Backend::Postgres | Backend::MySql => format!("CREATE OR REPLACE VIEW {ALL_CLAIMS_VIEW} AS {union}"),
        Backend::Sqlite => {
            format!("DROP VIEW IF EXISTS {ALL_CLAIMS_VIEW}; CREATE VIEW {ALL_CLAIMS_VIEW} AS {union}")
        }
    };
    pool.execute(AssertSqlSafe(view)).await?;
    Ok(())
}

/// `[dedup]`: how the claims are laid out.
#[derive(Debug, Clone, Default, PartialEq, serde::Serialize, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DedupSettings {
    /// `IDEMGATE_DEDUP__SHARDS`: 0 keeps every claim in `idempotent_record`; 2 to 100 splits
    /// them over `idempotent_record_00 …` by a stable hash of the key. Fixed when the first
    /// process runs on a database: a later start with another value is refused.
    pub shards: u16,
}

impl DedupSettings {
    pub fn validate(&self) -> Result<(), crate::setting::Invalid> {
        if self.shards == 1 || self.shards > MAX_SHARDS {
            return Err(crate::setting::invalid(
                "dedup.shards",
                format!("is {}; use 0 (one table) or 2 to {MAX_SHARDS}", self.shards),
            ));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_shard_of_a_key_never_changes() {
        // Fixed vectors: a change here moves existing claims out of their shard's sight.
        assert_eq!(shard_of("g", "stock.deduct", "D-1", 0, 16), shard_of("g", "stock.deduct", "D-1", 0, 16));
        let fixed: Vec<u16> = ["A", "B", "C", "ORDER-2026-000123"]
            .iter()
            .map(|id| shard_of("idemgate_shop_consumer", "order.create", id, 0, 16))
            .collect();
        assert_eq!(fixed, vec![5, 0, 11, 10], "FNV-1a, as any other FNV-1a implementation computes it");
        assert_ne!(
            shard_of("g", "t", "x", 0, 97),
            shard_of("g", "t", "x", 1, 97),
            "execute_time is part of the key"
        );
    }

    #[test]
    fn keys_spread_evenly_over_the_shards() {
        let mut counts = [0u32; 16];
        for i in 0..160_000 {
            counts[shard_of("g", "stock.deduct", &format!("DEDUCT-{i}"), 0, 16) as usize] += 1;
        }
        for c in counts {
            assert!((9_000..=11_000).contains(&c), "{counts:?}");
        }
    }

    #[test]
    fn a_correlated_subquery_on_the_view_becomes_one_per_table() {
        let sql = "SELECT a FROM d WHERE x = ? AND NOT EXISTS (SELECT 1 FROM idempotent_record_all r WHERE \
                   r.k = d.k AND (r.t = d.t)) AND NOT EXISTS (SELECT 1 FROM other r WHERE r.k = d.k) LIMIT ?";
        let tables = Layout::sharded(2).tables();
        assert_eq!(
            expand_view(sql, &tables),
            "SELECT a FROM d WHERE x = ? AND NOT EXISTS (SELECT 1 FROM idempotent_record_00 r WHERE \
             r.k = d.k AND (r.t = d.t) UNION ALL SELECT 1 FROM idempotent_record_01 r WHERE r.k = d.k AND \
             (r.t = d.t)) AND NOT EXISTS (SELECT 1 FROM other r WHERE r.k = d.k) LIMIT ?"
        );
        let scalar = "SELECT id, (SELECT r.c FROM idempotent_record_all r WHERE r.k = l.k) FROM l";
        assert_eq!(
            expand_view(scalar, &tables),
            "SELECT id, (SELECT r.c FROM idempotent_record_00 r WHERE r.k = l.k UNION ALL \
             SELECT r.c FROM idempotent_record_01 r WHERE r.k = l.k) FROM l"
        );
        static SQL: Sql = Sql::new("SELECT (SELECT 1 FROM idempotent_record_all r WHERE r.k = l.k) FROM l");
        assert!(std::ptr::eq(correlated(&SQL, Layout::SINGLE), &SQL));
        assert!(std::ptr::eq(correlated(&SQL, Layout::sharded(3)), correlated(&SQL, Layout::sharded(3))));
    }

    #[test]
    fn a_statement_driven_by_the_view_is_made_once_per_table() {
        static SQL: Sql = Sql::new("SELECT c.k FROM idempotent_record_all c WHERE c.t >= ? LIMIT ?");
        assert_eq!(each_table(&SQL, Layout::SINGLE).len(), 1);
        assert!(std::ptr::eq(each_table(&SQL, Layout::SINGLE)[0], &SQL));
        let each: Vec<&str> = each_table(&SQL, Layout::sharded(2)).iter().map(|s| s.portable()).collect();
        assert_eq!(
            each,
            [
                "SELECT c.k FROM idempotent_record_00 c WHERE c.t >= ? LIMIT ?",
                "SELECT c.k FROM idempotent_record_01 c WHERE c.t >= ? LIMIT ?"
            ]
        );
    }

    #[test]
    fn tables_are_named_with_two_digits() {
        assert_eq!(Layout::SINGLE.tables(), vec!["idempotent_record"]);
        assert_eq!(
            Layout::sharded(3).tables(),
            vec!["idempotent_record_00", "idempotent_record_01", "idempotent_record_02"]
        );
        let t = Layout::sharded(4).table_for("g", "t", "x", 0);
        assert!(t.name.starts_with("idempotent_record_0"));
        assert!(t.find.text(Backend::Postgres).as_str().contains(t.name));
    }
}
