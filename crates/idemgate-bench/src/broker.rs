//! `idemgate-bench broker`: end-to-end messages per second from a real broker (RocketMQ,
//! RabbitMQ or Kafka: `--kind`) into PostgreSQL or MariaDB, for a stream of `stock.deduct`
//! messages with a share of duplicates.
//!
//! The topic is loaded once (on RabbitMQ, into one queue per mode, each bound to the exchange
//! before the load); then each mode consumes all of it under a consumer group of its own: the client acking with no database work (the ceiling), the naive per-message pattern,
//! idemgate with its sized client runtime, and idemgate on the client's default runtime. The
//! rate is taken from the first delivery to the moment every message has been seen once.
//! Redeliveries that
//! the consumer never asked for are the client's own (listener calls refused with
//! `runtime.capacity.exhausted`, or timed out), and are reported.

use std::collections::HashSet;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::Context;
use async_trait::async_trait;

use super::{peak_rss_mib, rate};
use idemgate::broker::{
    BrokerKind, BrokerSettings, Brokers as Clients, ClientHost, Consumer, KafkaSettings, RabbitMqSettings,
    RocketMqSettings, StartFrom, Subscriber,
};
use idemgate::broker::{Limits, Sink, Subscription};
use idemgate::delivery::Delivery;
use idemgate::gate::{Gate, GroupSettings, Identity, Phases, Policy};
use idemgate::outcome::Verdict;
use idemgate::route::Routes;
use idemgate::store::{Backend, Store, StoreOptions};
use idemgate_shop as shop;
use idemgate_testkit::broker::LocalBroker;
use idemgate_testkit::kafka::LocalKafka;
use idemgate_testkit::scratch::ScratchDb;

/// The property that numbers the benchmark's messages.
const SEQ: &str = "BENCH_SEQ";

/// What to measure: the flags of `idemgate-bench broker`.
#[derive(Debug, Clone, clap::Args)]
pub struct Options {
    /// The broker: rocketmq, rabbitmq or kafka.
    #[arg(long, default_value = "rocketmq")]
    pub kind: String,
    /// RabbitMQ's URL, with `--kind rabbitmq`.
    #[arg(long, default_value = "amqp://guest:guest@127.0.0.1:5672/%2f")]
    pub rabbitmq_url: String,
    /// Running Kafka brokers, with `--kind kafka`; without them a private tansu is started
    /// (scripts/install-tansu.sh installs it).
    #[arg(long)]
    pub bootstrap_servers: Option<String>,
    /// A running name server; without it a private broker is started (scripts/install-rocketmq.sh
    /// installs the binaries).
    #[arg(long)]
    pub name_server: Option<String>,
    #[arg(long, default_value_t = 10000)]
    pub messages: usize,
    #[arg(long, default_value_t = 0.3)]
    pub duplicates: f64,
    // Consume threads of the per-message modes.
    #[arg(long, default_value_t = 8)]
    pub consume_threads: u32,
    /// The database: postgres or mysql.
    #[arg(long, default_value = "postgres")]
    pub backend: String,
    /// Consume threads of the group-commit run.
    // Enough deliveries in flight to fill its groups.
    #[arg(long, default_value_t = 4)]
    pub group_threads: u32,
    /// Messages per listener call in the group-commit run (1 to 32), handed to the gate at once.
    #[arg(long, default_value_t = 32)]
    pub group_listener_batch: u32,
    /// Deliveries per group transaction (1 to 64).
    #[arg(long, default_value_t = 32)]
    pub max_batch: usize,
    #[arg(long, default_value_t = 2)]
    pub linger_ms: u64,
    /// Groups committing at once.
    #[arg(long, default_value_t = 2)]
    pub in_flight: usize,
    /// Also run idemgate on the client's default runtime.
    // Slow: the client refuses most calls.
    #[arg(long)]
    pub client_defaults: bool,
}

impl Options {
    /// The broker `--kind` names.
    pub fn kind(&self) -> anyhow::Result<BrokerKind> {
        BrokerKind::parse(&self.kind).with_context(|| {
            format!("bench broker: --kind is rocketmq, rabbitmq or kafka, not {:?}", self.kind)
        })
    }

    /// The database, which must be a server: PostgreSQL or MySQL.
    pub fn backend(&self) -> anyhow::Result<Backend> {
        let backend: Backend = self.backend.parse()?;
        anyhow::ensure!(backend != Backend::Sqlite, "bench broker: --backend is postgres or mysql");
        Ok(backend)
    }

    /// Messages per listener call in the group-commit mode, 1 to 32.
    pub fn listener_batch(&self) -> u32 {
        self.group_listener_batch.clamp(1, 32)
    }

    /// The group commit of the group-commit mode, its queue four times the deliveries its
    /// consume threads hold at once.
    pub fn group(&self) -> GroupSettings {
        GroupSettings {
            enabled: true,
            max_batch: self.max_batch,
            linger_ms: self.linger_ms,
            in_flight: self.in_flight.max(1),
            queue: 4 * (self.group_threads * self.listener_batch()) as usize,
            batch: true,
        }
    }
}

/// `idemgate-bench broker`: checks the flags, prints the setting, runs every mode and prints
/// the table.
pub(crate) async fn command(options: Options) -> anyhow::Result<()> {
    let backend = options.backend()?;
    let kind = options.kind()?;
    anyhow::ensure!(
        kind == BrokerKind::RocketMq || !options.client_defaults,
        "bench broker: --client-defaults is RocketMQ's client runtime"
    );
    anyhow::ensure!(
        (1..=idemgate::gate::MAX_BATCH).contains(&options.max_batch),
        "bench broker: --max-batch is 1 to {}",
        idemgate::gate::MAX_BATCH
    );
    super::share("duplicates", options.duplicates, 0.9)?;
    let group = options.group();
    println!(
        "bench broker: {} stock.deduct messages, {:.0}% duplicates, {} -> {backend}, {} cores; group commit: {} threads × {} messages per call, max_batch {}, linger {} ms, {} in flight",
        options.messages,
        options.duplicates * 100.0,
        kind.as_str(),
        super::cores(),
        options.group_threads,
        options.listener_batch(),
        group.max_batch,
        group.linger_ms,
        group.in_flight,
    );
    let runs = run(&options, |r| eprintln!("  {}: {:.0} msg/s", r.mode, r.rate())).await?;
    println!("\n{}", table(&runs));
    Ok(())
}

#[derive(Debug, Clone)]
pub(crate) struct Run {
    pub mode: &'static str,
    pub consume_threads: u32,
    /// Messages per listener call.
    pub listener_batch: u32,
    pub messages: usize,
    pub elapsed: Duration,
    pub deliveries: u64,
    /// Deliveries answered with a retry (naive errors).
    pub retries_asked: u64,
    /// Redeliveries seen before the run ended that the consumer asked for, and the ones it
    /// did not ask for (the client's own).
    pub asked_redeliveries: u64,
    pub unasked_redeliveries: u64,
    pub effects: i64,
    pub double_applied: i64,
    /// Peak RSS during this mode alone.
    pub peak_rss_mib: f64,
    /// Where a gate's time went, per delivery, when the mode runs the gate.
    pub profile: Option<Profile>,
}

/// The gate's time per delivery, in microseconds: a group's shared phases divided among its
/// deliveries, so that the figures add up to the database time one message costs.
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct Profile {
    pub begin_us: f64,
    pub claim_us: f64,
    pub handler_us: f64,
    pub lookup_us: f64,
    pub log_us: f64,
    pub commit_us: f64,
    /// Deliveries per transaction, on average.
    pub group_size: f64,
}

impl Run {
    pub(crate) fn rate(&self) -> f64 {
        rate(self.messages, self.elapsed)
    }
}

/// Counts first attempts, remembers when the first delivery came, and tells the redeliveries
/// this consumer asked for from the ones the client made on its own.
struct Timed<S> {
    inner: S,
    first: Mutex<Option<Instant>>,
    /// When the last message of the topic was seen for the first time.
    last_new: Mutex<Option<Instant>>,
    /// The `BENCH_SEQ` of every message seen, on any attempt: a listener call the client
    /// refused never reaches the sink, so a message may first arrive as a redelivery.
    seen: Mutex<HashSet<String>>,
    seen_count: AtomicUsize,
    /// UNIQ_KEYs answered with a retry.
    asked: Mutex<HashSet<String>>,
    asked_redeliveries: AtomicU64,
    unasked_redeliveries: AtomicU64,
    /// Deliveries handed over, and those answered with a retry.
    deliveries: AtomicU64,
    retries: AtomicU64,
}

impl<S> Timed<S> {
    fn new(inner: S) -> Self {
        Self {
            inner,
            first: Mutex::new(None),
            last_new: Mutex::new(None),
            seen: Mutex::new(HashSet::new()),
            seen_count: AtomicUsize::new(0),
            asked: Mutex::new(HashSet::new()),
            asked_redeliveries: AtomicU64::new(0),
            unasked_redeliveries: AtomicU64::new(0),
            deliveries: AtomicU64::new(0),
            retries: AtomicU64::new(0),
        }
    }
}

#[async_trait]
impl<S: Sink> Sink for Timed<S> {
    fn takes_batches(&self) -> bool {
        self.inner.takes_batches()
    }

    async fn consume(&self, d: &Delivery, began: Instant) -> Verdict {
        self.first.lock().unwrap_or_else(|p| p.into_inner()).get_or_insert_with(Instant::now);
        if d.reconsume_times > 0 {
            let asked = self.asked.lock().unwrap_or_else(|p| p.into_inner()).contains(&d.uniq_key);
            let counter = if asked { &self.asked_redeliveries } else { &self.unasked_redeliveries };
            counter.fetch_add(1, Ordering::Relaxed);
        }
        let verdict = self.inner.consume(d, began).await;
        self.deliveries.fetch_add(1, Ordering::Relaxed);
        if verdict == Verdict::Retry {
            self.retries.fetch_add(1, Ordering::Relaxed);
            self.asked.lock().unwrap_or_else(|p| p.into_inner()).insert(d.uniq_key.clone());
        }
        let seq = d.property(SEQ).unwrap_or_default().to_owned();
        if self.seen.lock().unwrap_or_else(|p| p.into_inner()).insert(seq) {
            self.seen_count.fetch_add(1, Ordering::Relaxed);
            *self.last_new.lock().unwrap_or_else(|p| p.into_inner()) = Some(Instant::now());
        }
        verdict
    }
}

/// The gate, adding up where each delivery's time went.
struct Profiled {
    gate: Arc<Gate>,
    totals: Mutex<(Phases, f64, u64)>,
}

#[async_trait]
impl Sink for Profiled {
    async fn consume(&self, d: &Delivery, began: Instant) -> Verdict {
        let r = self.gate.process_since(d, began).await;
        let mut totals = self.totals.lock().unwrap_or_else(|p| p.into_inner());
        totals.0.add(&r.phases.per_delivery());
        totals.1 += f64::from(r.phases.group_size.max(1));
        totals.2 += 1;
        r.verdict
    }

    fn takes_batches(&self) -> bool {
        self.gate.takes_batches()
    }
}

impl Profiled {
    fn profile(&self) -> Profile {
        let (p, sizes, n) = *self.totals.lock().unwrap_or_else(|p| p.into_inner());
        let n = n.max(1) as f64;
        Profile {
            begin_us: p.begin_us as f64 / n,
            claim_us: p.claim_us as f64 / n,
            handler_us: p.handler_us as f64 / n,
            lookup_us: p.lookup_us as f64 / n,
            log_us: p.log_us as f64 / n,
            commit_us: p.commit_us as f64 / n,
            group_size: sizes / n,
        }
    }
}

/// The "handler alone" baseline ([`super::gate::HandlerAlone`]): deliveries batched by the
/// same committer as group commit, through the handler's batch form alone.
struct Alone(idemgate::gate::Committer);

#[async_trait]
impl Sink for Alone {
    async fn consume(&self, d: &Delivery, began: Instant) -> Verdict {
        self.0.submit(d.clone(), began + Limits::ROCKETMQ.answer_within).await.verdict
    }

    fn takes_batches(&self) -> bool {
        true
    }
}

struct AckOnly;

#[async_trait]
impl Sink for AckOnly {
    async fn consume(&self, _: &Delivery, _: Instant) -> Verdict {
        Verdict::Ack
    }
}

struct Naive(Store);

#[async_trait]
impl Sink for Naive {
    async fn consume(&self, d: &Delivery, _: Instant) -> Verdict {
        match super::gate::naive(&self.0, d).await {
            Ok(()) => Verdict::Ack,
            Err(_) => Verdict::Retry,
        }
    }
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum Mode {
    AckOnly,
    Naive,
    Gate,
    /// Group commit with `batch = false`: a savepoint per delivery.
    GroupCommitPerDelivery,
    /// Group commit on the batch path.
    GroupCommit,
    /// The batch path with a key allowed in two groups in flight at once.
    GroupCommitUndeferred,
    HandlerAlone,
    GateClientDefaults,
}

impl Mode {
    fn name(self) -> &'static str {
        match self {
            Self::AckOnly => "ack only, no database",
            Self::Naive => "naive select-then-insert",
            Self::Gate => "idemgate, one transaction per message",
            Self::GroupCommitPerDelivery => super::gate::GROUP_COMMIT_PER_DELIVERY,
            Self::GroupCommit => super::gate::GROUP_COMMIT_BATCHED,
            Self::GroupCommitUndeferred => super::gate::GROUP_COMMIT_UNDEFERRED,
            Self::HandlerAlone => super::gate::HANDLER_ALONE,
            Self::GateClientDefaults => "idemgate, client's default runtime",
        }
    }

    /// Whether the mode hands a listener call's messages over at once, to be grouped.
    fn grouped(self) -> bool {
        matches!(
            self,
            Self::GroupCommitPerDelivery
                | Self::GroupCommit
                | Self::GroupCommitUndeferred
                | Self::HandlerAlone
        )
    }
}

/// The brokers a run reaches: a private RocketMQ broker or tansu unless one is named.
struct Brokers {
    owned: Clients,
    _rocketmq: Option<LocalBroker>,
    _kafka: Option<LocalKafka>,
}

async fn brokers(options: &Options) -> anyhow::Result<Brokers> {
    let kind = options.kind()?;
    let mut owned = Clients {
        broker: BrokerSettings { kind, ..BrokerSettings::default() },
        rocketmq: RocketMqSettings {
            producer_group: "idemgate_bench_producer".to_owned(),
            ..RocketMqSettings::default()
        },
        rabbitmq: RabbitMqSettings {
            url: options.rabbitmq_url.clone(),
            prefetch: 256,
            ..RabbitMqSettings::default()
        },
        kafka: KafkaSettings { max_poll_records: 256, ..KafkaSettings::default() },
    };
    let (mut rocketmq, mut kafka) = (None, None);
    match kind {
        BrokerKind::RocketMq => {
            owned.rocketmq.name_server = match &options.name_server {
                Some(n) => n.clone(),
                None => {
                    let local = tokio::task::spawn_blocking(LocalBroker::start).await??;
                    let name_server = local.name_server().to_owned();
                    rocketmq = Some(local);
                    name_server
                }
            };
        }
        BrokerKind::Kafka => {
            owned.kafka.bootstrap_servers = match &options.bootstrap_servers {
                Some(b) => b.clone(),
                None => {
                    let local = tokio::task::spawn_blocking(LocalKafka::start).await??;
                    let bootstrap = local.bootstrap().to_owned();
                    kafka = Some(local);
                    bootstrap
                }
            };
        }
        BrokerKind::RabbitMq => {}
    }
    Ok(Brokers { owned, _rocketmq: rocketmq, _kafka: kafka })
}

pub(crate) async fn run(options: &Options, mut report: impl FnMut(&Run)) -> anyhow::Result<Vec<Run>> {
    let brokers = brokers(options).await?;
    let kind = brokers.owned.kind();
    let backend = options.backend()?;
    let threads = options.consume_threads.max(20).max(options.group_threads * options.listener_batch());
    let db = ScratchDb::create(backend, &StoreOptions { max_connections: threads + 4, ..Default::default() })
        .await?;
    let topic = format!("bench_{}", idemgate_shop::traffic::run_id());
    let (mut stream, distinct) = super::gate::stream(options.messages, options.duplicates, 7);
    for (i, d) in stream.iter_mut().enumerate() {
        d.topic = topic.clone();
        d.properties.insert(SEQ.to_owned(), i.to_string());
    }

    let mut modes = vec![
        Mode::AckOnly,
        Mode::Naive,
        Mode::Gate,
        Mode::GroupCommitPerDelivery,
        Mode::GroupCommitUndeferred,
        Mode::GroupCommit,
        Mode::HandlerAlone,
    ];
    if options.client_defaults {
        modes.push(Mode::GateClientDefaults);
    }
    let run_id = idemgate_shop::traffic::run_id();
    let group_of = |mode: Mode| format!("bench_{}_{run_id}", mode as u8);
    if kind == BrokerKind::RabbitMq {
        // RabbitMQ keeps a message only in the queues bound when it is published.
        for mode in &modes {
            idemgate::broker::rabbitmq::declare_group(
                &brokers.owned.rabbitmq,
                &group_of(*mode),
                &[(topic.clone(), "*".to_owned())],
            )
            .await?;
        }
    }
    let producer = brokers.owned.publisher().await?;
    let started = Instant::now();
    for d in &stream {
        producer.publish(d).await?;
    }
    let load = started.elapsed();
    producer.shutdown().await;
    eprintln!(
        "  loaded {} messages in {:.1} s ({:.0}/s)",
        stream.len(),
        load.as_secs_f64(),
        rate(stream.len(), load)
    );

    let mut runs = Vec::new();
    for mode in modes {
        super::gate::reset(&db.store).await?;
        super::reset_peak_rss();
        let group = group_of(mode);
        let consume_threads = match mode {
            Mode::GateClientDefaults => 20,
            // RabbitMQ and Kafka hand each delivery over on its own: a grouped mode has as many
            // in flight as RocketMQ's threads × messages per call.
            m if m.grouped() && kind != BrokerKind::RocketMq => {
                options.group_threads * options.listener_batch()
            }
            m if m.grouped() => options.group_threads,
            _ => options.consume_threads,
        };
        let mut gate = Gate::new(
            db.store.clone(),
            Routes::new(&shop::routes(&topic))?,
            shop::handlers(),
            Identity { consumer_group: group.clone(), instance_id: "bench".to_owned() },
            Policy { duplicate_warnings_per_second: 0, ..Policy::default() },
        )?;
        match mode {
            Mode::GroupCommit => gate = gate.with_group_commit(options.group()),
            Mode::GroupCommitUndeferred => {
                gate = gate.with_group_commit(options.group()).without_key_deferral()
            }
            Mode::GroupCommitPerDelivery => {
                gate = gate.with_group_commit(GroupSettings { batch: false, ..options.group() })
            }
            _ => {}
        }
        let profiled = Arc::new(Profiled { gate: Arc::new(gate), totals: Mutex::default() });
        let timed: Arc<Timed<Arc<dyn Sink>>> = Arc::new(Timed::new(match mode {
            Mode::AckOnly => Arc::new(AckOnly) as Arc<dyn Sink>,
            Mode::Naive => Arc::new(Naive(db.store.clone())),
            Mode::HandlerAlone => Arc::new(Alone(super::gate::HandlerAlone::committer(
                db.store.clone(),
                &topic,
                &options.group(),
            )?)),
            Mode::Gate
            | Mode::GroupCommitPerDelivery
            | Mode::GroupCommit
            | Mode::GroupCommitUndeferred
            | Mode::GateClientDefaults => profiled.clone(),
        }));
        let subscription = Subscription {
            group: group.clone(),
            topics: vec![(topic.clone(), "*".to_owned())],
            max_reconsume_times: 16,
            record: None,
        };
        let consumer_options = RocketMqSettings {
            batch_size: if mode.grouped() && kind == BrokerKind::RocketMq {
                options.listener_batch()
            } else {
                1
            },
            ..brokers.owned.rocketmq.clone()
        };
        let consumer: Box<dyn Subscriber> = match kind {
            BrokerKind::RocketMq => {
                let host = match mode {
                    Mode::GateClientDefaults => ClientHost::with_client_defaults("bench")?,
                    _ => ClientHost::new("bench", consume_threads as usize)?,
                };
                Box::new(
                    Consumer::start_with(
                        timed.clone(),
                        &subscription,
                        &consumer_options,
                        consume_threads,
                        StartFrom::First,
                        host,
                    )
                    .await?,
                )
            }
            _ => {
                let mut clients = brokers.owned.clone();
                clients.broker.consume_threads = consume_threads;
                clients.broker.start_from = StartFrom::First;
                clients.subscribe(timed.clone(), &subscription).await?
            }
        };
        let deadline = Instant::now() + Duration::from_secs(600);
        while timed.seen_count.load(Ordering::Relaxed) < stream.len() {
            anyhow::ensure!(
                Instant::now() < deadline,
                "{} did not consume the topic within 10 minutes",
                mode.name()
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        consumer.shutdown().await;
        if kind == BrokerKind::RabbitMq {
            idemgate_testkit::rabbitmq::remove_with(&brokers.owned.rabbitmq.url, &group, &[]).await?;
        }
        let first = timed.first.lock().unwrap_or_else(|p| p.into_inner()).context("a first delivery")?;
        let last = timed.last_new.lock().unwrap_or_else(|p| p.into_inner()).context("a last delivery")?;
        let (effects, double_applied) =
            if mode == Mode::AckOnly { (0, 0) } else { super::gate::books(&db.store).await? };
        // A mode that applied less than every key did not do the work its rate claims (the
        // handler alone applies every copy, so at least as many).
        anyhow::ensure!(
            mode == Mode::AckOnly || effects >= distinct as i64,
            "{}: {effects} effects for {distinct} keys; its rate would not be the rate of this work",
            mode.name()
        );
        let r = Run {
            mode: mode.name(),
            consume_threads,
            listener_batch: consumer_options.batch_size,
            messages: stream.len(),
            elapsed: last - first,
            deliveries: timed.deliveries.load(Ordering::Relaxed),
            retries_asked: timed.retries.load(Ordering::Relaxed),
            asked_redeliveries: timed.asked_redeliveries.load(Ordering::Relaxed),
            unasked_redeliveries: timed.unasked_redeliveries.load(Ordering::Relaxed),
            effects,
            double_applied,
            peak_rss_mib: peak_rss_mib(),
            profile: matches!(
                mode,
                Mode::Gate
                    | Mode::GroupCommitPerDelivery
                    | Mode::GroupCommit
                    | Mode::GroupCommitUndeferred
                    | Mode::GateClientDefaults
            )
            .then(|| profiled.profile()),
        };
        report(&r);
        runs.push(r);
    }

    super::gate::reset(&db.store).await?;
    super::reset_peak_rss();
    let started = Instant::now();
    let group = options.group();
    raw_batched_inserts(&db.store, options.messages, group.max_batch, group.in_flight).await?;
    let r = Run {
        mode: "raw batched insert, no broker, no handler",
        consume_threads: 0,
        listener_batch: 0,
        messages: options.messages,
        elapsed: started.elapsed(),
        deliveries: 0,
        retries_asked: 0,
        asked_redeliveries: 0,
        unasked_redeliveries: 0,
        effects: 0,
        double_applied: 0,
        peak_rss_mib: peak_rss_mib(),
        profile: None,
    };
    report(&r);
    runs.push(r);
    db.drop_now().await;
    if kind == BrokerKind::RabbitMq {
        idemgate_testkit::rabbitmq::remove_with(&brokers.owned.rabbitmq.url, "", &[topic.as_str()]).await?;
    }
    drop(brokers);
    Ok(runs)
}

/// The database's own limit for this many rows: claim-shaped rows inserted `batch` to a
/// statement and a commit, from `connections` connections at once. No broker, no handler, no
/// duplicates: what one durable row per message costs when commits are shared.
async fn raw_batched_inserts(
    store: &Store,
    rows: usize,
    batch: usize,
    connections: usize,
) -> anyhow::Result<()> {
    let next = Arc::new(AtomicUsize::new(0));
    let mut workers = Vec::new();
    for _ in 0..connections.max(1) {
        let (store, next) = (store.clone(), next.clone());
        workers.push(tokio::spawn(async move {
            loop {
                let from = next.fetch_add(batch, Ordering::Relaxed);
                if from >= rows {
                    return Ok::<_, sqlx::Error>(());
                }
                let n = batch.min(rows - from);
                let sql = format!(
                    "INSERT INTO idempotent_record (consumer_group, biz_type, biz_id, execute_time, msg_id, \
                     uniq_key, payload_hash, instance_id, claimed_at_ms) VALUES {}",
                    idemgate::store::values_list(9, n)
                );
                let mut q = idemgate::store::query_built(store.backend(), sql);
                for i in from..from + n {
                    q = q
                        .bind("raw")
                        .bind("stock.deduct")
                        .bind(format!("RAW-{i}"))
                        .bind(0i64)
                        .bind(format!("M-{i}"))
                        .bind(format!("U-{i}"))
                        .bind("0".repeat(64))
                        .bind("bench")
                        .bind(idemgate::clock::now_ms());
                }
                let mut tx = store.begin().await?;
                q.execute(&mut *tx).await?;
                tx.commit().await?;
            }
        }));
    }
    for w in workers {
        w.await??;
    }
    Ok(())
}

pub(crate) fn table(runs: &[Run]) -> String {
    let rate_of = |mode: Mode| runs.iter().find(|r| r.mode == mode.name()).map(Run::rate);
    let (naive, alone) = (rate_of(Mode::Naive), rate_of(Mode::HandlerAlone));
    let mut out = String::from(
        "| mode | consume threads × messages per call | msg/s | × naive | × handler alone | deliveries | retries asked | redeliveries asked | redeliveries not asked | effects | applied twice | peak RSS MiB |\n\
         |---|---|---|---|---|---|---|---|---|---|---|---|\n",
    );
    for r in runs {
        out.push_str(&format!(
            "| {} | {} | {:.0} | {} | {} | {} | {} | {} | {} | {} | {} | {:.0} |\n",
            r.mode,
            match r.consume_threads {
                0 => "–".to_owned(),
                t => format!("{t} × {}", r.listener_batch),
            },
            r.rate(),
            naive.map_or("".to_owned(), |n| format!("{:.2}", r.rate() / n)),
            alone.map_or("".to_owned(), |a| format!("{:.2}", r.rate() / a)),
            r.deliveries,
            r.retries_asked,
            r.asked_redeliveries,
            r.unasked_redeliveries,
            r.effects,
            r.double_applied,
            r.peak_rss_mib
        ));
    }
    let profiled: Vec<&Run> = runs.iter().filter(|r| r.profile.is_some()).collect();
    if !profiled.is_empty() {
        out.push_str(
            "\nWhere the gate's time goes, µs per message (a group's shared work divided among its deliveries):\n\n\
             | mode | deliveries per transaction | begin | claim | handler | read earlier claims | log row | commit | total |\n\
             |---|---|---|---|---|---|---|---|---|\n",
        );
        for r in profiled {
            let p = r.profile.unwrap_or_default();
            let total = p.begin_us + p.claim_us + p.handler_us + p.lookup_us + p.log_us + p.commit_us;
            out.push_str(&format!(
                "| {} | {:.1} | {:.0} | {:.0} | {:.0} | {:.0} | {:.0} | {:.0} | {:.0} |\n",
                r.mode,
                p.group_size,
                p.begin_us,
                p.claim_us,
                p.handler_us,
                p.lookup_us,
                p.log_us,
                p.commit_us,
                total
            ));
        }
    }
    out
}
