//! `order.create`: an insert guarded by the order's own unique key (the seeds' scheme 1).
//!
//! Its batch form inserts a group's orders in one multi-row statement. On PostgreSQL and
//! SQLite that statement skips the order numbers already taken and returns the ones it
//! inserted, so an order that exists (under another message key, or twice in the group) makes
//! only its own delivery a duplicate at the `business_unique` layer. MySQL/MariaDB have no
//! `ON CONFLICT`, and `INSERT IGNORE` would also swallow a value too long for its column: there
//! the statement is a plain insert, and when the primary key refuses it (InnoDB then takes back
//! that statement alone) the group's orders go in one at a time, each told apart as alone.

use std::collections::HashSet;

use async_trait::async_trait;
use serde::{Deserialize, Serialize};
use sqlx::Row;

use idemgate::handler::{Answers, Effect, Fact, Handler, HandlerError, Work};
use idemgate::insert_if_absent;
use idemgate::outcome::Layer;
use idemgate::store::{
    Backend, Conn, InsertIfAbsent, Pad, Store, bind_rows, filtered_insert, padded_values, query_built,
};

/// The body of an `order.create` message.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct CreateOrder {
    pub order_no: String,
    pub user_id: String,
    pub sku: String,
    pub quantity: i64,
    pub amount_cents: i64,
}

static INSERT_ORDER: InsertIfAbsent = insert_if_absent!(
    "INSERT INTO shop_order (order_no, user_id, sku, quantity, amount_cents, status, created_at_ms) \
     VALUES (?, ?, ?, ?, ?, ?, ?)",
    conflict = "(order_no)",
    index = "PRIMARY"
);

pub(crate) struct OrderCreate;

/// The order a delivery asks for; a body of the wrong shape, a quantity that is not positive or
/// a negative amount makes it invalid.
fn order_of(work: &Work<'_>) -> Result<CreateOrder, HandlerError> {
    let order: CreateOrder = super::parse_body(&work.delivery.body)?;
    if order.quantity <= 0 || order.amount_cents < 0 {
        return Err(HandlerError::Invalid(format!(
            "order {}: quantity must be positive and amount_cents not negative",
            order.order_no
        )));
    }
    Ok(order)
}

/// The effect of an order whose insert did (`true`) or did not go in.
fn created(order: &CreateOrder, inserted: bool) -> Effect {
    if inserted {
        Effect::Applied
    } else {
        Effect::AlreadyApplied {
            layer: Layer::BusinessUnique,
            detail: format!("order {} already exists", order.order_no),
        }
    }
}

/// The columns of a new order, in the order [`bind_order`] binds them.
/// The columns of a new order, in the order [`bind_order`] binds them.
const ORDER_COLUMNS: [&str; 7] =
    ["order_no", "user_id", "sku", "quantity", "amount_cents", "status", "created_at_ms"];

/// Binds a new order's values: it starts `UNPAID`.
fn bind_order(q: idemgate::store::AnyQuery, order: &CreateOrder, now_ms: i64) -> idemgate::store::AnyQuery {
    q.bind(order.order_no.as_str())
        .bind(order.user_id.as_str())
        .bind(order.sku.as_str())
        .bind(order.quantity)
        .bind(order.amount_cents)
        .bind("UNPAID")
        .bind(now_ms)
}

#[async_trait]
impl Handler for OrderCreate {
    async fn handle(&self, work: &Work<'_>, conn: &mut Conn) -> Result<Effect, HandlerError> {
        let order = order_of(work)?;
        let inserted =
            INSERT_ORDER.execute(conn, work.backend, |q| bind_order(q, &order, work.now_ms)).await?;
        Ok(created(&order, inserted))
    }

    /// The group's orders in one multi-row insert (see the module's comment). Of two
    /// deliveries of one order number, the first in the group creates it.
    async fn handle_batch(&self, works: &[Work<'_>], conn: &mut Conn) -> Result<Answers, HandlerError> {
        let Some(first) = works.first() else { return Ok(Vec::new()) };
        let (backend, now_ms) = (first.backend, first.now_ms);
        let orders: Vec<Result<CreateOrder, HandlerError>> = works.iter().map(order_of).collect();
        let valid: Vec<&CreateOrder> = orders.iter().filter_map(|o| o.as_ref().ok()).collect();
        if valid.is_empty() {
            return Ok(orders.into_iter().map(|o| o.map(|_| Effect::Applied)).collect());
        }
        // Padded to a few fixed counts of rows: the last order repeated where a taken order
        // number is skipped, rows a filter drops where it fails the insert.
        let last = valid[valid.len() - 1];
        let bind = |q, o: &&CreateOrder| bind_order(q, o, now_ms);
        let mut inserted: HashSet<String> = HashSet::with_capacity(valid.len());
        match backend {
            Backend::Postgres | Backend::Sqlite => {
                let sql = format!(
                    "INSERT INTO shop_order ({}) VALUES {} ON CONFLICT (order_no) DO NOTHING RETURNING order_no",
                    ORDER_COLUMNS.join(", "),
                    padded_values(ORDER_COLUMNS.len(), valid.len())
                );
                let q = bind_rows(query_built(backend, sql), &valid, &last, Pad::Repeat, bind);
                for row in q.fetch_all(&mut *conn).await? {
                    inserted.insert(row.try_get(0)?);
                }
            }
            Backend::MySql => {
                let sql = filtered_insert("shop_order", &ORDER_COLUMNS, valid.len());
                let q = bind_rows(query_built(backend, sql), &valid, &last, Pad::Filter, bind);
                match q.execute(&mut *conn).await {
                    Ok(_) => inserted.extend(valid.iter().map(|o| o.order_no.clone())),
                    Err(sqlx::Error::Database(db)) if db.is_unique_violation() => {
                        for order in &valid {
                            if INSERT_ORDER.execute(conn, backend, |q| bind_order(q, order, now_ms)).await? {
                                inserted.insert(order.order_no.clone());
                            }
                        }
                    }
                    Err(e) => return Err(e.into()),
                }
            }
        }
        // Each order number inserted is the first delivery's that asked for it.
        Ok(orders
            .into_iter()
            .map(|o| o.map(|order| created(&order, inserted.remove(&order.order_no))))
            .collect())
    }

    async fn prepare(&self, store: &Store) -> Result<(), String> {
        super::prepare(store).await
    }

    async fn describe(&self, store: &Store, biz_id: &str) -> Result<Vec<Fact>, sqlx::Error> {
        super::describe_order(store, false, biz_id).await
    }
}
