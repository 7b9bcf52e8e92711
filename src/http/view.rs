//! What the pages and the API share: rendering a template, links to a key's trace, the
//! delivery and run rows every list shows, the stylesheet, and JSON answers.

use askama::Template;
use axum::Json;
use axum::http::{StatusCode, header};
use axum::response::{Html, IntoResponse, Response};
use serde::Serialize;

use crate::archive::RunRecord;
use crate::clock::format_ms;
use crate::inspect::LogRow;
use crate::outcome::DuplicateCause;

/// A JSON answer.
pub(super) fn json<T: Serialize>(body: &T) -> Response {
    Json(body).into_response()
}

/// Renders a template; a template that fails to render is a bug, reported as a plain 500.
pub(super) fn render(page: &impl Template) -> Response {
    match page.render() {
        Ok(html) => Html(html).into_response(),
        Err(e) => {
            tracing::error!(error = %e, "a template failed to render");
            (StatusCode::INTERNAL_SERVER_ERROR, "the page could not be rendered").into_response()
        }
    }
}

/// The pages' one stylesheet.
pub(super) async fn style() -> impl IntoResponse {
    (
        [(header::CONTENT_TYPE, "text/css; charset=utf-8"), (header::CACHE_CONTROL, "max-age=3600")],
        include_str!("../../templates/style.css"),
    )
}

/// A link to the trace of a key.
pub(super) fn trace_href(biz_id: &str, biz_type: &str, execute_time: i64, group: &str) -> String {
    href("/trace", &trace_pairs(biz_id, biz_type, execute_time, group))
}

/// The query of a link to the trace of a key.
pub(super) fn trace_pairs(
    biz_id: &str,
    biz_type: &str,
    execute_time: i64,
    group: &str,
) -> Vec<(&'static str, String)> {
    let mut pairs = vec![("biz_id", biz_id.to_owned()), ("by", "biz_id".to_owned())];
    if !biz_type.is_empty() {
        pairs.push(("biz_type", biz_type.to_owned()));
    }
    if execute_time != 0 {
        pairs.push(("execute_time", execute_time.to_string()));
    }
    if !group.is_empty() {
        pairs.push(("group", group.to_owned()));
    }
    pairs
}

/// A link to the trace of the message with `msg_id`: the way to a delivery refused before a
/// bizId could be read from it.
pub(super) fn message_trace_href(msg_id: &str) -> String {
    href("/trace", &[("q", msg_id.to_owned()), ("by", "msg_id".to_owned())])
}

/// `path?query` with the pairs URL-encoded.
pub(super) fn href(path: &str, pairs: &[(&str, String)]) -> String {
    match serde_urlencoded::to_string(pairs) {
        Ok(q) if !q.is_empty() => format!("{path}?{q}"),
        _ => path.to_owned(),
    }
}

/// One delivery as a table row.
pub(super) struct RowView {
    pub(super) time: String,
    pub(super) outcome: String,
    /// The CSS class of the row.
    pub(super) class: &'static str,
    /// In the dead-letter list: whether the key has been claimed since.
    pub(super) now: &'static str,
    pub(super) now_class: &'static str,
    pub(super) cause: String,
    /// What the cause means, in words ([`crate::outcome::DuplicateCause::meaning`]); empty
    /// without a cause.
    pub(super) cause_meaning: &'static str,
    /// The cause is the gate's own retry after a COMMIT that lost its answer, not a broker's
    /// redelivery: the row says so in words.
    pub(super) ambiguous_commit: bool,
    /// For a redelivery: what the broker did, once the consumer record told it.
    pub(super) sub_cause: String,
    /// For a duplicate in a key's timeline: what happened and the evidence, in words.
    pub(super) explanation: String,
    pub(super) layer: String,
    pub(super) collision: bool,
    pub(super) payload: &'static str,
    pub(super) msg_id: String,
    pub(super) uniq_key: String,
    pub(super) position: String,
    pub(super) reconsume: i32,
    pub(super) latency: String,
    pub(super) error: String,
    pub(super) biz_type: String,
    pub(super) biz_id: String,
    pub(super) instance: String,
    /// The trace of this row's key, or of its msgId when it has no bizId.
    pub(super) trace: String,
    /// The W3C trace id of the message (empty without one), and the link to it in the tracing
    /// UI `http.trace_url_template` names (empty without the setting: the id is shown as text).
    pub(super) trace_id: String,
    pub(super) trace_id_href: String,
    /// The message's trace in the RocketMQ dashboard (`http.rocketmq_dashboard_url`), by the
    /// id its trace records carry (the UNIQ_KEY, else the msgId); empty without the setting.
    pub(super) message_trace_href: String,
    /// The kind of broker that delivered it: only RocketMQ's deliveries have a message trace
    /// in the RocketMQ dashboard.
    pub(super) broker: crate::delivery::BrokerKind,
}

impl RowView {
    /// The row of `r`; its trace id linked through `trace_url_template` when there is one.
    pub(super) fn new(r: &LogRow, trace_url_template: Option<&str>) -> Self {
        let class = match r.outcome.as_str() {
            "processed" => "ok",
            "duplicate" if r.is_collision() => "collision",
            "duplicate" => "dup",
            "failed" => "retry",
            "dead_lettered" => "dead",
            "invalid" => "invalid",
            _ => "",
        };
        let trace = if r.biz_id.is_empty() {
            message_trace_href(&r.msg_id)
        } else {
            trace_href(&r.biz_id, &r.biz_type, r.execute_time, &r.consumer_group)
        };
        let (now, now_class) = match (r.outcome.as_str(), r.claimed_at_ms) {
            ("dead_lettered", Some(_)) => ("applied since", "ok"),
            ("dead_lettered", None) => ("still unapplied", "dead"),
            _ => ("", ""),
        };
        Self {
            time: format_ms(r.logged_at_ms),
            outcome: match r.outcome.as_str() {
                "failed" => "failed · retried".to_owned(),
                other => other.replace('_', " "),
            },
            now,
            now_class,
            class,
            cause: r.cause.clone().unwrap_or_default().replace('_', " "),
            cause_meaning: r
                .cause
                .as_deref()
                .and_then(DuplicateCause::parse)
                .map_or("", DuplicateCause::meaning),
            ambiguous_commit: r.cause.as_deref() == Some(DuplicateCause::AmbiguousCommit.as_str()),
            sub_cause: r.sub_cause.clone().unwrap_or_default().replace('_', " "),
            explanation: r.explanation.clone().unwrap_or_default(),
            layer: r.layer.clone().unwrap_or_default(),
            collision: r.is_collision(),
            payload: match r.payload_match {
                Some(true) => "same body",
                Some(false) => "BODY DIFFERS",
                None => "",
            },
            msg_id: r.msg_id.clone(),
            uniq_key: r.uniq_key.clone(),
            position: r.broker.position(&r.topic, &r.tags, r.queue_id, r.queue_offset),
            reconsume: r.reconsume_times,
            latency: latency(r.latency_us),
            error: r.error.clone().unwrap_or_default(),
            biz_type: r.biz_type.clone(),
            biz_id: r.biz_id.clone(),
            instance: r.instance_id.clone(),
            trace,
            trace_id: r.trace_id.clone().unwrap_or_default(),
            trace_id_href: match (&r.trace_id, trace_url_template) {
                (Some(id), Some(template)) => crate::inspect::trace::trace_link(template, id),
                _ => String::new(),
            },
            message_trace_href: String::new(),
            broker: r.broker,
        }
    }

    /// The row with its message's trace in the RocketMQ dashboard linked through `template`,
    /// when there is one.
    pub(super) fn with_message_trace(mut self, template: Option<&str>) -> Self {
        let id = if self.uniq_key.is_empty() { &self.msg_id } else { &self.uniq_key };
        if let Some(template) = template
            && !id.is_empty()
            && self.broker == crate::delivery::BrokerKind::RocketMq
        {
            self.message_trace_href = crate::inspect::trace::message_trace_link(template, id);
        }
        self
    }
}

fn latency(us: i64) -> String {
    match us {
        us if us < 1_000 => format!("{us} µs"),
        us if us < 1_000_000 => format!("{:.1} ms", us as f64 / 1_000.0),
        us => format!("{:.2} s", us as f64 / 1_000_000.0),
    }
}

pub(super) struct RunView {
    pub(super) kind: String,
    pub(super) status: String,
    pub(super) class: &'static str,
    pub(super) started_by: String,
    pub(super) instance: String,
    pub(super) started: String,
    pub(super) took: String,
    pub(super) cutoff: String,
    pub(super) rows_moved: i64,
    pub(super) batches: i64,
    pub(super) detail: String,
}

impl RunView {
    pub(super) fn new(r: &RunRecord) -> Self {
        let status = r.status.as_str();
        Self {
            kind: r.kind.to_string(),
            status: status.to_owned(),
            class: match status {
                "success" => "ok",
                "failed" => "dead",
                "running" => "retry",
                _ => "dup",
            },
            started_by: r.started_by.to_string(),
            instance: r.instance_id.clone(),
            started: format_ms(r.started_at_ms),
            took: r
                .finished_at_ms
                .map(|f| latency((f - r.started_at_ms).saturating_mul(1_000)))
                .unwrap_or_else(|| "-".to_owned()),
            cutoff: format_ms(r.cutoff_ms),
            rows_moved: r.rows_moved,
            batches: r.batches,
            detail: [r.error.as_deref(), r.note.as_deref()]
                .into_iter()
                .flatten()
                .collect::<Vec<_>>()
                .join(" · "),
        }
    }
}
