//! A key with more deliveries than one page of its timeline holds: the summary counts every
//! delivery, the pages reach every one, each statement of the trace reads the key by its own
//! indexes, and pages busy on their pool leave `/readyz` alone.

use std::time::{Duration, Instant};

use idemgate::inspect::trace::{COUNT_LIMIT, KeyRef, PAGE_DELIVERIES, statements};
use idemgate::store::{Backend, query_built};
use idemgate_testkit::plan;
use tower::ServiceExt;

use super::*;

static FORGET_CLAIM: Sql = Sql::new("DELETE FROM idempotent_record WHERE biz_id = ?");

/// The deliveries of [`applied_twice`]'s key, two pages of its timeline, and the one that
/// applied it again, on the second page.
const DELIVERIES: usize = PAGE_DELIVERIES + 70;
const SECOND_APPLY: usize = PAGE_DELIVERIES + 2;

/// Delivers `D-HOT` [`DELIVERIES`] times through the gate with one UNIQ_KEY (a message the
/// broker keeps bringing back): the first is processed, the others are redeliveries, except the
/// [`SECOND_APPLY`]th,
/// which finds the claim gone (as after a restore that lost it) and applies the effect again.
async fn applied_twice(app: &App) {
    for n in 1..=DELIVERIES {
        if n == SECOND_APPLY {
            app.db()
                .store
                .query(&FORGET_CLAIM)
                .bind("D-HOT")
                .execute(app.db().store.pool())
                .await
                .expect("forget");
        }
        let expected = if n == 1 || n == SECOND_APPLY { Outcome::Processed } else { Outcome::Duplicate };
        let delivery = stock_deduct("D-HOT", &format!("M{n}"), "U-HOT", "SKU-W", 1);
        assert_eq!(app.deliver(&delivery).await, expected, "delivery {n}");
    }
}

/// The target of the link whose text is `text` in `html`, unescaped.
fn link(html: &str, text: &str) -> Option<String> {
    let end = html.find(&format!("\">{text}</a>"))?;
    let start = html[..end].rfind("href=\"")? + "href=\"".len();
    Some(html[start..end].replace("&#38;", "&").replace("&amp;", "&"))
}

/// The msgIds of a JSON story's page, in order.
fn msg_ids(json: &Value) -> Vec<String> {
    json["story"]["deliveries"]
        .as_array()
        .expect("deliveries")
        .iter()
        .map(|d| d["msg_id"].as_str().expect("msg_id").to_owned())
        .collect()
}

mod cases {
    use super::*;

    /// The second `processed` delivery of `D-HOT` is beyond the first page: the page, the JSON
    /// and `idemgate trace` all say the key was applied twice, with every delivery counted, and
    /// the next page of each holds the second processed row.
    pub async fn a_second_processed_delivery_beyond_the_first_page_shows_as_applied_twice(backend: Backend) {
        let app = App::new(backend).await;
        applied_twice(&app).await;

        let (status, html, _) = app.get("/trace?biz_id=D-HOT").await;
        assert_eq!(status, StatusCode::OK, "{html}");
        assert!(html.contains("APPLIED MORE THAN ONCE"), "{html}");
        assert!(html.contains("processed deliveries <b>2</b>"), "{html}");
        assert!(html.contains(&format!("{DELIVERIES} deliveries")), "{html}");
        assert!(html.contains(&format!("<b>{}</b> producer retry", DELIVERIES - 2)), "{html}");
        assert_eq!(count(&html, "<tr class=\"row-"), PAGE_DELIVERIES);
        assert_eq!(count(&html, "row-ok"), 1, "the first page holds the first processed row only");
        assert!(link(&html, "← Earlier").is_none(), "the first page has no earlier one");
        let later = link(&html, "Later →").expect("a link to the later deliveries");
        let (status, html, _) = app.get(&later).await;
        assert_eq!(status, StatusCode::OK, "{later}: {html}");
        assert!(html.contains("APPLIED MORE THAN ONCE"), "every page shows the whole key's summary");
        assert_eq!(count(&html, "<tr class=\"row-"), DELIVERIES - PAGE_DELIVERIES);
        assert_eq!(count(&html, "row-ok"), 1, "{later}");
        assert!(html.contains(&format!(">M{SECOND_APPLY}<")), "{html}");
        assert!(link(&html, "Later →").is_none(), "the last page has no later one");
        let earlier = link(&html, "← Earlier").expect("a link back");
        let (_, html, _) = app.get(&earlier).await;
        assert_eq!(count(&html, "<tr class=\"row-"), PAGE_DELIVERIES, "{earlier}");
        let (last, beyond) = (format!(">M{PAGE_DELIVERIES}<"), format!(">M{}<", PAGE_DELIVERIES + 1));
        assert!(html.contains(">M1<") && html.contains(&last) && !html.contains(&beyond), "{earlier}");

        let (status, json) = app.json("/api/trace/D-HOT").await;
        assert_eq!(status, StatusCode::OK);
        let summary = &json["story"]["summary"];
        assert_eq!(summary["processed"], 2, "{summary}");
        assert_eq!(summary["final_state"], "applied_twice", "{summary}");
        assert_eq!(summary["deliveries"], DELIVERIES, "{summary}");
        assert_eq!(summary["duplicates"]["producer_retry"], DELIVERIES - 2, "{summary}");
        assert_eq!(summary["count_limit"], COUNT_LIMIT);
        let page = msg_ids(&json);
        assert_eq!((page.len(), page[0].as_str()), (PAGE_DELIVERIES, "M1"));
        assert_eq!(page[PAGE_DELIVERIES - 1], format!("M{PAGE_DELIVERIES}"));
        assert_eq!(json["story"]["previous"], Value::Null);
        let next = json["story"]["next"].as_str().expect("a next cursor").to_owned();
        let (status, json) = app.json(&format!("/api/trace/D-HOT?after={next}")).await;
        assert_eq!(status, StatusCode::OK, "{json}");
        let page = msg_ids(&json);
        assert_eq!(page.len(), DELIVERIES - PAGE_DELIVERIES);
        assert_eq!(page[SECOND_APPLY - PAGE_DELIVERIES - 1], format!("M{SECOND_APPLY}"));
        assert_eq!(json["story"]["deliveries"][SECOND_APPLY - PAGE_DELIVERIES - 1]["outcome"], "processed");
        assert_eq!(json["story"]["next"], Value::Null, "{json}");
        assert!(json["story"]["previous"].is_string(), "{json}");
        let (status, json) = app.json("/api/trace/D-HOT?after=soon").await;
        assert_eq!(status, StatusCode::BAD_REQUEST, "{json}");

        // The same story as `idemgate trace D-HOT --biz-type stock.deduct` prints it.
        let text = trace_text(&app, None).await;
        assert!(text.contains("state: APPLIED MORE THAN ONCE"), "{text}");
        assert!(text.contains(&format!("{DELIVERIES} deliveries")), "{text}");
        assert!(!text.contains(&format!("msgId M{SECOND_APPLY}  UNIQ_KEY")), "{text}");
        let after = text
            .lines()
            .find_map(|l| l.trim().strip_prefix("… later deliveries: --after "))
            .expect("the cursor of the later deliveries")
            .to_owned();
        let text = trace_text(&app, Some(&after)).await;
        assert!(text.contains(&format!("msgId M{SECOND_APPLY}  UNIQ_KEY")), "{text}");
        assert!(text.contains("… earlier deliveries: --before "), "{text}");
    }

    /// A key with 20,000 deliveries beside 2,000 others of its bizId under another biz_type:
    /// every statement of its trace reads the log by `delivery_log_key` or
    /// `delivery_log_key_outcome` with the whole key fixed (the bizId alone for the step to the
    /// next key), and each count of the summary fixes the outcome too: no read of the bizId's
    /// rows, however many the key has.
    pub async fn the_trace_reads_a_key_by_its_own_indexes(backend: Backend) {
        let app = App::new(backend).await;
        let store = &app.db().store;
        let now = idemgate::clock::now_ms();
        let row = format!("(?, 'web-1', '{GROUP}', ?, 'U-P', 'shop', 0, 0, 0, ?, 'D-P', 0, ?, ?, ?, 100)");
        for (biz_type, rows) in [("stock.deduct", 20_000i64), ("order.create", 2_000)] {
            for chunk in (0..rows).collect::<Vec<_>>().chunks(500) {
                let sql = format!(
                    "INSERT INTO delivery_log (logged_at_ms, instance_id, consumer_group, msg_id, uniq_key, topic, \
                     queue_id, queue_offset, reconsume_times, biz_type, biz_id, execute_time, outcome, cause, \
                     payload_match, latency_us) VALUES {}",
                    vec![row.as_str(); chunk.len()].join(", ")
                );
                let q = chunk.iter().fold(query_built(backend, sql), |q, i| {
                    let (outcome, cause, matched) = match i {
                        0 => ("processed", None, None),
                        i if i % 100 == 1 => ("failed", None, None),
                        i => ("duplicate", Some("redelivery"), Some(i16::from(i % 1000 != 7))),
                    };
                    q.bind(now + i)
                        .bind(format!("M-{biz_type}-{i}"))
                        .bind(biz_type)
                        .bind(outcome)
                        .bind(cause)
                        .bind(matched)
                });
                q.execute(store.pool()).await.expect("log rows");
            }
        }

        let key = KeyRef {
            consumer_group: GROUP.to_owned(),
            biz_type: "stock.deduct".to_owned(),
            biz_id: "D-P".to_owned(),
            execute_time: 0,
        };
        let whole_key = ["biz_id", "biz_type", "consumer_group", "execute_time"];
        let counts = Outcome::ALL.len() + 2 * idemgate::outcome::DuplicateCause::ALL.len();
        for statement in statements(&key, now + 10_000) {
            let reads = plan::reads(store, &statement).await.expect("plan");
            // A day partition still to come holds nothing; its plan is whatever costs least on
            // nothing.
            let log: Vec<_> =
                reads.iter().filter(|r| r.table == "delivery_log" && !r.empty_partition).collect();
            assert!(!log.is_empty(), "{}: no read of the log in {reads:#?}", statement.name);
            for read in &log {
                let index = read.index.as_deref().unwrap_or("");
                assert!(
                    ["delivery_log_key", "delivery_log_key_outcome"].contains(&index),
                    "{}: {read}",
                    statement.name
                );
                let fixes = |columns: &[&str]| columns.iter().all(|c| read.fixed.iter().any(|f| f == c));
                let needed: &[&str] =
                    if statement.name.ends_with(" key") { &whole_key[..1] } else { &whole_key };
                assert!(fixes(needed), "{}: {read} fixes {:?}", statement.name, read.fixed);
            }
            if statement.name == "summary" {
                let by_outcome = log.iter().filter(|r| r.fixed.iter().any(|f| f == "outcome")).count();
                assert_eq!(by_outcome, counts, "every count fixes its outcome: {log:#?}");
            }
        }
    }
}

on_every_backend!(
    a_second_processed_delivery_beyond_the_first_page_shows_as_applied_twice,
    the_trace_reads_a_key_by_its_own_indexes,
);

/// While sixteen traces wait behind a lock on the log, holding every connection of the pages'
/// pool and every permit of `http.max_concurrent_requests`, `/readyz` answers 200 within its
/// second from the consumer's pool; once the lock goes, every trace answers.
async fn readiness_does_not_wait_behind_the_pages(backend: Backend) {
    let app = App::new(backend).await;
    assert_eq!(app.deliver(&stock_deduct("D-R", "M1", "U1", "SKU-W", 1)).await, Outcome::Processed);
    let locker = app.second_store().await;
    let mut held = locker.pool().acquire().await.expect("a connection");
    let (lock, unlock) = match backend {
        Backend::Postgres => ("BEGIN; LOCK TABLE delivery_log IN ACCESS EXCLUSIVE MODE", "COMMIT"),
        _ => ("LOCK TABLES delivery_log WRITE", "UNLOCK TABLES"),
    };
    sqlx::raw_sql(sqlx::AssertSqlSafe(lock)).execute(&mut *held).await.expect("lock");
    let traces: Vec<_> = (0..16)
        .map(|_| {
            let router = app.inner.router();
            tokio::spawn(async move {
                let request = Request::get("/api/trace/D-R").body(Body::empty()).expect("request");
                router.oneshot(request).await.expect("a response").status()
            })
        })
        .collect();
    tokio::time::sleep(Duration::from_millis(500)).await;
    let asked = Instant::now();
    let (status, body, _) = app.get("/readyz").await;
    let took = asked.elapsed();
    let waiting = traces.iter().filter(|t| !t.is_finished()).count();
    sqlx::raw_sql(sqlx::AssertSqlSafe(unlock)).execute(&mut *held).await.expect("unlock");
    assert_eq!(waiting, 16, "the traces wait on the lock");
    assert_eq!(status, StatusCode::OK, "{body} after {took:?}");
    assert!(took < Duration::from_millis(1_500), "{took:?}");
    for trace in traces {
        let answered = tokio::time::timeout(Duration::from_secs(10), trace).await.expect("answered");
        assert_eq!(answered.expect("ran"), StatusCode::OK);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn readiness_does_not_wait_behind_the_pages_on_postgres() {
    readiness_does_not_wait_behind_the_pages(Backend::Postgres).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn readiness_does_not_wait_behind_the_pages_on_mariadb() {
    readiness_does_not_wait_behind_the_pages(Backend::MySql).await;
}

/// D-HOT's stock.deduct story as the command line's `trace` prints it, from the page after
/// `after`.
async fn trace_text(app: &App, after: Option<&str>) -> String {
    use idemgate::inspect::trace::{SearchBy, TraceQuery, render_text, trace};
    let query = TraceQuery::new("D-HOT", SearchBy::Any, Some("stock.deduct"), None, None)
        .and_then(|q| q.paged(after, None))
        .expect("the query");
    render_text(&trace(&app.db().store, &app.web.trace, &query).await.expect("the trace"))
}
