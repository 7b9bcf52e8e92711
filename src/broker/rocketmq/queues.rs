//! What the RocketMQ client tells the consumer record ([`crate::instances`]): the queues each
//! rebalance gives this consumer and takes from it. The client calls its message-queue listener
//! with a topic's whole allocation after every rebalance that changed it; the difference from
//! the last one is what was given and taken.

use std::collections::{BTreeSet, HashMap, HashSet};
use std::sync::{Arc, Mutex};

use rocketmq_client_rust::MessageQueueListener;
use rocketmq_model::common::message::message_queue::MessageQueue;

use crate::delivery::BrokerKind;
use crate::instances::{EventKind, Record};

/// The listener: the record, and each topic's last allocation.
pub(crate) struct QueueWatch {
    record: Arc<Record>,
    held: Mutex<HashMap<String, BTreeSet<(String, i32)>>>,
}

impl QueueWatch {
    pub(crate) fn new(record: Arc<Record>) -> Self {
        Self { record, held: Mutex::new(HashMap::new()) }
    }
}

impl MessageQueueListener for QueueWatch {
    fn message_queue_changed(
        &self,
        topic: &str,
        _all: &HashSet<MessageQueue>,
        assigned: &HashSet<MessageQueue>,
    ) {
        let now: BTreeSet<(String, i32)> =
            assigned.iter().map(|q| (q.broker_name().to_string(), q.queue_id())).collect();
        let mut held = self.held.lock().unwrap_or_else(|p| p.into_inner());
        let before = held.insert(topic.to_owned(), now.clone()).unwrap_or_default();
        for (broker, queue) in before.difference(&now) {
            self.record.note(
                EventKind::Revoked,
                &BrokerKind::RocketMq.queue(topic, *queue),
                &format!("broker {broker}"),
            );
        }
        for (broker, queue) in now.difference(&before) {
            self.record.note(
                EventKind::Assigned,
                &BrokerKind::RocketMq.queue(topic, *queue),
                &format!("broker {broker}"),
            );
        }
    }
}
