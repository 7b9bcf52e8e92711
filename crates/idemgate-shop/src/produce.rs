//! `idemgate produce`: sends the example traffic to a real topic (RocketMQ or Kafka) or
//! exchange (RabbitMQ) at a chosen rate, with
//! duplicates of each cause, poison and malformed messages, and reports what it sent so that a
//! consumer's books can be checked against it. It is the load generator of the benchmarks and
//! the way an operator smoke-tests a pipeline.
//!
//! **Sends in flight.** On Kafka it sends as production clients do: up to [`KAFKA_IN_FLIGHT`]
//! sends are in flight at once, so that the client's linger gathers several records into each
//! batch. Every send's answer is still taken in the order the sends were made, and a send
//! waits until every earlier send of its business key (its first KEY) has been acknowledged:
//! a duplicate of any cause goes out only after its original is on the broker, as when each
//! send waited for the one before. The topic's first send goes alone (it may create the
//! topic). On RocketMQ and RabbitMQ each send waits for the one before.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use futures_util::stream::FuturesOrdered;
use futures_util::{FutureExt, StreamExt};
use serde::Serialize;

use crate::traffic::{Mix, Send, Tally, Traffic};
use idemgate::broker::{BrokerKind, Brokers};

/// How many sends may be in flight at once on Kafka.
pub const KAFKA_IN_FLIGHT: usize = 64;

/// What to send.
#[derive(Debug, Clone)]
pub struct ProduceOptions {
    /// The broker `[broker] kind` names, and how to reach it: RocketMQ's name server,
    /// account, namespace and producer group, RabbitMQ's URL, or Kafka's bootstrap servers.
    pub brokers: Brokers,
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

/// How many sends of `broker` may be in flight at once.
fn in_flight_limit(broker: BrokerKind) -> usize {
    match broker {
        BrokerKind::Kafka => KAFKA_IN_FLIGHT,
        BrokerKind::RocketMq | BrokerKind::RabbitMq => 1,
    }
}

/// The business key a send is ordered by: a send waits for every earlier one of its key.
fn key_of(send: &Send) -> String {
    send.message.keys.first().cloned().unwrap_or_default()
}

/// Takes the oldest send's answer: its key leaves the keys in flight, and a send the broker
/// accepted is counted and shown to `on_send`; the first error is kept in `failed`.
fn settle(
    (key, Send { kind, message }, published): (String, Send, anyhow::Result<String>),
    keys: &mut BTreeMap<String, usize>,
    failed: &mut Option<anyhow::Error>,
    sent: &mut u64,
    on_send: &mut impl FnMut(&SendRecord<'_>),
) {
    if let Some(n) = keys.get_mut(&key) {
        *n -= 1;
        if *n == 0 {
            keys.remove(&key);
        }
    }
    match published {
        Ok(uniq_key) => {
            *sent += 1;
            on_send(&SendRecord {
                kind: kind.as_str(),
                uniq_key: &uniq_key,
                tags: &message.tags,
                keys: &message.keys,
            });
        }
        Err(e) => {
            failed.get_or_insert(e);
        }
    }
}

/// Sends `options.count` messages, then the at most two that complete the last order begun;
/// `on_send` sees each one after the broker accepted it, in the order they were sent.
pub async fn run(
    options: &ProduceOptions,
    mut on_send: impl FnMut(&SendRecord<'_>),
) -> anyhow::Result<ProduceReport> {
    let producer = options.brokers.publisher().await?;
    let limit = in_flight_limit(options.brokers.kind());
    let mut traffic = Traffic::new(options.mix, options.seed, &options.run, &options.topic);
    let started = Instant::now();
    let mut tick = (options.rate > 0).then(|| {
        let mut t = tokio::time::interval(Duration::from_secs_f64(1.0 / f64::from(options.rate)));
        t.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Burst);
        t
    });
    let mut sent = 0;
    let result: anyhow::Result<()> = async {
        let publisher = producer.as_ref();
        let mut owed = Vec::new().into_iter();
        let mut issued = 0;
        // The sends made and not yet answered, oldest first, and how many of each business key.
        let mut in_flight = FuturesOrdered::new();
        let mut keys_in_flight: BTreeMap<String, usize> = BTreeMap::new();
        // The first send's error, after which nothing more is sent; the sends in flight are
        // still answered and recorded.
        let mut failed: Option<anyhow::Error> = None;
        while failed.is_none() {
            let next = if issued < options.count { Some(traffic.next_send()) } else { owed.next() };
            let Some(send) = next else { break };
            issued += 1;
            if issued == options.count {
                owed = traffic.finish().into_iter();
            }
            let key = key_of(&send);
            // Room in the window (the first send alone), and no earlier send of this key
            // unanswered.
            loop {
                let room = if sent == 0 { 1 } else { limit };
                if in_flight.is_empty() || (in_flight.len() < room && !keys_in_flight.contains_key(&key)) {
                    break;
                }
                let answer = in_flight.next().await.expect("a send in flight");
                settle(answer, &mut keys_in_flight, &mut failed, &mut sent, &mut on_send);
            }
            if failed.is_some() {
                break;
            }
            // The rate's next tick, the sends in flight answered meanwhile.
            if let Some(t) = tick.as_mut() {
                loop {
                    tokio::select! {
                        biased;
                        _ = t.tick() => break,
                        Some(answer) = in_flight.next(), if !in_flight.is_empty() => {
                            settle(answer, &mut keys_in_flight, &mut failed, &mut sent, &mut on_send);
                        }
                    }
                }
                if failed.is_some() {
                    break;
                }
            }
            *keys_in_flight.entry(key.clone()).or_default() += 1;
            in_flight.push_back(async move {
                let published = publisher.publish(&send.message).await;
                (key, send, published)
            });
            // Polled at once, so that the send reaches the client now (where the client's
            // linger batches it with its neighbours), and whatever is answered is taken.
            while let Some(Some(answer)) = in_flight.next().now_or_never() {
                settle(answer, &mut keys_in_flight, &mut failed, &mut sent, &mut on_send);
            }
        }
        while let Some(answer) = in_flight.next().await {
            settle(answer, &mut keys_in_flight, &mut failed, &mut sent, &mut on_send);
        }
        failed.map_or(Ok(()), Err)
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
