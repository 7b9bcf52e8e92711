//! The business side of the gate: the trait a handler implements and the registry that maps
//! handler names to handlers.
//!
//! A handler applies the effect of one delivery through the connection of the gate's open
//! transaction, so the effect and the dedup claim commit or roll back together. It must not
//! commit, roll back or open connections of its own; an effect written anywhere else is not
//! protected by the gate.
//!
//! Under group commit a handler may also take a group's fresh deliveries at once
//! ([`Handler::handle_batch`]), in a few statements instead of several per delivery. The
//! default batch form runs [`Handler::handle`] once per delivery, each in a savepoint of its
//! own ([`handle_each`]), which is also what the gate falls back to when a batch fails.

use std::collections::BTreeMap;
use std::fmt;
use std::sync::Arc;

use async_trait::async_trait;
use sqlx::{AssertSqlSafe, Executor};

use crate::delivery::Delivery;
use crate::outcome::Layer;
use crate::route::{BizKey, Routes};
use crate::store::{Backend, Conn, Store, is_transient};

/// What a handler is given besides the connection.
#[derive(Debug, Clone, Copy)]
pub struct Work<'a> {
    pub delivery: &'a Delivery,
    pub key: &'a BizKey,
    /// The dialect of the connection, for the rare statement that differs per backend.
    pub backend: Backend,
    /// The gate's clock, epoch milliseconds.
    pub now_ms: i64,
}

/// What a handler did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Effect {
    /// The effect was applied in the transaction.
    Applied,
    /// The business data shows the effect was applied before (a state machine that has already
    /// moved on, a business unique key already present). The claim still commits, so later
    /// copies stop at the gate, and the delivery counts as a duplicate at `layer`.
    AlreadyApplied { layer: Layer, detail: String },
}

impl Effect {
    /// What the handler said about an effect found already applied.
    pub fn detail(&self) -> Option<&str> {
        match self {
            Self::Applied => None,
            Self::AlreadyApplied { detail, .. } => Some(detail),
        }
    }
}

/// Why a handler did not apply its effect. Every variant rolls the transaction back, so the key
/// stays unclaimed.
#[derive(Debug, thiserror::Error)]
pub enum HandlerError {
    /// Might work later (a row that has not arrived yet, a downstream outage): the broker is
    /// asked to redeliver.
    #[error("{0}")]
    Retryable(String),
    /// Will never work as sent (a business rule refuses it): logged as dead-lettered with the
    /// message kept, not retried.
    #[error("{0}")]
    Permanent(String),
    /// The business row is in a state the move cannot start from (a SHIPPED order asked to
    /// become PAID): dead-lettered like `Permanent`, but logged and counted at the
    /// `state_machine` layer, so that it is told apart from other refusals and from duplicates.
    #[error("{0}")]
    IllegalTransition(String),
    /// The message does not have the shape this handler needs: logged as invalid.
    #[error("{0}")]
    Invalid(String),
    /// A database error. Transient conflicts are retried by the gate; others are retryable.
    #[error(transparent)]
    Database(#[from] sqlx::Error),
}

/// One line of business state, shown on a key's trace page.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct Fact {
    pub label: String,
    pub value: String,
    /// The state shows something that must never happen, such as an effect applied twice.
    pub alarm: bool,
}

impl Fact {
    pub fn new(label: impl Into<String>, value: impl Into<String>) -> Self {
        Self { label: label.into(), value: value.into(), alarm: false }
    }

    pub fn alarm(label: impl Into<String>, value: impl Into<String>) -> Self {
        Self { label: label.into(), value: value.into(), alarm: true }
    }
}

/// What a handler's batch form answers for each of its deliveries: the effect applied, or why
/// the delivery was refused (in which case nothing was written for it).
pub type Answers = Vec<Result<Effect, HandlerError>>;

/// Applies one kind of business effect.
#[async_trait]
pub trait Handler: Send + Sync + 'static {
    async fn handle(&self, work: &Work<'_>, conn: &mut Conn) -> Result<Effect, HandlerError>;

    /// The batch form, under group commit: the effects of a group's fresh deliveries of this
    /// handler (in [`Handler::lock_order`]), on the gate's connection, in as few statements as
    /// the handler can manage. Answers one result per work, in the same order.
    ///
    /// A delivery answered `Err` must have had nothing written for it: the gate only deletes
    /// its claim. An `Err` of the whole call means a statement failed: the gate rolls the group
    /// back to just after its claims and runs each delivery through [`Handler::handle`] alone,
    /// in a savepoint of its own, so that the culprit is found and the others commit.
    ///
    /// The default is that per-delivery path ([`handle_each`]): a handler without a batch form
    /// behaves exactly as it does alone.
    async fn handle_batch(&self, works: &[Work<'_>], conn: &mut Conn) -> Result<Answers, HandlerError> {
        handle_each(self, works, conn).await
    }

    /// The business state this handler owns for `biz_id`, read through `store` for the trace
    /// page: the order's status, the ledger rows of a deduction. Read-only and bounded. The
    /// default shows nothing.
    async fn describe(&self, _store: &Store, _biz_id: &str) -> Result<Vec<Fact>, sqlx::Error> {
        Ok(Vec::new())
    }

    /// Invariants of this handler's business tables that the reconciler checks on every run
    /// (for example: one ledger row per deduction). The default has none.
    fn checks(&self) -> Vec<crate::reconcile::Check> {
        Vec::new()
    }

    /// Makes what this handler needs in the business database, once, when the service is
    /// assembled and before [`Handler::verify`]: its own tables (by its own migrations) and
    /// the rows it expects to find. It runs at every start, so it must find its work done
    /// already and change nothing then. The default makes nothing: the service never creates a
    /// business table of its own accord.
    async fn prepare(&self, _store: &Store) -> Result<(), String> {
        Ok(())
    }

    /// Checks this handler against the database it will run on, once, when the service is
    /// assembled and before any delivery (a configured statement is prepared, so that a table
    /// or column that does not exist is refused at start). The error says what is wrong and
    /// where. The default checks nothing.
    async fn verify(&self, _store: &Store) -> Result<(), String> {
        Ok(())
    }

    /// The contended row this delivery will lock, if the handler knows it (the SKU of a stock
    /// deduction). Group commit runs a group's handlers in this order, so that two groups in
    /// flight lock shared rows in the same order and never deadlock each other. The default,
    /// `None`, keeps the deliveries' order; handlers that touch no shared row need nothing.
    fn lock_order(&self, _work: &Work<'_>) -> Option<String> {
        None
    }
}

/// The savepoint each delivery of [`handle_each`] runs in. One name serves all: a rollback goes
/// to the latest savepoint of that name, which is the running delivery's.
const SAVEPOINT: &str = "SAVEPOINT idemgate_delivery";
const ROLLBACK_TO_SAVEPOINT: &str = "ROLLBACK TO SAVEPOINT idemgate_delivery";

/// Each of `works` through `handler.handle` in a savepoint of its own: a delivery that fails is
/// rolled back to its savepoint, so that it leaves nothing behind while the others keep their
/// effects. A transient database error (a deadlock, which InnoDB answers by rolling back the
/// whole transaction) ends the call: the gate starts the group again.
pub async fn handle_each<H: Handler + ?Sized>(
    handler: &H,
    works: &[Work<'_>],
    conn: &mut Conn,
) -> Result<Answers, HandlerError> {
    let mut answers = Vec::with_capacity(works.len());
    for work in works {
        (&mut *conn).execute(AssertSqlSafe(SAVEPOINT)).await?;
        match handler.handle(work, conn).await {
            Ok(effect) => answers.push(Ok(effect)),
            Err(HandlerError::Database(e)) if is_transient(&e) => return Err(HandlerError::Database(e)),
            Err(why) => {
                (&mut *conn).execute(AssertSqlSafe(ROLLBACK_TO_SAVEPOINT)).await?;
                answers.push(Err(why));
            }
        }
    }
    Ok(answers)
}

/// Handlers by name. Routes name the handler for their biz_type.
#[derive(Clone, Default)]
pub struct Handlers {
    by_name: BTreeMap<String, Arc<dyn Handler>>,
}

impl fmt::Debug for Handlers {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_set().entries(self.by_name.keys()).finish()
    }
}

impl Handlers {
    pub fn new() -> Self {
        Self::default()
    }

    pub fn with(mut self, name: impl Into<String>, handler: impl Handler) -> Self {
        self.insert(name, handler);
        self
    }

    pub fn insert(&mut self, name: impl Into<String>, handler: impl Handler) {
        self.by_name.insert(name.into(), Arc::new(handler));
    }

    /// Adds every handler of `other`; a name in both takes `other`'s.
    pub fn extend(&mut self, other: Handlers) {
        self.by_name.extend(other.by_name);
    }

    pub fn get(&self, name: &str) -> Option<&Arc<dyn Handler>> {
        self.by_name.get(name)
    }

    pub fn names(&self) -> impl Iterator<Item = &str> {
        self.by_name.keys().map(String::as_str)
    }

    /// The invariant checks of every handler, each once. A check that names no biz_type (a
    /// configured one) reports under the first biz_type whose route names its handler, or,
    /// when no route names it, under the handler's own name (as a route without `handler`
    /// names the handler of its biz_type).
    pub fn checks(&self, routes: &Routes) -> Vec<crate::reconcile::Check> {
        let mut first_biz_type: BTreeMap<&str, &str> = BTreeMap::new();
        for (biz_type, name) in routes.handler_by_biz_type() {
            first_biz_type.entry(name).or_insert(biz_type);
        }
        for name in self.by_name.keys() {
            first_biz_type.entry(name).or_insert(name);
        }
        first_biz_type
            .into_iter()
            .filter_map(|(name, biz_type)| Some((self.get(name)?, biz_type)))
            .flat_map(|(h, biz_type)| {
                h.checks().into_iter().map(move |mut c| {
                    if c.biz_type.is_empty() {
                        c.biz_type = biz_type.to_owned().into();
                    }
                    c
                })
            })
            .collect()
    }

    /// [`Handler::prepare`] of every handler on `store`; the first failure, with the handler's
    /// name.
    pub async fn prepare(&self, store: &Store) -> Result<(), String> {
        for (name, handler) in &self.by_name {
            handler.prepare(store).await.map_err(|why| format!("handler {name:?}: {why}"))?;
        }
        Ok(())
    }

    /// [`Handler::verify`] of every handler against `store`; the first refusal, with the
    /// handler's name.
    pub async fn verify(&self, store: &Store) -> Result<(), String> {
        for (name, handler) in &self.by_name {
            handler.verify(store).await.map_err(|why| format!("handler {name:?}: {why}"))?;
        }
        Ok(())
    }

    /// The handler of each biz_type, for showing business state by biz_type: the handler its
    /// route names, else the handler of its name (a key logged before its route was removed,
    /// a command run without the service's routes).
    pub fn by_biz_type(&self, routes: &Routes) -> BTreeMap<String, Arc<dyn Handler>> {
        let mut by_biz_type: BTreeMap<String, Arc<dyn Handler>> =
            self.by_name.iter().map(|(name, h)| (name.clone(), h.clone())).collect();
        for (biz_type, name) in routes.handler_by_biz_type() {
            match self.get(name) {
                Some(h) => by_biz_type.insert(biz_type.to_owned(), h.clone()),
                None => by_biz_type.remove(biz_type),
            };
        }
        by_biz_type
    }
}

/// Handlers that apply nothing, under `names`: what a program brings besides the configured
/// handlers, for the tests of the checks that see both.
#[cfg(test)]
pub(crate) fn doing_nothing(names: &[&str]) -> Handlers {
    struct Nothing;
    #[async_trait]
    impl Handler for Nothing {
        async fn handle(&self, _: &Work<'_>, _: &mut Conn) -> Result<Effect, HandlerError> {
            Ok(Effect::Applied)
        }
    }
    names.iter().fold(Handlers::new(), |handlers, name| handlers.with(*name, Nothing))
}
