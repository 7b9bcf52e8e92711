//! Reading the story back: what the web UI, the JSON API and `idemgate trace` show. It turns the
//! delivery log, the dedup table and its archive into a key's trace ([`trace`]), the ops overview
//! ([`overview`]) and the lists of dead letters, invalid messages and key collisions ([`lists`]).
//!
//! Every read here is bounded: a row limit in each statement and a time limit on each request
//! ([`Limits`]), so that a page opened during an incident cannot add to it. This module only
//! reads; it must not write, and it must not know about HTTP or HTML.

pub mod instances;
pub mod lists;
pub mod overview;
pub mod trace;

use std::future::Future;
use std::time::Duration;

use serde::Serialize;
use sqlx::Row;
use sqlx::any::AnyRow;

use crate::delivery::BrokerKind;
use crate::route::{MAX_BIZ_ID_CHARS, MAX_BIZ_TYPE_CHARS, MAX_ID_CHARS};

/// The bounds of one request's reads.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limits {
    /// The longest a request may wait on the database.
    pub timeout: Duration,
}

impl Default for Limits {
    fn default() -> Self {
        Self { timeout: Duration::from_secs(5) }
    }
}

impl Limits {
    /// Runs `read` within the time limit.
    pub async fn run<T>(
        &self,
        read: impl Future<Output = Result<T, sqlx::Error>>,
    ) -> Result<T, InspectError> {
        match tokio::time::timeout(self.timeout, read).await {
            Ok(result) => result.map_err(InspectError::Database),
            Err(_) => Err(InspectError::Timeout(self.timeout)),
        }
    }
}

/// Why a read gave no answer.
#[derive(Debug, thiserror::Error)]
pub enum InspectError {
    /// The question itself is wrong: a parameter too long, malformed or out of range. The text
    /// says which and why.
    #[error("{0}")]
    BadRequest(String),
    #[error("the database did not answer within {} ms; try a narrower query", .0.as_millis())]
    Timeout(Duration),
    #[error("database error: {0}")]
    Database(#[from] sqlx::Error),
}

/// One row of the delivery log, without the body.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct LogRow {
    pub id: i64,
    pub logged_at_ms: i64,
    pub instance_id: String,
    pub consumer_group: String,
    pub msg_id: String,
    pub uniq_key: String,
    pub topic: String,
    pub tags: String,
    pub queue_id: i32,
    pub queue_offset: i64,
    pub reconsume_times: i32,
    pub biz_type: String,
    pub biz_id: String,
    pub execute_time: i64,
    pub outcome: String,
    pub cause: Option<String>,
    pub layer: Option<String>,
    /// For a duplicate: whether its body hashed the same as the claim's. `false` is a key
    /// collision.
    pub payload_match: Option<bool>,
    pub payload_hash: Option<String>,
    pub error: Option<String>,
    pub latency_us: i64,
    /// The W3C trace id of the message, from its `traceparent`; `None` without one (or with one
    /// that could not be read).
    pub trace_id: Option<String>,
    /// The kind of broker that delivered it (RocketMQ for rows logged before the column).
    pub broker: BrokerKind,
    /// The stored copy it was read from ([`crate::delivery::Delivery::stored_copy`]); empty on
    /// a broker that names none (RabbitMQ).
    pub stored_copy: String,
    /// For a redelivery: what the broker did (`ack_lost`, `rebalance`, `crash`,
    /// `consume_timeout`, `unattributed`), written a few seconds after the row by the instance
    /// that logged it; `None` until then.
    pub sub_cause: Option<String>,
    /// For a duplicate in a key's timeline: what happened, in words, and the evidence
    /// ([`trace::explain`]).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub explanation: Option<String>,
    /// In the lists: when the key was claimed, if it is claimed now. A dead letter whose key
    /// has since been claimed (by a replay or a resend) is resolved; one without is not.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub claimed_at_ms: Option<i64>,
}

/// The columns [`LogRow::from_row`] reads, in order, as a literal for `concat!`.
macro_rules! log_columns {
    () => {
        "id, logged_at_ms, instance_id, consumer_group, msg_id, uniq_key, topic, tags, queue_id, queue_offset, \
         reconsume_times, biz_type, biz_id, execute_time, outcome, cause, layer, payload_match, payload_hash, \
         error, latency_us, trace_id, broker, stored_copy, sub_cause"
    };
}
pub(crate) use log_columns;

impl LogRow {
    pub(crate) fn from_row(r: &AnyRow) -> Result<Self, sqlx::Error> {
        Ok(Self {
            id: r.try_get(0)?,
            logged_at_ms: r.try_get(1)?,
            instance_id: r.try_get(2)?,
            consumer_group: r.try_get(3)?,
            msg_id: r.try_get(4)?,
            uniq_key: r.try_get(5)?,
            topic: r.try_get(6)?,
            tags: r.try_get(7)?,
            queue_id: r.try_get(8)?,
            queue_offset: r.try_get(9)?,
            reconsume_times: r.try_get(10)?,
            biz_type: r.try_get(11)?,
            biz_id: r.try_get(12)?,
            execute_time: r.try_get(13)?,
            outcome: r.try_get(14)?,
            cause: r.try_get(15)?,
            layer: r.try_get(16)?,
            payload_match: r.try_get::<Option<i16>, _>(17)?.map(|m| m != 0),
            payload_hash: r.try_get(18)?,
            error: r.try_get(19)?,
            latency_us: r.try_get(20)?,
            trace_id: r.try_get(21)?,
            broker: r
                .try_get::<Option<String>, _>(22)?
                .as_deref()
                .and_then(BrokerKind::parse)
                .unwrap_or(BrokerKind::RocketMq),
            stored_copy: crate::delivery_log::read_copy(
                r.try_get(23)?,
                r.try_get(4)?,
                r.try_get::<Option<String>, _>(22)?.as_deref(),
            ),
            sub_cause: r.try_get(24)?,
            explanation: None,
            claimed_at_ms: if r.len() > 25 { r.try_get(25)? } else { None },
        })
    }

    /// A key collision: a duplicate whose body differs from the claim's.
    pub(crate) fn is_collision(&self) -> bool {
        self.payload_match == Some(false)
    }
}

/// A text parameter as the UI and the API take it: trimmed, at most `max` characters, no
/// control characters. Anything printable is allowed, since that is what keys may hold in the
/// log; it is only ever bound as a parameter and escaped on output.
pub fn checked_text(name: &str, value: &str, max: usize) -> Result<String, InspectError> {
    let value = value.trim();
    let chars = value.chars().count();
    if chars > max {
        return Err(InspectError::BadRequest(format!(
            "{name} is {chars} characters long; no stored {name} is longer than {max}"
        )));
    }
    if let Some(c) = value.chars().find(|c| c.is_control()) {
        return Err(InspectError::BadRequest(format!(
            "{name} contains the control character {:?}, which no stored {name} holds",
            c
        )));
    }
    Ok(value.to_owned())
}

/// True for a filter that selects everything: absent, empty, or what Grafana's "All" sends
/// (`.*`, `$__all`).
pub(crate) fn means_all(value: Option<&str>) -> bool {
    matches!(value.map(str::trim), None | Some("") | Some(".*") | Some("$__all"))
}

/// A biz_type filter; [`means_all`] values mean every biz_type.
pub(crate) fn biz_type_filter(value: Option<&str>) -> Result<Option<String>, InspectError> {
    match value.map(str::trim) {
        v if means_all(v) => Ok(None),
        Some(v) => checked_text("biz_type", v, MAX_BIZ_TYPE_CHARS).map(Some),
        None => Ok(None),
    }
}

/// The longest searchable text: a bizId, msgId or UNIQ_KEY (a trace id is shorter).
pub(crate) const MAX_SEARCH_CHARS: usize =
    if MAX_BIZ_ID_CHARS > MAX_ID_CHARS { MAX_BIZ_ID_CHARS } else { MAX_ID_CHARS };

/// The columns that confine a read: keys (a probe reads a few rows whatever the table's size)
/// and time windows (a range read once, as large as the window).
#[derive(Debug, Clone, Copy)]
pub struct Bounds {
    pub keys: &'static [&'static str],
    pub windows: &'static [&'static str],
}

/// What confines every read of the readers' statements (the overview, the lists, the
/// reconciler and its checks) so that none costs more when the planner's statistics are stale:
/// a probe by a key (bizId, msgId, a ledger's deduction) or, for the read that drives a
/// statement, its time window. Their tests and `idemgate-bench reconcile` read the plans against it.
pub const READ_BOUNDS: Bounds = Bounds {
    keys: &["biz_id", "msg_id", "deduction_id"],
    windows: &["logged_at_ms", "claimed_at_ms", "applied_at_ms"],
};

/// Reads a moment given as epoch milliseconds, RFC 3339, or a date and time in UTC as an
/// HTML `datetime-local` input sends it (`2026-11-29T10:52`).
pub(crate) fn parse_moment(name: &str, text: &str) -> Result<i64, InspectError> {
    let text = text.trim();
    if let Ok(ms) = text.parse::<i64>() {
        return Ok(ms);
    }
    if let Ok(t) = chrono::DateTime::parse_from_rfc3339(text) {
        return Ok(t.timestamp_millis());
    }
    for format in ["%Y-%m-%dT%H:%M", "%Y-%m-%dT%H:%M:%S", "%Y-%m-%d %H:%M", "%Y-%m-%d %H:%M:%S"] {
        if let Ok(t) = chrono::NaiveDateTime::parse_from_str(text, format) {
            return Ok(t.and_utc().timestamp_millis());
        }
    }
    let shown: String = text.chars().take(40).flat_map(char::escape_debug).collect();
    Err(InspectError::BadRequest(format!(
        "{name} {shown:?} is not a moment: give epoch milliseconds, RFC 3339 (2026-11-29T10:52:00Z) \
         or a UTC date and time (2026-11-29T10:52)"
    )))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn text_parameters_are_bounded_and_free_of_control_characters() {
        assert_eq!(checked_text("bizId", "  O-1 ", 128).unwrap(), "O-1");
        assert_eq!(checked_text("bizId", "<script>'; DROP TABLE x;--", 128).unwrap().len(), 26);
        let long = "x".repeat(129);
        assert!(checked_text("bizId", &long, 128).unwrap_err().to_string().contains("129 characters"));
        assert!(checked_text("bizId", "a\u{0}b", 128).unwrap_err().to_string().contains("control"));
    }

    #[test]
    fn grafana_all_means_no_biz_type_filter() {
        assert_eq!(biz_type_filter(Some(".*")).unwrap(), None);
        assert_eq!(biz_type_filter(Some("")).unwrap(), None);
        assert_eq!(biz_type_filter(Some("stock.deduct")).unwrap().as_deref(), Some("stock.deduct"));
    }

    #[test]
    fn moments_are_read_in_three_forms_and_nonsense_is_explained() {
        assert_eq!(parse_moment("since", "1700000000000").unwrap(), 1_700_000_000_000);
        assert_eq!(parse_moment("since", "2026-11-29T10:52:00Z").unwrap(), 1_795_949_520_000);
        assert_eq!(parse_moment("since", "2026-11-29T10:52").unwrap(), 1_795_949_520_000);
        let err = parse_moment("since", "yesterday").unwrap_err().to_string();
        assert!(err.contains("\"yesterday\" is not a moment"), "{err}");
    }
}
