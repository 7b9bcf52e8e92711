//! The RocketMQ side: the client runtime that hosts the RocketMQ client, the push consumer that
//! runs every delivery through the gate, and the producer behind `idemgate produce` and replay.
//!
//! This module translates between the broker's messages and [`Delivery`](crate::delivery::Delivery)
//! and between the gate's [`Verdict`](crate::gate::Verdict) and the broker's consume status. It
//! must not decide outcomes.

pub mod consumer;
pub mod local;
pub mod producer;
mod runtime;

use serde::{Deserialize, Serialize};

pub use consumer::Consumer;
pub use producer::Producer;
pub use runtime::ClientHost;

/// Where a new consumer group starts reading.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum StartFrom {
    /// The oldest message the broker still holds: a new group misses nothing.
    First,
    /// Only messages sent after the group first starts.
    Last,
}
