//! The HTTP server: the web UI, the JSON API, `/metrics` and the health endpoints. It binds to
//! loopback unless configured otherwise.
//!
//! One module per resource, each with its page and its JSON twin: the overview (`/`,
//! [`overview`]), a key's trace (`/trace`, [`trace`]), the lists (`/dead-letters`, `/invalid`,
//! `/collisions`) and the archive job (`/archive`, [`lists`]), the reconciler's findings
//! (`/anomalies`, [`anomalies`]) and the replay action (`POST /replay`, [`replay`]). Pages are
//! server-rendered askama templates that work without JavaScript; askama escapes everything
//! they hold. Each API endpoint (`/api/...`) takes the same parameters as its page and answers
//! the same data as JSON; docs/http-api.md documents them. Both answer errors through one
//! [`problem::Problem`].
//!
//! Every response carries a strict Content-Security-Policy (no scripts at all) and `nosniff`.
//! Everything but `/healthz` and `/readyz` answers only to the host names it is served under
//! ([`host`], against DNS rebinding) and, with credentials configured ([`auth`]), needs them; a
//! state-changing request must come from this site's own page ([`csrf`]).
//! This module owns routing and the server's lifecycle; each resource's handlers live in a
//! module of their own. It must not change state on a GET.

mod anomalies;
pub(crate) mod auth;
pub(crate) mod csrf;
mod health;
pub(crate) mod host;
mod lists;
mod metrics;
mod overview;
pub(crate) mod params;
pub(crate) mod problem;
mod replay;
pub(crate) mod settings;
mod state;
mod trace;
mod view;

use std::net::SocketAddr;

use anyhow::Context;
use axum::Router;
use axum::extract::Request;
use axum::http::{HeaderValue, header};
use axum::middleware::{self, Next};
use axum::response::Response;
use axum::routing::get;
use tokio::net::TcpListener;

pub(crate) use state::AppState;
pub use state::Web;

use problem::{ApiError, Problem};

/// Pages may load only their own stylesheet: no scripts, no frames, no foreign forms.
const CONTENT_SECURITY_POLICY: &str = "default-src 'none'; style-src 'self'; img-src 'self' data:; \
     form-action 'self'; frame-ancestors 'none'; base-uri 'none'";

async fn security_headers(request: Request, next: Next) -> Response {
    let mut response = next.run(request).await;
    let headers = response.headers_mut();
    headers.insert(header::CONTENT_SECURITY_POLICY, HeaderValue::from_static(CONTENT_SECURITY_POLICY));
    headers.insert(header::X_CONTENT_TYPE_OPTIONS, HeaderValue::from_static("nosniff"));
    headers.insert(header::REFERRER_POLICY, HeaderValue::from_static("no-referrer"));
    headers.insert(header::X_FRAME_OPTIONS, HeaderValue::from_static("DENY"));
    response
}

/// Serves a page or API call only while fewer than `http.max_concurrent_requests` are in
/// flight; one more is answered 503 at once, with `Retry-After`, and counted. A flood of
/// requests then costs the database at most that many queries, on the UI's own pool.
async fn limit_in_flight(
    axum::extract::State(state): axum::extract::State<AppState>,
    request: Request,
    next: Next,
) -> Response {
    use axum::response::IntoResponse;
    let Ok(_permit) = state.web.in_flight.clone().try_acquire_owned() else {
        state.metrics.observe_http_shed();
        let problem = Problem {
            status: axum::http::StatusCode::SERVICE_UNAVAILABLE,
            message: "too many pages and API calls in flight; try again in a moment".to_owned(),
        };
        let mut response = if request.uri().path().starts_with("/api/") {
            ApiError::from(problem).into_response()
        } else {
            problem.into_response()
        };
        response.headers_mut().insert(header::RETRY_AFTER, HeaderValue::from_static("1"));
        return response;
    };
    next.run(request).await
}

/// A path no route has: a JSON 404 under `/api/`, the 404 page elsewhere.
async fn not_found(uri: axum::http::Uri) -> Response {
    use axum::response::IntoResponse;
    if uri.path().starts_with("/api/") {
        problem::api_not_found().into_response()
    } else {
        problem::page_not_found().into_response()
    }
}

/// The whole application's routes. Outside in: the host name, then the credentials, then the
/// same-origin rule for state-changing requests; health needs none of them.
pub(crate) fn router(state: AppState) -> Router {
    let pages = Router::new()
        .merge(overview::router())
        .merge(trace::router())
        .merge(lists::router())
        .merge(anomalies::router())
        .merge(replay::router())
        .route("/assets/style.css", get(view::style))
        .route_layer(middleware::from_fn_with_state(state.clone(), limit_in_flight));
    let guarded = Router::new()
        .merge(metrics::router())
        .merge(pages)
        .fallback(not_found)
        .route_layer(middleware::from_fn(csrf::same_origin_writes))
        .route_layer(middleware::from_fn_with_state(state.web.auth.clone(), auth::require))
        .layer(middleware::from_fn_with_state(state.web.hosts.clone(), host::require_allowed));
    Router::new()
        .merge(health::router())
        .merge(guarded)
        .layer(middleware::from_fn(security_headers))
        .with_state(state)
}

/// A bound listener, not yet serving: bind first so that the address (port 0 picks a free
/// one) is known to what is built before serving.
pub(crate) struct Server {
    listener: TcpListener,
}

impl Server {
    pub(crate) async fn bind(addr: &str) -> anyhow::Result<Self> {
        let listener =
            TcpListener::bind(addr).await.with_context(|| format!("binding the HTTP server to {addr}"))?;
        Ok(Self { listener })
    }

    pub(crate) fn local_addr(&self) -> std::io::Result<SocketAddr> {
        self.listener.local_addr()
    }

    /// Serves `state`'s routes until `shutdown` resolves, then finishes the requests in flight.
    pub(crate) async fn run(
        self,
        state: AppState,
        shutdown: impl std::future::Future<Output = ()> + Send + 'static,
    ) -> anyhow::Result<()> {
        axum::serve(self.listener, router(state))
            .with_graceful_shutdown(shutdown)
            .await
            .context("serving HTTP")
    }
}
