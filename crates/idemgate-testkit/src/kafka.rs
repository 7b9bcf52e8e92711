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
    /// default `~/.cache/idemgate/tansu-0.6.0/bin/tansu`.
    pub fn binary() -> PathBuf {
        let root = std::env::var_os("IDEMGATE_TANSU_ROOT").map(PathBuf::from).unwrap_or_else(|| {
            PathBuf::from(std::env::var_os("HOME").unwrap_or_default()).join(".cache/idemgate/tansu-0.6.0")
        });
        root.join("bin/tansu")
    }

    /// Starts tansu on a free port and waits until it takes connections.
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
            .env("RUST_LOG", "warn")
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
