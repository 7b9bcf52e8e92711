//! `[database]`: where the claims, the log and the business tables live, and the consumer's
//! pool.

use serde::{Deserialize, Serialize};

use super::{Backend, StoreOptions};
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
}

impl std::fmt::Debug for DatabaseSettings {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DatabaseSettings")
            .field("url", &super::redact_url(&self.url))
            .field("max_connections", &self.max_connections)
            .field("acquire_timeout_ms", &self.acquire_timeout_ms)
            .finish()
    }
}

impl Default for DatabaseSettings {
    fn default() -> Self {
        Self {
            url: "sqlite://idemgate.db?mode=rwc".to_owned(),
            max_connections: 16,
            acquire_timeout_ms: 10_000,
        }
    }
}

impl DatabaseSettings {
    pub fn validate(&self) -> Result<(), Invalid> {
        Backend::from_url(&self.url).map_err(|e| invalid("database.url", e.to_string()))?;
        if self.max_connections == 0 {
            return Err(invalid("database.max_connections", "must be at least 1"));
        }
        if self.acquire_timeout_ms == 0 {
            return Err(invalid("database.acquire_timeout_ms", "must be at least 1"));
        }
        Ok(())
    }

    /// The consumer's pool: the gate, the schedulers and replay.
    pub fn store_options(&self) -> StoreOptions {
        StoreOptions {
            max_connections: self.max_connections,
            acquire_timeout: std::time::Duration::from_millis(self.acquire_timeout_ms),
            statement_timeout: None,
        }
    }
}
