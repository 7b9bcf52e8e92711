//! The multi-level defence: the Redis pre-filter in front of the claim and the sharded claim
//! tables, on SQLite, PostgreSQL and MariaDB, against a real Redis. The fault cases run a
//! private `redis-server` (stopped, restarted, put to sleep) so the shared one is never
//! disturbed. A missing Redis or `redis-server` fails these tests; nothing is skipped.

pub(crate) mod redis_server;

use crate::conformance::support;

use std::collections::BTreeSet;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use async_trait::async_trait;
use idemgate::delivery::Delivery;
use idemgate::gate::Gate;
use idemgate::handler::{Effect, Handler, HandlerError, Handlers, Work};
use idemgate::layout::{self, Layout, LayoutError};
use idemgate::metrics::{BuildInfo, Metrics};
use idemgate::outcome::{DuplicateCause, Layer, Outcome, Verdict};
use idemgate::prefilter::{Check, FallbackCause, Prefilter, RedisSettings, Settle, Settled, Step};
use idemgate::route::{BizKey, RouteConfig};
use idemgate::store::{Backend, Conn, Sql};
use idemgate_shop as shop;
use redis_server::RedisServer;
use support::{TestDb, gate, identity, race, stock_deduct};

static STOCK_OF: Sql = Sql::new("SELECT quantity FROM shop_stock WHERE sku = ?");
static LEDGER_ROWS_OF: Sql = Sql::new("SELECT COUNT(*) FROM shop_stock_ledger WHERE deduction_id = ?");
static LEDGER_ROWS_LIKE: Sql = Sql::new("SELECT COUNT(*) FROM shop_stock_ledger WHERE deduction_id LIKE ?");
static DISTINCT_LEDGER_KEYS_LIKE: Sql = Sql::new(
    "SELECT COUNT(*) FROM (SELECT DISTINCT deduction_id FROM shop_stock_ledger WHERE deduction_id LIKE ?) d",
);
static CLAIMS_IN_VIEW: Sql = Sql::new("SELECT COUNT(*) FROM idempotent_record_all WHERE biz_id LIKE ?");
static CLAIM_UNIQ_KEY: Sql = Sql::new("SELECT uniq_key FROM idempotent_record_all WHERE biz_id = ?");
static CLAIMS_IN_MAIN: Sql = Sql::new("SELECT COUNT(*) FROM idempotent_record");
static LOG_ROWS_OF: Sql = Sql::new("SELECT COUNT(*) FROM delivery_log WHERE biz_id = ? AND outcome = ?");
static ARCHIVED: Sql = Sql::new("SELECT COUNT(*) FROM idempotent_record_archive WHERE biz_id LIKE ?");
static DISTINCT_ARCHIVED_IDS: Sql =
    Sql::new("SELECT COUNT(*) FROM (SELECT DISTINCT id FROM idempotent_record_archive) ids");

const GROUP: &str = "stock-service";

/// The shared Redis of the machine (`IDEMGATE_TEST_REDIS_URL`, default 127.0.0.1:6379).
fn shared_redis_url() -> String {
    std::env::var("IDEMGATE_TEST_REDIS_URL").unwrap_or_else(|_| "redis://127.0.0.1:6379".to_owned())
}

/// Pre-filter settings on `url` under a prefix of this test's own, so parallel tests never
/// see each other's keys.
/// A generous timeout: these tests are about what Redis says, not about how fast (the fault
/// tests set their own).
fn redis_settings(url: &str) -> RedisSettings {
    RedisSettings {
        url: url.to_owned(),
        timeout_ms: 500,
        key_prefix: format!("idemgate-test-{:016x}", rand::random::<u64>()),
        ..Default::default()
    }
}

fn prefilter(settings: &RedisSettings) -> Arc<Prefilter> {
    Arc::new(Prefilter::new(settings).expect("a valid Redis URL"))
}

/// A plain connection to read and write keys behind the pre-filter's back.
async fn redis(url: &str) -> redis::aio::MultiplexedConnection {
    redis::Client::open(url).expect("url").get_multiplexed_async_connection().await.unwrap_or_else(|e| {
        panic!("Redis at {url} must be running for these tests (scripts/services.sh): {e}")
    })
}

async fn get(conn: &mut redis::aio::MultiplexedConnection, key: &str) -> Option<String> {
    redis::cmd("GET").arg(key).query_async(conn).await.expect("GET")
}

fn deduct_key(biz_id: &str) -> BizKey {
    BizKey {
        biz_type: shop::STOCK_DEDUCT.to_owned(),
        biz_id: biz_id.to_owned(),
        execute_time: 0,
        handler: shop::STOCK_DEDUCT.to_owned(),
    }
}

/// A handler for the tests: writes a ledger row, then fails while `failing` is set. With
/// `steal`, it first overwrites the delivery's Redis key, as a delivery that came after the
/// key's TTL ran out would.
struct Flaky {
    failing: Arc<AtomicBool>,
    steal: Option<(String, String)>,
}

static FLAKY_EFFECT: Sql = Sql::new(
    "INSERT INTO shop_stock_ledger (deduction_id, sku, quantity, applied_at_ms) VALUES (?, 'FLAKY', 1, 0)",
);

#[async_trait]
impl Handler for Flaky {
    async fn handle(&self, work: &Work<'_>, conn: &mut Conn) -> Result<Effect, HandlerError> {
        idemgate::store::query(work.backend, &FLAKY_EFFECT)
            .bind(work.key.biz_id.as_str())
            .execute(&mut *conn)
            .await?;
        if let Some((url, key)) = &self.steal {
            let mut r = redis(url).await;
            let _: () = redis::cmd("SET")
                .arg(key)
                .arg("claiming:another-delivery")
                .query_async(&mut r)
                .await
                .expect("SET");
        }
        if self.failing.load(Ordering::SeqCst) {
            return Err(HandlerError::Retryable("downstream said no".to_owned()));
        }
        Ok(Effect::Applied)
    }
}

fn flaky_gate(db: &TestDb, handler: Flaky) -> Gate {
    let route = RouteConfig {
        topic: "layers".into(),
        tags: "flaky".into(),
        biz_type: "test.flaky".into(),
        biz_id: "keys".into(),
        execute_time: None,
        handler: Some("test.flaky".into()),
    };
    gate(db.store.clone(), identity(GROUP, "a"), vec![route], Handlers::new().with("test.flaky", handler))
}

fn flaky_delivery(key: &str, msg_id: &str) -> Delivery {
    Delivery {
        msg_id: msg_id.into(),
        uniq_key: format!("U-{key}"),
        topic: "layers".into(),
        tags: "flaky".into(),
        keys: vec![key.into()],
        body: b"{}".to_vec(),
        ..Default::default()
    }
}

fn metrics() -> Arc<Metrics> {
    let info = BuildInfo {
        broker: Default::default(),
        backend: Backend::Sqlite,
        consumer_group: GROUP.to_owned(),
        instance_id: "a".to_owned(),
        ui_url: String::new(),
    };
    let biz_types: BTreeSet<String> = [shop::STOCK_DEDUCT.to_owned()].into();
    Arc::new(Metrics::new(&info, &biz_types, &[shop::TOPIC.to_owned()].into()))
}

/// The value of one sample in the text exposition, such as
/// `idemgate_prefilter_fallbacks_total{consumer_group="g",cause="timeout"}`.
fn sample(text: &str, name: &str, labels: &[(&str, &str)]) -> f64 {
    text.lines()
        .filter(|l| l.starts_with(name) && l[name.len()..].starts_with('{'))
        .filter(|l| labels.iter().all(|(k, v)| l.contains(&format!("{k}=\"{v}\""))))
        .map(|l| l.rsplit(' ').next().unwrap().parse::<f64>().unwrap())
        .sum()
}

/// `n` keys, each delivered three times (the send, a redelivery, a producer resend), in an
/// order where copies follow within a few deliveries.
fn stream(prefix: &str, n: usize, sku: &str) -> Vec<Delivery> {
    let mut out = Vec::with_capacity(n * 3);
    for i in 0..n {
        let id = format!("{prefix}-{i}");
        out.push(stock_deduct(&id, &format!("M-{id}-a"), &format!("U-{id}"), sku, 1));
        out.push(stock_deduct(&id, &format!("M-{id}-b"), &format!("U-{id}"), sku, 1));
        out.push(stock_deduct(&id, &format!("M-{id}-c"), &format!("U-{id}-resend"), sku, 1));
    }
    out
}

/// The same deliveries, with the copies of each key spread apart: in chunks of 30 keys, all
/// the sends, then all the redeliveries, then all the resends.
fn spaced(stream: Vec<Delivery>) -> Vec<Delivery> {
    let mut out = Vec::with_capacity(stream.len());
    for chunk in stream.chunks(90) {
        for copy in 0..3 {
            out.extend(chunk.iter().skip(copy).step_by(3).cloned());
        }
    }
    out
}

/// Every key of `prefix` applied exactly once.
async fn assert_exactly_once(db: &TestDb, prefix: &str, n: usize, sku: &str, initial: i64) {
    let like = format!("{prefix}-%");
    assert_eq!(db.scalar(&LEDGER_ROWS_LIKE, &[&like]).await, n as i64, "one ledger row per key");
    assert_eq!(db.scalar(&DISTINCT_LEDGER_KEYS_LIKE, &[&like]).await, n as i64, "every key applied");
    assert_eq!(db.scalar(&STOCK_OF, &[sku]).await, initial - n as i64, "stock taken once per key");
}

mod cases {
    use super::*;

    pub async fn sixteen_racing_deliveries_apply_once_with_redis_on(backend: Backend) {
        let db = TestDb::new(backend).await;
        let settings = redis_settings(&shared_redis_url());
        // Two processes: two pools, two pre-filters.
        let a = Arc::new(
            gate(db.store.clone(), identity(GROUP, "a"), vec![], Handlers::new())
                .with_prefilter(prefilter(&settings)),
        );
        let b = Arc::new(
            gate(db.second_store().await, identity(GROUP, "b"), vec![], Handlers::new())
                .with_prefilter(prefilter(&settings)),
        );
        race(&db, a.clone(), b, "DEDUCT-RACE-R", "SKU-RACE-R").await;
        let key = prefilter(&settings).redis_key(GROUP, &deduct_key("DEDUCT-RACE-R"));
        let value = get(&mut redis(&settings.url).await, &key).await.expect("the key is remembered");
        assert!(value.starts_with("done:"), "{value}");
        // Every later copy now stops at Redis, with its cause read from Redis's value: the
        // claim that won the race, whichever delivery owned the Redis key.
        let winner = db.scalar_text(&CLAIM_UNIQ_KEY, "DEDUCT-RACE-R").await;
        let cause =
            if winner == "U-1" { DuplicateCause::ProducerRetry } else { DuplicateCause::ProducerResend };
        let late = a.process(&stock_deduct("DEDUCT-RACE-R", "M-late", "U-1", "SKU-RACE-R", 7)).await;
        assert_eq!(
            (late.outcome, late.layer, late.cause),
            (Outcome::Duplicate, Some(Layer::Redis), Some(cause))
        );
        assert_eq!(db.scalar(&STOCK_OF, &["SKU-RACE-R"]).await, 993);
    }

    pub async fn sixteen_racing_deliveries_apply_once_on_sharded_tables(backend: Backend) {
        let db = TestDb::new(backend).await;
        let recorded = layout::ensure(&db.store, 8, "test").await.expect("a new database takes any layout");
        assert_eq!(recorded, Layout::sharded(8));
        let a = Arc::new(gate(db.store.clone(), identity(GROUP, "a"), vec![], Handlers::new()));
        // The second process reads the layout from the database.
        let b = Arc::new(gate(db.second_store().await, identity(GROUP, "b"), vec![], Handlers::new()));
        race(&db, a, b, "DEDUCT-RACE-S", "SKU-RACE-S").await;
        let shard = layout::shard_of(GROUP, shop::STOCK_DEDUCT, "DEDUCT-RACE-S", 0, 8);
        let in_shard: &'static Sql = Box::leak(Box::new(Sql::new(Box::leak(
            format!("SELECT COUNT(*) FROM idempotent_record_{shard:02} WHERE biz_id = ?").into_boxed_str(),
        ))));
        assert_eq!(db.scalar(in_shard, &["DEDUCT-RACE-S"]).await, 1, "the claim is in its shard");
        assert_eq!(db.scalar(&CLAIMS_IN_MAIN, &[]).await, 0, "nothing in the unsharded table");
        assert_eq!(db.scalar(&CLAIMS_IN_VIEW, &["DEDUCT-RACE-S"]).await, 1, "readers see it");
    }

    pub async fn the_layout_is_recorded_once_and_another_n_is_refused(backend: Backend) {
        let db = TestDb::new(backend).await;
        layout::ensure(&db.store, 4, "first").await.unwrap();
        assert_eq!(layout::ensure(&db.store, 4, "again").await.unwrap(), Layout::sharded(4), "same N: fine");
        for wanted in [8, 0] {
            let err = layout::ensure(&db.store, wanted, "second").await.unwrap_err();
            assert!(matches!(err, LayoutError::Mismatch { .. }), "{err:?}");
            let text = err.to_string();
            assert!(
                text.contains("configuration key dedup.shards")
                    && text.contains("4 shards")
                    && text.contains("by first")
                    && text.contains("Set dedup.shards = 4"),
                "{text}"
            );
        }
        // A database whose single table holds claims is not silently sharded.
        let other = TestDb::new(backend).await;
        let g = gate(other.store.clone(), identity(GROUP, "a"), vec![], Handlers::new());
        shop::seed_stock(&other.store, "SKU-L", 10).await.unwrap();
        assert_eq!(
            g.process(&stock_deduct("D-L", "M-1", "U-1", "SKU-L", 1)).await.outcome,
            Outcome::Processed
        );
        assert_eq!(
            layout::current(&other.store).await.unwrap(),
            Layout::SINGLE,
            "the gate recorded the single table"
        );
        let err = layout::ensure(&other.store, 4, "late").await.unwrap_err();
        assert!(matches!(err, LayoutError::Mismatch { .. }), "{err:?}");
        let fresh = TestDb::new(backend).await;
        let g = gate(fresh.store.clone(), identity(GROUP, "a"), vec![], Handlers::new());
        shop::seed_stock(&fresh.store, "SKU-L", 10).await.unwrap();
        // Claims written before the layout was recorded (an older idemgate) block sharding too.
        idemgate::store::query(fresh.store.backend(), &Sql::new(
            "INSERT INTO idempotent_record (consumer_group, biz_type, biz_id, execute_time, msg_id, uniq_key, \
             payload_hash, instance_id, claimed_at_ms) VALUES ('g', 't', 'x', 0, 'm', '', 'h', 'i', 1)",
        ))
        .execute(fresh.store.pool())
        .await
        .unwrap();
        drop(g);
        assert!(matches!(layout::ensure(&fresh.store, 4, "x").await.unwrap_err(), LayoutError::NotEmpty));
    }

    pub async fn trace_archive_and_reconcile_cover_every_shard(backend: Backend) {
        use idemgate::archive::{ArchiveOptions, Fault, StartedBy, archive_once};
        use idemgate::inspect::trace::{Answer, SearchBy, TraceQuery, trace};
        let db = TestDb::new(backend).await;
        layout::ensure(&db.store, 4, "test").await.unwrap();
        shop::seed_stock(&db.store, "SKU-SH", 1_000).await.unwrap();
        let g = gate(db.store.clone(), identity(GROUP, "a"), vec![], Handlers::new());
        let deliveries = stream("SH", 40, "SKU-SH");
        for d in &deliveries {
            assert_eq!(g.process(d).await.verdict, Verdict::Ack);
        }
        assert_exactly_once(&db, "SH", 40, "SKU-SH", 1_000).await;
        assert_eq!(db.scalar(&CLAIMS_IN_VIEW, &["SH-%"]).await, 40);

        // Trace: the claim and all three deliveries of a key, wherever its shard.
        let ctx = support::trace_context();
        for id in ["SH-0", "SH-17", "SH-39"] {
            let q = TraceQuery::new(id, SearchBy::BizId, None, None, None).unwrap();
            let Answer::Story { story, .. } = trace(&db.store, &ctx, &q).await.unwrap() else {
                panic!("{id}: one story expected")
            };
            let claim = story.claim.as_ref().expect("the live claim is found");
            assert_eq!((claim.state, claim.msg_id.as_str()), ("live", format!("M-{id}-a").as_str()));
            assert_eq!(story.deliveries.len(), 3);
        }

        // A deduction of an unknown SKU is dead-lettered, its key never claimed; one of the
        // keys above has since been deducted again by a resend (a duplicate).
        let poison = stock_deduct("SH-POISON", "M-POISON", "U-POISON", "SKU-NONE", 1);
        assert_eq!(g.process(&poison).await.outcome, Outcome::DeadLettered);
        let lists = idemgate::inspect::lists::ListQuery {
            kind: idemgate::inspect::lists::ListKind::DeadLetters,
            biz_type: None,
            since_ms: None,
            until_ms: None,
            before: None,
            page_size: 50,
        };
        let limits = idemgate::inspect::Limits { timeout: Duration::from_secs(10) };
        let page = idemgate::inspect::lists::list(&db.store, &limits, &lists).await.unwrap();
        assert_eq!(page.rows.len(), 1);
        assert_eq!(
            (page.rows[0].biz_id.as_str(), page.rows[0].claimed_at_ms),
            ("SH-POISON", None),
            "still unapplied"
        );

        // Reconcile over the shards: the dead letter is lost, the rest is clean.
        let now = idemgate::clock::now_ms();
        let opts = idemgate::reconcile::ReconcileOptions {
            consumer_group: GROUP.to_owned(),
            biz_type: None,
            since_ms: now - 3_600_000,
            until_ms: now + 1,
            stuck_after_ms: 1_800_000,
            log_retention_ms: 14 * 86_400_000,
            max_per_kind: 1_000,
            instance_id: "test".to_owned(),
            started_by: "command".to_owned(),
        };
        let checks = [idemgate_shop::STOCK_LEDGER_CHECK];
        let report = idemgate::reconcile::reconcile_once(&db.store, &opts, &checks, now).await.unwrap();
        let found: Vec<_> = report.anomalies.iter().map(|a| (a.kind, a.biz_id.as_str())).collect();
        assert_eq!(found, [(idemgate::reconcile::AnomalyKind::Lost, "SH-POISON")]);

        // Archive, 100 days later: every shard is walked, every claim moves once.
        let later = now + 100 * 86_400_000;
        let options = ArchiveOptions {
            dedup_retention_ms: 90 * 86_400_000,
            log_retention_ms: None,
            batch_size: 7,
            pause: Duration::ZERO,
            time_budget: Duration::from_secs(600),
            lease_ttl: Duration::from_secs(60),
            instance_id: "a".to_owned(),
            started_by: StartedBy::Command,
            partition_log: true,
            claim_key_by_biz_id: true,
            fault: Fault::None,
        };
        let run = archive_once(&db.store, &options, later).await.unwrap();
        assert_eq!(run.dedup.rows, 40);
        assert!(run.dedup.batches >= 4, "at least one batch per shard: {}", run.dedup.batches);
        assert_eq!(db.scalar(&CLAIMS_IN_VIEW, &["SH-%"]).await, 0);
        assert_eq!(db.scalar(&ARCHIVED, &["SH-%"]).await, 40);
        assert_eq!(db.scalar(&DISTINCT_ARCHIVED_IDS, &[]).await, 40, "ids of different shards never meet");
        let q = TraceQuery::new("SH-17", SearchBy::BizId, None, None, None).unwrap();
        let Answer::Story { story, .. } = trace(&db.store, &ctx, &q).await.unwrap() else {
            panic!("one story")
        };
        assert_eq!(story.claim.as_ref().map(|c| c.state), Some("archived"));
    }

    pub async fn redis_stops_copies_of_finished_keys_and_names_their_cause(backend: Backend) {
        let db = TestDb::new(backend).await;
        let settings = redis_settings(&shared_redis_url());
        let m = metrics();
        let g = gate(db.store.clone(), identity(GROUP, "a"), vec![], Handlers::new())
            .with_prefilter(prefilter(&settings))
            .with_observer(m.clone());
        shop::seed_stock(&db.store, "SKU-P", 100).await.unwrap();
        let first = g.process(&stock_deduct("D-P", "M-1", "U-1", "SKU-P", 2)).await;
        assert_eq!(first.outcome, Outcome::Processed);
        let report = first.prefilter.expect("the pre-filter covers stock.deduct");
        assert_eq!((report.step, report.settled), (Step::Claimed, Some(Settled::Done)));
        let cases = [
            (stock_deduct("D-P", "M-2", "U-1", "SKU-P", 2), DuplicateCause::ProducerRetry, Some(true)),
            (stock_deduct("D-P", "M-3", "U-2", "SKU-P", 2), DuplicateCause::ProducerResend, Some(true)),
            (stock_deduct("D-P", "M-4", "U-3", "SKU-P", 5), DuplicateCause::ProducerResend, Some(false)),
        ];
        for (d, cause, payload_match) in cases {
            let r = g.process(&d).await;
            assert_eq!(
                (r.outcome, r.verdict, r.layer, r.cause, r.payload_match),
                (Outcome::Duplicate, Verdict::Ack, Some(Layer::Redis), Some(cause), payload_match),
                "{}",
                d.msg_id
            );
            assert_eq!(r.prefilter.map(|p| p.step), Some(Step::Duplicate));
            assert_eq!(r.phases.claim_us, 0, "no database claim for a copy Redis knows");
            assert!(r.logged, "the copy still has its log row");
        }
        assert_eq!(db.scalar(&STOCK_OF, &["SKU-P"]).await, 98);
        assert_eq!(db.scalar(&LOG_ROWS_OF, &["D-P", "duplicate"]).await, 3);
        let text = m.render(None).await;
        let at_redis = sample(&text, "idemgate_conflicts_total", &[("layer", "redis")]);
        assert_eq!(at_redis, 3.0, "conflicts at layer redis");
        assert_eq!(sample(&text, "idemgate_prefilter_total", &[("step", "duplicate")]), 3.0);
        assert_eq!(sample(&text, "idemgate_key_collisions_total", &[]), 1.0);
    }

    pub async fn a_rollback_leaves_no_redis_key_and_the_retry_applies(backend: Backend) {
        let db = TestDb::new(backend).await;
        let settings = redis_settings(&shared_redis_url());
        let failing = Arc::new(AtomicBool::new(true));
        let p = prefilter(&settings);
        let g = flaky_gate(&db, Flaky { failing: failing.clone(), steal: None }).with_prefilter(p.clone());
        let key = p.redis_key(
            GROUP,
            &BizKey {
                biz_type: "test.flaky".into(),
                biz_id: "K-1".into(),
                execute_time: 0,
                handler: "test.flaky".into(),
            },
        );
        let mut r = redis(&settings.url).await;
        let failed = g.process(&flaky_delivery("K-1", "M-1")).await;
        assert_eq!((failed.outcome, failed.verdict), (Outcome::Failed, Verdict::Retry));
        assert_eq!(failed.prefilter.and_then(|p| p.settled), Some(Settled::Released));
        assert_eq!(get(&mut r, &key).await, None, "the rollback took the Redis key away");
        assert_eq!(db.scalar(&LEDGER_ROWS_OF, &["K-1"]).await, 0);
        failing.store(false, Ordering::SeqCst);
        let retried = g.process(&flaky_delivery("K-1", "M-1").retried()).await;
        assert_eq!(retried.outcome, Outcome::Processed, "the retry is not taken for a duplicate");
        assert_eq!(db.scalar(&LEDGER_ROWS_OF, &["K-1"]).await, 1);
        assert!(get(&mut r, &key).await.is_some_and(|v| v.starts_with("done:")));
    }

    pub async fn a_delivery_never_deletes_another_deliverys_redis_key(backend: Backend) {
        let db = TestDb::new(backend).await;
        let settings = redis_settings(&shared_redis_url());
        let p = prefilter(&settings);
        let key = p.redis_key(
            GROUP,
            &BizKey {
                biz_type: "test.flaky".into(),
                biz_id: "K-2".into(),
                execute_time: 0,
                handler: "test.flaky".into(),
            },
        );
        // The handler outlives the key's TTL: another delivery takes the key meanwhile, then
        // this one fails and rolls back.
        let handler = Flaky {
            failing: Arc::new(AtomicBool::new(true)),
            steal: Some((settings.url.clone(), key.clone())),
        };
        let g = flaky_gate(&db, handler).with_prefilter(p.clone());
        let failed = g.process(&flaky_delivery("K-2", "M-1")).await;
        assert_eq!(failed.outcome, Outcome::Failed);
        assert_eq!(failed.prefilter.and_then(|p| p.settled), Some(Settled::NotOwner));
        let mut r = redis(&settings.url).await;
        assert_eq!(
            get(&mut r, &key).await.as_deref(),
            Some("claiming:another-delivery"),
            "left to its owner"
        );

        // The same through the API: a token only settles its own value.
        let k3 = deduct_key("K-3");
        let Check::Owned(token) = p.check(GROUP, &k3).await else { panic!("a fresh key is taken") };
        assert!(matches!(p.check(GROUP, &k3).await, Check::InFlight), "a second look sees it in flight");
        let redis_key = p.redis_key(GROUP, &k3);
        let _: () =
            redis::cmd("SET").arg(&redis_key).arg("claiming:someone-else").query_async(&mut r).await.unwrap();
        assert_eq!(p.settle(token, Settle::Release).await, Settled::NotOwner);
        assert_eq!(get(&mut r, &redis_key).await.as_deref(), Some("claiming:someone-else"));
    }
}

on_every_backend!(
    sixteen_racing_deliveries_apply_once_with_redis_on,
    sixteen_racing_deliveries_apply_once_on_sharded_tables,
    the_layout_is_recorded_once_and_another_n_is_refused,
    trace_archive_and_reconcile_cover_every_shard,
    redis_stops_copies_of_finished_keys_and_names_their_cause,
    a_rollback_leaves_no_redis_key_and_the_retry_applies,
    a_delivery_never_deletes_another_deliverys_redis_key,
);

trait Retried {
    fn retried(self) -> Self;
}

impl Retried for Delivery {
    /// The broker's redelivery of this message: a new msgId, one more reconsume.
    fn retried(mut self) -> Self {
        self.msg_id = format!("{}-retry", self.msg_id);
        self.reconsume_times += 1;
        self
    }
}

/// Runs `deliveries` through `gate` from 4 tasks, calling `between(i)` before delivery `i`
/// (in order: the tasks take deliveries from one queue).
async fn run_stream<F, Fut>(
    gate: Arc<Gate>,
    deliveries: Vec<Delivery>,
    between: F,
) -> Vec<idemgate::gate::Disposition>
where
    F: Fn(usize) -> Fut + Send + Sync + 'static,
    Fut: std::future::Future<Output = ()> + Send,
{
    let queue = Arc::new(tokio::sync::Mutex::new(deliveries.into_iter().enumerate()));
    let between = Arc::new(between);
    let results = Arc::new(tokio::sync::Mutex::new(Vec::new()));
    let tasks: Vec<_> = (0..4)
        .map(|_| {
            let (queue, gate, between, results) =
                (queue.clone(), gate.clone(), between.clone(), results.clone());
            tokio::spawn(async move {
                loop {
                    let next = {
                        let mut q = queue.lock().await;
                        let next = q.next();
                        if let Some((i, _)) = &next {
                            between(*i).await;
                        }
                        next
                    };
                    let Some((i, d)) = next else { break };
                    let r = gate.process(&d).await;
                    results.lock().await.push((i, r));
                }
            })
        })
        .collect();
    for t in tasks {
        t.await.expect("no panic");
    }
    let mut results = std::mem::take(&mut *results.lock().await);
    results.sort_by_key(|(i, _)| *i);
    results.into_iter().map(|(_, r)| r).collect()
}

/// Redis is killed a third of the way through a stream of deliveries and started again at two
/// thirds: every key is applied exactly once, the fallbacks are counted, and the pre-filter
/// takes up its work again by itself.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn redis_stopped_and_restarted_mid_stream_loses_and_doubles_nothing() {
    let db = TestDb::new(Backend::Postgres).await;
    let server = Arc::new(tokio::sync::Mutex::new(RedisServer::start(&[]).await));
    let url = server.lock().await.url();
    let settings = RedisSettings { timeout_ms: 200, cooldown_ms: 100, ..redis_settings(&url) };
    let m = metrics();
    let p = prefilter(&settings);
    let g = Arc::new(
        gate(db.store.clone(), identity(GROUP, "a"), vec![], Handlers::new())
            .with_prefilter(p.clone())
            .with_observer(m.clone()),
    );
    shop::seed_stock(&db.store, "SKU-F", 10_000).await.unwrap();
    let deliveries = spaced(stream("F", 300, "SKU-F"));
    let n = deliveries.len();
    let s = server.clone();
    let results = run_stream(g, deliveries, move |i| {
        let (s, p) = (s.clone(), p.clone());
        async move {
            if i == n / 3 {
                s.lock().await.kill();
            } else if i == 2 * n / 3 {
                s.lock().await.restart().await;
                // The probe finds Redis back by itself.
                let deadline = Instant::now() + Duration::from_secs(5);
                while !p.available() {
                    assert!(Instant::now() < deadline, "the pre-filter did not recover within 5 s");
                    tokio::time::sleep(Duration::from_millis(10)).await;
                }
            } else if i > n / 3 && i < 2 * n / 3 && i % 30 == 0 {
                // Spread the outage over time, so the probe runs while deliveries go on.
                tokio::time::sleep(Duration::from_millis(120)).await;
            }
        }
    })
    .await;
    assert!(
        results.iter().all(|r| r.verdict == Verdict::Ack && r.logged),
        "every delivery acknowledged and logged"
    );
    assert_exactly_once(&db, "F", 300, "SKU-F", 10_000).await;
    let steps = |range: std::ops::Range<usize>, step: Step| {
        results[range].iter().filter(|r| r.prefilter.map(|p| p.step) == Some(step)).count()
    };
    let outage = n / 3 + 4..2 * n / 3;
    assert!(
        steps(outage.clone(), Step::Fallback) >= outage.len() - 4,
        "the outage falls back to the database"
    );
    assert_eq!(steps(outage.clone(), Step::Duplicate), 0);
    let after = 2 * n / 3 + 4..n;
    assert!(steps(after.clone(), Step::Duplicate) > 100, "Redis stops copies again after its restart");
    assert_eq!(steps(after.clone(), Step::Fallback), 0, "recovered by itself");
    let text = m.render(None).await;
    let fallbacks = sample(&text, "idemgate_prefilter_fallbacks_total", &[]);
    let open = sample(&text, "idemgate_prefilter_fallbacks_total", &[("cause", "circuit_open")]);
    // The circuit opens on the first failed command: a delivery's check (counted as its
    // fallback's cause) or the settle of a key owned when Redis went (counted as settled=failed).
    let settles_failed = sample(&text, "idemgate_prefilter_settled_total", &[("result", "failed")]);
    let failed = fallbacks - open + settles_failed;
    assert!(fallbacks >= (outage.len() - 4) as f64, "fallbacks counted: {fallbacks}");
    assert!(
        failed >= 1.0 && failed * 10.0 <= open,
        "the circuit spares most deliveries the failure: {failed} failed commands, {open} skipped"
    );
    assert_eq!(
        sample(
            &text,
            "idemgate_prefilter_fallbacks_total",
            &[("cause", FallbackCause::CircuitOpen.as_str())]
        ),
        open
    );
    // The duplicates the database stopped during the outage are still duplicates.
    assert_eq!(sample(&text, "idemgate_deliveries_total", &[("outcome", "duplicate")]), 600.0);
}

/// Redis stops answering for two seconds (`DEBUG SLEEP`): each delivery waits at most the
/// pre-filter's timeout, the circuit keeps the rest from waiting at all, and the effects stay
/// exactly-once.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_slow_redis_keeps_delivery_latency_bounded() {
    let db = TestDb::new(Backend::Postgres).await;
    let server = RedisServer::start(&["--enable-debug-command", "yes"]).await;
    let settings = RedisSettings { timeout_ms: 5, cooldown_ms: 100, ..redis_settings(&server.url()) };
    let g = Arc::new(
        gate(db.store.clone(), identity(GROUP, "a"), vec![], Handlers::new())
            .with_prefilter(prefilter(&settings)),
    );
    shop::seed_stock(&db.store, "SKU-SLOW", 10_000).await.unwrap();
    // Warm: the pool and Redis connection are open before the clock starts.
    for d in stream("WARM", 5, "SKU-SLOW") {
        g.process(&d).await;
    }
    let mut sleeper = redis(&server.url()).await;
    let sleeping = tokio::spawn(async move {
        let _: Result<(), _> = redis::cmd("DEBUG").arg("SLEEP").arg(2).query_async(&mut sleeper).await;
    });
    tokio::time::sleep(Duration::from_millis(100)).await;
    let started = Instant::now();
    let (mut worst, mut worst_redis) = (Duration::ZERO, Duration::ZERO);
    let mut causes = Vec::new();
    for d in stream("SLOW", 60, "SKU-SLOW") {
        let r = g.process(&d).await;
        assert_eq!(r.verdict, Verdict::Ack);
        worst = worst.max(r.latency);
        worst_redis = worst_redis.max(Duration::from_micros(r.phases.redis_us));
        causes.extend(r.prefilter.and_then(|p| p.fallback));
    }
    let elapsed = started.elapsed();
    sleeping.await.unwrap();
    // The time spent on Redis is the pre-filter's to bound: its 5 ms timeout, plus what a busy
    // machine adds to a timer. The whole delivery (which also waits on the database) stays far
    // below Redis's 2 s.
    assert!(worst_redis < Duration::from_millis(100), "worst wait on Redis {worst_redis:?}");
    assert!(worst < Duration::from_secs(1), "worst delivery latency {worst:?} (the stream took {elapsed:?})");
    assert!(causes.contains(&FallbackCause::Timeout), "{causes:?}");
    assert!(
        causes.iter().filter(|c| **c == FallbackCause::CircuitOpen).count() > causes.len() / 2,
        "{causes:?}"
    );
    assert_exactly_once(&db, "SLOW", 60, "SKU-SLOW", 10_000 - 5).await;
}

/// A Redis that is down when the gate starts only means fallbacks; nothing fails.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_gate_starts_and_works_while_redis_is_down() {
    let db = TestDb::new(Backend::Sqlite).await;
    let mut server = RedisServer::start(&[]).await;
    let url = server.url();
    server.kill();
    let settings = redis_settings(&url);
    let g = gate(db.store.clone(), identity(GROUP, "a"), vec![], Handlers::new())
        .with_prefilter(prefilter(&settings));
    shop::seed_stock(&db.store, "SKU-D", 10).await.unwrap();
    let r = g.process(&stock_deduct("D-D", "M-1", "U-1", "SKU-D", 1)).await;
    assert_eq!(r.outcome, Outcome::Processed);
    assert_eq!(r.prefilter.map(|p| p.step), Some(Step::Fallback));
    let again = g.process(&stock_deduct("D-D", "M-2", "U-1", "SKU-D", 1)).await;
    assert_eq!((again.outcome, again.layer), (Outcome::Duplicate, Some(Layer::Db)), "the database stops it");
}

on_every_backend_with_group_commit!(
    sixteen_racing_deliveries_apply_once_with_redis_on,
    sixteen_racing_deliveries_apply_once_on_sharded_tables,
    redis_stops_copies_of_finished_keys_and_names_their_cause,
    a_rollback_leaves_no_redis_key_and_the_retry_applies,
    a_delivery_never_deletes_another_deliverys_redis_key,
);
