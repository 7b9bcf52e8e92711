//! The `[archive]` section of the configuration: when the job runs, how long claims and log
//! rows are kept, and how hard a run may push. It is embedded in [`crate::config::Settings`] the
//! way `[[routes]]` is, and checked with the rest of the configuration at start.
//!
//! This module owns the section's fields, defaults and checks. It must not touch the database.

use crate::setting::{Invalid, invalid};
use std::time::Duration;

use serde::{Deserialize, Serialize};

use super::StartedBy;
use super::retention::{DAY_MS, RetentionWarning, check_dedup_retention};
use super::{ArchiveOptions, Fault};
use crate::cron::Schedule;

/// `[archive]`: scheduled archiving of old claims and deletion of old delivery-log rows.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct ArchiveSettings {
    /// `IDEMGATE_ARCHIVE__ENABLED`: run the job inside `serve`. Off, `idemgate archive` still
    /// runs it by hand.
    pub enabled: bool,
    /// `IDEMGATE_ARCHIVE__SCHEDULE`: when, as a 6-field cron expression in UTC
    /// (`second minute hour day-of-month month day-of-week`).
    pub schedule: String,
    /// `IDEMGATE_ARCHIVE__DEDUP_RETENTION_DAYS`: claims older than this move from
    /// `idempotent_record` to `idempotent_record_archive`. A duplicate arriving later than this
    /// is no longer recognised unless `late_duplicate_guard` is on.
    pub dedup_retention_days: u32,
    /// `IDEMGATE_ARCHIVE__LOG_RETENTION_DAYS`: delivery-log rows older than this are deleted.
    pub log_retention_days: u32,
    /// `IDEMGATE_ARCHIVE__BATCH_SIZE`: rows per batch; each batch is one short transaction.
    pub batch_size: u32,
    /// `IDEMGATE_ARCHIVE__PAUSE_MS`: pause between batches, leaving the database to consumers.
    pub pause_ms: u64,
    /// `IDEMGATE_ARCHIVE__MAX_RUN_SECONDS`: a run's time budget; the rest waits for the next run.
    pub max_run_seconds: u64,
    /// `IDEMGATE_ARCHIVE__LEASE_SECONDS`: how long the lease lasts without renewal (it is
    /// renewed before every batch). A crashed run's lease expires after this.
    pub lease_seconds: u64,
    /// `IDEMGATE_ARCHIVE__REPLAY_HORIZON_HOURS`: the longest time after its first delivery that
    /// a copy of a message may still arrive besides broker retries: delayed messages' delay and
    /// dead letters replayed from `%DLQ%`. Used by the start-up retention check.
    pub replay_horizon_hours: u32,
    /// `IDEMGATE_ARCHIVE__LATE_DUPLICATE_GUARD`: on every fresh claim, also look the key up in
    /// the archive; a hit is skipped as a `late_duplicate`.
    pub late_duplicate_guard: bool,
    /// `IDEMGATE_ARCHIVE__PARTITION_LOG`: on PostgreSQL and MariaDB/MySQL, move a plain
    /// delivery log to partitions by day (while consumers write), so that retention drops a day
    /// at a time. Off, a plain log stays plain; a partitioned one is kept partitioned either way.
    pub partition_log: bool,
    /// `IDEMGATE_ARCHIVE__CLAIM_KEY_BY_BIZ_ID`: on PostgreSQL and MariaDB/MySQL, lead the claim
    /// tables' unique key with biz_id (while consumers write) and drop the index on biz_id
    /// alone, which the key then serves. Off, a table keeps the key it has.
    pub claim_key_by_biz_id: bool,
}

/// Daily at 03:00 UTC.
pub(crate) const DEFAULT_SCHEDULE: &str = "0 0 3 * * *";

impl Default for ArchiveSettings {
    fn default() -> Self {
        Self {
            enabled: true,
            schedule: DEFAULT_SCHEDULE.to_owned(),
            dedup_retention_days: 90,
            // The log holds a row per attempt, with bodies for dead letters: by far the largest
            // table. Two weeks covers investigating an incident and replaying its dead letters
            // (the broker itself keeps messages for 3 days), without keeping months of rows.
            log_retention_days: 14,
            batch_size: 5_000,
            pause_ms: 50,
            max_run_seconds: 3_600,
            lease_seconds: 300,
            // RocketMQ 5 caps a delayed message at 3 days (timerMaxDelaySec) and keeps the
            // commit log, so %DLQ%, 72 hours (fileReservedTime).
            replay_horizon_hours: 72,
            late_duplicate_guard: false,
            partition_log: true,
            claim_key_by_biz_id: true,
        }
    }
}

impl ArchiveSettings {
    /// When the job next runs inside `serve` after `now_ms`, or `None` when it does not run
    /// on a schedule.
    pub(crate) fn next_run_after(&self, now_ms: i64) -> Option<i64> {
        if !self.enabled {
            return None;
        }
        Schedule::parse(&self.schedule).ok()?.next_after(now_ms)
    }

    /// Checks what types alone cannot, naming the key.
    pub fn validate(&self) -> Result<(), Invalid> {
        Schedule::parse(&self.schedule).map_err(|e| invalid("archive.schedule", e.to_string()))?;
        if !(1..=36_500).contains(&self.dedup_retention_days) {
            return Err(invalid("archive.dedup_retention_days", "must be between 1 and 36500"));
        }
        if !(1..=36_500).contains(&self.log_retention_days) {
            return Err(invalid("archive.log_retention_days", "must be between 1 and 36500"));
        }
        if !(1..=100_000).contains(&self.batch_size) {
            return Err(invalid("archive.batch_size", "must be between 1 and 100000"));
        }
        if self.pause_ms > 60_000 {
            return Err(invalid("archive.pause_ms", "must be at most 60000"));
        }
        if self.max_run_seconds == 0 {
            return Err(invalid("archive.max_run_seconds", "must be at least 1"));
        }
        if !(10..=86_400).contains(&self.lease_seconds) {
            return Err(invalid("archive.lease_seconds", "must be between 10 and 86400"));
        }
        Ok(())
    }

    /// The validated schedule.
    pub fn schedule(&self) -> Result<Schedule, Invalid> {
        Schedule::parse(&self.schedule).map_err(|e| invalid("archive.schedule", e.to_string()))
    }

    /// The options of a run started by `started_by` on `instance_id`.
    pub fn options(&self, instance_id: &str, started_by: StartedBy) -> ArchiveOptions {
        ArchiveOptions {
            dedup_retention_ms: i64::from(self.dedup_retention_days) * DAY_MS,
            log_retention_ms: Some(i64::from(self.log_retention_days) * DAY_MS),
            batch_size: self.batch_size,
            pause: Duration::from_millis(self.pause_ms),
            time_budget: Duration::from_secs(self.max_run_seconds),
            lease_ttl: Duration::from_secs(self.lease_seconds),
            instance_id: instance_id.to_owned(),
            started_by,
            partition_log: self.partition_log,
            claim_key_by_biz_id: self.claim_key_by_biz_id,
            fault: Fault::None,
        }
    }

    /// The start-up check: a warning when claims are archived before every copy of a message
    /// can have arrived (the broker's retries, `redelivery_ms`, plus the replay horizon).
    pub(crate) fn retention_warning(&self, redelivery_ms: i64) -> Option<RetentionWarning> {
        check_dedup_retention(
            i64::from(self.dedup_retention_days) * DAY_MS,
            redelivery_ms,
            i64::from(self.replay_horizon_hours) * 3_600_000,
            self.late_duplicate_guard,
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_defaults_are_valid() {
        assert_eq!(ArchiveSettings::default().validate(), Ok(()));
    }

    #[test]
    fn a_bad_value_is_refused_with_its_key_named() {
        type Case = (fn(&mut ArchiveSettings), &'static str);
        let cases: [Case; 4] = [
            (|s| s.schedule = "0 3 * * *".into(), "configuration key archive.schedule: \"0 3 * * *\""),
            (|s| s.dedup_retention_days = 0, "configuration key archive.dedup_retention_days"),
            (|s| s.batch_size = 0, "configuration key archive.batch_size"),
            (|s| s.lease_seconds = 1, "configuration key archive.lease_seconds"),
        ];
        for (spoil, expected) in cases {
            let mut s = ArchiveSettings::default();
            spoil(&mut s);
            let err = s.validate().expect_err(expected).to_string();
            assert!(err.starts_with(expected), "{err}");
        }
    }

    #[test]
    fn the_options_carry_the_windows_in_milliseconds() {
        let o = ArchiveSettings::default().options("i-1", StartedBy::Schedule);
        assert_eq!(o.dedup_retention_ms, 90 * DAY_MS);
        assert_eq!(o.log_retention_ms, Some(14 * DAY_MS));
        assert_eq!(o.lease_ttl, Duration::from_secs(300));
    }
}
