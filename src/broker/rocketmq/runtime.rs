//! The runtime the RocketMQ client runs on, sized for the consumer's load.
//!
//! The client runs its own Tokio runtime (a `rocketmq_runtime::RuntimeOwner`) and calls the
//! consume listener on the blocking lane it names `metadata-io`. With the default lane (4
//! threads and a queue of 16 on 2 cores) a burst of deliveries is refused with
//! `runtime.capacity.exhausted`, which the client treats as a failed batch and redelivers: a
//! real source of duplicates. The lane is sized here from the consume thread count, so the
//! client's own consume-thread limit is what bounds concurrency, not admission.
//!
//! The same lane holds the client's **consume deadline**: a listener call still running after
//! the lane's `task_timeout` is abandoned (`consume_message task panicked … DeadlineExceeded`)
//! and its messages sent back for redelivery, while the call goes on and its transaction may
//! still commit. It is set here explicitly to [`CONSUME_DEADLINE`], which the gate's deadline
//! (`consumer.delivery_timeout_ms`) and the listener's own stay below.
//!
//! The client's telemetry is left as a no-op so that it never installs a global subscriber of
//! its own: idemgate keeps control of its logging.

use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use rocketmq_client_rust::{ClientRuntime, ClientRuntimeConfig};
use rocketmq_observability::TelemetryRuntimeGuard;
use rocketmq_runtime::{RuntimeConfig, RuntimeOwner};

/// How long the RocketMQ client lets one listener call run before it abandons it: the listener
/// lane's `task_timeout`, 30 s by the client's default, set here so that it cannot change under
/// idemgate's deadlines.
pub(crate) const CONSUME_DEADLINE: Duration = Duration::from_secs(30);

/// Owns the RocketMQ client's runtime; shut it down after the clients it hosts.
pub struct ClientHost {
    owner: RuntimeOwner,
    client_runtime: Arc<ClientRuntime>,
    telemetry: TelemetryRuntimeGuard,
}

impl ClientHost {
    /// A runtime whose listener lane admits `consume_threads` listener calls at once, with a
    /// queue four times as deep behind them.
    pub fn new(name: &str, consume_threads: usize) -> anyhow::Result<Self> {
        let parallelism = std::thread::available_parallelism().map(|n| n.get()).unwrap_or(2);
        let lane_concurrency = consume_threads.max(1) + 4;
        let mut config = RuntimeConfig::for_parallelism(format!("idemgate-{name}"), parallelism)
            .with_max_blocking_threads((lane_concurrency * 2).clamp(16, 512))
            .context("sizing the RocketMQ client's blocking threads")?;
        let lane = &mut config.blocking_lane_policies.metadata_io;
        lane.max_concurrency = lane_concurrency;
        lane.max_queue_depth = lane_concurrency * 4;
        lane.task_timeout = CONSUME_DEADLINE;
        Self::from_config(config)
    }

    /// The client's own default sizing, for comparison in the benchmark: on 2 cores its
    /// listener lane admits 4 calls with 16 queued.
    pub fn with_client_defaults(name: &str) -> anyhow::Result<Self> {
        let parallelism = std::thread::available_parallelism().map(|n| n.get()).unwrap_or(2);
        Self::from_config(RuntimeConfig::for_parallelism(format!("idemgate-{name}"), parallelism))
    }

    fn from_config(config: RuntimeConfig) -> anyhow::Result<Self> {
        let owner = RuntimeOwner::plan(config)
            .context("planning the RocketMQ client runtime")?
            .build()
            .context("starting the RocketMQ client runtime")?;
        let telemetry = TelemetryRuntimeGuard::noop();
        let client_runtime = ClientRuntime::try_new(
            owner.root_context().component("client"),
            ClientRuntimeConfig::default(),
            telemetry.handle(),
        )
        .context("starting the RocketMQ client")?;
        Ok(Self { owner, client_runtime, telemetry })
    }

    pub fn client_runtime(&self) -> Arc<ClientRuntime> {
        Arc::clone(&self.client_runtime)
    }

    /// Stops the client runtime and its tasks; reports problems in the log, never panics.
    pub async fn shutdown(self) {
        let report = self.client_runtime.shutdown().await;
        if !report.is_healthy() {
            tracing::warn!(report = %report.to_json(), "the RocketMQ client did not shut down cleanly");
        }
        let report = self.owner.shutdown_tasks().await;
        if !report.is_healthy() {
            tracing::warn!(report = %report.to_json(), "RocketMQ client tasks did not stop cleanly");
        }
        let report = self.owner.shutdown_background();
        if !report.is_healthy() {
            tracing::warn!(report = %report.to_json(), "RocketMQ client background work did not stop cleanly");
        }
        let _ = self.telemetry.shutdown();
    }
}
