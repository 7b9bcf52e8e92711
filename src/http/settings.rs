//! `[http]`: where the web UI, the JSON API and `/metrics` listen, who may use them, and how
//! much of the database they may take.

use serde::{Deserialize, Serialize};

use crate::inspect::trace::{MSG_ID_PLACEHOLDER, TRACE_ID_PLACEHOLDER, fill_link};
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
    /// `IDEMGATE_HTTP__TRACE_URL_TEMPLATE`: the address of one trace in Tempo, Jaeger or the
    /// like, `{trace_id}` standing for the W3C trace id a message's `traceparent` carried, such
    /// as `https://tempo.example/explore?traceId={trace_id}`; the trace page links each trace
    /// id to it. An absolute `http` or `https` URL without credentials. Empty: the trace ids
    /// are shown as text.
    pub trace_url_template: String,
    /// `IDEMGATE_HTTP__ROCKETMQ_DASHBOARD_URL`: the RocketMQ dashboard, for the trace page's
    /// link from each delivery to the message's trace there (with `rocketmq.message_trace` on,
    /// the consumption is in it). Either the dashboard's base URL, such as
    /// `https://rocketmq-dashboard.example`, linked as `<base>/#/messageTrace?messageId=<id>`, or a
    /// template with `{msg_id}` where the message's id goes. An absolute `http` or `https` URL
    /// without credentials. Empty: no links.
    pub rocketmq_dashboard_url: String,
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

    /// `IDEMGATE_HTTP__PUBLIC_URL`: the web UI's address as the people who follow its links
    /// open it, such as `https://idemgate.example.com` (an ingress, a load balancer): the
    /// `ui_url` label of `idemgate_build_info`, from which the alerts build their links, and
    /// the link back from the trace page's Grafana link. Empty: `http://` and the bound
    /// address, with this machine's name in place of a wildcard address ([`Self::ui_url`]).
    pub public_url: String,

    // What a client may hold of the server: a connection, and a request in the making.
    /// `IDEMGATE_HTTP__HEADER_READ_TIMEOUT_MS`: the longest the server waits for a request's
    /// line and headers, 100 to 600000, counted from when it starts waiting: on a new
    /// connection, and on a kept-alive one after each answer. Then the connection is closed.
    pub header_read_timeout_ms: u64,
    /// `IDEMGATE_HTTP__REQUEST_TIMEOUT_MS`: the longest from a request's headers to its
    /// answer, the reading of its body included, 100 to 600000 and above
    /// `query_timeout_ms`; a request not answered by then gets 408 and its connection is
    /// closed, so a body that trickles in cannot hold a connection.
    pub request_timeout_ms: u64,
    /// `IDEMGATE_HTTP__MAX_CLIENT_CONNECTIONS`: client connections open at once, 1 to 10000.
    /// At the limit the server stops accepting: a new connection waits in the listen queue
    /// until an open one closes (the timeouts above close those that send too slowly).
    pub max_client_connections: u32,
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
            .field("trace_url_template", &shown.trace_url_template)
            .field("rocketmq_dashboard_url", &shown.rocketmq_dashboard_url)
            .field("query_timeout_ms", &shown.query_timeout_ms)
            .field("max_connections", &shown.max_connections)
            .field("max_concurrent_requests", &shown.max_concurrent_requests)
            .field("allowed_hosts", &shown.allowed_hosts)
            .field("csrf_token_ttl_seconds", &shown.csrf_token_ttl_seconds)
            .field("public_url", &shown.public_url)
            .field("header_read_timeout_ms", &shown.header_read_timeout_ms)
            .field("request_timeout_ms", &shown.request_timeout_ms)
            .field("max_client_connections", &shown.max_client_connections)
            .finish()
    }
}

impl HttpSettings {
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
        if !self.trace_url_template.is_empty() {
            check_link_template(&self.trace_url_template, &TRACE_LINKS).map_err(|why| {
                invalid("http.trace_url_template", format!("{:?} {why}", self.trace_url_template))
            })?;
        }
        if !self.rocketmq_dashboard_url.is_empty() {
            let url = &self.rocketmq_dashboard_url;
            let is_base = !url.contains(MSG_ID_PLACEHOLDER);
            if is_base && (url.contains('?') || url.contains('#')) {
                return Err(invalid(
                    "http.rocketmq_dashboard_url",
                    format!(
                        "{url:?} has a query or a fragment: give the base address, or a template with {{msg_id}}"
                    ),
                ));
            }
            let template = self.rocketmq_dashboard_template().unwrap_or_default();
            check_link_template(&template, &DASHBOARD_LINKS)
                .map_err(|why| invalid("http.rocketmq_dashboard_url", format!("{url:?} {why}")))?;
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
        if !self.public_url.is_empty() {
            check_public_url(&self.public_url)
                .map_err(|why| invalid("http.public_url", format!("{:?} {why}", self.public_url)))?;
        }
        if !(100..=600_000).contains(&self.header_read_timeout_ms) {
            return Err(invalid("http.header_read_timeout_ms", "must be from 100 to 600000"));
        }
        if !(100..=600_000).contains(&self.request_timeout_ms) {
            return Err(invalid("http.request_timeout_ms", "must be from 100 to 600000"));
        }
        if self.request_timeout_ms <= self.query_timeout_ms {
            return Err(invalid(
                "http.request_timeout_ms",
                format!(
                    "must be above http.query_timeout_ms ({}), or a page waiting on the database is cut \
                     off before it can answer",
                    self.query_timeout_ms
                ),
            ));
        }
        if !(1..=10_000).contains(&self.max_client_connections) {
            return Err(invalid("http.max_client_connections", "must be from 1 to 10000"));
        }
        Ok(())
    }

    /// The web UI's base URL for links from outside, without a trailing `/`: `public_url`
    /// when set. Otherwise `http://` and `bound`, the address the server listens on, except
    /// that a wildcard address (`0.0.0.0`, `[::]`), which no browser can open, becomes this
    /// machine's name: in a container that is its host name, the one name of it that other
    /// machines may resolve. Set `public_url` when even that is not how the UI is reached.
    pub fn ui_url(&self, bound: std::net::SocketAddr) -> String {
        if !self.public_url.is_empty() {
            return self.public_url.trim_end_matches('/').to_owned();
        }
        if bound.ip().is_unspecified() {
            return format!("http://{}:{}", crate::setting::host_name(), bound.port());
        }
        format!("http://{bound}")
    }

    /// The link template of a message's trace in the RocketMQ dashboard, `{msg_id}` where the
    /// id goes: `rocketmq_dashboard_url` as it is when it holds `{msg_id}`, else the dashboard's
    /// Message Trace page under that base address. `None` when unset.
    pub fn rocketmq_dashboard_template(&self) -> Option<String> {
        let url = &self.rocketmq_dashboard_url;
        if url.is_empty() {
            return None;
        }
        if url.contains(MSG_ID_PLACEHOLDER) {
            return Some(url.clone());
        }
        Some(format!("{}/#/messageTrace?messageId={MSG_ID_PLACEHOLDER}", url.trim_end_matches('/')))
    }

    /// True when the server listens on every address (`0.0.0.0`, `[::]`): then it is reached
    /// by names this process cannot know, which `allowed_hosts` must list.
    pub(crate) fn binds_every_address(&self) -> bool {
        self.bind.parse::<std::net::SocketAddr>().is_ok_and(|a| a.ip().is_unspecified())
    }
}

/// Checks `http.public_url`: an absolute `http` or `https` URL of a host others can open,
/// without credentials (it is shown in metrics), a query or a fragment.
fn check_public_url(text: &str) -> Result<(), &'static str> {
    let url =
        url::Url::parse(text).map_err(|_| "is not an absolute URL such as https://idemgate.example.com")?;
    if !matches!(url.scheme(), "http" | "https") {
        return Err("must start with http:// or https://");
    }
    let unspecified = match url.host() {
        None => return Err("names no host"),
        Some(url::Host::Ipv4(ip)) => ip.is_unspecified(),
        Some(url::Host::Ipv6(ip)) => ip.is_unspecified(),
        Some(url::Host::Domain(_)) => false,
    };
    if unspecified {
        return Err(
            "names every address (0.0.0.0, [::]), which no browser can open: give the name people reach it by",
        );
    }
    if !url.username().is_empty() || url.password().is_some() {
        return Err("carries credentials, which would be shown in metrics and alerts");
    }
    if url.query().is_some() || url.fragment().is_some() {
        return Err("has a query or a fragment: give the base address only");
    }
    Ok(())
}

/// What a link template of the pages holds: its placeholder, an id to try it with, and an
/// example of a good one.
struct LinkKind {
    placeholder: &'static str,
    example_id: &'static str,
    missing: &'static str,
    not_a_url: &'static str,
}

/// `http.trace_url_template`.
const TRACE_LINKS: LinkKind = LinkKind {
    placeholder: TRACE_ID_PLACEHOLDER,
    example_id: "4bf92f3577b34da6a3ce929d0e0e4736",
    missing: "has no {trace_id}, where the trace id goes",
    not_a_url: "is not an absolute URL such as https://tempo.example/explore?traceId={trace_id}",
};

/// `http.rocketmq_dashboard_url`, as the template it stands for.
const DASHBOARD_LINKS: LinkKind = LinkKind {
    placeholder: MSG_ID_PLACEHOLDER,
    example_id: "7F00000100002A9F0000000000000000",
    missing: "has no {msg_id}, where the message's id goes",
    not_a_url: "is not an absolute URL such as https://rocketmq-dashboard.example",
};

/// Checks a link template of the pages (`http.trace_url_template`, the template of
/// `http.rocketmq_dashboard_url`): its placeholder somewhere in it, and, with an id in its
/// place, an absolute `http` or `https` URL of a host, without credentials (every reader of
/// the pages would see them). No whitespace or control character: a URL parser would drop or
/// encode them, and the link would not be the one configured.
fn check_link_template(template: &str, kind: &LinkKind) -> Result<(), &'static str> {
    if !template.contains(kind.placeholder) {
        return Err(kind.missing);
    }
    if template.chars().any(|c| c.is_whitespace() || c.is_control()) {
        return Err("contains whitespace or control characters");
    }
    let example = fill_link(template, kind.placeholder, kind.example_id);
    let url = url::Url::parse(&example).map_err(|_| kind.not_a_url)?;
    if !matches!(url.scheme(), "http" | "https") {
        return Err("must start with http:// or https://");
    }
    if url.host().is_none() {
        return Err("names no host");
    }
    if !url.username().is_empty() || url.password().is_some() {
        return Err("carries credentials, which every reader of the trace page would see");
    }
    Ok(())
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
            trace_url_template: String::new(),
            rocketmq_dashboard_url: String::new(),
            query_timeout_ms: 5_000,
            max_connections: 4,
            max_concurrent_requests: 16,
            allowed_hosts: Vec::new(),
            csrf_token_ttl_seconds: 3_600,
            public_url: String::new(),
            header_read_timeout_ms: 10_000,
            request_timeout_ms: 30_000,
            max_client_connections: 256,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn with(change: impl FnOnce(&mut HttpSettings)) -> HttpSettings {
        let mut http = HttpSettings::default();
        change(&mut http);
        http
    }

    fn refusal(change: impl FnOnce(&mut HttpSettings)) -> String {
        with(change).validate().expect_err("refused").to_string()
    }

    #[test]
    fn the_public_url_is_an_absolute_web_address_of_a_host_people_can_open() {
        for good in [
            "https://idemgate.example.com",
            "http://10.0.0.5:8080/",
            "https://ops.example.com/idemgate",
            "http://[::1]:8080",
        ] {
            assert_eq!(with(|h| h.public_url = good.to_owned()).validate(), Ok(()), "{good}");
        }
        for (bad, why) in [
            ("idemgate.example.com", "is not an absolute URL"),
            ("/idemgate", "is not an absolute URL"),
            ("ftp://idemgate.example.com", "must start with http:// or https://"),
            ("http://0.0.0.0:8080", "names every address"),
            ("http://[::]:8080", "names every address"),
            ("https://oncall:secret@idemgate.example.com", "carries credentials"),
            ("https://idemgate.example.com/?tab=1", "has a query or a fragment"),
            ("https://idemgate.example.com/#top", "has a query or a fragment"),
            ("https://idem gate.example.com", "is not an absolute URL"),
        ] {
            let err = refusal(|h| h.public_url = bad.to_owned());
            assert!(err.starts_with("configuration key http.public_url: "), "{bad}: {err}");
            assert!(err.contains(why), "{bad}: {err}");
        }
    }

    #[test]
    fn the_rocketmq_dashboard_is_a_base_address_or_a_template_with_a_place_for_the_msg_id() {
        let base = with(|h| h.rocketmq_dashboard_url = "https://mq.example/".to_owned());
        assert_eq!(base.validate(), Ok(()));
        assert_eq!(
            base.rocketmq_dashboard_template().as_deref(),
            Some("https://mq.example/#/messageTrace?messageId={msg_id}")
        );
        let template = with(|h| h.rocketmq_dashboard_url = "https://mq.example/trace?id={msg_id}".to_owned());
        assert_eq!(template.validate(), Ok(()));
        assert_eq!(
            template.rocketmq_dashboard_template().as_deref(),
            Some("https://mq.example/trace?id={msg_id}")
        );
        assert_eq!(HttpSettings::default().rocketmq_dashboard_template(), None);
        for (bad, why) in [
            ("mq.example", "is not an absolute URL"),
            ("ftp://mq.example", "must start with http:// or https://"),
            ("https://ops:secret@mq.example", "carries credentials"),
            ("https://mq.example/?tab=1", "has a query or a fragment"),
            ("https://mq.example/#/trace", "has a query or a fragment"),
            ("https://mq.example/{msg_id} x", "whitespace"),
        ] {
            let err = refusal(|h| h.rocketmq_dashboard_url = bad.to_owned());
            assert!(err.starts_with("configuration key http.rocketmq_dashboard_url: "), "{bad}: {err}");
            assert!(err.contains(why), "{bad}: {err}");
        }
    }

    #[test]
    fn the_trace_url_template_is_a_web_address_with_a_place_for_the_trace_id() {
        for good in [
            "https://tempo.example/explore?traceId={trace_id}",
            "http://jaeger:16686/trace/{trace_id}",
            "https://grafana.example/explore?left={\"queries\":[{\"query\":\"{trace_id}\"}]}",
            "https://x.example/{trace_id}?again={trace_id}",
        ] {
            assert_eq!(with(|h| h.trace_url_template = good.to_owned()).validate(), Ok(()), "{good}");
        }
        for (bad, why) in [
            ("https://tempo.example/explore", "has no {trace_id}"),
            ("https://tempo.example/explore?traceId={traceId}", "has no {trace_id}"),
            ("javascript:alert(1)//{trace_id}", "must start with http:// or https://"),
            ("ftp://tempo.example/{trace_id}", "must start with http:// or https://"),
            ("/explore?traceId={trace_id}", "is not an absolute URL"),
            ("tempo.example/{trace_id}", "is not an absolute URL"),
            ("https://user:secret@tempo.example/{trace_id}", "carries credentials"),
            ("https://tempo.example/ {trace_id}", "whitespace or control"),
            ("https://tempo.example/\n{trace_id}", "whitespace or control"),
        ] {
            let err = refusal(|h| h.trace_url_template = bad.to_owned());
            assert!(err.starts_with("configuration key http.trace_url_template: "), "{bad}: {err}");
            assert!(err.contains(why), "{bad}: {err}");
        }
    }

    #[test]
    fn the_ui_url_is_the_public_url_else_the_bound_address_but_never_a_wildcard() {
        let bound = |a: &str| a.parse::<std::net::SocketAddr>().unwrap();
        let public = with(|h| h.public_url = "https://idemgate.example.com/".to_owned());
        assert_eq!(public.ui_url(bound("0.0.0.0:8080")), "https://idemgate.example.com");
        let default = HttpSettings::default();
        assert_eq!(default.ui_url(bound("127.0.0.1:8080")), "http://127.0.0.1:8080");
        assert_eq!(default.ui_url(bound("10.1.2.3:9000")), "http://10.1.2.3:9000");
        assert_eq!(default.ui_url(bound("[::1]:8080")), "http://[::1]:8080");
        let machine = crate::setting::host_name();
        for wildcard in ["0.0.0.0:8080", "[::]:8080"] {
            let url = default.ui_url(bound(wildcard));
            assert_eq!(url, format!("http://{machine}:8080"), "{wildcard}");
            assert!(!url.contains("0.0.0.0") && !url.contains("[::]"), "{url}");
        }
    }

    #[test]
    fn the_timeouts_and_the_connection_limit_are_held_to_their_ranges() {
        assert_eq!(HttpSettings::default().validate(), Ok(()));
        for (change, key) in [
            (with(|h| h.header_read_timeout_ms = 99), "http.header_read_timeout_ms"),
            (with(|h| h.header_read_timeout_ms = 600_001), "http.header_read_timeout_ms"),
            (with(|h| h.request_timeout_ms = 600_001), "http.request_timeout_ms"),
            (with(|h| h.max_client_connections = 0), "http.max_client_connections"),
            (with(|h| h.max_client_connections = 10_001), "http.max_client_connections"),
        ] {
            let err = change.validate().expect_err(key).to_string();
            assert!(err.starts_with(&format!("configuration key {key}: must be from")), "{err}");
        }
        let cut_short = refusal(|h| {
            h.query_timeout_ms = 5_000;
            h.request_timeout_ms = 5_000;
        });
        assert!(
            cut_short.starts_with(
                "configuration key http.request_timeout_ms: must be above http.query_timeout_ms (5000)"
            ),
            "{cut_short}"
        );
    }

    #[test]
    #[allow(clippy::result_large_err)] // figment::Jail's own error type
    fn the_new_keys_come_from_their_environment_variables() {
        use figment::providers::Env;
        figment::Jail::expect_with(|jail| {
            jail.set_env("IDEMGATE_HTTPKEYS_TEST_HTTP__PUBLIC_URL", "https://idemgate.example.com");
            jail.set_env("IDEMGATE_HTTPKEYS_TEST_HTTP__HEADER_READ_TIMEOUT_MS", "2500");
            jail.set_env("IDEMGATE_HTTPKEYS_TEST_HTTP__REQUEST_TIMEOUT_MS", "45000");
            jail.set_env("IDEMGATE_HTTPKEYS_TEST_HTTP__MAX_CLIENT_CONNECTIONS", "32");
            let s = crate::config::Settings::load_from(None, Env::prefixed("IDEMGATE_HTTPKEYS_TEST_"))
                .expect("loads");
            assert_eq!(s.http.public_url, "https://idemgate.example.com");
            assert_eq!(s.http.header_read_timeout_ms, 2_500);
            assert_eq!(s.http.request_timeout_ms, 45_000);
            assert_eq!(s.http.max_client_connections, 32);
            Ok(())
        });
    }
}
