//! The ops overview: what the last 5 minutes and the last hour looked like, per minute, which
//! biz_types conflict most, the latest trouble, and the archive job's state. It is read from the
//! delivery log, so it covers every instance that shares the database.

use std::collections::BTreeMap;

use serde::Serialize;
use sqlx::Row;

use super::lists::{ListKind, ListQuery, list_rows};
use super::{InspectError, Limits, LogRow};
use crate::archive::{ArchiveSettings, RunRecord, runs};
use crate::store::{Sql, Store};

pub const MINUTE_MS: i64 = 60_000;
/// Minutes in the chart.
pub const CHART_MINUTES: i64 = 60;
/// Rows in each "latest" box.
pub const LATEST: usize = 5;

/// Totals over one window.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct Window {
    pub label: &'static str,
    pub seconds: i64,
    pub deliveries: i64,
    pub processed: i64,
    /// Duplicates skipped: each one a conflict on the claim or a business layer.
    pub duplicates: i64,
    /// Failed attempts handed back to the broker.
    pub retries: i64,
    pub dead_letters: i64,
    pub invalid: i64,
    pub collisions: i64,
    pub deliveries_per_second: f64,
    pub conflicts_per_second: f64,
    /// Duplicates over deliveries; 0 when there were none.
    pub duplicate_ratio: f64,
}

impl Window {
    fn add(&mut self, outcome: &str, count: i64, collisions: i64) {
        self.deliveries += count;
        self.collisions += collisions;
        match outcome {
            "processed" => self.processed += count,
            "duplicate" => self.duplicates += count,
            "failed" => self.retries += count,
            "dead_lettered" => self.dead_letters += count,
            "invalid" => self.invalid += count,
            _ => {}
        }
    }

    fn finish(mut self) -> Self {
        let seconds = self.seconds.max(1) as f64;
        self.deliveries_per_second = self.deliveries as f64 / seconds;
        self.conflicts_per_second = self.duplicates as f64 / seconds;
        self.duplicate_ratio =
            if self.deliveries == 0 { 0.0 } else { self.duplicates as f64 / self.deliveries as f64 };
        self
    }
}

/// One minute of the chart.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct Minute {
    pub start_ms: i64,
    pub deliveries: i64,
    pub duplicates: i64,
    pub retries: i64,
    pub dead_letters: i64,
}

/// A biz_type's duplicates over the last hour.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Conflicts {
    pub biz_type: String,
    pub duplicates: i64,
}

/// The archive job as the overview shows it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct ArchiveStatus {
    pub enabled: bool,
    pub schedule: String,
    pub next_run_ms: Option<i64>,
    pub dedup_retention_days: u32,
    pub log_retention_days: u32,
    /// The latest passes, newest first.
    pub runs: Vec<RunRecord>,
}

/// The archive job's settings, its next run after `now_ms` and its latest `runs` passes: the
/// overview's box, the archive page and its JSON.
pub(crate) async fn archive_status(
    store: &Store,
    archive: &ArchiveSettings,
    now_ms: i64,
    runs: i64,
) -> Result<ArchiveStatus, sqlx::Error> {
    Ok(ArchiveStatus {
        enabled: archive.enabled,
        schedule: archive.schedule.clone(),
        next_run_ms: archive.next_run_after(now_ms),
        dedup_retention_days: archive.dedup_retention_days,
        log_retention_days: archive.log_retention_days,
        runs: runs::recent(store, runs).await?,
    })
}

/// The whole overview.
#[derive(Debug, Clone, Serialize)]
pub struct Overview {
    pub now_ms: i64,
    pub last_5_minutes: Window,
    pub last_hour: Window,
    /// Oldest first, one per minute of the last hour, gaps filled with zeros.
    pub minutes: Vec<Minute>,
    pub top_conflicts: Vec<Conflicts>,
    pub latest_dead_letters: Vec<LogRow>,
    pub latest_collisions: Vec<LogRow>,
    pub latest_invalid: Vec<LogRow>,
    pub archive: ArchiveStatus,
    /// The latest successful reconcile run and its anomalies by kind, once one has run.
    pub reconcile: Option<ReconcileStatus>,
}

/// The reconciler as the overview shows it.
#[derive(Debug, Clone, Serialize)]
pub struct ReconcileStatus {
    pub run: crate::reconcile::runs::RunRecord,
    pub counts: BTreeMap<crate::reconcile::AnomalyKind, i64>,
}

static BY_OUTCOME_SINCE: Sql = Sql::new(
    "SELECT outcome, COUNT(*), COUNT(CASE WHEN payload_match = 0 THEN 1 END) FROM delivery_log \
     WHERE logged_at_ms >= ? GROUP BY outcome",
);
static BY_MINUTE_SINCE: Sql = Sql::new(
    "SELECT logged_at_ms - logged_at_ms % 60000, outcome, COUNT(*), COUNT(CASE WHEN payload_match = 0 THEN 1 END) \
     FROM delivery_log WHERE logged_at_ms >= ? GROUP BY logged_at_ms - logged_at_ms % 60000, outcome",
);
static TOP_CONFLICTS: Sql = Sql::new(
    "SELECT biz_type, COUNT(*) FROM delivery_log WHERE outcome = 'duplicate' AND logged_at_ms >= ? \
     GROUP BY biz_type ORDER BY COUNT(*) DESC, biz_type LIMIT 10",
);

/// Reads the overview at `now_ms` within `limits`.
pub async fn overview(
    store: &Store,
    limits: &Limits,
    archive: &ArchiveSettings,
    now_ms: i64,
) -> Result<Overview, InspectError> {
    limits.run(read(store, archive, now_ms)).await
}

async fn read(store: &Store, archive: &ArchiveSettings, now_ms: i64) -> Result<Overview, sqlx::Error> {
    let pool = store.pool();
    let mut last_5_minutes = Window { label: "last 5 minutes", seconds: 300, ..Window::default() };
    for r in store.query(&BY_OUTCOME_SINCE).bind(now_ms - 5 * MINUTE_MS).fetch_all(pool).await? {
        last_5_minutes.add(&r.try_get::<String, _>(0)?, r.try_get(1)?, r.try_get(2)?);
    }

    let hour_start = now_ms - CHART_MINUTES * MINUTE_MS;
    let mut last_hour = Window { label: "last hour", seconds: 3600, ..Window::default() };
    let mut by_minute: BTreeMap<i64, Minute> = BTreeMap::new();
    for r in store.query(&BY_MINUTE_SINCE).bind(hour_start).fetch_all(pool).await? {
        let start_ms: i64 = r.try_get(0)?;
        let outcome: String = r.try_get(1)?;
        let count: i64 = r.try_get(2)?;
        last_hour.add(&outcome, count, r.try_get(3)?);
        let m = by_minute.entry(start_ms).or_insert_with(|| Minute { start_ms, ..Minute::default() });
        m.deliveries += count;
        match outcome.as_str() {
            "duplicate" => m.duplicates += count,
            "failed" => m.retries += count,
            "dead_lettered" => m.dead_letters += count,
            _ => {}
        }
    }
    let first_minute = hour_start - hour_start.rem_euclid(MINUTE_MS);
    let minutes = (0..=CHART_MINUTES)
        .map(|i| first_minute + i * MINUTE_MS)
        .filter(|start| *start <= now_ms)
        .map(|start_ms| by_minute.remove(&start_ms).unwrap_or(Minute { start_ms, ..Minute::default() }))
        .collect();

    let top_conflicts = store
        .query(&TOP_CONFLICTS)
        .bind(hour_start)
        .fetch_all(pool)
        .await?
        .iter()
        .map(|r| Ok(Conflicts { biz_type: r.try_get(0)?, duplicates: r.try_get(1)? }))
        .collect::<Result<Vec<_>, sqlx::Error>>()?;

    let latest = |kind| list_rows(store, ListQuery::latest(kind, LATEST));
    let latest_dead_letters = latest(ListKind::DeadLetters).await?;
    let latest_collisions = latest(ListKind::Collisions).await?;
    let latest_invalid = latest(ListKind::Invalid).await?;

    let archive = archive_status(store, archive, now_ms, 6).await?;

    let reconcile =
        match crate::reconcile::runs::recent(store, 10).await?.into_iter().find(|r| r.status == "success") {
            Some(run) => {
                Some(ReconcileStatus { counts: crate::reconcile::runs::counts(store, run.id).await?, run })
            }
            None => None,
        };

    Ok(Overview {
        now_ms,
        reconcile,
        last_5_minutes: last_5_minutes.finish(),
        last_hour: last_hour.finish(),
        minutes,
        top_conflicts,
        latest_dead_letters,
        latest_collisions,
        latest_invalid,
        archive,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_window_turns_counts_into_rates_and_a_ratio() {
        let mut w = Window { seconds: 300, ..Window::default() };
        w.add("processed", 600, 0);
        w.add("duplicate", 300, 3);
        w.add("failed", 90, 0);
        let w = w.finish();
        assert_eq!((w.deliveries, w.duplicates, w.retries, w.collisions), (990, 300, 90, 3));
        assert!((w.deliveries_per_second - 3.3).abs() < 1e-9);
        assert!((w.conflicts_per_second - 1.0).abs() < 1e-9);
        assert!((w.duplicate_ratio - 300.0 / 990.0).abs() < 1e-9);
        assert_eq!(Window::default().finish().duplicate_ratio, 0.0);
    }
}
