//! `payment.confirm`: a state-machine move, UNPAID to PAID, as a conditional update
//! ([`idemgate::state_machine`]).
//!
//! Zero affected rows means one of four things, told apart by reading the order afterwards:
//! the move was made before (a duplicate at the state-machine layer), the order has not arrived
//! yet (retry), the amount does not match (dead-lettered), or the order is in a state that
//! cannot become PAID (an illegal transition). When the order's own transaction committed
//! between the update and the read, the update is run once more.

use std::sync::LazyLock;

use async_trait::async_trait;
use serde::{Deserialize, Serialize};

use idemgate::handler::{Answers, Effect, Fact, Handler, HandlerError, Work};
use idemgate::state_machine::{Answer, Compare, Move, OnMissing, StateMachine, Transition, TransitionSpec};
use idemgate::store::{Conn, Store};

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

/// The payment a delivery confirms, as the move it makes: UNPAID to PAID with its payment
/// number and the gate's clock, guarded by its amount.
fn payment_of(work: &Work<'_>) -> Result<(ConfirmPayment, Move), HandlerError> {
    let pay: ConfirmPayment = super::parse_body(&work.delivery.body)?;
    let paid =
        Move::of(pay.order_no.as_str()).set(pay.payment_no.as_str()).set(work.now_ms).guard(pay.amount_cents);
    Ok((pay, paid))
}

/// What the payment's move answered, worded for the order and the payment.
fn paid(pay: &ConfirmPayment, answer: Answer) -> Result<Effect, HandlerError> {
    let order = format!("order {}", pay.order_no);
    match answer {
        Answer::AlreadyDone { state, found } => Ok(Effect::AlreadyApplied {
            layer: idemgate::outcome::Layer::StateMachine,
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

#[async_trait]
impl Handler for PaymentConfirm {
    async fn handle(&self, work: &Work<'_>, conn: &mut Conn) -> Result<Effect, HandlerError> {
        let (pay, m) = payment_of(work)?;
        let answer = MARK_PAID.apply(conn, work.backend, &m).await?;
        paid(&pay, answer)
    }

    /// The group's payments as one conditional update where the backend returns the rows it
    /// changed ([`Transition::apply_many`]).
    async fn handle_batch(&self, works: &[Work<'_>], conn: &mut Conn) -> Result<Answers, HandlerError> {
        let Some(first) = works.first() else { return Ok(Vec::new()) };
        let payments: Vec<_> = works.iter().map(payment_of).collect();
        let moves: Vec<Move> =
            payments.iter().filter_map(|p| p.as_ref().ok()).map(|(_, m)| m.clone()).collect();
        let mut answers = MARK_PAID.apply_many(conn, first.backend, &moves).await?.into_iter();
        Ok(payments
            .into_iter()
            .map(|p| {
                let (pay, _) = p?;
                let answer = answers.next().unwrap_or(Answer::Contended { state: "unknown".to_owned() });
                paid(&pay, answer)
            })
            .collect())
    }

    async fn prepare(&self, store: &Store) -> Result<(), String> {
        super::prepare(store).await
    }

    async fn describe(&self, store: &Store, biz_id: &str) -> Result<Vec<Fact>, sqlx::Error> {
        super::describe_order(store, true, biz_id).await
    }
}
