//! The service, assembled from its settings: the one place that turns [`Settings`] into a
//! running idemgate. `idemgate serve`, `idemgate demo`, an embedding binary and the
//! integration tests all build it here, so what is tested is what ships: every option of the
//! gate (late-duplicate guard, Redis pre-filter, shards, group commit, metrics), the HTTP
//! state with its own pool, the consumer and the schedules come from one function each.
//!
//! [`Application::build`] opens and migrates the database, binds the HTTP listener (port 0
//! picks a free one, see [`Application::url`]) and assembles the gate; nothing runs yet.
//! [`Application::start`] starts the parts as named tasks ([`tasks`]) and marks the service
//! ready; [`Running::run_until`] waits for the shutdown signal or for a part that ends on its
//! own, which turns `/readyz` to 503 and stops the service with an error naming the part.
//!
//! This module wires; it must not decide anything about deliveries.

mod by_hand;
pub(crate) mod tasks;

use std::collections::BTreeSet;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;

use anyhow::Context;

use crate::archive::ArchiveScheduler;
use crate::broker::lag::StallWatch;
use crate::broker::seam::Counted;
use crate::broker::{LagRead, Sink, Subscription};
use crate::config::Settings;
use crate::gate::Gate;
use crate::handler::Handlers;
use crate::http::{self, AppState, Web};
use crate::metrics::{BuildInfo, Metrics};
use crate::prefilter::Prefilter;
use crate::reconcile::{Check, ReconcileScheduler};
use crate::replay::Replayer;
use crate::store::{Store, StoreOptions, redact_url};
pub use by_hand::ByHand;
use tasks::{Stop, Tasks};

/// Where the gate's deliveries come from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Feed {
    /// The consumer of the broker `[broker] kind` names (`serve`). The trace page offers
    /// replay through the same broker.
    Broker,
    /// The caller hands deliveries to [`Running::gate`]: the demo's traffic, a test, an
    /// embedding program with its own source. No consumer is started and replay is off.
    Caller,
}

/// The service, built and not yet started.
pub struct Application {
    settings: Settings,
    feed: Feed,
    store: Store,
    ui_store: Store,
    gate: Arc<Gate>,
    state: AppState,
    server: http::Server,
    url: String,
    checks: Vec<Check>,
}

/// The longest the start waits for the claim key and the delivery log's partitions
/// ([`crate::archive::prepare_tables`]).
const PREPARE_TABLES_LIMIT: Duration = Duration::from_secs(30);

impl Application {
    /// Builds the service `settings` describe, with the configured handlers.
    pub async fn build(settings: &Settings, feed: Feed) -> anyhow::Result<Self> {
        let handlers = settings.handlers()?;
        Self::build_with(settings, handlers, feed).await
    }

    /// Builds the service with `handlers` instead of the configured ones: for a program that
    /// brings handlers of its own ([`Settings::handlers_with`] adds the configured ones). It
    /// refuses to build without a consumer group, without routes, or with a route whose
    /// handler `handlers` lacks (the gate's refusal, [`Gate::new`], made before any handler
    /// prepares its tables and before the listener is bound).
    pub async fn build_with(settings: &Settings, handlers: Handlers, feed: Feed) -> anyhow::Result<Self> {
        settings.validate_service()?;
        let mut settings = settings.clone();
        if settings.consumer.instance.is_empty() {
            // Fixed once, so that the gate, the schedules and the metrics name one instance.
            settings.consumer.instance = crate::gate::Identity::default_instance_id();
        }
        let shown = redact_url(&settings.database.url);
        let store = open_store(&settings).await?;
        // A claim key not yet led by biz_id still holds every key, and a log whose partitions
        // cannot be made now (a lock held past its bound, a right missing, a concurrent index
        // build waiting behind a long transaction) still takes every row (the overflow
        // partition, or the plain table): the start waits for them at most
        // PREPARE_TABLES_LIMIT, then goes on; the archive job tries again and the alerts on the
        // partitions say so.
        let now = crate::clock::now_ms();
        let prepared = tokio::time::timeout(
            PREPARE_TABLES_LIMIT,
            crate::archive::prepare_tables(&store, &settings.archive, &settings.consumer.instance, now),
        )
        .await;
        match prepared {
            Ok(Ok(())) => {}
            Ok(Err(e)) => tracing::warn!(
                error = %e,
                "could not prepare the claim key or the delivery log's partitions at start; the archive job tries again"
            ),
            Err(_) => tracing::warn!(
                limit_s = PREPARE_TABLES_LIMIT.as_secs(),
                "could not prepare the claim key or the delivery log's partitions at start within its limit; the archive job tries again"
            ),
        }
        // The gate first: it refuses a route to no handler before anything else is made.
        let gate_store = gate_store(&settings, &store)
            .await
            .with_context(|| format!("opening the gate's pool on {shown}"))?;
        let gate = gate(&settings, &store, gate_store, handlers.clone(), None).await?;
        // What a handler makes of its own (its tables, its reference rows) is made next; then
        // every configured statement is prepared before anything consumes: a typo in a table
        // or column name stops the service here, with the handler and the statement named.
        handlers
            .prepare(&store)
            .await
            .map_err(|why| anyhow::anyhow!("preparing the handlers on {shown}: {why}"))?;
        handlers
            .verify(&store)
            .await
            .map_err(|why| anyhow::anyhow!("checking the handlers against {shown}: {why}"))?;
        let ui_store =
            ui_store(&settings, &store).await.with_context(|| format!("opening the UI's pool on {shown}"))?;
        let server = http::Server::bind(&settings.http).await?;
        let bound = server.local_addr()?;
        let url = format!("http://{bound}");
        if settings.http.public_url.is_empty() && bound.ip().is_unspecified() {
            tracing::warn!(
                bind = %settings.http.bind,
                ui_url = %settings.http.ui_url(bound),
                "http.public_url is not set and http.bind listens on every address: the links of the \
                 metrics and alerts name this machine; set http.public_url (IDEMGATE_HTTP__PUBLIC_URL) \
                 to the address people open the web UI at"
            );
        }
        // Fixed once, so that the metrics, the alerts' links and the pages name one address.
        settings.http.public_url = settings.http.ui_url(bound);
        if settings.http.binds_every_address() && settings.http.allowed_hosts.is_empty() {
            tracing::warn!(
                bind = %settings.http.bind,
                "http.bind listens on every address but http.allowed_hosts names no host: the web UI, \
                 the API and /metrics answer only to IP addresses and localhost; list the names the \
                 service is reached by in http.allowed_hosts (IDEMGATE_HTTP__ALLOWED_HOSTS)"
            );
        }

        let routes = settings.routes();
        let identity = settings.identity();
        let topics = routes.topics().into_iter().map(|(topic, _)| topic).collect();
        let info = BuildInfo {
            backend: store.backend(),
            broker: settings.broker.kind,
            consumer_group: identity.consumer_group.clone(),
            instance_id: identity.instance_id.clone(),
            ui_url: settings.http.public_url.clone(),
        };
        let metrics = Arc::new(Metrics::new(&info, &routes.biz_types(), &topics));
        let web = Web::new(&settings.http, &settings.archive, handlers.by_biz_type(&routes));
        let web = Arc::new(match feed {
            Feed::Broker => web.with_replay(Replayer::new(settings.brokers(), routes.clone())),
            Feed::Caller => web,
        });
        let checks = handlers.checks(&routes);
        let record = crate::instances::Record::new(
            store.clone(),
            &identity.consumer_group,
            &identity.instance_id,
            settings.broker.kind,
        );
        let counted = metrics.clone();
        record.on_attributed(Box::new(move |biz_type, sub_cause| {
            counted.observe_redelivery(biz_type, sub_cause)
        }));
        let gate = Arc::new(observed(gate, &settings, &handlers, metrics.clone()).with_record(record));
        let state = AppState {
            store: ui_store.clone(),
            consumer_store: store.clone(),
            consumer_ready: Arc::new(AtomicBool::new(false)),
            consumer_progressing: Arc::new(AtomicBool::new(true)),
            metrics,
            web,
        };
        Ok(Self { settings, feed, store, ui_store, gate, state, server, url, checks })
    }

    /// The address the web UI listens on, as a URL such as `http://127.0.0.1:8080` (the port
    /// that port 0 picked): for connecting from this machine. Links for others use
    /// `http.public_url`.
    pub fn url(&self) -> &str {
        &self.url
    }

    pub fn gate(&self) -> &Arc<Gate> {
        &self.gate
    }

    /// The HTTP routes on the assembled state, for a request sent without the network
    /// (`tower::ServiceExt::oneshot`); [`Application::start`] serves the same.
    pub fn router(&self) -> axum::Router {
        http::router(self.state.clone())
    }

    /// The pages' fixed state: the handlers' describers, the host names, the form tokens.
    pub fn web(&self) -> &Arc<Web> {
        &self.state.web
    }

    /// The settings the service runs with (the instance id and the web UI's public URL filled
    /// in).
    pub fn settings(&self) -> &Settings {
        &self.settings
    }

    /// Starts every part: the HTTP server, the archive and reconcile schedules when enabled,
    /// and, fed by the broker, the consumer last, so that deliveries begin only once the rest
    /// runs, then the reading of its lag (`broker.lag_interval_seconds`). They stop in the
    /// reverse order.
    pub async fn start(self) -> anyhow::Result<Running> {
        let Self { settings, feed, store, ui_store, gate, state, server, url, checks } = self;
        let ready = state.consumer_ready.clone();
        let mut tasks = Tasks::clearing(ready.clone());
        let metrics = state.metrics.clone();
        let progressing = state.consumer_progressing.clone();
        tasks.spawn("http server", |stop| server.run(state, stop));
        let started =
            start_parts(&settings, feed, &store, &gate, checks, (metrics, progressing), &mut tasks).await;
        let running = Running { gate, url, store, ui_store, ready, tasks };
        if let Err(e) = started {
            let _ = running.stop().await;
            return Err(e);
        }
        running.tasks.mark_ready();
        Ok(running)
    }
}

/// How often the consumer task reads what the broker client holds pulled.
const BUFFERED_READ_EVERY: Duration = Duration::from_secs(1);
/// How long a clean stop may take to be written to the consumer record.
const RECORD_STOP_WITHIN: Duration = Duration::from_secs(5);

/// The schedules, the consumer and, after it, the reading of its lag, each as a task of `tasks`.
async fn start_parts(
    settings: &Settings,
    feed: Feed,
    store: &Store,
    gate: &Arc<Gate>,
    checks: Vec<Check>,
    (metrics, progressing): (Arc<Metrics>, Arc<AtomicBool>),
    tasks: &mut Tasks,
) -> anyhow::Result<()> {
    let identity = gate.identity();
    let brokers = settings.brokers();
    // How long a copy of a message can still come back through the broker's own retries.
    let redelivery_ms = brokers.limits().redelivery_horizon_ms(settings.consumer.max_reconsume_times);
    let archiver = ArchiveScheduler::start_for_serve(
        store.clone(),
        &settings.archive,
        &identity.instance_id,
        redelivery_ms,
    )
    .await?;
    if let Some(mut archiver) = archiver {
        tasks.spawn("archive schedule", |stop| async move {
            tokio::select! {
                () = stop => {
                    archiver.shutdown().await;
                    Ok(())
                }
                what = archiver.fault() => {
                    archiver.shutdown().await;
                    anyhow::bail!("an archive run panicked: {what}")
                }
            }
        });
    }
    let reconciler = ReconcileScheduler::start_for_serve(
        store.clone(),
        &settings.reconcile,
        &identity.consumer_group,
        &identity.instance_id,
        settings.archive.log_retention_days,
        checks,
    )
    .await?;
    if let Some(mut reconciler) = reconciler {
        tasks.spawn("reconcile schedule", |stop| async move {
            tokio::select! {
                () = stop => {
                    reconciler.shutdown().await;
                    Ok(())
                }
                what = reconciler.fault() => {
                    reconciler.shutdown().await;
                    anyhow::bail!("a reconcile run panicked: {what}")
                }
            }
        });
    }
    if let Some(record) = gate.record().cloned() {
        record.start().await.context("recording this run in consumer_instance")?;
        tasks.spawn("consumer record", |stop| async move {
            let writer = tokio::spawn(record.clone().run());
            stop.await;
            writer.abort();
            record.stop(RECORD_STOP_WITHIN).await;
            Ok(())
        });
    }
    if gate.group_commit().is_some() {
        // The committer's tasks start with the first delivery; a panic in one is reported here.
        let gate = gate.clone();
        tasks.spawn("group commit", |stop| async move {
            tokio::select! {
                () = stop => Ok(()),
                what = gate.group_commit_fault() => anyhow::bail!("a group-commit task panicked: {what}"),
            }
        });
    }
    if feed == Feed::Broker {
        let subscription = Subscription::of(gate);
        // Every verdict the consumer gives is counted: its progress, for the stall watch.
        let answered = Arc::new(AtomicU64::new(0));
        let sink: Arc<dyn Sink> = Arc::new(Counted::new(gate.clone(), answered.clone()));
        let mut consumer = brokers.subscribe(sink, &subscription).await?;
        let kind = brokers.kind();
        let buffered_metrics = metrics.clone();
        tasks.spawn("consumer", |mut stop| async move {
            // What the client holds fetched is read once a second, for the gauge.
            let mut ticks = tokio::time::interval(BUFFERED_READ_EVERY);
            ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            loop {
                tokio::select! {
                    () = &mut stop => {
                        consumer.shutdown().await;
                        return Ok(());
                    }
                    what = consumer.fault() => {
                        consumer.shutdown().await;
                        anyhow::bail!("the {} consumer stopped: {what}", kind.as_str())
                    }
                    _ = ticks.tick() => {
                        if let Some(held) = consumer.buffered_messages().await {
                            buffered_metrics.observe_buffered_messages(&held);
                        }
                    }
                }
            }
        });
        if let Some((every, timeout)) = settings.broker.lag_schedule() {
            let probe = brokers.lag_reader(&identity.consumer_group, timeout).await?;
            let topics = gate.routes().topics().into_iter().map(|(topic, _)| topic).collect();
            let stall = settings.broker.stall_after().map(|after| Stall {
                watch: StallWatch::new(after, std::time::Instant::now()),
                answered,
                progressing: progressing.clone(),
                broker: kind,
            });
            tasks.spawn("consumer lag", move |stop| {
                read_lag_every(probe, topics, every, metrics, stall, stop)
            });
        }
    }
    Ok(())
}

/// The consumer's progress, judged at each lag reading: `progressing` (which `/readyz` reads)
/// is cleared while the consumer answers nothing and messages wait.
struct Stall {
    watch: StallWatch,
    answered: Arc<AtomicU64>,
    progressing: Arc<AtomicBool>,
    broker: crate::broker::BrokerKind,
}

impl Stall {
    fn observe(&mut self, reading: &crate::broker::lag::LagReading, metrics: &Metrics) {
        let now = std::time::Instant::now();
        let answered = self.answered.load(Ordering::Relaxed);
        let waiting = reading.waiting();
        match self.watch.observe(waiting, answered, now) {
            Some(true) => {
                self.progressing.store(false, Ordering::Release);
                tracing::error!(
                    broker = self.broker.as_str(),
                    waiting = waiting.unwrap_or(0),
                    idle_s = self.watch.idle_for(now).as_secs(),
                    "the consumer answers no delivery while messages wait: it is stalled, and the service is not ready until it answers again"
                );
            }
            Some(false) => {
                self.progressing.store(true, Ordering::Release);
                tracing::info!(broker = self.broker.as_str(), "the consumer answers deliveries again");
            }
            None => {}
        }
        metrics.observe_consumer_stalled(!self.progressing.load(Ordering::Acquire));
    }
}

/// Reads the consumer lag of `topics` every `every` until `stop`, and hands each reading to the
/// metrics (which the overview page reads too). A topic whose reading goes wrong, or right again,
/// is logged once at the change.
async fn read_lag_every(
    probe: Box<dyn LagRead>,
    topics: Vec<String>,
    every: Duration,
    metrics: Arc<Metrics>,
    mut stall: Option<Stall>,
    mut stop: Stop,
) -> anyhow::Result<()> {
    let mut ticks = tokio::time::interval(every);
    ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut troubled = BTreeSet::new();
    loop {
        tokio::select! {
            () = &mut stop => break,
            _ = ticks.tick() => {}
        }
        let reading = tokio::select! {
            () = &mut stop => break,
            reading = probe.read(&topics) => reading,
        };
        for t in &reading.topics {
            match &t.problem {
                Some(problem) if troubled.insert(t.topic.clone()) => {
                    tracing::warn!(topic = %t.topic, result = t.result.as_str(), %problem, "the consumer lag could not be read in full");
                }
                None if troubled.remove(&t.topic) => {
                    tracing::info!(topic = %t.topic, "the consumer lag is read in full again");
                }
                _ => {}
            }
        }
        metrics.observe_consumer_lag(&reading);
        if let Some(stall) = stall.as_mut() {
            stall.observe(&reading, &metrics);
        }
    }
    probe.shutdown().await;
    Ok(())
}

/// The service, running.
pub struct Running {
    gate: Arc<Gate>,
    url: String,
    store: Store,
    ui_store: Store,
    ready: Arc<AtomicBool>,
    tasks: Tasks,
}

impl Running {
    pub fn gate(&self) -> &Arc<Gate> {
        &self.gate
    }

    /// The address the web UI listens on, as a URL such as `http://127.0.0.1:8080` (the port
    /// that port 0 picked): for connecting from this machine. Links for others use
    /// `http.public_url`.
    pub fn url(&self) -> &str {
        &self.url
    }

    /// The parts running, in the order they started.
    pub fn parts(&self) -> Vec<&'static str> {
        self.tasks.names().collect()
    }

    /// Resolves when a part has ended on its own, with its name and how it ended; `/readyz`
    /// answers 503 from then on.
    pub async fn failed(&mut self) -> (&'static str, String) {
        let (name, ended) = self.tasks.first_exit().await;
        self.ready.store(false, Ordering::Release);
        tracing::error!(part = name, ended = %ended, "a part of the service ended on its own; stopping");
        (name, ended.to_string())
    }

    /// Runs until `shutdown` resolves (then stops and returns `Ok`) or a part ends on its own
    /// (then stops and returns an error naming it).
    pub async fn run_until(
        mut self,
        shutdown: impl std::future::Future<Output = &'static str>,
    ) -> anyhow::Result<()> {
        let fault = tokio::select! {
            signal = shutdown => {
                tracing::info!(signal, "shutting down: no new pulls; finishing the deliveries in flight");
                None
            }
            (name, ended) = self.failed() => Some((name, ended)),
        };
        let stopped = self.stop().await;
        match fault {
            Some((name, ended)) => Err(anyhow::anyhow!("the {name} ended on its own ({ended})")),
            None => stopped,
        }
    }

    /// Stops every part (the consumer first: no new pulls, the deliveries in flight finish or
    /// roll back; the HTTP server last), then closes the pools.
    pub async fn stop(self) -> anyhow::Result<()> {
        self.ready.store(false, Ordering::Release);
        let faults = self.tasks.stop_all().await;
        self.ui_store.close().await;
        self.gate.store().close().await;
        self.store.close().await;
        match faults.as_slice() {
            [] => Ok(()),
            [(name, ended), ..] => Err(anyhow::anyhow!("the {name} did not stop cleanly ({ended})")),
        }
    }
}

/// The gate `settings` describe on `gate_store` (its own pool), ready for its first delivery:
/// made first, so that a route to no handler is refused before the database is written; then
/// the claim layout checked (or recorded) and Redis asked once, the layout's statements on
/// `store`, whose statements are not bounded. [`Application::build`] calls it.
pub async fn gate(
    settings: &Settings,
    store: &Store,
    gate_store: Store,
    handlers: Handlers,
    metrics: Option<Arc<Metrics>>,
) -> anyhow::Result<Gate> {
    let gate = assemble_gate(settings, gate_store, handlers, metrics)?;
    let layout =
        crate::layout::ensure(store, settings.dedup.shards, &settings.identity().instance_id).await?;
    // After the layout: the shard tables are checked too.
    if store.is_galera() {
        let ids = crate::store::galera::check(store.pool()).await?;
        tracing::info!(
            auto_increment_control = ids.control,
            increment = ids.increment,
            offset = ids.offset,
            cluster_size = ids.cluster_size,
            "the database is a Galera node: causal reads on every connection"
        );
        let flush = crate::store::galera::flush_log_at_trx_commit(store.pool()).await?;
        if flush != 1 {
            tracing::warn!(
                innodb_flush_log_at_trx_commit = flush,
                "the Galera node acknowledges commits before they are on disk: if the nodes crash within \
                 a second of each other, claims and effects already acknowledged to the broker are lost \
                 and never redelivered; set innodb_flush_log_at_trx_commit = 1 on every node (docs/galera.md)"
            );
        }
    }
    let gate = gate.with_layout(layout);
    if let Some(prefilter) = gate.prefilter()
        && prefilter.warm_up().await
    {
        tracing::info!(
            redis = %redact_url(&settings.redis.url), biz_types = ?settings.redis.biz_types,
            "the Redis pre-filter is on"
        );
    }
    Ok(gate)
}

/// The gate `settings` describe on `store`: every option of `[archive]`, `[redis]`, `[dedup]`,
/// `[group_commit]` and `[consumer]` that concerns a delivery is applied here and nowhere
/// else. Without [`gate`]'s preparation the layout is read on the first delivery and Redis is
/// first asked then: for tests that build a gate alone, through the same options.
pub fn assemble_gate(
    settings: &Settings,
    store: Store,
    handlers: Handlers,
    metrics: Option<Arc<Metrics>>,
) -> anyhow::Result<Gate> {
    let server = store.mysql_flavour().map_or(store.backend().name(), |f| f.name());
    let claim_path = crate::gate::ClaimPath::of(&store).describe();
    let mut gate =
        Gate::new(store, settings.routes(), handlers.clone(), settings.identity(), settings.policy())?
            .with_late_duplicate_guard(settings.archive.late_duplicate_guard);
    if settings.archive.late_duplicate_guard {
        tracing::info!("the late-duplicate guard is on: fresh claims are looked up in the archive");
    }
    if let Some(metrics) = metrics {
        gate = observed(gate, settings, &handlers, metrics);
    }
    let group = &settings.group_commit;
    if group.enabled {
        tracing::info!(
            max_batch = group.max_batch,
            linger_ms = group.linger_ms,
            in_flight = group.in_flight,
            server,
            claim = claim_path,
            "group commit is on"
        );
        gate = gate.with_group_commit(group.clone());
    }
    if settings.redis.enabled() {
        let prefilter = Prefilter::new(&settings.redis)
            .with_context(|| format!("redis.url {}", redact_url(&settings.redis.url)))?;
        gate = gate.with_prefilter(Arc::new(prefilter));
    }
    Ok(gate)
}

/// `gate` reporting its dispositions, groups and waits to `metrics`; on group commit's batch
/// path, every handler's fallbacks counted from 0.
fn observed(gate: Gate, settings: &Settings, handlers: &Handlers, metrics: Arc<Metrics>) -> Gate {
    if settings.group_commit.enabled && settings.group_commit.batch {
        metrics.start_group_fallbacks_at_zero(handlers.names());
    }
    gate.with_observer(metrics)
}

/// The database the settings name, opened and migrated: for the service and for a command run
/// by hand alike.
async fn open_store(settings: &Settings) -> anyhow::Result<Store> {
    Store::open(&settings.database.url, &settings.store_options())
        .await
        .with_context(|| format!("opening {}", redact_url(&settings.database.url)))
}

/// The gate's own pool (`database.max_connections`, its lock waits and statements bounded on the
/// server: `database.lock_timeout_ms`, `database.statement_timeout_ms`), apart from the pool of
/// the schedules, whose archive batches and reconcile reads may run longer.
async fn gate_store(settings: &Settings, store: &Store) -> anyhow::Result<Store> {
    own_pool(settings, store, &settings.gate_store_options()).await
}

/// The web UI's own pool (`http.max_connections`, statements bounded on the server), so that
/// pages never take the consumer's connections.
async fn ui_store(settings: &Settings, store: &Store) -> anyhow::Result<Store> {
    own_pool(settings, store, &settings.ui_store_options()).await
}

/// A pool of its own on the database of `store`, with `options`. An in-memory SQLite database
/// exists once per pool, so there it is `store` itself.
async fn own_pool(settings: &Settings, store: &Store, options: &StoreOptions) -> anyhow::Result<Store> {
    if store.is_in_memory() {
        return Ok(store.clone());
    }
    Ok(Store::connect(&settings.database.url, options).await?)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::handler::doing_nothing;
    use crate::route::RouteConfig;

    fn route(biz_type: &str) -> RouteConfig {
        RouteConfig {
            topic: "wallet".to_owned(),
            tags: biz_type.replace('.', "_"),
            biz_type: biz_type.to_owned(),
            biz_id: "keys".to_owned(),
            execute_time: None,
            handler: None,
        }
    }

    #[tokio::test]
    async fn a_route_to_no_handler_is_refused_once_by_the_gate_with_its_key_named() {
        let mut settings = Settings::default();
        let dir = tempfile::tempdir().expect("a temporary directory");
        settings.database.url = format!("sqlite://{}/idemgate.db?mode=rwc", dir.path().display());
        settings.http.bind = "127.0.0.1:0".to_owned();
        settings.consumer.group = "wallet_consumer".to_owned();
        settings.routes = vec![route("wallet.credit"), route("wallet.debit")];
        settings.validate_service().expect("the settings alone are fine: handlers are the gate's to check");
        let handlers = doing_nothing(&["wallet.credit"]);
        let err = match Application::build_with(&settings, handlers.clone(), Feed::Caller).await {
            Ok(_) => panic!("a route to no handler was accepted"),
            Err(e) => format!("{e:#}"),
        };
        assert_eq!(
            err,
            "configuration key routes[1].handler: no handler named \"wallet.debit\" (a route without \
             `handler` uses its biz_type); known handlers: wallet.credit"
        );
        settings.routes.pop();
        let app = Application::build_with(&settings, handlers, Feed::Caller)
            .await
            .expect("every route has its handler");
        assert_eq!(app.gate().routes().handler_names().count(), 1);
    }
}
