//! The HTTP server: the web UI ([`ui`]), the JSON API ([`api`]), `/metrics` and the health
//! endpoints. It binds to loopback unless configured otherwise.
//!
//! Every response carries a strict Content-Security-Policy (no scripts at all) and `nosniff`.
//! Everything but `/healthz` and `/readyz` answers only to the host names it is served under
//! ([`host`], against DNS rebinding) and, with credentials configured ([`auth`]), needs them; a
//! state-changing request must come from this site's own page ([`csrf`]).
//! This module owns routing and the server's lifecycle; each resource's handlers live in a
//! module of their own. It must not change state on a GET.

pub mod api;
pub mod auth;
pub mod csrf;
mod health;
pub mod host;
mod metrics;
pub mod params;
pub mod ui;

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::AtomicBool;

use anyhow::Context;
use axum::Router;
use axum::extract::Request;
use axum::http::{HeaderValue, header};
use axum::middleware::{self, Next};
use axum::response::Response;
use tokio::net::TcpListener;

use crate::archive::{ArchiveSettings, LogRetention};
use crate::config::Settings;
use crate::handler::Handlers;
use crate::inspect::Limits;
use crate::inspect::trace::TraceContext;
use crate::metrics::Metrics;
use crate::replay::Replayer;
use crate::store::Store;

/// What the handlers share.
#[derive(Clone)]
pub struct AppState {
    pub store: Store,
    /// Set once the consumer has started (or, in the demo, the traffic source).
    pub consumer_ready: Arc<AtomicBool>,
    pub metrics: Arc<Metrics>,
    pub web: Arc<Web>,
}

/// What the pages need besides the store: fixed at start.
#[derive(Debug, Clone)]
pub struct Web {
    pub trace: TraceContext,
    pub archive: ArchiveSettings,
    pub auth: auth::Auth,
    /// Replay from the trace page; `None` where this process has no broker (the demo).
    pub replay: Option<Arc<Replayer>>,
    /// One permit per page or API call in flight (`http.max_concurrent_requests`).
    in_flight: Arc<tokio::sync::Semaphore>,
    /// The host names served besides `localhost` and IP addresses.
    pub hosts: host::AllowedHosts,
    /// The tokens of the replay form, under a per-process secret.
    pub forms: csrf::FormTokens,
}

/// The purpose the replay form's tokens are issued for.
const REPLAY_FORM: &str = "replay";

impl Web {
    /// The pages' settings, and the handlers whose business state the trace page shows.
    pub fn new(settings: &Settings, handlers: &Handlers) -> Self {
        let http = &settings.http;
        Self {
            trace: TraceContext {
                limits: Limits { timeout: std::time::Duration::from_millis(http.query_timeout_ms) },
                retention: Some(LogRetention::days(settings.archive.log_retention_days)),
                grafana_url: (!http.grafana_url.is_empty()).then(|| http.grafana_url.clone()),
                describers: handlers.by_biz_type(&settings.routes()),
            },
            archive: settings.archive.clone(),
            auth: auth::Auth::from_settings(http),
            replay: None,
            in_flight: Arc::new(tokio::sync::Semaphore::new(http.max_concurrent_requests as usize)),
            hosts: host::AllowedHosts::from_settings(http),
            forms: csrf::FormTokens::new(std::time::Duration::from_secs(http.csrf_token_ttl_seconds)),
        }
    }

    /// Turns on replay from the trace page, through the configured broker.
    pub fn with_replay(mut self, settings: &Settings) -> Self {
        self.replay = Some(Arc::new(Replayer::new(
            &settings.broker.name_server,
            &settings.broker.producer_group,
            settings.routes(),
        )));
        self
    }

    /// The replay form's token for one key, issued at `now`: only this process can make one,
    /// and only for that very key.
    pub fn replay_token(
        &self,
        group: &str,
        biz_type: &str,
        biz_id: &str,
        execute_time: i64,
        now: std::time::SystemTime,
    ) -> String {
        self.forms.issue(REPLAY_FORM, &[group, biz_type, biz_id, &execute_time.to_string()], now)
    }

    /// Accepts a replay form's token for this key, issued here within the tokens' lifetime.
    pub fn check_replay_token(
        &self,
        group: &str,
        biz_type: &str,
        biz_id: &str,
        execute_time: i64,
        token: &str,
        now: std::time::SystemTime,
    ) -> Result<(), csrf::TokenRefusal> {
        self.forms.check(REPLAY_FORM, &[group, biz_type, biz_id, &execute_time.to_string()], token, now)
    }
}

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
        let problem = ui::Problem {
            status: axum::http::StatusCode::SERVICE_UNAVAILABLE,
            message: "too many pages and API calls in flight; try again in a moment".to_owned(),
        };
        let mut response = if request.uri().path().starts_with("/api/") {
            api::ApiError::from(problem).into_response()
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
        api::not_found().into_response()
    } else {
        ui::not_found().into_response()
    }
}

/// The whole application's routes. Outside in: the host name, then the credentials, then the
/// same-origin rule for state-changing requests; health needs none of them.
pub fn router(state: AppState) -> Router {
    let pages = Router::new()
        .merge(ui::router())
        .merge(api::router())
        .route_layer(middleware::from_fn_with_state(state.clone(), limit_in_flight));
    let guarded = Router::new()
        .merge(metrics::router())
        .merge(pages)
        .fallback(not_found)
        .route_layer(middleware::from_fn(csrf::same_origin_writes))
        .route_layer(middleware::from_fn_with_state(state.clone(), auth::require))
        .layer(middleware::from_fn_with_state(state.clone(), host::require_allowed));
    Router::new()
        .merge(health::router())
        .merge(guarded)
        .layer(middleware::from_fn(security_headers))
        .with_state(state)
}

/// A bound listener, not yet serving: bind first so that the address (port 0 picks a free
/// one) is known to what is built before serving.
pub struct Server {
    listener: TcpListener,
}

impl Server {
    pub async fn bind(addr: &str) -> anyhow::Result<Self> {
        let listener =
            TcpListener::bind(addr).await.with_context(|| format!("binding the HTTP server to {addr}"))?;
        Ok(Self { listener })
    }

    pub fn local_addr(&self) -> std::io::Result<SocketAddr> {
        self.listener.local_addr()
    }

    /// Serves `state`'s routes until `shutdown` resolves, then finishes the requests in flight.
    pub async fn run(
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
