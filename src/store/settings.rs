//! `[database]`: where the claims, the log and the business tables live, and the consumer's
//! pool: its size, and the bounds on the gate's waits (a lock, a statement).

use std::time::Duration;

use serde::{Deserialize, Serialize};

use super::{DatabaseUrl, StoreOptions};
use crate::setting::{Invalid, invalid};

/// `Debug` prints the URL with its password masked ([`crate::store::redact_url`]).
#[derive(Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DatabaseSettings {
    /// `IDEMGATE_DATABASE__URL`: `sqlite://FILE?mode=rwc`, `postgres://…` or `mysql://…`
    /// (MariaDB too).
    pub url: String,
    /// `IDEMGATE_DATABASE__MAX_CONNECTIONS`: pool size; at least the number of deliveries
    /// processed at once.
    pub max_connections: u32,
    /// `IDEMGATE_DATABASE__ACQUIRE_TIMEOUT_MS`: how long a delivery waits for a connection
    /// before it fails (and is retried by the broker).
    pub acquire_timeout_ms: u64,
    /// `IDEMGATE_DATABASE__LOCK_TIMEOUT_MS`: the longest a statement of the gate waits for a
    /// lock (a claim behind another instance's uncommitted claim of the same key, a handler's
    /// statement behind a row lock) before it fails and the delivery is retried: PostgreSQL
    /// `lock_timeout`, MySQL/MariaDB `innodb_lock_wait_timeout` (whole seconds, rounded up),
    /// SQLite `busy_timeout`. 1 to [`MAX_STATEMENT_TIMEOUT_MS`], at most `statement_timeout_ms`.
    pub lock_timeout_ms: u64,
    /// `IDEMGATE_DATABASE__STATEMENT_TIMEOUT_MS`: the longest one statement of the gate may run
    /// on the server (PostgreSQL `statement_timeout`, MariaDB `max_statement_time`; SQLite has
    /// none), 1 to [`MAX_STATEMENT_TIMEOUT_MS`].
    pub statement_timeout_ms: u64,
}

/// The longest `lock_timeout_ms` and `statement_timeout_ms`: one wait may not take a whole
/// delivery's time (`consumer.delivery_timeout_ms`, at most 25 s).
pub(crate) const MAX_STATEMENT_TIMEOUT_MS: u64 = 20_000;

impl std::fmt::Debug for DatabaseSettings {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DatabaseSettings")
            .field("url", &super::redact_url(&self.url))
            .field("max_connections", &self.max_connections)
            .field("acquire_timeout_ms", &self.acquire_timeout_ms)
            .field("lock_timeout_ms", &self.lock_timeout_ms)
            .field("statement_timeout_ms", &self.statement_timeout_ms)
            .finish()
    }
}

impl Default for DatabaseSettings {
    fn default() -> Self {
        Self {
            url: "sqlite://idemgate.db?mode=rwc".to_owned(),
            max_connections: 16,
            acquire_timeout_ms: 10_000,
            lock_timeout_ms: 2_000,
            statement_timeout_ms: 3_000,
        }
    }
}

impl DatabaseSettings {
    pub fn validate(&self) -> Result<(), Invalid> {
        DatabaseUrl::read(&self.url).map_err(|e| invalid("database.url", e.to_string()))?;
        if self.max_connections == 0 {
            return Err(invalid("database.max_connections", "must be at least 1"));
        }
        if self.acquire_timeout_ms == 0 {
            return Err(invalid("database.acquire_timeout_ms", "must be at least 1"));
        }
        for (key, ms) in [
            ("database.lock_timeout_ms", self.lock_timeout_ms),
            ("database.statement_timeout_ms", self.statement_timeout_ms),
        ] {
            if !(1..=MAX_STATEMENT_TIMEOUT_MS).contains(&ms) {
                return Err(invalid(key, format!("is {ms}; use 1 to {MAX_STATEMENT_TIMEOUT_MS}")));
            }
        }
        // A lock wait counts towards the statement's time on PostgreSQL: a longer lock timeout
        // would never fire, and the delivery would fail on the statement timeout instead of
        // being retried.
        let lock = self.lock_timeout();
        if lock > self.statement_timeout() {
            return Err(invalid(
                "database.lock_timeout_ms",
                format!(
                    "is {} ms on this backend, above database.statement_timeout_ms ({})",
                    lock.as_millis(),
                    self.statement_timeout_ms
                ),
            ));
        }
        Ok(())
    }

    /// The pool of idemgate's own work (migrations, the schedules, replay, the commands): no
    /// bound on its statements, which a long archive batch or reconcile read may need.
    pub fn store_options(&self) -> StoreOptions {
        StoreOptions {
            max_connections: self.max_connections,
            acquire_timeout: self.acquire_timeout(),
            statement_timeout: None,
            lock_timeout: None,
            idle_in_transaction_timeout: None,
        }
    }

    /// The gate's pool: every connection's lock waits and statements bounded on the server.
    pub(crate) fn gate_store_options(&self) -> StoreOptions {
        StoreOptions {
            statement_timeout: Some(self.statement_timeout()),
            lock_timeout: Some(Duration::from_millis(self.lock_timeout_ms)),
            ..self.store_options()
        }
    }

    pub(crate) fn acquire_timeout(&self) -> Duration {
        Duration::from_millis(self.acquire_timeout_ms)
    }

    /// The lock wait the backend allows for `lock_timeout_ms` (on MySQL/MariaDB whole seconds,
    /// rounded up). The URL's scheme is taken as valid: `validate` checks it first.
    pub(crate) fn lock_timeout(&self) -> Duration {
        let limit = Duration::from_millis(self.lock_timeout_ms);
        match DatabaseUrl::read(&self.url) {
            Ok(url) => super::effective_lock_timeout(url.backend, limit),
            Err(_) => limit,
        }
    }

    pub fn statement_timeout(&self) -> Duration {
        Duration::from_millis(self.statement_timeout_ms)
    }
}
