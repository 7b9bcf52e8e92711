//! Lost connections at chosen points, on PostgreSQL and MariaDB, with group commit off and on.
//!
//! The service runs as `serve` builds it ([`spawn_app_on`]), its database URL pointing at the
//! test kit's fault proxy ([`FaultProxy`]), which makes COMMITs ambiguous (forwarded, the answer
//! dropped, the connection cut), cuts a group's multi-row statement in half, or delays answers.
//! The test plays producer and broker: every key is sent once (the manifest), and a delivery
//! answered retry comes back as a broker's retry does (a new msgId, the same UNIQ_KEY, its
//! reconsume count one higher). Each scenario ends with the history checker
//! ([`idemgate_testkit::history`]) over the manifest, the attempts, the stock ledger, the claims,
//! the log and a reconcile run; a failure prints its summary and every fault with its time.
//!
//! The short form injects a few hundred faults in all; `IDEMGATE_FAULTS_LONG=1` five times as
//! many (docs/testing.md).

use std::time::Duration;

use futures_util::StreamExt;
use idemgate::delivery::Delivery;
use idemgate::gate::Gate;
use idemgate::handler::Handlers;
use idemgate::outcome::Verdict;
use idemgate::store::Backend;
use idemgate_shop as shop;
use idemgate_testkit::app::{GROUP, SKU, TestApp, now_ms, scratch_db, spawn_app_on};
use idemgate_testkit::fault_proxy::{Budget, FaultKind, FaultProxy, Plan};
use idemgate_testkit::history::{Attempt, Checked, History, Sent, Source, check};

/// The most deliveries of one key (the first and the broker's retries) a scenario makes.
const MAX_ATTEMPTS: u32 = 8;
/// The largest group under group commit.
const GROUP_SIZE: usize = 4;
/// The longest a scenario's traffic may take.
const TRAFFIC_LIMIT: Duration = Duration::from_secs(90);

/// How much a scenario does: the short form by default, five times more with
/// `IDEMGATE_FAULTS_LONG=1`.
fn scale(n: u32) -> u32 {
    match std::env::var("IDEMGATE_FAULTS_LONG").as_deref() {
        Ok("1") => n * 5,
        _ => n,
    }
}

/// The service on a scratch database of `backend`, reached through a fault proxy; group commit
/// as `group` says.
async fn start(backend: Backend, group: bool, retries: u32) -> (TestApp, FaultProxy) {
    let db = scratch_db(backend).await;
    let proxy = FaultProxy::in_front_of(&db.url).await.expect("the fault proxy starts");
    let url = proxy.url(&db.url);
    let app = spawn_app_on(
        db,
        |s| {
            s.database.url = url;
            s.database.max_connections = 16;
            s.consumer.transient_retries = retries;
            s.group_commit.enabled = group;
            s.group_commit.linger_ms = 5;
            // Small groups: many group commits, and so many faults, in a short run.
            s.group_commit.max_batch = GROUP_SIZE;
        },
        Handlers::new(),
    )
    .await;
    (app, proxy)
}

/// A `stock.deduct` of one unit for `biz_id`, as the producer first sent it.
fn first_send(biz_id: &str) -> Delivery {
    let body = shop::DeductStock { sku: SKU.to_owned(), quantity: 1 };
    Delivery {
        msg_id: format!("M-{biz_id}-0"),
        uniq_key: format!("U-{biz_id}"),
        ..shop::deduction_message(shop::TOPIC, biz_id, &body)
    }
}

/// What the test sent and delivered.
#[derive(Default)]
struct Traffic {
    sent: Vec<Sent>,
    attempts: Vec<Attempt>,
}

/// Sends `keys` keys `{prefix}-{i}`, `concurrency` at a time, each redelivered as the broker
/// would until the gate answers other than retry.
async fn drive(gate: &Gate, prefix: &str, keys: u32, concurrency: usize) -> Traffic {
    let deliveries = (0..keys).map(|i| async move {
        let biz_id = format!("{prefix}-{i}");
        let first = first_send(&biz_id);
        let sent =
            Sent { biz_id: biz_id.clone(), uniq_key: first.uniq_key.clone(), msg_id: first.msg_id.clone() };
        let mut attempts = Vec::new();
        let mut d = first;
        for n in 1..=MAX_ATTEMPTS {
            attempts.push(Attempt { biz_id: biz_id.clone(), msg_id: d.msg_id.clone() });
            if gate.process(&d).await.verdict != Verdict::Retry {
                break;
            }
            // The broker's retry: a new msgId, the same UNIQ_KEY.
            d = Delivery { msg_id: format!("M-{biz_id}-{n}"), reconsume_times: n as i32, ..d };
        }
        (sent, attempts)
    });
    let run = futures_util::stream::iter(deliveries).buffer_unordered(concurrency).collect::<Vec<_>>();
    let done = tokio::time::timeout(TRAFFIC_LIMIT, run).await.expect("the traffic ends in time");
    let mut traffic = Traffic::default();
    for (sent, attempts) in done {
        traffic.sent.push(sent);
        traffic.attempts.extend(attempts);
    }
    traffic
}

/// The history of the run, checked; prints the summary and the proxy's counts.
async fn checked(
    app: &TestApp,
    proxy: &FaultProxy,
    traffic: Traffic,
    since_ms: i64,
    scenario: &str,
) -> Checked {
    let source = Source {
        consumer_group: GROUP,
        biz_type: shop::STOCK_DEDUCT,
        effects_sql: "SELECT deduction_id, COUNT(*) FROM shop_stock_ledger GROUP BY deduction_id",
        since_ms,
    };
    let history =
        History::read(&app.db.store, &source, traffic.sent, traffic.attempts).await.expect("the history");
    let checked = check(&history);
    let faults = proxy.report();
    println!("{scenario}\n{checked}{}", faults.lines().next().unwrap_or_default());
    assert!(checked.is_valid(), "{scenario}\n{checked}\n{faults}");
    checked
}

/// Runs `plan` over `keys` keys and checks the history; returns it with the proxy.
async fn scenario(
    backend: Backend,
    group: bool,
    plan: Plan,
    keys: u32,
    name: &str,
) -> (TestApp, FaultProxy, Checked) {
    scenario_with_retries(backend, group, plan, keys, name, 3).await
}

/// [`scenario`] with `retries` transient retries inside the gate.
async fn scenario_with_retries(
    backend: Backend,
    group: bool,
    plan: Plan,
    keys: u32,
    name: &str,
    retries: u32,
) -> (TestApp, FaultProxy, Checked) {
    let (app, proxy) = start(backend, group, retries).await;
    let since_ms = now_ms() - 1_000;
    proxy.set_plan(plan);
    let traffic = drive(&app.gate(), name, keys, if group { 4 * GROUP_SIZE } else { 16 }).await;
    proxy.set_plan(Plan::default());
    let scenario = format!("{name} on {backend}, group commit {}", if group { "on" } else { "off" });
    let checked = checked(&app, &proxy, traffic, since_ms, &scenario).await;
    (app, proxy, checked)
}

/// The sum of `name`'s samples whose labels hold every one of `labels`.
async fn metric(app: &TestApp, name: &str, labels: &[&str]) -> f64 {
    let reply = idemgate_testkit::http::request(&app.addr, "GET", "/metrics", &[], b"").await;
    assert_eq!(reply.status, 200, "{}", reply.body);
    reply
        .body
        .lines()
        .filter(|l| l.strip_prefix(name).is_some_and(|rest| rest.starts_with('{')))
        .filter(|l| labels.iter().all(|label| l.contains(label)))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum()
}

fn count(checked: &Checked, outcome: &str) -> usize {
    checked.by_outcome.get(outcome).copied().unwrap_or(0)
}

async fn ambiguous_commits_alone(b: Backend) {
    let limit = scale(100);
    let plan = Plan { ambiguous_commits: Budget::every(3, limit), ..Plan::default() };
    let (app, proxy, checked) = scenario(b, false, plan, scale(300), "ambiguous").await;
    let faults = proxy.count(FaultKind::AmbiguousCommit);
    assert!(faults as u32 >= limit * 9 / 10, "{}", proxy.report());
    // Each retry found its own claim: logged as such, never as a broker's redelivery.
    assert!(count(&checked, "duplicate/ambiguous_commit") >= faults * 9 / 10, "{checked}");
    assert_eq!(count(&checked, "duplicate/redelivery"), 0, "{checked}");
    let counted = metric(&app, "idemgate_conflicts_total", &["cause=\"ambiguous_commit\""]).await;
    assert_eq!(counted as usize, count(&checked, "duplicate/ambiguous_commit"), "counted in the metrics");
    // The trace page names the gate's own retry for what it is.
    let noted: String =
        sqlx::query_scalar("SELECT biz_id FROM delivery_log WHERE cause = 'ambiguous_commit' LIMIT 1")
            .fetch_one(app.db.store.pool())
            .await
            .expect("a key with an ambiguous commit");
    let page = app.get(&format!("/trace?biz_id={noted}")).await;
    assert_eq!(page.status, 200, "{}", page.body);
    assert!(
        page.body.contains("ambiguous commit")
            && page.body.contains("the gate's own retry after its commit lost its answer"),
        "{}",
        page.body
    );
    app.stop().await;
}

/// With no retry left, the gate reads the claim back: each ambiguous commit is answered
/// processed, with its one row, and acknowledged; none is logged failed or redelivered.
async fn ambiguous_commits_with_no_retry_left(b: Backend) {
    let limit = scale(50);
    let plan = Plan { ambiguous_commits: Budget::every(3, limit), ..Plan::default() };
    let (app, proxy, checked) =
        scenario_with_retries(b, false, plan, scale(150), "ambiguous-read-back", 0).await;
    assert!(proxy.count(FaultKind::AmbiguousCommit) as u32 >= limit * 9 / 10, "{}", proxy.report());
    assert_eq!(checked.attempts, Some(checked.sent), "no delivery was answered retry: {checked}");
    assert_eq!(count(&checked, "processed"), checked.sent, "{checked}");
    assert_eq!(count(&checked, "failed") + count(&checked, "duplicate/redelivery"), 0, "{checked}");
    // Each was counted by what its read-back said.
    let ambiguous = |read_back: &'static str| {
        let labels = ["scope=\"delivery\"".to_owned(), format!("read_back=\"{read_back}\"")];
        let app = &app;
        async move {
            let labels: Vec<&str> = labels.iter().map(String::as_str).collect();
            metric(app, "idemgate_ambiguous_commits_total", &labels).await
        }
    };
    let committed = ambiguous("committed").await;
    assert!(committed as u32 >= limit * 9 / 10, "{committed} read back as committed, of {}", proxy.report());
    assert_eq!(ambiguous("not_committed").await + ambiguous("unread").await, 0.0);
    app.stop().await;
}

async fn ambiguous_commits_of_groups(b: Backend) {
    let limit = scale(60);
    let plan = Plan { ambiguous_commits: Budget::every(2, limit), ..Plan::default() };
    let (app, proxy, checked) = scenario(b, true, plan, scale(600), "ambiguous-group").await;
    assert!(proxy.count(FaultKind::AmbiguousCommit) as u32 >= limit * 9 / 10, "{}", proxy.report());
    assert_eq!(count(&checked, "duplicate/redelivery"), 0, "{checked}");
    // The groups' COMMITs that lost their answer, counted by what their rows read back said.
    let groups = metric(&app, "idemgate_ambiguous_commits_total", &["scope=\"group\""]).await;
    let committed =
        metric(&app, "idemgate_ambiguous_commits_total", &["scope=\"group\"", "read_back=\"committed\""])
            .await;
    assert!(groups > 0.0 && committed > 0.0, "groups {groups}, committed {committed}: {}", proxy.report());
    app.stop().await;
}

async fn cuts_mid_group_statement(b: Backend) {
    let limit = scale(20);
    let plan = Plan {
        cut_statement: vec!["INSERT INTO delivery_log".to_owned(), "padded_rows".to_owned()],
        cuts: Budget::every(2, limit),
        ..Plan::default()
    };
    let (app, proxy, checked) = scenario(b, true, plan, scale(300), "cut").await;
    assert!(proxy.count(FaultKind::CutMidStatement) as u32 >= limit * 9 / 10, "{}", proxy.report());
    assert_eq!(count(&checked, "duplicate/redelivery"), 0, "{checked}");
    app.stop().await;
}

async fn delayed_answers(b: Backend, group: bool) {
    let limit = scale(40);
    let plan = Plan { delay: Duration::from_millis(40), delays: Budget::every(5, limit), ..Plan::default() };
    let (app, proxy, checked) = scenario(b, group, plan, scale(200), "delay").await;
    assert!(proxy.count(FaultKind::DelayedAnswer) as u32 >= limit * 9 / 10, "{}", proxy.report());
    assert_eq!(checked.applied_once, checked.sent, "{checked}");
    app.stop().await;
}

async fn delayed_answers_alone(b: Backend) {
    delayed_answers(b, false).await;
}

async fn delayed_answers_of_groups(b: Backend) {
    delayed_answers(b, true).await;
}

macro_rules! on_servers {
    ($($probe:ident),* $(,)?) => {
        mod postgres {
            $(#[tokio::test(flavor = "multi_thread", worker_threads = 2)] async fn $probe() { super::$probe(idemgate::store::Backend::Postgres).await })*
        }
        mod mariadb {
            $(#[tokio::test(flavor = "multi_thread", worker_threads = 2)] async fn $probe() { super::$probe(idemgate::store::Backend::MySql).await })*
        }
    };
}

on_servers!(
    ambiguous_commits_alone,
    ambiguous_commits_with_no_retry_left,
    ambiguous_commits_of_groups,
    cuts_mid_group_statement,
    delayed_answers_alone,
    delayed_answers_of_groups,
);
