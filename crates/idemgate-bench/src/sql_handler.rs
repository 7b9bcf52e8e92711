//! `idemgate-bench sql-handler`: a wallet credit as a configured `[[sql_handlers]]` entry
//! ([`idemgate::sql_handler`]) against the same logic written as a Rust handler, through the same
//! gate, on the same database in the same run.
//!
//! Both credit a wallet (an update held to one row) and write the credit's ledger row (its
//! `credit_id` a primary key): the configured one from its two statements and typed JSON
//! parameters, the Rust one as a user writes it, parsing the body with serde and binding the
//! same values. Every message is a fresh key; `--workers` deliveries run at once; after a
//! warm-up, the two take turns in four rounds, each first in every other round. The books are
//! checked afterwards: one ledger row per message, and the balances the sum of the credits.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use async_trait::async_trait;
use sqlx::{AssertSqlSafe, Row};

use super::{Percentiles, rate};
use idemgate::config::Settings;
use idemgate::delivery::Delivery;
use idemgate::gate::Gate;
use idemgate::handler::{Effect, Handler, HandlerError, Work};
use idemgate::outcome::Outcome;
use idemgate::route::RouteConfig;
use idemgate::sql_handler::{Expect, OnZero, SqlHandlerConfig, StatementConfig};
use idemgate::store::{Backend, Conn, Sql, Store, StoreOptions, query};
use idemgate_testkit::scratch::ScratchDb;

/// What to measure: the flags of `idemgate-bench sql-handler`.
#[derive(Debug, Clone, clap::Args)]
pub struct Options {
    #[arg(long, value_delimiter = ',', default_value = "sqlite,postgres,mysql")]
    pub backends: Vec<Backend>,
    /// Credits each handler applies (at most 1,000,000), after 500 of warm-up.
    #[arg(long, default_value_t = 20_000)]
    pub messages: usize,
    /// Deliveries processed at once (1 to 64).
    #[arg(long, default_value_t = 8)]
    pub workers: usize,
    /// Wallets the credits are spread over.
    #[arg(long, default_value_t = 1_000)]
    pub wallets: usize,
}

/// The two handlers measured.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Kind {
    Configured = 0,
    Rust = 1,
}

/// The rounds the measured credits are delivered in.
const ROUNDS: usize = 4;

impl Kind {
    pub(crate) fn name(self) -> &'static str {
        match self {
            Self::Configured => "configured [[sql_handlers]]",
            Self::Rust => "Rust handler",
        }
    }

    fn tag(self) -> &'static str {
        match self {
            Self::Configured => "sql",
            Self::Rust => "rust",
        }
    }
}

/// One handler's run on one backend.
#[derive(Debug, Clone)]
pub(crate) struct RunReport {
    pub backend: Backend,
    pub kind: Kind,
    pub messages: usize,
    pub workers: usize,
    pub elapsed: Duration,
    pub latency: Percentiles,
}

impl RunReport {
    pub(crate) fn rate(&self) -> f64 {
        rate(self.messages, self.elapsed)
    }
}

const TOPIC: &str = "bench_wallet";
const CONFIGURED: &str = "wallet.credit";
const RUST: &str = "wallet.credit.rust";

static CREATE_WALLET: Sql =
    Sql::new("CREATE TABLE wallet (user_id VARCHAR(64) NOT NULL PRIMARY KEY, balance_cents BIGINT NOT NULL)");
static CREATE_LEDGER: Sql = Sql::new(
    "CREATE TABLE wallet_ledger (credit_id VARCHAR(128) NOT NULL PRIMARY KEY, user_id VARCHAR(64) NOT NULL, \
     cents BIGINT NOT NULL)",
);
static CREDIT: Sql = Sql::new("UPDATE wallet SET balance_cents = balance_cents + ? WHERE user_id = ?");
static LEDGER: Sql = Sql::new("INSERT INTO wallet_ledger (credit_id, user_id, cents) VALUES (?, ?, ?)");
static LEDGER_OF: Sql = Sql::new("SELECT cents FROM wallet_ledger WHERE credit_id LIKE ?");
static BALANCES: Sql = Sql::new("SELECT balance_cents FROM wallet");

/// The body both handlers read.
#[derive(serde::Deserialize)]
struct CreditBody {
    user_id: String,
    cents: i64,
}

/// The Rust handler: the same two statements, the body parsed with serde.
struct RustCredit;

#[async_trait]
impl Handler for RustCredit {
    async fn handle(&self, work: &Work<'_>, conn: &mut Conn) -> Result<Effect, HandlerError> {
        let body: CreditBody = serde_json::from_slice(&work.delivery.body)
            .map_err(|e| HandlerError::Invalid(format!("body: {e}")))?;
        let done = query(work.backend, &CREDIT)
            .bind(body.cents)
            .bind(body.user_id.as_str())
            .execute(&mut *conn)
            .await?;
        if done.rows_affected() != 1 {
            return Err(HandlerError::Retryable(format!("wallet of {} not found", body.user_id)));
        }
        query(work.backend, &LEDGER)
            .bind(work.key.biz_id.as_str())
            .bind(body.user_id.as_str())
            .bind(body.cents)
            .execute(&mut *conn)
            .await?;
        Ok(Effect::Applied)
    }
}

/// The configured handler of the same logic.
pub(crate) fn configured() -> SqlHandlerConfig {
    let statement =
        |sql: &str| StatementConfig { sql: sql.into(), expect: Expect::One, on_zero: OnZero::Retry };
    SqlHandlerConfig {
        name: CONFIGURED.into(),
        statements: vec![
            statement("UPDATE wallet SET balance_cents = balance_cents + :cents WHERE user_id = :user"),
            statement(
                "INSERT INTO wallet_ledger (credit_id, user_id, cents) VALUES (:biz_id, :user, :cents)",
            ),
        ],
        params: [("cents", "json:/cents:int"), ("user", "json:/user_id")]
            .map(|(k, v)| (k.to_owned(), v.to_owned()))
            .into(),
        describe: None,
        checks: vec![],
        business_unique: vec![],
    }
}

fn settings(backend: Backend) -> Settings {
    let mut s = Settings::default();
    s.consumer.group = format!("bench_sql_handler_{backend}");
    s.consumer.instance = "bench".into();
    s.routes = [Kind::Configured, Kind::Rust]
        .map(|kind| RouteConfig {
            topic: TOPIC.into(),
            tags: kind.tag().into(),
            biz_type: format!("bench.{}", kind.tag()),
            biz_id: "keys".into(),
            execute_time: None,
            handler: Some(if kind == Kind::Configured { CONFIGURED } else { RUST }.into()),
        })
        .to_vec();
    s.sql_handlers = vec![configured()];
    s
}

/// `idemgate-bench sql-handler`: prints the setting, runs every backend and prints the table.
pub(crate) async fn command(options: Options) -> anyhow::Result<()> {
    println!(
        "bench sql-handler: a wallet credit (update + ledger insert) as a configured [[sql_handlers]] entry \
         and as a Rust handler, {} fresh credits each over {} wallets, {} deliveries at once, {} cores",
        options.messages,
        options.wallets,
        options.workers,
        super::cores()
    );
    let reports = run(&options, |r| {
        eprintln!("  {} {}: {:.0} msg/s, p99 {} µs", r.backend, r.kind.name(), r.rate(), r.latency.p99_us)
    })
    .await?;
    println!("\n{}", table(&reports));
    Ok(())
}

/// Runs every backend, the two handlers in alternating rounds; calls `progress` after each
/// backend's two reports.
pub(crate) async fn run(
    options: &Options,
    mut progress: impl FnMut(&RunReport),
) -> anyhow::Result<Vec<RunReport>> {
    anyhow::ensure!((1..=1_000_000).contains(&options.messages), "--messages must be from 1 to 1000000");
    anyhow::ensure!((1..=64).contains(&options.workers), "--workers must be from 1 to 64");
    anyhow::ensure!((1..=100_000).contains(&options.wallets), "--wallets must be from 1 to 100000");
    let mut reports = Vec::new();
    for &backend in &options.backends {
        let store_options =
            StoreOptions { max_connections: options.workers as u32 + 2, ..Default::default() };
        let db = ScratchDb::create(backend, &store_options).await?;
        let measured = measure(&db.store, options, &mut reports, &mut progress).await;
        db.drop_now().await;
        measured?;
    }
    Ok(reports)
}

async fn measure(
    store: &Store,
    options: &Options,
    reports: &mut Vec<RunReport>,
    progress: &mut impl FnMut(&RunReport),
) -> anyhow::Result<()> {
    let backend = store.backend();
    store.query(&CREATE_WALLET).execute(store.pool()).await?;
    store.query(&CREATE_LEDGER).execute(store.pool()).await?;
    for start in (0..options.wallets).step_by(1000) {
        let values: Vec<String> =
            (start..(start + 1000).min(options.wallets)).map(|i| format!("('user-{i}', 0)")).collect();
        let sql = format!("INSERT INTO wallet (user_id, balance_cents) VALUES {}", values.join(", "));
        sqlx::query(AssertSqlSafe(sql)).execute(store.pool()).await?;
    }
    let settings = settings(backend);
    let mut handlers = settings.handlers()?;
    handlers.insert(RUST, RustCredit);
    settings.validate_service()?;
    handlers.verify(store).await.map_err(|why| anyhow::anyhow!(why))?;
    let gate = Arc::new(idemgate::app::gate(&settings, store, store.clone(), handlers, None).await?);
    for kind in [Kind::Configured, Kind::Rust] {
        deliver(&gate, kind, "W", 0..500, options).await?;
    }
    // In rounds, each handler first in every other one, so that neither gains from going second
    // (a warmer cache, a checkpoint that fell in the other's time).
    let mut measured = [(Duration::ZERO, Vec::new()), (Duration::ZERO, Vec::new())];
    let bounds: Vec<usize> = (0..=ROUNDS).map(|r| r * options.messages / ROUNDS).collect();
    for round in 0..ROUNDS {
        let order =
            if round % 2 == 0 { [Kind::Configured, Kind::Rust] } else { [Kind::Rust, Kind::Configured] };
        for kind in order {
            let (elapsed, latencies) =
                deliver(&gate, kind, "M", bounds[round]..bounds[round + 1], options).await?;
            let m = &mut measured[kind as usize];
            m.0 += elapsed;
            m.1.extend(latencies);
        }
    }
    for kind in [Kind::Configured, Kind::Rust] {
        // Summed here: a SUM of integers is a NUMERIC on PostgreSQL, which the Any driver lacks.
        let (rows, cents) = {
            let rows =
                store.query(&LEDGER_OF).bind(format!("{}-M-%", kind.tag())).fetch_all(store.pool()).await?;
            let cents = rows.iter().map(|r| r.try_get::<i64, _>(0)).sum::<Result<i64, _>>()?;
            (rows.len() as i64, Some(cents))
        };
        anyhow::ensure!(
            rows == options.messages as i64 && cents == Some(expected_cents(options.messages)),
            "{backend} {}: {rows} ledger rows of {cents:?} cents, expected {} of {}",
            kind.name(),
            options.messages,
            expected_cents(options.messages)
        );
        let (elapsed, latencies) = &mut measured[kind as usize];
        let r = RunReport {
            backend,
            kind,
            messages: options.messages,
            workers: options.workers,
            elapsed: *elapsed,
            latency: Percentiles::of(latencies),
        };
        progress(&r);
        reports.push(r);
    }
    let balances = store.query(&BALANCES).fetch_all(store.pool()).await?;
    let total = Some(balances.iter().map(|r| r.try_get::<i64, _>(0)).sum::<Result<i64, _>>()?);
    let expected = 2 * (expected_cents(options.messages) + expected_cents(500));
    anyhow::ensure!(
        total == Some(expected),
        "{backend}: the balances add up to {total:?}, expected {expected}"
    );
    Ok(())
}

/// The cents of credits `0..n`: credit `i` is `1 + i % 100` cents.
fn expected_cents(n: usize) -> i64 {
    (0..n as i64).map(|i| 1 + i % 100).sum()
}

/// Delivers the fresh credits `range` of `kind`, keyed `{tag}-{run}-{i}`, from
/// `options.workers` workers; the time they took and the latency of each, in microseconds.
async fn deliver(
    gate: &Arc<Gate>,
    kind: Kind,
    run: &str,
    range: std::ops::Range<usize>,
    options: &Options,
) -> anyhow::Result<(Duration, Vec<u64>)> {
    let n = range.end;
    let next = Arc::new(AtomicUsize::new(range.start));
    let started = Instant::now();
    let mut workers = Vec::new();
    for _ in 0..options.workers {
        let (gate, next, run, wallets) = (gate.clone(), next.clone(), run.to_owned(), options.wallets);
        workers.push(tokio::spawn(async move {
            let mut latencies = Vec::new();
            loop {
                let i = next.fetch_add(1, Ordering::Relaxed);
                if i >= n {
                    return Ok::<_, anyhow::Error>(latencies);
                }
                let body =
                    serde_json::json!({ "user_id": format!("user-{}", i % wallets), "cents": 1 + i % 100 });
                let d = Delivery {
                    msg_id: format!("{}-{run}-{i}", kind.tag()),
                    uniq_key: format!("U-{}-{run}-{i}", kind.tag()),
                    topic: TOPIC.into(),
                    tags: kind.tag().into(),
                    keys: vec![format!("{}-{run}-{i}", kind.tag())],
                    body: body.to_string().into_bytes(),
                    ..Default::default()
                };
                let t = Instant::now();
                let r = gate.process(&d).await;
                latencies.push(t.elapsed().as_micros() as u64);
                anyhow::ensure!(r.outcome == Outcome::Processed, "{} {}: {r:?}", kind.name(), d.msg_id);
            }
        }));
    }
    let mut all = Vec::with_capacity(range.len());
    for w in workers {
        all.extend(w.await??);
    }
    Ok((started.elapsed(), all))
}

/// The figures as a Markdown table.
pub(crate) fn table(reports: &[RunReport]) -> String {
    let mut out = String::from(
        "| backend | handler | credits | at once | msg/s | p50 µs | p99 µs |\n|---|---|---|---|---|---|---|\n",
    );
    for r in reports {
        out.push_str(&format!(
            "| {} | {} | {} | {} | {:.0} | {} | {} |\n",
            r.backend,
            r.kind.name(),
            r.messages,
            r.workers,
            r.rate(),
            r.latency.p50_us,
            r.latency.p99_us
        ));
    }
    out
}
