//! `/anomalies`: the reconciler's findings.

use askama::Template;
use axum::extract::{RawQuery, State};
use axum::response::Response;

use super::params::Params;
use super::problem::ApiError;
use super::problem::Problem;
use super::state::AppState;
use super::view::json;
use super::view::{href, render, trace_href};
use crate::clock::format_ms;
use crate::inspect::InspectError;
use crate::reconcile::AnomalyKind;
use axum::Router;
use axum::routing::get;

pub(super) fn router() -> Router<AppState> {
    Router::new().route("/anomalies", get(anomalies_page)).route("/api/anomalies", get(anomalies))
}

/// Reads `/anomalies` parameters: `kind` (empty or `.*` for all) and `run` (default: the latest).
pub(super) fn anomalies_query(p: &Params) -> Result<(Option<AnomalyKind>, Option<i64>), InspectError> {
    let kind = match p.get("kind").map(str::trim) {
        k if crate::inspect::means_all(k) => None,
        None => None,
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
        Some(r) => Some(
            r.parse::<i64>().map_err(|_| InspectError::BadRequest("run must be a run number".to_owned()))?,
        ),
    };
    Ok((kind, run))
}

/// The most anomalies a page lists.
pub(super) const MAX_ANOMALIES_SHOWN: i64 = 1_000;

/// A run and its anomalies, as the page and the API show them.
#[derive(Debug, serde::Serialize)]
pub(super) struct AnomalyReport {
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
                Some(r) => (
                    runs::counts(store, r.id).await?,
                    runs::anomalies(store, r.id, kind, MAX_ANOMALIES_SHOWN).await?,
                ),
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

pub(super) async fn anomalies_page(
    State(state): State<AppState>,
    RawQuery(raw): RawQuery,
) -> Result<Response, Problem> {
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
            &[kind.map(|k| ("kind", k.as_str().to_owned())), run_pair.clone()]
                .into_iter()
                .flatten()
                .collect::<Vec<_>>(),
        ),
    };
    Ok(render(&page))
}

// ---- the JSON API --------------------------------------------------------------------------

async fn anomalies(State(state): State<AppState>, RawQuery(raw): RawQuery) -> Result<Response, ApiError> {
    let params = Params::parse(raw.as_deref())?;
    let (kind, run) = anomalies_query(&params)?;
    let report = read_anomalies(&state, kind, run).await?;
    if run.is_some() && report.run.is_none() {
        return Err(ApiError(Problem::not_found("there is no reconcile run with that number")));
    }
    Ok(json(&report))
}
