//! Consumer lag in every broker's words: how far a consumer group trails each queue (a
//! RocketMQ queue, a Kafka partition, a RabbitMQ queue) of the topics it consumes, and how old
//! the oldest message not yet consumed is. Each broker's lag reader ([`super::seam::LagRead`])
//! answers a [`LagReading`]; the schedule that asks for one lives with the service's other
//! parts (`app`), and the figures go to `metrics` and the overview page.

use crate::delivery::BrokerKind;

/// One queue's lag: a RocketMQ queue, a Kafka partition, a RabbitMQ queue.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct QueueLag {
    /// What holds the queue, in the broker's words: the RocketMQ broker's name, `partition`
    /// on Kafka, the queue's name on RabbitMQ. The `source` label of the lag's gauges.
    pub source: String,
    /// The queue's number: RocketMQ's queue id, Kafka's partition, 0 for RabbitMQ's queue.
    pub queue: i32,
    /// Where the queue ends: the position the next message stored will get (RocketMQ's max
    /// offset, Kafka's high watermark); RabbitMQ's messages ready, its `committed` always 0.
    pub end: i64,
    /// Where the group has consumed to: its committed offset (0, or the partition's start,
    /// when it has none yet).
    pub committed: i64,
}

impl QueueLag {
    /// Messages stored in the queue and not yet consumed by the group.
    pub fn messages(&self) -> i64 {
        (self.end - self.committed).max(0)
    }
}

/// How a topic's reading went.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ReadResult {
    /// Every broker of the route answered, and every lagging queue's oldest message was read;
    /// also a topic with no route yet (nothing stored, nothing to lag).
    Complete,
    /// Some brokers did not answer, or some oldest message could not be read: the figures cover
    /// the rest.
    Partial,
    /// No figure: the route lookup failed or the reading ran out of time.
    Failed,
}

impl ReadResult {
    pub const ALL: [Self; 3] = [Self::Complete, Self::Partial, Self::Failed];

    pub fn as_str(self) -> &'static str {
        match self {
            Self::Complete => "complete",
            Self::Partial => "partial",
            Self::Failed => "failed",
        }
    }
}

/// One topic's lag, as one reading found it.
#[derive(Debug, Clone, PartialEq)]
pub struct TopicLag {
    pub topic: String,
    /// By broker, then queue.
    pub queues: Vec<QueueLag>,
    /// The store time (Unix ms) of the oldest message not yet consumed, over every queue that
    /// lags; `None` when none lags or its message could not be read.
    pub oldest_unconsumed_ms: Option<i64>,
    pub result: ReadResult,
    /// What went wrong, when the result is not complete.
    pub problem: Option<String>,
}

impl TopicLag {
    /// Messages not yet consumed, over every queue read.
    pub fn messages(&self) -> i64 {
        self.queues.iter().map(QueueLag::messages).sum()
    }

    /// How long the oldest message not yet consumed has waited at `now_ms`: 0 when nothing lags,
    /// `None` when something lags but its age could not be read.
    pub fn age_seconds(&self, now_ms: i64) -> Option<f64> {
        match self.oldest_unconsumed_ms {
            Some(stored) => Some((now_ms - stored).max(0) as f64 / 1e3),
            None if self.messages() == 0 && self.result != ReadResult::Failed => Some(0.0),
            None => None,
        }
    }

    pub(crate) fn failed(topic: &str, problem: String) -> Self {
        Self {
            topic: topic.to_owned(),
            queues: Vec::new(),
            oldest_unconsumed_ms: None,
            result: ReadResult::Failed,
            problem: Some(problem),
        }
    }
}

/// One reading of every topic the group consumes.
#[derive(Debug, Clone, PartialEq)]
pub struct LagReading {
    /// The broker read: how its queues are named (queues on brokers, partitions, a queue).
    pub broker: BrokerKind,
    pub read_at_ms: i64,
    pub topics: Vec<TopicLag>,
}

impl LagReading {
    /// How many of a topic's queues lag, of those read, in the broker's words: "2 of 8 queues on
    /// 2 brokers" (RocketMQ), "1 of 3 partitions" (Kafka), "1 of 2 queues" (RabbitMQ: the
    /// group's queue and its delay queue).
    pub fn queues_in_words(&self, t: &TopicLag) -> String {
        let lagging = t.queues.iter().filter(|q| q.messages() > 0).count();
        let n = t.queues.len();
        match self.broker {
            BrokerKind::RocketMq => {
                let sources: std::collections::BTreeSet<&str> =
                    t.queues.iter().map(|q| q.source.as_str()).collect();
                let brokers = sources.len();
                format!("{lagging} of {n} queues on {brokers} broker{}", if brokers == 1 { "" } else { "s" })
            }
            BrokerKind::Kafka => format!("{lagging} of {n} partitions"),
            BrokerKind::RabbitMq => format!("{lagging} of {n} queues"),
        }
    }
}

/// Whether a consumer makes progress: it is stalled once the lag readings have found messages
/// waiting, and it has answered no delivery, for `after`. A consumer that answers deliveries,
/// retries and dead letters included, makes progress, however slowly; one whose readings cannot
/// be taken is not judged.
#[derive(Debug)]
pub struct StallWatch {
    after: std::time::Duration,
    answered: u64,
    progress_at: std::time::Instant,
    stalled: bool,
}

impl StallWatch {
    pub fn new(after: std::time::Duration, now: std::time::Instant) -> Self {
        Self { after, answered: 0, progress_at: now, stalled: false }
    }

    /// One reading at `now`: `waiting` the messages it found not yet consumed (`None` when it
    /// could not tell), `answered` the consumer's count of verdicts so far. `Some(stalled)`
    /// when the judgement changes.
    pub fn observe(&mut self, waiting: Option<i64>, answered: u64, now: std::time::Instant) -> Option<bool> {
        if answered != self.answered || waiting == Some(0) {
            self.answered = answered;
            self.progress_at = now;
        }
        let stalled = match waiting {
            Some(n) if n > 0 => now.duration_since(self.progress_at) >= self.after,
            Some(_) => false,
            None => self.stalled,
        };
        (stalled != self.stalled).then(|| {
            self.stalled = stalled;
            stalled
        })
    }

    /// How long the consumer has gone without progress at `now`.
    pub fn idle_for(&self, now: std::time::Instant) -> std::time::Duration {
        now.duration_since(self.progress_at)
    }
}

impl LagReading {
    /// The messages waiting over every topic read in full or in part; `None` when no topic
    /// could be read.
    pub fn waiting(&self) -> Option<i64> {
        let read: Vec<&TopicLag> = self.topics.iter().filter(|t| t.result != ReadResult::Failed).collect();
        (!read.is_empty()).then(|| read.iter().map(|t| t.messages()).sum())
    }
}

#[cfg(test)]
mod tests {
    use std::time::{Duration, Instant};

    use super::*;

    #[test]
    fn a_consumer_that_answers_nothing_while_messages_wait_is_stalled_until_it_answers_again() {
        let t0 = Instant::now();
        let at = |s: u64| t0 + Duration::from_secs(s);
        let mut w = StallWatch::new(Duration::from_secs(60), t0);
        assert_eq!(w.observe(Some(5), 0, at(10)), None, "waiting, but not for long");
        assert_eq!(w.observe(None, 0, at(50)), None, "an unread reading judges nothing");
        assert_eq!(w.observe(Some(5), 0, at(61)), Some(true), "a minute with messages waiting and no answer");
        assert_eq!(w.observe(Some(9), 0, at(70)), None, "still stalled");
        assert_eq!(w.observe(Some(9), 1, at(75)), Some(false), "a delivery answered");
        assert_eq!(w.observe(Some(9), 1, at(130)), None, "55 s since");
        assert_eq!(w.observe(Some(9), 1, at(136)), Some(true));
        assert_eq!(w.observe(Some(0), 1, at(140)), Some(false), "nothing waiting is no stall");
        assert_eq!(w.observe(Some(0), 1, at(1_000)), None, "an idle consumer with nothing to do");
    }
}
