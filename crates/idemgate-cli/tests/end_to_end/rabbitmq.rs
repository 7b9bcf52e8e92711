//! RabbitMQ's own proofs, beside the shared ones of `brokers.rs`: the headers that make a message
//! a retry (`x-first-death-exchange`, the `x-death` trail) are believed only on a message
//! idemgate's delay queue sent back, never on one anybody published.

use std::time::{Duration, Instant};

use idemgate::broker::BrokerKind;
use idemgate::store::{Backend, Sql};
use idemgate_shop as shop;
use idemgate_testkit::rabbitmq::{Death, publish_with_trail};
use sqlx::Row;

use super::support::*;

static BY_UNIQ_KEY: Sql =
    Sql::new("SELECT topic, outcome, reconsume_times, error, biz_type FROM delivery_log WHERE uniq_key = ?");

/// The log rows of the message sent as `uniq_key`, once one is there (at most 30 s).
async fn logged(
    store: &idemgate::store::Store,
    uniq_key: &str,
) -> Vec<(String, String, i32, String, String)> {
    let started = Instant::now();
    loop {
        let rows = store.query(&BY_UNIQ_KEY).bind(uniq_key).fetch_all(store.pool()).await.expect("the log");
        if !rows.is_empty() || started.elapsed() > Duration::from_secs(30) {
            return rows
                .iter()
                .map(|r| {
                    (
                        r.get(0),
                        r.get(1),
                        r.get(2),
                        r.get::<Option<String>, _>(3).unwrap_or_default(),
                        r.get::<Option<String>, _>(4).unwrap_or_default(),
                    )
                })
                .collect();
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_message_published_to_the_return_exchange_is_invalid_unless_the_delay_queue_sent_it() {
    let db = database(Backend::Postgres).await;
    let (topic, group, run) = (unique("forged"), unique("group"), unique("F").replace('_', ""));
    let service = Service::start(&settings_for(BrokerKind::RabbitMq, &db.url, &topic, &group, "solo", 2));
    let order_no = |n: u32| format!("{run}-ORD-{n}");
    let body = |n: u32| order_body(&order_no(n));
    let back = format!("{group}.return");
    let retry_queue = format!("{group}.retry");
    // 1: through the return exchange, naming an exchange no route binds, with a forged count.
    publish_with_trail(
        &back,
        shop::TAG_ORDER_CREATE,
        &format!("{run}-U1"),
        &order_no(1),
        "payments_elsewhere",
        &[
            Death { queue: &retry_queue, reason: "expired", count: 1 },
            Death { queue: &group, reason: "rejected", count: 99 },
        ],
        &body(1),
    )
    .await
    .expect("publishing to the return exchange");
    // 2: naming the route's exchange, but with no trail through the delay queue.
    publish_with_trail(
        &back,
        shop::TAG_ORDER_CREATE,
        &format!("{run}-U2"),
        &order_no(2),
        &topic,
        &[Death { queue: &group, reason: "rejected", count: 1 }],
        &body(2),
    )
    .await
    .expect("publishing to the return exchange");
    // 3: on the route's own exchange, a forged trail and first exchange: its own exchange and
    // no retry count, whatever its headers say.
    publish_with_trail(
        &topic,
        shop::TAG_ORDER_CREATE,
        &format!("{run}-U3"),
        &order_no(3),
        "payments_elsewhere",
        &[Death { queue: &group, reason: "rejected", count: 99 }],
        &body(3),
    )
    .await
    .expect("publishing to the route's exchange");

    for n in [1, 2] {
        let rows = logged(&db.store, &format!("{run}-U{n}")).await;
        assert_eq!(rows.len(), 1, "message {n}: {rows:?}\n{}", service.log_text());
        let (logged_topic, outcome, reconsume, error, _) = &rows[0];
        assert_eq!(outcome, "invalid", "message {n}: {rows:?}");
        assert_eq!(logged_topic, &back, "message {n}: never a header's exchange");
        assert_eq!(*reconsume, 0, "message {n}: no forged count");
        assert!(error.contains("did not send back"), "message {n}: {error}");
    }
    let rows = logged(&db.store, &format!("{run}-U3")).await;
    assert_eq!(rows.len(), 1, "{rows:?}");
    assert_eq!(
        (rows[0].0.as_str(), rows[0].1.as_str(), rows[0].2),
        (topic.as_str(), "processed", 0),
        "{rows:?}"
    );
    assert_eq!(rows[0].4, "order.create");

    // The consumer goes on, ready, and no metric names the forged exchange.
    let addr = service_addr(&service);
    let (status, _) = http_get(&addr, "/readyz").expect("/readyz answers");
    assert_eq!(status, 200);
    let (_, metrics) = http_get(&addr, "/metrics").expect("/metrics answers");
    assert!(!metrics.contains("payments_elsewhere"), "a header's value became a label");
    assert_eq!(service.terminate().code(), Some(0));
    idemgate_testkit::rabbitmq::remove(&group, &[&topic]).await.expect("removing the test's queues");
    db.drop_now().await;
}

static CAUSES: Sql = Sql::new(
    "SELECT uniq_key, outcome, COALESCE(cause, ''), COALESCE(sub_cause, '') FROM delivery_log \
     WHERE topic = ? ORDER BY logged_at_ms, id",
);
static RUNS: Sql = Sql::new(
    "SELECT instance_id, broker, COALESCE(stop, '') FROM consumer_instance WHERE consumer_group = ?",
);
static EVENTS: Sql =
    Sql::new("SELECT kind, detail FROM consumer_event WHERE consumer_group = ? ORDER BY at_ms, id");

/// A producer that publishes the same message again (the same `message-id`, RabbitMQ's
/// `redelivered` flag unset, as a careful publisher does after a lost confirm) is named
/// `producer_retry` for every copy; a new `message-id` for the same order is `producer_resend`.
/// The run is on record from its start to its clean stop.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_message_published_again_with_its_message_id_is_a_producer_retry() {
    let db = database(Backend::Postgres).await;
    let (topic, group, run) = (unique("retry"), unique("group"), unique("P").replace('_', ""));
    let service = Service::start(&settings_for(BrokerKind::RabbitMq, &db.url, &topic, &group, "solo", 2));
    let order_no = format!("{run}-ORD-1");
    let body = order_body(&order_no);
    let same = format!("{run}-U1");
    // The first send, then two of the producer's own retries of it, each after the one before
    // was taken, then the application's resend under a new id.
    for (n, id) in [&same, &same, &same, &format!("{run}-U2")].into_iter().enumerate() {
        publish_with_trail(&topic, shop::TAG_ORDER_CREATE, id, &order_no, &topic, &[], &body)
            .await
            .expect("publishing to the route's exchange");
        let expected = n + 1;
        let started = Instant::now();
        loop {
            let rows = db
                .store
                .query(&CAUSES)
                .bind(topic.as_str())
                .fetch_all(db.store.pool())
                .await
                .expect("the log");
            if rows.len() >= expected || started.elapsed() > Duration::from_secs(30) {
                assert_eq!(rows.len(), expected, "send {n}\n{}", service.log_text());
                break;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }
    let rows =
        db.store.query(&CAUSES).bind(topic.as_str()).fetch_all(db.store.pool()).await.expect("the log");
    let seen: Vec<(String, String, String)> = rows.iter().map(|r| (r.get(0), r.get(1), r.get(2))).collect();
    let expected = [
        (same.clone(), "processed", ""),
        (same.clone(), "duplicate", "producer_retry"),
        (same.clone(), "duplicate", "producer_retry"),
        (format!("{run}-U2"), "duplicate", "producer_resend"),
    ];
    let expected: Vec<(String, String, String)> =
        expected.iter().map(|(u, o, c)| (u.clone(), (*o).to_owned(), (*c).to_owned())).collect();
    assert_eq!(seen, expected);
    assert!(rows.iter().all(|r| r.get::<String, _>(3).is_empty()), "no sub-cause: nothing was redelivered");

    let addr = service_addr(&service);
    let (_, metrics) = http_get(&addr, "/metrics").expect("/metrics answers");
    let retries = metrics
        .lines()
        .find(|l| {
            l.starts_with("idemgate_conflicts_total{")
                && l.contains("cause=\"producer_retry\"")
                && l.contains("layer=\"db\"")
        })
        .unwrap_or_default()
        .to_owned();
    assert!(retries.ends_with(" 2"), "{retries}");
    assert_eq!(service.terminate().code(), Some(0));

    let runs = db.store.query(&RUNS).bind(group.as_str()).fetch_all(db.store.pool()).await.expect("the runs");
    assert_eq!(runs.len(), 1);
    assert_eq!(
        (runs[0].get::<String, _>(1), runs[0].get::<String, _>(2)),
        ("rabbitmq".to_owned(), "clean".to_owned()),
        "a run stopped as asked is on record as a clean stop"
    );
    let events =
        db.store.query(&EVENTS).bind(group.as_str()).fetch_all(db.store.pool()).await.expect("the events");
    let kinds: Vec<String> = events.iter().map(|r| r.get(0)).collect();
    assert_eq!(kinds.first().map(String::as_str), Some("started"), "{kinds:?}");
    assert!(kinds.contains(&"assigned".to_owned()), "the consumer's start on its queue: {kinds:?}");
    assert_eq!(kinds.last().map(String::as_str), Some("stopped"), "{kinds:?}");
    idemgate_testkit::rabbitmq::remove(&group, &[&topic]).await.expect("removing the test's queues");
    db.drop_now().await;
}
