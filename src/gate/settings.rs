//! `[consumer]`: who consumes, and how the gate treats failures; `[group_commit]`: many
//! deliveries per transaction.

use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::route::{MAX_ID_CHARS, check_key_text};
use crate::setting::{Invalid, invalid};

/// `[consumer]`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ConsumerSettings {
    /// `IDEMGATE_CONSUMER__GROUP`: the RocketMQ consumer group. Part of every claim key: two
    /// groups apply their own effects, instances of one group share theirs.
    pub group: String,
    /// `IDEMGATE_CONSUMER__INSTANCE`: this process's name in logs, log rows and metrics.
    /// Empty means `hostname-pid`.
    pub instance: String,
    /// `IDEMGATE_CONSUMER__MAX_RECONSUME_TIMES`: the broker's retry budget; the failure at this
    /// reconsume count is logged `dead_lettered`.
    pub max_reconsume_times: i32,
    /// `IDEMGATE_CONSUMER__TRANSIENT_RETRIES`: in-gate retries of a deadlock, a lock wait that
    /// timed out or a busy database before the broker is asked to redeliver, 0 to
    /// [`MAX_TRANSIENT_RETRIES`].
    pub transient_retries: u32,
    /// `IDEMGATE_CONSUMER__DUPLICATE_WARNINGS_PER_SECOND`: WARN lines for duplicates per second;
    /// the rest are counted and reported with the next one.
    pub duplicate_warnings_per_second: u32,
    /// `IDEMGATE_CONSUMER__DELIVERY_TIMEOUT_MS`: the longest the gate works on a delivery, from
    /// its turn (on RocketMQ, from its listener call's start), at least 1000 and at most what the
    /// broker allows (`longest_delivery_timeout` of its `answer_within`: 25,000 on RocketMQ and
    /// Kafka, 297,000 on RabbitMQ). A delivery still unfinished then is rolled back and answered
    /// retry itself, before the broker's own deadline takes it back while its transaction may
    /// still commit.
    pub delivery_timeout_ms: u64,
}

/// The most in-gate retries of one transient conflict: with the pauses capped
/// ([`crate::store::MAX_RETRY_PAUSE`]) and every lock wait bounded, more retries only move the
/// redelivery later.
pub(crate) const MAX_TRANSIENT_RETRIES: u32 = 10;

/// `consumer.delivery_timeout_ms` by default: the longest RocketMQ allows
/// (`longest_delivery_timeout` of its 28 s answer).
pub(crate) const DEFAULT_DELIVERY_TIMEOUT_MS: u64 = 25_000;

/// The pause before the n-th retry of a transient conflict is at most this many ms `<< n`
/// (and never more than [`crate::store::MAX_RETRY_PAUSE`]).
pub(crate) const RETRY_BASE_MS: u64 = 5;

/// Who is consuming: part of every claim and log row.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Identity {
    pub consumer_group: String,
    /// This process, as shown in logs, log rows and metrics.
    pub instance_id: String,
}

impl Identity {
    /// `host-pid`: unique among the processes sharing a database.
    pub(crate) fn default_instance_id() -> String {
        format!("{}-{}", crate::setting::host_name(), std::process::id())
    }
}

/// How the gate treats failures.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Policy {
    /// The broker's `maxReconsumeTimes`: a retryable failure at this reconsume count is the
    /// last attempt and is logged `dead_lettered`.
    pub max_reconsume_times: i32,
    /// How often a transient database conflict (deadlock, busy file) is retried inside the
    /// gate before the broker is asked to redeliver.
    pub transient_retries: u32,
    /// How many duplicate warnings a second may log; the rest are counted and reported.
    pub duplicate_warnings_per_second: u32,
    /// How long the gate may work on a delivery, from the start of the listener call that holds
    /// it: then the delivery is rolled back and answered retry.
    pub delivery_timeout: Duration,
}

impl Policy {
    /// What the pauses between a delivery's transient retries add up to at most.
    pub(crate) fn longest_retry_pauses(&self) -> Duration {
        crate::store::longest_pauses(self.transient_retries, RETRY_BASE_MS)
    }
}

impl Default for Policy {
    fn default() -> Self {
        Self {
            max_reconsume_times: 16,
            transient_retries: 3,
            duplicate_warnings_per_second: 20,
            delivery_timeout: Duration::from_millis(DEFAULT_DELIVERY_TIMEOUT_MS),
        }
    }
}

impl Default for ConsumerSettings {
    fn default() -> Self {
        let policy = Policy::default();
        Self {
            group: String::new(),
            instance: String::new(),
            max_reconsume_times: policy.max_reconsume_times,
            transient_retries: policy.transient_retries,
            duplicate_warnings_per_second: policy.duplicate_warnings_per_second,
            delivery_timeout_ms: policy.delivery_timeout.as_millis() as u64,
        }
    }
}

impl ConsumerSettings {
    pub fn validate(&self) -> Result<(), Invalid> {
        // No group by default: the service asks for one (`Settings::require_group`).
        if !self.group.is_empty() {
            check_key_text(&self.group, MAX_ID_CHARS).map_err(|m| invalid("consumer.group", m))?;
        }
        if self.instance.chars().count() > MAX_ID_CHARS {
            return Err(invalid("consumer.instance", "is longer than 128 characters"));
        }
        if self.max_reconsume_times < 0 {
            // Its upper bound is the broker's (`Limits::max_reconsume_times`), checked with it.
            return Err(invalid("consumer.max_reconsume_times", "must not be negative"));
        }
        if self.transient_retries > MAX_TRANSIENT_RETRIES {
            return Err(invalid(
                "consumer.transient_retries",
                format!("is {}; use 0 to {MAX_TRANSIENT_RETRIES}", self.transient_retries),
            ));
        }
        if self.delivery_timeout_ms < 1_000 {
            // Its upper bound is the broker's (`longest_delivery_timeout`), checked with it.
            return Err(invalid(
                "consumer.delivery_timeout_ms",
                format!("is {}; use 1000 or more", self.delivery_timeout_ms),
            ));
        }
        Ok(())
    }

    pub fn delivery_timeout(&self) -> Duration {
        Duration::from_millis(self.delivery_timeout_ms)
    }

    /// Who this process is: the group, and `instance` or `hostname-pid`.
    pub fn identity(&self) -> Identity {
        let instance_id =
            if self.instance.is_empty() { Identity::default_instance_id() } else { self.instance.clone() };
        Identity { consumer_group: self.group.clone(), instance_id }
    }

    pub fn policy(&self) -> Policy {
        Policy {
            max_reconsume_times: self.max_reconsume_times,
            transient_retries: self.transient_retries,
            duplicate_warnings_per_second: self.duplicate_warnings_per_second,
            delivery_timeout: self.delivery_timeout(),
        }
    }
}

/// The most deliveries one group may hold. PostgreSQL keeps the ids of 64 subtransactions
/// (savepoints that wrote) per transaction in shared memory; one more and every other session's
/// snapshots slow down until the group commits.
pub const MAX_BATCH: usize = 64;

/// `[group_commit]`: deliveries that arrive together share one transaction, each handler
/// taking its deliveries at once (or each delivery in its own savepoint). Off by default: one
/// transaction per delivery.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct GroupSettings {
    /// `IDEMGATE_GROUP_COMMIT__ENABLED`.
    pub enabled: bool,
    /// `IDEMGATE_GROUP_COMMIT__MAX_BATCH`: deliveries per transaction, 1 to 64.
    pub max_batch: usize,
    /// `IDEMGATE_GROUP_COMMIT__LINGER_MS`: how long the first delivery of a group waits for
    /// others, 0 to 1000. Under load the group fills before that; when traffic is light this is
    /// the latency group commit adds.
    pub linger_ms: u64,
    /// `IDEMGATE_GROUP_COMMIT__IN_FLIGHT`: groups committing at once (each holds one
    /// connection), 1 to 16.
    pub in_flight: usize,
    /// `IDEMGATE_GROUP_COMMIT__QUEUE`: deliveries waiting for a group at most; the next caller
    /// waits for room.
    pub queue: usize,
    /// `IDEMGATE_GROUP_COMMIT__BATCH`: the batch path. Each handler takes the group's fresh
    /// deliveries at once ([`crate::handler::Handler::handle_batch`]) with no savepoint per
    /// delivery; if a statement fails, the group goes back to just after its claims and runs
    /// again with a savepoint per delivery. false: a savepoint per delivery always.
    pub batch: bool,
}

impl Default for GroupSettings {
    fn default() -> Self {
        Self { enabled: false, max_batch: 32, linger_ms: 2, in_flight: 2, queue: 256, batch: true }
    }
}

impl GroupSettings {
    /// The defaults, switched on.
    pub fn on() -> Self {
        Self { enabled: true, ..Self::default() }
    }

    pub fn linger(&self) -> Duration {
        Duration::from_millis(self.linger_ms)
    }

    pub fn validate(&self) -> Result<(), Invalid> {
        if !(1..=MAX_BATCH).contains(&self.max_batch) {
            return Err(invalid(
                "group_commit.max_batch",
                format!(
                    "is {}; use 1 to {MAX_BATCH} (PostgreSQL tracks at most 64 savepoints per transaction cheaply)",
                    self.max_batch
                ),
            ));
        }
        if self.linger_ms > 1_000 {
            return Err(invalid("group_commit.linger_ms", "must be at most 1000"));
        }
        if !(1..=16).contains(&self.in_flight) {
            return Err(invalid("group_commit.in_flight", "must be between 1 and 16"));
        }
        if !(1..=100_000).contains(&self.queue) {
            return Err(invalid("group_commit.queue", "must be between 1 and 100000"));
        }
        Ok(())
    }
}
