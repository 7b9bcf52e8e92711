//! A `traceparent` through a real broker: a producer traced as OpenTelemetry's RocketMQ
//! instrumentation traces it puts a W3C `traceparent` user property on its message; `serve`
//! logs the trace id with the delivery, links it from the trace page through
//! `http.trace_url_template`, finds the key by it, and counts a message whose `traceparent`
//! cannot be read while processing it all the same.

use idemgate::broker::Producer;
use idemgate::delivery::TRACEPARENT_PROPERTY;
use idemgate::store::{Backend, Sql};
use sqlx::Row;

use super::support::*;

static TRACE_ID_OF: Sql =
    Sql::new("SELECT trace_id FROM delivery_log WHERE biz_id = ? AND outcome = 'processed'");

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_traceparent_sent_through_the_broker_is_logged_linked_and_searchable() {
    let db = database(Backend::Postgres).await;
    let (topic, group, run) = (unique("traced"), unique("group"), unique("T").replace('_', ""));
    let mut s = settings(&db.url, &topic, &group, "traced", 2);
    s.http.trace_url_template = "https://tempo.example/explore?traceId={trace_id}".to_owned();
    let service = Service::start(&s);
    let addr = service_addr(&service);
    let producer = Producer::start(&broker().access(), &unique("pgroup")).await.expect("producer");

    let trace_id = "4bf92f3577b34da6a3ce929d0e0e4736";
    let (traced, unreadable) = (format!("{run}-O-1"), format!("{run}-O-2"));
    let mut message = order(&topic, &traced, 700);
    message.properties.insert(TRACEPARENT_PROPERTY.to_owned(), format!("00-{trace_id}-00f067aa0ba902b7-01"));
    producer.send(&message).await.expect("the traced send");
    let mut message = order(&topic, &unreadable, 700);
    message
        .properties
        .insert(TRACEPARENT_PROPERTY.to_owned(), format!("00-{}-00f067aa0ba902b7-01", "0".repeat(32)));
    producer.send(&message).await.expect("the send with an unreadable traceparent");

    for key in [&traced, &unreadable] {
        wait_for_log(&db.store, key, "processed delivery", |rows| {
            rows.iter().any(|r| r.starts_with("processed"))
        })
        .await;
    }
    let trace_of = |key: String| {
        let store = db.store.clone();
        async move {
            let row = store.query(&TRACE_ID_OF).bind(key).fetch_one(store.pool()).await.expect("the row");
            row.get::<Option<String>, _>(0)
        }
    };
    assert_eq!(trace_of(traced.clone()).await.as_deref(), Some(trace_id), "the broker carried the property");
    assert_eq!(trace_of(unreadable.clone()).await, None, "an all-zero trace id is no trace id");

    let (status, page) = http_get(&addr, &format!("/trace?q={trace_id}")).expect("the trace page");
    assert_eq!(status, 200, "{page}");
    assert!(page.contains(&traced) && page.contains("found by trace id"), "{page}");
    assert!(page.contains(&format!("href=\"https://tempo.example/explore?traceId={trace_id}\"")), "{page}");
    let (_, metrics) = http_get(&addr, "/metrics").expect("/metrics");
    let counted = sample(&metrics, "idemgate_invalid_traceparents_total", &[("reason", "zero_trace_id")]);
    assert_eq!(counted, Some(1.0), "{metrics}");

    producer.shutdown().await;
    assert_eq!(service.terminate().code(), Some(0));
    db.drop_now().await;
}
