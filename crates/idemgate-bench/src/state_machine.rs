//! `idemgate-bench state-machine`: state moves per second with the helper's conditional update
//! ([`idemgate::state_machine`]) against the naive way, on the same database in the same run.
//!
//! The naive way, as users write it: in one transaction, SELECT the row's state, check it in
//! Rust, and UPDATE the row by its key. Both make a PAID order SHIPPED with a time column,
//! one transaction per move, over fresh rows (the move is made) and then over the same rows
//! again (the move was made before: a duplicate). Each counts the statements it runs where it
//! runs them. A race then gives every row of a further set two movers at once: the helper's
//! conditional update moves each row once, the naive read-check-write lets both movers move it.

use std::time::{Duration, Instant};

use sqlx::{AssertSqlSafe, Row};

use super::{Percentiles, peak_rss_mib, rate, rss_mib};
use idemgate::state_machine::{Answer, Move, StateMachine, Transition, TransitionSpec};
use idemgate::store::{Backend, Sql, Store, StoreOptions};
use idemgate_testkit::scratch::ScratchDb;

/// What to measure: the flags of `idemgate-bench state-machine`.
#[derive(Debug, Clone, clap::Args)]
pub struct Options {
    #[arg(long, value_delimiter = ',', default_value = "postgres,mysql")]
    pub backends: Vec<Backend>,
    /// Rows each pattern moves, then moves again (at most 1,000,000).
    #[arg(long, default_value_t = 20_000)]
    pub rows: usize,
    /// Rows each pattern races two movers on.
    #[arg(long, default_value_t = 2_000)]
    pub race_rows: usize,
}

/// One pattern over one set of rows.
#[derive(Debug, Clone)]
pub(crate) struct RunReport {
    pub backend: Backend,
    pub pattern: Pattern,
    /// Fresh moves, or moves made already.
    pub already_done: bool,
    pub moves: usize,
    pub elapsed: Duration,
    pub latency: Percentiles,
    /// Statements the move ran (BEGIN and COMMIT not counted), over all moves.
    pub statements: u64,
    pub rss_after_mib: f64,
}

impl RunReport {
    pub(crate) fn rate(&self) -> f64 {
        rate(self.moves, self.elapsed)
    }

    pub(crate) fn statements_per_move(&self) -> f64 {
        self.statements as f64 / self.moves.max(1) as f64
    }
}

/// Two movers at once on each of `rows` rows.
#[derive(Debug, Clone)]
pub(crate) struct RaceReport {
    pub backend: Backend,
    pub pattern: Pattern,
    pub rows: usize,
    /// Rows that both movers reported as moved by them.
    pub moved_twice: usize,
}

/// Everything one run measured.
#[derive(Debug, Clone, Default)]
pub(crate) struct Report {
    pub runs: Vec<RunReport>,
    pub races: Vec<RaceReport>,
    pub peak_rss_mib: f64,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Pattern {
    Helper,
    Naive,
}

impl Pattern {
    pub(crate) fn name(self) -> &'static str {
        match self {
            Self::Helper => "idemgate conditional update",
            Self::Naive => "naive SELECT, check, UPDATE",
        }
    }

    fn prefix(self) -> &'static str {
        match self {
            Self::Helper => "H",
            Self::Naive => "N",
        }
    }
}

static CREATE: Sql = Sql::new(
    "CREATE TABLE bench_order (order_no VARCHAR(32) NOT NULL PRIMARY KEY, status VARCHAR(16) NOT NULL, \
     shipped_at_ms BIGINT)",
);
static NAIVE_READ: Sql = Sql::new("SELECT status FROM bench_order WHERE order_no = ?");
static NAIVE_WRITE: Sql = Sql::new("UPDATE bench_order SET status = ?, shipped_at_ms = ? WHERE order_no = ?");
static SHIPPED_ROWS: Sql = Sql::new("SELECT COUNT(*) FROM bench_order WHERE status = 'SHIPPED'");

/// What one move ended as.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Ended {
    Moved,
    AlreadyDone,
    Other,
}

/// `idemgate-bench state-machine`: prints the setting, runs every backend and prints the
/// table.
pub(crate) async fn command(options: Options) -> anyhow::Result<()> {
    println!(
        "bench state-machine: PAID to SHIPPED on {} rows per pattern, then again (already done), \
         one transaction a move; {} rows raced by two movers",
        options.rows, options.race_rows
    );
    let report = run(&options, |line| eprintln!("  {line}")).await?;
    println!("\n{}", table(&report));
    Ok(())
}

/// Runs every backend; calls `progress` after each run.
pub(crate) async fn run(options: &Options, mut progress: impl FnMut(&str)) -> anyhow::Result<Report> {
    anyhow::ensure!((1..=1_000_000).contains(&options.rows), "--rows must be from 1 to 1000000");
    anyhow::ensure!(options.race_rows <= 100_000, "--race-rows must be at most 100000");
    let ship = StateMachine::new("bench_order", "order_no", "status")?
        .transition(TransitionSpec::new(["PAID"], "SHIPPED").set("shipped_at_ms"))?;
    let mut report = Report::default();
    for &backend in &options.backends {
        let db =
            ScratchDb::create(backend, &StoreOptions { max_connections: 4, ..Default::default() }).await?;
        let measured = measure(&db.store, &ship, options, &mut report, &mut progress).await;
        db.drop_now().await;
        measured?;
    }
    report.peak_rss_mib = peak_rss_mib();
    Ok(report)
}

async fn measure(
    store: &Store,
    ship: &Transition,
    options: &Options,
    report: &mut Report,
    progress: &mut impl FnMut(&str),
) -> anyhow::Result<()> {
    let backend = store.backend();
    store.query(&CREATE).execute(store.pool()).await?;
    for pattern in [Pattern::Helper, Pattern::Naive] {
        load(store, pattern.prefix(), options.rows).await?;
        load(store, &format!("R{}", pattern.prefix()), options.race_rows).await?;
    }
    for already_done in [false, true] {
        for pattern in [Pattern::Helper, Pattern::Naive] {
            let r = run_one(store, ship, pattern, options.rows, already_done).await?;
            progress(&format!(
                "{backend} {} {}: {:.0} moves/s, {:.1} statements a move",
                pattern.name(),
                if already_done { "already done" } else { "fresh" },
                r.rate(),
                r.statements_per_move()
            ));
            report.runs.push(r);
        }
    }
    let shipped: i64 = store.query(&SHIPPED_ROWS).fetch_one(store.pool()).await?.try_get(0)?;
    anyhow::ensure!(
        shipped == 2 * options.rows as i64,
        "{shipped} rows shipped, expected {}",
        2 * options.rows
    );
    for pattern in [Pattern::Helper, Pattern::Naive] {
        let moved_twice = race(store, ship, pattern, options.race_rows).await?;
        if pattern == Pattern::Helper && moved_twice != 0 {
            anyhow::bail!("the helper moved {moved_twice} rows twice on {backend}");
        }
        progress(&format!(
            "{backend} {} race: {moved_twice} of {} rows moved twice",
            pattern.name(),
            options.race_rows
        ));
        report.races.push(RaceReport { backend, pattern, rows: options.race_rows, moved_twice });
    }
    Ok(())
}

/// `rows` PAID orders named `{prefix}-{i}`, a thousand to a statement. The text holds only
/// generated keys.
async fn load(store: &Store, prefix: &str, rows: usize) -> Result<(), sqlx::Error> {
    for start in (0..rows).step_by(1000) {
        let values: Vec<String> =
            (start..(start + 1000).min(rows)).map(|i| format!("('{prefix}-{i}', 'PAID')")).collect();
        let sql = format!("INSERT INTO bench_order (order_no, status) VALUES {}", values.join(", "));
        sqlx::query(AssertSqlSafe(sql)).execute(store.pool()).await?;
    }
    Ok(())
}

async fn run_one(
    store: &Store,
    ship: &Transition,
    pattern: Pattern,
    rows: usize,
    already_done: bool,
) -> anyhow::Result<RunReport> {
    let mut latencies = Vec::with_capacity(rows);
    let mut statements = 0u64;
    let before = ship.statements_run();
    let expected = if already_done { Ended::AlreadyDone } else { Ended::Moved };
    let started = Instant::now();
    for i in 0..rows {
        let key = format!("{}-{i}", pattern.prefix());
        let t = Instant::now();
        let ended = match pattern {
            Pattern::Helper => helper_move(store, ship, &key).await?,
            Pattern::Naive => naive_move(store, &key, &mut statements).await?,
        };
        latencies.push(t.elapsed().as_micros() as u64);
        anyhow::ensure!(ended == expected, "{} on {key}: {ended:?}, expected {expected:?}", pattern.name());
    }
    let elapsed = started.elapsed();
    if pattern == Pattern::Helper {
        statements = ship.statements_run() - before;
    }
    Ok(RunReport {
        backend: store.backend(),
        pattern,
        already_done,
        moves: rows,
        elapsed,
        latency: Percentiles::of(&mut latencies),
        statements,
        rss_after_mib: rss_mib(),
    })
}

/// The helper, as a handler runs it: one transaction, the conditional update.
async fn helper_move(store: &Store, ship: &Transition, key: &str) -> Result<Ended, sqlx::Error> {
    let mut tx = store.begin().await?;
    let answer = ship.apply(&mut tx, store.backend(), &Move::of(key).set(idemgate::clock::now_ms())).await?;
    tx.commit().await?;
    Ok(match answer {
        Answer::Moved => Ended::Moved,
        Answer::AlreadyDone { .. } => Ended::AlreadyDone,
        _ => Ended::Other,
    })
}

/// The naive way: read the state, check it here, write the row by its key.
async fn naive_move(store: &Store, key: &str, statements: &mut u64) -> Result<Ended, sqlx::Error> {
    let mut tx = store.begin().await?;
    *statements += 1;
    let state: Option<String> = store
        .query(&NAIVE_READ)
        .bind(key)
        .fetch_optional(&mut *tx)
        .await?
        .map(|r| r.try_get(0))
        .transpose()?;
    let ended = match state.as_deref() {
        Some("PAID") => {
            *statements += 1;
            store
                .query(&NAIVE_WRITE)
                .bind("SHIPPED")
                .bind(idemgate::clock::now_ms())
                .bind(key)
                .execute(&mut *tx)
                .await?;
            Ended::Moved
        }
        Some("SHIPPED") => Ended::AlreadyDone,
        _ => Ended::Other,
    };
    tx.commit().await?;
    Ok(ended)
}

/// Two movers at once on each row, one pair after the other; the rows both moved.
async fn race(store: &Store, ship: &Transition, pattern: Pattern, rows: usize) -> anyhow::Result<usize> {
    let mut moved_twice = 0;
    let (mut counted_a, mut counted_b) = (0u64, 0u64);
    for i in 0..rows {
        let key = format!("R{}-{i}", pattern.prefix());
        let (a, b) = match pattern {
            Pattern::Helper => tokio::join!(helper_move(store, ship, &key), helper_move(store, ship, &key)),
            Pattern::Naive => {
                tokio::join!(naive_move(store, &key, &mut counted_a), naive_move(store, &key, &mut counted_b))
            }
        };
        let (a, b) = (a?, b?);
        anyhow::ensure!(a == Ended::Moved || b == Ended::Moved, "neither mover moved {key}: {a:?} {b:?}");
        moved_twice += usize::from(a == Ended::Moved && b == Ended::Moved);
    }
    Ok(moved_twice)
}

/// The figures as Markdown tables: the runs, then the races.
pub(crate) fn table(report: &Report) -> String {
    let mut out = String::from(
        "| backend | pattern | moves | transitions/s | p50 µs | p99 µs | statements per move | RSS after MiB |\n\
         |---|---|---|---|---|---|---|---|\n",
    );
    for r in &report.runs {
        out.push_str(&format!(
            "| {} | {} | {} {} | {:.0} | {} | {} | {:.1} | {:.0} |\n",
            r.backend,
            r.pattern.name(),
            r.moves,
            if r.already_done { "already done" } else { "fresh" },
            r.rate(),
            r.latency.p50_us,
            r.latency.p99_us,
            r.statements_per_move(),
            r.rss_after_mib
        ));
    }
    out.push_str(&format!("\nPeak RSS of the whole run: {:.0} MiB.\n\n", report.peak_rss_mib));
    out.push_str(
        "| backend | pattern | rows, each moved by two movers at once | rows moved twice |\n|---|---|---|---|\n",
    );
    for r in &report.races {
        out.push_str(&format!("| {} | {} | {} | {} |\n", r.backend, r.pattern.name(), r.rows, r.moved_twice));
    }
    out
}
