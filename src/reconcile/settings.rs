//! The `[reconcile]` section of the configuration: when `serve` reconciles, over which window,
//! and how much one run may report. Checked with the rest of the configuration at start.

use crate::setting::{Invalid, invalid};
use std::time::Duration;

use serde::{Deserialize, Serialize};

use super::check::ReconcileOptions;
use crate::cron::Schedule;

/// `[reconcile]`: the scheduled reconciler.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct ReconcileSettings {
    /// `IDEMGATE_RECONCILE__ENABLED`: run the reconciler inside `serve`. Off, `idemgate
    /// reconcile` still runs it by hand.
    pub enabled: bool,
    /// `IDEMGATE_RECONCILE__SCHEDULE`: when, as a 6-field cron expression in UTC.
    pub schedule: String,
    /// `IDEMGATE_RECONCILE__WINDOW_HOURS`: how far back a scheduled run looks.
    pub window_hours: u32,
    /// `IDEMGATE_RECONCILE__STUCK_AFTER_MINUTES`: a key still failing this long after its first
    /// failure is reported stuck.
    pub stuck_after_minutes: u32,
    /// `IDEMGATE_RECONCILE__MAX_PER_KIND`: the most anomalies one run reports per kind.
    pub max_per_kind: u32,
    /// `IDEMGATE_RECONCILE__LEASE_SECONDS`: how long the group's lease lasts. It is given back
    /// when a run ends; a run whose instance died leaves it until it expires, and the group is
    /// not reconciled before then. It must exceed the longest run, or a later tick's run on
    /// another instance may start beside a slow one.
    pub lease_seconds: u64,
}

/// Every 15 minutes.
pub(crate) const DEFAULT_SCHEDULE: &str = "0 */15 * * * *";

impl Default for ReconcileSettings {
    fn default() -> Self {
        Self {
            enabled: true,
            schedule: DEFAULT_SCHEDULE.to_owned(),
            window_hours: 24,
            stuck_after_minutes: 30,
            max_per_kind: 1_000,
            lease_seconds: 600,
        }
    }
}

/// Who runs the reconciler, and what it needs to know of the rest of the configuration.
#[derive(Debug, Clone, Copy)]
pub struct Runner<'a> {
    pub consumer_group: &'a str,
    pub instance_id: &'a str,
    /// `schedule` or `command`.
    pub started_by: &'a str,
    pub log_retention_days: u32,
}

impl ReconcileSettings {
    pub fn validate(&self) -> Result<(), Invalid> {
        let bad = |key: &str, message: &str| Err(invalid(key, message));
        if let Err(e) = Schedule::parse(&self.schedule) {
            return Err(invalid("reconcile.schedule", e.to_string()));
        }
        if !(1..=24 * 90).contains(&self.window_hours) {
            return bad("reconcile.window_hours", "must be from 1 to 2160 (90 days)");
        }
        if !(1..=10_080).contains(&self.stuck_after_minutes) {
            return bad("reconcile.stuck_after_minutes", "must be from 1 to 10080 (a week)");
        }
        if !(1..=100_000).contains(&self.max_per_kind) {
            return bad("reconcile.max_per_kind", "must be from 1 to 100000");
        }
        if !(10..=86_400).contains(&self.lease_seconds) {
            return bad("reconcile.lease_seconds", "must be between 10 and 86400");
        }
        Ok(())
    }

    /// The options of a run by `who` over `window` ending at `now_ms`.
    pub fn options(
        &self,
        who: &Runner<'_>,
        biz_type: Option<String>,
        window: Duration,
        now_ms: i64,
    ) -> ReconcileOptions {
        let (since_ms, until_ms) = super::check::window(now_ms, window);
        ReconcileOptions {
            consumer_group: who.consumer_group.to_owned(),
            biz_type,
            since_ms,
            until_ms,
            stuck_after_ms: i64::from(self.stuck_after_minutes) * 60_000,
            log_retention_ms: i64::from(who.log_retention_days) * 86_400_000,
            max_per_kind: self.max_per_kind as usize,
            instance_id: who.instance_id.to_owned(),
            started_by: who.started_by.to_owned(),
        }
    }

    /// How long the group's lease lasts, in milliseconds.
    pub(crate) fn lease_ttl_ms(&self) -> i64 {
        i64::try_from(self.lease_seconds.saturating_mul(1_000)).unwrap_or(i64::MAX / 4)
    }

    pub fn window(&self) -> Duration {
        Duration::from_secs(u64::from(self.window_hours) * 3600)
    }
}
