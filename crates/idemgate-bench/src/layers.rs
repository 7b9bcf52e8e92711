//! `idemgate-bench layers`: the defence layers side by side on one database in one run:
//! messages per second, latency, database statements and Redis commands per message, at a low
//! and a high share of duplicates, for
//! - the gate on the database alone (one claim table);
//! - the gate with the Redis pre-filter in front;
//! - the gate on sharded claim tables;
//! - the naive Redis pattern users write by hand: `SET NX EX`, then the business change in its
//!   own transaction, no dedup table behind it (and no undo of the key when the change fails).
//!
//! Every mode runs on a database of its own (a layout is fixed per database) and its books are
//! checked afterwards: one ledger row per key, none twice. Statements are counted from sqlx's
//! own per-statement events ([`idemgate::telemetry::count_statements`]), so BEGIN, COMMIT and
//! ROLLBACK count too.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use tokio::sync::Mutex;

use super::gate::{GROUP, books, reset, stream};
use super::{Percentiles, peak_rss_mib, rate};
use idemgate::delivery::Delivery;
use idemgate::gate::{Gate, Identity, Policy};
use idemgate::layout;
use idemgate::outcome::Outcome;
use idemgate::prefilter::{Prefilter, RedisSettings};
use idemgate::route::Routes;
use idemgate::store::{Backend, Store, StoreOptions, redact_url};
use idemgate_shop::{self as shop, DeductStock};
use idemgate_testkit::scratch::ScratchDb;

/// What to measure: the flags of `idemgate-bench layers`.
#[derive(Debug, Clone, clap::Args)]
pub struct Options {
    #[arg(long, value_delimiter = ',', default_value = "postgres,mysql")]
    pub backends: Vec<Backend>,
    #[arg(long, default_value_t = 20_000)]
    pub messages: usize,
    /// Shares of duplicates; one run of every mode per value.
    #[arg(long, value_delimiter = ',', default_value = "0.3,0.9")]
    pub duplicates: Vec<f64>,
    /// Deliveries in flight.
    #[arg(long, default_value_t = 8)]
    pub concurrency: usize,
    /// Claim tables of the sharded mode.
    #[arg(long, default_value_t = 16)]
    pub shards: u16,
    #[arg(long, env = "IDEMGATE_TEST_REDIS_URL", default_value = "redis://127.0.0.1:6379")]
    pub redis_url: String,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Mode {
    Database,
    Redis,
    Sharded,
    NaiveRedis,
}

impl Mode {
    pub(crate) const ALL: [Mode; 4] = [Mode::Database, Mode::Redis, Mode::Sharded, Mode::NaiveRedis];

    pub(crate) fn name(self) -> &'static str {
        match self {
            Mode::Database => "idemgate, database only",
            Mode::Redis => "idemgate, Redis + database",
            Mode::Sharded => "idemgate, sharded tables",
            Mode::NaiveRedis => "naive Redis SET NX, no dedup table",
        }
    }
}

/// One mode's run.
#[derive(Debug, Clone)]
pub(crate) struct RunReport {
    pub backend: Backend,
    pub mode: Mode,
    pub duplicates: f64,
    pub messages: usize,
    pub elapsed: Duration,
    pub latency: Percentiles,
    pub statements: u64,
    pub redis_commands: u64,
    /// Duplicates stopped before the database (Redis hits).
    pub stopped_by_redis: usize,
    pub applied: i64,
    pub double_applied: i64,
    pub distinct: usize,
    pub peak_rss_mib: f64,
}

impl RunReport {
    pub(crate) fn rate(&self) -> f64 {
        rate(self.messages, self.elapsed)
    }

    fn per_message(&self, n: u64) -> f64 {
        n as f64 / self.messages.max(1) as f64
    }
}

/// `idemgate-bench layers`: prints the setting, runs every backend, share of duplicates and
/// mode, and prints the table.
pub(crate) async fn command(options: Options) -> anyhow::Result<()> {
    println!(
        "bench layers: {} stock.deduct messages, {} in flight, {} shards, Redis at {}, {} cores",
        options.messages,
        options.concurrency,
        options.shards,
        redact_url(&options.redis_url),
        super::cores()
    );
    let reports = run(&options, |r| {
        eprintln!("  {} {:.0}% {}: {:.0} msg/s", r.backend, r.duplicates * 100.0, r.mode.name(), r.rate())
    })
    .await?;
    println!("\n{}", table(&reports));
    Ok(())
}

/// Runs every backend, share of duplicates and mode; calls `report` after each run.
pub(crate) async fn run(
    options: &Options,
    mut report: impl FnMut(&RunReport),
) -> anyhow::Result<Vec<RunReport>> {
    let store_options =
        StoreOptions { max_connections: options.concurrency as u32 + 4, ..Default::default() };
    let mut all = Vec::new();
    for &backend in &options.backends {
        for &duplicates in &options.duplicates {
            let (stream, distinct) = stream(options.messages, duplicates, 42);
            let stream = Arc::new(stream);
            for mode in Mode::ALL {
                let db = ScratchDb::create(backend, &store_options).await?;
                let r = run_mode(&db.store, mode, options, &stream).await;
                let (applied, double_applied) = books(&db.store).await?;
                db.drop_now().await;
                let (elapsed, latency, statements, redis_commands, stopped_by_redis) = r?;
                let r = RunReport {
                    backend,
                    mode,
                    duplicates,
                    messages: stream.len(),
                    elapsed,
                    latency,
                    statements,
                    redis_commands,
                    stopped_by_redis,
                    applied,
                    double_applied,
                    distinct,
                    peak_rss_mib: peak_rss_mib(),
                };
                if applied != distinct as i64 || double_applied != 0 {
                    anyhow::bail!(
                        "{} applied {applied} effects for {distinct} keys ({double_applied} twice) on {backend}",
                        mode.name()
                    );
                }
                report(&r);
                all.push(r);
            }
        }
    }
    Ok(all)
}

type Measured = (Duration, Percentiles, u64, u64, usize);

async fn run_mode(
    store: &Store,
    mode: Mode,
    o: &Options,
    stream: &Arc<Vec<Delivery>>,
) -> anyhow::Result<Measured> {
    let shards = if mode == Mode::Sharded { o.shards } else { 0 };
    layout::ensure(store, shards, "bench").await?;
    reset(store).await?;
    let redis_settings = RedisSettings {
        url: o.redis_url.clone(),
        key_prefix: format!("idemgate-bench-{:016x}", rand::random::<u64>()),
        timeout_ms: 100,
        ..Default::default()
    };
    let prefilter = Arc::new(Prefilter::new(&redis_settings)?);
    let mut gate = Gate::new(
        store.clone(),
        Routes::new(&shop::routes(shop::TOPIC))?,
        shop::handlers(),
        Identity { consumer_group: GROUP.to_owned(), instance_id: "bench".to_owned() },
        Policy { duplicate_warnings_per_second: 0, ..Policy::default() },
    )?;
    if mode == Mode::Redis {
        gate = gate.with_prefilter(prefilter.clone());
    }
    let naive = match mode {
        Mode::NaiveRedis => {
            Some(Arc::new(NaiveRedis::connect(&o.redis_url, &redis_settings.key_prefix).await?))
        }
        _ => None,
    };
    if mode == Mode::Redis && !prefilter.warm_up().await {
        anyhow::bail!("Redis at {} does not answer", idemgate::store::redact_url(&o.redis_url));
    }
    let gate = Arc::new(gate);
    let next = Arc::new(AtomicUsize::new(0));
    let stopped = Arc::new(AtomicUsize::new(0));
    let latencies = Arc::new(Mutex::new(Vec::with_capacity(stream.len())));
    idemgate::telemetry::count_statements(true);
    let statements_before = idemgate::telemetry::statements_counted();
    let started = Instant::now();
    let mut workers = Vec::new();
    for _ in 0..o.concurrency {
        let (gate, store, stream, next, stopped, latencies, naive) = (
            gate.clone(),
            store.clone(),
            stream.clone(),
            next.clone(),
            stopped.clone(),
            latencies.clone(),
            naive.clone(),
        );
        workers.push(tokio::spawn(async move {
            let mut mine = Vec::new();
            loop {
                let i = next.fetch_add(1, Ordering::Relaxed);
                let Some(d) = stream.get(i) else { break };
                let t = Instant::now();
                match &naive {
                    Some(n) => n.process(&store, d).await?,
                    None => {
                        let r = gate.process(d).await;
                        if !matches!(r.outcome, Outcome::Processed | Outcome::Duplicate) {
                            anyhow::bail!("{}: {:?} {:?}", d.msg_id, r.outcome, r.error);
                        }
                        if r.layer == Some(idemgate::outcome::Layer::Redis) {
                            stopped.fetch_add(1, Ordering::Relaxed);
                        }
                    }
                }
                mine.push(t.elapsed().as_micros() as u64);
            }
            latencies.lock().await.extend(mine);
            Ok(())
        }));
    }
    for w in workers {
        w.await??;
    }
    let elapsed = started.elapsed();
    idemgate::telemetry::count_statements(false);
    let statements = idemgate::telemetry::statements_counted() - statements_before;
    let redis_commands = match (&naive, mode) {
        (Some(n), _) => n.commands.load(Ordering::Relaxed),
        (None, Mode::Redis) => prefilter.commands_sent(),
        _ => 0,
    };
    let latency = Percentiles::of(&mut latencies.lock().await);
    Ok((elapsed, latency, statements, redis_commands, stopped.load(Ordering::Relaxed)))
}

/// The seeds' naive Redis pattern: `SET key 1 NX EX ttl`; if it was set, apply the change in a
/// transaction; if it was there, skip. Nothing in the database remembers the key, and a failed
/// change leaves the key behind, so the broker's retry is skipped as a "duplicate".
struct NaiveRedis {
    conn: redis::aio::MultiplexedConnection,
    prefix: String,
    commands: AtomicU64,
}

impl NaiveRedis {
    async fn connect(url: &str, prefix: &str) -> anyhow::Result<Self> {
        let conn = redis::Client::open(url)?.get_multiplexed_async_connection().await?;
        Ok(Self { conn, prefix: prefix.to_owned(), commands: AtomicU64::new(0) })
    }

    async fn process(&self, store: &Store, d: &Delivery) -> anyhow::Result<()> {
        let biz_id = d.keys.first().map(String::as_str).unwrap_or("");
        let mut conn = self.conn.clone();
        self.commands.fetch_add(1, Ordering::Relaxed);
        let set: Option<String> = redis::cmd("SET")
            .arg(format!("{}:{biz_id}", self.prefix))
            .arg(1)
            .arg("NX")
            .arg("EX")
            .arg(600)
            .query_async(&mut conn)
            .await?;
        if set.is_none() {
            return Ok(());
        }
        let body: DeductStock = serde_json::from_slice(&d.body)?;
        let mut tx = store.begin().await?;
        super::gate::deduct(store, &mut tx, biz_id, &body, idemgate::clock::now_ms()).await?;
        tx.commit().await?;
        Ok(())
    }
}

/// The runs as a Markdown table.
pub(crate) fn table(reports: &[RunReport]) -> String {
    let mut out = String::from(
        "| backend | duplicates | mode | msg/s | × database only | p50 ms | p99 ms | SQL statements / msg | Redis commands / msg | stopped by Redis | effects (keys) | applied twice | peak RSS MiB |\n\
         |---|---|---|---|---|---|---|---|---|---|---|---|---|\n",
    );
    for r in reports {
        let base = reports
            .iter()
            .find(|b| b.backend == r.backend && b.duplicates == r.duplicates && b.mode == Mode::Database)
            .map_or(1.0, RunReport::rate);
        out.push_str(&format!(
            "| {} | {:.0}% | {} | {:.0} | {:.2} | {:.2} | {:.2} | {:.2} | {:.2} | {} | {} ({}) | {} | {:.0} |\n",
            r.backend,
            r.duplicates * 100.0,
            r.mode.name(),
            r.rate(),
            r.rate() / base,
            r.latency.p50_us as f64 / 1000.0,
            r.latency.p99_us as f64 / 1000.0,
            r.per_message(r.statements),
            r.per_message(r.redis_commands),
            r.stopped_by_redis,
            r.applied,
            r.distinct,
            r.double_applied,
            r.peak_rss_mib
        ));
    }
    out
}
