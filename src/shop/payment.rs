//! `payment.confirm`: a state-machine move, UNPAID to PAID, as a conditional update
//! ([`crate::state_machine`]).
//!
//! Zero affected rows means one of four things, told apart by reading the order afterwards:
//! the move was made before (a duplicate at the state-machine layer), the order has not arrived
//! yet (retry), the amount does not match (dead-lettered), or the order is in a state that
//! cannot become PAID (an illegal transition). When the order's own transaction committed
//! between the update and the read, the update is run once more.

use std::sync::LazyLock;

use async_trait::async_trait;
use serde::{Deserialize, Serialize};

use crate::handler::{Effect, Fact, Handler, HandlerError, Work};
use crate::state_machine::{Answer, Compare, Move, OnMissing, StateMachine, Transition, TransitionSpec};
use crate::store::{Conn, Store};

/// The body of a `payment.confirm` message.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ConfirmPayment {
    pub order_no: String,
    pub payment_no: String,
    pub amount_cents: i64,
}

/// UNPAID to PAID, setting the payment number and time, if the amount matches.
static MARK_PAID: LazyLock<Transition> = LazyLock::new(|| {
    StateMachine::new("shop_order", "order_no", "status")
        .and_then(|orders| {
            orders.transition(
                TransitionSpec::new(["UNPAID"], "PAID")
                    .set("payment_no")
                    .set("paid_at_ms")
                    .guard("amount_cents", Compare::Eq),
            )
        })
        .expect("the order table's names are plain identifiers")
});

pub(crate) struct PaymentConfirm;

#[async_trait]
impl Handler for PaymentConfirm {
    async fn handle(&self, work: &Work<'_>, conn: &mut Conn) -> Result<Effect, HandlerError> {
        let pay: ConfirmPayment = super::parse_body(&work.delivery.body)?;
        let paid = Move::of(pay.order_no.as_str())
            .set(pay.payment_no.as_str())
            .set(work.now_ms)
            .guard(pay.amount_cents);
        let order = format!("order {}", pay.order_no);
        match MARK_PAID.apply(conn, work.backend, &paid).await? {
            Answer::AlreadyDone { state, found } => Ok(Effect::AlreadyApplied {
                layer: crate::outcome::Layer::StateMachine,
                detail: format!(
                    "{order} is already {state} by payment {}",
                    found.set.first().cloned().flatten().map_or("?".to_owned(), |p| p.to_string())
                ),
            }),
            Answer::Missing => Err(HandlerError::Retryable(format!(
                "{order} does not exist yet; its order.create may still be on the way"
            ))),
            Answer::GuardFailed { found, .. } => Err(HandlerError::Permanent(format!(
                "payment {} of {} cents does not match {order} of {} cents",
                pay.payment_no,
                pay.amount_cents,
                found.guards.first().cloned().flatten().map_or("?".to_owned(), |a| a.to_string())
            ))),
            answer => MARK_PAID.result(answer, &order, OnMissing::Retry),
        }
    }

    async fn describe(&self, store: &Store, biz_id: &str) -> Result<Vec<Fact>, sqlx::Error> {
        super::describe_order(store, true, biz_id).await
    }
}
