//! `idemgate produce`: sends the example traffic to a real topic (RocketMQ or Kafka) or
//! exchange (RabbitMQ) at a chosen rate, with
//! duplicates of each cause, poison and malformed messages, and reports what it sent so that a
//! consumer's books can be checked against it. It is the load generator of the benchmarks and
//! the way an operator smoke-tests a pipeline.

use std::time::{Duration, Instant};

use serde::Serialize;

use crate::traffic::{Mix, Send, Tally, Traffic};
use idemgate::broker::OwnedBrokers;

/// What to send.
#[derive(Debug, Clone)]
pub struct ProduceOptions {
    /// The broker `[broker] kind` names, and how to reach it: RocketMQ's name server,
    /// account, namespace and producer group, RabbitMQ's URL, or Kafka's bootstrap servers.
    pub brokers: OwnedBrokers,
    pub topic: String,
    pub count: u64,
    /// Sends per second; 0 sends as fast as the broker takes them.
    pub rate: u32,
    pub mix: Mix,
    pub seed: u64,
    /// Prefix of every business key.
    pub run: String,
}

/// What was sent.
#[derive(Debug, Clone, Serialize)]
pub struct ProduceReport {
    pub run: String,
    pub topic: String,
    pub sent: u64,
    pub elapsed_seconds: f64,
    pub sends_per_second: f64,
    pub tally: Tally,
}

/// One send, as reported to the caller.
#[derive(Debug, Clone, Serialize)]
pub struct SendRecord<'a> {
    pub kind: &'static str,
    pub uniq_key: &'a str,
    pub tags: &'a str,
    pub keys: &'a [String],
}

/// Sends `options.count` messages, then the at most two that complete the last order begun;
/// `on_send` sees each one after the broker accepted it.
pub async fn run(
    options: &ProduceOptions,
    mut on_send: impl FnMut(&SendRecord<'_>),
) -> anyhow::Result<ProduceReport> {
    let producer = options.brokers.borrow().publisher().await?;
    let mut traffic = Traffic::new(options.mix, options.seed, &options.run, &options.topic);
    let started = Instant::now();
    let mut tick = (options.rate > 0).then(|| {
        let mut t = tokio::time::interval(Duration::from_secs_f64(1.0 / f64::from(options.rate)));
        t.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Burst);
        t
    });
    let mut sent = 0;
    let result: anyhow::Result<()> = async {
        let mut owed = Vec::new().into_iter();
        loop {
            let next = if sent < options.count { Some(traffic.next_send()) } else { owed.next() };
            let Some(Send { kind, message }) = next else { break };
            if let Some(t) = tick.as_mut() {
                t.tick().await;
            }
            let uniq_key = producer.publish(&message).await?;
            sent += 1;
            on_send(&SendRecord {
                kind: kind.as_str(),
                uniq_key: &uniq_key,
                tags: &message.tags,
                keys: &message.keys,
            });
            if sent == options.count {
                owed = traffic.finish().into_iter();
            }
        }
        Ok(())
    }
    .await;
    producer.shutdown().await;
    result?;
    let elapsed = started.elapsed();
    Ok(ProduceReport {
        run: options.run.clone(),
        topic: options.topic.clone(),
        sent,
        elapsed_seconds: elapsed.as_secs_f64(),
        sends_per_second: sent as f64 / elapsed.as_secs_f64().max(f64::EPSILON),
        tally: traffic.tally().clone(),
    })
}
