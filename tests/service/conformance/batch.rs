//! The batch path of group commit: handlers that take a group's fresh deliveries at once, and a
//! group that goes back to one delivery at a time when a batch fails.

use std::collections::BTreeSet;
use std::sync::Arc;

use async_trait::async_trait;
use idemgate::delivery::Delivery;
use idemgate::gate::{Disposition, Gate};
use idemgate::handler::{Answers, Effect, Handler, HandlerError, Handlers, Work};
use idemgate::metrics::{BuildInfo, Metrics};
use idemgate::outcome::{Layer, Outcome, Verdict};
use idemgate::route::{RouteConfig, Routes};
use idemgate::store::{Backend, Conn, Sql, query, query_built, values_list};
use idemgate_shop as shop;

use super::support::{TestDb, gate, identity, order, payment, series, stock_deduct};
use super::{ADD_ORDER, CLAIMS_OF, LEDGER_ROWS_OF, ORDER_STATUS, STOCK_OF, only_log_row};

const GROUP: &str = "batch-service";
const TOPIC: &str = "batch";
const LEDGERED: &str = "test.ledgered";

/// A handler that writes one ledger row per delivery; its batch form writes them all in one
/// insert. A delivery whose body is `fail` has no SKU, which the ledger refuses (`NOT NULL`):
/// alone it fails by itself, in a batch it fails the whole statement.
struct Ledgered;

static LEDGERED_ROW: Sql = Sql::new(
    "INSERT INTO shop_stock_ledger (deduction_id, sku, quantity, applied_at_ms) VALUES (?, ?, 1, 0)",
);

fn ledgered_sku(work: &Work<'_>) -> Option<&'static str> {
    (work.delivery.body != b"fail").then_some("LEDGERED")
}

#[async_trait]
impl Handler for Ledgered {
    async fn handle(&self, work: &Work<'_>, conn: &mut Conn) -> Result<Effect, HandlerError> {
        query(work.backend, &LEDGERED_ROW)
            .bind(work.key.biz_id.as_str())
            .bind(ledgered_sku(work))
            .execute(&mut *conn)
            .await?;
        Ok(Effect::Applied)
    }

    async fn handle_batch(&self, works: &[Work<'_>], conn: &mut Conn) -> Result<Answers, HandlerError> {
        let sql = format!(
            "INSERT INTO shop_stock_ledger (deduction_id, sku, quantity, applied_at_ms) VALUES {}",
            values_list(4, works.len())
        );
        let mut q = query_built(works[0].backend, sql);
        for work in works {
            q = q.bind(work.key.biz_id.as_str()).bind(ledgered_sku(work)).bind(1i64).bind(0i64);
        }
        q.execute(&mut *conn).await?;
        Ok(works.iter().map(|_| Ok(Effect::Applied)).collect())
    }
}

/// A gate on the shop's routes and handlers plus [`Ledgered`], reporting to the returned
/// metrics.
fn batch_gate(db: &TestDb) -> (Gate, Arc<Metrics>) {
    let route = RouteConfig {
        topic: TOPIC.into(),
        tags: "ledgered".into(),
        biz_type: LEDGERED.into(),
        biz_id: "keys".into(),
        execute_time: None,
        handler: Some(LEDGERED.into()),
    };
    let mut all_routes = shop::routes(shop::TOPIC);
    all_routes.push(route.clone());
    let routes = Routes::new(&all_routes).expect("routes");
    let info = BuildInfo {
        broker: Default::default(),
        backend: db.store.backend(),
        consumer_group: GROUP.into(),
        instance_id: "batch-1".into(),
        ui_url: "http://127.0.0.1:0".into(),
    };
    let topics: BTreeSet<String> = [TOPIC.to_owned(), shop::TOPIC.to_owned()].into();
    let metrics = Arc::new(Metrics::new(&info, &routes.biz_types(), &topics));
    let handlers = Handlers::new().with(LEDGERED, Ledgered);
    let g = gate(db.store.clone(), identity(GROUP, "batch-1"), vec![route], handlers)
        .with_observer(metrics.clone());
    (g, metrics)
}

fn ledgered(key: &str, msg_id: &str, body: &[u8]) -> Delivery {
    Delivery {
        msg_id: msg_id.into(),
        uniq_key: format!("U-{msg_id}"),
        topic: TOPIC.into(),
        tags: "ledgered".into(),
        keys: vec![key.into()],
        body: body.to_vec(),
        ..Default::default()
    }
}

/// Groups that fell back from `handler`'s batch form to one delivery at a time.
async fn fallbacks(metrics: &Metrics, handler: &str) -> f64 {
    let handler = format!("handler=\"{handler}\"");
    series(metrics, "idemgate_group_fallbacks_total", &[&handler]).await.iter().sum()
}

fn outcome(d: &Disposition) -> (Outcome, Option<Layer>, Verdict) {
    (d.outcome, d.layer, d.verdict)
}

fn one_transaction(answers: &[Disposition]) {
    assert!(
        answers.iter().all(|r| r.phases.group_size as usize == answers.len() && r.logged),
        "one transaction, not split: {answers:?}"
    );
}

static LEDGERED_ROWS_OF: Sql =
    Sql::new("SELECT COUNT(*) FROM shop_stock_ledger WHERE sku = 'LEDGERED' AND deduction_id = ?");
static LEDGER_ROWS_OF_SKU: Sql = Sql::new("SELECT COUNT(*) FROM shop_stock_ledger WHERE sku = ?");
static ORDERS_NUMBERED: Sql = Sql::new("SELECT COUNT(*) FROM shop_order WHERE order_no = ?");
static PAYMENT_OF: Sql = Sql::new("SELECT payment_no FROM shop_order WHERE order_no = ?");

pub mod cases {
    use super::*;

    pub async fn a_batch_that_fails_on_its_fifth_delivery_runs_again_one_delivery_at_a_time(
        backend: Backend,
    ) {
        let db = TestDb::new(backend).await;
        let (g, metrics) = batch_gate(&db);
        shop::seed_stock(&db.store, "SKU-F", 10).await.unwrap();
        // Eight deliveries for the ledgered handler, the fifth of them failing, and a
        // deduction whose batch runs first and must be taken back with the group's and made
        // again.
        let mut group: Vec<Delivery> = (1..=8)
            .map(|n| {
                let body: &[u8] = if n == 5 { b"fail" } else { b"{}" };
                ledgered(&format!("L-{n}"), &format!("M-{n}"), body)
            })
            .collect();
        group.push(stock_deduct("D-F", "M-9", "U-9", "SKU-F", 4));
        let answers = g.process_group(&group).await;
        one_transaction(&answers);
        for (n, r) in answers.iter().enumerate() {
            let expected =
                if n == 4 { (Outcome::Failed, Verdict::Retry) } else { (Outcome::Processed, Verdict::Ack) };
            assert_eq!((r.outcome, r.verdict), expected, "delivery {}: {r:?}", n + 1);
        }
        assert!(
            answers[4].error.as_deref().unwrap_or_default().starts_with("database error"),
            "{:?}",
            answers[4]
        );
        assert_eq!(fallbacks(&metrics, LEDGERED).await, 1.0, "the fallback is counted");
        assert_eq!(fallbacks(&metrics, shop::STOCK_DEDUCT).await, 0.0);
        for n in [1, 2, 3, 4, 6, 7, 8] {
            let key = format!("L-{n}");
            assert_eq!(db.scalar(&LEDGERED_ROWS_OF, &[&key]).await, 1, "{key} applied once");
            assert_eq!(db.scalar(&CLAIMS_OF, &[&key]).await, 1);
        }
        assert_eq!(db.scalar(&CLAIMS_OF, &["L-5"]).await, 0, "the fifth stays unclaimed");
        assert_eq!(db.scalar(&LEDGERED_ROWS_OF, &["L-5"]).await, 0);
        assert_eq!(db.scalar(&STOCK_OF, &["SKU-F"]).await, 6, "the deduction taken once");
        assert_eq!(db.scalar(&LEDGER_ROWS_OF, &["D-F"]).await, 1);
        assert_eq!(only_log_row(&db, "M-5").await.outcome, "failed");

        // Its retry, corrected, applies it; a group that fails nothing does not fall back.
        let retry = Delivery { reconsume_times: 1, ..ledgered("L-5", "M-10", b"{}") };
        let again = g.process_group(&[retry, ledgered("L-11", "M-11", b"{}")]).await;
        assert_eq!(outcome(&again[0]), (Outcome::Processed, None, Verdict::Ack));
        assert_eq!(db.scalar(&LEDGERED_ROWS_OF, &["L-5"]).await, 1);
        assert_eq!(fallbacks(&metrics, LEDGERED).await, 1.0);
    }

    pub async fn twenty_deductions_of_one_sku_in_one_group_refuse_exactly_the_three_it_cannot_cover(
        backend: Backend,
    ) {
        let db = TestDb::new(backend).await;
        let (g, metrics) = batch_gate(&db);
        shop::seed_stock(&db.store, "SKU-B", 17).await.unwrap();
        shop::seed_stock(&db.store, "SKU-O", 5).await.unwrap();
        let mut group: Vec<Delivery> = (1..=20)
            .map(|n| stock_deduct(&format!("D-{n}"), &format!("M-{n}"), &format!("U-{n}"), "SKU-B", 1))
            .collect();
        // Another SKU in the same group, and a SKU nobody stocks.
        group.insert(3, stock_deduct("D-O", "M-O", "U-O", "SKU-O", 2));
        group.push(stock_deduct("D-X", "M-X", "U-X", "SKU-NONE", 1));
        let answers = g.process_group(&group).await;
        one_transaction(&answers);
        let refused: Vec<&str> = group
            .iter()
            .zip(&answers)
            .filter(|(_, r)| r.outcome != Outcome::Processed)
            .map(|(d, _)| d.msg_id.as_str())
            .collect();
        assert_eq!(refused, ["M-18", "M-19", "M-20", "M-X"]);
        for msg_id in ["M-18", "M-19", "M-20"] {
            let r = &answers[group.iter().position(|d| d.msg_id == msg_id).unwrap()];
            assert_eq!((r.outcome, r.verdict), (Outcome::DeadLettered, Verdict::DeadLetter), "{msg_id}");
            assert_eq!(r.error.as_deref(), Some("insufficient stock of SKU-B: 0 left, 1 asked"), "{msg_id}");
        }
        assert_eq!(answers.last().unwrap().error.as_deref(), Some("unknown sku SKU-NONE"));
        assert_eq!(db.scalar(&STOCK_OF, &["SKU-B"]).await, 0, "17 taken, never below zero");
        assert_eq!(db.scalar(&STOCK_OF, &["SKU-O"]).await, 3);
        assert_eq!(db.scalar(&LEDGER_ROWS_OF_SKU, &["SKU-B"]).await, 17);
        for key in ["D-17", "D-O"] {
            assert_eq!(db.scalar(&LEDGER_ROWS_OF, &[key]).await, 1, "{key}");
        }
        for key in ["D-18", "D-19", "D-20", "D-X"] {
            assert_eq!(db.scalar(&LEDGER_ROWS_OF, &[key]).await, 0, "{key}");
            assert_eq!(db.scalar(&CLAIMS_OF, &[key]).await, 0, "{key} stays unclaimed");
        }
        assert_eq!(fallbacks(&metrics, shop::STOCK_DEDUCT).await, 0.0, "decided in the batch, no fallback");
    }

    pub async fn an_order_created_again_under_another_key_in_a_group_is_a_duplicate_at_the_business_key(
        backend: Backend,
    ) {
        let db = TestDb::new(backend).await;
        let (g, metrics) = batch_gate(&db);
        let created = g.process(&order("O-1", "SKU", 500, "M-1", "U-1")).await;
        assert_eq!(created.outcome, Outcome::Processed);
        let under = |key: &str, d: Delivery| Delivery { keys: vec![key.into()], ..d };
        let group = vec![
            under("O-1-resent", order("O-1", "SKU", 500, "M-2", "U-2")),
            order("O-2", "SKU", 700, "M-3", "U-3"),
            under("O-2-again", order("O-2", "SKU", 700, "M-4", "U-4")),
            order("O-3", "SKU", 900, "M-5", "U-5"),
        ];
        let answers = g.process_group(&group).await;
        one_transaction(&answers);
        let got: Vec<_> = answers.iter().map(outcome).collect();
        let duplicate = (Outcome::Duplicate, Some(Layer::BusinessUnique), Verdict::Ack);
        let processed = (Outcome::Processed, None, Verdict::Ack);
        assert_eq!(got, [duplicate, processed, duplicate, processed]);
        assert_eq!(only_log_row(&db, "M-2").await.error.as_deref(), Some("order O-1 already exists"));
        assert_eq!(only_log_row(&db, "M-4").await.error.as_deref(), Some("order O-2 already exists"));
        for no in ["O-1", "O-2", "O-3"] {
            assert_eq!(db.scalar(&ORDERS_NUMBERED, &[no]).await, 1, "{no}");
        }
        // The duplicates' claims commit, so that their own redeliveries stop at the claim.
        for key in ["O-1-resent", "O-2-again"] {
            assert_eq!(db.scalar(&CLAIMS_OF, &[key]).await, 1, "{key}");
        }
        assert_eq!(fallbacks(&metrics, shop::ORDER_CREATE).await, 0.0);
    }

    pub async fn a_group_of_payments_moves_its_orders_in_one_update_and_tells_every_other_answer_apart(
        backend: Backend,
    ) {
        let db = TestDb::new(backend).await;
        let (g, metrics) = batch_gate(&db);
        for (no, amount, status) in
            [("O-A", 500, "UNPAID"), ("O-B", 500, "PAID"), ("O-D", 900, "UNPAID"), ("O-E", 300, "UNPAID")]
        {
            db.store
                .query(&ADD_ORDER)
                .bind(no)
                .bind(amount)
                .bind(status)
                .execute(db.store.pool())
                .await
                .unwrap();
        }
        let group = vec![
            payment("P-A", "O-A", 500, "M-1", "U-1", 0),
            payment("P-B", "O-B", 500, "M-2", "U-2", 0),
            payment("P-C", "O-C", 500, "M-3", "U-3", 0),
            payment("P-D", "O-D", 1, "M-4", "U-4", 0),
            // O-A again, under another payment: by then the group has moved it.
            payment("P-A2", "O-A", 500, "M-5", "U-5", 0),
            payment("P-E", "O-E", 300, "M-6", "U-6", 0),
        ];
        let answers = g.process_group(&group).await;
        one_transaction(&answers);
        let got: Vec<_> = answers.iter().map(outcome).collect();
        assert_eq!(
            got,
            [
                (Outcome::Processed, None, Verdict::Ack),
                (Outcome::Duplicate, Some(Layer::StateMachine), Verdict::Ack),
                (Outcome::Failed, None, Verdict::Retry),
                (Outcome::DeadLettered, None, Verdict::DeadLetter),
                (Outcome::Duplicate, Some(Layer::StateMachine), Verdict::Ack),
                (Outcome::Processed, None, Verdict::Ack),
            ]
        );
        assert_eq!(answers[4].error.as_deref(), Some("order O-A is already PAID by payment P-A"));
        assert_eq!(db.scalar_text(&PAYMENT_OF, "O-A").await, "P-A");
        assert_eq!(db.scalar_text(&PAYMENT_OF, "O-E").await, "P-E");
        assert_eq!(db.scalar_text(&ORDER_STATUS, "O-D").await, "UNPAID");
        assert_eq!(db.scalar(&CLAIMS_OF, &["P-C"]).await, 0, "the early payment stays unclaimed");
        assert_eq!(fallbacks(&metrics, shop::PAYMENT_CONFIRM).await, 0.0);
    }
}

on_every_backend!(
    a_batch_that_fails_on_its_fifth_delivery_runs_again_one_delivery_at_a_time,
    twenty_deductions_of_one_sku_in_one_group_refuse_exactly_the_three_it_cannot_cover,
    an_order_created_again_under_another_key_in_a_group_is_a_duplicate_at_the_business_key,
    a_group_of_payments_moves_its_orders_in_one_update_and_tells_every_other_answer_apart,
);

on_mariadb_claiming_as_on_mysql!(
    a_batch_that_fails_on_its_fifth_delivery_runs_again_one_delivery_at_a_time,
    twenty_deductions_of_one_sku_in_one_group_refuse_exactly_the_three_it_cannot_cover,
    an_order_created_again_under_another_key_in_a_group_is_a_duplicate_at_the_business_key,
    a_group_of_payments_moves_its_orders_in_one_update_and_tells_every_other_answer_apart,
);
