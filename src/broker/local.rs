//! A private RocketMQ name server and broker on free loopback ports with a temporary store, for
//! tests and benchmarks. The binaries come from `scripts/install-rocketmq.sh` (installed once
//! per machine, outside the clone).
//!
//! Both processes are stopped by process id when the [`LocalBroker`] is dropped, and a small
//! watchdog stops them too if this process dies first, so a killed test run leaves nothing
//! behind.

use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context, bail};

/// The log line that says the broker has registered with the name server.
const READY_LINE: &str = "Register broker to name remoting_server success";

/// A running name server and broker.
pub struct LocalBroker {
    name_server: String,
    namesrv: Child,
    broker: Child,
    dir: tempfile::TempDir,
}

impl LocalBroker {
    /// Where the binaries are: `IDEMGATE_ROCKETMQ_ROOT/bin`, or the install script's default.
    pub fn bin_dir() -> PathBuf {
        let root = std::env::var_os("IDEMGATE_ROCKETMQ_ROOT").map(PathBuf::from).unwrap_or_else(|| {
            let home = std::env::var_os("HOME").map(PathBuf::from).unwrap_or_else(|| PathBuf::from("/root"));
            home.join(".cache/idemgate/rocketmq-1.0.0")
        });
        root.join("bin")
    }

    /// Starts a name server and a broker and waits until the broker has registered.
    pub fn start() -> anyhow::Result<Self> {
        let bin = Self::bin_dir();
        let namesrv_bin = bin.join("rocketmq-namesrv-rust");
        let broker_bin = bin.join("rocketmq-broker-rust");
        if !namesrv_bin.is_file() || !broker_bin.is_file() {
            bail!(
                "the RocketMQ binaries are not in {}: run scripts/install-rocketmq.sh (or set IDEMGATE_ROCKETMQ_ROOT)",
                bin.display()
            );
        }
        let dir =
            tempfile::Builder::new().prefix("idemgate-rocketmq-").tempdir().context("temporary store")?;
        let namesrv_port = free_port_run(1)?;
        // The broker listens on its port, on port − 2 (its fast port) and on the HA port.
        let base = free_port_run(4)?;
        let (fast_port, broker_port, ha_port) = (base, base + 2, base + 3);
        let name_server = format!("127.0.0.1:{namesrv_port}");
        let store = dir.path().join("store");
        let config = dir.path().join("broker.toml");
        std::fs::write(
            &config,
            format!(
                r#"[broker]
listenPort = {broker_port}
storePathRootDir = "{store}"
namesrvAddr = "{name_server}"
brokerIp1 = "127.0.0.1"
autoCreateTopicEnable = true

[broker.brokerIdentity]
brokerName = "broker-a"
brokerClusterName = "DefaultCluster"
brokerId = 0

[store]
brokerRole = "ASYNC_MASTER"
flushDiskType = "ASYNC_FLUSH"
haListenPort = {ha_port}
storePathRootDir = "{store}"
# The defaults refuse writes once the disk is 75% full, which a build machine reaches easily;
# this broker only ever holds a test's or a benchmark's messages.
diskMaxUsedSpaceRatio = 95
diskSpaceWarningLevelRatio = 98
diskSpaceCleanForciblyRatio = 97
"#,
                store = store.display()
            ),
        )
        .context("writing broker.toml")?;
        tracing::debug!(fast_port, broker_port, ha_port, namesrv_port, "starting a local RocketMQ broker");

        let namesrv = spawn(
            &namesrv_bin,
            &["--bindAddress", "127.0.0.1", "--listenPort", &namesrv_port.to_string()],
            dir.path(),
            "namesrv.log",
        )?;
        let broker = spawn(&broker_bin, &["-c", &config.to_string_lossy()], dir.path(), "broker.log");
        let broker = match broker {
            Ok(b) => b,
            Err(e) => {
                kill(namesrv);
                return Err(e);
            }
        };
        let mut local = Self { name_server, namesrv, broker, dir };
        local.watch();
        local.wait_ready(Duration::from_secs(60))?;
        local.wait_for_topic_creation(Duration::from_secs(60))?;
        Ok(local)
    }

    /// `host:port` of the name server.
    pub fn name_server(&self) -> &str {
        &self.name_server
    }

    pub fn log_dir(&self) -> &Path {
        self.dir.path()
    }

    fn wait_ready(&mut self, limit: Duration) -> anyhow::Result<()> {
        let log = self.dir.path().join("broker.log");
        let started = Instant::now();
        while started.elapsed() < limit {
            if std::fs::read_to_string(&log).map(|s| s.contains(READY_LINE)).unwrap_or(false) {
                return Ok(());
            }
            if let Ok(Some(status)) = self.broker.try_wait() {
                bail!("the broker exited with {status}; see {}", log.display());
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        bail!("the broker did not register within {limit:?}; see {}", log.display())
    }

    /// Waits until a send to a topic nobody created succeeds: the name server then holds the
    /// route of the broker's auto-create topic, which every test and benchmark relies on. The
    /// broker's registration alone does not promise that.
    fn wait_for_topic_creation(&self, limit: Duration) -> anyhow::Result<()> {
        let name_server = self.name_server.clone();
        // A thread of its own: this may be called from inside another runtime.
        let probe = std::thread::spawn(move || -> anyhow::Result<()> {
            let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build()?;
            runtime.block_on(async {
                let producer = super::Producer::start(&name_server, "idemgate_ready_probe").await?;
                let started = Instant::now();
                let probe = crate::delivery::Delivery {
                    topic: "idemgate_ready_probe".to_owned(),
                    keys: vec!["probe".to_owned()],
                    body: b"{}".to_vec(),
                    ..Default::default()
                };
                let outcome = loop {
                    match producer.send(&probe).await {
                        Ok(_) => break Ok(()),
                        Err(e) if started.elapsed() < limit => {
                            tracing::debug!(error = %e, "the broker cannot take a new topic yet");
                            tokio::time::sleep(Duration::from_millis(250)).await;
                        }
                        Err(e) => break Err(e.context(format!("no send to a new topic succeeded within {limit:?}"))),
                    }
                };
                producer.shutdown().await;
                outcome
            })
        });
        probe.join().map_err(|_| anyhow::anyhow!("the readiness probe panicked"))?
    }

    /// Stops both processes when this process goes away without dropping `self`.
    fn watch(&self) {
        let script = format!(
            "while kill -0 {me} 2>/dev/null; do sleep 1; done; kill -9 {b} {n} 2>/dev/null",
            me = std::process::id(),
            b = self.broker.id(),
            n = self.namesrv.id()
        );
        let _ = Command::new("sh")
            .args(["-c", &script])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn();
    }
}

impl Drop for LocalBroker {
    fn drop(&mut self) {
        let _ = self.broker.kill();
        let _ = self.broker.wait();
        let _ = self.namesrv.kill();
        let _ = self.namesrv.wait();
    }
}

fn spawn(bin: &Path, args: &[&str], dir: &Path, log: &str) -> anyhow::Result<Child> {
    let out = std::fs::File::create(dir.join(log)).context("creating a log file")?;
    let err = out.try_clone().context("creating a log file")?;
    Command::new(bin)
        .args(args)
        // Both servers refuse to start without ROCKETMQ_HOME.
        .env("ROCKETMQ_HOME", dir)
        .current_dir(dir)
        .stdin(Stdio::null())
        .stdout(out)
        .stderr(err)
        .spawn()
        .with_context(|| format!("starting {}", bin.display()))
}

fn kill(mut child: Child) {
    let _ = child.kill();
    let _ = child.wait();
}

/// The first of `n` consecutive free loopback ports.
fn free_port_run(n: u16) -> anyhow::Result<u16> {
    for _ in 0..200 {
        let first = TcpListener::bind("127.0.0.1:0")?.local_addr()?.port();
        if first > u16::MAX - n {
            continue;
        }
        let all_free = (0..n).all(|i| {
            let port = first + i;
            TcpListener::bind(("127.0.0.1", port)).is_ok() && TcpListener::bind(("0.0.0.0", port)).is_ok()
        });
        if all_free {
            return Ok(first);
        }
    }
    bail!("found no {n} consecutive free ports")
}
