//! The archive job on a cron schedule inside `serve`, through `tokio-cron-scheduler`.
//!
//! The scheduler only calls [`archive_once`](super::archive_once) at each tick; every instance
//! schedules it, and the lease decides which one archives. This module owns the cron
//! expression's check and the scheduler's lifecycle. It must not move rows itself.

use super::{ArchiveOptions, ArchiveOutcome, ArchiveSettings, StartedBy, archive_once};
use crate::cron::{CronJob, Schedule};
use crate::store::Store;

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
    /// redelivery horizon (`redelivery_ms`, the broker's retries) and the replay horizon, then, if `[archive]` is enabled, schedules the job for
    /// this instance. `None` when archiving is off.
    pub async fn start_for_serve(
        store: Store,
        settings: &ArchiveSettings,
        instance_id: &str,
        redelivery_ms: i64,
    ) -> Result<Option<Self>, SchedulerError> {
        if let Some(warning) = settings.retention_warning(redelivery_ms) {
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
pub(crate) async fn run_tick(store: &Store, options: &ArchiveOptions) {
    match archive_once(store, options, crate::clock::now_ms()).await {
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
