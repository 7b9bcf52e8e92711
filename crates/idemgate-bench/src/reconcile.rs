//! `idemgate-bench reconcile`: every statement of a reconcile run, and the overview's, on a day
//! of 1,000,000 deliveries that the planner has no statistics about, against the same
//! statements written the way one writes them first.
//!
//! On a scratch database per backend: fresh tables with automatic statistics off
//! (PostgreSQL `autovacuum_enabled = false`, InnoDB `STATS_AUTO_RECALC = 0`) and no `ANALYZE`,
//! as a database is after a fresh start, a burst or an archive run, filled by [`load`] with
//! the example shop's traffic over 24 hours (orders, payments and deductions with
//! redeliveries, failed attempts, poison payments dead-lettered, an archive of the day before)
//! and a few planted anomalies of every kind; with `span_hours` above 24 the same deliveries
//! spread over more days, as a log and claims kept for a week hold them, and the run still
//! reconciles the last 24 hours. Then each statement is timed, as written before
//! (`NOT EXISTS` anti joins, one-sided time ranges) and as idemgate writes it, first on those
//! stale statistics (and, on PostgreSQL, the old statements once more with
//! `enable_nestloop = off`, the other way to keep a nested loop out), then after an
//! `ANALYZE`, whose own time is reported; the plans' reads are printed
//! ([`idemgate_testkit::plan`]). The whole run must find exactly the planted anomalies.

use std::collections::{BTreeMap, BTreeSet};
use std::time::{Duration, Instant};

use sqlx::{AssertSqlSafe, Executor, Row};

use idemgate::inspect::overview;
use idemgate::inspect::{Limits, READ_BOUNDS};
use idemgate::layout::Layout;
use idemgate::reconcile::{AnomalyKind, ReconcileOptions, reconcile_once};
use idemgate::store::{Arg, Backend, Bound, Sql, Store, StoreOptions, bind_all, query_built};
use idemgate_shop::STOCK_LEDGER_CHECK;
use idemgate_testkit::plan::{self, Read};
use idemgate_testkit::scratch::ScratchDb;

const MINUTE_MS: i64 = 60_000;
const HOUR_MS: i64 = 60 * MINUTE_MS;
pub const GROUP: &str = "bench-reconcile";

/// What to measure: the flags of `idemgate-bench reconcile`.
#[derive(Debug, Clone, clap::Args)]
pub struct Options {
    #[arg(long, value_delimiter = ',', default_value = "postgres,mysql")]
    pub backends: Vec<Backend>,
    /// Deliveries to load, about (1,000 to 3,000,000).
    // The shape of the traffic sets the exact count.
    #[arg(long, default_value_t = 1_000_000)]
    pub deliveries: usize,
    /// Hours the deliveries are spread over (24 to 2160); the run reconciles the last 24.
    #[arg(long, default_value_t = 24)]
    pub span_hours: u32,
    /// Seconds a statement may run before it is cancelled and reported as such.
    #[arg(long, default_value = "120", value_parser = super::seconds)]
    pub statement_timeout: Duration,
}

impl Default for Options {
    fn default() -> Self {
        Self {
            backends: vec![Backend::Postgres, Backend::MySql],
            deliveries: 1_000_000,
            span_hours: 24,
            statement_timeout: Duration::from_secs(120),
        }
    }
}

/// How one execution of a statement went.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) enum Timing {
    Done(Duration),
    /// Cancelled at the statement timeout.
    Cancelled(Duration),
    /// Not measured on this backend.
    Skipped,
}

impl std::fmt::Display for Timing {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Done(d) => write!(f, "{:.3}", d.as_secs_f64()),
            Self::Cancelled(d) => write!(f, "> {:.0} (cancelled)", d.as_secs_f64()),
            Self::Skipped => f.write_str("—"),
        }
    }
}

/// One statement's figures.
#[derive(Debug, Clone)]
pub(crate) struct StatementReport {
    pub name: String,
    pub before_stale: Timing,
    pub before_no_nestloop: Timing,
    pub after_stale: Timing,
    pub before_analyzed: Timing,
    pub after_analyzed: Timing,
    /// The reads of each plan on stale statistics.
    pub plan_before: Vec<Read>,
    pub plan_after: Vec<Read>,
}

/// One backend's figures.
#[derive(Debug, Clone)]
pub(crate) struct Report {
    pub backend: Backend,
    pub deliveries: i64,
    /// Of them, in the reconciled 24 hours.
    pub in_window: i64,
    pub span_hours: u32,
    pub load: Duration,
    pub analyze: Duration,
    pub statements: Vec<StatementReport>,
    /// The whole run (`reconcile_once`) and the whole overview read, on stale statistics.
    pub run: Duration,
    pub overview: Duration,
    pub anomalies: usize,
}

/// `idemgate-bench reconcile`: prints the setting, runs every backend and prints the table.
pub(crate) async fn command(options: Options) -> anyhow::Result<()> {
    println!(
        "bench reconcile: about {} deliveries over {} hours per backend, the last 24 reconciled, \
         statistics never gathered; statements cancelled after {} s",
        options.deliveries,
        options.span_hours,
        options.statement_timeout.as_secs()
    );
    let reports = run(&options, |line| eprintln!("  {line}")).await?;
    println!("\n{}", table(&reports));
    Ok(())
}

/// Runs the benchmark on each backend.
pub(crate) async fn run(options: &Options, progress: impl Fn(&str)) -> anyhow::Result<Vec<Report>> {
    anyhow::ensure!(
        (1_000..=3_000_000).contains(&options.deliveries),
        "--deliveries must be from 1000 to 3000000, not {}",
        options.deliveries
    );
    anyhow::ensure!(
        (24..=24 * 90).contains(&options.span_hours),
        "--span-hours must be from 24 to 2160, not {}",
        options.span_hours
    );
    let mut reports = Vec::new();
    for &backend in &options.backends {
        anyhow::ensure!(backend != Backend::Sqlite, "bench reconcile runs on postgres and mysql");
        let scratch =
            ScratchDb::create(backend, &StoreOptions { max_connections: 4, ..Default::default() }).await?;
        let result = measure(&scratch.store, options, &progress).await;
        scratch.drop_now().await;
        reports.push(result?);
    }
    Ok(reports)
}

macro_rules! naive_claimed {
    ($table:literal) => {
        concat!(
            "SELECT 1 FROM ",
            $table,
            " r WHERE r.biz_id = d.biz_id AND r.biz_type = d.biz_type AND r.consumer_group = d.consumer_group \
             AND r.execute_time = d.execute_time"
        )
    };
}

macro_rules! naive_detector {
    ($where:literal) => {
        concat!(
            "SELECT biz_type, biz_id, execute_time, MIN(logged_at_ms), MAX(logged_at_ms), COUNT(*) \
             FROM delivery_log d WHERE consumer_group = ? AND logged_at_ms >= ? AND logged_at_ms < ? \
             AND (? = '' OR biz_type = ?) AND ",
            $where
        )
    };
}

/// The reconciler's statements as written before: `NOT EXISTS` anti joins, which PostgreSQL
/// plans from its statistics (a nested loop over the group's claim range per row when it has
/// none) and MariaDB may answer by materializing a whole table. Same values as idemgate's.
static NAIVE_DOUBLE_APPLIED: Sql = Sql::new(concat!(
    naive_detector!("outcome = 'processed'"),
    " GROUP BY biz_type, biz_id, execute_time HAVING COUNT(*) > 1 LIMIT ?"
));
static NAIVE_LOST: Sql = Sql::new(concat!(
    naive_detector!("outcome = 'dead_lettered' AND biz_id <> ''"),
    " AND NOT EXISTS (",
    naive_claimed!("idempotent_record_all"),
    ") AND NOT EXISTS (",
    naive_claimed!("idempotent_record_archive"),
    ") GROUP BY biz_type, biz_id, execute_time LIMIT ?"
));
static NAIVE_STUCK: Sql = Sql::new(concat!(
    naive_detector!("outcome = 'failed' AND biz_id <> ''"),
    " AND NOT EXISTS (",
    naive_claimed!("idempotent_record_all"),
    ") AND NOT EXISTS (",
    naive_claimed!("idempotent_record_archive"),
    ") AND NOT EXISTS (SELECT 1 FROM delivery_log x WHERE x.biz_id = d.biz_id AND x.biz_type = d.biz_type \
     AND x.consumer_group = d.consumer_group AND x.execute_time = d.execute_time AND x.outcome = 'dead_lettered') \
     GROUP BY biz_type, biz_id, execute_time HAVING MIN(logged_at_ms) < ? LIMIT ?"
));
static NAIVE_PROCESSED_WITHOUT_CLAIM: Sql = Sql::new(concat!(
    naive_detector!("outcome = 'processed'"),
    " AND NOT EXISTS (",
    naive_claimed!("idempotent_record_all"),
    ") AND NOT EXISTS (",
    naive_claimed!("idempotent_record_archive"),
    ") GROUP BY biz_type, biz_id, execute_time LIMIT ?"
));
static NAIVE_CLAIM_WITHOUT_DELIVERY: Sql = Sql::new(
    "SELECT biz_type, biz_id, execute_time, claimed_at_ms, claimed_at_ms, 1 FROM idempotent_record_all c \
     WHERE consumer_group = ? AND claimed_at_ms >= ? AND claimed_at_ms < ? AND (? = '' OR biz_type = ?) \
     AND NOT EXISTS (SELECT 1 FROM delivery_log d WHERE d.biz_id = c.biz_id AND d.msg_id = c.msg_id \
     AND d.biz_type = c.biz_type AND d.consumer_group = c.consumer_group AND d.execute_time = c.execute_time \
     AND d.outcome IN ('processed', 'duplicate')) LIMIT ?",
);
static NAIVE_COLLISIONS: Sql = Sql::new(concat!(
    naive_detector!("outcome = 'duplicate' AND payload_match = 0"),
    " GROUP BY biz_type, biz_id, execute_time LIMIT ?"
));
static NAIVE_LATE: Sql = Sql::new(concat!(
    naive_detector!("(layer = 'late_duplicate' OR (outcome = 'processed' AND EXISTS ("),
    naive_claimed!("idempotent_record_archive"),
    " AND r.archived_at_ms <= d.logged_at_ms))) GROUP BY biz_type, biz_id, execute_time LIMIT ?"
));
static NAIVE_LEDGER: Sql = Sql::new(
    "SELECT deduction_id, COUNT(*) FROM shop_stock_ledger WHERE applied_at_ms >= ? AND applied_at_ms < ? \
     GROUP BY deduction_id HAVING COUNT(*) > 1",
);
// The overview's windows as written before: open at the top.
static NAIVE_LAST_5_MINUTES: Sql = Sql::new(
    "SELECT outcome, COUNT(*), COUNT(CASE WHEN payload_match = 0 THEN 1 END) FROM delivery_log \
     WHERE logged_at_ms >= ? GROUP BY outcome",
);
static NAIVE_BY_MINUTE: Sql = Sql::new(
    "SELECT logged_at_ms - logged_at_ms % 60000, outcome, COUNT(*), COUNT(CASE WHEN payload_match = 0 THEN 1 END) \
     FROM delivery_log WHERE logged_at_ms >= ? GROUP BY logged_at_ms - logged_at_ms % 60000, outcome",
);
static NAIVE_TOP_CONFLICTS: Sql = Sql::new(
    "SELECT biz_type, COUNT(*) FROM delivery_log WHERE outcome = 'duplicate' AND logged_at_ms >= ? \
     GROUP BY biz_type ORDER BY COUNT(*) DESC, biz_type LIMIT 10",
);

/// The statement written before that does what `name` does, and how many of its values it
/// takes (the overview's open windows take only their start).
fn naive(name: &str) -> Option<(&'static Sql, Option<usize>)> {
    Some(match name {
        "double applied" => (&NAIVE_DOUBLE_APPLIED, None),
        "lost" => (&NAIVE_LOST, None),
        "stuck" => (&NAIVE_STUCK, None),
        "processed without claim" => (&NAIVE_PROCESSED_WITHOUT_CLAIM, None),
        "claim without delivery" => (&NAIVE_CLAIM_WITHOUT_DELIVERY, None),
        "key collision" => (&NAIVE_COLLISIONS, None),
        "late duplicate" => (&NAIVE_LATE, None),
        n if n == STOCK_LEDGER_CHECK.name => (&NAIVE_LEDGER, None),
        "last 5 minutes" => (&NAIVE_LAST_5_MINUTES, Some(1)),
        "last hour by minute" => (&NAIVE_BY_MINUTE, Some(1)),
        "top conflicts" => (&NAIVE_TOP_CONFLICTS, Some(1)),
        _ => return None,
    })
}

async fn measure(store: &Store, options: &Options, progress: &impl Fn(&str)) -> anyhow::Result<Report> {
    let backend = store.backend();
    let now = idemgate::clock::now_ms();
    let started = Instant::now();
    let span_ms = i64::from(options.span_hours) * HOUR_MS - MINUTE_MS;
    let planted = load(store, options.deliveries, span_ms, now).await?;
    let load = started.elapsed();
    let deliveries: i64 = store.query(&COUNT_LOG).fetch_one(store.pool()).await?.try_get(0)?;
    let in_window: i64 =
        store.query(&COUNT_SINCE).bind(now - 24 * HOUR_MS).fetch_one(store.pool()).await?.try_get(0)?;
    progress(&format!("{backend}: {deliveries} deliveries loaded in {:.0} s", load.as_secs_f64()));

    let reconcile = ReconcileOptions {
        consumer_group: GROUP.to_owned(),
        biz_type: None,
        since_ms: now - 24 * HOUR_MS,
        until_ms: now + 1,
        stuck_after_ms: HOUR_MS / 2,
        log_retention_ms: 14 * 24 * HOUR_MS,
        max_per_kind: 100_000,
        instance_id: "bench".to_owned(),
        started_by: "command".to_owned(),
    };
    let mut after = idemgate::reconcile::statements(store, &reconcile, &[STOCK_LEDGER_CHECK], now).await?;
    after.extend(overview::statements(now).into_iter().filter(|s| naive(s.name).is_some()));
    let pairs: Vec<(Bound, Bound)> = after
        .into_iter()
        .filter_map(|a| {
            let (sql, takes) = naive(a.name)?;
            let args = a.args[..takes.unwrap_or(a.args.len())].to_vec();
            Some((Bound::new(a.name, sql, args), a))
        })
        .collect();

    let timeout = options.statement_timeout;
    let mut rows = Vec::new();
    for (before, after) in &pairs {
        let plan_before = plan::reads(store, before).await?;
        let plan_after = plan::reads(store, after).await?;
        let before_stale = timed(store, before, timeout, false).await?;
        let before_no_nestloop = match backend {
            Backend::Postgres => timed(store, before, timeout, true).await?,
            _ => Timing::Skipped,
        };
        let after_stale = timed(store, after, timeout, false).await?;
        progress(&format!(
            "{backend}: {}: before {before_stale} s, nestloop off {before_no_nestloop} s, after {after_stale} s",
            after.name
        ));
        rows.push(StatementReport {
            name: after.name.to_owned(),
            before_stale,
            before_no_nestloop,
            after_stale,
            before_analyzed: Timing::Skipped,
            after_analyzed: Timing::Skipped,
            plan_before,
            plan_after,
        });
    }

    let t = Instant::now();
    let report = reconcile_once(store, &reconcile, &[STOCK_LEDGER_CHECK], now).await?;
    let run = t.elapsed();
    let found: BTreeSet<(AnomalyKind, String)> =
        report.anomalies.iter().map(|a| (a.kind, a.biz_id.clone())).collect();
    let planted: Vec<Planted> = planted.into_iter().filter(|p| p.at_ms >= reconcile.since_ms).collect();
    let expected: BTreeSet<(AnomalyKind, String)> =
        planted.iter().map(|p| (p.kind, p.biz_id.clone())).collect();
    anyhow::ensure!(
        found == expected,
        "the run found {:?}, not the planted {:?}",
        report.counts,
        counts(&planted)
    );
    let t = Instant::now();
    overview::overview(
        store,
        &Limits { timeout: Duration::from_secs(600) },
        &idemgate::archive::ArchiveSettings::default(),
        now,
    )
    .await?;
    let overview = t.elapsed();

    let t = Instant::now();
    analyze(store).await?;
    let analyze = t.elapsed();
    progress(&format!("{backend}: ANALYZE took {:.2} s", analyze.as_secs_f64()));
    for ((before, after), row) in pairs.iter().zip(&mut rows) {
        row.before_analyzed = timed(store, before, timeout, false).await?;
        row.after_analyzed = timed(store, after, timeout, false).await?;
    }
    Ok(Report {
        backend,
        deliveries,
        in_window,
        span_hours: options.span_hours,
        load,
        analyze,
        statements: rows,
        run,
        overview,
        anomalies: report.anomalies.len(),
    })
}

fn counts(planted: &[Planted]) -> BTreeMap<AnomalyKind, usize> {
    let mut counts = BTreeMap::new();
    for p in planted {
        *counts.entry(p.kind).or_default() += 1;
    }
    counts
}

static COUNT_LOG: Sql = Sql::new("SELECT COUNT(*) FROM delivery_log");
static COUNT_SINCE: Sql = Sql::new("SELECT COUNT(*) FROM delivery_log WHERE logged_at_ms >= ?");

/// Runs `statement` on a connection of its own with `timeout`, and with nested loops off when
/// `no_nestloop` (PostgreSQL), then closes that connection so its settings go with it.
async fn timed(
    store: &Store,
    statement: &Bound,
    timeout: Duration,
    no_nestloop: bool,
) -> Result<Timing, sqlx::Error> {
    let mut conn = store.pool().acquire().await?;
    idemgate::store::limit_statements(&mut conn, store.backend(), timeout).await?;
    if no_nestloop {
        conn.execute("SET enable_nestloop = off").await?;
    }
    let t = Instant::now();
    let result = statement.query(store).fetch_all(&mut *conn).await;
    let elapsed = t.elapsed();
    conn.close().await?;
    match result {
        Ok(_) => Ok(Timing::Done(elapsed)),
        // PostgreSQL's query_canceled, MariaDB's query interrupted by max_statement_time,
        // MySQL's by max_execution_time (error 3024, SQLSTATE HY000).
        Err(sqlx::Error::Database(e))
            if matches!(e.code().as_deref(), Some("57014" | "70100"))
                || e.message().contains("maximum statement execution time exceeded") =>
        {
            Ok(Timing::Cancelled(timeout))
        }
        Err(e) => Err(e),
    }
}

/// Statistics for every table the statements read.
async fn analyze(store: &Store) -> Result<(), sqlx::Error> {
    let mut tables = vec![
        "delivery_log".to_owned(),
        "idempotent_record_archive".to_owned(),
        "shop_stock_ledger".to_owned(),
    ];
    tables.extend(idemgate::layout::current(store).await?.tables());
    for table in tables {
        let statement = match store.backend() {
            Backend::Postgres => format!("ANALYZE {table}"),
            _ => format!("ANALYZE TABLE {table}"),
        };
        sqlx::query(AssertSqlSafe(statement)).fetch_all(store.pool()).await?;
    }
    Ok(())
}

/// An anomaly [`load`] planted, and when it shows in the log.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Planted {
    pub kind: AnomalyKind,
    pub biz_id: String,
    pub at_ms: i64,
}

/// The example shop's traffic over the `span_ms` before `now_ms`, about `deliveries` log
/// rows, into fresh tables whose statistics are never gathered: automatic statistics are
/// turned off first (PostgreSQL's autovacuum, InnoDB's recalculation) and nothing runs
/// `ANALYZE`. Keys rotate over order.create, payment.confirm and stock.deduct; each is
/// claimed and processed once; a third have a broker redelivery, a quarter of the payments a
/// failed attempt first; each deduction has its ledger row; one key in 200 is a poison payment
/// (two failed attempts, then a dead letter: lost); the archive holds a quarter as many claims
/// from the day before. Five anomalies of every other kind are planted 40 minutes before
/// `now_ms`. Claims go to their table in the database's layout. Returns the planted anomalies;
/// a run over a window finds those whose `at_ms` it covers.
pub async fn load(
    store: &Store,
    deliveries: usize,
    span_ms: i64,
    now_ms: i64,
) -> anyhow::Result<Vec<Planted>> {
    let layout = idemgate::layout::current(store).await?;
    keep_statistics_stale(store, layout).await?;
    // About 1.43 log rows a key (see above).
    let keys = (deliveries * 7 / 10).max(1) as i64;
    let step = (span_ms / keys).max(1);
    let start = now_ms - span_ms;
    let mut rows = Rows::new(store, layout);
    let mut planted = Vec::new();
    for i in 0..keys {
        let at = start + i * step;
        let (biz_type, letter) = SHOP[(i % 3) as usize];
        if i % 200 == 199 {
            let biz_id = format!("R-POISON-{i}");
            for (n, outcome) in ["failed", "failed", "dead_lettered"].into_iter().enumerate() {
                let msg = LogRow::new(at + n as i64 * 100, &format!("Z{i}-{n}"), &biz_id, outcome);
                rows.log(LogRow { biz_type: idemgate_shop::PAYMENT_CONFIRM, reconsume: n as i64, ..msg })
                    .await?;
            }
            planted.push(Planted { kind: AnomalyKind::Lost, biz_id, at_ms: at + 200 });
            continue;
        }
        let biz_id = format!("R-{letter}-{i}");
        let msg_id = message_id(i);
        let failed_first = letter == 'P' && i % 4 == 1;
        if failed_first {
            rows.log(LogRow {
                biz_type,
                reconsume: 0,
                ..LogRow::new(at - 500, &format!("F{i}"), &biz_id, "failed")
            })
            .await?;
        }
        rows.claim(biz_type, &biz_id, &msg_id, at).await?;
        let processed = LogRow::new(at, &msg_id, &biz_id, "processed");
        rows.log(LogRow { biz_type, reconsume: i64::from(failed_first), ..processed }).await?;
        if i % 3 == 0 {
            let copy = LogRow::new(at + 500, &format!("X{i}"), &biz_id, "duplicate");
            rows.log(LogRow { biz_type, payload_match: Some(1), ..copy }).await?;
        }
        if letter == 'D' {
            rows.ledger(&biz_id, at).await?;
        }
    }
    for i in 0..keys / 4 {
        let at = start - 2 * 24 * HOUR_MS + i * step;
        rows.archive(SHOP[(i % 3) as usize].0, &format!("R-A-{i}"), at, at + 24 * HOUR_MS).await?;
    }

    let at = now_ms - 40 * MINUTE_MS;
    let deduct = idemgate_shop::STOCK_DEDUCT;
    for k in 0..5 {
        let key = |what: &str| format!("PLANT-{what}-{k}");
        let mut plant = |kind, biz_id: String| planted.push(Planted { kind, biz_id, at_ms: at });
        // Processed twice.
        rows.claim(deduct, &key("TWICE"), &key("M-TWICE"), at).await?;
        rows.log(LogRow::new(at, &key("M-TWICE"), &key("TWICE"), "processed")).await?;
        rows.log(LogRow::new(at + 1, &key("N-TWICE"), &key("TWICE"), "processed")).await?;
        plant(AnomalyKind::DoubleApplied, key("TWICE"));
        // Processed, then its claim removed.
        rows.log(LogRow::new(at, &key("M-NOCLAIM"), &key("NOCLAIM"), "processed")).await?;
        plant(AnomalyKind::Orphan, key("NOCLAIM"));
        // A claim nobody delivered.
        rows.claim(deduct, &key("NODELIVERY"), &key("M-NODELIVERY"), at).await?;
        plant(AnomalyKind::Orphan, key("NODELIVERY"));
        // The same key with another body.
        rows.claim(deduct, &key("COLLISION"), &key("M-COLLISION"), at).await?;
        rows.log(LogRow::new(at, &key("M-COLLISION"), &key("COLLISION"), "processed")).await?;
        let other = LogRow::new(at + 1, &key("N-COLLISION"), &key("COLLISION"), "duplicate");
        rows.log(LogRow { payload_match: Some(0), ..other }).await?;
        plant(AnomalyKind::KeyCollision, key("COLLISION"));
        // Claimed again after its claim was archived.
        rows.archive(deduct, &key("LATE"), at - HOUR_MS, at - 1_000).await?;
        rows.claim(deduct, &key("LATE"), &key("M-LATE"), at).await?;
        rows.log(LogRow::new(at, &key("M-LATE"), &key("LATE"), "processed")).await?;
        plant(AnomalyKind::LateDuplicate, key("LATE"));
        // Two ledger rows for one deduction.
        rows.claim(deduct, &key("LEDGER"), &key("M-LEDGER"), at).await?;
        rows.log(LogRow::new(at, &key("M-LEDGER"), &key("LEDGER"), "processed")).await?;
        rows.ledger(&key("LEDGER"), at).await?;
        rows.ledger(&key("LEDGER"), at + 1).await?;
        plant(AnomalyKind::DoubleApplied, key("LEDGER"));
        // A payment failing for longer than stuck_after (30 minutes), nothing else.
        let stuck = LogRow::new(at - 5 * MINUTE_MS, &key("M-STUCK"), &key("STUCK"), "failed");
        rows.log(LogRow { biz_type: idemgate_shop::PAYMENT_CONFIRM, ..stuck }).await?;
        plant(AnomalyKind::Stuck, key("STUCK"));
    }
    rows.flush().await?;
    Ok(planted)
}

const SHOP: [(&str, char); 3] = [
    (idemgate_shop::ORDER_CREATE, 'O'),
    (idemgate_shop::PAYMENT_CONFIRM, 'P'),
    (idemgate_shop::STOCK_DEDUCT, 'D'),
];

/// A msgId as the broker makes them: 32 hex digits, in no order.
fn message_id(i: i64) -> String {
    let h = (i as u64 ^ 0x9e37_79b9_7f4a_7c15).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    format!("{h:016X}{:016X}", h.rotate_left(29) ^ i as u64)
}

/// Turns off what would gather statistics while the bench loads and measures.
async fn keep_statistics_stale(store: &Store, layout: Layout) -> Result<(), sqlx::Error> {
    let mut tables = vec![
        "delivery_log".to_owned(),
        "idempotent_record_archive".to_owned(),
        "shop_stock_ledger".to_owned(),
    ];
    tables.extend(layout.tables());
    for table in tables {
        let statement = match store.backend() {
            Backend::Postgres => format!("ALTER TABLE {table} SET (autovacuum_enabled = false)"),
            Backend::MySql => format!("ALTER TABLE {table} STATS_AUTO_RECALC = 0"),
            Backend::Sqlite => continue,
        };
        sqlx::query(AssertSqlSafe(statement)).execute(store.pool()).await?;
    }
    Ok(())
}

/// One delivery-log row of the loaded traffic.
struct LogRow {
    at: i64,
    msg_id: String,
    biz_type: &'static str,
    biz_id: String,
    outcome: &'static str,
    reconsume: i64,
    payload_match: Option<i64>,
}

impl LogRow {
    fn new(at: i64, msg_id: &str, biz_id: &str, outcome: &'static str) -> Self {
        Self {
            at,
            msg_id: msg_id.to_owned(),
            biz_type: idemgate_shop::STOCK_DEDUCT,
            biz_id: biz_id.to_owned(),
            outcome,
            reconsume: 0,
            payload_match: None,
        }
    }
}

/// Rows gathered per table and written as multi-row inserts of [`Rows::BATCH`].
struct Rows<'a> {
    store: &'a Store,
    layout: Layout,
    pending: BTreeMap<String, (usize, Vec<Arg>)>,
    archived: i64,
}

/// Each table's insert: its columns and one row's values, `?` for each bound one.
fn insert_of(table: &str) -> (String, &'static str) {
    match table {
        "delivery_log" => (
            "INSERT INTO delivery_log (logged_at_ms, instance_id, consumer_group, msg_id, uniq_key, topic, tags, \
             queue_id, queue_offset, reconsume_times, biz_type, biz_id, execute_time, outcome, cause, layer, \
             payload_match, latency_us) VALUES "
                .to_owned(),
            "(?, 'bench', ?, ?, ?, 'shop', '', 0, 0, ?, ?, ?, 0, ?, ?, ?, ?, 900)",
        ),
        "shop_stock_ledger" => (
            "INSERT INTO shop_stock_ledger (deduction_id, sku, quantity, applied_at_ms) VALUES ".to_owned(),
            "(?, 'SKU-1', 1, ?)",
        ),
        "idempotent_record_archive" => (
            "INSERT INTO idempotent_record_archive (id, consumer_group, biz_type, biz_id, execute_time, msg_id, \
             uniq_key, payload_hash, instance_id, claimed_at_ms, archived_at_ms) VALUES "
                .to_owned(),
            "(?, ?, ?, ?, 0, ?, '', 'hash', 'bench', ?, ?)",
        ),
        claims => (
            format!(
                "INSERT INTO {claims} (consumer_group, biz_type, biz_id, execute_time, msg_id, uniq_key, \
                 payload_hash, instance_id, claimed_at_ms) VALUES "
            ),
            "(?, ?, ?, 0, ?, ?, 'hash', 'bench', ?)",
        ),
    }
}

impl<'a> Rows<'a> {
    const BATCH: usize = 1_000;

    fn new(store: &'a Store, layout: Layout) -> Self {
        Self { store, layout, pending: BTreeMap::new(), archived: 0 }
    }

    async fn push(&mut self, table: &str, values: Vec<Arg>) -> Result<(), sqlx::Error> {
        let entry = self.pending.entry(table.to_owned()).or_default();
        entry.0 += 1;
        entry.1.extend(values);
        if entry.0 >= Self::BATCH {
            self.write(table).await?;
        }
        Ok(())
    }

    async fn write(&mut self, table: &str) -> Result<(), sqlx::Error> {
        let Some((count, args)) = self.pending.remove(table) else { return Ok(()) };
        if count == 0 {
            return Ok(());
        }
        let (head, row) = insert_of(table);
        let sql = format!("{head}{}", vec![row; count].join(", "));
        bind_all(query_built(self.store.backend(), sql), &args).execute(self.store.pool()).await?;
        Ok(())
    }

    async fn flush(&mut self) -> Result<(), sqlx::Error> {
        let tables: Vec<String> = self.pending.keys().cloned().collect();
        for table in tables {
            self.write(&table).await?;
        }
        Ok(())
    }

    async fn log(&mut self, r: LogRow) -> Result<(), sqlx::Error> {
        let (cause, layer) = match r.outcome {
            "duplicate" => (Some("redelivery"), Some("db")),
            _ => (None, None),
        };
        let text = |v: Option<&str>| v.map_or(Arg::NullText, |v| Arg::Text(v.to_owned()));
        let values = vec![
            Arg::Int(r.at),
            Arg::Text(GROUP.to_owned()),
            Arg::Text(r.msg_id.clone()),
            Arg::Text(format!("U-{}", r.biz_id)),
            Arg::Int(r.reconsume),
            Arg::Text(r.biz_type.to_owned()),
            Arg::Text(r.biz_id),
            Arg::Text(r.outcome.to_owned()),
            text(cause),
            text(layer),
            r.payload_match.map_or(Arg::NullInt, Arg::Int),
        ];
        self.push("delivery_log", values).await
    }

    async fn claim(
        &mut self,
        biz_type: &str,
        biz_id: &str,
        msg_id: &str,
        at: i64,
    ) -> Result<(), sqlx::Error> {
        let table = self.layout.table_for(GROUP, biz_type, biz_id, 0).name;
        let values = vec![
            Arg::Text(GROUP.to_owned()),
            Arg::Text(biz_type.to_owned()),
            Arg::Text(biz_id.to_owned()),
            Arg::Text(msg_id.to_owned()),
            Arg::Text(format!("U-{biz_id}")),
            Arg::Int(at),
        ];
        self.push(table, values).await
    }

    async fn ledger(&mut self, deduction_id: &str, at: i64) -> Result<(), sqlx::Error> {
        self.push("shop_stock_ledger", vec![Arg::Text(deduction_id.to_owned()), Arg::Int(at)]).await
    }

    async fn archive(
        &mut self,
        biz_type: &str,
        biz_id: &str,
        claimed: i64,
        archived: i64,
    ) -> Result<(), sqlx::Error> {
        // Ids far above any live claim's, as the archive keeps the live row's id.
        self.archived += 1;
        let id = 9_000_000_000_000_000_000 + self.archived;
        let values = vec![
            Arg::Int(id),
            Arg::Text(GROUP.to_owned()),
            Arg::Text(biz_type.to_owned()),
            Arg::Text(biz_id.to_owned()),
            Arg::Text(format!("A-{biz_id}")),
            Arg::Int(claimed),
            Arg::Int(archived),
        ];
        self.push("idempotent_record_archive", values).await
    }
}

/// The figures as Markdown: one table per backend, then each statement's plan reads.
pub(crate) fn table(reports: &[Report]) -> String {
    use std::fmt::Write;
    let mut out = String::new();
    for r in reports {
        let _ = writeln!(
            out,
            "{}: {} deliveries over {} hours, {} of them in the reconciled 24 hours, loaded in {:.0} s; \
             `ANALYZE` of the five tables {:.2} s; the whole run {:.2} s ({} anomalies, as planted); the whole \
             overview read {:.3} s (both on stale statistics)\n",
            r.backend,
            r.deliveries,
            r.span_hours,
            r.in_window,
            r.load.as_secs_f64(),
            r.analyze.as_secs_f64(),
            r.run.as_secs_f64(),
            r.anomalies,
            r.overview.as_secs_f64(),
        );
        out.push_str(
            "| statement | before, stale statistics s | before, nested loops off s | after, stale statistics s | before, after ANALYZE s | after, after ANALYZE s |\n\
             |---|---|---|---|---|---|\n",
        );
        for s in &r.statements {
            let _ = writeln!(
                out,
                "| {} | {} | {} | {} | {} | {} |",
                s.name,
                s.before_stale,
                s.before_no_nestloop,
                s.after_stale,
                s.before_analyzed,
                s.after_analyzed
            );
        }
        let _ = writeln!(
            out,
            "\n{} plans on stale statistics (reads not confined by a key or the window marked !):\n",
            r.backend
        );
        for s in &r.statements {
            let reads = |reads: &[Read]| {
                reads
                    .iter()
                    .map(|read| format!("{}{read}", if read.is_bounded(&READ_BOUNDS) { "" } else { "! " }))
                    .collect::<Vec<_>>()
                    .join("; ")
            };
            let _ = writeln!(
                out,
                "- {}: before: {}\n  after: {}",
                s.name,
                reads(&s.plan_before),
                reads(&s.plan_after)
            );
        }
        out.push('\n');
    }
    out
}
