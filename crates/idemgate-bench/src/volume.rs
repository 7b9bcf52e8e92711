//! `idemgate-bench volume`: what the gate, the trace page, the reconciler, the archive and the
//! log's retention cost as the tables grow to production size.
//!
//! On a scratch database per backend (PostgreSQL, MySQL/MariaDB) the gate is first measured on
//! the empty tables. Then the claim table is filled to each of `--sizes` in turn, spread over
//! the 90 days of the dedup retention; the claims of the last `--log-days` (the log's retention,
//! 14 by default) get two delivery-log rows each, at their time, in the log partitioned by day
//! as the service keeps it. The rows are made by the server, a million per statement, and never
//! pass through the gate. Their shape is production's:
//! - bizIds that grow with time, as snowflake or sequence ids do;
//! - RocketMQ msgIds and UNIQ_KEYs (32 hex digits), SHA-256-long payload hashes;
//! - a W3C trace id on one delivery in four;
//! - each key's second row a producer resend (every other key) or a failed first attempt.
//!
//! After each fill the tables are vacuumed and analyzed (`VACUUM ANALYZE`, `ANALYZE TABLE`), as
//! the server's own maintenance would leave them, and the step measures:
//! - bytes per claim and per log row, the heap and each index;
//! - the gate: group commit on its batch path with `--duplicates` of the stream repeated, msg/s
//!   and p99, and the ratio to the empty tables' run. New keys sort after the loaded ones, as
//!   new orders' ids do. Beside it, the naive select-then-insert pattern over the same kind of
//!   stream, and its own ratio;
//! - the trace page's lookup of random keys of the step, p50 and p99;
//! - a reconcile pass over one day of the log;
//! - archiving the oldest day of claims, alone: rows/s and the WAL (redo log) it writes;
//! - archiving the next day while the gate runs beside it: the gate's p99 against its run at
//!   this size with no archive;
//! - the log's retention, on the log partitioned by day as the service keeps it: the oldest day
//!   deleted row by row as on a plain log (`DELETE … LIMIT 5000` until none is left: rows/s, the
//!   WAL, the bytes it leaves), then the next day dropped as the archive job drops it (its time,
//!   its WAL, the bytes after).
//!
//! The log is partitioned before anything is written, with a day partition for each day of its
//! retention, made day by day as the archive job makes them; each fill after the first gives log
//! rows to the days still there.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use rand::Rng;
use sqlx::{AssertSqlSafe, Row};

use super::gate::{self, GROUP};
use super::{Percentiles, cores, create_digits, share};
use idemgate::archive::{
    ArchiveOptions, ArchiveSettings, PassReport, StartedBy, archive_once, prepare_tables,
};
use idemgate::delivery::Delivery;
use idemgate::delivery_log::partitions::{self, Bound, Partition};
use idemgate::gate::{Gate, GroupSettings, Identity, Policy};
use idemgate::inspect::Limits;
use idemgate::inspect::trace::{self, Answer, SearchBy, TraceContext, TraceQuery};
use idemgate::outcome::Outcome;
use idemgate::reconcile::{ReconcileOptions, reconcile_once};
use idemgate::route::Routes;
use idemgate::store::{Backend, Sql, Store, StoreOptions, query_built};
use idemgate_shop as shop;
use idemgate_testkit::scratch::ScratchDb;

const DAY_MS: i64 = 86_400_000;
/// The span the loaded claims and log rows cover: the default dedup retention.
const SPAN_DAYS: i64 = 90;
/// Rows made by one statement of the fill.
const CHUNK: u64 = 1_000_000;
/// The most claims a step may fill to.
const MAX_SIZE: u64 = 500_000_000;
/// Messages per chunk of the gate's stream while an archive pass runs beside it.
const BESIDE_CHUNK: usize = 2_000;

/// What to measure: the flags of `idemgate-bench volume`.
#[derive(Debug, Clone, clap::Args)]
pub struct Options {
    /// Backends to measure: postgres, mysql (SQLite is an embedded default, not a production
    /// store of this size).
    #[arg(long, value_delimiter = ',', default_value = "postgres,mysql")]
    pub backends: Vec<Backend>,
    /// Claims the tables are filled to, one step each, ascending; the log gets two rows per
    /// claim. Mind the disk: about 1 KB per claim with its log rows on PostgreSQL.
    #[arg(long, value_delimiter = ',', default_value = "1000000,10000000,50000000")]
    pub sizes: Vec<u64>,
    /// Messages through the gate per measurement.
    #[arg(long, default_value_t = 20_000)]
    pub messages: usize,
    /// The share of the gate's stream that repeats an earlier message.
    #[arg(long, default_value_t = 0.3)]
    pub duplicates: f64,
    /// Deliveries in flight through the gate.
    #[arg(long, default_value_t = 8)]
    pub concurrency: usize,
    /// Timed trace lookups per step.
    #[arg(long, default_value_t = 500)]
    pub lookups: usize,
    /// The days the delivery log keeps (the shipped `archive.log_retention_days`): the claims of
    /// the last this many days have their two log rows, one day partition each.
    #[arg(long, default_value_t = 14)]
    pub log_days: i64,
    /// Leave each backend's filled database in place and print its URL, to study its plans and
    /// sizes. Drop the database by hand afterwards.
    #[arg(long)]
    pub keep_database: bool,
    /// Measure the claim as it was first shaped, to compare: its key led by the consumer group
    /// beside an index on biz_id, the whole 64-digit body hash and the instance in every claim.
    #[arg(long)]
    pub first_claim_shape: bool,
}

impl Options {
    fn check(&self) -> anyhow::Result<()> {
        share("duplicates", self.duplicates, 0.9)?;
        anyhow::ensure!(!self.backends.is_empty(), "--backends names none");
        if let Some(b) = self.backends.iter().find(|b| **b == Backend::Sqlite) {
            anyhow::bail!("--backends: {b} is not measured at volume; choose postgres, mysql");
        }
        anyhow::ensure!(!self.sizes.is_empty(), "--sizes names none");
        anyhow::ensure!(
            self.sizes.windows(2).all(|w| w[0] < w[1]),
            "--sizes must ascend, each larger than the one before: {:?}",
            self.sizes
        );
        anyhow::ensure!(
            self.sizes.iter().all(|s| (SPAN_DAYS as u64 * 100..=MAX_SIZE).contains(s)),
            "--sizes must each be from {} (a hundred claims a day) to {MAX_SIZE}: {:?}",
            SPAN_DAYS * 100,
            self.sizes
        );
        anyhow::ensure!(self.messages >= 100, "--messages must be at least 100, not {}", self.messages);
        anyhow::ensure!(
            (1..=64).contains(&self.concurrency),
            "--concurrency must be from 1 to 64, not {}",
            self.concurrency
        );
        anyhow::ensure!(self.lookups > 0, "--lookups must be at least 1");
        anyhow::ensure!(
            (4..=SPAN_DAYS).contains(&self.log_days),
            "--log-days must be from 4 to {SPAN_DAYS}, not {}",
            self.log_days
        );
        Ok(())
    }
}

/// `idemgate-bench volume`: prints the setting, fills and measures every backend step by step,
/// and prints the tables.
pub(crate) async fn command(options: Options) -> anyhow::Result<()> {
    options.check()?;
    println!(
        "bench volume: sizes {:?} claims over {SPAN_DAYS} days (two log rows each for the last {} days), gate: {} stock.deduct \
         messages, {:.0}% duplicates, {} in flight, group commit (batch path); {} trace lookups; {} cores; the claim {}",
        options.sizes,
        options.log_days,
        options.messages,
        options.duplicates * 100.0,
        options.concurrency,
        options.lookups,
        cores(),
        if options.first_claim_shape {
            "as first shaped (key led by the group, an index on biz_id, the whole hash and the instance)"
        } else {
            "as written now (key led by biz_id, 96 bits of the hash, no instance)"
        }
    );
    let mut reports = Vec::new();
    for &backend in &options.backends {
        let store_options =
            StoreOptions { max_connections: options.concurrency as u32 + 6, ..Default::default() };
        let db = ScratchDb::create(backend, &store_options).await?;
        let result = measure(&db.store, &options, &mut reports).await;
        if options.keep_database {
            println!("bench volume: the {backend} database is kept at {}", db.keep().await);
        } else {
            db.drop_now().await;
        }
        result?;
    }
    println!("\n{}", table(&reports));
    println!(
        "Bytes per row, each part (heap is the table itself; on MySQL/MariaDB the clustered PRIMARY):\n"
    );
    println!("{}", bytes_table(&reports));
    println!("The reads of the log, as planned at the last step:\n");
    println!("{}", plans_table(&reports));
    if let Some(last) = reports.iter().rfind(|s| !s.claim_columns.is_empty()) {
        println!(
            "The claim's columns on PostgreSQL at {} claims, mean stored bytes (pg_stats.avg_width):\n",
            last.claims
        );
        println!("{}", columns_table(&last.claim_columns));
    }
    Ok(())
}

/// One step of one backend.
#[derive(Debug, Clone)]
pub(crate) struct Step {
    pub backend: Backend,
    /// Claims in the live table when measured (the gate's own included).
    pub claims: i64,
    pub log_rows: i64,
    pub fill: Duration,
    pub claim_parts: Vec<(String, i64)>,
    pub log_parts: Vec<(String, i64)>,
    /// PostgreSQL: the claim's columns and their mean stored width in bytes.
    pub claim_columns: Vec<(String, i64)>,
    pub gate: GateRun,
    /// msg/s against the empty tables' run.
    pub gate_ratio: f64,
    /// The naive select-then-insert pattern over the same stream, and its ratio to its own run
    /// on the empty tables.
    pub naive: GateRun,
    pub naive_ratio: f64,
    pub trace: Percentiles,
    pub reconcile: Duration,
    pub reconciled_deliveries: i64,
    pub archive: Pass,
    pub beside_archive: GateRun,
    /// The gate's p99 at this size with no archive running.
    pub idle_p99_us: u64,
    /// The oldest day deleted row by row, as on a plain log.
    pub row_wise: Pass,
    /// The next day dropped whole, by the archive job.
    pub retention: Pass,
    /// The log's heap and indexes before the retention, after the row-wise delete and after
    /// the drop.
    pub log_bytes_before: i64,
    pub log_bytes_row_wise: i64,
    pub log_bytes_after: i64,
    /// How each read of the log is planned at this size: its statement, the partitions it
    /// reads, their indexes, and the partitions it scans whole.
    pub plans: Vec<PlanSummary>,
}

/// One statement's reads of the partitioned log.
#[derive(Debug, Clone)]
pub(crate) struct PlanSummary {
    pub statement: String,
    /// Partitions of the log read (holding rows, and empty).
    pub partitions: usize,
    pub empty: usize,
    pub indexes: Vec<String>,
    /// Reads of a partition holding rows that scan it whole or walk a whole index.
    pub whole: Vec<String>,
}

/// A timed pass of the archive job.
#[derive(Debug, Clone, Default)]
pub(crate) struct Pass {
    pub rows: u64,
    pub elapsed: Duration,
    pub wal_bytes: i64,
}

impl Pass {
    fn of(report: &PassReport, wal_bytes: i64) -> Self {
        Self { rows: report.rows, elapsed: report.elapsed, wal_bytes }
    }

    fn rate(&self) -> f64 {
        super::rate(self.rows as usize, self.elapsed)
    }
}

/// The gate's run over one stream (or several, beside an archive pass).
#[derive(Debug, Clone, Default)]
pub(crate) struct GateRun {
    pub messages: usize,
    pub elapsed: Duration,
    pub latency: Percentiles,
}

impl GateRun {
    fn rate(&self) -> f64 {
        super::rate(self.messages, self.elapsed)
    }
}

async fn measure(store: &Store, options: &Options, reports: &mut Vec<Step>) -> anyhow::Result<()> {
    let backend = store.backend();
    // The log as the service keeps it: a partition a day, made over the whole span.
    let now = idemgate::clock::now_ms();
    let made = now - (options.log_days + 2) * DAY_MS;
    let settings =
        ArchiveSettings { claim_key_by_biz_id: !options.first_claim_shape, ..ArchiveSettings::default() };
    prepare_tables(store, &settings, "bench", made).await?;
    // Day by day, as the daily job makes them: one partition each.
    for day in 1..=options.log_days + 2 {
        partitions::ensure_ahead(store, made + day * DAY_MS).await?;
    }
    gate::seed(store).await?;
    create_digits(store).await?;
    let gate = Arc::new(the_gate(store)?);
    // The next key number (`D` and 18 digits). The fills and the gate's streams take their
    // numbers from it in turn, so every claim, loaded or made by the gate, sorts after every
    // claim before it, as a new order's id sorts after the old ones: each index grows at its
    // right edge, as in production.
    let keys = Arc::new(AtomicUsize::new(0));
    // A first run of each, not measured, so that the empty tables' figures are not a cold
    // start's (connections opened, statements prepared, caches filled). The tables are then
    // nearly empty: the two runs' keys only.
    gate_run(&gate, store, options, &keys).await?;
    naive_run(store, options, &keys).await?;
    // The statistics the server's autovacuum or persistent statistics would have by now: the
    // planner then plans the small tables as it plans the big ones.
    maintain(store).await?;
    let empty = gate_run(&gate, store, options, &keys).await?;
    let naive_empty = naive_run(store, options, &keys).await?;
    eprintln!(
        "  {backend} empty tables: gate {:.0} msg/s, p99 {:.1} ms; naive {:.0} msg/s",
        empty.rate(),
        ms(empty.latency.p99_us),
        naive_empty.rate()
    );
    let ctx = trace_context(options.log_days)?;
    let mut loaded = 0u64;
    for &size in &options.sizes {
        let started = Instant::now();
        let from = keys.fetch_add((size - loaded) as usize, Ordering::Relaxed) as u64;
        let to = from + size - loaded;
        let log_start = log_start(store, options.log_days).await?;
        let logged_from = fill(store, from, to, log_start, options.first_claim_shape).await?;
        maintain(store).await?;
        let fill = started.elapsed();
        loaded = size;
        let claims = count(store, "idempotent_record").await?;
        let log_rows = count(store, "delivery_log").await?;
        eprintln!("  {backend} {claims} claims, {log_rows} log rows: filled in {:.0} s", fill.as_secs_f64());
        let claim_parts = parts(store, "idempotent_record").await?;
        let log_parts = parts(store, "delivery_log").await?;
        let claim_columns = columns(store, "idempotent_record").await?;

        let run = gate_run(&gate, store, options, &keys).await?;
        let naive = naive_run(store, options, &keys).await?;
        let trace = lookups(store, &ctx, logged_from, to, options.lookups).await?;
        let (reconcile, reconciled_deliveries) = reconcile_day(store, options.log_days).await?;

        // The oldest day alone, then the next one with the gate beside it.
        let now = idemgate::clock::now_ms();
        let archive =
            pass(store, archive_options((SPAN_DAYS - 1) * DAY_MS, None, options.first_claim_shape), now)
                .await?;
        let stop = Arc::new(AtomicBool::new(false));
        let beside = {
            let (gate, store, options, keys, stop) =
                (gate.clone(), store.clone(), options.clone(), keys.clone(), stop.clone());
            tokio::spawn(async move { gate_beside(&gate, &store, &options, &keys, &stop).await })
        };
        let second =
            pass(store, archive_options((SPAN_DAYS - 2) * DAY_MS, None, options.first_claim_shape), now)
                .await;
        stop.store(true, Ordering::Relaxed);
        let beside_archive = beside.await??;
        second?;

        let log_bytes_before = total(&parts(store, "delivery_log").await?);
        let (oldest, next) = oldest_days(store).await?;
        let row_wise = delete_row_wise(store, &oldest).await?;
        let log_bytes_row_wise = total(&parts(store, "delivery_log").await?);
        let retention = drop_day(store, &next, now, options.first_claim_shape).await?;
        let log_bytes_after = total(&parts(store, "delivery_log").await?);

        let plans = log_plans(store, logged_from, options.log_days).await?;
        let idle_p99_us = run.latency.p99_us;
        let step = Step {
            backend,
            claims,
            log_rows,
            fill,
            claim_parts,
            log_parts,
            claim_columns,
            gate_ratio: run.rate() / empty.rate(),
            gate: run,
            naive_ratio: naive.rate() / naive_empty.rate(),
            naive,
            trace,
            reconcile,
            reconciled_deliveries,
            archive,
            beside_archive,
            idle_p99_us,
            row_wise,
            retention,
            log_bytes_before,
            log_bytes_row_wise,
            log_bytes_after,
            plans,
        };
        eprintln!("{}", table(std::slice::from_ref(&step)).lines().last().unwrap_or_default());
        reports.push(step);
    }
    Ok(())
}

/// The gate of `stock.deduct` with group commit on its batch path, as a production consumer at
/// volume runs it.
fn the_gate(store: &Store) -> anyhow::Result<Gate> {
    Ok(Gate::new(
        store.clone(),
        Routes::new(&shop::routes(shop::TOPIC))?,
        shop::handlers(),
        Identity { consumer_group: GROUP.to_owned(), instance_id: "bench".to_owned() },
        Policy { duplicate_warnings_per_second: 0, ..Policy::default() },
    )?
    .with_group_commit(GroupSettings::on()))
}

/// `messages` deliveries with `duplicates` repeated, their keys numbered from `from` on (after
/// every key before them). Returns the stream and its distinct keys.
fn stream(messages: usize, duplicates: f64, from: usize) -> (Vec<Delivery>, usize) {
    let (mut stream, distinct) = gate::stream(messages, duplicates, from as u64);
    for d in &mut stream {
        let i: u64 = d.keys[0].trim_start_matches("DEDUCT-").parse().unwrap_or(0);
        d.keys = vec![format!("D{:018}", from as u64 + i)];
        d.msg_id = format!("{}-{from}", d.msg_id);
    }
    (stream, distinct)
}

/// One measured run of the gate over a fresh stream; the books are checked and cleared after.
async fn gate_run(
    gate: &Arc<Gate>,
    store: &Store,
    options: &Options,
    keys: &AtomicUsize,
) -> anyhow::Result<GateRun> {
    let from = keys.fetch_add(options.messages, Ordering::Relaxed);
    let (stream, distinct) = stream(options.messages, options.duplicates, from);
    let started = Instant::now();
    let mut latencies = process(gate, Arc::new(stream), options.concurrency).await?;
    let elapsed = started.elapsed();
    books(store, distinct).await?;
    Ok(GateRun { messages: latencies.len(), elapsed, latency: Percentiles::of(&mut latencies) })
}

/// The naive per-message pattern (select the claim, insert it, apply, commit) over a fresh
/// stream with the same deliveries in flight. Its races end in errors the broker would
/// redeliver, and it may apply a key twice: both are its nature, not checked here.
async fn naive_run(store: &Store, options: &Options, keys: &AtomicUsize) -> anyhow::Result<GateRun> {
    let from = keys.fetch_add(options.messages, Ordering::Relaxed);
    let (stream, _) = stream(options.messages, options.duplicates, from);
    let (stream, next) = (Arc::new(stream), Arc::new(AtomicUsize::new(0)));
    let started = Instant::now();
    let mut workers = Vec::new();
    for _ in 0..options.concurrency {
        let (store, stream, next) = (store.clone(), stream.clone(), next.clone());
        workers.push(tokio::spawn(async move {
            let mut latencies = Vec::new();
            while let Some(d) = stream.get(next.fetch_add(1, Ordering::Relaxed)) {
                let t = Instant::now();
                let _ = gate::naive(&store, d).await;
                latencies.push(t.elapsed().as_micros() as u64);
            }
            latencies
        }));
    }
    let mut latencies = Vec::with_capacity(stream.len());
    for w in workers {
        latencies.extend(w.await?);
    }
    let elapsed = started.elapsed();
    store.query(&CLEAR_LEDGER).execute(store.pool()).await?;
    Ok(GateRun { messages: latencies.len(), elapsed, latency: Percentiles::of(&mut latencies) })
}

/// The gate over stream after stream until `stop`, at least one.
async fn gate_beside(
    gate: &Arc<Gate>,
    store: &Store,
    options: &Options,
    keys: &AtomicUsize,
    stop: &AtomicBool,
) -> anyhow::Result<GateRun> {
    let started = Instant::now();
    let (mut latencies, mut distinct) = (Vec::new(), 0);
    loop {
        let from = keys.fetch_add(BESIDE_CHUNK, Ordering::Relaxed);
        let (stream, fresh) = stream(BESIDE_CHUNK, options.duplicates, from);
        latencies.extend(process(gate, Arc::new(stream), options.concurrency).await?);
        distinct += fresh;
        if stop.load(Ordering::Relaxed) {
            break;
        }
    }
    let elapsed = started.elapsed();
    books(store, distinct).await?;
    Ok(GateRun { messages: latencies.len(), elapsed, latency: Percentiles::of(&mut latencies) })
}

/// Runs `stream` through the gate with `concurrency` deliveries in flight; the latency of each
/// in microseconds. A delivery the gate did not settle fails the run.
async fn process(
    gate: &Arc<Gate>,
    stream: Arc<Vec<Delivery>>,
    concurrency: usize,
) -> anyhow::Result<Vec<u64>> {
    let next = Arc::new(AtomicUsize::new(0));
    let mut workers = Vec::new();
    for _ in 0..concurrency {
        let (gate, stream, next) = (gate.clone(), stream.clone(), next.clone());
        workers.push(tokio::spawn(async move {
            let mut latencies = Vec::new();
            while let Some(d) = stream.get(next.fetch_add(1, Ordering::Relaxed)) {
                let t = Instant::now();
                let r = gate.process(d).await;
                anyhow::ensure!(
                    matches!(r.outcome, Outcome::Processed | Outcome::Duplicate),
                    "the gate answered {:?} for {}",
                    r.outcome,
                    d.msg_id
                );
                latencies.push(t.elapsed().as_micros() as u64);
            }
            Ok(latencies)
        }));
    }
    let mut all = Vec::with_capacity(stream.len());
    for w in workers {
        all.extend(w.await??);
    }
    Ok(all)
}

static CLEAR_LEDGER: Sql = Sql::new("DELETE FROM shop_stock_ledger");

/// Every distinct key of the run applied once, none twice; the ledger is cleared for the next.
async fn books(store: &Store, distinct: usize) -> anyhow::Result<()> {
    let (applied, twice) = gate::books(store).await?;
    anyhow::ensure!(
        applied == distinct as i64 && twice == 0,
        "the gate applied {applied} effects for {distinct} keys ({twice} twice) on {}",
        store.backend()
    );
    store.query(&CLEAR_LEDGER).execute(store.pool()).await?;
    Ok(())
}

fn trace_context(log_days: i64) -> anyhow::Result<TraceContext> {
    Ok(TraceContext {
        limits: Limits { timeout: Duration::from_secs(30) },
        retention: Some(idemgate::archive::LogRetention::days(log_days as u32)),
        grafana_url: None,
        trace_url_template: None,
        dashboard_url_template: None,
        describers: shop::handlers().by_biz_type(&Routes::new(&shop::routes(shop::TOPIC))?),
    })
}

/// The trace page's lookup by bizId of `lookups` random keys loaded by this step (older ones may
/// be archived by now), each answer checked: the claim and both deliveries.
async fn lookups(
    store: &Store,
    ctx: &TraceContext,
    from: u64,
    to: u64,
    lookups: usize,
) -> anyhow::Result<Percentiles> {
    let mut rng = rand::rng();
    let one = async |n: u64| -> anyhow::Result<u64> {
        let biz_id = format!("D{n:018}");
        let query = TraceQuery::new(&biz_id, SearchBy::BizId, None, None, None)?;
        let t = Instant::now();
        let answer = trace::trace(store, ctx, &query).await?;
        let took = t.elapsed().as_micros() as u64;
        match answer {
            Answer::Story { story, .. } if story.deliveries.len() == 2 && story.claim.is_some() => Ok(took),
            other => anyhow::bail!("trace of {biz_id}: unexpected answer {other:?}"),
        }
    };
    // Warm the caches the way a page opened a few times would.
    for _ in 0..20 {
        one(rng.random_range(from..to)).await?;
    }
    let mut samples = Vec::with_capacity(lookups);
    for _ in 0..lookups {
        samples.push(one(rng.random_range(from..to)).await?);
    }
    Ok(Percentiles::of(&mut samples))
}

/// A reconcile over the day in the middle of the log's days.
fn one_day(now: i64, log_days: i64) -> ReconcileOptions {
    let since = now - log_days / 2 * DAY_MS;
    ReconcileOptions {
        consumer_group: GROUP.to_owned(),
        biz_type: None,
        since_ms: since,
        until_ms: since + DAY_MS,
        stuck_after_ms: DAY_MS / 48,
        log_retention_ms: log_days * DAY_MS,
        max_per_kind: 1_000,
        instance_id: "bench".to_owned(),
        started_by: "command".to_owned(),
    }
}

/// A reconcile pass over one day in the middle of the log's days, which must find nothing: every
/// loaded key has its processed delivery.
async fn reconcile_day(store: &Store, log_days: i64) -> anyhow::Result<(Duration, i64)> {
    let now = idemgate::clock::now_ms();
    let options = one_day(now, log_days);
    let since = options.since_ms;
    let in_window: i64 = store
        .query(&COUNT_LOG_BETWEEN)
        .bind(since)
        .bind(since + DAY_MS)
        .fetch_one(store.pool())
        .await?
        .try_get(0)?;
    let started = Instant::now();
    let report = reconcile_once(store, &options, &[], now).await?;
    let took = started.elapsed();
    anyhow::ensure!(report.is_clean(), "reconcile over one day found anomalies: {:?}", report.counts);
    Ok((took, in_window))
}

static COUNT_LOG_BETWEEN: Sql =
    Sql::new("SELECT COUNT(*) FROM delivery_log WHERE logged_at_ms >= ? AND logged_at_ms < ?");

/// The shipped archive settings (batch size, pause) with these retentions, no time budget; with
/// `first_shape` the claim key stays as it is.
fn archive_options(
    dedup_retention_ms: i64,
    log_retention_ms: Option<i64>,
    first_shape: bool,
) -> ArchiveOptions {
    ArchiveOptions {
        dedup_retention_ms,
        log_retention_ms,
        time_budget: Duration::from_secs(24 * 3600),
        claim_key_by_biz_id: !first_shape,
        ..ArchiveSettings::default().options("bench", StartedBy::Command)
    }
}

/// One archive run: its claim pass (or, with a log retention, its log pass) and the WAL it wrote.
async fn pass(store: &Store, options: ArchiveOptions, now: i64) -> anyhow::Result<Pass> {
    let before = wal_position(store).await?;
    let report = archive_once(store, &options, now).await?;
    let wal = wal_since(store, &before).await?;
    // The pass must leave nothing past its cutoff.
    let (left, sql) = match options.log_retention_ms {
        Some(retention) => (now - retention, &LOG_BEFORE),
        None => (now - options.dedup_retention_ms, &CLAIMS_BEFORE),
    };
    let left: i64 = store.query(sql).bind(left).fetch_one(store.pool()).await?.try_get(0)?;
    anyhow::ensure!(left == 0, "the archive run left {left} rows past its cutoff");
    Ok(Pass::of(report.log.as_ref().unwrap_or(&report.dedup), wal))
}

/// The plans of every read of the log the trace page (for the key numbered `n`), the overview
/// and a reconcile over one day make, now.
async fn log_plans(store: &Store, n: u64, log_days: i64) -> anyhow::Result<Vec<PlanSummary>> {
    let now = idemgate::clock::now_ms();
    let key = idemgate::inspect::trace::KeyRef {
        consumer_group: GROUP.to_owned(),
        biz_type: shop::STOCK_DEDUCT.to_owned(),
        biz_id: format!("D{n:018}"),
        execute_time: 0,
    };
    let mut statements: Vec<(&str, idemgate::store::Bound)> =
        trace::statements(&key, now).into_iter().map(|b| ("trace", b)).collect();
    statements.extend(idemgate::inspect::overview::statements(now).into_iter().map(|b| ("overview", b)));
    let reconcile = one_day(now, log_days);
    let checks: [idemgate::reconcile::Check; 0] = [];
    for b in idemgate::reconcile::statements(store, &reconcile, &checks, now).await? {
        statements.push(("reconcile", b));
    }
    let mut out = Vec::new();
    for (page, statement) in statements {
        let reads = idemgate_testkit::plan::reads(store, &statement).await?;
        let log: Vec<_> = reads.iter().filter(|r| r.table == "delivery_log").collect();
        if log.is_empty() {
            continue;
        }
        let mut indexes: Vec<String> = log.iter().filter_map(|r| r.index.clone()).collect();
        indexes.sort();
        indexes.dedup();
        let whole =
            log.iter().filter(|r| !r.empty_partition && r.fixed.is_empty()).map(|r| r.to_string()).collect();
        out.push(PlanSummary {
            statement: format!("{page}: {}", statement.name),
            partitions: log.len(),
            empty: log.iter().filter(|r| r.empty_partition).count(),
            indexes,
            whole,
        });
    }
    Ok(out)
}

/// The plans of the last step of each backend, as a Markdown table.
pub(crate) fn plans_table(steps: &[Step]) -> String {
    let mut out = String::from(
        "| backend | claims | statement | log partitions read (empty) | indexes | whole reads of a partition with rows |\n\
         |---|---|---|---|---|---|\n",
    );
    for backend in [Backend::Postgres, Backend::MySql] {
        let Some(s) = steps.iter().rfind(|s| s.backend == backend) else { continue };
        for p in &s.plans {
            out.push_str(&format!(
                "| {} | {} | {} | {} ({}) | {} | {} |\n",
                s.backend,
                s.claims,
                p.statement,
                p.partitions,
                p.empty,
                p.indexes.join(", "),
                if p.whole.is_empty() { "none".to_owned() } else { p.whole.join("; ").replace('|', "/") },
            ));
        }
    }
    out
}

/// Where the next fill's log rows start: the midnight `log_days` before now (the first day
/// partition's start, so that it holds a whole day), or the oldest day partition left by the
/// retention of the steps before, whichever is later.
async fn log_start(store: &Store, log_days: i64) -> anyhow::Result<i64> {
    let span_start = partitions::day_start(idemgate::clock::now_ms() - log_days * DAY_MS);
    let shape = partitions::shape(store).await?;
    let oldest = shape.partitions().iter().find_map(|p| match p.bound {
        Bound::Day { from_ms, .. } => Some(from_ms),
        _ => None,
    });
    Ok(oldest.map_or(span_start, |from| from.max(span_start)))
}

/// The two oldest day partitions.
async fn oldest_days(store: &Store) -> anyhow::Result<(Partition, Partition)> {
    let shape = partitions::shape(store).await?;
    let mut days = shape.partitions().iter().filter(|p| matches!(p.bound, Bound::Day { .. })).cloned();
    match (days.next(), days.next()) {
        (Some(a), Some(b)) => Ok((a, b)),
        _ => anyhow::bail!("the log has fewer than two day partitions: {shape:?}"),
    }
}

/// The rows of `day` deleted as a plain log's retention is usually written: a bounded DELETE of
/// the oldest rows, again until none is left (MySQL/MariaDB: `DELETE … WHERE logged_at_ms < ?
/// LIMIT 5000`; PostgreSQL, which has no DELETE … LIMIT: the same through the rows' ctids).
async fn delete_row_wise(store: &Store, day: &Partition) -> anyhow::Result<Pass> {
    let backend = store.backend();
    let cutoff = day.to_ms().unwrap_or(i64::MIN);
    let statement = match backend {
        Backend::MySql => format!("DELETE FROM delivery_log WHERE logged_at_ms < {cutoff} LIMIT 5000"),
        Backend::Postgres | Backend::Sqlite => format!(
            "DELETE FROM {0} WHERE ctid IN (SELECT ctid FROM {0} WHERE logged_at_ms < {cutoff} LIMIT 5000)",
            day.name
        ),
    };
    let before = wal_position(store).await?;
    let started = Instant::now();
    let mut rows = 0;
    loop {
        let deleted =
            sqlx::query(AssertSqlSafe(statement.clone())).execute(store.pool()).await?.rows_affected();
        if deleted == 0 {
            break;
        }
        rows += deleted;
    }
    let elapsed = started.elapsed();
    Ok(Pass { rows, elapsed, wal_bytes: wal_since(store, &before).await? })
}

/// `day` dropped by an archive run whose log cutoff is its end (the row-wise deleted day before
/// it goes too, and the empty `before` partition): the run's log pass, timed.
async fn drop_day(store: &Store, day: &Partition, now: i64, first_shape: bool) -> anyhow::Result<Pass> {
    let rows = count(store, &day.table(store.backend())).await?;
    let cutoff = day.to_ms().unwrap_or(i64::MIN);
    let before = wal_position(store).await?;
    let report =
        archive_once(store, &archive_options(i64::MAX / 4, Some(now - cutoff), first_shape), now).await?;
    let wal_bytes = wal_since(store, &before).await?;
    let log = report.log.ok_or_else(|| anyhow::anyhow!("the archive run had no log pass"))?;
    anyhow::ensure!(log.dropped_partitions.contains(&day.name), "{} was not dropped: {log:?}", day.name);
    let left: i64 = store.query(&LOG_BEFORE).bind(cutoff).fetch_one(store.pool()).await?.try_get(0)?;
    anyhow::ensure!(left == 0, "the retention left {left} rows past its cutoff");
    Ok(Pass { rows: u64::try_from(rows).unwrap_or(0) + log.rows, elapsed: log.elapsed, wal_bytes })
}

static LOG_BEFORE: Sql = Sql::new("SELECT COUNT(*) FROM delivery_log WHERE logged_at_ms < ?");
static CLAIMS_BEFORE: Sql = Sql::new("SELECT COUNT(*) FROM idempotent_record WHERE claimed_at_ms < ?");

static PG_WAL: Sql = Sql::new("SELECT CAST(pg_current_wal_lsn() AS TEXT)");
static PG_WAL_SINCE: Sql =
    Sql::new("SELECT CAST(pg_wal_lsn_diff(pg_current_wal_lsn(), CAST(? AS pg_lsn)) AS BIGINT)");
static MYSQL_LSN: Sql = Sql::new(
    "SELECT CAST(VARIABLE_VALUE AS CHAR) FROM information_schema.GLOBAL_STATUS WHERE VARIABLE_NAME = 'INNODB_LSN_CURRENT'",
);

/// Where the server's write-ahead (redo) log stands: PostgreSQL's LSN, InnoDB's log sequence
/// number. Both count bytes; the server's other databases write to the same log.
async fn wal_position(store: &Store) -> anyhow::Result<String> {
    let sql = if store.backend() == Backend::Postgres { &PG_WAL } else { &MYSQL_LSN };
    Ok(store.query(sql).fetch_one(store.pool()).await?.try_get(0)?)
}

async fn wal_since(store: &Store, before: &str) -> anyhow::Result<i64> {
    if store.backend() == Backend::Postgres {
        return Ok(store.query(&PG_WAL_SINCE).bind(before).fetch_one(store.pool()).await?.try_get(0)?);
    }
    let now: i64 = wal_position(store).await?.parse()?;
    Ok(now - before.parse::<i64>()?)
}

async fn count(store: &Store, table: &str) -> anyhow::Result<i64> {
    let sql = format!("SELECT COUNT(*) FROM {table}");
    Ok(sqlx::query(AssertSqlSafe(sql)).fetch_one(store.pool()).await?.try_get(0)?)
}

/// The vacuum and statistics the server's own maintenance would leave after a bulk load.
async fn maintain(store: &Store) -> anyhow::Result<()> {
    let statements: &[&str] = match store.backend() {
        Backend::Postgres => &["VACUUM (ANALYZE) idempotent_record", "VACUUM (ANALYZE) delivery_log"],
        _ => &["ANALYZE TABLE idempotent_record", "ANALYZE TABLE delivery_log"],
    };
    for s in statements {
        sqlx::query(AssertSqlSafe(*s)).fetch_all(store.pool()).await?;
    }
    Ok(())
}

// A partitioned table's (and index's) bytes are its partitions': pg_partition_tree lists them
// (with the parent, of no bytes of its own), and nothing for a plain table.
static PG_PARTS: Sql = Sql::new(
    "SELECT 'heap', CAST(pg_table_size(CAST(? AS regclass)) + COALESCE((SELECT SUM(pg_table_size(t.relid)) \
     FROM pg_partition_tree(CAST(? AS regclass)) t), 0) AS BIGINT) \
     UNION ALL \
     SELECT CAST(i.relname AS TEXT), CAST(pg_relation_size(i.oid) + COALESCE((SELECT SUM(pg_relation_size(t.relid)) \
     FROM pg_partition_tree(i.oid) t), 0) AS BIGINT) \
     FROM pg_index x JOIN pg_class i ON i.oid = x.indexrelid \
     WHERE x.indrelid = CAST(? AS regclass) AND NOT x.indisprimary",
);
static PG_PRIMARY: Sql = Sql::new(
    "SELECT CAST(i.relname AS TEXT), CAST(pg_relation_size(i.oid) AS BIGINT) \
     FROM pg_index x JOIN pg_class i ON i.oid = x.indexrelid \
     WHERE x.indrelid = CAST(? AS regclass) AND x.indisprimary",
);
// A partitioned table's statistics are its partitions', as `table#P#partition`.
static MYSQL_PARTS: Sql = Sql::new(
    "SELECT CAST(index_name AS CHAR), CAST(SUM(stat_value) * @@innodb_page_size AS SIGNED) \
     FROM mysql.innodb_index_stats \
     WHERE database_name = DATABASE() AND (table_name = ? OR table_name LIKE ?) AND stat_name = 'size' \
     GROUP BY index_name ORDER BY index_name = 'PRIMARY' DESC, index_name",
);

/// The bytes of `table`'s parts: its heap first (with TOAST on PostgreSQL; the clustered
/// PRIMARY on MySQL/MariaDB), then each index.
async fn parts(store: &Store, table: &str) -> anyhow::Result<Vec<(String, i64)>> {
    let rows = if store.backend() == Backend::Postgres {
        let mut rows =
            store.query(&PG_PARTS).bind(table).bind(table).bind(table).fetch_all(store.pool()).await?;
        let mut primary = store.query(&PG_PRIMARY).bind(table).fetch_all(store.pool()).await?;
        rows.splice(1..1, primary.drain(..));
        rows
    } else {
        sqlx::query(AssertSqlSafe(format!("ANALYZE TABLE {table}"))).fetch_all(store.pool()).await?;
        store.query(&MYSQL_PARTS).bind(table).bind(format!("{table}#P#%")).fetch_all(store.pool()).await?
    };
    rows.iter()
        .map(|r| Ok((r.try_get::<String, _>(0)?, r.try_get::<i64, _>(1)?)))
        .collect::<Result<_, sqlx::Error>>()
        .map_err(Into::into)
}

static PG_COLUMNS: Sql = Sql::new(
    "SELECT CAST(s.attname AS TEXT), CAST(s.avg_width AS BIGINT) FROM pg_stats s \
     JOIN pg_attribute a ON a.attrelid = CAST(? AS regclass) AND a.attname = s.attname \
     WHERE s.schemaname = current_schema() AND s.tablename = ? ORDER BY a.attnum",
);

/// PostgreSQL: each column of `table` with its mean stored width from the statistics (the
/// last ANALYZE's sample); nothing on the other backends.
async fn columns(store: &Store, table: &str) -> anyhow::Result<Vec<(String, i64)>> {
    if store.backend() != Backend::Postgres {
        return Ok(Vec::new());
    }
    let rows = store.query(&PG_COLUMNS).bind(table).bind(table).fetch_all(store.pool()).await?;
    rows.iter()
        .map(|r| Ok((r.try_get::<String, _>(0)?, r.try_get::<i64, _>(1)?)))
        .collect::<Result<_, sqlx::Error>>()
        .map_err(Into::into)
}

fn total(parts: &[(String, i64)]) -> i64 {
    parts.iter().map(|(_, b)| b).sum()
}

// The fill. Claim n: bizId `D` and n in 18 digits, claimed at `start + (n - from) * step`; its
// processed delivery logged then, and a second row: a producer resend a minute later (even n)
// or a failed first attempt a second earlier (odd n). Numbers come from a thousand digits
// crossed with themselves, `?` rows from `?` on.
const NUMBERS: &str = "(SELECT a.n * 1000 + b.n + ? AS n FROM bench_digits a CROSS JOIN bench_digits b WHERE a.n * 1000 + b.n < ?) d";

/// How a backend spells a number in 18 digits, a number in 16 hex digits, an MD5, a
/// concatenation, and the base64 of a hex hash's first 12 bytes (what a claim keeps).
struct Dialect {
    digits: fn(&str) -> String,
    hex: fn(&str) -> String,
    md5: fn(&str) -> String,
    cat: fn(&[&str]) -> String,
    kept_hash: fn(&str) -> String,
}

impl Dialect {
    fn of(backend: Backend) -> Self {
        match backend {
            Backend::MySql => Self {
                digits: |e| format!("LPAD({e}, 18, '0')"),
                hex: |e| format!("LPAD(HEX({e}), 16, '0')"),
                md5: |e| format!("MD5({e})"),
                cat: |parts| format!("CONCAT({})", parts.join(", ")),
                kept_hash: |e| format!("TO_BASE64(LEFT(UNHEX({e}), 12))"),
            },
            Backend::Postgres | Backend::Sqlite => Self {
                digits: |e| format!("lpad(CAST({e} AS TEXT), 18, '0')"),
                hex: |e| format!("lpad(upper(to_hex({e})), 16, '0')"),
                md5: |e| format!("md5(CAST({e} AS TEXT))"),
                cat: |parts| parts.join(" || "),
                kept_hash: |e| format!("encode(substring(decode({e}, 'hex') from 1 for 12), 'base64')"),
            },
        }
    }
}

/// The two statements of one chunk on `backend`: the claims, and their deliveries in the order
/// of their time, so that the log's ids grow with time as the gate's appends make them. The
/// claims as the gate writes them (96 bits of the body's hash, no instance), or with `first_shape` as
/// it first wrote them (the whole hash, the instance).
fn fill_statements(backend: Backend, first_shape: bool) -> [String; 2] {
    let Dialect { digits, hex, md5, cat, kept_hash } = Dialect::of(backend);
    let biz_id = cat(&["'D'", &digits("d.n")]);
    let msg_id = |offset: &str| cat(&["'C0A8010A00002A9F'", &hex(&format!("d.n * 512 + {offset}"))]);
    let uniq_key = |pid: &str| cat(&[&format!("'7F000001{pid}2F1D'"), &hex("d.n")]);
    let payload_hash = cat(&[&md5("d.n"), &md5("d.n + 1")]);
    let instance = "'shop-consumer-7f9c4d5b8-xk2lp@10.42.3.17'";
    // What a claim keeps of the hash: its first 12 bytes in base64 (idemgate::outcome::claim_hash).
    let (claim_hash, claim_instance) =
        if first_shape { (payload_hash.clone(), instance) } else { (kept_hash(&md5("d.n")), "''") };
    let claims = format!(
        "INSERT INTO idempotent_record (consumer_group, biz_type, biz_id, execute_time, msg_id, uniq_key, \
         payload_hash, instance_id, claimed_at_ms) \
         SELECT ?, ?, {biz_id}, 0, {}, {}, {claim_hash}, {claim_instance}, ? + (d.n - ?) * ? FROM {NUMBERS} \
         ORDER BY d.n",
        msg_id("0"),
        uniq_key("3039")
    );
    let columns = "logged_at_ms, instance_id, consumer_group, msg_id, uniq_key, topic, tags, queue_id, \
                   queue_offset, reconsume_times, biz_type, biz_id, execute_time, outcome, cause, layer, \
                   payload_match, payload_hash, error, latency_us, trace_id";
    let trace_id = format!("CASE WHEN d.n % 4 = 0 THEN {} END", md5("d.n * 7"));
    // Row k of key n: k = 0 its processed delivery, k = 1 the second row: a producer resend a
    // minute later (even n) or a failed first attempt a second earlier (odd n).
    let row = |processed: &str, resend: &str, failed: &str| {
        format!("CASE WHEN r.k = 0 THEN {processed} WHEN d.n % 2 = 0 THEN {resend} ELSE {failed} END")
    };
    let log = format!(
        "INSERT INTO delivery_log ({columns}) \
         SELECT ? + (d.n - ?) * ? + {}, {instance}, ?, {}, {}, 'shop_orders', 'stock_deduct', d.n % 8, \
         d.n * 2 + r.k, 0, ?, {biz_id}, 0, {}, {}, {}, {}, {payload_hash}, {}, {}, {trace_id} \
         FROM {NUMBERS} CROSS JOIN (SELECT 0 AS k UNION ALL SELECT 1) r ORDER BY 1",
        row("0", "60000", "-1000"),
        row(&msg_id("0"), &msg_id("256"), &msg_id("0")),
        row(&uniq_key("3039"), &uniq_key("303A"), &uniq_key("3039")),
        row("'processed'", "'duplicate'", "'failed'"),
        row("NULL", "'producer_resend'", "NULL"),
        row("NULL", "'db'", "NULL"),
        row("NULL", "1", "NULL"),
        row("NULL", "NULL", "'handler stock.deduct: inventory service did not answer within 3000 ms'"),
        row("900 + d.n % 5000", "1200", "3000000"),
    );
    [claims, log]
}

/// Fills the tables from `from` claims to `to`, a million per statement, spread evenly over the
/// span before now; the claims from `log_start` on get their log rows. The first claim with log
/// rows.
async fn fill(store: &Store, from: u64, to: u64, log_start: i64, first_shape: bool) -> anyhow::Result<u64> {
    let [claims, log] = fill_statements(store.backend(), first_shape);
    let start = idemgate::clock::now_ms() - SPAN_DAYS * DAY_MS;
    let step = SPAN_DAYS * DAY_MS / (to - from) as i64;
    // The first claim whose rows are in the log's days (a failed first attempt is logged a
    // second before its claim).
    let logged_from = from + u64::try_from((log_start + 1_000 - start + step - 1) / step).unwrap_or(0);
    let (from_i, group, biz_type) = (from as i64, GROUP, shop::STOCK_DEDUCT);
    let mut at = from;
    while at < to {
        let rows = (to - at).min(CHUNK) as i64;
        let at_i = at as i64;
        query_built(store.backend(), claims.clone())
            .bind(group)
            .bind(biz_type)
            .bind(start)
            .bind(from_i)
            .bind(step)
            .bind(at_i)
            .bind(rows)
            .execute(store.pool())
            .await?;
        let log_at = at.max(logged_from);
        if log_at < at + rows as u64 {
            query_built(store.backend(), log.clone())
                .bind(start)
                .bind(from_i)
                .bind(step)
                .bind(group)
                .bind(biz_type)
                .bind(log_at as i64)
                .bind((at + rows as u64 - log_at) as i64)
                .execute(store.pool())
                .await?;
        }
        at += rows as u64;
        eprint!("\r  {} filled {} of {} claims", store.backend(), at - from, to - from);
    }
    eprintln!();
    Ok(logged_from.min(to - 1))
}

fn ms(us: u64) -> f64 {
    us as f64 / 1000.0
}

fn per_row(bytes: i64, rows: i64) -> f64 {
    bytes as f64 / rows.max(1) as f64
}

/// The steps as a Markdown table.
pub(crate) fn table(steps: &[Step]) -> String {
    let mut out = String::from(
        "| backend | claims | log rows | fill s | B/claim | B/log row | gate msg/s | × empty | gate p99 ms | naive msg/s | × empty | trace p50 / p99 ms | reconcile 1 day s (log rows) | archive 1 day rows/s | archive WAL B/row | gate p99 beside archive ms (× idle) | row-wise 1 day: rows | s | rows/s | WAL B/row | partition drop 1 day: rows | s | WAL bytes | log MB before → row-wise → drop |\n\
         |---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|\n",
    );
    for s in steps {
        out.push_str(&format!(
            "| {} | {} | {} | {:.0} | {:.0} | {:.0} | {:.0} | {:.2} | {:.1} | {:.0} | {:.2} | {:.1} / {:.1} | {:.2} ({}) | {:.0} | {:.0} | {:.1} ({:.2}) | {} | {:.2} | {:.0} | {:.0} | {} | {:.3} | {} | {:.0} → {:.0} → {:.0} |\n",
            s.backend,
            s.claims,
            s.log_rows,
            s.fill.as_secs_f64(),
            per_row(total(&s.claim_parts), s.claims),
            per_row(total(&s.log_parts), s.log_rows),
            s.gate.rate(),
            s.gate_ratio,
            ms(s.gate.latency.p99_us),
            s.naive.rate(),
            s.naive_ratio,
            ms(s.trace.p50_us),
            ms(s.trace.p99_us),
            s.reconcile.as_secs_f64(),
            s.reconciled_deliveries,
            s.archive.rate(),
            per_row(s.archive.wal_bytes, s.archive.rows as i64),
            ms(s.beside_archive.latency.p99_us),
            s.beside_archive.latency.p99_us as f64 / s.idle_p99_us.max(1) as f64,
            s.row_wise.rows,
            s.row_wise.elapsed.as_secs_f64(),
            s.row_wise.rate(),
            per_row(s.row_wise.wal_bytes, s.row_wise.rows as i64),
            s.retention.rows,
            s.retention.elapsed.as_secs_f64(),
            s.retention.wal_bytes,
            s.log_bytes_before as f64 / 1e6,
            s.log_bytes_row_wise as f64 / 1e6,
            s.log_bytes_after as f64 / 1e6,
        ));
    }
    out
}

/// Bytes per row of each part of both tables, at each step.
pub(crate) fn bytes_table(steps: &[Step]) -> String {
    let mut out =
        String::from("| backend | claims | table | part | bytes | B/row |\n|---|---|---|---|---|---|\n");
    for s in steps {
        for (table, parts, rows) in
            [("idempotent_record", &s.claim_parts, s.claims), ("delivery_log", &s.log_parts, s.log_rows)]
        {
            for (part, bytes) in parts {
                out.push_str(&format!(
                    "| {} | {} | {table} | {part} | {bytes} | {:.1} |\n",
                    s.backend,
                    s.claims,
                    per_row(*bytes, rows)
                ));
            }
        }
    }
    out
}

/// The claim's columns and their widths, with the row's fixed costs.
pub(crate) fn columns_table(columns: &[(String, i64)]) -> String {
    let mut out = String::from("| column | mean bytes |\n|---|---|\n");
    for (column, width) in columns {
        out.push_str(&format!("| {column} | {width} |\n"));
    }
    out.push_str(&format!(
        "| (the columns' sum; a heap tuple adds a 24-byte header, a 4-byte line pointer and alignment) | {} |\n",
        total(columns)
    ));
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn options() -> Options {
        Options {
            backends: vec![Backend::Postgres],
            sizes: vec![1_000_000, 10_000_000],
            messages: 1000,
            duplicates: 0.3,
            concurrency: 8,
            lookups: 10,
            log_days: 14,
            keep_database: false,
            first_claim_shape: false,
        }
    }

    #[test]
    fn sizes_must_ascend_within_bounds_and_sqlite_is_refused() {
        assert!(options().check().is_ok());
        let refused = |o: Options| o.check().unwrap_err().to_string();
        assert!(refused(Options { sizes: vec![10_000_000, 1_000_000], ..options() }).contains("ascend"));
        assert!(refused(Options { sizes: vec![10], ..options() }).contains("from 9000"));
        assert!(refused(Options { backends: vec![Backend::Sqlite], ..options() }).contains("sqlite"));
        assert!(refused(Options { duplicates: 0.95, ..options() }).contains("--duplicates"));
    }

    #[test]
    fn the_gates_keys_take_the_numbers_given_in_the_loaded_keys_form_and_keep_their_duplicates() {
        let (s, distinct) = stream(1000, 0.3, 5_000_000);
        let (first, last) = (format!("D{:018}", 5_000_000), format!("D{:018}", 5_001_000));
        assert!(s.iter().all(|d| d.keys[0] >= first && d.keys[0] < last && d.keys[0].len() == 19));
        let keys: std::collections::HashSet<_> = s.iter().map(|d| d.keys[0].clone()).collect();
        assert_eq!(keys.len(), distinct);
        let ids: std::collections::HashSet<_> = s.iter().map(|d| d.msg_id.clone()).collect();
        assert_eq!(ids.len(), s.len(), "every delivery has its own msgId");
    }

    #[test]
    fn each_fill_statement_binds_what_the_fill_gives_it() {
        for backend in [Backend::Postgres, Backend::MySql] {
            for first_shape in [false, true] {
                let [claims, log] = fill_statements(backend, first_shape);
                assert_eq!(claims.matches('?').count(), 7, "{backend}: {claims}");
                assert_eq!(log.matches('?').count(), 7, "{backend}: {log}");
                assert_eq!(claims.contains("shop-consumer"), first_shape, "{backend}: {claims}");
            }
        }
    }
}
