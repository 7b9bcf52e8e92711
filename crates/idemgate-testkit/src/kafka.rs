//! A private Kafka-compatible broker for tests and benchmarks: [`LocalKafka`], `tansu` on a free
//! loopback port with its in-memory storage. The binary comes from `scripts/install-tansu.sh`
//! (installed once per machine, outside the clone). The process is stopped when its owner is
//! dropped, and by a watchdog if this process dies first.

use std::net::TcpStream;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context, bail};

use crate::broker::{free_port_run, watch_over};

/// How long tansu may take to listen.
const READY_WITHIN: Duration = Duration::from_secs(30);

/// A running tansu broker.
pub struct LocalKafka {
    bootstrap: String,
    child: Child,
    log: PathBuf,
    _dir: tempfile::TempDir,
}

impl LocalKafka {
    /// Where `scripts/install-tansu.sh` puts the binary: `$IDEMGATE_TANSU_ROOT/bin/tansu`, by
    /// default `~/.cache/idemgate/tansu-0.6.0-p2/bin/tansu`.
    pub fn binary() -> PathBuf {
        let root = std::env::var_os("IDEMGATE_TANSU_ROOT").map(PathBuf::from).unwrap_or_else(|| {
            PathBuf::from(std::env::var_os("HOME").unwrap_or_default()).join(".cache/idemgate/tansu-0.6.0-p2")
        });
        root.join("bin/tansu")
    }

    /// Starts tansu on a free port and waits until it takes connections. It logs at `warn`, or
    /// as `IDEMGATE_TANSU_LOG` says (its `RUST_LOG`, e.g.
    /// `warn,tansu_broker::coordinator=debug` to follow the group coordinator).
    pub fn start() -> anyhow::Result<Self> {
        let bin = Self::binary();
        if !bin.is_file() {
            bail!(
                "tansu is not at {}: run scripts/install-tansu.sh (or set IDEMGATE_TANSU_ROOT)",
                bin.display()
            );
        }
        let dir = tempfile::Builder::new()
            .prefix(&format!("idemgate-tansu-{}-", std::process::id()))
            .tempdir()
            .context("temporary folder")?;
        let port = free_port_run(1)?;
        let url = format!("tcp://127.0.0.1:{port}");
        let log = dir.path().join("tansu.log");
        let out = std::fs::File::create(&log).context("creating a log file")?;
        let child = Command::new(&bin)
            .args(["broker", "--listener-url", &url, "--advertised-listener-url", &url])
            .args(["--storage-engine", "memory://tansu/"])
            .env("RUST_LOG", std::env::var("IDEMGATE_TANSU_LOG").unwrap_or_else(|_| "warn".to_owned()))
            .current_dir(dir.path())
            .stdin(Stdio::null())
            .stdout(out.try_clone().context("creating a log file")?)
            .stderr(out)
            .spawn()
            .with_context(|| format!("starting {}", bin.display()))?;
        watch_over(&child);
        let mut kafka = Self { bootstrap: format!("127.0.0.1:{port}"), child, log, _dir: dir };
        let started = Instant::now();
        loop {
            if TcpStream::connect_timeout(&([127, 0, 0, 1], port).into(), Duration::from_millis(200)).is_ok()
            {
                return Ok(kafka);
            }
            if let Ok(Some(status)) = kafka.child.try_wait() {
                bail!("tansu exited with {status}: {}", kafka.log_text());
            }
            if started.elapsed() > READY_WITHIN {
                bail!("tansu did not listen within {READY_WITHIN:?}: {}", kafka.log_text());
            }
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    /// `host:port`, for `kafka.bootstrap_servers`.
    pub fn bootstrap(&self) -> &str {
        &self.bootstrap
    }

    /// What tansu has logged.
    pub fn log_text(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }
}

impl Drop for LocalKafka {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// One record as a test reads it.
#[derive(Debug, Clone)]
pub struct Record {
    pub key: Option<Vec<u8>>,
    pub headers: Vec<(String, String)>,
    pub payload: Vec<u8>,
}

/// The records of `topic` (all its partitions, from the start) that arrive within `limit`, until
/// there are `at_least`, read by a consumer outside any group: what a test reads a dead-letter
/// topic with.
pub fn read_topic(
    bootstrap: &str,
    topic: &str,
    at_least: usize,
    limit: Duration,
) -> anyhow::Result<Vec<Record>> {
    use rdkafka::consumer::{BaseConsumer, Consumer};
    use rdkafka::message::Headers;
    use rdkafka::{Message, Offset, TopicPartitionList};
    let consumer: BaseConsumer = rdkafka::ClientConfig::new()
        .set("bootstrap.servers", bootstrap)
        .set("group.id", format!("idemgate-test-reader-{}", rand::random::<u32>()))
        .set("enable.auto.commit", "false")
        .set("log_level", "3")
        .create()
        .context("a reader")?;
    let metadata =
        consumer.fetch_metadata(Some(topic), Duration::from_secs(5)).context("the topic's partitions")?;
    let mut tpl = TopicPartitionList::new();
    for t in metadata.topics().iter().filter(|t| t.name() == topic) {
        for p in t.partitions() {
            tpl.add_partition_offset(topic, p.id(), Offset::Beginning)?;
        }
    }
    consumer.assign(&tpl)?;
    let started = Instant::now();
    let mut out = Vec::new();
    while started.elapsed() < limit && out.len() < at_least {
        if let Some(m) = consumer.poll(Duration::from_millis(200)) {
            let m = m?;
            if m.topic() == topic {
                let headers = m
                    .headers()
                    .map(|h| {
                        h.iter()
                            .map(|h| {
                                (
                                    h.key.to_owned(),
                                    String::from_utf8_lossy(h.value.unwrap_or_default()).into_owned(),
                                )
                            })
                            .collect()
                    })
                    .unwrap_or_default();
                out.push(Record {
                    key: m.key().map(<[u8]>::to_vec),
                    headers,
                    payload: m.payload().map(<[u8]>::to_vec).unwrap_or_default(),
                });
            }
        }
    }
    Ok(out)
}

/// Creates `topic` with `partitions` partitions (an existing one is kept as it is).
pub async fn create_topic(bootstrap: &str, topic: &str, partitions: i32) -> anyhow::Result<()> {
    use rdkafka::admin::{AdminClient, AdminOptions, NewTopic, TopicReplication};
    use rdkafka::client::DefaultClientContext;
    use rdkafka::error::RDKafkaErrorCode;
    let admin: AdminClient<DefaultClientContext> = rdkafka::ClientConfig::new()
        .set("bootstrap.servers", bootstrap)
        .set("log_level", "3")
        .create()
        .context("an admin client")?;
    let options = AdminOptions::new().operation_timeout(Some(Duration::from_secs(10)));
    let results = admin
        .create_topics(&[NewTopic::new(topic, partitions, TopicReplication::Fixed(1))], &options)
        .await
        .with_context(|| format!("creating the topic {topic:?}"))?;
    for result in results {
        match result {
            Ok(_) | Err((_, RDKafkaErrorCode::TopicAlreadyExists)) => {}
            Err((t, code)) => bail!("creating the topic {t:?}: {code}"),
        }
    }
    Ok(())
}

/// A producer as production clients configure one: `acks=all` and `linger_ms` of linger, so
/// that the records sent together share batches.
pub fn batching_producer(
    bootstrap: &str,
    linger_ms: u32,
) -> anyhow::Result<rdkafka::producer::FutureProducer> {
    batching_config(bootstrap, linger_ms).create().context("a producer")
}

fn batching_config(bootstrap: &str, linger_ms: u32) -> rdkafka::ClientConfig {
    let mut config = rdkafka::ClientConfig::new();
    config
        .set("bootstrap.servers", bootstrap)
        .set("acks", "all")
        .set("linger.ms", linger_ms.to_string())
        .set("message.timeout.ms", "30000")
        .set("log_level", "3");
    config
}

/// Sends `count` records (key `key-<i>`, payload `record <i>`) to partition `partition` of
/// `topic` through a batching producer with 50 ms of linger and at most `per_batch` records a
/// batch: every send is issued before any is awaited, then the producer is flushed, so that
/// neighbours share batches. Returns each record's offset, in the order sent.
pub async fn produce_batched(
    bootstrap: &str,
    topic: &str,
    partition: i32,
    count: usize,
    per_batch: usize,
) -> anyhow::Result<Vec<i64>> {
    use rdkafka::producer::{FutureRecord, Producer};
    let mut config = batching_config(bootstrap, 50);
    let producer: rdkafka::producer::FutureProducer =
        config.set("batch.num.messages", per_batch.to_string()).create().context("a producer")?;
    let mut pending = Vec::with_capacity(count);
    for i in 0..count {
        let (key, payload) = (format!("key-{i}"), format!("record {i}"));
        let record = FutureRecord::to(topic).partition(partition).key(&key).payload(&payload);
        let delivery = producer
            .send_result(record)
            .map_err(|(e, _)| e)
            .with_context(|| format!("sending record {i}"))?;
        pending.push(delivery);
    }
    producer.flush(Duration::from_secs(30)).context("flushing the producer")?;
    let mut offsets = Vec::with_capacity(count);
    for (i, delivery) in pending.into_iter().enumerate() {
        let delivered = delivery
            .await
            .with_context(|| format!("record {i}: the producer dropped its delivery report"))?
            .map_err(|(e, _)| e)
            .with_context(|| format!("record {i} was not delivered"))?;
        offsets.push(delivered.offset);
    }
    Ok(offsets)
}

/// The offsets of partition `partition` of `topic` a fresh consumer receives when assigned at
/// `offset` (outside any group, committing nothing), in the order received, until it has read
/// up to `end` (exclusive), nothing more arrives for two seconds, or `limit` passes.
pub fn read_from(
    bootstrap: &str,
    topic: &str,
    partition: i32,
    offset: i64,
    end: i64,
    limit: Duration,
) -> anyhow::Result<Vec<i64>> {
    use rdkafka::consumer::{BaseConsumer, Consumer};
    use rdkafka::{Message, Offset, TopicPartitionList};
    let consumer: BaseConsumer = rdkafka::ClientConfig::new()
        .set("bootstrap.servers", bootstrap)
        .set("group.id", format!("idemgate-test-reader-{}", rand::random::<u32>()))
        .set("enable.auto.commit", "false")
        .set("enable.auto.offset.store", "false")
        .set("enable.partition.eof", "false")
        .set("log_level", "3")
        .create()
        .context("a reader")?;
    let mut tpl = TopicPartitionList::new();
    tpl.add_partition_offset(topic, partition, Offset::Offset(offset))?;
    consumer.assign(&tpl)?;
    let started = Instant::now();
    let mut last_seen = Instant::now();
    let mut out = Vec::new();
    while started.elapsed() < limit && out.last().is_none_or(|o| *o + 1 < end) {
        match consumer.poll(Duration::from_millis(200)) {
            Some(Ok(m)) if m.topic() == topic && m.partition() == partition => {
                out.push(m.offset());
                last_seen = Instant::now();
            }
            Some(Ok(_)) => {}
            Some(Err(e)) => return Err(e).context("reading"),
            None if last_seen.elapsed() > Duration::from_secs(2) && !out.is_empty() => break,
            None => {}
        }
    }
    Ok(out)
}

/// A record batch as the broker answers a fetch: its first and last offsets.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BatchSpan {
    pub base: i64,
    pub last: i64,
}

impl BatchSpan {
    pub fn holds(&self, offset: i64) -> bool {
        (self.base..=self.last).contains(&offset)
    }

    pub fn records(&self) -> i64 {
        self.last - self.base + 1
    }
}

/// One Fetch request (v4, the Kafka protocol by hand) for partition `partition` of `topic` at
/// `offset`, with nothing waited for: the record batches the broker answers with, as it sent
/// them (a client would then skip the records before `offset`), and the partition's high
/// watermark. What a client library hides: which batch a fetch inside a batch starts with.
pub fn fetch_batches(
    bootstrap: &str,
    topic: &str,
    partition: i32,
    offset: i64,
) -> anyhow::Result<(Vec<BatchSpan>, i64)> {
    use std::io::{Read, Write};
    const FETCH: i16 = 1;
    const VERSION: i16 = 4;
    let client_id = "idemgate-test";
    let topic_len = i16::try_from(topic.len()).context("a topic name too long")?;
    let mut body = Vec::new();
    body.extend(FETCH.to_be_bytes());
    body.extend(VERSION.to_be_bytes());
    body.extend(7_i32.to_be_bytes()); // correlation id
    body.extend((client_id.len() as i16).to_be_bytes());
    body.extend(client_id.as_bytes());
    body.extend((-1_i32).to_be_bytes()); // replica id: a consumer
    body.extend(0_i32.to_be_bytes()); // max wait ms: answer at once
    body.extend(0_i32.to_be_bytes()); // min bytes
    body.extend(4_194_304_i32.to_be_bytes()); // max bytes
    body.push(0); // isolation level: read uncommitted
    body.extend(1_i32.to_be_bytes()); // one topic
    body.extend(topic_len.to_be_bytes());
    body.extend(topic.as_bytes());
    body.extend(1_i32.to_be_bytes()); // one partition
    body.extend(partition.to_be_bytes());
    body.extend(offset.to_be_bytes());
    body.extend(4_194_304_i32.to_be_bytes()); // partition max bytes
    let mut stream = TcpStream::connect(bootstrap).with_context(|| format!("connecting to {bootstrap}"))?;
    stream.set_read_timeout(Some(Duration::from_secs(10)))?;
    let mut request = (body.len() as i32).to_be_bytes().to_vec();
    request.extend(body);
    stream.write_all(&request).context("sending the fetch")?;
    let mut size = [0u8; 4];
    stream.read_exact(&mut size).context("reading the fetch's answer")?;
    let size = usize::try_from(i32::from_be_bytes(size)).context("a negative answer size")?;
    let mut answer = vec![0u8; size];
    stream.read_exact(&mut answer).context("reading the fetch's answer")?;
    let mut r = Reader { bytes: &answer, at: 0 };
    let correlation = r.i32()?;
    anyhow::ensure!(correlation == 7, "the answer's correlation id is {correlation}");
    let _throttle = r.i32()?;
    let mut batches = Vec::new();
    let mut high_watermark = -1;
    for _ in 0..r.i32()? {
        let name = r.string()?;
        for _ in 0..r.i32()? {
            let index = r.i32()?;
            let error = r.i16()?;
            let high = r.i64()?;
            let _last_stable = r.i64()?;
            let aborted = r.i32()?;
            for _ in 0..aborted.max(0) {
                r.take(16)?;
            }
            let records = r.i32()?;
            let records = if records < 0 { &[][..] } else { r.take(records as usize)? };
            if name != topic || index != partition {
                continue;
            }
            anyhow::ensure!(
                error == 0,
                "the fetch at {offset} of {topic}-{partition} answered error {error}"
            );
            high_watermark = high;
            let mut b = Reader { bytes: records, at: 0 };
            // Each batch: base offset (8), length (4) of what follows, then the partition
            // leader epoch (4), magic (1), crc (4), attributes (2), last offset delta (4), ….
            while b.bytes.len() - b.at >= 12 {
                let base = b.i64()?;
                let length = usize::try_from(b.i32()?).context("a negative batch length")?;
                if b.bytes.len() - b.at < length {
                    break; // A batch cut short by the size limit.
                }
                let batch = b.take(length)?;
                anyhow::ensure!(
                    batch.len() >= 15 && batch[4] == 2,
                    "a record batch of magic {}",
                    batch.get(4).copied().unwrap_or(0)
                );
                let delta = i32::from_be_bytes(batch[11..15].try_into().expect("four bytes"));
                batches.push(BatchSpan { base, last: base + i64::from(delta) });
            }
        }
    }
    Ok((batches, high_watermark))
}

/// Reads big-endian numbers and strings of a Kafka answer.
struct Reader<'a> {
    bytes: &'a [u8],
    at: usize,
}

impl<'a> Reader<'a> {
    fn take(&mut self, n: usize) -> anyhow::Result<&'a [u8]> {
        let end = self.at.checked_add(n).filter(|e| *e <= self.bytes.len());
        let end = end.with_context(|| format!("the answer ends before {n} bytes at {}", self.at))?;
        let out = &self.bytes[self.at..end];
        self.at = end;
        Ok(out)
    }

    fn i16(&mut self) -> anyhow::Result<i16> {
        Ok(i16::from_be_bytes(self.take(2)?.try_into().expect("two bytes")))
    }

    fn i32(&mut self) -> anyhow::Result<i32> {
        Ok(i32::from_be_bytes(self.take(4)?.try_into().expect("four bytes")))
    }

    fn i64(&mut self) -> anyhow::Result<i64> {
        Ok(i64::from_be_bytes(self.take(8)?.try_into().expect("eight bytes")))
    }

    fn string(&mut self) -> anyhow::Result<String> {
        let n = self.i16()?;
        Ok(String::from_utf8_lossy(self.take(usize::try_from(n).unwrap_or(0))?).into_owned())
    }
}

/// Every batch of partition `partition` of `topic`, from its start to its high watermark, as
/// [`fetch_batches`] reads them, each fetch starting after the last batch read.
pub fn all_batches(bootstrap: &str, topic: &str, partition: i32) -> anyhow::Result<Vec<BatchSpan>> {
    let mut out: Vec<BatchSpan> = Vec::new();
    let mut next = 0;
    loop {
        let (batches, high) = fetch_batches(bootstrap, topic, partition, next)?;
        let batches: Vec<BatchSpan> = batches.into_iter().filter(|b| b.last >= next).collect();
        if batches.is_empty() {
            anyhow::ensure!(next >= high, "a fetch at {next} (high watermark {high}) answered no batch");
            return Ok(out);
        }
        next = batches.last().expect("not empty").last + 1;
        out.extend(batches);
    }
}

/// Adds a header whose name is the raw bytes `name` (which need not be UTF-8, as rdkafka's
/// `Header` requires) and whose value is `value` to `headers`.
pub fn add_raw_header(
    headers: &mut rdkafka::message::OwnedHeaders,
    name: &[u8],
    value: &[u8],
) -> anyhow::Result<()> {
    let native =
        std::ptr::from_ref(headers.as_borrowed()).cast_mut().cast::<rdkafka::bindings::rd_kafka_headers_t>();
    let name_len = isize::try_from(name.len()).context("a header name too long")?;
    let value_len = isize::try_from(value.len()).context("a header value too long")?;
    // SAFETY: a `&BorrowedHeaders` is the address of librdkafka's header list that `headers`
    // owns (rdkafka's own `as_native_ptr` casts it so), and `headers` is borrowed mutably here,
    // so no other reference reads the list while librdkafka appends to it. librdkafka copies
    // `name_len` bytes of `name` and `value_len` bytes of `value`; both outlive the call.
    let err = unsafe {
        rdkafka::bindings::rd_kafka_header_add(
            native,
            name.as_ptr().cast(),
            name_len,
            value.as_ptr().cast(),
            value_len,
        )
    };
    anyhow::ensure!(
        err == rdkafka::types::RDKafkaRespErr::RD_KAFKA_RESP_ERR_NO_ERROR,
        "adding a header: {err:?}"
    );
    Ok(())
}

/// Sends one record to `topic` (its partition chosen by `key`), with `headers` as given, names
/// as raw bytes: what a producer that writes idemgate's own headers, or a name that is not
/// UTF-8, sends. Returns its partition and offset.
pub async fn send_raw(
    bootstrap: &str,
    topic: &str,
    key: &str,
    payload: &[u8],
    headers: &[(&[u8], &[u8])],
) -> anyhow::Result<(i32, i64)> {
    use rdkafka::producer::FutureRecord;
    let producer = batching_producer(bootstrap, 5)?;
    let mut owned = rdkafka::message::OwnedHeaders::new();
    for (name, value) in headers {
        add_raw_header(&mut owned, name, value)?;
    }
    let record = FutureRecord::to(topic).key(key).payload(payload).headers(owned);
    let delivered = producer
        .send(record, Duration::from_secs(30))
        .await
        .map_err(|(e, _)| e)
        .with_context(|| format!("sending a record to {topic:?}"))?;
    Ok((delivered.partition, delivered.offset))
}

/// One partition as a group stands on it: its committed offset (`None`: nothing committed) and
/// the partition's low and high watermarks.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GroupPosition {
    pub topic: String,
    pub partition: i32,
    pub committed: Option<i64>,
    pub low: i64,
    pub high: i64,
}

/// Where `group` stands on every partition of `topics`, read by a client outside the group:
/// what a test reports when a consumer does not move.
pub fn group_positions(
    bootstrap: &str,
    group: &str,
    topics: &[String],
) -> anyhow::Result<Vec<GroupPosition>> {
    use rdkafka::consumer::{BaseConsumer, Consumer};
    use rdkafka::{Offset, TopicPartitionList};
    let reader: BaseConsumer = rdkafka::ClientConfig::new()
        .set("bootstrap.servers", bootstrap)
        .set("group.id", group)
        .set("enable.auto.commit", "false")
        .set("log_level", "3")
        .create()
        .context("a reader")?;
    let timeout = Duration::from_secs(10);
    let mut out = Vec::new();
    for topic in topics {
        let metadata = reader.fetch_metadata(Some(topic), timeout).context("the topic's partitions")?;
        let mut tpl = TopicPartitionList::new();
        for t in metadata.topics().iter().filter(|t| t.name() == topic) {
            for p in t.partitions() {
                tpl.add_partition(topic, p.id());
            }
        }
        let committed = reader.committed_offsets(tpl.clone(), timeout).context("the group's offsets")?;
        for e in tpl.elements() {
            let (low, high) =
                reader.fetch_watermarks(topic, e.partition(), timeout).context("the watermarks")?;
            let committed = match committed.find_partition(topic, e.partition()).map(|c| c.offset()) {
                Some(Offset::Offset(o)) => Some(o),
                _ => None,
            };
            out.push(GroupPosition { topic: topic.clone(), partition: e.partition(), committed, low, high });
        }
    }
    Ok(out)
}

/// How the group coordinator describes `group` (DescribeGroups): its state, protocol and each
/// member with the partitions assigned to it. What a test reports when a consumer does not move.
pub fn describe_group(bootstrap: &str, group: &str) -> anyhow::Result<String> {
    use rdkafka::consumer::{BaseConsumer, Consumer};
    let reader: BaseConsumer = rdkafka::ClientConfig::new()
        .set("bootstrap.servers", bootstrap)
        .set("log_level", "3")
        .create()
        .context("a reader")?;
    let list =
        reader.fetch_group_list(Some(group), Duration::from_secs(10)).context("describing the group")?;
    let mut out = Vec::new();
    for g in list.groups() {
        out.push(format!(
            "group {} state {} protocol {}/{}, {} members",
            g.name(),
            g.state(),
            g.protocol_type(),
            g.protocol(),
            g.members().len()
        ));
        for m in g.members() {
            let assigned = m
                .assignment()
                .filter(|a| !a.is_empty())
                .map_or_else(|| "nothing assigned".to_owned(), describe_assignment);
            out.push(format!(
                "  member {} (client {}, {}): {assigned}",
                m.id(),
                m.client_id(),
                m.client_host()
            ));
        }
    }
    if out.is_empty() {
        out.push(format!("group {group}: the coordinator describes no such group"));
    }
    Ok(out.join("\n"))
}

/// A consumer protocol assignment (version, then each topic and its partitions) in words.
fn describe_assignment(bytes: &[u8]) -> String {
    let read = || -> anyhow::Result<String> {
        let mut r = Reader { bytes, at: 0 };
        let _version = r.i16()?;
        let mut topics = Vec::new();
        for _ in 0..r.i32()?.max(0) {
            let topic = r.string()?;
            let partitions: Vec<i32> =
                (0..r.i32()?.max(0)).map(|_| r.i32()).collect::<anyhow::Result<_>>()?;
            topics.push(format!("{topic} {partitions:?}"));
        }
        Ok(if topics.is_empty() { "no partitions".to_owned() } else { topics.join(", ") })
    };
    read().unwrap_or_else(|e| format!("{} bytes, unread: {e}", bytes.len()))
}
