//! RocketMQ (through `rocketmq-client-rust`): the runtime that hosts the client (`runtime`),
//! how every client reaches the cluster (`access`: account, namespace, trace), the start-up
//! check of the account's rights (`preflight`), the push consumer that runs every delivery
//! through the gate (`consumer`), the group's lag (`lag`), the producer behind `idemgate
//! produce` and replay (`producer`), and `[rocketmq]` (`settings`).

pub mod access;
pub mod consumer;
pub mod lag;
pub(crate) mod preflight;
pub(crate) mod producer;
mod queues;
pub(crate) mod runtime;
pub(crate) mod settings;

pub use access::BrokerAccess;
pub use consumer::Consumer;
pub use lag::LagProbe;
pub use preflight::Refused;
pub use producer::Producer;
pub use runtime::ClientHost;
pub use settings::{DEFAULT_TRACE_TOPIC, RocketMqSettings, SecretKey};

/// True for a property name the broker reserves for itself (UNIQ_KEY, KEYS, TAGS, the queue
/// offsets it adds on delivery, ...): a delivery carries only its user properties, and a message
/// sent again carries only those.
pub(crate) fn is_system_property(name: &str) -> bool {
    rocketmq_model::common::message::STRING_HASH_SET.contains(name)
}
