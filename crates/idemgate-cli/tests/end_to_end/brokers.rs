//! One set of proofs, run for each broker: RocketMQ (a private broker), RabbitMQ (the machine's)
//! and Kafka (a private tansu). `idemgate serve` and `idemgate produce` as the real binaries,
//! books exact from SQL through duplicates of every cause, a SIGKILL mid-stream, poison through
//! the retries to the broker's own dead letters, replay back to where the message came from, the
//! broker's coordinates on the trace page, the `broker` label on every metric, and two consumers
//! sharing a group. A proof added here runs on all three; `main.rs` keeps RocketMQ's own
//! (a batch of a listener call killed mid-group, SIGTERM mid-stream).

use std::time::{Duration, Instant};

use idemgate::broker::{BrokerKind, Publish};
use idemgate::config::Settings;
use idemgate::store::{Backend, Sql};
use idemgate_shop as shop;
use sqlx::Row;

use super::replay::{ConfigFile, dead_letter_then_fix, replayed_once_by_command};
use super::support::*;

/// Removes what a test made on the broker: RabbitMQ's queues and exchanges (Kafka's topics
/// live in the private broker, which goes with the test binary).
async fn clean_up(kind: BrokerKind, group: &str, topic: &str) {
    if kind == BrokerKind::RabbitMq {
        idemgate_testkit::rabbitmq::remove(group, &[topic]).await.expect("removing the test's queues");
    }
}

/// The started publisher of the broker of `kind`, as `produce` and replay reach it.
async fn publisher(s: &Settings) -> Box<dyn Publish> {
    s.brokers().publisher().await.expect("a publisher")
}

/// What the trace page says of a delivery's position on the broker of `kind`.
fn position_words(kind: BrokerKind) -> &'static [&'static str] {
    match kind {
        BrokerKind::RabbitMq => &["exchange ", " · routing key ", " · delivery tag "],
        BrokerKind::Kafka => &[" · partition ", " · offset "],
        BrokerKind::RocketMq => &[" · q"],
    }
}

async fn exactly_once(kind: BrokerKind, backend: Backend, group_commit: bool) {
    let db = database(backend).await;
    let (topic, group, run) = (unique("shop"), unique("group"), unique("R").replace('_', ""));
    let mut s = settings_for(kind, &db.url, &topic, &group, "solo", 2);
    if group_commit {
        s = with_group_commit(s, 16);
        // Deliveries are handed over as they come, each its own call: enough of them in flight
        // to fill the groups.
        s.broker.consume_threads = 32;
    }
    let service = Service::start(&s);
    let (report, sends) = produce_to(kind, &topic, &run, 2000, 0, &["--duplicates", "0.3"]);
    for what in ["producer_retry", "producer_resend", "late_duplicate", "poison", "malformed"] {
        assert!(report.tally.sends.get(what).copied().unwrap_or(0) > 0, "the traffic has {what} sends");
    }
    assert_converges(&db.store, &run, &group, &report, &sends).await;
    let causes = duplicates_by_cause(&db.store, &group).await;
    for cause in ["producer_retry", "producer_resend"] {
        assert!(causes.get(cause).copied().unwrap_or(0) > 0, "duplicates by cause: {causes:?}");
    }
    if group_commit {
        assert_groups_formed(&service);
    }

    // Every metric says which broker fed it, and the lag is read from the broker.
    let addr = service_addr(&service);
    let started = Instant::now();
    let text = loop {
        let (status, text) = http_get(&addr, "/metrics").expect("/metrics answers");
        assert_eq!(status, 200);
        let lag = series(&text, "idemgate_consumer_lag_messages", &[("consumer_group", &group)]);
        if (!lag.is_empty() && lag.iter().sum::<f64>() == 0.0) || started.elapsed() > Duration::from_secs(30)
        {
            break text;
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    };
    let label = format!("broker=\"{}\"", kind.as_str());
    assert!(
        text.lines().filter(|l| l.starts_with("idemgate_deliveries_total")).all(|l| l.contains(&label)),
        "every series carries {label}"
    );
    let lag = series(&text, "idemgate_consumer_lag_messages", &[("consumer_group", &group)]);
    assert!(
        !lag.is_empty(),
        "the lag is read: {}",
        text.lines().filter(|l| l.contains("lag")).collect::<Vec<_>>().join("\n")
    );
    assert_eq!(lag.iter().sum::<f64>(), 0.0, "everything consumed");

    // The trace page shows where a delivery was on the broker.
    let key =
        sends.iter().find(|l| l.tags == shop::TAG_ORDER_CREATE).map(|l| l.keys[0].clone()).expect("an order");
    let (status, page) = http_get(&addr, &format!("/trace?biz_id={key}")).expect("the trace page");
    assert_eq!(status, 200);
    for words in position_words(kind) {
        assert!(page.contains(words), "the trace page shows {words:?}");
    }
    assert!(page.contains(&topic), "the trace page names the topic");

    assert_eq!(service.terminate().code(), Some(0));
    clean_up(kind, &group, &topic).await;
    db.drop_now().await;
}

/// Redeliveries logged by `logged_by` of the copies `applied_by` applied: the sub-cause of each,
/// once every one has its own (written by `logged_by` a few seconds after the duplicate; at
/// most 30 s).
static REDELIVERIES: Sql = Sql::new(
    "SELECT d.sub_cause FROM delivery_log d JOIN delivery_log p \
     ON p.consumer_group = d.consumer_group AND p.biz_type = d.biz_type AND p.biz_id = d.biz_id \
     AND p.execute_time = d.execute_time AND p.outcome = 'processed' AND p.logged_at_ms <= d.logged_at_ms \
     WHERE d.consumer_group = ? AND d.outcome = 'duplicate' AND d.cause = 'redelivery' \
     AND d.instance_id = ? AND p.instance_id = ?",
);

async fn redelivery_sub_causes(
    store: &idemgate::store::Store,
    group: &str,
    logged_by: &str,
    applied_by: &str,
) -> Vec<String> {
    let started = Instant::now();
    loop {
        let rows = store
            .query(&REDELIVERIES)
            .bind(group)
            .bind(logged_by)
            .bind(applied_by)
            .fetch_all(store.pool())
            .await
            .expect("the redeliveries");
        let named: Vec<Option<String>> = rows.iter().map(|r| r.get(0)).collect();
        if named.iter().all(Option::is_some) || started.elapsed() > Duration::from_secs(30) {
            return named.into_iter().map(|n| n.unwrap_or_else(|| "(none after 30 s)".to_owned())).collect();
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
}

async fn killed_mid_stream(kind: BrokerKind, backend: Backend) {
    let db = database(backend).await;
    let (topic, group, run) = (unique("crash"), unique("group"), unique("C").replace('_', ""));
    let configure = |name: &str| settings_for(kind, &db.url, &topic, &group, name, 2);
    let first = Service::start(&configure("before-crash"));
    let producer = {
        let (topic, run) = (topic.clone(), run.clone());
        std::thread::spawn(move || produce_to(kind, &topic, &run, 2000, 500, &["--duplicates", "0.3"]))
    };
    // About 2 of the stream's 4 seconds in.
    tokio::time::sleep(Duration::from_secs(2)).await;
    first.kill_hard();
    let second = Service::start(&configure("after-crash"));
    let (report, sends) = producer.join().expect("producer thread");
    assert_converges(&db.store, &run, &group, &report, &sends).await;
    let by_instance = processed_by_instance(&db.store, &group).await;
    assert!(
        by_instance.contains_key("before-crash") && by_instance.contains_key("after-crash"),
        "{by_instance:?}"
    );
    // Every copy the killed instance applied and the next one was handed again is named a
    // crash. RocketMQ's client stores its offsets every 5 s, so there it always hands some
    // back; RabbitMQ's acks and Kafka's commits follow each answer, and may leave none.
    let named = redelivery_sub_causes(&db.store, &group, "after-crash", "before-crash").await;
    assert!(named.iter().all(|n| n == "crash"), "{named:?}");
    if kind == BrokerKind::RocketMq {
        assert!(!named.is_empty(), "the killed instance's unstored offsets come back");
    }
    assert_eq!(second.terminate().code(), Some(0));
    clean_up(kind, &group, &topic).await;
    db.drop_now().await;
}

static ATTEMPTS: Sql =
    Sql::new("SELECT reconsume_times, outcome FROM delivery_log WHERE biz_id = ? ORDER BY id");

async fn poison_to_the_dead_letters(kind: BrokerKind) {
    let db = database(Backend::Postgres).await;
    let (topic, group, run) = (unique("poison"), unique("group"), unique("P").replace('_', ""));
    let service = Service::start(&settings_for(kind, &db.url, &topic, &group, "solo", 2));
    let (report, _) =
        produce_to(kind, &topic, &run, 20, 0, &["--duplicates", "0", "--poison", "0", "--malformed", "0"]);
    let (poison, poison_sends) = produce_to(kind, &topic, &run, 1, 0, &["--poison", "1", "--malformed", "0"]);
    assert_eq!(poison.tally.poison, 1);
    let key = format!("{run}-POISON-1");
    let started = Instant::now();
    let attempts = loop {
        let rows = db.store.query(&ATTEMPTS).bind(key.as_str()).fetch_all(db.store.pool()).await.unwrap();
        let attempts: Vec<(i32, String)> = rows.iter().map(|r| (r.get(0), r.get(1))).collect();
        // RocketMQ's retries climb its back-off ladder: 10 s, then 30 s.
        if attempts.iter().any(|(_, o)| o == "dead_lettered") || started.elapsed() > Duration::from_secs(180)
        {
            break attempts;
        }
        tokio::time::sleep(Duration::from_millis(300)).await;
    };
    assert_eq!(
        attempts,
        vec![(0, "failed".to_owned()), (1, "failed".to_owned()), (2, "dead_lettered".to_owned())],
        "serve log:\n{}",
        service.log_text()
    );
    // No further delivery: the message is in the broker's own dead letters, body kept.
    tokio::time::sleep(Duration::from_secs(4)).await;
    let rows = db.store.query(&ATTEMPTS).bind(key.as_str()).fetch_all(db.store.pool()).await.unwrap();
    let after: Vec<(i32, String)> = rows.iter().map(|r| (r.get(0), r.get(1))).collect();
    assert_eq!(after, attempts, "no delivery after the dead letter; serve log:\n{}", service.log_text());
    let poison_uniq =
        poison_sends.iter().find(|s| s.kind == "poison").expect("the poison send").uniq_key.clone();
    match kind {
        BrokerKind::RabbitMq => {
            let dead = idemgate_testkit::rabbitmq::take_all(&format!("{group}.dead"), 10).await.unwrap();
            assert_eq!(dead.len(), 1, "{dead:?}");
            assert_eq!(dead[0].message_id, poison_uniq);
            assert_eq!(dead[0].routing_key, shop::TAG_PAYMENT_CONFIRM);
            assert!(dead[0].headers.contains(&("x-idemgate-exchange".to_owned(), topic.clone())), "{dead:?}");
            assert!(String::from_utf8_lossy(&dead[0].body).contains(&key));
        }
        BrokerKind::Kafka => {
            let dead = idemgate_testkit::kafka::read_topic(
                kafka().bootstrap(),
                &format!("{group}.dlt"),
                1,
                Duration::from_secs(10),
            )
            .unwrap();
            assert_eq!(dead.len(), 1);
            let headers = &dead[0].headers;
            assert!(headers.contains(&("idemgate-topic".to_owned(), topic.clone())), "{headers:?}");
            assert!(headers.contains(&("UNIQ_KEY".to_owned(), poison_uniq.clone())), "{headers:?}");
            assert!(String::from_utf8_lossy(&dead[0].payload).contains(&key));
        }
        // RocketMQ moves it to `%DLQ%<group>` itself, at the last attempt's ReconsumeLater: that
        // no delivery came after it (above) is what the consumer can see of it.
        BrokerKind::RocketMq => {}
    }
    assert_eq!(books(&db.store, &run, &group).await.orders, expected_books(&report).orders);
    assert_eq!(service.terminate().code(), Some(0));
    clean_up(kind, &group, &topic).await;
    db.drop_now().await;
}

async fn replayed_to_where_it_came_from(kind: BrokerKind) {
    let db = database(Backend::MySql).await;
    let (topic, group, run) = (unique("replay"), unique("group"), unique("Y").replace('_', ""));
    let settings = settings_for(kind, &db.url, &topic, &group, "replayer", 2);
    let service = Service::start(&settings);
    let config = ConfigFile::of(&settings);
    let producer = publisher(&settings).await;
    let (key, order_no) = (format!("{run}-PAY-1"), format!("{run}-ORD-1"));
    dead_letter_then_fix(&db.store, producer.as_ref(), &topic, &key, &order_no).await;
    replayed_once_by_command(&db.store, &config, &key, &order_no).await;

    // The trace page shows each delivery's coordinates on this broker.
    let (_, page) = http_get(&service_addr(&service), &format!("/trace?biz_id={key}")).unwrap();
    for words in position_words(kind) {
        assert!(page.contains(words), "the trace page shows {words:?}");
    }
    producer.shutdown().await;
    assert_eq!(service.terminate().code(), Some(0));
    clean_up(kind, &group, &topic).await;
    db.drop_now().await;
}

/// Two instances of one group, started before a stream of 2,000 messages, each process part of
/// it and the books are exact.
async fn two_consumers_share_the_stream(kind: BrokerKind, backend: Backend) {
    let db = database(backend).await;
    let (topic, group, run) = (unique("scale"), unique("group"), unique("S").replace('_', ""));
    let a = Service::start(&settings_for(kind, &db.url, &topic, &group, "instance-a", 2));
    let b = Service::start(&settings_for(kind, &db.url, &topic, &group, "instance-b", 2));
    // Both join the group before the stream starts, so that it is shared.
    tokio::time::sleep(Duration::from_secs(8)).await;
    let (report, sends) = produce_to(kind, &topic, &run, 2000, 400, &["--duplicates", "0.3"]);
    assert_converges(&db.store, &run, &group, &report, &sends).await;
    let by_instance = processed_by_instance(&db.store, &group).await;
    assert!(
        by_instance.get("instance-a").copied().unwrap_or(0) > 0
            && by_instance.get("instance-b").copied().unwrap_or(0) > 0,
        "both instances processed part of the stream: {by_instance:?}"
    );
    assert_eq!(a.terminate().code(), Some(0));
    assert_eq!(b.terminate().code(), Some(0));
    clean_up(kind, &group, &topic).await;
    db.drop_now().await;
}

/// A second instance that joins the group mid-stream takes queues or partitions from the first:
/// every copy the first applied and the second was handed again is named a rebalance.
async fn joined_mid_stream(kind: BrokerKind, backend: Backend) {
    let db = database(backend).await;
    let (topic, group, run) = (unique("join"), unique("group"), unique("J").replace('_', ""));
    let first = Service::start(&settings_for(kind, &db.url, &topic, &group, "first", 2));
    let producer = {
        let (topic, run) = (topic.clone(), run.clone());
        std::thread::spawn(move || produce_to(kind, &topic, &run, 2000, 250, &[]))
    };
    tokio::time::sleep(Duration::from_secs(3)).await;
    let second = Service::start(&settings_for(kind, &db.url, &topic, &group, "second", 2));
    let (report, sends) = producer.join().expect("producer thread");
    assert_converges(&db.store, &run, &group, &report, &sends).await;
    // How many copies the second reads again depends on where the first's offsets stood when
    // the queues moved (none, when the first stored them as it let go).
    let named = redelivery_sub_causes(&db.store, &group, "second", "first").await;
    assert!(named.iter().all(|n| n == "rebalance"), "{named:?}");
    assert_eq!(second.terminate().code(), Some(0));
    assert_eq!(first.terminate().code(), Some(0));
    clean_up(kind, &group, &topic).await;
    db.drop_now().await;
}

mod rocketmq {
    use super::*;

    const KIND: BrokerKind = BrokerKind::RocketMq;

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn two_thousand_messages_with_thirty_percent_duplicates_are_applied_exactly_once_on_postgres() {
        exactly_once(KIND, Backend::Postgres, false).await;
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn with_group_commit_two_thousand_messages_are_applied_exactly_once_on_mariadb() {
        exactly_once(KIND, Backend::MySql, true).await;
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_consumer_killed_mid_stream_converges_to_the_same_books_after_restart() {
        killed_mid_stream(KIND, Backend::Postgres).await;
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_poison_message_is_retried_with_growing_reconsume_counts_and_ends_dead_lettered() {
        poison_to_the_dead_letters(KIND).await;
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_dead_letter_is_replayed_to_its_topic_and_tag_into_one_effect() {
        replayed_to_where_it_came_from(KIND).await;
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn two_consumers_in_one_group_share_the_queues_without_double_effects() {
        two_consumers_share_the_stream(KIND, Backend::MySql).await;
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_second_instance_joining_mid_stream_names_the_copies_it_reads_again_rebalance() {
        joined_mid_stream(KIND, Backend::Postgres).await;
    }
}

mod rabbitmq {
    use super::*;

    const KIND: BrokerKind = BrokerKind::RabbitMq;

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn two_thousand_messages_with_thirty_percent_duplicates_are_applied_exactly_once_on_postgres() {
        exactly_once(KIND, Backend::Postgres, false).await;
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn with_group_commit_two_thousand_messages_are_applied_exactly_once_on_mariadb() {
        exactly_once(KIND, Backend::MySql, true).await;
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_consumer_killed_mid_stream_converges_to_the_same_books_after_restart() {
        killed_mid_stream(KIND, Backend::Postgres).await;
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_poison_message_goes_through_the_delay_queue_and_ends_in_the_dead_letter_queue() {
        poison_to_the_dead_letters(KIND).await;
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_dead_letter_is_replayed_to_its_exchange_and_routing_key_into_one_effect() {
        replayed_to_where_it_came_from(KIND).await;
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn two_consumers_on_one_queue_share_the_stream_without_double_effects() {
        two_consumers_share_the_stream(KIND, Backend::Postgres).await;
    }
}

mod kafka {
    use super::*;

    const KIND: BrokerKind = BrokerKind::Kafka;

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn two_thousand_messages_with_thirty_percent_duplicates_are_applied_exactly_once_on_postgres() {
        exactly_once(KIND, Backend::Postgres, false).await;
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn with_group_commit_polled_batches_are_applied_exactly_once_on_mariadb() {
        exactly_once(KIND, Backend::MySql, true).await;
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_consumer_killed_mid_stream_converges_to_the_same_books_after_restart() {
        killed_mid_stream(KIND, Backend::Postgres).await;
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_poison_record_goes_through_the_retry_topic_and_ends_in_the_dead_letter_topic() {
        poison_to_the_dead_letters(KIND).await;
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_dead_letter_is_replayed_to_its_topic_into_one_effect() {
        replayed_to_where_it_came_from(KIND).await;
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn two_consumers_in_one_group_share_the_partitions_without_double_effects() {
        two_consumers_share_the_stream(KIND, Backend::Postgres).await;
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_second_instance_joining_mid_stream_names_the_copies_it_reads_again_rebalance() {
        joined_mid_stream(KIND, Backend::Postgres).await;
    }
}
