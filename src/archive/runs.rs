//! The record of archive runs: one `archive_run` row per pass (`dedup` or `log`) of every run,
//! written as the run goes, so that the UI and the metrics read start and end, cutoff, rows
//! moved, batches, status and error from one place.
//!
//! This module owns `archive_run`. It must not move rows or take the lease.

use sqlx::Row;
use sqlx::any::AnyRow;

use crate::labelled::labelled;
use crate::store::{Sql, Store};

labelled! {
    /// What a pass trims.
    RunKind {
        /// Claims moved from `idempotent_record` to `idempotent_record_archive`.
        Dedup => "dedup",
        /// Delivery-log rows deleted.
        Log => "log",
    }
}

labelled! {
    /// Where a pass stands.
    RunStatus {
        Running => "running",
        /// Finished; `note` says when the time budget stopped it with rows left for next time.
        Success => "success",
        /// Stopped by an error (in `error`), or abandoned by a process that died.
        Failed => "failed",
        /// Another instance held the lease.
        Skipped => "skipped",
    }
}

labelled! {
    /// Who started a run.
    StartedBy {
        Schedule => "schedule",
        Command => "command",
    }
}

/// One `archive_run` row.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct RunRecord {
    pub id: i64,
    pub kind: RunKind,
    pub status: RunStatus,
    pub started_by: StartedBy,
    pub instance_id: String,
    pub started_at_ms: i64,
    pub finished_at_ms: Option<i64>,
    pub cutoff_ms: i64,
    pub rows_moved: i64,
    pub batches: i64,
    pub error: Option<String>,
    pub note: Option<String>,
}

const COLUMNS: &str = "id, kind, status, started_by, instance_id, started_at_ms, finished_at_ms, cutoff_ms, \
                       rows_moved, batches, error, note";

static START: Sql = Sql::new(
    "INSERT INTO archive_run (kind, status, started_by, instance_id, started_at_ms, finished_at_ms, \
     cutoff_ms, rows_moved, batches, error, note, closed_by) VALUES (?, ?, ?, ?, ?, ?, ?, 0, 0, NULL, ?, ?)",
);
// PostgreSQL has no last-insert id on the connection and sqlx's SQLite driver does not report
// one through `Any`: both return the new id (SQLite since 3.35). MySQL has no RETURNING and
// reports LAST_INSERT_ID() instead.
static START_RETURNING: Sql = Sql::new(
    "INSERT INTO archive_run (kind, status, started_by, instance_id, started_at_ms, finished_at_ms, \
     cutoff_ms, rows_moved, batches, error, note, closed_by) VALUES (?, ?, ?, ?, ?, ?, ?, 0, 0, NULL, ?, ?) \
     RETURNING id",
);
static PROGRESS: Sql = Sql::new("UPDATE archive_run SET rows_moved = ?, batches = ? WHERE id = ?");
// The instance that ran a pass closes it; a pass its dead process left running is closed by
// the instance that next holds the lease (`closed_by`, which the metrics count passes by).
static FINISH: Sql = Sql::new(
    "UPDATE archive_run SET status = ?, finished_at_ms = ?, rows_moved = ?, batches = ?, error = ?, note = ?, \
     closed_by = instance_id WHERE id = ?",
);
static ABANDON: Sql = Sql::new(
    "UPDATE archive_run SET status = 'failed', finished_at_ms = ?, closed_by = ?, \
     error = 'the run stopped before finishing (its process died); its lease expired' \
     WHERE status = 'running'",
);
static RECENT: Sql = Sql::new(
    "SELECT id, kind, status, started_by, instance_id, started_at_ms, finished_at_ms, cutoff_ms, \
     rows_moved, batches, error, note FROM archive_run ORDER BY id DESC LIMIT ?",
);
static LAST_SUCCESS: Sql = Sql::new(
    "SELECT id, kind, status, started_by, instance_id, started_at_ms, finished_at_ms, cutoff_ms, \
     rows_moved, batches, error, note FROM archive_run WHERE kind = ? AND status = 'success' \
     ORDER BY id DESC LIMIT 1",
);

/// A new row for a pass that starts now (`Running`) or was skipped (`Skipped`, finished at once).
#[allow(clippy::too_many_arguments)]
pub(crate) async fn start(
    store: &Store,
    kind: RunKind,
    status: RunStatus,
    started_by: StartedBy,
    instance_id: &str,
    now_ms: i64,
    cutoff_ms: i64,
    note: Option<&str>,
) -> Result<i64, sqlx::Error> {
    let finished = (status != RunStatus::Running).then_some(now_ms);
    store
        .insert_returning_id(&START_RETURNING, &START, |q| {
            q.bind(kind.as_str())
                .bind(status.as_str())
                .bind(started_by.as_str())
                .bind(instance_id.to_owned())
                .bind(now_ms)
                .bind(finished)
                .bind(cutoff_ms)
                .bind(note.map(str::to_owned))
                .bind(finished.map(|_| instance_id.to_owned()))
        })
        .await
}

/// Records how far a running pass has come, for a page that watches it.
pub(crate) async fn progress(store: &Store, id: i64, rows: i64, batches: i64) -> Result<(), sqlx::Error> {
    store.query(&PROGRESS).bind(rows).bind(batches).bind(id).execute(store.pool()).await?;
    Ok(())
}

/// Closes a pass.
#[allow(clippy::too_many_arguments)]
pub(crate) async fn finish(
    store: &Store,
    id: i64,
    status: RunStatus,
    now_ms: i64,
    rows: i64,
    batches: i64,
    error: Option<&str>,
    note: Option<&str>,
) -> Result<(), sqlx::Error> {
    store
        .query(&FINISH)
        .bind(status.as_str())
        .bind(now_ms)
        .bind(rows)
        .bind(batches)
        .bind(error.map(str::to_owned))
        .bind(note.map(str::to_owned))
        .bind(id)
        .execute(store.pool())
        .await?;
    Ok(())
}

/// Marks the passes left `running` by a process that died as failed, closed by `closer`. Called
/// by the holder of the lease only, when no other run can be going.
pub(crate) async fn abandon_stale(store: &Store, now_ms: i64, closer: &str) -> Result<u64, sqlx::Error> {
    let abandon = store.query(&ABANDON).bind(now_ms).bind(closer.to_owned());
    Ok(abandon.execute(store.pool()).await?.rows_affected())
}

/// The latest `limit` passes, newest first: the UI's table of runs.
pub async fn recent(store: &Store, limit: i64) -> Result<Vec<RunRecord>, sqlx::Error> {
    let rows = store.query(&RECENT).bind(limit).fetch_all(store.pool()).await?;
    rows.iter().map(record).collect()
}

/// The latest successful pass of `kind`. For `Log`, its cutoff is where the delivery log's
/// history now starts: the trace page says so when it shows an older period.
pub async fn last_success(store: &Store, kind: RunKind) -> Result<Option<RunRecord>, sqlx::Error> {
    let row = store.query(&LAST_SUCCESS).bind(kind.as_str()).fetch_optional(store.pool()).await?;
    row.as_ref().map(record).transpose()
}

fn record(r: &AnyRow) -> Result<RunRecord, sqlx::Error> {
    let word = |i: usize| -> Result<String, sqlx::Error> { r.try_get::<String, _>(i) };
    let unknown = |i: usize, v: String| sqlx::Error::ColumnDecode {
        index: COLUMNS.split(", ").nth(i).unwrap_or("?").to_owned(),
        source: format!("unknown value {v:?}").into(),
    };
    let kind = word(1)?;
    let status = word(2)?;
    let started_by = word(3)?;
    Ok(RunRecord {
        id: r.try_get(0)?,
        kind: RunKind::parse(&kind).ok_or_else(|| unknown(1, kind.clone()))?,
        status: RunStatus::parse(&status).ok_or_else(|| unknown(2, status.clone()))?,
        started_by: StartedBy::parse(&started_by).ok_or_else(|| unknown(3, started_by.clone()))?,
        instance_id: r.try_get(4)?,
        started_at_ms: r.try_get(5)?,
        finished_at_ms: r.try_get(6)?,
        cutoff_ms: r.try_get(7)?,
        rows_moved: r.try_get(8)?,
        batches: r.try_get(9)?,
        error: r.try_get(10)?,
        note: r.try_get(11)?,
    })
}
