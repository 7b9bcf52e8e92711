//! The seam between the service and its broker: what a consumer, a lag reader and a publisher
//! of any broker offer the service, and the one place that picks RocketMQ, RabbitMQ or Kafka
//! from `[broker] kind`.
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

use super::kafka::{KafkaSettings, KafkaSubscriber};
use super::lag::{LagProbe, LagReading};
use super::rabbitmq::{RabbitMqSettings, RabbitSubscriber};
use super::{BrokerAccess, BrokerSettings, Consumer, Producer, Sink, Subscription};
pub use crate::delivery::BrokerKind;
use crate::delivery::Delivery;
use crate::outcome::Verdict;

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

#[async_trait]
impl Subscriber for Consumer {
    async fn fault(&mut self) -> String {
        Consumer::fault(self).await
    }

    async fn buffered_messages(&self) -> Option<BTreeMap<String, u64>> {
        Consumer::buffered_messages(self).await
    }

    async fn shutdown(self: Box<Self>) {
        Consumer::shutdown(*self).await;
    }
}

#[async_trait]
impl LagRead for LagProbe {
    async fn read(&self, topics: &[String]) -> LagReading {
        LagProbe::read(self, topics).await
    }

    async fn shutdown(self: Box<Self>) {
        LagProbe::shutdown(*self).await;
    }
}

#[async_trait]
impl Publish for Producer {
    async fn publish(&self, message: &Delivery) -> anyhow::Result<String> {
        Ok(self.send(message).await?.uniq_key)
    }

    async fn shutdown(self: Box<Self>) {
        Producer::shutdown(*self).await;
    }
}

/// A RocketMQ client's start, its type erased: the client's futures are deep, and would push
/// every caller's past the compiler's layout depth.
type Erased<'a, T> = std::pin::Pin<Box<dyn Future<Output = anyhow::Result<T>> + Send + 'a>>;

/// Every broker's settings, and the kind `[broker] kind` picks.
#[derive(Debug, Clone, Copy)]
pub struct Brokers<'a> {
    pub kind: BrokerKind,
    /// `[broker]`: RocketMQ's own settings, and those every broker shares (`kind`,
    /// `consume_threads`, `lag_interval_seconds`, `producer_group`).
    pub rocketmq: &'a BrokerSettings,
    /// `[rabbitmq]`.
    pub rabbitmq: &'a RabbitMqSettings,
    /// `[kafka]`.
    pub kafka: &'a KafkaSettings,
}

impl Brokers<'_> {
    /// Starts the consumer of the chosen broker, handing every delivery to `sink`.
    pub async fn subscribe(
        self,
        sink: Arc<dyn Sink>,
        subscription: &Subscription,
    ) -> anyhow::Result<Box<dyn Subscriber>> {
        Ok(match self.kind {
            BrokerKind::RocketMq => {
                let topics: Vec<String> = subscription.topics.iter().map(|(t, _)| t.clone()).collect();
                let access = BrokerAccess::of(self.rocketmq)?;
                // Boxed: the check's future is deep, and would push every caller's past the
                // compiler's layout depth.
                Box::pin(super::preflight::check_consume_rights(&access, &subscription.group, &topics))
                    .await?;
                let host = super::ClientHost::new("consumer", self.rocketmq.consume_threads as usize)?;
                let start: Erased<'_, Consumer> =
                    Box::pin(Consumer::start_with(sink, subscription, self.rocketmq, host));
                Box::new(start.await?)
            }
            BrokerKind::RabbitMq => Box::new(
                RabbitSubscriber::start(sink, subscription, self.rabbitmq, self.rocketmq.consume_threads)
                    .await?,
            ),
            BrokerKind::Kafka => Box::new(
                KafkaSubscriber::start(
                    sink,
                    subscription,
                    self.kafka,
                    self.rocketmq.start_from,
                    self.rocketmq.consume_threads,
                )
                .await?,
            ),
        })
    }

    /// Starts the reader of `group`'s lag; each reading of a topic waits at most `timeout`.
    pub async fn lag_reader(self, group: &str, timeout: Duration) -> anyhow::Result<Box<dyn LagRead>> {
        Ok(match self.kind {
            BrokerKind::RocketMq => {
                let access = BrokerAccess::of(self.rocketmq)?;
                let start: Erased<'_, LagProbe> = Box::pin(LagProbe::start(&access, group, timeout));
                Box::new(start.await?)
            }
            BrokerKind::RabbitMq => {
                Box::new(super::rabbitmq::QueueDepth::start(self.rabbitmq, group, timeout).await?)
            }
            BrokerKind::Kafka => Box::new(super::kafka::PartitionLag::start(self.kafka, group, timeout)?),
        })
    }

    /// Starts a publisher to the chosen broker.
    pub async fn publisher(self) -> anyhow::Result<Box<dyn Publish>> {
        Ok(match self.kind {
            BrokerKind::RocketMq => {
                let access = BrokerAccess::of(self.rocketmq)?;
                let start: Erased<'_, Producer> =
                    Box::pin(Producer::start(&access, &self.rocketmq.producer_group));
                Box::new(start.await?)
            }
            BrokerKind::RabbitMq => Box::new(super::rabbitmq::Publisher::start(self.rabbitmq).await?),
            BrokerKind::Kafka => Box::new(super::kafka::KafkaPublisher::start(self.kafka)?),
        })
    }

    /// Where the chosen broker is, with no secret in it: for logs and refusals.
    pub fn describe(self) -> String {
        match self.kind {
            BrokerKind::RocketMq => match BrokerAccess::of(self.rocketmq) {
                Ok(access) => access.describe(),
                Err(_) => format!("name server {}", self.rocketmq.name_server),
            },
            BrokerKind::RabbitMq => self.rabbitmq.describe(),
            BrokerKind::Kafka => self.kafka.describe(),
        }
    }
}

/// Owned copies of every broker's settings, for a part that opens its client later (replay
/// from the web UI).
#[derive(Debug, Clone)]
pub struct OwnedBrokers {
    pub kind: BrokerKind,
    pub rocketmq: BrokerSettings,
    pub rabbitmq: RabbitMqSettings,
    pub kafka: KafkaSettings,
}

impl OwnedBrokers {
    pub fn of(b: Brokers<'_>) -> Self {
        Self {
            kind: b.kind,
            rocketmq: b.rocketmq.clone(),
            rabbitmq: b.rabbitmq.clone(),
            kafka: b.kafka.clone(),
        }
    }

    pub fn borrow(&self) -> Brokers<'_> {
        Brokers { kind: self.kind, rocketmq: &self.rocketmq, rabbitmq: &self.rabbitmq, kafka: &self.kafka }
    }
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
