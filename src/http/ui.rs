//! The web UI: server-rendered askama pages that work without JavaScript. The overview (`/`),
//! a key's trace (`/trace`), the lists (`/dead-letters`, `/invalid`, `/collisions`) and the
//! archive job (`/archive`) and the reconciler's findings (`/anomalies`). Every page has the search box; every key links to its trace.
//!
//! Handlers here read through [`crate::inspect`] and turn its answers into view structs; askama
//! escapes everything they hold. Errors become [`Problem`] pages.

use askama::Template;
use axum::Router;
use axum::extract::{RawQuery, State};
use axum::http::{StatusCode, header};
use axum::response::{Html, IntoResponse, Response};
use axum::routing::get;

use super::AppState;
use super::params::Params;
use crate::archive::RunRecord;
use crate::handler::Fact;
use crate::inspect::lists::{self, ListKind, ListQuery};
use crate::inspect::overview::{self, Minute, Overview, Window};
use crate::inspect::trace::{self, Answer, Candidate, ClaimRecord, SearchBy, Story, TraceQuery};
use crate::inspect::{InspectError, LogRow, format_ms};
use crate::reconcile::AnomalyKind;

pub(super) fn router() -> Router<AppState> {
    Router::new()
        .route("/", get(overview_page))
        .route("/trace", get(trace_page))
        .route("/dead-letters", get(|s: State<AppState>, q: RawQuery| list_page(ListKind::DeadLetters, s, q)))
        .route("/invalid", get(|s: State<AppState>, q: RawQuery| list_page(ListKind::Invalid, s, q)))
        .route("/collisions", get(|s: State<AppState>, q: RawQuery| list_page(ListKind::Collisions, s, q)))
        .route("/archive", get(archive_page))
        .route("/anomalies", get(anomalies_page))
        .route("/replay", axum::routing::post(replay_action))
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
    Problem::not_found("There is no page here. Search for a bizId, msgId or UNIQ_KEY above, or start at the overview.")
}

async fn style() -> impl IntoResponse {
    (
        [(header::CONTENT_TYPE, "text/css; charset=utf-8"), (header::CACHE_CONTROL, "max-age=3600")],
        include_str!("../../templates/style.css"),
    )
}

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

/// One window's figures, formatted.
struct WindowView {
    label: &'static str,
    deliveries: i64,
    throughput: String,
    conflicts: String,
    duplicate_ratio: String,
    duplicates: i64,
    retries: i64,
    dead_letters: i64,
    invalid: i64,
    collisions: i64,
}

impl WindowView {
    fn new(w: &Window) -> Self {
        Self {
            label: w.label,
            deliveries: w.deliveries,
            throughput: format!("{:.1}/s", w.deliveries_per_second),
            conflicts: format!("{:.2}/s", w.conflicts_per_second),
            duplicate_ratio: format!("{:.1}%", w.duplicate_ratio * 100.0),
            duplicates: w.duplicates,
            retries: w.retries,
            dead_letters: w.dead_letters,
            invalid: w.invalid,
            collisions: w.collisions,
        }
    }
}

/// A bar of the per-minute chart: SVG coordinates, drawn on the server.
struct Bar {
    x: i64,
    /// Top and height of the whole bar (all deliveries), of its duplicate part and of its
    /// retry and dead-letter part.
    y: i64,
    h: i64,
    dup_y: i64,
    dup_h: i64,
    bad_y: i64,
    bad_h: i64,
    title: String,
}

const CHART_HEIGHT: i64 = 90;
const BAR_WIDTH: i64 = 10;

fn bars(minutes: &[Minute]) -> (Vec<Bar>, i64) {
    let peak = minutes.iter().map(|m| m.deliveries).max().unwrap_or(0).max(1);
    let scale = |n: i64| if n == 0 { 0 } else { (n * CHART_HEIGHT / peak).max(1) };
    let bars = minutes
        .iter()
        .enumerate()
        .map(|(i, m)| {
            let h = scale(m.deliveries);
            let dup_h = scale(m.duplicates).min(h);
            let bad_h = scale(m.retries + m.dead_letters).min(h - dup_h);
            let time = chrono::DateTime::from_timestamp_millis(m.start_ms)
                .map(|t| t.format("%H:%M").to_string())
                .unwrap_or_default();
            Bar {
                x: i as i64 * BAR_WIDTH,
                y: CHART_HEIGHT - h,
                h,
                dup_y: CHART_HEIGHT - dup_h,
                dup_h,
                bad_y: CHART_HEIGHT - dup_h - bad_h,
                bad_h,
                title: format!(
                    "{time} UTC: {} deliveries, {} duplicates, {} retries, {} dead letters",
                    m.deliveries, m.duplicates, m.retries, m.dead_letters
                ),
            }
        })
        .collect();
    (bars, peak)
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
            detail: [r.error.as_deref(), r.note.as_deref()].into_iter().flatten().collect::<Vec<_>>().join(" · "),
        }
    }
}

// ---- overview -------------------------------------------------------------------------------

#[derive(Template)]
#[template(path = "overview.html")]
struct OverviewPage<'a> {
    title: String,
    search: &'a str,
    now: String,
    windows: Vec<WindowView>,
    bars: Vec<Bar>,
    peak: i64,
    chart_width: i64,
    chart_height: i64,
    top_conflicts: Vec<(String, i64)>,
    dead_letters: Vec<RowView>,
    collisions: Vec<RowView>,
    invalid: Vec<RowView>,
    archive_enabled: bool,
    archive_schedule: String,
    archive_next: String,
    archive_runs: Vec<RunView>,
    /// The latest reconcile run: when, and (kind, count, link) per kind; empty before any run.
    reconcile_when: String,
    reconcile_counts: Vec<(String, i64, String)>,
}

async fn overview_page(State(state): State<AppState>) -> Result<Response, Problem> {
    let o = read_overview(&state).await?;
    let (bars, peak) = bars(&o.minutes);
    let rows = |rows: &[LogRow]| rows.iter().map(RowView::new).collect::<Vec<_>>();
    let page = OverviewPage {
        title: "Overview".to_owned(),
        search: "",
        now: format_ms(o.now_ms),
        windows: vec![WindowView::new(&o.last_5_minutes), WindowView::new(&o.last_hour)],
        chart_width: bars.len() as i64 * BAR_WIDTH,
        chart_height: CHART_HEIGHT,
        bars,
        peak,
        top_conflicts: o.top_conflicts.iter().map(|c| (c.biz_type.clone(), c.duplicates)).collect(),
        dead_letters: rows(&o.latest_dead_letters),
        collisions: rows(&o.latest_collisions),
        invalid: rows(&o.latest_invalid),
        archive_enabled: o.archive.enabled,
        archive_schedule: o.archive.schedule.clone(),
        archive_next: o.archive.next_run_ms.map(format_ms).unwrap_or_else(|| "not scheduled".to_owned()),
        archive_runs: o.archive.runs.iter().take(4).map(RunView::new).collect(),
        reconcile_when: o
            .reconcile
            .as_ref()
            .map(|r| format_ms(r.run.finished_at_ms.unwrap_or(r.run.started_at_ms)))
            .unwrap_or_default(),
        reconcile_counts: o
            .reconcile
            .as_ref()
            .map(|r| {
                r.counts
                    .iter()
                    .map(|(k, n)| (k.as_str().replace('_', " "), *n, href("/anomalies", &[("kind", k.as_str().to_owned())])))
                    .collect()
            })
            .unwrap_or_default(),
    };
    Ok(render(&page))
}

pub(super) async fn read_overview(state: &AppState) -> Result<Overview, InspectError> {
    overview::overview(&state.store, &state.web.trace.limits, &state.web.archive, crate::gate::now_ms()).await
}

// ---- trace ----------------------------------------------------------------------------------

/// Reads a trace search from the query string: `q` (or `biz_id`, `msg_id`, `uniq_key`), `by`,
/// `biz_type`, `execute_time`, `group`.
pub(super) fn trace_query(p: &Params) -> Result<Option<TraceQuery>, InspectError> {
    let (text, implied) = if let Some(t) = p.get("biz_id") {
        (t, SearchBy::BizId)
    } else if let Some(t) = p.get("msg_id") {
        (t, SearchBy::MsgId)
    } else if let Some(t) = p.get("uniq_key") {
        (t, SearchBy::UniqKey)
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
    TraceQuery::new(text, by, p.get("biz_type"), p.get("execute_time"), p.get("group")).map(Some)
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
    deliveries: i64,
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
            deliveries: c.deliveries,
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
    deliveries: usize,
    duplicates: Vec<(String, usize)>,
    collisions: usize,
    retries: usize,
    dead_letters: usize,
    invalid: usize,
    claim: Option<ClaimView>,
    earlier_claims: Vec<ClaimView>,
    business: Vec<Fact>,
    timeline: Vec<RowView>,
    truncated: bool,
    max_rows: usize,
    retention_note: String,
    grafana_url: String,
    json_href: String,
    /// The replay form's CSRF token, when the key can be replayed here: dead-lettered, not
    /// claimed, and this process has a broker.
    replay_csrf: String,
    execute_time_ms: i64,
}

impl StoryView {
    fn new(s: &Story, matched_by: SearchBy, web: &super::Web) -> Self {
        let m = &s.summary;
        let k = &s.key;
        let mut json_pairs = vec![("biz_type", k.biz_type.clone()), ("group", k.consumer_group.clone())];
        if k.execute_time != 0 {
            json_pairs.push(("execute_time", k.execute_time.to_string()));
        }
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
            duplicates: m.duplicates.iter().map(|(c, n)| (c.replace('_', " "), *n)).collect(),
            collisions: m.collisions,
            retries: m.retries,
            dead_letters: m.dead_letters,
            invalid: m.invalid,
            claim: s.claim.as_ref().map(ClaimView::new),
            earlier_claims: s.earlier_claims.iter().map(ClaimView::new).collect(),
            business: s.business.clone(),
            timeline: s.deliveries.iter().map(RowView::new).collect(),
            truncated: s.truncated,
            max_rows: trace::MAX_DELIVERIES,
            retention_note: s.retention_note.clone().unwrap_or_default(),
            grafana_url: s.grafana_url.clone().unwrap_or_default(),
            json_href: href(&format!("/api/trace/{}", path_segment(&k.biz_id)), &json_pairs),
            replay_csrf: if web.replay.is_some() && s.claim.is_none() && m.dead_letters > 0 {
                web.csrf_token(&k.consumer_group, &k.biz_type, &k.biz_id, k.execute_time)
            } else {
                String::new()
            },
            execute_time_ms: k.execute_time,
        }
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

async fn trace_page(State(state): State<AppState>, RawQuery(raw): RawQuery) -> Result<Response, Problem> {
    let params = Params::parse(raw.as_deref())?;
    let by_text = params.get("by").unwrap_or("any");
    let Some(query) = trace_query(&params)? else {
        let page = TracePage {
            title: "Trace".to_owned(),
            search: "",
            by: by_text,
            nothing: String::new(),
            note: String::new(),
            candidates: Vec::new(),
            more: false,
            story: None,
        };
        return Ok(render(&page));
    };
    let answer = trace::trace(&state.store, &state.web.trace, &query).await?;
    let mut page = TracePage {
        title: format!("Trace {}", query.text),
        search: &query.text,
        by: by_text,
        nothing: String::new(),
        note: String::new(),
        candidates: Vec::new(),
        more: false,
        story: None,
    };
    let status = match &answer {
        Answer::Nothing { searched } => {
            page.nothing = format!(
                "Nothing found for {:?} (searched as {searched}). The delivery log keeps {} days; \
                 a key older than that is found only by its bizId, in the dedup table or its archive.",
                query.text, state.web.archive.log_retention_days
            );
            StatusCode::NOT_FOUND
        }
        Answer::Choice { candidates, more, note, matched_by } => {
            page.candidates = candidates.iter().map(CandidateView::new).collect();
            page.more = *more;
            page.note = note.clone().unwrap_or_else(|| {
                format!("This {} matches {} keys; choose one.", matched_by.label(), candidates.len())
            });
            StatusCode::OK
        }
        Answer::Story { matched_by, story } => {
            page.story = Some(StoryView::new(story, *matched_by, &state.web));
            StatusCode::OK
        }
    };
    Ok((status, render(&page)).into_response())
}

// ---- lists ----------------------------------------------------------------------------------

/// Reads a list request from the query string: `biz_type`, `since`, `until`, `before`, `limit`.
pub(super) fn list_query(kind: ListKind, p: &Params) -> Result<ListQuery, InspectError> {
    ListQuery::new(kind, p.get("biz_type"), p.get("since"), p.get("until"), p.get("before"), p.get("limit"))
}

#[derive(Template)]
#[template(path = "list.html")]
struct ListPage<'a> {
    title: String,
    search: &'a str,
    slug: &'static str,
    explanation: &'static str,
    biz_type: String,
    since: String,
    until: String,
    rows: Vec<RowView>,
    older: String,
    newest: String,
    json_href: String,
}

async fn list_page(kind: ListKind, State(state): State<AppState>, RawQuery(raw): RawQuery) -> Result<Response, Problem> {
    let params = Params::parse(raw.as_deref())?;
    let query = list_query(kind, &params)?;
    let page = lists::list(&state.store, &state.web.trace.limits, &query).await?;
    let mut keep: Vec<(&str, String)> = Vec::new();
    for name in ["biz_type", "since", "until", "limit"] {
        if let Some(v) = params.get(name).filter(|v| !v.trim().is_empty()) {
            keep.push((name, v.to_owned()));
        }
    }
    let path = format!("/{}", kind.slug());
    let older = page
        .next
        .as_ref()
        .map(|cursor| {
            let mut pairs = keep.clone();
            pairs.push(("before", cursor.clone()));
            href(&path, &pairs)
        })
        .unwrap_or_default();
    let mut api_pairs = keep.clone();
    if let Some(cursor) = query.before {
        api_pairs.push(("before", cursor.to_string()));
    }
    let view = ListPage {
        title: kind.title().to_owned(),
        search: "",
        slug: kind.slug(),
        explanation: kind.explanation(),
        biz_type: query.biz_type.clone().unwrap_or_default(),
        since: params.get("since").unwrap_or("").to_owned(),
        until: params.get("until").unwrap_or("").to_owned(),
        rows: page.rows.iter().map(RowView::new).collect(),
        older,
        newest: if query.before.is_some() { href(&path, &keep) } else { String::new() },
        json_href: href(&format!("/api/{}", kind.slug()), &api_pairs),
    };
    Ok(render(&view))
}

// ---- archive --------------------------------------------------------------------------------

#[derive(Template)]
#[template(path = "archive.html")]
struct ArchivePage<'a> {
    title: String,
    search: &'a str,
    enabled: bool,
    schedule: String,
    next: String,
    dedup_days: u32,
    log_days: u32,
    runs: Vec<RunView>,
}

async fn archive_page(State(state): State<AppState>) -> Result<Response, Problem> {
    let runs = state.web.trace.limits.run(crate::archive::runs::recent(&state.store, 50)).await?;
    let a = &state.web.archive;
    let next = a.next_run_after(crate::gate::now_ms());
    let page = ArchivePage {
        title: "Archive".to_owned(),
        search: "",
        enabled: a.enabled,
        schedule: a.schedule.clone(),
        next: next.map(format_ms).unwrap_or_else(|| "not scheduled".to_owned()),
        dedup_days: a.dedup_retention_days,
        log_days: a.log_retention_days,
        runs: runs.iter().map(RunView::new).collect(),
    };
    Ok(render(&page))
}

// ---- anomalies ------------------------------------------------------------------------------

/// Reads `/anomalies` parameters: `kind` (empty or `.*` for all) and `run` (default: the latest).
pub(super) fn anomalies_query(p: &Params) -> Result<(Option<AnomalyKind>, Option<i64>), InspectError> {
    let kind = match p.get("kind").map(str::trim) {
        None | Some("") | Some(".*") | Some("$__all") => None,
        Some(k) => Some(AnomalyKind::parse(k).ok_or_else(|| {
            InspectError::BadRequest(format!(
                "kind={:?} is not one of {}",
                k.chars().take(30).collect::<String>(),
                AnomalyKind::ALL.iter().map(|k| k.as_str()).collect::<Vec<_>>().join(", ")
            ))
        })?),
    };
    let run = match p.get("run").map(str::trim).filter(|r| !r.is_empty()) {
        None => None,
        Some(r) => Some(r.parse::<i64>().map_err(|_| InspectError::BadRequest("run must be a run number".to_owned()))?),
    };
    Ok((kind, run))
}

/// The most anomalies a page lists.
pub const MAX_ANOMALIES_SHOWN: i64 = 1_000;

/// A run and its anomalies, as the page and the API show them.
#[derive(Debug, serde::Serialize)]
pub struct AnomalyReport {
    pub run: Option<crate::reconcile::runs::RunRecord>,
    pub counts: std::collections::BTreeMap<AnomalyKind, i64>,
    pub anomalies: Vec<crate::reconcile::Anomaly>,
    pub recent_runs: Vec<crate::reconcile::runs::RunRecord>,
}

pub(super) async fn read_anomalies(
    state: &AppState,
    kind: Option<AnomalyKind>,
    run: Option<i64>,
) -> Result<AnomalyReport, InspectError> {
    use crate::reconcile::runs;
    let store = &state.store;
    state
        .web
        .trace
        .limits
        .run(async {
            let recent_runs = runs::recent(store, 20).await?;
            let run = match run {
                Some(id) => runs::get(store, id).await?,
                None => recent_runs.iter().find(|r| r.status == "success").cloned(),
            };
            let (counts, anomalies) = match &run {
                Some(r) => (runs::counts(store, r.id).await?, runs::anomalies(store, r.id, kind, MAX_ANOMALIES_SHOWN).await?),
                None => (Default::default(), Vec::new()),
            };
            Ok(AnomalyReport { run, counts, anomalies, recent_runs })
        })
        .await
}

struct AnomalyView {
    kind: String,
    alarm: bool,
    biz_type: String,
    biz_id: String,
    execute_time: String,
    group: String,
    first: String,
    last: String,
    detail: String,
    advice: &'static str,
    trace: String,
}

struct ReconcileRunView {
    id: i64,
    href: String,
    status: String,
    class: &'static str,
    started_by: String,
    group: String,
    window: String,
    finished: String,
    anomalies: i64,
    error: String,
}

#[derive(Template)]
#[template(path = "anomalies.html")]
struct AnomaliesPage<'a> {
    title: String,
    search: &'a str,
    run: Option<ReconcileRunView>,
    kind: String,
    counts: Vec<(String, i64, String, bool)>,
    anomalies: Vec<AnomalyView>,
    runs: Vec<ReconcileRunView>,
    json_href: String,
}

fn run_view(r: &crate::reconcile::runs::RunRecord) -> ReconcileRunView {
    ReconcileRunView {
        id: r.id,
        href: href("/anomalies", &[("run", r.id.to_string())]),
        status: r.status.clone(),
        class: match r.status.as_str() {
            "success" if r.anomalies == 0 => "ok",
            "success" => "retry",
            "failed" => "dead",
            _ => "dup",
        },
        started_by: r.started_by.clone(),
        group: r.consumer_group.clone(),
        window: format!("{} → {}", format_ms(r.since_ms), format_ms(r.until_ms)),
        finished: r.finished_at_ms.map(format_ms).unwrap_or_else(|| "running".to_owned()),
        anomalies: r.anomalies,
        error: r.error.clone().unwrap_or_default(),
    }
}

async fn anomalies_page(State(state): State<AppState>, RawQuery(raw): RawQuery) -> Result<Response, Problem> {
    let params = Params::parse(raw.as_deref())?;
    let (kind, run) = anomalies_query(&params)?;
    let report = read_anomalies(&state, kind, run).await?;
    if run.is_some() && report.run.is_none() {
        return Err(Problem::not_found("there is no reconcile run with that number"));
    }
    let run_pair = report.run.as_ref().map(|r| ("run", r.id.to_string()));
    let page = AnomaliesPage {
        title: "Anomalies".to_owned(),
        search: "",
        run: report.run.as_ref().map(run_view),
        kind: kind.map(|k| k.as_str().to_owned()).unwrap_or_default(),
        counts: report
            .counts
            .iter()
            .map(|(k, n)| {
                let mut pairs = vec![("kind", k.as_str().to_owned())];
                pairs.extend(run_pair.clone());
                (k.as_str().replace('_', " "), *n, href("/anomalies", &pairs), Some(*k) == kind)
            })
            .collect(),
        anomalies: report
            .anomalies
            .iter()
            .map(|a| AnomalyView {
                kind: a.kind.as_str().replace('_', " "),
                alarm: matches!(a.kind, AnomalyKind::Lost | AnomalyKind::DoubleApplied),
                biz_type: a.biz_type.clone(),
                biz_id: a.biz_id.clone(),
                execute_time: if a.execute_time == 0 { String::new() } else { format_ms(a.execute_time) },
                group: a.consumer_group.clone(),
                first: a.first_seen_ms.map(format_ms).unwrap_or_default(),
                last: a.last_seen_ms.map(format_ms).unwrap_or_default(),
                detail: a.detail.clone(),
                advice: a.kind.advice(),
                trace: trace_href(&a.biz_id, &a.biz_type, a.execute_time, &a.consumer_group),
            })
            .collect(),
        runs: report.recent_runs.iter().map(run_view).collect(),
        json_href: href(
            "/api/anomalies",
            &[kind.map(|k| ("kind", k.as_str().to_owned())), run_pair.clone()].into_iter().flatten().collect::<Vec<_>>(),
        ),
    };
    Ok(render(&page))
}

// ---- replay ---------------------------------------------------------------------------------

struct ReplayLineView {
    key: String,
    dead_letter: String,
    result: String,
    sent: bool,
}

#[derive(Template)]
#[template(path = "replay.html")]
struct ReplayPage<'a> {
    title: String,
    search: &'a str,
    lines: Vec<ReplayLineView>,
    trace: String,
}

/// `POST /replay`: re-publishes one key's latest dead letter. It needs the form's CSRF token
/// for that very key, a same-origin request (when the browser says where it came from) and,
/// where credentials are configured, those.
async fn replay_action(
    State(state): State<AppState>,
    headers: axum::http::HeaderMap,
    body: String,
) -> Result<Response, Problem> {
    let Some(replayer) = state.web.replay.clone() else {
        return Err(Problem { status: StatusCode::FORBIDDEN, message: "replay is not available here: this process has no broker".to_owned() });
    };
    if let (Some(origin), Some(host)) = (headers.get(header::ORIGIN), headers.get(header::HOST))
        && origin.as_bytes() != format!("http://{}", host.to_str().unwrap_or("")).as_bytes()
        && origin.as_bytes() != format!("https://{}", host.to_str().unwrap_or("")).as_bytes()
    {
        return Err(Problem { status: StatusCode::FORBIDDEN, message: "a replay must come from this site's own trace page".to_owned() });
    }
    let form = Params::parse(Some(&body))?;
    let field = |name: &str, max: usize| -> Result<String, Problem> {
        let v = form.get(name).ok_or_else(|| Problem::bad_request(format!("the form has no {name}")))?;
        Ok(crate::inspect::checked_text(name, v, max)?)
    };
    let group = field("group", crate::route::MAX_ID_CHARS)?;
    let biz_type = field("biz_type", crate::route::MAX_BIZ_TYPE_CHARS)?;
    let biz_id = field("biz_id", crate::route::MAX_BIZ_ID_CHARS)?;
    let execute_time: i64 =
        field("execute_time", 20)?.parse().map_err(|_| Problem::bad_request("execute_time must be epoch milliseconds"))?;
    let csrf = field("csrf", 64)?;
    let expected = state.web.csrf_token(&group, &biz_type, &biz_id, execute_time);
    if !super::auth::same(csrf.as_bytes(), expected.as_bytes()) {
        return Err(Problem { status: StatusCode::FORBIDDEN, message: "the form's token is not valid for this key; open the trace page again".to_owned() });
    }
    let lines = replayer
        .replay_key(&state.store, &group, &biz_type, &biz_id, execute_time)
        .await
        .map_err(|e| {
            tracing::error!(error = %e, "replay from the web UI failed");
            Problem { status: StatusCode::SERVICE_UNAVAILABLE, message: "the replay could not be sent; see the service log".to_owned() }
        })?;
    let page = ReplayPage {
        title: format!("Replay {biz_id}"),
        search: "",
        lines: lines
            .iter()
            .map(|l| ReplayLineView {
                key: format!("{} {}", l.biz_type, l.biz_id),
                dead_letter: format!("{} of {}", l.dead_letter_msg_id, format_ms(l.dead_lettered_at_ms)),
                result: l.action.describe(&l.topic, false),
                sent: matches!(l.action, crate::replay::Action::Sent { .. }),
            })
            .collect(),
        trace: trace_href(&biz_id, &biz_type, execute_time, &group),
    };
    Ok(render(&page))
}
