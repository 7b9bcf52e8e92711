//! Scenarios on a two-broker cluster (`LocalCluster`: one name server, masters `broker-a` and
//! `broker-b`, the topic created on both with 4 queues each), each ending in exact books: every
//! send logged, every key applied exactly once, every duplicate with its cause, and a reconcile
//! run that finds nothing `lost` or `double_applied`. They take about 8 minutes together, so
//! they are `#[ignore]`d: `scripts/test.sh` runs them (`--ignored`) unless
//! `IDEMGATE_CLUSTER_SCENARIOS=0`, which it sets, and says so, on a machine that had to build
//! the brokers first, where they would push the run past CI's limit. Each prints its wall time
//! and its figures.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use idemgate::config::Settings;
use idemgate::store::{Backend, Store};
use idemgate_shop::produce::ProduceReport;
use idemgate_testkit::broker::LocalCluster;
use idemgate_testkit::scratch;
use sqlx::Row;

use super::support::*;

/// Queues of the topic on each broker.
const QUEUES_PER_BROKER: u32 = 4;

/// A started cluster with `topic` on both brokers.
fn cluster_with(topic: &str) -> LocalCluster {
    let cluster = LocalCluster::start().unwrap_or_else(|e| panic!("a RocketMQ cluster is required: {e:#}"));
    cluster.create_topic(topic, QUEUES_PER_BROKER).unwrap_or_else(|e| panic!("creating {topic}: {e:#}"));
    cluster
}

/// `serve`'s settings on the cluster, reading the lag every 2 s.
fn on_cluster(cluster: &LocalCluster, db_url: &str, topic: &str, group: &str, instance: &str) -> Settings {
    let mut s = settings_on(cluster.name_server(), db_url, topic, group, instance);
    s.broker.lag_interval_seconds = 2;
    s
}

/// The traffic of every scenario: 30% duplicates of every cause, no poison and no malformed
/// message, so that every send carries a key that must be applied exactly once.
const TRAFFIC: [&str; 6] = ["--duplicates", "0.3", "--poison", "0", "--malformed", "0"];

/// Reads a service's lag (messages over every queue of `topic`) once a second until stopped:
/// the largest seen, and when it was last above 0.
struct LagWatch {
    stop: Arc<AtomicBool>,
    thread: std::thread::JoinHandle<(f64, Option<Instant>)>,
}

impl LagWatch {
    fn start(addr: String, group: &str, topic: &str) -> Self {
        let stop = Arc::new(AtomicBool::new(false));
        let (group, topic) = (group.to_owned(), topic.to_owned());
        let thread = std::thread::spawn({
            let stop = stop.clone();
            move || {
                let (mut most, mut last_behind) = (0.0f64, None);
                while !stop.load(Ordering::Relaxed) {
                    if let Some(behind) = lag_of(&addr, &group, &topic) {
                        most = most.max(behind);
                        if behind > 0.0 {
                            last_behind = Some(Instant::now());
                        }
                    }
                    std::thread::sleep(Duration::from_secs(1));
                }
                (most, last_behind)
            }
        });
        Self { stop, thread }
    }

    fn finish(self) -> (f64, Option<Instant>) {
        self.stop.store(true, Ordering::Relaxed);
        self.thread.join().expect("the lag watch")
    }
}

/// The messages behind on every queue of `topic` a service's `/metrics` shows.
fn lag_of(addr: &str, group: &str, topic: &str) -> Option<f64> {
    let (_, text) = http_get(addr, "/metrics")?;
    sample(&text, "idemgate_consumer_lag_messages", &[("consumer_group", group), ("topic", topic)])
}

/// Waits (up to `limit`) until a service reports no lag on `topic`; how long it took.
fn wait_for_no_lag(addr: &str, group: &str, topic: &str, limit: Duration) -> Duration {
    let started = Instant::now();
    loop {
        if lag_of(addr, group, topic) == Some(0.0) {
            return started.elapsed();
        }
        assert!(started.elapsed() < limit, "the lag of {topic} is not 0 {limit:?} after the books converged");
        std::thread::sleep(Duration::from_millis(500));
    }
}

/// The books converge, every duplicate has a cause, each planted duplicate is among them, and a
/// reconcile run finds nothing lost or applied twice. Returns the duplicates by cause.
async fn assert_exact_books(
    store: &Store,
    db_url: &str,
    run: &str,
    group: &str,
    report: &ProduceReport,
    sends: &[SendLine],
) -> BTreeMap<String, i64> {
    assert_converges(store, run, group, report, sends).await;
    let causes = duplicates_by_cause(store, group).await;
    for unnamed in ["", "unknown"] {
        assert!(!causes.contains_key(unnamed), "duplicates without a cause: {causes:?}");
    }
    let planted: u64 = ["producer_retry", "producer_resend", "late_duplicate"]
        .iter()
        .map(|kind| report.tally.sends.get(*kind).copied().unwrap_or(0))
        .sum();
    let logged: i64 = causes.values().sum();
    assert!(logged >= planted as i64, "{logged} duplicates logged, {planted} sent: {causes:?}");
    let (code, text) = reconcile(db_url, group);
    assert!(text.contains("lost 0") && text.contains("double_applied 0"), "reconcile ({code:?}):\n{text}");
    causes
}

/// One scenario: its cluster, database and names, the producer's stream and the watch on the lag
/// of the instance whose address it was given.
struct Scenario {
    name: &'static str,
    began: Instant,
    cluster: LocalCluster,
    db: scratch::ScratchDb,
    topic: String,
    group: String,
    run: String,
}

/// A stream on its way.
struct Stream {
    producer: std::thread::JoinHandle<(ProduceReport, Vec<SendLine>)>,
    watch: LagWatch,
    addr: String,
}

impl Scenario {
    async fn new(name: &'static str, prefix: &str) -> Self {
        Self::on(name, prefix, Backend::Postgres).await
    }

    async fn on(name: &'static str, prefix: &str, backend: Backend) -> Self {
        let began = Instant::now();
        let (topic, group, run) = (unique(prefix), unique("group"), unique(prefix).replace('_', ""));
        let cluster = cluster_with(&topic);
        let db = database(backend).await;
        Self { name, began, cluster, db, topic, group, run }
    }

    fn serve(&self, instance: &str) -> Service {
        Service::start(&on_cluster(&self.cluster, &self.db.url, &self.topic, &self.group, instance))
    }

    /// Starts sending `messages` at `rate`, watching the lag `watched` reports.
    fn stream(&self, messages: u64, rate: u32, watched: &Service) -> Stream {
        let addr = service_addr(watched);
        let (name_server, topic, run) =
            (self.cluster.name_server().to_owned(), self.topic.clone(), self.run.clone());
        Stream {
            producer: std::thread::spawn(move || {
                produce_on(&name_server, &topic, &run, messages, rate, &TRAFFIC)
            }),
            watch: LagWatch::start(addr.clone(), &self.group, &self.topic),
            addr,
        }
    }

    /// Waits for the stream's end, checks the books, waits for the lag to drain, and prints the
    /// figures, `events` first; the deliveries processed by each instance.
    async fn finish(&self, stream: Stream, events: &str) -> BTreeMap<String, i64> {
        let (report, sends) = tokio::task::block_in_place(|| stream.producer.join()).expect("the producer");
        let streamed = self.began.elapsed();
        let causes =
            assert_exact_books(&self.db.store, &self.db.url, &self.run, &self.group, &report, &sends).await;
        let converged = self.began.elapsed();
        let drained = tokio::task::block_in_place(|| {
            wait_for_no_lag(&stream.addr, &self.group, &self.topic, Duration::from_secs(60))
        });
        let (most_behind, _) = stream.watch.finish();
        let by_instance = processed_by_instance(&self.db.store, &self.group).await;
        println!(
            "{}: {events}; {} sends ({:.0}/s) by kind {:?}; duplicates by cause {causes:?}, {} duplicates beyond \
             the planted ones; processed by instance {by_instance:?}; lag at most {most_behind} messages, 0 {:.1} s \
             after the books; stream ended {:.1} s, books exact {:.1} s, wall {:.1} s",
            self.name,
            report.sent,
            report.sends_per_second,
            report.tally.sends,
            caused_redeliveries(&causes, &report),
            drained.as_secs_f64(),
            streamed.as_secs_f64(),
            converged.as_secs_f64(),
            self.began.elapsed().as_secs_f64()
        );
        by_instance
    }

    /// Drops the database; the cluster stops when dropped.
    async fn close(self) {
        self.db.drop_now().await;
    }
}

/// Duplicates the cluster caused beyond the ones the producer planted: every duplicate logged
/// minus every planted copy (`redelivery`, `producer_resend` and `late_duplicate` sends). Which of
/// two copies is logged as the duplicate depends on which arrives first, so the causes are not
/// compared one by one.
fn caused_redeliveries(causes: &BTreeMap<String, i64>, report: &ProduceReport) -> i64 {
    let planted: u64 = ["producer_retry", "producer_resend", "late_duplicate"]
        .iter()
        .map(|kind| report.tally.sends.get(*kind).copied().unwrap_or(0))
        .sum();
    causes.values().sum::<i64>() - planted as i64
}

/// Messages per scenario, and their rate: a 40 s stream.
const MESSAGES: u64 = 10_000;
const RATE: u32 = 250;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "a two-broker cluster scenario (about 8 minutes for the six): scripts/test.sh runs them with --ignored"]
async fn losing_a_broker_mid_stream_for_twenty_seconds_leaves_exact_books() {
    let mut scenario = Scenario::new("broker loss", "loss").await;
    let services: Vec<Service> = (1..=3).map(|i| scenario.serve(&format!("instance-{i}"))).collect();
    // Let the three join the group and share the eight queues before the stream starts.
    tokio::time::sleep(Duration::from_secs(3)).await;
    let stream = scenario.stream(MESSAGES, RATE, &services[0]);
    tokio::time::sleep(Duration::from_secs(8)).await;
    tokio::task::block_in_place(|| scenario.cluster.kill("broker-b")).expect("SIGKILL broker-b");
    let killed = Instant::now();
    tokio::time::sleep(Duration::from_secs(20)).await;
    tokio::task::block_in_place(|| scenario.cluster.restart("broker-b")).expect("broker-b starts again");
    let events = format!("broker-b SIGKILLed, back {:.1} s later", killed.elapsed().as_secs_f64());
    let by_instance = scenario.finish(stream, &events).await;
    assert_eq!(by_instance.len(), 3, "every instance processed part of the stream: {by_instance:?}");
    for service in services {
        assert_eq!(service.terminate().code(), Some(0));
    }
    scenario.close().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "a two-broker cluster scenario (about 8 minutes for the six): scripts/test.sh runs them with --ignored"]
async fn a_rebalance_storm_of_one_three_one_and_two_instances_leaves_exact_books() {
    let scenario = Scenario::new("rebalance storm", "storm").await;
    let first = scenario.serve("steady");
    let stream = scenario.stream(MESSAGES, RATE, &first);
    // 1 → 3 → 1 → 2, ten seconds apart; leaving is SIGTERM.
    tokio::time::sleep(Duration::from_secs(8)).await;
    let joined: Vec<Service> = ["joiner-1", "joiner-2"].iter().map(|n| scenario.serve(n)).collect();
    tokio::time::sleep(Duration::from_secs(10)).await;
    for service in joined {
        let exit = tokio::task::block_in_place(|| service.terminate());
        assert_eq!(exit.code(), Some(0), "a leaving instance exits 0");
    }
    tokio::time::sleep(Duration::from_secs(10)).await;
    let last = scenario.serve("late-joiner");
    let by_instance = scenario.finish(stream, "1 → 3 → 1 → 2 instances, 10 s apart").await;
    assert!(by_instance.len() >= 3, "the joiners processed part of the stream: {by_instance:?}");
    assert_eq!(first.terminate().code(), Some(0));
    assert_eq!(last.terminate().code(), Some(0));
    scenario.close().await;
}

/// Three instances; a fourth joins, and while the group rebalances one of the three is SIGKILLed
/// (its offsets not yet committed come back to the others as `redelivery` duplicates); a
/// replacement joins 15 s later.
async fn killed_during_a_rebalance(backend: Backend, name: &'static str) {
    let scenario = Scenario::on(name, "rebkill", backend).await;
    let steady = scenario.serve("steady");
    let others: Vec<Service> = ["second", "victim"].iter().map(|n| scenario.serve(n)).collect();
    tokio::time::sleep(Duration::from_secs(3)).await;
    let stream = scenario.stream(MESSAGES, RATE, &steady);
    tokio::time::sleep(Duration::from_secs(8)).await;
    let joiner = scenario.serve("joiner");
    // The joiner's arrival starts a rebalance of every instance; the victim dies inside it.
    tokio::time::sleep(Duration::from_millis(1500)).await;
    let mut others = others.into_iter();
    let second = others.next().expect("the second instance");
    let victim = others.next().expect("the victim");
    tokio::task::block_in_place(|| victim.kill_hard());
    let killed = Instant::now();
    tokio::time::sleep(Duration::from_secs(15)).await;
    let replacement = scenario.serve("replacement");
    let events = format!(
        "an instance SIGKILLed 1.5 s after a fourth joined, a replacement {:.1} s later",
        killed.elapsed().as_secs_f64()
    );
    let by_instance = scenario.finish(stream, &events).await;
    assert!(
        by_instance.contains_key("victim"),
        "the victim processed part of the stream first: {by_instance:?}"
    );
    for service in [steady, second, joiner, replacement] {
        assert_eq!(tokio::task::block_in_place(|| service.terminate()).code(), Some(0));
    }
    scenario.close().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "a two-broker cluster scenario (about 8 minutes for the six): scripts/test.sh runs them with --ignored"]
async fn an_instance_killed_during_a_rebalance_leaves_exact_books_on_postgres() {
    killed_during_a_rebalance(Backend::Postgres, "kill -9 during a rebalance, PostgreSQL").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "a two-broker cluster scenario (about 8 minutes for the six): scripts/test.sh runs them with --ignored"]
async fn an_instance_killed_during_a_rebalance_leaves_exact_books_on_mariadb() {
    killed_during_a_rebalance(Backend::MySql, "kill -9 during a rebalance, MariaDB").await;
}

static LOCK_CLAIMS: idemgate::store::Sql =
    idemgate::store::Sql::new("LOCK TABLE idempotent_record IN EXCLUSIVE MODE");
static FAILED: idemgate::store::Sql = idemgate::store::Sql::new(
    "SELECT COALESCE(error, ''), COUNT(*) FROM delivery_log WHERE consumer_group = ? AND outcome = 'failed' \
     GROUP BY error",
);

/// The pull bound of the slow-database scenario, per instance: small enough that 15 s of the
/// stream pass it many times over.
const BUFFERED: u32 = 200;
/// The most queues one instance of the slow-database scenario consumes: half of the topic's 8,
/// or all of them while the other instance has not joined yet, and one `%RETRY%` queue per broker.
const MOST_QUEUES: u32 = 2 * QUEUES_PER_BROKER + 2;

/// Two instances take the stream; 8 s in, a transaction takes `LOCK TABLE idempotent_record IN
/// EXCLUSIVE MODE` and holds it 15 s, so that every claim waits. The consumers must wait with it:
/// a claim waits at most `database.lock_timeout_ms` per attempt, so a delivery that runs out of
/// attempts during the stall is answered retry and redelivered, and no delivery fails on the
/// database in any other way; nothing is lost, and what each broker client holds pulled
/// stays within `rocketmq.buffered_messages` (plus at most one pull per queue, since the client
/// checks the bound before each pull), read from each instance's
/// `idemgate_consumer_buffered_messages` every second; their memory stays bounded with it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "a two-broker cluster scenario (about 8 minutes for the six): scripts/test.sh runs them with --ignored"]
async fn a_database_stalled_for_fifteen_seconds_slows_the_consumers_and_loses_nothing() {
    let scenario = Scenario::new("slow database", "stall").await;
    let services: Vec<Service> = ["first", "second"]
        .iter()
        .map(|n| {
            let mut s = on_cluster(&scenario.cluster, &scenario.db.url, &scenario.topic, &scenario.group, n);
            s.rocketmq.buffered_messages = BUFFERED;
            Service::start(&s)
        })
        .collect();
    let addrs: Vec<String> = services.iter().map(service_addr).collect();
    tokio::time::sleep(Duration::from_secs(3)).await;
    let stream = scenario.stream(MESSAGES, RATE, &services[0]);
    tokio::time::sleep(Duration::from_secs(8)).await;
    let mut lock = scenario.db.store.begin().await.expect("a transaction");
    scenario.db.store.query(&LOCK_CLAIMS).execute(&mut *lock).await.expect("the claims locked");
    let stalled = Instant::now();
    let (mut most_rss, mut most_held): (f64, f64) = (0.0, 0.0);
    let held = |addr: &str| {
        let (_, text) = http_get(addr, "/metrics")?;
        sample(
            &text,
            "idemgate_consumer_buffered_messages",
            &[("consumer_group", scenario.group.as_str()), ("topic", scenario.topic.as_str())],
        )
    };
    while stalled.elapsed() < Duration::from_secs(15) {
        for (service, addr) in services.iter().zip(&addrs) {
            most_rss = most_rss.max(service.rss_mib().expect("serve runs through the stall"));
            let now_held =
                tokio::task::block_in_place(|| held(addr)).expect("serve reports what it holds pulled");
            most_held = most_held.max(now_held);
        }
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
    lock.rollback().await.expect("the lock released");
    let pull = Settings::default().rocketmq.pull_batch_size;
    let bound = f64::from(BUFFERED + MOST_QUEUES * pull);
    assert!(
        most_held <= bound,
        "an instance held {most_held} messages pulled, over rocketmq.buffered_messages {BUFFERED} plus one pull of \
         {pull} per queue ({bound})"
    );
    assert!(
        // 15 s of the stream is many times the bound; a quarter of it held shows the client
        // stopped on the bound rather than on an empty topic.
        most_held >= f64::from(BUFFERED) / 4.0,
        "the stall never filled the client's buffer (at most {most_held} held): the bound was not exercised"
    );
    let events = format!(
        "the claim table locked {:.1} s, at most {most_held} messages held pulled by one instance \
         (rocketmq.buffered_messages {BUFFERED}), serve's RSS at most {most_rss:.0} MiB meanwhile",
        stalled.elapsed().as_secs_f64()
    );
    let by_instance = scenario.finish(stream, &events).await;
    assert_eq!(by_instance.len(), 2, "both instances processed part of the stream: {by_instance:?}");
    let failed: Vec<(String, i64)> = scenario
        .db
        .store
        .query(&FAILED)
        .bind(scenario.group.as_str())
        .fetch_all(scenario.db.store.pool())
        .await
        .expect("failed deliveries")
        .iter()
        .map(|r| (r.get(0), r.get(1)))
        .collect();
    // The stall holds orders back while payments on other queues go on arriving: those are
    // refused and retried by the example shop itself. A claim waits for the lock at most
    // `database.lock_timeout_ms` per attempt, and the gate's own retries add up to less than
    // the stall: such a delivery fails on the lock wait's bound and the broker brings it back
    // (the books above are exact). No delivery may fail on the database in any other way.
    let early_payment = |error: &str| error.ends_with("its order.create may still be on the way");
    let lock_wait = |error: &str| error.contains("canceling statement due to lock timeout");
    let otherwise: Vec<&(String, i64)> =
        failed.iter().filter(|(error, _)| !early_payment(error) && !lock_wait(error)).collect();
    assert!(otherwise.is_empty(), "deliveries failed during the stall on the database: {otherwise:?}");
    let count =
        |pick: &dyn Fn(&str) -> bool| -> i64 { failed.iter().filter(|(e, _)| pick(e)).map(|(_, n)| n).sum() };
    println!(
        "slow database: {} payments retried because the stall held their order back, {} deliveries redelivered \
         after their claim's lock wait reached database.lock_timeout_ms",
        count(&early_payment),
        count(&lock_wait)
    );
    assert!(most_rss < 200.0, "serve grew to {most_rss:.0} MiB while the database was stalled");
    for service in services {
        assert_eq!(tokio::task::block_in_place(|| service.terminate()).code(), Some(0));
    }
    scenario.close().await;
}

/// Claims seeded 100 days old, for the archive to move while the stream runs.
const EXPIRED_CLAIMS: i64 = 20_000;

static SEED_EXPIRED: idemgate::store::Sql = idemgate::store::Sql::new(
    "INSERT INTO idempotent_record (consumer_group, biz_type, biz_id, execute_time, msg_id, uniq_key, payload_hash, \
     instance_id, claimed_at_ms) \
     SELECT ?, 'stock.deduct', 'expired-' || g, 0, 'M-expired-' || g, 'U-expired-' || g, 'hash', 'seed', ? \
     FROM generate_series(1, ?) AS g",
);
static ARCHIVED_EXPIRED: idemgate::store::Sql = idemgate::store::Sql::new(
    "SELECT COUNT(*), COUNT(DISTINCT biz_id) FROM idempotent_record_archive \
     WHERE consumer_group = ? AND biz_id LIKE 'expired-%'",
);
static LIVE_EXPIRED: idemgate::store::Sql = idemgate::store::Sql::new(
    "SELECT COUNT(*) FROM idempotent_record WHERE consumer_group = ? AND biz_id LIKE 'expired-%'",
);
/// Every archive pass that ran (not skipped): its kind, status, instance and times.
static ARCHIVE_RUNS: idemgate::store::Sql = idemgate::store::Sql::new(
    "SELECT kind, status, instance_id, started_at_ms, COALESCE(finished_at_ms, 0), rows_moved \
     FROM archive_run WHERE status <> 'skipped' AND started_by = 'schedule' ORDER BY started_at_ms",
);
static ARCHIVE_SKIPS: idemgate::store::Sql =
    idemgate::store::Sql::new("SELECT COUNT(*) FROM archive_run WHERE status = 'skipped'");
static RECONCILE_RUNS: idemgate::store::Sql = idemgate::store::Sql::new(
    "SELECT status, instance_id, started_at_ms, COALESCE(finished_at_ms, 0) FROM reconcile_run \
     WHERE consumer_group = ? AND started_by = 'schedule' ORDER BY started_at_ms",
);

/// One run of a scheduled job, as its table recorded it.
#[derive(Debug)]
struct JobRun {
    kind: String,
    status: String,
    instance: String,
    started_ms: i64,
    finished_ms: i64,
}

/// The schedule of both jobs in the single-runner scenario: every 5 s.
const TICK_MS: i64 = 5_000;

/// At most one run per tick (ticks fall every `TICK_MS`), and no two finished runs of a kind
/// overlap in time. A run's tick is that of its first row (the reconcile run; the archive's
/// `dedup` pass, which starts as soon as the lease is taken: its `log` pass follows later and may
/// start in the next tick's window). A run abandoned by a killed instance is counted for its
/// tick; its finish is when the next run marked it failed, so it is left out of the overlap check.
fn assert_one_runner(job: &str, runs: &[JobRun]) {
    let mut per_tick: BTreeMap<i64, Vec<&JobRun>> = BTreeMap::new();
    for run in runs.iter().filter(|r| r.kind != "log") {
        per_tick.entry(run.started_ms.div_euclid(TICK_MS)).or_default().push(run);
    }
    let doubled: Vec<_> = per_tick.values().filter(|runs| runs.len() > 1).collect();
    assert!(doubled.is_empty(), "{job}: ticks run by more than one instance: {doubled:#?}");
    let mut finished: Vec<&JobRun> = runs.iter().filter(|r| r.status == "success").collect();
    finished.sort_by_key(|r| (r.kind.clone(), r.started_ms));
    for pair in finished.windows(2) {
        if pair[0].kind == pair[1].kind {
            assert!(
                pair[1].started_ms >= pair[0].finished_ms,
                "{job}: two runs at once: {:?} and {:?}",
                pair[0],
                pair[1]
            );
        }
    }
}

/// Three instances archive and reconcile every 5 s while they take the stream; two of them are
/// SIGKILLed at moments drawn at random. Every tick of either job is run by one instance at
/// most, both jobs go on running after the kills, and the 20,000 expired claims are archived
/// exactly once, in batches small enough that a kill can land in the middle of a run.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "a two-broker cluster scenario (about 8 minutes for the six): scripts/test.sh runs them with --ignored"]
async fn the_archive_and_reconcile_jobs_run_once_per_tick_while_instances_are_killed() {
    let scenario = Scenario::new("single runner", "single").await;
    let store = &scenario.db.store;
    let old = idemgate::clock::now_ms() - 100 * 86_400_000;
    store
        .query(&SEED_EXPIRED)
        .bind(scenario.group.as_str())
        .bind(old)
        .bind(EXPIRED_CLAIMS)
        .execute(store.pool())
        .await
        .expect("expired claims seeded");
    let serve = |instance: &str| {
        let mut s =
            on_cluster(&scenario.cluster, &scenario.db.url, &scenario.topic, &scenario.group, instance);
        s.archive.schedule = "*/5 * * * * *".to_owned();
        s.archive.batch_size = 500;
        s.archive.pause_ms = 200;
        s.archive.lease_seconds = 10;
        s.reconcile.schedule = "*/5 * * * * *".to_owned();
        s.reconcile.lease_seconds = 10;
        Service::start(&s)
    };
    let mut services: Vec<(String, Service)> =
        ["alpha", "beta", "gamma"].iter().map(|n| (n.to_string(), serve(n))).collect();
    tokio::time::sleep(Duration::from_secs(3)).await;
    let stream = scenario.stream(MESSAGES, RATE, &services[0].1);
    let streaming = Instant::now();
    // Two of the three, drawn at random, each at a moment drawn between 5 s and 30 s into the
    // stream; the watched first instance is never one of them.
    let mut moments: Vec<u64> = (0..2).map(|_| rand::random_range(5_000..30_000)).collect();
    moments.sort_unstable();
    let mut killed = Vec::new();
    for at in moments {
        let wait = Duration::from_millis(at).saturating_sub(streaming.elapsed());
        tokio::time::sleep(wait).await;
        let victim = rand::random_range(1..services.len());
        let (name, service) = services.remove(victim);
        tokio::task::block_in_place(|| service.kill_hard());
        killed.push((name, idemgate::clock::now_ms(), at));
    }
    let last_kill_ms = killed.iter().map(|k| k.1).max().expect("two kills");
    let events = format!(
        "SIGKILLed (instance, ms into the stream): {:?}",
        killed.iter().map(|k| (&k.0, k.2)).collect::<Vec<_>>()
    );
    scenario.finish(stream, &events).await;

    // Both jobs must run again after the kills (a dead holder's lease lasts 10 s), and the
    // archive must finish the expired claims.
    let group = scenario.group.as_str();
    let deadline = Instant::now() + Duration::from_secs(90);
    let (archive_runs, reconcile_runs) = loop {
        let archive_runs: Vec<JobRun> = store
            .query(&ARCHIVE_RUNS)
            .fetch_all(store.pool())
            .await
            .expect("archive runs")
            .iter()
            .map(|r| JobRun {
                kind: r.get(0),
                status: r.get(1),
                instance: r.get(2),
                started_ms: r.get(3),
                finished_ms: r.get(4),
            })
            .collect();
        let reconcile_runs: Vec<JobRun> = store
            .query(&RECONCILE_RUNS)
            .bind(group)
            .fetch_all(store.pool())
            .await
            .expect("reconcile runs")
            .iter()
            .map(|r| JobRun {
                kind: "reconcile".to_owned(),
                status: r.get(0),
                instance: r.get(1),
                started_ms: r.get(2),
                finished_ms: r.get(3),
            })
            .collect();
        let live: i64 =
            store.query(&LIVE_EXPIRED).bind(group).fetch_one(store.pool()).await.expect("live").get(0);
        let after =
            |runs: &[JobRun]| runs.iter().any(|r| r.status == "success" && r.started_ms > last_kill_ms);
        if live == 0 && after(&archive_runs) && after(&reconcile_runs) {
            break (archive_runs, reconcile_runs);
        }
        assert!(
            Instant::now() < deadline,
            "90 s after the stream: {live} expired claims left, archive runs {archive_runs:#?}, reconcile runs \
             {reconcile_runs:#?}"
        );
        tokio::time::sleep(Duration::from_secs(1)).await;
    };
    assert_one_runner("archive", &archive_runs);
    assert_one_runner("reconcile", &reconcile_runs);
    let row = store.query(&ARCHIVED_EXPIRED).bind(group).fetch_one(store.pool()).await.expect("archived");
    let (archived, distinct): (i64, i64) = (row.get(0), row.get(1));
    assert_eq!((archived, distinct), (EXPIRED_CLAIMS, EXPIRED_CLAIMS), "every expired claim archived once");
    let skipped: i64 = store.query(&ARCHIVE_SKIPS).fetch_one(store.pool()).await.expect("skips").get(0);
    assert!(skipped > 0, "instances woken by one tick found the lease taken and skipped");
    fn runners(runs: &[JobRun]) -> BTreeMap<&str, usize> {
        let mut by = BTreeMap::new();
        for r in runs {
            *by.entry(r.instance.as_str()).or_default() += 1;
        }
        by
    }
    let abandoned = archive_runs.iter().filter(|r| r.status == "failed").count();
    println!(
        "single runner: {} archive passes run by {:?} ({abandoned} abandoned by a killed instance, {skipped} \
         skipped), {} reconcile runs by {:?}; {archived} expired claims archived once",
        archive_runs.len(),
        runners(&archive_runs),
        reconcile_runs.len(),
        runners(&reconcile_runs)
    );
    for (_, service) in services {
        assert_eq!(tokio::task::block_in_place(|| service.terminate()).code(), Some(0));
    }
    scenario.close().await;
}
