//! The assembled service in a test: [`spawn_app`] builds it with `Application::build_with`,
//! exactly as `serve` and the demo do, on a fresh scratch database and a free port, and starts
//! it. Requests go over real TCP to its HTTP server. A missing database server fails the test.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use async_trait::async_trait;
use idemgate::app::{Application, Feed, Running};
use idemgate::config::Settings;
use idemgate::delivery::Delivery;
use idemgate::gate::Gate;
use idemgate::handler::{Answers, Effect, Handler, HandlerError, Handlers, Work, handle_each};
use idemgate::route::RouteConfig;
use idemgate::store::{Backend, Conn, StoreOptions, query_built};
use idemgate_shop as shop;
use idemgate_testkit::scratch::ScratchDb;
use sqlx::Row;

pub const GROUP: &str = "app-tests";
pub const INSTANCE: &str = "app-1";
/// The topic of the test handlers' routes.
pub const TEST_TOPIC: &str = "idemgate_app_tests";
pub const SKU: &str = "SKU-APP";

/// A running service on its own database.
pub struct TestApp {
    running: Option<Running>,
    /// The pages' state of this service (its form tokens).
    pub web: Arc<idemgate::http::Web>,
    pub db: ScratchDb,
    /// `127.0.0.1:PORT`.
    pub addr: String,
}

/// The service with the default settings but a scratch database, a free port and the test's
/// group and instance, changed by `configure`.
pub async fn spawn_app(backend: Backend, configure: impl FnOnce(&mut Settings)) -> TestApp {
    spawn_app_with(backend, configure, Handlers::new()).await
}

/// [`spawn_app`] with `extra` handlers besides the configured ones; a handler named `NAME`
/// gets a route on [`TEST_TOPIC`], tag `NAME`, biz_type `NAME`, key from the message's KEYS.
pub async fn spawn_app_with(
    backend: Backend,
    configure: impl FnOnce(&mut Settings),
    extra: Handlers,
) -> TestApp {
    spawn_app_on(scratch_db(backend).await, configure, extra).await
}

/// A fresh scratch database on `backend`, for [`spawn_app_on`].
pub async fn scratch_db(backend: Backend) -> ScratchDb {
    ScratchDb::create(backend, &StoreOptions { max_connections: 4, ..Default::default() })
        .await
        .unwrap_or_else(|e| panic!("{e}. Start the service (scripts/services.sh)."))
}

/// [`spawn_app_with`] on `db`, which the test has prepared (business tables of its own).
pub async fn spawn_app_on(db: ScratchDb, configure: impl FnOnce(&mut Settings), extra: Handlers) -> TestApp {
    shop::seed_stock(&db.store, SKU, 1_000_000).await.expect("stock");
    let mut settings = shop::settings();
    settings.database.url = db.url.clone();
    settings.http.bind = "127.0.0.1:0".to_owned();
    settings.consumer.group = GROUP.to_owned();
    settings.consumer.instance = INSTANCE.to_owned();
    for name in extra.names() {
        settings.routes.push(RouteConfig {
            topic: TEST_TOPIC.to_owned(),
            tags: name.to_owned(),
            biz_type: name.to_owned(),
            biz_id: "keys".to_owned(),
            execute_time: None,
            handler: None,
        });
    }
    configure(&mut settings);
    let mut handlers = settings.handlers_with(shop::handlers()).expect("the configured handlers");
    handlers.extend(extra);
    let app = Application::build_with(&settings, handlers, Feed::Caller).await.expect("the service builds");
    let web = app.web().clone();
    let running = app.start().await.expect("the service starts");
    let addr = running.url().trim_start_matches("http://").to_owned();
    TestApp { running: Some(running), web, db, addr }
}

impl TestApp {
    pub fn running(&self) -> &Running {
        self.running.as_ref().expect("running")
    }

    pub fn gate(&self) -> Arc<Gate> {
        self.running().gate().clone()
    }

    pub async fn get(&self, path: &str) -> Reply {
        request(&self.addr, "GET", path, &[], b"").await
    }

    /// Waits at most `limit` for a part of the service to end on its own: its name and how it
    /// ended.
    pub async fn part_ended(&mut self, limit: Duration) -> Option<(&'static str, String)> {
        let running = self.running.as_mut().expect("running");
        tokio::time::timeout(limit, running.failed()).await.ok()
    }

    /// Stops the service, which must report a part that did not stop cleanly, and drops its
    /// database. Returns the report.
    pub async fn stop_with_fault(mut self) -> String {
        let running = self.running.take().expect("running");
        let fault = running.stop().await.expect_err("a part that ended on its own is reported at stop");
        self.db.drop_now().await;
        format!("{fault:#}")
    }

    /// Stops the service (it must stop cleanly) and drops its database.
    pub async fn stop(mut self) {
        if let Some(running) = self.running.take() {
            running.stop().await.expect("the service stops cleanly");
        }
        self.db.drop_now().await;
    }

    /// One integer from a query with text arguments.
    pub async fn scalar(&self, sql: &str, binds: &[&str]) -> i64 {
        let mut q = query_built(self.db.store.backend(), sql.to_owned());
        for b in binds {
            q = q.bind(b.to_string());
        }
        let row = q.fetch_one(self.db.store.pool()).await.unwrap_or_else(|e| panic!("{e}: {sql}"));
        row.try_get::<i64, _>(0).expect("an integer")
    }

    /// Runs a statement with text and integer arguments (`Arg`).
    pub async fn execute(&self, sql: &str, binds: &[Arg<'_>]) {
        let mut q = query_built(self.db.store.backend(), sql.to_owned());
        for b in binds {
            q = match b {
                Arg::Text(t) => q.bind(t.to_string()),
                Arg::Int(i) => q.bind(*i),
            };
        }
        q.execute(self.db.store.pool()).await.unwrap_or_else(|e| panic!("{e}: {sql}"));
    }

    /// Polls `probe` every 100 ms until it is true; false when `limit` passes first.
    pub async fn eventually(&self, limit: Duration, mut probe: impl AsyncFnMut(&Self) -> bool) -> bool {
        let started = Instant::now();
        while started.elapsed() < limit {
            if probe(self).await {
                return true;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        false
    }

    /// `count` claims `{prefix}-{i}` (stock.deduct), `age_ms` old, written as the gate would
    /// have, in one transaction: a run of the archive sees all of them or none.
    pub async fn seed_claims(&self, prefix: &str, count: usize, age_ms: i64) {
        let store = &self.db.store;
        let mut tx = store.begin().await.expect("begin");
        for i in 0..count {
            let biz_id = format!("{prefix}-{i}");
            query_built(
                store.backend(),
                "INSERT INTO idempotent_record (consumer_group, biz_type, biz_id, execute_time, msg_id, uniq_key, \
                 payload_hash, instance_id, claimed_at_ms) VALUES (?, ?, ?, 0, ?, ?, 'hash', 'seed', ?)"
                    .to_owned(),
            )
            .bind(GROUP)
            .bind(shop::STOCK_DEDUCT)
            .bind(biz_id.clone())
            .bind(format!("M-{biz_id}"))
            .bind(format!("U-{biz_id}"))
            .bind(now_ms() - age_ms)
            .execute(&mut *tx)
            .await
            .expect("seed claim");
        }
        tx.commit().await.expect("commit");
    }

    /// A delivery-log row `age_ms` old of `biz_id` (stock.deduct) with `outcome`.
    pub async fn seed_log_row(&self, biz_id: &str, outcome: &str, age_ms: i64) {
        self.execute(
            "INSERT INTO delivery_log (logged_at_ms, instance_id, consumer_group, msg_id, uniq_key, topic, tags, \
             queue_id, queue_offset, reconsume_times, biz_type, biz_id, execute_time, outcome, latency_us) \
             VALUES (?, 'seed', ?, ?, '', 't', '', 0, 0, 0, ?, ?, 0, ?, 1)",
            &[
                Arg::Int(now_ms() - age_ms),
                Arg::Text(GROUP),
                Arg::Text(&format!("M-{biz_id}-{outcome}")),
                Arg::Text(shop::STOCK_DEDUCT),
                Arg::Text(biz_id),
                Arg::Text(outcome),
            ],
        )
        .await;
    }

    /// The sum of a metric's samples whose line starts with `prefix` (name and labels).
    pub async fn metric(&self, prefix: &str) -> f64 {
        metric_at(&self.addr, prefix).await
    }
}

/// The sum of the samples whose line starts with `prefix` (name and labels) in a scrape of the
/// service at `addr`.
pub async fn metric_at(addr: &str, prefix: &str) -> f64 {
    let reply = request(addr, "GET", "/metrics", &[], b"").await;
    assert_eq!(reply.status, 200, "{}", reply.body);
    reply
        .body
        .lines()
        .filter(|l| l.starts_with(prefix))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum()
}

pub enum Arg<'a> {
    Text(&'a str),
    Int(i64),
}

pub fn now_ms() -> i64 {
    idemgate::clock::now_ms()
}

/// A `stock.deduct` of one unit of [`SKU`] for `biz_id`, as first sent.
pub fn deduct(biz_id: &str) -> Delivery {
    Delivery {
        msg_id: format!("M-{biz_id}-{}", rand::random::<u32>()),
        uniq_key: format!("U-{biz_id}"),
        topic: shop::TOPIC.to_owned(),
        tags: shop::TAG_STOCK_DEDUCT.to_owned(),
        keys: vec![biz_id.to_owned()],
        body: serde_json::to_vec(&shop::DeductStock { sku: SKU.to_owned(), quantity: 1 }).expect("json"),
        ..Default::default()
    }
}

/// A delivery for the test handler `name` with key `biz_id`.
pub fn for_handler(name: &str, biz_id: &str) -> Delivery {
    Delivery {
        msg_id: format!("M-{biz_id}-{}", rand::random::<u32>()),
        uniq_key: format!("U-{biz_id}"),
        topic: TEST_TOPIC.to_owned(),
        tags: name.to_owned(),
        keys: vec![biz_id.to_owned()],
        body: b"{}".to_vec(),
        ..Default::default()
    }
}

/// A handler that sleeps, then applies nothing but its claim.
pub struct Sleepy(pub Duration);

#[async_trait]
impl Handler for Sleepy {
    async fn handle(&self, _: &Work<'_>, _: &mut Conn) -> Result<Effect, HandlerError> {
        tokio::time::sleep(self.0).await;
        Ok(Effect::Applied)
    }
}

/// A handler that counts the calls of its batch form, then takes the batch one delivery at a
/// time as a handler without a batch form does.
pub struct BatchCounting(pub Arc<std::sync::atomic::AtomicUsize>);

#[async_trait]
impl Handler for BatchCounting {
    async fn handle(&self, _: &Work<'_>, _: &mut Conn) -> Result<Effect, HandlerError> {
        Ok(Effect::Applied)
    }

    async fn handle_batch(&self, works: &[Work<'_>], conn: &mut Conn) -> Result<Answers, HandlerError> {
        self.0.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        handle_each(self, works, conn).await
    }
}

/// A handler that waits until the test opens it.
pub struct Gated(pub Arc<tokio::sync::Semaphore>);

#[async_trait]
impl Handler for Gated {
    async fn handle(&self, _: &Work<'_>, _: &mut Conn) -> Result<Effect, HandlerError> {
        let _permit = self.0.acquire().await.map_err(|e| HandlerError::Retryable(e.to_string()))?;
        Ok(Effect::Applied)
    }
}

/// A handler whose first `fail` calls fail with a transient database error (a lost
/// connection's kind), then applies.
pub struct TransientlyFailing {
    pub fail: u32,
    pub calls: Arc<Mutex<u32>>,
}

#[async_trait]
impl Handler for TransientlyFailing {
    async fn handle(&self, _: &Work<'_>, _: &mut Conn) -> Result<Effect, HandlerError> {
        let mut calls = self.calls.lock().unwrap();
        *calls += 1;
        if *calls <= self.fail {
            return Err(HandlerError::Database(sqlx::Error::PoolTimedOut));
        }
        Ok(Effect::Applied)
    }
}

/// A handler that always asks to be retried.
pub struct AlwaysRetry;

#[async_trait]
impl Handler for AlwaysRetry {
    async fn handle(&self, _: &Work<'_>, _: &mut Conn) -> Result<Effect, HandlerError> {
        Err(HandlerError::Retryable("the downstream is not ready".to_owned()))
    }
}

pub use idemgate_testkit::http::{Reply, head, request};

/// What `tracing` wrote while `f` ran, for the settings whose effect is a log line. The
/// subscriber is this thread's only; the test runtime runs every task on this thread.
pub struct LogCapture(Arc<Mutex<Vec<u8>>>);

impl LogCapture {
    pub fn start() -> (Self, tracing::subscriber::DefaultGuard) {
        let buffer = Arc::new(Mutex::new(Vec::new()));
        let writer = buffer.clone();
        let subscriber = tracing_subscriber::fmt()
            .with_ansi(false)
            .with_max_level(tracing::Level::INFO)
            .with_writer(move || CaptureWriter(writer.clone()))
            .finish();
        (Self(buffer), tracing::subscriber::set_default(subscriber))
    }

    pub fn text(&self) -> String {
        String::from_utf8_lossy(&self.0.lock().unwrap()).into_owned()
    }
}

struct CaptureWriter(Arc<Mutex<Vec<u8>>>);

impl std::io::Write for CaptureWriter {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(buf);
        Ok(buf.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}
