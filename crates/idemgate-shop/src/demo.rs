//! `idemgate demo`: the gate on embedded defaults, fed by the built-in traffic source instead of
//! a broker, so that the whole product runs with no services.
//!
//! The stand-in broker here assigns msgIds, redelivers what the gate asks to retry with a
//! growing reconsume count, and counts what ends in its dead-letter queue. It exists for the
//! demo only; every integration test uses the real broker.

use std::future::Future;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use tokio::sync::{Mutex, mpsc};

use crate::traffic::{Mix, Traffic};
use idemgate::delivery::Delivery;
use idemgate::gate::{Disposition, Gate};
use idemgate::outcome::{DuplicateCause, Outcome, Verdict};

/// How the demo runs.
#[derive(Debug, Clone)]
pub struct DemoOptions {
    /// Sends per second.
    pub rate: u32,
    /// Stop after this long; `None` runs until the shutdown signal.
    pub duration: Option<Duration>,
    /// Deliveries processed at once.
    pub workers: usize,
    /// The redelivery delay after the n-th failure is n times this (RocketMQ starts at 10 s;
    /// the demo is quicker so that retries and dead letters show within seconds).
    pub retry_backoff: Duration,
    pub status_every: Duration,
    pub mix: Mix,
    pub seed: u64,
}

impl Default for DemoOptions {
    fn default() -> Self {
        Self {
            rate: 200,
            duration: None,
            workers: 4,
            retry_backoff: Duration::from_millis(500),
            status_every: Duration::from_secs(5),
            mix: Mix::default(),
            seed: 1,
        }
    }
}

/// Running totals, readable while the demo runs.
#[derive(Debug, Default)]
pub struct Counters {
    pub deliveries: AtomicU64,
    /// By [`Outcome::index`]: one counter for each outcome there is.
    pub outcomes: [AtomicU64; Outcome::ALL.len()],
    /// By [`DuplicateCause::index`]: one counter for each cause there is.
    pub causes: [AtomicU64; DuplicateCause::ALL.len()],
    /// Deliveries with a reconsume count above 0.
    pub redeliveries: AtomicU64,
    /// Messages the stand-in broker moved to its dead-letter queue.
    pub dead_letter_queue: AtomicU64,
}

impl Counters {
    fn count(&self, d: &Delivery, r: &Disposition) {
        self.deliveries.fetch_add(1, Ordering::Relaxed);
        self.outcomes[r.outcome.index()].fetch_add(1, Ordering::Relaxed);
        if let Some(cause) = r.cause {
            self.causes[cause.index()].fetch_add(1, Ordering::Relaxed);
        }
        if d.reconsume_times > 0 {
            self.redeliveries.fetch_add(1, Ordering::Relaxed);
        }
    }

    pub(crate) fn outcome(&self, o: Outcome) -> u64 {
        self.outcomes[o.index()].load(Ordering::Relaxed)
    }

    pub(crate) fn cause(&self, c: DuplicateCause) -> u64 {
        self.causes[c.index()].load(Ordering::Relaxed)
    }

    /// One status line.
    pub(crate) fn status(&self, elapsed: Duration, since_last: u64, interval: Duration) -> String {
        format!(
            "{:>5.0}s  {:>5.0} deliveries/s  processed {}  duplicates {} (redelivery {}, producer_retry {}, producer_resend {}, other {})  \
             retries {}  dead-lettered {}  invalid {}",
            elapsed.as_secs_f64(),
            since_last as f64 / interval.as_secs_f64(),
            self.outcome(Outcome::Processed),
            self.outcome(Outcome::Duplicate),
            self.cause(DuplicateCause::Redelivery),
            self.cause(DuplicateCause::ProducerRetry),
            self.cause(DuplicateCause::ProducerResend),
            DuplicateCause::ALL
                .iter()
                .filter(|c| {
                    !matches!(
                        c,
                        DuplicateCause::Redelivery
                            | DuplicateCause::ProducerRetry
                            | DuplicateCause::ProducerResend
                    )
                })
                .map(|c| self.cause(*c))
                .sum::<u64>(),
            self.redeliveries.load(Ordering::Relaxed),
            self.outcome(Outcome::DeadLettered),
            self.outcome(Outcome::Invalid),
        )
    }
}

/// Creates the example shop's tables and stock where missing, then feeds the traffic through `gate` until `shutdown`
/// resolves or the duration passes. Status lines go to `status`.
pub async fn run(
    gate: Arc<Gate>,
    options: DemoOptions,
    shutdown: impl Future<Output = ()>,
    mut status: impl FnMut(String),
) -> anyhow::Result<Arc<Counters>> {
    crate::prepare(gate.store()).await.map_err(anyhow::Error::msg)?;
    let counters = Arc::new(Counters::default());
    let max_reconsume = gate.policy().max_reconsume_times;
    let (tx, rx) = mpsc::channel::<Delivery>(options.workers * 4);
    let rx = Arc::new(Mutex::new(rx));

    let mut workers = Vec::new();
    for _ in 0..options.workers {
        let (gate, rx, tx, counters) = (gate.clone(), rx.clone(), tx.downgrade(), counters.clone());
        let backoff = options.retry_backoff;
        workers.push(tokio::spawn(async move {
            loop {
                let next = rx.lock().await.recv().await;
                let Some(d) = next else { break };
                let r = gate.process(&d).await;
                counters.count(&d, &r);
                match r.verdict {
                    Verdict::Ack => {}
                    Verdict::DeadLetter => {
                        counters.dead_letter_queue.fetch_add(1, Ordering::Relaxed);
                    }
                    Verdict::Retry if d.reconsume_times >= max_reconsume => {
                        counters.dead_letter_queue.fetch_add(1, Ordering::Relaxed);
                    }
                    Verdict::Retry => {
                        // Redeliver later with a new msgId, the same UNIQ_KEY and one more
                        // reconsume, as the broker's retry topic does.
                        let Some(tx) = tx.upgrade() else { continue };
                        let mut again = d;
                        again.msg_id = msg_id();
                        again.reconsume_times += 1;
                        let delay = backoff * again.reconsume_times as u32;
                        tokio::spawn(async move {
                            tokio::time::sleep(delay).await;
                            let _ = tx.send(again).await;
                        });
                    }
                }
            }
        }));
    }

    let started = Instant::now();
    let mut traffic = Traffic::new(options.mix, options.seed, &crate::traffic::run_id(), crate::TOPIC);
    let mut send_tick = tokio::time::interval(Duration::from_secs_f64(1.0 / f64::from(options.rate.max(1))));
    send_tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Burst);
    let mut status_tick = tokio::time::interval(options.status_every);
    status_tick.tick().await;
    let deadline = async {
        match options.duration {
            Some(d) => tokio::time::sleep(d).await,
            None => std::future::pending().await,
        }
    };
    tokio::pin!(shutdown, deadline);
    let mut last_total = 0;
    let mut stored: u64 = 0;
    loop {
        tokio::select! {
            _ = &mut shutdown => break,
            _ = &mut deadline => break,
            _ = status_tick.tick() => {
                let total = counters.deliveries.load(Ordering::Relaxed);
                status(counters.status(started.elapsed(), total - last_total, options.status_every));
                last_total = total;
            }
            _ = send_tick.tick() => {
                let mut d = traffic.next_send().message;
                // Each send is a stored copy of its own, at the next offset of one of four
                // queues, as a broker stores it; its retries name it as theirs.
                d.msg_id = msg_id();
                d.stored_copy = d.msg_id.clone();
                d.queue_id = i32::try_from(stored % QUEUES).unwrap_or(0);
                d.queue_offset = i64::try_from(stored / QUEUES).unwrap_or(i64::MAX);
                stored += 1;
                d.born_at_ms = idemgate::clock::now_ms();
                if tx.send(d).await.is_err() {
                    break;
                }
            }
        }
    }
    // Stop sending; retries still sleeping are dropped with the demo.
    drop(tx);
    for w in workers {
        w.await?;
    }
    let total = counters.deliveries.load(Ordering::Relaxed);
    status(counters.status(started.elapsed(), total - last_total, options.status_every));
    Ok(counters)
}

/// The stand-in broker's queues of the topic.
const QUEUES: u64 = 4;

/// A broker-style message id: 32 hex digits.
fn msg_id() -> String {
    idemgate::delivery::new_message_id()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every outcome and every cause has its counter, and the status line reads them all.
    #[test]
    fn every_outcome_and_cause_is_counted_and_shown() {
        let counters = Counters::default();
        for cause in DuplicateCause::ALL {
            let r = Disposition {
                outcome: Outcome::Duplicate,
                verdict: Verdict::Ack,
                key: None,
                cause: Some(*cause),
                layer: None,
                payload_match: None,
                error: None,
                latency: Duration::ZERO,
                logged: true,
                phases: Default::default(),
                prefilter: None,
            };
            counters.count(&Delivery::default(), &r);
        }
        for cause in DuplicateCause::ALL {
            assert_eq!(counters.cause(*cause), 1, "{cause:?}");
        }
        let line = counters.status(Duration::from_secs(1), 5, Duration::from_secs(1));
        let total = DuplicateCause::ALL.len();
        assert!(
            line.contains(&format!(
                "duplicates {total} (redelivery 1, producer_retry 1, producer_resend 1, other {})",
                total - 3
            )),
            "{line}"
        );
    }
}
