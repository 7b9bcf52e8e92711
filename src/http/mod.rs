//! The HTTP server: health endpoints, and the router the web UI, the JSON API and `/metrics`
//! hang off. It binds to loopback unless configured otherwise.
//!
//! This module owns routing and the server's lifecycle; each resource's handlers live in a
//! module of their own. It must not change state on a GET.

mod health;

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::AtomicBool;

use anyhow::Context;
use axum::Router;
use tokio::net::TcpListener;

use crate::store::Store;

/// What the handlers share.
#[derive(Clone)]
pub struct AppState {
    pub store: Store,
    /// Set once the consumer has started (or, in the demo, the traffic source).
    pub consumer_ready: Arc<AtomicBool>,
}

/// The whole application's routes.
pub fn router(state: AppState) -> Router {
    Router::new().merge(health::router()).with_state(state)
}

/// A bound server, not yet serving.
pub struct Server {
    listener: TcpListener,
    router: Router,
}

impl Server {
    /// Binds `addr` (port 0 picks a free port).
    pub async fn bind(addr: &str, state: AppState) -> anyhow::Result<Self> {
        let listener =
            TcpListener::bind(addr).await.with_context(|| format!("binding the HTTP server to {addr}"))?;
        Ok(Self { listener, router: router(state) })
    }

    pub fn local_addr(&self) -> std::io::Result<SocketAddr> {
        self.listener.local_addr()
    }

    /// Serves until `shutdown` resolves, then finishes the requests in flight.
    pub async fn run(
        self,
        shutdown: impl std::future::Future<Output = ()> + Send + 'static,
    ) -> anyhow::Result<()> {
        axum::serve(self.listener, self.router).with_graceful_shutdown(shutdown).await.context("serving HTTP")
    }
}
