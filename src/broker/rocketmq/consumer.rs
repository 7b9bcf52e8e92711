//! The clustering push consumer: every delivery goes through the gate, and the gate's verdict
//! becomes the broker's consume status.
//!
//! The client calls the listener synchronously on one of its blocking threads. The listener
//! bridges into idemgate's own Tokio runtime with `Handle::block_on`, which is allowed on a
//! thread that is not a runtime worker, so the database work runs on idemgate's runtime and no
//! worker thread of either runtime is ever blocked.
//!
//! Verdicts: `Ack` (processed, duplicate, invalid) and `DeadLetter` (a permanent refusal, kept
//! in the delivery log for replay) consume the message; `Retry` answers `ReconsumeLater`, and
//! at the last allowed attempt that makes the broker move the message to `%DLQ%<group>`.
//!
//! **The answer comes before the client's deadline.** The client abandons a listener call after
//! [`CONSUME_DEADLINE`](super::runtime::CONSUME_DEADLINE) and redelivers its messages while the
//! call runs on. The gate answers each delivery by `consumer.delivery_timeout_ms` from the
//! call's start (rolling back what is not ready to commit), and the listener itself answers
//! `ReconsumeLater` at RocketMQ's [`Limits`](crate::broker::seam::Limits) (`answer_within`, 28 s)
//! whatever the sink is still doing, through the seam's one scaffold
//! ([`verdict_of`](crate::broker::seam::verdict_of)).

use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use anyhow::Context;
use rocketmq_client_rust::{
    ClientResult, ConsumeConcurrentlyContext, ConsumeConcurrentlyStatus, DefaultMQPushConsumer,
    MQConsumerInner, MQPushConsumer, MessageListenerConcurrently,
};
use rocketmq_model::common::consumer::consume_from_where::ConsumeFromWhere;
use rocketmq_model::common::message::message_ext::MessageExt;

use super::access::BrokerAccess;
use super::runtime::ClientHost;
use super::settings::RocketMqSettings;
use crate::broker::seam::{Limits, Sink, Subscription, next_fault, verdict_of};
use crate::broker::settings::StartFrom;
use crate::delivery::{Delivery, UNIQ_KEY_PROPERTY};
use crate::outcome::Verdict;

/// What the consumer has seen, for status lines, benchmarks and tests.
#[derive(Debug, Default)]
pub struct ConsumerCounters {
    pub listener_calls: AtomicU64,
    pub deliveries: AtomicU64,
    /// Deliveries whose reconsume count was above 0.
    pub redelivered: AtomicU64,
    /// Deliveries this consumer answered with `ReconsumeLater`. Redeliveries beyond these were
    /// caused by the client itself (a listener call refused for capacity, or timed out).
    pub retries_asked: AtomicU64,
}

/// A started consumer. Call [`Consumer::shutdown`] before the process exits.
pub struct Consumer {
    /// Shared with the route watcher ([`watch_routes`]).
    consumer: Arc<tokio::sync::Mutex<DefaultMQPushConsumer>>,
    route_watcher: tokio::task::JoinHandle<()>,
    host: ClientHost,
    counters: Arc<ConsumerCounters>,
    faults: tokio::sync::mpsc::UnboundedReceiver<String>,
}

impl Consumer {
    /// Starts a consumer that hands deliveries to `sink`, on the client runtime `host`,
    /// reaching the cluster as `options` says ([`BrokerAccess`]).
    pub async fn start_with(
        sink: Arc<dyn Sink>,
        subscription: &Subscription,
        options: &RocketMqSettings,
        consume_threads: u32,
        start_from: StartFrom,
        host: ClientHost,
    ) -> anyhow::Result<Self> {
        let counters = Arc::new(ConsumerCounters::default());
        let (faults_tx, faults) = tokio::sync::mpsc::unbounded_channel();
        let listener = SinkListener {
            sink,
            runtime: tokio::runtime::Handle::current(),
            counters: counters.clone(),
            faults: faults_tx,
            answer_within: Limits::ROCKETMQ.answer_within,
        };
        let access = BrokerAccess::of(options)?;
        let mut consumer = DefaultMQPushConsumer::builder(host.client_runtime())
            .client_config(access.client_config())
            .rpc_hook(access.rpc_hook().map(|hook| hook as _))
            .consumer_group(subscription.group.clone())
            .consume_from_where(match start_from {
                StartFrom::First => ConsumeFromWhere::ConsumeFromFirstOffset,
                StartFrom::Last => ConsumeFromWhere::ConsumeFromLastOffset,
            })
            .consume_thread_min(consume_threads)
            .consume_thread_max(consume_threads)
            .consume_message_batch_max_size(options.batch_size)
            .pull_batch_size(options.pull_batch_size)
            .pull_threshold_for_topic(i32::try_from(options.buffered_messages).unwrap_or(i32::MAX))
            .pull_threshold_size_for_topic(i32::try_from(options.buffered_mib).unwrap_or(i32::MAX))
            .max_reconsume_times(subscription.max_reconsume_times)
            .message_queue_listener(subscription.record.clone().map(|record| {
                Arc::new(super::queues::QueueWatch::new(record))
                    as rocketmq_client_rust::ArcMessageQueueListener
            }))
            .build();
        for (topic, tags) in &subscription.topics {
            consumer
                .subscribe(topic.as_str(), tags.as_str())
                .await
                .with_context(|| format!("subscribing to {topic} ({tags})"))?;
        }
        consumer.register_message_listener_concurrently(listener);
        consumer
            .start()
            .await
            .with_context(|| format!("starting the consumer against {}", access.describe()))?;
        tracing::info!(
            group = %subscription.group, name_server = %options.name_server,
            access_key = access.access_key().unwrap_or(""), namespace = access.namespace().unwrap_or(""),
            message_trace = options.message_trace, "consumer started"
        );
        let consumer = Arc::new(tokio::sync::Mutex::new(consumer));
        let topics = subscription.topics.iter().map(|(topic, _)| topic.clone()).collect();
        let route_watcher = tokio::spawn(watch_routes(consumer.clone(), topics));
        Ok(Self { consumer, route_watcher, host, counters, faults })
    }

    pub fn counters(&self) -> &Arc<ConsumerCounters> {
        &self.counters
    }

    /// The messages the client holds, pulled and not yet consumed (those in the gate included),
    /// per topic (a `%RETRY%` topic apart), from its own running snapshot: what
    /// `rocketmq.buffered_messages` bounds. The client stops pulling a queue once it holds more
    /// than its share of that bound, so the total may pass it by at most one pull per queue.
    /// `None` when the client could not give the snapshot.
    pub(crate) async fn buffered_messages(&self) -> Option<BTreeMap<String, u64>> {
        let info = self.consumer.lock().await.consumer_running_info().await.ok()?;
        let mut by_topic: BTreeMap<String, u64> = BTreeMap::new();
        for (queue, held) in &info.mq_table {
            *by_topic.entry(queue.topic_str().to_owned()).or_default() += u64::from(held.cached_msg_count);
        }
        Some(by_topic)
    }

    /// Resolves when a listener call has panicked, with the panic's message; never otherwise.
    /// The delivery it held was answered `ReconsumeLater`, so nothing is lost, but the process
    /// is no longer trustworthy: the service stops on it.
    pub(crate) async fn fault(&mut self) -> String {
        next_fault(&mut self.faults).await
    }

    /// Stops pulling, waits for the listener calls in flight (each finishes or rolls back its
    /// transaction), and stops the client.
    pub async fn shutdown(self) {
        self.route_watcher.abort();
        self.consumer.lock().await.shutdown().await;
        self.host.shutdown().await;
    }
}

/// How often a subscribed topic without a route is looked up again.
const ROUTE_RETRY: std::time::Duration = std::time::Duration::from_secs(1);

/// Asks the name server for the route of every subscribed topic that has none yet, every
/// [`ROUTE_RETRY`], until each has one, and then joins the topic's broker at once
/// ([`join_brokers`]). A topic is created by its first send; left to itself, the client looks
/// for new routes every 30 s, tells a broker it did not know at start of its consumer only with
/// its next heartbeat (every 30 s) and shares out queues at its next rebalance (every 20 s,
/// and one that finds the group without members at the broker waits another 20 s), so a fresh
/// consumer sat idle for 20 to 40 s after that send. The first miss is logged once at INFO,
/// the route's arrival too, so that the wait is visible.
async fn watch_routes(consumer: Arc<tokio::sync::Mutex<DefaultMQPushConsumer>>, topics: Vec<String>) {
    let mut waiting: Vec<(String, bool)> = topics.into_iter().map(|t| (t, false)).collect();
    while !waiting.is_empty() {
        let mut still = Vec::new();
        for (topic, announced) in waiting {
            let mut client = consumer.lock().await;
            let queues = client.fetch_subscribe_message_queues(&topic).await;
            match queues {
                Ok(queues) if !queues.is_empty() => {
                    if announced {
                        join_brokers(&client).await;
                        tracing::info!(%topic, queues = queues.len(), "the topic has a route now; consuming");
                    }
                }
                _ => {
                    if !announced {
                        tracing::info!(
                            %topic, retry_ms = ROUTE_RETRY.as_millis() as u64,
                            "the topic has no route yet (its first send creates it); asking the name server again until it has one"
                        );
                    }
                    still.push((topic, true));
                }
            }
        }
        waiting = still;
        if !waiting.is_empty() {
            tokio::time::sleep(ROUTE_RETRY).await;
        }
    }
}

/// Tells every broker the client now knows of that this consumer is in its group (a
/// heartbeat: before it, the broker lists no members of the group to share the queues among),
/// then shares out the queues at once (a rebalance) instead of at the client's next rounds of
/// either. A rebalance running beside the client's own is safe: a queue is taken only once.
async fn join_brokers(consumer: &DefaultMQPushConsumer) {
    let Some(inner) = consumer.default_mq_push_consumer_impl() else { return };
    let heartbeat = match inner.get_mq_client_factory() {
        Some(instance) => instance.send_heartbeat_to_all_broker_with_lock_v2(false).await,
        None => false,
    };
    if !heartbeat {
        tracing::warn!(
            "no heartbeat reached a broker; the consumer joins at the client's own next heartbeat"
        );
    }
    if let Err(e) = MQConsumerInner::try_rebalance(inner.as_ref()).await {
        tracing::warn!(error = %e, "the rebalance after a new route failed; the client's own follows within 20 s");
    }
}

struct SinkListener {
    sink: Arc<dyn Sink>,
    runtime: tokio::runtime::Handle,
    counters: Arc<ConsumerCounters>,
    faults: tokio::sync::mpsc::UnboundedSender<String>,
    /// How long a call may take before the listener answers `ReconsumeLater` itself:
    /// [`LISTENER_DEADLINE`].
    answer_within: Duration,
}

impl MessageListenerConcurrently for SinkListener {
    fn consume_message(
        &self,
        msgs: &[&MessageExt],
        _context: &ConsumeConcurrentlyContext,
    ) -> ClientResult<ConsumeConcurrentlyStatus> {
        let began = Instant::now();
        self.counters.listener_calls.fetch_add(1, Ordering::Relaxed);
        let deliveries: Vec<Delivery> = msgs.iter().map(|m| to_delivery(m)).collect();
        let (sink, within, faults) = (self.sink.as_ref(), self.answer_within, &self.faults);
        // Each delivery is answered by the call's deadline, a panic caught and reported.
        let verdicts = self.runtime.block_on(async {
            if sink.takes_batches() {
                futures_util::future::join_all(
                    deliveries.iter().map(|d| verdict_of(sink, d, began, within, faults)),
                )
                .await
            } else {
                let mut verdicts = Vec::with_capacity(deliveries.len());
                for d in &deliveries {
                    verdicts.push(verdict_of(sink, d, began, within, faults).await);
                }
                verdicts
            }
        });
        let retry = verdicts.contains(&Verdict::Retry);
        let redelivered = deliveries.iter().filter(|d| d.reconsume_times > 0).count() as u64;
        self.counters.redelivered.fetch_add(redelivered, Ordering::Relaxed);
        self.counters.deliveries.fetch_add(deliveries.len() as u64, Ordering::Relaxed);
        if retry {
            self.counters.retries_asked.fetch_add(deliveries.len() as u64, Ordering::Relaxed);
            Ok(ConsumeConcurrentlyStatus::ReconsumeLater)
        } else {
            Ok(ConsumeConcurrentlyStatus::ConsumeSuccess)
        }
    }
}

/// The property of a retry copy that names the msgId of the stored copy it retries.
const ORIGIN_MESSAGE_ID_PROPERTY: &str =
    rocketmq_model::common::message::MessageConst::PROPERTY_ORIGIN_MESSAGE_ID;

/// The broker's message as the gate sees it. The topic of a redelivered message is already
/// the original one (the client restores it from the retry topic).
pub(crate) fn to_delivery(m: &MessageExt) -> Delivery {
    let uniq_key = m
        .properties()
        .get(&cheetah_string::CheetahString::from_static_str(UNIQ_KEY_PROPERTY))
        .map(|u| u.to_string())
        .unwrap_or_default();
    // The user's properties only: those the broker reserves (UNIQ_KEY, KEYS, TAGS, the queue
    // offsets it adds on delivery, ...) are the delivery's own fields, or the broker's business.
    let properties: BTreeMap<String, String> = m
        .properties()
        .iter()
        .filter(|(k, _)| !super::is_system_property(k.as_str()))
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
    // A retry copy (read from `%RETRY%<group>`) names the copy it retries: the same stored copy.
    let stored_copy = m
        .properties()
        .get(&cheetah_string::CheetahString::from_static_str(ORIGIN_MESSAGE_ID_PROPERTY))
        .filter(|origin| !origin.is_empty())
        .map_or_else(|| m.msg_id().to_string(), |origin| origin.to_string());
    Delivery {
        broker: crate::delivery::BrokerKind::RocketMq,
        msg_id: m.msg_id().to_string(),
        stored_copy,
        uniq_key,
        topic: m.topic().to_string(),
        tags: m.get_tags().map(|t| t.to_string()).unwrap_or_default(),
        keys: m.message_inner().keys().unwrap_or_default(),
        properties,
        body: m.body().map(|b| b.to_vec()).unwrap_or_default(),
        queue_id: m.queue_id(),
        queue_offset: m.queue_offset(),
        reconsume_times: m.reconsume_times(),
        // The reconsume count says it.
        redelivered: false,
        unreadable: None,
        born_at_ms: m.born_timestamp(),
    }
}

#[cfg(test)]
mod tests {
    use async_trait::async_trait;
    use rocketmq_model::common::message::message_queue::MessageQueue;

    use super::super::runtime::CONSUME_DEADLINE;
    use super::*;

    /// A sink that never answers: a delivery stuck beyond every bound of the gate.
    struct Stuck;

    #[async_trait]
    impl Sink for Stuck {
        async fn consume(&self, _: &Delivery, _: Instant) -> Verdict {
            std::future::pending().await
        }
    }

    #[test]
    fn a_listener_call_that_runs_out_of_time_answers_reconsume_later_itself() {
        let runtime =
            tokio::runtime::Builder::new_multi_thread().worker_threads(1).enable_all().build().unwrap();
        let (faults, _unused) = tokio::sync::mpsc::unbounded_channel();
        let counters = Arc::new(ConsumerCounters::default());
        let listener = SinkListener {
            sink: Arc::new(Stuck),
            runtime: runtime.handle().clone(),
            counters: counters.clone(),
            faults,
            answer_within: Duration::from_millis(300),
        };
        let message = MessageExt::default();
        let started = Instant::now();
        // Called on a thread of its own, as the client's blocking lane calls it.
        let status = std::thread::scope(|scope| {
            scope
                .spawn(|| {
                    listener
                        .consume_message(&[&message], &ConsumeConcurrentlyContext::new(MessageQueue::new()))
                })
                .join()
                .unwrap()
        });
        let took = started.elapsed();
        assert!(matches!(status, Ok(ConsumeConcurrentlyStatus::ReconsumeLater)), "{status:?}");
        assert!(took < Duration::from_secs(2), "answered after {took:?}");
        assert_eq!(counters.retries_asked.load(Ordering::Relaxed), 1);
    }

    #[test]
    fn the_listener_answers_before_the_client_abandons_the_call() {
        assert_eq!(CONSUME_DEADLINE, Duration::from_secs(30));
        let answer_within = Limits::ROCKETMQ.answer_within;
        assert!(answer_within < CONSUME_DEADLINE, "{answer_within:?}");
    }
}
