//! Optional authentication for everything but the health endpoints: a bearer token for scripts
//! and Prometheus, HTTP basic auth for a browser. Off unless configured.
//!
//! Credentials are compared in constant time and never logged.

use axum::extract::{Request, State};
use axum::http::{HeaderValue, StatusCode, header};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use base64::Engine;

use super::settings::HttpSettings;

/// The accepted `Authorization` header values.
#[derive(Clone, Default)]
pub struct Auth {
    bearer: Option<String>,
    basic: Option<String>,
}

impl std::fmt::Debug for Auth {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Auth")
            .field("bearer", &self.bearer.is_some())
            .field("basic", &self.basic.is_some())
            .finish()
    }
}

impl Auth {
    pub(crate) fn from_settings(http: &HttpSettings) -> Self {
        let bearer = (!http.auth_token.is_empty()).then(|| format!("Bearer {}", http.auth_token));
        let basic = (!http.basic_user.is_empty()).then(|| {
            let pair = format!("{}:{}", http.basic_user, http.basic_password);
            format!("Basic {}", base64::engine::general_purpose::STANDARD.encode(pair))
        });
        Self { bearer, basic }
    }

    pub fn enabled(&self) -> bool {
        self.bearer.is_some() || self.basic.is_some()
    }

    fn admits(&self, presented: Option<&HeaderValue>) -> bool {
        if !self.enabled() {
            return true;
        }
        let Some(presented) = presented.map(HeaderValue::as_bytes) else {
            return false;
        };
        [&self.bearer, &self.basic].into_iter().flatten().any(|expected| same(expected.as_bytes(), presented))
    }
}

/// Equal in time that depends on the length only (`subtle`'s comparison).
fn same(a: &[u8], b: &[u8]) -> bool {
    use subtle::ConstantTimeEq;
    a.ct_eq(b).into()
}

/// Lets a request through when it carries accepted credentials.
pub(super) async fn require(State(auth): State<Auth>, request: Request, next: Next) -> Response {
    if auth.admits(request.headers().get(header::AUTHORIZATION)) {
        return next.run(request).await;
    }
    let mut response = (
        StatusCode::UNAUTHORIZED,
        "Sign in: this idemgate asks for a bearer token or its basic-auth user and password.\n",
    )
        .into_response();
    if auth.basic.is_some() {
        response.headers_mut().insert(
            header::WWW_AUTHENTICATE,
            HeaderValue::from_static("Basic realm=\"idemgate\", charset=\"UTF-8\""),
        );
    } else {
        response
            .headers_mut()
            .insert(header::WWW_AUTHENTICATE, HeaderValue::from_static("Bearer realm=\"idemgate\""));
    }
    response
}

#[cfg(test)]
mod tests {
    use super::*;

    fn settings(token: &str, user: &str, password: &str) -> HttpSettings {
        HttpSettings {
            auth_token: token.into(),
            basic_user: user.into(),
            basic_password: password.into(),
            ..HttpSettings::default()
        }
    }

    #[test]
    fn either_credential_is_accepted_and_anything_else_refused() {
        let auth = Auth::from_settings(&settings("0123456789abcdef", "ops", "s3cret"));
        let header = |v: &str| HeaderValue::from_str(v).unwrap();
        assert!(auth.admits(Some(&header("Bearer 0123456789abcdef"))));
        assert!(auth.admits(Some(&header("Basic b3BzOnMzY3JldA=="))));
        assert!(!auth.admits(Some(&header("Bearer 0123456789abcdeX"))));
        assert!(!auth.admits(Some(&header("Basic b3BzOndyb25n"))));
        assert!(!auth.admits(None));
        assert!(Auth::default().admits(None));
        assert!(!format!("{auth:?}").contains("0123456789abcdef"));
    }
}
