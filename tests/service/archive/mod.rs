//! Archiving on SQLite, PostgreSQL and MariaDB: back-dated claims and log rows, an injected
//! clock, imitated crashes, consumers running beside a run, and two instances racing for one
//! schedule tick.

mod claim_key;
mod partitions;

use crate::conformance::support;

use std::collections::BTreeSet;
use std::sync::Arc;
use std::time::Duration;

use idemgate::archive::retention::DAY_MS;
use idemgate::archive::{
    ArchiveOptions, ArchiveOutcome, ArchiveScheduler, Fault, RunKind, RunStatus, StartedBy, archive_once,
    dry_run, runs,
};
use idemgate::cron::Schedule;
use idemgate::delivery::Delivery;
use idemgate::handler::Handlers;
use idemgate::outcome::{Layer, Outcome};
use idemgate::store::{Sql, Store};
use idemgate_shop as shop;
use sqlx::Row;
use support::{TestDb, gate, gate_with, identity, stock_deduct};

/// The injected "now" of most tests: 2030-01-01.
const NOW: i64 = 1_893_456_000_000;
const GROUP: &str = "stock-service";

static SEED_CLAIM: Sql = Sql::new(
    "INSERT INTO idempotent_record (consumer_group, biz_type, biz_id, execute_time, msg_id, uniq_key, \
     payload_hash, instance_id, claimed_at_ms) VALUES (?, ?, ?, 0, ?, ?, 'hash', 'seed', ?)",
);
static SEED_LOG_ROW: Sql = Sql::new(
    "INSERT INTO delivery_log (logged_at_ms, instance_id, consumer_group, msg_id, uniq_key, topic, tags, \
     queue_id, queue_offset, reconsume_times, biz_type, biz_id, execute_time, outcome, latency_us) \
     VALUES (?, 'seed', ?, ?, '', 't', '', 0, 0, 0, 'x', ?, 0, 'processed', 1)",
);
static LIVE_IDS: Sql = Sql::new("SELECT id FROM idempotent_record ORDER BY id");
static ARCHIVED_IDS: Sql = Sql::new("SELECT id FROM idempotent_record_archive ORDER BY id");
static LOG_ROWS: Sql = Sql::new("SELECT COUNT(*) FROM delivery_log WHERE consumer_group = ?");
static ARCHIVED_MSG_ID: Sql =
    Sql::new("SELECT msg_id, claimed_at_ms FROM idempotent_record_archive WHERE id = ?");
static COPY_ONE_TO_ARCHIVE: Sql = Sql::new(
    "INSERT INTO idempotent_record_archive (id, consumer_group, biz_type, biz_id, execute_time, msg_id, \
     uniq_key, payload_hash, instance_id, claimed_at_ms, archived_at_ms) \
     SELECT id, consumer_group, biz_type, biz_id, execute_time, msg_id, uniq_key, payload_hash, instance_id, \
     claimed_at_ms, 1 FROM idempotent_record WHERE biz_id = ?",
);
static LATE_DUPLICATE_LOG_ROWS: Sql = Sql::new(
    "SELECT COUNT(*) FROM delivery_log WHERE msg_id = ? AND outcome = 'duplicate' AND layer = 'late_duplicate'",
);
static LEDGER_ROWS_LIKE: Sql = Sql::new("SELECT COUNT(*) FROM shop_stock_ledger WHERE deduction_id LIKE ?");
static CLAIMS_LIKE: Sql = Sql::new("SELECT COUNT(*) FROM idempotent_record WHERE biz_id LIKE ?");
static DISTINCT_CLAIMS_LIKE: Sql = Sql::new(
    "SELECT COUNT(*) FROM (SELECT DISTINCT biz_id FROM idempotent_record WHERE biz_id LIKE ?) claimed",
);

/// The first column of every row `sql` (written for the backend at hand) returns for `binds`.
async fn first_column<T>(store: &Store, sql: &'static str, binds: &[&str]) -> Vec<T>
where
    T: for<'r> sqlx::Decode<'r, sqlx::Any> + sqlx::Type<sqlx::Any>,
{
    let mut q = sqlx::query(sql);
    for b in binds {
        q = q.bind(b.to_string());
    }
    q.fetch_all(store.pool()).await.unwrap().iter().map(|r| r.try_get(0).unwrap()).collect()
}

/// A run's options in these tests: the shipped retentions and shapes, no pause, no fault.
fn options(instance: &str, batch_size: u32) -> ArchiveOptions {
    ArchiveOptions {
        dedup_retention_ms: 90 * DAY_MS,
        log_retention_ms: Some(14 * DAY_MS),
        batch_size,
        pause: Duration::ZERO,
        time_budget: Duration::from_secs(600),
        lease_ttl: Duration::from_secs(60),
        instance_id: instance.to_owned(),
        started_by: StartedBy::Command,
        partition_log: true,
        claim_key_by_biz_id: true,
        fault: Fault::None,
    }
}

/// `count` claims of `stock.deduct` keys `{prefix}-{i}`, claimed `age_ms + i` ms before `now`,
/// in one transaction.
async fn seed_claims(store: &Store, prefix: &str, count: usize, now: i64, age_ms: i64) {
    let mut tx = store.begin().await.expect("begin");
    for i in 0..count {
        store
            .query(&SEED_CLAIM)
            .bind(GROUP)
            .bind(shop::STOCK_DEDUCT)
            .bind(format!("{prefix}-{i}"))
            .bind(format!("M-{prefix}-{i}"))
            .bind(format!("U-{prefix}-{i}"))
            .bind(now - age_ms - i as i64)
            .execute(&mut *tx)
            .await
            .expect("seed claim");
    }
    tx.commit().await.expect("commit");
}

async fn seed_log_rows(store: &Store, prefix: &str, count: usize, now: i64, age_ms: i64) {
    let mut tx = store.begin().await.expect("begin");
    for i in 0..count {
        store
            .query(&SEED_LOG_ROW)
            .bind(now - age_ms - i as i64)
            .bind(GROUP)
            .bind(format!("M-{prefix}-{i}"))
            .bind(format!("{prefix}-{i}"))
            .execute(&mut *tx)
            .await
            .expect("seed log row");
    }
    tx.commit().await.expect("commit");
}

async fn ids(db: &TestDb, sql: &'static Sql) -> Vec<i64> {
    let rows = db.store.query(sql).fetch_all(db.store.pool()).await.expect("ids");
    rows.iter().map(|r| r.get::<i64, _>(0)).collect()
}

/// Every claim is in exactly one of the two tables, and the archive holds none twice.
async fn assert_each_claim_in_exactly_one_table(db: &TestDb, expected_total: usize) {
    let live = ids(db, &LIVE_IDS).await;
    let archived = ids(db, &ARCHIVED_IDS).await;
    let archived_set: BTreeSet<i64> = archived.iter().copied().collect();
    assert_eq!(archived_set.len(), archived.len(), "an id archived twice");
    assert!(live.iter().all(|id| !archived_set.contains(id)), "a claim in both tables");
    assert_eq!(live.len() + archived.len(), expected_total, "a claim lost");
}

async fn runs_of(db: &TestDb, kind: RunKind) -> Vec<runs::RunRecord> {
    let mut all = runs::recent(&db.store, 1_000).await.expect("runs");
    all.retain(|r| r.kind == kind);
    all.reverse();
    all
}

mod cases {
    use super::*;

    pub async fn exactly_the_claims_older_than_the_cutoff_move_once_and_a_rerun_moves_nothing(
        backend: idemgate::store::Backend,
    ) {
        let db = TestDb::new(backend).await;
        seed_claims(&db.store, "OLD", 25, NOW, 100 * DAY_MS).await;
        seed_claims(&db.store, "NEW", 10, NOW, 10 * DAY_MS).await;
        // Claimed exactly at the cutoff: not older than it, so it stays.
        seed_claims(&db.store, "EDGE", 1, NOW, 90 * DAY_MS).await;
        seed_log_rows(&db.store, "OLDLOG", 30, NOW, 20 * DAY_MS).await;
        seed_log_rows(&db.store, "NEWLOG", 5, NOW, DAY_MS).await;
        let old_ids: Vec<i64> = ids(&db, &LIVE_IDS).await[..25].to_vec();

        let report = archive_once(&db.store, &options("a", 7), NOW).await.expect("run");
        assert_eq!(report.outcome, ArchiveOutcome::Done);
        assert_eq!((report.dedup.rows, report.dedup.batches), (25, 4));
        assert_eq!(report.dedup.cutoff_ms, NOW - 90 * DAY_MS);
        assert_eq!(ids(&db, &ARCHIVED_IDS).await, old_ids, "exactly the old claims are archived");
        assert_eq!(ids(&db, &LIVE_IDS).await.len(), 11, "the new claims and the one at the cutoff stay");
        let row = db.store.query(&ARCHIVED_MSG_ID).bind(old_ids[3]).fetch_one(db.store.pool()).await.unwrap();
        assert_eq!(row.get::<String, _>(0), "M-OLD-3", "the archived row is the live row");
        assert_eq!(row.get::<i64, _>(1), NOW - 100 * DAY_MS - 3);
        assert_eq!(report.log.as_ref().map(|l| l.rows), Some(30));
        assert_eq!(db.scalar(&LOG_ROWS, &[GROUP]).await, 5, "only the log rows within 14 days stay");

        let again = archive_once(&db.store, &options("a", 7), NOW).await.expect("rerun");
        assert_eq!(again.outcome, ArchiveOutcome::Done);
        assert_eq!((again.dedup.rows, again.log.as_ref().map(|l| l.rows)), (0, Some(0)));
        assert_each_claim_in_exactly_one_table(&db, 36).await;

        let dedup_runs = runs_of(&db, RunKind::Dedup).await;
        let summary: Vec<_> = dedup_runs.iter().map(|r| (r.status, r.rows_moved, r.batches)).collect();
        assert_eq!(summary, [(RunStatus::Success, 25, 4), (RunStatus::Success, 0, 0)]);
        assert_eq!(dedup_runs[0].cutoff_ms, NOW - 90 * DAY_MS);
        assert!(dedup_runs.iter().all(|r| r.finished_at_ms.is_some() && r.instance_id == "a"));
        let log = runs::last_success(&db.store, RunKind::Log).await.unwrap().expect("a log run");
        assert_eq!(log.cutoff_ms, NOW - 14 * DAY_MS, "the trace page reads where the log now starts");
    }

    pub async fn a_run_killed_between_batches_loses_no_claim_and_the_next_run_finishes_the_job(
        backend: idemgate::store::Backend,
    ) {
        let db = TestDb::new(backend).await;
        seed_claims(&db.store, "OLD", 23, NOW, 100 * DAY_MS).await;
        seed_claims(&db.store, "NEW", 4, NOW, DAY_MS).await;
        let dying = ArchiveOptions { fault: Fault::DieAfterBatches(2), ..options("a", 5) };
        assert!(archive_once(&db.store, &dying, NOW).await.is_err());
        assert_eq!(ids(&db, &ARCHIVED_IDS).await.len(), 10, "two whole batches committed");
        assert_each_claim_in_exactly_one_table(&db, 27).await;
        assert_eq!(
            runs_of(&db, RunKind::Dedup).await[0].status,
            RunStatus::Running,
            "left as a dead process leaves it"
        );

        // The dead run's lease is still valid: another instance skips ...
        let skipped = archive_once(&db.store, &options("b", 5), NOW + 1_000).await.expect("skip");
        assert!(matches!(skipped.outcome, ArchiveOutcome::Skipped { .. }), "{skipped:?}");
        // ... until it expires; then the job is finished and the dead run is marked failed.
        let later = NOW + 61_000;
        let done = archive_once(&db.store, &options("b", 5), later).await.expect("finish");
        assert_eq!(done.dedup.rows, 13);
        assert_eq!(ids(&db, &LIVE_IDS).await.len(), 4, "only the new claims are live");
        assert_eq!(ids(&db, &ARCHIVED_IDS).await.len(), 23);
        assert_each_claim_in_exactly_one_table(&db, 27).await;
        let statuses: Vec<_> = runs_of(&db, RunKind::Dedup).await.iter().map(|r| r.status).collect();
        assert_eq!(statuses, [RunStatus::Failed, RunStatus::Skipped, RunStatus::Success]);
    }

    pub async fn a_run_killed_inside_a_batch_loses_no_claim_and_archives_none_twice(
        backend: idemgate::store::Backend,
    ) {
        let db = TestDb::new(backend).await;
        seed_claims(&db.store, "OLD", 23, NOW, 100 * DAY_MS).await;
        seed_claims(&db.store, "NEW", 4, NOW, DAY_MS).await;
        let dying = ArchiveOptions { fault: Fault::DieInsideBatch(2), ..options("a", 5) };
        assert!(archive_once(&db.store, &dying, NOW).await.is_err());
        assert_eq!(ids(&db, &ARCHIVED_IDS).await.len(), 5, "the copy of the killed batch rolled back");
        assert_eq!(ids(&db, &LIVE_IDS).await.len(), 22, "and its rows are still live");
        assert_each_claim_in_exactly_one_table(&db, 27).await;

        let done = archive_once(&db.store, &options("b", 5), NOW + 61_000).await.expect("finish");
        assert_eq!(done.dedup.rows, 18);
        assert_eq!(ids(&db, &ARCHIVED_IDS).await.len(), 23);
        assert_each_claim_in_exactly_one_table(&db, 27).await;
    }

    pub async fn a_claim_the_archive_already_holds_is_kept_there_once(backend: idemgate::store::Backend) {
        let db = TestDb::new(backend).await;
        seed_claims(&db.store, "OLD", 6, NOW, 100 * DAY_MS).await;
        // As if a copy had been made without its delete.
        db.store.query(&COPY_ONE_TO_ARCHIVE).bind("OLD-2").execute(db.store.pool()).await.unwrap();
        let report = archive_once(&db.store, &options("a", 4), NOW).await.expect("run");
        assert_eq!(report.dedup.rows, 6);
        assert_eq!(ids(&db, &LIVE_IDS).await.len(), 0);
        assert_each_claim_in_exactly_one_table(&db, 6).await;
    }

    pub async fn archiving_while_consumers_claim_new_keys_and_replay_old_ones_loses_nothing_and_applies_nothing_twice(
        backend: idemgate::store::Backend,
    ) {
        let db = TestDb::new(backend).await;
        shop::seed_stock(&db.store, "SKU-A", 1_000_000).await.unwrap();
        let now = idemgate::clock::now_ms();
        const OLD: usize = 1_500;
        const NEW: usize = 600;
        seed_claims(&db.store, "OLD", OLD, now, 100 * DAY_MS).await;
        let g = Arc::new(gate_with(db.store.clone(), identity(GROUP, "consumer"), |s| {
            s.archive.late_duplicate_guard = true
        }));
        let consumers: Vec<_> = (0..8)
            .map(|w| {
                let g = g.clone();
                tokio::spawn(async move {
                    let mut outcomes = Vec::new();
                    for i in (w..NEW).step_by(8) {
                        let fresh = stock_deduct(
                            &format!("NEW-{i}"),
                            &format!("N{i}"),
                            &format!("UN{i}"),
                            "SKU-A",
                            1,
                        );
                        // A copy of an old message: the broker or the producer sending it again.
                        let j = (i * 7) % OLD;
                        let old = stock_deduct(
                            &format!("OLD-{j}"),
                            &format!("R{i}"),
                            &format!("U-OLD-{j}"),
                            "SKU-A",
                            1,
                        );
                        let a = g.process(&fresh).await;
                        let b = g.process(&old).await;
                        outcomes.push((a.outcome, a.layer, true));
                        outcomes.push((b.outcome, b.layer, false));
                    }
                    outcomes
                })
            })
            .collect();
        let archiver = {
            let store = db.store.clone();
            tokio::spawn(async move { archive_once(&store, &options("archiver", 50), now).await })
        };
        let report = archiver.await.expect("no panic").expect("the run succeeds beside the consumers");
        let mut outcomes = Vec::new();
        for c in consumers {
            outcomes.extend(c.await.expect("no panic"));
        }
        for (outcome, layer, fresh) in &outcomes {
            if *fresh {
                assert_eq!(*outcome, Outcome::Processed, "a new key is applied");
            } else {
                assert_eq!(*outcome, Outcome::Duplicate, "a copy of an old key is skipped");
                assert!(matches!(layer, Some(Layer::Db) | Some(Layer::LateDuplicate)), "{layer:?}");
            }
        }
        assert_eq!(report.dedup.rows, OLD as u64, "every old claim moved");
        assert_eq!(db.scalar(&LEDGER_ROWS_LIKE, &["NEW-%"]).await, NEW as i64, "each new key applied once");
        assert_eq!(db.scalar(&LEDGER_ROWS_LIKE, &["OLD-%"]).await, 0, "no old key applied again");
        assert_eq!(db.scalar(&CLAIMS_LIKE, &["NEW-%"]).await, NEW as i64, "no claim lost");
        assert_eq!(db.scalar(&DISTINCT_CLAIMS_LIKE, &["NEW-%"]).await, NEW as i64);
        assert_eq!(db.scalar(&CLAIMS_LIKE, &["OLD-%"]).await, 0, "no late copy left a claim");
        assert_each_claim_in_exactly_one_table(&db, OLD + NEW).await;
    }

    pub async fn two_instances_woken_by_one_tick_make_one_archive_run(backend: idemgate::store::Backend) {
        let db = TestDb::new(backend).await;
        seed_claims(&db.store, "OLD", 40, NOW, 100 * DAY_MS).await;
        let other = db.second_store().await;
        let scheduled =
            |instance| ArchiveOptions { started_by: StartedBy::Schedule, ..options(instance, 10) };
        let (a, b) = (scheduled("a"), scheduled("b"));
        let (ra, rb) = tokio::join!(archive_once(&db.store, &a, NOW), archive_once(&other, &b, NOW + 3));
        let (ra, rb) = (ra.expect("a"), rb.expect("b"));
        let done = [&ra, &rb].iter().filter(|r| r.outcome == ArchiveOutcome::Done).count();
        assert_eq!(done, 1, "{ra:?} {rb:?}");
        let statuses: BTreeSet<_> =
            runs_of(&db, RunKind::Dedup).await.iter().map(|r| r.status.as_str()).collect();
        assert_eq!(statuses, BTreeSet::from(["skipped", "success"]));
        assert_eq!(ids(&db, &ARCHIVED_IDS).await.len(), 40);
        // The next tick is archived again, by whichever instance comes first.
        let next = archive_once(&other, &b, NOW + 1_000).await.expect("next tick");
        assert_eq!(next.outcome, ArchiveOutcome::Done);
        other.close().await;
    }

    pub async fn two_schedulers_on_one_database_archive_once_per_tick(backend: idemgate::store::Backend) {
        let db = TestDb::new(backend).await;
        let now = idemgate::clock::now_ms();
        seed_claims(&db.store, "OLD", 30, now, 100 * DAY_MS).await;
        let other = db.second_store().await;
        let every_second = Schedule::parse("* * * * * *").expect("schedule");
        let scheduled =
            |instance| ArchiveOptions { started_by: StartedBy::Schedule, ..options(instance, 10) };
        let a = ArchiveScheduler::start(db.store.clone(), scheduled("a"), &every_second).await.expect("a");
        let b = ArchiveScheduler::start(other.clone(), scheduled("b"), &every_second).await.expect("b");
        tokio::time::sleep(Duration::from_millis(3_500)).await;
        a.shutdown().await;
        b.shutdown().await;
        tokio::time::sleep(Duration::from_millis(300)).await;
        let dedup = runs_of(&db, RunKind::Dedup).await;
        let mut per_tick = std::collections::BTreeMap::<i64, (usize, usize)>::new();
        for r in &dedup {
            let tick = per_tick.entry(r.started_at_ms / 1_000).or_default();
            match r.status {
                RunStatus::Success => tick.0 += 1,
                RunStatus::Skipped => tick.1 += 1,
                other => panic!("unexpected {other} run: {r:?}"),
            }
        }
        assert!(per_tick.len() >= 2, "{dedup:?}");
        // Never two runs in one tick; a tick whose lease a slow run of the tick before still
        // holds has none, and is skipped by both.
        assert!(
            per_tick.values().all(|(success, _)| *success <= 1),
            "one success per tick at most: {per_tick:?}"
        );
        assert!(per_tick.values().filter(|(success, _)| *success == 1).count() >= 2, "{per_tick:?}");
        assert!(
            per_tick.values().any(|(_, skipped)| *skipped == 1),
            "the other instance skipped: {per_tick:?}"
        );
        assert_eq!(ids(&db, &ARCHIVED_IDS).await.len(), 30);
        other.close().await;
    }

    pub async fn a_late_copy_of_an_archived_key_is_skipped_as_a_late_duplicate_only_with_the_guard_on(
        backend: idemgate::store::Backend,
    ) {
        let db = TestDb::new(backend).await;
        shop::seed_stock(&db.store, "SKU-A", 100).await.unwrap();
        let now = idemgate::clock::now_ms();
        seed_claims(&db.store, "OLD", 3, now, 100 * DAY_MS).await;
        archive_once(&db.store, &options("a", 10), now).await.expect("run");
        let unguarded = gate(db.store.clone(), identity(GROUP, "c"), vec![], Handlers::new());
        let guarded =
            gate_with(db.store.clone(), identity(GROUP, "c"), |s| s.archive.late_duplicate_guard = true);

        // Same UNIQ_KEY and stored copy as the archived claim: the broker bringing the message
        // back, as a retry copy with its own msgId.
        let copy = Delivery {
            stored_copy: "M-OLD-0".to_owned(),
            ..stock_deduct("OLD-0", "LATE-1", "U-OLD-0", "SKU-A", 1)
        };
        let stopped = guarded.process(&copy).await;
        assert_eq!((stopped.outcome, stopped.layer), (Outcome::Duplicate, Some(Layer::LateDuplicate)));
        assert_eq!(stopped.cause, Some(idemgate::outcome::DuplicateCause::Redelivery));
        assert_eq!(db.scalar(&LEDGER_ROWS_LIKE, &["OLD-0"]).await, 0, "not applied");
        assert_eq!(db.scalar(&CLAIMS_LIKE, &["OLD-0"]).await, 0, "the fresh claim was rolled back");
        assert_eq!(db.scalar(&LATE_DUPLICATE_LOG_ROWS, &["LATE-1"]).await, 1, "logged at its layer");

        // Without the guard the same copy is a fresh key again: this is what the guard is for.
        let applied = unguarded.process(&stock_deduct("OLD-1", "LATE-2", "U-OLD-1", "SKU-A", 1)).await;
        assert_eq!(applied.outcome, Outcome::Processed);
        assert_eq!(db.scalar(&LEDGER_ROWS_LIKE, &["OLD-1"]).await, 1);

        // A key never archived is claimed as usual with the guard on.
        let fresh = guarded.process(&stock_deduct("NEW-1", "N-1", "U-N-1", "SKU-A", 1)).await;
        assert_eq!(fresh.outcome, Outcome::Processed);
    }

    pub async fn a_dry_run_reports_what_would_move_and_the_plan_and_changes_nothing(
        backend: idemgate::store::Backend,
    ) {
        let db = TestDb::new(backend).await;
        seed_claims(&db.store, "OLD", 12, NOW, 100 * DAY_MS).await;
        seed_claims(&db.store, "NEW", 3, NOW, DAY_MS).await;
        seed_log_rows(&db.store, "OLDLOG", 4, NOW, 20 * DAY_MS).await;
        let plan = dry_run(&db.store, &options("a", 5), NOW).await.expect("dry run");
        let counts: Vec<_> = plan.passes.iter().map(|p| (p.kind, p.rows)).collect();
        assert_eq!(counts, [(RunKind::Dedup, 12), (RunKind::Log, 4)]);
        let text = format!("{plan:#?}");
        assert!(
            plan.passes[0].statements.iter().any(|(sql, _)| sql.contains("DELETE FROM idempotent_record")),
            "{text}"
        );
        assert!(
            plan.passes.iter().all(|p| p.statements.iter().all(|(_, lines)| !lines.is_empty())),
            "{text}"
        );
        assert_eq!(ids(&db, &LIVE_IDS).await.len(), 15, "nothing moved");
        assert_eq!(ids(&db, &ARCHIVED_IDS).await.len(), 0);
        assert!(runs::recent(&db.store, 10).await.unwrap().is_empty(), "no run recorded");
        println!("{text}");
    }
}

on_every_backend!(
    exactly_the_claims_older_than_the_cutoff_move_once_and_a_rerun_moves_nothing,
    a_run_killed_between_batches_loses_no_claim_and_the_next_run_finishes_the_job,
    a_run_killed_inside_a_batch_loses_no_claim_and_archives_none_twice,
    a_claim_the_archive_already_holds_is_kept_there_once,
    archiving_while_consumers_claim_new_keys_and_replay_old_ones_loses_nothing_and_applies_nothing_twice,
    two_instances_woken_by_one_tick_make_one_archive_run,
    two_schedulers_on_one_database_archive_once_per_tick,
    a_late_copy_of_an_archived_key_is_skipped_as_a_late_duplicate_only_with_the_guard_on,
    a_dry_run_reports_what_would_move_and_the_plan_and_changes_nothing,
);
