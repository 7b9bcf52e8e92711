//! The service plants nothing of the example shop in a user's database, refuses to start
//! without what names a deployment's business (routes, a consumer group), and a database that
//! ran the service's migrations while they still made the shop's tables keeps working.

use idemgate::testing::scratch::{SERVICE_TABLES, ScratchDb};
use idemgate::testing::shop;
use idemgate::testing::store::{Backend, Sql, StoreOptions};
use sqlx::Row;

const BACKENDS: [Backend; 3] = [Backend::Sqlite, Backend::Postgres, Backend::MySql];

async fn empty_db(backend: Backend) -> ScratchDb {
    ScratchDb::create_empty(backend, &StoreOptions { max_connections: 4, ..Default::default() })
        .await
        .unwrap_or_else(|e| panic!("{e}. Start the service (scripts/services.sh)."))
}

fn sorted(names: &[&str]) -> Vec<String> {
    let mut names: Vec<String> = names.iter().map(|n| (*n).to_owned()).collect();
    names.sort();
    names
}

#[tokio::test]
async fn the_service_migrations_make_only_the_services_tables_on_every_backend() {
    for backend in BACKENDS {
        let db = empty_db(backend).await;
        db.store.migrate().await.expect("the service's migrations");
        assert_eq!(db.tables().await.expect("the tables"), sorted(&SERVICE_TABLES), "{backend}");
        db.drop_now().await;
    }
}

static STOCK_ROWS: Sql = Sql::new("SELECT COUNT(*) FROM shop_stock");

#[tokio::test]
async fn a_database_that_ran_the_first_texts_keeps_its_shop_tables_and_validates() {
    for backend in BACKENDS {
        let db = empty_db(backend).await;
        idemgate::testing::store::migrations::as_first_run(backend)
            .run(db.store.pool())
            .await
            .unwrap_or_else(|e| panic!("{backend}: the migrations as they first ran: {e}"));
        let before = db.tables().await.expect("the tables");
        assert!(
            before.contains(&"shop_order".to_owned()),
            "{backend}: the old shape has the shop: {before:?}"
        );
        // The service starts on it: every applied version validates, nothing is pending.
        db.store.migrate().await.unwrap_or_else(|e| panic!("{backend}: {e:?}"));
        // The shop, run on it again, finds its tables made and adds its stock.
        shop::prepare(&db.store).await.unwrap_or_else(|e| panic!("{backend}: {e}"));
        shop::prepare(&db.store).await.unwrap_or_else(|e| panic!("{backend}: a second time: {e}"));
        let stock: i64 = db.store.query(&STOCK_ROWS).fetch_one(db.store.pool()).await.expect("stock").get(0);
        assert_eq!(stock, 5, "{backend}");
        let after = db.tables().await.expect("the tables");
        let added: Vec<&String> = after.iter().filter(|t| !before.contains(t)).collect();
        assert_eq!(added, ["_idemgate_shop_migrations"], "{backend}");
        db.drop_now().await;
    }
}

/// `idemgate serve` with `config` (TOML) and nothing else: its exit code and standard error.
fn serve(config: &str) -> (Option<i32>, String) {
    let dir = tempfile::tempdir().expect("temp dir");
    let path = dir.path().join("idemgate.toml");
    std::fs::write(&path, config).expect("config");
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_idemgate"))
        .args(["--config", &path.to_string_lossy(), "serve"])
        .current_dir(dir.path())
        .env_remove("RUST_LOG")
        .output()
        .expect("run idemgate serve");
    (out.status.code(), String::from_utf8_lossy(&out.stderr).into_owned())
}

#[test]
fn serve_refuses_to_start_without_routes_or_a_consumer_group_and_names_what_is_missing() {
    let route =
        "[[routes]]\ntopic = \"wallet\"\ntags = \"*\"\nbiz_type = \"wallet.credit\"\nbiz_id = \"keys\"\n";
    let (code, err) = serve(route);
    assert_eq!(code, Some(1), "{err}");
    assert!(err.contains("consumer.group: is not set"), "{err}");
    let (code, err) = serve("[consumer]\ngroup = \"wallet_consumer\"\n");
    assert_eq!(code, Some(1), "{err}");
    assert!(err.contains("no [[routes]] entry is configured"), "{err}");
    // The example's routes are no one's default: `idemgate` itself has no shop handler.
    let shop_route = "[consumer]\ngroup = \"g\"\n[[routes]]\ntopic = \"t\"\ntags = \"*\"\nbiz_type = \"stock.deduct\"\nbiz_id = \"keys\"\n";
    let (code, err) = serve(shop_route);
    assert_eq!(code, Some(1), "{err}");
    assert!(err.contains("no handler named \"stock.deduct\""), "{err}");
}
