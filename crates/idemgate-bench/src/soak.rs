//! `idemgate-bench soak`: `serve` under a steady stream for minutes, with the archive and the
//! reconciler on short schedules, watched from outside once a minute: its resident memory, its
//! open file descriptors and its database connections.
//!
//! A private RocketMQ broker (or `--name-server`) and a scratch PostgreSQL database; the example
//! traffic (`idemgate produce`'s default mix: 30% duplicates of every cause, poison and malformed
//! messages, payments before their orders) at `--rate` for `--minutes`; `idemgate-shop serve` as a child
//! process of this binary, archiving every minute (with expired claims and log rows loaded
//! beforehand, so that its runs move rows) and reconciling every minute. Memory is flat when
//! the slope of the resident memory after `--warm-up-minutes`, fitted by least squares, stays
//! under 1 MiB per 10 minutes; the run fails when it does not, as it does when a send has no
//! first delivery in the log or a key was applied twice.

use std::collections::HashMap;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::Context;
use sqlx::{AssertSqlSafe, Row};

use idemgate::config::Settings;
use idemgate::store::{Backend, Store, StoreOptions};
use idemgate_shop as shop;
use idemgate_shop::produce::{ProduceOptions, run as produce};
use idemgate_shop::traffic::Mix;
use idemgate_testkit::broker::LocalBroker;
use idemgate_testkit::scratch::ScratchDb;

/// What to measure: the flags of `idemgate-bench soak`.
#[derive(Debug, Clone, clap::Args)]
pub struct Options {
    /// A running name server; without it a private broker is started.
    #[arg(long)]
    pub name_server: Option<String>,
    /// How long the stream runs (1 to 240).
    #[arg(long, default_value_t = 10)]
    pub minutes: u64,
    /// Sends per second, all producers together.
    #[arg(long, default_value_t = 500)]
    pub rate: u32,
    /// Producers sending at once, each its own stream of orders at an equal share of `--rate`:
    /// one producer waits for each send's acknowledgement, which caps it near 1 / round trip.
    #[arg(long, default_value_t = 4)]
    pub producers: u32,
    /// Minutes left out of the memory slope: pools, caches and the allocator settling.
    #[arg(long, default_value_t = 2)]
    pub warm_up_minutes: u64,
    /// Expired claims and log rows loaded for the archive to move.
    #[arg(long, default_value_t = 200_000)]
    pub expired_rows: usize,
}

/// The application name `serve`'s connections carry, so that they can be counted.
const APPLICATION: &str = "idemgate_soak";
/// The most memory growth a flat process may show, MiB per 10 minutes.
const FLAT_MIB_PER_10_MIN: f64 = 1.0;

/// One minute's reading.
#[derive(Debug, Clone)]
struct Sample {
    minute: u64,
    sent: u64,
    logged: i64,
    rss_mib: f64,
    fds: usize,
    connections: i64,
    archive_runs: i64,
    reconcile_runs: i64,
}

/// `idemgate-bench soak`: prints the setting, runs, prints a row a minute and the verdict.
pub(crate) async fn command(options: Options) -> anyhow::Result<()> {
    anyhow::ensure!((1..=240).contains(&options.minutes), "--minutes must be between 1 and 240");
    anyhow::ensure!((1..=5_000).contains(&options.rate), "--rate must be between 1 and 5000");
    anyhow::ensure!(
        (1..=64).contains(&options.producers) && options.producers <= options.rate,
        "--producers must be between 1 and 64, and at most --rate"
    );
    anyhow::ensure!(
        options.warm_up_minutes + 2 <= options.minutes,
        "--minutes must leave two readings after --warm-up-minutes to fit a slope to"
    );
    println!(
        "bench soak: serve for {} min at {} msg/s from {} producers (30% duplicates, the default mix), archive \
         and reconcile every minute, {} expired rows to archive, PostgreSQL, {} cores",
        options.minutes,
        options.rate,
        options.producers,
        options.expired_rows,
        super::cores()
    );
    let _broker;
    let name_server = match &options.name_server {
        Some(n) => n.clone(),
        None => {
            let b = tokio::task::spawn_blocking(LocalBroker::start).await??;
            let n = b.name_server().to_owned();
            _broker = b;
            n
        }
    };
    let db = ScratchDb::create(Backend::Postgres, &StoreOptions::default()).await?;
    let now = idemgate::clock::now_ms();
    super::create_digits(&db.store).await?;
    super::archive::load_expired(&db.store, "soak", options.expired_rows, now).await?;
    load_expired_log(&db.store, options.expired_rows, now).await?;
    let topic = format!("soak_{}", idemgate_shop::traffic::run_id());
    let dir = tempfile::tempdir()?;
    let mut child = start_serve(dir.path(), &serve_settings(&db.url, &name_server, &topic))?;
    let pid = child.id();

    let sent = std::sync::Arc::new(std::sync::atomic::AtomicU64::new(0));
    // Every acknowledged send, by its unique key, for the books at the end.
    let acknowledged = std::sync::Arc::new(std::sync::Mutex::new(HashMap::<String, i64>::new()));
    let share = options.rate / options.producers;
    let mut producers = tokio::task::JoinSet::new();
    for p in 0..options.producers {
        // The first producers take the remainder of the rate, one message per second each.
        let rate = share + u32::from(p < options.rate % options.producers);
        let rocketmq = idemgate::broker::RocketMqSettings {
            name_server: name_server.clone(),
            producer_group: format!("idemgate_soak_producer_{p}"),
            ..Default::default()
        };
        let produce_options = ProduceOptions {
            brokers: idemgate::broker::Brokers { rocketmq, ..Default::default() },
            topic: topic.clone(),
            count: u64::from(rate) * 60 * options.minutes,
            rate,
            mix: Mix::default(),
            seed: 7 + u64::from(p),
            run: format!("{}p{p}", idemgate_shop::traffic::run_id()),
        };
        let (sent, acknowledged) = (sent.clone(), acknowledged.clone());
        producers.spawn(async move {
            produce(&produce_options, |send| {
                sent.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                let mut acknowledged = acknowledged.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
                *acknowledged.entry(send.uniq_key.to_owned()).or_default() += 1;
            })
            .await
        });
    }
    let started = Instant::now();
    let mut samples = Vec::new();
    println!(
        "\n| minute | sent | log rows | RSS MiB | open fds | DB connections | archive runs | reconcile runs |\n\
         |---|---|---|---|---|---|---|---|"
    );
    for minute in 1..=options.minutes {
        tokio::time::sleep_until((started + Duration::from_secs(60 * minute)).into()).await;
        if let Some(status) = child.try_wait()? {
            anyhow::bail!("serve exited during the soak ({status}):\n{}", serve_log(dir.path()));
        }
        let s = sample(&db.store, pid, minute, sent.load(std::sync::atomic::Ordering::Relaxed)).await?;
        println!(
            "| {} | {} | {} | {:.1} | {} | {} | {} | {} |",
            s.minute, s.sent, s.logged, s.rss_mib, s.fds, s.connections, s.archive_runs, s.reconcile_runs
        );
        samples.push(s);
    }
    // The stream ends with the last minute; a producer that fell behind its rate stops there too.
    let finished_early: Vec<_> = std::iter::from_fn(|| producers.try_join_next()).collect();
    producers.abort_all();
    let sent = sent.load(std::sync::atomic::Ordering::Relaxed);
    let elapsed = started.elapsed();
    for finished in finished_early {
        if let Ok(Err(e)) = finished {
            anyhow::bail!("a producer failed: {e:#}");
        }
    }
    // Every acknowledged send has its first delivery in the log before serve stops: the backlog
    // drains, or the run fails.
    let acknowledged =
        std::mem::take(&mut *acknowledged.lock().unwrap_or_else(std::sync::PoisonError::into_inner));
    let drain = Instant::now();
    let mut missing = unlogged(&db.store, &acknowledged).await?;
    while missing > 0 && drain.elapsed() < Duration::from_secs(180) {
        tokio::time::sleep(Duration::from_secs(1)).await;
        missing = unlogged(&db.store, &acknowledged).await?;
    }
    let drained = drain.elapsed();
    stop(&mut child)?;
    let (processed, twice) = books(&db.store).await?;
    db.drop_now().await;

    let settled: Vec<(f64, f64)> = samples
        .iter()
        .filter(|s| s.minute > options.warm_up_minutes)
        .map(|s| (s.minute as f64, s.rss_mib))
        .collect();
    let slope = slope(&settled) * 10.0;
    let conns: Vec<i64> = samples.iter().map(|s| s.connections).collect();
    let fds: Vec<usize> = samples.iter().map(|s| s.fds).collect();
    println!(
        "\nsent {sent} ({:.0}/s), {missing} of them without a first delivery in the log after a drain of {:.1} s; \
         processed keys {processed}, applied twice {twice}; RSS slope after minute {}: {slope:+.2} MiB per 10 min ({}: the bound is \
         {FLAT_MIB_PER_10_MIN} MiB); open fds {}..{}, DB connections {}..{}",
        super::rate(sent as usize, elapsed),
        drained.as_secs_f64(),
        options.warm_up_minutes,
        if slope < FLAT_MIB_PER_10_MIN { "flat" } else { "NOT flat" },
        fds.iter().min().unwrap_or(&0),
        fds.iter().max().unwrap_or(&0),
        conns.iter().min().unwrap_or(&0),
        conns.iter().max().unwrap_or(&0),
    );
    anyhow::ensure!(missing == 0, "{missing} acknowledged sends have no first delivery in the log");
    anyhow::ensure!(twice == 0, "{twice} keys applied twice");
    anyhow::ensure!(
        slope < FLAT_MIB_PER_10_MIN,
        "resident memory grew {slope:+.2} MiB per 10 min after the warm-up, over the bound of {FLAT_MIB_PER_10_MIN} MiB"
    );
    Ok(())
}

/// `serve` on the scratch database: the example shop on `topic`, archive and reconcile every
/// minute, half a minute apart.
fn serve_settings(db_url: &str, name_server: &str, topic: &str) -> Settings {
    let mut s = Settings::default();
    let sep = if db_url.contains('?') { '&' } else { '?' };
    s.database.url = format!("{db_url}{sep}application_name={APPLICATION}");
    s.consumer.group = "soak".to_owned();
    s.consumer.instance = "soak-1".to_owned();
    s.rocketmq.name_server = name_server.to_owned();
    s.http.bind = "127.0.0.1:0".to_owned();
    s.routes = shop::routes(topic);
    s.archive.enabled = true;
    s.archive.schedule = "0 * * * * *".to_owned();
    s.reconcile.enabled = true;
    s.reconcile.schedule = "30 * * * * *".to_owned();
    s
}

fn start_serve(dir: &Path, settings: &Settings) -> anyhow::Result<Child> {
    let config = dir.join("idemgate.toml");
    std::fs::write(&config, toml::to_string(settings)?)?;
    let log = std::fs::File::create(dir.join("serve.log"))?;
    // The shop's service: `idemgate-shop`, built beside this binary.
    let child = Command::new(std::env::current_exe()?.with_file_name("idemgate-shop"))
        .args(["--config", &config.to_string_lossy(), "serve"])
        .env_remove("RUST_LOG")
        .stdin(Stdio::null())
        .stdout(log.try_clone()?)
        .stderr(log)
        .spawn()
        .context("starting serve")?;
    let started = Instant::now();
    while !serve_log(dir).contains("idemgate serving") {
        anyhow::ensure!(
            started.elapsed() < Duration::from_secs(30),
            "serve did not start:\n{}",
            serve_log(dir)
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    Ok(child)
}

fn serve_log(dir: &Path) -> String {
    std::fs::read_to_string(dir.join("serve.log")).unwrap_or_default()
}

/// SIGTERM, and the exit within a minute.
fn stop(child: &mut Child) -> anyhow::Result<()> {
    Command::new("kill").args(["-TERM", &child.id().to_string()]).status()?;
    let started = Instant::now();
    while child.try_wait()?.is_none() {
        anyhow::ensure!(
            started.elapsed() < Duration::from_secs(60),
            "serve did not exit within 60 s of SIGTERM"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    Ok(())
}

/// Expired log rows (100 days old) for the archive's log pass.
async fn load_expired_log(store: &Store, rows: usize, now: i64) -> Result<(), sqlx::Error> {
    let sql = format!(
        "INSERT INTO delivery_log (logged_at_ms, instance_id, consumer_group, msg_id, topic, queue_id, \
         queue_offset, reconsume_times, biz_type, biz_id, outcome, latency_us) \
         SELECT {old} + g, 'old', 'old', 'OLD' || g, 'old', 0, g, 0, 'stock.deduct', 'OLD-' || g, 'processed', 1 \
         FROM generate_series(1, {rows}) g",
        old = now - 100 * idemgate::archive::retention::DAY_MS
    );
    sqlx::query(AssertSqlSafe(sql)).execute(store.pool()).await?;
    Ok(())
}

async fn sample(store: &Store, pid: u32, minute: u64, sent: u64) -> anyhow::Result<Sample> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status"))?;
    let rss_kib: u64 = status
        .lines()
        .find(|l| l.starts_with("VmRSS:"))
        .and_then(|l| l.split_whitespace().nth(1))
        .and_then(|v| v.parse().ok())
        .unwrap_or(0);
    let fds = std::fs::read_dir(format!("/proc/{pid}/fd"))?.count();
    let row = sqlx::query(AssertSqlSafe(format!(
        "SELECT (SELECT COUNT(*) FROM pg_stat_activity WHERE application_name = '{APPLICATION}'), \
         (SELECT COUNT(*) FROM delivery_log WHERE consumer_group = 'soak'), \
         (SELECT COUNT(*) FROM archive_run WHERE status = 'success'), \
         (SELECT COUNT(*) FROM reconcile_run)"
    )))
    .fetch_one(store.pool())
    .await?;
    Ok(Sample {
        minute,
        sent,
        logged: row.try_get(1)?,
        rss_mib: rss_kib as f64 / 1024.0,
        fds,
        connections: row.try_get(0)?,
        archive_runs: row.try_get(2)?,
        reconcile_runs: row.try_get(3)?,
    })
}

/// How many of the `acknowledged` sends (each unique key as often as it was sent) lack a first
/// delivery (reconsume count 0) in the log.
async fn unlogged(store: &Store, acknowledged: &HashMap<String, i64>) -> Result<i64, sqlx::Error> {
    let rows = sqlx::query(
        "SELECT uniq_key, COUNT(*) FROM delivery_log WHERE consumer_group = 'soak' AND reconsume_times = 0 \
         GROUP BY uniq_key",
    )
    .fetch_all(store.pool())
    .await?;
    let mut logged = HashMap::with_capacity(rows.len());
    for row in rows {
        logged.insert(row.try_get::<String, _>(0)?, row.try_get::<i64, _>(1)?);
    }
    Ok(acknowledged.iter().map(|(key, n)| (n - logged.get(key).copied().unwrap_or(0)).max(0)).sum())
}

/// Keys processed, and keys with more than one processed delivery.
async fn books(store: &Store) -> Result<(i64, i64), sqlx::Error> {
    let row = sqlx::query(
        "SELECT COUNT(*), COUNT(CASE WHEN n > 1 THEN 1 END) FROM (SELECT COUNT(*) AS n FROM delivery_log \
         WHERE consumer_group = 'soak' AND outcome = 'processed' GROUP BY biz_type, biz_id, execute_time) k",
    )
    .fetch_one(store.pool())
    .await?;
    Ok((row.try_get(0)?, row.try_get(1)?))
}

/// The least-squares slope of `points` (x, y); 0 for fewer than two.
fn slope(points: &[(f64, f64)]) -> f64 {
    let n = points.len() as f64;
    if points.len() < 2 {
        return 0.0;
    }
    let (sx, sy) = points.iter().fold((0.0, 0.0), |(a, b), (x, y)| (a + x, b + y));
    let (mx, my) = (sx / n, sy / n);
    let (num, den) =
        points.iter().fold((0.0, 0.0), |(a, b), (x, y)| (a + (x - mx) * (y - my), b + (x - mx) * (x - mx)));
    if den == 0.0 { 0.0 } else { num / den }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_slope_is_fitted_by_least_squares() {
        assert_eq!(slope(&[(1.0, 10.0), (2.0, 12.0), (3.0, 14.0)]), 2.0);
        assert_eq!(slope(&[(1.0, 5.0)]), 0.0);
        assert!(slope(&[(1.0, 5.0), (2.0, 5.1), (3.0, 4.9), (4.0, 5.0)]).abs() < 0.05);
    }
}
