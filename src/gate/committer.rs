//! The committer: turns single deliveries into groups for [`super::group`]. Callers queue their
//! delivery and wait for its answer; the queue is bounded, so when the database is slow the
//! callers, and through them the broker client's consume threads, wait instead of piling up.
//! `in_flight` tasks each take a group off the queue (the first delivery, then whatever else
//! arrives within the linger, up to the batch size), commit it, and answer every caller.
//!
//! What a group runs is a [`GroupRunner`]: the gate's group transaction, or, in the benchmarks,
//! the same batching with the handler alone.

use std::sync::Arc;
use std::time::{Duration, Instant};

use async_trait::async_trait;
use tokio::sync::{mpsc, oneshot};

use super::core::Core;
use super::disposition::{Disposition, Phases};
use super::observer::Observer;
use super::settings::{GroupSettings, MAX_BATCH};
use crate::delivery::Delivery;
use crate::outcome::{Outcome, Verdict};

/// Runs one group of deliveries and answers each, in their order.
#[async_trait]
pub(crate) trait GroupRunner: Send + Sync + 'static {
    async fn run_group(&self, deliveries: &[Delivery]) -> Vec<Disposition>;
}

#[async_trait]
impl GroupRunner for Core {
    async fn run_group(&self, deliveries: &[Delivery]) -> Vec<Disposition> {
        self.process_group(deliveries).await
    }
}

/// One queued delivery and where its answer goes.
struct Job {
    delivery: Delivery,
    queued: Instant,
    reply: oneshot::Sender<Disposition>,
}

/// The queue and the tasks that turn it into groups. Dropping it (with its gate) closes the
/// queue; the tasks finish the groups they hold and stop.
pub(crate) struct Committer {
    queue: mpsc::Sender<Job>,
    observer: Option<Arc<dyn Observer>>,
}

impl Committer {
    pub(crate) fn start(core: Arc<Core>, settings: &GroupSettings) -> Self {
        let observer = core.observer.clone();
        Self::start_with(core, observer, settings)
    }

    /// A committer whose groups `runner` runs, reporting waits to `observer`.
    pub(crate) fn start_with(
        runner: Arc<dyn GroupRunner>,
        observer: Option<Arc<dyn Observer>>,
        settings: &GroupSettings,
    ) -> Self {
        let (queue, jobs) = mpsc::channel(settings.queue.max(1));
        let jobs = Arc::new(tokio::sync::Mutex::new(jobs));
        for _ in 0..settings.in_flight.max(1) {
            tokio::spawn(commit_groups(runner.clone(), observer.clone(), jobs.clone(), settings.clone()));
        }
        Self { queue, observer }
    }

    /// Queues `delivery` and waits for its group's answer. A full queue makes the caller wait
    /// for room first (counted: the database is not keeping up); the time in the queue is
    /// measured from when the delivery got in.
    pub(crate) async fn submit(&self, delivery: Delivery) -> Disposition {
        let room = match self.queue.try_reserve() {
            Ok(room) => room,
            Err(mpsc::error::TrySendError::Full(())) => {
                if let Some(observer) = &self.observer {
                    observer.group_queue_full();
                }
                match self.queue.reserve().await {
                    Ok(room) => room,
                    Err(_) => return abandoned(),
                }
            }
            Err(mpsc::error::TrySendError::Closed(())) => return abandoned(),
        };
        let (reply, answer) = oneshot::channel();
        room.send(Job { delivery, queued: Instant::now(), reply });
        answer.await.unwrap_or_else(|_| abandoned())
    }
}

/// The answer for a delivery whose group never finished (its runtime is shutting down): not
/// recorded, so not acknowledged.
fn abandoned() -> Disposition {
    Disposition {
        outcome: Outcome::Failed,
        verdict: Verdict::Retry,
        key: None,
        cause: None,
        layer: None,
        payload_match: None,
        error: Some("the group committer stopped before this delivery's group committed".to_owned()),
        latency: Duration::ZERO,
        logged: false,
        phases: Phases::default(),
        prefilter: None,
    }
}

/// One committer task: takes a group off the queue (the first delivery, then whatever else
/// arrives within the linger, up to the batch size), commits it, answers each caller.
async fn commit_groups(
    runner: Arc<dyn GroupRunner>,
    observer: Option<Arc<dyn Observer>>,
    jobs: Arc<tokio::sync::Mutex<mpsc::Receiver<Job>>>,
    settings: GroupSettings,
) {
    let max_batch = settings.max_batch.clamp(1, MAX_BATCH);
    loop {
        let group = {
            let mut jobs = jobs.lock().await;
            let Some(first) = jobs.recv().await else { return };
            let mut group = vec![first];
            let deadline = tokio::time::Instant::now() + settings.linger();
            while group.len() < max_batch {
                match jobs.try_recv() {
                    Ok(job) => group.push(job),
                    Err(mpsc::error::TryRecvError::Disconnected) => break,
                    Err(mpsc::error::TryRecvError::Empty) => {
                        match tokio::time::timeout_at(deadline, jobs.recv()).await {
                            Ok(Some(job)) => group.push(job),
                            Ok(None) | Err(_) => break,
                        }
                    }
                }
            }
            group
        };
        if let Some(observer) = &observer {
            for job in &group {
                observer.group_wait(job.queued.elapsed());
            }
        }
        let (deliveries, replies): (Vec<Delivery>, Vec<oneshot::Sender<Disposition>>) =
            group.into_iter().map(|j| (j.delivery, j.reply)).unzip();
        let answers = runner.run_group(&deliveries).await;
        for (reply, answer) in replies.into_iter().zip(answers) {
            // A caller that went away has nothing to acknowledge.
            let _ = reply.send(answer);
        }
    }
}
