//! The gate's conformance suite: the same cases against SQLite, PostgreSQL and MariaDB.

// The archive, layers, reconcile and web suites share this module; its macros are in scope in
// every module declared after `conformance` in `main.rs`.
#[macro_use]
pub(crate) mod support;
mod batch;
mod dead_letters;
mod invalid_replay;
mod key_text;
mod sql_handler;
mod state_machine;
mod traceparent;

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use async_trait::async_trait;
use idemgate::delivery::{Delivery, REPLAY_PROPERTY};
use idemgate::gate::Gate;
use idemgate::handler::{Effect, Handler, HandlerError, Handlers, Work};
use idemgate::outcome::{DuplicateCause, Layer, Outcome, Verdict};
use idemgate::route::RouteConfig;
use idemgate::store::{Backend, Conn, Sql, query};
use idemgate_shop::{self as shop, ConfirmPayment, CreateOrder};
use sqlx::Row;
use support::{TestDb, gate, identity, stock_deduct};

static CLAIMS_OF: Sql = Sql::new("SELECT COUNT(*) FROM idempotent_record WHERE biz_id = ?");
static LEDGER_ROWS_OF: Sql = Sql::new("SELECT COUNT(*) FROM shop_stock_ledger WHERE deduction_id = ?");
static STOCK_OF: Sql = Sql::new("SELECT quantity FROM shop_stock WHERE sku = ?");
static ORDER_STATUS: Sql = Sql::new("SELECT status FROM shop_order WHERE order_no = ?");
/// An order put in place by hand, in a given status.
static ADD_ORDER: Sql = Sql::new(
    "INSERT INTO shop_order (order_no, user_id, sku, quantity, amount_cents, status, created_at_ms) \
     VALUES (?, 'u', 'SKU', 1, ?, ?, 0)",
);
static LOG_ROW_OF_MSG: Sql = Sql::new(
    "SELECT outcome, cause, layer, payload_match, error, biz_type, biz_id, payload, consumer_group, instance_id \
     FROM delivery_log WHERE msg_id = ? ORDER BY id",
);
static ALL_LOG_ROWS: Sql = Sql::new("SELECT COUNT(*) FROM delivery_log");

/// One delivery-log row, as the tests read it.
#[derive(Debug)]
struct LogRow {
    outcome: String,
    cause: Option<String>,
    layer: Option<String>,
    payload_match: Option<i16>,
    error: Option<String>,
    biz_type: String,
    biz_id: String,
    payload: Option<Vec<u8>>,
    consumer_group: String,
    instance_id: String,
}

async fn log_rows(db: &TestDb, msg_id: &str) -> Vec<LogRow> {
    let rows =
        db.store.query(&LOG_ROW_OF_MSG).bind(msg_id).fetch_all(db.store.pool()).await.expect("log rows");
    rows.iter()
        .map(|r| LogRow {
            outcome: r.get(0),
            cause: r.get(1),
            layer: r.get(2),
            payload_match: r.get(3),
            error: r.get(4),
            biz_type: r.get(5),
            biz_id: r.get(6),
            payload: r.get(7),
            consumer_group: r.get(8),
            instance_id: r.get(9),
        })
        .collect()
}

async fn only_log_row(db: &TestDb, msg_id: &str) -> LogRow {
    let mut rows = log_rows(db, msg_id).await;
    assert_eq!(rows.len(), 1, "exactly one log row for {msg_id}: {rows:?}");
    rows.remove(0)
}

/// A handler for the tests: writes a ledger row (an effect), then fails while `failing` is set,
/// so a rollback must take the effect back with the claim.
struct Flaky {
    failing: Arc<AtomicBool>,
}

static FLAKY_EFFECT: Sql = Sql::new(
    "INSERT INTO shop_stock_ledger (deduction_id, sku, quantity, applied_at_ms) VALUES (?, 'FLAKY', 1, 0)",
);

#[async_trait]
impl Handler for Flaky {
    async fn handle(&self, work: &Work<'_>, conn: &mut Conn) -> Result<Effect, HandlerError> {
        query(work.backend, &FLAKY_EFFECT).bind(work.key.biz_id.as_str()).execute(&mut *conn).await?;
        if self.failing.load(Ordering::SeqCst) {
            return Err(HandlerError::Retryable("downstream said no".to_owned()));
        }
        Ok(Effect::Applied)
    }
}

/// A handler for the group cases: writes a ledger row, then fails when the body says so
/// (`fail`: retry; `never`: dead letter), so that only that delivery's savepoint must go.
struct Picky;

static PICKY_EFFECT: Sql = Sql::new(
    "INSERT INTO shop_stock_ledger (deduction_id, sku, quantity, applied_at_ms) VALUES (?, 'PICKY', 1, 0)",
);

#[async_trait]
impl Handler for Picky {
    async fn handle(&self, work: &Work<'_>, conn: &mut Conn) -> Result<Effect, HandlerError> {
        query(work.backend, &PICKY_EFFECT).bind(work.key.biz_id.as_str()).execute(&mut *conn).await?;
        match &work.delivery.body[..] {
            b"fail" => Err(HandlerError::Retryable("downstream said no".to_owned())),
            b"never" => Err(HandlerError::Permanent("this can never work".to_owned())),
            _ => Ok(Effect::Applied),
        }
    }
}

const TEST_TOPIC: &str = "conformance";

fn test_route(tags: &str, biz_type: &str, biz_id: &str, execute_time: Option<&str>) -> RouteConfig {
    RouteConfig {
        topic: TEST_TOPIC.into(),
        tags: tags.into(),
        biz_type: biz_type.into(),
        biz_id: biz_id.into(),
        execute_time: execute_time.map(Into::into),
        handler: Some("test.flaky".into()),
    }
}

fn flaky_gate(db: &TestDb, failing: Arc<AtomicBool>) -> Gate {
    let mut picky = test_route("picky", "test.picky", "keys", None);
    picky.handler = Some("test.picky".into());
    let routes = vec![
        test_route("flaky", "test.flaky", "keys", None),
        test_route("scheduled", "test.scheduled", "keys", Some("property:EXECUTE_TIME")),
        test_route("json", "test.json", "json:/id", None),
        picky,
    ];
    let handlers = Handlers::new().with("test.flaky", Flaky { failing }).with("test.picky", Picky);
    gate(db.store.clone(), identity("orders-service", "instance-a"), routes, handlers)
}

fn test_delivery(tag: &str, key: &str, msg_id: &str) -> Delivery {
    Delivery {
        msg_id: msg_id.into(),
        uniq_key: format!("U-{msg_id}"),
        topic: TEST_TOPIC.into(),
        tags: tag.into(),
        keys: vec![key.into()],
        body: b"{}".to_vec(),
        ..Default::default()
    }
}

/// A `picky` delivery of `key` with `body`.
fn picky(key: &str, msg_id: &str, uniq_key: &str, body: &[u8]) -> Delivery {
    Delivery { uniq_key: uniq_key.into(), body: body.to_vec(), ..test_delivery("picky", key, msg_id) }
}

static PICKY_ROWS_OF: Sql =
    Sql::new("SELECT COUNT(*) FROM shop_stock_ledger WHERE sku = 'PICKY' AND deduction_id = ?");

mod cases {
    use super::*;

    static WITH_ATTEMPT: Sql =
        Sql::new("SELECT COUNT(*) FROM delivery_log WHERE msg_id = ? AND attempt_id IS NOT NULL");

    /// A log row written on its own (a failure, here) whose insert committed while its answer
    /// was lost: the gate writes it again on a fresh connection, with the same attempt, and the
    /// log keeps one row.
    pub async fn a_log_row_written_again_after_its_answer_was_lost_is_kept_once(backend: Backend) {
        use idemgate::delivery_log::{AttemptId, Entry, append_once};
        let db = TestDb::new(backend).await;
        let d = test_delivery("flaky", "LOST-1", "M-lost");
        let entry = Entry {
            logged_at_ms: 1,
            instance_id: "instance-a",
            consumer_group: "orders-service",
            delivery: &d,
            biz_type: "test.flaky",
            biz_id: "LOST-1",
            execute_time: 0,
            outcome: Outcome::Failed,
            cause: None,
            layer: None,
            payload_match: None,
            payload_hash: None,
            error: Some("downstream said no"),
            latency_us: 1,
            keep_payload: false,
        };
        let attempt = AttemptId::new();
        let mut first = db.store.pool().acquire().await.expect("a connection");
        assert!(append_once(&mut first, backend, &entry, &attempt).await.expect("the first write"));
        drop(first);
        let other = db.second_store().await;
        let mut fresh = other.pool().acquire().await.expect("a fresh connection");
        let again = append_once(&mut fresh, backend, &entry, &attempt).await.expect("the retried write");
        assert!(!again, "the retry finds the attempt's row there");
        assert_eq!(log_rows(&db, "M-lost").await.len(), 1, "one row for one attempt");
        // The next attempt at the same delivery is a row of its own.
        assert!(append_once(&mut fresh, backend, &entry, &AttemptId::new()).await.expect("a second attempt"));
        assert_eq!(log_rows(&db, "M-lost").await.len(), 2);

        // The gate's rows written on their own carry their attempt; a processed one, written in
        // the claim's transaction, none.
        let failing = Arc::new(AtomicBool::new(true));
        let g = flaky_gate(&db, failing.clone());
        assert_eq!(g.process(&test_delivery("flaky", "LOST-2", "M-fail")).await.outcome, Outcome::Failed);
        failing.store(false, Ordering::SeqCst);
        assert_eq!(g.process(&test_delivery("flaky", "LOST-2", "M-ok")).await.outcome, Outcome::Processed);
        assert_eq!(db.scalar(&WITH_ATTEMPT, &["M-fail"]).await, 1);
        assert_eq!(db.scalar(&WITH_ATTEMPT, &["M-ok"]).await, 0);
    }

    pub async fn a_failing_handler_in_the_middle_of_a_group_rolls_back_only_itself(backend: Backend) {
        let db = TestDb::new(backend).await;
        let g = flaky_gate(&db, Arc::new(AtomicBool::new(false)));
        shop::seed_stock(&db.store, "SKU-G", 100).await.unwrap();
        let group = vec![
            stock_deduct("G-D1", "M-1", "U-1", "SKU-G", 3),
            picky("G-OK1", "M-2", "U-2", b"{}"),
            picky("G-FAIL", "M-3", "U-3", b"fail"),
            stock_deduct("G-D2", "M-4", "U-4", "SKU-G", 5),
            picky("G-NEVER", "M-5", "U-5", b"never"),
            // A redelivery of M-1 and a resend of G-D2 in the same group.
            stock_deduct("G-D1", "M-6", "U-1", "SKU-G", 3),
            stock_deduct("G-D2", "M-7", "U-7", "SKU-G", 5),
            Delivery { keys: vec![], ..picky("x", "M-8", "U-8", b"{}") },
            picky("G-OK2", "M-9", "U-9", b"{}"),
        ];
        let answers = g.process_group(&group).await;
        assert!(answers.iter().all(|r| r.phases.group_size == 9), "one transaction, not split: {answers:?}");
        let got: Vec<_> = answers.iter().map(|r| (r.outcome, r.verdict, r.logged)).collect();
        use Outcome::*;
        assert_eq!(
            got,
            vec![
                (Processed, Verdict::Ack, true),
                (Processed, Verdict::Ack, true),
                (Failed, Verdict::Retry, true),
                (Processed, Verdict::Ack, true),
                (DeadLettered, Verdict::DeadLetter, true),
                (Duplicate, Verdict::Ack, true),
                (Duplicate, Verdict::Ack, true),
                (Invalid, Verdict::Ack, true),
                (Processed, Verdict::Ack, true),
            ]
        );
        // A new msgId with the same UNIQ_KEY, and no copy named: a second copy of the message.
        assert_eq!(answers[5].cause, Some(DuplicateCause::ProducerRetry));
        assert_eq!(answers[6].cause, Some(DuplicateCause::ProducerResend));
        assert_eq!(answers[5].layer, Some(Layer::Db));
        // The failed and the dead-lettered deliveries left nothing behind: no claim, no effect.
        for key in ["G-FAIL", "G-NEVER"] {
            assert_eq!(db.scalar(&CLAIMS_OF, &[key]).await, 0, "{key} stays unclaimed");
            assert_eq!(db.scalar(&PICKY_ROWS_OF, &[key]).await, 0, "{key}'s effect was rolled back");
        }
        for key in ["G-OK1", "G-OK2"] {
            assert_eq!(db.scalar(&CLAIMS_OF, &[key]).await, 1);
            assert_eq!(db.scalar(&PICKY_ROWS_OF, &[key]).await, 1);
        }
        assert_eq!(db.scalar(&STOCK_OF, &["SKU-G"]).await, 92, "each deduction once");
        assert_eq!(db.scalar(&LEDGER_ROWS_OF, &["G-D1"]).await, 1);
        assert_eq!(db.scalar(&LEDGER_ROWS_OF, &["G-D2"]).await, 1);
        // Exactly one log row per delivery, the dead letter with its body.
        assert_eq!(db.scalar(&ALL_LOG_ROWS, &[]).await, group.len() as i64);
        let never = only_log_row(&db, "M-5").await;
        assert_eq!(
            (never.outcome.as_str(), never.payload.as_deref()),
            ("dead_lettered", Some(&b"never"[..]))
        );
        assert_eq!(only_log_row(&db, "M-3").await.outcome, "failed");
        assert_eq!(only_log_row(&db, "M-8").await.outcome, "invalid");

        // The retry of the failed delivery, in a group of its own, applies it.
        let retry = Delivery { reconsume_times: 1, ..picky("G-FAIL", "M-10", "U-3", b"{}") };
        let again = g.process_group(&[retry]).await;
        assert_eq!((again[0].outcome, again[0].verdict), (Processed, Verdict::Ack));
        assert_eq!(db.scalar(&PICKY_ROWS_OF, &["G-FAIL"]).await, 1);
    }

    pub async fn a_copy_after_a_failed_first_copy_in_one_group_claims_the_key_in_a_later_round(
        backend: Backend,
    ) {
        let db = TestDb::new(backend).await;
        let g = flaky_gate(&db, Arc::new(AtomicBool::new(false)));
        let group = vec![
            picky("G-K", "M-1", "U-1", b"fail"),
            picky("G-K", "M-2", "U-1", b"fail"),
            picky("G-K", "M-3", "U-1", b"{}"),
            picky("G-K", "M-4", "U-4", b"{}"),
        ];
        let answers = g.process_group(&group).await;
        assert!(answers.iter().all(|r| r.phases.group_size == 4), "one transaction, not split: {answers:?}");
        let got: Vec<_> = answers.iter().map(|r| r.outcome).collect();
        assert_eq!(got, vec![Outcome::Failed, Outcome::Failed, Outcome::Processed, Outcome::Duplicate]);
        assert_eq!(answers[3].cause, Some(DuplicateCause::ProducerResend), "a duplicate of M-3's claim");
        assert_eq!(db.scalar(&CLAIMS_OF, &["G-K"]).await, 1);
        assert_eq!(db.scalar(&PICKY_ROWS_OF, &["G-K"]).await, 1, "applied once, by the third copy");
        assert_eq!(db.scalar(&ALL_LOG_ROWS, &[]).await, 4);
        assert_eq!(db.scalar_text(&CLAIM_MSG_OF, "G-K").await, "M-3");
    }

    pub async fn a_group_whose_transaction_cannot_commit_is_split_and_each_delivery_answers_alone(
        backend: Backend,
    ) {
        let db = TestDb::new(backend).await;
        let g = flaky_gate(&db, Arc::new(AtomicBool::new(false)));
        // Without its log table the group cannot commit: it is split, each delivery fails
        // alone and is not acknowledged; with the table back, the same group goes through.
        let group = vec![
            picky("S-1", "M-1", "U-1", b"{}"),
            stock_deduct("S-2", "M-2", "U-2", "SKU-S", 1),
            picky("S-3", "M-3", "U-3", b"{}"),
        ];
        shop::seed_stock(&db.store, "SKU-S", 10).await.unwrap();
        drop_log_table_for_a_moment(&db).await;
        let answers = g.process_group(&group).await;
        for r in &answers {
            assert_eq!((r.outcome, r.verdict, r.logged), (Outcome::Failed, Verdict::Retry, false), "{r:?}");
        }
        restore_log_table(&db).await;
        assert_eq!(db.scalar(&CLAIMS_OF, &["S-1"]).await, 0, "nothing committed without its log row");
        assert_eq!(db.scalar(&STOCK_OF, &["SKU-S"]).await, 10);
        let again = g.process_group(&group).await;
        assert!(again.iter().all(|r| r.outcome == Outcome::Processed && r.logged), "{again:?}");
    }

    pub async fn sixteen_concurrent_deliveries_of_one_key_apply_the_effect_exactly_once(backend: Backend) {
        let db = TestDb::new(backend).await;
        // Two gates on two pools: two consumer processes of one group, racing.
        let a = Arc::new(gate(db.store.clone(), identity("stock-service", "a"), vec![], Handlers::new()));
        let b =
            Arc::new(gate(db.second_store().await, identity("stock-service", "b"), vec![], Handlers::new()));
        support::race(&db, a, b, "DEDUCT-RACE-1", "SKU-RACE").await;
    }

    pub async fn a_failed_handler_leaves_the_key_unclaimed_and_a_retry_succeeds(backend: Backend) {
        let db = TestDb::new(backend).await;
        let failing = Arc::new(AtomicBool::new(true));
        let g = flaky_gate(&db, failing.clone());

        let first = g.process(&test_delivery("flaky", "K-ROLLBACK", "M-1")).await;
        assert_eq!((first.outcome, first.verdict), (Outcome::Failed, Verdict::Retry));
        assert_eq!(db.scalar(&CLAIMS_OF, &["K-ROLLBACK"]).await, 0, "no dedup row remains");
        assert_eq!(db.scalar(&LEDGER_ROWS_OF, &["K-ROLLBACK"]).await, 0, "the effect rolled back too");
        let row = only_log_row(&db, "M-1").await;
        assert_eq!(row.outcome, "failed");
        assert_eq!(row.error.as_deref(), Some("downstream said no"));

        failing.store(false, Ordering::SeqCst);
        let mut retry = test_delivery("flaky", "K-ROLLBACK", "M-1-retry");
        retry.uniq_key = "U-M-1".into();
        retry.reconsume_times = 1;
        let second = g.process(&retry).await;
        assert_eq!((second.outcome, second.verdict), (Outcome::Processed, Verdict::Ack));
        assert_eq!(db.scalar(&CLAIMS_OF, &["K-ROLLBACK"]).await, 1);
        assert_eq!(db.scalar(&LEDGER_ROWS_OF, &["K-ROLLBACK"]).await, 1);
    }

    pub async fn the_last_allowed_attempt_is_dead_lettered_with_its_body_kept(backend: Backend) {
        let db = TestDb::new(backend).await;
        let g = flaky_gate(&db, Arc::new(AtomicBool::new(true)));
        let mut d = test_delivery("flaky", "K-POISON", "M-POISON");
        d.reconsume_times = g.policy().max_reconsume_times;
        d.body = b"{\"poison\":true}".to_vec();
        let last = g.process(&d).await;
        // Still ReconsumeLater: at the maximum, that is what makes the broker move it to the DLQ.
        assert_eq!((last.outcome, last.verdict), (Outcome::DeadLettered, Verdict::Retry));
        let row = only_log_row(&db, "M-POISON").await;
        assert_eq!(row.outcome, "dead_lettered");
        assert_eq!(row.payload.as_deref(), Some(&b"{\"poison\":true}"[..]));
        assert_eq!(db.scalar(&CLAIMS_OF, &["K-POISON"]).await, 0);
    }

    pub async fn a_permanent_refusal_is_dead_lettered_at_once(backend: Backend) {
        let db = TestDb::new(backend).await;
        shop::seed_stock(&db.store, "SKU-LOW", 2).await.unwrap();
        let g = gate(db.store.clone(), identity("stock-service", "a"), vec![], Handlers::new());
        let d = stock_deduct("DEDUCT-TOO-MUCH", "M-1", "U-1", "SKU-LOW", 5);
        let r = g.process(&d).await;
        assert_eq!((r.outcome, r.verdict), (Outcome::DeadLettered, Verdict::DeadLetter));
        assert_eq!(r.error.as_deref(), Some("insufficient stock of SKU-LOW: 2 left, 5 asked"));
        assert_eq!(db.scalar(&STOCK_OF, &["SKU-LOW"]).await, 2);
        assert_eq!(db.scalar(&CLAIMS_OF, &["DEDUCT-TOO-MUCH"]).await, 0);
    }

    pub async fn different_execute_times_under_one_biz_id_are_processed_independently(backend: Backend) {
        let db = TestDb::new(backend).await;
        let g = flaky_gate(&db, Arc::new(AtomicBool::new(false)));
        let scheduled = |msg: &str, at: &str| {
            let mut d = test_delivery("scheduled", "REMIND-1", msg);
            d.properties.insert("EXECUTE_TIME".into(), at.into());
            d
        };
        assert_eq!(g.process(&scheduled("M-1", "1767225600000")).await.outcome, Outcome::Processed);
        assert_eq!(g.process(&scheduled("M-2", "2026-01-02T00:00:00Z")).await.outcome, Outcome::Processed);
        // The same schedule again is a duplicate: 2026-01-01T00:00:00Z is 1767225600000.
        let again = g.process(&scheduled("M-3", "2026-01-01T00:00:00Z")).await;
        assert_eq!(again.outcome, Outcome::Duplicate);
        assert_eq!(again.key.as_ref().map(|k| k.execute_time), Some(1_767_225_600_000));
        assert_eq!(db.scalar(&CLAIMS_OF, &["REMIND-1"]).await, 2);
        assert_eq!(db.scalar(&LEDGER_ROWS_OF, &["REMIND-1"]).await, 2);
    }

    pub async fn duplicate_causes_are_classified_from_uniq_key_and_replay_marks(backend: Backend) {
        let db = TestDb::new(backend).await;
        shop::seed_stock(&db.store, "SKU-C", 100).await.unwrap();
        let g = gate(db.store.clone(), identity("stock-service", "a"), vec![], Handlers::new());
        let d = |msg: &str, uniq: &str| stock_deduct("DEDUCT-C", msg, uniq, "SKU-C", 1);
        assert_eq!(g.process(&d("M-1", "U-1")).await.outcome, Outcome::Processed);

        let mut replay = d("M-5", "U-5");
        replay.properties.insert(REPLAY_PROPERTY.into(), "M-1".into());
        for (delivery, cause) in [
            (d("M-2", "U-1"), DuplicateCause::ProducerRetry),
            (d("M-3", "U-3"), DuplicateCause::ProducerResend),
            (d("M-4", ""), DuplicateCause::Unknown),
            (replay, DuplicateCause::Replay),
        ] {
            let msg_id = delivery.msg_id.clone();
            let r = g.process(&delivery).await;
            assert_eq!(
                (r.outcome, r.cause, r.layer),
                (Outcome::Duplicate, Some(cause), Some(Layer::Db)),
                "{msg_id}"
            );
            assert_eq!(r.payload_match, Some(true));
            let row = only_log_row(&db, &msg_id).await;
            assert_eq!(
                (row.outcome.as_str(), row.cause.as_deref(), row.layer.as_deref(), row.payload_match),
                ("duplicate", Some(cause.as_str()), Some("db"), Some(1))
            );
        }
        // The claim's own delivery again (its msgId): the same stored copy, a redelivery.
        let r = g.process(&d("M-1", "U-1")).await;
        assert_eq!(
            (r.outcome, r.cause, r.layer),
            (Outcome::Duplicate, Some(DuplicateCause::Redelivery), Some(Layer::Db))
        );
        let rows = log_rows(&db, "M-1").await;
        let seen: Vec<_> = rows.iter().map(|r| (r.outcome.as_str(), r.cause.as_deref())).collect();
        assert_eq!(seen, [("processed", None), ("duplicate", Some("redelivery"))]);
        assert_eq!(db.scalar(&STOCK_OF, &["SKU-C"]).await, 99);
    }

    pub async fn a_duplicate_with_a_different_body_is_flagged_as_a_key_collision(backend: Backend) {
        let db = TestDb::new(backend).await;
        shop::seed_stock(&db.store, "SKU-K", 100).await.unwrap();
        let g = gate(db.store.clone(), identity("stock-service", "a"), vec![], Handlers::new());
        assert_eq!(
            g.process(&stock_deduct("DEDUCT-K", "M-1", "U-1", "SKU-K", 1)).await.outcome,
            Outcome::Processed
        );
        let r = g.process(&stock_deduct("DEDUCT-K", "M-2", "U-2", "SKU-K", 40)).await;
        assert_eq!((r.outcome, r.payload_match), (Outcome::Duplicate, Some(false)));
        let row = only_log_row(&db, "M-2").await;
        assert_eq!(row.payload_match, Some(0));
        assert!(row.error.unwrap_or_default().contains("key collision"));
        assert_eq!(db.scalar(&STOCK_OF, &["SKU-K"]).await, 99, "the colliding deduction was not applied");
    }

    pub async fn every_invalid_input_is_logged_with_its_reason_and_nothing_panics(backend: Backend) {
        let db = TestDb::new(backend).await;
        let g = flaky_gate(&db, Arc::new(AtomicBool::new(false)));
        let with_keys =
            |msg: &str, keys: Vec<String>| Delivery { keys, ..test_delivery("flaky", "unused", msg) };
        let with_body =
            |msg: &str, body: &[u8]| Delivery { body: body.to_vec(), ..test_delivery("json", "unused", msg) };
        let huge = "9".repeat(10_000);
        let cases: Vec<(Delivery, &str)> = vec![
            (with_keys("I-1", vec![]), "biz_id: the message has no KEYS"),
            (with_keys("I-2", vec![String::new()]), "biz_id: the message KEYS are empty"),
            (with_keys("I-3", vec![huge.clone()]), "is 10000 characters long; the limit is 128"),
            (
                with_body("I-4", b"\xc3\x28 not utf-8"),
                "biz_id: the body is not UTF-8 (invalid byte at offset 0)",
            ),
            (with_body("I-5", b"<xml/>"), "biz_id: the body is not JSON"),
            (
                with_body("I-6", br#"{"id":"x'); DROP TABLE idempotent_record; --"}"#),
                "forbidden character \\' (U+0027) at position 2",
            ),
            (
                with_body("I-7", br#"{"id":"<img src=x onerror=alert(1)>"}"#),
                "forbidden character < (U+003C) at position 1",
            ),
            (
                with_body("I-8", b"{\"id\":\"A\\u0007B\\r\\n\"}"),
                "forbidden character \\u{7} (U+0007) at position 2",
            ),
            (with_body("I-9", br#"{"id":"\"quoted\""}"#), "forbidden character \\\" (U+0022) at position 1"),
            (
                with_body("I-10", br#"{"id":"x"}"#).with_topic("unknown_topic"),
                "no route for topic unknown_topic with tag json",
            ),
        ];
        for (d, reason) in cases {
            let msg_id = d.msg_id.clone();
            let r = g.process(&d).await;
            assert_eq!((r.outcome, r.verdict), (Outcome::Invalid, Verdict::Ack), "{msg_id}: {r:?}");
            assert!(r.logged, "{msg_id}");
            let row = only_log_row(&db, &msg_id).await;
            assert_eq!(row.outcome, "invalid");
            let error = row.error.unwrap_or_default();
            assert!(error.contains(reason), "{msg_id}: expected {reason:?} in {error:?}");
            assert_eq!(row.payload.as_deref(), Some(&d.body[..]), "{msg_id}: the body is kept");
            assert!(row.biz_id.chars().count() <= 128);
        }
        // The hostile bizIds were stored as data, escaped and bounded, and findable.
        let row = only_log_row(&db, "I-6").await;
        assert_eq!(row.biz_id, "x\\'); DROP TABLE idempotent_record; --");
        assert_eq!(row.biz_type, "test.json");
        let row = only_log_row(&db, "I-3").await;
        assert!(row.biz_id.starts_with("9999") && row.biz_id.ends_with("…(10000 chars)"), "{}", row.biz_id);
        assert_eq!(db.scalar(&CLAIMS_OF, &["x"]).await, 0, "idempotent_record is still there");
        assert_eq!(db.scalar(&ALL_LOG_ROWS, &[]).await, 10);
    }

    pub async fn a_handler_that_finds_the_body_malformed_makes_the_delivery_invalid(backend: Backend) {
        let db = TestDb::new(backend).await;
        let g = gate(db.store.clone(), identity("stock-service", "a"), vec![], Handlers::new());
        let mut d = stock_deduct("DEDUCT-BAD", "M-1", "U-1", "SKU", 1);
        d.body = br#"{"sku":"SKU"}"#.to_vec();
        let r = g.process(&d).await;
        assert_eq!((r.outcome, r.verdict), (Outcome::Invalid, Verdict::Ack));
        assert!(r.error.as_deref().unwrap_or_default().contains("missing field `quantity`"), "{r:?}");
        assert_eq!(db.scalar(&CLAIMS_OF, &["DEDUCT-BAD"]).await, 0, "a corrected resend can still claim it");
    }

    pub async fn two_consumer_groups_apply_their_own_effects_and_one_group_blocks_itself(backend: Backend) {
        let db = TestDb::new(backend).await;
        let failing = Arc::new(AtomicBool::new(false));
        let routes = || vec![test_route("flaky", "test.flaky", "keys", None)];
        let handlers = || Handlers::new().with("test.flaky", Flaky { failing: failing.clone() });
        let stock_a = gate(db.store.clone(), identity("stock-service", "a"), routes(), handlers());
        let stock_b = gate(db.second_store().await, identity("stock-service", "b"), routes(), handlers());
        let points = gate(db.store.clone(), identity("points-service", "a"), routes(), handlers());

        let d = test_delivery("flaky", "ORDER-9", "M-1");
        assert_eq!(stock_a.process(&d).await.outcome, Outcome::Processed);
        assert_eq!(points.process(&d).await.outcome, Outcome::Processed, "another group is not blocked");
        let again = stock_b.process(&d).await;
        assert_eq!((again.outcome, again.cause), (Outcome::Duplicate, Some(DuplicateCause::Redelivery)));
        assert_eq!(db.scalar(&CLAIMS_OF, &["ORDER-9"]).await, 2);
        let rows = log_rows(&db, "M-1").await;
        let who: Vec<_> = rows
            .iter()
            .map(|r| (r.consumer_group.as_str(), r.instance_id.as_str(), r.outcome.as_str()))
            .collect();
        assert_eq!(
            who,
            vec![
                ("stock-service", "a", "processed"),
                ("points-service", "a", "processed"),
                ("stock-service", "b", "duplicate")
            ]
        );
    }

    pub async fn a_state_machine_move_made_twice_is_a_duplicate_and_an_illegal_one_is_refused(
        backend: Backend,
    ) {
        let db = TestDb::new(backend).await;
        let g = gate(db.store.clone(), identity("shop", "a"), vec![], Handlers::new());
        let msg = |tag: &str, key: &str, msg_id: &str, body: Vec<u8>| Delivery {
            msg_id: msg_id.into(),
            uniq_key: format!("U-{msg_id}"),
            topic: shop::TOPIC.into(),
            tags: tag.into(),
            keys: vec![key.into()],
            body,
            ..Default::default()
        };
        let order = |no: &str, amount| {
            serde_json::to_vec(&CreateOrder {
                order_no: no.into(),
                user_id: "u".into(),
                sku: "S".into(),
                quantity: 1,
                amount_cents: amount,
            })
            .unwrap()
        };
        let pay = |no: &str, p: &str, amount| {
            serde_json::to_vec(&ConfirmPayment {
                order_no: no.into(),
                payment_no: p.into(),
                amount_cents: amount,
            })
            .unwrap()
        };
        // The payment arrives before its order: retry later.
        let early = g.process(&msg(shop::TAG_PAYMENT_CONFIRM, "PAY-1", "M-1", pay("O-1", "P-1", 500))).await;
        assert_eq!((early.outcome, early.verdict), (Outcome::Failed, Verdict::Retry));
        assert!(early.error.unwrap_or_default().contains("does not exist yet"));

        assert_eq!(
            g.process(&msg(shop::TAG_ORDER_CREATE, "O-1", "M-2", order("O-1", 500))).await.outcome,
            Outcome::Processed
        );
        // The same order under another message key: stopped by the order's own unique key.
        let again = g.process(&msg(shop::TAG_ORDER_CREATE, "O-1-resent", "M-3", order("O-1", 500))).await;
        assert_eq!((again.outcome, again.layer), (Outcome::Duplicate, Some(Layer::BusinessUnique)));

        let paid = g.process(&msg(shop::TAG_PAYMENT_CONFIRM, "PAY-1", "M-4", pay("O-1", "P-1", 500))).await;
        assert_eq!(paid.outcome, Outcome::Processed);
        // A second payment notification under a new key: the state machine has moved on.
        let twice =
            g.process(&msg(shop::TAG_PAYMENT_CONFIRM, "PAY-1-b", "M-5", pay("O-1", "P-1", 500))).await;
        assert_eq!(
            (twice.outcome, twice.layer, twice.verdict),
            (Outcome::Duplicate, Some(Layer::StateMachine), Verdict::Ack)
        );
        let row = only_log_row(&db, "M-5").await;
        assert_eq!((row.outcome.as_str(), row.layer.as_deref()), ("duplicate", Some("state_machine")));
        assert_eq!(row.error.as_deref(), Some("order O-1 is already PAID by payment P-1"));

        assert_eq!(
            g.process(&msg(shop::TAG_ORDER_CREATE, "O-2", "M-6", order("O-2", 900))).await.outcome,
            Outcome::Processed
        );
        let wrong = g.process(&msg(shop::TAG_PAYMENT_CONFIRM, "PAY-2", "M-7", pay("O-2", "P-2", 1))).await;
        assert_eq!((wrong.outcome, wrong.verdict), (Outcome::DeadLettered, Verdict::DeadLetter));
        assert_eq!(db.scalar_text(&ORDER_STATUS, "O-2").await, "UNPAID");
        assert_eq!(db.scalar_text(&ORDER_STATUS, "O-1").await, "PAID");
    }

    pub async fn a_delivery_whose_log_row_cannot_be_written_is_not_acknowledged(backend: Backend) {
        let db = TestDb::new(backend).await;
        let g = flaky_gate(&db, Arc::new(AtomicBool::new(false)));
        sqlx::query("DROP TABLE delivery_log").execute(db.store.pool()).await.unwrap();
        let invalid = g.process(&Delivery { keys: vec![], ..test_delivery("flaky", "x", "M-1") }).await;
        assert_eq!(
            (invalid.outcome, invalid.verdict, invalid.logged),
            (Outcome::Invalid, Verdict::Retry, false)
        );
        let valid = g.process(&test_delivery("flaky", "K-1", "M-2")).await;
        assert_eq!((valid.outcome, valid.verdict, valid.logged), (Outcome::Failed, Verdict::Retry, false));
        assert_eq!(db.scalar(&CLAIMS_OF, &["K-1"]).await, 0, "without its log row the effect did not commit");
    }
}

trait WithTopic {
    fn with_topic(self, topic: &str) -> Self;
}

impl WithTopic for Delivery {
    fn with_topic(mut self, topic: &str) -> Self {
        self.topic = topic.into();
        self
    }
}

async fn drop_log_table_for_a_moment(db: &TestDb) {
    sqlx::query("ALTER TABLE delivery_log RENAME TO delivery_log_away")
        .execute(db.store.pool())
        .await
        .unwrap();
}

async fn restore_log_table(db: &TestDb) {
    sqlx::query("ALTER TABLE delivery_log_away RENAME TO delivery_log")
        .execute(db.store.pool())
        .await
        .unwrap();
}

static CLAIM_MSG_OF: Sql = Sql::new("SELECT msg_id FROM idempotent_record WHERE biz_id = ?");

/// The gate's exactly-once cases, run by `$runner` (alone or with group commit on), followed by
/// `$extra` cases.
macro_rules! exactly_once_cases {
    ($runner:ident $(, $extra:ident)* $(,)?) => {
        $runner!(
            sixteen_concurrent_deliveries_of_one_key_apply_the_effect_exactly_once,
            a_failed_handler_leaves_the_key_unclaimed_and_a_retry_succeeds,
            the_last_allowed_attempt_is_dead_lettered_with_its_body_kept,
            a_permanent_refusal_is_dead_lettered_at_once,
            different_execute_times_under_one_biz_id_are_processed_independently,
            duplicate_causes_are_classified_from_uniq_key_and_replay_marks,
            a_duplicate_with_a_different_body_is_flagged_as_a_key_collision,
            every_invalid_input_is_logged_with_its_reason_and_nothing_panics,
            a_handler_that_finds_the_body_malformed_makes_the_delivery_invalid,
            two_consumer_groups_apply_their_own_effects_and_one_group_blocks_itself,
            a_state_machine_move_made_twice_is_a_duplicate_and_an_illegal_one_is_refused,
            a_delivery_whose_log_row_cannot_be_written_is_not_acknowledged,
            $($extra,)*
        );
    };
}

exactly_once_cases!(on_every_backend_with_group_commit);

// Group commit's own cases call `process_group` directly, so they run once per backend.
exactly_once_cases!(
    on_every_backend,
    a_log_row_written_again_after_its_answer_was_lost_is_kept_once,
    a_failing_handler_in_the_middle_of_a_group_rolls_back_only_itself,
    a_copy_after_a_failed_first_copy_in_one_group_claims_the_key_in_a_later_round,
    a_group_whose_transaction_cannot_commit_is_split_and_each_delivery_answers_alone,
);

// Group commit as on MySQL (no INSERT … RETURNING), on MariaDB: every case in groups, and
// group commit's own cases.
exactly_once_cases!(
    on_mariadb_claiming_as_on_mysql,
    a_failing_handler_in_the_middle_of_a_group_rolls_back_only_itself,
    a_copy_after_a_failed_first_copy_in_one_group_claims_the_key_in_a_later_round,
    a_group_whose_transaction_cannot_commit_is_split_and_each_delivery_answers_alone,
);

/// The servers the suite runs on are told apart at connect, so the MariaDB runs above claim
/// with `INSERT IGNORE … RETURNING` and only `mariadb_claiming_as_on_mysql` reads back.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_test_server_is_recognised_and_claims_groups_with_a_returning_insert() {
    use idemgate::gate::ClaimPath;
    use idemgate::store::MySqlFlavour;
    for (backend, flavour) in
        [(Backend::Sqlite, None), (Backend::Postgres, None), (Backend::MySql, Some(MySqlFlavour::MariaDb))]
    {
        let db = TestDb::new(backend).await;
        assert_eq!(db.store.mysql_flavour(), flavour, "{backend}");
        assert_eq!(ClaimPath::of(&db.store), ClaimPath::Returning, "{backend}");
        let forced = db.store.clone().assuming_mysql_flavour(MySqlFlavour::MySql);
        let expected = if backend == Backend::MySql { ClaimPath::ReadBack } else { ClaimPath::Returning };
        assert_eq!(ClaimPath::of(&forced), expected, "{backend}");
    }
}

/// The UI's pool bounds each statement on the server with the setting the server has: on
/// MariaDB `max_statement_time` in seconds (MySQL's `max_execution_time` would be refused
/// there), on PostgreSQL `statement_timeout`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_statement_limit_is_set_on_each_server_in_its_own_words() {
    use idemgate::store::StoreOptions;
    let options = StoreOptions {
        statement_timeout: Some(std::time::Duration::from_millis(1_500)),
        ..StoreOptions::default()
    };
    for (backend, read, expected) in [
        (Backend::MySql, "SELECT CAST(ROUND(@@SESSION.max_statement_time * 1000) AS CHAR)", "1500"),
        (Backend::Postgres, "SHOW statement_timeout", "1500ms"),
    ] {
        let db = TestDb::new(backend).await;
        let store =
            idemgate::store::Store::connect(db.url(), &options).await.expect("a pool with a statement limit");
        let shown: String = sqlx::query(read).fetch_one(store.pool()).await.expect(read).get(0);
        assert_eq!(shown, expected, "{backend}");
        store.close().await;
    }
}
