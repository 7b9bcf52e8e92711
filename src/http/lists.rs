//! `/dead-letters`, `/invalid`, `/collisions` and `/archive`.

use askama::Template;
use axum::extract::{RawQuery, State};
use axum::response::Response;

use super::params::Params;
use super::problem::ApiError;
use super::problem::Problem;
use super::state::AppState;
use super::view::json;
use super::view::{RowView, RunView, href, render};
use crate::clock::format_ms;
use crate::inspect::InspectError;
use crate::inspect::lists::{self, ListKind, ListQuery};
use crate::inspect::overview::{ArchiveStatus, archive_status};
use axum::Router;
use axum::routing::get;

pub(super) fn router() -> Router<AppState> {
    Router::new()
        .route("/dead-letters", get(|s: State<AppState>, q: RawQuery| list_page(ListKind::DeadLetters, s, q)))
        .route("/invalid", get(|s: State<AppState>, q: RawQuery| list_page(ListKind::Invalid, s, q)))
        .route("/collisions", get(|s: State<AppState>, q: RawQuery| list_page(ListKind::Collisions, s, q)))
        .route("/archive", get(archive_page))
        .route("/api/dead-letters", get(|s: State<AppState>, q: RawQuery| list(ListKind::DeadLetters, s, q)))
        .route("/api/invalid", get(|s: State<AppState>, q: RawQuery| list(ListKind::Invalid, s, q)))
        .route("/api/collisions", get(|s: State<AppState>, q: RawQuery| list(ListKind::Collisions, s, q)))
        .route("/api/archive", get(archive))
}

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

pub(super) async fn list_page(
    kind: ListKind,
    State(state): State<AppState>,
    RawQuery(raw): RawQuery,
) -> Result<Response, Problem> {
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
    let links = state.web.trace.trace_url_template.as_deref();
    let view = ListPage {
        title: kind.title().to_owned(),
        search: "",
        slug: kind.slug(),
        explanation: kind.explanation(),
        biz_type: query.biz_type.clone().unwrap_or_default(),
        since: params.get("since").unwrap_or("").to_owned(),
        until: params.get("until").unwrap_or("").to_owned(),
        rows: page.rows.iter().map(|r| RowView::new(r, links)).collect(),
        older,
        newest: if query.before.is_some() { href(&path, &keep) } else { String::new() },
        json_href: href(&format!("/api/{}", kind.slug()), &api_pairs),
    };
    Ok(render(&view))
}

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

/// The archive job with its last 50 passes, for the page and its JSON.
pub(super) async fn read_archive(state: &AppState) -> Result<ArchiveStatus, InspectError> {
    let now = crate::clock::now_ms();
    state.web.trace.limits.run(archive_status(&state.store, &state.web.archive, now, 50)).await
}

pub(super) async fn archive_page(State(state): State<AppState>) -> Result<Response, Problem> {
    let a = read_archive(&state).await?;
    let page = ArchivePage {
        title: "Archive".to_owned(),
        search: "",
        enabled: a.enabled,
        schedule: a.schedule.clone(),
        next: a.next_run_ms.map(format_ms).unwrap_or_else(|| "not scheduled".to_owned()),
        dedup_days: a.dedup_retention_days,
        log_days: a.log_retention_days,
        runs: a.runs.iter().map(RunView::new).collect(),
    };
    Ok(render(&page))
}

// ---- the JSON API --------------------------------------------------------------------------

async fn list(
    kind: ListKind,
    State(state): State<AppState>,
    RawQuery(raw): RawQuery,
) -> Result<Response, ApiError> {
    let params = Params::parse(raw.as_deref())?;
    let query = list_query(kind, &params)?;
    Ok(json(&lists::list(&state.store, &state.web.trace.limits, &query).await?))
}

async fn archive(State(state): State<AppState>) -> Result<Response, ApiError> {
    Ok(json(&read_archive(&state).await?))
}
