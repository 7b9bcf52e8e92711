//! The typed configuration, layered: built-in defaults, then a TOML file, then environment
//! variables. Every field names its environment variable; `Settings::load` validates the
//! whole and names the offending key when something is wrong.
//!
//! The defaults are the embedded ones: a SQLite file, and neither a consumer group nor routes,
//! which name a deployment's own business (`idemgate serve` refuses to start without them; the
//! demo brings the example shop's). This module owns reading and checking settings; it must
//! not open connections.

use std::path::Path;

use figment::Figment;
use figment::providers::{Env, Format, Serialized, Toml};
use serde::{Deserialize, Serialize};

use crate::archive::ArchiveSettings;
use crate::broker::{BrokerKind, BrokerSettings, Brokers, KafkaSettings, RabbitMqSettings, RocketMqSettings};
use crate::gate::{ConsumerSettings, GroupSettings, Identity, Policy};
use crate::handler::Handlers;
use crate::http::settings::HttpSettings;
use crate::layout::DedupSettings;
use crate::prefilter::RedisSettings;
use crate::reconcile::ReconcileSettings;
use crate::route::{RouteConfig, Routes};
use crate::setting::Invalid;
use crate::sql_handler::{self, SqlHandlerConfig};
use crate::state_machine::{self, StateMachineConfig};
use crate::store::{DatabaseSettings, StoreOptions};
use crate::telemetry::LogSettings;

/// How much longer than a delivery may last a gate transaction may sit idle before the server
/// ends its session ([`Settings::gate_store_options`]).
const IDLE_TRANSACTION_MARGIN: std::time::Duration = std::time::Duration::from_secs(1);

/// All of idemgate's settings.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Settings {
    pub database: DatabaseSettings,
    pub consumer: ConsumerSettings,
    /// Which business key each topic/tag carries: the file's `[[routes]]` tables. None by
    /// default; the service needs at least one.
    pub routes: Vec<RouteConfig>,
    /// `[broker]`: which broker (`kind`) and what every broker shares ([`BrokerSettings`]).
    pub broker: BrokerSettings,
    /// `[rocketmq]`: the RocketMQ consumer's settings, read with `broker.kind = "rocketmq"`
    /// (the default) ([`RocketMqSettings`]).
    pub rocketmq: RocketMqSettings,
    /// `[rabbitmq]`: the RabbitMQ consumer's settings, read with `broker.kind = "rabbitmq"`
    /// ([`RabbitMqSettings`]).
    pub rabbitmq: RabbitMqSettings,
    /// `[kafka]`: the Kafka consumer's settings, read with `broker.kind = "kafka"`
    /// ([`KafkaSettings`]).
    pub kafka: KafkaSettings,
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
    /// `[group_commit]`: many deliveries per transaction ([`GroupSettings`]).
    pub group_commit: GroupSettings,
    /// `[[state_machines]]`: handlers made from configuration, each a conditional state move
    /// that routes name as their handler; each field is described on [`StateMachineConfig`].
    /// `IDEMGATE_STATE_MACHINES` replaces the whole array with inline tables. None by default.
    pub state_machines: Vec<StateMachineConfig>,
    /// `[[sql_handlers]]`: handlers made of SQL statements that routes name as their handler;
    /// each field is described on [`SqlHandlerConfig`]. `IDEMGATE_SQL_HANDLERS` replaces the
    /// whole array with inline tables. None by default.
    pub sql_handlers: Vec<SqlHandlerConfig>,
    /// What the loaded file and variables said in words that are no longer current, each
    /// naming the key to use instead: the service logs each as a warning at start.
    #[serde(skip)]
    pub deprecated: Vec<String>,
}

/// A setting is missing, malformed or inconsistent.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error("configuration file {0} does not exist")]
    MissingFile(String),
    #[error("configuration: {0}")]
    Parse(String),
    /// A key's value is refused, with the key named.
    #[error(transparent)]
    Invalid(#[from] Invalid),
}

fn invalid(key: &str, message: impl Into<String>) -> ConfigError {
    crate::setting::invalid(key, message).into()
}

impl Settings {
    /// Defaults, then `file` (if given; it must exist), then `IDEMGATE_SECTION__KEY` variables.
    pub fn load(file: Option<&Path>) -> Result<Self, ConfigError> {
        Self::load_from(file, Env::prefixed("IDEMGATE_"))
    }

    pub(crate) fn load_from(file: Option<&Path>, env: Env) -> Result<Self, ConfigError> {
        // What the file and the variables give, without the defaults: which keys were set.
        let mut given = Figment::new();
        if let Some(path) = file {
            if !path.is_file() {
                return Err(ConfigError::MissingFile(path.display().to_string()));
            }
            given = given.merge(Toml::file_exact(path));
        }
        // Only SECTION__KEY variables are settings, and the arrays of tables that can come whole
        // from one variable; others with the prefix (IDEMGATE_CONFIG, the tests' own) are not.
        given = given.merge(
            env.filter(|k| k.as_str().contains("__") || k == "state_machines" || k == "sql_handlers")
                .split("__"),
        );
        let mut figment = Figment::from(Serialized::defaults(Settings::default())).merge(given.clone());
        // RocketMQ's keys that `[broker]` once held are read as `[rocketmq]`'s, each warned of.
        let mut deprecated = Vec::new();
        for (old, new) in crate::broker::moved_keys(|key| given.contains(key)) {
            if given.contains(&new) {
                return Err(invalid(
                    &old,
                    format!("is set beside {new}: it is {new}'s old name; keep {new} alone"),
                ));
            }
            let value = given.find_value(&old).map_err(|e| ConfigError::Parse(describe(&e)))?;
            figment = figment.merge(Serialized::default(&new, value));
            deprecated.push(format!(
                "{old} is deprecated: it is {new} now (IDEMGATE_{}), and was read as that",
                new.to_uppercase().replace('.', "__")
            ));
        }
        let mut settings: Settings = figment.extract().map_err(|e| ConfigError::Parse(describe(&e)))?;
        settings.deprecated = deprecated;
        settings.validate()?;
        Ok(settings)
    }

    /// Checks what types alone cannot: every setting that is given. What only the service
    /// needs (a consumer group, routes) is [`Settings::validate_service`]'s.
    pub fn validate(&self) -> Result<(), ConfigError> {
        self.handlers()?;
        self.database.validate()?;
        self.consumer.validate()?;
        self.broker.validate()?;
        self.rocketmq.validate()?;
        self.rabbitmq.validate()?;
        self.kafka.validate()?;
        self.check_broker_limits()?;
        let b = &self.broker;
        let g = &self.group_commit;
        g.validate()?;
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
        self.http.validate()?;
        let routes = Routes::new(&self.routes)?;
        if self.broker.kind == BrokerKind::Kafka {
            for (topic, _) in routes.topics() {
                crate::broker::kafka::check_topic(&topic).map_err(|why| {
                    invalid("routes", format!("the topic {topic:?} {why} (a Kafka topic name)"))
                })?;
            }
        }
        self.archive.validate()?;
        self.reconcile.validate()?;
        self.redis.validate()?;
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
        self.dedup.validate()?;
        self.check_delivery_budget()?;
        Ok(())
    }

    /// [`Settings::validate`], and what the service needs besides: a consumer group and at
    /// least one route. That each route names a known handler is the gate's to check
    /// ([`crate::Gate::new`]), when the service is assembled with its handlers.
    pub fn validate_service(&self) -> Result<(), ConfigError> {
        self.validate()?;
        self.require_group()?;
        if self.routes.is_empty() {
            return Err(invalid(
                "routes",
                "no [[routes]] entry is configured: the service consumes nothing without one; add a \
                 [[routes]] table per topic and tag (topic, tags, biz_type, biz_id), see docs/configuration.md",
            ));
        }
        Ok(())
    }

    /// The consumer's retry budget and deadline, held to what the chosen broker allows.
    fn check_broker_limits(&self) -> Result<(), ConfigError> {
        let limits = self.brokers().limits();
        let broker = limits.kind.as_str();
        if self.consumer.max_reconsume_times > limits.max_reconsume_times {
            return Err(invalid(
                "consumer.max_reconsume_times",
                format!(
                    "is {}; {broker} allows 0 to {}",
                    self.consumer.max_reconsume_times, limits.max_reconsume_times
                ),
            ));
        }
        let longest = crate::gate::longest_delivery_timeout(limits.answer_within).as_millis();
        if u128::from(self.consumer.delivery_timeout_ms) > longest {
            return Err(invalid(
                "consumer.delivery_timeout_ms",
                format!(
                    "is {}; {broker} allows 1000 to {longest} (a delivery is answered within {} s, its log row's grace included)",
                    self.consumer.delivery_timeout_ms,
                    limits.answer_within.as_secs()
                ),
            ));
        }
        Ok(())
    }

    /// Every broker's settings, and the one `broker.kind` picks.
    pub fn brokers(&self) -> Brokers {
        Brokers {
            broker: self.broker.clone(),
            rocketmq: self.rocketmq.clone(),
            rabbitmq: self.rabbitmq.clone(),
            kafka: self.kafka.clone(),
        }
    }

    /// Fails unless `consumer.group` is set: the service, replay and the reconciler work for
    /// one consumer group, and there is no default.
    pub fn require_group(&self) -> Result<(), ConfigError> {
        if self.consumer.group.is_empty() {
            return Err(invalid(
                "consumer.group",
                "is not set: name the consumer group whose deliveries this is (IDEMGATE_CONSUMER__GROUP)",
            ));
        }
        Ok(())
    }

    /// The longest a delivery can wait on the configured bounds, term by term: a connection once,
    /// every retried attempt's lock wait to its bound and the pauses between them, the last
    /// attempt's statement to its bound, Redis (asked and settled), and with group commit the
    /// linger and the group's own try before it splits. The deadline
    /// (`consumer.delivery_timeout_ms`) holds whatever else happens; these are what it must not
    /// cut short.
    pub fn delivery_budget(&self) -> Vec<(String, std::time::Duration)> {
        let db = &self.database;
        let policy = self.policy();
        let lock = db.lock_timeout();
        let retries = policy.transient_retries;
        let mut terms = vec![
            (format!("database.acquire_timeout_ms ({})", db.acquire_timeout_ms), db.acquire_timeout()),
            (
                format!(
                    "consumer.transient_retries ({retries}) × database.lock_timeout_ms ({})",
                    lock.as_millis()
                ),
                lock * retries,
            ),
            (
                format!(
                    "the pauses before those retries (at most {} ms)",
                    policy.longest_retry_pauses().as_millis()
                ),
                policy.longest_retry_pauses(),
            ),
            (format!("database.statement_timeout_ms ({})", db.statement_timeout_ms), db.statement_timeout()),
        ];
        if self.redis.enabled() {
            let redis = std::time::Duration::from_millis(self.redis.timeout_ms);
            terms.push((format!("2 × redis.timeout_ms ({})", self.redis.timeout_ms), redis * 2));
        }
        let g = &self.group_commit;
        if g.enabled {
            terms.push((format!("group_commit.linger_ms ({})", g.linger_ms), g.linger()));
            terms.push((
                format!("the group's own try, database.statement_timeout_ms ({})", db.statement_timeout_ms),
                db.statement_timeout(),
            ));
        }
        terms
    }

    /// Refuses bounds that add up past `consumer.delivery_timeout_ms`: a delivery that waited
    /// on each would run out of time before its retries are done.
    fn check_delivery_budget(&self) -> Result<(), ConfigError> {
        let terms = self.delivery_budget();
        let total: std::time::Duration = terms.iter().map(|(_, d)| *d).sum();
        let timeout = self.consumer.delivery_timeout();
        if total <= timeout {
            return Ok(());
        }
        let sum = terms.iter().map(|(what, _)| what.as_str()).collect::<Vec<_>>().join(" + ");
        Err(invalid(
            "consumer.delivery_timeout_ms",
            format!(
                "is {}, below the longest a delivery can wait on the configured bounds, {} ms: {sum}; \
                 lower those, or raise consumer.delivery_timeout_ms (at most {})",
                timeout.as_millis(),
                total.as_millis(),
                crate::gate::longest_delivery_timeout(self.brokers().limits().answer_within).as_millis()
            ),
        ))
    }

    /// The configured `[[state_machines]]` and `[[sql_handlers]]`. A name taken twice is
    /// refused, with its key named.
    pub fn handlers(&self) -> Result<Handlers, ConfigError> {
        self.handlers_with(Handlers::new())
    }

    /// `own` (the handlers of a program that embeds the service), then the configured ones. A
    /// configured name that is taken already (one of `own`, a state machine's) is refused,
    /// with its key named.
    pub fn handlers_with(&self, own: Handlers) -> Result<Handlers, ConfigError> {
        let mut handlers = own;
        let configured = state_machine::handlers(&self.state_machines)?;
        for (i, machine) in self.state_machines.iter().enumerate() {
            if handlers.get(&machine.name).is_some() {
                return Err(invalid(
                    &format!("state_machines[{i}].name"),
                    format!("{:?} is the name of a handler the program brings; choose another", machine.name),
                ));
            }
        }
        handlers.extend(configured);
        let sql = sql_handler::handlers(&self.sql_handlers, &handlers)?;
        handlers.extend(sql);
        Ok(handlers)
    }

    pub fn routes(&self) -> Routes {
        Routes::new(&self.routes).expect("validated by Settings::load")
    }

    /// The pool of the service's own work: migrations, the schedulers, replay, the commands.
    pub fn store_options(&self) -> StoreOptions {
        self.database.store_options()
    }

    /// The gate's pool: its lock waits and statements bounded (`database.lock_timeout_ms`,
    /// `database.statement_timeout_ms`), and a transaction left idle longer than a delivery may
    /// last (`consumer.delivery_timeout_ms`, plus a second) ended by the server: the delivery
    /// that opened it has given up, so its client is gone or cut off by the network, and its
    /// locks would otherwise hold other instances' claims until the socket dies.
    pub(crate) fn gate_store_options(&self) -> StoreOptions {
        StoreOptions {
            idle_in_transaction_timeout: Some(self.consumer.delivery_timeout() + IDLE_TRANSACTION_MARGIN),
            ..self.database.gate_store_options()
        }
    }

    /// The web UI's own pool: `http.max_connections`, and every statement bounded by
    /// `http.query_timeout_ms` on the server as well.
    pub(crate) fn ui_store_options(&self) -> StoreOptions {
        let timeout = std::time::Duration::from_millis(self.http.query_timeout_ms);
        StoreOptions {
            max_connections: self.http.max_connections,
            acquire_timeout: timeout,
            statement_timeout: Some(timeout),
            lock_timeout: None,
            idle_in_transaction_timeout: None,
        }
    }

    pub fn identity(&self) -> Identity {
        self.consumer.identity()
    }

    pub fn policy(&self) -> Policy {
        self.consumer.policy()
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
    fn the_defaults_are_valid_and_embedded_and_name_no_business() {
        let s = Settings::load_from(None, no_env()).unwrap();
        assert!(s.database.url.starts_with("sqlite://"));
        assert!(s.routes.is_empty() && s.consumer.group.is_empty());
    }

    #[test]
    fn the_service_needs_a_group_and_routes() {
        let mut s = Settings::default();
        let err = s.validate_service().unwrap_err().to_string();
        assert!(err.contains("consumer.group: is not set"), "{err}");
        s.consumer.group = "wallet_consumer".to_owned();
        let err = s.validate_service().unwrap_err().to_string();
        assert!(err.contains("no [[routes]] entry is configured"), "{err}");
        s.routes = vec![RouteConfig {
            topic: "wallet".to_owned(),
            tags: "*".to_owned(),
            biz_type: "wallet.debit".to_owned(),
            biz_id: "keys".to_owned(),
            execute_time: None,
            handler: None,
        }];
        s.validate_service().unwrap();
    }

    #[test]
    fn the_retry_budget_and_the_deadline_are_the_chosen_broker_s() {
        let mut s = Settings::default();
        s.consumer.delivery_timeout_ms = 60_000;
        s.consumer.max_reconsume_times = 100;
        let err = s.validate().unwrap_err().to_string();
        assert!(err.contains("consumer.max_reconsume_times: is 100; rocketmq allows 0 to 32"), "{err}");
        s.broker.kind = BrokerKind::RabbitMq;
        s.validate().expect("RabbitMQ counts 100 retries and waits a minute for an answer");
        s.broker.kind = BrokerKind::Kafka;
        let err = s.validate().unwrap_err().to_string();
        assert!(err.contains("consumer.delivery_timeout_ms: is 60000; kafka allows 1000 to 25000"), "{err}");
    }

    #[test]
    #[allow(clippy::result_large_err)] // figment::Jail's own error type
    fn rocketmq_s_old_keys_in_broker_are_read_as_rocketmq_s_and_each_is_warned_of() {
        let dir = tempfile::tempdir().unwrap();
        let path = write(&dir, "[broker]\nname_server = \"ns1:9876\"\nconsume_threads = 4\n");
        figment::Jail::expect_with(|jail| {
            jail.set_env("IDEMGATE_MOVED_TEST_BROKER__PRODUCER_GROUP", "old_producers");
            let s = Settings::load_from(Some(&path), Env::prefixed("IDEMGATE_MOVED_TEST_")).unwrap();
            assert_eq!(s.rocketmq.name_server, "ns1:9876");
            assert_eq!(s.rocketmq.producer_group, "old_producers");
            assert_eq!(s.broker.consume_threads, 4, "a shared key stays where it is");
            assert_eq!(s.deprecated.len(), 2, "{:?}", s.deprecated);
            assert!(
                s.deprecated.iter().any(|d| d
                    == "broker.name_server is deprecated: it is rocketmq.name_server now (IDEMGATE_ROCKETMQ__NAME_SERVER), and was read as that"),
                "{:?}",
                s.deprecated
            );
            let current = Settings::load_from(None, Env::prefixed("IDEMGATE_MOVED_TEST_NONE_")).unwrap();
            assert!(current.deprecated.is_empty());
            Ok(())
        });
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
            ("[group_commit]\nbatch_size = 8", "key group_commit.batch_size: unknown field"),
            ("[group_commit]\nbatch = 8", "key group_commit.batch: invalid type"),
            (
                "[group_commit]\nenabled = true\nin_flight = 8\n[database]\nmax_connections = 8",
                "configuration key database.max_connections: is 8, below twice group_commit.in_flight (16)",
            ),
            ("[rocketmq]\nbuffered_messages = 0", "configuration key rocketmq.buffered_messages"),
            ("[broker]\nbuffered_mib = 0", "configuration key rocketmq.buffered_mib"),
            (
                "[broker]\nname_server = \"a:1\"\n[rocketmq]\nname_server = \"b:2\"",
                "configuration key broker.name_server: is set beside rocketmq.name_server",
            ),
            ("[broker]\nprefetch = 8", "configuration key broker.prefetch: is not a setting of [broker]"),
            (
                "[broker]\nstall_seconds = 5",
                "configuration key broker.stall_seconds: must be 0 (off) or between 30",
            ),
            ("[broker]\nlag_interval_seconds = 3601", "configuration key broker.lag_interval_seconds"),
            ("[broker]\nkind = \"nats\"", "unknown broker kind \"nats\""),
            ("[rabbitmq]\nprefetch = 0", "configuration key rabbitmq.prefetch"),
            ("[rabbitmq]\nurl = \"http://mq\"", "configuration key rabbitmq.url"),
            ("[rabbitmq]\nexchange = \"x\"", "key rabbitmq.exchange: unknown field"),
            ("[kafka]\nmax_poll_records = 0", "configuration key kafka.max_poll_records"),
            ("[kafka]\nretry_topic = \"a b\"", "configuration key kafka.retry_topic"),
            (
                "[broker]\nkind = \"kafka\"\n[[routes]]\ntopic = \"shop orders\"\nbiz_type = \"t\"\nbiz_id = \"keys\"",
                "the topic \"shop orders\" may hold only",
            ),
            (
                "[consumer]\ntransient_retries = 11",
                "configuration key consumer.transient_retries: is 11; use 0 to 10",
            ),
            ("[consumer]\ntransient_retries = -1", "key consumer.transient_retries"),
            (
                "[consumer]\ndelivery_timeout_ms = 30000",
                "configuration key consumer.delivery_timeout_ms: is 30000; rocketmq allows 1000 to 25000",
            ),
            ("[consumer]\ndelivery_timeout_ms = 999", "configuration key consumer.delivery_timeout_ms"),
            (
                "[database]\nlock_timeout_ms = 0",
                "configuration key database.lock_timeout_ms: is 0; use 1 to 20000",
            ),
            (
                "[database]\nstatement_timeout_ms = 20001",
                "configuration key database.statement_timeout_ms: is 20001; use 1 to 20000",
            ),
            (
                "[database]\nlock_timeout_ms = 4000\nstatement_timeout_ms = 3500",
                "configuration key database.lock_timeout_ms: is 4000 ms on this backend, above database.statement_timeout_ms (3500)",
            ),
            (
                "[database]\nurl = \"mysql://root@db/shop\"\nlock_timeout_ms = 2500\nstatement_timeout_ms = 2800",
                "configuration key database.lock_timeout_ms: is 3000 ms on this backend, above database.statement_timeout_ms (2800)",
            ),
            (
                "[consumer]\ntransient_retries = 10",
                "configuration key consumer.delivery_timeout_ms: is 25000, below the longest a delivery can wait on \
                 the configured bounds, 37270 ms: database.acquire_timeout_ms (10000) + consumer.transient_retries (10) \
                 × database.lock_timeout_ms (2000) + the pauses before those retries (at most 4270 ms) + \
                 database.statement_timeout_ms (3000); lower those, or raise consumer.delivery_timeout_ms (at most 25000)",
            ),
            (
                "[consumer]\ndelivery_timeout_ms = 10000",
                "configuration key consumer.delivery_timeout_ms: is 10000, below the longest a delivery can wait on \
                 the configured bounds, 19070 ms",
            ),
            (
                "[group_commit]\nenabled = true\n[database]\nacquire_timeout_ms = 15000",
                "+ group_commit.linger_ms (2) + the group's own try, database.statement_timeout_ms (3000); lower those",
            ),
            (
                "[redis]\nurl = \"redis://h\"\ntimeout_ms = 1000\n[database]\nacquire_timeout_ms = 15000",
                "+ 2 × redis.timeout_ms (1000); lower those",
            ),
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
    fn the_gate_bounds_its_waits_within_the_delivery_timeout_by_default_and_as_configured() {
        let s = Settings::default();
        let total = |s: &Settings| s.delivery_budget().iter().map(|(_, d)| *d).sum::<std::time::Duration>();
        assert_eq!(total(&s).as_millis(), 10_000 + 3 * 2_000 + 70 + 3_000);
        assert!(total(&s) <= s.consumer.delivery_timeout());
        let grouped = Settings { group_commit: GroupSettings::on(), ..Settings::default() };
        assert!(
            total(&grouped) <= grouped.consumer.delivery_timeout(),
            "the defaults hold with group commit on"
        );
        let options = s.gate_store_options();
        assert_eq!(
            (options.lock_timeout, options.statement_timeout),
            (Some(std::time::Duration::from_secs(2)), Some(std::time::Duration::from_secs(3)))
        );
        assert_eq!((s.store_options().lock_timeout, s.store_options().statement_timeout), (None, None));
        figment::Jail::expect_with(|jail| {
            jail.set_env("IDEMGATE_BOUNDS_TEST_DATABASE__LOCK_TIMEOUT_MS", "500");
            jail.set_env("IDEMGATE_BOUNDS_TEST_DATABASE__STATEMENT_TIMEOUT_MS", "1500");
            jail.set_env("IDEMGATE_BOUNDS_TEST_CONSUMER__TRANSIENT_RETRIES", "10");
            jail.set_env("IDEMGATE_BOUNDS_TEST_CONSUMER__DELIVERY_TIMEOUT_MS", "21000");
            let s = Settings::load_from(None, Env::prefixed("IDEMGATE_BOUNDS_TEST_")).unwrap();
            assert_eq!((s.database.lock_timeout_ms, s.database.statement_timeout_ms), (500, 1_500));
            assert_eq!(s.policy().transient_retries, 10);
            assert_eq!(s.policy().delivery_timeout, std::time::Duration::from_secs(21));
            Ok(())
        });
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
        [consumer]
        group = "logistics_consumer"

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
        let g = &s.group_commit;
        assert_eq!(
            (g.enabled, g.max_batch, g.linger(), g.in_flight),
            (true, 16, std::time::Duration::from_millis(5), 2)
        );
        assert!(!Settings::default().group_commit.enabled, "off by default");
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
        let names: Vec<_> = s.handlers().unwrap().names().map(str::to_owned).collect();
        assert_eq!(names, ["order.ship"], "the configured ones only");
        let handlers = s
            .handlers_with(crate::handler::doing_nothing(&[
                "order.create",
                "payment.confirm",
                "stock.deduct",
            ]))
            .unwrap();
        let names: Vec<_> = handlers.names().collect();
        assert_eq!(names, ["order.create", "order.ship", "payment.confirm", "stock.deduct"]);
        s.validate_service().unwrap();
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
    #[allow(clippy::result_large_err)] // figment::Jail's own error type
    fn sql_handlers_come_from_the_file_or_whole_from_one_variable() {
        let dir = tempfile::tempdir().unwrap();
        let file = r#"
            [[routes]]
            topic = "wallet"
            biz_type = "wallet.credit"
            biz_id = "keys"

            [[sql_handlers]]
            name = "wallet.credit"
            statements = [
              { sql = "UPDATE wallet SET balance_cents = balance_cents + :cents WHERE user_id = :user", expect = "one", on_zero = "retry" },
              { sql = "INSERT INTO wallet_ledger (credit_id, user_id, cents) VALUES (:biz_id, :user, :cents)", expect = "one" },
            ]
            params = { cents = "json:/cents:int", user = "json:/user_id" }
            business_unique = ["wallet_ledger(credit_id)"]
            "#;
        let s = Settings::load_from(Some(&write(&dir, file)), no_env()).unwrap();
        assert_eq!(s.sql_handlers[0].statements.len(), 2);
        assert_eq!(s.sql_handlers[0].business_unique, ["wallet_ledger(credit_id)"]);
        assert_eq!(s.sql_handlers[0].statements[1].on_zero, crate::sql_handler::OnZero::Retry, "the default");
        assert!(s.handlers().unwrap().get("wallet.credit").is_some());
        let bad = file.replace("expect = \"one\" }", "expect = \"two\" }");
        let err = Settings::load_from(Some(&write(&dir, &bad)), no_env()).unwrap_err().to_string();
        assert!(
            err.contains("key sql_handlers.0.statements.1.expect: unknown variant: found `two`"),
            "{err}"
        );
        figment::Jail::expect_with(|jail| {
            jail.set_env(
                "IDEMGATE_SQL_TEST_SQL_HANDLERS",
                r#"[{name="coupon.redeem", statements=[{sql="UPDATE coupon SET state = 'USED' WHERE code = :biz_id AND state = 'NEW'", expect="one", on_zero="duplicate"}], business_unique=["coupon_pkey"]}]"#,
            );
            let s = Settings::load_from(None, Env::prefixed("IDEMGATE_SQL_TEST_")).unwrap();
            assert_eq!(s.sql_handlers.len(), 1);
            assert_eq!(s.sql_handlers[0].business_unique, ["coupon_pkey"]);
            assert_eq!(s.sql_handlers[0].statements[0].on_zero, crate::sql_handler::OnZero::Duplicate);
            Ok(())
        });
    }

    #[test]
    fn hostile_or_colliding_state_machines_are_refused_with_their_key_named() {
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
        ];
        for (text, expected) in cases {
            let err = Settings::load_from(Some(&write(&dir, &text)), no_env()).unwrap_err().to_string();
            assert!(err.contains(expected), "expected {expected:?} in {err:?}\n{text}");
        }
        // What the program brings is known only where the service is assembled: a name taken
        // twice is refused there (and a route to no handler by the gate, `app`'s tests).
        let taken = with("name = \"order.ship\"", "name = \"payment.confirm\"")
            .replace("handler = \"order.ship\"", "handler = \"payment.confirm\"");
        let s = Settings::load_from(Some(&write(&dir, &taken)), no_env()).unwrap();
        let err = s
            .handlers_with(crate::handler::doing_nothing(&[
                "order.create",
                "payment.confirm",
                "stock.deduct",
            ]))
            .unwrap_err()
            .to_string();
        assert!(
            err.contains(
                "state_machines[0].name: \"payment.confirm\" is the name of a handler the program brings"
            ),
            "{err}"
        );
    }
}
