//! Partitions over a real network. `idemgate serve` runs in a network namespace of its own
//! ([`idemgate_testkit::network`]), reaching the database, Redis, the broker and the name server
//! over a veth pair; a second instance of the same group runs in the machine's namespace.
//! Mid-stream, nftables rules drop every packet between the first instance and one service for
//! 30 s, then the partition heals. The producer's manifest, the books, the claims and the
//! delivery log are then held to the history checker's rules, and the reconciler must report
//! nothing.
//!
//! The README's test command cuts once per scenario; `IDEMGATE_FAULTS_LONG=1` cuts three times,
//! with 30 s of healed traffic between the cuts. Each scenario prints its figures (faults,
//! deliveries, duplicates by cause, time to recover after the heal, the checker's verdict);
//! docs/testing.md keeps them. A namespace or an nftables rule that cannot be made fails the
//! test: nothing here is skipped.

#[allow(dead_code)]
#[path = "../end_to_end/support.rs"]
mod support;

use std::collections::BTreeSet;
use std::sync::OnceLock;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use idemgate::config::Settings;
use idemgate::store::{Backend, Store, query_built};
use idemgate_shop::produce::ProduceReport;
use idemgate_testkit::broker::{BrokerOptions, LocalBroker};
use idemgate_testkit::history::Checked;
use idemgate_testkit::network::{Direction, Host, Network};
use idemgate_testkit::scratch::ScratchDb;
use sqlx::Row;
use support::*;

/// How long each partition lasts.
const PARTITION: Duration = Duration::from_secs(30);
/// Healed traffic between two partitions of the long form: long enough for a healed instance
/// to heartbeat the broker again (every 10 s here) and take its half of the queues back before
/// the next cut (at 15 s, the third cut from the broker found it holding none).
const BETWEEN: Duration = Duration::from_secs(30);
/// The producer's sends per second.
const RATE: u64 = 100;
/// How long the broker keeps a consumer it has not heard from; every instance here heartbeats
/// every [`HEARTBEAT_SECONDS`], so a partitioned one is dropped (and its queues handed to the
/// other) 15 to 25 s into the cut.
const CHANNEL_EXPIRED: Duration = Duration::from_secs(15);
const HEARTBEAT_SECONDS: u32 = 10;
/// How long the stream runs before the first cut: the second instance's start hands it half
/// the queues, and what the first had consumed of those without storing its offset comes again
/// to the second (about 11 s after the start, measured); the cut comes after that has settled,
/// so that a message consumed again after the cut is the cut's doing.
const LEAD: Duration = Duration::from_secs(20);
/// The partitioned instance's delivery deadline: a transaction it left open is ended by the
/// server this much (and a second) after its last statement.
const DELIVERY_TIMEOUT_MS: u64 = 10_000;

/// The private network of this test binary.
fn network() -> &'static Network {
    static NETWORK: OnceLock<Network> = OnceLock::new();
    NETWORK
        .get_or_init(|| Network::start().unwrap_or_else(|e| panic!("a private network is required: {e:#}")))
}

/// A broker that tells its clients the services host's address, which every host reaches.
fn broker() -> &'static LocalBroker {
    static BROKER: OnceLock<LocalBroker> = OnceLock::new();
    BROKER.get_or_init(|| {
        let options = BrokerOptions {
            advertise: Some(network().services()),
            channel_expired_timeout: Some(CHANNEL_EXPIRED),
            ..Default::default()
        };
        LocalBroker::start_with(options).unwrap_or_else(|e| panic!("a RocketMQ broker is required: {e:#}"))
    })
}

/// The port of a `host:port`.
fn port_of(addr: &str) -> u16 {
    addr.rsplit(':').next().and_then(|p| p.parse().ok()).unwrap_or_else(|| panic!("no port in {addr}"))
}

/// `url` (a database or Redis URL on the loopback) as a host of the network reaches it.
fn through_network(url: &str) -> String {
    let mut parsed = url::Url::parse(url).expect("a URL");
    parsed.set_host(Some(&network().services().to_string())).expect("a host");
    parsed.to_string()
}

/// Partitions per scenario: one in the README's test command, three with
/// `IDEMGATE_FAULTS_LONG=1`.
fn rounds() -> u32 {
    if std::env::var("IDEMGATE_FAULTS_LONG").is_ok_and(|v| v == "1") { 3 } else { 1 }
}

/// The settings both instances share: short bounds, so that a delivery cut off from the
/// database gives up (and its transaction is ended by the server) well inside the partition,
/// and a heartbeat the broker's short expiry allows.
fn tuned(mut s: Settings, group_commit: bool) -> Settings {
    s.consumer.max_reconsume_times = 16;
    s.rocketmq.heartbeat_interval_seconds = HEARTBEAT_SECONDS;
    s.consumer.delivery_timeout_ms = DELIVERY_TIMEOUT_MS;
    s.database.acquire_timeout_ms = 2_000;
    s.database.lock_timeout_ms = 1_000;
    s.database.statement_timeout_ms = 2_000;
    if group_commit { with_group_commit(s, 16) } else { s }
}

/// Transactions of the database's sessions that have sat idle for at least `secs` seconds: the
/// ones a client opened and can no longer finish.
async fn idle_transactions(store: &Store, secs: i64) -> i64 {
    let sql = match store.backend() {
        Backend::Postgres => {
            "SELECT COUNT(*) FROM pg_stat_activity WHERE datname = current_database() \
             AND state LIKE 'idle in transaction%' AND state_change <= now() - make_interval(secs => ?)"
        }
        Backend::MySql => {
            "SELECT COUNT(*) FROM information_schema.innodb_trx t \
             JOIN information_schema.processlist p ON p.id = t.trx_mysql_thread_id \
             WHERE p.db = DATABASE() AND p.command = 'Sleep' AND p.time >= ?"
        }
        Backend::Sqlite => unreachable!("SQLite has no network"),
    };
    let row = query_built(store.backend(), sql.to_owned())
        .bind(secs as f64)
        .fetch_one(store.pool())
        .await
        .expect("idle transactions");
    row.try_get::<i64, _>(0).expect("a count")
}

/// What a scenario measured, printed for docs/testing.md.
struct Figures {
    scenario: String,
    faults: usize,
    sends: usize,
    log_rows: i64,
    duplicates: std::collections::BTreeMap<String, i64>,
    recovered_after_heal: Duration,
    unlogged: f64,
    verdict: String,
    /// What only this scenario measures.
    extra: String,
}

impl std::fmt::Display for Figures {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "FIGURES {}: faults {}, sends {}, log rows {}, duplicates by cause {:?}, attempts unlogged {}, \
             books exact {:.1} s after the last heal, checker: {}{}",
            self.scenario,
            self.faults,
            self.sends,
            self.log_rows,
            self.duplicates,
            self.unlogged,
            self.recovered_after_heal.as_secs_f64(),
            self.verdict,
            self.extra
        )
    }
}

/// One scenario's run: instance `a` in a host of its own, instance `b` beside the services, the
/// producer sending throughout, and the partitions between `a` and one service.
struct Scenario {
    name: String,
    host: Host,
    db: ScratchDb,
    group: String,
    run: String,
    since_ms: i64,
    a: Service,
    b: Service,
    /// The instance ids the two write into the delivery log.
    ids: (String, String),
    producer: Option<JoinHandle<(ProduceReport, Vec<SendLine>)>>,
    /// When the last partition healed.
    healed: Option<Instant>,
}

/// What [`Scenario::finish`] read: the figures, the checker's verdict and the reconciler's.
struct Ending {
    figures: Figures,
    checked: Checked,
    reconciled: (Option<i32>, String),
}

impl Scenario {
    /// Starts both instances (`edit` shapes each one's settings, told whether it is the one in
    /// the host) and the producer, and lets the stream run [`LEAD`] before the first cut.
    async fn start(
        kind: &str,
        backend: Backend,
        group_commit: bool,
        edit: impl Fn(Settings, bool) -> Settings,
    ) -> Self {
        let name =
            format!("serve | {kind} ({backend:?}, group commit {})", if group_commit { "on" } else { "off" });
        let (net, broker) = (network(), broker());
        let host = net.host(&format!("serve-a {name}")).expect("a host for serve");
        let db = database(backend).await;
        // The test's own index, for `consumed_again_when`'s lookup of a message by its queue and
        // offset: without it that lookup reads the whole log for every row, minutes on MariaDB
        // by the third round, which would push the next cut past the end of the traffic.
        query_built(
            db.store.backend(),
            "CREATE INDEX test_queue_offset ON delivery_log (consumer_group, topic, queue_id, queue_offset)"
                .to_owned(),
        )
        .execute(db.store.pool())
        .await
        .expect("the test's queue-offset index");
        let (topic, group, run) = (unique("part"), unique("group"), unique("N").replace('_', ""));
        let inside_name_server = net.service(port_of(broker.name_server()));
        let inside = tuned(
            settings_on(&inside_name_server, &through_network(&db.url), &topic, &group, "a"),
            group_commit,
        );
        let mut a = edit(inside, true);
        a.http.bind = format!("{}:0", host.address());
        let b =
            edit(tuned(settings_on(broker.name_server(), &db.url, &topic, &group, "b"), group_commit), false);
        let ids = (a.identity().instance_id, b.identity().instance_id);
        let since_ms = idemgate::clock::now_ms() - 60_000;
        let service_a = Service::start_in(&host, BIN, &a);
        let service_b = Service::start(&b);
        // The lead before the first cut, the cuts and the healed spells between them, 4 s after.
        let rounds = u64::from(rounds());
        let count =
            RATE * (LEAD.as_secs() + rounds * PARTITION.as_secs() + (rounds - 1) * BETWEEN.as_secs() + 4);
        let producer = {
            let (name_server, topic, run) = (broker.name_server().to_owned(), topic.clone(), run.clone());
            std::thread::spawn(move || {
                let traffic = ["--duplicates", "0.3", "--poison", "0"];
                produce_on(&name_server, &topic, &run, count, RATE as u32, &traffic)
            })
        };
        tokio::time::sleep(LEAD).await;
        Self {
            name,
            host,
            db,
            group,
            run,
            since_ms,
            a: service_a,
            b: service_b,
            ids,
            producer: Some(producer),
            healed: None,
        }
    }

    /// Cuts `a` off from `ports` of the services host, both ways.
    fn cut(&self, what: &str, ports: &[u16]) -> Instant {
        self.host.partition(what, ports, Direction::Both).expect("the partition");
        Instant::now()
    }

    /// Waits out the partition begun at `cut`, heals it, and waits [`BETWEEN`] unless it was
    /// the last round.
    async fn heal_after(&mut self, cut: Instant, round: u32) {
        tokio::time::sleep(PARTITION.saturating_sub(cut.elapsed())).await;
        self.host.heal().expect("the heal");
        self.healed = Some(Instant::now());
        if round + 1 < rounds() {
            tokio::time::sleep(BETWEEN).await;
        }
    }

    /// Waits for the producer and the books, and reads what the run left: every send applied
    /// once (asserted here), every send logged (every first attempt when `logs_complete`: the
    /// partition left the log's database reachable), the history checker's verdict and the
    /// reconciler's.
    async fn finish(&mut self, logs_complete: bool) -> Ending {
        let (report, sends) = self.producer.take().expect("one finish").join().expect("producer thread");
        let expected = expected_books(&report);
        let store = &self.db.store;
        let books = wait_for_books(store, &self.run, &self.group, &expected, Duration::from_secs(240)).await;
        let recovered_after_heal = self.healed.expect("a heal").elapsed();
        assert_eq!(
            books,
            expected,
            "{}: troubled deliveries:\n{}",
            self.name,
            trouble(store, &self.group).await
        );
        let unlogged = unlogged_attempts(&[&self.a, &self.b]);
        if logs_complete {
            assert_every_send_is_logged(store, &self.group, &sends).await;
        } else {
            assert_every_send_is_logged_or_counted(store, &self.group, &sends, unlogged).await;
        }
        let reconciled = reconcile(&self.db.url, &self.group);
        let checked = check_history(store, &self.group, &self.run, &sends, self.since_ms).await;
        let figures = Figures {
            scenario: self.name.clone(),
            faults: network().faults().iter().filter(|f| f.host == self.host.label()).count(),
            sends: sends.len(),
            log_rows: log_rows(store, &self.group).await,
            duplicates: duplicates_by_cause(store, &self.group).await,
            recovered_after_heal,
            unlogged,
            verdict: if checked.is_valid() { "valid".to_owned() } else { "INVALID".to_owned() },
            extra: String::new(),
        };
        Ending { figures, checked, reconciled }
    }

    /// Prints the figures, holds the run to the reconciler and the checker, and stops both
    /// instances, which must exit cleanly.
    async fn close(self, ending: Ending) {
        let Ending { figures, checked, reconciled: (code, text) } = ending;
        println!("{figures}\n{checked}{}", network().report());
        assert_eq!(code, Some(0), "{}: the reconciler found anomalies:\n{text}", self.name);
        assert!(checked.is_valid(), "{}:\n{checked}\n{}", self.name, network().report());
        for service in [self.a, self.b] {
            let exit = service.terminate();
            assert_eq!(exit.code(), Some(0), "{}", exit.log);
        }
        drop(self.host);
        self.db.drop_now().await;
    }

    /// The deliveries logged from `from` until `until` (ms since 1970) of a message (the same
    /// queue and offset) that the other instance had logged before: what the broker consumed
    /// again after a queue changed hands, as opposed to the producer's own copies, which are new
    /// messages. With when the first and the last of them were logged, in seconds after `from`.
    async fn consumed_again_when(&self, from: i64, until: i64) -> (i64, Option<f64>, Option<f64>) {
        let row = query_built(
            self.db.store.backend(),
            "SELECT COUNT(*), MIN(d.logged_at_ms), MAX(d.logged_at_ms) FROM delivery_log d WHERE d.consumer_group = ? AND d.logged_at_ms >= ? \
             AND d.logged_at_ms < ? AND EXISTS (SELECT 1 FROM delivery_log p WHERE p.consumer_group = d.consumer_group \
             AND p.topic = d.topic AND p.queue_id = d.queue_id AND p.queue_offset = d.queue_offset \
             AND p.instance_id <> d.instance_id AND p.id < d.id)"
                .to_owned(),
        )
        .bind(self.group.clone())
        .bind(from)
        .bind(until)
        .fetch_one(self.db.store.pool())
        .await
        .expect("the messages consumed again");
        let after =
            |i| row.try_get::<Option<i64>, _>(i).expect("a time").map(|ms| (ms - from) as f64 / 1_000.0);
        (row.try_get::<i64, _>(0).expect("a count"), after(1), after(2))
    }

    /// The queues each of `a` and `b` logged a delivery of between `from` and `to` (ms since
    /// 1970).
    async fn queues_between(&self, from: i64, to: i64) -> (BTreeSet<i32>, BTreeSet<i32>) {
        let rows = query_built(
            self.db.store.backend(),
            "SELECT DISTINCT instance_id, queue_id FROM delivery_log \
             WHERE consumer_group = ? AND logged_at_ms >= ? AND logged_at_ms < ?"
                .to_owned(),
        )
        .bind(self.group.clone())
        .bind(from)
        .bind(to)
        .fetch_all(self.db.store.pool())
        .await
        .expect("the queues");
        let of = |id: &str| {
            rows.iter().filter(|r| r.get::<String, _>(0) == id).map(|r| r.get::<i32, _>(1)).collect()
        };
        (of(&self.ids.0), of(&self.ids.1))
    }
}

async fn log_rows(store: &Store, group: &str) -> i64 {
    query_built(store.backend(), "SELECT COUNT(*) FROM delivery_log WHERE consumer_group = ?".to_owned())
        .bind(group.to_owned())
        .fetch_one(store.pool())
        .await
        .expect("log rows")
        .try_get::<i64, _>(0)
        .expect("a count")
}

/// Polls `/metrics` of `service` for the sum of `name`'s samples that carry `with`.
fn metric(service: &Service, name: &str, with: &str) -> f64 {
    let (status, text) = http_get(&service_addr(service), "/metrics").expect("/metrics answers");
    assert_eq!(status, 200);
    text.lines()
        .filter(|l| l.starts_with(name) && l.contains(with))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum()
}

/// The TTLs of the Redis keys under `prefix`: −1 for a key that never expires.
fn redis_ttls(prefix: &str) -> Vec<i64> {
    let script = "local out = {} for _, k in ipairs(redis.call('KEYS', ARGV[1])) do \
                  table.insert(out, redis.call('TTL', k)) end return out";
    let output = std::process::Command::new("redis-cli")
        .args(["-h", "127.0.0.1", "-p", "6379", "EVAL", script, "0", &format!("{prefix}*")])
        .output()
        .expect("redis-cli (the Redis server's client) is required");
    assert!(output.status.success(), "redis-cli: {}", String::from_utf8_lossy(&output.stderr));
    String::from_utf8_lossy(&output.stdout).lines().filter_map(|l| l.trim().parse().ok()).collect()
}

/// `serve` cut off from the database both ways for 30 s mid-stream, while another instance of
/// the group goes on: the transactions the cut-off instance left open are ended by the server
/// within the delivery deadline and a second, so they hold no claim the other instance waits
/// for; after the heal everything converges, applied once, logged, reconciled clean.
async fn serve_partitioned_from_the_database(backend: Backend, group_commit: bool) {
    let mut s = Scenario::start("database", backend, group_commit, |s, _| s).await;
    let db_port = url::Url::parse(&s.db.url).ok().and_then(|u| u.port()).unwrap_or(match backend {
        Backend::Postgres => 5432,
        _ => 3306,
    });
    let (mut idle_at_cut, mut still_idle) = (Vec::new(), Vec::new());
    for round in 0..rounds() {
        // The cut comes while the instance's deductions are inside their transactions: the test
        // holds every stock row for a moment, the deductions that arrive wait on it after their
        // claim, and the cut falls in that wait. When the test lets go, the server finishes
        // those statements and their answers are lost: transactions the instance can neither
        // commit nor roll back, holding the claims and the stock rows the other instance needs.
        let mut holder = s.db.store.pool().begin().await.expect("a transaction");
        query_built(backend, "SELECT sku FROM shop_stock FOR UPDATE".to_owned())
            .fetch_all(&mut *holder)
            .await
            .expect("the stock rows held");
        tokio::time::sleep(Duration::from_millis(500)).await;
        let cut = s.cut("the database", &[db_port]);
        tokio::time::sleep(Duration::from_millis(300)).await;
        holder.rollback().await.expect("the stock rows let go");
        tokio::time::sleep(Duration::from_secs(2)).await;
        idle_at_cut.push(idle_transactions(&s.db.store, 1).await);
        // The server ends what the cut-off instance left open once it has sat idle past the
        // delivery deadline and a second (MariaDB counts whole seconds): nothing older remains.
        let ended_by = Duration::from_millis(DELIVERY_TIMEOUT_MS) + Duration::from_secs(4);
        tokio::time::sleep(ended_by.saturating_sub(cut.elapsed())).await;
        still_idle.push(idle_transactions(&s.db.store, (DELIVERY_TIMEOUT_MS / 1_000 + 2) as i64).await);
        s.heal_after(cut, round).await;
    }
    let mut ending = s.finish(false).await;
    let felt = metric(&s.a, "idemgate_deliveries_total", "outcome=\"failed\"")
        + metric(&s.a, "idemgate_group_retries_total", "")
        + metric(&s.a, "idemgate_group_commits_total", "result=\"split\"");
    ending.figures.extra =
        format!(", idle transactions 2 s after each cut {idle_at_cut:?}, past the deadline {still_idle:?}");
    let figures = &ending.figures;
    assert!(
        idle_at_cut.iter().all(|n| *n > 0),
        "{}: a cut left no transaction open, so it tested nothing\n{figures}",
        s.name
    );
    assert!(
        still_idle.iter().all(|n| *n == 0),
        "{}: transactions left open by the cut-off instance outlived the delivery deadline\n{figures}",
        s.name
    );
    assert!(
        felt > 0.0,
        "{}: the partition left no trace in the cut-off instance's metrics\n{figures}",
        s.name
    );
    s.close(ending).await;
}

/// `serve` with the Redis pre-filter on, cut off from Redis both ways for 30 s mid-stream while
/// another instance goes on: the cut-off instance falls back to the database (the unique index
/// decides), no key is left owned without an expiry, nothing is skipped wrongly, and the books
/// are exact.
async fn serve_partitioned_from_redis(backend: Backend, group_commit: bool) {
    const TTL_SECONDS: u64 = 120;
    let prefix = format!("{}:", unique("partition"));
    let mut s = Scenario::start("Redis", backend, group_commit, |mut s, inside| {
        s.redis.url = if inside {
            through_network("redis://127.0.0.1:6379")
        } else {
            "redis://127.0.0.1:6379".to_owned()
        };
        s.redis.biz_types = vec!["*".to_owned()];
        s.redis.ttl_seconds = TTL_SECONDS;
        s.redis.timeout_ms = 200;
        s.redis.cooldown_ms = 500;
        s.redis.key_prefix = prefix.clone();
        s
    })
    .await;
    for round in 0..rounds() {
        let cut = s.cut("Redis", &[6379]);
        s.heal_after(cut, round).await;
    }
    let mut ending = s.finish(true).await;
    let fallbacks = metric(&s.a, "idemgate_prefilter_fallbacks_total", "");
    let ttls = redis_ttls(&prefix);
    ending.figures.extra =
        format!(", pre-filter fallbacks of the cut-off instance {fallbacks}, Redis keys {}", ttls.len());
    let figures = &ending.figures;
    assert!(fallbacks > 0.0, "{}: the cut-off instance never fell back to the database\n{figures}", s.name);
    assert!(!ttls.is_empty(), "{}: no Redis key under {prefix}", s.name);
    let forever = ttls.iter().filter(|t| **t < 0 || **t > TTL_SECONDS as i64).count();
    assert_eq!(
        forever,
        0,
        "{}: {forever} of {} Redis keys have no expiry within the TTL",
        s.name,
        ttls.len()
    );
    s.close(ending).await;
}

/// `serve` cut off from the broker both ways for 30 s mid-stream: its pulls stop and the
/// offsets it has consumed never reach the broker (the acks are lost); the broker stops hearing
/// its heartbeats, drops it, and hands its queues to the other instance, which consumes them
/// again from the last stored offsets. After the heal the cut-off instance rejoins and the
/// queues are shared out again. Every redelivered send is a duplicate, applied once.
async fn serve_partitioned_from_the_broker(backend: Backend, group_commit: bool) {
    let mut s = Scenario::start("broker", backend, group_commit, |s, _| s).await;
    let broker_port = port_of(&broker().broker_addr());
    // The broker listens on its port and on its fast port, two below.
    let ports = [broker_port, broker_port - 2];
    let (mut moved, mut cuts) = (Vec::new(), Vec::new());
    for round in 0..rounds() {
        let before = idemgate::clock::now_ms();
        let (held_by_a, _) = s.queues_between(before - 5_000, before).await;
        let cut = s.cut("the broker", &ports);
        let cut_ms = idemgate::clock::now_ms();
        s.heal_after(cut, round).await;
        // The queues `a` held before the cut that `b` consumed during it, and the messages
        // consumed again since the cut: those whose offsets `a` never got to store.
        let (_, taken_by_b) = s.queues_between(cut_ms, cut_ms + PARTITION.as_millis() as i64).await;
        moved.push(held_by_a.intersection(&taken_by_b).count());
        cuts.push(cut_ms);
    }
    let mut ending = s.finish(true).await;
    // The messages consumed again from each cut until the next one (the last: until the end).
    let mut again = Vec::new();
    for (i, from) in cuts.iter().enumerate() {
        let until = cuts.get(i + 1).copied().unwrap_or(i64::MAX);
        again.push(s.consumed_again_when(*from, until).await.0);
    }
    ending.figures.extra = format!(
        ", queues of the cut-off instance handed to the other in each cut {moved:?}, messages consumed again \
         by the other instance from each cut until the next {again:?}"
    );
    let figures = &ending.figures;
    assert!(
        moved.iter().all(|n| *n > 0),
        "{}: the broker never handed the cut-off instance's queues to the other one\n{figures}",
        s.name
    );
    assert!(
        again.iter().all(|n| *n > 0),
        "{}: the lost acks brought no message back to the other instance\n{figures}",
        s.name
    );
    s.close(ending).await;
}

/// `serve` cut off from the name server both ways for 30 s while the broker stays reachable: it
/// cannot refresh its routes, and goes on consuming through the routes it has.
async fn serve_partitioned_from_the_name_server(backend: Backend, group_commit: bool) {
    let mut s = Scenario::start("name server", backend, group_commit, |s, _| s).await;
    let name_server_port = port_of(broker().name_server());
    let mut consumed = Vec::new();
    let first_cut_ms = idemgate::clock::now_ms();
    for round in 0..rounds() {
        let cut = s.cut("the name server", &[name_server_port]);
        let cut_ms = idemgate::clock::now_ms();
        s.heal_after(cut, round).await;
        let (by_a, _) = s.queues_between(cut_ms + 5_000, cut_ms + PARTITION.as_millis() as i64).await;
        consumed.push(by_a.len());
    }
    let mut ending = s.finish(true).await;
    let (again, first, last) = s.consumed_again_when(first_cut_ms, i64::MAX).await;
    ending.figures.extra = format!(
        ", queues the cut-off instance consumed during each cut {consumed:?}, messages consumed again by the \
         other instance since the cut {again} (from {first:?} to {last:?} s after it)"
    );
    let figures = &ending.figures;
    assert!(
        consumed.iter().all(|n| *n > 0),
        "{}: the instance cut off from the name server stopped consuming\n{figures}",
        s.name
    );
    assert_eq!(
        again, 0,
        "{}: no queue changed hands, so the broker consumed nothing again\n{figures}",
        s.name
    );
    s.close(ending).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_serve_partitioned_from_redis() {
    serve_partitioned_from_redis(Backend::Postgres, false).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mariadb_serve_partitioned_from_redis_with_group_commit() {
    serve_partitioned_from_redis(Backend::MySql, true).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_serve_partitioned_from_the_database() {
    serve_partitioned_from_the_database(Backend::Postgres, false).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_serve_partitioned_from_the_database_with_group_commit() {
    serve_partitioned_from_the_database(Backend::Postgres, true).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mariadb_serve_partitioned_from_the_database() {
    serve_partitioned_from_the_database(Backend::MySql, false).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mariadb_serve_partitioned_from_the_database_with_group_commit() {
    serve_partitioned_from_the_database(Backend::MySql, true).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_serve_partitioned_from_the_broker_hands_its_queues_over_and_back() {
    serve_partitioned_from_the_broker(Backend::Postgres, false).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mariadb_serve_partitioned_from_the_broker_with_group_commit() {
    serve_partitioned_from_the_broker(Backend::MySql, true).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_serve_partitioned_from_the_name_server_goes_on_consuming() {
    serve_partitioned_from_the_name_server(Backend::Postgres, true).await;
}

/// Whether a program in `host` connects to `port` of the services host within a second.
fn connects(host: &Host, port: u16) -> bool {
    let probe = format!("exec 3<>/dev/tcp/{}/{port}", network().services());
    let output =
        host.command("timeout").args(["1", "bash", "-c", &probe]).output().expect("run bash in the host");
    if !output.status.success() {
        eprintln!(
            "{}: {probe}: {} {}",
            host.label(),
            output.status,
            String::from_utf8_lossy(&output.stderr).trim()
        );
    }
    output.status.success()
}

#[test]
fn a_host_reaches_the_loopback_services_until_a_partition_drops_its_packets_and_again_after_the_heal() {
    let net = network();
    let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("a loopback listener");
    let port = listener.local_addr().expect("its address").port();
    let other = std::net::TcpListener::bind("127.0.0.1:0").expect("a second listener");
    let other_port = other.local_addr().expect("its address").port();
    let host = net.host("probe").expect("a host");
    assert!(
        connects(&host, port),
        "a host reaches a server bound to the loopback through the services address"
    );
    host.partition("the listener", &[port], Direction::Outbound).expect("the partition");
    assert!(!connects(&host, port), "the partition drops the connection's packets");
    assert!(connects(&host, other_port), "a partition takes only the ports it names");
    host.heal().expect("the heal");
    assert!(connects(&host, port), "the heal restores it");
    host.partition("the listener", &[port], Direction::Inbound).expect("the partition");
    assert!(!connects(&host, port), "the answers are dropped: no connection completes");
    host.heal().expect("the heal");
    let faults = net.faults().into_iter().filter(|f| f.host == "probe").collect::<Vec<_>>();
    assert_eq!(faults.len(), 4, "{}", net.report());
    assert!(faults[0].what.contains("outbound") && faults[2].what.contains("inbound"), "{}", net.report());
    let namespace = std::path::Path::new("/run/netns").join(host.namespace());
    assert!(namespace.exists(), "{}", namespace.display());
    drop(host);
    assert!(!namespace.exists(), "dropping a host removes its namespace, {}", namespace.display());
}
