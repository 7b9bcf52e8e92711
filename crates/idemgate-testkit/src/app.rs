//! The assembled service in a test: [`spawn_app`] builds it with `Application::build_with`,
//! exactly as `serve` and the demo do, with the example shop's handlers beside the configured
//! ones, on a fresh scratch database and a free port, and starts it, fed by the test
//! (`Feed::Caller`). Requests go over real TCP ([`crate::http`]) to its HTTP server, or, without
//! the network, through its router ([`TestApp::oneshot`]). A missing database server fails the
//! test.

use std::sync::Arc;
use std::time::{Duration, Instant};

use idemgate::app::{Application, Feed, Running};
use idemgate::config::Settings;
use idemgate::gate::Gate;
use idemgate::handler::Handlers;
use idemgate::route::RouteConfig;
use idemgate::store::{Backend, StoreOptions, query_built};
use idemgate_shop as shop;
use sqlx::Row;

use crate::http::{Reply, request};
use crate::scratch::ScratchDb;

pub const GROUP: &str = "app-tests";
pub const INSTANCE: &str = "app-1";
/// The topic of the test handlers' routes.
pub const TEST_TOPIC: &str = "idemgate_app_tests";
pub const SKU: &str = "SKU-APP";

/// A running service on its own database.
pub struct TestApp {
    running: Option<Running>,
    /// The HTTP routes on the service's own state, for requests without the network.
    router: axum::Router,
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
    let (web, router) = (app.web().clone(), app.router());
    let running = app.start().await.expect("the service starts");
    let addr = running.url().trim_start_matches("http://").to_owned();
    TestApp { running: Some(running), router, web, db, addr }
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

    /// The service's HTTP routes, for requests without the network from tasks of the test's own.
    pub fn router(&self) -> axum::Router {
        self.router.clone()
    }

    /// `request` through the service's routes without the network
    /// (`tower::ServiceExt::oneshot`): the status, the body and the headers.
    pub async fn oneshot(
        &self,
        request: axum::http::Request<axum::body::Body>,
    ) -> (axum::http::StatusCode, String, axum::http::HeaderMap) {
        use tower::ServiceExt;
        let response = self.router.clone().oneshot(request).await.expect("a response");
        let status = response.status();
        let headers = response.headers().clone();
        let bytes = axum::body::to_bytes(response.into_body(), 16 << 20).await.expect("body");
        (status, String::from_utf8(bytes.to_vec()).expect("utf-8"), headers)
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
/// service at `addr`, read as [`without_broker`] writes it.
pub async fn metric_at(addr: &str, prefix: &str) -> f64 {
    let reply = request(addr, "GET", "/metrics", &[], b"").await;
    assert_eq!(reply.status, 200, "{}", reply.body);
    without_broker(&reply.body)
        .lines()
        .filter(|l| l.starts_with(prefix))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum()
}

/// A scrape with the `broker` label every series carries taken out (the registry adds it after a
/// series' own labels: `{a="b",broker="rocketmq"}` reads `{a="b"}`, `{broker="rocketmq"}`
/// nothing), so that a test names only the labels it is about. Every one is checked first to be
/// the broker the test app consumes.
pub fn without_broker(scrape: &str) -> String {
    let label = format!("broker=\"{}\"", idemgate::broker::BrokerKind::RocketMq.as_str());
    scrape
        .lines()
        .map(|l| {
            if l.starts_with('#') {
                return l.to_owned();
            }
            assert!(l.contains(&label), "every series carries {label}: {l}");
            l.replacen(&format!(",{label}}}"), "}", 1).replacen(&format!("{{{label}}}"), "", 1)
        })
        .collect::<Vec<_>>()
        .join("\n")
}

/// An argument of [`TestApp::execute`].
pub enum Arg<'a> {
    Text(&'a str),
    Int(i64),
}

/// The clock the service reads.
pub fn now_ms() -> i64 {
    idemgate::clock::now_ms()
}
