//! `/metrics`: the Prometheus text exposition. Table sizes are read from the database at scrape
//! time, through the same cache the metrics module keeps.

use axum::Router;
use axum::extract::State;
use axum::http::header;
use axum::response::IntoResponse;
use axum::routing::get;

use super::state::AppState;

pub(super) fn router() -> Router<AppState> {
    Router::new().route("/metrics", get(metrics))
}

async fn metrics(State(state): State<AppState>) -> impl IntoResponse {
    let body = state.metrics.render(Some(&state.store)).await;
    ([(header::CONTENT_TYPE, "text/plain; version=0.0.4; charset=utf-8")], body)
}
