//! Test databases: each test gets its own scratch database (or SQLite file), so runs never
//! collide. A missing service is a failure, never a skip.

use std::sync::Arc;

use idemgate::config::Settings;
use idemgate::delivery::Delivery;
use idemgate::gate::ClaimPath;
use idemgate::gate::{Gate, GroupSettings, Identity};
use idemgate::handler::Handlers;
use idemgate::outcome::{Outcome, Verdict};
use idemgate::route::RouteConfig;
use idemgate::store::{Backend, MySqlFlavour, Sql, Store, StoreOptions};
use idemgate_shop as shop;
use idemgate_testkit::scratch::ScratchDb;
use sqlx::Row;

fn options() -> StoreOptions {
    StoreOptions { max_connections: 24, ..Default::default() }
}

/// A fresh database that is dropped when the test ends.
pub struct TestDb {
    pub store: Store,
    scratch: ScratchDb,
}

impl TestDb {
    pub async fn new(backend: Backend) -> Self {
        let scratch = ScratchDb::create(backend, &options()).await.unwrap_or_else(|e| {
            panic!("{e}. Start the service (scripts/services.sh) or set IDEMGATE_TEST_*_URL.")
        });
        Self { store: scratch.store.clone(), scratch }
    }

    /// The database's URL, for a service of its own on it.
    pub fn url(&self) -> &str {
        &self.scratch.url
    }

    /// A second, independent pool on the same database: another process, as far as the
    /// database can tell.
    pub async fn second_store(&self) -> Store {
        self.scratch.second_store(&options()).await.expect("second pool")
    }

    /// One integer from a query (a count, a sum cast to BIGINT).
    pub async fn scalar(&self, sql: &'static Sql, binds: &[&str]) -> i64 {
        let mut q = self.store.query(sql);
        for b in binds {
            q = q.bind(*b);
        }
        let row = q.fetch_one(self.store.pool()).await.expect("scalar query");
        row.try_get::<i64, _>(0).expect("an integer")
    }

    /// One text value from a query with one argument.
    pub async fn scalar_text(&self, sql: &'static Sql, bind: &str) -> String {
        let row = self.store.query(sql).bind(bind).fetch_one(self.store.pool()).await.expect("text query");
        row.try_get::<String, _>(0).expect("a text")
    }
}

/// The trace page's context with no links and a 10-second bound: what a test of the trace reads
/// its answers with.
pub fn trace_context() -> idemgate::inspect::trace::TraceContext {
    idemgate::inspect::trace::TraceContext {
        limits: idemgate::inspect::Limits { timeout: std::time::Duration::from_secs(10) },
        retention: None,
        grafana_url: None,
        trace_url_template: None,
        dashboard_url_template: None,
        describers: Default::default(),
    }
}

pub fn identity(group: &str, instance: &str) -> Identity {
    Identity { consumer_group: group.to_owned(), instance_id: instance.to_owned() }
}

tokio::task_local! {
    /// Set by [`on_every_backend_with_group_commit!`]: the gates a case makes commit in groups.
    pub static GROUP_COMMIT: bool;
}

/// The group commit of the grouped runs: small groups and a linger long enough for the cases'
/// concurrent deliveries to meet in one group.
pub fn test_group_settings() -> GroupSettings {
    GroupSettings { enabled: true, max_batch: 8, linger_ms: 20, in_flight: 2, queue: 64, batch: true }
}

tokio::task_local! {
    /// Set by [`on_mariadb_claiming_as_on_mysql!`]: the gates a case makes take their MariaDB
    /// for MySQL, so that group commit claims without `INSERT … RETURNING`.
    pub static CLAIMING_AS_ON_MYSQL: bool;
}

/// A gate on the shop routes and handlers, plus `extra` routes and handlers; with group
/// commit when the case runs under [`on_every_backend_with_group_commit!`], claiming as on
/// MySQL under [`on_mariadb_claiming_as_on_mysql!`]. Built by the service's own assembly
/// (`idemgate::app::assemble_gate`) from the settings [`gate_settings`] describes.
pub fn gate(store: Store, id: Identity, extra_routes: Vec<RouteConfig>, extra: Handlers) -> Gate {
    let store = if CLAIMING_AS_ON_MYSQL.try_with(|on| *on).unwrap_or(false) {
        let store = store.assuming_mysql_flavour(MySqlFlavour::MySql);
        assert_eq!(ClaimPath::of(&store), ClaimPath::ReadBack, "{store:?}");
        store
    } else {
        store
    };
    let mut handlers = shop::handlers();
    handlers.extend(extra);
    idemgate::app::assemble_gate(&gate_settings(&id, extra_routes), store, handlers, None).expect("gate")
}

/// [`gate`] on the shop routes and handlers, with `configure` changing its settings first.
pub fn gate_with(store: Store, id: Identity, configure: impl FnOnce(&mut Settings)) -> Gate {
    let mut settings = gate_settings(&id, Vec::new());
    configure(&mut settings);
    idemgate::app::assemble_gate(&settings, store, shop::handlers(), None).expect("gate")
}

/// The settings of the cases' gates: the shop routes plus `extra_routes`, the group and
/// instance of `id`, the default policy, and the test group commit when the case runs under
/// [`on_every_backend_with_group_commit!`].
pub fn gate_settings(id: &Identity, extra_routes: Vec<RouteConfig>) -> Settings {
    let mut settings = shop::settings();
    settings.routes.extend(extra_routes);
    settings.consumer.group = id.consumer_group.clone();
    settings.consumer.instance = id.instance_id.clone();
    if GROUP_COMMIT.try_with(|on| *on).unwrap_or(false) {
        settings.group_commit = test_group_settings();
    }
    settings
}

pub fn stock_deduct(biz_id: &str, msg_id: &str, uniq_key: &str, sku: &str, quantity: i64) -> Delivery {
    let body = shop::DeductStock { sku: sku.to_owned(), quantity };
    Delivery {
        msg_id: msg_id.to_owned(),
        uniq_key: uniq_key.to_owned(),
        ..shop::deduction_message(shop::TOPIC, biz_id, &body)
    }
}

/// A `payment.confirm` of `amount_cents` for `order_no`, as delivered with `msg_id` and
/// `uniq_key` after `reconsume` failures.
pub fn payment(
    payment_no: &str,
    order_no: &str,
    amount_cents: i64,
    msg_id: &str,
    uniq_key: &str,
    reconsume: i32,
) -> Delivery {
    let body = shop::ConfirmPayment {
        order_no: order_no.to_owned(),
        payment_no: payment_no.to_owned(),
        amount_cents,
    };
    Delivery {
        msg_id: msg_id.to_owned(),
        uniq_key: uniq_key.to_owned(),
        reconsume_times: reconsume,
        ..shop::payment_message(shop::TOPIC, &body)
    }
}

/// An `order.create` of one `sku` for `amount_cents`, as delivered with `msg_id` and `uniq_key`.
pub fn order(order_no: &str, sku: &str, amount_cents: i64, msg_id: &str, uniq_key: &str) -> Delivery {
    let body = shop::CreateOrder {
        order_no: order_no.to_owned(),
        user_id: "u-1".to_owned(),
        sku: sku.to_owned(),
        quantity: 1,
        amount_cents,
    };
    Delivery {
        msg_id: msg_id.to_owned(),
        uniq_key: uniq_key.to_owned(),
        ..shop::order_message(shop::TOPIC, &body)
    }
}

/// Runs each `cases::$case(backend)` as a test on PostgreSQL and MariaDB: the database servers.
#[allow(unused_macros)]
macro_rules! on_the_servers {
    ($($case:ident),* $(,)?) => {
        mod postgres {
            $(#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
            async fn $case() { super::cases::$case(idemgate::store::Backend::Postgres).await })*
        }
        mod mariadb {
            $(#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
            async fn $case() { super::cases::$case(idemgate::store::Backend::MySql).await })*
        }
    };
}

/// Runs each `cases::$case(backend)` as a test on SQLite, PostgreSQL and MariaDB.
macro_rules! on_every_backend {
    ($($case:ident),* $(,)?) => {
        mod sqlite {
            $(#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
            async fn $case() { super::cases::$case(idemgate::store::Backend::Sqlite).await })*
        }
        on_the_servers!($($case),*);
    };
}

/// Runs each `cases::$case(backend)` as a test on SQLite, PostgreSQL and MariaDB with group
/// commit on: every gate the case makes through [`gate`] commits in groups.
#[allow(unused_macros)]
macro_rules! on_every_backend_with_group_commit {
    ($($case:ident),* $(,)?) => {
        mod sqlite_group_commit {
            $(#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
            async fn $case() {
                crate::conformance::support::GROUP_COMMIT
                    .scope(true, super::cases::$case(idemgate::store::Backend::Sqlite))
                    .await
            })*
        }
        mod postgres_group_commit {
            $(#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
            async fn $case() {
                crate::conformance::support::GROUP_COMMIT
                    .scope(true, super::cases::$case(idemgate::store::Backend::Postgres))
                    .await
            })*
        }
        mod mariadb_group_commit {
            $(#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
            async fn $case() {
                crate::conformance::support::GROUP_COMMIT
                    .scope(true, super::cases::$case(idemgate::store::Backend::MySql))
                    .await
            })*
        }
    };
}

/// Runs each `cases::$case(backend)` as a test on MariaDB with group commit on, its claims made
/// as on MySQL: `INSERT IGNORE` and the group's own rows read back, instead of
/// `INSERT IGNORE … RETURNING`, which MySQL lacks. (MySQL itself is not at hand here; its
/// statements are.)
#[allow(unused_macros)]
macro_rules! on_mariadb_claiming_as_on_mysql {
    ($($case:ident),* $(,)?) => {
        mod mariadb_claiming_as_on_mysql {
            $(#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
            async fn $case() {
                let case = super::cases::$case(idemgate::store::Backend::MySql);
                let grouped = crate::conformance::support::GROUP_COMMIT.scope(true, case);
                crate::conformance::support::CLAIMING_AS_ON_MYSQL.scope(true, grouped).await
            })*
        }
    };
}

/// The values of a metric's series whose labels include every one of `labels`, from the
/// metrics' own text exposition.
pub async fn series(metrics: &idemgate::metrics::Metrics, name: &str, labels: &[&str]) -> Vec<f64> {
    let text = metrics.render(None).await;
    text.lines()
        .filter(|l| l.starts_with(&format!("{name}{{")) && labels.iter().all(|label| l.contains(label)))
        .map(|l| l.rsplit(' ').next().and_then(|v| v.parse::<f64>().ok()).expect("a value"))
        .collect()
}

static RACE_STOCK_OF: Sql = Sql::new("SELECT quantity FROM shop_stock WHERE sku = ?");
static RACE_LEDGER_ROWS_OF: Sql = Sql::new("SELECT COUNT(*) FROM shop_stock_ledger WHERE deduction_id = ?");
static CLAIMS_OF: Sql = Sql::new("SELECT COUNT(*) FROM idempotent_record_all WHERE biz_id = ?");
static LOG_ROWS_OF: Sql = Sql::new("SELECT COUNT(*) FROM delivery_log WHERE biz_id = ? AND outcome = ?");

/// Sixteen deliveries of one deduction at once from two gates (two processes): half broker
/// redeliveries, half producer resends. Exactly one applies.
pub async fn race(db: &TestDb, a: Arc<Gate>, b: Arc<Gate>, biz_id: &str, sku: &str) {
    shop::seed_stock(&db.store, sku, 1_000).await.unwrap();
    let barrier = Arc::new(tokio::sync::Barrier::new(16));
    let tasks: Vec<_> = (0..16)
        .map(|i| {
            let g = if i % 2 == 0 { a.clone() } else { b.clone() };
            let barrier = barrier.clone();
            let uniq = if i % 2 == 0 { "U-1".to_owned() } else { format!("U-resend-{i}") };
            let d = stock_deduct(biz_id, &format!("M-{i}"), &uniq, sku, 7);
            tokio::spawn(async move {
                barrier.wait().await;
                g.process(&d).await
            })
        })
        .collect();
    let mut outcomes = Vec::new();
    let mut largest_group = 0;
    for t in tasks {
        let r = t.await.expect("no panic");
        assert_eq!(r.verdict, Verdict::Ack, "{r:?}");
        assert!(r.logged);
        outcomes.push(r.outcome);
        largest_group = largest_group.max(r.phases.group_size);
    }
    if GROUP_COMMIT.try_with(|on| *on).unwrap_or(false) {
        assert!(largest_group > 1, "racing deliveries met in one group: {largest_group}");
    }
    assert_eq!(outcomes.iter().filter(|o| **o == Outcome::Processed).count(), 1, "{outcomes:?}");
    assert_eq!(outcomes.iter().filter(|o| **o == Outcome::Duplicate).count(), 15, "{outcomes:?}");
    assert_eq!(db.scalar(&RACE_STOCK_OF, &[sku]).await, 993, "stock decremented once");
    assert_eq!(db.scalar(&RACE_LEDGER_ROWS_OF, &[biz_id]).await, 1, "one ledger row");
    assert_eq!(db.scalar(&CLAIMS_OF, &[biz_id]).await, 1, "one claim");
    assert_eq!(db.scalar(&LOG_ROWS_OF, &[biz_id, "processed"]).await, 1);
    assert_eq!(db.scalar(&LOG_ROWS_OF, &[biz_id, "duplicate"]).await, 15);
}

/// A stand-in for the broker, for replay where there is none: what replay publishes is
/// delivered to the gate at once, with a msgId and UNIQ_KEY of its own (`R-` and the replayed
/// row's msgId), as the broker would deliver it.
pub struct ToTheGate<'a> {
    pub gate: &'a Gate,
}

#[async_trait::async_trait]
impl idemgate::replay::Publish for ToTheGate<'_> {
    async fn publish(&self, message: &Delivery) -> anyhow::Result<String> {
        let of = message.properties.get(idemgate::delivery::REPLAY_PROPERTY);
        let uniq_key = format!("R-{}", of.map_or("", String::as_str));
        let delivered = Delivery { msg_id: uniq_key.clone(), uniq_key: uniq_key.clone(), ..message.clone() };
        let r = self.gate.process(&delivered).await;
        anyhow::ensure!(r.logged, "the replayed delivery was not logged: {r:?}");
        Ok(uniq_key)
    }
}
