//! `idemgate serve`: the service. It wires the store, the gate, the metrics, the HTTP server,
//! the archive and reconcile schedules and the RocketMQ consumer, runs until SIGTERM or SIGINT, and shuts down in order: stop
//! pulling, let the deliveries in flight finish (or roll back), stop the HTTP server, close the
//! pool.
//!
//! A crash at any point loses nothing: an uncommitted transaction rolls back and its message
//! is redelivered; a committed one whose ack was lost comes back as a `redelivery` duplicate.
//! [`Running`] is the part `serve` and the demo share: the gate with its metrics and the HTTP
//! server.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use anyhow::Context;
use tokio::sync::oneshot;
use tokio::task::JoinHandle;

use crate::archive::ArchiveScheduler;
use crate::broker::Consumer;
use crate::config::Settings;
use crate::gate::{Gate, Policy};
use crate::handler::Handlers;
use crate::http::{self, AppState, Web};
use crate::metrics::{BuildInfo, Metrics};
use crate::prefilter::Prefilter;
use crate::reconcile::ReconcileScheduler;
use crate::store::{Store, redact_url};

/// The gate, its metrics and the HTTP server, running.
pub struct Running {
    pub gate: Arc<Gate>,
    /// The web UI's base URL, such as `http://127.0.0.1:8080`.
    pub url: String,
    store: Store,
    ready: Arc<AtomicBool>,
    stop_http: oneshot::Sender<()>,
    http_task: JoinHandle<anyhow::Result<()>>,
}

impl Running {
    /// Binds the HTTP server, builds the gate with metrics on `store`, and starts serving.
    /// `replay` offers dead-letter replay on the trace page through the configured broker.
    /// `/readyz` answers 503 until [`Running::set_ready`].
    pub async fn start(
        settings: &Settings,
        store: Store,
        handlers: Handlers,
        policy: Policy,
        replay: bool,
    ) -> anyhow::Result<Self> {
        let server = http::Server::bind(&settings.http.bind).await?;
        if settings.http.binds_every_address() && settings.http.allowed_hosts.is_empty() {
            tracing::warn!(
                bind = %settings.http.bind,
                "http.bind listens on every address but http.allowed_hosts names no host: the web UI, \
                 the API and /metrics answer only to IP addresses and localhost; list the names the \
                 service is reached by in http.allowed_hosts (IDEMGATE_HTTP__ALLOWED_HOSTS)"
            );
        }
        let url = format!("http://{}", server.local_addr()?);
        let routes = settings.routes();
        let identity = settings.identity();
        let topics = routes.topics().into_iter().map(|(topic, _)| topic).collect();
        let info = BuildInfo {
            backend: store.backend(),
            consumer_group: identity.consumer_group.clone(),
            instance_id: identity.instance_id.clone(),
            ui_url: url.clone(),
        };
        let metrics = Arc::new(Metrics::new(&info, &routes.biz_types(), &topics));
        let web = Web::new(settings, &handlers);
        let web = Arc::new(if replay { web.with_replay(settings) } else { web });
        let layout = crate::layout::ensure(&store, settings.dedup.shards, &identity.instance_id).await?;
        let mut gate = Gate::new(store.clone(), routes, handlers, identity, policy)?
            .with_metrics(metrics.clone())
            .with_layout(layout);
        if let Some(group) = settings.group_commit.group_settings() {
            tracing::info!(
                max_batch = group.max_batch,
                linger_ms = group.linger.as_millis() as u64,
                in_flight = group.in_flight,
                "group commit is on"
            );
            gate = gate.with_group_commit(group);
        }
        if settings.redis.enabled() {
            let prefilter = Prefilter::new(&settings.redis)
                .with_context(|| format!("redis.url {}", redact_url(&settings.redis.url)))?;
            if prefilter.warm_up().await {
                tracing::info!(
                    redis = %redact_url(&settings.redis.url), biz_types = ?settings.redis.biz_types,
                    "the Redis pre-filter is on"
                );
            }
            gate = gate.with_prefilter(Arc::new(prefilter));
        }
        let gate = Arc::new(gate);
        let ready = Arc::new(AtomicBool::new(false));
        let state = AppState { store: store.clone(), consumer_ready: ready.clone(), metrics, web };
        let (stop_http, http_stopped) = oneshot::channel::<()>();
        let http_task = tokio::spawn(server.run(state, async {
            let _ = http_stopped.await;
        }));
        Ok(Self { gate, url, store, ready, stop_http, http_task })
    }

    pub fn set_ready(&self, ready: bool) {
        self.ready.store(ready, Ordering::Release);
    }

    /// Stops the HTTP server after its requests in flight, then closes the pool.
    pub async fn stop(self) -> anyhow::Result<()> {
        let _ = self.stop_http.send(());
        let served = self.http_task.await.context("the HTTP server task failed");
        self.store.close().await;
        served?
    }
}

/// Runs the service on `store` (opened and migrated) with `handlers` until a shutdown signal.
pub async fn run(settings: &Settings, store: Store, handlers: Handlers) -> anyhow::Result<()> {
    let checks = handlers.checks(&settings.routes());
    let mut running = Running::start(settings, store, handlers, settings.policy(), true).await?;
    let archiver = ArchiveScheduler::start_for_serve(
        running.store.clone(),
        &settings.archive,
        &running.gate.identity().instance_id,
        settings.consumer.max_reconsume_times,
    )
    .await?;
    let reconciler = ReconcileScheduler::start_for_serve(
        running.store.clone(),
        &settings.reconcile,
        &running.gate.identity().consumer_group,
        &running.gate.identity().instance_id,
        settings.archive.log_retention_days,
        checks,
    )
    .await?;
    let consumer = Consumer::start(running.gate.clone(), &settings.consumer_options()).await?;
    running.set_ready(true);
    tracing::info!(
        http = %running.url,
        group = %running.gate.identity().consumer_group,
        instance = %running.gate.identity().instance_id,
        database = %redact_url(&settings.database.url),
        "idemgate serving"
    );
    let http_failed = tokio::select! {
        signal = shutdown_signal() => {
            tracing::info!(signal, "shutting down: no new pulls; finishing the deliveries in flight");
            None
        }
        result = &mut running.http_task => Some(result),
    };
    running.set_ready(false);
    consumer.shutdown().await;
    if let Some(archiver) = archiver {
        archiver.shutdown().await;
    }
    if let Some(reconciler) = reconciler {
        reconciler.shutdown().await;
    }
    if let Some(result) = http_failed {
        running.store.close().await;
        result.context("the HTTP server task failed")??;
        anyhow::bail!("the HTTP server stopped on its own");
    }
    running.stop().await?;
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
