//! `[broker]`: where the name server is, how hard the consumer pulls, and how often its lag is
//! read.

use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::route::{MAX_ID_CHARS, check_key_text};
use crate::setting::{Invalid, invalid};

/// The longest one consumer-lag reading may take.
const MAX_LAG_READ: Duration = Duration::from_secs(10);

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
/// `[broker]`.
pub struct BrokerSettings {
    /// `IDEMGATE_BROKER__NAME_SERVER`: the RocketMQ name server(s), `host:port[;host:port]`.
    pub name_server: String,
    /// `IDEMGATE_BROKER__CONSUME_THREADS`: listener calls in flight at once. Each holds one
    /// database connection, so `database.max_connections` must be at least this (with group
    /// commit, only each group does: see `group_commit`).
    pub consume_threads: u32,
    /// `IDEMGATE_BROKER__BATCH_SIZE`: messages per listener call. 1 keeps a retry to its own
    /// message; a larger batch redelivers the whole batch when one message asks for a retry.
    pub batch_size: u32,
    /// `IDEMGATE_BROKER__PULL_BATCH_SIZE`: messages fetched from a queue per pull.
    pub pull_batch_size: u32,
    /// `IDEMGATE_BROKER__BUFFERED_MESSAGES`: messages pulled but not yet consumed, per topic,
    /// at most; the client stops pulling beyond it, so a slow database never fills memory.
    pub buffered_messages: u32,
    /// `IDEMGATE_BROKER__BUFFERED_MIB`: the same bound in MiB of message bodies, per topic.
    pub buffered_mib: u32,
    /// `IDEMGATE_BROKER__START_FROM`: where a new consumer group starts, `first` (miss nothing)
    /// or `last`.
    pub start_from: StartFrom,
    /// `IDEMGATE_BROKER__PRODUCER_GROUP`: the producer group of `produce` and replay.
    pub producer_group: String,
    /// `IDEMGATE_BROKER__LAG_INTERVAL_SECONDS`: how often `serve` reads the group's consumer lag
    /// from the brokers (0: never). A reading that takes longer than the interval, or than 10 s,
    /// is abandoned and counted failed.
    pub lag_interval_seconds: u32,
}

impl Default for BrokerSettings {
    fn default() -> Self {
        Self {
            name_server: "127.0.0.1:9876".to_owned(),
            consume_threads: 8,
            batch_size: 1,
            pull_batch_size: 32,
            buffered_messages: 4_000,
            buffered_mib: 64,
            start_from: StartFrom::First,
            producer_group: "idemgate_producer".to_owned(),
            lag_interval_seconds: 15,
        }
    }
}

impl BrokerSettings {
    pub fn validate(&self) -> Result<(), Invalid> {
        if self.name_server.trim().is_empty() {
            return Err(invalid("broker.name_server", "is empty"));
        }
        if !(1..=256).contains(&self.consume_threads) {
            return Err(invalid("broker.consume_threads", "must be between 1 and 256"));
        }
        if !(1..=32).contains(&self.batch_size) {
            return Err(invalid("broker.batch_size", "must be between 1 and 32"));
        }
        if !(1..=1024).contains(&self.pull_batch_size) {
            return Err(invalid("broker.pull_batch_size", "must be between 1 and 1024"));
        }
        if !(1..=1_000_000).contains(&self.buffered_messages) {
            return Err(invalid("broker.buffered_messages", "must be between 1 and 1000000"));
        }
        if !(1..=4096).contains(&self.buffered_mib) {
            return Err(invalid("broker.buffered_mib", "must be between 1 and 4096"));
        }
        check_key_text(&self.producer_group, MAX_ID_CHARS)
            .map_err(|m| invalid("broker.producer_group", m))?;
        if self.lag_interval_seconds > 3600 {
            return Err(invalid("broker.lag_interval_seconds", "must be between 0 (off) and 3600"));
        }
        Ok(())
    }

    /// How often the consumer lag is read, and how long one reading may take; `None` when off.
    pub(crate) fn lag_schedule(&self) -> Option<(Duration, Duration)> {
        let every = Duration::from_secs(u64::from(self.lag_interval_seconds));
        (!every.is_zero()).then(|| (every, every.min(MAX_LAG_READ)))
    }
}

/// Where a new consumer group starts reading.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum StartFrom {
    /// The oldest message the broker still holds: a new group misses nothing.
    First,
    /// Only messages sent after the group first starts.
    Last,
}
