//! The start-up check of the consumer's rights: before the push consumer starts, one pull of
//! one message from the first queue of each subscribed topic, as the consumer group and signed
//! as its account. A broker that refuses it (wrong credentials, an unknown account, no
//! subscribe right on the topic or the group) fails `serve` at once with a message that names
//! the broker and the account, never the secret; left to the push consumer, the same refusal
//! would only be logged on every pull while nothing is consumed.
//!
//! The pull reads and commits nothing. A topic without a route yet (its first send creates it)
//! and a broker that does not answer are not refusals: the consumer starts and waits for them
//! as it always does, and the check says so in the log.

use std::time::Duration;

use super::lag::start_puller;
use super::{BrokerAccess, ClientHost};

/// The longest the whole check may take.
const CHECK_TIMEOUT: Duration = Duration::from_secs(10);
/// Each pull's own bound.
const PULL_TIMEOUT: Duration = Duration::from_secs(3);

/// The broker answered the check with a refusal.
#[derive(Debug, thiserror::Error)]
#[error(
    "the broker at {broker} refused {who} for consuming topic {topic:?} as group {group:?}: {reason} \
     (broker code {code}); check the account's secret and its rights (see \"Joining a production cluster\" \
     in docs/running.md)"
)]
pub struct Refused {
    pub broker: String,
    pub who: String,
    pub topic: String,
    pub group: String,
    pub code: i32,
    pub reason: String,
}

/// Checks that `access` may consume every one of `topics` as `group`; `Err` with a [`Refused`]
/// when a broker refuses.
pub(crate) async fn check_consume_rights(
    access: &BrokerAccess,
    group: &str,
    topics: &[String],
) -> anyhow::Result<()> {
    let host = ClientHost::new("check", 1)?;
    let checked = tokio::time::timeout(CHECK_TIMEOUT, check_with(&host, access, group, topics)).await;
    host.shutdown().await;
    match checked {
        Ok(result) => result,
        Err(_) => {
            tracing::warn!(
                waited_s = CHECK_TIMEOUT.as_secs(), broker = %access.describe(),
                "the start-up check of the consumer's rights had no answer in time; starting the consumer anyway"
            );
            Ok(())
        }
    }
}

#[allow(deprecated)]
async fn check_with(
    host: &ClientHost,
    access: &BrokerAccess,
    group: &str,
    topics: &[String],
) -> anyhow::Result<()> {
    let puller = start_puller(host, access, group, PULL_TIMEOUT).await?;
    let mut outcome = Ok(());
    for topic in topics {
        let queues = match puller.fetch_subscribe_message_queues(topic).await {
            Ok(queues) if !queues.is_empty() => queues,
            _ => {
                tracing::info!(%topic, "the topic has no route yet; its rights are checked by the consumer's first pull");
                continue;
            }
        };
        let Some(queue) = queues.iter().min_by_key(|q| (q.broker_name().to_string(), q.queue_id())) else {
            continue;
        };
        match puller.pull(queue, "*", 0, 1).await {
            Ok(_) => tracing::info!(%topic, %group, "the account may consume the topic"),
            Err(e) => match e.broker_response_code() {
                Some(code) => {
                    outcome = Err(anyhow::Error::new(Refused {
                        broker: e
                            .broker_addr()
                            .map(str::to_owned)
                            .unwrap_or_else(|| queue.broker_name().to_string()),
                        who: access.describe(),
                        topic: topic.clone(),
                        group: group.to_owned(),
                        code,
                        reason: e.to_string(),
                    }));
                    break;
                }
                None => tracing::warn!(
                    %topic, error = %e,
                    "the start-up check could not reach the topic's broker; the consumer will keep trying"
                ),
            },
        }
    }
    if let Err(e) = puller.shutdown().await {
        tracing::debug!(error = %e, "the start-up check's puller did not shut down cleanly");
    }
    outcome
}
