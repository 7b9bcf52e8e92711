//! The one place that picks the broker `[broker] kind` names: its consumer, its lag reader,
//! its publisher and its limits, behind the seam's traits ([`super::seam`]).

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;

use super::kafka::{KafkaSettings, KafkaSubscriber};
use super::lag::LagReading;
use super::rabbitmq::{RabbitMqSettings, RabbitSubscriber};
use super::rocketmq::{BrokerAccess, ClientHost, Consumer, LagProbe, Producer, RocketMqSettings};
use super::seam::{BrokerKind, LagRead, Limits, Publish, Sink, Subscriber, Subscription};
use super::settings::BrokerSettings;
use crate::delivery::Delivery;

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

/// The broker `[broker] kind` picks, with every broker's settings: what the service, `produce`,
/// replay and the benchmarks open their clients from.
#[derive(Debug, Clone, Default)]
pub struct Brokers {
    /// `[broker]`: the kind, and what every broker shares.
    pub broker: BrokerSettings,
    /// `[rocketmq]`.
    pub rocketmq: RocketMqSettings,
    /// `[rabbitmq]`.
    pub rabbitmq: RabbitMqSettings,
    /// `[kafka]`.
    pub kafka: KafkaSettings,
}

impl Brokers {
    /// The broker the consumer reads.
    pub fn kind(&self) -> BrokerKind {
        self.broker.kind
    }

    /// What the chosen broker allows a consumer: its answer deadline, its retry budget, how
    /// long its retries wait.
    pub fn limits(&self) -> Limits {
        match self.kind() {
            BrokerKind::RocketMq => Limits::ROCKETMQ,
            BrokerKind::RabbitMq => Limits::rabbitmq(self.rabbitmq.retry_delay_ms),
            BrokerKind::Kafka => Limits::kafka(self.kafka.retry_delay_ms),
        }
    }

    /// Starts the consumer of the chosen broker, handing every delivery to `sink`.
    pub async fn subscribe(
        &self,
        sink: Arc<dyn Sink>,
        subscription: &Subscription,
    ) -> anyhow::Result<Box<dyn Subscriber>> {
        let (threads, start_from) = (self.broker.consume_threads, self.broker.start_from);
        Ok(match self.kind() {
            BrokerKind::RocketMq => {
                let topics: Vec<String> = subscription.topics.iter().map(|(t, _)| t.clone()).collect();
                let access = BrokerAccess::of(&self.rocketmq)?;
                // Boxed: the check's future is deep, and would push every caller's past the
                // compiler's layout depth.
                Box::pin(super::rocketmq::preflight::check_consume_rights(
                    &access,
                    &subscription.group,
                    &topics,
                ))
                .await?;
                let host = ClientHost::new("consumer", threads as usize)?;
                let start: Erased<'_, Consumer> = Box::pin(Consumer::start_with(
                    sink,
                    subscription,
                    &self.rocketmq,
                    threads,
                    start_from,
                    host,
                ));
                Box::new(start.await?)
            }
            BrokerKind::RabbitMq => {
                Box::new(RabbitSubscriber::start(sink, subscription, &self.rabbitmq, threads).await?)
            }
            BrokerKind::Kafka => {
                Box::new(KafkaSubscriber::start(sink, subscription, &self.kafka, start_from, threads).await?)
            }
        })
    }

    /// Starts the reader of `group`'s lag; each reading of a topic waits at most `timeout`.
    pub async fn lag_reader(&self, group: &str, timeout: Duration) -> anyhow::Result<Box<dyn LagRead>> {
        Ok(match self.kind() {
            BrokerKind::RocketMq => {
                let access = BrokerAccess::of(&self.rocketmq)?;
                let start: Erased<'_, LagProbe> = Box::pin(LagProbe::start(&access, group, timeout));
                Box::new(start.await?)
            }
            BrokerKind::RabbitMq => {
                Box::new(super::rabbitmq::QueueDepth::start(&self.rabbitmq, group, timeout).await?)
            }
            BrokerKind::Kafka => Box::new(super::kafka::PartitionLag::start(&self.kafka, group, timeout)?),
        })
    }

    /// Starts a publisher to the chosen broker.
    pub async fn publisher(&self) -> anyhow::Result<Box<dyn Publish>> {
        Ok(match self.kind() {
            BrokerKind::RocketMq => {
                let access = BrokerAccess::of(&self.rocketmq)?;
                let start: Erased<'_, Producer> =
                    Box::pin(Producer::start(&access, &self.rocketmq.producer_group));
                Box::new(start.await?)
            }
            BrokerKind::RabbitMq => Box::new(super::rabbitmq::Publisher::start(&self.rabbitmq).await?),
            BrokerKind::Kafka => Box::new(super::kafka::KafkaPublisher::start(&self.kafka)?),
        })
    }

    /// Where the chosen broker is, with no secret in it: for logs and refusals.
    pub fn describe(&self) -> String {
        match self.kind() {
            BrokerKind::RocketMq => match BrokerAccess::of(&self.rocketmq) {
                Ok(access) => access.describe(),
                Err(_) => format!("name server {}", self.rocketmq.name_server),
            },
            BrokerKind::RabbitMq => self.rabbitmq.describe(),
            BrokerKind::Kafka => self.kafka.describe(),
        }
    }
}
