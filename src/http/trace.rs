//! `/trace`: a key's story, or the choice of keys a search matched.

use askama::Template;
use axum::extract::{RawQuery, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};

use super::params::Params;
use super::problem::ApiError;
use super::problem::Problem;
use super::state::AppState;
use super::view::{RowView, href, render, trace_href, trace_pairs};
use crate::clock::format_ms;
use crate::handler::Fact;
use crate::inspect::InspectError;
use crate::inspect::lists::Cursor;
use crate::inspect::trace::{
    self, Answer, Candidate, ClaimRecord, PageAt, SearchBy, Story, TraceQuery, count_text,
};
use axum::extract::Path;
use axum::routing::get;
use axum::{Json, Router};

pub(super) fn router() -> Router<AppState> {
    Router::new()
        .route("/trace", get(trace_page))
        .route("/api/trace", get(trace_by_query))
        .route("/api/trace/{biz_id}", get(trace_by_path))
}

/// Reads a trace search from the query string: `q` (or `biz_id`, `msg_id`, `uniq_key`,
/// `trace_id`), `by`, `biz_type`, `execute_time`, `group`, and the timeline's page, `after` or
/// `before` a cursor.
pub(super) fn trace_query(p: &Params) -> Result<Option<TraceQuery>, InspectError> {
    let (text, implied) = if let Some(t) = p.get("biz_id") {
        (t, SearchBy::BizId)
    } else if let Some(t) = p.get("msg_id") {
        (t, SearchBy::MsgId)
    } else if let Some(t) = p.get("uniq_key") {
        (t, SearchBy::UniqKey)
    } else if let Some(t) = p.get("trace_id") {
        (t, SearchBy::TraceId)
    } else if let Some(t) = p.get("q") {
        (t, SearchBy::Any)
    } else {
        return Ok(None);
    };
    if text.trim().is_empty() {
        return Ok(None);
    }
    let by = match p.get("by") {
        Some(b) => SearchBy::parse(b)?,
        None => implied,
    };
    TraceQuery::new(text, by, p.get("biz_type"), execute_time(p)?, p.get("group"))?
        .paged(p.get("after"), p.get("before"))
        .map(Some)
}

/// The `execute_time` parameter, read as a route reads one: epoch milliseconds or RFC 3339;
/// absent or empty, none.
fn execute_time(p: &Params) -> Result<Option<i64>, InspectError> {
    match p.get("execute_time").map(str::trim).filter(|t| !t.is_empty()) {
        None => Ok(None),
        Some(t) => crate::route::parse_execute_time(t)
            .map(Some)
            .map_err(|why| InspectError::BadRequest(format!("execute_time: {why}"))),
    }
}

struct ClaimView {
    state: &'static str,
    claimed: String,
    msg_id: String,
    uniq_key: String,
    instance: String,
    payload_hash: String,
    archived: String,
}

impl ClaimView {
    fn new(c: &ClaimRecord) -> Self {
        Self {
            state: c.state,
            claimed: format_ms(c.claimed_at_ms),
            msg_id: c.msg_id.clone(),
            uniq_key: c.uniq_key.clone(),
            instance: c.instance_id.clone(),
            payload_hash: c.payload_hash.clone(),
            archived: c.archived_at_ms.map(format_ms).unwrap_or_default(),
        }
    }
}

struct CandidateView {
    href: String,
    biz_type: String,
    biz_id: String,
    execute_time: String,
    group: String,
    deliveries: String,
    claim: &'static str,
    first: String,
    last: String,
}

impl CandidateView {
    fn new(c: &Candidate) -> Self {
        let k = &c.key;
        Self {
            href: trace_href(&k.biz_id, &k.biz_type, k.execute_time, &k.consumer_group),
            biz_type: k.biz_type.clone(),
            biz_id: k.biz_id.clone(),
            execute_time: if k.execute_time == 0 { "-".to_owned() } else { format_ms(k.execute_time) },
            group: k.consumer_group.clone(),
            deliveries: count_text(usize::try_from(c.deliveries).unwrap_or(0)),
            claim: c.claim,
            first: c.first_seen_ms.map(format_ms).unwrap_or_default(),
            last: c.last_seen_ms.map(format_ms).unwrap_or_default(),
        }
    }
}

struct StoryView {
    biz_id: String,
    biz_type: String,
    execute_time: String,
    group: String,
    matched_by: &'static str,
    state: &'static str,
    trouble: bool,
    first_seen: String,
    processed_at: String,
    /// The counts over every delivery of the key; each is read up to
    /// [`trace::COUNT_LIMIT`], and [`StoryView::count`] shows one past it as "more than".
    deliveries: usize,
    processed: usize,
    duplicates: Vec<(String, String)>,
    collisions: usize,
    retries: usize,
    dead_letters: usize,
    invalid: usize,
    claim: Option<ClaimView>,
    earlier_claims: Vec<ClaimView>,
    business: Vec<Fact>,
    /// One page of the timeline, and the links to its neighbours and to its two ends (empty
    /// where there is none).
    timeline: Vec<RowView>,
    previous_href: String,
    next_href: String,
    oldest_href: String,
    newest_href: String,
    page_rows: usize,
    retention_note: String,
    grafana_url: String,
    /// The traces of this page's deliveries: each trace id and its link (empty without
    /// `http.trace_url_template`: the id is shown as text).
    traces: Vec<(String, String)>,
    json_href: String,
    /// The replay form's CSRF token, when the key can be replayed here: dead-lettered or
    /// refused as invalid, not claimed, and this process has a broker.
    replay_csrf: String,
    /// The msgId the replay form names, for a message refused before a bizId could be read
    /// from it; empty when the form names the key.
    replay_msg_id: String,
    /// What the replay form re-publishes: `dead letter` or `invalid delivery`.
    replay_what: &'static str,
    execute_time_ms: i64,
}

impl StoryView {
    fn new(s: &Story, matched_by: SearchBy, query: &TraceQuery, web: &crate::http::Web) -> Self {
        let m = &s.summary;
        let k = &s.key;
        let mut json_pairs = vec![("biz_type", k.biz_type.clone()), ("group", k.consumer_group.clone())];
        if k.execute_time != 0 {
            json_pairs.push(("execute_time", k.execute_time.to_string()));
        }
        let replay = ReplayForm::of(s, web);
        let mut json_path = format!("/api/trace/{}", path_segment(&k.biz_id));
        // The trace of a message without a bizId is the message's own: its links name it.
        let page_pairs = if k.biz_id.is_empty() {
            json_path = "/api/trace".to_owned();
            json_pairs = vec![
                ("q", query.text.clone()),
                ("by", matched_by.param().to_owned()),
                ("biz_type", k.biz_type.clone()),
                ("group", k.consumer_group.clone()),
            ];
            json_pairs.clone()
        } else {
            trace_pairs(&k.biz_id, &k.biz_type, k.execute_time, &k.consumer_group)
        };
        let page_href = |name: &'static str, cursor: Option<String>| {
            cursor
                .map(|c| {
                    let mut pairs = page_pairs.clone();
                    pairs.push((name, c));
                    href("/trace", &pairs)
                })
                .unwrap_or_default()
        };
        match query.page {
            PageAt::Oldest => {}
            PageAt::After(c) => json_pairs.push(("after", c.to_string())),
            PageAt::Before(c) => json_pairs.push(("before", c.to_string())),
        }
        // The newest page ends after the last delivery.
        let newest =
            m.last_seen_ms.map(|at| Cursor { logged_at_ms: at.saturating_add(1), id: 0 }.to_string());
        Self {
            biz_id: k.biz_id.clone(),
            biz_type: k.biz_type.clone(),
            execute_time: if k.execute_time == 0 { String::new() } else { format_ms(k.execute_time) },
            group: k.consumer_group.clone(),
            matched_by: matched_by.label(),
            state: m.final_state_text,
            trouble: m.final_state.is_trouble(),
            first_seen: m.first_seen_ms.map(format_ms).unwrap_or_else(|| "-".to_owned()),
            processed_at: m.processed_at_ms.map(format_ms).unwrap_or_else(|| "never".to_owned()),
            deliveries: m.deliveries,
            processed: m.processed,
            duplicates: m.duplicates.iter().map(|(c, n)| (c.replace('_', " "), count_text(*n))).collect(),
            collisions: m.collisions,
            retries: m.retries,
            dead_letters: m.dead_letters,
            invalid: m.invalid,
            claim: s.claim.as_ref().map(ClaimView::new),
            earlier_claims: s.earlier_claims.iter().map(ClaimView::new).collect(),
            business: s.business.clone(),
            timeline: s
                .deliveries
                .iter()
                .map(|r| {
                    RowView::new(r, web.trace.trace_url_template.as_deref())
                        .with_message_trace(web.trace.dashboard_url_template.as_deref())
                })
                .collect(),
            previous_href: page_href("before", s.previous.clone()),
            next_href: page_href("after", s.next.clone()),
            oldest_href: if s.previous.is_some() { href("/trace", &page_pairs) } else { String::new() },
            newest_href: page_href("before", newest.filter(|_| s.next.is_some())),
            page_rows: trace::PAGE_DELIVERIES,
            retention_note: s.retention_note.clone().unwrap_or_default(),
            grafana_url: s.grafana_url.clone().unwrap_or_default(),
            traces: s
                .traces
                .iter()
                .map(|t| (t.trace_id.clone(), t.url.clone().unwrap_or_default()))
                .collect(),
            json_href: href(&json_path, &json_pairs),
            replay_csrf: replay.csrf,
            replay_msg_id: replay.msg_id,
            replay_what: replay.what,
            execute_time_ms: k.execute_time,
        }
    }
}

/// The trace page's replay form: for the key, or for the message when the delivery was
/// refused before a bizId could be read from it; no token when there is nothing to replay.
struct ReplayForm {
    csrf: String,
    msg_id: String,
    what: &'static str,
}

impl ReplayForm {
    fn of(s: &Story, web: &crate::http::Web) -> Self {
        let (m, k) = (&s.summary, &s.key);
        let latest =
            s.deliveries.iter().rev().find(|d| matches!(d.outcome.as_str(), "dead_lettered" | "invalid"));
        let what = match latest.map(|d| d.outcome.as_str()) {
            Some("invalid") => "invalid delivery",
            Some(_) => "dead letter",
            None if m.dead_letters > 0 => "dead letter",
            None => "invalid delivery",
        };
        let none = Self { csrf: String::new(), msg_id: String::new(), what };
        if web.replay.is_none() || s.claim.is_some() || m.dead_letters + m.invalid == 0 {
            return none;
        }
        let now = std::time::SystemTime::now();
        if !k.biz_id.is_empty() {
            let csrf = web.replay_token(&k.consumer_group, &k.biz_type, &k.biz_id, k.execute_time, now);
            return Self { csrf, ..none };
        }
        match latest {
            Some(row) => Self {
                csrf: web.replay_message_token(&k.consumer_group, &row.msg_id, now),
                msg_id: row.msg_id.clone(),
                what,
            },
            None => none,
        }
    }
}

impl StoryView {
    /// A count of the summary as the page shows it: past [`trace::COUNT_LIMIT`], "more than".
    fn count(&self, n: &usize) -> String {
        count_text(*n)
    }
}

/// Percent-encodes a path segment.
fn path_segment(text: &str) -> String {
    serde_urlencoded::to_string([("", text)]).map(|s| s[1..].replace('+', "%20")).unwrap_or_default()
}

#[derive(Template)]
#[template(path = "trace.html")]
struct TracePage<'a> {
    title: String,
    search: &'a str,
    by: &'a str,
    nothing: String,
    note: String,
    candidates: Vec<CandidateView>,
    more: bool,
    story: Option<StoryView>,
}

impl<'a> TracePage<'a> {
    /// The page with nothing found yet: the search form only.
    fn empty(title: String, search: &'a str, by: &'a str) -> Self {
        Self {
            title,
            search,
            by,
            nothing: String::new(),
            note: String::new(),
            candidates: Vec::new(),
            more: false,
            story: None,
        }
    }
}

pub(super) async fn trace_page(
    State(state): State<AppState>,
    RawQuery(raw): RawQuery,
) -> Result<Response, Problem> {
    let params = Params::parse(raw.as_deref())?;
    let by_text = params.get("by").unwrap_or("any");
    let Some(query) = trace_query(&params)? else {
        return Ok(render(&TracePage::empty("Trace".to_owned(), "", by_text)));
    };
    let answer = trace::trace(&state.store, &state.web.trace, &query).await?;
    let mut page = TracePage::empty(format!("Trace {}", query.text), &query.text, by_text);
    let status = match &answer {
        Answer::Nothing { searched } => {
            page.nothing = format!(
                "Nothing found for {:?} (searched as {searched}). The delivery log keeps {} days; \
                 a key older than that is found only by its bizId, in the dedup table or its archive.",
                query.text, state.web.archive.log_retention_days
            );
            StatusCode::NOT_FOUND
        }
        Answer::Choice { candidates, more, note, matched_by, .. } => {
            page.candidates = candidates.iter().map(CandidateView::new).collect();
            page.more = *more;
            page.note = note.clone().unwrap_or_else(|| {
                format!("This {} matches {} keys; choose one.", matched_by.label(), candidates.len())
            });
            StatusCode::OK
        }
        Answer::Story { matched_by, story } => {
            page.story = Some(StoryView::new(story, *matched_by, &query, &state.web));
            StatusCode::OK
        }
    };
    Ok((status, render(&page)).into_response())
}

// ---- the JSON API --------------------------------------------------------------------------

async fn trace_by_query(
    State(state): State<AppState>,
    RawQuery(raw): RawQuery,
) -> Result<Response, ApiError> {
    let params = Params::parse(raw.as_deref())?;
    let query = trace_query(&params)?.ok_or_else(|| {
        ApiError(Problem::bad_request("give biz_id, msg_id, uniq_key, trace_id or q (any of them)"))
    })?;
    answer(&state, &query).await
}

async fn trace_by_path(
    State(state): State<AppState>,
    Path(biz_id): Path<String>,
    RawQuery(raw): RawQuery,
) -> Result<Response, ApiError> {
    let params = Params::parse(raw.as_deref())?;
    let by = params.get("by").map(SearchBy::parse).transpose()?.unwrap_or(SearchBy::BizId);
    let query =
        TraceQuery::new(&biz_id, by, params.get("biz_type"), execute_time(&params)?, params.get("group"))?
            .paged(params.get("after"), params.get("before"))?;
    answer(&state, &query).await
}

async fn answer(state: &AppState, query: &TraceQuery) -> Result<Response, ApiError> {
    let answer = trace::trace(&state.store, &state.web.trace, query).await?;
    let status =
        if matches!(answer, Answer::Nothing { .. }) { StatusCode::NOT_FOUND } else { StatusCode::OK };
    Ok((status, Json(answer)).into_response())
}
