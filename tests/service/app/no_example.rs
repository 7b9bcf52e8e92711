//! The service plants nothing of the example shop in a user's database, refuses to start
//! without what names a deployment's business (routes, a consumer group), and a database that
//! ran the service's migrations while they still made the shop's tables keeps working.

use idemgate::store::{Backend, Sql, StoreOptions};
use idemgate_shop as shop;
use idemgate_testkit::scratch::{SERVICE_TABLES, ScratchDb};
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
        idemgate::store::migrations::as_first_run(backend)
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
