//! The ops overview: what the last 5 minutes and the last hour looked like, per minute, which
//! biz_types conflict most, the latest trouble, and the archive job's state. It is read from the
//! delivery log, so it covers every instance that shares the database.

use std::collections::BTreeMap;

use serde::Serialize;
use sqlx::Row;

use super::lists::{ListKind, ListQuery, list_rows};
use super::{InspectError, Limits, LogRow};
use crate::archive::{ArchiveSettings, RunRecord, runs};
use crate::store::{Arg, Bound, Sql, Store};

pub(crate) const MINUTE_MS: i64 = 60_000;
/// Minutes in the chart.
pub(crate) const CHART_MINUTES: i64 = 60;
/// Rows in each "latest" box.
pub const LATEST: usize = 5;

/// Totals over one window.
///
/// The rates divide by the part of the window the delivery log covers (`covered_seconds`),
/// not by the whole window: a database whose first delivery came 30 s ago has 30 s of data in
/// its last 5 minutes, and dividing its deliveries by 300 s would show a tenth of the real rate.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct Window {
    pub label: &'static str,
    /// The window's length.
    pub seconds: i64,
    /// How much of the window the log covers: from the window's start, or from the log's first
    /// row when that is younger, to now; never less than [`MIN_COVERED_MS`] once there is a
    /// row, 0 while the log is empty. The rates are per second of this.
    pub covered_seconds: f64,
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

/// The least time a window is taken to cover once the log has a row: a rate read a few
/// milliseconds after the first delivery would otherwise be that delivery over almost nothing.
pub(crate) const MIN_COVERED_MS: i64 = 1_000;

impl Window {
    fn new(label: &'static str, seconds: i64) -> Self {
        Self { label, seconds, ..Self::default() }
    }

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

    /// The rates over the part of the window the log covers at `now_ms`, given the log's
    /// first row (`None`: the log is empty).
    fn finish(mut self, now_ms: i64, first_logged_ms: Option<i64>) -> Self {
        let window_ms = self.seconds * 1_000;
        let covered_ms = first_logged_ms.map_or(0, |first| {
            (now_ms - first.max(now_ms - window_ms)).clamp(MIN_COVERED_MS.min(window_ms), window_ms)
        });
        self.covered_seconds = covered_ms as f64 / 1_000.0;
        let per_second = |n: i64| if covered_ms == 0 { 0.0 } else { n as f64 / self.covered_seconds };
        self.deliveries_per_second = per_second(self.deliveries);
        self.conflicts_per_second = per_second(self.duplicates);
        self.duplicate_ratio =
            if self.deliveries == 0 { 0.0 } else { self.duplicates as f64 / self.deliveries as f64 };
        self
    }

    /// Whether the log covers less than the whole window: its rates are over `covered_seconds`.
    pub(crate) fn is_partial(&self) -> bool {
        self.covered_seconds < self.seconds as f64
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

// Every window is read as a range with both ends: PostgreSQL without statistics takes
// `logged_at_ms >= ?` alone to match a third of the log and scans all of it, while a closed
// range reads the window through the time index. The upper end is a minute past now, so that
// the rows of an instance whose clock runs ahead still count.
static BY_OUTCOME: Sql = Sql::new(
    "SELECT outcome, COUNT(*), COUNT(CASE WHEN payload_match = 0 THEN 1 END) FROM delivery_log \
     WHERE logged_at_ms >= ? AND logged_at_ms < ? GROUP BY outcome",
);
static BY_MINUTE: Sql = Sql::new(
    "SELECT logged_at_ms - logged_at_ms % 60000, outcome, COUNT(*), COUNT(CASE WHEN payload_match = 0 THEN 1 END) \
     FROM delivery_log WHERE logged_at_ms >= ? AND logged_at_ms < ? \
     GROUP BY logged_at_ms - logged_at_ms % 60000, outcome",
);
static TOP_CONFLICTS: Sql = Sql::new(
    "SELECT biz_type, COUNT(*) FROM delivery_log WHERE outcome = 'duplicate' AND outcome <> 'processed' \
     AND logged_at_ms >= ? \
     AND logged_at_ms < ? GROUP BY biz_type ORDER BY COUNT(*) DESC, biz_type LIMIT 10",
);
/// Where the log's data begins: the windows' rates are over the time since, when that is
/// shorter than the window. One end of the time index.
static FIRST_LOGGED: Sql = Sql::new("SELECT MIN(logged_at_ms) FROM delivery_log");

/// The overview's own statements at `now_ms`, with their values: the 5-minute totals, the
/// hour's minutes, the top conflicts and the log's first row. The boxes of the latest rows
/// are the lists' first pages ([`super::lists::statement`]).
pub fn statements(now_ms: i64) -> [Bound; 4] {
    let until = Arg::Int(now_ms + MINUTE_MS);
    let hour_start = Arg::Int(now_ms - CHART_MINUTES * MINUTE_MS);
    [
        Bound::new("last 5 minutes", &BY_OUTCOME, vec![Arg::Int(now_ms - 5 * MINUTE_MS), until.clone()]),
        Bound::new("last hour by minute", &BY_MINUTE, vec![hour_start.clone(), until.clone()]),
        Bound::new("top conflicts", &TOP_CONFLICTS, vec![hour_start, until]),
        Bound::new("first logged", &FIRST_LOGGED, vec![]),
    ]
}

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
    let [by_outcome, by_minute, top_conflicts, first_logged] = statements(now_ms);
    let first_logged_ms: Option<i64> = first_logged.query(store).fetch_one(pool).await?.try_get(0)?;

    let mut last_5_minutes = Window::new("last 5 minutes", 300);
    for r in by_outcome.query(store).fetch_all(pool).await? {
        last_5_minutes.add(&r.try_get::<String, _>(0)?, r.try_get(1)?, r.try_get(2)?);
    }

    let hour_start = now_ms - CHART_MINUTES * MINUTE_MS;
    let mut last_hour = Window::new("last hour", CHART_MINUTES * 60);
    let mut by_minute_rows: BTreeMap<i64, Minute> = BTreeMap::new();
    for r in by_minute.query(store).fetch_all(pool).await? {
        let start_ms: i64 = r.try_get(0)?;
        let outcome: String = r.try_get(1)?;
        let count: i64 = r.try_get(2)?;
        last_hour.add(&outcome, count, r.try_get(3)?);
        let m = by_minute_rows.entry(start_ms).or_insert_with(|| Minute { start_ms, ..Minute::default() });
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
        .map(|start_ms| by_minute_rows.remove(&start_ms).unwrap_or(Minute { start_ms, ..Minute::default() }))
        .collect();

    let top_conflicts = top_conflicts
        .query(store)
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
        last_5_minutes: last_5_minutes.finish(now_ms, first_logged_ms),
        last_hour: last_hour.finish(now_ms, first_logged_ms),
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
        let now = 1_800_000_000_000;
        let mut w = Window::new("last 5 minutes", 300);
        w.add("processed", 600, 0);
        w.add("duplicate", 300, 3);
        w.add("failed", 90, 0);
        let w = w.finish(now, Some(now - 3_600_000));
        assert_eq!((w.deliveries, w.duplicates, w.retries, w.collisions), (990, 300, 90, 3));
        assert_eq!(w.covered_seconds, 300.0);
        assert!(!w.is_partial());
        assert!((w.deliveries_per_second - 3.3).abs() < 1e-9);
        assert!((w.conflicts_per_second - 1.0).abs() < 1e-9);
        assert!((w.duplicate_ratio - 300.0 / 990.0).abs() < 1e-9);
        assert_eq!(Window::default().finish(now, None).duplicate_ratio, 0.0);
    }

    #[test]
    fn rates_are_over_the_time_the_log_covers_when_it_is_younger_than_the_window() {
        let now = 1_800_000_000_000;
        // 30 s of data at 200 deliveries a second.
        let mut w = Window::new("last 5 minutes", 300);
        w.add("processed", 6_000, 0);
        let w = w.finish(now, Some(now - 30_000));
        assert_eq!(w.covered_seconds, 30.0);
        assert!(w.is_partial());
        assert!((w.deliveries_per_second - 200.0).abs() < 1e-9, "{}", w.deliveries_per_second);

        // The first delivery a moment ago is not a rate of thousands a second.
        let mut w = Window::new("last 5 minutes", 300);
        w.add("processed", 3, 0);
        let w = w.finish(now, Some(now - 2));
        assert_eq!((w.covered_seconds, w.deliveries_per_second), (1.0, 3.0));

        // A row from an instance whose clock runs ahead, and an empty log.
        assert_eq!(Window::new("w", 300).finish(now, Some(now + 5_000)).covered_seconds, 1.0);
        let empty = Window::new("w", 300).finish(now, None);
        assert_eq!((empty.covered_seconds, empty.deliveries_per_second), (0.0, 0.0));
    }
}
