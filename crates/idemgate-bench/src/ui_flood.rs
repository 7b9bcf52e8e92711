//! `idemgate-bench ui-flood`: what a flood of web requests does to the consumer. The service
//! is the one `serve` ships ([`Application::build`], fed by a real RocketMQ broker), on a
//! scratch database holding a history of deliveries so that the pages do real work. Each
//! configuration consumes the same pre-loaded topic under a fresh consumer group twice: once
//! quiet, once while `clients` loops request `/api/overview` and `/collisions?since=0` as fast
//! as the service answers.
//!
//! The configurations: the shipped defaults (the UI's own small pool, a limit on requests in
//! flight); the same with the limits opened wide; and the naive way, the pages on the
//! consumer's own pool with no limit at all. The consumer must never wait for a connection
//! (`PoolTimedOut`) and its books must stay exact; [`Report::check`] says so.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use anyhow::Context;
use sqlx::Row;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

use super::{Percentiles, peak_rss_mib, reset_peak_rss};
use idemgate::app::{Application, Feed};
use idemgate::broker::Producer;
use idemgate::config::Settings;
use idemgate::http::{self, AppState, Web};
use idemgate::metrics::{BuildInfo, Metrics};
use idemgate::store::{Backend, Sql, Store, StoreOptions};
use idemgate_shop as shop;
use idemgate_testkit::broker::LocalBroker;
use idemgate_testkit::scratch::ScratchDb;

/// The consumer groups of the measured runs, cleared between runs; the history's is another.
const RUN_GROUP_PREFIX: &str = "uiflood_run_";

#[derive(Debug, Clone, clap::Args)]
pub struct Options {
    /// A running name server; without it a private broker is started (scripts/install-rocketmq.sh
    /// installs the binaries).
    #[arg(long)]
    pub name_server: Option<String>,
    /// The database: postgres or mysql.
    #[arg(long, default_value = "postgres")]
    pub backend: Backend,
    /// stock.deduct messages each run consumes.
    #[arg(long, default_value_t = 2_000)]
    pub messages: usize,
    #[arg(long, default_value_t = 0.3)]
    pub duplicates: f64,
    /// Concurrent request loops of the flood.
    #[arg(long, default_value_t = 200)]
    pub clients: usize,
    /// Delivery-log rows of history loaded before the runs (the pages read them).
    #[arg(long, default_value_t = 100_000)]
    pub history: usize,
    /// Deliveries of one hot key loaded before the runs, whose trace is one of the flood's
    /// requests (0 leaves it out).
    #[arg(long, default_value_t = 1_000_000)]
    pub hot_key_rows: usize,
}

/// How the web UI is wired in a run.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Wiring {
    /// `[http]` as shipped: `max_connections` 4, `max_concurrent_requests` 16.
    Defaults,
    /// The UI's own pool of 32, and up to 1,024 requests in flight (the most
    /// `http.max_concurrent_requests` allows).
    WideLimits,
    /// The pages on the consumer's pool, no limit on requests: the naive way.
    SharedPool,
}

impl Wiring {
    pub(crate) fn name(self) -> &'static str {
        match self {
            Wiring::Defaults => "defaults (own pool of 4, 16 in flight)",
            Wiring::WideLimits => "own pool of 32, 1,024 in flight",
            Wiring::SharedPool => "naive: consumer's pool, no limit",
        }
    }
}

/// One run: a configuration, quiet or flooded.
#[derive(Debug, Clone)]
pub(crate) struct Run {
    pub wiring: Wiring,
    pub flooded: bool,
    pub messages: usize,
    /// From the first delivery logged to the last message's first log row.
    pub elapsed: Duration,
    /// The gate's latency per delivery, from the log.
    pub latency: Percentiles,
    /// Deliveries that failed waiting for a pool connection, logged or not.
    pub pool_timeouts: i64,
    /// Deliveries the gate could not log (`idemgate_unlogged_deliveries_total`).
    pub unlogged: f64,
    /// Ledger rows, and deductions applied more than once.
    pub effects: i64,
    pub double_applied: i64,
    pub distinct_keys: usize,
    pub requests: Requests,
    /// What `/readyz` answered, asked every 200 ms during the run.
    pub readiness: Readiness,
    pub peak_rss_mib: f64,
}

/// The answers of `/readyz` during a run.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct Readiness {
    pub ready: u64,
    /// 503: the consumer's pool did not answer within a second, or the consumer had stopped.
    pub not_ready: u64,
    /// Any other status, or no answer.
    pub other: u64,
}

impl Run {
    pub(crate) fn rate(&self) -> f64 {
        super::rate(self.messages, self.elapsed)
    }

    fn books_exact(&self) -> bool {
        self.effects == self.distinct_keys as i64 && self.double_applied == 0
    }
}

/// What the flood's requests got.
#[derive(Debug, Clone, Default)]
pub(crate) struct Requests {
    pub ok: u64,
    pub shed: u64,
    /// Any other status, or no answer.
    pub other: u64,
    /// Latency of the answered 200s.
    pub ok_latency: Percentiles,
}

#[derive(Debug, Clone)]
pub(crate) struct Report {
    pub runs: Vec<Run>,
}

impl Report {
    /// Fails unless every run's books are exact and the shipped defaults never made the
    /// consumer wait for a connection, flooded or not.
    pub(crate) fn check(&self) -> anyhow::Result<()> {
        for r in &self.runs {
            anyhow::ensure!(
                r.books_exact(),
                "{} ({}): {} ledger rows for {} keys, {} applied twice",
                r.wiring.name(),
                if r.flooded { "flooded" } else { "quiet" },
                r.effects,
                r.distinct_keys,
                r.double_applied
            );
            if r.wiring == Wiring::Defaults {
                anyhow::ensure!(
                    r.pool_timeouts == 0 && r.unlogged == 0.0,
                    "the shipped defaults let the consumer wait for a connection: {} pool timeouts, {} unlogged",
                    r.pool_timeouts,
                    r.unlogged
                );
                anyhow::ensure!(
                    r.readiness.not_ready == 0 && r.readiness.other == 0 && r.readiness.ready > 0,
                    "with the shipped defaults /readyz answered {} times ready, {} not ready and {} otherwise ({})",
                    r.readiness.ready,
                    r.readiness.not_ready,
                    r.readiness.other,
                    if r.flooded { "flooded" } else { "quiet" },
                );
            }
        }
        Ok(())
    }
}

/// `idemgate-bench ui-flood`: checks the flags, prints the setting, runs every configuration
/// quiet and flooded, prints the table and fails unless [`Report::check`] passes.
pub(crate) async fn command(options: Options) -> anyhow::Result<()> {
    super::share("duplicates", options.duplicates, 0.9)?;
    anyhow::ensure!(
        options.messages > 0 && options.clients > 0,
        "bench ui-flood: --messages and --clients must be at least 1"
    );
    println!(
        "bench ui-flood: {} stock.deduct messages, {:.0}% duplicates, RocketMQ -> {}, {} request loops, {} history rows, a hot key of {} deliveries, {} cores",
        options.messages,
        options.duplicates * 100.0,
        options.backend,
        options.clients,
        options.history,
        options.hot_key_rows,
        super::cores(),
    );
    let report = run(&options, |line| eprintln!("  {line}")).await?;
    println!("\n{}", table(&report));
    report.check()
}

pub(crate) async fn run(options: &Options, progress: impl Fn(&str)) -> anyhow::Result<Report> {
    anyhow::ensure!(options.backend != Backend::Sqlite, "bench ui-flood: --backend is postgres or mysql");
    let local = match &options.name_server {
        Some(_) => None,
        None => Some(LocalBroker::start()?),
    };
    let name_server = options
        .name_server
        .clone()
        .or_else(|| local.as_ref().map(|l| l.name_server().to_owned()))
        .context("a name server")?;
    let db = ScratchDb::create(options.backend, &StoreOptions::default()).await?;
    idemgate::layout::ensure(&db.store, Settings::default().dedup.shards, "bench").await?;
    if options.history > 0 {
        let started = Instant::now();
        let now = idemgate::clock::now_ms();
        super::reconcile::load(&db.store, options.history, 3_600_000, now).await?;
        progress(&format!(
            "loaded {} delivery-log rows of history in {:.1} s",
            options.history,
            started.elapsed().as_secs_f64()
        ));
    }
    if options.hot_key_rows > 0 {
        let started = Instant::now();
        super::create_digits(&db.store).await?;
        super::trace::load_hot_key(&db.store, options.hot_key_rows, 3_600_000).await?;
        progress(&format!(
            "loaded a hot key of {} deliveries in {:.1} s",
            options.hot_key_rows,
            started.elapsed().as_secs_f64()
        ));
    }

    let topic = format!("uiflood_{}", idemgate_shop::traffic::run_id());
    let (mut stream, distinct_keys) = super::gate::stream(options.messages, options.duplicates, 11);
    for d in &mut stream {
        d.topic = topic.clone();
    }
    let producer =
        Producer::start(&idemgate::broker::BrokerAccess::open(&name_server), "idemgate_bench_producer")
            .await?;
    for d in &stream {
        producer.send(d).await?;
    }
    producer.shutdown().await;
    progress(&format!("loaded {} messages into {topic}", stream.len()));

    let mut runs = Vec::new();
    for wiring in [Wiring::Defaults, Wiring::WideLimits, Wiring::SharedPool] {
        for flooded in [false, true] {
            clear_runs(&db.store).await?;
            reset_peak_rss();
            let group = format!("{RUN_GROUP_PREFIX}{}", idemgate_shop::traffic::run_id());
            let settings = settings(&db.url, &name_server, &topic, &group, wiring);
            let r = consume(&settings, wiring, flooded, options, stream.len(), distinct_keys, &db.store)
                .await
                .with_context(|| {
                    format!("{} ({})", wiring.name(), if flooded { "flooded" } else { "quiet" })
                })?;
            progress(&format!(
                "{}, {}: {:.0} msg/s, p99 {:.1} ms, requests {} ok / {} shed / {} other, {} pool timeouts",
                wiring.name(),
                if flooded { "flooded" } else { "quiet" },
                r.rate(),
                r.latency.p99_us as f64 / 1000.0,
                r.requests.ok,
                r.requests.shed,
                r.requests.other,
                r.pool_timeouts
            ));
            runs.push(r);
        }
    }
    db.drop_now().await;
    drop(local);
    Ok(Report { runs })
}

/// `serve`'s settings for one run: the shop's routes on `topic`, a fresh group, the HTTP
/// limits of `wiring`.
fn settings(db_url: &str, name_server: &str, topic: &str, group: &str, wiring: Wiring) -> Settings {
    let mut s = Settings::default();
    s.database.url = db_url.to_owned();
    s.rocketmq.name_server = name_server.to_owned();
    s.consumer.group = group.to_owned();
    s.consumer.instance = "bench".to_owned();
    s.http.bind = "127.0.0.1:0".to_owned();
    s.routes = shop::routes(topic);
    if wiring != Wiring::Defaults {
        s.http.max_connections = 32;
        s.http.max_concurrent_requests = 1_024;
    }
    s
}

async fn consume(
    settings: &Settings,
    wiring: Wiring,
    flooded: bool,
    options: &Options,
    messages: usize,
    distinct_keys: usize,
    store: &Store,
) -> anyhow::Result<Run> {
    let app =
        Application::build_with(settings, settings.handlers_with(shop::handlers())?, Feed::Broker).await?;
    // The naive wiring serves the same pages from a second listener on the gate's own pool.
    let naive = match wiring {
        Wiring::SharedPool => Some(shared_pool_server(settings, app.gate().store().clone()).await?),
        _ => None,
    };
    let running = app.start().await?;
    let target = naive.as_ref().map_or_else(|| authority(running.url()), |(addr, _)| addr.clone());
    let stop_flood = Arc::new(AtomicBool::new(false));
    let mut paths = vec!["/api/overview".to_owned(), "/collisions?since=0".to_owned()];
    if options.hot_key_rows > 0 {
        paths.push(format!("/trace?q={}", super::trace::HOT_BIZ_ID));
    }
    let flood = flooded.then(|| Flood::start(&target, options.clients, &paths, stop_flood.clone()));
    let probe = readiness_probe(authority(running.url()), stop_flood.clone());

    let group = &settings.consumer.group;
    let deadline = Instant::now() + Duration::from_secs(600);
    while seen(store, group).await? < messages as i64 {
        anyhow::ensure!(Instant::now() < deadline, "the topic was not consumed within 10 minutes");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    stop_flood.store(true, Ordering::Release);
    let requests = match flood {
        Some(flood) => flood.finish().await,
        None => Requests::default(),
    };
    let readiness = probe.await.unwrap_or_default();
    // Redeliveries the gate asked for may still be under way; the books are read when the
    // log has stopped growing.
    settle(store, group).await?;
    let metrics = scrape(&authority(running.url())).await.unwrap_or_default();
    let unlogged = metric_sum(&metrics, "idemgate_unlogged_deliveries_total");
    if let Some((_, stop)) = naive {
        let _ = stop.send(());
    }
    running.stop().await?;

    let (elapsed, latency, pool_timeouts) = log_figures(store, group).await?;
    let (effects, double_applied) = super::gate::books(store).await?;
    Ok(Run {
        wiring,
        flooded,
        messages,
        elapsed,
        latency,
        pool_timeouts,
        unlogged,
        effects,
        double_applied,
        distinct_keys,
        requests,
        readiness,
        peak_rss_mib: peak_rss_mib(),
    })
}

/// Asks the service's `/readyz` every 200 ms until `stop`, each answer within 5 s.
fn readiness_probe(addr: String, stop: Arc<AtomicBool>) -> tokio::task::JoinHandle<Readiness> {
    tokio::spawn(async move {
        let mut readiness = Readiness::default();
        while !stop.load(Ordering::Acquire) {
            match tokio::time::timeout(Duration::from_secs(5), get_status(&addr, "/readyz")).await {
                Ok(Some(200)) => readiness.ready += 1,
                Ok(Some(503)) => readiness.not_ready += 1,
                _ => readiness.other += 1,
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
        readiness
    })
}

/// The pages served on `store` (the consumer's pool), with no limit on requests in flight:
/// the address it listens on and the sender that stops it.
async fn shared_pool_server(
    settings: &Settings,
    store: Store,
) -> anyhow::Result<(String, tokio::sync::oneshot::Sender<()>)> {
    let mut naive = settings.clone();
    naive.http.max_concurrent_requests = 1_000_000;
    naive.http.bind = "127.0.0.1:0".to_owned();
    let handlers = naive.handlers_with(shop::handlers())?;
    let server = http::Server::bind(&naive.http).await?;
    let addr = server.local_addr()?.to_string();
    let info = BuildInfo {
        backend: store.backend(),
        consumer_group: naive.consumer.group.clone(),
        broker: Default::default(),
        instance_id: "bench-naive-ui".to_owned(),
        ui_url: format!("http://{addr}"),
    };
    let metrics = Arc::new(Metrics::new(&info, &naive.routes().biz_types(), &Default::default()));
    let state = AppState {
        consumer_store: store.clone(),
        store,
        consumer_ready: Arc::new(AtomicBool::new(true)),
        consumer_progressing: Arc::new(AtomicBool::new(true)),
        metrics,
        web: Arc::new(Web::new(&naive.http, &naive.archive, handlers.by_biz_type(&naive.routes()))),
    };
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    tokio::spawn(server.run(state, async move {
        let _ = stopped.await;
    }));
    Ok((addr, stop))
}

fn authority(url: &str) -> String {
    url.trim_start_matches("http://").trim_end_matches('/').to_owned()
}

/// `clients` loops, each requesting `paths` in turn, one request after the other, until
/// `stop`.
struct Flood {
    loops: Vec<tokio::task::JoinHandle<Vec<(u16, u64)>>>,
}

impl Flood {
    fn start(addr: &str, clients: usize, paths: &[String], stop: Arc<AtomicBool>) -> Self {
        let loops = (0..clients)
            .map(|i| {
                let addr = addr.to_owned();
                let paths = paths.to_vec();
                let stop = stop.clone();
                tokio::spawn(async move {
                    let mut answers = Vec::new();
                    let mut n = i;
                    while !stop.load(Ordering::Acquire) {
                        let path = &paths[n % paths.len()];
                        n += 1;
                        let started = Instant::now();
                        let status = get_status(&addr, path).await.unwrap_or(0);
                        answers.push((status, started.elapsed().as_micros() as u64));
                        if status == 0 {
                            tokio::time::sleep(Duration::from_millis(10)).await;
                        }
                    }
                    answers
                })
            })
            .collect();
        Self { loops }
    }

    async fn finish(self) -> Requests {
        let mut requests = Requests::default();
        let mut ok_latency = Vec::new();
        for handle in self.loops {
            for (status, us) in handle.await.unwrap_or_default() {
                match status {
                    200 => {
                        requests.ok += 1;
                        ok_latency.push(us);
                    }
                    503 => requests.shed += 1,
                    _ => requests.other += 1,
                }
            }
        }
        requests.ok_latency = Percentiles::of(&mut ok_latency);
        requests
    }
}

/// One HTTP/1.1 GET on a fresh connection; the status code, or `None` without an answer.
async fn get_status(addr: &str, path: &str) -> Option<u16> {
    let text = get(addr, path).await?;
    text.split_whitespace().nth(1)?.parse().ok()
}

async fn get(addr: &str, path: &str) -> Option<String> {
    let mut stream = tokio::net::TcpStream::connect(addr).await.ok()?;
    let request = format!("GET {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n");
    stream.write_all(request.as_bytes()).await.ok()?;
    let mut answer = Vec::new();
    tokio::time::timeout(Duration::from_secs(60), stream.read_to_end(&mut answer)).await.ok()?.ok()?;
    Some(String::from_utf8_lossy(&answer).into_owned())
}

async fn scrape(addr: &str) -> Option<String> {
    get(addr, "/metrics").await
}

/// The sum of a metric's samples in a Prometheus text exposition.
fn metric_sum(exposition: &str, name: &str) -> f64 {
    exposition
        .lines()
        .filter(|l| l.starts_with(name) && l[name.len()..].starts_with(['{', ' ']))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum()
}

static SEEN: Sql = Sql::new("SELECT COUNT(DISTINCT msg_id) FROM delivery_log WHERE consumer_group = ?");
static LOG_ROWS: Sql = Sql::new("SELECT COUNT(*) FROM delivery_log WHERE consumer_group = ?");
static SPAN: Sql = Sql::new(
    "SELECT MIN(first_ms), MAX(first_ms) FROM \
     (SELECT MIN(logged_at_ms) AS first_ms FROM delivery_log WHERE consumer_group = ? GROUP BY msg_id) t",
);
static LATENCIES: Sql = Sql::new("SELECT latency_us FROM delivery_log WHERE consumer_group = ?");
static POOL_TIMEOUTS: Sql =
    Sql::new("SELECT COUNT(*) FROM delivery_log WHERE consumer_group = ? AND error LIKE '%pool timed out%'");
static CLEAR: [Sql; 3] = [
    Sql::new("DELETE FROM delivery_log WHERE consumer_group LIKE 'uiflood_run_%'"),
    Sql::new("DELETE FROM idempotent_record WHERE consumer_group LIKE 'uiflood_run_%'"),
    Sql::new("DELETE FROM shop_stock_ledger"),
];

async fn seen(store: &Store, group: &str) -> anyhow::Result<i64> {
    Ok(store.query(&SEEN).bind(group.to_owned()).fetch_one(store.pool()).await?.try_get(0)?)
}

/// Waits until the group's log has not grown for two seconds.
async fn settle(store: &Store, group: &str) -> anyhow::Result<()> {
    let mut last = -1_i64;
    let mut still = 0;
    while still < 4 {
        let rows: i64 =
            store.query(&LOG_ROWS).bind(group.to_owned()).fetch_one(store.pool()).await?.try_get(0)?;
        still = if rows == last { still + 1 } else { 0 };
        last = rows;
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    Ok(())
}

async fn log_figures(store: &Store, group: &str) -> anyhow::Result<(Duration, Percentiles, i64)> {
    let span = store.query(&SPAN).bind(group.to_owned()).fetch_one(store.pool()).await?;
    let (first, last): (i64, i64) = (span.try_get(0)?, span.try_get(1)?);
    let mut latencies: Vec<u64> = store
        .query(&LATENCIES)
        .bind(group.to_owned())
        .fetch_all(store.pool())
        .await?
        .iter()
        .map(|r| r.try_get::<i64, _>(0).map(|v| v.max(0) as u64))
        .collect::<Result<_, _>>()?;
    let timeouts =
        store.query(&POOL_TIMEOUTS).bind(group.to_owned()).fetch_one(store.pool()).await?.try_get(0)?;
    Ok((Duration::from_millis((last - first).max(1) as u64), Percentiles::of(&mut latencies), timeouts))
}

async fn clear_runs(store: &Store) -> anyhow::Result<()> {
    for sql in &CLEAR {
        store.query(sql).execute(store.pool()).await?;
    }
    // Each run deducts from the same full stock, so that every fresh key applies.
    super::gate::seed(store).await?;
    Ok(())
}

/// The runs as a Markdown table.
pub(crate) fn table(report: &Report) -> String {
    let mut out = String::from(
        "| UI wiring | flood | msg/s | delivery p50 ms | delivery p99 ms | pool timeouts | unlogged | requests 200 / 503 / other | 200 p50 ms | 200 p99 ms | /readyz ready / not / other | effects / keys | applied twice | peak RSS MiB |\n\
         |---|---|---|---|---|---|---|---|---|---|---|---|---|---|\n",
    );
    for r in &report.runs {
        let q = &r.requests;
        out.push_str(&format!(
            "| {} | {} | {:.0} | {:.1} | {:.1} | {} | {} | {} / {} / {} | {:.0} | {:.0} | {} / {} / {} | {} / {} | {} | {:.0} |\n",
            r.wiring.name(),
            if r.flooded { "yes" } else { "no" },
            r.rate(),
            r.latency.p50_us as f64 / 1000.0,
            r.latency.p99_us as f64 / 1000.0,
            r.pool_timeouts,
            r.unlogged,
            q.ok,
            q.shed,
            q.other,
            q.ok_latency.p50_us as f64 / 1000.0,
            q.ok_latency.p99_us as f64 / 1000.0,
            r.readiness.ready,
            r.readiness.not_ready,
            r.readiness.other,
            r.effects,
            r.distinct_keys,
            r.double_applied,
            r.peak_rss_mib,
        ));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_metric_is_summed_over_its_labels_and_not_over_its_namesakes() {
        let text = "# HELP x\nidemgate_unlogged_deliveries_total{group=\"a\"} 2\n\
                    idemgate_unlogged_deliveries_total{group=\"b\"} 3\n\
                    idemgate_unlogged_deliveries_total_other 7\n";
        assert_eq!(metric_sum(text, "idemgate_unlogged_deliveries_total"), 5.0);
        assert_eq!(metric_sum(text, "idemgate_missing_total"), 0.0);
    }

    #[test]
    fn a_run_with_a_key_applied_twice_fails_the_check() {
        let run = Run {
            wiring: Wiring::SharedPool,
            flooded: true,
            messages: 10,
            elapsed: Duration::from_secs(1),
            latency: Percentiles::default(),
            pool_timeouts: 3,
            unlogged: 0.0,
            effects: 8,
            double_applied: 1,
            distinct_keys: 7,
            requests: Requests::default(),
            readiness: Readiness { ready: 5, ..Readiness::default() },
            peak_rss_mib: 0.0,
        };
        let mut report = Report { runs: vec![run.clone()] };
        assert!(report.check().is_err());
        // The naive wiring may time out; only the books fail it.
        report.runs[0] = Run { effects: 7, double_applied: 0, ..run.clone() };
        assert!(report.check().is_ok());
        report.runs[0] = Run { wiring: Wiring::Defaults, effects: 7, double_applied: 0, ..run.clone() };
        assert!(report.check().is_err(), "the defaults may not time out");
        let ready = Run { wiring: Wiring::Defaults, effects: 7, double_applied: 0, pool_timeouts: 0, ..run };
        report.runs[0] = ready.clone();
        assert!(report.check().is_ok());
        report.runs[0] = Run { readiness: Readiness { ready: 5, not_ready: 1, other: 0 }, ..ready };
        assert!(report.check().is_err(), "with the defaults /readyz may not turn false");
    }
}
