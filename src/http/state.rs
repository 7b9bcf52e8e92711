//! What every handler shares: the stores, the readiness flag, the metrics, and what the pages
//! need that is fixed at start.

use std::sync::Arc;
use std::sync::atomic::AtomicBool;

use super::settings::HttpSettings;
use super::{auth, csrf, host};
use crate::archive::{ArchiveSettings, LogRetention};
use crate::handler::Handler;
use crate::inspect::Limits;
use crate::inspect::trace::TraceContext;
use crate::metrics::Metrics;
use crate::replay::Replayer;
use crate::store::Store;

/// What the handlers share.
#[derive(Clone)]
pub struct AppState {
    /// The pages' own pool (`http.max_connections`).
    pub store: Store,
    /// The consumer's pool, which `/readyz` asks: whether the service can consume does not
    /// hang on how busy the pages are.
    pub consumer_store: Store,
    /// Set once the consumer has started (or, in the demo, the traffic source).
    pub consumer_ready: Arc<AtomicBool>,
    /// Cleared while the consumer answers no delivery and messages wait (`broker.stall_seconds`):
    /// `/readyz` answers 503 until it answers again.
    pub consumer_progressing: Arc<AtomicBool>,
    pub metrics: Arc<Metrics>,
    pub web: Arc<Web>,
}

/// What the pages need besides the store: fixed at start.
#[derive(Debug, Clone)]
pub struct Web {
    pub trace: TraceContext,
    pub archive: ArchiveSettings,
    pub auth: auth::Auth,
    /// Replay from the trace page; `None` where this process has no broker (the demo).
    pub replay: Option<Arc<Replayer>>,
    /// One permit per page or API call in flight (`http.max_concurrent_requests`).
    pub(super) in_flight: Arc<tokio::sync::Semaphore>,
    /// The host names served besides `localhost` and IP addresses.
    pub hosts: host::AllowedHosts,
    /// The tokens of the replay form, under a per-process secret.
    pub forms: csrf::FormTokens,
    /// How long a request may take from its headers to its answer (`http.request_timeout_ms`).
    pub request_timeout: std::time::Duration,
}

/// The purpose the replay form's tokens are issued for.
const REPLAY_FORM: &str = "replay";
/// The purpose of the tokens of the replay form for one message, by its msgId (a delivery
/// refused before a bizId could be read from it).
const REPLAY_MESSAGE_FORM: &str = "replay-message";

/// What a key's story is read with, from the settings: the pages' query bound, the log's
/// retention (for the note on old history), the Grafana link, the trace links' template, and
/// the business state each handler of `describers` describes. The pages and `idemgate trace`
/// read with the same.
pub fn trace_context(
    http: &HttpSettings,
    archive: &ArchiveSettings,
    describers: std::collections::BTreeMap<String, Arc<dyn Handler>>,
) -> TraceContext {
    TraceContext {
        limits: Limits { timeout: std::time::Duration::from_millis(http.query_timeout_ms) },
        retention: Some(LogRetention::days(archive.log_retention_days)),
        grafana_url: grafana_base(http),
        trace_url_template: Some(http.trace_url_template.clone()).filter(|t| !t.is_empty()),
        dashboard_url_template: http.rocketmq_dashboard_template(),
        describers,
    }
}

impl Web {
    /// The pages' settings, and the handler of each biz_type, whose business state the trace
    /// page shows.
    pub fn new(
        http: &HttpSettings,
        archive: &ArchiveSettings,
        describers: std::collections::BTreeMap<String, Arc<dyn Handler>>,
    ) -> Self {
        Self {
            trace: trace_context(http, archive, describers),
            archive: archive.clone(),
            auth: auth::Auth::from_settings(http),
            replay: None,
            in_flight: Arc::new(tokio::sync::Semaphore::new(http.max_concurrent_requests as usize)),
            hosts: host::AllowedHosts::from_settings(http),
            forms: csrf::FormTokens::new(std::time::Duration::from_secs(http.csrf_token_ttl_seconds)),
            request_timeout: std::time::Duration::from_millis(http.request_timeout_ms),
        }
    }

    /// Turns on replay from the trace page, through `replayer`.
    pub(crate) fn with_replay(mut self, replayer: Replayer) -> Self {
        self.replay = Some(Arc::new(replayer));
        self
    }

    /// The replay form's token for one key, issued at `now`: only this process can make one,
    /// and only for that very key.
    pub fn replay_token(
        &self,
        group: &str,
        biz_type: &str,
        biz_id: &str,
        execute_time: i64,
        now: std::time::SystemTime,
    ) -> String {
        self.forms.issue(REPLAY_FORM, &[group, biz_type, biz_id, &execute_time.to_string()], now)
    }

    /// Accepts a replay form's token for this key, issued here within the tokens' lifetime.
    pub fn check_replay_token(
        &self,
        group: &str,
        biz_type: &str,
        biz_id: &str,
        execute_time: i64,
        token: &str,
        now: std::time::SystemTime,
    ) -> Result<(), csrf::TokenRefusal> {
        self.forms.check(REPLAY_FORM, &[group, biz_type, biz_id, &execute_time.to_string()], token, now)
    }

    /// The token of the replay form for the message `msg_id` of `group`, issued at `now`.
    pub(crate) fn replay_message_token(
        &self,
        group: &str,
        msg_id: &str,
        now: std::time::SystemTime,
    ) -> String {
        self.forms.issue(REPLAY_MESSAGE_FORM, &[group, msg_id], now)
    }

    /// Accepts a token of the replay form for the message `msg_id` of `group`.
    pub fn check_replay_message_token(
        &self,
        group: &str,
        msg_id: &str,
        token: &str,
        now: std::time::SystemTime,
    ) -> Result<(), csrf::TokenRefusal> {
        self.forms.check(REPLAY_MESSAGE_FORM, &[group, msg_id], token, now)
    }
}

/// The Grafana dashboard's URL the trace page links to, when one is configured: with the web
/// UI's own address as the dashboard's `idemgate_url`, so that the dashboard's links lead back
/// to the UI the engineer came from.
fn grafana_base(http: &HttpSettings) -> Option<String> {
    if http.grafana_url.is_empty() {
        return None;
    }
    if http.public_url.is_empty() {
        return Some(http.grafana_url.clone());
    }
    let ui = http.public_url.trim_end_matches('/');
    let pair = serde_urlencoded::to_string([("var-idemgate_url", ui)]).unwrap_or_default();
    let sep = if http.grafana_url.contains('?') { '&' } else { '?' };
    Some(format!("{}{sep}{pair}", http.grafana_url))
}
