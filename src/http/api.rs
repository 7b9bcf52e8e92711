//! The JSON API behind every page, for scripts and runbooks. Each endpoint takes the same
//! parameters as its page and answers the same data as JSON; errors are
//! `{"error": "...", "status": N}` with the page's status code. docs/http-api.md
//! documents it.

use axum::extract::{Path, RawQuery, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::{Json, Router};
use serde::Serialize;
use serde_json::json;

use super::AppState;
use super::params::Params;
use super::ui::{
    Problem, anomalies_query, list_query, read_anomalies, read_archive, read_overview, trace_query,
};
use crate::inspect::InspectError;
use crate::inspect::lists::{self, ListKind};
use crate::inspect::trace::{self, Answer, SearchBy, TraceQuery};

pub(super) fn router() -> Router<AppState> {
    Router::new()
        .route("/api/overview", get(overview))
        .route("/api/trace", get(trace_by_query))
        .route("/api/trace/{biz_id}", get(trace_by_path))
        .route("/api/dead-letters", get(|s: State<AppState>, q: RawQuery| list(ListKind::DeadLetters, s, q)))
        .route("/api/invalid", get(|s: State<AppState>, q: RawQuery| list(ListKind::Invalid, s, q)))
        .route("/api/collisions", get(|s: State<AppState>, q: RawQuery| list(ListKind::Collisions, s, q)))
        .route("/api/archive", get(archive))
        .route("/api/anomalies", get(anomalies))
}

/// The answer for an `/api/` path that does not exist.
pub(super) fn not_found() -> ApiError {
    ApiError(Problem::not_found("no such API endpoint; docs/http-api.md lists them"))
}

/// A [`Problem`] answered as JSON.
pub struct ApiError(Problem);

impl From<Problem> for ApiError {
    fn from(problem: Problem) -> Self {
        Self(problem)
    }
}

impl From<InspectError> for ApiError {
    fn from(e: InspectError) -> Self {
        Self(Problem::from(e))
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let status = self.0.status;
        (status, Json(json!({ "error": self.0.message, "status": status.as_u16() }))).into_response()
    }
}

fn ok<T: Serialize>(body: &T) -> Response {
    Json(body).into_response()
}

async fn overview(State(state): State<AppState>) -> Result<Response, ApiError> {
    Ok(ok(&read_overview(&state).await?))
}

async fn trace_by_query(
    State(state): State<AppState>,
    RawQuery(raw): RawQuery,
) -> Result<Response, ApiError> {
    let params = Params::parse(raw.as_deref())?;
    let query = trace_query(&params)?.ok_or_else(|| {
        ApiError(Problem::bad_request("give biz_id, msg_id, uniq_key or q (any of the three)"))
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
    let query = TraceQuery::new(
        &biz_id,
        by,
        params.get("biz_type"),
        params.get("execute_time"),
        params.get("group"),
    )?;
    answer(&state, &query).await
}

async fn answer(state: &AppState, query: &TraceQuery) -> Result<Response, ApiError> {
    let answer = trace::trace(&state.store, &state.web.trace, query).await?;
    let status =
        if matches!(answer, Answer::Nothing { .. }) { StatusCode::NOT_FOUND } else { StatusCode::OK };
    Ok((status, Json(answer)).into_response())
}

async fn list(
    kind: ListKind,
    State(state): State<AppState>,
    RawQuery(raw): RawQuery,
) -> Result<Response, ApiError> {
    let params = Params::parse(raw.as_deref())?;
    let query = list_query(kind, &params)?;
    Ok(ok(&lists::list(&state.store, &state.web.trace.limits, &query).await?))
}

async fn archive(State(state): State<AppState>) -> Result<Response, ApiError> {
    Ok(ok(&read_archive(&state).await?))
}

async fn anomalies(State(state): State<AppState>, RawQuery(raw): RawQuery) -> Result<Response, ApiError> {
    let params = Params::parse(raw.as_deref())?;
    let (kind, run) = anomalies_query(&params)?;
    let report = read_anomalies(&state, kind, run).await?;
    if run.is_some() && report.run.is_none() {
        return Err(ApiError(Problem::not_found("there is no reconcile run with that number")));
    }
    Ok(ok(&report))
}
