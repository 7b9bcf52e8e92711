//! A RocketMQ producer for `idemgate produce` and for re-publishing dead letters.
//!
//! A message's UNIQ_KEY is set here when the caller chose one, so that "the same message sent
//! twice" really carries one UNIQ_KEY (the client only assigns one when none is set).

use std::time::Duration;

use anyhow::Context;
use cheetah_string::CheetahString;
use rocketmq_client_rust::DefaultMQProducer;
use rocketmq_model::common::message::MessageTrait;
use rocketmq_model::common::message::message_single::Message;

use super::{BrokerAccess, ClientHost};
use crate::delivery::{Delivery, UNIQ_KEY_PROPERTY};

/// RocketMQ's response code for a topic the broker does not (yet) have.
const TOPIC_NOT_EXIST: i32 = 17;
const TOPIC_WAIT: Duration = Duration::from_secs(10);
/// How long a send goes on trying while no broker answers.
const BROKER_GONE_WAIT: Duration = Duration::from_secs(30);

/// A started producer. Call [`Producer::shutdown`] when done.
pub struct Producer {
    producer: DefaultMQProducer,
    host: ClientHost,
}

/// What the broker said about one send.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Sent {
    /// The UNIQ_KEY the message carries.
    pub uniq_key: String,
    pub queue_offset: u64,
}

impl Producer {
    /// Starts a producer in `group`, reaching the cluster through `access` (its account, its
    /// namespace).
    pub async fn start(access: &BrokerAccess, group: &str) -> anyhow::Result<Self> {
        let host = ClientHost::new("producer", 4)?;
        let mut builder =
            DefaultMQProducer::builder(host.client_runtime()).client_config(access.client_config());
        if let Some(hook) = access.rpc_hook() {
            builder = builder.rpc_hook(hook);
        }
        let mut producer = builder.producer_group(group.to_owned()).build();
        producer
            .start()
            .await
            .with_context(|| format!("starting the producer against {}", access.describe()))?;
        Ok(Self { producer, host })
    }

    /// Sends `d`'s topic, tags, KEYS, user properties, body and (when set) UNIQ_KEY. A property
    /// the broker reserves for itself (a delivered message's queue offsets, say: a replay's
    /// properties are those it was delivered with) is left for the broker to set.
    pub async fn send(&self, d: &Delivery) -> anyhow::Result<Sent> {
        let mut builder = Message::builder().topic(d.topic.as_str()).body_slice(&d.body);
        if !d.tags.is_empty() {
            builder = builder.tags(d.tags.as_str());
        }
        if !d.keys.is_empty() {
            builder = builder.keys(d.keys.clone());
        }
        let mut message = builder.build_unchecked();
        for (k, v) in d.properties.iter().filter(|(k, _)| !super::is_system_property(k)) {
            message
                .put_property(CheetahString::from_string(k.clone()), CheetahString::from_string(v.clone()));
        }
        if !d.uniq_key.is_empty() {
            message.put_property(
                CheetahString::from_static_str(UNIQ_KEY_PROPERTY),
                CheetahString::from_string(d.uniq_key.clone()),
            );
        }
        // A topic the broker creates on first use can answer "topic not exist" (code 17) for a
        // moment: nothing was stored, so the send is retried for up to ten seconds. A broker
        // that is gone (killed, unreachable) fails the send with a transport error and no
        // response code, and the client does not try another broker after a response timeout:
        // the send is tried again, for up to thirty seconds, on the queue the client picks next,
        // so the producer moves to the brokers still up. A copy the lost broker had stored
        // before it went is a producer resend, which the gate recognises.
        let mut waited = Duration::ZERO;
        let result = loop {
            match self.producer.send(message.clone()).await {
                Err(e) if e.broker_response_code() == Some(TOPIC_NOT_EXIST) && waited < TOPIC_WAIT => {
                    tokio::time::sleep(Duration::from_millis(250)).await;
                    waited += Duration::from_millis(250);
                }
                Err(e) if e.broker_response_code().is_none() && waited < BROKER_GONE_WAIT => {
                    tracing::debug!(error = %e, "a send failed without a broker's answer; trying again");
                    tokio::time::sleep(Duration::from_millis(250)).await;
                    waited += Duration::from_millis(250);
                }
                other => break other.with_context(|| format!("sending to topic {}", d.topic))?,
            }
        }
        .context("the broker returned no send result")?;
        Ok(Sent {
            uniq_key: result.msg_id.map(|m| m.to_string()).unwrap_or_else(|| d.uniq_key.clone()),
            queue_offset: result.queue_offset,
        })
    }

    pub async fn shutdown(mut self) {
        self.producer.shutdown().await;
        self.host.shutdown().await;
    }
}
