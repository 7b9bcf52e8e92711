//! The archive job on a cron schedule inside `serve`, through `tokio-cron-scheduler`.
//!
//! The scheduler only calls [`archive_once`](super::archive_once) at each tick; every instance
//! schedules it, and the lease decides which one archives. This module owns the cron
//! expression's check and the scheduler's lifecycle. It must not move rows itself.

use std::fmt;

use tokio_cron_scheduler::Job;

use super::{ArchiveOptions, ArchiveOutcome, ArchiveSettings, StartedBy, archive_once};
use crate::cron::CronJob;
use crate::store::Store;

/// A checked 6-field cron expression, in UTC.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Schedule(String);

/// A cron expression that cannot be used.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(
    "{expression:?} is not a valid schedule ({why}); write 6 fields, second minute hour day-of-month \
     month day-of-week, in UTC: \"0 0 3 * * *\" is daily at 03:00"
)]
pub struct ScheduleError {
    pub expression: String,
    pub why: String,
}

impl Schedule {
    /// Checks `expression`: exactly six fields, and a schedule the scheduler accepts.
    pub fn parse(expression: &str) -> Result<Self, ScheduleError> {
        let fields = expression.split_whitespace().count();
        let refuse = |why: String| ScheduleError { expression: expression.to_owned(), why };
        if fields != 6 {
            return Err(refuse(format!("it has {fields} fields")));
        }
        Job::new_async(expression, |_, _| Box::pin(async {}))
            .map_err(|_| refuse("the scheduler cannot read it".to_owned()))?;
        Ok(Self(expression.trim().to_owned()))
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }

    /// The first moment after `after_ms` (epoch ms) that the schedule fires, read as the
    /// scheduler reads it (UTC, seconds required).
    pub fn next_after(&self, after_ms: i64) -> Option<i64> {
        let cron = croner::parser::CronParser::builder()
            .seconds(croner::parser::Seconds::Required)
            .dom_and_dow(true)
            .build()
            .parse(&self.0)
            .ok()?;
        let after = chrono::DateTime::from_timestamp_millis(after_ms)?;
        cron.find_next_occurrence(&after, false).ok().map(|t| t.timestamp_millis())
    }
}

impl fmt::Display for Schedule {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// The running scheduler. Stop it with [`ArchiveScheduler::shutdown`]; a run in progress is
/// then abandoned at its next await, which is safe: each batch is one transaction.
pub struct ArchiveScheduler {
    job: CronJob,
}

/// The scheduler could not start.
#[derive(Debug, thiserror::Error)]
#[error("could not start the archive scheduler: {0}")]
pub struct SchedulerError(String);

impl ArchiveScheduler {
    /// Starts calling `archive_once(store, options, now)` at every tick of `schedule`.
    pub async fn start(
        store: Store,
        options: ArchiveOptions,
        schedule: &Schedule,
    ) -> Result<Self, SchedulerError> {
        let job = CronJob::start("archive", schedule.as_str(), move || {
            let (store, options) = (store.clone(), options.clone());
            async move { run_tick(&store, &options).await }
        })
        .await
        .map_err(|e| SchedulerError(e.to_string()))?;
        tracing::info!(schedule = %schedule, "archive job scheduled (UTC)");
        Ok(Self { job })
    }

    /// What `serve` does at start: warns when the dedup retention is shorter than the
    /// redelivery and replay horizon, then, if `[archive]` is enabled, schedules the job for
    /// this instance. `None` when archiving is off.
    pub async fn start_for_serve(
        store: Store,
        settings: &ArchiveSettings,
        instance_id: &str,
        max_reconsume_times: i32,
    ) -> Result<Option<Self>, SchedulerError> {
        if let Some(warning) = settings.retention_warning(max_reconsume_times) {
            tracing::warn!("{warning}");
        }
        if !settings.enabled {
            tracing::info!("archiving is off (archive.enabled = false); `idemgate archive` runs it by hand");
            return Ok(None);
        }
        let schedule = settings.schedule().map_err(|e| SchedulerError(e.to_string()))?;
        let options = settings.options(instance_id, StartedBy::Schedule);
        Self::start(store, options, &schedule).await.map(Some)
    }

    /// Resolves when a tick has panicked, with the panic's message.
    pub async fn fault(&mut self) -> String {
        self.job.fault().await
    }

    pub async fn shutdown(self) {
        self.job.shutdown().await;
    }
}

/// One tick: run the job and log what it did. Failures are recorded in `archive_run` by the
/// job itself; here they only become log lines.
pub async fn run_tick(store: &Store, options: &ArchiveOptions) {
    match archive_once(store, options, crate::gate::now_ms()).await {
        Ok(report) => match &report.outcome {
            ArchiveOutcome::Skipped { holder, until_ms } => {
                tracing::info!(%holder, until_ms, "archive run skipped: another instance holds the lease")
            }
            ArchiveOutcome::Done => tracing::info!(
                claims_archived = report.dedup.rows,
                log_rows_deleted = report.log.as_ref().map(|l| l.rows).unwrap_or(0),
                complete = report.complete(),
                "archive run finished"
            ),
        },
        Err(e) => tracing::error!(error = %e, "archive run failed"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn six_fields_are_accepted_and_anything_else_is_refused_with_the_expression_named() {
        assert!(Schedule::parse("0 0 3 * * *").is_ok());
        // 2026-11-29T10:52:00Z; the next 03:00 UTC is the morning after.
        let next = Schedule::parse("0 0 3 * * *").unwrap().next_after(1_795_949_520_000);
        assert_eq!(next, Some(1_796_007_600_000));
        assert!(Schedule::parse("0 */15 * * * Mon-Fri").is_ok());
        let five = Schedule::parse("0 3 * * *").unwrap_err().to_string();
        assert!(five.starts_with("\"0 3 * * *\" is not a valid schedule (it has 5 fields)"), "{five}");
        assert!(five.contains("second minute hour day-of-month month day-of-week"), "{five}");
        let nonsense = Schedule::parse("0 0 25 * * *").unwrap_err().to_string();
        assert!(nonsense.contains("\"0 0 25 * * *\""), "{nonsense}");
    }
}
