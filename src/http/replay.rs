//! `POST /replay`: the trace page's Replay button, for a dead letter or an invalid delivery.

use askama::Template;
use axum::extract::State;
use axum::http::StatusCode;
use axum::response::Response;

use super::params::Params;
use super::problem::Problem;
use super::state::AppState;
use super::view::{message_trace_href, render, trace_href};
use crate::clock::format_ms;
use crate::replay::{Action, Selection};
use axum::Router;
use axum::routing::post;

pub(super) fn router() -> Router<AppState> {
    Router::new().route("/replay", post(replay_action))
}

struct ReplayLineView {
    key: String,
    row: String,
    result: String,
    sent: bool,
}

#[derive(Template)]
#[template(path = "replay.html")]
struct ReplayPage<'a> {
    title: String,
    search: &'a str,
    /// What was replayed: `key` or `message`.
    what: &'static str,
    lines: Vec<ReplayLineView>,
    trace: String,
}

/// `POST /replay`: re-publishes one key's latest dead letter or invalid delivery, or (with
/// `msg_id`) one message's, when it was refused before a bizId could be read from it. It
/// needs the form's CSRF token for that very key or message, issued by this process within
/// the tokens' lifetime; the router has already checked the host name, the credentials where
/// configured, and that the browser did not send it from another site
/// ([`crate::http::csrf`]).
pub(super) async fn replay_action(State(state): State<AppState>, body: String) -> Result<Response, Problem> {
    let form = Params::parse(Some(&body))?;
    let field = |name: &str, max: usize| -> Result<String, Problem> {
        let v = form.get(name).ok_or_else(|| Problem::bad_request(format!("the form has no {name}")))?;
        Ok(crate::inspect::checked_text(name, v, max)?)
    };
    let group = field("group", crate::route::MAX_ID_CHARS)?;
    let csrf = field("csrf", 128)?;
    let now = std::time::SystemTime::now();
    let forbidden = |refusal: crate::http::csrf::TokenRefusal| Problem {
        status: StatusCode::FORBIDDEN,
        message: refusal.to_string(),
    };
    let (selection, title, what, trace) = if form.get("msg_id").is_some() {
        let msg_id = field("msg_id", crate::route::MAX_ID_CHARS)?;
        state.web.check_replay_message_token(&group, &msg_id, &csrf, now).map_err(forbidden)?;
        let trace = message_trace_href(&msg_id);
        (Selection::Message { msg_id: msg_id.clone() }, format!("Replay msgId {msg_id}"), "message", trace)
    } else {
        let biz_type = field("biz_type", crate::route::MAX_BIZ_TYPE_CHARS)?;
        let biz_id = field("biz_id", crate::route::MAX_BIZ_ID_CHARS)?;
        let execute_time: i64 = field("execute_time", 20)?
            .parse()
            .map_err(|_| Problem::bad_request("execute_time must be epoch milliseconds"))?;
        state
            .web
            .check_replay_token(&group, &biz_type, &biz_id, execute_time, &csrf, now)
            .map_err(forbidden)?;
        let trace = trace_href(&biz_id, &biz_type, execute_time, &group);
        let title = format!("Replay {biz_id}");
        let selection = Selection::Key { biz_id, biz_type: Some(biz_type), execute_time: Some(execute_time) };
        (selection, title, "key", trace)
    };
    let Some(replayer) = state.web.replay.clone() else {
        return Err(Problem {
            status: StatusCode::FORBIDDEN,
            message: "replay is not available here: this process has no broker".to_owned(),
        });
    };
    let lines = replayer.replay(&state.store, &group, &selection).await.map_err(|e| {
        tracing::error!(error = %e, "replay from the web UI failed");
        Problem {
            status: StatusCode::SERVICE_UNAVAILABLE,
            message: "the replay could not be sent; see the service log".to_owned(),
        }
    })?;
    let page = ReplayPage {
        title,
        search: "",
        what,
        lines: lines
            .iter()
            .map(|l| ReplayLineView {
                key: if l.biz_id.is_empty() {
                    format!("{} (no bizId)", l.biz_type)
                } else {
                    format!("{} {}", l.biz_type, l.biz_id)
                },
                row: format!(
                    "{} {} of {}",
                    l.replayed_row(),
                    l.dead_letter_msg_id,
                    format_ms(l.dead_lettered_at_ms)
                ),
                result: l.action.describe(&l.topic, false),
                sent: matches!(l.action, Action::Sent { .. }),
            })
            .collect(),
        trace,
    };
    Ok(render(&page))
}
