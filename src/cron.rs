//! A cron job inside the service, through `tokio-cron-scheduler`: the archive and the
//! reconcile schedules both run on it.
//!
//! This module owns the scheduler's lifecycle and one guarantee: a tick that panics is not
//! lost in a background task. It is logged and reported through [`CronJob::fault`], which the
//! service's supervisor watches, so a job that can no longer run turns `/readyz` to 503 and
//! stops the process with the job named. It knows nothing of what a tick does.

use std::fmt;
use std::future::Future;
use std::panic::AssertUnwindSafe;
use std::sync::Arc;

use futures_util::FutureExt;
use tokio::sync::mpsc;
use tokio_cron_scheduler::{Job, JobScheduler, JobSchedulerError};

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
    pub(crate) fn next_after(&self, after_ms: i64) -> Option<i64> {
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

/// A started job. Stop it with [`CronJob::shutdown`].
pub(crate) struct CronJob {
    name: &'static str,
    scheduler: JobScheduler,
    faults: mpsc::UnboundedReceiver<String>,
}

impl CronJob {
    /// Calls `tick` at every tick of the 6-field UTC cron `expression`.
    pub(crate) async fn start<F, Fut>(
        name: &'static str,
        expression: &str,
        tick: F,
    ) -> Result<Self, JobSchedulerError>
    where
        F: Fn() -> Fut + Send + Sync + 'static,
        Fut: Future<Output = ()> + Send + 'static,
    {
        let (report, faults) = mpsc::unbounded_channel();
        let tick = Arc::new(tick);
        let scheduler = JobScheduler::new().await?;
        let job = Job::new_async(expression, move |_, _| {
            let (tick, report) = (tick.clone(), report.clone());
            Box::pin(async move {
                if let Err(panic) = AssertUnwindSafe(tick()).catch_unwind().await {
                    let what = panic_message(panic.as_ref());
                    tracing::error!(job = name, panic = %what, "a scheduled run panicked");
                    let _ = report.send(what);
                }
            })
        })?;
        scheduler.add(job).await?;
        scheduler.start().await?;
        Ok(Self { name, scheduler, faults })
    }

    /// Resolves when a tick has panicked, with the panic's message; never otherwise.
    pub(crate) async fn fault(&mut self) -> String {
        match self.faults.recv().await {
            Some(what) => what,
            None => std::future::pending().await,
        }
    }

    /// Stops the scheduler; a tick in progress is abandoned at its next await.
    pub(crate) async fn shutdown(mut self) {
        if let Err(e) = self.scheduler.shutdown().await {
            tracing::warn!(job = self.name, error = %e, "the scheduler did not stop cleanly");
        }
    }
}

/// The text a panic carried, when it carried one.
pub(crate) fn panic_message(panic: &(dyn std::any::Any + Send)) -> String {
    if let Some(s) = panic.downcast_ref::<&str>() {
        (*s).to_owned()
    } else if let Some(s) = panic.downcast_ref::<String>() {
        s.clone()
    } else {
        "a panic without a message".to_owned()
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    #[tokio::test]
    async fn a_tick_that_panics_is_reported_as_the_jobs_fault() {
        let mut job = CronJob::start("test", "* * * * * *", || async {
            panic!("the tick broke");
        })
        .await
        .expect("start");
        let fault = tokio::time::timeout(Duration::from_secs(5), job.fault()).await;
        job.shutdown().await;
        assert_eq!(fault.expect("a fault within one tick and a bit"), "the tick broke");
    }

    #[tokio::test]
    async fn ticks_that_return_report_no_fault() {
        let ran = Arc::new(std::sync::atomic::AtomicU32::new(0));
        let counter = ran.clone();
        let mut job = CronJob::start("test", "* * * * * *", move || {
            let counter = counter.clone();
            async move {
                counter.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            }
        })
        .await
        .expect("start");
        let fault = tokio::time::timeout(Duration::from_millis(2_500), job.fault()).await;
        job.shutdown().await;
        assert!(fault.is_err(), "no fault expected");
        assert!(ran.load(std::sync::atomic::Ordering::Relaxed) >= 1, "the job ticked");
    }

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
