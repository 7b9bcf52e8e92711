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
