//! Test databases: each test gets its own fresh database (or SQLite file), so runs never
//! collide. A missing service is a failure, never a skip.

use std::sync::atomic::{AtomicU32, Ordering};

use idemgate::delivery::Delivery;
use idemgate::gate::{Gate, Identity, Policy};
use idemgate::handler::Handlers;
use idemgate::route::{RouteConfig, Routes};
use idemgate::shop;
use idemgate::store::{Backend, Sql, Store, StoreOptions};
use sqlx::{AnyPool, Executor, Row};

pub const POSTGRES_ADMIN_URL: &str = "postgres://postgres@127.0.0.1:5432/postgres";
pub const MYSQL_ADMIN_URL: &str = "mysql://root@127.0.0.1:3306/test";

fn admin_url(backend: Backend) -> String {
    let (var, default) = match backend {
        Backend::Postgres => ("IDEMGATE_TEST_POSTGRES_URL", POSTGRES_ADMIN_URL),
        Backend::MySql => ("IDEMGATE_TEST_MYSQL_URL", MYSQL_ADMIN_URL),
        Backend::Sqlite => unreachable!("SQLite needs no server"),
    };
    std::env::var(var).unwrap_or_else(|_| default.to_owned())
}

/// A fresh database that is dropped when the test ends.
pub struct TestDb {
    pub store: Store,
    pub url: String,
    backend: Backend,
    name: String,
    _dir: Option<tempfile::TempDir>,
}

static NEXT: AtomicU32 = AtomicU32::new(0);

impl TestDb {
    pub async fn new(backend: Backend) -> Self {
        sqlx::any::install_default_drivers();
        let name = format!(
            "idemgate_t_{}_{}_{}",
            std::process::id(),
            NEXT.fetch_add(1, Ordering::Relaxed),
            rand::random::<u16>()
        );
        let (url, dir) = match backend {
            Backend::Sqlite => {
                let dir = tempfile::tempdir().expect("a temporary directory");
                let url = format!("sqlite://{}?mode=rwc", dir.path().join("gate.db").display());
                (url, Some(dir))
            }
            Backend::Postgres | Backend::MySql => {
                let admin = admin_url(backend);
                let pool = AnyPool::connect(&admin).await.unwrap_or_else(|e| {
                    panic!(
                        "{backend} is required by this test and is not reachable at {admin}: {e}. \
                         Start it (scripts/services.sh) or point the test at it with IDEMGATE_TEST_{}_URL.",
                        backend.name().to_uppercase()
                    )
                });
                pool.execute(sqlx::AssertSqlSafe(format!("CREATE DATABASE {name}")))
                    .await
                    .expect("CREATE DATABASE");
                pool.close().await;
                let base = admin.rsplit_once('/').map(|(b, _)| b).unwrap_or(&admin);
                (format!("{base}/{name}"), None)
            }
        };
        let options = StoreOptions { max_connections: 24, ..Default::default() };
        let store = Store::open(&url, &options).await.expect("open and migrate the test database");
        Self { store, url, backend, name, _dir: dir }
    }

    /// A second, independent pool on the same database: another process, as far as the
    /// database can tell.
    pub async fn second_store(&self) -> Store {
        Store::connect(&self.url, &StoreOptions { max_connections: 24, ..Default::default() })
            .await
            .expect("second pool")
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
}

impl TestDb {
    /// One text value from a query with one argument.
    pub async fn scalar_text(&self, sql: &'static Sql, bind: &str) -> String {
        let row = self.store.query(sql).bind(bind).fetch_one(self.store.pool()).await.expect("text query");
        row.try_get::<String, _>(0).expect("a text")
    }
}

impl Drop for TestDb {
    fn drop(&mut self) {
        if self.backend == Backend::Sqlite {
            return;
        }
        let (backend, name) = (self.backend, self.name.clone());
        let pool = self.store.pool().clone();
        // Drop runs inside the test's runtime, which cannot be blocked on: drop the database
        // from a thread with a runtime of its own.
        let _ = std::thread::spawn(move || {
            let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().ok()?;
            rt.block_on(async move {
                pool.close().await;
                let admin = AnyPool::connect(&admin_url(backend)).await.ok()?;
                let sql = match backend {
                    Backend::Postgres => format!("DROP DATABASE IF EXISTS {name} WITH (FORCE)"),
                    _ => format!("DROP DATABASE IF EXISTS {name}"),
                };
                admin.execute(sqlx::AssertSqlSafe(sql)).await.ok()?;
                admin.close().await;
                Some(())
            })
        })
        .join();
    }
}

pub fn identity(group: &str, instance: &str) -> Identity {
    Identity { consumer_group: group.to_owned(), instance_id: instance.to_owned() }
}

/// A gate on the shop routes and handlers, plus `extra` routes and handlers.
pub fn gate(store: Store, id: Identity, extra_routes: Vec<RouteConfig>, extra: Handlers) -> Gate {
    let mut routes = shop::routes(shop::TOPIC);
    routes.extend(extra_routes);
    let mut handlers = shop::handlers();
    handlers.extend(extra);
    Gate::new(store, Routes::new(&routes).expect("routes"), handlers, id, Policy::default()).expect("gate")
}

pub fn stock_deduct(biz_id: &str, msg_id: &str, uniq_key: &str, sku: &str, quantity: i64) -> Delivery {
    Delivery {
        msg_id: msg_id.to_owned(),
        uniq_key: uniq_key.to_owned(),
        topic: shop::TOPIC.to_owned(),
        tags: shop::TAG_STOCK_DEDUCT.to_owned(),
        keys: vec![biz_id.to_owned()],
        body: serde_json::to_vec(&shop::DeductStock { sku: sku.to_owned(), quantity }).expect("json"),
        ..Default::default()
    }
}
