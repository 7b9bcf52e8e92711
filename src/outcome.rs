//! The vocabulary of a delivery's fate: outcome, duplicate cause, conflict layer, the verdict
//! the broker gets, and the earlier claim a duplicate is compared with. These names are stored
//! in the delivery log and become metric labels, so each set is closed and small. Everything
//! that reports a delivery speaks it; it depends on nothing but the delivery itself.

use crate::delivery::Delivery;
use crate::labelled::labelled;

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
        /// The gate's own retry of a delivery whose COMMIT lost its answer (the connection
        /// died after the COMMIT was sent): the retry found the claim of that same delivery.
        /// The effect committed once, by this delivery; no broker sent anything again.
        AmbiguousCommit => "ambiguous_commit",
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
        /// A configured SQL handler's statement that found nothing left to change
        /// (`on_zero = "duplicate"`): the business data shows the effect was applied before.
        Business => "business",
        /// The archive of old claims, checked on a fresh claim by the optional late-duplicate
        /// guard: the copy arrived after its claim was archived.
        LateDuplicate => "late_duplicate",
    }
}

impl DuplicateCause {
    /// What the cause means to a reader of the trace page.
    pub fn meaning(self) -> &'static str {
        match self {
            Self::Redelivery => "the broker or the producer sent the same message again",
            Self::ProducerResend => "the producer sent the business event again as a new message",
            Self::Replay => "re-published by idemgate replay",
            Self::AmbiguousCommit => {
                "the gate's own retry: this delivery's commit lost its answer, and the retry found \
                 its claim; the effect committed once, no broker sent it again"
            }
            Self::Unknown => "not enough information to tell",
        }
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

/// Who claimed a key first.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Claim {
    pub msg_id: String,
    pub uniq_key: String,
    pub payload_hash: String,
}

impl Claim {
    /// A claim from a row whose first columns are `msg_id, uniq_key, payload_hash`, of the live
    /// table or of the archive.
    pub(crate) fn from_row(row: &sqlx::any::AnyRow) -> Result<Self, sqlx::Error> {
        use sqlx::Row;
        Ok(Self { msg_id: row.try_get(0)?, uniq_key: row.try_get(1)?, payload_hash: row.try_get(2)? })
    }
}

/// Names the cause of a duplicate and says whether its body matches the claim's.
pub(crate) fn classify(
    d: &Delivery,
    payload_hash: &str,
    claim: Option<&Claim>,
) -> (DuplicateCause, Option<bool>) {
    let payload_match = claim.map(|c| c.payload_hash == payload_hash);
    let cause = match claim {
        _ if d.is_replay() => DuplicateCause::Replay,
        None => DuplicateCause::Unknown,
        Some(c) if d.uniq_key.is_empty() || c.uniq_key.is_empty() => DuplicateCause::Unknown,
        Some(c) if c.uniq_key == d.uniq_key => DuplicateCause::Redelivery,
        Some(_) => DuplicateCause::ProducerResend,
    };
    (cause, payload_match)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::delivery::REPLAY_PROPERTY;

    fn claim(uniq_key: &str, hash: &str) -> Claim {
        Claim { msg_id: "m0".into(), uniq_key: uniq_key.into(), payload_hash: hash.into() }
    }

    #[test]
    fn causes_are_told_apart_by_uniq_key() {
        let d = Delivery { uniq_key: "U1".into(), ..Default::default() };
        assert_eq!(classify(&d, "h", Some(&claim("U1", "h"))), (DuplicateCause::Redelivery, Some(true)));
        assert_eq!(classify(&d, "h", Some(&claim("U2", "h"))), (DuplicateCause::ProducerResend, Some(true)));
        assert_eq!(classify(&d, "h", Some(&claim("", "h"))), (DuplicateCause::Unknown, Some(true)));
        assert_eq!(classify(&d, "h", None), (DuplicateCause::Unknown, None));
        let mut replay = d.clone();
        replay.properties.insert(REPLAY_PROPERTY.into(), "m0".into());
        assert_eq!(classify(&replay, "h", Some(&claim("U2", "h"))), (DuplicateCause::Replay, Some(true)));
    }

    #[test]
    fn a_different_body_under_the_same_key_is_a_collision() {
        let d = Delivery { uniq_key: "U2".into(), ..Default::default() };
        assert_eq!(
            classify(&d, "other", Some(&claim("U1", "h"))),
            (DuplicateCause::ProducerResend, Some(false))
        );
    }
}
