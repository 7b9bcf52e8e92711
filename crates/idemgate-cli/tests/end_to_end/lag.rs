//! Consumer lag against the real broker: messages sent to a topic whose consumer group has not
//! started yet are its lag, with the age of the oldest of them; once `serve` has consumed them,
//! its `/metrics` and its overview page say 0, read as often as `broker.lag_interval_seconds`
//! says.

use std::time::{Duration, Instant};

use idemgate::broker::Producer;
use idemgate::broker::lag::{ReadResult, TopicLag};
use idemgate::broker::rocketmq::LagProbe;
use idemgate::store::{Backend, Sql};
use sqlx::Row;

use super::support::*;

const SENT: i64 = 40;

static PROCESSED: Sql =
    Sql::new("SELECT COUNT(*) FROM delivery_log WHERE consumer_group = ? AND outcome = 'processed'");

/// Reads `topic`'s lag until `done` holds or `limit` passes; the last reading.
async fn read_until(
    probe: &LagProbe,
    topic: &str,
    limit: Duration,
    done: impl Fn(&TopicLag) -> bool,
) -> TopicLag {
    let started = Instant::now();
    loop {
        let reading = probe.read(&[topic.to_owned()]).await;
        let lag = reading.topics.into_iter().next().expect("one topic read");
        if done(&lag) || started.elapsed() > limit {
            return lag;
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn messages_sent_before_the_group_starts_are_its_lag_and_none_is_left_once_serve_consumed_them() {
    let db = database(Backend::Postgres).await;
    let (topic, group, run) = (unique("lag"), unique("group"), unique("L").replace('_', ""));
    let producer = Producer::start(&broker().access(), &unique("pgroup")).await.expect("producer");
    let first_sent = Instant::now();
    for i in 0..SENT {
        producer.send(&order(&topic, &format!("{run}-O-{i}"), 100 + i)).await.expect("the send");
    }
    let last_sent = Instant::now();
    producer.shutdown().await;

    // Nobody consumes yet: every message sent is lag, and the oldest waits since the first send.
    let probe = LagProbe::start(&broker().access(), &group, Duration::from_secs(5)).await.expect("the probe");
    let before = read_until(&probe, &topic, Duration::from_secs(30), |l| l.messages() == SENT).await;
    let read_at = Instant::now();
    assert_eq!(before.messages(), SENT, "{before:?}");
    assert_eq!(before.result, ReadResult::Complete, "{before:?}");
    assert!(before.queues.iter().all(|q| q.source == "broker-a" && q.committed == 0), "{before:?}");
    let age = before.age_seconds(idemgate::clock::now_ms()).expect("the oldest message dated");
    let (least, most) = (read_at.duration_since(last_sent).as_secs_f64(), first_sent.elapsed().as_secs_f64());
    assert!(age >= least - 1.0 && age <= most + 1.0, "age {age} s, sends {least:.1}–{most:.1} s ago");

    // serve consumes them, reading the lag every second.
    let mut s = settings(&db.url, &topic, &group, "lagging", 2);
    s.broker.lag_interval_seconds = 1;
    let service = Service::start(&s);
    let addr = service_addr(&service);
    let started = Instant::now();
    loop {
        let row = db.store.query(&PROCESSED).bind(group.as_str()).fetch_one(db.store.pool()).await.unwrap();
        if row.get::<i64, _>(0) == SENT {
            break;
        }
        assert!(started.elapsed() < Duration::from_secs(60), "serve did not process {SENT} messages in 60 s");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let labels = [("consumer_group", group.as_str()), ("topic", topic.as_str())];
    let metrics = || http_get(&addr, "/metrics").expect("/metrics answers").1;
    // Offsets are committed every 5 s: the lag reaches 0 within a few readings after that.
    let started = Instant::now();
    let text = loop {
        let text = metrics();
        let behind = sample(&text, "idemgate_consumer_lag_messages", &labels);
        let age = sample(&text, "idemgate_consumer_lag_seconds", &labels);
        if behind == Some(0.0) && age == Some(0.0) {
            break text;
        }
        assert!(
            started.elapsed() < Duration::from_secs(30),
            "lag {behind:?} messages, {age:?} s, 30 s after consumption:\n{}",
            text.lines().filter(|l| l.contains("consumer_lag")).collect::<Vec<_>>().join("\n")
        );
        tokio::time::sleep(Duration::from_millis(500)).await;
    };
    assert_eq!(series(&text, "idemgate_consumer_lag_messages", &labels).len(), before.queues.len(), "{text}");
    let after = read_until(&probe, &topic, Duration::from_secs(5), |l| l.messages() == 0).await;
    assert_eq!(after.messages(), 0, "{after:?}");
    assert_eq!(after.age_seconds(idemgate::clock::now_ms()), Some(0.0));

    // broker.lag_interval_seconds = 1: four seconds bring three readings at least (the default,
    // 15 s, one at most).
    let complete = [labels[0], labels[1], ("result", "complete")];
    let reads = |text: &str| sample(text, "idemgate_consumer_lag_reads_total", &complete).unwrap_or(0.0);
    let first = reads(&metrics());
    tokio::time::sleep(Duration::from_secs(4)).await;
    let more = reads(&metrics()) - first;
    assert!(more >= 3.0, "{more} readings in 4 s");

    // The overview page shows the topic with nothing waiting.
    let (status, page) = http_get(&addr, "/").expect("the overview");
    assert_eq!(status, 200);
    let lag = page
        .split("<h2>Consumer lag</h2>")
        .nth(1)
        .expect("a consumer lag section")
        .split("</section>")
        .next()
        .unwrap_or("");
    assert!(
        lag.contains(&format!("<td>{topic}</td><td class=\"num\">0</td><td>nothing waiting</td>")),
        "{lag}"
    );

    probe.shutdown().await;
    assert_eq!(service.terminate().code(), Some(0));
    db.drop_now().await;
}
