//! The seam between the service and its broker: what a consumer hands each delivery to (the
//! [`Sink`]), who consumes what ([`Subscription`]), and what a consumer, a lag reader and a
//! publisher of any broker offer the service ([`Subscriber`], [`LagRead`], [`Publish`]), with
//! the answer rules every consumer shares. `choice` picks RocketMQ, RabbitMQ or Kafka from
//! `[broker] kind`.
//!
//! Each broker's module turns its messages into [`Delivery`]s, hands them to the [`Sink`] (the
//! gate), and turns each [`Verdict`](crate::outcome::Verdict) into its own answer: RocketMQ's
//! consume status; RabbitMQ's ack, a reject into the delay queue, or a publish to the dead-letter
//! exchange; Kafka's offset commit after the verdicts of a polled batch, with a retry or
//! dead-letter topic. None of them decides an outcome.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use async_trait::async_trait;
use futures_util::FutureExt;

use super::lag::LagReading;
pub use crate::delivery::BrokerKind;
use crate::delivery::Delivery;
use crate::gate::Gate;
use crate::outcome::Verdict;

/// The next fault a consumer's tasks reported; never resolves when they can report none.
pub(crate) async fn next_fault(faults: &mut tokio::sync::mpsc::UnboundedReceiver<String>) -> String {
    match faults.recv().await {
        Some(what) => what,
        None => std::future::pending().await,
    }
}

/// Spawns one of a consumer's own tasks, `name` naming it with its broker ("the Kafka consumer
/// of the retry topic"): an end before `stopped` is set, by a return or a panic, is sent on
/// `faults` as the consumer's fault, so that the service clears its readiness and stops, naming
/// the task, instead of running on with a consumer that consumes nothing.
pub(crate) fn spawn_watched<F>(
    name: String,
    faults: tokio::sync::mpsc::UnboundedSender<String>,
    stopped: tokio::sync::watch::Receiver<bool>,
    task: F,
) -> tokio::task::JoinHandle<()>
where
    F: Future<Output = ()> + Send + 'static,
{
    tokio::spawn(async move {
        let ended = std::panic::AssertUnwindSafe(task).catch_unwind().await;
        let what = match ended {
            Ok(()) if *stopped.borrow() => return,
            Ok(()) => format!("{name} ended while the service runs"),
            Err(panic) => format!("{name} panicked: {}", crate::cron::panic_message(panic.as_ref())),
        };
        tracing::error!(task = %name, "{what}");
        let _ = faults.send(what);
    })
}

/// What every broker's consumer shares with the tasks that answer its deliveries: the sink, the
/// consumer's fault channel, the turns in the gate (`broker.consume_threads` at once), the
/// broker's answer deadline, the retry budget and the routes' topics. RabbitMQ's and Kafka's
/// consumers each fill one in and answer through [`Answering::verdict`].
pub(crate) struct Answering {
    sink: Arc<dyn Sink>,
    /// The consumer's faults: a panic, a task that ended, a copy that could not be kept.
    pub(crate) faults: tokio::sync::mpsc::UnboundedSender<String>,
    in_gate: tokio::sync::Semaphore,
    within: Duration,
    max_reconsume_times: i32,
    /// The routes' topics: the only first topics a retried copy may name.
    pub(crate) routed: std::collections::BTreeSet<String>,
    /// The consumer record, for what the consumer sees happen ([`Answering::note`]).
    record: Option<Arc<crate::instances::Record>>,
}

impl Answering {
    /// The answering of `subscription`'s deliveries by `limits`, `consume_threads` at once; the
    /// receiving end of its faults, for the [`Subscriber`]'s `fault`.
    pub(crate) fn new(
        sink: Arc<dyn Sink>,
        subscription: &Subscription,
        consume_threads: u32,
        limits: Limits,
    ) -> (Self, tokio::sync::mpsc::UnboundedReceiver<String>) {
        let (faults, receiver) = tokio::sync::mpsc::unbounded_channel();
        let answering = Self {
            sink,
            faults,
            in_gate: tokio::sync::Semaphore::new(consume_threads as usize),
            within: limits.answer_within,
            max_reconsume_times: subscription.max_reconsume_times,
            routed: subscription.topics.iter().map(|(t, _)| t.clone()).collect(),
            record: subscription.record.clone(),
        };
        (answering, receiver)
    }

    /// Records `kind` for `queue` in the consumer record, when there is one.
    pub(crate) fn note(&self, kind: crate::instances::EventKind, queue: &str, detail: &str) {
        if let Some(record) = &self.record {
            record.note(kind, queue, detail);
        }
    }

    /// The verdict on `d` as the broker is to be answered: `d` waits for its turn in the gate,
    /// then [`verdict_of`] by the broker's deadline from that turn, and the last allowed retry
    /// becomes a dead letter ([`last_attempt`]).
    pub(crate) async fn verdict(&self, d: &Delivery) -> Verdict {
        let verdict = {
            let _turn = self.in_gate.acquire().await;
            verdict_of(self.sink.as_ref(), d, Instant::now(), self.within, &self.faults).await
        };
        last_attempt(verdict, d, self.max_reconsume_times)
    }

    /// How long a delivery may take, from its turn.
    pub(crate) fn within(&self) -> Duration {
        self.within
    }
}

/// What a broker without a dead-letter queue of its own is told to do with `verdict` on `d`:
/// a retry of the last attempt the budget allows (`max_reconsume_times`), which the gate logged
/// dead-lettered, goes to the dead letters, as RocketMQ moves it to `%DLQ%<group>` itself.
pub(crate) fn last_attempt(verdict: Verdict, d: &Delivery, max_reconsume_times: i32) -> Verdict {
    match verdict {
        Verdict::Retry if d.reconsume_times >= max_reconsume_times => Verdict::DeadLetter,
        other => other,
    }
}

/// Hands `d`, a delivery taken at `began`, to `sink` and waits for its verdict until `within`
/// after `began`: past it, the answer is `Retry` whatever the sink is still doing (the gate
/// itself rolls back what is not ready to commit well before). A panic of the sink is a defect:
/// the delivery is answered `Retry` (it comes back), and the panic is sent on `faults`, naming
/// the broker and the delivery, so that the service stops rather than run on in an unknown
/// state. Every broker's consumer answers through this one scaffold.
pub(crate) async fn verdict_of(
    sink: &dyn Sink,
    d: &Delivery,
    began: Instant,
    within: Duration,
    faults: &tokio::sync::mpsc::UnboundedSender<String>,
) -> Verdict {
    let answer_by = tokio::time::Instant::from_std(began + within);
    let consume = std::panic::AssertUnwindSafe(sink.consume(d, began)).catch_unwind();
    match tokio::time::timeout_at(answer_by, consume).await {
        Ok(Ok(verdict)) => verdict,
        Ok(Err(panic)) => {
            let what = crate::cron::panic_message(panic.as_ref());
            tracing::error!(panic = %what, msg_id = %d.msg_id, "the handling of a delivery panicked; it is answered retry and comes back");
            let _ = faults.send(format!(
                "the handling of the {} delivery {} panicked: {what}",
                d.broker.as_str(),
                d.msg_id
            ));
            Verdict::Retry
        }
        Err(_) => {
            tracing::error!(
                msg_id = %d.msg_id, waited_ms = began.elapsed().as_millis() as u64,
                "a delivery ran out of time; answering retry"
            );
            Verdict::Retry
        }
    }
}

/// What a broker allows a consumer, which the gate's settings, the archive's retention check and
/// the consumers ask of the chosen broker instead of assuming one broker's.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limits {
    /// The broker, for the words of a refusal.
    pub kind: BrokerKind,
    /// The longest a consumer may take to answer a delivery, from its turn in the gate: past
    /// it the broker takes the delivery back (RocketMQ's client abandons a listener call after
    /// 30 s; a Kafka member past `max.poll.interval.ms` leaves its group; RabbitMQ closes a
    /// channel past its `consumer_timeout`). Each consumer answers by this itself.
    pub answer_within: Duration,
    /// The most retries the broker can count for a message (`consumer.max_reconsume_times`).
    pub max_reconsume_times: i32,
    /// How long a retry waits before it comes back: RocketMQ's back-off ladder, or the fixed
    /// delay of RabbitMQ's delay queue and Kafka's retry topic.
    retry_delay: RetryDelay,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum RetryDelay {
    /// RocketMQ: the k-th retry waits at delay level `2 + k`.
    Ladder,
    /// The same wait for every retry, in milliseconds.
    Fixed(i64),
}

/// RocketMQ's delay levels 1 to 18 (`messageDelayLevel`: 1s 5s 10s 30s 1m 2m 3m 4m 5m 6m 7m 8m
/// 9m 10m 20m 30m 1h 2h), in milliseconds.
const DELAY_LEVELS_MS: [i64; 18] = [
    1_000, 5_000, 10_000, 30_000, 60_000, 120_000, 180_000, 240_000, 300_000, 360_000, 420_000, 480_000,
    540_000, 600_000, 1_200_000, 1_800_000, 3_600_000, 7_200_000,
];

impl Limits {
    /// RocketMQ: the client abandons a listener call after 30 s, so a call is answered by 28 s;
    /// at most 32 retries (the broker's own bound), climbing its back-off ladder.
    pub const ROCKETMQ: Self = Self {
        kind: BrokerKind::RocketMq,
        answer_within: Duration::from_secs(28),
        max_reconsume_times: 32,
        retry_delay: RetryDelay::Ladder,
    };

    /// RabbitMQ with a delay queue of `retry_delay_ms`: a delivery is answered within 5
    /// minutes, far inside RabbitMQ's `consumer_timeout` (30 minutes by default); retries are
    /// counted by `x-death` without a bound of the broker's, so the budget's is 1,000.
    pub const fn rabbitmq(retry_delay_ms: u32) -> Self {
        Self {
            kind: BrokerKind::RabbitMq,
            answer_within: Duration::from_secs(300),
            max_reconsume_times: 1_000,
            retry_delay: RetryDelay::Fixed(retry_delay_ms as i64),
        }
    }

    /// Kafka with a retry topic of `retry_delay_ms`: a delivery is answered within 28 s, so
    /// that a whole polled batch (`kafka.max_poll_records` in `broker.consume_threads` turns)
    /// ends well inside the consumer's `max.poll.interval.ms` (5 minutes at least); the retry
    /// count is idemgate's own header, bounded at 1,000.
    pub const fn kafka(retry_delay_ms: u32) -> Self {
        Self {
            kind: BrokerKind::Kafka,
            answer_within: Duration::from_secs(28),
            max_reconsume_times: 1_000,
            retry_delay: RetryDelay::Fixed(retry_delay_ms as i64),
        }
    }

    /// The longest a message can keep coming back through `max_reconsume_times` retries.
    pub fn redelivery_horizon_ms(&self, max_reconsume_times: i32) -> i64 {
        let n = max_reconsume_times.max(0) as usize;
        match self.retry_delay {
            RetryDelay::Ladder => {
                (1..=n).map(|k| DELAY_LEVELS_MS[(k + 1).min(DELAY_LEVELS_MS.len() - 1)]).sum()
            }
            RetryDelay::Fixed(ms) => ms.saturating_mul(n as i64),
        }
    }
}

/// What the consumer hands each delivery to: the gate in the service, simpler sinks in the
/// benchmark.
#[async_trait]
pub trait Sink: Send + Sync + 'static {
    /// The verdict on `d`, a delivery of the listener call that began at `began`.
    async fn consume(&self, d: &Delivery, began: Instant) -> Verdict;

    /// True when the deliveries of one listener call should be handed over all at once rather
    /// than one after the other: a gate with group commit puts them in one group.
    fn takes_batches(&self) -> bool {
        false
    }
}

#[async_trait]
impl<S: Sink + ?Sized> Sink for Arc<S> {
    async fn consume(&self, d: &Delivery, began: Instant) -> Verdict {
        (**self).consume(d, began).await
    }

    fn takes_batches(&self) -> bool {
        (**self).takes_batches()
    }
}

#[async_trait]
impl Sink for Gate {
    async fn consume(&self, d: &Delivery, began: Instant) -> Verdict {
        self.process_since(d, began).await.verdict
    }

    fn takes_batches(&self) -> bool {
        self.group_commit().is_some()
    }
}

/// A sink that counts the verdicts it gives: a consumer's progress in the same words for every
/// broker, which the service's [`StallWatch`](super::lag::StallWatch) reads.
pub struct Counted {
    inner: Arc<dyn Sink>,
    answered: Arc<std::sync::atomic::AtomicU64>,
}

impl Counted {
    pub fn new(inner: Arc<dyn Sink>, answered: Arc<std::sync::atomic::AtomicU64>) -> Self {
        Self { inner, answered }
    }
}

#[async_trait]
impl Sink for Counted {
    async fn consume(&self, d: &Delivery, began: Instant) -> Verdict {
        let verdict = self.inner.consume(d, began).await;
        self.answered.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        verdict
    }

    fn takes_batches(&self) -> bool {
        self.inner.takes_batches()
    }
}

/// Who consumes what.
#[derive(Debug, Clone)]
pub struct Subscription {
    pub group: String,
    /// (topic, tag expression) pairs.
    pub topics: Vec<(String, String)>,
    pub max_reconsume_times: i32,
    /// Where the consumer reports the queues it is given and loses, the answers that did not
    /// reach the broker and the broker's timeouts ([`crate::instances`]); none in a consumer
    /// started without the service's record.
    pub record: Option<Arc<crate::instances::Record>>,
}

impl Subscription {
    /// The gate's group, the topics its routes cover and its retry budget.
    pub(crate) fn of(gate: &Gate) -> Self {
        Self {
            group: gate.identity().consumer_group.clone(),
            topics: gate.routes().topics(),
            max_reconsume_times: gate.policy().max_reconsume_times,
            record: gate.record().cloned(),
        }
    }
}

/// A started consumer of any broker.
#[async_trait]
pub trait Subscriber: Send {
    /// Resolves when the handling of a delivery panicked, or the consumer cannot go on (its
    /// connection lost for good), with what happened; never otherwise. The delivery it held
    /// was not acknowledged, so nothing is lost, but the service stops on it.
    async fn fault(&mut self) -> String;

    /// The messages the consumer holds fetched and not yet answered, per topic; `None` when
    /// it cannot tell.
    async fn buffered_messages(&self) -> Option<BTreeMap<String, u64>>;

    /// Stops taking deliveries, waits for those in flight to be answered, and closes.
    async fn shutdown(self: Box<Self>);
}

/// Reads a consumer group's lag.
#[async_trait]
pub trait LagRead: Send + Sync {
    /// One reading of `topics`; each has its own result, and none waits longer than the
    /// reader's timeout.
    async fn read(&self, topics: &[String]) -> LagReading;

    async fn shutdown(self: Box<Self>);
}

/// Sends a message to the broker: `idemgate produce`, and replay of dead letters and invalid
/// deliveries back to where they came from.
#[async_trait]
pub trait Publish: Send + Sync {
    /// Sends `message` (its topic, tags, KEYS, properties and body; its UNIQ_KEY when set);
    /// answers the UNIQ_KEY it was sent with, once the broker has it.
    async fn publish(&self, message: &Delivery) -> anyhow::Result<String>;

    /// Closes the connection; the default has nothing to close.
    async fn shutdown(self: Box<Self>) {}
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sixteen_rocketmq_retries_climb_its_back_off_ladder_to_four_hours_45_minutes_40_seconds() {
        let (second, minute, hour) = (1_000, 60_000, 3_600_000);
        let rocketmq = Limits::ROCKETMQ;
        assert_eq!(rocketmq.redelivery_horizon_ms(0), 0);
        assert_eq!(rocketmq.redelivery_horizon_ms(1), 10 * second);
        assert_eq!(rocketmq.redelivery_horizon_ms(2), 40 * second);
        assert_eq!(rocketmq.redelivery_horizon_ms(16), 4 * hour + 45 * minute + 40 * second);
        // Past level 18 every retry waits 2 h.
        assert_eq!(rocketmq.redelivery_horizon_ms(18), rocketmq.redelivery_horizon_ms(16) + 4 * hour);
    }

    #[test]
    fn a_fixed_retry_delay_makes_a_straight_horizon() {
        assert_eq!(Limits::kafka(5_000).redelivery_horizon_ms(16), 80_000);
        assert_eq!(Limits::rabbitmq(30_000).redelivery_horizon_ms(3), 90_000);
        assert_eq!(Limits::rabbitmq(30_000).redelivery_horizon_ms(-1), 0);
    }

    #[test]
    fn the_last_allowed_retry_goes_to_the_dead_letters() {
        let at = |n| Delivery { reconsume_times: n, ..Default::default() };
        assert_eq!(last_attempt(Verdict::Retry, &at(1), 2), Verdict::Retry);
        assert_eq!(last_attempt(Verdict::Retry, &at(2), 2), Verdict::DeadLetter);
        assert_eq!(last_attempt(Verdict::Retry, &at(5), 2), Verdict::DeadLetter);
        assert_eq!(last_attempt(Verdict::Ack, &at(5), 2), Verdict::Ack);
        assert_eq!(last_attempt(Verdict::DeadLetter, &at(0), 2), Verdict::DeadLetter);
    }
}
