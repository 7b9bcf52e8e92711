//! `idemgate-bench archive`: how fast a run moves expired claims to the archive, what it does
//! to the consumers' latency while it runs, and what the late-duplicate guard costs.
//!
//! On a scratch database per backend: bulk-load expired claims (one INSERT … SELECT from a
//! generated series), archive them with nothing else running; measure the consumers (the gate on
//! `stock.deduct`, fresh keys) alone; load the same number again and measure the consumers while
//! a run with the default pause archives them; then, with the archive full, measure fresh claims
//! with the guard off and on, and send copies of archived keys both ways.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use sqlx::AssertSqlSafe;

use super::{Percentiles, create_digits, rate};
use idemgate::archive::retention::DAY_MS;
use idemgate::archive::{ArchiveOptions, Fault, PassReport, StartedBy, archive_once};
use idemgate::delivery::Delivery;
use idemgate::gate::{Gate, Identity, Policy};
use idemgate::outcome::{Layer, Outcome};
use idemgate::route::Routes;
use idemgate::store::{Backend, Sql, Store, StoreOptions};
use idemgate_shop::{self as shop, DeductStock};
use idemgate_testkit::scratch::ScratchDb;

/// What to measure: the flags of `idemgate-bench archive`.
#[derive(Debug, Clone, clap::Args)]
pub struct Options {
    #[arg(long, value_delimiter = ',', default_value = "postgres,mysql")]
    pub backends: Vec<Backend>,
    /// Expired claims to load and archive (at most 1,000,000).
    #[arg(long, default_value_t = 1_000_000)]
    pub rows: usize,
    #[arg(long, default_value_t = 5_000)]
    pub batch_size: u32,
    /// Pause between batches of the run beside the consumers.
    // The scheduled default is 50 ms.
    #[arg(long = "pause-ms", value_name = "PAUSE_MS", default_value = "50", value_parser = super::millis)]
    pub pause: Duration,
    /// Deliveries in flight.
    #[arg(long, default_value_t = 4)]
    pub concurrency: usize,
    /// Fresh deliveries per consumer measurement.
    // Three of them: the baseline, the guard off, the guard on.
    #[arg(long, default_value_t = 4_000)]
    pub messages: usize,
}

impl Default for Options {
    fn default() -> Self {
        Self {
            backends: vec![Backend::Postgres, Backend::MySql],
            rows: 1_000_000,
            batch_size: 5_000,
            pause: Duration::from_millis(50),
            concurrency: 4,
            messages: 4_000,
        }
    }
}

/// The consumers over one stretch.
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct ConsumerRun {
    pub messages: usize,
    pub elapsed: Duration,
    pub latency: Percentiles,
    /// Mean claim phase (insert, plus the archive lookup when the guard is on), µs.
    pub claim_us: u64,
    pub failed: usize,
}

impl ConsumerRun {
    pub(crate) fn rate(&self) -> f64 {
        rate(self.messages, self.elapsed)
    }
}

/// One backend's figures.
#[derive(Debug, Clone)]
pub(crate) struct Report {
    pub backend: Backend,
    pub rows: usize,
    /// The run with nothing else on the database, no pause.
    pub alone: PassReport,
    /// Consumers with no run.
    pub consumers_alone: ConsumerRun,
    /// The run beside the consumers, with the configured pause.
    pub beside: PassReport,
    /// Consumers during that run.
    pub consumers_during: ConsumerRun,
    /// Fresh claims with the archive full, guard off and on.
    pub guard_off: ConsumerRun,
    pub guard_on: ConsumerRun,
    /// Copies of archived keys sent through the gate: how many were applied again without the
    /// guard, and how many the guard stopped as `late_duplicate`.
    pub late_copies: usize,
    pub applied_again_unguarded: usize,
    pub stopped_by_guard: usize,
}

const GROUP: &str = "bench_archive";
const SKU: &str = "SKU-BENCH-ARCHIVE";

/// `idemgate-bench archive`: prints the setting, runs every backend and prints the tables
/// of the runs and of the guard.
pub(crate) async fn command(options: Options) -> anyhow::Result<()> {
    println!(
        "bench archive: {} expired claims, batches of {}, pause {} ms beside {} deliveries in flight, {} cores",
        options.rows,
        options.batch_size,
        options.pause.as_millis(),
        options.concurrency,
        super::cores()
    );
    let reports = run(&options, |line| eprintln!("  {line}")).await?;
    println!("\n{}\n{}", table(&reports), guard_table(&reports));
    // A consumer whose fresh deliveries did not all commit measured something else.
    for r in &reports {
        for (stretch, run) in [
            ("alone", &r.consumers_alone),
            ("during the archive run", &r.consumers_during),
            ("guard off", &r.guard_off),
            ("guard on", &r.guard_on),
        ] {
            anyhow::ensure!(
                run.failed == 0,
                "{}: {} of the consumers' {} fresh deliveries {stretch} were not processed",
                r.backend,
                run.failed,
                run.messages
            );
        }
    }
    Ok(())
}

/// Runs every backend; calls `progress` with a line as each step ends.
pub(crate) async fn run(options: &Options, mut progress: impl FnMut(&str)) -> anyhow::Result<Vec<Report>> {
    if options.rows == 0 || options.rows > 1_000_000 {
        anyhow::bail!("--rows must be between 1 and 1000000, not {}", options.rows);
    }
    let mut reports = Vec::new();
    for &backend in &options.backends {
        let store_options =
            StoreOptions { max_connections: options.concurrency as u32 + 4, ..Default::default() };
        let db = ScratchDb::create(backend, &store_options).await?;
        let store = db.store.clone();
        shop::seed_stock(&store, SKU, i64::MAX / 2).await?;
        create_digits(&store).await?;
        let now = idemgate::clock::now_ms();
        let archive = ArchiveOptions {
            dedup_retention_ms: 90 * DAY_MS,
            log_retention_ms: None,
            batch_size: options.batch_size,
            pause: Duration::ZERO,
            time_budget: Duration::from_secs(24 * 3600),
            lease_ttl: Duration::from_secs(600),
            instance_id: "bench".to_owned(),
            started_by: StartedBy::Command,
            // Claims only: the log keeps its shape.
            partition_log: false,
            claim_key_by_biz_id: true,
            fault: Fault::None,
        };

        let t = Instant::now();
        load_expired(&store, "A", options.rows, now).await?;
        let load_secs = t.elapsed().as_secs_f64();
        progress(&format!("{backend}: loaded {} expired claims in {load_secs:.1} s", options.rows));
        let alone = archive_once(&store, &archive, now).await?.dedup;
        progress(&format!("{backend}: archived alone at {:.0} rows/s", alone.rate()));

        let gate = Arc::new(gate(&store)?);
        let consumers_alone = consume(&gate, "BASE", Some(options.messages), options.concurrency, None).await;
        progress(&format!("{backend}: consumers alone p99 {} µs", consumers_alone.latency.p99_us));

        load_expired(&store, "B", options.rows, now).await?;
        let running = Arc::new(AtomicBool::new(true));
        let during = {
            let (gate, running, concurrency) = (gate.clone(), running.clone(), options.concurrency);
            tokio::spawn(async move { consume(&gate, "DURING", None, concurrency, Some(running)).await })
        };
        let beside =
            archive_once(&store, &ArchiveOptions { pause: options.pause, ..archive.clone() }, now).await;
        running.store(false, Ordering::Release);
        let consumers_during = during.await?;
        let beside = beside?.dedup;
        progress(&format!(
            "{backend}: archived beside consumers at {:.0} rows/s; their p99 {} µs",
            beside.rate(),
            consumers_during.latency.p99_us
        ));

        let guard_off = consume(&gate, "OFF", Some(options.messages), options.concurrency, None).await;
        let guarded = Arc::new(self::gate(&store)?.with_late_duplicate_guard(true));
        let guard_on = consume(&guarded, "ON", Some(options.messages), options.concurrency, None).await;
        progress(&format!(
            "{backend}: claim {} µs without the guard, {} µs with it",
            guard_off.claim_us, guard_on.claim_us
        ));

        let late_copies = 200.min(options.rows);
        let (mut applied_again_unguarded, mut stopped_by_guard) = (0, 0);
        for i in 0..late_copies {
            // Keys of the first load, archived by the first run.
            let d = deduct(&format!("EXP-A-{}", i * (options.rows / late_copies)), &format!("LATE-{i}"));
            let guarded_answer = guarded.process(&d).await;
            stopped_by_guard += usize::from(guarded_answer.layer == Some(Layer::LateDuplicate));
            let unguarded_answer = gate.process(&d).await;
            applied_again_unguarded += usize::from(unguarded_answer.outcome == Outcome::Processed);
        }
        reports.push(Report {
            backend,
            rows: options.rows,
            alone,
            consumers_alone,
            beside,
            consumers_during,
            guard_off,
            guard_on,
            late_copies,
            applied_again_unguarded,
            stopped_by_guard,
        });
        db.drop_now().await;
    }
    Ok(reports)
}

fn gate(store: &Store) -> anyhow::Result<Gate> {
    Ok(Gate::new(
        store.clone(),
        Routes::new(&shop::routes(shop::TOPIC))?,
        shop::handlers(),
        Identity { consumer_group: GROUP.to_owned(), instance_id: "bench".to_owned() },
        Policy { duplicate_warnings_per_second: 0, ..Policy::default() },
    )?)
}

fn deduct(biz_id: &str, msg_id: &str) -> Delivery {
    Delivery {
        msg_id: msg_id.to_owned(),
        uniq_key: format!("U-{msg_id}"),
        topic: shop::TOPIC.to_owned(),
        tags: shop::TAG_STOCK_DEDUCT.to_owned(),
        keys: vec![biz_id.to_owned()],
        body: serde_json::to_vec(&DeductStock { sku: SKU.to_owned(), quantity: 1 }).unwrap_or_default(),
        ..Default::default()
    }
}

/// Fresh `stock.deduct` deliveries through `gate`, `concurrency` at a time: `count` of them, or
/// as many as fit while `running` stays set.
async fn consume(
    gate: &Arc<Gate>,
    phase: &'static str,
    count: Option<usize>,
    concurrency: usize,
    running: Option<Arc<AtomicBool>>,
) -> ConsumerRun {
    let next = Arc::new(AtomicUsize::new(0));
    let started = Instant::now();
    let workers: Vec<_> = (0..concurrency.max(1))
        .map(|_| {
            let (gate, next, running) = (gate.clone(), next.clone(), running.clone());
            tokio::spawn(async move {
                let (mut latencies, mut claim_us, mut failed) = (Vec::new(), 0u64, 0usize);
                loop {
                    if running.as_ref().is_some_and(|r| !r.load(Ordering::Acquire)) {
                        break;
                    }
                    let i = next.fetch_add(1, Ordering::Relaxed);
                    if count.is_some_and(|n| i >= n) {
                        break;
                    }
                    let d = deduct(&format!("{phase}-{i}"), &format!("{phase}-M{i}"));
                    let t = Instant::now();
                    let r = gate.process(&d).await;
                    latencies.push(t.elapsed().as_micros() as u64);
                    claim_us += r.phases.claim_us;
                    failed += usize::from(r.outcome != Outcome::Processed);
                }
                (latencies, claim_us, failed)
            })
        })
        .collect();
    let (mut all, mut claim_us, mut failed) = (Vec::new(), 0, 0);
    for w in workers {
        if let Ok((l, c, f)) = w.await {
            all.extend(l);
            claim_us += c;
            failed += f;
        }
    }
    let messages = all.len();
    ConsumerRun {
        messages,
        elapsed: started.elapsed(),
        latency: Percentiles::of(&mut all),
        claim_us: claim_us / messages.max(1) as u64,
        failed,
    }
}

// String concatenation is where the dialects differ: || on PostgreSQL and SQLite, CONCAT on
// MySQL/MariaDB (where || means OR).
static LOAD_PIPES: Sql = Sql::new(
    "INSERT INTO idempotent_record (consumer_group, biz_type, biz_id, execute_time, msg_id, uniq_key, \
     payload_hash, instance_id, claimed_at_ms) \
     SELECT ?, ?, CAST(? AS TEXT) || CAST(a.n * 1000 + b.n AS TEXT), 0, 'M-' || CAST(a.n * 1000 + b.n AS TEXT), \
     '', 'hash', 'bench', ? + a.n * 1000 + b.n \
     FROM bench_digits a CROSS JOIN bench_digits b WHERE a.n * 1000 + b.n < ? ORDER BY a.n, b.n",
);
static LOAD_CONCAT: Sql = Sql::new(
    "INSERT INTO idempotent_record (consumer_group, biz_type, biz_id, execute_time, msg_id, uniq_key, \
     payload_hash, instance_id, claimed_at_ms) \
     SELECT ?, ?, CONCAT(?, a.n * 1000 + b.n), 0, CONCAT('M-', a.n * 1000 + b.n), \
     '', 'hash', 'bench', ? + a.n * 1000 + b.n \
     FROM bench_digits a CROSS JOIN bench_digits b WHERE a.n * 1000 + b.n < ? ORDER BY a.n, b.n",
);
/// `rows` claims of keys `EXP-{prefix}-{n}`, claimed 100 days before `now`, in one statement:
/// a thousand digits crossed with themselves.
pub(crate) async fn load_expired(
    store: &Store,
    prefix: &str,
    rows: usize,
    now: i64,
) -> Result<(), sqlx::Error> {
    let load = match store.backend() {
        Backend::MySql => &LOAD_CONCAT,
        Backend::Postgres | Backend::Sqlite => &LOAD_PIPES,
    };
    let mut tx = store.begin().await?;
    store
        .query(load)
        .bind(GROUP)
        .bind(shop::STOCK_DEDUCT)
        .bind(format!("EXP-{prefix}-"))
        .bind(now - 100 * DAY_MS)
        .bind(rows as i64)
        .execute(&mut *tx)
        .await?;
    tx.commit().await?;
    let analyze = match store.backend() {
        Backend::Postgres => "ANALYZE idempotent_record",
        Backend::MySql => "ANALYZE TABLE idempotent_record",
        Backend::Sqlite => "ANALYZE",
    };
    let _ = sqlx::query(AssertSqlSafe(analyze)).fetch_all(store.pool()).await?;
    Ok(())
}

/// The run's throughput and the consumers' latency, as a Markdown table.
pub(crate) fn table(reports: &[Report]) -> String {
    let mut out = String::from(
        "| backend | expired claims | archive alone rows/s | archive beside consumers rows/s | consumer msg/s without / during | p50 ms without / during | p99 ms without / during |\n\
         |---|---|---|---|---|---|---|\n",
    );
    for r in reports {
        let ms = |us: u64| us as f64 / 1000.0;
        out.push_str(&format!(
            "| {} | {} | {:.0} | {:.0} | {:.0} / {:.0} | {:.2} / {:.2} | {:.2} / {:.2} |\n",
            r.backend,
            r.rows,
            r.alone.rate(),
            r.beside.rate(),
            r.consumers_alone.rate(),
            r.consumers_during.rate(),
            ms(r.consumers_alone.latency.p50_us),
            ms(r.consumers_during.latency.p50_us),
            ms(r.consumers_alone.latency.p99_us),
            ms(r.consumers_during.latency.p99_us),
        ));
    }
    out
}

/// The late-duplicate guard's cost and effect, as a Markdown table.
pub(crate) fn guard_table(reports: &[Report]) -> String {
    let mut out = String::from(
        "| backend | archived claims | guard | msg/s | p50 ms | p99 ms | claim µs | late copies applied again |\n\
         |---|---|---|---|---|---|---|---|\n",
    );
    for r in reports {
        for (name, run, again) in [
            ("off", &r.guard_off, r.applied_again_unguarded),
            ("on", &r.guard_on, r.late_copies - r.stopped_by_guard),
        ] {
            out.push_str(&format!(
                "| {} | {} | {name} | {:.0} | {:.2} | {:.2} | {} | {again} of {} |\n",
                r.backend,
                2 * r.rows,
                run.rate(),
                run.latency.p50_us as f64 / 1000.0,
                run.latency.p99_us as f64 / 1000.0,
                run.claim_us,
                r.late_copies,
            ));
        }
    }
    out
}
