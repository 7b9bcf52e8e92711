//! The delivery log partitioned by day, on PostgreSQL and MariaDB: the shape a database gets,
//! reads across partitions and across a day boundary, retention by dropping whole days, and the
//! move of a plain log while a consumer writes to it. SQLite keeps the plain log.

use crate::conformance::support;

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;

use idemgate::archive::retention::DAY_MS;
use idemgate::archive::{ArchiveOptions, ArchiveSettings, archive_once, prepare_tables};
use idemgate::delivery_log::partitions::{self, Bound, Partition, Shape, day_start};
use idemgate::delivery_log::{AttemptId, Entry, append_once};
use idemgate::handler::Handlers;
use idemgate::inspect::trace::{Answer, SearchBy, TraceQuery, trace};
use idemgate::outcome::{DuplicateCause, Outcome, Verdict};
use idemgate::store::{Backend, Sql, Store};
use idemgate_shop as shop;
use sqlx::{AssertSqlSafe, Row};
use support::{TestDb, gate, identity, stock_deduct, trace_context};

const GROUP: &str = "stock-service";

static LOG_ROWS_LIKE: Sql = Sql::new("SELECT COUNT(*) FROM delivery_log WHERE biz_id LIKE ?");
static DISTINCT_LOGGED_LIKE: Sql = Sql::new(
    "SELECT COUNT(*) FROM (SELECT DISTINCT biz_id FROM delivery_log WHERE biz_id LIKE ? AND outcome = 'processed') k",
);
static CLAIMS_LIKE: Sql = Sql::new("SELECT COUNT(*) FROM idempotent_record WHERE biz_id LIKE ?");
static REPEATED_IDS: Sql = Sql::new("SELECT COUNT(*) - COUNT(DISTINCT id) FROM delivery_log");
static SEED_LOG_ROW: Sql = Sql::new(
    "INSERT INTO delivery_log (logged_at_ms, instance_id, consumer_group, msg_id, uniq_key, topic, tags, \
     queue_id, queue_offset, reconsume_times, biz_type, biz_id, execute_time, outcome, latency_us) \
     VALUES (?, 'seed', ?, ?, '', 't', '', 0, 0, 0, 'x', ?, 0, 'processed', 1)",
);

fn options(partition_log: bool) -> ArchiveOptions {
    ArchiveOptions { partition_log, ..super::options("archiver", 500) }
}

/// The times of `biz_id`'s deliveries, as its trace shows them.
async fn traced(store: &Store, biz_id: &str) -> Vec<i64> {
    let q = TraceQuery::new(biz_id, SearchBy::BizId, None, None, None).unwrap();
    match trace(store, &trace_context(), &q).await.unwrap() {
        Answer::Story { story, .. } => story.deliveries.iter().map(|d| d.logged_at_ms).collect(),
        _ => panic!("{biz_id}: one story expected"),
    }
}

/// Rows of `biz_id` in the partition `p`, read from the partition alone.
async fn rows_in_partition(store: &Store, p: &Partition, biz_id: &str) -> i64 {
    let param = if store.backend() == Backend::Postgres { "$1" } else { "?" };
    let sql = format!("SELECT COUNT(*) FROM {} WHERE biz_id = {param}", p.table(store.backend()));
    count(store, &sql, Some(biz_id)).await
}

/// One count, from a statement written for the backend at hand, with at most one value.
async fn count(store: &Store, sql: &str, bind: Option<&str>) -> i64 {
    let mut q = sqlx::query(AssertSqlSafe(sql.to_owned()));
    if let Some(value) = bind {
        q = q.bind(value.to_owned());
    }
    q.fetch_one(store.pool()).await.expect("a count").try_get(0).expect("an integer")
}

/// The partition that takes `ms`.
fn partition_of(shape: &Shape, ms: i64) -> Partition {
    let p = shape.partitions().iter().find(|p| match p.bound {
        Bound::Before { to_ms } => ms < to_ms,
        Bound::Day { from_ms, to_ms } => (from_ms..to_ms).contains(&ms),
        Bound::Overflow => true,
    });
    p.expect("every time has a partition").clone()
}

/// The partitions' shape is what the module promises: the `before` one (until retention drops
/// it), days one after the other, the overflow last.
fn assert_contiguous(shape: &Shape, through_ms: i64) {
    let parts = shape.partitions();
    assert!(parts.iter().skip(1).all(|p| !matches!(p.bound, Bound::Before { .. })), "{parts:?}");
    assert!(matches!(parts.last().map(|p| p.bound), Some(Bound::Overflow)), "{parts:?}");
    let mut end = parts[0].to_ms().unwrap();
    for p in &parts[1..parts.len() - 1] {
        let Bound::Day { from_ms, to_ms } = p.bound else { panic!("{p:?} is not a day") };
        assert_eq!(from_ms, end, "days follow one another: {parts:?}");
        assert_eq!(from_ms % DAY_MS, 0, "days start at midnight UTC");
        end = to_ms;
    }
    assert!(end >= through_ms, "partitions reach {end}, not {through_ms}");
}

/// An entry of a `stock.deduct` duplicate of `biz_id` logged at `at_ms`.
fn duplicate_entry<'a>(d: &'a idemgate::delivery::Delivery, biz_id: &'a str, at_ms: i64) -> Entry<'a> {
    Entry {
        logged_at_ms: at_ms,
        instance_id: "late",
        consumer_group: GROUP,
        delivery: d,
        biz_type: shop::STOCK_DEDUCT,
        biz_id,
        execute_time: 0,
        outcome: Outcome::Duplicate,
        cause: Some(DuplicateCause::Redelivery),
        layer: None,
        payload_match: Some(true),
        payload_hash: None,
        error: None,
        latency_us: 1,
        keep_payload: false,
    }
}

pub(crate) mod cases {
    use super::*;

    /// A new database gets a log partitioned by day, days ahead of now and the overflow; rows
    /// land in their day's partition, a day boundary parts one key's deliveries between two
    /// partitions, every read sees them all, and retention drops whole expired days.
    pub async fn reads_span_day_partitions_and_retention_drops_whole_days(backend: Backend) {
        let db = TestDb::new(backend).await;
        let store = &db.store;
        let now = idemgate::clock::now_ms();
        let today = day_start(now);
        // Made five days ago, kept ahead since: the days between are partitions of their own.
        prepare_tables(store, &ArchiveSettings::default(), "t", now - 5 * DAY_MS).await.unwrap();
        let made = partitions::ensure_ahead(store, now).await.unwrap();
        assert!(!made.is_empty(), "days up to three ahead of now are made");
        let shape = partitions::shape(store).await.unwrap();
        assert_contiguous(&shape, today + 4 * DAY_MS);
        assert_eq!(shape.partitions()[0].to_ms(), Some(day_start(now - 5 * DAY_MS) + 2 * DAY_MS));
        let health = partitions::health(store, now).await.unwrap().expect("a partitioned log");
        assert!(health.ahead_ms > 3 * DAY_MS && health.overflow_rows == 0, "{health:?}");

        // Today's deliveries through the gate, one of them a dead letter.
        shop::seed_stock(store, "SKU-PX", 100).await.unwrap();
        let g = gate(store.clone(), identity(GROUP, "a"), vec![], Handlers::new());
        for i in 0..5 {
            let d = stock_deduct(&format!("PX-{i}"), &format!("M-PX-{i}"), &format!("U-PX-{i}"), "SKU-PX", 1);
            assert_eq!(g.process(&d).await.verdict, Verdict::Ack);
        }
        let poison = stock_deduct("PX-POISON", "M-PX-POISON", "U-PX-POISON", "SKU-NONE", 1);
        assert_eq!(g.process(&poison).await.outcome, Outcome::DeadLettered);

        // Two copies of PX-1 either side of yesterday's midnight: 23:59:59.999, written twice
        // as a retry whose first answer was lost, and 00:00:00.000.
        let midnight = today - DAY_MS;
        let late = stock_deduct("PX-1", "M-PX-1-late", "U-PX-1", "SKU-PX", 1);
        let (before_midnight, at_midnight) =
            (duplicate_entry(&late, "PX-1", midnight - 1), duplicate_entry(&late, "PX-1", midnight));
        let attempt = AttemptId::new();
        let mut conn = store.pool().acquire().await.unwrap();
        assert!(append_once(&mut conn, backend, &before_midnight, &attempt).await.unwrap());
        assert!(!append_once(&mut conn, backend, &before_midnight, &attempt).await.unwrap(), "written once");
        assert!(append_once(&mut conn, backend, &at_midnight, &AttemptId::new()).await.unwrap());
        drop(conn);
        let (day_before, day_after) = (partition_of(&shape, midnight - 1), partition_of(&shape, midnight));
        assert_ne!(day_before.name, day_after.name);
        assert_eq!(rows_in_partition(store, &day_before, "PX-1").await, 1);
        assert_eq!(rows_in_partition(store, &day_after, "PX-1").await, 1);
        let times = traced(store, "PX-1").await;
        assert_eq!(times.len(), 3, "the trace reads every partition: {times:?}");
        assert_eq!(&times[..2], [midnight - 1, midnight]);

        // The dead letters list and the reconcile read across them too.
        let lists = idemgate::inspect::lists::ListQuery {
            kind: idemgate::inspect::lists::ListKind::DeadLetters,
            biz_type: None,
            since_ms: Some(now - 3 * DAY_MS),
            until_ms: None,
            before: None,
            page_size: 50,
        };
        let limits = idemgate::inspect::Limits { timeout: Duration::from_secs(10) };
        let page = idemgate::inspect::lists::list(store, &limits, &lists).await.unwrap();
        let dead: Vec<&str> = page.rows.iter().map(|r| r.biz_id.as_str()).collect();
        assert_eq!(dead, ["PX-POISON"]);
        let reconcile = idemgate::reconcile::ReconcileOptions {
            consumer_group: GROUP.to_owned(),
            biz_type: None,
            since_ms: now - 3 * DAY_MS,
            until_ms: idemgate::clock::now_ms() + 1,
            stuck_after_ms: 1_800_000,
            log_retention_ms: 14 * DAY_MS,
            max_per_kind: 1_000,
            instance_id: "test".to_owned(),
            started_by: "command".to_owned(),
        };
        let checks = [idemgate_shop::STOCK_LEDGER_CHECK];
        let report = idemgate::reconcile::reconcile_once(store, &reconcile, &checks, now).await.unwrap();
        let found: Vec<_> = report.anomalies.iter().map(|a| (a.kind, a.biz_id.as_str())).collect();
        assert_eq!(found, [(idemgate::reconcile::AnomalyKind::Lost, "PX-POISON")]);

        // Thirteen days on, with a retention of fourteen: every partition that ends before
        // yesterday's start is dropped whole; the day after midnight stays, and nothing is
        // deleted row by row.
        let later = now + 13 * DAY_MS;
        let run = archive_once(store, &options(true), later).await.unwrap();
        let log = run.log.expect("a log pass");
        let expected: Vec<String> = shape
            .partitions()
            .iter()
            .filter(|p| p.to_ms().is_some_and(|to| to <= later - 14 * DAY_MS))
            .map(|p| p.name.clone())
            .collect();
        assert!(expected.contains(&day_before.name) && !expected.contains(&day_after.name), "{expected:?}");
        assert_eq!(log.dropped_partitions, expected);
        assert_eq!(log.rows, 0, "no row deleted one by one");
        let after = partitions::shape(store).await.unwrap();
        for name in &expected {
            assert!(after.partitions().iter().all(|p| &p.name != name), "{name} is gone");
        }
        if backend == Backend::Postgres {
            for name in &expected {
                let left = count(store, "SELECT COUNT(to_regclass($1)::text)", Some(name)).await;
                assert_eq!(left, 0, "no table {name} is left");
            }
        }
        assert_contiguous(&after, day_start(later) + 4 * DAY_MS);
        assert_eq!(traced(store, "PX-1").await, [midnight, times[2]]);
        // The run's row says what it dropped.
        let runs = idemgate::archive::runs::recent(store, 10).await.unwrap();
        let note =
            runs.iter().find_map(|r| r.note.clone().filter(|n| n.contains("dropped the log partitions")));
        assert!(note.is_some_and(|n| n.contains(&day_before.name)), "{runs:?}");
    }

    /// A log of the old shape, with rows from the last three weeks, moves to partitions while a
    /// consumer keeps writing: no row is lost or written twice, the expired ones go, and (on
    /// PostgreSQL) the old table becomes the `before` partition with its indexes as they were.
    pub async fn a_plain_log_moves_to_partitions_while_a_consumer_writes(backend: Backend) {
        let db = TestDb::new(backend).await;
        let store = db.store.clone();
        assert_eq!(partitions::shape(&store).await.unwrap(), Shape::Plain);
        let now = idemgate::clock::now_ms();
        // 12,000 rows over 21 days: the copy of MariaDB's move takes a few batches.
        let seeded = 12_000_i64;
        // Oldest first, as a log is written.
        let seeded_at = |i: i64| now - DAY_MS / 2 - (seeded - 1 - i) * (21 * DAY_MS / seeded);
        let mut tx = store.begin().await.unwrap();
        for i in 0..seeded {
            store
                .query(&SEED_LOG_ROW)
                .bind(seeded_at(i))
                .bind(GROUP)
                .bind(format!("M-OLD-{i}"))
                .bind(format!("OLD-{i}"))
                .execute(&mut *tx)
                .await
                .unwrap();
        }
        tx.commit().await.unwrap();
        let expired = (0..seeded).filter(|&i| seeded_at(i) < now - 14 * DAY_MS).count();
        let old_indexes = pg_indexes(&store, "delivery_log").await;

        // The consumer: one delivery after another until told to stop.
        shop::seed_stock(&store, "SKU-MV", 1_000_000).await.unwrap();
        let stop = Arc::new(AtomicBool::new(false));
        let acked = Arc::new(AtomicU64::new(0));
        let writer = {
            let (g, stop, acked) = (
                gate(store.clone(), identity(GROUP, "w"), vec![], Handlers::new()),
                stop.clone(),
                acked.clone(),
            );
            tokio::spawn(async move {
                let mut i = 0;
                while !stop.load(Ordering::Relaxed) {
                    let d = stock_deduct(
                        &format!("MV-{i}"),
                        &format!("M-MV-{i}"),
                        &format!("U-MV-{i}"),
                        "SKU-MV",
                        1,
                    );
                    assert_eq!(g.process(&d).await.verdict, Verdict::Ack, "MV-{i}");
                    acked.fetch_add(1, Ordering::Relaxed);
                    i += 1;
                }
            })
        };
        tokio::time::sleep(Duration::from_millis(300)).await;
        let before_run = acked.load(Ordering::Relaxed);
        let run = archive_once(&store, &options(true), now).await.unwrap();
        let log = run.log.expect("a log pass");
        assert!(!log.schema_steps.is_empty(), "the run moved the log: {log:?}");
        let during = acked.load(Ordering::Relaxed);
        tokio::time::sleep(Duration::from_millis(300)).await;
        stop.store(true, Ordering::Relaxed);
        writer.await.unwrap();
        let written = acked.load(Ordering::Relaxed);
        assert!(
            before_run > 0 && during > before_run && written > during,
            "the consumer wrote before, during and after the move: {before_run}, {during}, {written}"
        );

        let shape = partitions::shape(&store).await.unwrap();
        assert_contiguous(&shape, day_start(now) + 4 * DAY_MS);
        let n = written as i64;
        assert_eq!(db.scalar(&CLAIMS_LIKE, &["MV-%"]).await, n);
        assert_eq!(
            db.scalar(&LOG_ROWS_LIKE, &["MV-%"]).await,
            n,
            "one log row per delivery, none lost, none twice"
        );
        assert_eq!(db.scalar(&DISTINCT_LOGGED_LIKE, &["MV-%"]).await, n);
        assert_eq!(
            db.scalar(&LOG_ROWS_LIKE, &["OLD-%"]).await,
            seeded - expired as i64,
            "the expired ones went"
        );
        assert_eq!(log.rows, expired as u64, "deleted from the old table row by row");
        assert_eq!(db.scalar(&REPEATED_IDS, &[]).await, 0, "ids stay unique");
        match backend {
            Backend::Postgres => {
                // The old table's indexes are the `before` partition's, attached, not rebuilt.
                let kept = pg_indexes(&store, "delivery_log_before").await;
                assert!(old_indexes.iter().all(|i| kept.contains(i)), "{old_indexes:?} ⊄ {kept:?}");
            }
            _ => {
                for leftover in
                    ["delivery_log_partitioned", "delivery_log_unpartitioned", "delivery_log_conversion"]
                {
                    let tables = "SELECT COUNT(*) FROM information_schema.TABLES WHERE TABLE_SCHEMA = DATABASE() \
                                  AND TABLE_NAME = ?";
                    assert_eq!(count(&store, tables, Some(leftover)).await, 0, "{leftover} is gone");
                }
                let triggers =
                    "SELECT COUNT(*) FROM information_schema.TRIGGERS WHERE TRIGGER_SCHEMA = DATABASE()";
                assert_eq!(count(&store, triggers, None).await, 0, "the copy's triggers are gone");
            }
        }
        // A new delivery after the move lands in today's partition; a second run moves nothing.
        let g = gate(store.clone(), identity(GROUP, "w"), vec![], Handlers::new());
        let d = stock_deduct("MV-after", "M-MV-after", "U-MV-after", "SKU-MV", 1);
        assert_eq!(g.process(&d).await.verdict, Verdict::Ack);
        let again = archive_once(&store, &options(true), now).await.unwrap().log.unwrap();
        assert!(again.schema_steps.is_empty() && again.dropped_partitions.is_empty(), "{again:?}");
        assert_eq!(traced(&store, "MV-after").await.len(), 1);
    }

    /// With `partition_log` off, a plain log stays plain and keeps its row-wise retention.
    pub async fn with_partition_log_off_a_plain_log_stays_plain(backend: Backend) {
        let db = TestDb::new(backend).await;
        let settings = ArchiveSettings { partition_log: false, ..ArchiveSettings::default() };
        prepare_tables(&db.store, &settings, "t", idemgate::clock::now_ms()).await.unwrap();
        archive_once(&db.store, &options(false), idemgate::clock::now_ms()).await.unwrap();
        assert_eq!(partitions::shape(&db.store).await.unwrap(), Shape::Plain);
    }
}

/// The indexes of `table` on PostgreSQL (their ids), none elsewhere.
async fn pg_indexes(store: &Store, table: &str) -> Vec<i64> {
    if store.backend() != Backend::Postgres {
        return Vec::new();
    }
    let sql = "SELECT indexrelid::oid::bigint FROM pg_index WHERE indrelid = to_regclass($1) ORDER BY 1";
    super::first_column(store, sql, &[table]).await
}

// SQLite keeps the plain log: its own test below.
on_the_servers!(
    reads_span_day_partitions_and_retention_drops_whole_days,
    a_plain_log_moves_to_partitions_while_a_consumer_writes,
    with_partition_log_off_a_plain_log_stays_plain,
);

/// SQLite keeps the plain log, whatever the settings.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn sqlite_keeps_the_plain_log() {
    let db = TestDb::new(Backend::Sqlite).await;
    let now = idemgate::clock::now_ms();
    prepare_tables(&db.store, &ArchiveSettings::default(), "t", now).await.unwrap();
    let run = archive_once(&db.store, &options(true), now).await.unwrap();
    assert!(run.log.unwrap().schema_steps.is_empty());
    assert_eq!(partitions::shape(&db.store).await.unwrap(), Shape::Plain);
    assert_eq!(partitions::health(&db.store, now).await.unwrap(), None);
}
