//! `/instances`: the consumer groups' instances, from the consumer record: each run, its queues
//! now, its history, and its duplicates by cause.

use askama::Template;
use axum::Router;
use axum::extract::State;
use axum::response::Response;
use axum::routing::get;

use super::problem::{ApiError, Problem};
use super::state::AppState;
use super::view::{json, render};
use crate::clock::{format_ms, now_ms};
use crate::inspect::InspectError;
use crate::inspect::instances::{self, Instances, RunState};

pub(super) fn router() -> Router<AppState> {
    Router::new().route("/instances", get(instances_page)).route("/api/instances", get(instances_json))
}

async fn read(state: &AppState) -> Result<Instances, InspectError> {
    let store = &state.store;
    state.web.trace.limits.run(instances::read(store, now_ms())).await
}

struct RunView {
    instance: String,
    group: String,
    broker: String,
    started: String,
    heartbeat: String,
    state: &'static str,
    class: &'static str,
    queues: String,
    duplicates: Vec<(String, i64)>,
}

struct EventView {
    at: String,
    instance: String,
    kind: String,
    queue: String,
    detail: String,
}

#[derive(Template)]
#[template(path = "instances.html")]
struct InstancesPage<'a> {
    title: String,
    search: &'a str,
    runs: Vec<RunView>,
    events: Vec<EventView>,
    max_events: i64,
}

async fn instances_page(State(state): State<AppState>) -> Result<Response, Problem> {
    let found = read(&state).await?;
    let runs = found
        .runs
        .iter()
        .map(|r| RunView {
            instance: r.instance_id.clone(),
            group: r.consumer_group.clone(),
            broker: r.broker.clone(),
            started: format_ms(r.started_at_ms),
            heartbeat: match r.stopped_at_ms {
                Some(stopped) => format!("stopped {}", format_ms(stopped)),
                None => {
                    format!("{:.1} s ago", (found.read_at_ms - r.heartbeat_at_ms).max(0) as f64 / 1_000.0)
                }
            },
            state: r.state.as_str(),
            class: match r.state {
                RunState::Running => "ok",
                RunState::Stopped => "dup",
                RunState::Crashed | RunState::Silent => "dead",
            },
            queues: r.queues.join(", "),
            duplicates: r.duplicates.iter().map(|(cause, n)| (cause.replace('_', " "), *n)).collect(),
        })
        .collect();
    let events = found
        .events
        .iter()
        .map(|e| EventView {
            at: format_ms(e.at_ms),
            instance: e.instance_id.clone(),
            kind: e.kind.replace('_', " "),
            queue: e.queue.clone(),
            detail: e.detail.clone(),
        })
        .collect();
    let page = InstancesPage {
        title: "Instances".to_owned(),
        search: "",
        runs,
        events,
        max_events: instances::MAX_EVENTS,
    };
    Ok(render(&page))
}

async fn instances_json(State(state): State<AppState>) -> Result<Response, ApiError> {
    Ok(json(&read(&state).await?))
}
