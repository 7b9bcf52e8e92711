//! `idemgate-bench galera`: what a three-node MariaDB Galera cluster does to the gate's
//! throughput. On a private cluster ([`LocalGalera`]), the `stock.deduct` stream of
//! `bench gate` (each copy of a message close behind its original, so that copies race) is
//! consumed three ways: one consumer on node 1; three consumers all on node 1 (more consumers,
//! one server); and one consumer on each node (the same three consumers, three servers). For
//! each: msg/s, p99, and the certification retries each node's consumer made, with the conflict
//! rate (retries per delivery). The books are checked after every run: every key applied once.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use tokio::sync::Mutex;

use super::gate::{books, reset, stream};
use super::{Percentiles, rate};
use idemgate::delivery::Delivery;
use idemgate::gate::{Disposition, Gate, Identity, Observer, Policy};
use idemgate::outcome::Outcome;
use idemgate::route::Routes;
use idemgate::store::{Backend, Retries, Store, StoreOptions, TransientCause};
use idemgate_shop as shop;
use idemgate_testkit::galera::{LocalGalera, NODES};
use idemgate_testkit::scratch::ScratchDb;

/// What to measure: the flags of `idemgate-bench galera`.
#[derive(Debug, Clone, clap::Args)]
pub struct Options {
    #[arg(long, default_value_t = 3000)]
    pub messages: usize,
    /// Shares of the stream that repeat an earlier message; one run of each layout per value.
    #[arg(long, value_delimiter = ',', default_value = "0.3,0.9")]
    pub duplicates: Vec<f64>,
    /// Deliveries in flight per consumer.
    #[arg(long, default_value_t = 4)]
    pub in_flight: usize,
}

/// Where the consumers run.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Layout {
    OneConsumer,
    ThreeConsumersOneNode,
    OneConsumerPerNode,
}

impl Layout {
    const ALL: [Layout; 3] = [Self::OneConsumer, Self::ThreeConsumersOneNode, Self::OneConsumerPerNode];

    /// The node of each consumer (0-based).
    fn nodes(self) -> Vec<usize> {
        match self {
            Self::OneConsumer => vec![0],
            Self::ThreeConsumersOneNode => vec![0; NODES],
            Self::OneConsumerPerNode => (0..NODES).collect(),
        }
    }

    fn name(self) -> &'static str {
        match self {
            Self::OneConsumer => "1 consumer on node 1",
            Self::ThreeConsumersOneNode => "3 consumers, all on node 1",
            Self::OneConsumerPerNode => "3 consumers, one per node",
        }
    }
}

/// One run.
#[derive(Debug, Clone)]
struct Run {
    duplicates: f64,
    layout: Layout,
    messages: usize,
    elapsed: Duration,
    latency: Percentiles,
    /// Per consumer: its node (0-based), deliveries, certification retries.
    consumers: Vec<(usize, u64, u64)>,
}

/// Counts a gate's deliveries and certification retries.
#[derive(Default)]
struct Counts {
    deliveries: AtomicU64,
    certification: AtomicU64,
}

impl Observer for Counts {
    fn delivery(&self, _d: &Delivery, _r: &Disposition) {
        self.deliveries.fetch_add(1, Ordering::Relaxed);
    }

    fn transient_retries(&self, retries: &Retries) {
        let n = retries
            .by_cause()
            .filter(|(c, _)| *c == TransientCause::Certification)
            .map(|(_, n)| n)
            .sum::<u32>();
        self.certification.fetch_add(u64::from(n), Ordering::Relaxed);
    }
}

/// `idemgate-bench galera`: starts the cluster, runs every share and layout, prints the table.
pub(crate) async fn command(options: Options) -> anyhow::Result<()> {
    for share in &options.duplicates {
        super::share("duplicates", *share, 0.95)?;
    }
    anyhow::ensure!(options.in_flight > 0, "--in-flight must be at least 1");
    println!(
        "bench galera: {} stock.deduct messages, {} in flight per consumer, a three-node MariaDB Galera cluster \
         on one machine, {} cores",
        options.messages,
        options.in_flight,
        super::cores()
    );
    let started = Instant::now();
    let cluster = LocalGalera::start().await?;
    eprintln!("  the cluster is Synced after {:.1} s", started.elapsed().as_secs_f64());
    let mut runs = Vec::new();
    for &duplicates in &options.duplicates {
        for layout in Layout::ALL {
            let run = run(&cluster, &options, duplicates, layout).await?;
            eprintln!(
                "  {:.0}% {}: {:.0} msg/s",
                duplicates * 100.0,
                layout.name(),
                rate(run.messages, run.elapsed)
            );
            runs.push(run);
        }
    }
    println!("\n{}", table(&runs));
    Ok(())
}

/// One layout at one share of duplicates, on a fresh database.
async fn run(
    cluster: &LocalGalera,
    options: &Options,
    duplicates: f64,
    layout: Layout,
) -> anyhow::Result<Run> {
    let (deliveries, distinct) = stream(options.messages, duplicates, 42);
    let store_options = StoreOptions { max_connections: options.in_flight as u32 + 2, ..Default::default() };
    let db = ScratchDb::create_at(Backend::MySql, &cluster.admin_url(0), &store_options).await?;
    reset(&db.store).await?;
    let mut gates = Vec::new();
    let mut stores = Vec::new();
    for (i, node) in layout.nodes().into_iter().enumerate() {
        let store = Store::connect(&cluster.url(node, db.name()), &store_options).await?;
        let counts = Arc::new(Counts::default());
        let gate = Gate::new(
            store.clone(),
            Routes::new(&shop::routes(shop::TOPIC))?,
            shop::handlers(),
            Identity { consumer_group: super::gate::GROUP.to_owned(), instance_id: format!("consumer-{i}") },
            Policy { duplicate_warnings_per_second: 0, ..Policy::default() },
        )?
        .with_observer(counts.clone());
        gates.push((node, Arc::new(gate), counts));
        stores.push(store);
    }
    let deliveries = Arc::new(deliveries);
    let next = Arc::new(AtomicUsize::new(0));
    let latencies = Arc::new(Mutex::new(Vec::with_capacity(deliveries.len())));
    let failures = Arc::new(AtomicUsize::new(0));
    let began = Instant::now();
    let mut workers = Vec::new();
    for (_, gate, _) in &gates {
        for _ in 0..options.in_flight {
            let (gate, deliveries, next, latencies, failures) =
                (gate.clone(), deliveries.clone(), next.clone(), latencies.clone(), failures.clone());
            workers.push(tokio::spawn(async move {
                let mut own = Vec::new();
                loop {
                    let i = next.fetch_add(1, Ordering::Relaxed);
                    let Some(d) = deliveries.get(i) else { break };
                    let t = Instant::now();
                    let r = gate.process(d).await;
                    own.push(t.elapsed().as_micros() as u64);
                    if !matches!(r.outcome, Outcome::Processed | Outcome::Duplicate) {
                        failures.fetch_add(1, Ordering::Relaxed);
                    }
                }
                latencies.lock().await.extend(own);
            }));
        }
    }
    for w in workers {
        w.await?;
    }
    let elapsed = began.elapsed();
    let failed = failures.load(Ordering::Relaxed);
    // A delivery that failed would come back from the broker; here it would be a missing key.
    anyhow::ensure!(failed == 0, "{failed} deliveries failed on the cluster ({})", layout.name());
    let (applied, twice) = books(&db.store).await?;
    anyhow::ensure!(
        applied == distinct as i64 && twice == 0,
        "the gate applied {applied} effects for {distinct} keys ({twice} twice) on the cluster"
    );
    let consumers = gates
        .iter()
        .map(|(node, _, c)| {
            (*node, c.deliveries.load(Ordering::Relaxed), c.certification.load(Ordering::Relaxed))
        })
        .collect();
    for store in stores {
        store.close().await;
    }
    db.drop_now().await;
    let mut latencies = latencies.lock().await;
    Ok(Run {
        duplicates,
        layout,
        messages: options.messages,
        elapsed,
        latency: Percentiles::of(&mut latencies),
        consumers,
    })
}

/// The runs as a Markdown table: per node, its consumers' certification retries and their
/// share of the node's deliveries.
fn table(runs: &[Run]) -> String {
    let mut out = String::from(
        "| duplicates | consumers | msg/s | p99 ms | certification retries | per node: retries / deliveries (conflict rate) |\n\
         |---|---|---|---|---|---|\n",
    );
    for r in runs {
        let total: u64 = r.consumers.iter().map(|c| c.2).sum();
        let per_node: Vec<String> = (0..NODES)
            .filter_map(|node| {
                let mine: Vec<_> = r.consumers.iter().filter(|c| c.0 == node).collect();
                let deliveries: u64 = mine.iter().map(|c| c.1).sum();
                let retries: u64 = mine.iter().map(|c| c.2).sum();
                (deliveries > 0).then(|| {
                    format!(
                        "node {}: {retries} / {deliveries} ({:.2}%)",
                        node + 1,
                        100.0 * retries as f64 / deliveries as f64
                    )
                })
            })
            .collect();
        out.push_str(&format!(
            "| {:.0}% | {} | {:.0} | {:.2} | {total} | {} |\n",
            r.duplicates * 100.0,
            r.layout.name(),
            rate(r.messages, r.elapsed),
            r.latency.p99_us as f64 / 1000.0,
            per_node.join("; ")
        ));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_table_gives_each_node_its_conflict_rate() {
        let run = Run {
            duplicates: 0.3,
            layout: Layout::OneConsumerPerNode,
            messages: 300,
            elapsed: Duration::from_secs(1),
            latency: Percentiles { p50_us: 1000, p99_us: 5000, max_us: 9000 },
            consumers: vec![(0, 100, 2), (1, 100, 0), (2, 100, 1)],
        };
        let text = table(&[run]);
        assert!(
            text.contains("| 30% | 3 consumers, one per node | 300 | 5.00 | 3 | node 1: 2 / 100 (2.00%); node 2: 0 / 100 (0.00%); node 3: 1 / 100 (1.00%) |"),
            "{text}"
        );
    }
}
