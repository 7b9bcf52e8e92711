//! `[rabbitmq]`: where the broker is, which queue the group consumes, how much it holds
//! unacknowledged, how long a retry waits, and whether idemgate declares what it consumes.
//! The URL's password is never shown: [`RabbitMqSettings::describe`] and
//! [`RabbitMqSettings::redacted`] mask it.

use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::route::{MAX_ID_CHARS, check_key_text};
use crate::setting::{Invalid, invalid};
use crate::store::redact_url;

/// `[rabbitmq]`. `Debug` prints the URL with its password masked.
#[derive(Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct RabbitMqSettings {
    /// `IDEMGATE_RABBITMQ__URL`: the AMQP 0-9-1 URL, `amqp://user:password@host:port/vhost`
    /// (the default vhost `/` is written `%2f`). The password is masked wherever it is shown.
    pub url: String,
    /// `IDEMGATE_RABBITMQ__QUEUE`: the queue the consumer group reads; empty: the group's
    /// name. Every instance of the group consumes it, so RabbitMQ shares its messages among
    /// them. Its delay queue is `<queue>.retry` and its dead letters go to `<queue>.dead`.
    pub queue: String,
    /// `IDEMGATE_RABBITMQ__PREFETCH`: messages delivered and not yet acknowledged, per
    /// instance, at most (AMQP `basic.qos`): what the consumer holds, and so what a crash
    /// hands back to the queue. Deliveries in the gate at once are bounded by
    /// `broker.consume_threads` besides.
    pub prefetch: u16,
    /// `IDEMGATE_RABBITMQ__RETRY_DELAY_MS`: how long a delivery the gate asked to retry waits
    /// in the delay queue (its message TTL) before it returns to the queue.
    pub retry_delay_ms: u32,
    /// `IDEMGATE_RABBITMQ__DECLARE_EXCHANGES`: declare each route's topic as a durable `topic`
    /// exchange at start (a no-op when it exists as one). Off: the exchanges must exist; the
    /// queues and bindings idemgate owns are declared either way.
    pub declare_exchanges: bool,
    /// `IDEMGATE_RABBITMQ__CONNECT_TIMEOUT_MS`: the longest a connection, and each declaration
    /// or publish, may take.
    pub connect_timeout_ms: u32,
}

impl Default for RabbitMqSettings {
    fn default() -> Self {
        Self {
            url: "amqp://guest:guest@127.0.0.1:5672/%2f".to_owned(),
            queue: String::new(),
            prefetch: 64,
            retry_delay_ms: 5_000,
            declare_exchanges: true,
            connect_timeout_ms: 10_000,
        }
    }
}

impl std::fmt::Debug for RabbitMqSettings {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RabbitMqSettings")
            .field("url", &redact_url(&self.url))
            .field("queue", &self.queue)
            .field("prefetch", &self.prefetch)
            .field("retry_delay_ms", &self.retry_delay_ms)
            .field("declare_exchanges", &self.declare_exchanges)
            .field("connect_timeout_ms", &self.connect_timeout_ms)
            .finish()
    }
}

/// AMQP's limit on a queue or exchange name, in bytes.
const MAX_NAME_BYTES: usize = 255;
/// The longest suffix idemgate adds to the queue's name (`.retry`, `.dead`).
const SUFFIX_BYTES: usize = 6;

impl RabbitMqSettings {
    pub fn validate(&self) -> Result<(), Invalid> {
        let url =
            url::Url::parse(&self.url).map_err(|e| invalid("rabbitmq.url", format!("is not a URL ({e})")))?;
        if !matches!(url.scheme(), "amqp" | "amqps") {
            return Err(invalid("rabbitmq.url", "must start with amqp:// or amqps://"));
        }
        if url.scheme() == "amqps" {
            return Err(invalid(
                "rabbitmq.url",
                "amqps:// (TLS) is not built in; reach the broker over amqp:// through a TLS proxy",
            ));
        }
        if !self.queue.is_empty() {
            check_key_text(&self.queue, MAX_ID_CHARS).map_err(|m| invalid("rabbitmq.queue", m))?;
            if self.queue.len() + SUFFIX_BYTES > MAX_NAME_BYTES || self.queue.starts_with("amq.") {
                return Err(invalid(
                    "rabbitmq.queue",
                    "must be at most 249 bytes and must not start with \"amq.\" (reserved by RabbitMQ)",
                ));
            }
        }
        if self.prefetch == 0 {
            return Err(invalid("rabbitmq.prefetch", "must be between 1 and 65535"));
        }
        if !(100..=3_600_000).contains(&self.retry_delay_ms) {
            return Err(invalid("rabbitmq.retry_delay_ms", "must be between 100 and 3600000"));
        }
        if !(100..=120_000).contains(&self.connect_timeout_ms) {
            return Err(invalid("rabbitmq.connect_timeout_ms", "must be between 100 and 120000"));
        }
        Ok(())
    }

    /// The queue `group` consumes.
    pub fn queue_of(&self, group: &str) -> String {
        if self.queue.is_empty() { group.to_owned() } else { self.queue.clone() }
    }

    /// The broker's address with the password masked, for logs and refusals.
    pub fn describe(&self) -> String {
        format!("RabbitMQ at {}", redact_url(&self.url))
    }

    /// A copy with the URL's password masked, for printing.
    pub fn redacted(&self) -> Self {
        Self { url: redact_url(&self.url), ..self.clone() }
    }

    pub(crate) fn timeout(&self) -> Duration {
        Duration::from_millis(u64::from(self.connect_timeout_ms))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_defaults_are_valid_and_the_queue_is_the_group_by_default() {
        let s = RabbitMqSettings::default();
        s.validate().unwrap();
        assert_eq!(s.queue_of("orders"), "orders");
        let named = RabbitMqSettings { queue: "q1".into(), ..s };
        assert_eq!(named.queue_of("orders"), "q1");
    }

    #[test]
    fn bad_values_are_refused_with_their_key() {
        let base = RabbitMqSettings::default();
        let cases = [
            (RabbitMqSettings { url: "http://x".into(), ..base.clone() }, "rabbitmq.url"),
            (RabbitMqSettings { url: "amqps://h/%2f".into(), ..base.clone() }, "rabbitmq.url"),
            (RabbitMqSettings { url: "not a url".into(), ..base.clone() }, "rabbitmq.url"),
            (RabbitMqSettings { queue: "amq.mine".into(), ..base.clone() }, "rabbitmq.queue"),
            (RabbitMqSettings { queue: "a\u{0}b".into(), ..base.clone() }, "rabbitmq.queue"),
            (RabbitMqSettings { prefetch: 0, ..base.clone() }, "rabbitmq.prefetch"),
            (RabbitMqSettings { retry_delay_ms: 5, ..base.clone() }, "rabbitmq.retry_delay_ms"),
            (RabbitMqSettings { connect_timeout_ms: 0, ..base.clone() }, "rabbitmq.connect_timeout_ms"),
        ];
        for (s, key) in cases {
            let err = s.validate().unwrap_err().to_string();
            assert!(err.contains(key), "{key}: {err}");
        }
    }

    #[test]
    fn the_password_is_never_shown() {
        let s = RabbitMqSettings { url: "amqp://app:s3cret@mq:5672/%2f".into(), ..Default::default() };
        assert!(!s.describe().contains("s3cret"), "{}", s.describe());
        assert!(!format!("{:?}", s.redacted()).contains("s3cret"));
        assert!(!format!("{s:?}").contains("s3cret"));
    }
}
