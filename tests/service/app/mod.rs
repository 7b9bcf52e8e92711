//! The assembled service, as `serve` and the demo run it, on SQLite, PostgreSQL and MariaDB.
//!
//! The settings table: every key of `[archive]`, `[redis]`, `[dedup]`, `[group_commit]`,
//! `[reconcile]`, `[http]` and `[consumer]` has a probe that changes that one setting from its
//! default, starts the service through `Application::build`, and observes from outside (rows
//! in tables, HTTP answers, metrics, Redis keys, timings, log lines) a behaviour the default
//! does not have. A setting that is parsed but not honoured fails its probe, and a new key
//! without a probe fails `every_setting_of_the_service_sections_has_a_probe`.

mod clients;
mod instances;
mod no_example;
mod support;

use std::collections::BTreeSet;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use crate::layers::redis_server::RedisServer;
use idemgate::config::Settings;
use idemgate::handler::Handlers;
use idemgate::outcome::{Layer, Outcome, Verdict};
use idemgate::prefilter::{FallbackCause, Step};
use idemgate::store::Backend;
use idemgate_shop as shop;
use support::*;
use tokio::io::AsyncWriteExt;

const EVERY_SECOND: &str = "* * * * * *";
const DAY: i64 = 86_400_000;
const PATIENCE: Duration = Duration::from_secs(8);

/// The sections whose every key must have a probe.
const SECTIONS: [&str; 7] = ["archive", "redis", "dedup", "group_commit", "reconcile", "http", "consumer"];

macro_rules! settings_table {
    (
        everywhere: [$($key:literal => $probe:ident),* $(,)?],
        servers: [$($skey:literal => $sprobe:ident),* $(,)?] $(,)?
    ) => {
        /// Every key that has a probe.
        const PROBED: &[&str] = &[$($key,)* $($skey,)*];

        mod sqlite {
            $(#[tokio::test] async fn $probe() { super::$probe(idemgate::store::Backend::Sqlite).await })*
        }
        mod postgres {
            $(#[tokio::test] async fn $probe() { super::$probe(idemgate::store::Backend::Postgres).await })*
            $(#[tokio::test] async fn $sprobe() { super::$sprobe(idemgate::store::Backend::Postgres).await })*
        }
        mod mariadb {
            $(#[tokio::test] async fn $probe() { super::$probe(idemgate::store::Backend::MySql).await })*
            $(#[tokio::test] async fn $sprobe() { super::$sprobe(idemgate::store::Backend::MySql).await })*
        }
    };
}

settings_table! {
    everywhere: [
        "archive.enabled" => archive_enabled,
        "archive.schedule" => archive_schedule,
        "archive.dedup_retention_days" => archive_dedup_retention_days,
        "archive.log_retention_days" => archive_log_retention_days,
        "archive.batch_size" => archive_batch_size,
        "archive.pause_ms" => archive_pause_ms,
        "archive.max_run_seconds" => archive_max_run_seconds,
        "archive.lease_seconds" => archive_lease_seconds,
        "archive.replay_horizon_hours" => archive_replay_horizon_hours,
        "archive.late_duplicate_guard" => archive_late_duplicate_guard,
        "archive.partition_log" => archive_partition_log,
        "archive.claim_key_by_biz_id" => archive_claim_key_by_biz_id,
        "redis.url" => redis_url,
        "redis.biz_types" => redis_biz_types,
        "redis.ttl_seconds" => redis_ttl_seconds,
        "redis.timeout_ms" => redis_timeout_ms,
        "redis.cooldown_ms" => redis_cooldown_ms,
        "redis.key_prefix" => redis_key_prefix,
        "dedup.shards" => dedup_shards,
        "group_commit.enabled" => group_commit_enabled,
        "group_commit.max_batch" => group_commit_max_batch,
        "group_commit.linger_ms" => group_commit_linger_ms,
        "group_commit.in_flight" => group_commit_in_flight,
        "group_commit.queue" => group_commit_queue,
        "group_commit.batch" => group_commit_batch,
        "reconcile.enabled" => reconcile_enabled,
        "reconcile.schedule" => reconcile_schedule,
        "reconcile.window_hours" => reconcile_window_hours,
        "reconcile.stuck_after_minutes" => reconcile_stuck_after_minutes,
        "reconcile.max_per_kind" => reconcile_max_per_kind,
        "http.bind" => http_bind,
        "http.auth_token" => http_auth_token,
        "http.basic_user" => http_basic_user,
        "http.basic_password" => http_basic_password,
        "http.grafana_url" => http_grafana_url,
        "http.trace_url_template" => http_trace_url_template,
        "http.rocketmq_dashboard_url" => http_rocketmq_dashboard_url,
        "http.max_concurrent_requests" => http_max_concurrent_requests,
        "http.allowed_hosts" => http_allowed_hosts,
        "http.csrf_token_ttl_seconds" => http_csrf_token_ttl_seconds,
        "http.public_url" => http_public_url,
        "http.header_read_timeout_ms" => http_header_read_timeout_ms,
        "http.request_timeout_ms" => http_request_timeout_ms,
        "http.max_client_connections" => http_max_client_connections,
        "consumer.group" => consumer_group,
        "consumer.instance" => consumer_instance,
        "consumer.max_reconsume_times" => consumer_max_reconsume_times,
        "consumer.transient_retries" => consumer_transient_retries,
        "consumer.duplicate_warnings_per_second" => consumer_duplicate_warnings_per_second,
        "consumer.delivery_timeout_ms" => consumer_delivery_timeout_ms,
    ],
    // SQLite has no server to hold a lock or count sessions on.
    servers: [
        "http.query_timeout_ms" => http_query_timeout_ms,
        "http.max_connections" => http_max_connections,
        "reconcile.lease_seconds" => reconcile_lease_seconds,
    ],
}

#[test]
fn every_setting_of_the_service_sections_has_a_probe() {
    let defaults = toml::Value::try_from(Settings::default()).expect("settings as TOML");
    let mut keys = BTreeSet::new();
    for section in SECTIONS {
        let table = defaults.get(section).and_then(|v| v.as_table()).unwrap_or_else(|| panic!("[{section}]"));
        keys.extend(table.keys().map(|k| format!("{section}.{k}")));
    }
    let probed: BTreeSet<String> = PROBED.iter().map(|k| k.to_string()).collect();
    let missing: Vec<_> = keys.difference(&probed).collect();
    let unknown: Vec<_> = probed.difference(&keys).collect();
    assert!(missing.is_empty(), "settings without a probe: {missing:?}");
    assert!(unknown.is_empty(), "probes of settings that do not exist: {unknown:?}");
}

// ---------------------------------------------------------------------------------------------
// The assembled service as a whole.

#[tokio::test]
async fn the_assembled_service_runs_its_parts_and_is_ready() {
    for backend in [Backend::Sqlite, Backend::Postgres, Backend::MySql] {
        let app = spawn_app(backend, |_| {}).await;
        assert_eq!(
            app.running().parts(),
            ["http server", "archive schedule", "reconcile schedule", "consumer record"]
        );
        assert_eq!(app.get("/readyz").await.status, 200);
        let d = app.gate().process(&deduct("whole-1")).await;
        assert_eq!(d.outcome, Outcome::Processed);
        assert_eq!(
            app.scalar("SELECT COUNT(*) FROM shop_stock_ledger WHERE deduction_id = ?", &["whole-1"]).await,
            1
        );
        app.stop().await;
    }
}

#[tokio::test]
async fn metrics_show_the_process_own_memory_cpu_file_descriptors_and_start_time() {
    let app = spawn_app(Backend::Sqlite, |_| {}).await;
    let metrics = app.get("/metrics").await.body;
    for family in ["process_resident_memory_bytes", "process_cpu_seconds_total", "process_open_fds"] {
        assert!(metrics.contains(&format!("# TYPE {family} ")), "no {family} in:\n{metrics}");
    }
    let resident = app.metric("process_resident_memory_bytes ").await;
    assert!(resident > 1_000_000.0, "resident memory of {resident} bytes");
    assert!(app.metric("process_open_fds ").await >= 1.0, "the process has open files");
    // The start time is this test process's: a little while ago, never in the future.
    let started = app.metric("process_start_time_seconds ").await;
    let now =
        std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).expect("after 1970").as_secs_f64();
    assert!(started <= now + 1.0 && started > now - 86_400.0, "started at {started}, now is {now}");
    app.stop().await;
}

// ---------------------------------------------------------------------------------------------
// [archive]

async fn archive_enabled(b: Backend) {
    let app = spawn_app(b, |s| {
        s.archive.enabled = false;
        s.archive.schedule = EVERY_SECOND.to_owned();
    })
    .await;
    assert!(!app.running().parts().contains(&"archive schedule"), "{:?}", app.running().parts());
    tokio::time::sleep(Duration::from_millis(2_500)).await;
    assert_eq!(app.scalar("SELECT COUNT(*) FROM archive_run", &[]).await, 0, "no run while archiving is off");
    app.stop().await;
}

async fn archive_schedule(b: Backend) {
    let app = spawn_app(b, |s| s.archive.schedule = EVERY_SECOND.to_owned()).await;
    let ran =
        app.eventually(PATIENCE, async |a| a.scalar("SELECT COUNT(*) FROM archive_run", &[]).await > 0).await;
    assert!(ran, "the every-second schedule ran the archive");
    app.stop().await;
}

async fn archive_dedup_retention_days(b: Backend) {
    let app = spawn_app(b, |s| {
        s.archive.schedule = EVERY_SECOND.to_owned();
        s.archive.dedup_retention_days = 1;
    })
    .await;
    app.seed_claims("ret", 1, 2 * DAY).await;
    let moved = app
        .eventually(PATIENCE, async |a| {
            a.scalar("SELECT COUNT(*) FROM idempotent_record_archive WHERE biz_id = ?", &["ret-0"]).await == 1
        })
        .await;
    assert!(moved, "a claim of two days moved with a retention of one day (the default keeps 90)");
    app.stop().await;
}

async fn archive_log_retention_days(b: Backend) {
    let app = spawn_app(b, |s| {
        s.archive.schedule = EVERY_SECOND.to_owned();
        s.archive.log_retention_days = 1;
    })
    .await;
    app.seed_log_row("old-log", "processed", 2 * DAY).await;
    let deleted = app
        .eventually(PATIENCE, async |a| {
            a.scalar("SELECT COUNT(*) FROM delivery_log WHERE biz_id = ?", &["old-log"]).await == 0
        })
        .await;
    assert!(deleted, "a log row of two days was deleted with a retention of one day (the default keeps 14)");
    app.stop().await;
}

/// Waits for an archive run that moved all `count` claims, and returns (batches, duration ms).
async fn archive_run_that_moved(app: &TestApp, count: i64) -> (i64, i64) {
    let moved = app
        .eventually(Duration::from_secs(15), async |a| {
            a.scalar(
                &format!("SELECT COUNT(*) FROM archive_run WHERE kind = 'dedup' AND rows_moved = {count} AND finished_at_ms IS NOT NULL"),
                &[],
            )
            .await
                > 0
        })
        .await;
    assert!(moved, "a run moved the {count} claims");
    let sql = format!("WHERE kind = 'dedup' AND rows_moved = {count}");
    let batches = app.scalar(&format!("SELECT MAX(batches) FROM archive_run {sql}"), &[]).await;
    let took =
        app.scalar(&format!("SELECT MAX(finished_at_ms - started_at_ms) FROM archive_run {sql}"), &[]).await;
    (batches, took)
}

async fn archive_batch_size(b: Backend) {
    let app = spawn_app(b, |s| {
        s.archive.schedule = EVERY_SECOND.to_owned();
        s.archive.dedup_retention_days = 1;
        s.archive.batch_size = 1;
    })
    .await;
    app.seed_claims("batch", 3, 2 * DAY).await;
    let (batches, _) = archive_run_that_moved(&app, 3).await;
    assert!(batches >= 3, "three claims in batches of one took {batches} batches (the default takes one)");
    app.stop().await;
}

async fn archive_pause_ms(b: Backend) {
    let app = spawn_app(b, |s| {
        s.archive.schedule = EVERY_SECOND.to_owned();
        s.archive.dedup_retention_days = 1;
        s.archive.batch_size = 1;
        s.archive.pause_ms = 700;
    })
    .await;
    app.seed_claims("pause", 3, 2 * DAY).await;
    let (_, took) = archive_run_that_moved(&app, 3).await;
    assert!(took >= 1_400, "three batches with 700 ms pauses took {took} ms (the default pauses 50 ms)");
    app.stop().await;
}

async fn archive_max_run_seconds(b: Backend) {
    let app = spawn_app(b, |s| {
        s.archive.schedule = EVERY_SECOND.to_owned();
        s.archive.dedup_retention_days = 1;
        s.archive.batch_size = 1;
        s.archive.pause_ms = 700;
        s.archive.max_run_seconds = 1;
    })
    .await;
    app.seed_claims("budget", 6, 2 * DAY).await;
    let cut = app
        .eventually(Duration::from_secs(15), async |a| {
            a.scalar(
                "SELECT COUNT(*) FROM archive_run WHERE kind = 'dedup' AND finished_at_ms IS NOT NULL \
                 AND rows_moved > 0 AND rows_moved < 6",
                &[],
            )
            .await
                > 0
        })
        .await;
    assert!(cut, "a run with a one-second budget stopped before moving all six claims");
    app.stop().await;
}

async fn archive_lease_seconds(b: Backend) {
    let app = spawn_app(b, |s| {
        s.archive.schedule = EVERY_SECOND.to_owned();
        s.archive.dedup_retention_days = 1;
        s.archive.batch_size = 1;
        s.archive.pause_ms = 1_500;
        s.archive.lease_seconds = 3_600;
    })
    .await;
    app.seed_claims("lease", 4, 2 * DAY).await;
    // While a run holds it, the lease reaches an hour past its taking; the default, 5 minutes.
    let held = app
        .eventually(PATIENCE, async |a| {
            a.scalar("SELECT COUNT(*) FROM archive_lease WHERE expires_at_ms - acquired_at_ms > 3000000", &[])
                .await
                > 0
        })
        .await;
    assert!(held, "a lease of an hour was taken");
    app.stop().await;
}

async fn archive_replay_horizon_hours(b: Backend) {
    let (log, _guard) = LogCapture::start();
    // Four days of retention cover the default horizon (72 h of replay plus the broker's
    // retries); a horizon of 100 h does not, and the start says so.
    let app = spawn_app(b, |s| {
        s.archive.dedup_retention_days = 4;
        s.archive.replay_horizon_hours = 100;
    })
    .await;
    let text = log.text();
    assert!(
        text.contains("plus archive.replay_horizon_hours 4 d 4 h"),
        "the retention warning names the horizon:\n{text}"
    );
    app.stop().await;
}

/// Partitions of the delivery log: how many the catalog lists (none on a plain log).
async fn log_partitions(app: &TestApp, b: Backend) -> i64 {
    match b {
        Backend::Postgres => {
            app.scalar("SELECT COUNT(*) FROM pg_inherits WHERE inhparent = to_regclass('delivery_log')", &[])
                .await
        }
        Backend::MySql => {
            app.scalar(
                "SELECT COUNT(*) FROM information_schema.PARTITIONS WHERE TABLE_SCHEMA = DATABASE() \
                 AND TABLE_NAME = 'delivery_log' AND PARTITION_NAME IS NOT NULL",
                &[],
            )
            .await
        }
        Backend::Sqlite => 0,
    }
}

async fn archive_partition_log(b: Backend) {
    // On: the new database's log is partitioned by day when the service starts (SQLite keeps
    // the plain table): the `before` partition (through tomorrow), the two days after it and
    // the overflow.
    let app = spawn_app(b, |_| {}).await;
    let expected = if b == Backend::Sqlite { 0 } else { 4 };
    assert_eq!(log_partitions(&app, b).await, expected, "the log is partitioned on {b}");
    app.stop().await;
    // Off: it stays plain.
    let app = spawn_app(b, |s| s.archive.partition_log = false).await;
    assert_eq!(log_partitions(&app, b).await, 0, "the log stays plain on {b}");
    app.stop().await;
}

async fn archive_claim_key_by_biz_id(b: Backend) {
    // On: the new database's claim key is led by biz_id when the service starts, and the index
    // on biz_id alone is gone (SQLite keeps its key, reported as final).
    let app = spawn_app(b, |_| {}).await;
    let shape = idemgate::layout::key::shape(&app.db.store, "idempotent_record").await.unwrap();
    assert!(shape.is_led(), "{b}: {shape:?}");
    app.stop().await;
    // Off: the first key stays, beside its index on biz_id.
    let app = spawn_app(b, |s| s.archive.claim_key_by_biz_id = false).await;
    let shape = idemgate::layout::key::shape(&app.db.store, "idempotent_record").await.unwrap();
    assert_eq!(shape.is_led(), b == Backend::Sqlite, "{b}: {shape:?}");
    app.stop().await;
}

async fn archive_late_duplicate_guard(b: Backend) {
    let app = spawn_app(b, |s| {
        s.archive.late_duplicate_guard = true;
        s.archive.schedule = EVERY_SECOND.to_owned();
        s.archive.dedup_retention_days = 1;
    })
    .await;
    let gate = app.gate();
    assert_eq!(gate.process(&deduct("late-1")).await.outcome, Outcome::Processed);
    // Two days pass for the claim; the scheduled archive moves it.
    app.execute(
        "UPDATE idempotent_record SET claimed_at_ms = ? WHERE biz_id = ?",
        &[Arg::Int(now_ms() - 2 * DAY), Arg::Text("late-1")],
    )
    .await;
    let archived = app
        .eventually(PATIENCE, async |a| {
            a.scalar("SELECT COUNT(*) FROM idempotent_record_archive WHERE biz_id = ?", &["late-1"]).await
                == 1
        })
        .await;
    assert!(archived, "the claim was archived by the service's own schedule");
    let late = gate.process(&deduct("late-1")).await;
    assert_eq!((late.outcome, late.layer), (Outcome::Duplicate, Some(Layer::LateDuplicate)), "{late:?}");
    assert_eq!(late.verdict, Verdict::Ack);
    assert_eq!(
        app.scalar("SELECT COUNT(*) FROM shop_stock_ledger WHERE deduction_id = ?", &["late-1"]).await,
        1
    );
    assert_eq!(
        app.scalar(
            "SELECT COUNT(*) FROM delivery_log WHERE biz_id = ? AND outcome = 'duplicate' AND layer = 'late_duplicate'",
            &["late-1"]
        )
        .await,
        1
    );
    app.stop().await;
}

// ---------------------------------------------------------------------------------------------
// [redis]

fn unique(prefix: &str) -> String {
    format!("{prefix}-{}-{}", std::process::id(), rand::random::<u32>())
}

async fn redis_keys(url: &str, pattern: &str) -> Vec<String> {
    let client = redis::Client::open(url).expect("redis url");
    let mut conn = client.get_multiplexed_async_connection().await.expect("Redis must run for these tests");
    redis::cmd("KEYS").arg(pattern).query_async(&mut conn).await.expect("KEYS")
}

const REDIS: &str = "redis://127.0.0.1:6379";

async fn redis_url(b: Backend) {
    let prefix = unique("url");
    let app = spawn_app(b, |s| {
        s.redis.url = REDIS.to_owned();
        // Room for a loaded machine: these probes are not about the timeout.
        s.redis.timeout_ms = 1_000;
        s.redis.key_prefix = prefix.clone();
    })
    .await;
    let gate = app.gate();
    assert_eq!(gate.process(&deduct("r-1")).await.outcome, Outcome::Processed);
    let copy = gate.process(&deduct("r-1")).await;
    assert_eq!((copy.outcome, copy.layer), (Outcome::Duplicate, Some(Layer::Redis)), "{copy:?}");
    app.stop().await;
}

async fn redis_biz_types(b: Backend) {
    let prefix = unique("types");
    let app = spawn_app(b, |s| {
        s.redis.url = REDIS.to_owned();
        // Room for a loaded machine: these probes are not about the timeout.
        s.redis.timeout_ms = 1_000;
        s.redis.key_prefix = prefix.clone();
        s.redis.biz_types = vec![shop::PAYMENT_CONFIRM.to_owned()];
    })
    .await;
    let gate = app.gate();
    let first = gate.process(&deduct("t-1")).await;
    assert!(first.prefilter.is_none(), "stock.deduct is not covered: {first:?}");
    let copy = gate.process(&deduct("t-1")).await;
    assert_eq!((copy.outcome, copy.layer), (Outcome::Duplicate, Some(Layer::Db)));
    assert!(redis_keys(REDIS, &format!("{prefix}*")).await.is_empty());
    app.stop().await;
}

async fn redis_ttl_seconds(b: Backend) {
    let prefix = unique("ttl");
    let app = spawn_app(b, |s| {
        s.redis.url = REDIS.to_owned();
        // Room for a loaded machine: these probes are not about the timeout.
        s.redis.timeout_ms = 1_000;
        s.redis.key_prefix = prefix.clone();
        s.redis.ttl_seconds = 37;
    })
    .await;
    app.gate().process(&deduct("ttl-1")).await;
    let keys = redis_keys(REDIS, &format!("{prefix}*")).await;
    assert_eq!(keys.len(), 1, "{keys:?}");
    let client = redis::Client::open(REDIS).expect("url");
    let mut conn = client.get_multiplexed_async_connection().await.expect("redis");
    let ttl: i64 = redis::cmd("TTL").arg(&keys[0]).query_async(&mut conn).await.expect("TTL");
    assert!((1..=37).contains(&ttl), "TTL {ttl} (the default is 600)");
    app.stop().await;
}

async fn redis_key_prefix(b: Backend) {
    let prefix = unique("prefix");
    let app = spawn_app(b, |s| {
        s.redis.url = REDIS.to_owned();
        // Room for a loaded machine: these probes are not about the timeout.
        s.redis.timeout_ms = 1_000;
        s.redis.key_prefix = prefix.clone();
    })
    .await;
    app.gate().process(&deduct("p-1")).await;
    assert_eq!(redis_keys(REDIS, &format!("{prefix}*")).await.len(), 1);
    app.stop().await;
}

async fn redis_timeout_ms(b: Backend) {
    let server = RedisServer::start(&["--enable-debug-command", "yes"]).await;
    let app = spawn_app(b, |s| {
        s.redis.url = server.url();
        s.redis.timeout_ms = 600;
    })
    .await;
    let gate = app.gate();
    assert_eq!(gate.process(&deduct("to-1")).await.prefilter.map(|p| p.step), Some(Step::Claimed));
    // Redis busy for two seconds: the delivery waits out its 600 ms, then the database decides.
    let sleeper = debug_sleep(server.url(), 2);
    tokio::time::sleep(Duration::from_millis(100)).await;
    let started = Instant::now();
    let d = gate.process(&deduct("to-2")).await;
    let waited = started.elapsed();
    assert_eq!(d.outcome, Outcome::Processed);
    assert_eq!(d.prefilter.and_then(|p| p.fallback), Some(FallbackCause::Timeout));
    assert!(waited >= Duration::from_millis(500), "waited {waited:?} (the default waits 5 ms)");
    sleeper.await.expect("DEBUG SLEEP");
    app.stop().await;
}

async fn redis_cooldown_ms(b: Backend) {
    let mut server = RedisServer::reserved(&[]);
    let app = spawn_app(b, |s| {
        s.redis.url = server.url();
        s.redis.cooldown_ms = 600_000;
    })
    .await;
    // Redis was down at the start: the circuit is open. It comes up; with the default
    // cooldown of a second the probe would have closed the circuit within this wait.
    server.restart().await;
    tokio::time::sleep(Duration::from_secs(3)).await;
    let d = app.gate().process(&deduct("cool-1")).await;
    assert_eq!(d.outcome, Outcome::Processed);
    assert_eq!(d.prefilter.and_then(|p| p.fallback), Some(FallbackCause::CircuitOpen), "{d:?}");
    app.stop().await;
}

/// `DEBUG SLEEP seconds` on a connection of its own (no response timeout), in the background.
fn debug_sleep(url: String, seconds: u32) -> tokio::task::JoinHandle<()> {
    tokio::spawn(async move {
        let client = redis::Client::open(url).unwrap();
        let config = redis::AsyncConnectionConfig::new().set_response_timeout(None);
        let mut c = client.get_multiplexed_async_connection_with_config(&config).await.expect("connect");
        let _: () =
            redis::cmd("DEBUG").arg("SLEEP").arg(seconds).query_async(&mut c).await.expect("DEBUG SLEEP");
    })
}

// ---------------------------------------------------------------------------------------------
// [dedup]

async fn dedup_shards(b: Backend) {
    let app = spawn_app(b, |s| s.dedup.shards = 4).await;
    assert_eq!(app.gate().process(&deduct("shard-1")).await.outcome, Outcome::Processed);
    assert_eq!(app.scalar("SELECT COUNT(*) FROM idempotent_record WHERE biz_id = ?", &["shard-1"]).await, 0);
    assert_eq!(
        app.scalar("SELECT COUNT(*) FROM idempotent_record_all WHERE biz_id = ?", &["shard-1"]).await,
        1
    );
    assert_eq!(app.scalar("SELECT shards FROM dedup_layout", &[]).await, 4);
    app.stop().await;
}

// ---------------------------------------------------------------------------------------------
// [group_commit]

async fn group_commit_enabled(b: Backend) {
    let app = spawn_app(b, |s| s.group_commit.enabled = true).await;
    assert_eq!(app.gate().process(&deduct("gc-1")).await.outcome, Outcome::Processed);
    assert_eq!(app.metric("idemgate_group_size_count").await, 1.0);
    app.stop().await;
}

/// Processes `deliveries` at once through the service's gate; how long it took.
async fn all_at_once(app: &TestApp, deliveries: Vec<idemgate::delivery::Delivery>) -> Duration {
    let gate = app.gate();
    let started = Instant::now();
    let answers = futures_util::future::join_all(deliveries.iter().map(|d| gate.process(d))).await;
    assert!(answers.iter().all(|d| d.outcome == Outcome::Processed), "{answers:?}");
    started.elapsed()
}

async fn group_commit_max_batch(b: Backend) {
    let app = spawn_app(b, |s| {
        s.group_commit.enabled = true;
        s.group_commit.max_batch = 2;
        s.group_commit.linger_ms = 300;
    })
    .await;
    all_at_once(&app, (0..8).map(|i| deduct(&format!("mb-{i}"))).collect()).await;
    let groups = app.metric("idemgate_group_size_count").await;
    assert!(groups >= 4.0, "eight deliveries in groups of two make {groups} groups (the default makes one)");
    app.stop().await;
}

async fn group_commit_linger_ms(b: Backend) {
    let app = spawn_app(b, |s| {
        s.group_commit.enabled = true;
        s.group_commit.linger_ms = 800;
    })
    .await;
    let took = all_at_once(&app, vec![deduct("linger-1")]).await;
    assert!(
        took >= Duration::from_millis(700),
        "a lone delivery lingered {took:?} (the default lingers 2 ms)"
    );
    app.stop().await;
}

async fn group_commit_in_flight(b: Backend) {
    let app = spawn_app_with(
        b,
        |s| {
            s.group_commit.enabled = true;
            s.group_commit.max_batch = 1;
            s.group_commit.linger_ms = 0;
            s.group_commit.in_flight = 1;
        },
        Handlers::new().with("slow", Sleepy(Duration::from_millis(300))),
    )
    .await;
    let took = all_at_once(&app, (0..4).map(|i| for_handler("slow", &format!("if-{i}"))).collect()).await;
    assert!(
        took >= Duration::from_millis(1_100),
        "four 300 ms groups one at a time took {took:?} (the default runs two at once)"
    );
    app.stop().await;
}

async fn group_commit_batch(b: Backend) {
    let calls = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let app = spawn_app_with(
        b,
        |s| {
            s.group_commit.enabled = true;
            s.group_commit.batch = false;
        },
        Handlers::new().with("counted", BatchCounting(calls.clone())),
    )
    .await;
    all_at_once(&app, (0..4).map(|i| for_handler("counted", &format!("bt-{i}"))).collect()).await;
    let calls = calls.load(std::sync::atomic::Ordering::SeqCst);
    assert_eq!(calls, 0, "the batch form ran {calls} times (by default every group runs it)");
    app.stop().await;
}

async fn group_commit_queue(b: Backend) {
    let open = Arc::new(tokio::sync::Semaphore::new(0));
    let app = spawn_app_with(
        b,
        |s| {
            s.group_commit.enabled = true;
            s.group_commit.max_batch = 1;
            s.group_commit.linger_ms = 0;
            s.group_commit.in_flight = 1;
            s.group_commit.queue = 1;
        },
        Handlers::new().with("gated", Gated(open.clone())),
    )
    .await;
    let gate = app.gate();
    let deliveries: Vec<_> = (0..20).map(|i| for_handler("gated", &format!("q-{i}"))).collect();
    let opener = async {
        tokio::time::sleep(Duration::from_millis(600)).await;
        open.add_permits(1_000);
    };
    let (answers, ()) =
        tokio::join!(futures_util::future::join_all(deliveries.iter().map(|d| gate.process(d))), opener);
    assert!(answers.iter().all(|d| d.outcome == Outcome::Processed));
    // With room for one, the others find the queue full and wait before it, not in it; with
    // the default room for 256, all would get in and nineteen would each wait 600 ms in it.
    let full = app.metric("idemgate_group_queue_full_total").await;
    assert!(full >= 10.0, "{full} deliveries found a queue of one full");
    let waited = app.metric("idemgate_group_queue_wait_seconds_sum").await;
    assert!(waited < 3.0, "{waited} s waited in a queue of one");
    app.stop().await;
}

// ---------------------------------------------------------------------------------------------
// [reconcile]

async fn reconcile_enabled(b: Backend) {
    let app = spawn_app(b, |s| {
        s.reconcile.enabled = false;
        s.reconcile.schedule = EVERY_SECOND.to_owned();
    })
    .await;
    assert!(!app.running().parts().contains(&"reconcile schedule"));
    tokio::time::sleep(Duration::from_millis(2_500)).await;
    assert_eq!(app.scalar("SELECT COUNT(*) FROM reconcile_run", &[]).await, 0);
    app.stop().await;
}

async fn reconcile_schedule(b: Backend) {
    let app = spawn_app(b, |s| s.reconcile.schedule = EVERY_SECOND.to_owned()).await;
    let ran = app
        .eventually(PATIENCE, async |a| a.scalar("SELECT COUNT(*) FROM reconcile_run", &[]).await > 0)
        .await;
    assert!(ran, "the every-second schedule ran the reconciler");
    app.stop().await;
}

async fn reconcile_window_hours(b: Backend) {
    let app = spawn_app(b, |s| {
        s.reconcile.schedule = EVERY_SECOND.to_owned();
        s.reconcile.window_hours = 2;
    })
    .await;
    let ran = app
        .eventually(PATIENCE, async |a| {
            // The window ends just after its run's "now".
            a.scalar(
                "SELECT COUNT(*) FROM reconcile_run WHERE until_ms - since_ms BETWEEN 7200000 AND 7200001",
                &[],
            )
            .await
                > 0
        })
        .await;
    assert!(ran, "a run over two hours (the default reads 24)");
    app.stop().await;
}

async fn reconcile_stuck_after_minutes(b: Backend) {
    let app = spawn_app(b, |s| {
        s.reconcile.schedule = EVERY_SECOND.to_owned();
        s.reconcile.stuck_after_minutes = 5;
    })
    .await;
    app.seed_log_row("stuck-1", "failed", 10 * 60_000).await;
    let found = app
        .eventually(PATIENCE, async |a| {
            a.scalar(
                "SELECT COUNT(*) FROM reconcile_anomaly WHERE kind = 'stuck' AND biz_id = ?",
                &["stuck-1"],
            )
            .await
                > 0
        })
        .await;
    assert!(found, "retried for 10 minutes is stuck after 5 (the default waits 30)");
    app.stop().await;
}

async fn reconcile_max_per_kind(b: Backend) {
    let app = spawn_app(b, |s| {
        s.reconcile.schedule = EVERY_SECOND.to_owned();
        s.reconcile.max_per_kind = 1;
    })
    .await;
    for i in 0..3 {
        app.seed_log_row(&format!("lost-{i}"), "dead_lettered", 60_000).await;
    }
    let found = app
        .eventually(PATIENCE, async |a| {
            a.scalar("SELECT COUNT(*) FROM reconcile_anomaly WHERE kind = 'lost'", &[]).await > 0
        })
        .await;
    assert!(found, "a run found lost keys");
    let most = app
        .scalar("SELECT MAX(n) FROM (SELECT COUNT(*) AS n FROM reconcile_anomaly WHERE kind = 'lost' GROUP BY run_id) per_run", &[])
        .await;
    assert_eq!(most, 1, "three lost keys, at most one reported per run (the default reports all three)");
    app.stop().await;
}

async fn reconcile_lease_seconds(b: Backend) {
    let app = spawn_app(b, |s| {
        s.reconcile.schedule = EVERY_SECOND.to_owned();
        s.reconcile.lease_seconds = 3_600;
    })
    .await;
    // A run held up on the log holds the group's lease meanwhile: for an hour past its taking
    // here; the default, 10 minutes.
    let lock = LogLock::take(&app).await;
    let held = app
        .eventually(PATIENCE, async |a| {
            a.scalar(
                "SELECT COUNT(*) FROM archive_lease WHERE name LIKE 'reconcile:%' \
                 AND expires_at_ms - acquired_at_ms > 3000000",
                &[],
            )
            .await
                > 0
        })
        .await;
    lock.release().await;
    assert!(held, "a reconcile lease of an hour was taken");
    app.stop().await;
}

// ---------------------------------------------------------------------------------------------
// [http]

async fn http_bind(b: Backend) {
    let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
    let app = spawn_app(b, |s| s.http.bind = format!("127.0.0.1:{port}")).await;
    assert_eq!(app.addr, format!("127.0.0.1:{port}"));
    assert_eq!(request(&format!("127.0.0.1:{port}"), "GET", "/healthz", &[], b"").await.status, 200);
    app.stop().await;
}

async fn http_auth_token(b: Backend) {
    let token = "a-long-enough-test-token-0123456789";
    let app = spawn_app(b, |s| s.http.auth_token = token.to_owned()).await;
    assert_eq!(app.get("/api/overview").await.status, 401);
    let bearer = format!("Bearer {token}");
    let reply = request(&app.addr, "GET", "/api/overview", &[("Authorization", &bearer)], b"").await;
    assert_eq!(reply.status, 200, "{}", reply.body);
    app.stop().await;
}

fn basic(user: &str, password: &str) -> String {
    use base64::Engine;
    format!("Basic {}", base64::engine::general_purpose::STANDARD.encode(format!("{user}:{password}")))
}

async fn http_basic_user(b: Backend) {
    let app = spawn_app(b, |s| {
        s.http.basic_user = "oncall".to_owned();
        s.http.basic_password = "correct horse".to_owned();
    })
    .await;
    assert_eq!(app.get("/").await.status, 401);
    let right = basic("oncall", "correct horse");
    assert_eq!(request(&app.addr, "GET", "/", &[("Authorization", &right)], b"").await.status, 200);
    let wrong_user = basic("someone", "correct horse");
    assert_eq!(request(&app.addr, "GET", "/", &[("Authorization", &wrong_user)], b"").await.status, 401);
    app.stop().await;
}

async fn http_basic_password(b: Backend) {
    let app = spawn_app(b, |s| {
        s.http.basic_user = "oncall".to_owned();
        s.http.basic_password = "correct horse".to_owned();
    })
    .await;
    let wrong = basic("oncall", "battery staple");
    assert_eq!(request(&app.addr, "GET", "/", &[("Authorization", &wrong)], b"").await.status, 401);
    app.stop().await;
}

async fn http_grafana_url(b: Backend) {
    let app =
        spawn_app(b, |s| s.http.grafana_url = "http://grafana.example:3000/d/idemgate".to_owned()).await;
    app.gate().process(&deduct("graf-1")).await;
    let page = app.get("/trace?q=graf-1").await;
    assert_eq!(page.status, 200);
    assert!(page.body.contains("http://grafana.example:3000/d/idemgate"), "{}", page.body);
    app.stop().await;
}

async fn http_trace_url_template(b: Backend) {
    let template = "https://tempo.example/explore?traceId={trace_id}";
    let app = spawn_app(b, |s| s.http.trace_url_template = template.to_owned()).await;
    let trace_id = "4bf92f3577b34da6a3ce929d0e0e4736";
    let mut d = deduct("tempo-1");
    let traceparent = format!("00-{trace_id}-00f067aa0ba902b7-01");
    d.properties.insert(idemgate::delivery::TRACEPARENT_PROPERTY.to_owned(), traceparent);
    app.gate().process(&d).await;
    let page = app.get("/trace?q=tempo-1").await;
    assert_eq!(page.status, 200);
    let link = format!("href=\"https://tempo.example/explore?traceId={trace_id}\"");
    assert!(page.body.contains(&link), "{}", page.body);
    app.stop().await;
}

async fn http_rocketmq_dashboard_url(b: Backend) {
    let app =
        spawn_app(b, |s| s.http.rocketmq_dashboard_url = "https://rmq-dashboard.example/".to_owned()).await;
    let d = deduct("rmqdash-1");
    app.gate().process(&d).await;
    let page = app.get("/trace?q=rmqdash-1").await;
    assert_eq!(page.status, 200);
    // The default has no such link; the base address leads to the dashboard's Message Trace page
    // of the message's id as the dashboard knows it (the UNIQ_KEY the producer gave).
    let link = format!("href=\"https://rmq-dashboard.example/#/messageTrace?messageId={}\"", d.uniq_key);
    assert!(page.body.contains(&link), "no {link} in:\n{}", page.body);
    app.stop().await;
}

async fn http_max_concurrent_requests(b: Backend) {
    let app = spawn_app(b, |s| s.http.max_concurrent_requests = 1).await;
    // A form whose body is still arriving holds the one place.
    let mut slow = tokio::net::TcpStream::connect(&app.addr).await.expect("connect");
    let form = [("Content-Type", "application/x-www-form-urlencoded")];
    slow.write_all(&head(&app.addr, "POST", "/replay", &form, 100)).await.expect("send");
    slow.write_all(b"biz_id=x").await.expect("send");
    tokio::time::sleep(Duration::from_millis(300)).await;
    let turned_away = app.get("/api/overview").await;
    assert_eq!(turned_away.status, 503, "{}", turned_away.body);
    assert!(turned_away.headers.contains("retry-after: 1"), "{}", turned_away.headers);
    assert_eq!(app.get("/healthz").await.status, 200, "health is not counted");
    assert_eq!(app.metric("idemgate_http_requests_shed_total").await, 1.0);
    drop(slow);
    let served =
        app.eventually(Duration::from_secs(5), async |a| a.get("/api/overview").await.status == 200).await;
    assert!(served, "the place is free again once the slow request is gone");
    app.stop().await;
}

async fn http_allowed_hosts(b: Backend) {
    let app = spawn_app(b, |s| s.http.allowed_hosts = vec!["idemgate.test".to_owned()]).await;
    let port = app.addr.rsplit(':').next().expect("a port").to_owned();
    let listed = format!("idemgate.test:{port}");
    let reply = request(&app.addr, "GET", "/api/overview", &[("Host", &listed)], b"").await;
    assert_eq!(reply.status, 200, "a listed name is served (the default refuses it): {}", reply.body);
    let other = format!("other.test:{port}");
    assert_eq!(request(&app.addr, "GET", "/api/overview", &[("Host", &other)], b"").await.status, 421);
    app.stop().await;
}

async fn http_csrf_token_ttl_seconds(b: Backend) {
    let app = spawn_app(b, |s| s.http.csrf_token_ttl_seconds = 60).await;
    // A form shown two minutes ago: within the default hour, past a minute.
    let shown = std::time::SystemTime::now() - Duration::from_secs(120);
    let token = app.web.replay_token(GROUP, shop::PAYMENT_CONFIRM, "P-1", 0, shown);
    let form =
        format!("group={GROUP}&biz_type={}&biz_id=P-1&execute_time=0&csrf={token}", shop::PAYMENT_CONFIRM);
    let headers = [("Content-Type", "application/x-www-form-urlencoded")];
    let reply = request(&app.addr, "POST", "/replay", &headers, form.as_bytes()).await;
    assert_eq!(reply.status, 403, "{}", reply.body);
    assert!(
        reply.body.contains("expired"),
        "a two-minute-old form is expired after one minute: {}",
        reply.body
    );
    app.stop().await;
}

/// Holds a table lock that blocks every reader of `delivery_log` until released.
struct LogLock(sqlx::pool::PoolConnection<sqlx::Any>, Backend);

impl LogLock {
    async fn take(app: &TestApp) -> Self {
        let mut conn = app.db.store.pool().acquire().await.expect("a connection");
        use sqlx::Executor;
        match app.db.store.backend() {
            Backend::Postgres => {
                conn.execute("BEGIN").await.expect("begin");
                conn.execute("LOCK TABLE delivery_log IN ACCESS EXCLUSIVE MODE").await.expect("lock");
            }
            Backend::MySql => {
                conn.execute("LOCK TABLES delivery_log WRITE").await.expect("lock");
            }
            Backend::Sqlite => unreachable!("the server probes run on PostgreSQL and MariaDB"),
        }
        Self(conn, app.db.store.backend())
    }

    async fn release(mut self) {
        use sqlx::Executor;
        let unlock = if self.1 == Backend::MySql { "UNLOCK TABLES" } else { "ROLLBACK" };
        self.0.execute(unlock).await.expect("unlock");
    }
}

/// Sessions of the test database waiting on a lock.
async fn waiting_on_locks(app: &TestApp) -> i64 {
    match app.db.store.backend() {
        Backend::Postgres => {
            app.scalar(
                "SELECT COUNT(*) FROM pg_stat_activity WHERE datname = current_database() AND wait_event_type = 'Lock'",
                &[],
            )
            .await
        }
        _ => {
            app.scalar(
                "SELECT COUNT(*) FROM information_schema.PROCESSLIST WHERE DB = DATABASE() AND STATE LIKE 'Waiting for table%'",
                &[],
            )
            .await
        }
    }
}

async fn http_query_timeout_ms(b: Backend) {
    let app = spawn_app(b, |s| s.http.query_timeout_ms = 300).await;
    let lock = LogLock::take(&app).await;
    let started = Instant::now();
    let reply = app.get("/api/overview").await;
    let took = started.elapsed();
    assert_eq!(reply.status, 503, "{}", reply.body);
    assert!(took < Duration::from_secs(3), "answered in {took:?} (the default waits 5 s)");
    // The server stopped the query too: nothing of the UI's is left waiting on the lock.
    let gone = app.eventually(Duration::from_secs(3), async |a| waiting_on_locks(a).await == 0).await;
    assert!(gone, "the abandoned query still runs on the server");
    lock.release().await;
    app.stop().await;
}

async fn http_max_connections(b: Backend) {
    let app = spawn_app(b, |s| {
        s.http.max_connections = 2;
        s.http.query_timeout_ms = 4_000;
    })
    .await;
    let lock = LogLock::take(&app).await;
    let addr = app.addr.clone();
    let requests: Vec<_> = (0..6)
        .map(|_| {
            let addr = addr.clone();
            tokio::spawn(async move { request(&addr, "GET", "/api/overview", &[], b"").await })
        })
        .collect();
    tokio::time::sleep(Duration::from_millis(1_500)).await;
    let waiting = waiting_on_locks(&app).await;
    lock.release().await;
    for r in requests {
        r.await.expect("request");
    }
    assert_eq!(waiting, 2, "six pages at once reach the database through two connections (the default four)");
    app.stop().await;
}

// The probes of http.public_url, the timeouts and the connection limit live with the tests of
// slow clients and of the links (`clients.rs`).
use clients::{
    http_header_read_timeout_ms, http_max_client_connections, http_public_url, http_request_timeout_ms,
};

// ---------------------------------------------------------------------------------------------
// [consumer]

async fn consumer_group(b: Backend) {
    let app = spawn_app(b, |s| s.consumer.group = "row-group".to_owned()).await;
    app.gate().process(&deduct("grp-1")).await;
    assert_eq!(
        app.scalar(
            "SELECT COUNT(*) FROM idempotent_record WHERE consumer_group = ? AND biz_id = ?",
            &["row-group", "grp-1"]
        )
        .await,
        1
    );
    app.stop().await;
}

async fn consumer_instance(b: Backend) {
    let app = spawn_app(b, |s| s.consumer.instance = "row-instance".to_owned()).await;
    app.gate().process(&deduct("inst-1")).await;
    assert_eq!(
        app.scalar(
            "SELECT COUNT(*) FROM delivery_log WHERE instance_id = ? AND biz_id = ?",
            &["row-instance", "inst-1"]
        )
        .await,
        1
    );
    app.stop().await;
}

async fn consumer_max_reconsume_times(b: Backend) {
    let app =
        spawn_app_with(b, |s| s.consumer.max_reconsume_times = 0, Handlers::new().with("flaky", AlwaysRetry))
            .await;
    let d = app.gate().process(&for_handler("flaky", "mr-1")).await;
    assert_eq!(
        d.outcome,
        Outcome::DeadLettered,
        "the first failure is the last attempt (the default allows 16)"
    );
    app.stop().await;
}

async fn consumer_transient_retries(b: Backend) {
    let calls = Arc::new(Mutex::new(0));
    let handler = TransientlyFailing { fail: 1, calls: calls.clone() };
    let app =
        spawn_app_with(b, |s| s.consumer.transient_retries = 0, Handlers::new().with("transient", handler))
            .await;
    let d = app.gate().process(&for_handler("transient", "tr-1")).await;
    assert_eq!(
        (d.outcome, d.verdict),
        (Outcome::Failed, Verdict::Retry),
        "no retry inside the gate (the default retries 3 times)"
    );
    assert_eq!(*calls.lock().unwrap(), 1);
    app.stop().await;
}

async fn consumer_duplicate_warnings_per_second(b: Backend) {
    let (log, _guard) = LogCapture::start();
    let app = spawn_app(b, |s| s.consumer.duplicate_warnings_per_second = 1).await;
    let gate = app.gate();
    gate.process(&deduct("warn-1")).await;
    for _ in 0..6 {
        assert_eq!(gate.process(&deduct("warn-1")).await.outcome, Outcome::Duplicate);
    }
    // One a second: the six fall in one window, or two when a second boundary cuts them.
    let warnings = log.text().matches("duplicate delivery skipped").count();
    assert!(
        (1..=2).contains(&warnings),
        "{warnings} warnings for six duplicates (the default allows 20 a second)"
    );
    app.stop().await;
}

/// A handler's own wait (here a sleep; an HTTP call, many statements) past the deadline: the
/// delivery is answered retry at the deadline, and its transaction never commits.
async fn consumer_delivery_timeout_ms(b: Backend) {
    let app =
        spawn_app_with(b, quick_bounds, Handlers::new().with("slow", Sleepy(Duration::from_secs(6)))).await;
    let started = Instant::now();
    let d = app.gate().process(&for_handler("slow", "dt-1")).await;
    let took = started.elapsed();
    assert_eq!((d.outcome, d.verdict), (Outcome::Failed, Verdict::Retry), "{d:?} (the default waits 25 s)");
    assert!(d.error.as_deref().is_some_and(|e| e.contains("ran out of time")), "{:?}", d.error);
    assert!(took >= Duration::from_millis(2_500) && took < Duration::from_secs(4), "answered after {took:?}");
    assert!(d.logged, "the failed attempt is in the log");
    // Past the handler's own six seconds: its transaction was rolled back, not committed.
    tokio::time::sleep(Duration::from_secs(6) - took + Duration::from_secs(1)).await;
    assert_eq!(claims_of(&app, "dt-1").await, 0, "the abandoned transaction committed its claim");
    app.stop().await;
}

/// A delivery timeout of 2.5 s and bounds whose waits fit it (`delivery_budget`), with or without
/// group commit.
fn quick_bounds(s: &mut Settings) {
    s.consumer.delivery_timeout_ms = 2_500;
    s.database.acquire_timeout_ms = 100;
    s.database.lock_timeout_ms = 300;
    s.database.statement_timeout_ms = 1_000;
    s.consumer.transient_retries = 0;
}

async fn claims_of(app: &TestApp, biz_id: &str) -> i64 {
    app.scalar("SELECT COUNT(*) FROM idempotent_record WHERE biz_id = ?", &[biz_id]).await
}

// ---------------------------------------------------------------------------------------------
// Bounded waits: a claim or a handler's statement behind a lock another connection holds, a
// group past its deadline, a group-commit task that panics.

/// Runs `$case(backend)` as a test on SQLite, PostgreSQL and MariaDB.
macro_rules! on_every_backend {
    ($($case:ident),* $(,)?) => {
        $(mod $case {
            #[tokio::test] async fn sqlite() { super::$case(idemgate::store::Backend::Sqlite).await }
            #[tokio::test] async fn postgres() { super::$case(idemgate::store::Backend::Postgres).await }
            #[tokio::test] async fn mariadb() { super::$case(idemgate::store::Backend::MySql).await }
        })*
    };
}

on_every_backend!(
    a_claim_behind_an_uncommitted_claim_of_its_key_is_retried_as_a_lock_wait_and_goes_through_once_released,
    a_group_behind_an_uncommitted_claim_splits_and_its_delivery_is_retried_as_a_lock_wait,
    a_configured_handler_behind_a_row_lock_answers_retry_long_before_the_lock_goes_and_never_commits,
    a_group_not_ready_by_its_deadline_is_rolled_back_and_answered_retry,
    a_handler_that_panics_inside_a_group_stops_the_service_with_the_group_committer_named,
);

/// A connection of the test's own, in a transaction that holds what `statement` locks, until
/// released: another instance paused or cut off with its transaction open.
struct Holder(sqlx::pool::PoolConnection<sqlx::Any>);

impl Holder {
    async fn take(app: &TestApp, statement: &str, binds: &[&str]) -> Self {
        use sqlx::Executor;
        let store = &app.db.store;
        let mut conn = store.pool().acquire().await.expect("a connection");
        // SQLite's writer lock is the whole file's: a deferred BEGIN would not take it.
        let begin = if store.backend() == Backend::Sqlite { "BEGIN IMMEDIATE" } else { "BEGIN" };
        conn.execute(begin).await.expect("begin");
        let mut q = idemgate::store::query_built(store.backend(), statement.to_owned());
        for b in binds {
            q = q.bind(b.to_string());
        }
        q.execute(&mut *conn).await.unwrap_or_else(|e| panic!("{e}: {statement}"));
        Self(conn)
    }

    /// The other instance's claim of `biz_id`, inserted and not committed.
    async fn claim(app: &TestApp, biz_id: &str) -> Self {
        let claim = "INSERT INTO idempotent_record (consumer_group, biz_type, biz_id, execute_time, msg_id, uniq_key, \
                     payload_hash, instance_id, claimed_at_ms) VALUES (?, ?, ?, 0, 'M-other', 'U-other', 'h', 'app-2', 0)";
        Self::take(app, claim, &[GROUP, shop::STOCK_DEDUCT, biz_id]).await
    }

    async fn release(mut self) {
        use sqlx::Executor;
        self.0.execute("ROLLBACK").await.expect("rollback");
    }
}

/// The lock bounds of these cases: 300 ms (a whole second on MariaDB, which counts in seconds),
/// two retries.
fn lock_bounds(s: &mut Settings) {
    s.database.lock_timeout_ms = 300;
    s.database.statement_timeout_ms = 1_500;
    s.consumer.transient_retries = 2;
}

/// The lock wait the backend allows for [`lock_bounds`].
fn lock_wait(b: Backend) -> Duration {
    if b == Backend::MySql { Duration::from_secs(1) } else { Duration::from_millis(300) }
}

/// The cause a lock wait that ran out is counted under: SQLite's file is busy.
fn lock_cause(b: Backend) -> &'static str {
    if b == Backend::Sqlite { "busy" } else { "lock_wait" }
}

/// The gate's retries of `cause` so far, from `/metrics`.
async fn retries_of(app: &TestApp, cause: &str) -> f64 {
    let reply = app.get("/metrics").await;
    reply
        .body
        .lines()
        .filter(|l| {
            l.starts_with("idemgate_transient_retries_total{") && l.contains(&format!("cause=\"{cause}\""))
        })
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum()
}

/// Processes `d` through the service's gate, failing the test if no answer comes within 20 s;
/// the answer and how long it took.
async fn answer_within_20_s(app: &TestApp, d: &idemgate::delivery::Delivery) -> (Disposition, Duration) {
    let started = Instant::now();
    let r = tokio::time::timeout(Duration::from_secs(20), app.gate().process(d))
        .await
        .expect("an answer within 20 s: the lock wait is bounded");
    (r, started.elapsed())
}

type Disposition = idemgate::gate::Disposition;

async fn a_claim_behind_an_uncommitted_claim_of_its_key_is_retried_as_a_lock_wait_and_goes_through_once_released(
    b: Backend,
) {
    let app = spawn_app(b, lock_bounds).await;
    let holder = Holder::claim(&app, "held-1").await;
    let (d, took) = answer_within_20_s(&app, &deduct("held-1")).await;
    assert_eq!((d.outcome, d.verdict), (Outcome::Failed, Verdict::Retry), "{d:?}");
    // Three tries, each waiting for the lock to its bound. SQLite's log row waits for the same
    // writer lock, three times more, and cannot be written: the delivery is not acknowledged.
    let tries = if b == Backend::Sqlite { 6 } else { 3 };
    assert!(took >= lock_wait(b) * 3, "answered after {took:?}: the lock was not waited for");
    assert!(took < lock_wait(b) * tries + Duration::from_secs(2), "answered after {took:?}");
    assert!(retries_of(&app, lock_cause(b)).await >= 2.0, "the retries are counted as {}", lock_cause(b));
    assert_eq!(d.logged, b != Backend::Sqlite, "{d:?}");
    holder.release().await;
    let again = app.gate().process(&deduct("held-1")).await;
    assert_eq!(again.outcome, Outcome::Processed, "{again:?}");
    assert_eq!(
        app.scalar("SELECT COUNT(*) FROM shop_stock_ledger WHERE deduction_id = ?", &["held-1"]).await,
        1
    );
    app.stop().await;
}

async fn a_group_behind_an_uncommitted_claim_splits_and_its_delivery_is_retried_as_a_lock_wait(b: Backend) {
    let app = spawn_app(b, |s| {
        lock_bounds(s);
        s.group_commit.enabled = true;
    })
    .await;
    let holder = Holder::claim(&app, "held-g").await;
    let gate = app.gate();
    let started = Instant::now();
    let (held, free) = (deduct("held-g"), deduct("free-g"));
    let (held, free) = tokio::join!(gate.process(&held), gate.process(&free));
    let took = started.elapsed();
    assert_eq!((held.outcome, held.verdict), (Outcome::Failed, Verdict::Retry), "{held:?}");
    if b == Backend::Sqlite {
        // The whole file is locked: nothing can be written until the other writer is gone.
        assert_eq!(free.verdict, Verdict::Retry, "{free:?}");
    } else {
        assert_eq!(
            free.outcome,
            Outcome::Processed,
            "the other delivery of the group is not held back: {free:?}"
        );
    }
    // On a server, the group waits once and splits; alone, the delivery tries three times.
    // SQLite's whole file is locked: the group tries three times, then each of the two
    // deliveries alone, and three times more for its log row.
    let waits = if b == Backend::Sqlite { 15 } else { 4 };
    assert!(took < lock_wait(b) * waits + Duration::from_secs(2), "answered after {took:?}");
    assert!(retries_of(&app, lock_cause(b)).await >= 3.0);
    holder.release().await;
    assert_eq!(app.gate().process(&deduct("held-g")).await.outcome, Outcome::Processed);
    app.stop().await;
}

const WALLET: &str =
    "CREATE TABLE wallet (user_id VARCHAR(64) NOT NULL PRIMARY KEY, balance_cents BIGINT NOT NULL)";
const WALLET_LEDGER: &str = "CREATE TABLE wallet_ledger (credit_id VARCHAR(128) NOT NULL PRIMARY KEY, user_id VARCHAR(64) NOT NULL, \
     cents BIGINT NOT NULL)";

/// The wallet credit of docs/own-business.md, as configuration, on the test topic.
fn wallet_credit(s: &mut Settings) {
    let business: toml::Value = toml::from_str(&format!(
        r#"
        [[sql_handlers]]
        name = "wallet.credit"
        statements = [
          {{ sql = "UPDATE wallet SET balance_cents = balance_cents + :cents WHERE user_id = :user", expect = "one", on_zero = "retry" }},
          {{ sql = "INSERT INTO wallet_ledger (credit_id, user_id, cents) VALUES (:biz_id, :user, :cents)", expect = "one" }},
        ]
        params = {{ cents = "json:/cents:int", user = "json:/user_id" }}

        [[routes]]
        topic = "{TEST_TOPIC}"
        tags = "credit"
        biz_type = "wallet.credit"
        biz_id = "json:/credit_id"
        "#
    ))
    .expect("the business as TOML");
    s.sql_handlers = business["sql_handlers"].clone().try_into().expect("sql_handlers");
    s.routes
        .extend(business["routes"].clone().try_into::<Vec<idemgate::route::RouteConfig>>().expect("routes"));
}

fn credit(credit_id: &str) -> idemgate::delivery::Delivery {
    idemgate::delivery::Delivery {
        msg_id: format!("M-{credit_id}-{}", rand::random::<u32>()),
        uniq_key: format!("U-{credit_id}"),
        topic: TEST_TOPIC.to_owned(),
        tags: "credit".to_owned(),
        body: serde_json::json!({ "credit_id": credit_id, "user_id": "user-1", "cents": 250 })
            .to_string()
            .into_bytes(),
        ..Default::default()
    }
}

/// A row lock on the configured handler's table outlasting the client's patience (40 s in the
/// field; six seconds here): the delivery answers retry within its lock bounds, long before the
/// lock goes, and its statements never commit, not even once the lock is released.
async fn a_configured_handler_behind_a_row_lock_answers_retry_long_before_the_lock_goes_and_never_commits(
    b: Backend,
) {
    const HELD: Duration = Duration::from_secs(6);
    let db = scratch_db(b).await;
    for ddl in [WALLET, WALLET_LEDGER, "INSERT INTO wallet (user_id, balance_cents) VALUES ('user-1', 0)"] {
        sqlx::query(sqlx::AssertSqlSafe(ddl)).execute(db.store.pool()).await.expect(ddl);
    }
    let app = spawn_app_on(
        db,
        |s| {
            lock_bounds(s);
            wallet_credit(s);
        },
        Handlers::new(),
    )
    .await;
    let holder =
        Holder::take(&app, "UPDATE wallet SET balance_cents = balance_cents WHERE user_id = ?", &["user-1"])
            .await;
    let locked_at = Instant::now();
    let gate = app.gate();
    let delivery = credit("C-locked");
    let answer = tokio::spawn(async move {
        let r = gate.process(&delivery).await;
        (r, Instant::now())
    });
    tokio::time::sleep(HELD).await;
    holder.release().await;
    let released_at = Instant::now();
    let (r, answered_at) = answer.await.expect("no panic");
    assert_eq!((r.outcome, r.verdict), (Outcome::Failed, Verdict::Retry), "{r:?}");
    assert!(
        answered_at < released_at,
        "answered only once the lock went, after {:?}",
        answered_at - locked_at
    );
    assert!(answered_at - locked_at < Duration::from_secs(5), "answered after {:?}", answered_at - locked_at);
    // Nothing of the delivery committed then, nor afterwards.
    tokio::time::sleep(Duration::from_secs(1)).await;
    let ledger = "SELECT COUNT(*) FROM wallet_ledger WHERE credit_id = ?";
    assert_eq!(app.scalar(ledger, &["C-locked"]).await, 0, "the abandoned statements committed");
    assert_eq!(app.scalar("SELECT balance_cents FROM wallet WHERE user_id = ?", &["user-1"]).await, 0);
    assert_eq!(claims_of(&app, "C-locked").await, 0);
    // The redelivery applies it, once.
    assert_eq!(app.gate().process(&credit("C-locked")).await.outcome, Outcome::Processed);
    assert_eq!(app.scalar(ledger, &["C-locked"]).await, 1);
    assert_eq!(app.scalar("SELECT balance_cents FROM wallet WHERE user_id = ?", &["user-1"]).await, 250);
    app.stop().await;
}

async fn a_group_not_ready_by_its_deadline_is_rolled_back_and_answered_retry(b: Backend) {
    let app = spawn_app_with(
        b,
        |s| {
            quick_bounds(s);
            s.group_commit.enabled = true;
        },
        Handlers::new().with("slow", Sleepy(Duration::from_secs(6))),
    )
    .await;
    let started = Instant::now();
    let d = app.gate().process(&for_handler("slow", "gdt-1")).await;
    let took = started.elapsed();
    assert_eq!((d.outcome, d.verdict), (Outcome::Failed, Verdict::Retry), "{d:?}");
    assert!(d.error.as_deref().is_some_and(|e| e.contains("ran out of time")), "{:?}", d.error);
    assert!(took >= Duration::from_millis(2_500) && took < Duration::from_secs(4), "answered after {took:?}");
    assert!(d.logged);
    tokio::time::sleep(Duration::from_secs(6) - took + Duration::from_secs(1)).await;
    assert_eq!(claims_of(&app, "gdt-1").await, 0, "the group's transaction committed after its deadline");
    let split = format!("idemgate_group_commits_total{{consumer_group=\"{GROUP}\",result=\"split\"}}");
    assert_eq!(app.metric(&split).await, 1.0, "the group was rolled back and split");
    app.stop().await;
}

/// Panics in every call: a defect in business code.
struct Panicking;

#[async_trait::async_trait]
impl idemgate::handler::Handler for Panicking {
    async fn handle(
        &self,
        _: &idemgate::handler::Work<'_>,
        _: &mut idemgate::store::Conn,
    ) -> Result<idemgate::handler::Effect, idemgate::handler::HandlerError> {
        panic!("a defect in the business code")
    }
}

async fn a_handler_that_panics_inside_a_group_stops_the_service_with_the_group_committer_named(b: Backend) {
    let mut app =
        spawn_app_with(b, |s| s.group_commit.enabled = true, Handlers::new().with("panicky", Panicking))
            .await;
    assert!(app.running().parts().contains(&"group commit"), "{:?}", app.running().parts());
    assert_eq!(app.get("/readyz").await.status, 200);
    let d = app.gate().process(&for_handler("panicky", "pan-1")).await;
    assert_eq!((d.verdict, d.logged), (Verdict::Retry, false), "{d:?}");
    // Ready no more, at once: nothing else has to notice first.
    let ready = app.get("/readyz").await;
    assert_eq!(ready.status, 503, "{}", ready.body);
    let (part, ended) = app.part_ended(Duration::from_secs(5)).await.expect("a part ended on its own");
    assert_eq!(part, "group commit");
    assert!(ended.contains("a group-commit task panicked: a defect in the business code"), "{ended}");
    assert_eq!(claims_of(&app, "pan-1").await, 0, "the group rolled back");
    let fault = app.stop_with_fault().await;
    assert!(fault.contains("the group commit did not stop cleanly"), "{fault}");
}

/// Invalid deliveries' warnings keep to the duplicates' budget
/// (`consumer.duplicate_warnings_per_second`), counted apart from them: six refused by the
/// gate (no KEYS) and six by the handler (a body it cannot read) log one or two lines, not
/// twelve (the default allows 20 a second). Every one is still logged `invalid`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn invalid_delivery_warnings_are_rate_limited_like_duplicates() {
    let (log, _guard) = LogCapture::start();
    let app = spawn_app(Backend::Sqlite, |s| s.consumer.duplicate_warnings_per_second = 1).await;
    let gate = app.gate();
    for i in 0..6 {
        let no_key = idemgate::delivery::Delivery { keys: vec![], ..deduct(&format!("inv-{i}")) };
        assert_eq!(gate.process(&no_key).await.outcome, Outcome::Invalid);
        let unreadable =
            idemgate::delivery::Delivery { body: b"{\"sku\":".to_vec(), ..deduct(&format!("inv-b{i}")) };
        assert_eq!(gate.process(&unreadable).await.outcome, Outcome::Invalid);
    }
    let text = log.text();
    let warnings = text
        .lines()
        .filter(|l| {
            l.contains("invalid delivery") || (l.contains("delivery given up") && l.contains("invalid"))
        })
        .count();
    // One a second: the twelve fall in one window, or two when a second boundary cuts them.
    assert!((1..=2).contains(&warnings), "{warnings} warnings for twelve invalid deliveries:\n{text}");
    app.stop().await;
}
