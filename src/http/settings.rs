//! `[http]`: where the web UI, the JSON API and `/metrics` listen, who may use them, and how
//! much of the database they may take.

use serde::{Deserialize, Serialize};

use crate::setting::{Invalid, invalid};

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

    pub fn validate(&self) -> Result<(), Invalid> {
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

impl Default for HttpSettings {
    fn default() -> Self {
        Self {
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
        }
    }
}
