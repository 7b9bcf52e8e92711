//! The built-in example business: the seeds' e-commerce scenario of orders, payments and stock,
//! one handler per idempotency scheme.
//!
//! - `order.create` inserts an order whose `order_no` is a business unique key (scheme 1);
//! - `payment.confirm` moves an order from UNPAID to PAID with a conditional update (the state
//!   machine scheme), telling an already-made move from an illegal one;
//! - `stock.deduct` decrements stock: not idempotent at all, made safe only by the gate, and
//!   it writes a ledger row per applied deduction so a double application is visible.
//!
//! The demo, the benchmarks and the tests use these; so does `idemgate-shop`, the service with
//! the shop's handlers, as a program that embeds idemgate builds it. `idemgate serve` knows none
//! of it: the shop's tables are its own migrations' (`migrations/` of this crate), made by its
//! handlers' [`prepare`].
//!
//! Beside the business: [`traffic`], the example traffic and the books of what was sent;
//! [`demo`], the stand-in broker `idemgate demo` feeds it through; [`produce`], the same traffic
//! sent to a real topic (`idemgate produce`). The command line (`idemgate-cli`) only parses
//! their flags.

pub mod demo;
mod order;
mod payment;
pub mod produce;
mod stock;
pub mod traffic;

use std::sync::LazyLock;

use serde::de::DeserializeOwned;
use sqlx::migrate::Migrator;

pub use order::CreateOrder;
pub(crate) use order::OrderCreate;
pub use payment::ConfirmPayment;
pub(crate) use payment::PaymentConfirm;
pub use stock::{DeductStock, STOCK_LEDGER_CHECK, seed_stock};
pub use stock::{StockDeduct, ensure_stock};

use idemgate::delivery::Delivery;
use idemgate::handler::{HandlerError, Handlers};
use idemgate::route::RouteConfig;
use idemgate::store::{Backend, Store};

pub const ORDER_CREATE: &str = "order.create";
pub const PAYMENT_CONFIRM: &str = "payment.confirm";
/// The SKUs the shop sells (and the example traffic deducts from).
pub(crate) const SKUS: [&str; 5] = ["SKU-1", "SKU-2", "SKU-3", "SKU-4", "SKU-5"];

pub const STOCK_DEDUCT: &str = "stock.deduct";

/// The topic the example traffic uses, with one tag per business event.
pub const TOPIC: &str = "idemgate_shop";
pub const TAG_ORDER_CREATE: &str = "order_create";
pub const TAG_PAYMENT_CONFIRM: &str = "payment_confirm";
pub const TAG_STOCK_DEDUCT: &str = "stock_deduct";

/// The three handlers, under their biz_type names.
pub fn handlers() -> Handlers {
    Handlers::new()
        .with(ORDER_CREATE, OrderCreate)
        .with(PAYMENT_CONFIRM, PaymentConfirm)
        .with(STOCK_DEDUCT, StockDeduct)
}

/// The consumer group the example shop consumes under, unless one is configured.
pub const CONSUMER_GROUP: &str = "idemgate_shop_consumer";

/// `settings` made to consume the example traffic on `topic` where they name no business of
/// their own: the shop's routes unless routes are configured, its consumer group unless one
/// is set.
pub fn configure(settings: &mut idemgate::config::Settings, topic: &str) {
    if settings.routes.is_empty() {
        settings.routes = routes(topic);
    }
    if settings.consumer.group.is_empty() {
        settings.consumer.group = CONSUMER_GROUP.to_owned();
    }
}

/// The default settings, made to consume the example traffic on [`TOPIC`] ([`configure`]).
pub fn settings() -> idemgate::config::Settings {
    let mut settings = idemgate::config::Settings::default();
    configure(&mut settings, TOPIC);
    settings
}

/// Routes for the example traffic on `topic`: the bizId is the message's first KEY.
pub fn routes(topic: &str) -> Vec<RouteConfig> {
    [
        (TAG_ORDER_CREATE, ORDER_CREATE),
        (TAG_PAYMENT_CONFIRM, PAYMENT_CONFIRM),
        (TAG_STOCK_DEDUCT, STOCK_DEDUCT),
    ]
    .into_iter()
    .map(|(tag, biz_type)| RouteConfig {
        topic: topic.to_owned(),
        tags: tag.to_owned(),
        biz_type: biz_type.to_owned(),
        biz_id: "keys".to_owned(),
        execute_time: None,
        handler: None,
    })
    .collect()
}

/// An `order.create` message for `order` on `topic`: its order number is the KEY.
pub fn order_message(topic: &str, order: &CreateOrder) -> Delivery {
    example_message(topic, TAG_ORDER_CREATE, &order.order_no, serde_json::to_vec(order))
}

/// A `stock.deduct` message for `deduction` on `topic`: `deduction_id`, the deduction's own
/// number, is the KEY.
pub fn deduction_message(topic: &str, deduction_id: &str, deduction: &DeductStock) -> Delivery {
    example_message(topic, TAG_STOCK_DEDUCT, deduction_id, serde_json::to_vec(deduction))
}

/// A `payment.confirm` message for `payment` on `topic`: its payment number is the KEY.
pub fn payment_message(topic: &str, payment: &ConfirmPayment) -> Delivery {
    example_message(topic, TAG_PAYMENT_CONFIRM, &payment.payment_no, serde_json::to_vec(payment))
}

fn example_message(topic: &str, tag: &str, key: &str, body: serde_json::Result<Vec<u8>>) -> Delivery {
    Delivery {
        topic: topic.to_owned(),
        tags: tag.to_owned(),
        keys: vec![key.to_owned()],
        body: body.expect("the example bodies always serialize"),
        ..Default::default()
    }
}

/// The stock every example SKU starts with when the shop's handlers first meet a database.
pub const INITIAL_STOCK: i64 = 1_000_000_000_000;

/// Where the shop's migrations record themselves: a table of their own, beside the service's.
const MIGRATIONS_TABLE: &str = "_idemgate_shop_migrations";

static POSTGRES_MIGRATIONS: LazyLock<Migrator> =
    LazyLock::new(|| own_table(sqlx::migrate!("migrations/postgres")));
static MYSQL_MIGRATIONS: LazyLock<Migrator> = LazyLock::new(|| own_table(sqlx::migrate!("migrations/mysql")));
static SQLITE_MIGRATIONS: LazyLock<Migrator> =
    LazyLock::new(|| own_table(sqlx::migrate!("migrations/sqlite")));

fn own_table(mut migrator: Migrator) -> Migrator {
    migrator.dangerous_set_table_name(MIGRATIONS_TABLE);
    migrator
}

/// Creates the shop's tables (this crate's `migrations/<backend>/`, recorded in
/// `_idemgate_shop_migrations`), on a database the service's migrations have run on.
pub async fn migrate(store: &Store) -> Result<(), sqlx::migrate::MigrateError> {
    let migrator = match store.backend() {
        Backend::Postgres => &*POSTGRES_MIGRATIONS,
        Backend::MySql => &*MYSQL_MIGRATIONS,
        Backend::Sqlite => &*SQLITE_MIGRATIONS,
    };
    migrator.run(store.pool()).await
}

/// What the shop's handlers need before they consume: its tables, and the stock rows of the
/// example SKUs that are missing, so that `stock.deduct` traffic from `idemgate produce` finds
/// its SKUs. Each of the three handlers runs it when the service is assembled
/// ([`Handler::prepare`](idemgate::handler::Handler::prepare)); the second and third find it done.
pub async fn prepare(store: &Store) -> Result<(), String> {
    migrate(store).await.map_err(|e| format!("creating the example shop's tables: {e}"))?;
    for sku in SKUS {
        ensure_stock(store, sku, INITIAL_STOCK)
            .await
            .map_err(|e| format!("creating the example shop's stock of {sku}: {e}"))?;
    }
    Ok(())
}

static ORDER_BY_NO: idemgate::store::Sql = idemgate::store::Sql::new(
    "SELECT order_no, user_id, sku, quantity, amount_cents, status, created_at_ms, payment_no, paid_at_ms \
     FROM shop_order WHERE order_no = ?",
);
static ORDER_BY_PAYMENT: idemgate::store::Sql = idemgate::store::Sql::new(
    "SELECT order_no, user_id, sku, quantity, amount_cents, status, created_at_ms, payment_no, paid_at_ms \
     FROM shop_order WHERE payment_no = ? LIMIT 2",
);

/// The order (found by its number, or by the payment that paid it) as trace-page facts.
async fn describe_order(
    store: &idemgate::store::Store,
    by_payment: bool,
    id: &str,
) -> Result<Vec<idemgate::handler::Fact>, sqlx::Error> {
    use idemgate::clock::format_ms;
    use idemgate::handler::Fact;
    use sqlx::Row;
    let sql = if by_payment { &ORDER_BY_PAYMENT } else { &ORDER_BY_NO };
    let rows = store.query(sql).bind(id).fetch_all(store.pool()).await?;
    let Some(r) = rows.first() else {
        let what = if by_payment { "no order is paid by this payment" } else { "no such order" };
        return Ok(vec![Fact::new("shop_order", what)]);
    };
    let mut facts = vec![
        Fact::new("order", r.try_get::<String, _>(0)?),
        Fact::new("status", r.try_get::<String, _>(5)?),
        Fact::new(
            "item",
            format!(
                "{} × {} for {} cents, user {}",
                r.try_get::<i64, _>(3)?,
                r.try_get::<String, _>(2)?,
                r.try_get::<i64, _>(4)?,
                r.try_get::<String, _>(1)?
            ),
        ),
        Fact::new("created", format_ms(r.try_get(6)?)),
    ];
    if let Some(payment_no) = r.try_get::<Option<String>, _>(7)? {
        facts.push(Fact::new("paid by", payment_no));
    }
    if let Some(paid_at) = r.try_get::<Option<i64>, _>(8)? {
        facts.push(Fact::new("paid", format_ms(paid_at)));
    }
    if rows.len() > 1 {
        facts.push(Fact::alarm("payment", "one payment number marks more than one order paid"));
    }
    Ok(facts)
}

/// Parses a handler's JSON body; a body of the wrong shape makes the delivery invalid.
fn parse_body<T: DeserializeOwned>(body: &[u8]) -> Result<T, HandlerError> {
    serde_json::from_slice(body).map_err(|e| HandlerError::Invalid(format!("body: {e}")))
}
