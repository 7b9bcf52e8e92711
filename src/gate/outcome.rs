//! The vocabulary of a delivery's fate: outcome, duplicate cause, conflict layer and the
//! verdict the broker gets. These strings are stored in the delivery log and become metric
//! labels, so each set is closed and small.

use std::time::Duration;

use crate::route::BizKey;

/// Declares a closed set of stored names (outcomes, causes, run kinds…): the enum, `ALL`,
/// `index`, `as_str`, `parse`, `Display` and `Serialize` (as the stored name).
macro_rules! labelled {
    ($(#[$meta:meta])* $name:ident { $($(#[$vmeta:meta])* $variant:ident => $label:literal,)+ }) => {
        $(#[$meta])*
        #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
        pub enum $name {
            $($(#[$vmeta])* $variant,)+
        }

        impl $name {
            /// Every value, in declaration order (for metrics that start at 0).
            pub const ALL: &'static [$name] = &[$($name::$variant,)+];

            /// The position in [`Self::ALL`], for per-value counters kept in arrays.
            pub fn index(self) -> usize {
                self as usize
            }

            /// The stored and exported name.
            pub fn as_str(self) -> &'static str {
                match self {
                    $($name::$variant => $label,)+
                }
            }

            /// Reads a stored name back.
            pub fn parse(s: &str) -> Option<Self> {
                match s {
                    $($label => Some($name::$variant),)+
                    _ => None,
                }
            }
        }

        impl serde::Serialize for $name {
            fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
                s.serialize_str(self.as_str())
            }
        }

        impl std::fmt::Display for $name {
            fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str(self.as_str())
            }
        }
    };
}

pub(crate) use labelled;

labelled! {
    /// What happened to one delivery.
    Outcome {
        /// The claim and the effect committed.
        Processed => "processed",
        /// The key was claimed before; the effect was not applied again.
        Duplicate => "duplicate",
        /// The handler or the database failed; the key stays unclaimed and the broker retries.
        Failed => "failed",
        /// Given up: the last allowed attempt failed, or the handler refused it for good. The
        /// body is kept in the log for replay.
        DeadLettered => "dead_lettered",
        /// The message cannot be processed as sent (no key, bad key, malformed body).
        Invalid => "invalid",
    }
}

labelled! {
    /// Why a duplicate arrived, read from the UNIQ_KEY of the delivery and of the claim.
    DuplicateCause {
        /// Same UNIQ_KEY as the claim: the broker (or the producer's own retry) sent the same
        /// send again: a lost ack, a rebalance, a crash before the ack.
        Redelivery => "redelivery",
        /// Same business key, different UNIQ_KEY: the producer sent the business event again
        /// as a new message.
        ProducerResend => "producer_resend",
        /// A dead letter re-published by `idemgate replay`.
        Replay => "replay",
        /// Not enough information (no UNIQ_KEY on either side, or the claim is gone).
        Unknown => "unknown",
    }
}

labelled! {
    /// The defence that stopped a duplicate.
    Layer {
        /// The dedup table's unique index.
        Db => "db",
        /// The Redis `SET NX` pre-filter.
        Redis => "redis",
        /// A conditional state-machine update that found the move already made.
        StateMachine => "state_machine",
        /// A business table's own unique key.
        BusinessUnique => "business_unique",
        /// The archive of old claims, checked on a fresh claim by the optional late-duplicate
        /// guard: the copy arrived after its claim was archived.
        LateDuplicate => "late_duplicate",
    }
}

/// What the consumer should tell the broker.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verdict {
    /// Consumed: processed, a duplicate, or invalid and recorded.
    Ack,
    /// Redeliver later (RocketMQ `ReconsumeLater`). At the last allowed attempt the broker
    /// moves the message to `%DLQ%<group>`.
    Retry,
    /// Do not retry: the handler refused it for good. The log keeps the body for replay; a
    /// consumer that can send it straight to the DLQ should.
    DeadLetter,
}

/// Where the time of one delivery went, in microseconds.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Phases {
    pub begin_us: u64,
    pub claim_us: u64,
    pub handler_us: u64,
    pub log_us: u64,
    pub commit_us: u64,
    /// Reading the earlier claim of a duplicate, to name its cause.
    pub lookup_us: u64,
    /// Asking the Redis pre-filter and settling its key.
    pub redis_us: u64,
    /// Transient conflicts (deadlock, busy file) retried inside the gate.
    pub transient_retries: u32,
    /// With group commit: the deliveries that shared this one's transaction, itself included
    /// (0 when it had a transaction of its own).
    pub group_size: u32,
}

impl Phases {
    /// This delivery's share: a group's shared phases (begin, claim, lookup, log, commit)
    /// divided among the deliveries that shared them; its own handler and Redis time whole.
    pub fn per_delivery(&self) -> Phases {
        let n = u64::from(self.group_size.max(1));
        Phases {
            begin_us: self.begin_us / n,
            claim_us: self.claim_us / n,
            lookup_us: self.lookup_us / n,
            log_us: self.log_us / n,
            commit_us: self.commit_us / n,
            ..*self
        }
    }

    pub fn add(&mut self, other: &Phases) {
        self.begin_us += other.begin_us;
        self.claim_us += other.claim_us;
        self.handler_us += other.handler_us;
        self.log_us += other.log_us;
        self.commit_us += other.commit_us;
        self.lookup_us += other.lookup_us;
        self.redis_us += other.redis_us;
        self.transient_retries += other.transient_retries;
    }
}

/// The gate's answer for one delivery.
#[derive(Debug, Clone)]
pub struct Disposition {
    pub outcome: Outcome,
    pub verdict: Verdict,
    /// The key, when one could be read.
    pub key: Option<BizKey>,
    pub cause: Option<DuplicateCause>,
    pub layer: Option<Layer>,
    /// For duplicates: whether the body matches the claim's. `Some(false)` is a key collision.
    pub payload_match: Option<bool>,
    pub error: Option<String>,
    pub latency: Duration,
    /// Whether the delivery-log row was written. A delivery whose row could not be written is
    /// never acknowledged.
    pub logged: bool,
    pub phases: Phases,
    /// What the Redis pre-filter did, for deliveries of a biz_type it covers.
    pub prefilter: Option<crate::prefilter::PrefilterReport>,
}
