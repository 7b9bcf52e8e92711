//! The typed configuration, layered: built-in defaults, then a TOML file, then environment
//! variables. Every field names its environment variable; `Settings::load` validates the
//! whole and names the offending key when something is wrong.
//!
//! The defaults are the embedded ones: a SQLite file and the example shop routes, so that
//! `idemgate demo` needs no services. This module owns reading and checking settings; it must
//! not open connections.

use std::path::Path;

use figment::Figment;
use figment::providers::{Env, Format, Serialized, Toml};
use serde::{Deserialize, Serialize};

use crate::archive::ArchiveSettings;
use crate::broker::StartFrom;
use crate::broker::consumer::ConsumerOptions;
use crate::gate::{GroupSettings, Identity, Policy};
use crate::handler::Handlers;
use crate::prefilter::RedisSettings;
use crate::reconcile::ReconcileSettings;
use crate::route::{RouteConfig, Routes};
use crate::shop;
use crate::state_machine::{self, StateMachineConfig};
use crate::store::{Backend, StoreOptions};

/// All of idemgate's settings.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Settings {
    pub database: DatabaseSettings,
    pub consumer: ConsumerSettings,
    /// Which business key each topic/tag carries. The file's `[[routes]]` tables replace the
    /// default shop routes as a whole.
    pub routes: Vec<RouteConfig>,
    pub broker: BrokerSettings,
    pub http: HttpSettings,
    pub log: LogSettings,
    /// `[archive]`: scheduled archiving of old claims and the delivery log's retention; each
    /// field names its `IDEMGATE_ARCHIVE__…` variable ([`ArchiveSettings`]).
    pub archive: ArchiveSettings,
    /// `[reconcile]`: the scheduled reconciler; each field names its `IDEMGATE_RECONCILE__…`
    /// variable ([`ReconcileSettings`]).
    pub reconcile: ReconcileSettings,
    /// `[redis]`: the optional Redis pre-filter in front of the claim; each field names its
    /// `IDEMGATE_REDIS__…` variable ([`RedisSettings`]).
    pub redis: RedisSettings,
    /// `[dedup]`: how the claims are laid out ([`DedupSettings`]).
    pub dedup: DedupSettings,
    /// `[group_commit]`: many deliveries per transaction ([`GroupCommitSettings`]).
    pub group_commit: GroupCommitSettings,
    /// `[[state_machines]]`: handlers made from configuration, each a conditional state move
    /// that routes name as their handler; each field is described on [`StateMachineConfig`].
    /// `IDEMGATE_STATE_MACHINES` replaces the whole array with inline tables. None by default.
    pub state_machines: Vec<StateMachineConfig>,
}

/// `[dedup]`: how the claims are laid out.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DedupSettings {
    /// `IDEMGATE_DEDUP__SHARDS`: 0 keeps every claim in `idempotent_record`; 2 to 100 splits
    /// them over `idempotent_record_00 …` by a stable hash of the key. Fixed when the first
    /// process runs on a database: a later start with another value is refused.
    pub shards: u16,
}

/// `[group_commit]`: deliveries that arrive together share one transaction, each in its own
/// savepoint ([`crate::gate::group`]). Off by default: one transaction per delivery.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct GroupCommitSettings {
    /// `IDEMGATE_GROUP_COMMIT__ENABLED`.
    pub enabled: bool,
    /// `IDEMGATE_GROUP_COMMIT__MAX_BATCH`: deliveries per transaction, 1 to 64.
    pub max_batch: usize,
    /// `IDEMGATE_GROUP_COMMIT__LINGER_MS`: how long a group waits for more deliveries after
    /// its first, 0 to 1000: the latency added when traffic is light.
    pub linger_ms: u64,
    /// `IDEMGATE_GROUP_COMMIT__IN_FLIGHT`: groups committing at once, 1 to 16.
    pub in_flight: usize,
    /// `IDEMGATE_GROUP_COMMIT__QUEUE`: deliveries waiting for a group at most; beyond it the
    /// consume threads wait.
    pub queue: usize,
}

impl Default for GroupCommitSettings {
    fn default() -> Self {
        let g = GroupSettings::default();
        Self {
            enabled: false,
            max_batch: g.max_batch,
            linger_ms: g.linger.as_millis() as u64,
            in_flight: g.in_flight,
            queue: g.queue,
        }
    }
}

impl GroupCommitSettings {
    /// The gate's group settings, when group commit is on.
    pub fn group_settings(&self) -> Option<GroupSettings> {
        self.enabled.then(|| GroupSettings {
            max_batch: self.max_batch,
            linger: std::time::Duration::from_millis(self.linger_ms),
            in_flight: self.in_flight,
            queue: self.queue,
        })
    }
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct BrokerSettings {
    /// `IDEMGATE_BROKER__NAME_SERVER`: the RocketMQ name server(s), `host:port[;host:port]`.
    pub name_server: String,
    /// `IDEMGATE_BROKER__CONSUME_THREADS`: listener calls in flight at once. Each holds one
    /// database connection, so `database.max_connections` must be at least this (with group
    /// commit, only each group does: see `group_commit`).
    pub consume_threads: u32,
    /// `IDEMGATE_BROKER__BATCH_SIZE`: messages per listener call. 1 keeps a retry to its own
    /// message; a larger batch redelivers the whole batch when one message asks for a retry.
    pub batch_size: u32,
    /// `IDEMGATE_BROKER__PULL_BATCH_SIZE`: messages fetched from a queue per pull.
    pub pull_batch_size: u32,
    /// `IDEMGATE_BROKER__BUFFERED_MESSAGES`: messages pulled but not yet consumed, per topic,
    /// at most; the client stops pulling beyond it, so a slow database never fills memory.
    pub buffered_messages: u32,
    /// `IDEMGATE_BROKER__BUFFERED_MIB`: the same bound in MiB of message bodies, per topic.
    pub buffered_mib: u32,
    /// `IDEMGATE_BROKER__START_FROM`: where a new consumer group starts, `first` (miss nothing)
    /// or `last`.
    pub start_from: StartFrom,
    /// `IDEMGATE_BROKER__PRODUCER_GROUP`: the producer group of `produce` and replay.
    pub producer_group: String,
}

/// `Debug` masks the secrets, so that a settings dump in a log never carries them.
#[derive(Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct HttpSettings {
    /// `IDEMGATE_HTTP__BIND`: the address of the web UI, the JSON API, `/metrics` and the
    /// health endpoints. Loopback unless you mean to expose it.
    pub bind: String,
    /// `IDEMGATE_HTTP__AUTH_TOKEN`: when set, every page, API call and `/metrics` needs
    /// `Authorization: Bearer <token>` (or the basic-auth pair below). Health stays open.
    pub auth_token: String,
    /// `IDEMGATE_HTTP__BASIC_USER` and `IDEMGATE_HTTP__BASIC_PASSWORD`: when both are set, a
    /// browser may sign in with them (HTTP basic auth). Set neither or both.
    pub basic_user: String,
    pub basic_password: String,
    /// `IDEMGATE_HTTP__GRAFANA_URL`: the idemgate dashboard's URL, such as
    /// `http://grafana:3000/d/idemgate`; the trace page links to it with the key's time range.
    /// Empty: no links.
    pub grafana_url: String,
    /// `IDEMGATE_HTTP__QUERY_TIMEOUT_MS`: the longest a page or API call may wait on the
    /// database before it answers 503. On PostgreSQL and MariaDB the UI's connections also
    /// carry it as a server-side statement timeout, so an abandoned query stops on the server
    /// too.
    pub query_timeout_ms: u64,
    /// `IDEMGATE_HTTP__MAX_CONNECTIONS`: the web UI's, JSON API's and `/metrics`' own pool,
    /// 1 to 64. The consumer's connections (`database.max_connections`) are never lent to a
    /// page, so no flood of requests can starve the deliveries.
    pub max_connections: u32,
    /// `IDEMGATE_HTTP__MAX_CONCURRENT_REQUESTS`: pages and API calls served at once, 1 to
    /// 1024; one more is answered 503 at once with `Retry-After`. Health and `/metrics` are
    /// not counted.
    pub max_concurrent_requests: u32,

    // Which names the server answers to, and how long a replay form stays valid: the guards
    // against DNS rebinding and cross-site requests ([`crate::http::host`], [`crate::http::csrf`]).
    /// `IDEMGATE_HTTP__ALLOWED_HOSTS`: the host names (without a port; any port is accepted)
    /// the web UI, the API and `/metrics` are served under, such as
    /// `["idemgate.example.com"]`. `localhost` and IP addresses (the bind address, a pod IP)
    /// are always accepted; a request whose `Host` names anything else gets 421. `/healthz`
    /// and `/readyz` answer any `Host`. Empty by default: with the loopback bind nothing else
    /// is needed; with a wildcard bind (`0.0.0.0`, `[::]`) list every name the service is
    /// reached by.
    pub allowed_hosts: Vec<String>,
    /// `IDEMGATE_HTTP__CSRF_TOKEN_TTL_SECONDS`: how long the trace page's Replay form stays
    /// valid after the page was shown, 60 to 86400. An older form is refused with a request
    /// to reload the page.
    pub csrf_token_ttl_seconds: u64,
}

impl std::fmt::Debug for HttpSettings {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let shown = self.redacted();
        f.debug_struct("HttpSettings")
            .field("bind", &shown.bind)
            .field("auth_token", &shown.auth_token)
            .field("basic_user", &shown.basic_user)
            .field("basic_password", &shown.basic_password)
            .field("grafana_url", &shown.grafana_url)
            .field("query_timeout_ms", &shown.query_timeout_ms)
            .field("max_connections", &shown.max_connections)
            .field("max_concurrent_requests", &shown.max_concurrent_requests)
            .field("allowed_hosts", &shown.allowed_hosts)
            .field("csrf_token_ttl_seconds", &shown.csrf_token_ttl_seconds)
            .finish()
    }
}

impl HttpSettings {
    /// True when the web UI asks for credentials.
    pub fn auth_enabled(&self) -> bool {
        !self.auth_token.is_empty() || !self.basic_user.is_empty()
    }

    /// A copy with the secrets masked, for printing.
    pub fn redacted(&self) -> Self {
        let mask = |s: &str| if s.is_empty() { String::new() } else { "***".to_owned() };
        Self {
            auth_token: mask(&self.auth_token),
            basic_password: mask(&self.basic_password),
            ..self.clone()
        }
    }

    fn validate(&self) -> Result<(), ConfigError> {
        self.bind.parse::<std::net::SocketAddr>().map_err(|e| {
            invalid("http.bind", format!("{:?} is not an address such as 127.0.0.1:8080 ({e})", self.bind))
        })?;
        if !self.auth_token.is_empty() && self.auth_token.chars().count() < 16 {
            return Err(invalid("http.auth_token", "is shorter than 16 characters; use a long random token"));
        }
        if self.auth_token.chars().any(|c| c.is_whitespace() || c.is_control()) {
            return Err(invalid("http.auth_token", "contains whitespace or control characters"));
        }
        if self.basic_user.is_empty() != self.basic_password.is_empty() {
            return Err(invalid(
                "http.basic_user",
                "basic_user and basic_password are set together or not at all",
            ));
        }
        if self.basic_user.contains(':') {
            return Err(invalid("http.basic_user", "contains ':', which basic auth cannot carry"));
        }
        let web_url = self.grafana_url.starts_with("http://") || self.grafana_url.starts_with("https://");
        if !self.grafana_url.is_empty() && !web_url {
            return Err(invalid("http.grafana_url", "must start with http:// or https://"));
        }
        if !(100..=600_000).contains(&self.query_timeout_ms) {
            return Err(invalid("http.query_timeout_ms", "must be from 100 to 600000"));
        }
        if !(1..=64).contains(&self.max_connections) {
            return Err(invalid("http.max_connections", "must be from 1 to 64"));
        }
        if !(1..=1024).contains(&self.max_concurrent_requests) {
            return Err(invalid("http.max_concurrent_requests", "must be from 1 to 1024"));
        }
        for name in &self.allowed_hosts {
            check_host_name(name).map_err(|why| invalid("http.allowed_hosts", format!("{name:?} {why}")))?;
        }
        if !(60..=86_400).contains(&self.csrf_token_ttl_seconds) {
            return Err(invalid("http.csrf_token_ttl_seconds", "must be from 60 to 86400"));
        }
        Ok(())
    }

    /// True when the server listens on every address (`0.0.0.0`, `[::]`): then it is reached
    /// by names this process cannot know, which `allowed_hosts` must list.
    pub fn binds_every_address(&self) -> bool {
        self.bind.parse::<std::net::SocketAddr>().is_ok_and(|a| a.ip().is_unspecified())
    }
}

/// Checks one `http.allowed_hosts` entry: a DNS name or an IP address, without a scheme, a
/// port, a path or a wildcard.
fn check_host_name(name: &str) -> Result<(), &'static str> {
    let bare = name.strip_prefix('[').and_then(|n| n.strip_suffix(']')).unwrap_or(name);
    if bare.parse::<std::net::IpAddr>().is_ok() {
        return Ok(());
    }
    if name.contains("://") || name.contains('/') {
        return Err("is not a host name: give the name alone, such as idemgate.example.com");
    }
    if name.contains(':') {
        return Err("has a port: give the name alone; any port is accepted");
    }
    if name.contains('*') {
        return Err("has a wildcard: list each name");
    }
    let labels = name.strip_suffix('.').unwrap_or(name);
    let label_ok = |l: &str| {
        (1..=63).contains(&l.len())
            && l.chars().all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_')
            && !l.starts_with('-')
            && !l.ends_with('-')
    };
    if labels.is_empty() || labels.len() > 253 || !labels.split('.').all(label_ok) {
        return Err("is not a host name (letters, digits, '-' and '.', at most 253 characters)");
    }
    Ok(())
}

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
            .field("url", &crate::store::redact_url(&self.url))
            .field("max_connections", &self.max_connections)
            .field("acquire_timeout_ms", &self.acquire_timeout_ms)
            .finish()
    }
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ConsumerSettings {
    /// `IDEMGATE_CONSUMER__GROUP`: the RocketMQ consumer group. Part of every claim key: two
    /// groups apply their own effects, instances of one group share theirs.
    pub group: String,
    /// `IDEMGATE_CONSUMER__INSTANCE`: this process's name in logs, log rows and metrics.
    /// Empty means `hostname-pid`.
    pub instance: String,
    /// `IDEMGATE_CONSUMER__MAX_RECONSUME_TIMES`: the broker's retry budget; the failure at this
    /// reconsume count is logged `dead_lettered`.
    pub max_reconsume_times: i32,
    /// `IDEMGATE_CONSUMER__TRANSIENT_RETRIES`: in-gate retries of a deadlock or busy database
    /// before the broker is asked to redeliver.
    pub transient_retries: u32,
    /// `IDEMGATE_CONSUMER__DUPLICATE_WARNINGS_PER_SECOND`: WARN lines for duplicates per second;
    /// the rest are counted and reported with the next one.
    pub duplicate_warnings_per_second: u32,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LogSettings {
    /// `IDEMGATE_LOG__FILTER`: a `tracing` filter such as `info` or `idemgate=debug,sqlx=warn`.
    /// `RUST_LOG`, when set, wins.
    pub filter: String,
    /// `IDEMGATE_LOG__FORMAT`: `text` or `json`.
    pub format: LogFormat,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum LogFormat {
    Text,
    Json,
}

impl Default for Settings {
    fn default() -> Self {
        let policy = Policy::default();
        Self {
            database: DatabaseSettings {
                url: "sqlite://idemgate.db?mode=rwc".to_owned(),
                max_connections: 16,
                acquire_timeout_ms: 10_000,
            },
            consumer: ConsumerSettings {
                group: "idemgate_shop_consumer".to_owned(),
                instance: String::new(),
                max_reconsume_times: policy.max_reconsume_times,
                transient_retries: policy.transient_retries,
                duplicate_warnings_per_second: policy.duplicate_warnings_per_second,
            },
            routes: shop::routes(shop::TOPIC),
            broker: BrokerSettings {
                name_server: "127.0.0.1:9876".to_owned(),
                consume_threads: 8,
                batch_size: 1,
                pull_batch_size: 32,
                buffered_messages: 4_000,
                buffered_mib: 64,
                start_from: StartFrom::First,
                producer_group: "idemgate_producer".to_owned(),
            },
            http: HttpSettings {
                bind: "127.0.0.1:8080".to_owned(),
                auth_token: String::new(),
                basic_user: String::new(),
                basic_password: String::new(),
                grafana_url: String::new(),
                query_timeout_ms: 5_000,
                max_connections: 4,
                max_concurrent_requests: 16,
                allowed_hosts: Vec::new(),
                csrf_token_ttl_seconds: 3_600,
            },
            log: LogSettings { filter: DEFAULT_LOG_FILTER.to_owned(), format: LogFormat::Text },
            archive: ArchiveSettings::default(),
            reconcile: ReconcileSettings::default(),
            redis: RedisSettings::default(),
            dedup: DedupSettings { shards: 0 },
            group_commit: GroupCommitSettings::default(),
            state_machines: Vec::new(),
        }
    }
}

/// idemgate at INFO; the RocketMQ client (chatty at INFO: every rebalance and offset
/// commit) and the cron scheduler (a line per job it creates) at WARN.
pub const DEFAULT_LOG_FILTER: &str = "info,rocketmq_client_rust=warn,rocketmq_transport=warn,rocketmq_runtime=warn,\
     rocketmq_remoting=warn,tokio_cron_scheduler=warn";

/// A setting is missing, malformed or inconsistent.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error("configuration file {0} does not exist")]
    MissingFile(String),
    #[error("configuration: {0}")]
    Parse(String),
    #[error("configuration key {key}: {message}")]
    Invalid { key: String, message: String },
}

fn invalid(key: &str, message: impl Into<String>) -> ConfigError {
    ConfigError::Invalid { key: key.to_owned(), message: message.into() }
}

impl Settings {
    /// Defaults, then `file` (if given; it must exist), then `IDEMGATE_SECTION__KEY` variables.
    pub fn load(file: Option<&Path>) -> Result<Self, ConfigError> {
        Self::load_from(file, Env::prefixed("IDEMGATE_"))
    }

    fn load_from(file: Option<&Path>, env: Env) -> Result<Self, ConfigError> {
        let mut figment = Figment::from(Serialized::defaults(Settings::default()));
        if let Some(path) = file {
            if !path.is_file() {
                return Err(ConfigError::MissingFile(path.display().to_string()));
            }
            figment = figment.merge(Toml::file_exact(path));
        }
        // Only SECTION__KEY variables are settings, and the one array of tables that can come
        // whole from one variable; others with the prefix (IDEMGATE_CONFIG, the tests' own) are
        // not.
        figment =
            figment.merge(env.filter(|k| k.as_str().contains("__") || k == "state_machines").split("__"));
        let settings: Settings = figment.extract().map_err(|e| ConfigError::Parse(describe(&e)))?;
        settings.validate()?;
        Ok(settings)
    }

    /// Checks what types alone cannot.
    pub fn validate(&self) -> Result<(), ConfigError> {
        self.validate_with(&self.handlers()?)
    }

    /// [`Settings::validate`] against `handlers` instead of the configured ones: for a program
    /// that brings handlers of its own, whose routes name them.
    pub fn validate_with(&self, handlers: &Handlers) -> Result<(), ConfigError> {
        // The configured handlers are checked even when others are given.
        self.handlers()?;
        Backend::from_url(&self.database.url).map_err(|e| invalid("database.url", e.to_string()))?;
        if self.database.max_connections == 0 {
            return Err(invalid("database.max_connections", "must be at least 1"));
        }
        if self.database.acquire_timeout_ms == 0 {
            return Err(invalid("database.acquire_timeout_ms", "must be at least 1"));
        }
        crate::route::check_key_text(&self.consumer.group, crate::route::MAX_ID_CHARS)
            .map_err(|m| invalid("consumer.group", m))?;
        if self.consumer.instance.chars().count() > crate::route::MAX_ID_CHARS {
            return Err(invalid("consumer.instance", "is longer than 128 characters"));
        }
        if !(0..=32).contains(&self.consumer.max_reconsume_times) {
            return Err(invalid(
                "consumer.max_reconsume_times",
                "must be between 0 and 32 (RocketMQ's own limit)",
            ));
        }
        let b = &self.broker;
        if b.name_server.trim().is_empty() {
            return Err(invalid("broker.name_server", "is empty"));
        }
        if !(1..=256).contains(&b.consume_threads) {
            return Err(invalid("broker.consume_threads", "must be between 1 and 256"));
        }
        if !(1..=32).contains(&b.batch_size) {
            return Err(invalid("broker.batch_size", "must be between 1 and 32"));
        }
        if !(1..=1024).contains(&b.pull_batch_size) {
            return Err(invalid("broker.pull_batch_size", "must be between 1 and 1024"));
        }
        if !(1..=1_000_000).contains(&b.buffered_messages) {
            return Err(invalid("broker.buffered_messages", "must be between 1 and 1000000"));
        }
        if !(1..=4096).contains(&b.buffered_mib) {
            return Err(invalid("broker.buffered_mib", "must be between 1 and 4096"));
        }
        let g = &self.group_commit;
        if !(1..=crate::gate::group::MAX_BATCH).contains(&g.max_batch) {
            return Err(invalid(
                "group_commit.max_batch",
                format!(
                    "is {}; use 1 to {} (PostgreSQL tracks at most 64 savepoints per transaction cheaply)",
                    g.max_batch,
                    crate::gate::group::MAX_BATCH
                ),
            ));
        }
        if g.linger_ms > 1_000 {
            return Err(invalid("group_commit.linger_ms", "must be at most 1000"));
        }
        if !(1..=16).contains(&g.in_flight) {
            return Err(invalid("group_commit.in_flight", "must be between 1 and 16"));
        }
        if !(1..=100_000).contains(&g.queue) {
            return Err(invalid("group_commit.queue", "must be between 1 and 100000"));
        }
        if g.enabled {
            // Each group in flight holds a connection; a group's duplicates read their earlier
            // claims on another.
            let needed = 2 * g.in_flight as u32;
            if self.database.max_connections < needed {
                return Err(invalid(
                    "database.max_connections",
                    format!(
                        "is {}, below twice group_commit.in_flight ({needed}): each group holds a connection and reads its duplicates' claims on another",
                        self.database.max_connections
                    ),
                ));
            }
        } else if self.database.max_connections < b.consume_threads {
            return Err(invalid(
                "database.max_connections",
                format!(
                    "is {}, below broker.consume_threads ({}): every listener call holds a connection",
                    self.database.max_connections, b.consume_threads
                ),
            ));
        }
        crate::route::check_key_text(&b.producer_group, crate::route::MAX_ID_CHARS)
            .map_err(|m| invalid("broker.producer_group", m))?;
        self.http.validate()?;
        if self.routes.is_empty() {
            return Err(invalid("routes", "at least one route is needed"));
        }
        let routes = Routes::new(&self.routes).map_err(|e| invalid(&e.field, e.message))?;
        for (route, name) in routes.handler_names() {
            if handlers.get(name).is_none() {
                return Err(invalid(
                    &format!("routes[{route}].handler"),
                    format!(
                        "no handler named {name:?} (a route without `handler` uses its biz_type); known handlers: {}",
                        handlers.names().collect::<Vec<_>>().join(", ")
                    ),
                ));
            }
        }
        self.archive.validate().map_err(|e| invalid(e.key, e.message))?;
        self.reconcile.validate().map_err(|e| invalid(e.key, e.message))?;
        self.redis.validate().map_err(|e| invalid(e.key, e.message))?;
        let carried = routes.biz_types();
        if let Some(unknown) = self.redis.biz_types.iter().find(|t| *t != "*" && !carried.contains(*t)) {
            return Err(invalid(
                "redis.biz_types",
                format!(
                    "{unknown:?} is the biz_type of no route; the routes carry {}",
                    carried.iter().map(String::as_str).collect::<Vec<_>>().join(", ")
                ),
            ));
        }
        if self.dedup.shards == 1 || self.dedup.shards > crate::layout::MAX_SHARDS {
            return Err(invalid(
                "dedup.shards",
                format!("is {}; use 0 (one table) or 2 to {}", self.dedup.shards, crate::layout::MAX_SHARDS),
            ));
        }
        Ok(())
    }

    /// The built-in shop handlers and the configured `[[state_machines]]`. A configured name
    /// that is a built-in handler's is refused, with its key named.
    pub fn handlers(&self) -> Result<Handlers, ConfigError> {
        let mut handlers = shop::handlers();
        let configured =
            state_machine::handlers(&self.state_machines).map_err(|e| invalid(&e.field, e.message))?;
        for (i, machine) in self.state_machines.iter().enumerate() {
            if handlers.get(&machine.name).is_some() {
                return Err(invalid(
                    &format!("state_machines[{i}].name"),
                    format!("{:?} is the name of a built-in handler; choose another", machine.name),
                ));
            }
        }
        handlers.extend(configured);
        Ok(handlers)
    }

    pub fn routes(&self) -> Routes {
        Routes::new(&self.routes).expect("validated by Settings::load")
    }

    /// The consumer's pool: the gate, the schedulers and replay.
    pub fn store_options(&self) -> StoreOptions {
        StoreOptions {
            max_connections: self.database.max_connections,
            acquire_timeout: std::time::Duration::from_millis(self.database.acquire_timeout_ms),
            statement_timeout: None,
        }
    }

    /// The web UI's own pool: `http.max_connections`, and every statement bounded by
    /// `http.query_timeout_ms` on the server as well.
    pub fn ui_store_options(&self) -> StoreOptions {
        let timeout = std::time::Duration::from_millis(self.http.query_timeout_ms);
        StoreOptions {
            max_connections: self.http.max_connections,
            acquire_timeout: timeout,
            statement_timeout: Some(timeout),
        }
    }

    pub fn identity(&self) -> Identity {
        let instance_id = if self.consumer.instance.is_empty() {
            Identity::default_instance_id()
        } else {
            self.consumer.instance.clone()
        };
        Identity { consumer_group: self.consumer.group.clone(), instance_id }
    }

    pub fn consumer_options(&self) -> ConsumerOptions {
        ConsumerOptions {
            name_server: self.broker.name_server.clone(),
            consume_threads: self.broker.consume_threads,
            batch_size: self.broker.batch_size,
            pull_batch_size: self.broker.pull_batch_size,
            buffered_messages: self.broker.buffered_messages,
            buffered_mib: self.broker.buffered_mib,
            start_from: self.broker.start_from,
        }
    }

    pub fn policy(&self) -> Policy {
        Policy {
            max_reconsume_times: self.consumer.max_reconsume_times,
            transient_retries: self.consumer.transient_retries,
            duplicate_warnings_per_second: self.consumer.duplicate_warnings_per_second,
        }
    }
}

/// figment's error, with the key path and the source (file or variable) it came from.
fn describe(e: &figment::Error) -> String {
    e.clone()
        .into_iter()
        .map(|e| {
            let key = if e.path.is_empty() { String::new() } else { format!("key {}: ", e.path.join(".")) };
            let from = e
                .metadata
                .as_ref()
                .map(|m| match &m.source {
                    Some(src) => format!(" (from {} {src})", m.name),
                    None => format!(" (from {})", m.name),
                })
                .unwrap_or_default();
            format!("{key}{}{from}", e.kind)
        })
        .collect::<Vec<_>>()
        .join("; ")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn write(dir: &tempfile::TempDir, text: &str) -> std::path::PathBuf {
        let path = dir.path().join("idemgate.toml");
        std::fs::write(&path, text).unwrap();
        path
    }

    fn no_env() -> Env {
        Env::prefixed("IDEMGATE_UNIT_TEST_NOTHING_")
    }

    #[test]
    fn the_defaults_are_valid_and_embedded() {
        let s = Settings::load_from(None, no_env()).unwrap();
        assert!(s.database.url.starts_with("sqlite://"));
        assert_eq!(s.routes.len(), 3);
    }

    #[test]
    #[allow(clippy::result_large_err)] // figment::Jail's own error type
    fn a_file_overrides_defaults_and_the_environment_overrides_the_file() {
        let dir = tempfile::tempdir().unwrap();
        let path = write(
            &dir,
            r#"
            [database]
            url = "postgres://app@db/shop"
            [consumer]
            group = "stock_consumer"
            [[routes]]
            topic = "orders"
            biz_type = "order.create"
            biz_id = "json:/order_no"
            "#,
        );
        figment::Jail::expect_with(|jail| {
            jail.set_env("IDEMGATE_TEST_CONFIG_CONSUMER__GROUP", "from_env");
            jail.set_env("IDEMGATE_TEST_CONFIG_UNRELATED", "ignored");
            let s = Settings::load_from(Some(&path), Env::prefixed("IDEMGATE_TEST_CONFIG_")).unwrap();
            assert_eq!(s.database.url, "postgres://app@db/shop");
            assert_eq!(s.database.max_connections, 16, "unset keys keep their defaults");
            assert_eq!(s.consumer.group, "from_env");
            assert_eq!(s.routes.len(), 1);
            assert_eq!(s.routes[0].tags, "*");
            Ok(())
        });
    }

    #[test]
    fn a_bad_setting_is_refused_with_its_key_named() {
        let dir = tempfile::tempdir().unwrap();
        let cases = [
            ("[database]\nurl = \"oracle://x\"", "configuration key database.url"),
            ("[database]\nmax_connections = \"many\"", "key database.max_connections"),
            ("[database]\nurll = \"x\"", "key database.urll: unknown field: found `urll`"),
            ("[consumer]\ngroup = \"a b\"", "configuration key consumer.group: has a forbidden character"),
            ("[consumer]\nmax_reconsume_times = 99", "configuration key consumer.max_reconsume_times"),
            (
                "[[routes]]\ntopic = \"t\"\nbiz_type = \"x\"\nbiz_id = \"body\"",
                "configuration key routes[0].biz_id",
            ),
            ("[log]\nformat = \"xml\"", "key log.format"),
            ("[http]\nbind = \"localhost\"", "configuration key http.bind"),
            (
                "[http]\nallowed_hosts = [\"idemgate.example.com:8080\"]",
                "configuration key http.allowed_hosts: \"idemgate.example.com:8080\" has a port",
            ),
            (
                "[http]\nallowed_hosts = [\"https://idemgate.example.com\"]",
                "configuration key http.allowed_hosts: \"https://idemgate.example.com\" is not a host name",
            ),
            ("[http]\nallowed_hosts = [\"*.example.com\"]", "configuration key http.allowed_hosts"),
            ("[http]\nallowed_hosts = [\"\"]", "configuration key http.allowed_hosts"),
            ("[http]\nallowed_hosts = [\"two words\"]", "configuration key http.allowed_hosts"),
            ("[http]\nallowed_hosts = \"one.example\"", "key http.allowed_hosts"),
            ("[http]\ncsrf_token_ttl_seconds = 10", "configuration key http.csrf_token_ttl_seconds"),
            (
                "[broker]\nconsume_threads = 64",
                "configuration key database.max_connections: is 16, below broker.consume_threads (64)",
            ),
            ("[broker]\nstart_from = \"middle\"", "key broker.start_from"),
            (
                "[archive]\nschedule = \"0 3 * * *\"",
                "configuration key archive.schedule: \"0 3 * * *\" is not a valid schedule (it has 5 fields)",
            ),
            ("[archive]\nbatch_size = 0", "configuration key archive.batch_size"),
            ("[reconcile]\nwindow_hours = 0", "configuration key reconcile.window_hours"),
            ("[reconcile]\nschedule = \"often\"", "configuration key reconcile.schedule"),
            ("[redis]\nurl = \"localhost:6379\"", "configuration key redis.url: must start with redis://"),
            ("[redis]\nurl = \"redis://h\"\ntimeout_ms = 0", "configuration key redis.timeout_ms"),
            ("[redis]\nbiz_types = [\"<x>\"]", "configuration key redis.biz_types"),
            (
                "[redis]\nbiz_types = [\"stock.dedcut\"]",
                "configuration key redis.biz_types: \"stock.dedcut\" is the biz_type of no route; the routes carry",
            ),
            ("[dedup]\nshards = 1", "configuration key dedup.shards: is 1; use 0 (one table) or 2 to 100"),
            ("[dedup]\nshards = 101", "configuration key dedup.shards"),
            ("[dedup]\nshards = -1", "key dedup.shards"),
            (
                "[group_commit]\nmax_batch = 65",
                "configuration key group_commit.max_batch: is 65; use 1 to 64",
            ),
            ("[group_commit]\nmax_batch = 0", "configuration key group_commit.max_batch"),
            ("[group_commit]\nlinger_ms = 5000", "configuration key group_commit.linger_ms"),
            ("[group_commit]\nin_flight = 0", "configuration key group_commit.in_flight"),
            ("[group_commit]\nqueue = 0", "configuration key group_commit.queue"),
            ("[group_commit]\nbatch = 8", "key group_commit.batch: unknown field"),
            (
                "[group_commit]\nenabled = true\nin_flight = 8\n[database]\nmax_connections = 8",
                "configuration key database.max_connections: is 8, below twice group_commit.in_flight (16)",
            ),
            ("[broker]\nbuffered_messages = 0", "configuration key broker.buffered_messages"),
            ("[broker]\nbuffered_mib = 0", "configuration key broker.buffered_mib"),
            ("this is not toml", "configuration"),
        ];
        for (text, expected) in cases {
            let err = Settings::load_from(Some(&write(&dir, text)), no_env()).unwrap_err().to_string();
            assert!(err.contains(expected), "{text:?}: expected {expected:?} in {err:?}");
        }
        let missing =
            Settings::load_from(Some(Path::new("/nonexistent/idemgate.toml")), no_env()).unwrap_err();
        assert_eq!(missing.to_string(), "configuration file /nonexistent/idemgate.toml does not exist");
    }

    #[test]
    #[allow(clippy::result_large_err)] // figment::Jail's own error type
    fn allowed_hosts_come_from_a_list_in_the_file_or_one_variable() {
        let defaults = Settings::default().http;
        assert!(defaults.allowed_hosts.is_empty(), "localhost and IP addresses need no entry");
        assert_eq!(defaults.csrf_token_ttl_seconds, 3_600);
        assert!(!defaults.binds_every_address());
        let dir = tempfile::tempdir().unwrap();
        let file = "[http]\nbind = \"0.0.0.0:8080\"\nallowed_hosts = [\"idemgate.example.com\", \"10.0.0.5\", \"[::1]\"]";
        let s = Settings::load_from(Some(&write(&dir, file)), no_env()).unwrap();
        assert_eq!(s.http.allowed_hosts, ["idemgate.example.com", "10.0.0.5", "[::1]"]);
        assert!(s.http.binds_every_address());
        figment::Jail::expect_with(|jail| {
            jail.set_env(
                "IDEMGATE_HOSTS_TEST_HTTP__ALLOWED_HOSTS",
                r#"["gate.internal", "idemgate.example.com."]"#,
            );
            let s = Settings::load_from(None, Env::prefixed("IDEMGATE_HOSTS_TEST_")).unwrap();
            assert_eq!(s.http.allowed_hosts, ["gate.internal", "idemgate.example.com."]);
            Ok(())
        });
    }

    #[test]
    fn a_settings_dump_never_carries_a_secret() {
        let mut s = Settings::default();
        s.database.url = "postgres://app:hunter1@127.0.0.1/x?sslmode=disable&password=hunter2".to_owned();
        s.http.auth_token = "hunter3-0123456789".to_owned();
        s.http.basic_user = "ops".to_owned();
        s.http.basic_password = "hunter4".to_owned();
        s.redis.url = "redis://:hunter5@127.0.0.1:6379/0?password=hunter6".to_owned();
        let dump = format!("{s:?}");
        assert!(!dump.contains("hunter"), "{dump}");
        assert!(dump.contains("postgres://app:***@127.0.0.1/x?sslmode=disable&password=***"), "{dump}");
        assert!(dump.contains("redis://:***@127.0.0.1:6379/0?password=***"), "{dump}");
    }

    const SHIP: &str = r#"
        [[routes]]
        topic = "logistics"
        tags = "shipped"
        biz_type = "order.shipment"
        biz_id = "json:/shipment_no"
        handler = "order.ship"

        [[state_machines]]
        name = "order.ship"
        table = "shop_order"
        key_column = "order_no"
        state_column = "status"
        from = ["PAID"]
        to = "SHIPPED"
        row_key = "json:/order_no"
        "#;

    #[test]
    fn group_commit_needs_connections_for_its_groups_not_for_every_consume_thread() {
        let dir = tempfile::tempdir().unwrap();
        let text = "[group_commit]\nenabled = true\nmax_batch = 16\nlinger_ms = 5\n\
                    [broker]\nconsume_threads = 64\n[database]\nmax_connections = 8";
        let s = Settings::load_from(Some(&write(&dir, text)), no_env()).unwrap();
        let g = s.group_commit.group_settings().expect("on");
        assert_eq!((g.max_batch, g.linger, g.in_flight), (16, std::time::Duration::from_millis(5), 2));
        assert_eq!(Settings::default().group_commit.group_settings(), None, "off by default");
        let off = "[broker]\nconsume_threads = 64\n[database]\nmax_connections = 8";
        let err = Settings::load_from(Some(&write(&dir, off)), no_env()).unwrap_err().to_string();
        assert!(err.contains("below broker.consume_threads (64)"), "{err}");
    }

    #[test]
    fn a_configured_state_machine_is_a_handler_routes_can_name() {
        let dir = tempfile::tempdir().unwrap();
        let s = Settings::load_from(Some(&write(&dir, SHIP)), no_env()).unwrap();
        let m = &s.state_machines[0];
        assert_eq!((m.done.as_ref(), m.on_missing), (None, state_machine::OnMissing::Retry));
        let handlers = s.handlers().unwrap();
        let names: Vec<_> = handlers.names().collect();
        assert_eq!(names, ["order.create", "order.ship", "payment.confirm", "stock.deduct"]);
    }

    #[test]
    #[allow(clippy::result_large_err)] // figment::Jail's own error type
    fn state_machines_may_come_whole_from_one_variable() {
        figment::Jail::expect_with(|jail| {
            jail.set_env(
                "IDEMGATE_SM_TEST_STATE_MACHINES",
                r#"[{name="order.cancel", table="shop_order", key_column="order_no", state_column="status", from=["UNPAID", "PAID"], to="CANCELLED", on_missing="dead_letter"}]"#,
            );
            let s = Settings::load_from(None, Env::prefixed("IDEMGATE_SM_TEST_")).unwrap();
            assert_eq!(s.state_machines.len(), 1);
            assert_eq!(s.state_machines[0].from, ["UNPAID", "PAID"]);
            assert_eq!(s.state_machines[0].on_missing, state_machine::OnMissing::DeadLetter);
            Ok(())
        });
    }

    #[test]
    fn hostile_or_colliding_state_machines_and_routes_to_nothing_are_refused_with_their_key_named() {
        let dir = tempfile::tempdir().unwrap();
        let with = |from: &str, to: &str| SHIP.replace(from, to);
        let cases = [
            (
                with("table = \"shop_order\"", "table = \"x; drop\""),
                "configuration key state_machines[0].table: \"x; drop\" is not a plain SQL identifier",
            ),
            (
                with("key_column = \"order_no\"", "key_column = \"order_no; DELETE FROM shop_order\""),
                "configuration key state_machines[0].key_column: \"order_no; DELETE FROM shop_order\" is not a plain SQL identifier",
            ),
            (
                with("state_column = \"status\"", "state_column = \"status\\\" = 1 --\""),
                "configuration key state_machines[0].state_column: \"status\\\" = 1 --\" is not a plain SQL identifier",
            ),
            (
                with("row_key = \"json:/order_no\"", "set_time_column = \"shipped at\""),
                "configuration key state_machines[0].set_time_column: \"shipped at\" is not a plain SQL identifier",
            ),
            (
                with("name = \"order.ship\"", "name = \"payment.confirm\"")
                    .replace("handler = \"order.ship\"", "handler = \"payment.confirm\""),
                "configuration key state_machines[0].name: \"payment.confirm\" is the name of a built-in handler",
            ),
            (with("to = \"SHIPPED\"", "to = \"PAID\""), "configuration key state_machines[0].to:"),
            (
                with("from = [\"PAID\"]", "from = []"),
                "configuration key state_machines[0].from: names no state",
            ),
            (
                with("row_key = \"json:/order_no\"", "on_missing = \"explode\""),
                "key state_machines.0.on_missing: unknown variant: found `explode`",
            ),
            (with("row_key =", "tabel = \"t\"\nrow_key ="), "unknown field: found `tabel`"),
            (
                with("handler = \"order.ship\"", "handler = \"order.shipp\""),
                "configuration key routes[0].handler: no handler named \"order.shipp\" (a route without `handler` uses its biz_type); known handlers: order.create, order.ship, payment.confirm, stock.deduct",
            ),
            (
                with("handler = \"order.ship\"", ""),
                "configuration key routes[0].handler: no handler named \"order.shipment\"",
            ),
        ];
        for (text, expected) in cases {
            let err = Settings::load_from(Some(&write(&dir, &text)), no_env()).unwrap_err().to_string();
            assert!(err.contains(expected), "expected {expected:?} in {err:?}\n{text}");
        }
    }
}
