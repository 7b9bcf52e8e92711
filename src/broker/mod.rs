//! The brokers: the seam every broker's consumer, lag reader and publisher fits (`seam`), the
//! choice among the three behind it (`choice`), and the three. RocketMQ's modules sit at the top: the client runtime that hosts the
//! RocketMQ client, how every client reaches the cluster (`access`: account, namespace, trace),
//! the push consumer that runs every delivery through the gate, its lag, and the producer
//! behind `idemgate produce` and replay. RabbitMQ (`rabbitmq`) and Kafka (`kafka`) have one
//! module each.
//!
//! This module translates between the broker's messages and [`Delivery`](crate::delivery::Delivery)
//! and between the gate's [`Verdict`](crate::outcome::Verdict) and the broker's consume status. It
//! must not decide outcomes.

pub mod access;
mod choice;
pub mod consumer;
pub mod kafka;
pub mod lag;
mod preflight;
pub(crate) mod producer;
pub mod rabbitmq;
mod runtime;
pub mod seam;
pub(crate) mod settings;

pub use access::BrokerAccess;
pub use choice::{Brokers, OwnedBrokers};
pub use consumer::Consumer;
pub use kafka::KafkaSettings;
pub use preflight::Refused;
pub use producer::Producer;
pub use rabbitmq::RabbitMqSettings;
pub use runtime::ClientHost;
pub use seam::{BrokerKind, LagRead, Publish, Sink, Subscriber, Subscription};
pub use settings::{BrokerSettings, DEFAULT_TRACE_TOPIC, SecretKey, StartFrom};
