//! What the Kafka client tells the consumer record ([`crate::instances`]): the partitions the
//! group coordinator gives the consumer and takes from it (librdkafka's rebalance callbacks,
//! run on the client's own thread before it hands over any record of a new assignment), and the
//! offset commits that failed (its commit callback).

use std::sync::Arc;

use rdkafka::ClientContext;
use rdkafka::TopicPartitionList;
use rdkafka::consumer::{BaseConsumer, ConsumerContext, Rebalance};
use rdkafka::error::{KafkaError, KafkaResult};
use rdkafka::types::RDKafkaErrorCode;

use crate::delivery::BrokerKind;
use crate::instances::{EventKind, Record};

/// The consumer's context: the record it reports to, when the service keeps one.
pub(crate) struct Recording {
    pub(crate) record: Option<Arc<Record>>,
}

impl Recording {
    fn note_each(&self, kind: EventKind, partitions: &TopicPartitionList, detail: &str) {
        let Some(record) = &self.record else { return };
        for p in partitions.elements() {
            record.note(kind, &BrokerKind::Kafka.queue(p.topic(), p.partition()), detail);
        }
    }
}

impl ClientContext for Recording {}

/// What a failed offset commit says in the record: the coordinator refusing it because the
/// group is rebalancing (the partition is being taken: `revoked`), or an answer that did not
/// reach the broker (`ack_failed`).
pub(crate) fn commit_failure(e: &KafkaError) -> EventKind {
    match e.rdkafka_error_code() {
        Some(
            RDKafkaErrorCode::RebalanceInProgress
            | RDKafkaErrorCode::IllegalGeneration
            | RDKafkaErrorCode::UnknownMemberId,
        ) => EventKind::Revoked,
        _ => EventKind::AckFailed,
    }
}

impl ConsumerContext for Recording {
    fn pre_rebalance(&self, _: &BaseConsumer<Self>, rebalance: &Rebalance<'_>) {
        if let Rebalance::Revoke(partitions) = rebalance {
            self.note_each(EventKind::Revoked, partitions, "the group coordinator took the partition");
        }
    }

    fn post_rebalance(&self, _: &BaseConsumer<Self>, rebalance: &Rebalance<'_>) {
        if let Rebalance::Assign(partitions) = rebalance {
            self.note_each(EventKind::Assigned, partitions, "the group coordinator gave the partition");
        }
    }

    fn commit_callback(&self, result: KafkaResult<()>, offsets: &TopicPartitionList) {
        if let Err(e) = result {
            self.note_each(commit_failure(&e), offsets, &format!("the offset commit failed: {e}"));
        }
    }
}
