//! Consumer lag: how far the consumer group's committed offsets trail the brokers' queues, and
//! how old the oldest message not yet consumed is, read through the RocketMQ admin API.
//!
//! One reading of a topic costs one route lookup at the name server, one consume-stats request
//! per broker of the route (each queue's max offset and the group's committed offset), and, for
//! each queue that lags, one pull of a single message at the committed offset: its store time
//! is the age of the oldest message not yet consumed. The broker's consume stats carry only the
//! store time of the last message *consumed* (`lastTimestamp`), which says nothing about how long
//! the next one has waited, hence the pull. Every request has the reading's timeout.
//!
//! The committed offsets are what the brokers hold: the client commits them every few seconds,
//! so a queue consumed to its end shows its last few messages as lag until the next commit.
//!
//! This module reads; the schedule that calls [`LagProbe::read`] lives with the service's other
//! parts (`app`), the figures go to `metrics`. It must not change any offset.

use std::time::Duration;

use anyhow::Context;
use cheetah_string::CheetahString;
#[allow(deprecated)]
use rocketmq_client_rust::DefaultMQPullConsumer;
use rocketmq_client_rust::{ClientOptions, DefaultMQAdminExt, MQAdminReadExt};
use rocketmq_model::common::message::message_queue::MessageQueue;

use super::access::BrokerAccess;
use super::runtime::ClientHost;
use crate::broker::lag::{LagReading, QueueLag, ReadResult, TopicLag};
use crate::clock::now_ms;

/// RocketMQ's response code for a topic the name server has no route for.
const TOPIC_NOT_EXIST: i32 = 17;

/// The admin client and the one-message puller that read a group's lag.
pub struct LagProbe {
    /// The group measured, as the broker names it (in its namespace).
    group: String,
    access: BrokerAccess,
    timeout: Duration,
    admin: DefaultMQAdminExt,
    /// The one-message puller, or why it did not start.
    #[allow(deprecated)]
    puller: Result<DefaultMQPullConsumer, String>,
    host: ClientHost,
}

impl LagProbe {
    /// Starts the clients that read `group`'s lag through `access` (its account and namespace);
    /// every request of a reading has `timeout`. The puller joins a group of its own
    /// (`<group>_lag_probe`), so it never takes queues from the group it measures; when it
    /// cannot start, the probe reads the messages behind without their age (each reading
    /// `partial`, saying why).
    pub async fn start(access: &BrokerAccess, group: &str, timeout: Duration) -> anyhow::Result<Self> {
        let host = ClientHost::new("lag", 1)?;
        let admin_group = format!("{group}_lag_admin");
        let mut admin = match access.rpc_hook() {
            Some(hook) => DefaultMQAdminExt::with_admin_ext_group_rpc_hook_and_timeout(
                host.client_runtime(),
                admin_group,
                hook,
                timeout,
            ),
            None => DefaultMQAdminExt::with_admin_ext_group_and_timeout(
                host.client_runtime(),
                admin_group,
                timeout,
            ),
        };
        *admin.client_config_mut() = access.client_config();
        admin
            .start()
            .await
            .with_context(|| format!("starting the lag reader against {}", access.describe()))?;
        let puller = start_puller(&host, access, &format!("{group}_lag_probe"), timeout).await.map_err(|e| {
            tracing::warn!(error = %format!("{e:#}"), "the consumer lag is read without the age of the oldest message");
            format!("{e:#}")
        });
        Ok(Self { group: access.resource(group), access: access.clone(), timeout, admin, puller, host })
    }

    /// Reads the lag of every topic in `topics`, each within the probe's timeout.
    pub async fn read(&self, topics: &[String]) -> LagReading {
        let mut out = Vec::with_capacity(topics.len());
        for topic in topics {
            let lag = match tokio::time::timeout(self.timeout, self.read_topic(topic)).await {
                Ok(Ok(lag)) => lag,
                Ok(Err(e)) => TopicLag::failed(topic, format!("{e:#}")),
                Err(_) => TopicLag::failed(topic, format!("no answer within {:?}", self.timeout)),
            };
            out.push(lag);
        }
        LagReading { broker: crate::delivery::BrokerKind::RocketMq, read_at_ms: now_ms(), topics: out }
    }

    async fn read_topic(&self, topic: &str) -> anyhow::Result<TopicLag> {
        let timeout_ms = self.timeout.as_millis() as u64;
        // The admin client names topics and groups as the broker does: in the namespace.
        let broker_topic = self.access.resource(topic);
        let route =
            match self.admin.examine_topic_route_info(CheetahString::from(broker_topic.as_str())).await {
                Ok(route) => route,
                Err(e) if e.broker_response_code() == Some(TOPIC_NOT_EXIST) => None,
                Err(e) => return Err(e).context("looking up the topic's route"),
            };
        let mut lag = TopicLag {
            topic: topic.to_owned(),
            queues: Vec::new(),
            oldest_unconsumed_ms: None,
            result: ReadResult::Complete,
            problem: None,
        };
        let Some(route) = route else { return Ok(lag) };
        let mut problems = Vec::new();
        let mut lagging = Vec::new();
        for broker in &route.broker_datas {
            let name = broker.broker_name().to_string();
            let Some(addr) = broker.broker_addrs().get(&rocketmq_model::common::mix_all::MASTER_ID) else {
                problems.push(format!("{name} has no master"));
                continue;
            };
            let stats = MQAdminReadExt::examine_consume_stats(
                &self.admin,
                CheetahString::from(self.group.as_str()),
                Some(CheetahString::from(broker_topic.as_str())),
                None,
                Some(addr.clone()),
                Some(timeout_ms),
            )
            .await;
            let stats = match stats {
                Ok(stats) => stats,
                Err(e) => {
                    problems.push(format!("{name}: {e}"));
                    continue;
                }
            };
            for (mq, offsets) in stats.get_offset_table() {
                if mq.topic_str() != broker_topic {
                    continue;
                }
                let queue = QueueLag {
                    source: mq.broker_name().to_string(),
                    queue: mq.queue_id(),
                    end: offsets.get_broker_offset(),
                    committed: offsets.get_consumer_offset().max(0),
                };
                if queue.messages() > 0 {
                    lagging.push((mq.clone(), queue.committed));
                }
                lag.queues.push(queue);
            }
        }
        lag.queues.sort_by(|a, b| (&a.source, a.queue).cmp(&(&b.source, b.queue)));
        for (mq, offset) in lagging {
            match self.store_time_at(&mq, offset).await {
                Ok(stored) => {
                    lag.oldest_unconsumed_ms =
                        Some(lag.oldest_unconsumed_ms.map_or(stored, |o| o.min(stored)));
                }
                Err(e) => problems.push(format!("{} queue {}: {e:#}", mq.broker_name(), mq.queue_id())),
            }
        }
        if !problems.is_empty() {
            lag.result = ReadResult::Partial;
            lag.problem = Some(problems.join("; "));
        }
        Ok(lag)
    }

    /// The store time of the message at `offset` of `mq`.
    #[allow(deprecated)]
    async fn store_time_at(&self, mq: &MessageQueue, offset: i64) -> anyhow::Result<i64> {
        let puller = self.puller.as_ref().map_err(|why| anyhow::anyhow!("no puller: {why}"))?;
        let pulled = puller.pull(mq, "*", offset, 1).await.context("pulling the oldest message")?;
        pulled
            .msg_found_list()
            .and_then(|found| found.first())
            .map(|m| m.store_timestamp())
            .with_context(|| format!("no message at offset {offset} ({:?})", pulled.pull_status()))
    }

    /// Stops both clients and their runtime.
    #[allow(deprecated)]
    pub async fn shutdown(mut self) {
        if let Ok(puller) = &self.puller
            && let Err(e) = puller.shutdown().await
        {
            tracing::debug!(error = %e, "the lag reader's puller did not shut down cleanly");
        }
        self.admin.shutdown().await;
        self.host.shutdown().await;
    }
}

/// A one-message puller in `group` (named without the namespace, which `access` adds), each
/// pull bounded by `timeout`: the lag reader's, which dates the oldest unconsumed message of a
/// queue in a group of its own, and the start-up check's ([`super::preflight`]).
#[allow(deprecated)]
pub(crate) async fn start_puller(
    host: &ClientHost,
    access: &BrokerAccess,
    group: &str,
    timeout: Duration,
) -> anyhow::Result<DefaultMQPullConsumer> {
    let mut builder = DefaultMQPullConsumer::builder(host.client_runtime())
        .client_options(ClientOptions::legacy(access.client_config()))
        .consumer_group(group.to_owned())
        .consumer_pull_timeout(timeout);
    if let Some(hook) = access.rpc_hook() {
        builder = builder.rpc_hook(hook);
    }
    let puller = builder.build().context("building a puller")?;
    puller.start().await.with_context(|| format!("starting a puller against {}", access.describe()))?;
    Ok(puller)
}
