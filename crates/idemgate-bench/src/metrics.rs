//! `idemgate-bench metrics`: what the metrics cost. The hot path is measured twice: one
//! `observe` call in isolation, and the gate's throughput on a scratch SQLite database with and
//! without metrics, in the same run. The scrape is measured with 10 biz_types × 5 outcomes ×
//! 4 causes of live series.

use idemgate::gate::Observer;
use std::collections::BTreeSet;
use std::sync::Arc;
use std::time::{Duration, Instant};

use super::{peak_rss_mib, rate};
use idemgate::delivery::Delivery;
use idemgate::gate::{Disposition, Gate, Identity, Phases, Policy};
use idemgate::metrics::{BuildInfo, Metrics};
use idemgate::outcome::{DuplicateCause, Layer, Outcome, Verdict};
use idemgate::route::{BizKey, Routes};
use idemgate::store::{Backend, StoreOptions};
use idemgate_shop as shop;
use idemgate_testkit::scratch::ScratchDb;

/// What to measure: the flags of `idemgate-bench metrics`.
#[derive(Debug, Clone, clap::Args)]
pub struct Options {
    /// Messages for the with/without comparison on SQLite.
    #[arg(long, default_value_t = 4000)]
    pub messages: usize,
}

#[derive(Debug, Clone)]
pub(crate) struct Report {
    pub observe_ns: f64,
    pub gate_without: f64,
    pub gate_with: f64,
    pub series: usize,
    pub scrape_us: f64,
    pub scrape_bytes: usize,
    pub peak_rss_mib: f64,
}

fn info() -> BuildInfo {
    BuildInfo {
        backend: Backend::Sqlite,
        broker: Default::default(),
        consumer_group: "bench".into(),
        instance_id: "bench".into(),
        ui_url: "http://127.0.0.1:8080".into(),
    }
}

/// `idemgate-bench metrics`: prints the setting, measures and prints the table.
pub(crate) async fn command(options: Options) -> anyhow::Result<()> {
    let messages = options.messages;
    println!("bench metrics: {messages} stock.deduct messages on SQLite with and without metrics");
    let report = run(messages).await?;
    println!("\n{}", table(&report));
    Ok(())
}

pub(crate) async fn run(messages: usize) -> anyhow::Result<Report> {
    // 1. One observe call, on the ten-biz_type registry.
    let biz_types: BTreeSet<String> = (0..10).map(|i| format!("biz.type_{i}")).collect();
    let topics: BTreeSet<String> = ["topic_a".to_owned()].into();
    let metrics = Metrics::new(&info(), &biz_types, &topics);
    let dispositions: Vec<(Delivery, Disposition)> = (0..200)
        .map(|i| {
            let outcome = Outcome::ALL[i % Outcome::ALL.len()];
            let cause = DuplicateCause::ALL[i % DuplicateCause::ALL.len()];
            let d = Delivery {
                topic: "topic_a".into(),
                born_at_ms: idemgate::clock::now_ms() - 5,
                ..Default::default()
            };
            let r = Disposition {
                outcome,
                verdict: Verdict::Ack,
                key: Some(BizKey {
                    biz_type: format!("biz.type_{}", i % 10),
                    biz_id: format!("K-{i}"),
                    execute_time: 0,
                    handler: String::new(),
                }),
                cause: (outcome == Outcome::Duplicate).then_some(cause),
                layer: (outcome == Outcome::Duplicate).then_some(Layer::Db),
                payload_match: Some(true),
                error: None,
                latency: Duration::from_micros(700),
                logged: true,
                phases: Phases { handler_us: 90, ..Phases::default() },
                prefilter: None,
            };
            (d, r)
        })
        .collect();
    // Every biz_type × outcome × cause combination becomes a live series.
    for (d, r) in &dispositions {
        for cause in DuplicateCause::ALL {
            let mut r = r.clone();
            r.outcome = Outcome::Duplicate;
            r.cause = Some(*cause);
            metrics.delivery(d, &r);
        }
    }
    let n = 1_000_000;
    let started = Instant::now();
    for i in 0..n {
        let (d, r) = &dispositions[i % dispositions.len()];
        metrics.delivery(d, r);
    }
    let observe_ns = started.elapsed().as_nanos() as f64 / n as f64;

    // 2. The scrape.
    let body = metrics.render(None).await;
    let series = body.lines().filter(|l| !l.starts_with('#') && !l.is_empty()).count();
    let renders = 200;
    let started = Instant::now();
    for _ in 0..renders {
        std::hint::black_box(metrics.render(None).await);
    }
    let scrape_us = started.elapsed().as_micros() as f64 / renders as f64;

    // 3. The gate with and without metrics, same database, same stream.
    let db = ScratchDb::create(Backend::Sqlite, &StoreOptions { max_connections: 2, ..Default::default() })
        .await?;
    let (stream, _) = super::gate::stream(messages, 0.3, 11);
    let mut rates = [0.0; 2];
    for (i, with_metrics) in [false, true].into_iter().enumerate() {
        super::gate::reset(&db.store).await?;
        let routes = Routes::new(&shop::routes(shop::TOPIC))?;
        let gate = Gate::new(
            db.store.clone(),
            routes.clone(),
            shop::handlers(),
            Identity { consumer_group: "bench".into(), instance_id: "bench".into() },
            Policy { duplicate_warnings_per_second: 0, ..Policy::default() },
        )?;
        let gate = if with_metrics {
            let topics = routes.topics().into_iter().map(|(t, _)| t).collect();
            gate.with_observer(Arc::new(Metrics::new(&info(), &routes.biz_types(), &topics)))
        } else {
            gate
        };
        let started = Instant::now();
        for d in &stream {
            gate.process(d).await;
        }
        rates[i] = rate(stream.len(), started.elapsed());
    }
    db.drop_now().await;
    Ok(Report {
        observe_ns,
        gate_without: rates[0],
        gate_with: rates[1],
        series,
        scrape_us,
        scrape_bytes: body.len(),
        peak_rss_mib: peak_rss_mib(),
    })
}

pub(crate) fn table(r: &Report) -> String {
    format!(
        "| measure | value |\n|---|---|\n\
         | one `observe` (hot path, per delivery) | {:.0} ns |\n\
         | gate on SQLite without metrics | {:.0} msg/s |\n\
         | gate on SQLite with metrics | {:.0} msg/s |\n\
         | live series in the scrape | {} |\n\
         | one scrape (render, no database) | {:.0} µs, {} KiB |\n\
         | peak RSS | {:.0} MiB |\n",
        r.observe_ns,
        r.gate_without,
        r.gate_with,
        r.series,
        r.scrape_us,
        r.scrape_bytes / 1024,
        r.peak_rss_mib
    )
}
