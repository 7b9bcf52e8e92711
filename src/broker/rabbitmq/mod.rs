//! RabbitMQ (AMQP 0-9-1, through `lapin`): the consumer, the publisher and the queue's lag.
//!
//! **What it declares.** The group's queue `Q` (`rabbitmq.queue`, the group's name by default)
//! is bound to each route's topic, an exchange, with the route's tags as binding keys (`*`: all,
//! `#`). Its retries and dead letters use RabbitMQ's own dead-lettering:
//!
//! ```text
//!  route exchange ──(tags)──▶ Q ──reject──▶ Q.retry (exchange) ──▶ Q.retry (queue, TTL retry_delay_ms)
//!        ▲                                                                    │ expired
//!        └── replay                  Q ◀── Q.return (exchange) ◀──────────────┘
//!  dead letter: published to Q.dlx (exchange) ──▶ Q.dead (queue), body and headers kept, then acked
//! ```
//!
//! A retried message keeps its routing key (no queue rewrites it) and its first exchange is in
//! `x-first-death-exchange`, so its route and its topic are the original ones; the `x-death`
//! count of `Q` (reason `rejected`) is its reconsume count. The `redelivered` flag says that
//! RabbitMQ delivered it before without an answer (a channel closed, a consumer crashed): a
//! duplicate found that way is a redelivery even when the producer set no `message-id`.
//!
//! **Acknowledgement** comes after the gate's verdict, never before: `Ack` acks; `Retry`
//! rejects without requeue (into the delay queue); `DeadLetter` publishes to `Q.dlx` with
//! publisher confirms, then acks (a failed publish rejects into the delay queue instead, so
//! the message comes back). At most `rabbitmq.prefetch` messages are held unacknowledged, and
//! `broker.consume_threads` are in the gate at once. A lost connection is opened again with a
//! growing pause; what it held unacknowledged RabbitMQ delivers again, flagged `redelivered`.

mod settings;

pub use settings::RabbitMqSettings;

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use anyhow::Context;
use async_trait::async_trait;
use futures_util::StreamExt;
use lapin::options::{
    BasicAckOptions, BasicCancelOptions, BasicConsumeOptions, BasicPublishOptions, BasicQosOptions,
    BasicRejectOptions, ConfirmSelectOptions, ExchangeDeclareOptions, QueueBindOptions, QueueDeclareOptions,
};
use lapin::types::{AMQPValue, FieldTable, LongString, ShortString};
use lapin::{BasicProperties, Channel, Confirmation, Connection, ConnectionProperties, ExchangeKind};

use super::lag::{LagReading, ReadResult, TopicLag};
use super::seam::{
    Answering, LagRead, Limits, Publish, Sink, Subscriber, Subscription, next_fault, spawn_watched,
};
use crate::clock::now_ms;
use crate::delivery::{BrokerKind, Delivery};
use crate::instances::EventKind;
use crate::outcome::Verdict;

/// The header a publisher's `KEYS` travel in (space-separated, as RocketMQ's).
pub const KEYS_HEADER: &str = "KEYS";
/// Headers a dead letter gets: where the message was first sent, and why it was dead-lettered.
const DEAD_EXCHANGE_HEADER: &str = "x-idemgate-exchange";
const DEAD_ROUTING_KEY_HEADER: &str = "x-idemgate-routing-key";
const DEAD_REASON_HEADER: &str = "x-idemgate-reason";

/// The names of the queues and exchanges a group's queue comes with.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Names {
    pub queue: String,
    /// The exchange a rejected message goes to, and the delay queue bound to it.
    pub retry: String,
    /// The exchange the delay queue's expired messages go to, back to `queue`.
    pub back: String,
    /// The dead-letter exchange.
    pub dead_exchange: String,
    /// The queue dead letters are kept in.
    pub dead_queue: String,
}

impl Names {
    pub fn of(queue: &str) -> Self {
        Self {
            queue: queue.to_owned(),
            retry: format!("{queue}.retry"),
            back: format!("{queue}.return"),
            dead_exchange: format!("{queue}.dlx"),
            dead_queue: format!("{queue}.dead"),
        }
    }
}

/// The binding keys of a route's tag expression: `*` is every routing key (`#`), `a||b` two.
pub(crate) fn binding_keys(tags: &str) -> Vec<String> {
    if tags.trim() == "*" {
        return vec!["#".to_owned()];
    }
    tags.split("||").map(str::trim).filter(|t| !t.is_empty()).map(str::to_owned).collect()
}

async fn within<T>(
    limit: Duration,
    what: &str,
    f: impl Future<Output = lapin::Result<T>>,
) -> anyhow::Result<T> {
    match tokio::time::timeout(limit, f).await {
        Ok(result) => result.with_context(|| what.to_owned()),
        Err(_) => anyhow::bail!("{what}: no answer within {} ms", limit.as_millis()),
    }
}

/// Opens a connection to the broker `settings` names, within its timeout.
async fn connect(settings: &RabbitMqSettings) -> anyhow::Result<Connection> {
    let what = format!("connecting to {}", settings.describe());
    within(settings.timeout(), &what, Connection::connect(&settings.url, ConnectionProperties::default()))
        .await
}

fn durable() -> QueueDeclareOptions {
    QueueDeclareOptions { durable: true, ..QueueDeclareOptions::default() }
}

fn table(entries: &[(&str, AMQPValue)]) -> FieldTable {
    let mut t = FieldTable::default();
    for (k, v) in entries {
        t.insert(ShortString::from(*k), v.clone());
    }
    t
}

/// Declares the group's queue, its delay queue and dead-letter queue with their exchanges, and
/// binds the queue to every route's exchange. A queue that exists with other arguments (another
/// `retry_delay_ms`, say) is refused by RabbitMQ, and the refusal says which.
pub(crate) async fn declare(
    channel: &Channel,
    settings: &RabbitMqSettings,
    names: &Names,
    topics: &[(String, String)],
) -> anyhow::Result<()> {
    let limit = settings.timeout();
    let exchange = |name: &str, kind: ExchangeKind| {
        let name = name.to_owned();
        async move {
            within(
                limit,
                &format!("declaring the exchange {name:?}"),
                channel.exchange_declare(
                    name.as_str().into(),
                    kind,
                    ExchangeDeclareOptions { durable: true, ..Default::default() },
                    FieldTable::default(),
                ),
            )
            .await
        }
    };
    let queue = |name: String, args: FieldTable| async move {
        within(
            limit,
            &format!("declaring the queue {name:?} (a queue that exists with other arguments is refused: delete it, or set back what it was declared with)"),
            channel.queue_declare(name.as_str().into(), durable(), args),
        )
        .await
    };
    let bind = |q: String, x: String, key: String| async move {
        within(
            limit,
            &format!("binding the queue {q:?} to the exchange {x:?} with {key:?}"),
            channel.queue_bind(
                q.as_str().into(),
                x.as_str().into(),
                key.as_str().into(),
                QueueBindOptions::default(),
                FieldTable::default(),
            ),
        )
        .await
    };
    exchange(&names.retry, ExchangeKind::Fanout).await?;
    exchange(&names.back, ExchangeKind::Fanout).await?;
    exchange(&names.dead_exchange, ExchangeKind::Fanout).await?;
    queue(
        names.retry.clone(),
        table(&[
            ("x-message-ttl", AMQPValue::LongUInt(settings.retry_delay_ms)),
            ("x-dead-letter-exchange", AMQPValue::LongString(names.back.as_str().into())),
        ]),
    )
    .await?;
    bind(names.retry.clone(), names.retry.clone(), String::new()).await?;
    queue(names.dead_queue.clone(), FieldTable::default()).await?;
    bind(names.dead_queue.clone(), names.dead_exchange.clone(), String::new()).await?;
    queue(
        names.queue.clone(),
        table(&[("x-dead-letter-exchange", AMQPValue::LongString(names.retry.as_str().into()))]),
    )
    .await?;
    bind(names.queue.clone(), names.back.clone(), String::new()).await?;
    for (topic, tags) in topics {
        if settings.declare_exchanges {
            exchange(topic, ExchangeKind::Topic).await?;
        }
        for key in binding_keys(tags) {
            bind(names.queue.clone(), topic.clone(), key).await?;
        }
    }
    Ok(())
}

/// Declares `group`'s queue with its delay and dead-letter queues, bound to `topics`, on a
/// connection of its own: what the consumer does at start, for a queue that must take messages
/// before its consumer first runs.
pub async fn declare_group(
    settings: &RabbitMqSettings,
    group: &str,
    topics: &[(String, String)],
) -> anyhow::Result<()> {
    let connection = connect(settings).await?;
    let channel = within(settings.timeout(), "opening a channel", connection.create_channel()).await?;
    let declared = declare(&channel, settings, &Names::of(&settings.queue_of(group)), topics).await;
    let _ = tokio::time::timeout(settings.timeout(), connection.close(200, "bye".into())).await;
    declared
}

/// A header's value as text, when it is one that reads as text.
fn header_text(v: &AMQPValue) -> Option<String> {
    Some(match v {
        AMQPValue::LongString(s) => String::from_utf8(s.as_bytes().to_vec()).ok()?,
        AMQPValue::ShortString(s) => s.as_str().to_owned(),
        AMQPValue::Boolean(b) => b.to_string(),
        AMQPValue::ShortShortInt(n) => n.to_string(),
        AMQPValue::ShortShortUInt(n) => n.to_string(),
        AMQPValue::ShortInt(n) => n.to_string(),
        AMQPValue::ShortUInt(n) => n.to_string(),
        AMQPValue::LongInt(n) => n.to_string(),
        AMQPValue::LongUInt(n) => n.to_string(),
        AMQPValue::LongLongInt(n) => n.to_string(),
        AMQPValue::Timestamp(n) => n.to_string(),
        _ => return None,
    })
}

fn number(v: &AMQPValue) -> Option<i64> {
    match v {
        AMQPValue::LongLongInt(n) => Some(*n),
        AMQPValue::LongInt(n) => Some(i64::from(*n)),
        AMQPValue::LongUInt(n) => Some(i64::from(*n)),
        AMQPValue::ShortInt(n) => Some(i64::from(*n)),
        AMQPValue::ShortUInt(n) => Some(i64::from(*n)),
        AMQPValue::Timestamp(n) => i64::try_from(*n).ok(),
        _ => None,
    }
}

/// How often `queue` rejected the message, from its `x-death` header: its reconsume count.
fn rejections(headers: Option<&FieldTable>, queue: &str) -> i32 {
    let Some(AMQPValue::FieldArray(deaths)) = headers.and_then(|h| h.inner().get("x-death")) else {
        return 0;
    };
    deaths
        .as_slice()
        .iter()
        .filter_map(|d| match d {
            AMQPValue::FieldTable(t) => Some(t.inner()),
            _ => None,
        })
        .filter(|t| {
            t.get("queue").and_then(header_text).as_deref() == Some(queue)
                && t.get("reason").and_then(header_text).as_deref() == Some("rejected")
        })
        .filter_map(|t| t.get("count").and_then(number))
        .map(|n| i32::try_from(n).unwrap_or(i32::MAX))
        .max()
        .unwrap_or(0)
}

/// Whether the message's `x-death` trail shows it expired from `queue`: it came back through
/// idemgate's delay queue.
fn expired_from(headers: Option<&FieldTable>, queue: &str) -> bool {
    let Some(AMQPValue::FieldArray(deaths)) = headers.and_then(|h| h.inner().get("x-death")) else {
        return false;
    };
    deaths.as_slice().iter().any(|d| match d {
        AMQPValue::FieldTable(t) => {
            let t = t.inner();
            t.get("queue").and_then(header_text).as_deref() == Some(queue)
                && t.get("reason").and_then(header_text).as_deref() == Some("expired")
        }
        _ => false,
    })
}

/// A delivery of `names.queue` as the gate sees it. A message back from the delay queue (through
/// `names.back`) has its first exchange restored from `x-first-death-exchange` and its reconsume
/// count read from `x-death`; those headers are believed only there, only when the trail shows
/// the delay queue's expiry, and only for an exchange one of the routes (`routed`) binds. A
/// message published to the return exchange by anyone else is `unreadable`: logged `invalid`
/// and kept, its topic never a header's. Anywhere else its exchange is its own and its
/// reconsume count 0, whatever its headers say.
pub(crate) fn to_delivery(
    names: &Names,
    routed: &BTreeSet<String>,
    consumer_tag: &str,
    m: &lapin::message::Delivery,
) -> Delivery {
    let (properties, exchange, routing_key) = (&m.properties, m.exchange.as_str(), m.routing_key.as_str());
    let headers = properties.headers().as_ref();
    let mut kept = BTreeMap::new();
    let mut keys = Vec::new();
    if let Some(h) = headers {
        for (name, value) in h.inner() {
            let name = name.as_str();
            if name == "x-death" || name.starts_with("x-first-death") || name.starts_with("x-last-death") {
                continue;
            }
            let Some(text) = header_text(value) else { continue };
            if name == KEYS_HEADER {
                keys = text.split_whitespace().map(str::to_owned).collect();
            } else {
                kept.insert(name.to_owned(), text);
            }
        }
    }
    let via_delay_queue = exchange == names.back;
    let mut unreadable = None;
    let topic = if via_delay_queue {
        let first = headers.and_then(|h| h.inner().get("x-first-death-exchange")).and_then(header_text);
        match first {
            Some(first) if routed.contains(&first) && expired_from(headers, &names.retry) => first,
            _ => {
                unreadable = Some(format!(
                    "a message came through the exchange {} that the delay queue of idemgate did not send back (its x-death trail or its first exchange names no route)",
                    names.back
                ));
                exchange.to_owned()
            }
        }
    } else {
        exchange.to_owned()
    };
    let reconsume_times =
        if via_delay_queue && unreadable.is_none() { rejections(headers, &names.queue) } else { 0 };
    Delivery {
        broker: BrokerKind::RabbitMq,
        msg_id: format!("{consumer_tag}:{}", m.delivery_tag),
        // RabbitMQ names no stored copy: its `redelivered` flag is its word.
        stored_copy: String::new(),
        uniq_key: properties.message_id().as_ref().map(|m| m.as_str().to_owned()).unwrap_or_default(),
        topic,
        tags: routing_key.to_owned(),
        keys,
        properties: kept,
        body: m.data.clone(),
        queue_id: 0,
        queue_offset: i64::try_from(m.delivery_tag).unwrap_or(i64::MAX),
        reconsume_times,
        redelivered: m.redelivered,
        unreadable,
        born_at_ms: properties
            .timestamp()
            .and_then(|s| i64::try_from(s).ok())
            .map_or(0, |s| s.saturating_mul(1000)),
    }
}

/// Publishes one message to `exchange` with `routing_key`, mandatory and confirmed: an error
/// unless the broker confirmed that a queue took it.
async fn publish_confirmed(
    channel: &Channel,
    limit: Duration,
    exchange: &str,
    routing_key: &str,
    body: &[u8],
    properties: BasicProperties,
) -> anyhow::Result<()> {
    let what = format!("publishing to the exchange {exchange:?} with routing key {routing_key:?}");
    let confirm = within(
        limit,
        &what,
        channel.basic_publish(
            exchange.into(),
            routing_key.into(),
            BasicPublishOptions { mandatory: true, ..Default::default() },
            body,
            properties,
        ),
    )
    .await?;
    match within(limit, &what, confirm).await? {
        Confirmation::Ack(None) => Ok(()),
        Confirmation::Ack(Some(_)) => anyhow::bail!(
            "{what}: no queue is bound to take it (the consumer declares its bindings at start)"
        ),
        Confirmation::Nack(_) => anyhow::bail!("{what}: the broker refused it"),
        Confirmation::NotRequested => anyhow::bail!("{what}: the channel has no publisher confirms"),
    }
}

/// A started RabbitMQ consumer.
pub struct RabbitSubscriber {
    stop: tokio::sync::watch::Sender<bool>,
    task: tokio::task::JoinHandle<()>,
    faults: tokio::sync::mpsc::UnboundedReceiver<String>,
    held: Arc<AtomicU64>,
    queue: String,
}

/// What a consumer session shares with the tasks of its deliveries.
struct Shared {
    answering: Answering,
    settings: RabbitMqSettings,
    names: Names,
    held: Arc<AtomicU64>,
}

/// The longest pause between two attempts at a lost connection.
const MAX_RECONNECT_PAUSE: Duration = Duration::from_secs(10);

impl RabbitSubscriber {
    /// Connects, declares the queues and bindings (a failure here stops the start, with the
    /// reason) and starts consuming.
    pub async fn start(
        sink: Arc<dyn Sink>,
        subscription: &Subscription,
        settings: &RabbitMqSettings,
        consume_threads: u32,
    ) -> anyhow::Result<Self> {
        let names = Names::of(&settings.queue_of(&subscription.group));
        // The first connection and declaration are checked here, so that a wrong URL, account
        // or argument stops `serve` at once with the reason.
        let connection = connect(settings).await?;
        let channel = within(settings.timeout(), "opening a channel", connection.create_channel()).await?;
        declare(&channel, settings, &names, &subscription.topics).await?;
        let limits = Limits::rabbitmq(settings.retry_delay_ms);
        let (answering, faults) = Answering::new(sink, subscription, consume_threads, limits);
        let held = Arc::new(AtomicU64::new(0));
        let shared = Arc::new(Shared {
            answering,
            settings: settings.clone(),
            names: names.clone(),
            held: held.clone(),
        });
        let (stop, stopped) = tokio::sync::watch::channel(false);
        tracing::info!(
            group = %subscription.group, queue = %names.queue, broker = %settings.describe(),
            prefetch = settings.prefetch, "consumer started"
        );
        let task = spawn_watched(
            format!("the RabbitMQ consumer of the queue {:?}", names.queue),
            shared.answering.faults.clone(),
            stopped.clone(),
            consume_until_stopped(shared, connection, channel, stopped),
        );
        Ok(Self { stop, task, faults, held, queue: names.queue })
    }
}

#[async_trait]
impl Subscriber for RabbitSubscriber {
    async fn fault(&mut self) -> String {
        next_fault(&mut self.faults).await
    }

    async fn buffered_messages(&self) -> Option<BTreeMap<String, u64>> {
        Some(BTreeMap::from([(self.queue.clone(), self.held.load(Ordering::Relaxed))]))
    }

    async fn shutdown(self: Box<Self>) {
        let _ = self.stop.send(true);
        if let Err(e) = self.task.await {
            tracing::error!(error = %e, "the consumer's task ended badly");
        }
    }
}

/// The pauses between attempts at a lost connection: from 250 ms, doubling with jitter, up to
/// [`MAX_RECONNECT_PAUSE`], without end.
fn reconnect_pauses() -> backon::ExponentialBackoff {
    use backon::BackoffBuilder;
    backon::ExponentialBuilder::new()
        .with_min_delay(Duration::from_millis(250))
        .with_max_delay(MAX_RECONNECT_PAUSE)
        .with_jitter()
        .without_max_times()
        .build()
}

/// Sessions, one per connection, until `stopped`; a lost connection is opened again after
/// [`reconnect_pauses`], which start over once a connection opens.
async fn consume_until_stopped(
    shared: Arc<Shared>,
    connection: Connection,
    channel: Channel,
    mut stopped: tokio::sync::watch::Receiver<bool>,
) {
    let mut first = Some((connection, channel));
    let mut pauses = reconnect_pauses();
    let mut session_number = 0_u32;
    loop {
        let opened = match first.take() {
            Some(open) => Ok(open),
            None => {
                async {
                    let connection = connect(&shared.settings).await?;
                    let channel =
                        within(shared.settings.timeout(), "opening a channel", connection.create_channel())
                            .await?;
                    declare(&channel, &shared.settings, &shared.names, &[]).await?;
                    anyhow::Ok((connection, channel))
                }
                .await
            }
        };
        let ended = match opened {
            Ok((connection, channel)) => {
                session_number += 1;
                pauses = reconnect_pauses();
                let ended = session(&shared, &connection, &channel, session_number, &mut stopped).await;
                let _ = tokio::time::timeout(shared.settings.timeout(), connection.close(200, "bye".into()))
                    .await;
                ended
            }
            Err(e) => Err(e),
        };
        match ended {
            Ok(()) => return,
            Err(e) if *stopped.borrow() => {
                tracing::debug!(error = %format!("{e:#}"), "the consumer stopped");
                return;
            }
            Err(e) => {
                let pause = pauses.next().unwrap_or(MAX_RECONNECT_PAUSE);
                tracing::warn!(
                    error = %format!("{e:#}"), retry_ms = pause.as_millis() as u64,
                    "the RabbitMQ connection is lost; connecting again (unacknowledged messages come back redelivered)"
                );
                tokio::select! {
                    _ = stopped.changed() => return,
                    () = tokio::time::sleep(pause) => {}
                }
            }
        }
    }
}

/// One connection's consumption: `Ok` when stopped (after the deliveries in flight are
/// answered), an error when the connection or the consumer is lost.
async fn session(
    shared: &Arc<Shared>,
    connection: &Connection,
    channel: &Channel,
    number: u32,
    stopped: &mut tokio::sync::watch::Receiver<bool>,
) -> anyhow::Result<()> {
    let limit = shared.settings.timeout();
    within(
        limit,
        "setting the prefetch",
        channel.basic_qos(shared.settings.prefetch, BasicQosOptions::default()),
    )
    .await?;
    let publisher = within(limit, "opening the dead-letter channel", connection.create_channel()).await?;
    within(limit, "turning on publisher confirms", publisher.confirm_select(ConfirmSelectOptions::default()))
        .await?;
    let publisher = Arc::new(publisher);
    let tag = format!("idemgate-{:08x}-{number}", rand::random::<u32>());
    let mut consumer = within(
        limit,
        &format!("consuming the queue {:?}", shared.names.queue),
        channel.basic_consume(
            shared.names.queue.as_str().into(),
            tag.as_str().into(),
            BasicConsumeOptions::default(),
            FieldTable::default(),
        ),
    )
    .await?;
    shared.answering.note(
        EventKind::Assigned,
        "",
        &format!("consuming the queue {} (consumer tag {tag})", shared.names.queue),
    );
    let mut in_flight = tokio::task::JoinSet::new();
    let lost = loop {
        tokio::select! {
            _ = stopped.changed() => break None,
            next = consumer.next() => match next {
                Some(Ok(delivery)) => {
                    shared.held.fetch_add(1, Ordering::Relaxed);
                    let (shared, publisher, tag) = (shared.clone(), publisher.clone(), tag.clone());
                    in_flight.spawn(async move {
                        answer(&shared, &publisher, &tag, delivery).await;
                        shared.held.fetch_sub(1, Ordering::Relaxed);
                    });
                }
                Some(Err(e)) => {
                    note_channel_lost(shared, &e.to_string());
                    break Some(anyhow::Error::new(e).context("the consumer's channel failed"));
                }
                None => {
                    shared.answering.note(EventKind::Revoked, "", "the broker cancelled the consumer");
                    break Some(anyhow::anyhow!("the broker cancelled the consumer"));
                }
            },
            Some(done) = in_flight.join_next(), if !in_flight.is_empty() => {
                if let Err(e) = done {
                    let _ = shared.answering.faults.send(format!("a delivery's task failed: {e}"));
                }
            }
        }
    };
    if lost.is_none() {
        let _ = tokio::time::timeout(
            limit,
            channel.basic_cancel(tag.as_str().into(), BasicCancelOptions::default()),
        )
        .await;
    }
    // The deliveries in flight are answered (each by its deadline) before the channel closes.
    let drained = tokio::time::timeout(shared.answering.within() + limit, async {
        while in_flight.join_next().await.is_some() {}
    })
    .await;
    if drained.is_err() {
        tracing::error!("deliveries still in flight at the consumer's stop; RabbitMQ delivers them again");
    }
    if lost.is_none() {
        // Each channel closed in turn, before the connection.
        for c in [publisher.as_ref(), channel] {
            let _ = tokio::time::timeout(limit, c.close(200, "bye".into())).await;
        }
    }
    match lost {
        None => Ok(()),
        Some(e) => Err(e),
    }
}

/// Runs one delivery through the gate and answers RabbitMQ by its verdict.
async fn answer(shared: &Shared, publisher: &Channel, tag: &str, m: lapin::message::Delivery) {
    let d = to_delivery(&shared.names, &shared.answering.routed, tag, &m);
    // The deadline runs from the delivery's turn in the gate, not from its arrival.
    let verdict = shared.answering.verdict(&d).await;
    let answered = match verdict {
        Verdict::Ack => m.acker.ack(BasicAckOptions::default()).await.map(|_| ()),
        Verdict::Retry => m.acker.reject(BasicRejectOptions { requeue: false }).await.map(|_| ()),
        Verdict::DeadLetter => {
            let mut headers = m.properties.headers().clone().unwrap_or_default();
            headers.insert(DEAD_EXCHANGE_HEADER.into(), AMQPValue::LongString(d.topic.as_str().into()));
            headers.insert(DEAD_ROUTING_KEY_HEADER.into(), AMQPValue::LongString(d.tags.as_str().into()));
            headers.insert(DEAD_REASON_HEADER.into(), AMQPValue::LongString("idemgate dead letter".into()));
            let properties = m.properties.clone().with_headers(headers);
            match publish_confirmed(
                publisher,
                shared.settings.timeout(),
                &shared.names.dead_exchange,
                &d.tags,
                &m.data,
                properties,
            )
            .await
            {
                Ok(()) => m.acker.ack(BasicAckOptions::default()).await.map(|_| ()),
                Err(e) => {
                    tracing::error!(
                        error = %format!("{e:#}"), msg_id = %d.msg_id,
                        "a dead letter could not be kept in the dead-letter queue; it goes to the delay queue and comes back"
                    );
                    m.acker.reject(BasicRejectOptions { requeue: false }).await.map(|_| ())
                }
            }
        }
    };
    if let Err(e) = answered {
        // The channel is gone: RabbitMQ delivers the message again on the next connection.
        tracing::warn!(error = %e, msg_id = %d.msg_id, ?verdict, "the answer did not reach RabbitMQ; the message comes back redelivered");
        note_channel_lost(
            shared,
            &format!("the answer to delivery tag {} did not reach RabbitMQ: {e}", m.delivery_tag),
        );
    }
}

/// What a lost channel says in the consumer record: RabbitMQ's own timeout (the channel closed
/// with `PRECONDITION_FAILED` because a delivery was not acknowledged within its
/// `consumer_timeout`), or an answer that can no longer reach the broker.
fn note_channel_lost(shared: &Shared, error: &str) {
    let kind = if is_consumer_timeout(error) { EventKind::ConsumeTimeout } else { EventKind::AckFailed };
    shared.answering.note(kind, "", error);
}

/// Whether `error` is RabbitMQ closing a channel for its `consumer_timeout`: "delivery
/// acknowledgement on channel N timed out".
fn is_consumer_timeout(error: &str) -> bool {
    let error = error.to_ascii_lowercase();
    error.contains("acknowledgement") && error.contains("timed out")
}

/// Publishes to RabbitMQ: `idemgate produce` and replay. Each message goes to its topic (the
/// exchange) with its tags as the routing key, persistent, with its UNIQ_KEY (a new one when
/// none is set) as the AMQP `message-id`, its KEYS in the `KEYS` header and its properties as
/// headers; the broker confirms that a queue took it. A connection lost between two sends is
/// opened again on the next.
pub struct Publisher {
    settings: RabbitMqSettings,
    open: tokio::sync::Mutex<Option<(Connection, Channel)>>,
    declared: std::sync::Mutex<std::collections::BTreeSet<String>>,
}

impl Publisher {
    pub async fn start(settings: &RabbitMqSettings) -> anyhow::Result<Self> {
        let publisher = Self {
            settings: settings.clone(),
            open: tokio::sync::Mutex::new(None),
            declared: std::sync::Mutex::new(std::collections::BTreeSet::new()),
        };
        *publisher.open.lock().await = Some(publisher.open_channel().await?);
        Ok(publisher)
    }

    async fn open_channel(&self) -> anyhow::Result<(Connection, Channel)> {
        let connection = connect(&self.settings).await?;
        let limit = self.settings.timeout();
        let channel = within(limit, "opening a channel", connection.create_channel()).await?;
        within(
            limit,
            "turning on publisher confirms",
            channel.confirm_select(ConfirmSelectOptions::default()),
        )
        .await?;
        Ok((connection, channel))
    }
}

#[async_trait]
impl Publish for Publisher {
    async fn publish(&self, message: &Delivery) -> anyhow::Result<String> {
        let uniq_key = message.uniq_key_or_new();
        let mut headers = FieldTable::default();
        for (k, v) in &message.properties {
            headers.insert(k.as_str().into(), AMQPValue::LongString(LongString::from(v.as_str())));
        }
        if !message.keys.is_empty() {
            headers.insert(KEYS_HEADER.into(), AMQPValue::LongString(message.keys.join(" ").into()));
        }
        let born = if message.born_at_ms > 0 { message.born_at_ms } else { now_ms() };
        let properties = BasicProperties::default()
            .with_message_id(uniq_key.as_str().into())
            .with_delivery_mode(2)
            .with_timestamp(u64::try_from(born / 1000).unwrap_or(0))
            .with_headers(headers);
        let mut open = self.open.lock().await;
        if open.as_ref().is_none_or(|(c, ch)| !c.status().connected() || !ch.status().connected()) {
            *open = Some(self.open_channel().await?);
        }
        let (_, channel) = open.as_ref().expect("opened above");
        let fresh = self.settings.declare_exchanges
            && self.declared.lock().unwrap_or_else(|p| p.into_inner()).insert(message.topic.clone());
        if fresh {
            let declared = within(
                self.settings.timeout(),
                &format!("declaring the exchange {:?}", message.topic),
                channel.exchange_declare(
                    message.topic.as_str().into(),
                    ExchangeKind::Topic,
                    ExchangeDeclareOptions { durable: true, ..Default::default() },
                    FieldTable::default(),
                ),
            )
            .await;
            if let Err(e) = declared {
                self.declared.lock().unwrap_or_else(|p| p.into_inner()).remove(&message.topic);
                *open = None;
                return Err(e);
            }
        }
        let sent = publish_confirmed(
            channel,
            self.settings.timeout(),
            &message.topic,
            &message.tags,
            &message.body,
            properties,
        )
        .await;
        if sent.is_err() && !channel.status().connected() {
            *open = None;
        }
        sent.map(|()| uniq_key)
    }

    async fn shutdown(self: Box<Self>) {
        if let Some((connection, _)) = self.open.lock().await.take() {
            let _ = tokio::time::timeout(self.settings.timeout(), connection.close(200, "bye".into())).await;
        }
    }
}

/// The lag of a group's queue: its ready messages and those waiting in its delay queue, read
/// with a passive declare of each (the management plugin is not needed). The messages held
/// unacknowledged are what the consumer holds (`idemgate_consumer_buffered_messages`).
/// RabbitMQ tells no message's age without taking it, so the age is not read.
pub struct QueueDepth {
    settings: RabbitMqSettings,
    names: Names,
    timeout: Duration,
    open: tokio::sync::Mutex<Option<(Connection, Channel)>>,
}

impl QueueDepth {
    pub async fn start(settings: &RabbitMqSettings, group: &str, timeout: Duration) -> anyhow::Result<Self> {
        Ok(Self {
            settings: settings.clone(),
            names: Names::of(&settings.queue_of(group)),
            timeout,
            open: tokio::sync::Mutex::new(None),
        })
    }

    async fn ready(&self, queue: &str) -> anyhow::Result<u32> {
        let mut open = self.open.lock().await;
        if open.as_ref().is_none_or(|(c, ch)| !c.status().connected() || !ch.status().connected()) {
            let connection = connect(&self.settings).await?;
            let channel = within(self.timeout, "opening a channel", connection.create_channel()).await?;
            *open = Some((connection, channel));
        }
        let (_, channel) = open.as_ref().expect("opened above");
        let declared = within(
            self.timeout,
            &format!("reading the queue {queue:?}"),
            channel.queue_declare(
                queue.into(),
                QueueDeclareOptions { passive: true, ..Default::default() },
                FieldTable::default(),
            ),
        )
        .await;
        if declared.is_err() {
            // A passive declare of a missing queue closes the channel.
            *open = None;
        }
        Ok(declared?.message_count())
    }
}

#[async_trait]
impl LagRead for QueueDepth {
    async fn read(&self, _topics: &[String]) -> LagReading {
        let mut queues = Vec::new();
        let mut problems = Vec::new();
        for (i, queue) in [&self.names.queue, &self.names.retry].into_iter().enumerate() {
            match tokio::time::timeout(self.timeout, self.ready(queue)).await {
                Ok(Ok(ready)) => queues.push(super::lag::QueueLag {
                    source: queue.clone(),
                    queue: i as i32,
                    end: i64::from(ready),
                    committed: 0,
                }),
                Ok(Err(e)) => problems.push(format!("{e:#}")),
                Err(_) => problems
                    .push(format!("reading {queue:?} took longer than {} ms", self.timeout.as_millis())),
            }
        }
        let result = match (queues.is_empty(), problems.is_empty()) {
            (_, true) => ReadResult::Complete,
            (false, false) => ReadResult::Partial,
            (true, false) => ReadResult::Failed,
        };
        LagReading {
            broker: BrokerKind::RabbitMq,
            read_at_ms: now_ms(),
            topics: vec![TopicLag {
                topic: self.names.queue.clone(),
                queues,
                oldest_unconsumed_ms: None,
                result,
                problem: (!problems.is_empty()).then(|| problems.join("; ")),
            }],
        }
    }

    async fn shutdown(self: Box<Self>) {
        if let Some((connection, _)) = self.open.lock().await.take() {
            let _ = tokio::time::timeout(self.timeout, connection.close(200, "bye".into())).await;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tag_expressions_become_binding_keys() {
        assert_eq!(binding_keys("*"), vec!["#"]);
        assert_eq!(binding_keys("order.create||payment.confirm"), vec!["order.create", "payment.confirm"]);
        assert_eq!(binding_keys("a"), vec!["a"]);
    }

    fn death(queue: &str, reason: &str, count: i64) -> AMQPValue {
        AMQPValue::FieldTable(table(&[
            ("queue", AMQPValue::LongString(queue.into())),
            ("reason", AMQPValue::LongString(reason.into())),
            ("count", AMQPValue::LongLongInt(count)),
            ("exchange", AMQPValue::LongString("shop".into())),
        ]))
    }

    #[test]
    fn a_message_back_from_the_delay_queue_has_its_exchange_and_reconsume_count() {
        let names = Names::of("g1");
        let mut deaths = lapin::types::FieldArray::default();
        deaths.push(death("g1.retry", "expired", 2));
        deaths.push(death("g1", "rejected", 2));
        let headers = table(&[
            ("x-death", AMQPValue::FieldArray(deaths)),
            ("x-first-death-exchange", AMQPValue::LongString("shop".into())),
            ("KEYS", AMQPValue::LongString("K1 K2".into())),
            ("traceparent", AMQPValue::LongString("00-abc".into())),
            ("attempt", AMQPValue::LongInt(3)),
        ]);
        let properties = BasicProperties::default()
            .with_message_id("U1".into())
            .with_timestamp(1_700_000_000)
            .with_headers(headers);
        let mut m = lapin::message::Delivery::mock(
            7,
            "g1.return".into(),
            "order.create".into(),
            true,
            b"{}".to_vec(),
        );
        m.properties = properties;
        let d = to_delivery(&names, &routed(), "ctag", &m);
        assert_eq!(d.broker, BrokerKind::RabbitMq);
        assert_eq!((d.topic.as_str(), d.tags.as_str()), ("shop", "order.create"));
        assert_eq!(d.reconsume_times, 2);
        assert_eq!(d.uniq_key, "U1");
        assert_eq!(d.msg_id, "ctag:7");
        assert_eq!(d.queue_offset, 7);
        assert!(d.redelivered);
        assert_eq!(d.keys, vec!["K1", "K2"]);
        assert_eq!(d.born_at_ms, 1_700_000_000_000);
        assert_eq!(d.property("traceparent"), Some("00-abc"));
        assert_eq!(d.property("attempt"), Some("3"));
        assert!(d.properties.keys().all(|k| !k.starts_with("x-")), "{:?}", d.properties);
    }

    #[test]
    fn a_first_delivery_keeps_its_exchange_and_has_no_reconsume_count() {
        let names = Names::of("g1");
        let m = lapin::message::Delivery::mock(1, "shop".into(), "stock.deduct".into(), false, vec![]);
        let d = to_delivery(&names, &routed(), "c", &m);
        assert_eq!((d.topic.as_str(), d.reconsume_times, d.uniq_key.as_str()), ("shop", 0, ""));
        assert!(!d.redelivered);
        assert_eq!(d.unreadable, None);
    }

    fn routed() -> BTreeSet<String> {
        BTreeSet::from(["shop".to_owned()])
    }

    fn with_headers(exchange: &str, headers: FieldTable) -> lapin::message::Delivery {
        let mut m =
            lapin::message::Delivery::mock(3, exchange.into(), "order.create".into(), false, b"{}".to_vec());
        m.properties = BasicProperties::default().with_headers(headers);
        m
    }

    #[test]
    fn a_forged_trail_on_a_route_s_exchange_is_not_believed() {
        let names = Names::of("g1");
        let mut deaths = lapin::types::FieldArray::default();
        deaths.push(death("g1", "rejected", 99));
        let headers = table(&[
            ("x-death", AMQPValue::FieldArray(deaths)),
            ("x-first-death-exchange", AMQPValue::LongString("payments".into())),
        ]);
        let d = to_delivery(&names, &routed(), "c", &with_headers("shop", headers));
        assert_eq!((d.topic.as_str(), d.reconsume_times), ("shop", 0));
        assert_eq!(d.unreadable, None);
    }

    #[test]
    fn the_return_exchange_believes_only_a_trail_through_the_delay_queue_to_a_route() {
        let names = Names::of("g1");
        let trail = |first: &str, through_delay: bool| {
            let mut deaths = lapin::types::FieldArray::default();
            if through_delay {
                deaths.push(death("g1.retry", "expired", 1));
            }
            deaths.push(death("g1", "rejected", 1));
            table(&[
                ("x-death", AMQPValue::FieldArray(deaths)),
                ("x-first-death-exchange", AMQPValue::LongString(first.into())),
            ])
        };
        let d = to_delivery(&names, &routed(), "c", &with_headers("g1.return", trail("shop", true)));
        assert_eq!((d.topic.as_str(), d.reconsume_times, d.unreadable.is_none()), ("shop", 1, true));
        for (first, through_delay) in [("payments", true), ("shop", false)] {
            let d =
                to_delivery(&names, &routed(), "c", &with_headers("g1.return", trail(first, through_delay)));
            assert_eq!((d.topic.as_str(), d.reconsume_times), ("g1.return", 0), "{first} {through_delay}");
            assert!(
                d.unreadable.as_deref().is_some_and(|u| u.contains("did not send back")),
                "{:?}",
                d.unreadable
            );
        }
    }
}
