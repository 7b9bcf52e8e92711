//! Guarded replay end to end: a real broker, `idemgate serve`, a poison payment that
//! dead-letters, the cause fixed (its order sent), a replay that makes it processed exactly once
//! with cause `replay`, and a second replay refused. Once with `idemgate replay`, once with the
//! trace page's form, and once with a broken handler that is then fixed. Then orders refused as
//! invalid by a broken route, replayed by their msgIds once the route is fixed.

use std::process::Command;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use idemgate::app::{Application, Feed};
use idemgate::broker::{Producer, Publish};
use idemgate::delivery::Delivery;
use idemgate::handler::{Effect, Handler, HandlerError, Handlers, Work};
use idemgate::replay::{self, Action, Selection};
use idemgate::route::RouteConfig;
use idemgate::store::{Backend, Conn, Sql, Store, query};
use idemgate_shop as shop;
use sqlx::Row;

use super::support::*;
use super::support::{http_get, http_post_form};

static STATUS: Sql = Sql::new("SELECT status FROM shop_order WHERE order_no = ?");

/// A service's settings written to a configuration file, for the command line.
pub(super) struct ConfigFile {
    _dir: tempfile::TempDir,
    path: std::path::PathBuf,
}

impl ConfigFile {
    pub(super) fn of(settings: &idemgate::config::Settings) -> Self {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("idemgate.toml");
        std::fs::write(&path, toml::to_string(settings).unwrap()).unwrap();
        Self { _dir: dir, path }
    }

    /// `idemgate replay ARGS` on these settings: its exit code and everything it printed.
    pub(super) fn replay(&self, args: &[&str]) -> (Option<i32>, String) {
        let out = Command::new(BIN)
            .args(["--config", &self.path.to_string_lossy(), "replay"])
            .args(args)
            .env_remove("RUST_LOG")
            .output()
            .expect("run idemgate replay");
        (
            out.status.code(),
            String::from_utf8_lossy(&out.stdout).into_owned() + &String::from_utf8_lossy(&out.stderr),
        )
    }
}

/// Dead-letters `key` (its order missing), then sends the order: the cause is fixed.
pub(super) async fn dead_letter_then_fix(
    store: &Store,
    producer: &dyn Publish,
    topic: &str,
    key: &str,
    order_no: &str,
) {
    producer.publish(&payment(topic, key, order_no, 990)).await.unwrap();
    wait_for_log(store, key, "dead letter", |s| s.iter().any(|o| o.starts_with("dead_lettered"))).await;
    producer.publish(&order(topic, order_no, 990)).await.unwrap();
    wait_for_log(store, order_no, "order", |s| s.iter().any(|o| o.starts_with("processed"))).await;
}

/// `idemgate replay --biz-id KEY` sends the dead letter of `key` again: it is processed once,
/// with cause `replay`, its order is paid, and a second replay is refused.
pub(super) async fn replayed_once_by_command(store: &Store, config: &ConfigFile, key: &str, order_no: &str) {
    let (code, out) = config.replay(&["--biz-id", key]);
    assert_eq!(code, Some(0), "{out}");
    assert!(out.contains("sent again as UNIQ_KEY"), "{out}");
    let seen =
        wait_for_log(store, key, "replayed delivery", |s| s.iter().any(|o| o.starts_with("processed"))).await;
    assert_eq!(seen, ["failed/", "failed/", "dead_lettered/", "processed/replay"]);
    let status = store.query(&STATUS).bind(order_no).fetch_one(store.pool()).await.unwrap();
    assert_eq!(status.get::<String, _>(0), "PAID");
    let (code, out) = config.replay(&["--biz-id", key]);
    assert_eq!(code, Some(7), "a second replay is refused: {out}");
    assert!(out.contains("refused: already applied (live claim"), "{out}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dead_letter_is_replayed_into_exactly_one_effect_and_a_second_replay_is_refused() {
    let db = database(Backend::Postgres).await;
    let (topic, group, run) = (unique("replay"), unique("group"), unique("Y").replace('_', ""));
    let settings = settings(&db.url, &topic, &group, "replayer", 2);
    let service = Service::start(&settings);
    let addr = service_addr(&service);
    let config = ConfigFile::of(&settings);
    let replay = |args: &[&str]| config.replay(args);
    let producer = Producer::start(&broker().access(), &unique("pgroup")).await.unwrap();

    // 1. By command.
    let (key, order_no) = (format!("{run}-PAY-1"), format!("{run}-ORD-1"));
    dead_letter_then_fix(&db.store, &producer, &topic, &key, &order_no).await;
    let (code, out) = replay(&["--biz-id", &key, "--dry-run"]);
    assert_eq!(code, Some(0), "{out}");
    assert!(out.contains("would be sent (dry run)"), "{out}");
    assert_eq!(log_of(&db.store, &key).await.len(), 3, "a dry run sends nothing");
    replayed_once_by_command(&db.store, &config, &key, &order_no).await;

    // 2. From the trace page's form, with its CSRF token.
    let (key, order_no) = (format!("{run}-PAY-2"), format!("{run}-ORD-2"));
    dead_letter_then_fix(&db.store, &producer, &topic, &key, &order_no).await;
    let ReplayForm { token, body: form } = replay_form(&addr, &group, shop::PAYMENT_CONFIRM, &key);
    let forged = form.replace(&token, &"0".repeat(64));
    let (status, _) = http_post_form(&addr, "/replay", &forged).unwrap();
    assert_eq!(status, 403, "a forged token is refused");
    let (status, result) = http_post_form(&addr, "/replay", &form).unwrap();
    assert_eq!(status, 200, "{result}");
    assert!(result.contains("sent again as UNIQ_KEY"), "{result}");
    let seen =
        wait_for_log(&db.store, &key, "replayed delivery", |s| s.iter().any(|o| o.starts_with("processed")))
            .await;
    assert_eq!(seen.iter().filter(|o| o.starts_with("processed")).count(), 1);
    let (_, again) = http_post_form(&addr, "/replay", &form).unwrap();
    assert!(again.contains("refused: already applied"), "{again}");
    let (_, page) = http_get(&addr, &format!("/trace?biz_id={key}")).unwrap();
    assert!(!page.contains("name=\"csrf\""), "an applied key offers no replay");

    // The replays are on the trace with their cause; nothing was applied twice.
    tokio::time::sleep(Duration::from_secs(3)).await;
    for n in 1..=2 {
        let log = log_of(&db.store, &format!("{run}-PAY-{n}")).await;
        assert_eq!(log.iter().filter(|o| o.starts_with("processed")).count(), 1, "{log:?}");
    }
    producer.shutdown().await;
    assert_eq!(service.terminate().code(), Some(0));
    db.drop_now().await;
}

/// A handler that fails until its switch is turned: the broken release, then the fix.
struct Fragile {
    fixed: Arc<AtomicBool>,
}

static FRAGILE_EFFECT: Sql = Sql::new(
    "INSERT INTO shop_stock_ledger (deduction_id, sku, quantity, applied_at_ms) VALUES (?, 'FRAGILE', 1, ?)",
);
static FRAGILE_EFFECTS: Sql = Sql::new("SELECT COUNT(*) FROM shop_stock_ledger WHERE deduction_id = ?");

#[async_trait::async_trait]
impl Handler for Fragile {
    async fn handle(&self, work: &Work<'_>, conn: &mut Conn) -> Result<Effect, HandlerError> {
        if !self.fixed.load(Ordering::SeqCst) {
            return Err(HandlerError::Retryable("the handler is broken (its test switch is off)".into()));
        }
        query(work.backend, &FRAGILE_EFFECT)
            .bind(work.key.biz_id.as_str())
            .bind(work.now_ms)
            .execute(&mut *conn)
            .await?;
        Ok(Effect::Applied)
    }
}

/// The consumer in this process, so that its handler can be switched from broken to fixed:
/// a message dead-letters while it is broken; after the fix, one replay applies it once and a
/// second is refused.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn after_the_handler_is_fixed_a_replay_applies_the_dead_letter_exactly_once() {
    let db = database(Backend::Postgres).await;
    let (topic, group, run) = (unique("fragile"), unique("group"), unique("F").replace('_', ""));
    let mut settings = settings(&db.url, &topic, &group, "fragile", 2);
    settings.routes = vec![RouteConfig {
        topic: topic.clone(),
        tags: "fragile".to_owned(),
        biz_type: "fragile.apply".to_owned(),
        biz_id: "keys".to_owned(),
        execute_time: None,
        handler: Some("fragile".to_owned()),
    }];
    let fixed = Arc::new(AtomicBool::new(false));
    let routes = settings.routes();
    let handlers = Handlers::new().with("fragile", Fragile { fixed: fixed.clone() });
    let service = Application::build_with(&settings, handlers, Feed::Broker)
        .await
        .expect("the service builds")
        .start()
        .await
        .expect("the service starts");
    let producer = Producer::start(&broker().access(), &unique("pgroup")).await.unwrap();

    let key = format!("{run}-FRAGILE-1");
    let message = Delivery {
        topic: topic.clone(),
        tags: "fragile".to_owned(),
        keys: vec![key.clone()],
        body: b"{}".to_vec(),
        ..Default::default()
    };
    producer.send(&message).await.unwrap();
    let seen =
        wait_for_log(&db.store, &key, "dead letter", |s| s.iter().any(|o| o.starts_with("dead_lettered")))
            .await;
    assert_eq!(seen, ["failed/", "failed/", "dead_lettered/"]);

    fixed.store(true, Ordering::SeqCst);
    let selection = Selection::Key { biz_id: key.clone(), biz_type: None, execute_time: None };
    let lines = replay::replay(&db.store, &routes, &group, &selection, Some(&producer)).await.unwrap();
    assert!(matches!(lines.as_slice(), [l] if matches!(l.action, Action::Sent { .. })), "{lines:?}");
    let seen =
        wait_for_log(&db.store, &key, "replayed delivery", |s| s.iter().any(|o| o.starts_with("processed")))
            .await;
    assert_eq!(seen, ["failed/", "failed/", "dead_lettered/", "processed/replay"]);

    let again = replay::replay(&db.store, &routes, &group, &selection, Some(&producer)).await.unwrap();
    assert!(
        matches!(again.as_slice(), [l] if matches!(l.action, Action::RefusedClaimed { state: "live", .. })),
        "{again:?}"
    );
    tokio::time::sleep(Duration::from_secs(3)).await;
    let effects: i64 =
        db.store.query(&FRAGILE_EFFECTS).bind(key.as_str()).fetch_one(db.store.pool()).await.unwrap().get(0);
    assert_eq!(effects, 1, "applied exactly once");
    assert_eq!(log_of(&db.store, &key).await.len(), 4, "nothing arrived after the refused replay");

    producer.shutdown().await;
    service.stop().await.expect("the service stops cleanly");
    db.drop_now().await;
}

static INVALID_OF: Sql =
    Sql::new("SELECT msg_id FROM delivery_log WHERE uniq_key = ? AND outcome = 'invalid' ORDER BY id");
static ORDERS_OF: Sql = Sql::new("SELECT COUNT(*) FROM shop_order WHERE order_no = ?");

/// Waits (up to 240 s) for the invalid row of the message sent as `uniq_key`; its msgId.
async fn invalid_msg_id(store: &Store, uniq_key: &str) -> String {
    let started = std::time::Instant::now();
    loop {
        if let Some(row) = store.query(&INVALID_OF).bind(uniq_key).fetch_optional(store.pool()).await.unwrap()
        {
            return row.get(0);
        }
        assert!(started.elapsed() < Duration::from_secs(240), "no invalid row for {uniq_key} within 240 s");
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
}

/// A release whose order route reads the order number from a property the producer never sets
/// refuses every order as invalid and acknowledges it. The fixed release reads it from the
/// KEYS again; each refused order is replayed into exactly one order, once by
/// `idemgate replay --msg-id` and once by the trace page's form for the message, and a second
/// replay of each is refused.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_invalid_delivery_is_replayed_after_its_route_is_fixed_into_exactly_one_effect() {
    let db = database(Backend::Postgres).await;
    let (topic, group, run) = (unique("invalid"), unique("group"), unique("I").replace('_', ""));
    let fixed = settings(&db.url, &topic, &group, "fixed", 2);
    let mut broken = settings(&db.url, &topic, &group, "broken", 2);
    for route in broken.routes.iter_mut().filter(|r| r.biz_type == shop::ORDER_CREATE) {
        route.biz_id = "property:ORDER_NO".to_owned();
    }
    let producer = Producer::start(&broker().access(), &unique("pgroup")).await.unwrap();

    let service = Service::start(&broken);
    let orders = [format!("{run}-ORD-1"), format!("{run}-ORD-2")];
    let mut refused = Vec::new();
    for order_no in &orders {
        let sent = producer.send(&order(&topic, order_no, 700)).await.unwrap();
        refused.push(invalid_msg_id(&db.store, &sent.uniq_key).await);
    }
    assert_eq!(service.terminate().code(), Some(0));

    let service = Service::start(&fixed);
    let addr = service_addr(&service);
    let config = ConfigFile::of(&fixed);
    let replay = |args: &[&str]| config.replay(args);
    let orders_of = |order_no: String| {
        let store = db.store.clone();
        async move {
            let row = store.query(&ORDERS_OF).bind(order_no.as_str()).fetch_one(store.pool()).await.unwrap();
            row.get::<i64, _>(0)
        }
    };

    // 1. By command, by msgId.
    let (code, out) = replay(&["--msg-id", &refused[0], "--dry-run"]);
    assert_eq!(code, Some(0), "{out}");
    assert!(
        out.contains(&format!("order.create \"{}\" (invalid delivery {}", orders[0], refused[0])),
        "{out}"
    );
    assert!(out.contains("would be sent (dry run)"), "{out}");
    let (code, out) = replay(&["--msg-id", &refused[0]]);
    assert_eq!(code, Some(0), "{out}");
    assert!(out.contains("sent again as UNIQ_KEY"), "{out}");
    let seen = wait_for_log(&db.store, &orders[0], "replayed order", |s| !s.is_empty()).await;
    assert_eq!(seen, ["processed/replay"]);
    assert_eq!(orders_of(orders[0].clone()).await, 1);
    let (_, out) = replay(&["--msg-id", &refused[0]]);
    assert!(out.contains("refused: already applied (live claim"), "{out}");

    // 2. From the trace page of the message, whose form names it by its msgId.
    let (status, page) = http_get(&addr, &format!("/trace?q={}&by=msg_id", refused[1])).unwrap();
    assert_eq!(status, 200, "{page}");
    assert!(page.contains("Replay the invalid delivery"), "{page}");
    let token = replay_token_on(&page);
    let form = serde_urlencoded::to_string([
        ("group", group.as_str()),
        ("msg_id", refused[1].as_str()),
        ("csrf", token.as_str()),
    ])
    .unwrap();
    let (status, result) = http_post_form(&addr, "/replay", &form).unwrap();
    assert_eq!(status, 200, "{result}");
    assert!(result.contains("sent again as UNIQ_KEY"), "{result}");
    let seen = wait_for_log(&db.store, &orders[1], "replayed order", |s| !s.is_empty()).await;
    assert_eq!(seen, ["processed/replay"]);
    let (_, again) = http_post_form(&addr, "/replay", &form).unwrap();
    assert!(again.contains("refused: already applied"), "{again}");

    tokio::time::sleep(Duration::from_secs(3)).await;
    for order_no in &orders {
        assert_eq!(orders_of(order_no.clone()).await, 1, "{order_no}: one order");
        assert_eq!(log_of(&db.store, order_no).await, ["processed/replay"], "nothing after the refusals");
    }
    producer.shutdown().await;
    assert_eq!(service.terminate().code(), Some(0));
    db.drop_now().await;
}
