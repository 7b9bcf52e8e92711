//! Kafka (through `rdkafka`, librdkafka): the consumer, the publisher and the lag per partition.
//!
//! **A batch, then its offsets.** The consumer takes what is fetched, up to
//! `kafka.max_poll_records` records, hands them to the gate together (with group commit they
//! share transactions), and only when every one has its verdict commits, per partition, the
//! offset after the last record answered. A crash before the commit makes the group read the
//! batch again: each record comes back with the same coordinates, and so the same UNIQ_KEY, and
//! a key already claimed is a `redelivery`. A producer that sends the event again writes a new
//! record at a new offset: a `producer_resend`.
//!
//! **Retry and dead-letter topics**, the usual Kafka pattern: a record the gate asks to retry is
//! written to the retry topic (`<group>.retry`) with its first coordinates, its UNIQ_KEY, its
//! retry count and the time it is due in `idemgate-*` headers. A consumer of its own (group
//! `<group>.retry`) reads that topic, and waits until a batch's last record is due before it
//! hands the batch over, so that retries never hold back the routes' topics. A dead letter is
//! written to the dead-letter topic (`<group>.dlt`) with its key, body and headers. Each write
//! is acknowledged by the brokers before the record's offset is committed; a write that still
//! fails after [`COPY_WRITES`] tries stops the consumer with the record's offset uncommitted,
//! as the service's fault: the record is read again after the restart.
//!
//! A delivery's `topic`, `queue_id` and `queue_offset` are the record's first coordinates
//! (topic, partition, offset); its msgId is where this copy was read (`topic-partition@offset`);
//! its UNIQ_KEY is the record's `UNIQ_KEY` header, or its first coordinates when it has none;
//! KEYS is the record's key; its tag is the `kafka.tag_header` header.

mod context;
mod record;
mod settings;

pub use record::coordinates;
pub use settings::{KafkaSettings, check_topic};

use record::{
    DUE_HEADER, OWN_HEADERS, REASON_HEADER, RETRIES_HEADER, ReadFrom, copy_headers, header_map, number,
    to_delivery,
};

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::Context;
use async_trait::async_trait;
use futures_util::FutureExt;
use rdkafka::admin::{AdminClient, AdminOptions, NewTopic, TopicReplication};
use rdkafka::client::DefaultClientContext;
use rdkafka::config::ClientConfig;
use rdkafka::consumer::{BaseConsumer, CommitMode, Consumer, StreamConsumer};
use rdkafka::error::RDKafkaErrorCode;
use rdkafka::message::{Header, Message, OwnedHeaders, OwnedMessage};
use rdkafka::producer::{FutureProducer, FutureRecord};
use rdkafka::{Offset, TopicPartitionList};

use super::lag::{LagReading, QueueLag, ReadResult, TopicLag};
use super::seam::{
    Answering, LagRead, Limits, Publish, Sink, Subscriber, Subscription, next_fault, spawn_watched,
};
use super::settings::StartFrom;
use crate::clock::now_ms;
use crate::delivery::{BrokerKind, Delivery, UNIQ_KEY_PROPERTY};
use crate::instances::EventKind;
use crate::outcome::Verdict;
use context::Recording;

fn client_config(settings: &KafkaSettings) -> ClientConfig {
    let mut c = ClientConfig::new();
    c.set("bootstrap.servers", &settings.bootstrap_servers)
        .set("socket.timeout.ms", settings.request_timeout_ms.max(10_000).to_string())
        .set("log_level", "4");
    c
}

/// Creates the topics that are missing, with `kafka.topic_partitions` partitions.
pub(crate) async fn create_topics(settings: &KafkaSettings, topics: &[String]) -> anyhow::Result<()> {
    let admin: AdminClient<DefaultClientContext> =
        client_config(settings).create().context("creating the Kafka admin client")?;
    let partitions = i32::try_from(settings.topic_partitions).unwrap_or(1);
    let new: Vec<NewTopic<'_>> =
        topics.iter().map(|t| NewTopic::new(t, partitions, TopicReplication::Fixed(1))).collect();
    let options = AdminOptions::new()
        .operation_timeout(Some(settings.timeout()))
        .request_timeout(Some(settings.timeout()));
    let results = tokio::time::timeout(settings.timeout() * 2, admin.create_topics(&new, &options))
        .await
        .with_context(|| format!("creating the topics {topics:?}: no answer from {}", settings.describe()))?
        .with_context(|| format!("creating the topics {topics:?} at {}", settings.describe()))?;
    for result in results {
        match result {
            Ok(_) | Err((_, RDKafkaErrorCode::TopicAlreadyExists)) => {}
            Err((topic, code)) => anyhow::bail!("creating the topic {topic:?}: {code}"),
        }
    }
    Ok(())
}

async fn send(
    producer: &FutureProducer,
    timeout: Duration,
    topic: &str,
    key: Option<&[u8]>,
    body: &[u8],
    headers: OwnedHeaders,
) -> anyhow::Result<(i32, i64)> {
    let mut record = FutureRecord::to(topic).payload(body).headers(headers);
    if let Some(key) = key {
        record = record.key(key);
    }
    let sent = tokio::time::timeout(timeout + Duration::from_secs(1), producer.send(record, timeout))
        .await
        .with_context(|| {
        format!("writing to the topic {topic:?}: no acknowledgement within {} ms", timeout.as_millis())
    })?;
    let delivered = sent.map_err(|(e, _)| e).with_context(|| format!("writing to the topic {topic:?}"))?;
    Ok((delivered.partition, delivered.offset))
}

fn producer(settings: &KafkaSettings) -> anyhow::Result<FutureProducer> {
    client_config(settings)
        .set("acks", "all")
        .set("message.timeout.ms", settings.request_timeout_ms.to_string())
        .create()
        .context("creating the Kafka producer")
}

/// A started Kafka consumer: the group's consumer of the routes' topics, and the consumer of
/// its retry topic (group `<group>.retry`), each a task of its own.
pub struct KafkaSubscriber {
    stop: tokio::sync::watch::Sender<bool>,
    tasks: Vec<tokio::task::JoinHandle<()>>,
    faults: tokio::sync::mpsc::UnboundedReceiver<String>,
    held: Arc<Held>,
}

struct Shared {
    answering: Answering,
    settings: KafkaSettings,
    producer: FutureProducer,
    retry_topic: String,
    dead_letter_topic: String,
    held: Arc<Held>,
}

/// How many times a retried or dead-lettered copy's write is tried before the consumer stops.
const COPY_WRITES: usize = 5;

impl KafkaSubscriber {
    /// Creates the missing topics (`kafka.create_topics`), joins the group on the routes'
    /// topics and `<group>.retry` on the retry topic, and starts consuming.
    pub async fn start(
        sink: Arc<dyn Sink>,
        subscription: &Subscription,
        settings: &KafkaSettings,
        start_from: StartFrom,
        consume_threads: u32,
    ) -> anyhow::Result<Self> {
        let group = &subscription.group;
        let retry_topic = settings.retry_topic_of(group);
        let dead_letter_topic = settings.dead_letter_topic_of(group);
        let topics: Vec<String> = subscription.topics.iter().map(|(t, _)| t.clone()).collect();
        for t in &topics {
            check_topic(t)
                .map_err(|why| anyhow::anyhow!("the route topic {t:?} {why} (a Kafka topic name)"))?;
        }
        if settings.create_topics {
            let mut all = topics.clone();
            all.extend([retry_topic.clone(), dead_letter_topic.clone()]);
            create_topics(settings, &all).await?;
        }
        let recording = || Recording { record: subscription.record.clone() };
        let main = consumer(settings, group, start_from, &topics, recording())?;
        // The retry consumer waits for each record's due time before it takes it: its poll
        // interval allows the longest wait.
        let retry = consumer(
            settings,
            &format!("{group}.retry"),
            StartFrom::First,
            std::slice::from_ref(&retry_topic),
            recording(),
        )?;
        let limits = Limits::kafka(settings.retry_delay_ms);
        let (answering, faults) = Answering::new(sink, subscription, consume_threads, limits);
        let held = Arc::new(Held::default());
        let shared = Arc::new(Shared {
            answering,
            settings: settings.clone(),
            producer: producer(settings)?,
            retry_topic: retry_topic.clone(),
            dead_letter_topic,
            held: held.clone(),
        });
        let (stop, stopped) = tokio::sync::watch::channel(false);
        tracing::info!(%group, ?topics, %retry_topic, broker = %settings.describe(), "consumer started");
        let tasks = vec![
            spawn_watched(
                format!("the Kafka consumer of {topics:?}"),
                shared.answering.faults.clone(),
                stopped.clone(),
                consume_until_stopped(shared.clone(), main, false, stopped.clone()),
            ),
            spawn_watched(
                format!("the Kafka consumer of the retry topic {retry_topic:?}"),
                shared.answering.faults.clone(),
                stopped.clone(),
                consume_until_stopped(shared, retry, true, stopped),
            ),
        ];
        Ok(Self { stop, tasks, faults, held })
    }
}

/// The records taken and not yet answered, per topic.
#[derive(Debug, Default)]
struct Held(std::sync::Mutex<BTreeMap<String, u64>>);

impl Held {
    fn add(&self, topics: &[String], taken: bool) {
        let mut held = self.0.lock().unwrap_or_else(|p| p.into_inner());
        for t in topics {
            let n = held.entry(t.clone()).or_default();
            *n = if taken { *n + 1 } else { n.saturating_sub(1) };
        }
    }

    fn by_topic(&self) -> BTreeMap<String, u64> {
        self.0.lock().unwrap_or_else(|p| p.into_inner()).clone()
    }
}

/// A consumer of `topics` in `group`, committing by hand.
fn consumer(
    settings: &KafkaSettings,
    group: &str,
    start_from: StartFrom,
    topics: &[String],
    context: Recording,
) -> anyhow::Result<StreamConsumer<Recording>> {
    let max_poll_interval = (u64::from(settings.retry_delay_ms) + 60_000).max(300_000);
    let consumer: StreamConsumer<Recording> = client_config(settings)
        .set("group.id", group)
        .set("enable.auto.commit", "false")
        .set("enable.auto.offset.store", "false")
        .set("enable.partition.eof", "false")
        .set("session.timeout.ms", settings.session_timeout_ms.to_string())
        .set("max.poll.interval.ms", max_poll_interval.to_string())
        .set(
            "auto.offset.reset",
            match start_from {
                StartFrom::First => "earliest",
                StartFrom::Last => "latest",
            },
        )
        .create_with_context(context)
        .context("creating the Kafka consumer")?;
    let names: Vec<&str> = topics.iter().map(String::as_str).collect();
    consumer.subscribe(&names).with_context(|| format!("subscribing to {topics:?}"))?;
    Ok(consumer)
}

#[async_trait]
impl Subscriber for KafkaSubscriber {
    async fn fault(&mut self) -> String {
        next_fault(&mut self.faults).await
    }

    async fn buffered_messages(&self) -> Option<BTreeMap<String, u64>> {
        Some(self.held.by_topic())
    }

    async fn shutdown(self: Box<Self>) {
        let _ = self.stop.send(true);
        for task in self.tasks {
            if let Err(e) = task.await {
                tracing::error!(error = %e, "the consumer's task ended badly");
            }
        }
    }
}

/// Takes batches from `consumer` until `stopped` (or until a copy cannot be written, which is
/// the service's fault), and hands each to [`handle_batch`]. The retry consumer (`retry`) first
/// waits until the batch's last record is due.
async fn consume_until_stopped(
    shared: Arc<Shared>,
    consumer: StreamConsumer<Recording>,
    retry: bool,
    mut stopped: tokio::sync::watch::Receiver<bool>,
) {
    let mut last_error: Option<String> = None;
    // The offsets committed so far, per partition: committed again, synchronously, at the stop.
    let mut answered: BTreeMap<(String, i32), i64> = BTreeMap::new();
    'batches: loop {
        let first = tokio::select! {
            _ = stopped.changed() => break,
            m = consumer.recv() => m.map(|m| m.detach()),
        };
        let first = match first {
            Ok(m) => m,
            Err(e) => {
                // librdkafka goes on by itself (a broker down, a rebalance); each new error
                // is logged once.
                let text = e.to_string();
                if e.rdkafka_error_code() == Some(rdkafka::types::RDKafkaErrorCode::PollExceeded) {
                    shared.answering.note(EventKind::ConsumeTimeout, "", &text);
                }
                if last_error.as_deref() != Some(text.as_str()) {
                    tracing::warn!(error = %text, "the Kafka consumer reports an error; it goes on");
                    last_error = Some(text);
                }
                tokio::time::sleep(Duration::from_millis(100)).await;
                continue;
            }
        };
        last_error = None;
        let mut batch = vec![first];
        while batch.len() < shared.settings.max_poll_records as usize {
            match consumer.recv().now_or_never() {
                Some(Ok(m)) => batch.push(m.detach()),
                _ => break,
            }
        }
        if retry {
            // Records come in the order they were written, each due a fixed delay after; the
            // batch waits for its last one, at most that delay.
            let due =
                batch.iter().filter_map(|m| number(&header_map(m).ok()?, DUE_HEADER)).max().unwrap_or(0);
            let wait =
                u64::try_from(due - now_ms()).unwrap_or(0).min(u64::from(shared.settings.retry_delay_ms));
            tokio::select! {
                _ = stopped.changed() => break 'batches,
                () = tokio::time::sleep(Duration::from_millis(wait)) => {}
            }
        }
        let topics: Vec<String> = batch.iter().map(|m| m.topic().to_owned()).collect();
        shared.held.add(&topics, true);
        let (committed, go_on) = handle_batch(&shared, &consumer, batch, retry).await;
        shared.held.add(&topics, false);
        answered.extend(committed);
        if !go_on {
            break;
        }
    }
    // Each batch's offsets were committed without waiting; this makes sure the last ones reached
    // the coordinator. Then the consumer leaves the group as it is dropped, which waits on the
    // coordinator: both off the runtime's threads.
    let committed = tokio::task::spawn_blocking(move || {
        // Only the partitions still assigned: another member may have read further on the rest.
        if let Ok(assigned) = consumer.assignment() {
            let mine = assigned.to_topic_map();
            answered.retain(|key, _| mine.contains_key(key));
        }
        let tpl = offsets(&answered);
        let committed = if tpl.count() == 0 { Ok(()) } else { consumer.commit(&tpl, CommitMode::Sync) };
        drop(consumer);
        committed
    })
    .await;
    if let Ok(Err(e)) = committed {
        shared.answering.note(
            context::commit_failure(&e),
            "",
            &format!("the last offsets could not be committed: {e}"),
        );
        tracing::warn!(error = %e, "the last offsets could not be committed; those records are read again");
    }
}

/// The offsets to commit, as a list.
fn offsets(next: &BTreeMap<(String, i32), i64>) -> TopicPartitionList {
    let mut tpl = TopicPartitionList::new();
    for ((topic, partition), next) in next {
        if let Err(e) = tpl.add_partition_offset(topic, *partition, Offset::Offset(*next)) {
            tracing::warn!(error = %e, %topic, partition, "an offset could not be listed for commit");
        }
    }
    tpl
}

/// Writes a copy, tried [`COPY_WRITES`] times with growing pauses.
async fn write_copy(
    shared: &Shared,
    topic: &str,
    m: &OwnedMessage,
    headers: OwnedHeaders,
) -> anyhow::Result<()> {
    use backon::BackoffBuilder;
    let mut pauses = backon::ExponentialBuilder::new()
        .with_min_delay(Duration::from_millis(200))
        .with_max_delay(Duration::from_secs(5))
        .with_jitter()
        .with_max_times(COPY_WRITES - 1)
        .build();
    loop {
        let sent = send(
            &shared.producer,
            shared.settings.timeout(),
            topic,
            m.key(),
            m.payload().unwrap_or_default(),
            headers.clone(),
        )
        .await;
        match (sent, pauses.next()) {
            (Ok(_), _) => return Ok(()),
            (Err(e), Some(pause)) => {
                tracing::warn!(error = %format!("{e:#}"), %topic, "a copy could not be written; trying again");
                tokio::time::sleep(pause).await;
            }
            (Err(e), None) => return Err(e),
        }
    }
}

/// Runs a batch through the gate, answers each verdict, and commits per partition the offset
/// after the last record answered; returns those offsets, and whether the consumer goes on. A
/// copy that cannot be written stops it, its offset uncommitted, and is the service's fault:
/// the record is read again after the restart.
async fn handle_batch(
    shared: &Shared,
    consumer: &StreamConsumer<Recording>,
    batch: Vec<OwnedMessage>,
    retry: bool,
) -> (BTreeMap<(String, i32), i64>, bool) {
    let from = if retry { ReadFrom::Retry { routed: &shared.answering.routed } } else { ReadFrom::Route };
    let ready: Vec<(OwnedMessage, Delivery)> = batch
        .into_iter()
        .map(|m| {
            let d = to_delivery(&m, &shared.settings.tag_header, from);
            (m, d)
        })
        .collect();
    // The deadline runs from each delivery's turn in the gate, not from the batch's start.
    let verdicts =
        futures_util::future::join_all(ready.iter().map(|(_, d)| shared.answering.verdict(d))).await;
    let mut commit: BTreeMap<(String, i32), i64> = BTreeMap::new();
    let mut go_on = true;
    for ((m, d), verdict) in ready.iter().zip(verdicts) {
        let written = match verdict {
            Verdict::Ack => Ok(()),
            Verdict::Retry => {
                let due = now_ms() + i64::from(shared.settings.retry_delay_ms);
                let headers = copy_headers(
                    m,
                    d,
                    &[(RETRIES_HEADER, (d.reconsume_times + 1).to_string()), (DUE_HEADER, due.to_string())],
                );
                write_copy(shared, &shared.retry_topic, m, headers).await
            }
            Verdict::DeadLetter => {
                let headers = copy_headers(
                    m,
                    d,
                    &[
                        (RETRIES_HEADER, d.reconsume_times.to_string()),
                        (REASON_HEADER, "idemgate dead letter".to_owned()),
                    ],
                );
                write_copy(shared, &shared.dead_letter_topic, m, headers).await
            }
        };
        if let Err(e) = written {
            let what = format!(
                "the {} copy of {} could not be written to Kafka: {e:#}; the consumer stops, and the record is read again",
                if verdict == Verdict::Retry { "retry" } else { "dead-letter" },
                d.msg_id
            );
            tracing::error!("{what}");
            let _ = shared.answering.faults.send(what);
            go_on = false;
            break;
        }
        commit.insert((m.topic().to_owned(), m.partition()), m.offset() + 1);
    }
    if !commit.is_empty()
        && let Err(e) = consumer.commit(&offsets(&commit), CommitMode::Async)
    {
        tracing::warn!(error = %e, "the batch's offsets could not be committed; its records are read again");
        for (topic, partition) in commit.keys() {
            shared.answering.note(
                context::commit_failure(&e),
                &BrokerKind::Kafka.queue(topic, *partition),
                &format!("the offset commit could not be sent: {e}"),
            );
        }
    }
    (commit, go_on)
}

/// Publishes to Kafka: `idemgate produce` and replay. The record goes to its topic with its
/// first KEYS as its key, its tag in the `kafka.tag_header` header, its UNIQ_KEY (a new one
/// when none is set) in `UNIQ_KEY` and its properties as headers; the brokers acknowledge it
/// (`acks=all`).
pub struct KafkaPublisher {
    settings: KafkaSettings,
    producer: FutureProducer,
    created: std::sync::Mutex<std::collections::BTreeSet<String>>,
}

impl KafkaPublisher {
    pub fn start(settings: &KafkaSettings) -> anyhow::Result<Self> {
        Ok(Self {
            settings: settings.clone(),
            producer: producer(settings)?,
            created: std::sync::Mutex::new(std::collections::BTreeSet::new()),
        })
    }
}

#[async_trait]
impl Publish for KafkaPublisher {
    async fn publish(&self, message: &Delivery) -> anyhow::Result<String> {
        check_topic(&message.topic).map_err(|why| anyhow::anyhow!("the topic {:?} {why}", message.topic))?;
        let fresh = self.settings.create_topics
            && self.created.lock().unwrap_or_else(|p| p.into_inner()).insert(message.topic.clone());
        if fresh && let Err(e) = create_topics(&self.settings, std::slice::from_ref(&message.topic)).await {
            self.created.lock().unwrap_or_else(|p| p.into_inner()).remove(&message.topic);
            return Err(e);
        }
        let uniq_key = message.uniq_key_or_new();
        let mut headers = OwnedHeaders::new();
        for (k, v) in &message.properties {
            if !OWN_HEADERS.contains(&k.as_str()) {
                headers = headers.insert(Header { key: k, value: Some(v.as_bytes()) });
            }
        }
        headers = headers.insert(Header { key: UNIQ_KEY_PROPERTY, value: Some(uniq_key.as_bytes()) });
        if !message.tags.is_empty() {
            headers = headers
                .insert(Header { key: &self.settings.tag_header, value: Some(message.tags.as_bytes()) });
        }
        let key = message.keys.first().map(String::as_bytes);
        send(&self.producer, self.settings.timeout(), &message.topic, key, &message.body, headers).await?;
        Ok(uniq_key)
    }
}

/// The lag of a group per partition: each partition's high watermark minus the group's
/// committed offset (the low watermark when the group has none yet), and the age of the oldest
/// record not yet consumed, read by fetching the record at the committed offset with a
/// consumer outside the group.
pub struct PartitionLag {
    group: String,
    timeout: Duration,
    offsets: Arc<BaseConsumer>,
    reader: Arc<std::sync::Mutex<BaseConsumer>>,
}

impl PartitionLag {
    pub fn start(settings: &KafkaSettings, group: &str, timeout: Duration) -> anyhow::Result<Self> {
        let offsets: BaseConsumer = client_config(settings)
            .set("group.id", group)
            .set("enable.auto.commit", "false")
            .create()
            .context("creating the Kafka lag reader")?;
        let reader: BaseConsumer = client_config(settings)
            .set("group.id", format!("{group}_lag_probe"))
            .set("enable.auto.commit", "false")
            .set("enable.partition.eof", "false")
            .create()
            .context("creating the Kafka lag reader")?;
        Ok(Self {
            group: group.to_owned(),
            timeout,
            offsets: Arc::new(offsets),
            reader: Arc::new(std::sync::Mutex::new(reader)),
        })
    }

    fn read_topic(
        offsets: &BaseConsumer,
        reader: &std::sync::Mutex<BaseConsumer>,
        topic: &str,
        timeout: Duration,
    ) -> TopicLag {
        let started = Instant::now();
        let left = || timeout.saturating_sub(started.elapsed());
        let metadata = match offsets.fetch_metadata(Some(topic), left()) {
            Ok(m) => m,
            Err(e) => return TopicLag::failed(topic, format!("reading the topic's partitions: {e}")),
        };
        let partitions: Vec<i32> = metadata
            .topics()
            .iter()
            .filter(|t| t.name() == topic)
            .flat_map(|t| t.partitions().iter().map(|p| p.id()))
            .collect();
        let mut tpl = TopicPartitionList::new();
        for p in &partitions {
            tpl.add_partition(topic, *p);
        }
        let committed = match offsets.committed_offsets(tpl, left()) {
            Ok(c) => c,
            Err(e) => return TopicLag::failed(topic, format!("reading the group's offsets: {e}")),
        };
        let mut queues = Vec::new();
        let mut problems = Vec::new();
        let mut oldest: Option<i64> = None;
        for p in partitions {
            let (low, high) = match offsets.fetch_watermarks(topic, p, left()) {
                Ok(w) => w,
                Err(e) => {
                    problems.push(format!("partition {p}: {e}"));
                    continue;
                }
            };
            let at = match committed.find_partition(topic, p).map(|e| e.offset()) {
                Some(Offset::Offset(o)) => o,
                _ => low,
            };
            queues.push(QueueLag { source: "partition".to_owned(), queue: p, end: high, committed: at });
            if high > at {
                match oldest_at(reader, topic, p, at, left()) {
                    Ok(Some(ms)) => oldest = Some(oldest.map_or(ms, |o| o.min(ms))),
                    Ok(None) => {
                        problems.push(format!("partition {p}: the record at {at} could not be read in time"))
                    }
                    Err(e) => problems.push(format!("partition {p}: {e}")),
                }
            }
        }
        let result = if problems.is_empty() { ReadResult::Complete } else { ReadResult::Partial };
        TopicLag {
            topic: topic.to_owned(),
            queues,
            oldest_unconsumed_ms: oldest,
            result,
            problem: (!problems.is_empty()).then(|| problems.join("; ")),
        }
    }
}

/// The timestamp of the record at `offset` of a partition, read by a consumer outside the
/// group; `None` when none arrives in `timeout`.
fn oldest_at(
    reader: &std::sync::Mutex<BaseConsumer>,
    topic: &str,
    partition: i32,
    offset: i64,
    timeout: Duration,
) -> anyhow::Result<Option<i64>> {
    let reader = reader.lock().unwrap_or_else(|p| p.into_inner());
    let mut tpl = TopicPartitionList::new();
    tpl.add_partition_offset(topic, partition, Offset::Offset(offset))?;
    reader.assign(&tpl)?;
    let started = Instant::now();
    while started.elapsed() < timeout {
        match reader.poll(timeout.saturating_sub(started.elapsed())) {
            Some(Ok(m)) if m.topic() == topic && m.partition() == partition => {
                return Ok(m.timestamp().to_millis());
            }
            Some(Ok(_)) | None => {}
            Some(Err(e)) => return Err(e.into()),
        }
    }
    Ok(None)
}

#[async_trait]
impl LagRead for PartitionLag {
    async fn read(&self, topics: &[String]) -> LagReading {
        let mut read = Vec::new();
        for topic in topics {
            let (offsets, reader, topic_owned, timeout) =
                (self.offsets.clone(), self.reader.clone(), topic.clone(), self.timeout);
            let reading = tokio::task::spawn_blocking(move || {
                PartitionLag::read_topic(&offsets, &reader, &topic_owned, timeout)
            });
            let lag = match tokio::time::timeout(self.timeout + Duration::from_secs(1), reading).await {
                Ok(Ok(lag)) => lag,
                Ok(Err(e)) => TopicLag::failed(topic, format!("the reading failed: {e}")),
                Err(_) => {
                    TopicLag::failed(topic, format!("no answer within {} ms", self.timeout.as_millis()))
                }
            };
            read.push(lag);
        }
        tracing::trace!(group = %self.group, topics = read.len(), "lag read");
        LagReading { broker: crate::delivery::BrokerKind::Kafka, read_at_ms: now_ms(), topics: read }
    }

    async fn shutdown(self: Box<Self>) {}
}
