//! `idemgate-bench gate`: processed messages per second for a stream of `stock.deduct`
//! deliveries with a share of duplicates, through the gate and through the naive per-message
//! pattern of the seeds, on each backend, at one and at several deliveries in flight.
//!
//! The naive pattern, as users write it: in one transaction per message, SELECT the dedup row;
//! if absent INSERT it, apply the business change, commit. It uses the same table (with its
//! unique index) so that the only difference is the pattern. Under concurrency its SELECT
//! sees nothing for two copies at once, and the second INSERT fails: the consumer throws and
//! the broker redelivers. The gate's insert-first claim waits for the first copy instead and
//! answers "duplicate".

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use async_trait::async_trait;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use sqlx::Row;
use tokio::sync::Mutex;

use super::{Percentiles, peak_rss_mib, rate};
use idemgate::delivery::Delivery;
use idemgate::gate::{Committer, Disposition, Gate, GroupRunner, GroupSettings, Identity, Phases, Policy};
use idemgate::handler::{Handler, Work};
use idemgate::outcome::{Outcome, Verdict};
use idemgate::route::Routes;
use idemgate::store::{Backend, Sql, Store, StoreOptions};
use idemgate_shop::{self as shop, DeductStock, StockDeduct};
use idemgate_testkit::scratch::ScratchDb;

/// What to measure: the flags of `idemgate-bench gate`.
#[derive(Debug, Clone, clap::Args)]
pub struct Options {
    /// Backends to measure (sqlite, postgres, mysql); the servers' admin URLs come from
    /// IDEMGATE_TEST_POSTGRES_URL and IDEMGATE_TEST_MYSQL_URL or the local defaults.
    #[arg(long, value_delimiter = ',', default_value = "sqlite,postgres,mysql")]
    pub backends: Vec<Backend>,
    #[arg(long, default_value_t = 4000)]
    pub messages: usize,
    // The share of the stream that repeats an earlier message.
    #[arg(long, default_value_t = 0.3)]
    pub duplicates: f64,
    /// Deliveries in flight; one run per value.
    #[arg(long, value_delimiter = ',', default_value = "1,8")]
    pub concurrency: Vec<usize>,
    /// Deliveries per transaction of the group-commit pattern (1 to 64).
    #[arg(long, default_value_t = 32)]
    pub max_batch: usize,
    /// Groups committing at once in the group-commit pattern.
    #[arg(long, default_value_t = 2)]
    pub in_flight: usize,
}

impl Options {
    /// The group commit of the group-commit pattern, on: `max_batch` brought into 1 to
    /// [`MAX_BATCH`](idemgate::gate::MAX_BATCH), at least one group in flight.
    pub fn group(&self) -> GroupSettings {
        GroupSettings {
            enabled: true,
            max_batch: self.max_batch.clamp(1, idemgate::gate::MAX_BATCH),
            in_flight: self.in_flight.max(1),
            ..Default::default()
        }
    }
}

/// `idemgate-bench gate`: prints the setting, runs every backend, pattern and concurrency,
/// and prints the table of rates and the one of where the gate's time goes.
pub(crate) async fn command(options: Options) -> anyhow::Result<()> {
    println!(
        "bench gate: {} stock.deduct messages, {:.0}% duplicates, {} cores",
        options.messages,
        options.duplicates * 100.0,
        super::cores()
    );
    let reports = run(&options, |r| {
        eprintln!("  {} {} x{}: {:.0} msg/s", r.backend, r.pattern, r.concurrency, r.rate());
    })
    .await?;
    println!("\n{}", table(&reports));
    println!("Where the gate's time goes (mean per message):\n\n{}", phase_table(&reports));
    Ok(())
}

/// One pattern's run.
#[derive(Debug, Clone)]
pub(crate) struct RunReport {
    pub backend: Backend,
    pub pattern: &'static str,
    pub concurrency: usize,
    pub messages: usize,
    pub elapsed: Duration,
    pub latency: Percentiles,
    /// Effects applied (ledger rows) and keys applied more than once.
    pub applied: i64,
    pub double_applied: i64,
    /// Deliveries that ended in an error the broker would have to redeliver.
    pub errors: usize,
    /// For the gate: mean time per message in each phase.
    pub phases: Option<Phases>,
    pub peak_rss_mib: f64,
}

impl RunReport {
    pub(crate) fn rate(&self) -> f64 {
        rate(self.messages, self.elapsed)
    }
}

pub(crate) const GROUP: &str = "bench_group";
/// Deductions spread over this many SKUs, so that the runs measure the pattern rather than
/// the row lock of one hot SKU.
const SKUS: usize = 16;

/// A stream of `stock.deduct` deliveries in which `duplicates` of the messages repeat one of
/// the last 16 (so that, with several in flight, copies race each other): half as broker
/// redeliveries, half as producer resends. Returns the stream and the number of distinct keys.
pub(crate) fn stream(messages: usize, duplicates: f64, seed: u64) -> (Vec<Delivery>, usize) {
    let mut rng = StdRng::seed_from_u64(seed);
    let mut out: Vec<Delivery> = Vec::with_capacity(messages);
    let mut originals: Vec<usize> = Vec::new();
    for i in 0..messages {
        let d = if !originals.is_empty() && rng.random_bool(duplicates) {
            let window = originals.len().min(16);
            let pick = originals[originals.len() - 1 - rng.random_range(0..window)];
            let mut copy = out[pick].clone();
            copy.msg_id = format!("M-{i}");
            if rng.random_bool(0.5) {
                copy.uniq_key = uniq_key(i);
            }
            copy
        } else {
            originals.push(i);
            Delivery {
                msg_id: format!("M-{i}"),
                uniq_key: uniq_key(i),
                topic: shop::TOPIC.to_owned(),
                tags: shop::TAG_STOCK_DEDUCT.to_owned(),
                keys: vec![format!("DEDUCT-{i}")],
                body: serde_json::to_vec(&DeductStock { sku: sku(i % SKUS), quantity: 1 })
                    .expect("serializable"),
                ..Default::default()
            }
        };
        out.push(d);
    }
    let distinct = originals.len();
    (out, distinct)
}

/// The i-th message's UNIQ_KEY, in RocketMQ's 32-hex-digit form.
fn uniq_key(i: usize) -> String {
    format!("{i:032X}")
}

/// Runs every backend, pattern and concurrency; calls `report` after each run.
pub(crate) async fn run(
    options: &Options,
    mut report: impl FnMut(&RunReport),
) -> anyhow::Result<Vec<RunReport>> {
    let (stream, distinct) = stream(options.messages, options.duplicates, 42);
    let stream = Arc::new(stream);
    let max_c = options.concurrency.iter().copied().max().unwrap_or(1);
    let store_options = StoreOptions { max_connections: (max_c as u32) + 2, ..Default::default() };
    let mut all = Vec::new();
    for &backend in &options.backends {
        let db = ScratchDb::create(backend, &store_options).await?;
        let gate = Arc::new(Gate::new(
            db.store.clone(),
            Routes::new(&shop::routes(shop::TOPIC))?,
            shop::handlers(),
            Identity { consumer_group: GROUP.to_owned(), instance_id: "bench".to_owned() },
            Policy { duplicate_warnings_per_second: 0, ..Policy::default() },
        )?);
        let grouped = |batch: bool, defer: bool| -> anyhow::Result<Arc<Gate>> {
            let gate = Gate::new(
                db.store.clone(),
                Routes::new(&shop::routes(shop::TOPIC))?,
                shop::handlers(),
                Identity { consumer_group: GROUP.to_owned(), instance_id: "bench".to_owned() },
                Policy { duplicate_warnings_per_second: 0, ..Policy::default() },
            )?
            .with_group_commit(GroupSettings { batch, ..options.group() });
            Ok(Arc::new(if defer { gate } else { gate.without_key_deferral() }))
        };
        let (per_delivery, batched, undeferred) =
            (grouped(false, true)?, grouped(true, true)?, grouped(true, false)?);
        let alone = Arc::new(HandlerAlone::committer(db.store.clone(), shop::TOPIC, &options.group())?);
        for &concurrency in &options.concurrency {
            for pattern in Pattern::ALL {
                reset(&db.store).await?;
                let gate = match pattern {
                    Pattern::GroupCommitPerDelivery => &per_delivery,
                    Pattern::GroupCommit => &batched,
                    Pattern::GroupCommitUndeferred => &undeferred,
                    Pattern::Naive | Pattern::Gate | Pattern::HandlerAlone => &gate,
                };
                let r = run_one(gate, &alone, &db.store, pattern, &stream, concurrency).await?;
                let (applied, double_applied) = books(&db.store).await?;
                let r = RunReport {
                    backend,
                    pattern: pattern.name(),
                    concurrency,
                    messages: stream.len(),
                    elapsed: r.elapsed,
                    latency: r.latency,
                    applied,
                    double_applied,
                    errors: r.errors,
                    phases: r.phases,
                    peak_rss_mib: peak_rss_mib(),
                };
                let guarded = !matches!(pattern, Pattern::Naive | Pattern::HandlerAlone);
                if guarded && (applied != distinct as i64 || double_applied != 0) {
                    anyhow::bail!(
                        "the gate applied {applied} effects for {distinct} keys ({double_applied} twice) on {backend}"
                    );
                }
                report(&r);
                all.push(r);
            }
        }
        db.drop_now().await;
    }
    Ok(all)
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Pattern {
    Naive,
    Gate,
    /// Group commit with `batch = false`: a savepoint per delivery.
    GroupCommitPerDelivery,
    /// Group commit on the batch path.
    GroupCommit,
    /// The batch path with a key allowed in two groups in flight at once.
    GroupCommitUndeferred,
    HandlerAlone,
}

impl Pattern {
    const ALL: [Pattern; 6] = [
        Self::Naive,
        Self::Gate,
        Self::GroupCommitPerDelivery,
        Self::GroupCommitUndeferred,
        Self::GroupCommit,
        Self::HandlerAlone,
    ];

    fn name(self) -> &'static str {
        match self {
            Self::Naive => "naive select-then-insert",
            Self::Gate => "idemgate",
            Self::GroupCommitPerDelivery => GROUP_COMMIT_PER_DELIVERY,
            Self::GroupCommit => GROUP_COMMIT_BATCHED,
            Self::GroupCommitUndeferred => GROUP_COMMIT_UNDEFERRED,
            Self::HandlerAlone => HANDLER_ALONE,
        }
    }
}

pub(crate) const GROUP_COMMIT_PER_DELIVERY: &str = "idemgate, group commit, a savepoint per delivery";
pub(crate) const GROUP_COMMIT_BATCHED: &str = "idemgate, group commit, batch path";
pub(crate) const GROUP_COMMIT_UNDEFERRED: &str =
    "idemgate, group commit, batch path, a key in two groups in flight";
pub(crate) const HANDLER_ALONE: &str = "handler alone, same batching, no claim, no log (unsafe)";

struct Timing {
    elapsed: Duration,
    latency: Percentiles,
    errors: usize,
    phases: Option<Phases>,
}

async fn run_one(
    gate: &Arc<Gate>,
    alone: &Arc<Committer>,
    store: &Store,
    pattern: Pattern,
    stream: &Arc<Vec<Delivery>>,
    concurrency: usize,
) -> anyhow::Result<Timing> {
    let next = Arc::new(AtomicUsize::new(0));
    let totals = Arc::new(Mutex::new((Vec::with_capacity(stream.len()), 0usize, Phases::default())));
    let started = Instant::now();
    let mut workers = Vec::new();
    for _ in 0..concurrency {
        let (gate, alone, store, stream, next, totals) =
            (gate.clone(), alone.clone(), store.clone(), stream.clone(), next.clone(), totals.clone());
        workers.push(tokio::spawn(async move {
            let (mut latencies, mut errors, mut phases) = (Vec::new(), 0usize, Phases::default());
            loop {
                let i = next.fetch_add(1, Ordering::Relaxed);
                let Some(d) = stream.get(i) else { break };
                let t = Instant::now();
                let ok = match pattern {
                    Pattern::Gate
                    | Pattern::GroupCommitPerDelivery
                    | Pattern::GroupCommit
                    | Pattern::GroupCommitUndeferred => {
                        let r = gate.process(d).await;
                        phases.add(&r.phases.per_delivery());
                        matches!(r.outcome, Outcome::Processed | Outcome::Duplicate)
                    }
                    Pattern::HandlerAlone => {
                        let due = t + Policy::default().delivery_timeout;
                        alone.submit(d.clone(), due).await.verdict == Verdict::Ack
                    }
                    Pattern::Naive => naive(&store, d).await.is_ok(),
                };
                latencies.push(t.elapsed().as_micros() as u64);
                errors += usize::from(!ok);
            }
            let mut totals = totals.lock().await;
            totals.0.extend(latencies);
            totals.1 += errors;
            totals.2.add(&phases);
        }));
    }
    for w in workers {
        w.await?;
    }
    let elapsed = started.elapsed();
    let mut totals = totals.lock().await;
    let n = stream.len() as u64;
    let profiled = !matches!(pattern, Pattern::Naive | Pattern::HandlerAlone);
    let phases = profiled.then(|| totals.2.mean_over(n));
    Ok(Timing { elapsed, latency: Percentiles::of(&mut totals.0), errors: totals.1, phases })
}

static NAIVE_CHECK: Sql = Sql::new(
    "SELECT 1 FROM idempotent_record WHERE consumer_group = ? AND biz_type = ? AND biz_id = ? AND execute_time = 0",
);
static NAIVE_INSERT: Sql = Sql::new(
    "INSERT INTO idempotent_record (consumer_group, biz_type, biz_id, execute_time, msg_id, uniq_key, \
     payload_hash, instance_id, claimed_at_ms) VALUES (?, ?, ?, 0, ?, ?, ?, 'bench', ?)",
);
static DEDUCT: Sql =
    Sql::new("UPDATE shop_stock SET quantity = quantity - ? WHERE sku = ? AND quantity >= ?");
static LEDGER: Sql = Sql::new(
    "INSERT INTO shop_stock_ledger (deduction_id, sku, quantity, applied_at_ms) VALUES (?, ?, ?, ?)",
);

/// The seeds' naive per-message pattern: select, then insert, then business, one transaction.
pub(crate) async fn naive(store: &Store, d: &Delivery) -> Result<(), sqlx::Error> {
    let biz_id = d.keys.first().map(String::as_str).unwrap_or("");
    let body: DeductStock = serde_json::from_slice(&d.body).map_err(|e| sqlx::Error::Decode(e.into()))?;
    let now = idemgate::clock::now_ms();
    let mut tx = store.begin().await?;
    let seen = store
        .query(&NAIVE_CHECK)
        .bind(GROUP)
        .bind(shop::STOCK_DEDUCT)
        .bind(biz_id)
        .fetch_optional(&mut *tx)
        .await?;
    if seen.is_some() {
        return tx.commit().await;
    }
    store
        .query(&NAIVE_INSERT)
        .bind(GROUP)
        .bind(shop::STOCK_DEDUCT)
        .bind(biz_id)
        .bind(d.msg_id.as_str())
        .bind(d.uniq_key.as_str())
        .bind(d.payload_hash())
        .bind(now)
        .execute(&mut *tx)
        .await?;
    deduct(store, &mut tx, biz_id, &body, now).await?;
    tx.commit().await
}

/// The deduction itself, as a user's consumer writes it: take the stock, write the ledger row.
pub(crate) async fn deduct(
    store: &Store,
    conn: &mut idemgate::store::Conn,
    biz_id: &str,
    body: &DeductStock,
    now: i64,
) -> Result<(), sqlx::Error> {
    store
        .query(&DEDUCT)
        .bind(body.quantity)
        .bind(body.sku.as_str())
        .bind(body.quantity)
        .execute(&mut *conn)
        .await?;
    store
        .query(&LEDGER)
        .bind(biz_id.to_owned())
        .bind(body.sku.as_str())
        .bind(body.quantity)
        .bind(now)
        .execute(&mut *conn)
        .await?;
    Ok(())
}

/// The "handler alone" baseline: each group of deliveries through `stock.deduct`'s batch form
/// in one transaction, with no claim, no log row and no dedup. Unsafe (every copy applies its
/// deduction again), and the ceiling of this handler under the same batching as group commit:
/// the same committer takes the deliveries off the same queue in groups of the same size.
pub(crate) struct HandlerAlone {
    store: Store,
    routes: Routes,
}

impl HandlerAlone {
    /// The committer that batches deliveries of `topic` for the handler alone, as group commit
    /// would.
    pub(crate) fn committer(
        store: Store,
        topic: &str,
        settings: &GroupSettings,
    ) -> anyhow::Result<Committer> {
        let routes = Routes::new(&shop::routes(topic))?;
        let faults = tokio::sync::watch::Sender::new(None);
        Ok(Committer::start_with(Arc::new(Self { store, routes }), None, settings, faults))
    }

    async fn apply(&self, deliveries: &[Delivery]) -> anyhow::Result<()> {
        let backend = self.store.backend();
        let now_ms = idemgate::clock::now_ms();
        let keys = deliveries.iter().map(|d| self.routes.resolve(d).map_err(|r| anyhow::anyhow!(r.reason)));
        let keys = keys.collect::<anyhow::Result<Vec<_>>>()?;
        let mut works: Vec<Work<'_>> = deliveries
            .iter()
            .zip(&keys)
            .map(|(delivery, key)| Work { delivery, key, backend, now_ms })
            .collect();
        // In lock order, as the gate hands them over.
        works.sort_by_key(|w| StockDeduct.lock_order(w));
        let mut tx = self.store.begin().await?;
        StockDeduct.handle_batch(&works, &mut tx).await?;
        tx.commit().await?;
        Ok(())
    }
}

#[async_trait]
impl GroupRunner for HandlerAlone {
    async fn run_group(&self, deliveries: &[Delivery], _due: std::time::Instant) -> Vec<Disposition> {
        let verdict = match self.apply(deliveries).await {
            Ok(()) => Verdict::Ack,
            Err(e) => {
                tracing::warn!(error = %e, "the handler alone could not apply a group");
                Verdict::Retry
            }
        };
        let outcome = if verdict == Verdict::Ack { Outcome::Processed } else { Outcome::Failed };
        let group_size = u32::try_from(deliveries.len()).unwrap_or(u32::MAX);
        deliveries
            .iter()
            .map(|_| Disposition {
                outcome,
                verdict,
                key: None,
                cause: None,
                layer: None,
                payload_match: None,
                error: None,
                latency: Duration::ZERO,
                logged: false,
                phases: Phases { group_size, ..Phases::default() },
                prefilter: None,
            })
            .collect()
    }
}

static CLEAR: [Sql; 3] = [
    Sql::new("DELETE FROM idempotent_record"),
    Sql::new("DELETE FROM delivery_log"),
    Sql::new("DELETE FROM shop_stock_ledger"),
];
static APPLIED: Sql = Sql::new("SELECT COUNT(*) FROM shop_stock_ledger");
static TWICE: Sql = Sql::new(
    "SELECT COUNT(*) FROM (SELECT deduction_id FROM shop_stock_ledger GROUP BY deduction_id HAVING COUNT(*) > 1) t",
);

pub(crate) async fn reset(store: &Store) -> Result<(), sqlx::Error> {
    for sql in &CLEAR {
        store.query(sql).execute(store.pool()).await?;
    }
    seed(store).await
}

/// Stock the stream's SKUs with more than any run deducts, so that every deduction applies.
pub(crate) async fn seed(store: &Store) -> Result<(), sqlx::Error> {
    for i in 0..SKUS {
        shop::seed_stock(store, &sku(i), i64::MAX / 2).await?;
    }
    Ok(())
}

fn sku(i: usize) -> String {
    format!("SKU-BENCH-{i:02}")
}

pub(crate) async fn books(store: &Store) -> Result<(i64, i64), sqlx::Error> {
    let applied = store.query(&APPLIED).fetch_one(store.pool()).await?.try_get(0)?;
    let twice = store.query(&TWICE).fetch_one(store.pool()).await?.try_get(0)?;
    Ok((applied, twice))
}

/// The runs as a Markdown table.
pub(crate) fn table(reports: &[RunReport]) -> String {
    // Each run beside the naive pattern and the handler alone of the same backend and load.
    let beside = |r: &RunReport, pattern: Pattern| {
        reports
            .iter()
            .find(|o| o.backend == r.backend && o.concurrency == r.concurrency && o.pattern == pattern.name())
            .map_or(String::new(), |o| format!("{:.2}", r.rate() / o.rate()))
    };
    let mut out = String::from(
        "| backend | in flight | pattern | msg/s | × naive | × handler alone | p50 ms | p99 ms | effects | applied twice | errors (redeliveries) | peak RSS MiB |\n\
         |---|---|---|---|---|---|---|---|---|---|---|---|\n",
    );
    for r in reports {
        out.push_str(&format!(
            "| {} | {} | {} | {:.0} | {} | {} | {:.2} | {:.2} | {} | {} | {} | {:.0} |\n",
            r.backend,
            r.concurrency,
            r.pattern,
            r.rate(),
            beside(r, Pattern::Naive),
            beside(r, Pattern::HandlerAlone),
            r.latency.p50_us as f64 / 1000.0,
            r.latency.p99_us as f64 / 1000.0,
            r.applied,
            r.double_applied,
            r.errors,
            r.peak_rss_mib
        ));
    }
    out
}

/// Where the gate's time goes, per message, as a Markdown table.
pub(crate) fn phase_table(reports: &[RunReport]) -> String {
    let mut out = String::from(
        "| backend | in flight | pattern | begin µs | claim µs | handler µs | log µs | commit µs | duplicate lookup µs | transient retries |\n\
         |---|---|---|---|---|---|---|---|---|---|\n",
    );
    for r in reports {
        if let Some(p) = r.phases {
            out.push_str(&format!(
                "| {} | {} | {} | {} | {} | {} | {} | {} | {} | {} |\n",
                r.backend,
                r.concurrency,
                r.pattern,
                p.begin_us,
                p.claim_us,
                p.handler_us,
                p.log_us,
                p.commit_us,
                p.lookup_us,
                p.transient_retries
            ));
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_stream_has_the_asked_share_of_duplicates_close_to_their_originals() {
        let (s, distinct) = stream(10_000, 0.3, 1);
        let dup_share = 1.0 - distinct as f64 / s.len() as f64;
        assert!((0.28..0.32).contains(&dup_share), "{dup_share}");
        let own = |d: &Delivery| uniq_key(d.msg_id[2..].parse().unwrap());
        let is_copy = |d: &Delivery| d.keys[0] != format!("DEDUCT-{}", &d.msg_id[2..]);
        let redeliveries = s.iter().filter(|d| is_copy(d) && d.uniq_key != own(d)).count();
        let resends = s.iter().filter(|d| is_copy(d) && d.uniq_key == own(d)).count();
        assert!(redeliveries > 1000 && resends > 1000, "{redeliveries} {resends}");
    }
}
