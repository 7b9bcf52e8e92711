//! The web UI: server-rendered askama pages that work without JavaScript, one module per page:
//! the overview (`/`, [`overview`]), a key's trace (`/trace`, [`trace`]), the lists
//! (`/dead-letters`, `/invalid`, `/collisions`) and the archive job (`/archive`, [`lists`]), the
//! reconciler's findings (`/anomalies`, [`anomalies`]) and the replay action (`POST /replay`,
//! [`replay`]). Every page has the search box; every key links to its trace.
//!
//! Handlers read through [`crate::inspect`] and turn its answers into view structs; askama
//! escapes everything they hold. Errors become [`Problem`] pages. This module holds what the
//! pages share: the router, the error page, links and the delivery row.

use askama::Template;
use axum::Router;
use axum::extract::{RawQuery, State};
use axum::http::{StatusCode, header};
use axum::response::{Html, IntoResponse, Response};
use axum::routing::get;

use super::AppState;
use crate::archive::RunRecord;
use crate::inspect::lists::ListKind;
use crate::inspect::{InspectError, LogRow, format_ms};

pub(super) fn router() -> Router<AppState> {
    Router::new()
        .route("/", get(overview::overview_page))
        .route("/trace", get(trace::trace_page))
        .route(
            "/dead-letters",
            get(|s: State<AppState>, q: RawQuery| lists::list_page(ListKind::DeadLetters, s, q)),
        )
        .route("/invalid", get(|s: State<AppState>, q: RawQuery| lists::list_page(ListKind::Invalid, s, q)))
        .route(
            "/collisions",
            get(|s: State<AppState>, q: RawQuery| lists::list_page(ListKind::Collisions, s, q)),
        )
        .route("/archive", get(lists::archive_page))
        .route("/anomalies", get(anomalies::anomalies_page))
        .route("/replay", axum::routing::post(replay::replay_action))
        .route("/assets/style.css", get(style))
}

/// A page that could not be shown, and why.
#[derive(Debug)]
pub struct Problem {
    pub status: StatusCode,
    pub message: String,
}

impl Problem {
    pub fn bad_request(message: impl Into<String>) -> Self {
        Self { status: StatusCode::BAD_REQUEST, message: message.into() }
    }

    pub fn not_found(message: impl Into<String>) -> Self {
        Self { status: StatusCode::NOT_FOUND, message: message.into() }
    }
}

impl From<InspectError> for Problem {
    fn from(e: InspectError) -> Self {
        let status = match &e {
            InspectError::BadRequest(_) => StatusCode::BAD_REQUEST,
            InspectError::Timeout(_) => StatusCode::SERVICE_UNAVAILABLE,
            InspectError::Database(err) => {
                tracing::error!(error = %err, "a page's database read failed");
                StatusCode::SERVICE_UNAVAILABLE
            }
        };
        let message = match &e {
            InspectError::Database(_) => "the database could not answer; see the service log".to_owned(),
            other => other.to_string(),
        };
        Self { status, message }
    }
}

#[derive(Template)]
#[template(path = "problem.html")]
struct ProblemPage<'a> {
    title: String,
    search: &'a str,
    status: u16,
    reason: &'a str,
    message: &'a str,
}

impl IntoResponse for Problem {
    fn into_response(self) -> Response {
        let page = ProblemPage {
            title: format!("{} {}", self.status.as_u16(), self.status.canonical_reason().unwrap_or("")),
            search: "",
            status: self.status.as_u16(),
            reason: self.status.canonical_reason().unwrap_or("error"),
            message: &self.message,
        };
        (self.status, render(&page)).into_response()
    }
}

/// Renders a template; a template that fails to render is a bug, reported as a plain 500.
fn render(page: &impl Template) -> Response {
    match page.render() {
        Ok(html) => Html(html).into_response(),
        Err(e) => {
            tracing::error!(error = %e, "a template failed to render");
            (StatusCode::INTERNAL_SERVER_ERROR, "the page could not be rendered").into_response()
        }
    }
}

/// The 404 page for paths the UI does not have.
pub(super) fn not_found() -> Problem {
    Problem::not_found(
        "There is no page here. Search for a bizId, msgId or UNIQ_KEY above, or start at the overview.",
    )
}

async fn style() -> impl IntoResponse {
    (
        [(header::CONTENT_TYPE, "text/css; charset=utf-8"), (header::CACHE_CONTROL, "max-age=3600")],
        include_str!("../../../templates/style.css"),
    )
}

mod anomalies;
mod lists;
mod overview;
mod replay;
mod trace;

pub(in crate::http) use anomalies::{anomalies_query, read_anomalies};
pub(in crate::http) use lists::{list_query, read_archive};
pub(in crate::http) use overview::read_overview;
pub(in crate::http) use trace::trace_query;

// ---- views ----------------------------------------------------------------------------------

/// A link to the trace of a key.
pub fn trace_href(biz_id: &str, biz_type: &str, execute_time: i64, group: &str) -> String {
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
    href("/trace", &pairs)
}

/// `path?query` with the pairs URL-encoded.
pub fn href(path: &str, pairs: &[(&str, String)]) -> String {
    match serde_urlencoded::to_string(pairs) {
        Ok(q) if !q.is_empty() => format!("{path}?{q}"),
        _ => path.to_owned(),
    }
}

/// One delivery as a table row.
struct RowView {
    time: String,
    outcome: String,
    /// The CSS class of the row.
    class: &'static str,
    /// In the dead-letter list: whether the key has been claimed since.
    now: &'static str,
    now_class: &'static str,
    cause: String,
    layer: String,
    collision: bool,
    payload: &'static str,
    msg_id: String,
    uniq_key: String,
    position: String,
    reconsume: i32,
    latency: String,
    error: String,
    biz_type: String,
    biz_id: String,
    instance: String,
    /// The trace of this row's key, or of its msgId when it has no bizId.
    trace: String,
}

impl RowView {
    fn new(r: &LogRow) -> Self {
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
            href("/trace", &[("q", r.msg_id.clone()), ("by", "msg_id".to_owned())])
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
            layer: r.layer.clone().unwrap_or_default(),
            collision: r.is_collision(),
            payload: match r.payload_match {
                Some(true) => "same body",
                Some(false) => "BODY DIFFERS",
                None => "",
            },
            msg_id: r.msg_id.clone(),
            uniq_key: r.uniq_key.clone(),
            position: format!("{} · q{} · @{}", r.topic, r.queue_id, r.queue_offset),
            reconsume: r.reconsume_times,
            latency: latency(r.latency_us),
            error: r.error.clone().unwrap_or_default(),
            biz_type: r.biz_type.clone(),
            biz_id: r.biz_id.clone(),
            instance: r.instance_id.clone(),
            trace,
        }
    }
}

fn latency(us: i64) -> String {
    match us {
        us if us < 1_000 => format!("{us} µs"),
        us if us < 1_000_000 => format!("{:.1} ms", us as f64 / 1_000.0),
        us => format!("{:.2} s", us as f64 / 1_000_000.0),
    }
}

struct RunView {
    kind: String,
    status: String,
    class: &'static str,
    started_by: String,
    instance: String,
    started: String,
    took: String,
    cutoff: String,
    rows_moved: i64,
    batches: i64,
    detail: String,
}

impl RunView {
    fn new(r: &RunRecord) -> Self {
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
