//! `payment.confirm`: a state-machine move, UNPAID to PAID, as a conditional update.
//!
//! Zero affected rows means one of four things, told apart by reading the order afterwards:
//! the move was made before (a duplicate at the state-machine layer), the order has not arrived
//! yet (retry), the order is in a state that cannot become PAID (an illegal transition), or
//! the order's own transaction committed between the update and the read (the update is run
//! once more).

use async_trait::async_trait;
use serde::{Deserialize, Serialize};
use sqlx::Row;

use crate::gate::Layer;
use crate::handler::{Effect, Fact, Handler, HandlerError, Work};
use crate::store::{Conn, Sql, Store, query};

/// The body of a `payment.confirm` message.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ConfirmPayment {
    pub order_no: String,
    pub payment_no: String,
    pub amount_cents: i64,
}

static MARK_PAID: Sql = Sql::new(
    "UPDATE shop_order SET status = 'PAID', payment_no = ?, paid_at_ms = ? \
     WHERE order_no = ? AND status = 'UNPAID' AND amount_cents = ?",
);
static READ_ORDER: Sql =
    Sql::new("SELECT status, amount_cents, payment_no FROM shop_order WHERE order_no = ?");

pub struct PaymentConfirm;

/// The conditional move; true when it applied.
async fn mark_paid(work: &Work<'_>, conn: &mut Conn, pay: &ConfirmPayment) -> Result<bool, sqlx::Error> {
    let moved = query(work.backend, &MARK_PAID)
        .bind(pay.payment_no.as_str())
        .bind(work.now_ms)
        .bind(pay.order_no.as_str())
        .bind(pay.amount_cents)
        .execute(&mut *conn)
        .await?;
    Ok(moved.rows_affected() == 1)
}

#[async_trait]
impl Handler for PaymentConfirm {
    async fn handle(&self, work: &Work<'_>, conn: &mut Conn) -> Result<Effect, HandlerError> {
        let pay: ConfirmPayment = super::parse_body(&work.delivery.body)?;
        if mark_paid(work, conn, &pay).await? {
            return Ok(Effect::Applied);
        }
        let row =
            query(work.backend, &READ_ORDER).bind(pay.order_no.as_str()).fetch_optional(&mut *conn).await?;
        let Some(row) = row else {
            return Err(HandlerError::Retryable(format!(
                "order {} does not exist yet; its order.create may still be on the way",
                pay.order_no
            )));
        };
        let status: String = row.try_get(0)?;
        let amount: i64 = row.try_get(1)?;
        let paid_by: Option<String> = row.try_get(2)?;
        match status.as_str() {
            "PAID" => Ok(Effect::AlreadyApplied {
                layer: Layer::StateMachine,
                detail: format!(
                    "order {} is already PAID by payment {}",
                    pay.order_no,
                    paid_by.as_deref().unwrap_or("?")
                ),
            }),
            // The order committed between the update and this read: the update applies now.
            "UNPAID" if amount == pay.amount_cents => {
                if mark_paid(work, conn, &pay).await? {
                    Ok(Effect::Applied)
                } else {
                    Err(HandlerError::Retryable(format!("order {} is changing; retrying", pay.order_no)))
                }
            }
            "UNPAID" => Err(HandlerError::Permanent(format!(
                "payment {} of {} cents does not match order {} of {amount} cents",
                pay.payment_no, pay.amount_cents, pay.order_no
            ))),
            other => Err(HandlerError::Permanent(format!(
                "illegal transition: order {} is {other} and cannot become PAID",
                pay.order_no
            ))),
        }
    }

    async fn describe(&self, store: &Store, biz_id: &str) -> Result<Vec<Fact>, sqlx::Error> {
        super::describe_order(store, true, biz_id).await
    }
}
