//! A production cluster's security and tenancy, against a private broker with authentication
//! and authorization on: `idemgate serve` consumes as an account with the rights
//! docs/running.md lists, a wrong secret or a missing subscribe right stops it at start with a
//! message that names the broker and the account and never the secret, the consumer lag is
//! read with the rights listed for it, replay sends as the account, and with message trace on
//! the consumption is in the trace topic as the Java client writes it. Then two namespaces on
//! one (open) broker: each service consumes only its own topic of the same name.

use std::process::{Command, Stdio};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use idemgate::broker::lag::ReadResult;
use idemgate::broker::rocketmq::LagProbe;
use idemgate::broker::{BrokerAccess, DEFAULT_TRACE_TOPIC, Producer, SecretKey};
use idemgate::config::Settings;
use idemgate::store::Backend;
use idemgate_testkit::broker::{BrokerOptions, LocalBroker, Right, SuperUser};

use super::support::*;

const ADMIN: &str = "idemgate_admin";
const ADMIN_SECRET: &str = "admin-Secret-4711";
/// Every user's secret in these tests: long and odd enough to be found if it leaked.
const SECRET: &str = "s3cret-Zebra-9931";

/// The secured broker the tests of this file share, each with its own users, topics and groups.
fn secured() -> &'static LocalBroker {
    static BROKER: OnceLock<LocalBroker> = OnceLock::new();
    BROKER.get_or_init(|| {
        LocalBroker::start_with(BrokerOptions {
            auth: Some(SuperUser { name: ADMIN.to_owned(), secret: ADMIN_SECRET.to_owned() }),
            trace_topic: Some(DEFAULT_TRACE_TOPIC.to_owned()),
            ..Default::default()
        })
        .unwrap_or_else(|e| panic!("a secured RocketMQ broker is required: {e:#}"))
    })
}

/// What the service's account needs to consume `topic` as `group`: SUB on both. PUB on the
/// topic is for replay.
fn consume_rights(topic: &str, group: &str) -> Vec<Right> {
    vec![
        Right::new(format!("Topic:{topic}"), &["Sub", "Pub"]),
        Right::new(format!("Group:{group}"), &["Sub"]),
    ]
}

/// `s` signed as `user` with [`SECRET`].
fn signed(mut s: Settings, user: &str) -> Settings {
    s.rocketmq.access_key = user.to_owned();
    s.rocketmq.secret_key = SecretKey::new(SECRET);
    s
}

/// The settings of one `serve` on the secured broker, signed as `user`.
fn secured_settings(db_url: &str, topic: &str, group: &str, user: &str) -> Settings {
    let mut s = signed(settings_on(secured().name_server(), db_url, topic, group, "acl"), user);
    s.consumer.max_reconsume_times = 2;
    s
}

/// Creates `topic` on the secured broker by a first message to it (an order of its own), as
/// the super user, so that the start-up check has a route to check.
async fn create_topic(topic: &str) {
    let producer = Producer::start(&secured().access(), &unique("pgroup")).await.expect("producer");
    producer.send(&order(topic, &unique("FIRST"), 100)).await.expect("the first send");
    producer.shutdown().await;
}

/// Runs `idemgate-shop serve` with `settings` until it exits (within 60 s): its exit code and
/// everything it printed.
fn serve_until_it_exits(settings: &Settings) -> (Option<i32>, String) {
    let dir = tempfile::tempdir().expect("temp dir");
    let config = dir.path().join("idemgate.toml");
    std::fs::write(&config, toml::to_string(settings).expect("settings to TOML")).expect("write config");
    let mut child = Command::new(BIN)
        .args(["--config", &config.to_string_lossy(), "serve"])
        .env_remove("RUST_LOG")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn idemgate serve");
    let started = Instant::now();
    while child.try_wait().expect("wait").is_none() {
        if started.elapsed() > Duration::from_secs(60) {
            let _ = child.kill();
            let out = child.wait_with_output().expect("output");
            panic!("serve still ran after 60 s:\n{}", String::from_utf8_lossy(&out.stdout));
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    let out = child.wait_with_output().expect("output");
    let text = String::from_utf8_lossy(&out.stdout).into_owned() + &String::from_utf8_lossy(&out.stderr);
    (out.status.code(), text)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_the_right_credentials_serve_consumes_from_a_secured_broker() {
    let db = database(Backend::Postgres).await;
    let (topic, group, user) = (unique("acl"), unique("group"), unique("consumer"));
    secured().create_user(&user, SECRET, &consume_rights(&topic, &group)).expect("the user");
    create_topic(&topic).await;
    let service = Service::start(&secured_settings(&db.url, &topic, &group, &user));
    let producer = Producer::start(&secured().access(), &unique("pgroup")).await.expect("producer");
    let order_no = unique("O");
    producer.send(&order(&topic, &order_no, 100)).await.expect("the send");
    let seen =
        wait_for_log(&db.store, &order_no, "order", |s| s.iter().any(|o| o.starts_with("processed"))).await;
    assert_eq!(seen, ["processed/"]);
    let log = service.log_text();
    assert!(log.contains("the account may consume the topic"), "{log}");
    assert!(!log.contains(SECRET), "the secret is never logged:\n{log}");
    producer.shutdown().await;
    assert_eq!(service.terminate().code(), Some(0));
    db.drop_now().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_wrong_secret_stops_serve_at_start_naming_the_broker_and_the_account_but_never_the_secret() {
    let db = database(Backend::Postgres).await;
    let (topic, group, user) = (unique("acl"), unique("group"), unique("consumer"));
    secured().create_user(&user, "the-Right-one-123", &consume_rights(&topic, &group)).expect("the user");
    create_topic(&topic).await;
    let started = Instant::now();
    let (code, out) = serve_until_it_exits(&secured_settings(&db.url, &topic, &group, &user));
    assert_eq!(code, Some(1), "{out}");
    assert!(started.elapsed() < Duration::from_secs(30), "refused only after {:?}", started.elapsed());
    assert!(out.contains("refused"), "{out}");
    assert!(out.contains(&secured().broker_addr()), "the broker is named: {out}");
    assert!(out.contains(&format!("access key {user:?}")), "the account is named: {out}");
    assert!(!out.contains(SECRET), "the secret is never printed: {out}");
    db.drop_now().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_account_without_the_subscribe_right_is_refused_clearly_at_start() {
    let db = database(Backend::Postgres).await;
    let (topic, group, user) = (unique("acl"), unique("group"), unique("producer_only"));
    let rights =
        [Right::new(format!("Topic:{topic}"), &["Pub"]), Right::new(format!("Group:{group}"), &["Sub"])];
    secured().create_user(&user, SECRET, &rights).expect("the user");
    create_topic(&topic).await;
    let (code, out) = serve_until_it_exits(&secured_settings(&db.url, &topic, &group, &user));
    assert_eq!(code, Some(1), "{out}");
    assert!(
        out.contains(&format!(
            "refused name server {} as access key {user:?} for consuming topic {topic:?}",
            secured().name_server()
        )),
        "{out}"
    );
    assert!(out.contains(&secured().broker_addr()), "the broker is named: {out}");
    assert!(!out.contains(SECRET), "{out}");
    db.drop_now().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_lag_is_read_with_exactly_the_rights_the_docs_list() {
    let (topic, group, user) = (unique("acl_lag"), unique("group"), unique("lag_reader"));
    // docs/running.md: GET on the topic and the group (consume stats), SUB on the topic and on
    // `<group>_lag_probe` (the one-message pull that dates the oldest message).
    let rights = [
        Right::new(format!("Topic:{topic}"), &["Get", "Sub"]),
        Right::new(format!("Group:{group}"), &["Get"]),
        Right::new(format!("Group:{group}_lag_probe"), &["Sub"]),
    ];
    secured().create_user(&user, SECRET, &rights).expect("the user");
    let producer = Producer::start(&secured().access(), &unique("pgroup")).await.expect("producer");
    for i in 0..3 {
        producer.send(&order(&topic, &unique(&format!("L{i}")), 100)).await.expect("the send");
    }
    producer.shutdown().await;
    let access = BrokerAccess::open(secured().name_server()).with_account(&user, SECRET);
    let probe = LagProbe::start(&access, &group, Duration::from_secs(5)).await.expect("the probe");
    let started = Instant::now();
    let lag = loop {
        let lag = probe.read(std::slice::from_ref(&topic)).await.topics.remove(0);
        if lag.messages() == 3 || started.elapsed() > Duration::from_secs(30) {
            break lag;
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    };
    assert_eq!(lag.messages(), 3, "{lag:?}");
    assert_eq!(lag.result, ReadResult::Complete, "{lag:?}");
    assert!(lag.oldest_unconsumed_ms.is_some(), "the oldest message is dated: {lag:?}");
    probe.shutdown().await;

    // Without GET on the group, the reading fails and says so.
    let (other, denied) = (unique("group"), unique("lag_reader"));
    let rights = [
        Right::new(format!("Topic:{topic}"), &["Get", "Sub"]),
        Right::new(format!("Group:{other}_lag_probe"), &["Sub"]),
    ];
    secured().create_user(&denied, SECRET, &rights).expect("the user");
    let access = BrokerAccess::open(secured().name_server()).with_account(&denied, SECRET);
    let probe = LagProbe::start(&access, &other, Duration::from_secs(5)).await.expect("the probe");
    let lag = probe.read(std::slice::from_ref(&topic)).await.topics.remove(0);
    assert_ne!(lag.result, ReadResult::Complete, "{lag:?}");
    probe.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn replay_through_a_secured_broker_sends_as_the_account() {
    let db = database(Backend::Postgres).await;
    let (topic, group, user) = (unique("acl_replay"), unique("group"), unique("replayer"));
    secured().create_user(&user, SECRET, &consume_rights(&topic, &group)).expect("the user");
    create_topic(&topic).await;
    let settings = secured_settings(&db.url, &topic, &group, &user);
    let service = Service::start(&settings);
    let producer = Producer::start(&secured().access(), &unique("pgroup")).await.expect("producer");
    let (key, order_no) = (unique("PAY"), unique("ORD"));
    super::replay::dead_letter_then_fix(&db.store, &producer, &topic, &key, &order_no).await;
    producer.shutdown().await;

    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("idemgate.toml");
    std::fs::write(&config, toml::to_string(&settings).unwrap()).unwrap();
    let out = Command::new(BIN)
        .args(["--config", &config.to_string_lossy(), "replay", "--biz-id", &key])
        .env_remove("RUST_LOG")
        .output()
        .expect("run idemgate replay");
    let text = String::from_utf8_lossy(&out.stdout).into_owned() + &String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(0), "{text}");
    assert!(text.contains("sent again as UNIQ_KEY"), "{text}");
    assert!(!text.contains(SECRET), "{text}");
    let seen =
        wait_for_log(&db.store, &key, "replayed delivery", |s| s.iter().any(|o| o.starts_with("processed")))
            .await;
    assert_eq!(seen.last().map(String::as_str), Some("processed/replay"), "{seen:?}");
    assert_eq!(service.terminate().code(), Some(0));
    db.drop_now().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_message_trace_on_each_consumption_is_in_the_trace_topic_as_the_java_client_writes_it() {
    let db = database(Backend::Postgres).await;
    let (topic, group, user) = (unique("acl_trace"), unique("group"), unique("traced"));
    // With trace on, the account also publishes to the trace topic.
    let mut rights = consume_rights(&topic, &group);
    rights.push(Right::new(format!("Topic:{DEFAULT_TRACE_TOPIC}"), &["Pub"]));
    secured().create_user(&user, SECRET, &rights).expect("the user");
    create_topic(&topic).await;
    let mut settings = secured_settings(&db.url, &topic, &group, &user);
    settings.rocketmq.message_trace = true;
    let service = Service::start(&settings);
    let producer = Producer::start(&secured().access(), &unique("pgroup")).await.expect("producer");
    let order_no = unique("O");
    let sent = producer.send(&order(&topic, &order_no, 100)).await.expect("the send");
    producer.shutdown().await;
    wait_for_log(&db.store, &order_no, "order", |s| s.iter().any(|o| o.starts_with("processed"))).await;

    // The client sends its trace records in batches, within a few seconds.
    let started = Instant::now();
    let record = loop {
        let records = secured().read_trace(DEFAULT_TRACE_TOPIC).expect("the trace topic");
        if let Some(r) = records.into_iter().find(|r| r.msg_id == sent.uniq_key) {
            break r;
        }
        assert!(
            started.elapsed() < Duration::from_secs(60),
            "no consume record of {} in 60 s",
            sent.uniq_key
        );
        tokio::time::sleep(Duration::from_secs(1)).await;
    };
    assert_eq!(record.group, group);
    assert!(record.success, "{record:?}");
    assert!(record.cost_ms >= 0, "{record:?}");
    assert_eq!(service.terminate().code(), Some(0));
    db.drop_now().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_namespaces_on_one_broker_each_consume_only_their_own_topic_of_the_same_name() {
    let db = database(Backend::Postgres).await;
    let (topic, group) = (unique("tenant"), unique("group"));
    let in_namespace = |namespace: &str| {
        let mut s = settings(&db.url, &topic, &group, namespace, 2);
        s.rocketmq.namespace = namespace.to_owned();
        s
    };
    let (a, b) = (unique("ns_a"), unique("ns_b"));
    // Each namespace's topic exists before its consumer starts.
    let (order_a, order_b) = (unique("OA"), unique("OB"));
    for (namespace, order_no) in [(&a, &order_a), (&b, &order_b)] {
        let access = broker().access().with_namespace(namespace);
        let producer = Producer::start(&access, &unique("pgroup")).await.expect("producer");
        producer.send(&order(&topic, order_no, 100)).await.expect("the send");
        producer.shutdown().await;
    }
    let service_a = Service::start(&in_namespace(&a));
    let service_b = Service::start(&in_namespace(&b));
    wait_for_log(&db.store, &order_a, "order of a", |s| s.iter().any(|o| o.starts_with("processed"))).await;
    wait_for_log(&db.store, &order_b, "order of b", |s| s.iter().any(|o| o.starts_with("processed"))).await;
    // Each was consumed once, by its own namespace's service.
    static BY: idemgate::store::Sql =
        idemgate::store::Sql::new("SELECT instance_id, topic FROM delivery_log WHERE biz_id = ? ORDER BY id");
    for (order_no, namespace) in [(&order_a, &a), (&order_b, &b)] {
        use sqlx::Row;
        let rows = db.store.query(&BY).bind(order_no.as_str()).fetch_all(db.store.pool()).await.unwrap();
        let seen: Vec<(String, String)> = rows.iter().map(|r| (r.get(0), r.get(1))).collect();
        assert_eq!(seen, [(namespace.clone(), topic.clone())], "the topic is named without its namespace");
    }
    assert_eq!(service_a.terminate().code(), Some(0));
    assert_eq!(service_b.terminate().code(), Some(0));
    db.drop_now().await;
}
