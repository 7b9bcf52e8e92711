//! Which host names the server answers to: the guard against DNS rebinding.
//!
//! A page on a domain its owner points at this server's address (after the browser has
//! looked it up once) is, to the browser, same-origin with whatever answers there: it could
//! read every page and post the replay form. What gives it away is the `Host` it sends: its own
//! domain. So every route but `/healthz` and `/readyz` answers only to `localhost`, to an IP
//! address, to the names `http.allowed_hosts` lists and to the host of `http.public_url`; any
//! other `Host` gets 421 Misdirected Request before credentials are even asked for.
//!
//! An IP address is always accepted because a browser sends one only when it was pointed at
//! that address itself: the page's origin is then this server, not someone else's domain.
//! That keeps Prometheus scrapes and probes by address working on any bind. A request with no
//! `Host` at all (HTTP/1.0, a test calling the router in process) is not a browser's and is
//! let through. This module must not look at credentials or at the request's body.

use std::collections::BTreeSet;
use std::net::IpAddr;

use axum::extract::{Request, State};
use axum::http::uri::Authority;
use axum::http::{StatusCode, header};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};

use super::settings::HttpSettings;

/// The names a request's `Host` may carry besides `localhost` and IP addresses.
#[derive(Debug, Clone, Default)]
pub struct AllowedHosts {
    names: BTreeSet<String>,
}

impl AllowedHosts {
    /// `http.allowed_hosts`, and the host of `http.public_url`: the links the service hands
    /// out lead to it.
    pub(crate) fn from_settings(http: &HttpSettings) -> Self {
        let public = url::Url::parse(&http.public_url).ok().and_then(|u| u.host_str().map(canonical));
        Self { names: http.allowed_hosts.iter().map(|n| canonical(n)).chain(public).collect() }
    }

    /// True when a `Host` value (`name`, `name:port`, `[v6]:port`) may be served.
    pub(crate) fn admits(&self, host: &str) -> bool {
        if host.contains('@') {
            return false;
        }
        let Ok(authority) = host.parse::<Authority>() else {
            return false;
        };
        let name = authority.host();
        let bare = name.strip_prefix('[').and_then(|n| n.strip_suffix(']')).unwrap_or(name);
        if bare.parse::<IpAddr>().is_ok() {
            return true;
        }
        let name = canonical(name);
        name == "localhost" || self.names.contains(&name)
    }
}

/// A host name as compared: lower case, without the trailing dot of a fully qualified name.
fn canonical(name: &str) -> String {
    let name = name.to_ascii_lowercase();
    name.strip_suffix('.').map(str::to_owned).unwrap_or(name)
}

/// Lets a request through when every host it names (its `Host` header and, in absolute form or
/// over HTTP/2, its URI's authority) is one this server answers to.
pub(super) async fn require_allowed(
    State(allowed): State<AllowedHosts>,
    request: Request,
    next: Next,
) -> Response {
    let mut headers = request.headers().get_all(header::HOST).iter();
    let header_ok = match (headers.next(), headers.next()) {
        (None, _) => true,
        (Some(host), None) => host.to_str().is_ok_and(|h| allowed.admits(h)),
        (Some(_), Some(_)) => false,
    };
    let uri_ok = request.uri().authority().is_none_or(|a| allowed.admits(a.as_str()));
    if header_ok && uri_ok {
        return next.run(request).await;
    }
    tracing::debug!(host = ?request.headers().get(header::HOST), "refused a request for a host name not served");
    (
        StatusCode::MISDIRECTED_REQUEST,
        "This idemgate is not served under that host name. If it should be, add the name to \
         http.allowed_hosts (IDEMGATE_HTTP__ALLOWED_HOSTS).\n",
    )
        .into_response()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn allowed(names: &[&str]) -> AllowedHosts {
        let http = HttpSettings {
            allowed_hosts: names.iter().map(|n| (*n).to_owned()).collect(),
            ..HttpSettings::default()
        };
        AllowedHosts::from_settings(&http)
    }

    #[test]
    fn loopback_names_and_addresses_are_served_and_other_names_only_when_listed() {
        let none = allowed(&[]);
        for host in [
            "localhost",
            "localhost:8080",
            "LOCALHOST:8080",
            "localhost.:8080",
            "127.0.0.1:8080",
            "[::1]:8080",
            "[::1]",
            "10.1.2.3:9100",
            "0.0.0.0:8080",
        ] {
            assert!(none.admits(host), "{host}");
        }
        for host in [
            "evil.example:8080",
            "evil.example",
            "localhost.evil.example",
            "127.0.0.1.nip.io:8080",
            "sub.localhost:8080",
            "u@127.0.0.1:8080",
            "",
            "bad host",
            "2130706433:8080",
        ] {
            assert!(!none.admits(host), "{host}");
        }
        let listed = allowed(&["Idemgate.Example.com", "gate.internal."]);
        for host in ["idemgate.example.com", "IDEMGATE.example.com:443", "gate.internal:8080", "localhost"] {
            assert!(listed.admits(host), "{host}");
        }
        for host in ["example.com", "idemgate.example.com.evil.example", "evil.idemgate.example.com"] {
            assert!(!listed.admits(host), "{host}");
        }
    }

    #[test]
    fn the_host_of_the_public_url_is_served_without_being_listed() {
        let http = HttpSettings {
            public_url: "https://Ops.Example.com/idemgate".to_owned(),
            ..HttpSettings::default()
        };
        let hosts = AllowedHosts::from_settings(&http);
        assert!(hosts.admits("ops.example.com"));
        assert!(hosts.admits("ops.example.com:443"));
        assert!(!hosts.admits("example.com"));
        assert!(!allowed(&[]).admits("ops.example.com"), "without the public URL it is not");
    }
}
