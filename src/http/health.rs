//! `/healthz` (the process answers) and `/readyz` (the database answers the consumer's pool
//! within a second, the consumer has started, and it is not stalled: answering nothing while
//! messages wait; pages busy on their own pool do not make the service unready). Neither needs
//! authentication.

use std::sync::atomic::Ordering;
use std::time::Duration;

use axum::extract::State;
use axum::http::StatusCode;
use axum::routing::get;
use axum::{Json, Router};
use serde_json::json;

use super::state::AppState;
use crate::store::Sql;

static PING: Sql = Sql::new("SELECT 1");

pub(super) fn router() -> Router<AppState> {
    Router::new().route("/healthz", get(healthz)).route("/readyz", get(readyz))
}

async fn healthz() -> &'static str {
    "ok"
}

async fn readyz(State(state): State<AppState>) -> (StatusCode, Json<serde_json::Value>) {
    let store = &state.consumer_store;
    let database = tokio::time::timeout(Duration::from_secs(1), store.query(&PING).execute(store.pool()))
        .await
        .map(|r| r.is_ok())
        .unwrap_or(false);
    let consumer = state.consumer_ready.load(Ordering::Acquire);
    let progressing = state.consumer_progressing.load(Ordering::Acquire);
    let status =
        if database && consumer && progressing { StatusCode::OK } else { StatusCode::SERVICE_UNAVAILABLE };
    (status, Json(json!({ "database": database, "consumer": consumer, "progressing": progressing })))
}
