//! `serve` with business written only as configuration: a `[[sql_handlers]]` wallet credit on a
//! real broker, with producer resends of the same credits, ends in exact books, and the trace
//! page shows the wallet's ledger row.

use std::time::{Duration, Instant};

use idemgate::broker::Producer;
use idemgate::config::Settings;
use idemgate::delivery::Delivery;
use idemgate::route::RouteConfig;
use idemgate::sql_handler::SqlHandlerConfig;
use idemgate::store::{Backend, Sql};
use idemgate_testkit::scratch::{SERVICE_TABLES, ScratchDb};
use sqlx::Row;

use crate::support::*;

const USERS: usize = 10;
const CREDITS: usize = 200;
/// Every fifth credit is sent twice, each copy a message of its own (a producer resend).
const RESENT_EVERY: usize = 5;

/// The handler and its route as docs/own-business.md writes them, on the test's own topic.
fn wallet_configuration(topic: &str) -> String {
    format!(
        r#"
[[sql_handlers]]
name = "wallet.credit"
statements = [
  {{ sql = "UPDATE wallet SET balance_cents = balance_cents + :cents WHERE user_id = :user", expect = "one", on_zero = "retry" }},
  {{ sql = "INSERT INTO wallet_ledger (credit_id, user_id, cents) VALUES (:biz_id, :user, :cents)", expect = "one" }},
]
params = {{ cents = "json:/cents:int", user = "json:/user_id" }}
business_unique = ["wallet_ledger(credit_id)"]
describe = "SELECT user_id, cents FROM wallet_ledger WHERE credit_id = :biz_id"
checks = [
  {{ name = "credit_once", sql = "SELECT credit_id FROM wallet_ledger GROUP BY credit_id HAVING COUNT(*) > 1" }},
]

[[routes]]
topic = "{topic}"
tags = "credit"
biz_type = "wallet.credit"
biz_id = "json:/credit_id"
"#
    )
}

/// The part of the configuration that is the business.
#[derive(serde::Deserialize)]
struct Business {
    sql_handlers: Vec<SqlHandlerConfig>,
    routes: Vec<RouteConfig>,
}

fn credit(topic: &str, run: &str, i: usize) -> Delivery {
    let body = serde_json::json!({
        "credit_id": format!("{run}-C{i}"),
        "user_id": format!("user-{}", i % USERS),
        "cents": 100 + i as i64,
    });
    Delivery {
        topic: topic.to_owned(),
        tags: "credit".to_owned(),
        body: body.to_string().into_bytes(),
        ..Default::default()
    }
}

static LOGGED: Sql = Sql::new("SELECT COUNT(*) FROM delivery_log WHERE consumer_group = ?");
static OUTCOMES: Sql = Sql::new(
    "SELECT outcome, COALESCE(cause, ''), COUNT(*) FROM delivery_log WHERE consumer_group = ? \
     GROUP BY outcome, COALESCE(cause, '')",
);
static LEDGER: Sql = Sql::new(
    "SELECT COUNT(*), COUNT(DISTINCT credit_id), CAST(COALESCE(SUM(cents), 0) AS BIGINT) FROM wallet_ledger",
);
static BALANCES: Sql = Sql::new("SELECT balance_cents FROM wallet");

/// The wallet's tables, and ten wallets at zero.
async fn create_wallets(db: &ScratchDb) {
    for ddl in [
        "CREATE TABLE wallet (user_id VARCHAR(64) NOT NULL PRIMARY KEY, balance_cents BIGINT NOT NULL DEFAULT 0)",
        "CREATE TABLE wallet_ledger (credit_id VARCHAR(128) NOT NULL PRIMARY KEY, user_id VARCHAR(64) NOT NULL, \
         cents BIGINT NOT NULL)",
        "INSERT INTO wallet (user_id) SELECT 'user-' || i FROM generate_series(0, 9) AS i",
    ] {
        sqlx::query(sqlx::AssertSqlSafe(ddl)).execute(db.store.pool()).await.expect("wallet tables");
    }
}

/// `serve`'s settings for the wallet business of the documented configuration, on `topic`.
fn wallet_settings(db_url: &str, topic: &str, group: &str, max_reconsume_times: i32) -> Settings {
    let business: Business =
        toml::from_str(&wallet_configuration(topic)).expect("the documented configuration");
    Settings {
        routes: business.routes,
        sql_handlers: business.sql_handlers,
        ..settings(db_url, topic, group, "solo", max_reconsume_times)
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_configured_sql_handler_credits_each_wallet_once_through_serve_and_the_trace_shows_it() {
    // The business database as a deployment has it: its own tables and nothing of idemgate's.
    let db = empty_database(Backend::Postgres).await;
    let (topic, group, run) = (unique("wallet"), unique("group"), unique("W").replace('_', ""));
    create_wallets(&db).await;
    let s = wallet_settings(&db.url, &topic, &group, 2);
    let service = Service::start_as(PLAIN_BIN, &s);
    // `serve` made its own tables, and no other: nothing of the example shop, no stock rows.
    let mut expected: Vec<&str> = SERVICE_TABLES.into_iter().chain(["wallet", "wallet_ledger"]).collect();
    expected.sort_unstable();
    assert_eq!(db.tables().await.expect("the tables"), expected);

    let producer = Producer::start(&broker().access(), &unique("pgroup")).await.expect("producer");
    let mut sends = 0;
    for i in 0..CREDITS {
        let message = credit(&topic, &run, i);
        producer.send(&message).await.expect("send");
        sends += 1;
        if i % RESENT_EVERY == 0 {
            producer.send(&message).await.expect("resend");
            sends += 1;
        }
    }
    producer.shutdown().await;

    let deadline = Instant::now() + Duration::from_secs(120);
    loop {
        let logged: i64 = db
            .store
            .query(&LOGGED)
            .bind(group.as_str())
            .fetch_one(db.store.pool())
            .await
            .expect("log")
            .get(0);
        if logged >= sends {
            break;
        }
        assert!(Instant::now() < deadline, "{logged} of {sends} sends logged within 120 s");
        tokio::time::sleep(Duration::from_millis(250)).await;
    }

    // Books: one ledger row per credit, the balances hold exactly the credits, every resend a
    // duplicate by cause.
    let row = db.store.query(&LEDGER).fetch_one(db.store.pool()).await.expect("ledger");
    let (rows, distinct, cents): (i64, i64, i64) = (row.get(0), row.get(1), row.get(2));
    let expected_cents: i64 = (0..CREDITS).map(|i| 100 + i as i64).sum();
    assert_eq!((rows, distinct, cents), (CREDITS as i64, CREDITS as i64, expected_cents));
    let balances: i64 = db
        .store
        .query(&BALANCES)
        .fetch_all(db.store.pool())
        .await
        .expect("balances")
        .iter()
        .map(|r| r.get::<i64, _>(0))
        .sum();
    assert_eq!(balances, expected_cents, "the wallets hold exactly the credits");
    let mut outcomes = std::collections::BTreeMap::new();
    for r in
        db.store.query(&OUTCOMES).bind(group.as_str()).fetch_all(db.store.pool()).await.expect("outcomes")
    {
        outcomes.insert((r.get::<String, _>(0), r.get::<String, _>(1)), r.get::<i64, _>(2));
    }
    assert_eq!(
        outcomes.get(&("processed".to_owned(), String::new())),
        Some(&(CREDITS as i64)),
        "{outcomes:?}"
    );
    let resends = CREDITS.div_ceil(RESENT_EVERY) as i64;
    assert_eq!(
        outcomes.get(&("duplicate".to_owned(), "producer_resend".to_owned())),
        Some(&resends),
        "{outcomes:?}"
    );
    assert_eq!(outcomes.values().sum::<i64>(), sends, "nothing but processed and resends: {outcomes:?}");

    // The trace page shows the wallet's state from the configured describe.
    let addr = service_addr(&service);
    let key = format!("{run}-C7");
    let (status, page) = http_get(&addr, &format!("/trace?q={key}")).expect("trace page");
    assert_eq!(status, 200, "{page}");
    assert!(page.contains("user-7") && page.contains("107"), "the ledger row on the trace page: {page}");
    let (status, json) = http_get(&addr, &format!("/api/trace?q={key}")).expect("trace API");
    assert_eq!(status, 200, "{json}");
    assert!(json.contains("user-7"), "{json}");

    assert_eq!(service.terminate().code(), Some(0));
    db.drop_now().await;
}

static LOCKED_LEDGER: Sql = Sql::new("SELECT COUNT(*) FROM wallet_ledger WHERE credit_id LIKE ?");
static SLOWEST_PROCESSED: Sql = Sql::new(
    "SELECT CAST(COALESCE(MAX(latency_us), 0) AS BIGINT) FROM delivery_log WHERE consumer_group = ? AND outcome = 'processed'",
);
static BALANCE_OF: Sql = Sql::new("SELECT balance_cents FROM wallet WHERE user_id = ?");

/// The credits of the locked wallet.
const LOCKED_CREDITS: usize = 12;
/// How long the wallet's row stays locked: past the client's 30 s consume deadline, as in the
/// field.
const LOCK_HELD: Duration = Duration::from_secs(40);

/// A row lock on the configured handler's table held past the RocketMQ client's consume
/// deadline: every delivery that needs the row answers `ReconsumeLater` itself within its lock
/// bounds (`database.lock_timeout_ms` × the transient retries), the client never abandons a
/// listener call (`consume_message task panicked … DeadlineExceeded`), and nothing commits while
/// the lock is held, nor later from an abandoned call: once the lock goes, the redeliveries apply
/// each credit once, none of them a duplicate of a claim committed behind the broker's back.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_row_lock_past_the_client_deadline_makes_each_delivery_answer_retry_itself_and_commit_nothing_meanwhile()
 {
    use sqlx::Executor;
    let db = database(Backend::Postgres).await;
    let (topic, group, run) = (unique("wallet"), unique("group"), unique("L").replace('_', ""));
    create_wallets(&db).await;
    let s = wallet_settings(&db.url, &topic, &group, 16);
    let service = Service::start_as(PLAIN_BIN, &s);

    // Another transaction holds the locked wallet's row, and keeps it.
    let mut holder = db.store.pool().acquire().await.expect("a connection");
    holder.execute("BEGIN").await.expect("begin");
    holder
        .execute("UPDATE wallet SET balance_cents = balance_cents WHERE user_id = 'user-0'")
        .await
        .expect("the row lock");
    let locked_at = Instant::now();
    let producer = Producer::start(&broker().access(), &unique("pgroup")).await.expect("producer");
    for i in 0..LOCKED_CREDITS {
        let body =
            serde_json::json!({ "credit_id": format!("{run}-L{i}"), "user_id": "user-0", "cents": 100 });
        let message = Delivery {
            topic: topic.clone(),
            tags: "credit".to_owned(),
            body: body.to_string().into_bytes(),
            ..Default::default()
        };
        producer.send(&message).await.expect("send");
    }
    producer.shutdown().await;
    tokio::time::sleep(LOCK_HELD.saturating_sub(locked_at.elapsed())).await;
    let pattern = format!("{run}-L%");
    let ledger = |store: &idemgate::store::Store| {
        let (store, pattern) = (store.clone(), pattern.clone());
        async move {
            let row =
                store.query(&LOCKED_LEDGER).bind(pattern).fetch_one(store.pool()).await.expect("ledger");
            row.get::<i64, _>(0)
        }
    };
    assert_eq!(ledger(&db.store).await, 0, "a credit committed while its wallet's row was locked");
    holder.execute("ROLLBACK").await.expect("release the row lock");
    drop(holder);

    let deadline = Instant::now() + Duration::from_secs(240);
    while ledger(&db.store).await < LOCKED_CREDITS as i64 {
        assert!(Instant::now() < deadline, "the credits were not applied within 240 s of the lock's release");
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    let balance: i64 =
        db.store.query(&BALANCE_OF).bind("user-0").fetch_one(db.store.pool()).await.expect("balance").get(0);
    assert_eq!(balance, 100 * LOCKED_CREDITS as i64, "each credit once");
    let mut outcomes = std::collections::BTreeMap::new();
    for r in
        db.store.query(&OUTCOMES).bind(group.as_str()).fetch_all(db.store.pool()).await.expect("outcomes")
    {
        outcomes.insert((r.get::<String, _>(0), r.get::<String, _>(1)), r.get::<i64, _>(2));
    }
    assert_eq!(
        outcomes.get(&("processed".to_owned(), String::new())),
        Some(&(LOCKED_CREDITS as i64)),
        "{outcomes:?}"
    );
    assert!(
        outcomes.keys().all(|(outcome, _)| outcome != "duplicate"),
        "an abandoned call committed: {outcomes:?}"
    );
    assert!(outcomes.get(&("failed".to_owned(), String::new())).is_some_and(|n| *n >= 1), "{outcomes:?}");
    let slowest: i64 = db
        .store
        .query(&SLOWEST_PROCESSED)
        .bind(group.as_str())
        .fetch_one(db.store.pool())
        .await
        .expect("latency")
        .get(0);
    assert!(slowest < 25_000_000, "a delivery committed {slowest} µs after its listener call began");

    let (status, metrics) = http_get(&service_addr(&service), "/metrics").expect("/metrics");
    assert_eq!(status, 200);
    let lock_waits =
        sample(&metrics, "idemgate_transient_retries_total", &[("cause", "lock_wait")]).unwrap_or(0.0);
    assert!(lock_waits >= LOCKED_CREDITS as f64, "{lock_waits} lock-wait retries");
    let exit = service.terminate();
    assert_eq!(exit.code(), Some(0), "{}", exit.log);
    for abandoned in ["DeadlineExceeded", "consume_message task panicked"] {
        assert!(!exit.log.contains(abandoned), "the client abandoned a listener call:\n{}", exit.log);
    }
    db.drop_now().await;
}
