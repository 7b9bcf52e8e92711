//! One batch: the statements that move a range of expired claims to the archive, or delete a
//! range of expired log rows, in one transaction each.
//!
//! Batches walk the primary key. Once per pass, the newest expired row is found through the
//! time index (`claimed_at_ms`, `logged_at_ms`) and its neighbourhood gives the highest id to
//! visit; each batch then reads the next `N` expired ids above the last one through the primary
//! key, and copies and deletes exactly the ids in that range that are expired. No batch scans
//! the table, and the rows within the retention are never visited past that bound.
//!
//! This module owns these statements. It must not take the lease or record runs.

use std::collections::HashMap;
use std::sync::{Mutex, OnceLock};

use sqlx::any::AnyRow;
use sqlx::{AssertSqlSafe, Row};

use crate::store::{Backend, Sql, Store};

use super::RunKind;

/// Ids and time stamps are not assigned in one step (a claim's time is read just before its
/// insert), so the ids of rows a few moments apart may be out of order. The bound is the highest
/// id among the rows expired within this much before the newest expired one.
const ID_DISORDER_MS: i64 = 10 * 60 * 1_000;

/// One table a pass walks, with its statements: `delivery_log` for the log pass, each claim
/// table of the layout ([`crate::layout`]) for the dedup pass.
pub(crate) struct Target {
    pub table: &'static str,
    kind: RunKind,
    newest_expired: Sql,
    highest_id: Sql,
    next_range: Sql,
    count_expired: Sql,
    /// Claims only: the copy to the archive (PostgreSQL and SQLite, MySQL/MariaDB).
    copy: Option<(Sql, Sql)>,
    delete: Sql,
}

// Copying a claim the archive already holds (by its id) must neither fail the batch nor store
// it twice. PostgreSQL and SQLite say so with ON CONFLICT (id) DO NOTHING; MySQL/MariaDB have no
// such clause and use a no-op ON DUPLICATE KEY UPDATE (INSERT IGNORE would also hide truncation
// and other errors).
const ARCHIVE_COLUMNS: &str = "id, consumer_group, biz_type, biz_id, execute_time, msg_id, uniq_key, \
                               payload_hash, instance_id, claimed_at_ms";

impl Target {
    /// The statements for `table`, made once per process and table (the crate's statements are
    /// static; a layout has at most [`crate::layout::MAX_SHARDS`] tables).
    fn of(kind: RunKind, table: &str) -> &'static Target {
        static TARGETS: OnceLock<Mutex<HashMap<String, &'static Target>>> = OnceLock::new();
        let mut targets = TARGETS.get_or_init(Default::default).lock().unwrap_or_else(|p| p.into_inner());
        if let Some(t) = targets.get(table) {
            return t;
        }
        let sql = |text: String| Sql::new(Box::leak(text.into_boxed_str()));
        let time = match kind {
            RunKind::Dedup => "claimed_at_ms",
            RunKind::Log => "logged_at_ms",
        };
        let copy = (kind == RunKind::Dedup).then(|| {
            let insert = format!(
                "INSERT INTO idempotent_record_archive ({ARCHIVE_COLUMNS}, archived_at_ms) \
                 SELECT {ARCHIVE_COLUMNS}, ? FROM {table} WHERE id >= ? AND id <= ? AND claimed_at_ms < ?"
            );
            (
                sql(format!("{insert} ON CONFLICT (id) DO NOTHING")),
                sql(format!(
                    "{insert} ON DUPLICATE KEY UPDATE idempotent_record_archive.id = idempotent_record_archive.id"
                )),
            )
        });
        let made: &'static Target = Box::leak(Box::new(Target {
            table: Box::leak(table.to_owned().into_boxed_str()),
            kind,
            newest_expired: sql(format!(
                "SELECT {time} FROM {table} WHERE {time} < ? ORDER BY {time} DESC LIMIT 1"
            )),
            highest_id: sql(format!("SELECT MAX(id) FROM {table} WHERE {time} < ? AND {time} >= ?")),
            next_range: sql(format!(
                "SELECT MIN(id), MAX(id), COUNT(*) FROM (SELECT id FROM {table} \
                 WHERE id > ? AND id <= ? AND {time} < ? ORDER BY id LIMIT ?) expired"
            )),
            count_expired: sql(format!("SELECT COUNT(*) FROM {table} WHERE {time} < ?")),
            copy,
            delete: sql(format!("DELETE FROM {table} WHERE id >= ? AND id <= ? AND {time} < ?")),
        }));
        targets.insert(table.to_owned(), made);
        made
    }

    pub(super) fn kind(&self) -> RunKind {
        self.kind
    }

    fn copy(&self, backend: Backend) -> Option<&Sql> {
        self.copy.as_ref().map(|(portable, mysql)| match backend {
            Backend::MySql => mysql,
            Backend::Postgres | Backend::Sqlite => portable,
        })
    }
}

/// The tables a pass of `kind` walks, in order.
pub(crate) async fn targets(store: &Store, kind: RunKind) -> Result<Vec<&'static Target>, sqlx::Error> {
    Ok(match kind {
        // A partitioned log's days are dropped whole; only its `before` and overflow partitions
        // are deleted row by row.
        RunKind::Log => crate::delivery_log::partitions::shape(store)
            .await?
            .row_wise_tables(store.backend())
            .iter()
            .map(|t| Target::of(kind, t))
            .collect(),
        RunKind::Dedup => {
            crate::layout::current(store).await?.tables().iter().map(|t| Target::of(kind, t)).collect()
        }
    })
}

/// A pass's walk: ids above `after` up to `through`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Walk {
    pub after: i64,
    pub through: i64,
}

/// The highest id a pass visits, or `None` when nothing is expired.
pub(crate) async fn bound(store: &Store, t: &Target, cutoff_ms: i64) -> Result<Option<Walk>, sqlx::Error> {
    let newest = store.query(&t.newest_expired).bind(cutoff_ms).fetch_optional(store.pool()).await?;
    let Some(newest) = newest else { return Ok(None) };
    let newest: i64 = newest.try_get(0)?;
    let row = store
        .query(&t.highest_id)
        .bind(cutoff_ms)
        .bind(newest - ID_DISORDER_MS)
        .fetch_one(store.pool())
        .await?;
    let highest: Option<i64> = row.try_get(0)?;
    Ok(highest.map(|through| Walk { after: 0, through }))
}

/// How many rows are expired now: the estimate a progress bar needs. An index range count.
pub(crate) async fn count_expired(store: &Store, t: &Target, cutoff_ms: i64) -> Result<i64, sqlx::Error> {
    store.query(&t.count_expired).bind(cutoff_ms).fetch_one(store.pool()).await?.try_get(0)
}

/// What one batch did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Batch {
    pub first_id: i64,
    pub last_id: i64,
    /// Rows now gone from the live table (and, for claims, in the archive).
    pub rows: u64,
    /// Claims the archive already held, kept once (PostgreSQL and SQLite count them).
    pub already_archived: u64,
}

/// Where a batch should stop short, to show what a crash there leaves behind.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Interrupt {
    None,
    /// Give up after the copy and before the delete, with the transaction open.
    AfterCopy,
}

/// The batch stopped where it was told to; its transaction was rolled back.
#[derive(Debug)]
pub(crate) struct Interrupted;

/// Moves (claims) or deletes (log rows) the next `limit` expired rows of `walk`, in one
/// transaction. `None` when none are left. Transient conflicts are retried a few times.
pub(crate) async fn run(
    store: &Store,
    t: &Target,
    cutoff_ms: i64,
    walk: Walk,
    limit: u32,
    now_ms: i64,
    interrupt: Interrupt,
) -> Result<Result<Option<Batch>, Interrupted>, sqlx::Error> {
    // A batch that conflicted with a consumer is simply redone.
    store.retry_transient(5, 20, || once(store, t, cutoff_ms, walk, limit, now_ms, interrupt)).await.0
}

async fn once(
    store: &Store,
    t: &Target,
    cutoff_ms: i64,
    walk: Walk,
    limit: u32,
    now_ms: i64,
    interrupt: Interrupt,
) -> Result<Result<Option<Batch>, Interrupted>, sqlx::Error> {
    let (backend, kind) = (store.backend(), t.kind);
    let mut tx = store.begin().await?;
    let range = store
        .query(&t.next_range)
        .bind(walk.after)
        .bind(walk.through)
        .bind(cutoff_ms)
        .bind(i64::from(limit))
        .fetch_one(&mut *tx)
        .await?;
    let (first, last, count): (Option<i64>, Option<i64>, i64) =
        (range.try_get(0)?, range.try_get(1)?, range.try_get(2)?);
    let (Some(first_id), Some(last_id)) = (first, last) else {
        tx.rollback().await?;
        return Ok(Ok(None));
    };
    let mut copied = 0;
    if let Some(copy) = t.copy(backend) {
        copied = store
            .query(copy)
            .bind(now_ms)
            .bind(first_id)
            .bind(last_id)
            .bind(cutoff_ms)
            .execute(&mut *tx)
            .await?
            .rows_affected();
    }
    if interrupt == Interrupt::AfterCopy {
        // Dropping the transaction rolls it back, as a killed process's connection would.
        drop(tx);
        return Ok(Err(Interrupted));
    }
    let deleted = store
        .query(&t.delete)
        .bind(first_id)
        .bind(last_id)
        .bind(cutoff_ms)
        .execute(&mut *tx)
        .await?
        .rows_affected();
    // The range holds exactly the `count` rows read above; anything else means another process
    // moved or deleted some of them meanwhile. Roll back rather than leave a row in neither or
    // both tables.
    if deleted != count as u64 || copied > deleted {
        tx.rollback().await?;
        return Err(sqlx::Error::Protocol(format!(
            "{kind} batch {first_id}..={last_id} of {}: read {count} rows, copied {copied}, deleted {deleted}; \
             another process changed them, the batch was rolled back",
            t.table
        )));
    }
    tx.commit().await?;
    let already_archived = match (kind, backend) {
        (RunKind::Dedup, Backend::Postgres | Backend::Sqlite) => deleted - copied,
        _ => 0,
    };
    Ok(Ok(Some(Batch { first_id, last_id, rows: deleted, already_archived })))
}

/// The statements a pass would run, with the database's plan for each (EXPLAIN), for a dry run.
pub(crate) async fn explain(
    store: &Store,
    t: &Target,
    cutoff_ms: i64,
    walk: Walk,
    limit: u32,
) -> Result<Vec<(String, Vec<String>)>, sqlx::Error> {
    let backend = store.backend();
    let mut out = Vec::new();
    for (sql, binds) in [
        (&t.newest_expired, vec![cutoff_ms]),
        (&t.next_range, vec![walk.after, walk.through, cutoff_ms, i64::from(limit)]),
        (&t.delete, vec![walk.after + 1, walk.through, cutoff_ms]),
    ] {
        let text = sql.text(backend);
        // Each backend has its own EXPLAIN: PostgreSQL's text plan, MySQL/MariaDB's JSON (the
        // tabular form has a column set that differs between versions), SQLite's query plan.
        let prefix = match backend {
            Backend::Postgres => "EXPLAIN ",
            Backend::MySql => "EXPLAIN FORMAT=JSON ",
            Backend::Sqlite => "EXPLAIN QUERY PLAN ",
        };
        let mut q = sqlx::query(AssertSqlSafe(format!("{prefix}{}", text.as_str())));
        for b in binds {
            q = q.bind(b);
        }
        let rows = q.fetch_all(store.pool()).await?;
        let plan = rows.iter().map(|r| plan_line(backend, r)).collect::<Vec<_>>();
        out.push((text.as_str().to_owned(), plan));
    }
    if let Some(copy) = t.copy(backend) {
        out.push((
            copy.text(backend).as_str().to_owned(),
            vec![format!("reads the same id range and rows ({ARCHIVE_COLUMNS}) as the DELETE")],
        ));
    }
    Ok(out)
}

/// One row of EXPLAIN output as text: SQLite's `detail` column, otherwise the first column.
fn plan_line(backend: Backend, r: &AnyRow) -> String {
    let column = match backend {
        Backend::Sqlite => 3,
        Backend::Postgres | Backend::MySql => 0,
    };
    if let Ok(text) = r.try_get::<String, _>(column) {
        return text;
    }
    if let Ok(bytes) = r.try_get::<Vec<u8>, _>(column) {
        return String::from_utf8_lossy(&bytes).into_owned();
    }
    "(plan not readable)".to_owned()
}
