//! `idemgate serve`: the service fed by the RocketMQ broker, until SIGTERM or SIGINT.
//!
//! The service itself is assembled in [`idemgate::app`]; this module only starts it, says where
//! it serves, and waits for the signal. Shutdown goes in order: stop pulling, let the
//! deliveries in flight finish (or roll back), stop the schedules and the HTTP server, close
//! the pools. A part that ends on its own stops the service with an error naming the part,
//! and the process exits non-zero.
//!
//! A crash at any point loses nothing: an uncommitted transaction rolls back and its message
//! is redelivered; a committed one whose ack was lost comes back as a `redelivery` duplicate.

use idemgate::app::{Application, Feed};
use idemgate::config::Settings;
use idemgate::handler::Handlers;
use idemgate::store::redact_url;

/// Runs the service `settings` describe, with `handlers`, until a shutdown signal.
pub(crate) async fn run(settings: &Settings, handlers: Handlers) -> anyhow::Result<()> {
    let running = Application::build_with(settings, handlers, Feed::Broker).await?.start().await?;
    let identity = running.gate().identity();
    tracing::info!(
        http = %running.url(),
        group = %identity.consumer_group,
        instance = %identity.instance_id,
        database = %redact_url(&settings.database.url),
        parts = ?running.parts(),
        "idemgate serving"
    );
    running.run_until(shutdown_signal()).await?;
    tracing::info!("idemgate stopped");
    Ok(())
}

/// Resolves on SIGTERM or SIGINT with the signal's name.
pub(crate) async fn shutdown_signal() -> &'static str {
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
