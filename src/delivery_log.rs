//! The delivery log: one row per delivery attempt, whatever its outcome. It is the raw material
//! of the trace page, the metrics and the reconciler.
//!
//! This module owns the `delivery_log` table's writes. A `processed` row is written inside the
//! gate's transaction, so it exists exactly when the effect does; every other row is written on
//! its own, and may be written again on a fresh connection when the first one's answer was lost:
//! such a row carries its attempt's [`AttemptId`], unique in the table, and is inserted only if
//! absent ([`append_once`]), so that an insert that committed and lost its answer leaves one
//! row, not two. It must not decide outcomes; the gate does.

pub mod partitions;

use crate::delivery::{BrokerKind, Delivery};
use crate::outcome::{DuplicateCause, Layer, Outcome};
use crate::route::{
    MAX_BIZ_ID_CHARS, MAX_BIZ_TYPE_CHARS, MAX_ID_CHARS, MAX_TOPIC_CHARS, stored_id, stored_key,
};
use crate::store::{
    AnyQuery, Backend, Conn, InsertIfAbsent, Pad, Sql, bind_rows, filtered_insert, query, query_built,
};

/// The longest error text kept, in characters.
pub(crate) const MAX_ERROR_CHARS: usize = 2_000;
/// The most body bytes kept for a dead-lettered or invalid delivery (RocketMQ's own default
/// message size limit). A longer body is cut: the row's `payload_truncated` is set (replay
/// reads it and refuses the row) and its error ends with a note for the reader.
pub const MAX_KEPT_PAYLOAD: usize = 4 * 1024 * 1024;

/// The columns of one row, in the order [`bind`] binds them.
pub const COLUMNS: [&str; 26] = [
    "logged_at_ms",
    "instance_id",
    "consumer_group",
    "msg_id",
    "uniq_key",
    "topic",
    "tags",
    "queue_id",
    "queue_offset",
    "reconsume_times",
    "biz_type",
    "biz_id",
    "execute_time",
    "outcome",
    "cause",
    "layer",
    "payload_match",
    "payload_hash",
    "error",
    "latency_us",
    "payload",
    "payload_truncated",
    "kept_headers",
    "trace_id",
    "broker",
    "stored_copy",
];
static APPEND: Sql = Sql::new(
    "INSERT INTO delivery_log (logged_at_ms, instance_id, consumer_group, msg_id, uniq_key, \
     topic, tags, queue_id, queue_offset, reconsume_times, biz_type, biz_id, execute_time, \
     outcome, cause, layer, payload_match, payload_hash, error, latency_us, payload, payload_truncated, \
     kept_headers, trace_id, broker, stored_copy) \
     VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
);
/// [`APPEND`] with the attempt's id, skipped when the table already holds a row of that
/// attempt. The unique index is on `(attempt_id, logged_at_ms)` (a partitioned table's unique
/// index must hold its partition key; a retried write repeats its row's time), and keeps only
/// the rows that carry an id (PostgreSQL and SQLite: a partial index; MySQL/MariaDB, whose
/// unique index takes NULL as often as it comes, index every row), so a `processed` row, written
/// in the gate's transaction without one, costs nothing more. The conflict names no target: the
/// statement is the same on the plain log, during its move and on the partitioned one, whose
/// unique indexes differ ([`partitions`]).
static APPEND_ONCE: InsertIfAbsent = crate::store::insert_if_absent!(
    "INSERT INTO delivery_log (logged_at_ms, instance_id, consumer_group, msg_id, uniq_key, \
     topic, tags, queue_id, queue_offset, reconsume_times, biz_type, biz_id, execute_time, \
     outcome, cause, layer, payload_match, payload_hash, error, latency_us, payload, payload_truncated, \
     kept_headers, trace_id, broker, stored_copy, attempt_id) \
     VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
    conflict = "",
    index = "delivery_log_attempt"
);

/// One attempt at writing a log row, however often the write is retried: 128 random bits as
/// 32 hex digits (`delivery_log.attempt_id`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AttemptId(String);

impl AttemptId {
    pub fn new() -> Self {
        Self(format!("{:032x}", rand::random::<u128>()))
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl Default for AttemptId {
    fn default() -> Self {
        Self::new()
    }
}

/// The most rows one multi-row append carries (27 values each with its `keep_row`, far below
/// every backend's limit on bound values).
pub(crate) const MAX_ROWS_PER_STATEMENT: usize = 64;

/// One row of the log, borrowed from the delivery it describes.
#[derive(Debug, Clone)]
pub struct Entry<'a> {
    pub logged_at_ms: i64,
    pub instance_id: &'a str,
    pub consumer_group: &'a str,
    pub delivery: &'a Delivery,
    pub biz_type: &'a str,
    pub biz_id: &'a str,
    pub execute_time: i64,
    pub outcome: Outcome,
    pub cause: Option<DuplicateCause>,
    pub layer: Option<Layer>,
    pub payload_match: Option<bool>,
    pub payload_hash: Option<&'a str>,
    pub error: Option<&'a str>,
    pub latency_us: i64,
    /// Keep the body: for dead letters (so they can be replayed) and invalid messages (so they
    /// can be inspected and fixed).
    pub keep_payload: bool,
}

/// Appends `entry` through `conn` (a pooled connection or the gate's open transaction).
///
/// The msgId, UNIQ_KEY, topic and tag are stored exactly as delivered, as the claim holds them,
/// when they fit their columns and can be stored; only a delivery refused for one of them has
/// it stored as an escaped, bounded excerpt ([`stored_id`]), so that a hostile message is logged
/// instead of failing the insert. A bizId or biz_type that passed the key rules is stored
/// exactly as the claim holds it, a refused one as its excerpt ([`stored_key`]).
pub(crate) async fn append(conn: &mut Conn, backend: Backend, entry: &Entry<'_>) -> Result<(), sqlx::Error> {
    bind(query(backend, &APPEND), entry).execute(conn).await?;
    Ok(())
}

/// Appends `entry` as the row of `attempt`, through a connection of its own, unless a row of
/// that attempt is there already (its insert committed and only the answer was lost). True when
/// this call wrote it.
pub async fn append_once(
    conn: &mut Conn,
    backend: Backend,
    entry: &Entry<'_>,
    attempt: &AttemptId,
) -> Result<bool, sqlx::Error> {
    APPEND_ONCE.execute(conn, backend, |q| bind(q, entry).bind(attempt.as_str().to_owned())).await
}

/// Appends `entries` in as few statements as possible (one per [`MAX_ROWS_PER_STATEMENT`]
/// rows): a group commit's log rows cost one round trip, not one each. The rows are padded to
/// a few fixed counts ([`crate::store::Pad::Filter`]), so that each connection prepares this
/// statement a few times, not once per group size; a padding row is the last entry without its
/// body or error, so padding costs no copy of a kept body.
pub(crate) async fn append_many(
    conn: &mut Conn,
    backend: Backend,
    entries: &[Entry<'_>],
) -> Result<(), sqlx::Error> {
    for chunk in entries.chunks(MAX_ROWS_PER_STATEMENT) {
        let Some(last) = chunk.last() else { continue };
        let pad = Entry { keep_payload: false, error: None, ..last.clone() };
        let sql = filtered_insert("delivery_log", &COLUMNS, chunk.len());
        bind_rows(query_built(backend, sql), chunk, &pad, Pad::Filter, bind).execute(&mut *conn).await?;
    }
    Ok(())
}

/// The columns of a claim's delivery, as [`claim_delivery`] reads them.
macro_rules! applied_columns {
    () => {
        "SELECT stored_copy, msg_id, broker, instance_id, logged_at_ms, latency_us, topic, queue_id FROM delivery_log \
         WHERE consumer_group = ? AND biz_type = ? AND biz_id = ? AND execute_time = ? AND outcome = 'processed' "
    };
}
static APPLIED: Sql = Sql::new(concat!(applied_columns!(), "AND msg_id = ? ORDER BY logged_at_ms LIMIT 1"));
static APPLIED_BEFORE: Sql =
    Sql::new(concat!(applied_columns!(), "AND logged_at_ms <= ? ORDER BY logged_at_ms DESC LIMIT 1"));

/// What the log holds of the delivery that made `claim` on `key`: its `processed` row's stored
/// copy, instance, time and queue, the evidence a duplicate of it is held against. `None` when
/// the row is gone (its day dropped) or the claim was made otherwise.
pub(crate) async fn applied(
    conn: &mut Conn,
    backend: Backend,
    consumer_group: &str,
    key: &crate::route::BizKey,
    claim: &crate::outcome::Claim,
) -> Result<Option<crate::outcome::ClaimDelivery>, sqlx::Error> {
    let row = key
        .bind_in(query(backend, &APPLIED), consumer_group)
        .bind(claim.msg_id.clone())
        .fetch_optional(conn)
        .await?;
    row.as_ref().map(claim_delivery).transpose()
}

/// What the log holds of the delivery that applied the key (`biz_type`, `biz_id`,
/// `execute_time`) last at or before `at_ms`: the `processed` row a redelivery logged then is a
/// copy of.
pub(crate) async fn applied_before(
    conn: &mut Conn,
    backend: Backend,
    consumer_group: &str,
    (biz_type, biz_id, execute_time): (&str, &str, i64),
    at_ms: i64,
) -> Result<Option<crate::outcome::ClaimDelivery>, sqlx::Error> {
    let q = crate::route::bind_key(
        query(backend, &APPLIED_BEFORE),
        consumer_group,
        biz_type,
        biz_id,
        execute_time,
    );
    let row = q.bind(at_ms).fetch_optional(conn).await?;
    row.as_ref().map(claim_delivery).transpose()
}

/// A claim's delivery from a row of [`applied_columns`].
fn claim_delivery(row: &sqlx::any::AnyRow) -> Result<crate::outcome::ClaimDelivery, sqlx::Error> {
    use sqlx::Row;
    let broker: Option<String> = row.try_get(2)?;
    let kind = broker.as_deref().and_then(BrokerKind::parse).unwrap_or_default();
    let topic: String = row.try_get(6)?;
    Ok(crate::outcome::ClaimDelivery {
        stored_copy: read_copy(row.try_get(0)?, row.try_get(1)?, broker.as_deref()),
        instance_id: row.try_get(3)?,
        logged_at_ms: row.try_get(4)?,
        latency_us: row.try_get(5)?,
        queue: kind.queue(&topic, row.try_get(7)?),
    })
}

static LOGGED_AT: Sql = Sql::new(
    "SELECT COUNT(*) FROM delivery_log \
     WHERE msg_id = ? AND consumer_group = ? AND instance_id = ? AND logged_at_ms = ?",
);

/// Whether `entry`'s row is in the log: a row of its delivery (msgId), consumer group and
/// instance, logged at its very millisecond. A group's rows are written in its transaction with
/// one `logged_at_ms`; after a COMMIT that lost its answer, this read on a fresh connection
/// tells whether the group committed.
pub(crate) async fn is_logged(
    conn: &mut Conn,
    backend: Backend,
    entry: &Entry<'_>,
) -> Result<bool, sqlx::Error> {
    use sqlx::Row;
    let row = query(backend, &LOGGED_AT)
        .bind(stored_id(&entry.delivery.msg_id, MAX_ID_CHARS).into_owned())
        .bind(entry.consumer_group.to_owned())
        .bind(entry.instance_id.to_owned())
        .bind(entry.logged_at_ms)
        .fetch_one(conn)
        .await?;
    Ok(row.try_get::<i64, _>(0)? > 0)
}

/// Binds one row's 26 values, in column order. The trace id is the message's `traceparent`'s
/// when it can be read; one that cannot is stored as none (the metrics count it), never a
/// reason to refuse the row.
fn bind(q: AnyQuery, entry: &Entry<'_>) -> AnyQuery {
    let d = entry.delivery;
    let mut error = entry.error.map(|e| clip(e, MAX_ERROR_CHARS));
    let truncated = entry.keep_payload && d.body.len() > MAX_KEPT_PAYLOAD;
    let payload = entry.keep_payload.then(|| {
        if truncated {
            let note = format!(" [body of {} bytes cut to {MAX_KEPT_PAYLOAD}]", d.body.len());
            error = Some(error.take().unwrap_or_default() + &note);
            d.body[..MAX_KEPT_PAYLOAD].to_vec()
        } else {
            d.body.clone()
        }
    });
    q.bind(entry.logged_at_ms)
        .bind(entry.instance_id.to_owned())
        .bind(entry.consumer_group.to_owned())
        .bind(stored_id(&d.msg_id, MAX_ID_CHARS).into_owned())
        .bind(stored_id(&d.uniq_key, MAX_ID_CHARS).into_owned())
        .bind(stored_id(&d.topic, MAX_TOPIC_CHARS).into_owned())
        .bind(stored_id(&d.tags, MAX_TOPIC_CHARS).into_owned())
        .bind(d.queue_id)
        .bind(d.queue_offset)
        .bind(d.reconsume_times)
        .bind(stored_key(entry.biz_type, MAX_BIZ_TYPE_CHARS).into_owned())
        .bind(stored_key(entry.biz_id, MAX_BIZ_ID_CHARS).into_owned())
        .bind(entry.execute_time)
        .bind(entry.outcome.as_str())
        .bind(entry.cause.map(DuplicateCause::as_str))
        .bind(entry.layer.map(Layer::as_str))
        .bind(entry.payload_match.map(i16::from))
        .bind(entry.payload_hash.map(str::to_owned))
        .bind(error)
        .bind(entry.latency_us)
        .bind(payload)
        .bind(i16::from(truncated))
        .bind(entry.keep_payload.then(|| kept_headers(d)).flatten())
        .bind(d.trace_id().ok().flatten().map(|t| t.as_str().to_owned()))
        .bind((d.broker != BrokerKind::RocketMq).then(|| d.broker.as_str()))
        .bind(logged_copy(d).map(|copy| stored_id(copy, MAX_ID_CHARS).into_owned()))
}

/// What a row keeps of its delivery's stored copy: nothing when the copy is the delivery's own
/// msgId (every delivery but a retry copy) or the broker names none; the row's msgId stands for
/// it ([`read_copy`]).
fn logged_copy(d: &Delivery) -> Option<&str> {
    (!d.stored_copy.is_empty() && d.stored_copy != d.msg_id).then_some(d.stored_copy.as_str())
}

/// A row's stored copy, from its `stored_copy`, `msg_id` and `broker` columns: what
/// [`logged_copy`] kept, else the row's msgId, except on a broker that names no copies.
pub(crate) fn read_copy(stored_copy: Option<String>, msg_id: String, broker: Option<&str>) -> String {
    match (stored_copy, broker.and_then(BrokerKind::parse)) {
        (Some(copy), _) => copy,
        (None, Some(BrokerKind::RabbitMq)) => String::new(),
        (None, _) => msg_id,
    }
}

/// The most bytes of KEYS and properties kept beside a body (RocketMQ bounds a message's
/// properties to 32 KiB; a stand-in broker might not).
const MAX_KEPT_HEADERS: usize = 64 * 1024;

/// What a message carries beside its body, as JSON (`{"keys": [...], "properties": {...}}`),
/// kept with a dead letter's or invalid delivery's body: a route fixed to read its key from a
/// KEY or a property the refusing route did not read can still read it when the message is
/// replayed. `None` past [`MAX_KEPT_HEADERS`]; replay then rebuilds the message from its key.
fn kept_headers(d: &Delivery) -> Option<String> {
    let headers = KeptHeaders { keys: d.keys.clone(), properties: d.properties.clone() };
    serde_json::to_string(&headers).ok().filter(|json| json.len() <= MAX_KEPT_HEADERS)
}

/// The KEYS and properties of a logged delivery (`delivery_log.kept_headers`).
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub(crate) struct KeptHeaders {
    pub keys: Vec<String>,
    pub properties: std::collections::BTreeMap<String, String>,
}

impl KeptHeaders {
    /// Reads a row's `kept_headers`; `None` when absent or not of this shape.
    pub(crate) fn read(json: Option<&str>) -> Option<Self> {
        serde_json::from_str(json?).ok()
    }
}

/// Cuts `text` to `max` characters without splitting one.
pub(crate) fn clip(text: &str, max: usize) -> String {
    match text.char_indices().nth(max) {
        Some((i, _)) => text[..i].to_owned(),
        None => text.to_owned(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_single_row_append_names_the_columns_in_the_order_bind_binds_them() {
        let expected = format!(
            "INSERT INTO delivery_log ({}) VALUES ({})",
            COLUMNS.join(", "),
            vec!["?"; COLUMNS.len()].join(", ")
        );
        let spelled = APPEND.portable().split_whitespace().collect::<Vec<_>>().join(" ");
        assert_eq!(spelled, expected.split_whitespace().collect::<Vec<_>>().join(" "));
    }
}
