//! `order.create`: an insert guarded by the order's own unique key (the seeds' scheme 1).

use async_trait::async_trait;
use serde::{Deserialize, Serialize};

use crate::handler::{Effect, Fact, Handler, HandlerError, Work};
use crate::insert_if_absent;
use crate::outcome::Layer;
use crate::store::{Conn, InsertIfAbsent, Store};

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
     VALUES (?, ?, ?, ?, ?, 'UNPAID', ?)",
    conflict = "(order_no)",
    index = "PRIMARY"
);

pub(crate) struct OrderCreate;

#[async_trait]
impl Handler for OrderCreate {
    async fn handle(&self, work: &Work<'_>, conn: &mut Conn) -> Result<Effect, HandlerError> {
        let order: CreateOrder = super::parse_body(&work.delivery.body)?;
        if order.quantity <= 0 || order.amount_cents < 0 {
            return Err(HandlerError::Invalid(format!(
                "order {}: quantity must be positive and amount_cents not negative",
                order.order_no
            )));
        }
        let inserted = INSERT_ORDER
            .execute(conn, work.backend, |q| {
                q.bind(order.order_no.as_str())
                    .bind(order.user_id.as_str())
                    .bind(order.sku.as_str())
                    .bind(order.quantity)
                    .bind(order.amount_cents)
                    .bind(work.now_ms)
            })
            .await?;
        Ok(if inserted {
            Effect::Applied
        } else {
            Effect::AlreadyApplied {
                layer: Layer::BusinessUnique,
                detail: format!("order {} already exists", order.order_no),
            }
        })
    }

    async fn describe(&self, store: &Store, biz_id: &str) -> Result<Vec<Fact>, sqlx::Error> {
        super::describe_order(store, false, biz_id).await
    }
}
