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

/// Removes the queues and exchanges that test runs no longer running left behind (a test that
/// failed stops before it removes its own): every name a test makes embeds its process id
/// (`group_<pid>_<n>`, with the suffixes of [`Names`]), and those whose process is gone are
/// deleted. The names are listed with `rabbitmqctl`, as AMQP cannot list them.
pub async fn remove_stale() -> anyhow::Result<()> {
    let list = |what: &str| -> anyhow::Result<Vec<String>> {
        let out = std::process::Command::new("rabbitmqctl")
            .args(["-q", what, "name"])
            .output()
            .with_context(|| format!("rabbitmqctl {what}"))?;
        anyhow::ensure!(out.status.success(), "rabbitmqctl {what}: {}", String::from_utf8_lossy(&out.stderr));
        Ok(String::from_utf8_lossy(&out.stdout).lines().skip(1).map(str::to_owned).collect())
    };
    let stale = |name: &str| {
        let base = name.split('.').next().unwrap_or(name);
        let mut parts = base.split('_');
        let (Some(_), Some(pid), Some(n), None) = (parts.next(), parts.next(), parts.next(), parts.next())
        else {
            return false;
        };
        pid.parse::<u32>().is_ok()
            && n.parse::<u64>().is_ok()
            && !std::path::Path::new(&format!("/proc/{pid}")).exists()
    };
    let queues: Vec<String> = list("list_queues")?.into_iter().filter(|q| stale(q)).collect();
    let exchanges: Vec<String> = list("list_exchanges")?.into_iter().filter(|x| stale(x)).collect();
    if queues.is_empty() && exchanges.is_empty() {
        return Ok(());
    }
    let connection = connect().await?;
    let channel = connection.create_channel().await?;
    for q in &queues {
        channel.queue_delete(q.as_str().into(), QueueDeleteOptions::default()).await?;
    }
    for x in &exchanges {
        channel.exchange_delete(x.as_str().into(), ExchangeDeleteOptions::default()).await?;
    }
    connection.close(200, "bye".into()).await?;
    Ok(())
}

/// One entry of a message's `x-death` trail: the queue, why it left it, how often.
pub struct Death<'a> {
    pub queue: &'a str,
    pub reason: &'a str,
    pub count: i64,
}

/// Publishes `body` to `exchange` with `routing_key`, as anyone allowed to write it could: a
/// `message-id`, its `KEYS` header, an `x-first-death-exchange` header naming `first_exchange`
/// and an `x-death` trail of `deaths`, whatever RabbitMQ's own dead-lettering would have
/// written. Confirmed.
pub async fn publish_with_trail(
    exchange: &str,
    routing_key: &str,
    message_id: &str,
    keys: &str,
    first_exchange: &str,
    deaths: &[Death<'_>],
    body: &[u8],
) -> anyhow::Result<()> {
    use lapin::options::{BasicPublishOptions, ConfirmSelectOptions};
    use lapin::types::{FieldArray, FieldTable, ShortString};
    let connection = connect().await?;
    let channel = connection.create_channel().await?;
    channel.confirm_select(ConfirmSelectOptions::default()).await?;
    let mut trail = FieldArray::default();
    for d in deaths {
        let mut t = FieldTable::default();
        t.insert(ShortString::from("queue"), AMQPValue::LongString(d.queue.into()));
        t.insert(ShortString::from("reason"), AMQPValue::LongString(d.reason.into()));
        t.insert(ShortString::from("count"), AMQPValue::LongLongInt(d.count));
        t.insert(ShortString::from("exchange"), AMQPValue::LongString(first_exchange.into()));
        trail.push(AMQPValue::FieldTable(t));
    }
    let mut headers = FieldTable::default();
    headers.insert(ShortString::from("x-death"), AMQPValue::FieldArray(trail));
    headers.insert(ShortString::from("KEYS"), AMQPValue::LongString(keys.into()));
    headers.insert(ShortString::from("x-first-death-exchange"), AMQPValue::LongString(first_exchange.into()));
    let properties =
        lapin::BasicProperties::default().with_message_id(message_id.into()).with_headers(headers);
    let confirm = channel
        .basic_publish(exchange.into(), routing_key.into(), BasicPublishOptions::default(), body, properties)
        .await?;
    tokio::time::timeout(Duration::from_secs(10), confirm).await.context("no confirm within 10 s")??;
    connection.close(200, "bye".into()).await?;
    Ok(())
}
