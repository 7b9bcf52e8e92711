//! A message's W3C `traceparent`: its trace id is logged with every outcome, whichever way the
//! row is written (in the gate's transaction, on its own, in a group's multi-row insert), and a
//! `traceparent` that cannot be read is counted by why and costs the delivery nothing: it is
//! processed, its effect applied, its row logged without a trace id.

use std::collections::BTreeSet;
use std::sync::Arc;

use idemgate::delivery::{Delivery, TRACEPARENT_PROPERTY};
use idemgate::gate::Gate;
use idemgate::handler::Handlers;
use idemgate::metrics::{BuildInfo, Metrics};
use idemgate::outcome::{Outcome, Verdict};
use idemgate::route::Routes;
use idemgate::store::{Backend, Sql};
use idemgate_shop as shop;
use sqlx::Row;

use super::support::{TestDb, gate, identity, series, stock_deduct};

const GROUP: &str = "traced-service";
const SKU: &str = "SKU-TP";

static TRACE_ID_OF_MSG: Sql = Sql::new("SELECT trace_id, outcome FROM delivery_log WHERE msg_id = ?");
static LEDGER_ROWS_OF: Sql = Sql::new("SELECT COUNT(*) FROM shop_stock_ledger WHERE deduction_id = ?");
static STOCK_OF: Sql = Sql::new("SELECT quantity FROM shop_stock WHERE sku = ?");

/// A gate on the shop's routes and handlers, reporting to the returned metrics.
fn traced_gate(db: &TestDb) -> (Gate, Arc<Metrics>) {
    let routes = Routes::new(&shop::routes(shop::TOPIC)).expect("routes");
    let info = BuildInfo {
        broker: Default::default(),
        backend: db.store.backend(),
        consumer_group: GROUP.into(),
        instance_id: "traced-1".into(),
        ui_url: "http://127.0.0.1:0".into(),
    };
    let topics: BTreeSet<String> = [shop::TOPIC.to_owned()].into();
    let metrics = Arc::new(Metrics::new(&info, &routes.biz_types(), &topics));
    let g = gate(db.store.clone(), identity(GROUP, "traced-1"), vec![], Handlers::new())
        .with_observer(metrics.clone());
    (g, metrics)
}

/// `d` as a producer with tracing sends it: with `traceparent`.
fn traced(mut d: Delivery, traceparent: &str) -> Delivery {
    d.properties.insert(TRACEPARENT_PROPERTY.to_owned(), traceparent.to_owned());
    d
}

/// The trace id and outcome of the one log row of `msg_id`.
async fn logged(db: &TestDb, msg_id: &str) -> (Option<String>, String) {
    let rows =
        db.store.query(&TRACE_ID_OF_MSG).bind(msg_id).fetch_all(db.store.pool()).await.expect("log rows");
    assert_eq!(rows.len(), 1, "one log row of {msg_id}");
    (rows[0].get(0), rows[0].get(1))
}

/// The deliveries `idemgate_invalid_traceparents_total` counted for `reason`.
async fn invalid(metrics: &Metrics, reason: &str) -> f64 {
    let reason = format!("reason=\"{reason}\"");
    series(metrics, "idemgate_invalid_traceparents_total", &[&reason]).await.iter().sum()
}

const T1: &str = "4bf92f3577b34da6a3ce929d0e0e4736";
const T2: &str = "0af7651916cd43dd8448eb211c80319c";
const T3: &str = "aaaabbbbccccddddeeeeffff00001111";

fn traceparent(trace_id: &str) -> String {
    format!("00-{trace_id}-00f067aa0ba902b7-01")
}

pub mod cases {
    use super::*;

    pub async fn the_trace_id_of_a_traceparent_is_logged_with_every_outcome(backend: Backend) {
        let db = TestDb::new(backend).await;
        shop::seed_stock(&db.store, SKU, 100).await.expect("stock");
        let (g, metrics) = traced_gate(&db);

        let first = traced(stock_deduct("TP-1", "M-TP1", "U-TP1", SKU, 1), &traceparent(T1));
        let again = traced(stock_deduct("TP-1", "M-TP2", "U-TP1", SKU, 1), &traceparent(T1));
        let keyless = Delivery { keys: vec![], ..stock_deduct("", "M-TP3", "U-TP3", SKU, 1) };
        let keyless = traced(keyless, &traceparent(T2));
        let later_version = traced(
            stock_deduct("TP-4", "M-TP4", "U-TP4", SKU, 1),
            &format!("cc-{T3}-00f067aa0ba902b7-01-what-comes-next"),
        );
        let untraced = stock_deduct("TP-5", "M-TP5", "U-TP5", SKU, 1);
        for (d, outcome) in [
            (&first, Outcome::Processed),
            (&again, Outcome::Duplicate),
            (&keyless, Outcome::Invalid),
            (&later_version, Outcome::Processed),
            (&untraced, Outcome::Processed),
        ] {
            let r = g.process(d).await;
            assert_eq!((r.outcome, r.verdict, r.logged), (outcome, Verdict::Ack, true), "{}", d.msg_id);
        }

        assert_eq!(logged(&db, "M-TP1").await, (Some(T1.to_owned()), "processed".to_owned()));
        assert_eq!(logged(&db, "M-TP2").await, (Some(T1.to_owned()), "duplicate".to_owned()));
        assert_eq!(logged(&db, "M-TP3").await, (Some(T2.to_owned()), "invalid".to_owned()));
        assert_eq!(logged(&db, "M-TP4").await, (Some(T3.to_owned()), "processed".to_owned()));
        assert_eq!(logged(&db, "M-TP5").await, (None, "processed".to_owned()));
        for reason in idemgate::delivery::TraceparentFault::ALL {
            assert_eq!(invalid(&metrics, reason.as_str()).await, 0.0, "{reason}: nothing refused");
        }
    }

    pub async fn an_invalid_traceparent_is_counted_and_the_delivery_still_processed(backend: Backend) {
        let db = TestDb::new(backend).await;
        shop::seed_stock(&db.store, SKU, 100).await.expect("stock");
        let (g, metrics) = traced_gate(&db);
        let zero_trace = format!("00-{}-00f067aa0ba902b7-01", "0".repeat(32));
        let upper = traceparent(T1).to_uppercase();
        let cases = [
            ("M-BAD1", upper.as_str(), "uppercase"),
            ("M-BAD2", zero_trace.as_str(), "zero_trace_id"),
            ("M-BAD3", "ff-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01", "version"),
            ("M-BAD4", "", "length"),
            ("M-BAD5", "00-<script>'); DROP TABLE x;--aaaaa-00f067aa0ba902b7-01", "not_hex"),
            ("M-BAD6", "00_4bf92f3577b34da6a3ce929d0e0e4736_00f067aa0ba902b7_01", "delimiter"),
            ("M-BAD7", "00-4bf92f3577b34da6a3ce929d0e0e4736-0000000000000000-01", "zero_parent_id"),
        ];
        for (i, (msg_id, value, reason)) in cases.iter().enumerate() {
            let biz_id = format!("TP-BAD-{i}");
            let d = traced(stock_deduct(&biz_id, msg_id, &format!("U-{msg_id}"), SKU, 1), value);
            let r = g.process(&d).await;
            assert_eq!(
                (r.outcome, r.verdict, r.logged),
                (Outcome::Processed, Verdict::Ack, true),
                "{reason}"
            );
            assert_eq!(logged(&db, msg_id).await, (None, "processed".to_owned()), "{reason}: no trace id");
            assert_eq!(db.scalar(&LEDGER_ROWS_OF, &[&biz_id]).await, 1, "{reason}: the effect applied");
            assert_eq!(invalid(&metrics, reason).await, 1.0, "{reason} counted once");
        }
        assert_eq!(db.scalar(&STOCK_OF, &[SKU]).await, 100 - cases.len() as i64);
        // A redelivery of a message with a bad traceparent is counted again: a delivery each.
        let (msg_id, value, reason) = cases[0];
        let d = traced(stock_deduct("TP-BAD-0", "M-BAD1-AGAIN", &format!("U-{msg_id}"), SKU, 1), value);
        assert_eq!(g.process(&d).await.outcome, Outcome::Duplicate);
        assert_eq!(invalid(&metrics, reason).await, 2.0);
        let total: f64 = series(&metrics, "idemgate_invalid_traceparents_total", &[]).await.iter().sum();
        assert_eq!(total, cases.len() as f64 + 1.0, "nothing else was counted");
        let labels = metrics.render(None).await;
        assert!(!labels.contains(T1) && !labels.contains("TP-BAD"), "no trace id or bizId as a label");
    }
}

on_every_backend!(
    the_trace_id_of_a_traceparent_is_logged_with_every_outcome,
    an_invalid_traceparent_is_counted_and_the_delivery_still_processed,
);

// A group's rows are written in one multi-row insert: the trace id goes through it too.
on_every_backend_with_group_commit!(
    the_trace_id_of_a_traceparent_is_logged_with_every_outcome,
    an_invalid_traceparent_is_counted_and_the_delivery_still_processed,
);
