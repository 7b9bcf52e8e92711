//! How every client idemgate opens reaches the cluster: the name server, the account that signs
//! its requests (RocketMQ's ACL: an access key and its secret, through the client's
//! `AclClientRPCHook`), the namespace its topics and groups live in, and whether its
//! consumption is recorded in the trace topic.
//!
//! One [`BrokerAccess`], made from `[broker]`, serves the push consumer, the lag reader's admin
//! and pull clients, replay's producer and `produce`, so that none of them reaches the cluster
//! differently. The secret leaves this module only into the signing hook: `Debug` masks it and
//! no message built here quotes it.

use std::sync::Arc;

use cheetah_string::CheetahString;
use rocketmq_client_rust::{AclClientRPCHook, ClientConfig, SessionCredentials};

use super::settings::{RocketMqSettings, SecretKey};
use crate::setting::Invalid;

/// What a client needs to reach the cluster. Cheap to clone.
#[derive(Clone, PartialEq)]
pub struct BrokerAccess {
    name_server: String,
    /// The access key and its secret, when requests are signed.
    account: Option<(String, SecretKey)>,
    namespace: Option<String>,
    /// The trace topic, when consumption is traced.
    trace_topic: Option<String>,
    /// How often each client heartbeats the brokers, in milliseconds.
    heartbeat_interval_ms: u32,
}

impl std::fmt::Debug for BrokerAccess {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("BrokerAccess")
            .field("name_server", &self.name_server)
            .field("access_key", &self.access_key())
            .field("secret_key", &self.account.as_ref().map(|(_, secret)| secret))
            .field("namespace", &self.namespace)
            .field("trace_topic", &self.trace_topic)
            .field("heartbeat_interval_ms", &self.heartbeat_interval_ms)
            .finish()
    }
}

impl BrokerAccess {
    /// The access `[broker]` describes; its secret read from `rocketmq.secret_key_file` when
    /// given there.
    pub fn of(settings: &RocketMqSettings) -> Result<Self, Invalid> {
        let account = settings.secret()?.map(|secret| (settings.access_key.clone(), secret));
        Ok(Self {
            name_server: settings.name_server.clone(),
            account,
            namespace: (!settings.namespace.is_empty()).then(|| settings.namespace.clone()),
            trace_topic: settings.message_trace.then(|| settings.trace_topic.clone()),
            heartbeat_interval_ms: settings.heartbeat_interval_seconds.saturating_mul(1_000),
        })
    }

    /// An open cluster through `name_server`: no account, no namespace, no trace.
    pub fn open(name_server: &str) -> Self {
        Self {
            name_server: name_server.to_owned(),
            account: None,
            namespace: None,
            trace_topic: None,
            heartbeat_interval_ms: RocketMqSettings::default().heartbeat_interval_seconds * 1_000,
        }
    }

    /// The same access signed as `access_key` with `secret`.
    pub fn with_account(mut self, access_key: &str, secret: &str) -> Self {
        self.account = Some((access_key.to_owned(), SecretKey::new(secret)));
        self
    }

    /// The same access in `namespace`.
    pub fn with_namespace(mut self, namespace: &str) -> Self {
        self.namespace = (!namespace.is_empty()).then(|| namespace.to_owned());
        self
    }

    pub fn name_server(&self) -> &str {
        &self.name_server
    }

    /// The account requests are signed as, if any.
    pub fn access_key(&self) -> Option<&str> {
        self.account.as_ref().map(|(key, _)| key.as_str())
    }

    pub fn namespace(&self) -> Option<&str> {
        self.namespace.as_deref()
    }

    /// Who reaches the cluster and how, for messages: the name server and the account, never
    /// the secret.
    pub fn describe(&self) -> String {
        match self.access_key() {
            Some(key) => format!("name server {} as access key {key:?}", self.name_server),
            None => format!("name server {} without credentials", self.name_server),
        }
    }

    /// `name` (a topic or a group) as the broker sees it: `<namespace>%<name>` in a namespace.
    pub fn resource(&self, name: &str) -> String {
        self.client_config().with_namespace(name).to_string()
    }

    /// The client configuration every client starts from: the name server, the heartbeat
    /// interval, the namespace, and the trace topic when consumption is traced.
    pub(crate) fn client_config(&self) -> ClientConfig {
        let mut config = ClientConfig::default();
        config.set_namesrv_addr(CheetahString::from_string(self.name_server.clone()));
        config.set_heartbeat_broker_interval(self.heartbeat_interval_ms);
        if let Some(namespace) = &self.namespace {
            config.set_namespace(CheetahString::from_string(namespace.clone()));
        }
        if let Some(topic) = &self.trace_topic {
            config.set_enable_trace(true);
            config.set_trace_topic(CheetahString::from_string(topic.clone()));
        }
        config
    }

    /// The hook that signs every request with the account, if there is one.
    pub fn rpc_hook(&self) -> Option<Arc<AclClientRPCHook>> {
        self.account.as_ref().map(|(key, secret)| {
            Arc::new(AclClientRPCHook::new(SessionCredentials::with_keys(key.as_str(), secret.expose())))
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn settings(edit: impl FnOnce(&mut RocketMqSettings)) -> RocketMqSettings {
        let mut s = RocketMqSettings::default();
        edit(&mut s);
        s
    }

    #[test]
    fn the_secret_is_masked_wherever_the_access_is_shown() {
        let access = BrokerAccess::of(&settings(|s| {
            s.access_key = "idemgate".to_owned();
            s.secret_key = SecretKey::new("s3cr3t-value");
        }))
        .unwrap();
        let shown = format!(
            "{access:?} {} {:?}",
            access.describe(),
            settings(|s| s.secret_key = SecretKey::new("s3cr3t-value"))
        );
        assert!(!shown.contains("s3cr3t-value"), "{shown}");
        assert!(shown.contains("idemgate") && shown.contains("***"), "{shown}");
        let redacted = settings(|s| s.secret_key = SecretKey::new("s3cr3t-value")).redacted();
        assert_eq!(redacted.secret_key, SecretKey::new("***"));
    }

    #[test]
    fn every_client_heartbeats_as_often_as_the_setting_says_within_the_clients_bounds() {
        let access = BrokerAccess::of(&settings(|s| s.heartbeat_interval_seconds = 10)).unwrap();
        assert_eq!(access.client_config().get_heartbeat_broker_interval(), 10_000);
        let default = BrokerAccess::open("127.0.0.1:9876").client_config().get_heartbeat_broker_interval();
        assert_eq!(default, 30_000);
        for outside in [0, 9, 601] {
            let e = settings(|s| s.heartbeat_interval_seconds = outside).validate().unwrap_err();
            assert_eq!(e.key, "rocketmq.heartbeat_interval_seconds", "{e}");
        }
    }

    #[test]
    fn the_account_and_its_secret_come_together_or_not_at_all() {
        let refused = |edit: fn(&mut RocketMqSettings)| settings(edit).validate().unwrap_err();
        let e = refused(|s| s.secret_key = SecretKey::new("x"));
        assert_eq!(e.key, "rocketmq.secret_key", "{e}");
        let e = refused(|s| s.secret_key_file = "/etc/idemgate/secret".to_owned());
        assert_eq!(e.key, "rocketmq.secret_key_file", "{e}");
        let e = refused(|s| s.access_key = "idemgate".to_owned());
        assert_eq!(e.key, "rocketmq.secret_key", "{e}");
        assert!(e.message.contains("secret_key_file"), "{e}");
        let e = refused(|s| {
            s.access_key = "idemgate".to_owned();
            s.secret_key = SecretKey::new("x");
            s.secret_key_file = "/etc/idemgate/secret".to_owned();
        });
        assert_eq!(e.key, "rocketmq.secret_key_file", "{e}");
        let none = settings(|_| {});
        assert_eq!(none.validate(), Ok(()));
        assert_eq!(BrokerAccess::of(&none).unwrap().access_key(), None);
        assert!(BrokerAccess::of(&none).unwrap().rpc_hook().is_none());
    }

    #[test]
    fn the_secret_is_read_from_its_file_and_a_file_that_cannot_be_read_is_named() {
        let dir = std::env::temp_dir().join(format!("idemgate-secret-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let file = dir.join("secret");
        std::fs::write(&file, "from-the-file\n").unwrap();
        let with_file = |path: &std::path::Path| {
            settings(|s| {
                s.access_key = "idemgate".to_owned();
                s.secret_key_file = path.display().to_string();
            })
        };
        let access = BrokerAccess::of(&with_file(&file)).unwrap();
        assert_eq!(access.account.as_ref().map(|(_, s)| s.expose()), Some("from-the-file"));
        assert!(access.rpc_hook().is_some());

        let missing = dir.join("missing");
        let e = with_file(&missing).validate().unwrap_err();
        assert_eq!(e.key, "rocketmq.secret_key_file");
        assert!(e.message.contains("missing") && e.message.contains("cannot be read"), "{e}");

        std::fs::write(&file, " \n").unwrap();
        let e = with_file(&file).validate().unwrap_err();
        assert_eq!(e.key, "rocketmq.secret_key_file");
        assert!(e.message.contains("empty"), "{e}");
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn a_namespace_prefixes_topics_and_groups_as_the_broker_sees_them() {
        let access = BrokerAccess::open("127.0.0.1:9876").with_namespace("tenant-a");
        assert_eq!(access.resource("orders"), "tenant-a%orders");
        assert_eq!(access.resource("orders_group_lag_probe"), "tenant-a%orders_group_lag_probe");
        assert_eq!(BrokerAccess::open("127.0.0.1:9876").resource("orders"), "orders");
        let e = settings(|s| s.namespace = "a b".to_owned()).validate().unwrap_err();
        assert_eq!(e.key, "rocketmq.namespace");
        let e = settings(|s| s.trace_topic = String::new()).validate().unwrap_err();
        assert_eq!(e.key, "rocketmq.trace_topic");
    }

    #[test]
    fn message_trace_goes_to_the_default_trace_topic_unless_told_otherwise() {
        let traced = BrokerAccess::of(&settings(|s| s.message_trace = true)).unwrap();
        let config = traced.client_config();
        assert!(config.enable_trace);
        assert_eq!(config.trace_topic.as_ref().map(|t| t.as_str()), Some("RMQ_SYS_TRACE_TOPIC"));
        assert!(!BrokerAccess::of(&settings(|_| {})).unwrap().client_config().enable_trace);
    }
}
