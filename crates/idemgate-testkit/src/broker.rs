//! Private RocketMQ servers on free loopback ports with temporary stores, for tests and
//! benchmarks: [`LocalBroker`], one name server and one broker that creates topics on first use,
//! and [`LocalCluster`], one name server and two master brokers of one cluster (`broker-a`,
//! `broker-b`) whose topics are created explicitly on both, with a broker that can be killed and
//! started again. The binaries come from `scripts/install-rocketmq.sh` (installed once per
//! machine, outside the clone).
//!
//! A [`LocalBroker`] started with [`BrokerOptions`] may have authentication and authorization on,
//! with a super user of the test's choosing, through which [`LocalBroker::create_user`] adds
//! accounts with exactly the rights a test names (users and ACLs are the broker's auth metadata,
//! made through the admin API as `mqadmin createUser` / `createAcl` do), and
//! [`LocalBroker::read_trace`] reads the message-trace topic back, decoded from the Java client's
//! trace format.
//!
//! Every process is stopped by process id when its owner is dropped, and a small watchdog per
//! process stops it too if this process dies first, so a killed test run leaves nothing behind.

use std::future::Future;
use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use cheetah_string::CheetahString;
use rocketmq_client_rust::{
    AuthAdmin, DefaultMQAdminExt, MQAdminReadExt, TopicAdmin, TraceDataEncoder, TraceType,
};
use rocketmq_model::common::config::TopicConfig;

use idemgate::broker::{BrokerAccess, ClientHost};

/// The log line that says the broker has registered with the name server.
const READY_LINE: &str = "Register broker to name remoting_server success";

/// How long a broker may take to register with the name server.
const READY_WITHIN: Duration = Duration::from_secs(60);

/// The cluster every local broker belongs to.
const CLUSTER: &str = "DefaultCluster";

/// A running name server and broker.
pub struct LocalBroker {
    name_server: String,
    namesrv: Server,
    broker: Server,
    dir: tempfile::TempDir,
    options: BrokerOptions,
}

/// How a [`LocalBroker`] is set up beyond the defaults.
#[derive(Debug, Clone, Default)]
pub struct BrokerOptions {
    /// Authentication and authorization on, with this super user; `None`: an open broker.
    pub auth: Option<SuperUser>,
    /// The broker's message-trace topic (`msgTraceTopicName`), created at start
    /// (`traceTopicEnable`); `None`: neither set.
    pub trace_topic: Option<String>,
    /// The address the broker gives the name server for its clients to reach it by
    /// (`brokerIp1`): a [`Network`](crate::network::Network)'s services address, for clients in
    /// other network namespaces. `None`: 127.0.0.1.
    pub advertise: Option<std::net::Ipv4Addr>,
    /// How long the broker keeps a client it has not heard from (`channelExpiredTimeout`; the
    /// broker looks every 10 s): after it, the client's queues go to the rest of its group.
    /// `None`: the broker's 120 s.
    pub channel_expired_timeout: Option<std::time::Duration>,
}

/// The broker's first user (`initAuthenticationUser`), which may do anything: the one the test
/// kit itself signs as, and through which other users are made.
#[derive(Debug, Clone)]
pub struct SuperUser {
    pub name: String,
    pub secret: String,
}

/// One right of a user: `actions` (`Sub`, `Pub`, `Get`, …, or `All`) on `resource`
/// (`Topic:orders`, `Group:orders_consumer`, `Topic:*`, …), allowed from anywhere.
#[derive(Debug, Clone)]
pub struct Right {
    pub resource: String,
    pub actions: Vec<String>,
}

impl Right {
    pub fn new(resource: impl Into<String>, actions: &[&str]) -> Self {
        Self { resource: resource.into(), actions: actions.iter().map(|a| (*a).to_owned()).collect() }
    }
}

/// One consume record of the trace topic, as the Java client writes it (`SubAfter`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConsumeTrace {
    /// The message's id as the producer got it (its UNIQ_KEY).
    pub msg_id: String,
    /// The consumer group, without the namespace (from the consumption's `SubBefore` record
    /// when its `SubAfter` does not carry it).
    pub group: String,
    pub success: bool,
    /// How long the consumption took, in milliseconds.
    pub cost_ms: i32,
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
        Self::start_with(BrokerOptions::default())
    }

    /// Starts a name server and a broker set up as `options` say, and waits until the broker
    /// has registered and takes new topics.
    pub fn start_with(options: BrokerOptions) -> anyhow::Result<Self> {
        let dir = temp_dir()?;
        let (name_server, namesrv) = start_name_server(dir.path())?;
        let mut broker = Server::broker_with(dir.path(), "broker-a", &name_server, true, &options)?;
        broker.start(dir.path())?;
        let mut local = Self { name_server, namesrv, broker, dir, options };
        local.broker.wait_ready(local.dir.path(), READY_WITHIN)?;
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

    /// `host:port` of the broker.
    pub fn broker_addr(&self) -> String {
        format!("127.0.0.1:{}", self.broker.port)
    }

    /// How the test kit reaches the broker: as the super user when authentication is on.
    pub fn access(&self) -> BrokerAccess {
        let open = BrokerAccess::open(&self.name_server);
        match &self.options.auth {
            Some(user) => open.with_account(&user.name, &user.secret),
            None => open,
        }
    }

    /// Makes a normal user `name` with `secret` and exactly `rights`, through the admin API
    /// signed as the super user.
    pub fn create_user(&self, name: &str, secret: &str, rights: &[Right]) -> anyhow::Result<()> {
        let (access, broker) = (self.access(), self.broker_addr());
        let (name, secret, rights) = (name.to_owned(), secret.to_owned(), rights.to_vec());
        on_a_thread_of_its_own(Box::pin(async move {
            let host = ClientHost::new("admin", 1)?;
            // Boxed: the admin client's futures are deep.
            let mut admin = Box::pin(start_admin(&host, &access)).await?;
            let made = Box::pin(provision(&admin, &broker, &name, &secret, &rights)).await;
            admin.shutdown().await;
            host.shutdown().await;
            made
        }))
    }

    /// Every consume record in `trace_topic` so far, read from its first offset through a pull
    /// as the super user.
    pub fn read_trace(&self, trace_topic: &str) -> anyhow::Result<Vec<ConsumeTrace>> {
        let (access, topic) = (self.access(), trace_topic.to_owned());
        on_a_thread_of_its_own(async move {
            let host = ClientHost::new("trace-reader", 1)?;
            let bodies = Box::pin(pull_everything(&host, &access, &topic)).await;
            host.shutdown().await;
            // A `SubAfter` record carries the consumption's result and cost; its `SubBefore`
            // (the same request id) the group, which the Java format writes there only.
            let contexts: Vec<_> =
                bodies?.iter().flat_map(|b| TraceDataEncoder::decoder_from_trace_data_string(b)).collect();
            let group_of = |request_id: &str| {
                contexts
                    .iter()
                    .find(|c| {
                        matches!(c.trace_type, Some(TraceType::SubBefore)) && c.request_id == request_id
                    })
                    .map(|c| c.group_name.to_string())
                    .unwrap_or_default()
            };
            let mut out = Vec::new();
            for context in contexts.iter().filter(|c| matches!(c.trace_type, Some(TraceType::SubAfter))) {
                let group = if context.group_name.is_empty() {
                    group_of(context.request_id.as_str())
                } else {
                    context.group_name.to_string()
                };
                for bean in context.trace_beans.iter().flatten() {
                    out.push(ConsumeTrace {
                        msg_id: bean.msg_id.to_string(),
                        group: group.clone(),
                        success: context.is_success,
                        cost_ms: context.cost_time,
                    });
                }
            }
            Ok(out)
        })
    }

    /// Waits until a send to a topic nobody created succeeds: the name server then holds the
    /// route of the broker's auto-create topic, which every test and benchmark relies on. The
    /// broker's registration alone does not promise that.
    fn wait_for_topic_creation(&self, limit: Duration) -> anyhow::Result<()> {
        let access = self.access();
        on_a_thread_of_its_own(async move {
            let producer = idemgate::broker::Producer::start(&access, "idemgate_ready_probe").await?;
            let started = Instant::now();
            let probe = idemgate::delivery::Delivery {
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
                    Err(e) => {
                        break Err(e.context(format!("no send to a new topic succeeded within {limit:?}")));
                    }
                }
            };
            producer.shutdown().await;
            outcome
        })
    }
}

/// An admin client signed as `access` says, started.
async fn start_admin(host: &ClientHost, access: &BrokerAccess) -> anyhow::Result<DefaultMQAdminExt> {
    let mut admin = match access.rpc_hook() {
        Some(hook) => DefaultMQAdminExt::with_admin_ext_group_rpc_hook_and_timeout(
            host.client_runtime(),
            "idemgate_local_admin",
            hook,
            Duration::from_secs(5),
        ),
        None => DefaultMQAdminExt::with_admin_ext_group_and_timeout(
            host.client_runtime(),
            "idemgate_local_admin",
            Duration::from_secs(5),
        ),
    };
    admin.set_namesrv_addr(access.name_server());
    admin.start().await.context("starting the admin client")?;
    Ok(admin)
}

/// Makes the normal user `name` with `secret` at `broker` and grants it `rights`.
async fn provision(
    admin: &DefaultMQAdminExt,
    broker: &str,
    name: &str,
    secret: &str,
    rights: &[Right],
) -> anyhow::Result<()> {
    let broker = CheetahString::from(broker);
    AuthAdmin::create_user(
        admin,
        broker.clone(),
        CheetahString::from(name),
        CheetahString::from(secret),
        CheetahString::from_static_str("Normal"),
    )
    .await
    .with_context(|| format!("creating user {name}"))?;
    for right in rights {
        AuthAdmin::create_acl(
            admin,
            broker.clone(),
            CheetahString::from(format!("User:{name}")),
            vec![CheetahString::from(right.resource.as_str())],
            right.actions.iter().map(|a| CheetahString::from(a.as_str())).collect(),
            Vec::new(),
            CheetahString::from_static_str("Allow"),
        )
        .await
        .with_context(|| format!("granting {name} {:?} on {}", right.actions, right.resource))?;
    }
    Ok(())
}

/// The bodies of every message of `topic`, from each queue's first offset to its end, within
/// 20 s.
#[allow(deprecated)]
async fn pull_everything(
    host: &ClientHost,
    access: &BrokerAccess,
    topic: &str,
) -> anyhow::Result<Vec<String>> {
    use rocketmq_client_rust::DefaultMQPullConsumer;
    let mut builder = DefaultMQPullConsumer::builder(host.client_runtime())
        .name_server_addr(access.name_server().to_owned())
        .consumer_group("idemgate_trace_reader")
        .consumer_pull_timeout(Duration::from_secs(3));
    if let Some(hook) = access.rpc_hook() {
        builder = builder.rpc_hook(hook);
    }
    let puller = builder.build().context("building the trace reader")?;
    puller.start().await.context("starting the trace reader")?;
    let read = tokio::time::timeout(Duration::from_secs(20), async {
        let mut bodies = Vec::new();
        let queues =
            puller.fetch_subscribe_message_queues(topic).await.context("the trace topic's queues")?;
        for queue in &queues {
            let mut offset = 0;
            loop {
                let pulled = puller.pull(queue, "*", offset, 32).await.context("pulling the trace topic")?;
                let found = pulled.msg_found_list().map(|f| f.to_vec()).unwrap_or_default();
                if found.is_empty() {
                    break;
                }
                for m in &found {
                    bodies
                        .push(String::from_utf8_lossy(m.body().as_deref().unwrap_or_default()).into_owned());
                }
                offset = pulled.next_begin_offset() as i64;
            }
        }
        anyhow::Ok(bodies)
    })
    .await
    .unwrap_or_else(|_| Err(anyhow::anyhow!("reading the trace topic took more than 20 s")));
    let _ = puller.shutdown().await;
    read
}

impl Drop for LocalBroker {
    fn drop(&mut self) {
        self.broker.stop();
        self.namesrv.stop();
    }
}

/// One name server and two master brokers, `broker-a` and `broker-b`, of one cluster. Topics
/// are not created on first use: [`LocalCluster::create_topic`] creates one on both brokers.
pub struct LocalCluster {
    name_server: String,
    namesrv: Server,
    /// (broker name, its address, its process).
    brokers: Vec<(String, String, Server)>,
    dir: tempfile::TempDir,
}

impl LocalCluster {
    /// The brokers' names.
    pub const BROKERS: [&'static str; 2] = ["broker-a", "broker-b"];

    /// Starts the name server and both brokers and waits until both have registered.
    pub fn start() -> anyhow::Result<Self> {
        let dir = temp_dir()?;
        let (name_server, namesrv) = start_name_server(dir.path())?;
        let mut cluster = Self { name_server, namesrv, brokers: Vec::new(), dir };
        for name in Self::BROKERS {
            let mut broker = Server::broker(cluster.dir.path(), name, &cluster.name_server, false)?;
            broker.start(cluster.dir.path())?;
            let addr = format!("127.0.0.1:{}", broker.port);
            cluster.brokers.push((name.to_owned(), addr, broker));
        }
        for (_, _, broker) in &mut cluster.brokers {
            broker.wait_ready(cluster.dir.path(), READY_WITHIN)?;
        }
        Ok(cluster)
    }

    /// `host:port` of the name server.
    pub fn name_server(&self) -> &str {
        &self.name_server
    }

    /// Where the servers' logs and stores are.
    pub fn log_dir(&self) -> &Path {
        self.dir.path()
    }

    /// Creates `topic` with `queues` read and write queues on every broker, through the admin
    /// API's `create_and_update_topic_config` (the broker's UPDATE_AND_CREATE_TOPIC request), and
    /// waits until the name server's route of the topic names every broker.
    pub fn create_topic(&self, topic: &str, queues: u32) -> anyhow::Result<()> {
        let (name_server, topic) = (self.name_server.clone(), topic.to_owned());
        let addrs: Vec<String> = self.brokers.iter().map(|(_, addr, _)| addr.clone()).collect();
        on_a_thread_of_its_own(async move {
            let host = ClientHost::new("admin", 1)?;
            let mut admin = DefaultMQAdminExt::with_admin_ext_group_and_timeout(
                host.client_runtime(),
                "idemgate_local_admin",
                Duration::from_secs(5),
            );
            admin.set_namesrv_addr(name_server.as_str());
            admin.start().await.context("starting the admin client")?;
            let created = create_everywhere(&admin, &topic, queues, &addrs).await;
            admin.shutdown().await;
            host.shutdown().await;
            created
        })
    }

    /// SIGKILLs `broker`: no chance to flush or to unregister.
    pub fn kill(&mut self, broker: &str) -> anyhow::Result<()> {
        self.broker_mut(broker)?.stop();
        Ok(())
    }

    /// Starts `broker` again, with its ports and its store, and waits until it has registered.
    pub fn restart(&mut self, broker: &str) -> anyhow::Result<()> {
        let dir = self.dir.path().to_owned();
        let server = self.broker_mut(broker)?;
        server.start(&dir)?;
        server.wait_ready(&dir, READY_WITHIN)
    }

    fn broker_mut(&mut self, name: &str) -> anyhow::Result<&mut Server> {
        self.brokers
            .iter_mut()
            .find(|(n, _, _)| n == name)
            .map(|(_, _, server)| server)
            .with_context(|| format!("no broker named {name}"))
    }
}

impl Drop for LocalCluster {
    fn drop(&mut self) {
        for (_, _, broker) in &mut self.brokers {
            broker.stop();
        }
        self.namesrv.stop();
    }
}

async fn create_everywhere(
    admin: &DefaultMQAdminExt,
    topic: &str,
    queues: u32,
    addrs: &[String],
) -> anyhow::Result<()> {
    for addr in addrs {
        TopicAdmin::create_and_update_topic_config(
            admin,
            CheetahString::from(addr.as_str()),
            TopicConfig::with_queues(topic, queues, queues),
        )
        .await
        .with_context(|| format!("creating topic {topic} on {addr}"))?;
    }
    let started = Instant::now();
    loop {
        let route = MQAdminReadExt::examine_topic_route_info(admin, CheetahString::from(topic)).await;
        let brokers = route.as_ref().ok().and_then(Option::as_ref).map_or(0, |r| r.broker_datas.len());
        if brokers == addrs.len() {
            return Ok(());
        }
        if started.elapsed() > Duration::from_secs(30) {
            bail!("the route of {topic} names {brokers} of {} brokers after 30 s", addrs.len());
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
}

/// One server process: how to start it, and its child while it runs.
struct Server {
    bin: PathBuf,
    args: Vec<String>,
    /// The log file's name without `.log`; a second start logs to `<stem>.2.log`, and so on.
    stem: String,
    /// The port it serves clients on.
    port: u16,
    starts: u32,
    child: Option<Child>,
}

/// The share of the disk's space in use from which the broker's store refuses every write:
/// its warning ratio, which the store caps at 0.90 whatever the configuration asks.
const DISK_FULL_RATIO: f64 = 0.90;

/// Refuses to start a broker whose store would sit on a disk that is (almost) as full as the
/// store's own limit: its sends would fail with nothing but "Broker operation failed". A margin
/// of two points leaves room for the test's own writes.
fn check_disk(dir: &Path) -> anyhow::Result<()> {
    let out = Command::new("df").arg("-Pk").arg(dir).output().context("running df")?;
    let text = String::from_utf8_lossy(&out.stdout);
    let Some(used) = used_ratio(&text) else {
        anyhow::bail!("df -Pk {} printed no size: {text}", dir.display());
    };
    anyhow::ensure!(
        used < DISK_FULL_RATIO - 0.02,
        "the disk holding {} is {:.1}% used; a RocketMQ broker refuses every write from {:.0}% \
         (its store caps the warning ratio there), so free some space first",
        dir.display(),
        used * 100.0,
        DISK_FULL_RATIO * 100.0
    );
    Ok(())
}

/// The used share of a disk as the store counts it, `(size − available) / size`, from the
/// second line of `df -Pk` (filesystem, size, used, available, …, in KiB).
fn used_ratio(df: &str) -> Option<f64> {
    let fields: Vec<&str> = df.lines().nth(1)?.split_whitespace().collect();
    let size: f64 = fields.get(1)?.parse().ok()?;
    let available: f64 = fields.get(3)?.parse().ok()?;
    (size > 0.0).then(|| (size - available) / size)
}

impl Server {
    /// A broker of [`CLUSTER`] on free ports, with its configuration written under `dir`.
    fn broker(dir: &Path, name: &str, name_server: &str, auto_create_topics: bool) -> anyhow::Result<Self> {
        Self::broker_with(dir, name, name_server, auto_create_topics, &BrokerOptions::default())
    }

    /// [`Server::broker`] set up as `options` say.
    fn broker_with(
        dir: &Path,
        name: &str,
        name_server: &str,
        auto_create_topics: bool,
        options: &BrokerOptions,
    ) -> anyhow::Result<Self> {
        check_disk(dir)?;
        let mut extra = String::new();
        if let Some(user) = &options.auth {
            // Authorization needs authentication on and a non-blank auth config path; the users
            // and ACLs the admin API makes are kept there.
            extra.push_str(&format!(
                "authenticationEnabled = true\nauthorizationEnabled = true\nauthConfigPath = \"{}\"\n\
                 initAuthenticationUser = \"{}:{}\"\n",
                dir.join(format!("{name}-auth")).display(),
                user.name,
                user.secret
            ));
        }
        if let Some(topic) = &options.trace_topic {
            extra.push_str(&format!("traceTopicEnable = true\nmsgTraceTopicName = \"{topic}\"\n"));
        }
        if let Some(expired) = options.channel_expired_timeout {
            extra.push_str(&format!("channelExpiredTimeout = {}\n", expired.as_millis()));
        }
        // The broker listens on its port, on port − 2 (its fast port) and on the HA port.
        let base = free_port_run(4)?;
        let (port, ha_port) = (base + 2, base + 3);
        let store = dir.join(format!("{name}-store"));
        let config = dir.join(format!("{name}.toml"));
        std::fs::write(
            &config,
            format!(
                r#"[broker]
listenPort = {port}
storePathRootDir = "{store}"
namesrvAddr = "{name_server}"
brokerIp1 = "{advertise}"
autoCreateTopicEnable = {auto_create_topics}
{extra}
[broker.brokerIdentity]
brokerName = "{name}"
brokerClusterName = "{CLUSTER}"
brokerId = 0

[store]
brokerRole = "ASYNC_MASTER"
flushDiskType = "ASYNC_FLUSH"
haListenPort = {ha_port}
storePathRootDir = "{store}"
# The defaults refuse writes once the disk is 75% full, which a build machine reaches easily;
# this broker only ever holds a test's or a benchmark's messages. The store caps what it takes:
# the warning ratio at 90% (from there every write is refused) and the forcible clean at 85%.
diskMaxUsedSpaceRatio = 95
diskSpaceWarningLevelRatio = 98
diskSpaceCleanForciblyRatio = 97
"#,
                store = store.display(),
                advertise = options.advertise.unwrap_or(std::net::Ipv4Addr::LOCALHOST),
            ),
        )
        .context("writing the broker's configuration")?;
        tracing::debug!(name, port, ha_port, "a local RocketMQ broker");
        Ok(Self {
            bin: binary("rocketmq-broker-rust")?,
            args: vec!["-c".to_owned(), config.to_string_lossy().into_owned()],
            stem: name.to_owned(),
            port,
            starts: 0,
            child: None,
        })
    }

    fn log(&self, dir: &Path) -> PathBuf {
        match self.starts {
            0 | 1 => dir.join(format!("{}.log", self.stem)),
            n => dir.join(format!("{}.{n}.log", self.stem)),
        }
    }

    /// Starts the process, with a watchdog that stops it if this process dies first.
    fn start(&mut self, dir: &Path) -> anyhow::Result<()> {
        self.starts += 1;
        let out = std::fs::File::create(self.log(dir)).context("creating a log file")?;
        let err = out.try_clone().context("creating a log file")?;
        let child = Command::new(&self.bin)
            .args(&self.args)
            // Both servers refuse to start without ROCKETMQ_HOME.
            .env("ROCKETMQ_HOME", dir)
            .current_dir(dir)
            .stdin(Stdio::null())
            .stdout(out)
            .stderr(err)
            .spawn()
            .with_context(|| format!("starting {}", self.bin.display()))?;
        watch_over(&child);
        self.child = Some(child);
        Ok(())
    }

    /// Waits until the broker's log says it has registered with the name server.
    fn wait_ready(&mut self, dir: &Path, limit: Duration) -> anyhow::Result<()> {
        let log = self.log(dir);
        let started = Instant::now();
        while started.elapsed() < limit {
            if std::fs::read_to_string(&log).map(|s| s.contains(READY_LINE)).unwrap_or(false) {
                return Ok(());
            }
            if let Some(Ok(Some(status))) = self.child.as_mut().map(Child::try_wait) {
                bail!("{} exited with {status}; see {}", self.stem, log.display());
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        bail!("{} did not register within {limit:?}; see {}", self.stem, log.display())
    }

    /// SIGKILL, and reap.
    fn stop(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

/// Starts a small watchdog that SIGKILLs `child` as soon as this process is gone, so that a
/// killed test run leaves no server behind.
pub(crate) fn watch_over(child: &Child) {
    let child = child.id();
    when_this_process_is_gone(
        &format!("kill -0 {child} 2>/dev/null"),
        &format!("kill -9 {child} 2>/dev/null"),
    );
}

/// Removes `dir` once this process is gone: a killed run, or a server kept for a whole test
/// binary in a static (never dropped), leaves no stores behind. The pause lets the servers'
/// own watchdogs stop them first.
pub(crate) fn remove_when_gone(dir: &Path) {
    remove_when_process_is_gone(std::process::id(), dir);
}

fn remove_when_process_is_gone(owner: u32, dir: &Path) {
    when_process_is_gone(owner, "true", &format!("sleep 2; rm -rf '{}'", dir.display()));
}

/// Runs the shell command `then` once this process has exited, or as soon as the shell test
/// `still_needed` fails.
pub(crate) fn when_this_process_is_gone(still_needed: &str, then: &str) {
    when_process_is_gone(std::process::id(), still_needed, then);
}

fn when_process_is_gone(owner: u32, still_needed: &str, then: &str) {
    let script = format!("while kill -0 {owner} 2>/dev/null && {still_needed}; do sleep 1; done; {then}");
    let _ = Command::new("sh")
        .args(["-c", &script])
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn();
}

/// Starts a name server on a free port; its `host:port` and process.
fn start_name_server(dir: &Path) -> anyhow::Result<(String, Server)> {
    let port = free_port_run(1)?;
    let mut namesrv = Server {
        bin: binary("rocketmq-namesrv-rust")?,
        args: ["--bindAddress", "127.0.0.1", "--listenPort", &port.to_string()].map(str::to_owned).to_vec(),
        stem: "namesrv".to_owned(),
        port,
        starts: 0,
        child: None,
    };
    namesrv.start(dir)?;
    Ok((format!("127.0.0.1:{port}"), namesrv))
}

/// An installed RocketMQ binary.
fn binary(name: &str) -> anyhow::Result<PathBuf> {
    let bin = LocalBroker::bin_dir();
    let path = bin.join(name);
    if !path.is_file() {
        bail!(
            "the RocketMQ binaries are not in {}: run scripts/install-rocketmq.sh (or set IDEMGATE_ROCKETMQ_ROOT)",
            bin.display()
        );
    }
    Ok(path)
}

/// A temporary folder for the servers' logs and stores, removed once this process is gone even
/// when it is never dropped: a test binary keeps its broker in a static, and a broker's store
/// takes about 1.5 GB from its start, so each run would otherwise leave that behind.
fn temp_dir() -> anyhow::Result<tempfile::TempDir> {
    let dir = tempfile::Builder::new()
        .prefix(&format!("idemgate-rocketmq-{}-", std::process::id()))
        .tempdir()
        .context("temporary store")?;
    remove_when_gone(dir.path());
    Ok(dir)
}

/// Runs `work` to its end on a current-thread runtime of a thread of its own: the callers may be
/// inside another runtime, or in none.
fn on_a_thread_of_its_own<T: Send + 'static>(
    work: impl Future<Output = anyhow::Result<T>> + Send + 'static,
) -> anyhow::Result<T> {
    std::thread::spawn(move || {
        tokio::runtime::Builder::new_current_thread().enable_all().build()?.block_on(work)
    })
    .join()
    .map_err(|_| anyhow::anyhow!("the work on the RocketMQ servers panicked"))?
}

/// The first of `n` consecutive free loopback ports.
pub(crate) fn free_port_run(n: u16) -> anyhow::Result<u16> {
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_used_share_counts_what_is_not_available_as_the_broker_store_does() {
        let df = "Filesystem     1024-blocks      Used Available Capacity Mounted on\n\
                  /dev/vda         264241152  70254592  26214400      73% /\n";
        let used = used_ratio(df).unwrap();
        assert!((used - 0.9008).abs() < 0.001, "{used}");
        assert!(used >= DISK_FULL_RATIO - 0.02);
        assert_eq!(used_ratio("Filesystem 1024-blocks\n"), None);
        assert_eq!(used_ratio(""), None);
    }

    #[test]
    fn a_store_is_removed_once_the_process_that_made_it_is_gone_and_not_before() {
        let dir = tempfile::Builder::new().prefix("idemgate-watchdog-").tempdir().unwrap().keep();
        std::fs::write(dir.join("00000000000000000000"), b"commit log").unwrap();
        let mut owner = Command::new("sleep").arg("2").spawn().unwrap();
        remove_when_process_is_gone(owner.id(), &dir);
        std::thread::sleep(Duration::from_secs(1));
        assert!(dir.exists(), "removed while its process still ran");
        // Reaped: a zombie still answers `kill -0`.
        owner.wait().unwrap();
        let started = Instant::now();
        while dir.exists() && started.elapsed() < Duration::from_secs(10) {
            std::thread::sleep(Duration::from_millis(100));
        }
        assert!(!dir.exists(), "{} is still there 10 s after its process ended", dir.display());
    }
}
