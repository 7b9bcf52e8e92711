//! A member of a Kafka consumer group that takes partitions and never commits: what holds a
//! group's partitions away from idemgate's consumer, so that a test can watch a consumer that
//! has messages waiting and answers none of them.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use anyhow::Context;
use rdkafka::config::ClientConfig;
use rdkafka::consumer::{BaseConsumer, Consumer};

/// A running member of a group, polling on a thread of its own until dropped.
pub struct GroupHog {
    stop: Arc<AtomicBool>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl GroupHog {
    /// Joins `group` on `topic` at `bootstrap` with a client id that sorts before every other
    /// member's (so that the range assignor, which gives a lone partition to the first member,
    /// gives it this one), and polls (so that it stays in the group) without ever committing.
    pub fn join(bootstrap: &str, group: &str, topic: &str) -> anyhow::Result<Self> {
        let consumer: BaseConsumer = ClientConfig::new()
            .set("bootstrap.servers", bootstrap)
            .set("group.id", group)
            .set("client.id", "aaaa-hog")
            .set("partition.assignment.strategy", "range")
            .set("enable.auto.commit", "false")
            .set("auto.offset.reset", "earliest")
            .set("session.timeout.ms", "6000")
            .set("log_level", "3")
            .create()
            .context("creating the group's hog")?;
        consumer.subscribe(&[topic]).with_context(|| format!("subscribing to {topic}"))?;
        let stop = Arc::new(AtomicBool::new(false));
        let stopping = stop.clone();
        let thread = std::thread::spawn(move || {
            while !stopping.load(Ordering::Relaxed) {
                let _ = consumer.poll(Duration::from_millis(200));
            }
            // Leaves the group as it is dropped.
            drop(consumer);
        });
        Ok(Self { stop, thread: Some(thread) })
    }

    /// Leaves the group: its partitions go to the other members at the rebalance.
    pub fn leave(mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

impl Drop for GroupHog {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}
