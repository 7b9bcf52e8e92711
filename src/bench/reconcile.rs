//! `idemgate bench reconcile`: how long a reconcile run takes over a 24-hour window of
//! 1,000,000 deliveries, against the naive way.
//!
//! On a scratch PostgreSQL database: load 333,334 claims with three deliveries each (a failed
//! attempt, the processed delivery, a producer-resend duplicate) over the last 24 hours, plus a
//! few planted anomalies, then time [`reconcile_once`] over the window and check that it finds
//! exactly the planted ones. The naive way is the script a team writes without idemgate: read
//! every delivery of the window into the process, group them by key in a hash map, and ask the
//! dedup table about each key that looks wrong.

use std::collections::HashMap;
use std::time::{Duration, Instant};

use sqlx::Row;

use super::trace::{GROUP, load};
use super::{peak_rss_mib, rss_mib};
use crate::reconcile::{AnomalyKind, ReconcileOptions, STOCK_LEDGER_CHECK, reconcile_once};
use crate::scratch::ScratchDb;
use crate::store::{Backend, Sql, Store, StoreOptions};

const HOUR_MS: i64 = 3_600_000;

/// One backend's figures.
#[derive(Debug, Clone)]
pub struct Report {
    pub backend: Backend,
    pub deliveries: i64,
    pub load: Duration,
    pub reconcile: Duration,
    pub found: usize,
    pub rss_before_mib: f64,
    pub rss_after_reconcile_mib: f64,
    pub naive: Duration,
    pub naive_found: usize,
    pub rss_after_naive_mib: f64,
    pub peak_rss_mib: f64,
}

static PLANT_FAILED: Sql = Sql::new(
    "INSERT INTO delivery_log (logged_at_ms, instance_id, consumer_group, msg_id, uniq_key, topic, tags, queue_id, \
     queue_offset, reconsume_times, biz_type, biz_id, execute_time, outcome, latency_us) \
     VALUES (?, 'bench', ?, ?, '', 'shop', 'stock_deduct', 0, 0, ?, 'stock.deduct', ?, 0, ?, 900)",
);
static NAIVE_ALL: Sql = Sql::new(
    "SELECT biz_type, biz_id, execute_time, outcome, payload_match FROM delivery_log \
     WHERE consumer_group = ? AND logged_at_ms >= ? AND logged_at_ms < ?",
);
static NAIVE_CLAIM: Sql = Sql::new(
    "SELECT 1 FROM idempotent_record WHERE consumer_group = ? AND biz_type = ? AND biz_id = ? AND execute_time = ?",
);

/// Runs the benchmark with `claims` keys (three deliveries each) on PostgreSQL.
pub async fn run(claims: usize) -> anyhow::Result<Report> {
    anyhow::ensure!((1..=1_000_000).contains(&claims), "--claims must be from 1 to 1000000");
    let scratch =
        ScratchDb::create(Backend::Postgres, &StoreOptions { max_connections: 4, ..Default::default() })
            .await?;
    let result = measure(&scratch.store, claims).await;
    scratch.drop_now().await;
    result
}

async fn measure(store: &Store, claims: usize) -> anyhow::Result<Report> {
    let started = Instant::now();
    load(store, claims, 24 * HOUR_MS - 60_000).await?;
    // Plant anomalies: 5 lost keys (dead-lettered, never claimed) and 5 double-applied ones.
    let now = crate::gate::now_ms();
    for i in 0..5 {
        let lost = format!("LOST-{i}");
        for (n, outcome) in ["failed", "failed", "dead_lettered"].into_iter().enumerate() {
            plant(store, now - HOUR_MS, &format!("{lost}-{n}"), n as i32, &lost, outcome).await?;
        }
        plant(store, now - HOUR_MS, &format!("TWICE-{i}-x"), 0, &format!("T-{i}"), "processed").await?;
    }
    let deliveries: i64 = store.query(&COUNT).fetch_one(store.pool()).await?.get(0);
    let load = started.elapsed();

    let options = ReconcileOptions {
        consumer_group: GROUP.to_owned(),
        biz_type: None,
        since_ms: now - 24 * HOUR_MS,
        until_ms: now + 1,
        stuck_after_ms: HOUR_MS / 2,
        log_retention_ms: 14 * 24 * HOUR_MS,
        max_per_kind: 1_000,
        instance_id: "bench".to_owned(),
        started_by: "command".to_owned(),
    };
    let rss_before_mib = rss_mib();
    let t = Instant::now();
    let report = reconcile_once(store, &options, &[STOCK_LEDGER_CHECK], now).await?;
    let reconcile = t.elapsed();
    let rss_after_reconcile_mib = rss_mib();
    let lost = report.counts[&AnomalyKind::Lost];
    let twice = report.counts[&AnomalyKind::DoubleApplied];
    anyhow::ensure!(
        lost == 5 && twice == 5 && report.anomalies.len() == 10,
        "reconcile found {:?}, expected 5 lost and 5 double_applied",
        report.counts
    );

    let t = Instant::now();
    let naive_found = naive(store, options.since_ms, options.until_ms).await?;
    let naive = t.elapsed();
    Ok(Report {
        backend: Backend::Postgres,
        deliveries,
        load,
        reconcile,
        found: report.anomalies.len(),
        rss_before_mib,
        rss_after_reconcile_mib,
        naive,
        naive_found,
        rss_after_naive_mib: rss_mib(),
        peak_rss_mib: peak_rss_mib(),
    })
}

static COUNT: Sql = Sql::new("SELECT COUNT(*) FROM delivery_log");

async fn plant(
    store: &Store,
    at: i64,
    msg_id: &str,
    reconsume: i32,
    biz_id: &str,
    outcome: &str,
) -> Result<(), sqlx::Error> {
    store
        .query(&PLANT_FAILED)
        .bind(at)
        .bind(GROUP)
        .bind(msg_id)
        .bind(reconsume)
        .bind(biz_id)
        .bind(outcome)
        .execute(store.pool())
        .await?;
    Ok(())
}

/// The script: every delivery of the window into a map by key; then, for each key that was
/// processed twice or dead-lettered and never processed, one query for its claim.
async fn naive(store: &Store, since: i64, until: i64) -> Result<usize, sqlx::Error> {
    #[derive(Default)]
    struct Seen {
        processed: u32,
        dead: u32,
    }
    let rows = store.query(&NAIVE_ALL).bind(GROUP).bind(since).bind(until).fetch_all(store.pool()).await?;
    let mut keys: HashMap<(String, String, i64), Seen> = HashMap::new();
    for r in &rows {
        let key = (r.try_get::<String, _>(0)?, r.try_get::<String, _>(1)?, r.try_get::<i64, _>(2)?);
        let seen = keys.entry(key).or_default();
        match r.try_get::<String, _>(3)?.as_str() {
            "processed" => seen.processed += 1,
            "dead_lettered" => seen.dead += 1,
            _ => {}
        }
    }
    let mut found = 0;
    for ((biz_type, biz_id, execute_time), seen) in &keys {
        if seen.processed > 1 {
            found += 1;
        } else if seen.dead > 0 && seen.processed == 0 {
            let claimed = store
                .query(&NAIVE_CLAIM)
                .bind(GROUP)
                .bind(biz_type.as_str())
                .bind(biz_id.as_str())
                .bind(*execute_time)
                .fetch_optional(store.pool())
                .await?;
            found += usize::from(claimed.is_none());
        }
    }
    Ok(found)
}

/// The figures as a Markdown table.
pub fn table(r: &Report) -> String {
    format!(
        "| backend | deliveries in the window | load s | idemgate reconcile s | anomalies | RSS before / after MiB | naive script s | its anomalies | RSS after MiB | peak RSS MiB |\n\
         |---|---|---|---|---|---|---|---|---|---|\n\
         | {} | {} | {:.0} | {:.2} | {} | {:.0} / {:.0} | {:.2} | {} | {:.0} | {:.0} |\n",
        r.backend,
        r.deliveries,
        r.load.as_secs_f64(),
        r.reconcile.as_secs_f64(),
        r.found,
        r.rss_before_mib,
        r.rss_after_reconcile_mib,
        r.naive.as_secs_f64(),
        r.naive_found,
        r.rss_after_naive_mib,
        r.peak_rss_mib,
    )
}
