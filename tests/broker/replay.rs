//! Guarded dead-letter replay end to end: a real broker, `idemgate serve`, a poison payment that
//! dead-letters, the cause fixed (its order sent), a replay that makes it processed exactly once
//! with cause `replay`, and a second replay refused. Once with `idemgate replay`, once with the
//! trace page's form, and once with a broken handler that is then fixed.

use std::process::Command;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use idemgate::testing::app::{Application, Feed};
use idemgate::testing::broker::Producer;
use idemgate::testing::delivery::Delivery;
use idemgate::testing::handler::{Effect, Handler, HandlerError, Handlers, Work};
use idemgate::testing::replay::{self, Action, Selection};
use idemgate::testing::route::RouteConfig;
use idemgate::testing::shop;
use idemgate::testing::store::{Backend, Conn, Sql, Store, query};
use sqlx::Row;

use super::support::*;
use super::support::{http_get, http_post_form};

static STATUS: Sql = Sql::new("SELECT status FROM shop_order WHERE order_no = ?");

/// Dead-letters `key` (its order missing), then sends the order: the cause is fixed.
pub(super) async fn dead_letter_then_fix(
    store: &Store,
    producer: &Producer,
    topic: &str,
    key: &str,
    order_no: &str,
) {
    producer.send(&payment(topic, key, order_no, 990)).await.unwrap();
    wait_for_log(store, key, "dead letter", |s| s.iter().any(|o| o.starts_with("dead_lettered"))).await;
    producer.send(&order(topic, order_no, 990)).await.unwrap();
    wait_for_log(store, order_no, "order", |s| s.iter().any(|o| o.starts_with("processed"))).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dead_letter_is_replayed_into_exactly_one_effect_and_a_second_replay_is_refused() {
    let db = database(Backend::Postgres).await;
    let (topic, group, run) = (unique("replay"), unique("group"), unique("Y").replace('_', ""));
    let settings = settings(&db.url, &topic, &group, "replayer", 2);
    let service = Service::start(&settings);
    let addr = service_addr(&service);
    let config_dir = tempfile::tempdir().unwrap();
    let config = config_dir.path().join("idemgate.toml");
    std::fs::write(&config, toml::to_string(&settings).unwrap()).unwrap();
    let replay = |args: &[&str]| {
        let out = Command::new(BIN)
            .args(["--config", &config.to_string_lossy(), "replay"])
            .args(args)
            .env_remove("RUST_LOG")
            .output()
            .expect("run idemgate replay");
        (
            out.status.code(),
            String::from_utf8_lossy(&out.stdout).into_owned() + &String::from_utf8_lossy(&out.stderr),
        )
    };
    let producer = Producer::start(broker().name_server(), &unique("pgroup")).await.unwrap();

    // 1. By command.
    let (key, order_no) = (format!("{run}-PAY-1"), format!("{run}-ORD-1"));
    dead_letter_then_fix(&db.store, &producer, &topic, &key, &order_no).await;
    let (code, out) = replay(&["--biz-id", &key, "--dry-run"]);
    assert_eq!(code, Some(0), "{out}");
    assert!(out.contains("would be sent (dry run)"), "{out}");
    assert_eq!(log_of(&db.store, &key).await.len(), 3, "a dry run sends nothing");
    let (code, out) = replay(&["--biz-id", &key]);
    assert_eq!(code, Some(0), "{out}");
    assert!(out.contains("sent again as UNIQ_KEY"), "{out}");
    let seen =
        wait_for_log(&db.store, &key, "replayed delivery", |s| s.iter().any(|o| o.starts_with("processed")))
            .await;
    assert_eq!(seen, ["failed/", "failed/", "dead_lettered/", "processed/replay"]);
    let status = db.store.query(&STATUS).bind(order_no.as_str()).fetch_one(db.store.pool()).await.unwrap();
    assert_eq!(status.get::<String, _>(0), "PAID");
    let (code, out) = replay(&["--biz-id", &key]);
    assert_eq!(code, Some(7), "{out}");
    assert!(out.contains("refused: already applied (live claim"), "{out}");

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
    let producer = Producer::start(broker().name_server(), &unique("pgroup")).await.unwrap();

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
