//! The machine's RabbitMQ for tests and benchmarks: its URL, a check that it answers (a test
//! fails, never skips, without it), what a test reads back from a dead-letter queue, and the
//! removal of a test's queues and exchanges.

use std::time::Duration;

use anyhow::Context;
use lapin::options::{BasicGetOptions, ExchangeDeleteOptions, QueueDeleteOptions};
use lapin::types::AMQPValue;
use lapin::{Connection, ConnectionProperties};

use idemgate::broker::rabbitmq::Names;

/// `IDEMGATE_TEST_RABBITMQ_URL`, by default the local broker as guest.
pub fn url() -> String {
    std::env::var("IDEMGATE_TEST_RABBITMQ_URL")
        .unwrap_or_else(|_| "amqp://guest:guest@127.0.0.1:5672/%2f".to_owned())
}

async fn connect() -> anyhow::Result<Connection> {
    connect_to(&url()).await
}

async fn connect_to(url: &str) -> anyhow::Result<Connection> {
    tokio::time::timeout(Duration::from_secs(10), Connection::connect(url, ConnectionProperties::default()))
        .await
        .context("RabbitMQ did not answer within 10 s")?
        .with_context(|| {
            format!(
                "RabbitMQ is required at {} (IDEMGATE_TEST_RABBITMQ_URL)",
                idemgate::store::redact_url(url)
            )
        })
}

/// Fails unless RabbitMQ answers.
pub async fn require() -> anyhow::Result<()> {
    connect().await?.close(200, "bye".into()).await.context("closing")
}

/// One message taken from a queue.
#[derive(Debug, Clone)]
pub struct Taken {
    pub message_id: String,
    pub routing_key: String,
    pub headers: Vec<(String, String)>,
    pub body: Vec<u8>,
}

/// Takes (and acknowledges) every message of `queue`, at most `max`.
pub async fn take_all(queue: &str, max: usize) -> anyhow::Result<Vec<Taken>> {
    let connection = connect().await?;
    let channel = connection.create_channel().await?;
    let mut out = Vec::new();
    while out.len() < max {
        let Some(m) = channel.basic_get(queue.into(), BasicGetOptions { no_ack: true }).await? else { break };
        let headers = m
            .delivery
            .properties
            .headers()
            .as_ref()
            .map(|h| {
                h.inner()
                    .iter()
                    .filter_map(|(k, v)| match v {
                        AMQPValue::LongString(s) => {
                            Some((k.to_string(), String::from_utf8_lossy(s.as_bytes()).into_owned()))
                        }
                        _ => None,
                    })
                    .collect()
            })
            .unwrap_or_default();
        out.push(Taken {
            message_id: m
                .delivery
                .properties
                .message_id()
                .as_ref()
                .map(|s| s.to_string())
                .unwrap_or_default(),
            routing_key: m.delivery.routing_key.to_string(),
            headers,
            body: m.delivery.data.clone(),
        });
    }
    connection.close(200, "bye".into()).await?;
    Ok(out)
}

/// Removes a group's queue with its delay and dead-letter queues and their exchanges, and the
/// `exchanges` a test used.
pub async fn remove(queue: &str, exchanges: &[&str]) -> anyhow::Result<()> {
    remove_with(&url(), queue, exchanges).await
}

/// [`remove`] on the broker at `url`; an empty `queue` removes only the `exchanges`.
pub async fn remove_with(url: &str, queue: &str, exchanges: &[&str]) -> anyhow::Result<()> {
    let connection = connect_to(url).await?;
    let channel = connection.create_channel().await?;
    let mut gone: Vec<String> = exchanges.iter().map(|x| (*x).to_owned()).collect();
    if !queue.is_empty() {
        let names = Names::of(queue);
        for q in [&names.queue, &names.retry, &names.dead_queue] {
            channel.queue_delete(q.as_str().into(), QueueDeleteOptions::default()).await?;
        }
        gone.extend([names.retry, names.back, names.dead_exchange]);
    }
    for x in &gone {
        channel.exchange_delete(x.as_str().into(), ExchangeDeleteOptions::default()).await?;
    }
    connection.close(200, "bye".into()).await?;
    Ok(())
}
