//! A consumer that makes no progress while messages wait is not ready: on the real Kafka test
//! broker, another member of the group holds the topic's one partition and never commits, so
//! `serve` answers nothing while the lag grows; `/readyz` turns 503 and
//! `idemgate_consumer_stalled` 1 after `broker.stall_seconds`, and both come back once the
//! member leaves and `serve` consumes.

use std::time::{Duration, Instant};

use idemgate::broker::BrokerKind;
use idemgate::store::Backend;
use idemgate_testkit::kafka_hog::GroupHog;

use super::support::*;

/// `/readyz`'s status and `idemgate_consumer_stalled`, polled until `done` holds or `within`
/// runs out; the last of each.
async fn watch(
    addr: &str,
    group: &str,
    within: Duration,
    done: impl Fn(u16, f64) -> bool,
) -> (u16, f64, Duration) {
    let started = Instant::now();
    loop {
        let (status, _) = http_get(addr, "/readyz").expect("/readyz answers");
        let (_, text) = http_get(addr, "/metrics").expect("/metrics answers");
        let stalled = series(&text, "idemgate_consumer_stalled", &[("consumer_group", group)])
            .first()
            .copied()
            .unwrap_or(-1.0);
        if done(status, stalled) || started.elapsed() > within {
            return (status, stalled, started.elapsed());
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_consumer_that_answers_nothing_while_its_partition_holds_records_is_not_ready() {
    let db = database(Backend::Postgres).await;
    let (topic, group, run) = (unique("stall"), unique("group"), unique("T").replace('_', ""));
    let bootstrap = kafka().bootstrap().to_owned();
    idemgate_testkit::kafka::create_topic(&bootstrap, &topic, 1).await.expect("a one-partition topic");
    // The member that holds the partition joins first.
    let hog = {
        let (b, g, t) = (bootstrap.clone(), group.clone(), topic.clone());
        tokio::task::spawn_blocking(move || GroupHog::join(&b, &g, &t)).await.unwrap().expect("the hog joins")
    };
    tokio::time::sleep(Duration::from_secs(4)).await;
    let mut s = settings_for(BrokerKind::Kafka, &db.url, &topic, &group, "starved", 2);
    s.broker.lag_interval_seconds = 2;
    s.broker.stall_seconds = 30;
    let service = Service::start(&s);
    let addr = service_addr(&service);
    let quiet = ["--duplicates", "0", "--poison", "0", "--malformed", "0"];
    let (report, sends) = produce_to(BrokerKind::Kafka, &topic, &run, 40, 0, &quiet);

    let (status, stalled, after) =
        watch(&addr, &group, Duration::from_secs(90), |status, stalled| status == 503 && stalled == 1.0)
            .await;
    let processed = processed_by_instance(&db.store, &group).await;
    assert_eq!(
        (status, stalled),
        (503, 1.0),
        "not reported stalled {after:?} in; processed so far {processed:?}; serve log:\n{}",
        service.log_text()
    );
    assert!(processed.is_empty(), "the other member held the partition: {processed:?}");
    assert!(after >= Duration::from_secs(20), "reported after {after:?}, before broker.stall_seconds");
    assert!(service.log_text().contains("it is stalled"), "{}", service.log_text());
    println!("stall: /readyz 503 and idemgate_consumer_stalled 1 after {:.1} s", after.as_secs_f64());

    // The member leaves: the partition comes to serve, which consumes, and is ready again.
    tokio::task::spawn_blocking(move || hog.leave()).await.unwrap();
    let left = Instant::now();
    assert_converges(&db.store, &run, &group, &report, &sends).await;
    let (status, stalled, _) =
        watch(&addr, &group, Duration::from_secs(30), |status, stalled| status == 200 && stalled == 0.0)
            .await;
    assert_eq!((status, stalled), (200, 0.0), "ready again; serve log:\n{}", service.log_text());
    println!("stall: ready again {:.1} s after the other member left", left.elapsed().as_secs_f64());
    assert_eq!(service.terminate().code(), Some(0));
    db.drop_now().await;
}
