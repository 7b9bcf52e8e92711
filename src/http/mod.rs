//! The HTTP server: health endpoints, `/metrics`, and the router the web UI and the JSON API
//! hang off. It binds to loopback unless configured otherwise.
//!
//! This module owns routing and the server's lifecycle; each resource's handlers live in a
//! module of their own. It must not change state on a GET.

mod health;
mod metrics;

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::AtomicBool;

use anyhow::Context;
use axum::Router;
use tokio::net::TcpListener;

use crate::metrics::Metrics;
use crate::store::Store;

/// What the handlers share.
#[derive(Clone)]
pub struct AppState {
    pub store: Store,
    /// Set once the consumer has started (or, in the demo, the traffic source).
    pub consumer_ready: Arc<AtomicBool>,
    pub metrics: Arc<Metrics>,
}

/// The whole application's routes.
pub fn router(state: AppState) -> Router {
    Router::new().merge(health::router()).merge(metrics::router()).with_state(state)
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
