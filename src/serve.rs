//! `idemgate serve`: the service. It wires the store, the gate, the HTTP server and the
//! RocketMQ consumer, runs until SIGTERM or SIGINT, and shuts down in order: stop pulling,
//! let the deliveries in flight finish (or roll back), stop the HTTP server, close the pool.
//!
//! A crash at any point loses nothing: an uncommitted transaction rolls back and its message
//! is redelivered; a committed one whose ack was lost comes back as a `redelivery` duplicate.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use anyhow::Context;
use tokio::sync::oneshot;

use crate::broker::Consumer;
use crate::config::Settings;
use crate::gate::Gate;
use crate::handler::Handlers;
use crate::http::{self, AppState};
use crate::store::{Store, redact_url};

/// Runs the service on `store` (opened and migrated) with `handlers` until a shutdown signal.
pub async fn run(settings: &Settings, store: Store, handlers: Handlers) -> anyhow::Result<()> {
    let gate = Arc::new(Gate::new(
        store.clone(),
        settings.routes(),
        handlers,
        settings.identity(),
        settings.policy(),
    )?);
    let ready = Arc::new(AtomicBool::new(false));
    let server = http::Server::bind(
        &settings.http.bind,
        AppState { store: store.clone(), consumer_ready: ready.clone() },
    )
    .await?;
    let addr = server.local_addr()?;
    let (stop_http, http_stopped) = oneshot::channel::<()>();
    let mut http_task = tokio::spawn(server.run(async {
        let _ = http_stopped.await;
    }));

    let consumer = Consumer::start(gate.clone(), &settings.consumer_options()).await?;
    ready.store(true, Ordering::Release);
    tracing::info!(
        http = %format!("http://{addr}/"),
        group = %gate.identity().consumer_group,
        instance = %gate.identity().instance_id,
        database = %redact_url(&settings.database.url),
        "idemgate serving"
    );

    let http_result = tokio::select! {
        signal = shutdown_signal() => {
            tracing::info!(signal, "shutting down: no new pulls; finishing the deliveries in flight");
            None
        }
        result = &mut http_task => Some(result),
    };
    ready.store(false, Ordering::Release);
    consumer.shutdown().await;
    let _ = stop_http.send(());
    let http_result = match http_result {
        Some(r) => r,
        None => http_task.await,
    };
    store.close().await;
    http_result.context("the HTTP server task failed")??;
    tracing::info!("idemgate stopped");
    Ok(())
}

/// Resolves on SIGTERM or SIGINT with the signal's name.
pub async fn shutdown_signal() -> &'static str {
    let ctrl_c = async {
        let _ = tokio::signal::ctrl_c().await;
    };
    #[cfg(unix)]
    {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut term) => tokio::select! {
                _ = ctrl_c => "SIGINT",
                _ = term.recv() => "SIGTERM",
            },
            Err(_) => {
                ctrl_c.await;
                "SIGINT"
            }
        }
    }
    #[cfg(not(unix))]
    {
        ctrl_c.await;
        "SIGINT"
    }
}
