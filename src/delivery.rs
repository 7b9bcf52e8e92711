//! One delivery of one message, as the gate sees it, whatever brought it: the RocketMQ consumer
//! or the demo's built-in traffic source.
//!
//! This module owns the broker-neutral shape of a message and its payload hash, ([`value`])
//! the one grammar of where a value comes from in it and how that value is read, and
//! ([`traceparent`]) the trace a producer's tracing put it in. It must not judge business
//! content; that is [`crate::route`]'s job.

pub mod traceparent;
pub(crate) mod value;

pub use traceparent::{TRACEPARENT_PROPERTY, TraceId, TraceparentFault};

use std::collections::BTreeMap;

use sha2::{Digest, Sha256};

/// The property a producer sets (and RocketMQ keeps) as the message's stable id across
/// redeliveries. The broker's `msgId` changes on every redelivery; this does not.
pub(crate) const UNIQ_KEY_PROPERTY: &str = "UNIQ_KEY";

/// The property `idemgate replay` sets on a re-published dead letter, so that the gate can
/// tell a replay from other duplicates.
pub const REPLAY_PROPERTY: &str = "IDEMGATE_REPLAY_OF";

crate::labelled::labelled! {
    /// Which kind of broker delivered a message: how its coordinates read (`topic`, `tags`,
    /// `queue_id`, `queue_offset` and `msg_id` of a [`Delivery`]), and the `broker` label of
    /// every metric.
    #[derive(Default)]
    BrokerKind {
        /// RocketMQ: topic, tag, queue and queue offset; msgId and UNIQ_KEY.
        #[default]
        RocketMq => "rocketmq",
        /// RabbitMQ (AMQP 0-9-1): the exchange as the topic, the routing key as the tag, the
        /// delivery tag as the offset; the AMQP `message-id` as UNIQ_KEY.
        RabbitMq => "rabbitmq",
        /// Kafka: topic, partition as the queue, offset; the record key as KEYS.
        Kafka => "kafka",
    }
}

impl<'de> serde::Deserialize<'de> for BrokerKind {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let name = String::deserialize(d)?;
        Self::parse(&name).ok_or_else(|| {
            serde::de::Error::custom(format!(
                "unknown broker kind {name:?}: expected \"rocketmq\", \"rabbitmq\" or \"kafka\""
            ))
        })
    }
}

impl BrokerKind {
    /// Where a delivery sits in its broker, in the broker's own words: RocketMQ's topic, queue
    /// and offset; RabbitMQ's exchange, routing key and delivery tag; Kafka's topic, partition
    /// and offset.
    pub fn position(self, topic: &str, tags: &str, queue_id: i32, offset: i64) -> String {
        match self {
            Self::RocketMq => format!("{topic} · q{queue_id} · @{offset}"),
            Self::RabbitMq => {
                let exchange = if topic.is_empty() { "(default exchange)" } else { topic };
                format!("exchange {exchange} · routing key {tags} · delivery tag {offset}")
            }
            Self::Kafka => format!("{topic} · partition {queue_id} · offset {offset}"),
        }
    }
}

impl BrokerKind {
    /// A queue's or partition's name in the consumer record ([`crate::instances`]): the topic
    /// and the queue, in the broker's words. Empty on RabbitMQ, whose consumers of a group all
    /// share its one queue: an event there names every delivery of the group, and its detail
    /// names the queue.
    pub fn queue(self, topic: &str, queue_id: i32) -> String {
        match self {
            Self::RabbitMq => String::new(),
            Self::RocketMq => format!("{topic} · q{queue_id}"),
            Self::Kafka => format!("{topic} · partition {queue_id}"),
        }
    }
}

/// A message as delivered, plus where it came from.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Delivery {
    /// The kind of broker that delivered it.
    pub broker: BrokerKind,
    /// The broker's message id. It changes on every redelivery.
    pub msg_id: String,
    /// The producer's id of this send (RocketMQ `UNIQ_KEY`). Stable across redeliveries; a
    /// producer resend of the same business key gets a new one. Empty when unknown.
    pub uniq_key: String,
    pub topic: String,
    pub tags: String,
    /// RocketMQ `KEYS`: business keys the producer attached, in order.
    pub keys: Vec<String>,
    pub properties: BTreeMap<String, String>,
    pub body: Vec<u8>,
    pub queue_id: i32,
    pub queue_offset: i64,
    /// How many times the broker has redelivered this message after a failure.
    pub reconsume_times: i32,
    /// Which stored copy of the message this is, in the broker's own words, the same for every
    /// delivery of that copy and different for a second copy of the same message (a producer's
    /// retry): RocketMQ's msgId of the copy in the original topic (a retry copy's
    /// `ORIGIN_MESSAGE_ID`: the broker's address and commit-log offset), Kafka's first topic,
    /// partition and offset (a retry copy's from its headers). Empty where the broker keeps no
    /// such id (RabbitMQ: its `redelivered` flag is its word instead). Read by
    /// [`crate::outcome::classify`] to tell a redelivery from a producer's retry.
    pub stored_copy: String,
    /// The broker says it delivered this message before without an answer (RabbitMQ's
    /// `redelivered` flag: a channel closed, a consumer crashed). RocketMQ and Kafka say it
    /// through `reconsume_times` or the message's own id instead.
    pub redelivered: bool,
    /// When the producer created the message, epoch milliseconds; 0 when unknown.
    pub born_at_ms: i64,
    /// What the broker's client could not read of the message, when some part of it could not
    /// be read (a Kafka header whose name is not UTF-8, a retry copy naming a topic no route
    /// covers). Such a delivery is logged `invalid` with this reason, kept and acknowledged,
    /// never a consumer stopped on it.
    pub unreadable: Option<String>,
}

/// A fresh id in RocketMQ's form, 32 uppercase hex digits of 128 random bits: the UNIQ_KEY a
/// publisher gives a message sent without one, and a stand-in broker's msgId.
pub fn new_message_id() -> String {
    format!("{:032X}", rand::random::<u128>())
}

impl Delivery {
    /// The UNIQ_KEY to send this message with: its own, or a fresh one ([`new_message_id`]).
    pub fn uniq_key_or_new(&self) -> String {
        if self.uniq_key.is_empty() { new_message_id() } else { self.uniq_key.clone() }
    }

    /// The hex SHA-256 of the body: what a claim remembers, so a duplicate with a different
    /// body (a key collision, i.e. a producer bug) is caught.
    pub fn payload_hash(&self) -> String {
        hex::encode(Sha256::digest(&self.body))
    }

    /// True when the message is a re-publication by `idemgate replay`.
    pub(crate) fn is_replay(&self) -> bool {
        self.properties.contains_key(REPLAY_PROPERTY)
    }

    pub fn property(&self, name: &str) -> Option<&str> {
        self.properties.get(name).map(String::as_str)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn payload_hash_is_stable_and_depends_on_the_body() {
        let a = Delivery { body: b"{\"sku\":\"A\"}".to_vec(), ..Default::default() };
        let b = Delivery { body: b"{\"sku\":\"B\"}".to_vec(), msg_id: "other".into(), ..Default::default() };
        assert_eq!(a.payload_hash(), a.clone().payload_hash());
        assert_eq!(a.payload_hash().len(), 64);
        assert_ne!(a.payload_hash(), b.payload_hash());
    }
}
