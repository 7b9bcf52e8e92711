//! The reconciler inside `serve`: a cron job that runs [`reconcile_once`] over the configured
//! window. Instances of one group take a lease first, so one of them reconciles per tick.

use super::check::Check;
use super::reconcile_once;
use super::settings::ReconcileSettings;
use super::settings::Runner;
use crate::archive::Lease;
use crate::cron::CronJob;
use crate::store::Store;

/// The running job. Stop it with [`ReconcileScheduler::shutdown`].
pub struct ReconcileScheduler {
    job: CronJob,
}

/// Everything one tick needs, owned.
#[derive(Clone)]
struct Tick {
    store: Store,
    settings: ReconcileSettings,
    consumer_group: String,
    instance_id: String,
    log_retention_days: u32,
    checks: Vec<Check>,
}

impl ReconcileScheduler {
    /// Schedules the reconciler when `[reconcile]` is enabled; `None` when it is off.
    pub async fn start_for_serve(
        store: Store,
        settings: &ReconcileSettings,
        consumer_group: &str,
        instance_id: &str,
        log_retention_days: u32,
        checks: Vec<Check>,
    ) -> anyhow::Result<Option<Self>> {
        if !settings.enabled {
            tracing::info!(
                "reconciling is off (reconcile.enabled = false); `idemgate reconcile` runs it by hand"
            );
            return Ok(None);
        }
        let tick = Tick {
            store,
            settings: settings.clone(),
            consumer_group: consumer_group.to_owned(),
            instance_id: instance_id.to_owned(),
            log_retention_days,
            checks,
        };
        let job = CronJob::start("reconcile", &settings.schedule, move || {
            let tick = tick.clone();
            async move { run_tick(&tick).await }
        })
        .await?;
        tracing::info!(schedule = %settings.schedule, window_hours = settings.window_hours, "reconciler scheduled (UTC)");
        Ok(Some(Self { job }))
    }

    /// Resolves when a tick has panicked, with the panic's message.
    pub async fn fault(&mut self) -> String {
        self.job.fault().await
    }

    pub async fn shutdown(self) {
        self.job.shutdown().await;
    }
}

/// One tick. Instances woken by the same tick (cron ticks fall on whole seconds) share it: the
/// first takes the group's lease, the others find it taken since the tick and skip.
async fn run_tick(t: &Tick) {
    let now = crate::clock::now_ms();
    let tick = now - now.rem_euclid(1_000);
    let lease_name = format!("reconcile:{}", t.consumer_group);
    let ttl = t.settings.lease_ttl_ms();
    let lease = match Lease::acquire(&t.store, &lease_name, &t.instance_id, now, ttl, tick).await {
        Ok(Ok(lease)) => lease,
        Ok(Err(held)) => {
            tracing::debug!(holder = %held.holder, "reconcile tick skipped: another instance runs it");
            return;
        }
        Err(e) => {
            tracing::warn!(error = %e, "reconcile tick skipped: the lease could not be read");
            return;
        }
    };
    let who = Runner {
        consumer_group: &t.consumer_group,
        instance_id: &t.instance_id,
        started_by: "schedule",
        log_retention_days: t.log_retention_days,
    };
    let options = t.settings.options(&who, None, t.settings.window(), now);
    match reconcile_once(&t.store, &options, &t.checks, now).await {
        Ok(report) if report.is_clean() => {
            tracing::info!(run = report.run_id, elapsed_ms = report.elapsed_ms, "reconcile run: no anomalies")
        }
        Ok(report) => tracing::warn!(
            run = report.run_id,
            anomalies = report.anomalies.len(),
            counts = ?report.counts,
            "reconcile run found anomalies; see /anomalies"
        ),
        Err(e) => tracing::error!(error = %e, "reconcile run failed"),
    }
    if let Err(e) = lease.release(&t.store).await {
        tracing::warn!(error = %e, "could not release the reconcile lease");
    }
}
