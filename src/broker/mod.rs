//! The RocketMQ side: the client runtime that hosts the RocketMQ client, the push consumer that
//! runs every delivery through the gate, and the producer behind `idemgate produce` and replay.
//!
//! This module translates between the broker's messages and [`Delivery`](crate::delivery::Delivery)
//! and between the gate's [`Verdict`](crate::outcome::Verdict) and the broker's consume status. It
//! must not decide outcomes.

pub mod consumer;
pub mod lag;
pub(crate) mod producer;
mod runtime;
pub(crate) mod settings;

pub use consumer::Consumer;
pub use producer::Producer;
pub(crate) use runtime::CONSUME_DEADLINE;
pub use runtime::ClientHost;
pub use settings::{BrokerSettings, StartFrom};
