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
use super::runtime::CONSUME_DEADLINE;
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
/// itself rolls back what is not ready to commit well before). `Err` with the panic's message
/// when the sink panicked: a defect, which the consumer reports as its fault.
pub(crate) async fn verdict_of(
    sink: &dyn Sink,
    d: &Delivery,
    began: Instant,
    within: Duration,
) -> Result<Verdict, String> {
    let answer_by = tokio::time::Instant::from_std(began + within);
    let consume = std::panic::AssertUnwindSafe(sink.consume(d, began)).catch_unwind();
    match tokio::time::timeout_at(answer_by, consume).await {
        Ok(Ok(verdict)) => Ok(verdict),
        Ok(Err(panic)) => Err(crate::cron::panic_message(panic.as_ref())),
        Err(_) => {
            tracing::error!(
                msg_id = %d.msg_id, waited_ms = began.elapsed().as_millis() as u64,
                "a delivery ran out of time; answering retry"
            );
            Ok(Verdict::Retry)
        }
    }
}

/// The listener's own answer time, from the start of a call: two seconds before the client's
/// [`CONSUME_DEADLINE`]. The gate's deadline (at most `crate::gate::MAX_DELIVERY_TIMEOUT_MS`)
/// and a log row's grace after it end before this.
pub const LISTENER_DEADLINE: Duration = CONSUME_DEADLINE.saturating_sub(Duration::from_secs(2));

// The gate's longest deadline and a log row's grace after it end before the listener's own.
const _: () = assert!(
    crate::gate::MAX_DELIVERY_TIMEOUT_MS as u128 + crate::gate::ANSWER_GRACE.as_millis()
        < LISTENER_DEADLINE.as_millis()
);

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

/// Who consumes what.
#[derive(Debug, Clone)]
pub struct Subscription {
    pub group: String,
    /// (topic, tag expression) pairs.
    pub topics: Vec<(String, String)>,
    pub max_reconsume_times: i32,
}

impl Subscription {
    /// The gate's group, the topics its routes cover and its retry budget.
    pub(crate) fn of(gate: &Gate) -> Self {
        Self {
            group: gate.identity().consumer_group.clone(),
            topics: gate.routes().topics(),
            max_reconsume_times: gate.policy().max_reconsume_times,
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
    fn the_last_allowed_retry_goes_to_the_dead_letters() {
        let at = |n| Delivery { reconsume_times: n, ..Default::default() };
        assert_eq!(last_attempt(Verdict::Retry, &at(1), 2), Verdict::Retry);
        assert_eq!(last_attempt(Verdict::Retry, &at(2), 2), Verdict::DeadLetter);
        assert_eq!(last_attempt(Verdict::Retry, &at(5), 2), Verdict::DeadLetter);
        assert_eq!(last_attempt(Verdict::Ack, &at(5), 2), Verdict::Ack);
        assert_eq!(last_attempt(Verdict::DeadLetter, &at(0), 2), Verdict::DeadLetter);
    }
}
