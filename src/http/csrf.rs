//! Cross-site request forgery: the replay form's token and the same-origin rules every
//! state-changing request (a method other than GET, HEAD or OPTIONS) must meet.
//!
//! A form token names the time it was issued and carries an HMAC-SHA256, under a secret drawn
//! at start, over that time, the form's purpose and the key it acts on. It is valid for
//! `http.csrf_token_ttl_seconds` and in this process only; it is compared in constant time. A
//! state-changing request is also refused when the browser says it came from elsewhere:
//! `Sec-Fetch-Site` other than `same-origin`, or an `Origin` that is not this `Host`.
//! This module must not change state itself.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use axum::extract::Request;
use axum::http::{HeaderMap, Method, StatusCode, header};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use hmac::{Hmac, KeyInit, Mac};
use sha2::Sha256;

use super::problem::Problem;

type HmacSha256 = Hmac<Sha256>;

/// How far ahead of this process's clock a token's issue time may be: none of ours is, unless
/// the clock was set back.
const CLOCK_SKEW: Duration = Duration::from_secs(60);

/// Issues and checks the tokens of this process's forms.
#[derive(Clone)]
pub struct FormTokens {
    secret: [u8; 32],
    ttl: Duration,
}

impl std::fmt::Debug for FormTokens {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("FormTokens").field("secret", &"***").field("ttl", &self.ttl).finish()
    }
}

/// Why a form's token was refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum TokenRefusal {
    /// Not made by this process for this purpose and subject (forged, altered, for another key,
    /// or from before a restart).
    #[error("the form's token is not valid for this key; open the trace page again")]
    Invalid,
    /// Made here, but longer ago than the tokens' lifetime.
    #[error("the form has expired (a form is valid for {} minutes); reload the trace page and press the button again", .0.as_secs() / 60)]
    Expired(Duration),
}

impl FormTokens {
    /// Tokens under a fresh random secret, valid for `ttl`.
    pub fn new(ttl: Duration) -> Self {
        Self { secret: rand::random(), ttl }
    }

    /// A token for `purpose` on `subject` (the parts that name what the form acts on), issued
    /// at `now`: `<seconds since the epoch>.<hex HMAC>`.
    pub(crate) fn issue(&self, purpose: &str, subject: &[&str], now: SystemTime) -> String {
        let issued = now.duration_since(UNIX_EPOCH).unwrap_or_default().as_secs();
        format!("{issued}.{}", hex::encode(self.mac(purpose, subject, issued).finalize().into_bytes()))
    }

    /// Accepts `token` when this process issued it for `purpose` on `subject` no longer than
    /// the lifetime before `now`.
    pub fn check(
        &self,
        purpose: &str,
        subject: &[&str],
        token: &str,
        now: SystemTime,
    ) -> Result<(), TokenRefusal> {
        let (issued, mac) = token.split_once('.').ok_or(TokenRefusal::Invalid)?;
        if issued.is_empty() || issued.len() > 20 || !issued.bytes().all(|b| b.is_ascii_digit()) {
            return Err(TokenRefusal::Invalid);
        }
        let issued: u64 = issued.parse().map_err(|_| TokenRefusal::Invalid)?;
        let presented = hex::decode(mac).map_err(|_| TokenRefusal::Invalid)?;
        // In constant time: `verify_slice` compares with `subtle`.
        self.mac(purpose, subject, issued).verify_slice(&presented).map_err(|_| TokenRefusal::Invalid)?;
        let issued = UNIX_EPOCH + Duration::from_secs(issued);
        if issued > now + CLOCK_SKEW {
            return Err(TokenRefusal::Invalid);
        }
        match now.duration_since(issued) {
            Ok(age) if age > self.ttl => Err(TokenRefusal::Expired(self.ttl)),
            _ => Ok(()),
        }
    }

    /// HMAC-SHA256 over the issue time, the purpose and each part of the subject, each
    /// length-prefixed so that no two different lists read the same.
    fn mac(&self, purpose: &str, subject: &[&str], issued: u64) -> HmacSha256 {
        let mut mac = HmacSha256::new_from_slice(&self.secret).expect("HMAC takes a key of any length");
        mac.update(&issued.to_be_bytes());
        for part in std::iter::once(purpose).chain(subject.iter().copied()) {
            mac.update(&(part.len() as u64).to_be_bytes());
            mac.update(part.as_bytes());
        }
        mac
    }
}

/// Why a state-changing request is refused, from its headers alone; `None` when it may go on.
fn cross_site(headers: &HeaderMap) -> Option<&'static str> {
    if let Some(site) = headers.get("sec-fetch-site")
        && site.as_bytes() != b"same-origin"
    {
        return Some("the browser says this request comes from another site; use this site's own page");
    }
    if let (Some(origin), Some(host)) = (headers.get(header::ORIGIN), headers.get(header::HOST)) {
        let host = host.to_str().unwrap_or("");
        let same = [format!("http://{host}"), format!("https://{host}")]
            .iter()
            .any(|o| !host.is_empty() && o.as_bytes() == origin.as_bytes());
        if !same {
            return Some("the request must come from this site's own page");
        }
    }
    None
}

/// Refuses (403) a state-changing request that the browser says came from another site.
pub(super) async fn same_origin_writes(request: Request, next: Next) -> Response {
    let safe = matches!(*request.method(), Method::GET | Method::HEAD | Method::OPTIONS);
    if !safe && let Some(message) = cross_site(request.headers()) {
        return Problem { status: StatusCode::FORBIDDEN, message: message.to_owned() }.into_response();
    }
    next.run(request).await
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_mac_is_rfc_4231_hmac_sha256() {
        // RFC 4231, test cases 1 and 2.
        let known = |key: &[u8], text: &[u8]| {
            let mut mac = HmacSha256::new_from_slice(key).unwrap();
            mac.update(text);
            hex::encode(mac.finalize().into_bytes())
        };
        assert_eq!(
            known(&[0x0b; 20], b"Hi There"),
            "b0344c61d8db38535ca8afceaf0bf12b881dc200c9833da726e9376c2e32cff7"
        );
        assert_eq!(
            known(b"Jefe", b"what do ya want for nothing?"),
            "5bdcc146bf60754e6a042426089575c75a003f089d2739839dec58b964ec3843"
        );
    }

    #[test]
    fn a_token_is_good_for_its_subject_and_its_lifetime_only() {
        let tokens = FormTokens::new(Duration::from_secs(3_600));
        let now = SystemTime::now();
        let key = ["g", "payment.confirm", "P-1", "0"];
        let token = tokens.issue("replay", &key, now);
        assert_eq!(tokens.check("replay", &key, &token, now), Ok(()));
        assert_eq!(tokens.check("replay", &key, &token, now + Duration::from_secs(3_599)), Ok(()));
        assert_eq!(
            tokens.check("replay", &key, &token, now + Duration::from_secs(3_601)),
            Err(TokenRefusal::Expired(Duration::from_secs(3_600)))
        );
        assert_eq!(
            tokens.check("replay", &["g", "payment.confirm", "P-2", "0"], &token, now),
            Err(TokenRefusal::Invalid)
        );
        assert_eq!(tokens.check("other", &key, &token, now), Err(TokenRefusal::Invalid));
        assert_eq!(
            tokens.check("replay", &["g", "payment.confirm", "P-1", ""], &token, now),
            Err(TokenRefusal::Invalid),
            "parts are length-prefixed"
        );
        let (issued, mac) = token.split_once('.').unwrap();
        let later = format!("{}.{mac}", issued.parse::<u64>().unwrap() + 600);
        assert_eq!(
            tokens.check("replay", &key, &later, now),
            Err(TokenRefusal::Invalid),
            "the time is signed"
        );
        for forged in ["", ".", "0", &"0".repeat(64), &format!("{issued}."), &format!("x{issued}.{mac}")] {
            assert_eq!(tokens.check("replay", &key, forged, now), Err(TokenRefusal::Invalid), "{forged:?}");
        }
        let future = tokens.issue("replay", &key, now + Duration::from_secs(600));
        assert_eq!(tokens.check("replay", &key, &future, now), Err(TokenRefusal::Invalid));
        let elsewhere = FormTokens::new(Duration::from_secs(3_600));
        assert_eq!(
            elsewhere.check("replay", &key, &token, now),
            Err(TokenRefusal::Invalid),
            "another process"
        );
        assert!(!format!("{tokens:?}").contains(&hex::encode(tokens.secret)));
    }

    #[test]
    fn a_request_from_another_site_is_told_apart() {
        let headers = |pairs: &[(&'static str, &str)]| {
            let mut h = HeaderMap::new();
            for (name, value) in pairs {
                h.insert(*name, value.parse().unwrap());
            }
            h
        };
        let host = ("host", "127.0.0.1:8080");
        assert_eq!(cross_site(&headers(&[host])), None);
        assert_eq!(cross_site(&headers(&[host, ("origin", "http://127.0.0.1:8080")])), None);
        assert_eq!(cross_site(&headers(&[host, ("sec-fetch-site", "same-origin")])), None);
        for refused in [
            &[host, ("origin", "http://evil.example")][..],
            &[host, ("origin", "null")],
            &[host, ("sec-fetch-site", "cross-site")],
            &[host, ("sec-fetch-site", "same-site")],
            &[host, ("sec-fetch-site", "none")],
            &[("origin", "http://"), ("host", "")],
        ] {
            assert!(cross_site(&headers(refused)).is_some(), "{refused:?}");
        }
    }
}
