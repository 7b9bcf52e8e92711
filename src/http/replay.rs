//! `POST /replay`: the trace page's Replay button.

use askama::Template;
use axum::extract::State;
use axum::http::StatusCode;
use axum::response::Response;

use super::params::Params;
use super::problem::Problem;
use super::state::AppState;
use super::view::{render, trace_href};
use crate::clock::format_ms;
use axum::Router;
use axum::routing::post;

pub(super) fn router() -> Router<AppState> {
    Router::new().route("/replay", post(replay_action))
}

struct ReplayLineView {
    key: String,
    dead_letter: String,
    result: String,
    sent: bool,
}

#[derive(Template)]
#[template(path = "replay.html")]
struct ReplayPage<'a> {
    title: String,
    search: &'a str,
    lines: Vec<ReplayLineView>,
    trace: String,
}

/// `POST /replay`: re-publishes one key's latest dead letter. It needs the form's CSRF token
/// for that very key, issued by this process within the tokens' lifetime; the router has
/// already checked the host name, the credentials where configured, and that the browser did
/// not send it from another site ([`crate::http::csrf`]).
pub(super) async fn replay_action(State(state): State<AppState>, body: String) -> Result<Response, Problem> {
    let form = Params::parse(Some(&body))?;
    let field = |name: &str, max: usize| -> Result<String, Problem> {
        let v = form.get(name).ok_or_else(|| Problem::bad_request(format!("the form has no {name}")))?;
        Ok(crate::inspect::checked_text(name, v, max)?)
    };
    let group = field("group", crate::route::MAX_ID_CHARS)?;
    let biz_type = field("biz_type", crate::route::MAX_BIZ_TYPE_CHARS)?;
    let biz_id = field("biz_id", crate::route::MAX_BIZ_ID_CHARS)?;
    let execute_time: i64 = field("execute_time", 20)?
        .parse()
        .map_err(|_| Problem::bad_request("execute_time must be epoch milliseconds"))?;
    let csrf = field("csrf", 128)?;
    state
        .web
        .check_replay_token(&group, &biz_type, &biz_id, execute_time, &csrf, std::time::SystemTime::now())
        .map_err(|refusal| Problem { status: StatusCode::FORBIDDEN, message: refusal.to_string() })?;
    let Some(replayer) = state.web.replay.clone() else {
        return Err(Problem {
            status: StatusCode::FORBIDDEN,
            message: "replay is not available here: this process has no broker".to_owned(),
        });
    };
    let lines =
        replayer.replay_key(&state.store, &group, &biz_type, &biz_id, execute_time).await.map_err(|e| {
            tracing::error!(error = %e, "replay from the web UI failed");
            Problem {
                status: StatusCode::SERVICE_UNAVAILABLE,
                message: "the replay could not be sent; see the service log".to_owned(),
            }
        })?;
    let page = ReplayPage {
        title: format!("Replay {biz_id}"),
        search: "",
        lines: lines
            .iter()
            .map(|l| ReplayLineView {
                key: format!("{} {}", l.biz_type, l.biz_id),
                dead_letter: format!("{} of {}", l.dead_letter_msg_id, format_ms(l.dead_lettered_at_ms)),
                result: l.action.describe(&l.topic, false),
                sent: matches!(l.action, crate::replay::Action::Sent { .. }),
            })
            .collect(),
        trace: trace_href(&biz_id, &biz_type, execute_time, &group),
    };
    Ok(render(&page))
}
