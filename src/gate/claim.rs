//! The claim: inserting the business key into its claim table ([`crate::layout`]) inside the business
//! transaction, and reading an earlier claim back to explain a duplicate.
//!
//! Insert first, never select first: a select-then-insert lets two deliveries both see "absent"
//! and both apply the effect. The unique index is the only arbiter; the read here happens only
//! after the index has said "taken", to name the cause.

use crate::delivery::Delivery;
use crate::gate::DuplicateCause;
use crate::layout::ClaimTable;
use crate::route::BizKey;
use crate::store::{Backend, Conn, query};

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

/// Who is claiming, and when: the consumer group is part of the key (see
/// [`crate::gate::Identity`]).
pub(crate) struct Claimant<'a> {
    pub consumer_group: &'a str,
    pub instance_id: &'a str,
    pub now_ms: i64,
}

/// Inserts the claim. True when this delivery now owns the key; false when it was taken.
///
/// A concurrent, uncommitted claim of the same key makes this wait for that transaction: if it
/// commits, the answer is false; if it rolls back, this insert goes through.
pub(crate) async fn claim(
    conn: &mut Conn,
    backend: Backend,
    table: &ClaimTable,
    who: &Claimant<'_>,
    key: &BizKey,
    d: &Delivery,
    payload_hash: &str,
) -> Result<bool, sqlx::Error> {
    table
        .claim
        .execute(conn, backend, |q| {
            q.bind(who.consumer_group)
                .bind(key.biz_type.as_str())
                .bind(key.biz_id.as_str())
                .bind(key.execute_time)
                .bind(d.msg_id.as_str())
                .bind(d.uniq_key.as_str())
                .bind(payload_hash)
                .bind(who.instance_id)
                .bind(who.now_ms)
        })
        .await
}

/// Reads the claim that holds `key` for `consumer_group` in `table`.
pub(crate) async fn find(
    conn: &mut Conn,
    backend: Backend,
    table: &ClaimTable,
    consumer_group: &str,
    key: &BizKey,
) -> Result<Option<Claim>, sqlx::Error> {
    let row = query(backend, &table.find)
        .bind(consumer_group)
        .bind(key.biz_type.as_str())
        .bind(key.biz_id.as_str())
        .bind(key.execute_time)
        .fetch_optional(conn)
        .await?;
    row.as_ref().map(Claim::from_row).transpose()
}

/// Names the cause of a duplicate and says whether its body matches the claim's.
pub fn classify(d: &Delivery, payload_hash: &str, claim: Option<&Claim>) -> (DuplicateCause, Option<bool>) {
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
