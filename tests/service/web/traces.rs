//! The traces messages belong to, on the trace page and in the search: the W3C trace id a
//! message's `traceparent` carried is shown with each delivery and in the key's header, linked
//! through `http.trace_url_template` when it is set and as text otherwise; a trace id typed into
//! the search box (or asked for with `by=trace_id`) finds the keys of its messages, through an
//! index of its own; a `traceparent` that cannot be read is counted on `/metrics` of the
//! service as `serve` assembles it.

use idemgate::delivery::TRACEPARENT_PROPERTY;
use idemgate::inspect::trace::{KeyRef, statements_by_trace_id};
use idemgate::store::{Backend, query_built};
use idemgate_testkit::plan;

use super::*;

const T1: &str = "4bf92f3577b34da6a3ce929d0e0e4736";
const T2: &str = "0af7651916cd43dd8448eb211c80319c";
const T3: &str = "aaaabbbbccccddddeeeeffff00001111";
const TEMPO: &str = "https://tempo.example/explore?orgId=1&traceId={trace_id}";

/// `d` with a version 00 `traceparent` of `trace_id`.
fn traced(mut d: Delivery, trace_id: &str) -> Delivery {
    d.properties.insert(TRACEPARENT_PROPERTY.to_owned(), format!("00-{trace_id}-00f067aa0ba902b7-01"));
    d
}

/// The targets of the page's trace-id links, unescaped.
fn trace_links(html: &str) -> Vec<String> {
    let marker = "class=\"mono trace-id\" href=\"";
    html.match_indices(marker)
        .map(|(at, _)| {
            let link = &html[at + marker.len()..];
            link[..link.find('"').expect("a closing quote")].replace("&#38;", "&").replace("&amp;", "&")
        })
        .collect()
}

async fn with_template(backend: Backend) -> App {
    let mut settings = shop::settings();
    settings.http.trace_url_template = TEMPO.to_owned();
    App::with_settings(backend, settings).await
}

mod cases {
    use super::*;

    /// With `http.trace_url_template`, the key's header links each trace of the page once, and
    /// each delivery's trace id links to its trace; the JSON carries the ids and the links.
    pub async fn the_trace_page_links_each_trace_through_the_template(backend: Backend) {
        let app = with_template(backend).await;
        let first = traced(stock_deduct("TR-1", "M-TR1", "U-TR1", "SKU-W", 1), T1);
        let again = traced(stock_deduct("TR-1", "M-TR2", "U-TR1", "SKU-W", 1), T1);
        let resent = traced(stock_deduct("TR-1", "M-TR3", "U-TR3", "SKU-W", 1), T2);
        let untraced = stock_deduct("TR-1", "M-TR4", "U-TR4", "SKU-W", 1);
        assert_eq!(app.deliver(&first).await, Outcome::Processed);
        for d in [&again, &resent, &untraced] {
            assert_eq!(app.deliver(d).await, Outcome::Duplicate, "{}", d.msg_id);
        }

        let (status, html, _) = app.get("/trace?biz_id=TR-1").await;
        assert_eq!(status, StatusCode::OK, "{html}");
        let link = |id: &str| TEMPO.replace("{trace_id}", id);
        assert_eq!(trace_links(&html), [link(T1), link(T2)], "the header names each trace once: {html}");
        assert!(html.contains("traces <a class=\"mono trace-id\""), "{html}");
        let row_links = html.matches("<a class=\"trace-id\" href=\"https://tempo.example/explore?").count();
        assert_eq!(row_links, 3, "three deliveries carried a trace: {html}");
        assert!(!html.contains("<span class=\"mono trace-id\">"), "no trace shown as bare text: {html}");

        let (status, json) = app.json("/api/trace/TR-1").await;
        assert_eq!(status, StatusCode::OK);
        let story = &json["story"];
        assert_eq!(story["traces"][0]["trace_id"], T1);
        assert_eq!(story["traces"][0]["url"], link(T1).as_str());
        assert_eq!(story["traces"][1]["trace_id"], T2);
        let ids: Vec<&Value> =
            story["deliveries"].as_array().expect("rows").iter().map(|d| &d["trace_id"]).collect();
        assert_eq!(ids, [&Value::from(T1), &Value::from(T1), &Value::from(T2), &Value::Null]);
    }

    /// Without the setting, the trace ids are shown as text: no link anywhere.
    pub async fn without_a_template_the_trace_id_is_shown_as_text(backend: Backend) {
        let app = App::new(backend).await;
        let d = traced(stock_deduct("TR-2", "M-TX1", "U-TX1", "SKU-W", 1), T1);
        assert_eq!(app.deliver(&d).await, Outcome::Processed);

        let (status, html, _) = app.get("/trace?biz_id=TR-2").await;
        assert_eq!(status, StatusCode::OK, "{html}");
        assert!(html.contains(&format!("trace <span class=\"mono trace-id\">{T1}</span>")), "{html}");
        assert!(html.contains(&format!("trace <span class=\"trace-id\">{T1}</span>")), "the row: {html}");
        assert!(trace_links(&html).is_empty() && !html.contains("<a class=\"trace-id\""), "{html}");
        let (_, json) = app.json("/api/trace/TR-2").await;
        assert_eq!(json["story"]["traces"][0]["trace_id"], T1);
        assert_eq!(json["story"]["traces"][0]["url"], Value::Null);
    }

    /// A trace id finds the keys of its messages: typed as it is (or in capitals) into the
    /// search box, or asked for by name. A trace of two keys is a choice; a trace id that is
    /// also a bizId is that bizId's (a bizId is tried first); a message refused before its key
    /// could be read is found alone, not with every other such message of its biz_type.
    pub async fn a_trace_id_finds_the_keys_of_its_messages(backend: Backend) {
        let app = App::new(backend).await;
        let t1 = traced(stock_deduct("TR-A", "M-TA", "U-TA", "SKU-W", 1), T1);
        assert_eq!(app.deliver(&t1).await, Outcome::Processed);
        assert_eq!(app.deliver(&traced(order("TR-B", "M-TB"), T2)).await, Outcome::Processed);
        assert_eq!(
            app.deliver(&traced(payment("TR-C", "TR-B", "M-TC", "U-TC", 0), T2)).await,
            Outcome::Processed
        );

        for uri in [
            format!("/trace?q={T1}"),
            format!("/trace?q={}", T1.to_uppercase()),
            format!("/trace?q={T1}&by=trace_id"),
            format!("/trace?trace_id={T1}"),
        ] {
            let (status, html, _) = app.get(&uri).await;
            assert_eq!(status, StatusCode::OK, "{uri}: {html}");
            assert!(html.contains("<span class=\"mono\">TR-A</span>"), "{uri}: {html}");
            assert!(html.contains("found by trace id"), "{uri}: {html}");
        }
        let (status, json) = app.json(&format!("/api/trace?q={T2}")).await;
        assert_eq!(status, StatusCode::OK);
        assert_eq!((json["found"].as_str(), json["matched_by"].as_str()), (Some("choice"), Some("trace_id")));
        let mut ids: Vec<&str> = json["candidates"]
            .as_array()
            .expect("candidates")
            .iter()
            .map(|c| c["key"]["biz_id"].as_str().unwrap())
            .collect();
        ids.sort();
        assert_eq!(ids, ["TR-B", "TR-C"], "{json}");
        let (status, html, _) = app.get(&format!("/trace?q={T2}")).await;
        assert_eq!(status, StatusCode::OK);
        assert!(html.contains("This trace id matches 2 keys"), "{html}");

        let (status, json) = app.json(&format!("/api/trace?q={T3}")).await;
        assert_eq!(status, StatusCode::NOT_FOUND);
        assert_eq!(json["searched"], "bizId, msgId, UNIQ_KEY, trace id", "{json}");
        let (_, json) = app.json("/api/trace?q=NOT-A-TRACE").await;
        assert_eq!(
            json["searched"], "bizId, msgId, UNIQ_KEY",
            "a text that is no trace id is not tried as one"
        );
        for bad in ["xyz", "4bf92f3577b34da6a3ce929d0e0e473", "00000000000000000000000000000000"] {
            let (status, html, _) = app.get(&format!("/trace?q={bad}&by=trace_id")).await;
            assert_eq!(status, StatusCode::BAD_REQUEST, "{bad}: {html}");
            assert!(html.contains("a trace id is 32 hex digits"), "{bad}: {html}");
        }

        // A bizId that reads like a trace id is a bizId first.
        let bizid = stock_deduct(T3, "M-T3-KEY", "U-T3-KEY", "SKU-W", 1);
        assert_eq!(app.deliver(&bizid).await, Outcome::Processed);
        assert_eq!(app.deliver(&traced(order("TR-D", "M-TD"), T3)).await, Outcome::Processed);
        let (_, json) = app.json(&format!("/api/trace?q={T3}")).await;
        assert_eq!(
            (json["matched_by"].as_str(), json["story"]["key"]["biz_id"].as_str()),
            (Some("biz_id"), Some(T3))
        );
        let (_, json) = app.json(&format!("/api/trace?q={T3}&by=trace_id")).await;
        assert_eq!(json["story"]["key"]["biz_id"], "TR-D", "{json}");

        // Two messages refused before their key could be read share the key without a bizId;
        // the trace of one shows that one.
        let keyless = |msg_id: &str| Delivery {
            keys: vec![],
            ..stock_deduct("", msg_id, &format!("U-{msg_id}"), "SKU-W", 1)
        };
        let traced_keyless = traced(keyless("M-NOKEY-1"), "1111222233334444555566667777aaaa");
        assert_eq!(app.deliver(&traced_keyless).await, Outcome::Invalid);
        assert_eq!(app.deliver(&keyless("M-NOKEY-2")).await, Outcome::Invalid);
        let (status, html, _) = app.get("/trace?q=1111222233334444555566667777aaaa").await;
        assert_eq!(status, StatusCode::OK, "{html}");
        assert!(html.contains("M-NOKEY-1") && !html.contains("M-NOKEY-2"), "{html}");
    }

    /// A `traceparent` that cannot be read is counted on the service's `/metrics` by why, and
    /// the delivery is processed all the same.
    pub async fn an_unreadable_traceparent_is_counted_on_the_metrics(backend: Backend) {
        let app = App::new(backend).await;
        let mut d = stock_deduct("TR-BAD", "M-BAD", "U-BAD", "SKU-W", 1);
        d.properties
            .insert(TRACEPARENT_PROPERTY.to_owned(), format!("00-{}-00f067aa0ba902b7-01", T1.to_uppercase()));
        assert_eq!(app.deliver(&d).await, Outcome::Processed);
        let reason = |r: &str| {
            format!("idemgate_invalid_traceparents_total{{consumer_group=\"{GROUP}\",reason=\"{r}\"}}")
        };
        assert_eq!(app.inner.metric(&reason("uppercase")).await, 1.0);
        assert_eq!(app.inner.metric(&reason("length")).await, 0.0, "the other reasons start at 0");
        let (_, json) = app.json("/api/trace/TR-BAD").await;
        assert_eq!(json["story"]["deliveries"][0]["trace_id"], Value::Null);
        assert_eq!(json["story"]["traces"], Value::Array(vec![]));
    }

    /// A search by trace id reads `delivery_log_trace_id` with the trace id fixed, among
    /// thousands of rows with other trace ids and none, and so does the story of a message
    /// without a bizId found by it.
    pub async fn a_search_by_trace_id_reads_its_own_index(backend: Backend) {
        let app = App::new(backend).await;
        let store = &app.db().store;
        let now = idemgate::clock::now_ms();
        let row =
            format!("(?, 'web-1', '{GROUP}', ?, 'U-P', 'shop', 0, 0, 0, 'stock.deduct', ?, 0, ?, 100, ?)");
        for chunk in (0..6_000i64).collect::<Vec<_>>().chunks(500) {
            let sql = format!(
                "INSERT INTO delivery_log (logged_at_ms, instance_id, consumer_group, msg_id, uniq_key, topic, \
                 queue_id, queue_offset, reconsume_times, biz_type, biz_id, execute_time, outcome, latency_us, \
                 trace_id) VALUES {}",
                vec![row.as_str(); chunk.len()].join(", ")
            );
            let q = chunk.iter().fold(query_built(backend, sql), |q, i| {
                // A third keyless and invalid, a third without a trace id.
                let (biz_id, outcome) =
                    if i % 3 == 0 { (String::new(), "invalid") } else { (format!("D-{i}"), "processed") };
                let trace_id = (i % 3 != 1).then(|| format!("{:032x}", i + 1));
                q.bind(now + i).bind(format!("M-P-{i}")).bind(biz_id).bind(outcome).bind(trace_id)
            });
            q.execute(store.pool()).await.expect("log rows");
        }
        let keyless = KeyRef {
            consumer_group: GROUP.to_owned(),
            biz_type: "stock.deduct".to_owned(),
            biz_id: String::new(),
            execute_time: 0,
        };
        let trace_id = format!("{:032x}", 3_001);
        for statement in statements_by_trace_id(&trace_id, &keyless) {
            let reads = plan::reads(store, &statement).await.expect("plan");
            // A day partition still to come holds nothing; its plan is whatever costs least on
            // nothing.
            let log: Vec<_> =
                reads.iter().filter(|r| r.table == "delivery_log" && !r.empty_partition).collect();
            assert!(!log.is_empty(), "{}: no read of the log in {reads:#?}", statement.name);
            for read in &log {
                assert_eq!(
                    read.index.as_deref(),
                    Some("delivery_log_trace_id"),
                    "{}: {read}",
                    statement.name
                );
                assert!(read.fixed.iter().any(|c| c == "trace_id"), "{}: {read}", statement.name);
            }
        }
        let (status, json) = app.json(&format!("/api/trace?q={trace_id}")).await;
        assert_eq!(status, StatusCode::OK, "{json}");
        assert_eq!(json["story"]["deliveries"][0]["msg_id"], "M-P-3000", "{json}");
        assert_eq!(json["story"]["summary"]["deliveries"], 1, "{json}");
    }
}

on_every_backend!(
    the_trace_page_links_each_trace_through_the_template,
    without_a_template_the_trace_id_is_shown_as_text,
    a_trace_id_finds_the_keys_of_its_messages,
    an_unreadable_traceparent_is_counted_on_the_metrics,
    a_search_by_trace_id_reads_its_own_index,
);
