//! The broker tests' harness: one private RocketMQ name server and broker for the whole test
//! binary, `idemgate serve` and `idemgate produce` run as the real binary, and the books read
//! back from the database. A missing broker install or database fails the test.

use std::collections::BTreeMap;
use std::io::BufRead;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use idemgate::broker::BrokerKind;
use idemgate::config::Settings;
use idemgate::delivery::Delivery;
use idemgate::store::{Backend, Sql, Store, StoreOptions};
use idemgate_shop as shop;
use idemgate_shop::produce::ProduceReport;
use idemgate_testkit::broker::LocalBroker;
use idemgate_testkit::history::{self, History, Sent, Source};
use idemgate_testkit::kafka::LocalKafka;
use idemgate_testkit::scratch::ScratchDb;
use sqlx::Row;

/// The service with the example shop's handlers, whose traffic these tests send, and its
/// commands (the same command line as `idemgate`'s).
pub const BIN: &str = env!("CARGO_BIN_EXE_idemgate-shop");
/// `idemgate` itself: the service with configured handlers only.
pub const PLAIN_BIN: &str = env!("CARGO_BIN_EXE_idemgate");

/// The broker every test of this binary shares; each test uses its own topic and group.
pub fn broker() -> &'static LocalBroker {
    static BROKER: OnceLock<LocalBroker> = OnceLock::new();
    BROKER.get_or_init(|| {
        LocalBroker::start().unwrap_or_else(|e| panic!("a RocketMQ broker is required: {e:#}"))
    })
}

/// The tansu broker every Kafka test of this binary shares; each test uses its own topics and
/// group.
pub fn kafka() -> &'static LocalKafka {
    static KAFKA: OnceLock<LocalKafka> = OnceLock::new();
    KAFKA.get_or_init(|| {
        LocalKafka::start().unwrap_or_else(|e| panic!("a Kafka broker (tansu) is required: {e:#}"))
    })
}

/// Removes, once per test binary, what runs no longer running left on the machine's RabbitMQ.
fn rabbitmq_swept() {
    static SWEPT: OnceLock<()> = OnceLock::new();
    SWEPT.get_or_init(|| {
        let swept = std::thread::spawn(|| {
            tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .expect("a runtime")
                .block_on(idemgate_testkit::rabbitmq::remove_stale())
        })
        .join()
        .expect("the sweep's thread");
        swept.unwrap_or_else(|e| panic!("RabbitMQ is required, and its stale test queues removable: {e:#}"));
    });
}

/// The settings of one `serve` process consuming `topic` from the broker of `kind`, with
/// `max_reconsume_times` attempts after the first and retries that wait a second.
pub fn settings_for(
    kind: BrokerKind,
    db_url: &str,
    topic: &str,
    group: &str,
    instance: &str,
    max_reconsume_times: i32,
) -> Settings {
    let mut s = match kind {
        BrokerKind::RocketMq => settings(db_url, topic, group, instance, max_reconsume_times),
        _ => settings_on("127.0.0.1:9876", db_url, topic, group, instance),
    };
    s.consumer.max_reconsume_times = max_reconsume_times;
    s.broker.kind = kind;
    s.broker.lag_interval_seconds = 2;
    s.rabbitmq.url = idemgate_testkit::rabbitmq::url();
    s.rabbitmq.retry_delay_ms = 1_000;
    if kind == BrokerKind::RabbitMq {
        rabbitmq_swept();
    }
    if kind == BrokerKind::Kafka {
        s.kafka.bootstrap_servers = kafka().bootstrap().to_owned();
        // `produce` keeps 64 sends in flight on Kafka, as batching producers do: a payment can
        // run well ahead of its order in another partition, so its retries wait 4 s.
        s.kafka.retry_delay_ms = 4_000;
        s.kafka.session_timeout_ms = 6_000;
    }
    s
}

/// The JSON body of an `order.create` for one unit of `SKU-1`, numbered `order_no`: what a test
/// sends by hand, past `produce`.
pub fn order_body(order_no: &str) -> Vec<u8> {
    serde_json::to_vec(&shop::CreateOrder {
        order_no: order_no.to_owned(),
        user_id: "u-test".to_owned(),
        sku: "SKU-1".to_owned(),
        quantity: 1,
        amount_cents: 1_250,
    })
    .expect("an order as JSON")
}

/// A unique name for this test's topic, group and keys.
pub fn unique(prefix: &str) -> String {
    format!("{prefix}_{}_{}", std::process::id(), rand::random::<u32>())
}

pub async fn database(backend: Backend) -> ScratchDb {
    ScratchDb::create(backend, &StoreOptions { max_connections: 4, ..Default::default() })
        .await
        .unwrap_or_else(|e| panic!("{e}"))
}

/// A database with no table at all: a deployment's business database before the service
/// first starts on it.
pub async fn empty_database(backend: Backend) -> ScratchDb {
    ScratchDb::create_empty(backend, &StoreOptions { max_connections: 4, ..Default::default() })
        .await
        .unwrap_or_else(|e| panic!("{e}"))
}

/// The settings of one `serve` process on the shared broker.
pub fn settings(
    db_url: &str,
    topic: &str,
    group: &str,
    instance: &str,
    max_reconsume_times: i32,
) -> Settings {
    let mut s = settings_on(broker().name_server(), db_url, topic, group, instance);
    s.consumer.max_reconsume_times = max_reconsume_times;
    s
}

/// The settings of one `serve` process consuming through `name_server`, with the default retry
/// budget.
pub fn settings_on(name_server: &str, db_url: &str, topic: &str, group: &str, instance: &str) -> Settings {
    let mut s = Settings::default();
    s.database.url = db_url.to_owned();
    s.database.max_connections = 16;
    s.consumer.group = group.to_owned();
    s.consumer.instance = instance.to_owned();
    s.rocketmq.name_server = name_server.to_owned();
    s.broker.consume_threads = 8;
    s.http.bind = "127.0.0.1:0".to_owned();
    s.routes = shop::routes(topic);
    s
}

/// `settings` with group commit on, and enough deliveries in flight to fill its groups: 64
/// consume threads of one message each (`listener_batch` 1), or 4 threads of `listener_batch`
/// messages handed over together.
pub fn with_group_commit(mut s: Settings, listener_batch: u32) -> Settings {
    s.group_commit.enabled = true;
    s.group_commit.max_batch = 32;
    s.rocketmq.batch_size = listener_batch;
    s.broker.consume_threads = if listener_batch == 1 { 64 } else { 4 };
    s
}

/// The service's groups so far: how many committed, and the deliveries they held.
pub fn groups_of(service: &Service) -> (f64, f64) {
    let (status, text) = http_get(&service_addr(service), "/metrics").expect("/metrics answers");
    assert_eq!(status, 200);
    let sample = |name: &str| -> f64 {
        text.lines()
            .filter(|l| l.starts_with(name) && !l.starts_with('#'))
            .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
            .sum()
    };
    (sample("idemgate_group_size_count"), sample("idemgate_group_size_sum"))
}

/// Waits until the service has committed `groups` groups.
pub fn wait_for_groups(service: &Service, groups: u32, limit: Duration) {
    let started = Instant::now();
    while groups_of(service).0 < f64::from(groups) {
        assert!(started.elapsed() < limit, "no {groups} groups committed within {limit:?}");
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// The service's groups held more than one delivery each on average: group commit was on and
/// deliveries met in groups.
pub fn assert_groups_formed(service: &Service) {
    let (groups, deliveries) = groups_of(service);
    assert!(groups > 0.0, "no group committed");
    assert!(deliveries / groups > 1.0, "{deliveries} deliveries in {groups} groups");
}

/// A running `idemgate serve`.
pub struct Service {
    child: Child,
    pub log: PathBuf,
    _dir: tempfile::TempDir,
}

impl Service {
    /// Starts `idemgate-shop serve` with `settings` and waits until it reports that it is
    /// serving.
    pub fn start(settings: &Settings) -> Self {
        Self::start_as(BIN, settings)
    }

    /// Starts `bin serve` with `settings` and waits until it reports that it is serving.
    pub fn start_as(bin: &str, settings: &Settings) -> Self {
        Self::start_command(Command::new(bin), settings)
    }

    /// Starts `bin serve` with `settings` in `host`'s network namespace, and waits until it
    /// reports that it is serving. (The partition scenarios', tests/partitions.)
    #[allow(dead_code)]
    pub fn start_in(host: &idemgate_testkit::network::Host, bin: &str, settings: &Settings) -> Self {
        Self::start_command(host.command(bin), settings)
    }

    /// Starts `command serve` (the program, with its arguments to come) with `settings`.
    fn start_command(mut command: Command, settings: &Settings) -> Self {
        let dir = tempfile::tempdir().expect("temp dir");
        let config = dir.path().join("idemgate.toml");
        std::fs::write(&config, toml::to_string(settings).expect("settings to TOML")).expect("write config");
        let log = dir.path().join("serve.log");
        let out = std::fs::File::create(&log).expect("log file");
        let child = command
            .args(["--config", &config.to_string_lossy(), "serve"])
            .env_remove("RUST_LOG")
            .stdin(Stdio::null())
            .stdout(out.try_clone().expect("log file"))
            .stderr(out)
            .spawn()
            .expect("spawn idemgate serve");
        let service = Self { child, log, _dir: dir };
        service.wait_for_line("idemgate serving", Duration::from_secs(30));
        service
    }

    /// Its resident memory now, in MiB (`/proc/<pid>/status`); `None` once it has exited.
    pub fn rss_mib(&self) -> Option<f64> {
        let status = std::fs::read_to_string(format!("/proc/{}/status", self.child.id())).ok()?;
        let kib: f64 =
            status.lines().find(|l| l.starts_with("VmRSS:"))?.split_whitespace().nth(1)?.parse().ok()?;
        Some(kib / 1024.0)
    }

    pub fn wait_for_line(&self, needle: &str, limit: Duration) {
        let started = Instant::now();
        while started.elapsed() < limit {
            if self.log_text().contains(needle) {
                return;
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        panic!("serve did not log {needle:?} within {limit:?}:\n{}", self.log_text());
    }

    pub fn log_text(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// SIGKILL: no chance to finish anything.
    pub fn kill_hard(mut self) {
        self.child.kill().expect("SIGKILL");
        self.child.wait().expect("reap");
    }

    /// SIGTERM, then how it exited and what it logged.
    pub fn terminate(mut self) -> Exit {
        let ok =
            Command::new("kill").args(["-TERM", &self.child.id().to_string()]).status().expect("kill -TERM");
        assert!(ok.success());
        let started = Instant::now();
        loop {
            if let Some(status) = self.child.try_wait().expect("wait") {
                return Exit { status, log: self.log_text() };
            }
            assert!(started.elapsed() < Duration::from_secs(60), "serve did not exit within 60 s of SIGTERM");
            std::thread::sleep(Duration::from_millis(100));
        }
    }
}

/// How a service exited, with its log (the log file goes with the service).
pub struct Exit {
    pub status: std::process::ExitStatus,
    pub log: String,
}

impl Exit {
    pub fn code(&self) -> Option<i32> {
        self.status.code()
    }
}

impl Drop for Service {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// One accepted send, as `produce --sends` wrote it.
#[derive(Debug, serde::Deserialize)]
pub struct SendLine {
    pub uniq_key: String,
    /// `original`, `producer_resend`, `malformed`, … (the producer's kinds of send).
    #[serde(default)]
    #[allow(dead_code)]
    pub kind: String,
    /// The message's tag, which names its business type. Read by the partition scenarios
    /// (tests/partitions), which share this module.
    #[serde(default)]
    #[allow(dead_code)]
    pub tags: String,
    /// The message's keys; the first is its business key.
    #[serde(default)]
    #[allow(dead_code)]
    pub keys: Vec<String>,
}

/// Runs `idemgate produce` to `topic` on the shared broker and returns its report and its sends.
pub fn produce(
    topic: &str,
    run: &str,
    count: u64,
    rate: u32,
    extra: &[&str],
) -> (ProduceReport, Vec<SendLine>) {
    produce_on(broker().name_server(), topic, run, count, rate, extra)
}

/// Runs `idemgate produce` to `topic` through `name_server`.
pub fn produce_on(
    name_server: &str,
    topic: &str,
    run: &str,
    count: u64,
    rate: u32,
    extra: &[&str],
) -> (ProduceReport, Vec<SendLine>) {
    produce_with(
        &[("IDEMGATE_ROCKETMQ__NAME_SERVER", name_server.to_owned())],
        topic,
        run,
        count,
        rate,
        extra,
    )
}

/// Runs `idemgate produce` to `topic` on the broker of `kind`: the shared RocketMQ broker, the
/// machine's RabbitMQ or the shared tansu.
pub fn produce_to(
    kind: BrokerKind,
    topic: &str,
    run: &str,
    count: u64,
    rate: u32,
    extra: &[&str],
) -> (ProduceReport, Vec<SendLine>) {
    produce_with(&broker_env(kind), topic, run, count, rate, extra)
}

/// The environment that points a command at the broker of `kind`.
pub fn broker_env(kind: BrokerKind) -> Vec<(&'static str, String)> {
    let mut env = vec![("IDEMGATE_BROKER__KIND", kind.as_str().to_owned())];
    match kind {
        BrokerKind::RocketMq => {
            env.push(("IDEMGATE_ROCKETMQ__NAME_SERVER", broker().name_server().to_owned()))
        }
        BrokerKind::RabbitMq => env.push(("IDEMGATE_RABBITMQ__URL", idemgate_testkit::rabbitmq::url())),
        BrokerKind::Kafka => env.push(("IDEMGATE_KAFKA__BOOTSTRAP_SERVERS", kafka().bootstrap().to_owned())),
    }
    env
}

fn produce_with(
    env: &[(&str, String)],
    topic: &str,
    run: &str,
    count: u64,
    rate: u32,
    extra: &[&str],
) -> (ProduceReport, Vec<SendLine>) {
    let dir = tempfile::tempdir().expect("temp dir");
    let sends = dir.path().join("sends.jsonl");
    let output = Command::new(BIN)
        .args([
            "produce",
            "--topic",
            topic,
            "--run",
            run,
            "--count",
            &count.to_string(),
            "--rate",
            &rate.to_string(),
        ])
        .args(["--sends", &sends.to_string_lossy()])
        .args(extra)
        .envs(env.iter().map(|(k, v)| (*k, v.as_str())))
        .env_remove("RUST_LOG")
        .stdin(Stdio::null())
        .output()
        .expect("run idemgate produce");
    assert!(output.status.success(), "produce failed: {}", String::from_utf8_lossy(&output.stderr));
    let report = parse_report(&output.stdout);
    let lines = read_sends(&sends);
    assert_eq!(lines.len() as u64, report.sent);
    (report, lines)
}

fn parse_report(stdout: &[u8]) -> ProduceReport {
    let v: serde_json::Value = serde_json::from_slice(stdout).expect("produce prints JSON");
    ProduceReport {
        run: v["run"].as_str().expect("run").to_owned(),
        topic: v["topic"].as_str().expect("topic").to_owned(),
        sent: v["sent"].as_u64().expect("sent"),
        elapsed_seconds: v["elapsed_seconds"].as_f64().expect("elapsed"),
        sends_per_second: v["sends_per_second"].as_f64().expect("rate"),
        tally: serde_json::from_value(v["tally"].clone()).expect("tally"),
    }
}

fn read_sends(path: &Path) -> Vec<SendLine> {
    let file = std::fs::File::open(path).expect("sends file");
    std::io::BufReader::new(file)
        .lines()
        .map(|l| serde_json::from_str(&l.expect("line")).expect("a send line"))
        .collect()
}

static ORDERS: Sql = Sql::new("SELECT status FROM shop_order WHERE order_no LIKE ?");
static LEDGER: Sql =
    Sql::new("SELECT deduction_id, sku, quantity FROM shop_stock_ledger WHERE deduction_id LIKE ?");
static STOCK: Sql = Sql::new("SELECT sku, quantity FROM shop_stock");
static DEAD_POISON: Sql = Sql::new(
    "SELECT COUNT(DISTINCT biz_id) FROM delivery_log WHERE outcome = 'dead_lettered' AND biz_id LIKE ? AND consumer_group = ?",
);
static FIRST_ATTEMPTS: Sql = Sql::new(
    "SELECT uniq_key, COUNT(*) FROM delivery_log WHERE reconsume_times = 0 AND consumer_group = ? GROUP BY uniq_key",
);
static PROCESSED_BY: Sql = Sql::new(
    "SELECT instance_id, COUNT(*) FROM delivery_log WHERE outcome = 'processed' AND consumer_group = ? GROUP BY instance_id",
);

/// What the database says happened to one run.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Books {
    pub orders: u64,
    pub paid: u64,
    pub ledger_rows: u64,
    pub distinct_deductions: u64,
    pub deducted: BTreeMap<String, i64>,
    pub stock: BTreeMap<String, i64>,
    pub dead_lettered_poison: u64,
}

pub async fn books(store: &Store, run: &str, group: &str) -> Books {
    let pool = store.pool();
    let mut b = Books::default();
    for row in store.query(&ORDERS).bind(format!("{run}-O-%")).fetch_all(pool).await.expect("orders") {
        b.orders += 1;
        b.paid += u64::from(row.get::<String, _>(0) == "PAID");
    }
    let mut ids = std::collections::BTreeSet::new();
    for row in store.query(&LEDGER).bind(format!("{run}-D-%")).fetch_all(pool).await.expect("ledger") {
        b.ledger_rows += 1;
        ids.insert(row.get::<String, _>(0));
        *b.deducted.entry(row.get(1)).or_default() += row.get::<i64, _>(2);
    }
    b.distinct_deductions = ids.len() as u64;
    for row in store.query(&STOCK).fetch_all(pool).await.expect("stock") {
        b.stock.insert(row.get(0), row.get(1));
    }
    let dead = store.query(&DEAD_POISON).bind(format!("{run}-POISON-%")).bind(group).fetch_one(pool).await;
    b.dead_lettered_poison = dead.expect("dead letters").get::<i64, _>(0) as u64;
    b
}

/// The books a run must end with, from what `produce` says it sent.
pub fn expected_books(report: &ProduceReport) -> Books {
    let t = &report.tally;
    Books {
        orders: t.orders,
        paid: t.payments,
        ledger_rows: t.deductions,
        distinct_deductions: t.deductions,
        deducted: t.deducted.clone(),
        stock: t.deducted.iter().map(|(sku, q)| (sku.clone(), shop::INITIAL_STOCK - q)).collect(),
        dead_lettered_poison: t.poison,
    }
}

/// Polls until the books equal `expected` or `limit` passes, and returns the last books read.
pub async fn wait_for_books(
    store: &Store,
    run: &str,
    group: &str,
    expected: &Books,
    limit: Duration,
) -> Books {
    let started = Instant::now();
    loop {
        let b = books(store, run, group).await;
        if &b == expected || started.elapsed() > limit {
            return b;
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
}

static TROUBLE: Sql = Sql::new(
    "SELECT biz_type, biz_id, reconsume_times, outcome, error, instance_id FROM delivery_log \
     WHERE consumer_group = ? AND outcome IN ('failed', 'dead_lettered', 'invalid') AND biz_id NOT LIKE '%POISON%' \
     ORDER BY id",
);

/// The failed, dead-lettered and invalid deliveries of a group (poison aside), for failure messages.
pub async fn trouble(store: &Store, group: &str) -> String {
    let rows = store.query(&TROUBLE).bind(group).fetch_all(store.pool()).await.expect("trouble");
    rows.iter()
        .map(|r| {
            format!(
                "{} {} r{} {} {:?} {}",
                r.get::<String, _>(0),
                r.get::<String, _>(1),
                r.get::<i32, _>(2),
                r.get::<String, _>(3),
                r.get::<Option<String>, _>(4),
                r.get::<String, _>(5)
            )
        })
        .collect::<Vec<_>>()
        .join("\n")
}

/// The books end as `produce` reported, and every send is in the delivery log.
pub async fn assert_converges(
    store: &Store,
    run: &str,
    group: &str,
    report: &ProduceReport,
    sends: &[SendLine],
) {
    let expected = expected_books(report);
    let books = wait_for_books(store, run, group, &expected, Duration::from_secs(180)).await;
    assert_eq!(books, expected, "troubled deliveries:\n{}", trouble(store, group).await);
    assert_every_send_is_logged(store, group, sends).await;
}

/// Every send has at least one first-attempt row in the delivery log.
pub async fn assert_every_send_is_logged(store: &Store, group: &str, sends: &[SendLine]) {
    let mut logged: BTreeMap<String, i64> = BTreeMap::new();
    for row in store.query(&FIRST_ATTEMPTS).bind(group).fetch_all(store.pool()).await.expect("log") {
        logged.insert(row.get(0), row.get(1));
    }
    let mut sent: BTreeMap<&str, i64> = BTreeMap::new();
    for s in sends {
        *sent.entry(s.uniq_key.as_str()).or_default() += 1;
    }
    let missing: Vec<_> = sent
        .iter()
        .filter(|(k, n)| logged.get(**k).copied().unwrap_or(0) < **n)
        .map(|(k, n)| (*k, *n))
        .collect();
    assert!(
        missing.is_empty(),
        "{} sends have no delivery-log row, e.g. {:?}",
        missing.len(),
        &missing[..missing.len().min(5)]
    );
}

static DUPLICATES_BY_CAUSE: Sql = Sql::new(
    "SELECT COALESCE(cause, ''), COUNT(*) FROM delivery_log WHERE outcome = 'duplicate' AND consumer_group = ? GROUP BY cause",
);

/// The group's duplicate deliveries by cause (`""` for none).
pub async fn duplicates_by_cause(store: &Store, group: &str) -> BTreeMap<String, i64> {
    let rows = store.query(&DUPLICATES_BY_CAUSE).bind(group).fetch_all(store.pool()).await.expect("causes");
    rows.iter().map(|r| (r.get(0), r.get(1))).collect()
}

/// Runs `idemgate reconcile --since 1h` for `group`: its exit code and its report.
pub fn reconcile(db_url: &str, group: &str) -> (Option<i32>, String) {
    let out = Command::new(BIN)
        .args(["reconcile", "--since", "1h"])
        .env("IDEMGATE_DATABASE__URL", db_url)
        .env("IDEMGATE_CONSUMER__GROUP", group)
        .env_remove("RUST_LOG")
        .output()
        .expect("run idemgate reconcile");
    let text = format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    (out.status.code(), text)
}

/// Processed deliveries per instance.
pub async fn processed_by_instance(store: &Store, group: &str) -> BTreeMap<String, i64> {
    let rows = store.query(&PROCESSED_BY).bind(group).fetch_all(store.pool()).await.expect("by instance");
    rows.iter().map(|r| (r.get(0), r.get(1))).collect()
}

/// The values of the series of `name` in a `/metrics` text that carry every label of `labels`.
pub fn series(text: &str, name: &str, labels: &[(&str, &str)]) -> Vec<f64> {
    text.lines()
        .filter_map(|l| l.strip_prefix(name)?.strip_prefix('{'))
        .filter(|l| labels.iter().all(|(k, v)| l.contains(&format!("{k}=\"{v}\""))))
        .filter_map(|l| l.rsplit(' ').next()?.parse().ok())
        .collect()
}

/// The sum of [`series`], or `None` when there is none.
pub fn sample(text: &str, name: &str, labels: &[(&str, &str)]) -> Option<f64> {
    let values = series(text, name, labels);
    (!values.is_empty()).then(|| values.iter().sum())
}

/// `host:port` of a running service, from its start-up line.
pub fn service_addr(service: &Service) -> String {
    let log = service.log_text();
    let at =
        log.find("http=http://").expect("the start-up line names the HTTP address") + "http=http://".len();
    log[at..].chars().take_while(|c| c.is_ascii_digit() || *c == '.' || *c == ':').collect()
}

/// A `payment.confirm` of `amount_cents` for `order_no`, to send to `topic`.
pub fn payment(topic: &str, payment_no: &str, order_no: &str, amount_cents: i64) -> Delivery {
    shop::payment_message(
        topic,
        &shop::ConfirmPayment {
            order_no: order_no.to_owned(),
            payment_no: payment_no.to_owned(),
            amount_cents,
        },
    )
}

/// An `order.create` of one SKU-1 for `amount_cents`, to send to `topic`.
pub fn order(topic: &str, order_no: &str, amount_cents: i64) -> Delivery {
    shop::order_message(
        topic,
        &shop::CreateOrder {
            order_no: order_no.to_owned(),
            user_id: "u-test".to_owned(),
            sku: "SKU-1".to_owned(),
            quantity: 1,
            amount_cents,
        },
    )
}

static OUTCOMES: Sql = Sql::new(
    "SELECT outcome, COALESCE(cause, '') FROM delivery_log WHERE biz_id = ? ORDER BY logged_at_ms, id",
);

/// A key's delivery-log rows, oldest first, as `outcome/cause`.
pub async fn log_of(store: &Store, key: &str) -> Vec<String> {
    let rows = store.query(&OUTCOMES).bind(key).fetch_all(store.pool()).await.expect("log rows");
    rows.iter().map(|r| format!("{}/{}", r.get::<String, _>(0), r.get::<String, _>(1))).collect()
}

/// Waits (up to 240 s) until the key's log rows satisfy `done`; returns them.
pub async fn wait_for_log(
    store: &Store,
    key: &str,
    what: &str,
    done: impl Fn(&[String]) -> bool,
) -> Vec<String> {
    let started = Instant::now();
    loop {
        let seen = log_of(store, key).await;
        if done(&seen) {
            return seen;
        }
        assert!(started.elapsed() < Duration::from_secs(240), "no {what} for {key} within 240 s: {seen:?}");
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
}

/// The trace page's replay form for one key, as its browser would post it.
pub struct ReplayForm {
    /// The form's CSRF token.
    pub token: String,
    /// The url-encoded body the form posts to `/replay`.
    pub body: String,
}

/// Loads the trace page of `key` (of `biz_type`, in `group`, execute_time 0) and reads its replay
/// form; fails when the page offers none.
pub fn replay_form(addr: &str, group: &str, biz_type: &str, key: &str) -> ReplayForm {
    let (status, page) = http_get(addr, &format!("/trace?biz_id={key}")).expect("the trace page");
    assert_eq!(status, 200, "{page}");
    let token = replay_token_on(&page);
    let body = serde_urlencoded::to_string([
        ("group", group),
        ("biz_type", biz_type),
        ("biz_id", key),
        ("execute_time", "0"),
        ("csrf", token.as_str()),
    ])
    .expect("a url-encoded form");
    ReplayForm { token, body }
}

/// The CSRF token of the replay form on a trace page; fails when the page offers none.
pub fn replay_token_on(page: &str) -> String {
    page.split("name=\"csrf\" value=\"")
        .nth(1)
        .and_then(|s| s.split('"').next())
        .unwrap_or_else(|| panic!("the trace page has no replay form:\n{page}"))
        .to_owned()
}

/// A plain HTTP/1.1 GET; (status, body).
pub fn http_get(addr: &str, path: &str) -> Option<(u16, String)> {
    http_request(addr, "GET", path, None)
}

/// A form POST, as a browser on the service's own page sends it.
pub fn http_post_form(addr: &str, path: &str, form: &str) -> Option<(u16, String)> {
    http_request(addr, "POST", path, Some(form))
}

fn http_request(addr: &str, method: &str, path: &str, form: Option<&str>) -> Option<(u16, String)> {
    let origin = format!("http://{addr}");
    let headers: &[(&str, &str)] = match form {
        None => &[],
        Some(_) => &[("Origin", &origin), ("Content-Type", "application/x-www-form-urlencoded")],
    };
    let body = form.unwrap_or("").as_bytes();
    let reply =
        idemgate_testkit::http::request_blocking(addr, method, path, headers, body, Duration::from_secs(30))?;
    Some((reply.status, reply.body))
}

/// The stock deductions of the manifest, as the checker's sends.
#[allow(dead_code)] // The partition and Galera scenarios'.
pub fn deductions_sent(sends: &[SendLine]) -> Vec<Sent> {
    sends
        .iter()
        // A malformed send is refused as invalid by design, and poison dead-lettered: neither
        // has an effect to check.
        .filter(|s| {
            s.tags == idemgate_shop::TAG_STOCK_DEDUCT && !matches!(s.kind.as_str(), "malformed" | "poison")
        })
        .filter_map(|s| {
            Some(Sent {
                biz_id: s.keys.first()?.clone(),
                uniq_key: s.uniq_key.clone(),
                msg_id: s.uniq_key.clone(),
            })
        })
        .collect()
}

/// The history checker ([`history::check`]) over the run's stock deductions (`run`'s sends of
/// `group`) that the log holds since `since_ms`.
#[allow(dead_code)] // The partition and Galera scenarios'.
pub async fn check_history(
    store: &Store,
    group: &str,
    run: &str,
    sends: &[SendLine],
    since_ms: i64,
) -> history::Checked {
    let effects = format!(
        "SELECT deduction_id, COUNT(*) FROM shop_stock_ledger WHERE deduction_id LIKE '{run}-D-%' GROUP BY deduction_id"
    );
    let source = Source {
        consumer_group: group,
        biz_type: idemgate_shop::STOCK_DEDUCT,
        effects_sql: &effects,
        since_ms,
    };
    let history =
        History::read_broker_run(store, &source, deductions_sent(sends)).await.expect("the history");
    history::check(&history)
}

static EARLIEST_ATTEMPTS: Sql = Sql::new(
    "SELECT uniq_key, MIN(reconsume_times) FROM delivery_log WHERE consumer_group = ? GROUP BY uniq_key",
);

/// The sends with no delivery-log row at all, and how many sends have no row of their first
/// attempt (reconsume count 0).
async fn unlogged_sends(store: &Store, group: &str, sends: &[SendLine]) -> (Vec<String>, usize) {
    let rows =
        store.query(&EARLIEST_ATTEMPTS).bind(group).fetch_all(store.pool()).await.expect("the log's sends");
    let first: BTreeMap<String, i32> =
        rows.iter().map(|r| (r.get::<String, _>(0), r.get::<i32, _>(1))).collect();
    let keys: std::collections::BTreeSet<&str> = sends.iter().map(|s| s.uniq_key.as_str()).collect();
    let never = keys.iter().filter(|k| !first.contains_key(**k)).map(|k| (*k).to_owned()).collect();
    let late = keys.iter().filter(|k| first.get(**k).is_some_and(|r| *r > 0)).count();
    (never, late)
}

/// The attempts `services` counted unlogged (`idemgate_unlogged_deliveries_total`), summed.
#[allow(dead_code)] // The partition and Galera scenarios'.
pub fn unlogged_attempts(services: &[&Service]) -> f64 {
    services
        .iter()
        .map(|s| {
            let (_, text) = http_get(&service_addr(s), "/metrics").expect("/metrics answers");
            sample(&text, "idemgate_unlogged_deliveries_total", &[]).unwrap_or(0.0)
        })
        .sum()
}

/// Every send has a delivery-log row of some attempt, and no more sends lack a row of their
/// first attempt than the services counted unlogged (`unlogged`: attempts made while the log's
/// database refused them, answered `ReconsumeLater`, and logged at a later attempt).
#[allow(dead_code)] // The partition and Galera scenarios'.
pub async fn assert_every_send_is_logged_or_counted(
    store: &Store,
    group: &str,
    sends: &[SendLine],
    unlogged: f64,
) {
    let (never_logged, first_unlogged) = unlogged_sends(store, group, sends).await;
    assert!(never_logged.is_empty(), "sends with no delivery-log row at all: {never_logged:?}");
    assert!(
        first_unlogged as f64 <= unlogged,
        "{first_unlogged} sends have no first-attempt row, but only {unlogged} attempts were counted unlogged"
    );
}
