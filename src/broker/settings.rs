//! `[broker]`: which broker the consumer reads, and what every broker shares: how many
//! deliveries are in the gate at once, where a new group starts, how often the lag is read and
//! how long a consumer may go without progress while its queues hold messages. Each broker's
//! own settings are a section of their own: `[rocketmq]`, `[rabbitmq]`, `[kafka]`.
//!
//! `[broker]` once held RocketMQ's own settings too. Those keys are still read, each moved to
//! `[rocketmq]` with a deprecation warning naming the new key ([`moved_keys`]).

use std::collections::BTreeMap;
use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::delivery::BrokerKind;
use crate::setting::{Invalid, invalid};

/// The longest one consumer-lag reading may take.
const MAX_LAG_READ: Duration = Duration::from_secs(10);

/// The keys `[broker]` once held for RocketMQ, now in `[rocketmq]` under the same names.
pub const MOVED_TO_ROCKETMQ: [&str; 13] = [
    "name_server",
    "batch_size",
    "pull_batch_size",
    "buffered_messages",
    "buffered_mib",
    "producer_group",
    "heartbeat_interval_seconds",
    "access_key",
    "secret_key",
    "secret_key_file",
    "namespace",
    "message_trace",
    "trace_topic",
];

/// `[broker]`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct BrokerSettings {
    /// `IDEMGATE_BROKER__KIND`: the broker the consumer reads, `rocketmq` (`[rocketmq]`),
    /// `rabbitmq` (`[rabbitmq]`) or `kafka` (`[kafka]`).
    pub kind: BrokerKind,
    /// `IDEMGATE_BROKER__CONSUME_THREADS`: deliveries in the gate at once (RocketMQ's listener
    /// calls, RabbitMQ's and Kafka's deliveries handed over). Each holds one database
    /// connection, so `database.max_connections` must be at least this (with group commit,
    /// only each group does: see `group_commit`).
    pub consume_threads: u32,
    /// `IDEMGATE_BROKER__START_FROM`: where a new consumer group starts, `first` (miss nothing)
    /// or `last`. RocketMQ and Kafka read it; a RabbitMQ queue holds what arrived since it was
    /// declared, so it has no start to choose.
    pub start_from: StartFrom,
    /// `IDEMGATE_BROKER__LAG_INTERVAL_SECONDS`: how often `serve` reads the group's consumer lag
    /// from the broker (0: never). A reading that takes longer than the interval, or than 10 s,
    /// is abandoned and counted failed.
    pub lag_interval_seconds: u32,
    /// `IDEMGATE_BROKER__STALL_SECONDS`: how long the consumer may answer no delivery while the
    /// lag readings find messages waiting before the service is reported stalled: `/readyz`
    /// answers 503 and `idemgate_consumer_stalled` is 1 until a delivery is answered again (0:
    /// never, and never while the lag is not read; at least three lag readings). Longer than a
    /// rebalance and the longest retry wait.
    pub stall_seconds: u32,
    /// Keys `[broker]` no longer has: RocketMQ's, moved to `[rocketmq]` when the settings are
    /// loaded; any other is refused by [`BrokerSettings::validate`].
    #[serde(flatten, skip_serializing)]
    pub unknown: BTreeMap<String, serde::de::IgnoredAny>,
}

impl Default for BrokerSettings {
    fn default() -> Self {
        Self {
            kind: BrokerKind::RocketMq,
            consume_threads: 8,
            start_from: StartFrom::First,
            lag_interval_seconds: 15,
            stall_seconds: 300,
            unknown: BTreeMap::new(),
        }
    }
}

impl BrokerSettings {
    pub fn validate(&self) -> Result<(), Invalid> {
        if let Some(key) = self.unknown.keys().find(|k| !MOVED_TO_ROCKETMQ.contains(&k.as_str())) {
            return Err(invalid(
                format!("broker.{key}"),
                "is not a setting of [broker] (kind, consume_threads, start_from, lag_interval_seconds, stall_seconds); each broker's own settings are in [rocketmq], [rabbitmq] or [kafka]",
            ));
        }
        if !(1..=256).contains(&self.consume_threads) {
            return Err(invalid("broker.consume_threads", "must be between 1 and 256"));
        }
        if self.lag_interval_seconds > 3600 {
            return Err(invalid("broker.lag_interval_seconds", "must be between 0 (off) and 3600"));
        }
        if self.stall_seconds != 0 && !(30..=86_400).contains(&self.stall_seconds) {
            return Err(invalid("broker.stall_seconds", "must be 0 (off) or between 30 and 86400"));
        }
        Ok(())
    }

    /// How often the consumer lag is read, and how long one reading may take; `None` when off.
    pub(crate) fn lag_schedule(&self) -> Option<(Duration, Duration)> {
        let every = Duration::from_secs(u64::from(self.lag_interval_seconds));
        (!every.is_zero()).then(|| (every, every.min(MAX_LAG_READ)))
    }

    /// How long the consumer may go without progress while messages wait, at least three lag
    /// readings; `None` when off or when the lag is not read.
    pub(crate) fn stall_after(&self) -> Option<Duration> {
        (self.stall_seconds > 0 && self.lag_interval_seconds > 0)
            .then(|| Duration::from_secs(u64::from(self.stall_seconds.max(3 * self.lag_interval_seconds))))
    }
}

/// The old `[broker]` keys that `given` names, each with the `[rocketmq]` key it is now: what
/// the settings' loader moves, warning of each.
pub fn moved_keys(given: impl Fn(&str) -> bool) -> Vec<(String, String)> {
    MOVED_TO_ROCKETMQ
        .iter()
        .filter(|k| given(&format!("broker.{k}")))
        .map(|k| (format!("broker.{k}"), format!("rocketmq.{k}")))
        .collect()
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
