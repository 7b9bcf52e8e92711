//! The RocketMQ side: the client runtime that hosts the RocketMQ client, how every client reaches
//! the cluster (`access`: account, namespace, trace), the push consumer that runs every delivery
//! through the gate, and the producer behind `idemgate produce` and replay.
//!
//! This module translates between the broker's messages and [`Delivery`](crate::delivery::Delivery)
//! and between the gate's [`Verdict`](crate::outcome::Verdict) and the broker's consume status. It
//! must not decide outcomes.

pub mod access;
pub mod consumer;
pub mod lag;
mod preflight;
pub(crate) mod producer;
mod runtime;
pub(crate) mod settings;

pub use access::BrokerAccess;
pub use consumer::Consumer;
pub use preflight::Refused;
pub use producer::Producer;
pub(crate) use runtime::CONSUME_DEADLINE;
pub use runtime::ClientHost;
pub use settings::{BrokerSettings, DEFAULT_TRACE_TOPIC, SecretKey, StartFrom};
