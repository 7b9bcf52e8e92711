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
    /// Why a duplicate arrived, read from the evidence of the delivery and of the delivery that
    /// made the claim: the producer's id of the send (RocketMQ UNIQ_KEY, RabbitMQ `message-id`,
    /// Kafka's `UNIQ_KEY` header), the stored copy each was read from
    /// ([`Delivery::stored_copy`]), and the broker's `redelivered` flag where it keeps no copy id.
    DuplicateCause {
        /// The same stored copy delivered again: the broker's doing. What the broker did is the
        /// [`RedeliveryCause`].
        Redelivery => "redelivery",
        /// The same id on a different stored copy, not a retry copy: the producer's client sent
        /// the same message again (its retry after a lost send response or confirm), and the
        /// broker stored and delivered both.
        ProducerRetry => "producer_retry",
        /// Same business key, different id: the application sent the business event again as a
        /// new message.
        ProducerResend => "producer_resend",
        /// A dead letter re-published by `idemgate replay`.
        Replay => "replay",
        /// The gate's own retry of a delivery whose COMMIT lost its answer (the connection
        /// died after the COMMIT was sent): the retry found the claim of that same delivery.
        /// The effect committed once, by this delivery; no broker sent anything again.
        AmbiguousCommit => "ambiguous_commit",
        /// Not enough information (no id on either side, or the claim is gone).
        Unknown => "unknown",
    }
}

labelled! {
    /// What the broker did when it delivered the same stored copy again: read from the record of
    /// what the consumers did ([`crate::instances`]) around the delivery that made the claim.
    RedeliveryCause {
        /// The instance that applied it recorded that its answer (ack, offset commit) failed,
        /// timed out, or could not be sent.
        AckLost => "ack_lost",
        /// The queue or partition was taken from the instance that applied it, which was alive
        /// and did not stop, while the delivery was unanswered.
        Rebalance => "rebalance",
        /// The instance that applied it stopped without a clean stop: its heartbeat ended and no
        /// stop was recorded.
        Crash => "crash",
        /// The broker gave up waiting for the answer: the instance that applied it recorded the
        /// broker's timeout (RabbitMQ's `consumer_timeout`, Kafka's `max.poll.interval.ms`), or
        /// took longer than the broker waits.
        ConsumeTimeout => "consume_timeout",
        /// The same stored copy again with none of the above on record.
        Unattributed => "unattributed",
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
            Self::Redelivery => "the broker delivered the same stored copy again",
            Self::ProducerRetry => {
                "the producer's client sent the same message again (the same id, a second stored copy)"
            }
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

impl RedeliveryCause {
    /// What the sub-cause means to a reader of the trace page.
    pub fn meaning(self) -> &'static str {
        match self {
            Self::AckLost => "the answer of the instance that applied it never reached the broker",
            Self::Rebalance => "the queue was taken from the instance that applied it before it answered",
            Self::Crash => "the instance that applied it stopped without a clean stop before it answered",
            Self::ConsumeTimeout => "the broker gave up waiting for the answer",
            Self::Unattributed => "nothing on record says why the broker delivered it again",
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
    /// The body's hash as the claim keeps it: [`claim_hash`] of the SHA-256 (claims written
    /// before kept its 64 hex digits; [`same_payload`](Self::same_payload) reads either).
    pub payload_hash: String,
}

/// Bytes of the body's SHA-256 a claim keeps: 96 bits, which tell two bodies of one key apart
/// as surely as the whole hash would (a claim's hash is only ever compared with a later copy's
/// under the same key, to say whether it carried the same body), written in base64: 16
/// characters where the 64 hex digits took 64. The log keeps the whole hash in hex.
pub const CLAIM_HASH_BYTES: usize = 12;
/// [`CLAIM_HASH_BYTES`] in base64.
const CLAIM_HASH_CHARS: usize = CLAIM_HASH_BYTES / 3 * 4;

/// What a claim keeps of the body's whole hex hash `full`: its first [`CLAIM_HASH_BYTES`] in
/// base64. Anything that is not a hex hash is kept as it is.
pub fn claim_hash(full: &str) -> String {
    use base64::Engine;
    match full.get(..CLAIM_HASH_BYTES * 2).map(hex::decode) {
        Some(Ok(bytes)) => base64::engine::general_purpose::STANDARD.encode(bytes),
        _ => full.to_owned(),
    }
}

/// A claim's kept hash in hex, for reading beside the log's: the first 24 digits of the body's
/// hash for a claim of [`claim_hash`], the whole hash for an older claim.
pub fn claim_hash_hex(kept: &str) -> String {
    use base64::Engine;
    if kept.len() == CLAIM_HASH_CHARS
        && let Ok(bytes) = base64::engine::general_purpose::STANDARD.decode(kept)
    {
        return hex::encode(bytes);
    }
    kept.to_owned()
}

impl Claim {
    /// A claim from a row whose first columns are `msg_id, uniq_key, payload_hash`, of the live
    /// table or of the archive.
    pub(crate) fn from_row(row: &sqlx::any::AnyRow) -> Result<Self, sqlx::Error> {
        use sqlx::Row;
        Ok(Self { msg_id: row.try_get(0)?, uniq_key: row.try_get(1)?, payload_hash: row.try_get(2)? })
    }

    /// True when a body whose whole hex hash is `full` is the body this claim was made with:
    /// the claim's kept hash, in hex, is the start of `full`, whether it kept 96 bits or all
    /// 256.
    pub fn same_payload(&self, full: &str) -> bool {
        let kept = claim_hash_hex(&self.payload_hash);
        !kept.is_empty() && kept.len() >= (CLAIM_HASH_BYTES * 2).min(full.len()) && full.starts_with(&kept)
    }
}

/// What the log holds of the delivery that made a claim: the evidence a duplicate of it is
/// held against.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct ClaimDelivery {
    /// The stored copy it was read from ([`Delivery::stored_copy`]); empty where the broker keeps
    /// no such id.
    pub stored_copy: String,
    /// The instance that applied it.
    pub instance_id: String,
    /// When its row was logged (the commit), epoch milliseconds.
    pub logged_at_ms: i64,
    /// How long the gate took with it, microseconds.
    pub latency_us: i64,
    /// Its queue, in the words of [`crate::delivery::BrokerKind::queue`].
    pub queue: String,
}

/// Names the cause of a duplicate and says whether its body matches the claim's. `applied` is
/// what the log holds of the delivery that made the claim, when it could be read; without it the
/// claim's msgId stands for its stored copy (true unless a retry copy made the claim).
pub(crate) fn classify(
    d: &Delivery,
    payload_hash: &str,
    claim: Option<&Claim>,
    applied: Option<&ClaimDelivery>,
) -> (DuplicateCause, Option<bool>) {
    let payload_match = claim.map(|c| c.same_payload(payload_hash));
    let Some(c) = claim else {
        return (if d.is_replay() { DuplicateCause::Replay } else { DuplicateCause::Unknown }, payload_match);
    };
    if d.is_replay() {
        return (DuplicateCause::Replay, payload_match);
    }
    // Which stored copy made the claim, where the broker names its copies.
    let claimed_copy = applied.map(|a| a.stored_copy.as_str()).filter(|s| !s.is_empty());
    // The claim's own delivery again (its msgId) is its copy on every broker; otherwise the
    // copies are compared where the broker names them.
    let same_copy = if !d.msg_id.is_empty() && d.msg_id == c.msg_id {
        Some(true)
    } else {
        (!d.stored_copy.is_empty()).then(|| claimed_copy.unwrap_or(c.msg_id.as_str()) == d.stored_copy)
    };
    let ids_known = !d.uniq_key.is_empty() && !c.uniq_key.is_empty();
    let cause = match same_copy {
        // The broker's own word: this very copy came again.
        Some(true) => DuplicateCause::Redelivery,
        _ if d.stored_copy.is_empty() && d.redelivered => DuplicateCause::Redelivery,
        _ if !ids_known => DuplicateCause::Unknown,
        _ if c.uniq_key != d.uniq_key => DuplicateCause::ProducerResend,
        // The same id on another copy (or, on a broker without copy ids, on a message the broker
        // never delivered before): the producer's client sent it again.
        _ => DuplicateCause::ProducerRetry,
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

    fn copy(uniq_key: &str, msg_id: &str, stored_copy: &str) -> Delivery {
        Delivery {
            uniq_key: uniq_key.into(),
            msg_id: msg_id.into(),
            stored_copy: stored_copy.into(),
            ..Default::default()
        }
    }

    #[test]
    fn the_stored_copy_tells_a_redelivery_from_a_producer_retry() {
        // The claim was made by stored copy m0.
        let c = claim("U1", "h");
        let cause = |d: &Delivery| classify(d, "h", Some(&c), None).0;
        assert_eq!(cause(&copy("U1", "m0", "m0")), DuplicateCause::Redelivery, "the same copy again");
        assert_eq!(cause(&copy("U1", "r1", "m0")), DuplicateCause::Redelivery, "a retry copy of it");
        assert_eq!(cause(&copy("U1", "m1", "m1")), DuplicateCause::ProducerRetry, "a second copy, same id");
        assert_eq!(cause(&copy("U2", "m1", "m1")), DuplicateCause::ProducerResend, "another id");
        assert_eq!(cause(&copy("", "m1", "m1")), DuplicateCause::Unknown, "no id");
        assert_eq!(cause(&copy("", "m0", "m0")), DuplicateCause::Redelivery, "no id, but the same copy");
        // A claim made by a retry copy r0 of m0: the log names its stored copy.
        let by_retry = Claim { msg_id: "r0".into(), ..claim("U1", "h") };
        let applied = ClaimDelivery { stored_copy: "m0".into(), ..Default::default() };
        let d = copy("U1", "m0", "m0");
        assert_eq!(classify(&d, "h", Some(&by_retry), Some(&applied)).0, DuplicateCause::Redelivery);
        assert_eq!(
            classify(&d, "h", Some(&by_retry), None).0,
            DuplicateCause::ProducerRetry,
            "without the log"
        );
    }

    #[test]
    fn without_copy_ids_the_redelivered_flag_is_the_brokers_word() {
        let c = claim("U1", "h");
        let flagged = Delivery { uniq_key: "U1".into(), redelivered: true, ..Default::default() };
        assert_eq!(classify(&flagged, "h", Some(&c), None), (DuplicateCause::Redelivery, Some(true)));
        let unflagged = Delivery { uniq_key: "U1".into(), ..Default::default() };
        assert_eq!(classify(&unflagged, "h", Some(&c), None).0, DuplicateCause::ProducerRetry);
        let other = Delivery { uniq_key: "U2".into(), ..Default::default() };
        assert_eq!(classify(&other, "h", Some(&c), None).0, DuplicateCause::ProducerResend);
        assert_eq!(classify(&Delivery::default(), "h", Some(&c), None).0, DuplicateCause::Unknown);
        assert_eq!(classify(&flagged, "h", None, None), (DuplicateCause::Unknown, None));
        let mut replay = other.clone();
        replay.properties.insert(REPLAY_PROPERTY.into(), "m0".into());
        assert_eq!(classify(&replay, "h", Some(&c), None).0, DuplicateCause::Replay);
    }

    #[test]
    fn a_different_body_under_the_same_key_is_a_collision() {
        let d = Delivery { uniq_key: "U2".into(), ..Default::default() };
        assert_eq!(
            classify(&d, "other", Some(&claim("U1", "h")), None),
            (DuplicateCause::ProducerResend, Some(false))
        );
    }

    #[test]
    fn a_claim_keeps_96_bits_of_the_hash_and_still_tells_bodies_apart() {
        let same = Delivery { body: b"{\"sku\":\"A\"}".to_vec(), ..Default::default() };
        let other = Delivery { body: b"{\"sku\":\"B\"}".to_vec(), ..Default::default() };
        let full = same.payload_hash();
        let kept = claim_hash(&full);
        assert_eq!(kept.len(), 16, "{kept}");
        assert_eq!(claim_hash_hex(&kept), full[..24], "read back as the hash's first 24 digits");
        for c in [&claim("U1", &kept), &claim("U1", &full)] {
            assert!(c.same_payload(&full), "a claim of either form matches its body");
            assert!(!c.same_payload(&other.payload_hash()));
        }
        assert!(!claim("U1", "").same_payload(&full), "an empty hash matches nothing");
        assert_eq!(claim_hash("not a hash"), "not a hash");
        assert_eq!(claim_hash_hex("short"), "short");
    }
}
