//! `idemgate-bench trace`: how long the trace page's lookup takes on a big database, against
//! the naive way.
//!
//! On a scratch database per backend: load 1,000,000 claims and 3,000,000 delivery-log rows (each
//! key with a processed delivery, a duplicate and a failed attempt, spread over 30 days), then
//! time [`trace`](idemgate::inspect::trace::trace) for random bizIds and msgIds: the whole story,
//! every statement the page runs. The naive way is the same tables as a team builds them
//! without idemgate (the claim's unique key and a msgId index only) queried by bizId:
//! `SELECT … FROM delivery_log WHERE biz_id = ?` and the claim by bizId, timed after the trace
//! indexes are dropped from the same data.
//!
//! Then a hot key: one bizId with `--hot-key-rows` deliveries (3,000,000 by default: a failed
//! attempt, the processed delivery, then redeliveries and producer resends without end, and a
//! second processed delivery hidden in the middle), traced from its first page and from a page
//! deep in its timeline. Each answer must name the double apply. Its old way is the query the
//! trace ran before its reads were bounded: the bizId's keys counted over every row, and the
//! oldest 500 rows as both the timeline and the summary.

use std::sync::LazyLock;
use std::time::{Duration, Instant};

use rand::Rng;
use sqlx::AssertSqlSafe;

use super::{Percentiles, create_digits, peak_rss_mib, rss_mib};
use idemgate::inspect::Limits;
use idemgate::inspect::trace::{
    self, Answer, FinalState, PAGE_DELIVERIES, SearchBy, TraceContext, TraceQuery,
};
use idemgate::store::{Backend, Sql, Store, StoreOptions};
use idemgate_shop as shop;
use idemgate_testkit::scratch::ScratchDb;

pub(crate) const GROUP: &str = "bench-trace";
/// The hot key's bizId.
pub(crate) const HOT_BIZ_ID: &str = "HOT-0";
const DAY_MS: i64 = 86_400_000;
/// The most deliveries the hot key is loaded with.
const MAX_HOT_ROWS: usize = 10_000_000;

/// What to measure: the flags of `idemgate-bench trace`.
#[derive(Debug, Clone, clap::Args)]
pub struct Options {
    #[arg(long, value_delimiter = ',', default_value = "postgres,mysql,sqlite")]
    pub backends: Vec<Backend>,
    /// Claims to load (at most 1,000,000); the delivery log gets three rows per claim.
    #[arg(long, default_value_t = 1_000_000)]
    pub claims: usize,
    /// Timed trace lookups per kind (by bizId, by msgId).
    #[arg(long, default_value_t = 2_000)]
    pub lookups: usize,
    /// Timed naive lookups (each one scans the log).
    #[arg(long, default_value_t = 10)]
    pub naive_lookups: usize,
    /// Deliveries of the hot key (0 leaves it out, at most 10,000,000).
    #[arg(long, default_value_t = 3_000_000)]
    pub hot_key_rows: usize,
    /// Timed traces of the hot key, from its first page and from a deep page each.
    #[arg(long, default_value_t = 200)]
    pub hot_lookups: usize,
    /// Timed lookups of the hot key the old way (each one reads every row of the key).
    #[arg(long, default_value_t = 10)]
    pub old_lookups: usize,
    /// The p99 every kind of trace must beat, in milliseconds; the run fails otherwise.
    #[arg(long, default_value_t = 50)]
    pub target_p99_ms: u64,
    /// Leave each backend's loaded database in place and print its URL, to study its plans
    /// (`idemgate trace … --explain`, the server's `ANALYZE`). The naive lookups, which drop
    /// the trace's indexes, are then not run. Drop the database by hand afterwards.
    #[arg(long)]
    pub keep_database: bool,
}

impl Default for Options {
    fn default() -> Self {
        Self {
            backends: vec![Backend::Postgres, Backend::MySql, Backend::Sqlite],
            claims: 1_000_000,
            lookups: 2_000,
            naive_lookups: 10,
            hot_key_rows: 3_000_000,
            hot_lookups: 200,
            old_lookups: 10,
            target_p99_ms: 50,
            keep_database: false,
        }
    }
}

/// One backend's figures.
#[derive(Debug, Clone)]
pub(crate) struct Report {
    pub backend: Backend,
    pub claims: usize,
    pub log_rows: i64,
    pub load: Duration,
    pub by_biz_id: Percentiles,
    pub by_msg_id: Percentiles,
    pub naive: Percentiles,
    pub naive_lookups: usize,
    /// Resident memory before and after the timed lookups, and the process's peak, MiB.
    pub rss_before_mib: f64,
    pub rss_after_mib: f64,
    pub peak_rss_mib: f64,
    pub hot: Option<HotReport>,
}

/// The hot key's figures.
#[derive(Debug, Clone)]
pub(crate) struct HotReport {
    pub rows: usize,
    pub load: Duration,
    /// The trace from the key's first page, and from a page deep in its timeline.
    pub first_page: Percentiles,
    pub deep_page: Percentiles,
    /// The old way: the bizId's keys counted over every row, and its oldest 500 rows.
    pub old: Percentiles,
    pub old_lookups: usize,
    /// Whether the old way's summary (its 500 rows) saw the second processed delivery.
    pub old_saw_double_apply: bool,
}

/// `idemgate-bench trace`: prints the setting, runs every backend and prints the table.
pub(crate) async fn command(options: Options) -> anyhow::Result<()> {
    println!(
        "bench trace: {} claims and {} delivery-log rows per backend; {} lookups by bizId and by msgId",
        options.claims,
        3 * options.claims,
        options.lookups
    );
    let reports = run(&options).await?;
    println!("\n{}", table(&reports));
    if reports.iter().any(|r| r.hot.is_some()) {
        println!("{}", hot_table(&reports));
    }
    check(&reports, Duration::from_millis(options.target_p99_ms))
}

/// Fails when any trace's p99, of random keys or of the hot key, is not under `target`.
pub(crate) fn check(reports: &[Report], target: Duration) -> anyhow::Result<()> {
    let target_us = target.as_micros() as u64;
    for r in reports {
        let mut p99s = vec![("by bizId", r.by_biz_id.p99_us), ("by msgId", r.by_msg_id.p99_us)];
        if let Some(hot) = &r.hot {
            p99s.extend([
                ("of the hot key", hot.first_page.p99_us),
                ("of the hot key's deep pages", hot.deep_page.p99_us),
            ]);
        }
        for (what, p99) in p99s {
            anyhow::ensure!(
                p99 < target_us,
                "on {}, the trace {what} took {:.1} ms at p99, over the target of {} ms",
                r.backend,
                p99 as f64 / 1000.0,
                target.as_millis()
            );
        }
    }
    Ok(())
}

/// Runs the benchmark on each backend.
pub(crate) async fn run(options: &Options) -> anyhow::Result<Vec<Report>> {
    anyhow::ensure!(
        (1..=1_000_000).contains(&options.claims),
        "--claims must be from 1 to 1000000, not {}",
        options.claims
    );
    anyhow::ensure!(
        options.hot_key_rows == 0 || (4..=MAX_HOT_ROWS).contains(&options.hot_key_rows),
        "--hot-key-rows must be 0 or from 4 to {MAX_HOT_ROWS}, not {}",
        options.hot_key_rows
    );
    anyhow::ensure!(
        options.lookups > 0
            && options.hot_lookups > 0
            && options.old_lookups > 0
            && options.naive_lookups > 0,
        "--lookups, --hot-lookups, --old-lookups and --naive-lookups must be at least 1"
    );
    let mut reports = Vec::new();
    for &backend in &options.backends {
        let scratch =
            ScratchDb::create(backend, &StoreOptions { max_connections: 4, ..Default::default() }).await?;
        let result = measure(&scratch.store, backend, options).await;
        if options.keep_database {
            println!("bench trace: the {backend} database is kept at {}", scratch.keep().await);
        } else {
            scratch.drop_now().await;
        }
        reports.push(result?);
    }
    Ok(reports)
}

async fn measure(store: &Store, backend: Backend, options: &Options) -> anyhow::Result<Report> {
    // The tables as the service shapes them at start (the claim key led by biz_id).
    let settings = idemgate::archive::ArchiveSettings { partition_log: false, ..Default::default() };
    idemgate::archive::prepare_tables(store, &settings, "bench", idemgate::clock::now_ms()).await?;
    let started = Instant::now();
    load(store, options.claims, 30 * DAY_MS).await?;
    let load = started.elapsed();
    let log_rows = store.query(&COUNT_LOG).fetch_one(store.pool()).await.map(|r| {
        use sqlx::Row;
        r.get::<i64, _>(0)
    })?;

    let ctx = TraceContext {
        limits: Limits { timeout: Duration::from_secs(30) },
        retention: Some(idemgate::archive::LogRetention::days(90)),
        grafana_url: Some("http://grafana:3000/d/idemgate".to_owned()),
        trace_url_template: None,
        dashboard_url_template: None,
        describers: shop::handlers().by_biz_type(&idemgate::route::Routes::new(&shop::routes(shop::TOPIC))?),
    };
    let mut rng = rand::rng();
    // Warm the caches the way a page opened a few times would.
    for _ in 0..50 {
        let n = rng.random_range(0..options.claims);
        lookup(store, &ctx, &format!("T-{n}"), SearchBy::BizId).await?;
    }
    let rss_before_mib = rss_mib();
    let mut by_biz_id = Vec::with_capacity(options.lookups);
    for _ in 0..options.lookups {
        let n = rng.random_range(0..options.claims);
        let t = Instant::now();
        lookup(store, &ctx, &format!("T-{n}"), SearchBy::BizId).await?;
        by_biz_id.push(t.elapsed().as_micros() as u64);
    }
    let mut by_msg_id = Vec::with_capacity(options.lookups);
    for _ in 0..options.lookups {
        let n = rng.random_range(0..options.claims);
        let t = Instant::now();
        lookup(store, &ctx, &format!("D-{n}"), SearchBy::MsgId).await?;
        by_msg_id.push(t.elapsed().as_micros() as u64);
    }
    let rss_after_mib = rss_mib();

    let hot = match options.hot_key_rows {
        0 => None,
        rows => Some(hot_key(store, &ctx, rows, options).await?),
    };

    // The naive schema: drop what idemgate adds for tracing, keep the claim key (led by the
    // group, as a unique key is first written) and msgId.
    // A database kept for study keeps its indexes, and the naive way is not timed.
    let naive_lookups = if options.keep_database { 0 } else { options.naive_lookups };
    if naive_lookups > 0 {
        for drop in naive_schema(backend) {
            sqlx::query(AssertSqlSafe(drop)).execute(store.pool()).await?;
        }
    }
    let mut naive = Vec::with_capacity(options.naive_lookups);
    for _ in 0..naive_lookups {
        let n = rng.random_range(0..options.claims);
        let key = format!("T-{n}");
        let t = Instant::now();
        let claim = store.query(&NAIVE_CLAIM).bind(key.as_str()).fetch_all(store.pool()).await?;
        let rows = store.query(&NAIVE_LOG).bind(key.as_str()).fetch_all(store.pool()).await?;
        naive.push(t.elapsed().as_micros() as u64);
        anyhow::ensure!(
            claim.len() == 1 && rows.len() == 3,
            "naive lookup of {key}: {} claims, {} rows",
            claim.len(),
            rows.len()
        );
    }
    Ok(Report {
        backend,
        claims: options.claims,
        log_rows,
        load,
        by_biz_id: Percentiles::of(&mut by_biz_id),
        by_msg_id: Percentiles::of(&mut by_msg_id),
        naive: Percentiles::of(&mut naive),
        naive_lookups,
        rss_before_mib,
        rss_after_mib,
        peak_rss_mib: peak_rss_mib(),
        hot,
    })
}

/// Loads the hot key and times its traces, then the old way's reads of it.
async fn hot_key(
    store: &Store,
    ctx: &TraceContext,
    rows: usize,
    options: &Options,
) -> anyhow::Result<HotReport> {
    let started = Instant::now();
    let hot = load_hot_key(store, rows, 30 * DAY_MS).await?;
    let load = started.elapsed();
    let mut rng = rand::rng();
    for _ in 0..5 {
        hot_lookup(store, ctx, None).await?;
    }
    let mut first_page = Vec::with_capacity(options.hot_lookups);
    let mut deep_page = Vec::with_capacity(options.hot_lookups);
    for _ in 0..options.hot_lookups {
        let t = Instant::now();
        hot_lookup(store, ctx, None).await?;
        first_page.push(t.elapsed().as_micros() as u64);
        // A page from a random delivery past the first page: the cursor of the row logged then.
        let at = hot.logged_at_ms(rng.random_range(PAGE_DELIVERIES..rows));
        let t = Instant::now();
        hot_lookup(store, ctx, Some(&format!("{at}-0"))).await?;
        deep_page.push(t.elapsed().as_micros() as u64);
    }
    let mut old = Vec::with_capacity(options.old_lookups);
    let mut old_saw_double_apply = false;
    for _ in 0..options.old_lookups {
        let t = Instant::now();
        let keys = store.query(&OLD_KEYS_OF_BIZ_ID).bind(HOT_BIZ_ID).fetch_all(store.pool()).await?;
        let page = store.query(&OLD_OLDEST_PAGE).bind(HOT_BIZ_ID).fetch_all(store.pool()).await?;
        old.push(t.elapsed().as_micros() as u64);
        use sqlx::Row;
        let counted: i64 = keys.first().map(|r| r.try_get(4)).transpose()?.unwrap_or(0);
        anyhow::ensure!(
            keys.len() == 1 && counted == rows as i64 && page.len() == OLD_PAGE_ROWS,
            "the old way's reads of the hot key: {} keys, {counted} rows counted, a page of {}",
            keys.len(),
            page.len()
        );
        let processed =
            page.iter().filter(|r| r.try_get::<String, _>("outcome").is_ok_and(|o| o == "processed")).count();
        old_saw_double_apply = processed > 1;
    }
    Ok(HotReport {
        rows,
        load,
        first_page: Percentiles::of(&mut first_page),
        deep_page: Percentiles::of(&mut deep_page),
        old: Percentiles::of(&mut old),
        old_lookups: options.old_lookups,
        old_saw_double_apply,
    })
}

/// One trace of the hot key, checked: a full page of its timeline, every page but the last
/// with a later one, and a summary that names the double apply however deep it lies.
async fn hot_lookup(store: &Store, ctx: &TraceContext, after: Option<&str>) -> anyhow::Result<()> {
    let query = TraceQuery::new(HOT_BIZ_ID, SearchBy::BizId, None, None, None)?.paged(after, None)?;
    match trace::trace(store, ctx, &query).await? {
        Answer::Story { story, .. }
            if !story.deliveries.is_empty()
                && (after.is_none() || story.previous.is_some())
                && story.summary.processed == 2
                && story.summary.final_state == FinalState::AppliedTwice =>
        {
            Ok(())
        }
        Answer::Story { story, .. } => anyhow::bail!(
            "trace of the hot key after {after:?}: {} deliveries on the page, {} processed, {:?}",
            story.deliveries.len(),
            story.summary.processed,
            story.summary.final_state
        ),
        other => anyhow::bail!("trace of the hot key: unexpected answer {other:?}"),
    }
}

/// One trace, checked: exactly the key's story with its three deliveries.
async fn lookup(store: &Store, ctx: &TraceContext, text: &str, by: SearchBy) -> anyhow::Result<()> {
    let query = TraceQuery::new(text, by, None, None, None)?;
    match trace::trace(store, ctx, &query).await? {
        Answer::Story { story, .. } if story.deliveries.len() == 3 && story.claim.is_some() => Ok(()),
        other => anyhow::bail!("trace of {text}: unexpected answer {other:?}"),
    }
}

fn naive_schema(backend: Backend) -> [String; 5] {
    let drop = |index: &str, table: &str| match backend {
        Backend::MySql => format!("DROP INDEX {index} ON {table}"),
        Backend::Postgres | Backend::Sqlite => format!("DROP INDEX {index}"),
    };
    let first_key = "(consumer_group, biz_type, biz_id, execute_time)";
    let claim_key = match backend {
        Backend::MySql => format!(
            "ALTER TABLE idempotent_record DROP INDEX idempotent_record_claim_key, \
             ADD UNIQUE KEY idempotent_record_claim_key {first_key}"
        ),
        Backend::Postgres => format!(
            "ALTER TABLE idempotent_record DROP CONSTRAINT idempotent_record_claim_key, \
             ADD CONSTRAINT idempotent_record_claim_key UNIQUE {first_key}"
        ),
        // SQLite keeps its first key, beside its index on biz_id.
        Backend::Sqlite => drop("idempotent_record_biz_id", "idempotent_record"),
    };
    [
        drop("delivery_log_key", "delivery_log"),
        drop("delivery_log_key_outcome", "delivery_log"),
        drop("delivery_log_uniq_key", "delivery_log"),
        claim_key,
        drop("idempotent_record_archive_key", "idempotent_record_archive"),
    ]
}

static COUNT_LOG: Sql = Sql::new("SELECT COUNT(*) FROM delivery_log");
// The trace's reads of a bizId before they were bounded: every row of the bizId counted by key,
// and the oldest page, which was also all the summary saw.
static OLD_KEYS_OF_BIZ_ID: Sql = Sql::new(
    "SELECT consumer_group, biz_type, biz_id, execute_time, COUNT(*), MIN(logged_at_ms), MAX(logged_at_ms) \
     FROM delivery_log WHERE biz_id = ? GROUP BY consumer_group, biz_type, biz_id, execute_time LIMIT 51",
);
/// The rows the old way's page held: the oldest 500 (today's timeline page holds
/// [`PAGE_DELIVERIES`]).
const OLD_PAGE_ROWS: usize = 500;
static OLD_OLDEST_PAGE: Sql =
    Sql::new("SELECT * FROM delivery_log WHERE biz_id = ? ORDER BY logged_at_ms, id LIMIT 500");
static NAIVE_CLAIM: Sql = Sql::new("SELECT * FROM idempotent_record WHERE biz_id = ?");
static NAIVE_LOG: Sql = Sql::new("SELECT * FROM delivery_log WHERE biz_id = ? ORDER BY logged_at_ms");

// Keys T-n; msgIds M-n (processed), D-n (duplicate), F-n (failed); spread over 30 days.
// String concatenation differs: || on PostgreSQL and SQLite, CONCAT on MySQL/MariaDB.
static CLAIMS_PIPES: Sql = Sql::new(
    "INSERT INTO idempotent_record (consumer_group, biz_type, biz_id, execute_time, msg_id, uniq_key, \
     payload_hash, instance_id, claimed_at_ms) \
     SELECT ?, ?, 'T-' || CAST(a.n * 1000 + b.n AS TEXT), 0, 'M-' || CAST(a.n * 1000 + b.n AS TEXT), \
     'U-' || CAST(a.n * 1000 + b.n AS TEXT), 'hash', 'bench', ? + (a.n * 1000 + b.n) * ? \
     FROM bench_digits a CROSS JOIN bench_digits b WHERE a.n * 1000 + b.n < ?",
);
static CLAIMS_CONCAT: Sql = Sql::new(
    "INSERT INTO idempotent_record (consumer_group, biz_type, biz_id, execute_time, msg_id, uniq_key, \
     payload_hash, instance_id, claimed_at_ms) \
     SELECT ?, ?, CONCAT('T-', a.n * 1000 + b.n), 0, CONCAT('M-', a.n * 1000 + b.n), \
     CONCAT('U-', a.n * 1000 + b.n), 'hash', 'bench', ? + (a.n * 1000 + b.n) * ? \
     FROM bench_digits a CROSS JOIN bench_digits b WHERE a.n * 1000 + b.n < ?",
);
static LOG_PIPES: Sql = Sql::new(
    "INSERT INTO delivery_log (logged_at_ms, instance_id, consumer_group, msg_id, uniq_key, topic, tags, \
     queue_id, queue_offset, reconsume_times, biz_type, biz_id, execute_time, outcome, cause, layer, \
     payload_match, payload_hash, error, latency_us) \
     SELECT ? + (a.n * 1000 + b.n) * ?, 'bench', ?, ? || CAST(a.n * 1000 + b.n AS TEXT), \
     ? || CAST(a.n * 1000 + b.n AS TEXT), 'shop', 'stock_deduct', b.n % 8, a.n * 1000 + b.n, ?, ?, \
     'T-' || CAST(a.n * 1000 + b.n AS TEXT), 0, ?, ?, ?, ?, 'hash', ?, 900 \
     FROM bench_digits a CROSS JOIN bench_digits b WHERE a.n * 1000 + b.n < ?",
);
static LOG_CONCAT: Sql = Sql::new(
    "INSERT INTO delivery_log (logged_at_ms, instance_id, consumer_group, msg_id, uniq_key, topic, tags, \
     queue_id, queue_offset, reconsume_times, biz_type, biz_id, execute_time, outcome, cause, layer, \
     payload_match, payload_hash, error, latency_us) \
     SELECT ? + (a.n * 1000 + b.n) * ?, 'bench', ?, CONCAT(?, a.n * 1000 + b.n), \
     CONCAT(?, a.n * 1000 + b.n), 'shop', 'stock_deduct', b.n % 8, a.n * 1000 + b.n, ?, ?, \
     CONCAT('T-', a.n * 1000 + b.n), 0, ?, ?, ?, ?, 'hash', ?, 900 \
     FROM bench_digits a CROSS JOIN bench_digits b WHERE a.n * 1000 + b.n < ?",
);

/// One of the three deliveries every key gets in the loaded log.
struct LogKind {
    msg_prefix: &'static str,
    uniq_prefix: &'static str,
    reconsume_times: i32,
    outcome: &'static str,
    cause: Option<&'static str>,
    layer: Option<&'static str>,
    payload_match: Option<i16>,
    error: Option<&'static str>,
    /// Logged this long after the key's claim (a failed attempt comes first).
    offset_ms: i64,
}

const LOG_KINDS: [LogKind; 3] = [
    LogKind {
        msg_prefix: "F-",
        uniq_prefix: "U-",
        reconsume_times: 0,
        outcome: "failed",
        cause: None,
        layer: None,
        payload_match: None,
        error: Some("downstream timeout"),
        offset_ms: -1_000,
    },
    LogKind {
        msg_prefix: "M-",
        uniq_prefix: "U-",
        reconsume_times: 1,
        outcome: "processed",
        cause: None,
        layer: None,
        payload_match: None,
        error: None,
        offset_ms: 0,
    },
    LogKind {
        msg_prefix: "D-",
        uniq_prefix: "V-",
        reconsume_times: 0,
        outcome: "duplicate",
        cause: Some("producer_resend"),
        layer: Some("db"),
        payload_match: Some(1),
        error: None,
        offset_ms: 60_000,
    },
];

/// `claims` claims and three log rows per claim (a failed attempt, the processed delivery and a
/// producer-resend duplicate), spread over the `span_ms` before now, each set in one statement.
pub(crate) async fn load(store: &Store, claims: usize, span_ms: i64) -> anyhow::Result<()> {
    create_digits(store).await?;
    let mysql = store.backend() == Backend::MySql;
    let start = idemgate::clock::now_ms() - span_ms;
    // Keys are spread evenly over the span.
    let step = (span_ms / claims as i64).max(1);
    let rows = claims as i64;
    store
        .query(if mysql { &CLAIMS_CONCAT } else { &CLAIMS_PIPES })
        .bind(GROUP)
        .bind(shop::STOCK_DEDUCT)
        .bind(start)
        .bind(step)
        .bind(rows)
        .execute(store.pool())
        .await?;
    for kind in LOG_KINDS {
        store
            .query(if mysql { &LOG_CONCAT } else { &LOG_PIPES })
            .bind(start + kind.offset_ms)
            .bind(step)
            .bind(GROUP)
            .bind(kind.msg_prefix)
            .bind(kind.uniq_prefix)
            .bind(kind.reconsume_times)
            .bind(shop::STOCK_DEDUCT)
            .bind(kind.outcome)
            .bind(kind.cause)
            .bind(kind.layer)
            .bind(kind.payload_match)
            .bind(kind.error)
            .bind(rows)
            .execute(store.pool())
            .await?;
    }
    analyze(store).await
}

// The hot key's deliveries, row i of them a million at a time: i = 0 a failed attempt, i = 1
// and i = the `double` bound its processed deliveries, every third other row a producer resend
// under its own msgId, the rest redeliveries of the first msgId.
/// The hot key's load statement, with string concatenation as the backend spells it: `||` on
/// PostgreSQL and SQLite, `CONCAT` on MySQL/MariaDB.
fn hot_log(mysql: bool) -> &'static Sql {
    static PIPES: LazyLock<Sql> = LazyLock::new(|| hot_log_statement(false));
    static CONCAT: LazyLock<Sql> = LazyLock::new(|| hot_log_statement(true));
    if mysql { &CONCAT } else { &PIPES }
}

fn hot_log_statement(mysql: bool) -> Sql {
    let numbered = |prefix: &str| {
        if mysql { format!("CONCAT('{prefix}', s.i)") } else { format!("'{prefix}' || CAST(s.i AS TEXT)") }
    };
    let text = format!(
        "INSERT INTO delivery_log (logged_at_ms, instance_id, consumer_group, msg_id, uniq_key, topic, tags, \
         queue_id, queue_offset, reconsume_times, biz_type, biz_id, execute_time, outcome, cause, layer, \
         payload_match, payload_hash, error, latency_us) \
         SELECT ? + s.i * ?, 'bench', ?, \
         CASE WHEN s.i > 1 AND s.i % 3 = 0 THEN {} ELSE 'HM-0' END, \
         CASE WHEN s.i > 1 AND s.i % 3 = 0 THEN {} ELSE 'HU-0' END, \
         'shop', 'stock_deduct', 0, s.i, s.i % 16, ?, ?, 0, \
         CASE WHEN s.i = 0 THEN 'failed' WHEN s.i = 1 OR s.i = ? THEN 'processed' ELSE 'duplicate' END, \
         CASE WHEN s.i < 2 OR s.i = ? THEN NULL WHEN s.i % 3 = 0 THEN 'producer_resend' ELSE 'redelivery' END, \
         CASE WHEN s.i < 2 OR s.i = ? THEN NULL ELSE 'db' END, \
         CASE WHEN s.i < 2 OR s.i = ? THEN NULL ELSE 1 END, \
         'hash', CASE WHEN s.i = 0 THEN 'downstream timeout' ELSE NULL END, 900 \
         FROM (SELECT ? * 1000000 + b.n * 1000 + c.n AS i FROM bench_digits b CROSS JOIN bench_digits c) s \
         WHERE s.i < ?",
        numbered("HR-"),
        numbered("HV-"),
    );
    Sql::new(Box::leak(text.into_boxed_str()))
}
static HOT_CLAIM: Sql = Sql::new(
    "INSERT INTO idempotent_record (consumer_group, biz_type, biz_id, execute_time, msg_id, uniq_key, \
     payload_hash, instance_id, claimed_at_ms) VALUES (?, ?, ?, 0, 'HM-0', 'HU-0', 'hash', 'bench', ?)",
);

/// Where the hot key's deliveries lie in time.
#[derive(Debug, Clone, Copy)]
pub(crate) struct HotKey {
    start_ms: i64,
    step_ms: i64,
}

impl HotKey {
    /// When the hot key's delivery `i` (0 the oldest) was logged.
    pub(crate) fn logged_at_ms(self, i: usize) -> i64 {
        self.start_ms + i as i64 * self.step_ms
    }
}

/// The hot key [`HOT_BIZ_ID`]: its claim and `rows` deliveries spread over the `span_ms` before
/// now, a million rows a statement, with a second processed delivery at the middle. Needs
/// `bench_digits` ([`create_digits`]).
pub(crate) async fn load_hot_key(store: &Store, rows: usize, span_ms: i64) -> anyhow::Result<HotKey> {
    anyhow::ensure!((4..=MAX_HOT_ROWS).contains(&rows), "a hot key of {rows} deliveries");
    let mysql = store.backend() == Backend::MySql;
    let start_ms = idemgate::clock::now_ms() - span_ms;
    let step_ms = (span_ms / rows as i64).max(1);
    let double = (rows / 2) as i64 + 1;
    store
        .query(&HOT_CLAIM)
        .bind(GROUP)
        .bind(shop::STOCK_DEDUCT)
        .bind(HOT_BIZ_ID)
        .bind(start_ms + step_ms)
        .execute(store.pool())
        .await?;
    for million in 0..rows.div_ceil(1_000_000) as i64 {
        store
            .query(hot_log(mysql))
            .bind(start_ms)
            .bind(step_ms)
            .bind(GROUP)
            .bind(shop::STOCK_DEDUCT)
            .bind(HOT_BIZ_ID)
            .bind(double)
            .bind(double)
            .bind(double)
            .bind(double)
            .bind(million)
            .bind(rows as i64)
            .execute(store.pool())
            .await?;
    }
    analyze(store).await?;
    Ok(HotKey { start_ms, step_ms })
}

async fn analyze(store: &Store) -> anyhow::Result<()> {
    let analyze: &[&str] = match store.backend() {
        Backend::Postgres => &["ANALYZE idempotent_record", "ANALYZE delivery_log"],
        Backend::MySql => &["ANALYZE TABLE idempotent_record", "ANALYZE TABLE delivery_log"],
        Backend::Sqlite => &["ANALYZE"],
    };
    for statement in analyze {
        let _ = sqlx::query(AssertSqlSafe(*statement)).fetch_all(store.pool()).await?;
    }
    Ok(())
}

/// "p50 / p99" in milliseconds, with `decimals` digits after the point.
fn p50_p99(p: &Percentiles, decimals: usize) -> String {
    let ms = |us: u64| us as f64 / 1000.0;
    format!("{:.*} / {:.*}", decimals, ms(p.p50_us), decimals, ms(p.p99_us))
}

/// The hot key's figures as a Markdown table.
pub(crate) fn hot_table(reports: &[Report]) -> String {
    let mut out = String::from(
        "| backend | hot key's deliveries | load s | trace, first page p50 / p99 ms | trace, deep page p50 / p99 ms | old way p50 / p99 ms | old way's summary saw the double apply |\n\
         |---|---|---|---|---|---|---|\n",
    );
    for r in reports {
        let Some(h) = &r.hot else { continue };
        out.push_str(&format!(
            "| {} | {} | {:.0} | {} | {} | {} ({} lookups) | {} |\n",
            r.backend,
            h.rows,
            h.load.as_secs_f64(),
            p50_p99(&h.first_page, 2),
            p50_p99(&h.deep_page, 2),
            p50_p99(&h.old, 0),
            h.old_lookups,
            if h.old_saw_double_apply { "yes" } else { "no" },
        ));
    }
    out
}

/// The figures as a Markdown table.
pub(crate) fn table(reports: &[Report]) -> String {
    let mut out = String::from(
        "| backend | claims | log rows | load s | trace by bizId p50 / p99 ms | trace by msgId p50 / p99 ms | naive by bizId p50 / p99 ms | RSS before / after / peak MiB |\n\
         |---|---|---|---|---|---|---|---|\n",
    );
    for r in reports {
        out.push_str(&format!(
            "| {} | {} | {} | {:.0} | {} | {} | {} | {:.0} / {:.0} / {:.0} |\n",
            r.backend,
            r.claims,
            r.log_rows,
            r.load.as_secs_f64(),
            p50_p99(&r.by_biz_id, 2),
            p50_p99(&r.by_msg_id, 2),
            match r.naive_lookups {
                0 => "not run".to_owned(),
                n => format!("{} ({n} lookups)", p50_p99(&r.naive, 0)),
            },
            r.rss_before_mib,
            r.rss_after_mib,
            r.peak_rss_mib,
        ));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn p99(ms: u64) -> Percentiles {
        Percentiles { p50_us: 1_000, p99_us: ms * 1_000, max_us: ms * 1_000 }
    }

    fn report(hot_deep_ms: u64) -> Report {
        Report {
            backend: Backend::Sqlite,
            claims: 1,
            log_rows: 3,
            load: Duration::ZERO,
            by_biz_id: p99(2),
            by_msg_id: p99(2),
            naive: p99(400),
            naive_lookups: 1,
            rss_before_mib: 0.0,
            rss_after_mib: 0.0,
            peak_rss_mib: 0.0,
            hot: Some(HotReport {
                rows: 4,
                load: Duration::ZERO,
                first_page: p99(3),
                deep_page: p99(hot_deep_ms),
                old: p99(1_000),
                old_lookups: 1,
                old_saw_double_apply: false,
            }),
        }
    }

    #[test]
    fn a_trace_at_or_over_the_target_fails_the_run_and_the_naive_way_does_not() {
        let target = Duration::from_millis(50);
        assert!(check(&[report(49)], target).is_ok());
        let err = check(&[report(50)], target).unwrap_err().to_string();
        assert!(err.contains("the hot key's deep pages took 50.0 ms"), "{err}");
    }

    #[test]
    fn the_hot_keys_deliveries_are_spread_one_step_apart_from_the_start() {
        let hot = HotKey { start_ms: 1_000, step_ms: 864 };
        assert_eq!(hot.logged_at_ms(0), 1_000);
        assert_eq!(hot.logged_at_ms(2_999_999), 1_000 + 2_999_999 * 864);
    }
}
