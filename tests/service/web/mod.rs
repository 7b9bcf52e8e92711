//! The web UI and the JSON API through `tower::ServiceExt::oneshot`, on SQLite, PostgreSQL and
//! MariaDB: deliveries go through the real gate into a real database, then each page, JSON
//! endpoint and error path is requested. Hostile and SQL-looking input must round-trip escaped
//! and harmless; bad input must get a 400 that says why, never a 500.

use crate::conformance::support;

mod dashboard;
mod hot_key;
mod traces;

use std::sync::Arc;

use axum::body::Body;
use axum::http::{Request, StatusCode, header};
use idemgate::config::Settings;
use idemgate::delivery::Delivery;
use idemgate::gate::Policy;
use idemgate::handler::Handlers;
use idemgate::http::Web;
use idemgate::outcome::Outcome;
use idemgate::store::{Sql, Store, StoreOptions};
use idemgate_shop as shop;
use idemgate_testkit::app::{TestApp, spawn_app_on};
use idemgate_testkit::scratch::ScratchDb;
use serde_json::Value;
use support::stock_deduct;

const GROUP: &str = "shop-web";

/// The service as `serve` assembles it (the test kit's [`TestApp`]), started and fed by the
/// test, its routes called without the network.
struct App {
    inner: TestApp,
    /// The pages' state of this service: its form tokens hold across requests.
    web: Arc<Web>,
}

impl App {
    async fn new(backend: idemgate::store::Backend) -> Self {
        Self::with_settings(backend, shop::settings()).await
    }

    /// The service with `settings` (their database, address, group and instance the test's).
    async fn with_settings(backend: idemgate::store::Backend, settings: Settings) -> Self {
        let options = StoreOptions { max_connections: 24, ..Default::default() };
        let db = ScratchDb::create(backend, &options)
            .await
            .unwrap_or_else(|e| panic!("{e}. Start the service (scripts/services.sh)."));
        shop::seed_stock(&db.store, "SKU-W", 1_000).await.expect("stock");
        let configure = move |s: &mut Settings| {
            let url = std::mem::take(&mut s.database.url);
            *s = settings;
            s.database.url = url;
            s.http.bind = "127.0.0.1:0".to_owned();
            s.consumer.group = GROUP.to_owned();
            s.consumer.instance = "web-1".to_owned();
        };
        let inner = spawn_app_on(db, configure, Handlers::new()).await;
        let web = inner.web.clone();
        Self { inner, web }
    }

    /// The service's database.
    fn db(&self) -> &ScratchDb {
        &self.inner.db
    }

    /// A second, independent pool on the service's database: another process, as far as the
    /// database can tell.
    async fn second_store(&self) -> Store {
        let options = StoreOptions { max_connections: 4, ..Default::default() };
        self.inner.db.second_store(&options).await.expect("second pool")
    }

    async fn deliver(&self, d: &Delivery) -> Outcome {
        self.inner.gate().process(d).await.outcome
    }

    async fn get(&self, uri: &str) -> (StatusCode, String, axum::http::HeaderMap) {
        self.request(Request::get(uri).body(Body::empty()).expect("request")).await
    }

    async fn request(&self, request: Request<Body>) -> (StatusCode, String, axum::http::HeaderMap) {
        self.inner.oneshot(request).await
    }

    async fn json(&self, uri: &str) -> (StatusCode, Value) {
        let (status, body, headers) = self.get(uri).await;
        assert_eq!(
            headers.get(header::CONTENT_TYPE).and_then(|v| v.to_str().ok()),
            Some("application/json"),
            "{uri}: {body}"
        );
        (status, serde_json::from_str(&body).unwrap_or_else(|e| panic!("{uri}: {e}: {body}")))
    }
}

/// A payment of 500 cents, as these tests send them.
fn payment(payment_no: &str, order_no: &str, msg_id: &str, uniq_key: &str, reconsume: i32) -> Delivery {
    support::payment(payment_no, order_no, 500, msg_id, uniq_key, reconsume)
}

/// An order of SKU-W for 500 cents.
fn order(order_no: &str, msg_id: &str) -> Delivery {
    support::order(order_no, "SKU-W", 500, msg_id, &format!("U-{msg_id}"))
}

fn count(html: &str, needle: &str) -> usize {
    html.matches(needle).count()
}

mod cases {
    use super::*;

    /// One key with every kind of event: processed, a producer's retry, a producer resend and
    /// a resend with a different body (a collision); the page and the JSON tell each apart.
    pub async fn the_trace_tells_the_whole_story_of_a_key(backend: idemgate::store::Backend) {
        let app = App::new(backend).await;
        assert_eq!(app.deliver(&stock_deduct("D-77", "M1", "U1", "SKU-W", 2)).await, Outcome::Processed);
        assert_eq!(app.deliver(&stock_deduct("D-77", "M2", "U1", "SKU-W", 2)).await, Outcome::Duplicate);
        assert_eq!(app.deliver(&stock_deduct("D-77", "M3", "U2", "SKU-W", 2)).await, Outcome::Duplicate);
        assert_eq!(app.deliver(&stock_deduct("D-77", "M4", "U3", "SKU-W", 5)).await, Outcome::Duplicate);

        let (status, html, headers) = app.get("/trace?biz_id=D-77").await;
        assert_eq!(status, StatusCode::OK, "{html}");
        assert!(headers.get(header::CONTENT_SECURITY_POLICY).is_some());
        assert!(html.contains("applied once"), "{html}");
        assert!(html.contains(">live<"), "the dedup record is live");
        assert!(html.contains("M1") && html.contains("M4"));
        assert_eq!(count(&html, "row-ok"), 1, "one processed row");
        assert_eq!(count(&html, "row-dup"), 2, "two plain duplicates");
        assert_eq!(count(&html, "row-collision"), 1, "one collision");
        assert!(html.contains("BODY DIFFERS"));
        assert!(html.contains("producer resend") && html.contains("producer retry"));
        assert!(html.contains("Producer retry: the same id U1"), "each duplicate says why, in words");
        assert!(html.contains("ledger row") && html.contains("2 × SKU-W"), "the stock ledger is shown");

        let (status, json) = app.json("/api/trace/D-77?biz_type=stock.deduct").await;
        assert_eq!(status, StatusCode::OK);
        assert_eq!(json["found"], "story");
        let story = &json["story"];
        assert_eq!(story["claim"]["msg_id"], "M1");
        assert_eq!(story["claim"]["state"], "live");
        assert_eq!(story["summary"]["deliveries"], 4);
        assert_eq!(story["summary"]["processed"], 1);
        assert_eq!(story["summary"]["collisions"], 1);
        assert_eq!(story["summary"]["duplicates"]["producer_retry"], 1);
        assert_eq!(story["summary"]["duplicates"]["producer_resend"], 2);
        assert_eq!(story["summary"]["final_state"], "applied");
        let msg_ids: Vec<&str> =
            story["deliveries"].as_array().unwrap().iter().map(|d| d["msg_id"].as_str().unwrap()).collect();
        assert_eq!(msg_ids, ["M1", "M2", "M3", "M4"], "oldest first");

        // The same story by msgId and by UNIQ_KEY.
        let (_, by_msg) = app.json("/api/trace?q=M3").await;
        assert_eq!(
            (by_msg["matched_by"].as_str(), by_msg["story"]["key"]["biz_id"].as_str()),
            (Some("msg_id"), Some("D-77"))
        );
        let (_, by_uniq) = app.json("/api/trace?uniq_key=U3").await;
        assert_eq!(by_uniq["story"]["key"]["biz_id"], "D-77");
    }

    /// A payment retried, then dead-lettered: never claimed, the rows stand out, the state says
    /// so and the dead-letter list has it.
    pub async fn retries_and_dead_letters_stand_out(backend: idemgate::store::Backend) {
        let app = App::new(backend).await;
        let last = Policy::default().max_reconsume_times;
        assert_eq!(app.deliver(&payment("P-9", "O-none", "M1", "U1", 0)).await, Outcome::Failed);
        assert_eq!(app.deliver(&payment("P-9", "O-none", "M2", "U1", 1)).await, Outcome::Failed);
        assert_eq!(app.deliver(&payment("P-9", "O-none", "M3", "U1", last)).await, Outcome::DeadLettered);

        let (status, html, _) = app.get("/trace?q=P-9").await;
        assert_eq!(status, StatusCode::OK);
        assert!(html.contains("dead-lettered: never applied"), "{html}");
        assert!(html.contains("No dedup record"));
        assert_eq!(count(&html, "row-retry"), 2);
        assert_eq!(count(&html, "row-dead"), 1);
        assert!(html.contains("no order is paid by this payment"), "business state of payment.confirm");

        let (_, json) = app.json("/api/trace/P-9").await;
        assert_eq!(json["story"]["summary"]["final_state"], "dead_lettered");
        assert_eq!(json["story"]["summary"]["retries"], 2);
        assert_eq!(json["story"]["claim"], Value::Null);

        let (_, list) = app.json("/api/dead-letters").await;
        assert_eq!(list["rows"].as_array().unwrap().len(), 1);
        assert_eq!(list["rows"][0]["biz_id"], "P-9");
        let (status, page, _) = app.get("/dead-letters").await;
        assert_eq!(status, StatusCode::OK);
        assert!(page.contains("/trace?biz_id=P-9"), "each row links to its trace: {page}");
        assert!(page.contains("still unapplied"), "an unresolved dead letter says so: {page}");

        let (_, overview) = app.json("/api/overview").await;
        assert_eq!(overview["last_5_minutes"]["deliveries"], 3);
        assert_eq!(overview["last_5_minutes"]["retries"], 2);
        assert_eq!(overview["last_5_minutes"]["dead_letters"], 1);
        assert_eq!(overview["latest_dead_letters"][0]["msg_id"], "M3");
        let minutes = overview["minutes"].as_array().unwrap();
        assert!(minutes.len() >= 60, "a bar per minute of the hour");
        assert_eq!(minutes.iter().map(|m| m["deliveries"].as_i64().unwrap()).sum::<i64>(), 3);
        let (status, html, _) = app.get("/").await;
        assert_eq!(status, StatusCode::OK);
        assert!(html.contains("<svg") && html.contains("Latest dead letters") && html.contains("P-9"));
    }

    /// A database whose log began 30 s ago, at 100 deliveries a second: the overview's windows
    /// show 100/s over the 30 s the log covers, not the 10/s of 3,000 deliveries over 300 s, and
    /// their cards say what the rate is over.
    pub async fn rates_are_over_the_time_the_log_covers(backend: idemgate::store::Backend) {
        let app = App::new(backend).await;
        let store = &app.db().store;
        let first = idemgate::clock::now_ms() - 30_000;
        let row =
            format!("(?, 'web-1', '{GROUP}', ?, 'shop', 0, 0, 0, 'stock.deduct', ?, 0, 'processed', 100)");
        for chunk in (0..3_000i64).collect::<Vec<_>>().chunks(500) {
            let sql = format!(
                "INSERT INTO delivery_log (logged_at_ms, instance_id, consumer_group, msg_id, topic, queue_id, \
                 queue_offset, reconsume_times, biz_type, biz_id, execute_time, outcome, latency_us) VALUES {}",
                vec![row.as_str(); chunk.len()].join(", ")
            );
            let q = chunk.iter().fold(idemgate::store::query_built(store.backend(), sql), |q, i| {
                q.bind(first + i * 10).bind(format!("M-{i}")).bind(format!("D-{i}"))
            });
            q.execute(store.pool()).await.expect("log rows");
        }

        let (status, overview) = app.json("/api/overview").await;
        assert_eq!(status, StatusCode::OK);
        for window in ["last_5_minutes", "last_hour"] {
            let w = &overview[window];
            assert_eq!(w["deliveries"], 3_000, "{w}");
            let covered = w["covered_seconds"].as_f64().expect("covered_seconds");
            assert!((30.0..40.0).contains(&covered), "the log covers about 30 s: {w}");
            let rate = w["deliveries_per_second"].as_f64().expect("rate");
            assert!((3_000.0 / covered - rate).abs() < 1e-6 && rate > 75.0, "{window}: {rate}/s: {w}");
        }

        let (status, html, _) = app.get("/").await;
        assert_eq!(status, StatusCode::OK);
        let said: Vec<i64> = html
            .split("rates over the last ")
            .skip(1)
            .filter_map(|rest| rest.split_once(" s (all the data there is)"))
            .filter_map(|(n, _)| n.parse().ok())
            .collect();
        assert_eq!(said.len(), 2, "both cards say what their rates are over: {html}");
        assert!(said.iter().all(|s| (30..40).contains(s)), "{said:?}");
    }

    /// Hostile keys are refused at the gate and logged as invalid; looking them up shows them
    /// escaped, and SQL-looking searches find nothing rather than everything.
    pub async fn hostile_and_sql_looking_input_round_trips_harmlessly(backend: idemgate::store::Backend) {
        let app = App::new(backend).await;
        let xss = "<script>alert(1)</script>";
        assert_eq!(app.deliver(&stock_deduct(xss, "M-XSS", "U-XSS", "SKU-W", 1)).await, Outcome::Invalid);
        let sql = "D-1' OR '1'='1";
        assert_eq!(app.deliver(&stock_deduct(sql, "M-SQL", "U-SQL", "SKU-W", 1)).await, Outcome::Invalid);
        // Legal keys with URL-special and non-ASCII characters.
        let odd = "A/B#1+2=3|x~y@z";
        assert_eq!(app.deliver(&stock_deduct(odd, "M-ODD", "U-ODD", "SKU-W", 1)).await, Outcome::Processed);
        let han = "订单-1";
        assert_eq!(app.deliver(&stock_deduct(han, "M-HAN", "U-HAN", "SKU-W", 1)).await, Outcome::Processed);

        let (status, html, _) = app.get("/invalid").await;
        assert_eq!(status, StatusCode::OK);
        assert!(!html.contains(xss), "never rendered raw");
        assert!(html.contains("&#60;script&#62;alert(1)&#60;/script&#62;"), "escaped: {html}");

        let (status, html, _) = app.get("/trace?q=M-XSS").await;
        assert_eq!(status, StatusCode::OK, "{html}");
        assert!(!html.contains("<script>"));
        assert!(html.contains("invalid: refused before the claim"), "{html}");

        // The hostile bizId is findable as it was sent: the invalid message, shown escaped.
        let uri = format!("/trace?{}", serde_urlencoded::to_string([("biz_id", xss)]).unwrap());
        let (status, html, _) = app.get(&uri).await;
        assert_eq!(status, StatusCode::OK, "{html}");
        assert!(!html.contains(xss) && html.contains("invalid: refused before the claim"), "{html}");
        let (_, json) = app.json(&uri.replacen("/trace", "/api/trace", 1)).await;
        assert_eq!(json["story"]["key"]["biz_id"], xss, "the JSON carries the exact text");

        // SQL-looking and wildcard searches match nothing: they are values, not SQL.
        for search in [sql, "' OR 1=1 --", "%", "_", "*"] {
            let uri = format!("/api/trace?{}", serde_urlencoded::to_string([("biz_id", search)]).unwrap());
            let (status, json) = app.json(&uri).await;
            assert_eq!(status, StatusCode::NOT_FOUND, "{search}: {json}");
            let (status, html, _) = app.get(&uri.replacen("/api", "", 1)).await;
            assert_eq!(status, StatusCode::NOT_FOUND);
            assert!(!html.contains("<script>alert"), "{search}");
        }
        let (_, rows) = app.json("/api/invalid").await;
        assert_eq!(rows["rows"].as_array().unwrap().len(), 2, "both hostile messages are kept and listed");

        for key in [odd, han] {
            let path = serde_urlencoded::to_string([("", key)]).unwrap()[1..].replace('+', "%20");
            let (status, json) = app.json(&format!("/api/trace/{path}")).await;
            assert_eq!(status, StatusCode::OK, "{key}: {json}");
            assert_eq!(json["story"]["key"]["biz_id"], key);
            let (status, html, _) =
                app.get(&format!("/trace?{}", serde_urlencoded::to_string([("q", key)]).unwrap())).await;
            assert_eq!(status, StatusCode::OK);
            assert!(html.contains("applied once"), "{key}");
        }
    }

    /// Bad parameters get a 400 page (or JSON) that says what is wrong; nothing gets a 500.
    pub async fn bad_input_gets_a_400_that_explains(backend: idemgate::store::Backend) {
        let app = App::new(backend).await;
        let long = "x".repeat(300);
        let cases = [
            (format!("/trace?q={long}"), "300 characters"),
            ("/trace?q=a%00b".to_owned(), "control character"),
            (
                "/trace?q=O-1&execute_time=tomorrow".to_owned(),
                "neither epoch milliseconds nor an RFC 3339 time",
            ),
            ("/trace?q=O-1&by=sql".to_owned(), "is not one of"),
            ("/dead-letters?before=1;DROP".to_owned(), "page cursor"),
            ("/dead-letters?limit=0".to_owned(), "limit must be"),
            ("/collisions?since=last+tuesday".to_owned(), "is not a moment"),
            ("/invalid?since=2026-11-29T10:00&until=2026-11-28T10:00".to_owned(), "since is after until"),
            (format!("/invalid?biz_type={}", "t".repeat(65)), "65 characters"),
            (format!("/trace?q={}", "y".repeat(5000)), "query string"),
        ];
        for (uri, why) in &cases {
            let (status, html, _) = app.get(uri).await;
            assert_eq!(status, StatusCode::BAD_REQUEST, "{uri}: {html}");
            assert!(html.contains(why), "{uri} should say {why:?}: {html}");
            assert!(html.contains("<form class=\"search\""), "the error page keeps the search box");
            let (status, json) = app.json(&uri.replacen('/', "/api/", 1)).await;
            assert_eq!(status, StatusCode::BAD_REQUEST, "{uri}");
            assert!(json["error"].as_str().unwrap().contains(why), "{uri}: {json}");
            assert_eq!(json["status"], 400);
        }
        let (status, html, _) = app.get("/no/such/page").await;
        assert_eq!(status, StatusCode::NOT_FOUND);
        assert!(html.contains("There is no page here"));
        let (status, json) = app.json("/api/nothing").await;
        assert_eq!((status, json["status"].as_i64()), (StatusCode::NOT_FOUND, Some(404)));
        let (status, _, _) = app.request(Request::post("/trace?q=x").body(Body::empty()).unwrap()).await;
        assert_eq!(status, StatusCode::METHOD_NOT_ALLOWED, "no page changes state, and none takes a POST");
    }

    /// The same bizId under two biz_types: the page offers the choice; a biz_type picks one.
    pub async fn several_matches_offer_a_choice(backend: idemgate::store::Backend) {
        let app = App::new(backend).await;
        assert_eq!(app.deliver(&stock_deduct("SAME-1", "M1", "U1", "SKU-W", 1)).await, Outcome::Processed);
        assert_eq!(app.deliver(&order("SAME-1", "M2")).await, Outcome::Processed);

        let (status, html, _) = app.get("/trace?q=SAME-1").await;
        assert_eq!(status, StatusCode::OK);
        assert!(html.contains("matches 2 keys"), "{html}");
        assert!(html.contains("biz_type=stock.deduct") && html.contains("biz_type=order.create"));
        let (_, json) = app.json("/api/trace?q=SAME-1").await;
        assert_eq!(json["found"], "choice");
        assert_eq!(json["candidates"].as_array().unwrap().len(), 2);

        let (_, json) = app.json("/api/trace?q=SAME-1&biz_type=order.create").await;
        assert_eq!(json["found"], "story");
        let facts = json["story"]["business"].as_array().unwrap();
        assert!(facts.iter().any(|f| f["label"] == "status" && f["value"] == "UNPAID"), "{facts:?}");

        let (_, json) = app.json("/api/trace?q=SAME-1&biz_type=payment.confirm").await;
        assert_eq!(json["found"], "choice", "a filter that matches none lists what exists");
        assert!(json["note"].as_str().unwrap().contains("not with the biz_type"));
    }

    /// Lists page with a cursor, filter by biz_type and time, and agree with their JSON.
    pub async fn lists_page_and_filter(backend: idemgate::store::Backend) {
        let app = App::new(backend).await;
        let last = Policy::default().max_reconsume_times;
        for i in 0..7 {
            let d = payment(&format!("P-{i}"), "O-none", &format!("M{i}"), &format!("U{i}"), last);
            assert_eq!(app.deliver(&d).await, Outcome::DeadLettered);
        }
        // A stock deduction that can never apply is refused for good: dead-lettered at once.
        assert_eq!(
            app.deliver(&stock_deduct("D-big", "MB", "UB", "SKU-W", 1_000_000)).await,
            Outcome::DeadLettered
        );

        let (_, first) = app.json("/api/dead-letters?limit=3").await;
        let ids = |page: &Value| -> Vec<String> {
            page["rows"]
                .as_array()
                .unwrap()
                .iter()
                .map(|r| r["biz_id"].as_str().unwrap().to_owned())
                .collect()
        };
        assert_eq!(ids(&first), ["D-big", "P-6", "P-5"], "newest first");
        let next = first["next"].as_str().expect("a next page").to_owned();
        let (_, second) = app.json(&format!("/api/dead-letters?limit=3&before={next}")).await;
        assert_eq!(ids(&second), ["P-4", "P-3", "P-2"]);
        let (_, third) =
            app.json(&format!("/api/dead-letters?limit=3&before={}", second["next"].as_str().unwrap())).await;
        assert_eq!(ids(&third), ["P-1", "P-0"]);
        assert_eq!(third["next"], Value::Null);

        let (status, html, _) = app.get("/dead-letters?limit=3").await;
        assert_eq!(status, StatusCode::OK);
        assert!(html.contains(&format!("before={next}")), "an Older link carries the cursor");

        let (_, stock) = app.json("/api/dead-letters?biz_type=stock.deduct").await;
        assert_eq!(ids(&stock), ["D-big"]);
        let (_, all) = app.json("/api/dead-letters?biz_type=.*").await;
        assert_eq!(ids(&all).len(), 8, "Grafana's All");
        let (_, none) = app.json("/api/dead-letters?until=2000-01-01T00:00").await;
        assert_eq!(ids(&none).len(), 0);
        let (_, since) = app.json("/api/dead-letters?since=2000-01-01T00:00").await;
        assert_eq!(ids(&since).len(), 8);
        let (_, collisions) = app.json("/api/collisions").await;
        assert_eq!(ids(&collisions).len(), 0);
    }

    /// A claim older than the delivery log's retention: the record shows, with the note that
    /// its deliveries are no longer listed.
    pub async fn history_beyond_the_log_retention_is_noted(backend: idemgate::store::Backend) {
        static OLD_CLAIM: Sql = Sql::new(
            "INSERT INTO idempotent_record (consumer_group, biz_type, biz_id, execute_time, msg_id, uniq_key, \
             payload_hash, instance_id, claimed_at_ms) VALUES (?, 'stock.deduct', 'D-OLD', 0, 'M-OLD', '', 'h', 'i', ?)",
        );
        let app = App::new(backend).await;
        let forty_days_ago = idemgate::clock::now_ms() - 40 * 86_400_000;
        app.db()
            .store
            .query(&OLD_CLAIM)
            .bind(GROUP)
            .bind(forty_days_ago)
            .execute(app.db().store.pool())
            .await
            .unwrap();
        let (status, html, _) = app.get("/trace?biz_id=D-OLD").await;
        assert_eq!(status, StatusCode::OK, "{html}");
        assert!(html.contains("The delivery log keeps 14 days"), "{html}");
        assert!(html.contains("M-OLD") && html.contains("The delivery log holds no delivery of this key"));
        let (status, html, _) = app.get("/archive").await;
        assert_eq!(status, StatusCode::OK);
        assert!(html.contains("No run yet") && html.contains("0 0 3 * * *"));
    }

    /// The reconciler's findings: the anomalies page, its filter and JSON, the overview's box and
    /// the metrics, all from the stored run.
    pub async fn anomalies_are_listed_with_links_to_their_traces(backend: idemgate::store::Backend) {
        let app = App::new(backend).await;
        let last = Policy::default().max_reconsume_times;
        assert_eq!(app.deliver(&payment("P-LOST", "O-none", "M1", "U1", last)).await, Outcome::DeadLettered);
        assert_eq!(app.deliver(&stock_deduct("D-C", "M2", "U2", "SKU-W", 1)).await, Outcome::Processed);
        assert_eq!(app.deliver(&stock_deduct("D-C", "M3", "U3", "SKU-W", 4)).await, Outcome::Duplicate);
        let (_, html, _) = app.get("/anomalies").await;
        assert!(html.contains("No successful reconcile run yet"), "{html}");

        let now = idemgate::clock::now_ms();
        let options = idemgate::reconcile::ReconcileOptions {
            consumer_group: GROUP.to_owned(),
            biz_type: None,
            since_ms: now - 60_000,
            until_ms: now + 1,
            stuck_after_ms: 1_800_000,
            log_retention_ms: 14 * 86_400_000,
            max_per_kind: 100,
            instance_id: "web-1".to_owned(),
            started_by: "command".to_owned(),
        };
        let report =
            idemgate::reconcile::reconcile_once(&app.db().store, &options, &[], now).await.expect("run");
        assert_eq!(report.anomalies.len(), 2, "{report:?}");

        let (status, html, _) = app.get("/anomalies").await;
        assert_eq!(status, StatusCode::OK);
        assert!(html.contains("lost 1") && html.contains("key collision 1"), "{html}");
        assert!(html.contains("/trace?biz_id=P-LOST") && html.contains("/trace?biz_id=D-C"), "{html}");
        let (_, html, _) = app.get("/anomalies?kind=lost").await;
        assert!(html.contains("P-LOST") && !html.contains("/trace?biz_id=D-C"), "{html}");
        let (_, json) = app.json("/api/anomalies?kind=key_collision").await;
        assert_eq!(json["anomalies"].as_array().unwrap().len(), 1);
        assert_eq!(json["anomalies"][0]["biz_id"], "D-C");
        assert_eq!(json["counts"]["lost"], 1);
        let (status, html, _) = app.get("/anomalies?kind=everything").await;
        assert_eq!(status, StatusCode::BAD_REQUEST);
        assert!(html.contains("is not one of lost, stuck"), "{html}");
        assert_eq!(app.get("/anomalies?run=99999").await.0, StatusCode::NOT_FOUND);
        let (_, html, _) = app.get("/").await;
        assert!(html.contains("Reconcile anomalies") && html.contains("lost 1"), "{html}");
        let (_, metrics, _) = app.get("/metrics").await;
        let metrics = idemgate_testkit::app::without_broker(&metrics);
        let line = format!("idemgate_reconcile_anomalies{{consumer_group=\"{GROUP}\",kind=\"lost\"}} 1");
        assert!(metrics.contains(&line), "{line} in:\n{metrics}");
        assert!(metrics.contains("idemgate_reconcile_last_run_timestamp_seconds{"), "{metrics}");
    }

    /// The instances page: this run, running, with its start on record, and the duplicates it
    /// logged by cause; a redelivery's sub-cause once this run has read it from its record (the
    /// same instance handed the same copy again with nothing on record: `unattributed`).
    pub async fn the_instances_page_shows_each_run_and_its_duplicates_by_cause(
        backend: idemgate::store::Backend,
    ) {
        let app = App::new(backend).await;
        assert_eq!(app.deliver(&stock_deduct("D-I", "M1", "U1", "SKU-W", 1)).await, Outcome::Processed);
        assert_eq!(app.deliver(&stock_deduct("D-I", "M1", "U1", "SKU-W", 1)).await, Outcome::Duplicate);
        assert_eq!(app.deliver(&stock_deduct("D-I", "M2", "U1", "SKU-W", 1)).await, Outcome::Duplicate);
        let started = std::time::Instant::now();
        let json = loop {
            let (status, json) = app.json("/api/instances").await;
            assert_eq!(status, StatusCode::OK);
            let attributed = json["runs"][0]["duplicates"]["redelivery/unattributed"] == 1;
            if attributed || started.elapsed() > std::time::Duration::from_secs(20) {
                break json;
            }
            tokio::time::sleep(std::time::Duration::from_millis(250)).await;
        };
        let run = &json["runs"][0];
        assert_eq!(json["runs"].as_array().map(Vec::len), Some(1), "{json}");
        assert_eq!(
            (run["instance_id"].as_str(), run["state"].as_str()),
            (Some("web-1"), Some("running")),
            "{json}"
        );
        assert_eq!(run["duplicates"]["redelivery/unattributed"], 1, "{json}");
        assert_eq!(run["duplicates"]["producer_retry"], 1, "{json}");
        let kinds: Vec<&str> =
            json["events"].as_array().unwrap().iter().filter_map(|e| e["kind"].as_str()).collect();
        assert_eq!(kinds, ["started"], "{json}");
        let (status, html, _) = app.get("/instances").await;
        assert_eq!(status, StatusCode::OK);
        assert!(html.contains("web-1") && html.contains(">running<"), "{html}");
        assert!(
            html.contains("<b>1</b> redelivery/unattributed") && html.contains("<b>1</b> producer retry"),
            "{html}"
        );
        let (_, html, _) = app.get("/trace?biz_id=D-I").await;
        assert!(html.contains("redelivery · unattributed"), "the trace names the sub-cause: {html}");
    }

    /// With credentials configured, everything but health needs them; the token never shows.
    pub async fn credentials_guard_everything_but_health(backend: idemgate::store::Backend) {
        let mut settings = shop::settings();
        settings.http.auth_token = "tok-0123456789abcdef".to_owned();
        settings.http.basic_user = "ops".to_owned();
        settings.http.basic_password = "pa55".to_owned();
        let app = App::with_settings(backend, settings).await;
        for open in ["/healthz", "/readyz"] {
            assert_eq!(app.get(open).await.0, StatusCode::OK, "{open}");
        }
        for guarded in
            ["/", "/trace?q=x", "/dead-letters", "/api/overview", "/metrics", "/archive", "/instances"]
        {
            let (status, body, headers) = app.get(guarded).await;
            assert_eq!(status, StatusCode::UNAUTHORIZED, "{guarded}");
            assert!(headers.get(header::WWW_AUTHENTICATE).is_some());
            assert!(!body.contains("tok-0123456789abcdef"));
            let with = |value: &str| {
                Request::get(guarded).header(header::AUTHORIZATION, value).body(Body::empty()).unwrap()
            };
            // Admitted: whatever the page answers then, it is not a demand for credentials.
            assert_ne!(
                app.request(with("Bearer tok-0123456789abcdef")).await.0,
                StatusCode::UNAUTHORIZED,
                "{guarded}"
            );
            assert_ne!(
                app.request(with("Basic b3BzOnBhNTU=")).await.0,
                StatusCode::UNAUTHORIZED,
                "{guarded}"
            );
            assert_eq!(app.request(with("Bearer wrong")).await.0, StatusCode::UNAUTHORIZED);
        }
    }
}

on_every_backend!(
    the_trace_tells_the_whole_story_of_a_key,
    retries_and_dead_letters_stand_out,
    rates_are_over_the_time_the_log_covers,
    hostile_and_sql_looking_input_round_trips_harmlessly,
    bad_input_gets_a_400_that_explains,
    several_matches_offer_a_choice,
    lists_page_and_filter,
    history_beyond_the_log_retention_is_noted,
    credentials_guard_everything_but_health,
    anomalies_are_listed_with_links_to_their_traces,
    the_instances_page_shows_each_run_and_its_duplicates_by_cause,
);

/// A request for `uri` that names `host` in its `Host` header, as a browser's does.
fn get_with_host(uri: &str, host: &str) -> Request<Body> {
    Request::get(uri).header(header::HOST, host).body(Body::empty()).expect("request")
}

/// The trace page's replay form for `biz_id`, posted under `host` with `extra` headers.
fn replay_post(biz_id: &str, token: &str, host: &str, extra: &[(&str, &str)]) -> Request<Body> {
    let form = serde_urlencoded::to_string([
        ("group", GROUP),
        ("biz_type", shop::PAYMENT_CONFIRM),
        ("biz_id", biz_id),
        ("execute_time", "0"),
        ("csrf", token),
    ])
    .expect("form");
    let mut request = Request::post("/replay")
        .header(header::HOST, host)
        .header(header::CONTENT_TYPE, "application/x-www-form-urlencoded");
    for (name, value) in extra {
        request = request.header(*name, *value);
    }
    request.body(Body::from(form)).expect("request")
}

/// What a replay that passed every check meets in a process without a broker.
const NO_BROKER: &str = "replay is not available here";

/// A page on a rebinding domain reaches this server with its own domain in `Host`: every route
/// but health refuses it (421), before any credentials are asked for. Loopback names, IP
/// addresses (a Prometheus scrape by address) and listed names are served.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_page_asked_for_under_a_foreign_host_name_is_misdirected() {
    let app = App::new(idemgate::store::Backend::Sqlite).await;
    let guarded = [
        "/trace?q=P-1",
        "/",
        "/api/overview",
        "/dead-letters",
        "/metrics",
        "/assets/style.css",
        "/no/such/page",
    ];
    for uri in guarded {
        let (status, body, _) = app.request(get_with_host(uri, "evil.example:8080")).await;
        assert_eq!(status, StatusCode::MISDIRECTED_REQUEST, "{uri}: {body}");
        assert!(body.contains("http.allowed_hosts"), "{uri}: {body}");
    }
    for uri in ["/healthz", "/readyz"] {
        assert_eq!(app.request(get_with_host(uri, "evil.example:8080")).await.0, StatusCode::OK, "{uri}");
    }
    for host in ["127.0.0.1:8080", "localhost:8080", "LocalHost", "[::1]:8080", "10.1.2.3:9100"] {
        let (status, body, _) = app.request(get_with_host("/", host)).await;
        assert_eq!(status, StatusCode::OK, "{host}: {body}");
        assert_eq!(app.request(get_with_host("/metrics", host)).await.0, StatusCode::OK, "{host}");
    }
    let absolute = Request::get("http://evil.example:8080/")
        .header(header::HOST, "127.0.0.1:8080")
        .body(Body::empty())
        .unwrap();
    assert_eq!(app.request(absolute).await.0, StatusCode::MISDIRECTED_REQUEST, "the URI's host counts too");
    let twice = Request::get("/")
        .header(header::HOST, "127.0.0.1:8080")
        .header(header::HOST, "evil.example:8080")
        .body(Body::empty())
        .unwrap();
    assert_eq!(app.request(twice).await.0, StatusCode::MISDIRECTED_REQUEST, "two Host headers");

    let mut settings = shop::settings();
    settings.http.allowed_hosts = vec!["idemgate.example.com".to_owned()];
    settings.http.auth_token = "tok-0123456789abcdef".to_owned();
    let listed = App::with_settings(idemgate::store::Backend::Sqlite, settings).await;
    let signed_in = |host: &str| {
        Request::get("/")
            .header(header::HOST, host)
            .header(header::AUTHORIZATION, "Bearer tok-0123456789abcdef")
            .body(Body::empty())
            .unwrap()
    };
    assert_eq!(listed.request(signed_in("IDEMGATE.example.com:443")).await.0, StatusCode::OK);
    assert_eq!(listed.request(signed_in("evil.example")).await.0, StatusCode::MISDIRECTED_REQUEST);
    let (status, _, headers) = listed.request(get_with_host("/", "evil.example")).await;
    assert_eq!(
        status,
        StatusCode::MISDIRECTED_REQUEST,
        "the host is refused before credentials are asked for"
    );
    assert!(headers.get(header::WWW_AUTHENTICATE).is_none(), "no sign-in prompt for a foreign page");
    assert_eq!(listed.request(get_with_host("/healthz", "10.244.0.7:8080")).await.0, StatusCode::OK);
}

/// The rebinding attack on replay: the form posted with a matching `Origin` and `Host`, both the
/// attacker's domain, and a token read from the trace page. Refused for its host name.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_replay_posted_from_a_rebinding_domain_is_refused() {
    let app = App::new(idemgate::store::Backend::Sqlite).await;
    let token = app.web.replay_token(GROUP, shop::PAYMENT_CONFIRM, "P-1", 0, std::time::SystemTime::now());
    let rebound = replay_post("P-1", &token, "evil.example:8080", &[("origin", "http://evil.example:8080")]);
    let (status, body, _) = app.request(rebound).await;
    assert_eq!(status, StatusCode::MISDIRECTED_REQUEST, "{body}");
    assert!(!body.contains(NO_BROKER), "{body}");

    let own = replay_post("P-1", &token, "127.0.0.1:8080", &[("origin", "http://127.0.0.1:8080")]);
    let (status, body, _) = app.request(own).await;
    assert_eq!(status, StatusCode::FORBIDDEN);
    assert!(body.contains(NO_BROKER), "the same form from the page's own origin passes every check: {body}");
}

/// A state-changing request the browser marks as coming from another site is refused, whatever
/// its token; `Sec-Fetch-Site: same-origin` and a matching `Origin` go on.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_replay_the_browser_says_comes_from_another_site_is_refused() {
    let app = App::new(idemgate::store::Backend::Sqlite).await;
    let token = app.web.replay_token(GROUP, shop::PAYMENT_CONFIRM, "P-1", 0, std::time::SystemTime::now());
    let host = "127.0.0.1:8080";
    for site in ["cross-site", "same-site", "none"] {
        let (status, body, _) =
            app.request(replay_post("P-1", &token, host, &[("sec-fetch-site", site)])).await;
        assert_eq!(status, StatusCode::FORBIDDEN, "{site}");
        assert!(body.contains("comes from another site"), "{site}: {body}");
    }
    let foreign_origin = [("origin", "http://evil.example"), ("sec-fetch-site", "same-origin")];
    let (status, body, _) = app.request(replay_post("P-1", &token, host, &foreign_origin)).await;
    assert_eq!(status, StatusCode::FORBIDDEN);
    assert!(body.contains("this site&#39;s own page") || body.contains("this site's own page"), "{body}");
    let same = [("origin", "http://127.0.0.1:8080"), ("sec-fetch-site", "same-origin")];
    let (_, body, _) = app.request(replay_post("P-1", &token, host, &same)).await;
    assert!(body.contains(NO_BROKER), "{body}");
}

/// A replay form's token lasts `http.csrf_token_ttl_seconds` (an hour by default): an older
/// one is refused with a request to reload the page; one for another key, or in the old
/// never-expiring form, is not valid at all.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_expired_replay_token_is_refused_with_a_request_to_reload_the_page() {
    let app = App::new(idemgate::store::Backend::Sqlite).await;
    let now = std::time::SystemTime::now();
    let two_hours_ago = now - std::time::Duration::from_secs(7_200);
    let old = app.web.replay_token(GROUP, shop::PAYMENT_CONFIRM, "P-1", 0, two_hours_ago);
    let (status, body, _) = app.request(replay_post("P-1", &old, "127.0.0.1:8080", &[])).await;
    assert_eq!(status, StatusCode::FORBIDDEN);
    assert!(body.contains("expired") && body.contains("reload the trace page"), "{body}");

    let other_key = app.web.replay_token(GROUP, shop::PAYMENT_CONFIRM, "P-2", 0, now);
    for refused in [other_key, "0".repeat(64)] {
        let (status, body, _) = app.request(replay_post("P-1", &refused, "127.0.0.1:8080", &[])).await;
        assert_eq!(status, StatusCode::FORBIDDEN);
        assert!(body.contains("not valid for this key"), "{refused}: {body}");
    }
    let fresh = app.web.replay_token(GROUP, shop::PAYMENT_CONFIRM, "P-1", 0, now);
    let (_, body, _) = app.request(replay_post("P-1", &fresh, "127.0.0.1:8080", &[])).await;
    assert!(body.contains(NO_BROKER), "a fresh token passes: {body}");
}

/// Keys in every script through the trace page and its JSON, exactly as written; deliveries
/// refused as invalid counted, listed, linked to their traces, and offered for replay there.
mod scripts {
    use super::*;

    /// Keys as their scripts write them: Devanagari and Bengali conjuncts with the virama, Tamil
    /// with the pulli, Thai with tone marks, Persian with a zero-width non-joiner inside the word
    /// and the same word without it (another key), Arabic, Hebrew, Hangul and Han.
    const KEYS: [&str; 11] = [
        "क्ष-1",
        "श्री-42",
        "স্কুল-৭",
        "தமிழ்-௧",
        "สั่ง-1",
        "می\u{200c}خواهم-۱",
        "میخواهم-۱",
        "طلب-مُحَمَّد-١",
        "הזמנה-42",
        "주문-9",
        "订单-𠮷-7",
    ];

    /// `text` percent-encoded for a path segment or a query value.
    fn encoded(text: &str) -> String {
        text.bytes()
            .map(|b| {
                if b.is_ascii_alphanumeric() || b"-._~".contains(&b) {
                    (b as char).to_string()
                } else {
                    format!("%{b:02X}")
                }
            })
            .collect()
    }

    /// An `href` of the page as a request path: the template escapes `&`.
    fn link_after(html: &str, start: &str) -> String {
        let at = html.find(start).unwrap_or_else(|| panic!("no link starting {start:?} in {html}"));
        let link = &html[at..];
        link[..link.find('"').expect("a closing quote")].replace("&amp;", "&")
    }

    /// The value of the hidden form field `name` on `html`.
    fn field(html: &str, name: &str) -> String {
        let marker = format!("name=\"{name}\" value=\"");
        let at = html.find(&marker).unwrap_or_else(|| panic!("no field {name} in {html}")) + marker.len();
        html[at..at + html[at..].find('"').expect("a closing quote")].to_owned()
    }

    pub(super) mod cases {
        use super::*;

        pub async fn keys_in_every_script_are_traced_on_the_page_and_in_the_json_as_written(
            backend: idemgate::store::Backend,
        ) {
            let app = App::new(backend).await;
            for (i, key) in KEYS.iter().enumerate() {
                let d = stock_deduct(key, &format!("M-{i}"), &format!("U-{i}"), "SKU-W", 1);
                assert_eq!(app.deliver(&d).await, Outcome::Processed, "{key}");
            }
            for (i, key) in KEYS.iter().enumerate() {
                let (status, html, _) = app.get(&format!("/trace?biz_id={}", encoded(key))).await;
                assert_eq!(status, StatusCode::OK, "{key}: {html}");
                assert!(html.contains(&format!("<span class=\"mono\">{key}</span>")), "{key}: {html}");
                assert!(html.contains("applied once") && html.contains(&format!("M-{i}")), "{key}: {html}");

                for uri in
                    [format!("/api/trace/{}", encoded(key)), format!("/api/trace?biz_id={}", encoded(key))]
                {
                    let (status, json) = app.json(&uri).await;
                    assert_eq!(status, StatusCode::OK, "{uri}");
                    assert_eq!(json["found"], "story", "{uri}: one key, not a choice: {json}");
                    assert_eq!(json["story"]["key"]["biz_id"], *key, "{uri}");
                    assert_eq!(json["story"]["claim"]["msg_id"], format!("M-{i}"), "{uri}");
                    assert_eq!(json["story"]["summary"]["final_state"], "applied", "{uri}");
                }
            }
        }

        pub async fn an_invalid_delivery_is_counted_listed_linked_to_its_trace_and_offered_for_replay(
            backend: idemgate::store::Backend,
        ) {
            // Assembled as `serve` does, with a broker to replay through: the pages offer the
            // replay; nothing here sends one.
            use idemgate::app::{Application, Feed};
            use tower::ServiceExt;
            let db = support::TestDb::new(backend).await;
            let mut settings = shop::settings();
            settings.database.url = db.url().to_owned();
            settings.http.bind = "127.0.0.1:0".to_owned();
            settings.consumer.group = GROUP.to_owned();
            let handlers = settings.handlers_with(shop::handlers()).expect("handlers");
            let app =
                Application::build_with(&settings, handlers, Feed::Broker).await.expect("the service builds");
            let router = app.router();
            let get = |uri: String| {
                let router = router.clone();
                async move {
                    let request = Request::get(uri.as_str()).body(Body::empty()).expect("request");
                    let response = router.oneshot(request).await.expect("a response");
                    let status = response.status();
                    let bytes = axum::body::to_bytes(response.into_body(), 16 << 20).await.expect("body");
                    (status, String::from_utf8(bytes.to_vec()).expect("utf-8"))
                }
            };
            let keyed = stock_deduct("ORDER 1", "M-SPACE", "U-SPACE", "SKU-W", 1);
            let keyless = Delivery { keys: vec![], ..stock_deduct("", "M-NOKEY", "U-NOKEY", "SKU-W", 1) };
            for d in [&keyed, &keyless] {
                assert_eq!(app.gate().process(d).await.outcome, Outcome::Invalid, "{}", d.msg_id);
            }

            let (_, metrics) = get("/metrics".to_owned()).await;
            let invalid: f64 = metrics
                .lines()
                .filter(|l| l.starts_with("idemgate_deliveries_total{") && l.contains("outcome=\"invalid\""))
                .map(|l| l.rsplit(' ').next().and_then(|v| v.parse::<f64>().ok()).expect("a value"))
                .sum();
            assert_eq!(invalid, 2.0, "each refused delivery is counted: {metrics}");

            let (status, list) = get("/invalid".to_owned()).await;
            assert_eq!(status, StatusCode::OK);
            assert!(list.contains("(no bizId)") && list.contains("ORDER 1"), "{list}");
            let by_key = link_after(&list, "/trace?biz_id=ORDER+1");
            let by_msg_id = link_after(&list, "/trace?q=M-NOKEY");

            let (status, page) = get(by_key).await;
            assert_eq!(status, StatusCode::OK, "{page}");
            assert!(page.contains("invalid: refused before the claim"), "{page}");
            assert!(page.contains("Replay the invalid delivery"), "the replay is offered: {page}");
            let now = std::time::SystemTime::now();
            let token = field(&page, "csrf");
            assert_eq!(field(&page, "biz_id"), "ORDER 1");
            assert!(app.web().check_replay_token(GROUP, "stock.deduct", "ORDER 1", 0, &token, now).is_ok());

            let (status, page) = get(by_msg_id).await;
            assert_eq!(status, StatusCode::OK, "{page}");
            assert!(page.contains("Replay the invalid delivery"), "the replay is offered: {page}");
            assert_eq!(field(&page, "msg_id"), "M-NOKEY", "the form names the message");
            let token = field(&page, "csrf");
            assert!(app.web().check_replay_message_token(GROUP, "M-NOKEY", &token, now).is_ok());
            // The same message found by its UNIQ_KEY: its deliveries are listed.
            let (status, page) = get("/trace?q=U-NOKEY&by=uniq_key".to_owned()).await;
            assert_eq!(status, StatusCode::OK, "{page}");
            assert!(page.contains("M-NOKEY") && page.contains("row-invalid"), "{page}");
        }
    }

    on_every_backend!(
        keys_in_every_script_are_traced_on_the_page_and_in_the_json_as_written,
        an_invalid_delivery_is_counted_listed_linked_to_its_trace_and_offered_for_replay,
    );
}
