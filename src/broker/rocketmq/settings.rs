//! `[rocketmq]`: where the name server is, how hard the consumer pulls, the producer group of
//! `produce` and replay, and what a secured cluster asks of every client: the account and its
//! secret, the namespace, and message trace. The secret is read here (from the setting or its
//! file) and never shown: `Debug` and [`RocketMqSettings::redacted`] mask it.

use serde::{Deserialize, Serialize};

use crate::route::{MAX_ID_CHARS, check_key_text};
use crate::setting::{Invalid, invalid};

/// `[rocketmq]`, read with `broker.kind = "rocketmq"` (the default).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct RocketMqSettings {
    /// `IDEMGATE_ROCKETMQ__NAME_SERVER`: the RocketMQ name server(s), `host:port[;host:port]`.
    pub name_server: String,
    /// `IDEMGATE_ROCKETMQ__BATCH_SIZE`: messages per listener call. 1 keeps a retry to its own
    /// message; a larger batch redelivers the whole batch when one message asks for a retry.
    pub batch_size: u32,
    /// `IDEMGATE_ROCKETMQ__PULL_BATCH_SIZE`: messages fetched from a queue per pull.
    pub pull_batch_size: u32,
    /// `IDEMGATE_ROCKETMQ__BUFFERED_MESSAGES`: messages pulled but not yet consumed, per topic,
    /// at most; the client stops pulling beyond it, so a slow database never fills memory.
    pub buffered_messages: u32,
    /// `IDEMGATE_ROCKETMQ__BUFFERED_MIB`: the same bound in MiB of message bodies, per topic.
    pub buffered_mib: u32,
    /// `IDEMGATE_ROCKETMQ__PRODUCER_GROUP`: the producer group of `produce` and replay.
    pub producer_group: String,
    /// `IDEMGATE_ROCKETMQ__HEARTBEAT_INTERVAL_SECONDS`: how often each client tells the brokers
    /// it is alive (10 to 600; RocketMQ's default 30). A broker drops a consumer it has not
    /// heard from for its `channelExpiredTimeout` (120 s by default) and hands its queues to the
    /// rest of the group: keep this at a third of that or less.
    pub heartbeat_interval_seconds: u32,

    // A secured cluster: the same account, namespace and trace for every client idemgate opens
    // (the consumer, the lag reader's two clients, replay's producer and `produce`).
    /// `IDEMGATE_ROCKETMQ__ACCESS_KEY`: the account (access key) idemgate signs its requests
    /// with, on a cluster with authentication on. Empty: requests are not signed.
    pub access_key: String,
    /// `IDEMGATE_ROCKETMQ__SECRET_KEY`: the account's secret. Give it here or in
    /// `secret_key_file`, not both; never logged, and masked by `idemgate config`.
    pub secret_key: SecretKey,
    /// `IDEMGATE_ROCKETMQ__SECRET_KEY_FILE`: a file holding the account's secret (its
    /// surrounding whitespace ignored), such as a mounted Kubernetes secret; read at start.
    pub secret_key_file: String,
    /// `IDEMGATE_ROCKETMQ__NAMESPACE`: the RocketMQ namespace of the topics and groups; the
    /// broker sees each as `<namespace>%<name>`. Empty: none.
    pub namespace: String,
    /// `IDEMGATE_ROCKETMQ__MESSAGE_TRACE`: record each consumption in the broker's trace topic
    /// as the Java client does, for the RocketMQ dashboard's message trace.
    pub message_trace: bool,
    /// `IDEMGATE_ROCKETMQ__TRACE_TOPIC`: the topic trace records go to with `message_trace`;
    /// RocketMQ's default `RMQ_SYS_TRACE_TOPIC`.
    pub trace_topic: String,
}

/// RocketMQ's default trace topic, where the dashboard reads message traces.
pub const DEFAULT_TRACE_TOPIC: &str = "RMQ_SYS_TRACE_TOPIC";

/// The broker account's secret: shown as `***` by `Debug`, so that no log of the settings
/// carries it.
#[derive(Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(transparent)]
pub struct SecretKey(String);

impl SecretKey {
    pub fn new(secret: impl Into<String>) -> Self {
        Self(secret.into())
    }

    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// The secret itself, for signing requests only.
    pub(crate) fn expose(&self) -> &str {
        &self.0
    }

    /// `***` for a secret, empty for none: what a printed configuration shows.
    fn masked(&self) -> Self {
        Self(if self.0.is_empty() { String::new() } else { "***".to_owned() })
    }
}

impl std::fmt::Debug for SecretKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(if self.0.is_empty() { "\"\"" } else { "\"***\"" })
    }
}

impl Default for RocketMqSettings {
    fn default() -> Self {
        Self {
            name_server: "127.0.0.1:9876".to_owned(),
            batch_size: 1,
            pull_batch_size: 32,
            buffered_messages: 4_000,
            buffered_mib: 64,
            producer_group: "idemgate_producer".to_owned(),
            heartbeat_interval_seconds: 30,
            access_key: String::new(),
            secret_key: SecretKey::default(),
            secret_key_file: String::new(),
            namespace: String::new(),
            message_trace: false,
            trace_topic: DEFAULT_TRACE_TOPIC.to_owned(),
        }
    }
}

impl RocketMqSettings {
    pub fn validate(&self) -> Result<(), Invalid> {
        if self.name_server.trim().is_empty() {
            return Err(invalid("rocketmq.name_server", "is empty"));
        }
        if !(1..=32).contains(&self.batch_size) {
            return Err(invalid("rocketmq.batch_size", "must be between 1 and 32"));
        }
        if !(1..=1024).contains(&self.pull_batch_size) {
            return Err(invalid("rocketmq.pull_batch_size", "must be between 1 and 1024"));
        }
        if !(1..=1_000_000).contains(&self.buffered_messages) {
            return Err(invalid("rocketmq.buffered_messages", "must be between 1 and 1000000"));
        }
        if !(1..=4096).contains(&self.buffered_mib) {
            return Err(invalid("rocketmq.buffered_mib", "must be between 1 and 4096"));
        }
        check_key_text(&self.producer_group, MAX_ID_CHARS)
            .map_err(|m| invalid("rocketmq.producer_group", m))?;
        if !(10..=600).contains(&self.heartbeat_interval_seconds) {
            // The client's own bounds: it refuses anything else.
            return Err(invalid("rocketmq.heartbeat_interval_seconds", "must be between 10 and 600"));
        }
        if self.access_key.chars().any(|c| c.is_whitespace() || c.is_control()) {
            return Err(invalid("rocketmq.access_key", "contains whitespace or control characters"));
        }
        self.secret()?;
        if !self.namespace.is_empty() {
            check_resource_name(&self.namespace, MAX_NAMESPACE_CHARS, false)
                .map_err(|why| invalid("rocketmq.namespace", format!("{:?} {why}", self.namespace)))?;
        }
        check_resource_name(&self.trace_topic, MAX_TOPIC_NAME_CHARS, true)
            .map_err(|why| invalid("rocketmq.trace_topic", format!("{:?} {why}", self.trace_topic)))?;
        Ok(())
    }

    /// The account's secret, from `secret_key` or read from `secret_key_file`; `None` without
    /// an account. Refused when the account has no secret, two, or an unreadable or empty file;
    /// no refusal quotes the secret.
    pub(crate) fn secret(&self) -> Result<Option<SecretKey>, Invalid> {
        let from_file = !self.secret_key_file.is_empty();
        if self.access_key.is_empty() {
            if !self.secret_key.is_empty() || from_file {
                let key = if from_file { "rocketmq.secret_key_file" } else { "rocketmq.secret_key" };
                return Err(invalid(key, "is set without rocketmq.access_key: set both or neither"));
            }
            return Ok(None);
        }
        let secret = match (self.secret_key.is_empty(), from_file) {
            (false, true) => {
                return Err(invalid(
                    "rocketmq.secret_key_file",
                    "is set beside rocketmq.secret_key: give the secret in one of them",
                ));
            }
            (true, false) => {
                return Err(invalid(
                    "rocketmq.secret_key",
                    "is empty while rocketmq.access_key is set: give the secret here or in \
                     rocketmq.secret_key_file",
                ));
            }
            (false, false) => self.secret_key.expose().trim().to_owned(),
            (true, true) => std::fs::read_to_string(&self.secret_key_file)
                .map_err(|e| {
                    invalid(
                        "rocketmq.secret_key_file",
                        format!("{:?} cannot be read: {e}", self.secret_key_file),
                    )
                })?
                .trim()
                .to_owned(),
        };
        if secret.is_empty() {
            let key = if from_file { "rocketmq.secret_key_file" } else { "rocketmq.secret_key" };
            return Err(invalid(key, "holds an empty secret"));
        }
        if secret.chars().any(char::is_control) {
            let key = if from_file { "rocketmq.secret_key_file" } else { "rocketmq.secret_key" };
            return Err(invalid(key, "holds control characters"));
        }
        Ok(Some(SecretKey(secret)))
    }

    /// A copy with the secret masked, for printing.
    pub fn redacted(&self) -> Self {
        Self { secret_key: self.secret_key.masked(), ..self.clone() }
    }
}

/// RocketMQ's limits: a namespace of at most 64 characters, a topic of at most 127.
const MAX_NAMESPACE_CHARS: usize = 64;
const MAX_TOPIC_NAME_CHARS: usize = 127;

/// Checks a namespace or a topic name by RocketMQ's rule: ASCII letters, digits, `_` and `-`
/// (a topic also `%` and `|`), at most `max` characters.
fn check_resource_name(name: &str, max: usize, topic: bool) -> Result<(), String> {
    if name.is_empty() {
        return Err("is empty".to_owned());
    }
    if name.len() > max {
        return Err(format!("is longer than {max} characters"));
    }
    let allowed =
        |c: char| c.is_ascii_alphanumeric() || c == '_' || c == '-' || (topic && (c == '%' || c == '|'));
    if !name.chars().all(allowed) {
        return Err(if topic {
            "may hold only ASCII letters, digits, '_', '-', '%' and '|'".to_owned()
        } else {
            "may hold only ASCII letters, digits, '_' and '-'".to_owned()
        });
    }
    Ok(())
}
