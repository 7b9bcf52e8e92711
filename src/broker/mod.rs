//! The brokers: the seam every broker's consumer, lag reader and publisher fits (`seam`, with
//! the lag's broker-neutral words in `lag`), `[broker]`'s shared settings (`settings`), the
//! choice among the three behind it (`choice`), and the three, one folder each: `rocketmq`,
//! `rabbitmq` and `kafka`.
//!
//! This module translates between the broker's messages and [`Delivery`](crate::delivery::Delivery)
//! and between the gate's [`Verdict`](crate::outcome::Verdict) and the broker's answer. It
//! must not decide outcomes.

mod choice;
pub mod kafka;
pub mod lag;
pub mod rabbitmq;
pub mod rocketmq;
pub mod seam;
pub(crate) mod settings;

pub use choice::Brokers;
pub use kafka::KafkaSettings;
pub use rabbitmq::RabbitMqSettings;
pub use rocketmq::{
    BrokerAccess, ClientHost, Consumer, DEFAULT_TRACE_TOPIC, Producer, Refused, RocketMqSettings, SecretKey,
};
pub use seam::{BrokerKind, LagRead, Limits, Publish, Sink, Subscriber, Subscription};
pub use settings::{BrokerSettings, MOVED_TO_ROCKETMQ, StartFrom, moved_keys};
