//! The business side of the gate: the trait a handler implements and the registry that maps
//! handler names to handlers.
//!
//! A handler applies the effect of one delivery through the connection of the gate's open
//! transaction, so the effect and the dedup claim commit or roll back together. It must not
//! commit, roll back or open connections of its own; an effect written anywhere else is not
//! protected by the gate.

use std::collections::BTreeMap;
use std::fmt;
use std::sync::Arc;

use async_trait::async_trait;

use crate::delivery::Delivery;
use crate::gate::Layer;
use crate::route::BizKey;
use crate::store::{Backend, Conn};

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
    /// The message does not have the shape this handler needs: logged as invalid.
    #[error("{0}")]
    Invalid(String),
    /// A database error. Transient conflicts are retried by the gate; others are retryable.
    #[error(transparent)]
    Database(#[from] sqlx::Error),
}

/// Applies one kind of business effect.
#[async_trait]
pub trait Handler: Send + Sync + 'static {
    async fn handle(&self, work: &Work<'_>, conn: &mut Conn) -> Result<Effect, HandlerError>;
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
}
