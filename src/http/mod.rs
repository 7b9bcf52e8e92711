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
mod instances;
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
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use axum::Router;
use axum::extract::Request;
use axum::http::{HeaderValue, StatusCode, header};
use axum::middleware::{self, Next};
use axum::response::Response;
use axum::routing::get;
use hyper_util::rt::{TokioIo, TokioTimer};
use hyper_util::server::graceful::GracefulShutdown;
use hyper_util::service::TowerToHyperService;
use tokio::net::TcpListener;
use tokio::sync::Semaphore;
use tower_http::timeout::TimeoutLayer;

pub use state::AppState;
pub use state::{Web, trace_context};

use crate::metrics::HttpTimeout;
use problem::{ApiError, Problem};
use settings::HttpSettings;

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

/// The whole application's routes. Outside in: the request timeout, which health too is held
/// to, then the host name, the credentials and the same-origin rule for state-changing
/// requests, which health needs none of.
pub(crate) fn router(state: AppState) -> Router {
    let pages = Router::new()
        .merge(overview::router())
        .merge(trace::router())
        .merge(lists::router())
        .merge(anomalies::router())
        .merge(instances::router())
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
    let request_timeout = state.web.request_timeout;
    Router::new()
        .merge(health::router())
        .merge(guarded)
        .layer(TimeoutLayer::with_status_code(StatusCode::REQUEST_TIMEOUT, request_timeout))
        .layer(middleware::from_fn_with_state(state.clone(), close_after_timeout))
        .layer(middleware::from_fn(security_headers))
        .with_state(state)
}

/// A request not answered within `http.request_timeout_ms` (its body still arriving, most
/// often) is answered 408 by the timeout layer inside: counted here, and its connection closed,
/// so that what is left of its body is never read as the next request.
async fn close_after_timeout(
    axum::extract::State(state): axum::extract::State<AppState>,
    request: Request,
    next: Next,
) -> Response {
    let mut response = next.run(request).await;
    if response.status() == StatusCode::REQUEST_TIMEOUT {
        state.metrics.observe_http_timeout(HttpTimeout::Request);
        response.headers_mut().insert(header::CONNECTION, HeaderValue::from_static("close"));
    }
    response
}

/// A bound listener, not yet serving: bind first so that the address (port 0 picks a free
/// one) is known to what is built before serving.
pub struct Server {
    listener: TcpListener,
    header_read_timeout: Duration,
    max_client_connections: usize,
}

impl Server {
    /// Binds `http.bind`, to serve with `http`'s limits on what a client may hold.
    pub async fn bind(http: &HttpSettings) -> anyhow::Result<Self> {
        let addr = &http.bind;
        let listener =
            TcpListener::bind(addr).await.with_context(|| format!("binding the HTTP server to {addr}"))?;
        Ok(Self {
            listener,
            header_read_timeout: Duration::from_millis(http.header_read_timeout_ms),
            max_client_connections: http.max_client_connections as usize,
        })
    }

    pub fn local_addr(&self) -> std::io::Result<SocketAddr> {
        self.listener.local_addr()
    }

    /// Serves `state`'s routes until `shutdown` resolves, then stops accepting, lets each
    /// connection finish the request it is serving and waits for them all to close.
    ///
    /// Each connection speaks HTTP/1.1 through hyper, with a header read timeout: a request
    /// head that has not arrived whole within `http.header_read_timeout_ms` closes the
    /// connection (the request timeout of [`router`] bounds the rest). At most
    /// `http.max_client_connections` are open at once; at the limit the loop stops accepting,
    /// so that further connections wait in the listen queue, as the kernel holds them, until
    /// one closes.
    pub async fn run(
        self,
        state: AppState,
        shutdown: impl std::future::Future<Output = ()> + Send + 'static,
    ) -> anyhow::Result<()> {
        let metrics = state.metrics.clone();
        let service = TowerToHyperService::new(router(state));
        let mut http1 = hyper::server::conn::http1::Builder::new();
        http1.timer(TokioTimer::new()).header_read_timeout(self.header_read_timeout);
        let places = Arc::new(Semaphore::new(self.max_client_connections));
        let open = GracefulShutdown::new();
        tokio::pin!(shutdown);
        loop {
            let place = match places.clone().try_acquire_owned() {
                Ok(place) => place,
                Err(_) => {
                    metrics.observe_http_connection_limit();
                    tokio::select! {
                        place = places.clone().acquire_owned() => match place {
                            Ok(place) => place,
                            Err(_) => break,
                        },
                        () = &mut shutdown => break,
                    }
                }
            };
            let stream = tokio::select! {
                accepted = self.listener.accept() => match accepted {
                    Ok((stream, _)) => stream,
                    Err(e) => {
                        if pause_after_accept_error(e, &mut shutdown).await {
                            break;
                        }
                        continue;
                    }
                },
                () = &mut shutdown => break,
            };
            let connection = open.watch(http1.serve_connection(TokioIo::new(stream), service.clone()));
            let metrics = metrics.clone();
            tokio::spawn(async move {
                let _open = metrics.open_http_connection();
                match connection.await {
                    Err(e) if e.is_timeout() => metrics.observe_http_timeout(HttpTimeout::Header),
                    Err(e) => tracing::debug!(error = %e, "an HTTP connection ended in error"),
                    Ok(()) => {}
                }
                drop(place);
            });
        }
        drop(self.listener);
        open.shutdown().await;
        Ok(())
    }
}

/// After a failed accept: a connection that went away before it was accepted is nothing;
/// anything else (out of file descriptors, most often) is logged, and accepting resumes a
/// second later rather than spinning. True when `shutdown` came meanwhile.
async fn pause_after_accept_error(
    error: std::io::Error,
    shutdown: &mut std::pin::Pin<&mut (impl std::future::Future<Output = ()> + Send)>,
) -> bool {
    use std::io::ErrorKind;
    if matches!(
        error.kind(),
        ErrorKind::ConnectionAborted | ErrorKind::ConnectionReset | ErrorKind::ConnectionRefused
    ) {
        return false;
    }
    tracing::warn!(error = %error, "the HTTP server could not accept a connection; trying again in a second");
    tokio::select! {
        () = tokio::time::sleep(Duration::from_secs(1)) => false,
        () = shutdown.as_mut() => true,
    }
}
