//! The claim key led by biz_id, on PostgreSQL and MariaDB: a database of the first shape moves
//! while a consumer claims new keys and repeats old ones, every guarantee kept across the move
//! (no key claimed twice, every old claim still stopping its duplicates, with its whole hash);
//! shards move too; the setting keeps a table as it is; SQLite keeps its key.

use crate::conformance::support;

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;

use idemgate::archive::retention::DAY_MS;
use idemgate::archive::{ArchiveOptions, ArchiveSettings, archive_once, prepare_tables};
use idemgate::handler::Handlers;
use idemgate::inspect::trace::{Answer, SearchBy, TraceQuery, trace};
use idemgate::layout::key;
use idemgate::outcome::{Verdict, claim_hash};
use idemgate::store::{Backend, Sql, Store};
use idemgate_shop as shop;
use sqlx::Row;
use support::{TestDb, gate, identity, stock_deduct, trace_context};

const GROUP: &str = "stock-service";
const SKU: &str = "SKU-KEY";

static SEED_CLAIM: Sql = Sql::new(
    "INSERT INTO idempotent_record (consumer_group, biz_type, biz_id, execute_time, msg_id, uniq_key, \
     payload_hash, instance_id, claimed_at_ms) VALUES (?, ?, ?, 0, ?, ?, ?, 'old-instance', ?)",
);
static CLAIMS_LIKE: Sql = Sql::new("SELECT COUNT(*) FROM idempotent_record WHERE biz_id LIKE ?");
static DISTINCT_CLAIMS: Sql = Sql::new(
    "SELECT COUNT(*) FROM (SELECT DISTINCT consumer_group, biz_type, biz_id, execute_time FROM idempotent_record) k",
);
static ALL_CLAIMS: Sql = Sql::new("SELECT COUNT(*) FROM idempotent_record");
static MATCHING_DUPLICATES_LIKE: Sql = Sql::new(
    "SELECT COUNT(*) FROM delivery_log WHERE biz_id LIKE ? AND outcome = 'duplicate' AND payload_match = ?",
);
static STOCK_OF: Sql = Sql::new("SELECT quantity FROM shop_stock WHERE sku = ?");
static NEW_CLAIM: Sql = Sql::new("SELECT payload_hash, instance_id FROM idempotent_record WHERE biz_id = ?");

fn options(claim_key_by_biz_id: bool) -> ArchiveOptions {
    ArchiveOptions { claim_key_by_biz_id, ..super::options("archiver", 500) }
}

/// The old delivery of key `i`, as it was claimed before the move.
fn old_delivery(i: u64) -> idemgate::Delivery {
    stock_deduct(&format!("OLD-{i}"), &format!("M-OLD-{i}"), &format!("U-OLD-{i}"), SKU, 1)
}

/// Claims of the first shape, as the gate wrote them before: the whole hash, the instance.
async fn seed_old_claims(store: &Store, n: u64, now: i64) {
    let mut tx = store.begin().await.unwrap();
    for i in 0..n {
        let d = old_delivery(i);
        store
            .query(&SEED_CLAIM)
            .bind(GROUP)
            .bind(shop::STOCK_DEDUCT)
            .bind(format!("OLD-{i}"))
            .bind(d.msg_id.clone())
            .bind(d.uniq_key.clone())
            .bind(d.payload_hash())
            .bind(now - 30 * DAY_MS + i as i64 * 1_000)
            .execute(&mut *tx)
            .await
            .unwrap();
    }
    tx.commit().await.unwrap();
}

fn assert_first_shape(shape: &key::KeyShape, table: &str) {
    assert!(shape.first_key.is_some() && shape.biz_id_index.is_some(), "{table}: {shape:?}");
    assert!(!shape.is_led(), "{table}: {shape:?}");
}

/// The columns of the unique index named `name` on `table`, in order.
async fn key_columns(store: &Store, table: &str, name: &str) -> Vec<String> {
    let sql = match store.backend() {
        Backend::Postgres => {
            "SELECT a.attname::text FROM pg_index i JOIN pg_class c ON c.oid = i.indexrelid \
             CROSS JOIN LATERAL unnest(i.indkey::int2[]) WITH ORDINALITY AS k(attnum, n) \
             JOIN pg_attribute a ON a.attrelid = i.indrelid AND a.attnum = k.attnum \
             WHERE i.indrelid = to_regclass($1) AND c.relname = $2 AND i.indisunique ORDER BY k.n"
        }
        _ => {
            "SELECT COLUMN_NAME FROM information_schema.STATISTICS WHERE TABLE_SCHEMA = DATABASE() \
             AND TABLE_NAME = ? AND INDEX_NAME = ? AND NON_UNIQUE = 0 ORDER BY SEQ_IN_INDEX"
        }
    };
    super::first_column(store, sql, &[table, name]).await
}

pub(crate) mod cases {
    use super::*;

    /// A claim table of the first shape moves while a consumer claims new keys and repeats
    /// old ones: nothing is claimed twice, every old claim still stops its duplicate (and its
    /// whole hash still matches), the key keeps its name and is led by biz_id, the index on
    /// biz_id alone is gone, and the claims written after keep 96 bits of the hash and no instance.
    pub async fn the_claim_key_moves_while_a_consumer_writes(backend: Backend) {
        let db = TestDb::new(backend).await;
        let store = db.store.clone();
        assert_first_shape(&key::shape(&store, "idempotent_record").await.unwrap(), "idempotent_record");
        let now = idemgate::clock::now_ms();
        let old = 12_000_u64;
        seed_old_claims(&store, old, now).await;
        shop::seed_stock(&store, SKU, 1_000_000).await.unwrap();

        // The consumer: a new key, then a repeat of an old one, until told to stop.
        let stop = Arc::new(AtomicBool::new(false));
        let (fresh, repeated) = (Arc::new(AtomicU64::new(0)), Arc::new(AtomicU64::new(0)));
        let writer = {
            let g = gate(store.clone(), identity(GROUP, "w"), vec![], Handlers::new());
            let (stop, fresh, repeated) = (stop.clone(), fresh.clone(), repeated.clone());
            tokio::spawn(async move {
                let mut i = 0;
                while !stop.load(Ordering::Relaxed) {
                    let d =
                        stock_deduct(&format!("KM-{i}"), &format!("M-KM-{i}"), &format!("U-KM-{i}"), SKU, 1);
                    let r = g.process(&d).await;
                    assert_eq!(r.verdict, Verdict::Ack, "KM-{i}: {r:?}");
                    fresh.fetch_add(1, Ordering::Relaxed);
                    let r = g.process(&old_delivery(i % old)).await;
                    assert_eq!(r.verdict, Verdict::Ack, "OLD-{i}: {r:?}");
                    repeated.fetch_add(1, Ordering::Relaxed);
                    i += 1;
                }
            })
        };
        tokio::time::sleep(Duration::from_millis(300)).await;
        let before_run = fresh.load(Ordering::Relaxed);
        let run = archive_once(&store, &options(true), now).await.unwrap();
        assert!(!run.dedup.schema_steps.is_empty(), "the run moved the key: {:?}", run.dedup);
        let during = fresh.load(Ordering::Relaxed);
        tokio::time::sleep(Duration::from_millis(300)).await;
        stop.store(true, Ordering::Relaxed);
        writer.await.unwrap();
        let (fresh, repeated) =
            (fresh.load(Ordering::Relaxed) as i64, repeated.load(Ordering::Relaxed) as i64);
        assert!(
            before_run > 0 && during as i64 > before_run as i64 && fresh > during as i64,
            "the consumer wrote before, during and after the move: {before_run}, {during}, {fresh}"
        );

        let shape = key::shape(&store, "idempotent_record").await.unwrap();
        assert!(shape.is_led(), "{shape:?}");
        assert_eq!(
            key_columns(&store, "idempotent_record", "idempotent_record_claim_key").await,
            ["biz_id", "biz_type", "consumer_group", "execute_time"],
            "the key keeps its name"
        );
        // The books: every new key claimed and applied once, no old key applied again.
        assert_eq!(db.scalar(&CLAIMS_LIKE, &["KM-%"]).await, fresh);
        assert_eq!(db.scalar(&CLAIMS_LIKE, &["OLD-%"]).await, old as i64);
        assert_eq!(db.scalar(&ALL_CLAIMS, &[]).await, db.scalar(&DISTINCT_CLAIMS, &[]).await);
        assert_eq!(db.scalar(&STOCK_OF, &[SKU]).await, 1_000_000 - fresh);
        // Each repeat of an old key was a duplicate whose body matched the old claim's whole hash.
        let matched = |pattern: &'static str, same: bool| {
            let store = store.clone();
            async move {
                store
                    .query(&MATCHING_DUPLICATES_LIKE)
                    .bind(pattern)
                    .bind(i32::from(same))
                    .fetch_one(store.pool())
                    .await
                    .unwrap()
                    .try_get::<i64, _>(0)
                    .unwrap()
            }
        };
        assert_eq!(matched("OLD-%", true).await, repeated);
        assert_eq!(matched("OLD-%", false).await, 0);

        // After the move: a claim keeps 96 bits of the hash and no instance; its redelivery still
        // matches, a different body under its key does not, and the trace names the instance
        // from the log.
        let g = gate(store.clone(), identity(GROUP, "w"), vec![], Handlers::new());
        let d = stock_deduct("KM-after", "M-KM-after", "U-KM-after", SKU, 1);
        assert_eq!(g.process(&d).await.verdict, Verdict::Ack);
        let row = store.query(&NEW_CLAIM).bind("KM-after").fetch_one(store.pool()).await.unwrap();
        let (hash, instance): (String, String) = (row.try_get(0).unwrap(), row.try_get(1).unwrap());
        assert_eq!((hash.len(), hash.clone()), (16, claim_hash(&d.payload_hash())), "96 bits in base64");
        assert_eq!(instance, "");
        assert_eq!(g.process(&d).await.verdict, Verdict::Ack);
        let other = stock_deduct("KM-after", "M-KM-other", "U-KM-other", SKU, 2);
        assert_eq!(g.process(&other).await.verdict, Verdict::Ack);
        assert_eq!(matched("KM-after", true).await, 1, "the redelivery matches the kept hash");
        assert_eq!(matched("KM-after", false).await, 1, "another body does not");
        let q = TraceQuery::new("KM-after", SearchBy::BizId, None, None, None).unwrap();
        match trace(&store, &trace_context(), &q).await.unwrap() {
            Answer::Story { story, .. } => {
                let claim = story.claim.expect("a claim");
                assert_eq!(claim.instance_id, "w", "named by its processed delivery");
                assert_eq!(story.deliveries.len(), 3);
            }
            other => panic!("one story expected: {other:?}"),
        }
        // A second run has nothing left to move.
        let again = archive_once(&store, &options(true), now).await.unwrap();
        assert!(again.dedup.schema_steps.is_empty(), "{:?}", again.dedup);
    }

    /// Shards made by an earlier version move as the main table does; one made after copies the
    /// moved main table.
    pub async fn shards_move_too(backend: Backend) {
        let db = TestDb::new(backend).await;
        let store = db.store.clone();
        idemgate::layout::ensure(&store, 3, "t").await.unwrap();
        let tables = idemgate::layout::Layout::sharded(3).tables();
        for t in &tables {
            assert_first_shape(&key::shape(&store, t).await.unwrap(), t);
        }
        prepare_tables(&store, &ArchiveSettings::default(), "t", idemgate::clock::now_ms()).await.unwrap();
        for t in tables.iter().map(String::as_str).chain(["idempotent_record"]) {
            let shape = key::shape(&store, t).await.unwrap();
            assert!(shape.is_led(), "{t}: {shape:?}");
        }
        // The gate claims across the moved shards, and a repeat is still a duplicate.
        let g = idemgate::app::assemble_gate(
            &{
                let mut s = support::gate_settings(&identity(GROUP, "w"), Vec::new());
                s.dedup.shards = 3;
                s
            },
            store.clone(),
            shop::handlers(),
            None,
        )
        .expect("gate");
        shop::seed_stock(&store, SKU, 100).await.unwrap();
        for i in 0..30 {
            let d = stock_deduct(&format!("SH-{i}"), &format!("M-SH-{i}"), &format!("U-SH-{i}"), SKU, 1);
            assert_eq!(g.process(&d).await.verdict, Verdict::Ack);
            assert_eq!(g.process(&d).await.verdict, Verdict::Ack);
        }
        assert_eq!(db.scalar(&STOCK_OF, &[SKU]).await, 70);
    }

    /// With `claim_key_by_biz_id` off, a table keeps its first key.
    pub async fn with_the_setting_off_the_key_stays(backend: Backend) {
        let db = TestDb::new(backend).await;
        let settings = ArchiveSettings { claim_key_by_biz_id: false, ..ArchiveSettings::default() };
        prepare_tables(&db.store, &settings, "t", idemgate::clock::now_ms()).await.unwrap();
        archive_once(&db.store, &options(false), idemgate::clock::now_ms()).await.unwrap();
        assert_first_shape(&key::shape(&db.store, "idempotent_record").await.unwrap(), "idempotent_record");
    }
}

on_the_servers!(
    the_claim_key_moves_while_a_consumer_writes,
    shards_move_too,
    with_the_setting_off_the_key_stays,
);

/// SQLite keeps its key, whatever the settings, and says it has nothing to move.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn sqlite_keeps_its_key() {
    let db = TestDb::new(Backend::Sqlite).await;
    prepare_tables(&db.store, &ArchiveSettings::default(), "t", idemgate::clock::now_ms()).await.unwrap();
    assert!(key::shape(&db.store, "idempotent_record").await.unwrap().is_led());
    assert_eq!(key::step(&db.store, "idempotent_record").await.unwrap(), idemgate::store::ddl::Step::Done);
    let run = archive_once(&db.store, &options(true), idemgate::clock::now_ms()).await.unwrap();
    assert!(run.dedup.schema_steps.is_empty());
}
