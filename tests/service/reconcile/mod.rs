//! The reconciler on SQLite, PostgreSQL and MariaDB: each anomaly kind built on purpose through
//! the real gate (and, where the anomaly is damage, by doing what breaks it: a handler that
//! writes around the gate, a claim deleted by hand, a claim archived too early), then checked
//! to be reported for exactly those keys; a clean run of 10,000 keys with 30% duplicates
//! that reports nothing; and, on a database the planner has no statistics about, the plan of
//! every statement of a run and of the overview, read by key or by window.

use crate::conformance::support;

use std::collections::BTreeSet;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use async_trait::async_trait;
use idemgate::clock::now_ms;
use idemgate::delivery::Delivery;
use idemgate::gate::{Gate, Policy};
use idemgate::handler::{Effect, Handler, HandlerError, Handlers, Work};
use idemgate::outcome::Outcome;
use idemgate::reconcile::{AnomalyKind, ReconcileOptions, ReconcileReport, reconcile_once, runs};
use idemgate::route::RouteConfig;
use idemgate::store::{Backend, Conn, Sql, Store};
use idemgate_shop as shop;
use idemgate_shop::STOCK_LEDGER_CHECK;
use support::{TestDb, gate, identity, stock_deduct};

const GROUP: &str = "stock-service";
const HOUR: i64 = 3_600_000;

fn options(since_ms: i64) -> ReconcileOptions {
    ReconcileOptions {
        consumer_group: GROUP.to_owned(),
        biz_type: None,
        since_ms,
        until_ms: now_ms() + 1,
        stuck_after_ms: HOUR / 2,
        log_retention_ms: 14 * 24 * HOUR,
        max_per_kind: 1_000,
        instance_id: "test".to_owned(),
        started_by: "command".to_owned(),
    }
}

fn found(report: &ReconcileReport) -> BTreeSet<(AnomalyKind, String)> {
    report.anomalies.iter().map(|a| (a.kind, a.biz_id.clone())).collect()
}

/// A broken `stock.deduct`: it writes its ledger row through its own connection, outside the
/// gate's transaction, and fails the first attempt. The retry writes the row again.
struct LeakyDeduct {
    store: Store,
    attempts: AtomicUsize,
}

static LEAK_LEDGER: Sql = Sql::new(
    "INSERT INTO shop_stock_ledger (deduction_id, sku, quantity, applied_at_ms) VALUES (?, 'SKU-R', 1, ?)",
);

#[async_trait]
impl Handler for LeakyDeduct {
    async fn handle(&self, work: &Work<'_>, _conn: &mut Conn) -> Result<Effect, HandlerError> {
        self.store
            .query(&LEAK_LEDGER)
            .bind(work.key.biz_id.as_str())
            .bind(work.now_ms)
            .execute(self.store.pool())
            .await?;
        if self.attempts.fetch_add(1, Ordering::SeqCst) == 0 {
            return Err(HandlerError::Retryable("downstream timeout".into()));
        }
        Ok(Effect::Applied)
    }
}

fn leaky(store: &Store) -> (Vec<RouteConfig>, Handlers) {
    let route = RouteConfig {
        topic: shop::TOPIC.to_owned(),
        tags: "leaky_deduct".to_owned(),
        biz_type: shop::STOCK_DEDUCT.to_owned(),
        biz_id: "keys".to_owned(),
        execute_time: None,
        handler: Some("leaky".to_owned()),
    };
    let handler = LeakyDeduct { store: store.clone(), attempts: AtomicUsize::new(0) };
    (vec![route], Handlers::new().with("leaky", handler))
}

/// A payment of 700 cents; its UNIQ_KEY stays the same across redeliveries.
fn payment(payment_no: &str, order_no: &str, msg_id: &str, reconsume: i32) -> Delivery {
    support::payment(payment_no, order_no, 700, msg_id, &format!("U-{payment_no}"), reconsume)
}

/// An order of SKU-R for 700 cents.
fn order(order_no: &str, msg_id: &str) -> Delivery {
    support::order(order_no, "SKU-R", 700, msg_id, &format!("U-{order_no}"))
}

static DELETE_CLAIM: Sql = Sql::new("DELETE FROM idempotent_record WHERE biz_id = ?");
static ARCHIVE_CLAIM: Sql = Sql::new(
    "INSERT INTO idempotent_record_archive (id, consumer_group, biz_type, biz_id, execute_time, msg_id, uniq_key, \
     payload_hash, instance_id, claimed_at_ms, archived_at_ms) SELECT id, consumer_group, biz_type, biz_id, \
     execute_time, msg_id, uniq_key, payload_hash, instance_id, claimed_at_ms, ? \
     FROM idempotent_record WHERE biz_id = ?",
);
static FORGED_CLAIM: Sql = Sql::new(
    "INSERT INTO idempotent_record (consumer_group, biz_type, biz_id, execute_time, msg_id, uniq_key, payload_hash, \
     instance_id, claimed_at_ms) VALUES (?, 'stock.deduct', 'D-ORPHAN-CLAIM', 0, 'M-FORGED', '', 'h', 'hand', ?)",
);

async fn exec(store: &Store, sql: &'static Sql, biz_id: &str) {
    store.query(sql).bind(biz_id).execute(store.pool()).await.expect("statement");
}

mod cases {
    use super::*;

    pub async fn each_anomaly_kind_is_reported_for_exactly_its_keys(backend: Backend) {
        let db = TestDb::new(backend).await;
        let store = &db.store;
        shop::seed_stock(store, "SKU-R", 1_000_000).await.unwrap();
        let (routes, handlers) = leaky(store);
        let gate: Gate = gate(store.clone(), identity(GROUP, "r-1"), routes, handlers);
        let deliver = |d: Delivery| {
            let gate = &gate;
            async move { gate.process(&d).await.outcome }
        };
        let started = now_ms() - 1_000;
        let last = Policy::default().max_reconsume_times;

        // Noise that is fine: keys with duplicates of every cause, a payment retried until its order came.
        for i in 0..20 {
            let key = format!("D-OK-{i}");
            assert_eq!(
                deliver(stock_deduct(&key, &format!("M{i}"), &format!("U{i}"), "SKU-R", 1)).await,
                Outcome::Processed
            );
            assert_eq!(
                deliver(stock_deduct(&key, &format!("M{i}b"), &format!("U{i}"), "SKU-R", 1)).await,
                Outcome::Duplicate
            );
        }
        assert_eq!(deliver(payment("P-EARLY", "O-EARLY", "MP1", 0)).await, Outcome::Failed);
        assert_eq!(deliver(order("O-EARLY", "MO1")).await, Outcome::Processed);
        assert_eq!(deliver(payment("P-EARLY", "O-EARLY", "MP2", 1)).await, Outcome::Processed);

        // lost: dead-lettered, never applied.
        assert_eq!(deliver(payment("P-LOST", "O-NONE", "ML1", last)).await, Outcome::DeadLettered);
        // stuck: failing, and (by the clock handed to the run) for longer than stuck_after.
        assert_eq!(deliver(payment("P-STUCK", "O-NONE-2", "MS1", 0)).await, Outcome::Failed);
        // double_applied: a handler that writes around the gate, retried once.
        let leak = |m: &str| Delivery {
            tags: "leaky_deduct".to_owned(),
            ..stock_deduct("D-LEAK", m, "U-LEAK", "SKU-R", 1)
        };
        assert_eq!(deliver(leak("MK1")).await, Outcome::Failed);
        assert_eq!(deliver(leak("MK2")).await, Outcome::Processed);
        // double_applied: a claim deleted by hand, then the message redelivered.
        assert_eq!(deliver(stock_deduct("D-DEL", "MD1", "U-DEL", "SKU-R", 1)).await, Outcome::Processed);
        exec(store, &DELETE_CLAIM, "D-DEL").await;
        assert_eq!(deliver(stock_deduct("D-DEL", "MD2", "U-DEL", "SKU-R", 1)).await, Outcome::Processed);
        // orphan: a claim nobody delivered, and a processed delivery whose claim was deleted.
        store.query(&FORGED_CLAIM).bind(GROUP).bind(now_ms()).execute(store.pool()).await.unwrap();
        assert_eq!(
            deliver(stock_deduct("D-ORPHAN-LOG", "MO2", "U-OL", "SKU-R", 1)).await,
            Outcome::Processed
        );
        exec(store, &DELETE_CLAIM, "D-ORPHAN-LOG").await;
        // key_collision: the same key with another body.
        assert_eq!(deliver(stock_deduct("D-COLL", "MC1", "U-C1", "SKU-R", 1)).await, Outcome::Processed);
        assert_eq!(deliver(stock_deduct("D-COLL", "MC2", "U-C2", "SKU-R", 9)).await, Outcome::Duplicate);
        // late_duplicate: the claim archived too early, then a copy arrives (guard off).
        assert_eq!(deliver(stock_deduct("D-LATE", "MT1", "U-T1", "SKU-R", 1)).await, Outcome::Processed);
        store.query(&ARCHIVE_CLAIM).bind(now_ms()).bind("D-LATE").execute(store.pool()).await.unwrap();
        exec(store, &DELETE_CLAIM, "D-LATE").await;
        assert_eq!(deliver(stock_deduct("D-LATE", "MT2", "U-T2", "SKU-R", 1)).await, Outcome::Processed);

        let clock = now_ms() + 2 * HOUR;
        let report =
            reconcile_once(store, &options(started), &[STOCK_LEDGER_CHECK], clock).await.expect("run");
        let expected: BTreeSet<(AnomalyKind, String)> = [
            (AnomalyKind::Lost, "P-LOST"),
            (AnomalyKind::Stuck, "P-STUCK"),
            (AnomalyKind::DoubleApplied, "D-LEAK"),
            (AnomalyKind::DoubleApplied, "D-DEL"),
            (AnomalyKind::DoubleApplied, "D-LATE"),
            (AnomalyKind::Orphan, "D-ORPHAN-CLAIM"),
            (AnomalyKind::Orphan, "D-ORPHAN-LOG"),
            (AnomalyKind::KeyCollision, "D-COLL"),
            (AnomalyKind::LateDuplicate, "D-LATE"),
        ]
        .into_iter()
        .map(|(k, id)| (k, id.to_owned()))
        .collect();
        assert_eq!(found(&report), expected, "{report:#?}");
        assert_eq!(report.anomalies.len(), expected.len(), "one anomaly per kind and key: {report:#?}");
        let leak = report.anomalies.iter().find(|a| a.biz_id == "D-LEAK").unwrap();
        assert!(leak.detail.contains("stock ledger rows"), "the ledger check found it: {}", leak.detail);
        let deleted = report.anomalies.iter().find(|a| a.biz_id == "D-DEL").unwrap();
        assert!(
            deleted.detail.contains("2 processed deliveries") && deleted.detail.contains("ledger"),
            "{}",
            deleted.detail
        );

        // Without the clock moved on, the failing payment is not stuck yet.
        let early = reconcile_once(store, &options(started), &[STOCK_LEDGER_CHECK], now_ms()).await.unwrap();
        assert!(!found(&early).contains(&(AnomalyKind::Stuck, "P-STUCK".to_owned())));
        // A biz_type filter keeps to its keys.
        let payments =
            ReconcileOptions { biz_type: Some(shop::PAYMENT_CONFIRM.to_owned()), ..options(started) };
        let only = reconcile_once(store, &payments, &[STOCK_LEDGER_CHECK], clock).await.unwrap();
        assert_eq!(
            found(&only),
            [(AnomalyKind::Lost, "P-LOST".to_owned()), (AnomalyKind::Stuck, "P-STUCK".to_owned())].into(),
        );
        // A window that ends before everything finds nothing.
        let before =
            ReconcileOptions { since_ms: started - 2 * HOUR, until_ms: started - HOUR, ..options(started) };
        assert!(reconcile_once(store, &before, &[STOCK_LEDGER_CHECK], clock).await.unwrap().is_clean());

        // The run is stored: its counts and anomalies read back.
        let counts = runs::counts(store, report.run_id).await.unwrap();
        assert_eq!(counts[&AnomalyKind::DoubleApplied], 3);
        assert_eq!(counts[&AnomalyKind::Orphan], 2);
        let stored = runs::anomalies(store, report.run_id, Some(AnomalyKind::Lost), 10).await.unwrap();
        assert_eq!(stored.len(), 1);
        assert_eq!(stored[0].biz_id, "P-LOST");
        let run = runs::get(store, report.run_id).await.unwrap().unwrap();
        assert_eq!((run.status.as_str(), run.anomalies), ("success", 9));
    }

    /// 10,000 keys with 30% duplicates of both causes, from 8 tasks at once: nothing to report.
    pub async fn a_clean_run_of_ten_thousand_keys_with_thirty_percent_duplicates_reports_nothing(
        backend: Backend,
    ) {
        let db = TestDb::new(backend).await;
        shop::seed_stock(&db.store, "SKU-R", 1_000_000_000).await.unwrap();
        let gate = Arc::new(gate(db.store.clone(), identity(GROUP, "r-1"), vec![], Handlers::new()));
        let started = now_ms() - 1_000;
        let tasks: Vec<_> = (0..8)
            .map(|t| {
                let gate = gate.clone();
                tokio::spawn(async move {
                    let mut outcomes = [0usize; 2];
                    for i in (t..10_000).step_by(8) {
                        let key = format!("D-{i}");
                        let first = gate
                            .process(&stock_deduct(&key, &format!("M{i}"), &format!("U{i}"), "SKU-R", 1))
                            .await;
                        outcomes[0] += usize::from(first.outcome == Outcome::Processed);
                        if i % 10 < 3 {
                            // Alternate a broker redelivery (same UNIQ_KEY) and a producer resend.
                            let uniq = if i % 2 == 0 { format!("U{i}") } else { format!("V{i}") };
                            let copy =
                                gate.process(&stock_deduct(&key, &format!("N{i}"), &uniq, "SKU-R", 1)).await;
                            outcomes[1] += usize::from(copy.outcome == Outcome::Duplicate);
                        }
                    }
                    outcomes
                })
            })
            .collect();
        let mut totals = [0usize; 2];
        for t in tasks {
            let o = t.await.unwrap();
            totals[0] += o[0];
            totals[1] += o[1];
        }
        assert_eq!(totals, [10_000, 3_000]);
        let report = reconcile_once(&db.store, &options(started), &[STOCK_LEDGER_CHECK], now_ms() + 2 * HOUR)
            .await
            .expect("run");
        assert!(report.is_clean(), "{:#?}", report.anomalies.iter().take(10).collect::<Vec<_>>());
        assert!(report.counts.values().all(|n| *n == 0));
    }
}

on_every_backend!(a_clean_run_of_ten_thousand_keys_with_thirty_percent_duplicates_reports_nothing);

/// A fresh database whose planner has no statistics (automatic statistics off, nothing
/// analyzed: as after a fresh start, a burst or an archive run) holds ten hours of the shop's
/// traffic, an archive of the day before and a few planted anomalies; the last hour is
/// reconciled. The plan of every statement the run makes, and of every overview read, reads
/// the log (or the claims) once by the window and everything else by key: no read repeated per
/// row that walks a range of an index, no read of a whole table or of an index's prefix. And
/// the run finds exactly what was planted in the hour.
async fn every_statement_reads_by_key_or_by_window_without_statistics(backend: Backend, shards: u16) {
    use idemgate::inspect::lists::{self, ListKind, ListQuery};
    use idemgate::inspect::{READ_BOUNDS, overview};
    use idemgate_bench::reconcile::{GROUP as LOADED_GROUP, load};
    use idemgate_testkit::plan;

    let db = TestDb::new(backend).await;
    let store = &db.store;
    if shards > 0 {
        idemgate::layout::ensure(store, shards, "test").await.expect("shards");
    }
    let now = now_ms();
    let planted = load(store, 6_000, 10 * HOUR, now).await.expect("load");
    let options = ReconcileOptions {
        consumer_group: LOADED_GROUP.to_owned(),
        since_ms: now - HOUR,
        until_ms: now + 1,
        ..options(now - HOUR)
    };

    let layout = idemgate::layout::current(store).await.unwrap();
    let mut statements =
        idemgate::reconcile::statements(store, &options, &[STOCK_LEDGER_CHECK], now).await.unwrap();
    statements.extend(overview::statements(now));
    statements.extend(
        ListKind::ALL.map(|kind| lists::statement(layout, &ListQuery::latest(kind, overview::LATEST))),
    );
    let mut unbounded = Vec::new();
    for statement in &statements {
        let reads = plan::reads(store, statement).await.expect("plan");
        assert!(
            !reads.is_empty() || statement.name == "first logged",
            "{}: no reads in its plan",
            statement.name
        );
        unbounded.extend(
            reads.iter().filter(|r| !r.is_bounded(&READ_BOUNDS)).map(|r| format!("{}: {r}", statement.name)),
        );
    }
    assert!(unbounded.is_empty(), "reads whose cost hangs on the statistics: {unbounded:#?}");

    let report = reconcile_once(store, &options, &[STOCK_LEDGER_CHECK], now).await.expect("run");
    let expected: BTreeSet<(AnomalyKind, String)> =
        planted.iter().filter(|p| p.at_ms >= options.since_ms).map(|p| (p.kind, p.biz_id.clone())).collect();
    assert!(
        expected.iter().any(|(k, _)| *k == AnomalyKind::Lost),
        "a poison payment in the hour: {expected:?}"
    );
    assert_eq!(found(&report), expected);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn every_statement_reads_by_key_or_by_window_without_statistics_on_postgres() {
    every_statement_reads_by_key_or_by_window_without_statistics(Backend::Postgres, 0).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn every_statement_reads_by_key_or_by_window_without_statistics_on_mariadb() {
    every_statement_reads_by_key_or_by_window_without_statistics(Backend::MySql, 0).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn every_statement_reads_by_key_or_by_window_without_statistics_on_postgres_shards() {
    every_statement_reads_by_key_or_by_window_without_statistics(Backend::Postgres, 4).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn every_statement_reads_by_key_or_by_window_without_statistics_on_mariadb_shards() {
    every_statement_reads_by_key_or_by_window_without_statistics(Backend::MySql, 4).await;
}

// The broken handler writes through a second connection while the gate's transaction is open;
// SQLite allows one writer at a time, so that handler cannot run there at all. The anomaly
// cases run on the two servers.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn each_anomaly_kind_is_reported_for_exactly_its_keys_on_postgres() {
    cases::each_anomaly_kind_is_reported_for_exactly_its_keys(Backend::Postgres).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn each_anomaly_kind_is_reported_for_exactly_its_keys_on_mariadb() {
    cases::each_anomaly_kind_is_reported_for_exactly_its_keys(Backend::MySql).await;
}

/// The job inside `serve`: two instances on one schedule (every second) make one run per tick,
/// and the runs are stored with `started_by = schedule`.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_scheduled_reconciler_runs_once_per_tick_across_instances() {
    use idemgate::reconcile::{ReconcileScheduler, ReconcileSettings};
    let db = TestDb::new(Backend::Postgres).await;
    let settings = ReconcileSettings { schedule: "* * * * * *".to_owned(), ..ReconcileSettings::default() };
    let mut schedulers = Vec::new();
    for instance in ["a", "b"] {
        let s = ReconcileScheduler::start_for_serve(
            db.store.clone(),
            &settings,
            GROUP,
            instance,
            14,
            vec![STOCK_LEDGER_CHECK],
        )
        .await
        .expect("scheduler")
        .expect("enabled");
        schedulers.push(s);
    }
    tokio::time::sleep(std::time::Duration::from_millis(4_500)).await;
    for s in schedulers {
        s.shutdown().await;
    }
    let runs = runs::recent(&db.store, 100).await.unwrap();
    assert!(runs.len() >= 3, "a run about every second: {runs:?}");
    assert!(runs.iter().all(|r| r.started_by == "schedule" && r.status == "success"), "{runs:?}");
    let mut ticks: Vec<i64> = runs.iter().map(|r| r.started_at_ms / 1_000).collect();
    let all = ticks.len();
    ticks.dedup();
    assert_eq!(ticks.len(), all, "one run per tick, not one per instance: {runs:?}");
}
