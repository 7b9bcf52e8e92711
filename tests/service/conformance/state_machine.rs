//! State-machine moves through the gate and through the library API, on every backend: a move
//! made once, a second request for it a duplicate at the `state_machine` layer, an illegal move
//! dead-lettered and counted apart, a missing row retried (or dead-lettered), a guard that
//! fails, and movers racing for one row.

use std::collections::BTreeSet;
use std::sync::Arc;

use idemgate::delivery::Delivery;
use idemgate::gate::{Disposition, Gate};
use idemgate::handler::Handler;
use idemgate::metrics::{BuildInfo, Metrics};
use idemgate::outcome::{Layer, Outcome, Verdict};
use idemgate::route::{RouteConfig, Routes};
use idemgate::state_machine::{
    self, Answer, Compare, Found, Move, OnMissing, StateMachine, StateMachineConfig, TransitionSpec, Value,
};
use idemgate::store::{Backend, Sql};
use idemgate_shop as shop;
use sqlx::Row;

use super::support::{TestDb, gate, identity, order, payment};
use super::{ADD_ORDER, CLAIMS_OF, ORDER_STATUS, only_log_row};

const GROUP: &str = "logistics";
const TOPIC: &str = "logistics";

/// `order.ship`: a PAID order becomes SHIPPED. Shipment messages are keyed by their shipment
/// number; the order they ship is in the body.
fn ship_config() -> StateMachineConfig {
    StateMachineConfig {
        name: "order.ship".into(),
        table: "shop_order".into(),
        key_column: "order_no".into(),
        state_column: "status".into(),
        from: vec!["PAID".into()],
        to: "SHIPPED".into(),
        done: None,
        on_missing: OnMissing::Retry,
        set_time_column: None,
        row_key: Some("json:/order_no".into()),
    }
}

/// `parcel.deliver` on a table of the test's own: keyed by the parcel number, a time column
/// set, a missing parcel dead-lettered.
fn deliver_config() -> StateMachineConfig {
    StateMachineConfig {
        name: "parcel.deliver".into(),
        table: "test_parcel".into(),
        key_column: "parcel_no".into(),
        state_column: "state".into(),
        from: vec!["IN_TRANSIT".into(), "OUT_FOR_DELIVERY".into()],
        to: "DELIVERED".into(),
        done: Some(vec!["DELIVERED".into(), "SIGNED".into()]),
        on_missing: OnMissing::DeadLetter,
        set_time_column: Some("delivered_at_ms".into()),
        row_key: None,
    }
}

fn routes() -> Vec<RouteConfig> {
    let route = |tags: &str, biz_type: &str, biz_id: &str, handler: &str| RouteConfig {
        topic: TOPIC.into(),
        tags: tags.into(),
        biz_type: biz_type.into(),
        biz_id: biz_id.into(),
        execute_time: None,
        handler: Some(handler.into()),
    };
    vec![
        route("shipped", "order.shipment", "json:/shipment_no", "order.ship"),
        route("delivered", "parcel.delivery", "keys", "parcel.deliver"),
    ]
}

/// A gate on the shop's routes and handlers plus the configured state machines, reporting to
/// the returned metrics.
fn configured_gate(db: &TestDb) -> (Gate, Arc<Metrics>) {
    let handlers = state_machine::handlers(&[ship_config(), deliver_config()]).expect("valid state machines");
    let mut all_routes = shop::routes(shop::TOPIC);
    all_routes.extend(routes());
    let routes = Routes::new(&all_routes).expect("routes");
    let topics: BTreeSet<String> = [TOPIC.to_owned(), shop::TOPIC.to_owned()].into();
    let info = BuildInfo {
        broker: Default::default(),
        backend: db.store.backend(),
        consumer_group: GROUP.into(),
        instance_id: "ship-1".into(),
        ui_url: "http://127.0.0.1:0".into(),
    };
    let metrics = Arc::new(Metrics::new(&info, &routes.biz_types(), &topics));
    let g = gate(db.store.clone(), identity(GROUP, "ship-1"), self::routes(), handlers)
        .with_observer(metrics.clone());
    (g, metrics)
}

fn shipment(shipment_no: &str, order_no: &str, msg_id: &str) -> Delivery {
    Delivery {
        msg_id: msg_id.into(),
        uniq_key: format!("U-{msg_id}"),
        topic: TOPIC.into(),
        tags: "shipped".into(),
        keys: vec![shipment_no.into()],
        body: serde_json::json!({ "shipment_no": shipment_no, "order_no": order_no })
            .to_string()
            .into_bytes(),
        ..Default::default()
    }
}

fn parcel_delivered(parcel_no: &str, msg_id: &str) -> Delivery {
    Delivery {
        msg_id: msg_id.into(),
        uniq_key: format!("U-{msg_id}"),
        topic: TOPIC.into(),
        tags: "delivered".into(),
        keys: vec![parcel_no.into()],
        body: b"{}".to_vec(),
        ..Default::default()
    }
}

/// Creates order `no` of 500 cents and, with `paid`, pays it, through the shop's own handlers.
async fn seed_order(g: &Gate, no: &str, paid: bool) {
    let created =
        g.process(&order(no, "SKU", 500, &format!("M-create-{no}"), &format!("U-create-{no}"))).await;
    assert_eq!(created.outcome, Outcome::Processed, "{created:?}");
    if paid {
        let pay = payment(&format!("PAY-{no}"), no, 500, &format!("M-pay-{no}"), &format!("U-pay-{no}"), 0);
        assert_eq!(g.process(&pay).await.outcome, Outcome::Processed);
    }
}

/// The sum of a counter's series whose labels include every one of `labels`.
async fn counter(metrics: &Metrics, name: &str, labels: &[&str]) -> f64 {
    let values = crate::conformance::support::series(metrics, name, labels).await;
    assert!(!values.is_empty(), "no series of {name} with {labels:?}");
    values.iter().sum()
}

fn outcome(d: &Disposition) -> (Outcome, Option<Layer>, Verdict) {
    (d.outcome, d.layer, d.verdict)
}

static CREATE_PARCELS: Sql = Sql::new(
    "CREATE TABLE test_parcel (parcel_no VARCHAR(64) NOT NULL PRIMARY KEY, state VARCHAR(16) NOT NULL, \
     delivered_at_ms BIGINT)",
);
static ADD_PARCEL: Sql = Sql::new("INSERT INTO test_parcel (parcel_no, state) VALUES (?, ?)");
static PARCEL: Sql = Sql::new("SELECT state, delivered_at_ms FROM test_parcel WHERE parcel_no = ?");
static SET_ORDER_STATUS: Sql = Sql::new("UPDATE shop_order SET status = ? WHERE order_no = ?");
static ORDER_ROWS: Sql = Sql::new("SELECT COUNT(*) FROM shop_order");

pub mod cases {
    use super::*;

    pub async fn a_configured_move_is_made_once_and_asked_again_is_a_duplicate_at_the_state_machine(
        backend: Backend,
    ) {
        let db = TestDb::new(backend).await;
        let (g, metrics) = configured_gate(&db);
        seed_order(&g, "O-1", true).await;

        let first = g.process(&shipment("SHIP-1", "O-1", "M-1")).await;
        assert_eq!(outcome(&first), (Outcome::Processed, None, Verdict::Ack), "{first:?}");
        assert_eq!(db.scalar_text(&ORDER_STATUS, "O-1").await, "SHIPPED");

        // A second shipment message for the same order: another bizId, so the claim does not
        // stop it; the order's state does.
        let second = g.process(&shipment("SHIP-2", "O-1", "M-2")).await;
        assert_eq!(
            outcome(&second),
            (Outcome::Duplicate, Some(Layer::StateMachine), Verdict::Ack),
            "{second:?}"
        );
        let row = only_log_row(&db, "M-2").await;
        assert_eq!((row.outcome.as_str(), row.layer.as_deref()), ("duplicate", Some("state_machine")));
        assert_eq!(row.error.as_deref(), Some("shop_order O-1 is already SHIPPED"));
        assert_eq!(db.scalar(&CLAIMS_OF, &["SHIP-2"]).await, 1, "the duplicate's claim commits");

        // The first message again stops at the claim.
        let again = g.process(&shipment("SHIP-1", "O-1", "M-3")).await;
        assert_eq!(outcome(&again), (Outcome::Duplicate, Some(Layer::Db), Verdict::Ack));

        assert_eq!(
            counter(
                &metrics,
                "idemgate_conflicts_total",
                &["layer=\"state_machine\"", "biz_type=\"order.shipment\""]
            )
            .await,
            1.0
        );
        assert_eq!(
            counter(&metrics, "idemgate_conflicts_total", &["layer=\"db\"", "biz_type=\"order.shipment\""])
                .await,
            1.0
        );
        assert_eq!(
            counter(&metrics, "idemgate_illegal_transitions_total", &["biz_type=\"order.shipment\""]).await,
            0.0
        );
    }

    pub async fn an_illegal_move_is_dead_lettered_at_the_state_machine_and_counted_apart(backend: Backend) {
        let db = TestDb::new(backend).await;
        let (g, metrics) = configured_gate(&db);
        seed_order(&g, "O-2", false).await;

        let d = shipment("SHIP-3", "O-2", "M-illegal");
        let illegal = g.process(&d).await;
        assert_eq!(
            outcome(&illegal),
            (Outcome::DeadLettered, Some(Layer::StateMachine), Verdict::DeadLetter)
        );
        let row = only_log_row(&db, "M-illegal").await;
        assert_eq!((row.outcome.as_str(), row.layer.as_deref()), ("dead_lettered", Some("state_machine")));
        assert_eq!(
            row.error.as_deref(),
            Some("illegal transition: shop_order O-2 is UNPAID and cannot become SHIPPED")
        );
        assert_eq!(row.payload.as_deref(), Some(&d.body[..]), "the body is kept for replay");
        assert_eq!(db.scalar(&CLAIMS_OF, &["SHIP-3"]).await, 0, "the key stays unclaimed");
        assert_eq!(db.scalar_text(&ORDER_STATUS, "O-2").await, "UNPAID");

        // Another kind of dead letter, a payment of the wrong amount, is no illegal transition.
        let wrong = g.process(&payment("PAY-X", "O-2", 1, "M-wrong", "U-wrong", 0)).await;
        assert_eq!(outcome(&wrong), (Outcome::DeadLettered, None, Verdict::DeadLetter));
        assert_eq!(only_log_row(&db, "M-wrong").await.layer, None);

        let illegal = "idemgate_illegal_transitions_total";
        assert_eq!(counter(&metrics, illegal, &["biz_type=\"order.shipment\""]).await, 1.0);
        assert_eq!(
            counter(&metrics, illegal, &["biz_type=\"payment.confirm\""]).await,
            0.0,
            "known biz_types start at 0"
        );
        assert_eq!(counter(&metrics, illegal, &["biz_type=\"parcel.delivery\""]).await, 0.0);
        assert_eq!(
            counter(&metrics, "idemgate_deliveries_total", &["outcome=\"dead_lettered\""]).await,
            2.0,
            "both are dead letters"
        );
        assert_eq!(
            counter(&metrics, "idemgate_conflicts_total", &["layer=\"state_machine\""]).await,
            0.0,
            "neither is a duplicate"
        );
    }

    pub async fn a_missing_row_is_retried_or_dead_lettered_as_configured(backend: Backend) {
        let db = TestDb::new(backend).await;
        let (g, metrics) = configured_gate(&db);
        db.store.query(&CREATE_PARCELS).execute(db.store.pool()).await.expect("parcel table");

        let early = g.process(&shipment("SHIP-9", "O-404", "M-early")).await;
        assert_eq!(outcome(&early), (Outcome::Failed, None, Verdict::Retry));
        assert_eq!(
            early.error.as_deref(),
            Some("shop_order O-404 does not exist yet; it may still be on its way")
        );
        assert_eq!(db.scalar(&CLAIMS_OF, &["SHIP-9"]).await, 0);
        // The order arrives, and the redelivery moves it.
        seed_order(&g, "O-404", true).await;
        let mut retry = shipment("SHIP-9", "O-404", "M-early-2");
        retry.uniq_key = "U-M-early".into();
        retry.reconsume_times = 1;
        assert_eq!(g.process(&retry).await.outcome, Outcome::Processed);

        let lost = g.process(&parcel_delivered("P-404", "M-lost")).await;
        assert_eq!(outcome(&lost), (Outcome::DeadLettered, None, Verdict::DeadLetter));
        assert_eq!(lost.error.as_deref(), Some("test_parcel P-404 does not exist"));
        assert_eq!(counter(&metrics, "idemgate_illegal_transitions_total", &[]).await, 0.0);
    }

    pub async fn a_configured_move_sets_its_time_column_and_shows_the_row_on_the_trace_page(
        backend: Backend,
    ) {
        let db = TestDb::new(backend).await;
        let (g, _) = configured_gate(&db);
        db.store.query(&CREATE_PARCELS).execute(db.store.pool()).await.expect("parcel table");
        for (parcel, state) in [("P-1", "OUT_FOR_DELIVERY"), ("P-2", "SIGNED"), ("P-3", "RETURNED")] {
            db.store
                .query(&ADD_PARCEL)
                .bind(parcel)
                .bind(state)
                .execute(db.store.pool())
                .await
                .expect("parcel");
        }
        let before = idemgate::clock::now_ms();
        assert_eq!(g.process(&parcel_delivered("P-1", "M-1")).await.outcome, Outcome::Processed);
        let after = idemgate::clock::now_ms();
        let row = db.store.query(&PARCEL).bind("P-1").fetch_one(db.store.pool()).await.expect("parcel");
        let (state, at): (String, Option<i64>) = (row.get(0), row.get(1));
        assert_eq!(state, "DELIVERED");
        assert!(at.is_some_and(|at| (before..=after).contains(&at)), "{at:?} not in {before}..={after}");

        // SIGNED is a done state besides the to-state.
        let signed = g.process(&parcel_delivered("P-2", "M-2")).await;
        assert_eq!(outcome(&signed), (Outcome::Duplicate, Some(Layer::StateMachine), Verdict::Ack));
        let returned = g.process(&parcel_delivered("P-3", "M-3")).await;
        assert_eq!(
            outcome(&returned),
            (Outcome::DeadLettered, Some(Layer::StateMachine), Verdict::DeadLetter)
        );

        let handler = deliver_config().handler().expect("handler");
        let facts = handler.describe(&db.store, "P-1").await.expect("describe");
        let shown: Vec<(&str, &str)> = facts.iter().map(|f| (f.label.as_str(), f.value.as_str())).collect();
        assert_eq!(
            shown[..2],
            [("row", "test_parcel P-1"), ("state", "DELIVERED: the move to DELIVERED is made")]
        );
        assert_eq!(shown[2].0, "delivered_at_ms");
        assert_eq!(shown[2].1, idemgate::clock::format_ms(at.unwrap_or_default()));
        let facts = handler.describe(&db.store, "P-3").await.expect("describe");
        assert_eq!(facts[1].value, "RETURNED: cannot become DELIVERED");
        let facts = handler.describe(&db.store, "P-9").await.expect("describe");
        assert_eq!(
            (facts[0].label.as_str(), facts[0].value.as_str()),
            ("test_parcel", "no row with parcel_no P-9")
        );
        // Rows named by a body field cannot be found from the bizId, and the page says so.
        let facts =
            ship_config().handler().expect("handler").describe(&db.store, "SHIP-1").await.expect("describe");
        assert_eq!(facts[0].value, "rows are named by json:/order_no of each message, not by the bizId");
    }

    pub async fn movers_racing_for_one_row_move_it_once(backend: Backend) {
        let db = TestDb::new(backend).await;
        let (g, _) = configured_gate(&db);
        seed_order(&g, "O-RACE", true).await;
        let second = {
            let handlers = state_machine::handlers(&[ship_config(), deliver_config()]).expect("valid");
            gate(db.second_store().await, identity(GROUP, "ship-2"), routes(), handlers)
        };
        let gates = [Arc::new(g), Arc::new(second)];
        let barrier = Arc::new(tokio::sync::Barrier::new(8));
        let tasks: Vec<_> = (0..8)
            .map(|i| {
                let (g, barrier) = (gates[i % 2].clone(), barrier.clone());
                let d = shipment(&format!("SHIP-R{i}"), "O-RACE", &format!("M-R{i}"));
                tokio::spawn(async move {
                    barrier.wait().await;
                    g.process(&d).await
                })
            })
            .collect();
        let mut ends = Vec::new();
        for t in tasks {
            let d = t.await.expect("no panic");
            ends.push((d.outcome, d.layer));
        }
        let moved = ends.iter().filter(|e| **e == (Outcome::Processed, None)).count();
        let done = ends.iter().filter(|e| **e == (Outcome::Duplicate, Some(Layer::StateMachine))).count();
        assert_eq!((moved, done), (1, 7), "{ends:?}");
        assert_eq!(db.scalar_text(&ORDER_STATUS, "O-RACE").await, "SHIPPED");
    }

    pub async fn the_library_api_tells_every_answer_apart_and_binds_every_value(backend: Backend) {
        let db = TestDb::new(backend).await;
        for (no, amount, status) in
            [("O-A", 500_i64, "UNPAID"), ("O-B", 900, "UNPAID"), ("O-C", 500, "CANCELLED")]
        {
            db.store
                .query(&ADD_ORDER)
                .bind(no)
                .bind(amount)
                .bind(status)
                .execute(db.store.pool())
                .await
                .expect("order");
        }
        let pay = StateMachine::new("shop_order", "order_no", "status")
            .and_then(|m| {
                m.transition(
                    TransitionSpec::new(["UNPAID"], "PAID")
                        .set("payment_no")
                        .set("paid_at_ms")
                        .guard("amount_cents", Compare::Eq),
                )
            })
            .expect("a valid move");
        let paid =
            |order: &str, payment: &str, amount: i64| Move::of(order).set(payment).set(42).guard(amount);
        let mut tx = db.store.begin().await.expect("begin");
        let mut step = async |m: Move| {
            let before = pay.statements_run();
            let answer = pay.apply(&mut tx, backend, &m).await.expect("apply");
            (answer, pay.statements_run() - before)
        };
        assert_eq!(step(paid("O-A", "P-A", 500)).await, (Answer::Moved, 1));
        let found = Found {
            set: vec![Some(Value::from("P-A")), Some(Value::Int(42))],
            guards: vec![Some(Value::Int(500))],
        };
        assert_eq!(
            step(paid("O-A", "P-A2", 500)).await,
            (Answer::AlreadyDone { state: "PAID".into(), found }, 2)
        );
        let found = Found { set: vec![None, None], guards: vec![Some(Value::Int(900))] };
        assert_eq!(
            step(paid("O-B", "P-B", 1)).await,
            (Answer::GuardFailed { state: "UNPAID".into(), found }, 2)
        );
        let found = Found { set: vec![None, None], guards: vec![Some(Value::Int(500))] };
        assert_eq!(
            step(paid("O-C", "P-C", 500)).await,
            (Answer::Illegal { state: "CANCELLED".into(), found }, 2)
        );
        assert_eq!(step(paid("O-404", "P-D", 500)).await, (Answer::Missing, 2));
        // Values are bound, never spliced: a hostile key names no row.
        assert_eq!(step(paid("x' OR '1'='1", "P-E", 500)).await, (Answer::Missing, 2));
        assert_eq!(step(paid("O-B'; DELETE FROM shop_order; --", "P-F", 900)).await, (Answer::Missing, 2));
        let wrong_arity = pay.apply(&mut tx, backend, &Move::of("O-B").set("P-B")).await;
        assert!(matches!(wrong_arity, Err(sqlx::Error::InvalidArgument(_))), "{wrong_arity:?}");
        tx.commit().await.expect("commit");
        assert_eq!(db.scalar(&ORDER_ROWS, &[]).await, 3);
        assert_eq!(db.scalar_text(&ORDER_STATUS, "O-A").await, "PAID");
        assert_eq!(db.scalar_text(&ORDER_STATUS, "O-B").await, "UNPAID");

        // An illegal payment through the shop's own handler now names its layer.
        db.store
            .query(&SET_ORDER_STATUS)
            .bind("CANCELLED")
            .bind("O-B")
            .execute(db.store.pool())
            .await
            .expect("cancel");
        let g = gate(db.store.clone(), identity("shop", "a"), vec![], idemgate::handler::Handlers::new());
        let r = g.process(&payment("P-B", "O-B", 900, "M-cancelled", "U-cancelled", 0)).await;
        assert_eq!(outcome(&r), (Outcome::DeadLettered, Some(Layer::StateMachine), Verdict::DeadLetter));
        assert_eq!(
            r.error.as_deref(),
            Some("illegal transition: order O-B is CANCELLED and cannot become PAID")
        );
    }
}

on_every_backend!(
    a_configured_move_is_made_once_and_asked_again_is_a_duplicate_at_the_state_machine,
    an_illegal_move_is_dead_lettered_at_the_state_machine_and_counted_apart,
    a_missing_row_is_retried_or_dead_lettered_as_configured,
    a_configured_move_sets_its_time_column_and_shows_the_row_on_the_trace_page,
    movers_racing_for_one_row_move_it_once,
    the_library_api_tells_every_answer_apart_and_binds_every_value,
);

on_every_backend_with_group_commit!(
    a_configured_move_is_made_once_and_asked_again_is_a_duplicate_at_the_state_machine,
    an_illegal_move_is_dead_lettered_at_the_state_machine_and_counted_apart,
    a_missing_row_is_retried_or_dead_lettered_as_configured,
    a_configured_move_sets_its_time_column_and_shows_the_row_on_the_trace_page,
    movers_racing_for_one_row_move_it_once,
);
