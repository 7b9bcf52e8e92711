//! The service's life against a real broker: a listener call that panics stops it with the
//! consumer named and nothing acknowledged; a fresh `serve` consumes the first send to a topic
//! that send creates within seconds, not at the client's next route refresh; and a replay form
//! served longer ago than `http.csrf_token_ttl_seconds` is refused as expired.

use std::time::{Duration, Instant};

use idemgate::app::{Application, Feed};
use idemgate::broker::Producer;
use idemgate::delivery::Delivery;
use idemgate::handler::{Effect, Handler, HandlerError, Work};
use idemgate::route::RouteConfig;
use idemgate::store::{Backend, Conn, Sql};
use idemgate_shop as shop;
use sqlx::Row;

use super::replay::dead_letter_then_fix;
use super::support::*;

/// The biz_type, handler name and tag of the handler that panics.
const BOOM: &str = "boom.apply";
const BOOM_TAG: &str = "boom";

/// A handler with a defect: it panics on every message.
struct Panicking;

#[async_trait::async_trait]
impl Handler for Panicking {
    async fn handle(&self, work: &Work<'_>, _conn: &mut Conn) -> Result<Effect, HandlerError> {
        panic!("the boom handler cannot handle {}", work.key.biz_id)
    }
}

static CLAIMS: Sql = Sql::new("SELECT COUNT(*) FROM idempotent_record WHERE biz_id = ?");

/// `/readyz`'s status and body, asked off the runtime's worker threads.
async fn readiness(addr: &str) -> (u16, String) {
    let addr = addr.to_owned();
    tokio::task::spawn_blocking(move || http_get(&addr, "/readyz"))
        .await
        .expect("the request thread")
        .expect("/readyz answers")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_listener_call_that_panics_stops_the_service_with_the_consumer_named() {
    let db = database(Backend::Postgres).await;
    let (topic, group, run) = (unique("boom"), unique("group"), unique("B").replace('_', ""));
    let mut settings = settings(&db.url, &topic, &group, "panicking", 2);
    settings.routes.push(RouteConfig {
        topic: topic.clone(),
        tags: BOOM_TAG.to_owned(),
        biz_type: BOOM.to_owned(),
        biz_id: "keys".to_owned(),
        execute_time: None,
        handler: None,
    });
    let handlers = shop::handlers().with(BOOM, Panicking);
    let mut running = Application::build_with(&settings, handlers, Feed::Broker)
        .await
        .expect("the service builds")
        .start()
        .await
        .expect("the service starts");
    assert!(running.parts().contains(&"consumer"), "{:?}", running.parts());
    let addr = running.url().trim_start_matches("http://").to_owned();
    assert_eq!(readiness(&addr).await.0, 200, "ready once started");

    let producer = Producer::start(&broker().access(), &unique("pgroup")).await.expect("producer");
    let key = format!("{run}-BOOM-1");
    let message = Delivery {
        topic: topic.clone(),
        tags: BOOM_TAG.to_owned(),
        keys: vec![key.clone()],
        body: b"{}".to_vec(),
        ..Default::default()
    };
    producer.send(&message).await.expect("the send");

    let (part, ended) = tokio::time::timeout(Duration::from_secs(60), running.failed())
        .await
        .expect("a part of the service ends within 60 s of the send");
    assert_eq!(part, "consumer", "{ended}");
    assert!(ended.contains(&format!("the boom handler cannot handle {key}")), "{ended}");
    let (status, body) = readiness(&addr).await;
    assert_eq!(status, 503, "not ready once a part has ended: {body}");
    assert!(body.contains("\"consumer\":false"), "{body}");

    // The delivery was answered ReconsumeLater: not logged as processed, nothing claimed.
    let log = log_of(&db.store, &key).await;
    assert!(!log.iter().any(|o| o.starts_with("processed")), "{log:?}");
    let claims: i64 =
        db.store.query(&CLAIMS).bind(key.as_str()).fetch_one(db.store.pool()).await.expect("claims").get(0);
    assert_eq!(claims, 0, "the panic left no claim");

    let stopped = running.stop().await;
    let stopped = stopped.expect_err("a service whose consumer ended does not stop cleanly").to_string();
    assert!(stopped.contains("consumer"), "{stopped}");
    producer.shutdown().await;
    db.drop_now().await;
}

/// What `serve` logs once when a subscribed topic has no route yet.
const NO_ROUTE_YET: &str = "the topic has no route yet (its first send creates it)";
/// The longest a first send to a new topic may wait for its delivery: at the client's own pace
/// (routes looked up every 30 s, rebalances every 20 s) it waited 20 s and more.
const FIRST_SEND_WITHIN: Duration = Duration::from_secs(10);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fresh_service_consumes_the_first_send_to_a_new_topic_within_a_few_seconds() {
    let db = database(Backend::Postgres).await;
    let (topic, group, run) = (unique("fresh"), unique("group"), unique("N").replace('_', ""));
    let service = Service::start(&settings(&db.url, &topic, &group, "fresh", 2));
    let producer = Producer::start(&broker().access(), &unique("pgroup")).await.expect("producer");
    service.wait_for_line(NO_ROUTE_YET, Duration::from_secs(10));

    // The topic is created by this send.
    let order_no = format!("{run}-O-1");
    let sent = Instant::now();
    producer.send(&order(&topic, &order_no, 990)).await.expect("the send");
    let send_took = sent.elapsed();
    let delivered = loop {
        if !log_of(&db.store, &order_no).await.is_empty() {
            break sent.elapsed();
        }
        assert!(sent.elapsed() < Duration::from_secs(90), "no delivery within 90 s of the send");
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    println!("first send to a new topic: sent in {send_took:?}, logged {delivered:?} after the send began");
    assert!(
        delivered < FIRST_SEND_WITHIN,
        "the first send was delivered {delivered:?} after it began (the send took {send_took:?}):\n{}",
        service.log_text()
    );
    let log = service.log_text();
    assert_eq!(log.matches(NO_ROUTE_YET).count(), 1, "{log}");
    assert!(log.contains("the topic has a route now; consuming"), "{log}");
    producer.shutdown().await;
    assert_eq!(service.terminate().code(), Some(0));
    db.drop_now().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_replay_form_older_than_its_lifetime_is_refused() {
    let db = database(Backend::Postgres).await;
    let (topic, group, run) = (unique("forms"), unique("group"), unique("T").replace('_', ""));
    // No retries: the first failure is the dead letter.
    let mut settings = settings(&db.url, &topic, &group, "forms", 0);
    settings.http.csrf_token_ttl_seconds = 60;
    let service = Service::start(&settings);
    let addr = service_addr(&service);
    let producer = Producer::start(&broker().access(), &unique("pgroup")).await.expect("producer");
    let (key, order_no) = (format!("{run}-PAY-1"), format!("{run}-ORD-1"));
    dead_letter_then_fix(&db.store, &producer, &topic, &key, &order_no).await;

    let stale = replay_form(&addr, &group, shop::PAYMENT_CONFIRM, &key);
    let served = Instant::now();
    tokio::time::sleep(Duration::from_millis(61_500).saturating_sub(served.elapsed())).await;
    let (status, refused) = http_post_form(&addr, "/replay", &stale.body).expect("an answer");
    assert_eq!(status, 403, "{refused}");
    assert!(refused.contains("has expired"), "{refused}");

    let fresh = replay_form(&addr, &group, shop::PAYMENT_CONFIRM, &key);
    assert_ne!(fresh.token, stale.token);
    let (status, result) = http_post_form(&addr, "/replay", &fresh.body).expect("an answer");
    assert_eq!(status, 200, "{result}");
    assert!(result.contains("sent again as UNIQ_KEY"), "{result}");
    wait_for_log(&db.store, &key, "replayed delivery", |s| s.iter().any(|o| o.starts_with("processed")))
        .await;
    // Had the expired form sent a replay too, its copy would follow the fresh one's.
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert_eq!(log_of(&db.store, &key).await, ["dead_lettered/", "processed/replay"]);
    producer.shutdown().await;
    assert_eq!(service.terminate().code(), Some(0));
    db.drop_now().await;
}
