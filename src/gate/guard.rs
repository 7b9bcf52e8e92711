//! The late-duplicate guard: on a fresh claim, the gate may also look the key up in
//! `idempotent_record_archive`. A hit means the key was applied and archived before, and this
//! delivery arrived after the dedup retention: the claim is rolled back and the delivery counted
//! as a duplicate at the `late_duplicate` layer.
//!
//! It costs one indexed lookup per fresh claim (duplicates caught by the live table never reach
//! it). Turn it on when copies can arrive later than the dedup retention: a retention shortened
//! below the redelivery and replay horizon, producers that resend from their own outbox after
//! weeks, or replays of old dead letters.
//!
//! This module owns the lookup. It must not decide the outcome; the gate does.

use crate::outcome::Claim;
use crate::route::BizKey;
use crate::store::{Backend, Conn, Sql, query};

static FIND_ARCHIVED: Sql = Sql::new(
    "SELECT msg_id, uniq_key, payload_hash FROM idempotent_record_archive \
     WHERE consumer_group = ? AND biz_type = ? AND biz_id = ? AND execute_time = ? \
     ORDER BY id DESC LIMIT 1",
);

/// The newest archived claim of `key` for `consumer_group`, if the key was archived.
pub(crate) async fn archived_claim(
    conn: &mut Conn,
    backend: Backend,
    consumer_group: &str,
    key: &BizKey,
) -> Result<Option<Claim>, sqlx::Error> {
    let row = key.bind_in(query(backend, &FIND_ARCHIVED), consumer_group).fetch_optional(conn).await?;
    row.as_ref().map(Claim::from_row).transpose()
}
