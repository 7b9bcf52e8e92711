//! The record of reconcile runs: one `reconcile_run` row per run and one `reconcile_anomaly`
//! row per finding, written by [`super::reconcile_once`] and read by the UI and `/metrics`.

use std::collections::BTreeMap;

use serde::Serialize;
use sqlx::Row;
use sqlx::any::AnyRow;

use super::check::{Anomaly, AnomalyKind, ReconcileOptions};
use crate::store::{Sql, Store};

/// One `reconcile_run` row.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct RunRecord {
    pub id: i64,
    pub status: String,
    pub started_by: String,
    pub instance_id: String,
    pub consumer_group: String,
    pub biz_type: String,
    pub since_ms: i64,
    pub until_ms: i64,
    pub started_at_ms: i64,
    pub finished_at_ms: Option<i64>,
    pub anomalies: i64,
    pub error: Option<String>,
}

static START: Sql = Sql::new(
    "INSERT INTO reconcile_run (status, started_by, instance_id, consumer_group, biz_type, since_ms, until_ms, \
     started_at_ms, anomalies) VALUES ('running', ?, ?, ?, ?, ?, ?, ?, 0)",
);
static START_RETURNING: Sql = Sql::new(
    "INSERT INTO reconcile_run (status, started_by, instance_id, consumer_group, biz_type, since_ms, until_ms, \
     started_at_ms, anomalies) VALUES ('running', ?, ?, ?, ?, ?, ?, ?, 0) RETURNING id",
);
static ADD: Sql = Sql::new(
    "INSERT INTO reconcile_anomaly (run_id, kind, consumer_group, biz_type, biz_id, execute_time, first_seen_ms, \
     last_seen_ms, detail) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)",
);
static FINISH: Sql =
    Sql::new("UPDATE reconcile_run SET status = 'success', finished_at_ms = ?, anomalies = ? WHERE id = ?");
static FAIL: Sql =
    Sql::new("UPDATE reconcile_run SET status = 'failed', finished_at_ms = ?, error = ? WHERE id = ?");
static RECENT: Sql = Sql::new(
    "SELECT id, status, started_by, instance_id, consumer_group, biz_type, since_ms, until_ms, started_at_ms, \
     finished_at_ms, anomalies, error FROM reconcile_run ORDER BY id DESC LIMIT ?",
);
static ONE: Sql = Sql::new(
    "SELECT id, status, started_by, instance_id, consumer_group, biz_type, since_ms, until_ms, started_at_ms, \
     finished_at_ms, anomalies, error FROM reconcile_run WHERE id = ?",
);
static LAST_SUCCESS: Sql = Sql::new(
    "SELECT id, status, started_by, instance_id, consumer_group, biz_type, since_ms, until_ms, started_at_ms, \
     finished_at_ms, anomalies, error FROM reconcile_run WHERE consumer_group = ? AND status = 'success' \
     ORDER BY id DESC LIMIT 1",
);
static ANOMALIES: Sql = Sql::new(
    "SELECT kind, consumer_group, biz_type, biz_id, execute_time, first_seen_ms, last_seen_ms, detail \
     FROM reconcile_anomaly WHERE run_id = ? AND (? = '' OR kind = ?) ORDER BY kind, id LIMIT ?",
);
static COUNTS: Sql = Sql::new("SELECT kind, COUNT(*) FROM reconcile_anomaly WHERE run_id = ? GROUP BY kind");

/// Records a run that starts now; returns its id.
pub(crate) async fn start(store: &Store, o: &ReconcileOptions, now_ms: i64) -> Result<i64, sqlx::Error> {
    store
        .insert_returning_id(&START_RETURNING, &START, |q| {
            q.bind(o.started_by.clone())
                .bind(o.instance_id.clone())
                .bind(o.consumer_group.clone())
                .bind(o.biz_type.clone().unwrap_or_default())
                .bind(o.since_ms)
                .bind(o.until_ms)
                .bind(now_ms)
        })
        .await
}

/// Stores the anomalies and marks the run successful, in one transaction.
pub(crate) async fn finish(
    store: &Store,
    id: i64,
    anomalies: &[Anomaly],
    now_ms: i64,
) -> Result<(), sqlx::Error> {
    let mut tx = store.begin().await?;
    for a in anomalies {
        store
            .query(&ADD)
            .bind(id)
            .bind(a.kind.as_str())
            .bind(a.consumer_group.as_str())
            .bind(a.biz_type.as_str())
            .bind(a.biz_id.as_str())
            .bind(a.execute_time)
            .bind(a.first_seen_ms)
            .bind(a.last_seen_ms)
            .bind(a.detail.as_str())
            .execute(&mut *tx)
            .await?;
    }
    store.query(&FINISH).bind(now_ms).bind(anomalies.len() as i64).bind(id).execute(&mut *tx).await?;
    tx.commit().await
}

pub(crate) async fn fail(store: &Store, id: i64, error: &str, now_ms: i64) -> Result<(), sqlx::Error> {
    store.query(&FAIL).bind(now_ms).bind(error).bind(id).execute(store.pool()).await?;
    Ok(())
}

/// The latest `limit` runs, newest first.
pub async fn recent(store: &Store, limit: i64) -> Result<Vec<RunRecord>, sqlx::Error> {
    store.query(&RECENT).bind(limit).fetch_all(store.pool()).await?.iter().map(record).collect()
}

pub async fn get(store: &Store, id: i64) -> Result<Option<RunRecord>, sqlx::Error> {
    store.query(&ONE).bind(id).fetch_optional(store.pool()).await?.as_ref().map(record).transpose()
}

/// The latest successful run of `group`: what `/metrics` and the overview report.
pub(crate) async fn last_success(store: &Store, group: &str) -> Result<Option<RunRecord>, sqlx::Error> {
    store
        .query(&LAST_SUCCESS)
        .bind(group)
        .fetch_optional(store.pool())
        .await?
        .as_ref()
        .map(record)
        .transpose()
}

/// A run's anomalies, of `kind` or all, at most `limit`.
pub async fn anomalies(
    store: &Store,
    run_id: i64,
    kind: Option<AnomalyKind>,
    limit: i64,
) -> Result<Vec<Anomaly>, sqlx::Error> {
    let kind = kind.map(AnomalyKind::as_str).unwrap_or("");
    let rows = store
        .query(&ANOMALIES)
        .bind(run_id)
        .bind(kind)
        .bind(kind)
        .bind(limit)
        .fetch_all(store.pool())
        .await?;
    rows.iter()
        .map(|r| {
            let kind: String = r.try_get(0)?;
            Ok(Anomaly {
                kind: AnomalyKind::parse(&kind).ok_or_else(|| sqlx::Error::ColumnDecode {
                    index: "kind".to_owned(),
                    source: format!("unknown anomaly kind {kind:?}").into(),
                })?,
                consumer_group: r.try_get(1)?,
                biz_type: r.try_get(2)?,
                biz_id: r.try_get(3)?,
                execute_time: r.try_get(4)?,
                first_seen_ms: r.try_get(5)?,
                last_seen_ms: r.try_get(6)?,
                detail: r.try_get(7)?,
            })
        })
        .collect()
}

/// A run's anomalies counted by kind, every kind present.
pub async fn counts(store: &Store, run_id: i64) -> Result<BTreeMap<AnomalyKind, i64>, sqlx::Error> {
    let mut out: BTreeMap<AnomalyKind, i64> = AnomalyKind::ALL.iter().map(|k| (*k, 0)).collect();
    for r in store.query(&COUNTS).bind(run_id).fetch_all(store.pool()).await? {
        if let Some(kind) = AnomalyKind::parse(&r.try_get::<String, _>(0)?) {
            out.insert(kind, r.try_get(1)?);
        }
    }
    Ok(out)
}

fn record(r: &AnyRow) -> Result<RunRecord, sqlx::Error> {
    Ok(RunRecord {
        id: r.try_get(0)?,
        status: r.try_get(1)?,
        started_by: r.try_get(2)?,
        instance_id: r.try_get(3)?,
        consumer_group: r.try_get(4)?,
        biz_type: r.try_get(5)?,
        since_ms: r.try_get(6)?,
        until_ms: r.try_get(7)?,
        started_at_ms: r.try_get(8)?,
        finished_at_ms: r.try_get(9)?,
        anomalies: r.try_get(10)?,
        error: r.try_get(11)?,
    })
}
