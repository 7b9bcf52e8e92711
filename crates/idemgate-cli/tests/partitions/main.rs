//! Partitions over a real network. `idemgate serve` runs in a network namespace of its own
//! ([`idemgate_testkit::network`]), reaching the database, Redis and the RocketMQ servers over a
//! veth pair; a second instance of the same group runs in the machine's namespace. Mid-stream,
//! nftables rules drop every packet between the first instance and one service for 30 s, then
//! the partition heals. The producer's manifest, the books, the claims and the delivery log are
//! then held to the history checker's rules, and the reconciler must report nothing.
//!
//! Each scenario prints its figures (faults, deliveries, duplicates by cause, time to recover
//! after the heal, the checker's verdict); docs/testing.md keeps them. A namespace or an
//! nftables rule that cannot be made fails the test: nothing here is skipped.

#[allow(dead_code)]
#[path = "../end_to_end/support.rs"]
mod support;

use std::sync::OnceLock;
use std::time::{Duration, Instant};

use idemgate::config::Settings;
use idemgate::store::{Backend, Store, query_built};
use idemgate_testkit::broker::{BrokerOptions, LocalBroker};
use idemgate_testkit::history::{self, History, Sent, Source};
use idemgate_testkit::network::{Direction, Host, Network};
use idemgate_testkit::scratch::ScratchDb;
use sqlx::Row;
use support::*;

/// How long each partition lasts.
const PARTITION: Duration = Duration::from_secs(30);
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
        let options = BrokerOptions { advertise: Some(network().services()), ..Default::default() };
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

/// The settings both instances share: short bounds, so that a delivery cut off from the
/// database gives up (and its transaction is ended by the server) well inside the partition.
fn tuned(mut s: Settings, group_commit: bool) -> Settings {
    s.consumer.max_reconsume_times = 16;
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

/// The stock deductions of the manifest, as the checker's sends.
fn deductions_sent(sends: &[SendLine]) -> Vec<Sent> {
    sends
        .iter()
        // A malformed send is refused as invalid by design, and poison dead-lettered: neither
        // has an effect to check.
        .filter(|s| {
            s.tags == idemgate_shop::TAG_STOCK_DEDUCT && !matches!(s.kind.as_str(), "malformed" | "poison")
        })
        .filter_map(|s| {
            Some(Sent {
                biz_id: s.keys.first()?.clone(),
                uniq_key: s.uniq_key.clone(),
                msg_id: s.uniq_key.clone(),
            })
        })
        .collect()
}

/// The history checker over the run's stock deductions, with the reconciler over the window.
async fn check_history(
    db: &ScratchDb,
    group: &str,
    run: &str,
    sends: &[SendLine],
    since_ms: i64,
) -> history::Checked {
    let effects = format!(
        "SELECT deduction_id, COUNT(*) FROM shop_stock_ledger WHERE deduction_id LIKE '{run}-D-%' GROUP BY deduction_id"
    );
    let source = Source {
        consumer_group: group,
        biz_type: idemgate_shop::STOCK_DEDUCT,
        effects_sql: &effects,
        since_ms,
    };
    let history =
        History::read_broker_run(&db.store, &source, deductions_sent(sends)).await.expect("the history");
    history::check(&history)
}

/// What a scenario measured, printed for docs/testing.md.
struct Figures {
    scenario: String,
    faults: usize,
    sends: usize,
    log_rows: i64,
    duplicates: std::collections::BTreeMap<String, i64>,
    recovered_after_heal: Duration,
    /// Transactions left open 2 s after a cut from the database; `None` for other cuts.
    idle_at_cut: Option<i64>,
    unlogged: f64,
    verdict: String,
}

impl std::fmt::Display for Figures {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "FIGURES {}: faults {}, sends {}, log rows {}, duplicates by cause {:?}, idle transactions 2 s after the cut {:?}, \
             attempts unlogged {}, books exact {:.1} s after the heal, checker: {}",
            self.scenario,
            self.faults,
            self.sends,
            self.log_rows,
            self.duplicates,
            self.idle_at_cut,
            self.unlogged,
            self.recovered_after_heal.as_secs_f64(),
            self.verdict
        )
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

/// The sends with no delivery-log row at all, and how many sends have no row of their first
/// attempt (reconsume count 0).
async fn unlogged_sends(store: &Store, group: &str, sends: &[SendLine]) -> (Vec<String>, usize) {
    let rows = query_built(
        store.backend(),
        "SELECT uniq_key, MIN(reconsume_times) FROM delivery_log WHERE consumer_group = ? GROUP BY uniq_key"
            .to_owned(),
    )
    .bind(group.to_owned())
    .fetch_all(store.pool())
    .await
    .expect("the log's sends");
    let first: std::collections::BTreeMap<String, i32> =
        rows.iter().map(|r| (r.get::<String, _>(0), r.get::<i32, _>(1))).collect();
    let keys: std::collections::BTreeSet<&str> = sends.iter().map(|s| s.uniq_key.as_str()).collect();
    let never = keys.iter().filter(|k| !first.contains_key(**k)).map(|k| (*k).to_owned()).collect();
    let late = keys.iter().filter(|k| first.get(**k).is_some_and(|r| *r > 0)).count();
    (never, late)
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

/// `serve` cut off from the database both ways for 30 s mid-stream, while another instance of
/// the group goes on: the transactions the cut-off instance left open are ended by the server
/// within the delivery deadline and a second, so they hold no claim the other instance waits
/// for; after the heal everything converges, applied once, logged, reconciled clean.
async fn serve_partitioned_from_the_database(backend: Backend, group_commit: bool) {
    let scenario =
        format!("serve | database ({backend:?}, group commit {})", if group_commit { "on" } else { "off" });
    let (net, broker) = (network(), broker());
    let host: Host = net.host(&format!("serve-a {scenario}")).expect("a host for serve");
    let db = database(backend).await;
    let (topic, group, run) = (unique("part"), unique("group"), unique("N").replace('_', ""));
    let inside_name_server = net.service(port_of(broker.name_server()));
    let mut a =
        tuned(settings_on(&inside_name_server, &through_network(&db.url), &topic, &group, "a"), group_commit);
    a.http.bind = format!("{}:0", host.address());
    let b = tuned(settings_on(broker.name_server(), &db.url, &topic, &group, "b"), group_commit);
    let since_ms = idemgate::clock::now_ms() - 60_000;
    let service_a = Service::start_in(&host, BIN, &a);
    let service_b = Service::start(&b);
    let producer = {
        let (name_server, topic, run) = (broker.name_server().to_owned(), topic.clone(), run.clone());
        std::thread::spawn(move || {
            produce_on(&name_server, &topic, &run, 4000, 100, &["--duplicates", "0.3", "--poison", "0"])
        })
    };
    tokio::time::sleep(Duration::from_secs(6)).await;
    let db_port = url::Url::parse(&db.url).ok().and_then(|u| u.port()).unwrap_or(match backend {
        Backend::Postgres => 5432,
        _ => 3306,
    });
    // The cut comes while the instance's deductions are inside their transactions: the test
    // holds every stock row for a moment, the deductions that arrive wait on it after their
    // claim, and the cut falls in that wait. When the test lets go, the server finishes those
    // statements and their answers are lost: transactions the instance can neither commit nor
    // roll back, holding the claims and the stock rows the other instance needs.
    let mut holder = db.store.pool().begin().await.expect("a transaction");
    query_built(backend, "SELECT sku FROM shop_stock FOR UPDATE".to_owned())
        .fetch_all(&mut *holder)
        .await
        .expect("the stock rows held");
    tokio::time::sleep(Duration::from_millis(500)).await;
    host.partition("the database", &[db_port], Direction::Both).expect("the partition");
    let cut = Instant::now();
    tokio::time::sleep(Duration::from_millis(300)).await;
    holder.rollback().await.expect("the stock rows let go");
    tokio::time::sleep(Duration::from_secs(2)).await;
    let idle_at_cut = idle_transactions(&db.store, 1).await;
    // The server ends what the cut-off instance left open once it has sat idle past the
    // delivery deadline and a second (MariaDB counts whole seconds): nothing older remains.
    let ended_by = Duration::from_millis(DELIVERY_TIMEOUT_MS) + Duration::from_secs(4);
    tokio::time::sleep(ended_by.saturating_sub(cut.elapsed())).await;
    let still_idle = idle_transactions(&db.store, (DELIVERY_TIMEOUT_MS / 1_000 + 2) as i64).await;
    tokio::time::sleep(PARTITION.saturating_sub(cut.elapsed())).await;
    host.heal().expect("the heal");
    let healed = Instant::now();
    let (report, sends) = producer.join().expect("producer thread");
    let expected = expected_books(&report);
    let books = wait_for_books(&db.store, &run, &group, &expected, Duration::from_secs(240)).await;
    let recovered_after_heal = healed.elapsed();
    assert_eq!(books, expected, "{scenario}: troubled deliveries:\n{}", trouble(&db.store, &group).await);
    // An attempt made while the log's database was out of reach has no row: it is counted
    // unlogged and not acknowledged, and a later attempt of the same send is logged.
    let unlogged = metric(&service_a, "idemgate_unlogged_deliveries_total", "")
        + metric(&service_b, "idemgate_unlogged_deliveries_total", "");
    let (never_logged, first_unlogged) = unlogged_sends(&db.store, &group, &sends).await;
    assert!(never_logged.is_empty(), "{scenario}: sends with no delivery-log row at all: {never_logged:?}");
    assert!(
        first_unlogged as f64 <= unlogged,
        "{scenario}: {first_unlogged} sends have no first-attempt row, but only {unlogged} attempts were counted unlogged"
    );
    let (code, text) = reconcile(&db.url, &group);
    let checked = check_history(&db, &group, &run, &sends, since_ms).await;
    let felt = metric(&service_a, "idemgate_deliveries_total", "outcome=\"failed\"")
        + metric(&service_a, "idemgate_group_retries_total", "")
        + metric(&service_a, "idemgate_group_commits_total", "result=\"split\"");
    let figures = Figures {
        scenario: scenario.clone(),
        faults: net.faults().iter().filter(|f| f.host == host.label()).count(),
        sends: sends.len(),
        log_rows: log_rows(&db.store, &group).await,
        duplicates: duplicates_by_cause(&db.store, &group).await,
        recovered_after_heal,
        idle_at_cut: Some(idle_at_cut),
        unlogged,
        verdict: if checked.is_valid() { "valid".to_owned() } else { "INVALID".to_owned() },
    };
    println!("{figures}\n{checked}{}", net.report());
    assert!(idle_at_cut > 0, "{scenario}: the cut left no transaction open, so it tested nothing\n{figures}");
    assert_eq!(
        still_idle, 0,
        "{scenario}: transactions left open by the cut-off instance outlived the delivery deadline\n{figures}"
    );
    assert!(
        felt > 0.0,
        "{scenario}: the partition left no trace in the cut-off instance's metrics\n{figures}"
    );
    assert_eq!(code, Some(0), "{scenario}: the reconciler found anomalies:\n{text}");
    assert!(checked.is_valid(), "{scenario}:\n{checked}\n{}", net.report());
    for service in [service_a, service_b] {
        let exit = service.terminate();
        assert_eq!(exit.code(), Some(0), "{}", exit.log);
    }
    drop(host);
    db.drop_now().await;
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

/// `serve` with the Redis pre-filter on, cut off from Redis both ways for 30 s mid-stream while
/// another instance goes on: the cut-off instance falls back to the database (the unique index
/// decides), no key is left owned without an expiry, nothing is skipped wrongly, and the books
/// are exact.
async fn serve_partitioned_from_redis(backend: Backend, group_commit: bool) {
    const TTL_SECONDS: u64 = 120;
    let scenario =
        format!("serve | Redis ({backend:?}, group commit {})", if group_commit { "on" } else { "off" });
    let (net, broker) = (network(), broker());
    let host: Host = net.host(&format!("serve-a {scenario}")).expect("a host for serve");
    let db = database(backend).await;
    let (topic, group, run) = (unique("redispart"), unique("group"), unique("R").replace('_', ""));
    let prefix = format!("{}:", unique("partition"));
    let with_redis = |mut s: Settings, url: &str| {
        s.redis.url = url.to_owned();
        s.redis.biz_types = vec!["*".to_owned()];
        s.redis.ttl_seconds = TTL_SECONDS;
        s.redis.timeout_ms = 200;
        s.redis.cooldown_ms = 500;
        s.redis.key_prefix = prefix.clone();
        s
    };
    let inside_name_server = net.service(port_of(broker.name_server()));
    let mut a = with_redis(
        tuned(settings_on(&inside_name_server, &through_network(&db.url), &topic, &group, "a"), group_commit),
        &through_network("redis://127.0.0.1:6379"),
    );
    a.http.bind = format!("{}:0", host.address());
    let b = with_redis(
        tuned(settings_on(broker.name_server(), &db.url, &topic, &group, "b"), group_commit),
        "redis://127.0.0.1:6379",
    );
    let since_ms = idemgate::clock::now_ms() - 60_000;
    let service_a = Service::start_in(&host, BIN, &a);
    let service_b = Service::start(&b);
    let producer = {
        let (name_server, topic, run) = (broker.name_server().to_owned(), topic.clone(), run.clone());
        std::thread::spawn(move || {
            produce_on(&name_server, &topic, &run, 4000, 100, &["--duplicates", "0.3", "--poison", "0"])
        })
    };
    tokio::time::sleep(Duration::from_secs(6)).await;
    host.partition("Redis", &[6379], Direction::Both).expect("the partition");
    tokio::time::sleep(PARTITION).await;
    host.heal().expect("the heal");
    let healed = Instant::now();
    let (report, sends) = producer.join().expect("producer thread");
    let expected = expected_books(&report);
    let books = wait_for_books(&db.store, &run, &group, &expected, Duration::from_secs(240)).await;
    let recovered_after_heal = healed.elapsed();
    assert_eq!(books, expected, "{scenario}: troubled deliveries:\n{}", trouble(&db.store, &group).await);
    assert_every_send_is_logged(&db.store, &group, &sends).await;
    let (code, text) = reconcile(&db.url, &group);
    let checked = check_history(&db, &group, &run, &sends, since_ms).await;
    let fallbacks = metric(&service_a, "idemgate_prefilter_fallbacks_total", "");
    let ttls = redis_ttls(&prefix);
    let figures = Figures {
        scenario: scenario.clone(),
        faults: net.faults().iter().filter(|f| f.host == host.label()).count(),
        sends: sends.len(),
        log_rows: log_rows(&db.store, &group).await,
        duplicates: duplicates_by_cause(&db.store, &group).await,
        recovered_after_heal,
        idle_at_cut: None,
        unlogged: metric(&service_a, "idemgate_unlogged_deliveries_total", "")
            + metric(&service_b, "idemgate_unlogged_deliveries_total", ""),
        verdict: if checked.is_valid() { "valid".to_owned() } else { "INVALID".to_owned() },
    };
    println!(
        "{figures}, pre-filter fallbacks of the cut-off instance {fallbacks}, Redis keys {}\n{checked}{}",
        ttls.len(),
        net.report()
    );
    assert!(fallbacks > 0.0, "{scenario}: the cut-off instance never fell back to the database\n{figures}");
    assert!(!ttls.is_empty(), "{scenario}: no Redis key under {prefix}");
    let forever = ttls.iter().filter(|t| **t < 0 || **t > TTL_SECONDS as i64).count();
    assert_eq!(
        forever,
        0,
        "{scenario}: {forever} of {} Redis keys have no expiry within the TTL",
        ttls.len()
    );
    assert_eq!(code, Some(0), "{scenario}: the reconciler found anomalies:\n{text}");
    assert!(checked.is_valid(), "{scenario}:\n{checked}\n{}", net.report());
    for service in [service_a, service_b] {
        let exit = service.terminate();
        assert_eq!(exit.code(), Some(0), "{}", exit.log);
    }
    drop(host);
    db.drop_now().await;
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
