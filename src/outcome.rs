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
    /// Why a duplicate arrived, read from the UNIQ_KEY of the delivery and of the claim (and,
    /// where either has none, from the broker's redelivered flag).
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

/// Names the cause of a duplicate and says whether its body matches the claim's.
pub(crate) fn classify(
    d: &Delivery,
    payload_hash: &str,
    claim: Option<&Claim>,
) -> (DuplicateCause, Option<bool>) {
    let payload_match = claim.map(|c| c.same_payload(payload_hash));
    let cause = match claim {
        _ if d.is_replay() => DuplicateCause::Replay,
        None => DuplicateCause::Unknown,
        // Without the producer's id, the broker's word that it delivered this message before.
        Some(c) if (d.uniq_key.is_empty() || c.uniq_key.is_empty()) && d.redelivered => {
            DuplicateCause::Redelivery
        }
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
        let flagged = Delivery { redelivered: true, ..Default::default() };
        assert_eq!(
            classify(&flagged, "h", Some(&claim("U1", "h"))),
            (DuplicateCause::Redelivery, Some(true))
        );
        let unflagged = Delivery::default();
        assert_eq!(classify(&unflagged, "h", Some(&claim("U1", "h"))), (DuplicateCause::Unknown, Some(true)));
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
