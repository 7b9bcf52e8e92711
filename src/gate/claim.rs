//! The claim: inserting the business key into its claim table ([`crate::layout`]) inside the business
//! transaction, and reading an earlier claim back to explain a duplicate.
//!
//! Insert first, never select first: a select-then-insert lets two deliveries both see "absent"
//! and both apply the effect. The unique index is the only arbiter; the read here happens only
//! after the index has said "taken", to name the cause.

use crate::delivery::Delivery;
use crate::layout::ClaimTable;
use crate::outcome::Claim;
use crate::route::BizKey;
use crate::store::{Backend, Conn, query};

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
