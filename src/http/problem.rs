//! The one error type of the pages and the API: a [`Problem`] is answered as an HTML page, or
//! as JSON (`{"error": "...", "status": N}`) through [`ApiError`], with the same status.

use askama::Template;
use axum::Json;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use serde_json::json;

use super::view::render;
use crate::inspect::InspectError;

/// A page that could not be shown, and why.
#[derive(Debug)]
pub(crate) struct Problem {
    pub status: StatusCode,
    pub message: String,
}

impl Problem {
    pub(crate) fn bad_request(message: impl Into<String>) -> Self {
        Self { status: StatusCode::BAD_REQUEST, message: message.into() }
    }

    pub(crate) fn not_found(message: impl Into<String>) -> Self {
        Self { status: StatusCode::NOT_FOUND, message: message.into() }
    }
}

impl From<InspectError> for Problem {
    fn from(e: InspectError) -> Self {
        let status = match &e {
            InspectError::BadRequest(_) => StatusCode::BAD_REQUEST,
            InspectError::Timeout(_) => StatusCode::SERVICE_UNAVAILABLE,
            InspectError::Database(err) => {
                tracing::error!(error = %err, "a page's database read failed");
                StatusCode::SERVICE_UNAVAILABLE
            }
        };
        let message = match &e {
            InspectError::Database(_) => "the database could not answer; see the service log".to_owned(),
            other => other.to_string(),
        };
        Self { status, message }
    }
}

#[derive(Template)]
#[template(path = "problem.html")]
struct ProblemPage<'a> {
    title: String,
    search: &'a str,
    status: u16,
    reason: &'a str,
    message: &'a str,
}

impl IntoResponse for Problem {
    fn into_response(self) -> Response {
        let page = ProblemPage {
            title: format!("{} {}", self.status.as_u16(), self.status.canonical_reason().unwrap_or("")),
            search: "",
            status: self.status.as_u16(),
            reason: self.status.canonical_reason().unwrap_or("error"),
            message: &self.message,
        };
        (self.status, render(&page)).into_response()
    }
}

/// The 404 page for paths the UI does not have.
pub(super) fn page_not_found() -> Problem {
    Problem::not_found(
        "There is no page here. Search for a bizId, msgId, UNIQ_KEY or trace id above, or start at the overview.",
    )
}

/// The answer for an `/api/` path that does not exist.
pub(super) fn api_not_found() -> ApiError {
    ApiError(Problem::not_found("no such API endpoint; docs/http-api.md lists them"))
}

/// A [`Problem`] answered as JSON.
pub(crate) struct ApiError(pub Problem);

impl From<Problem> for ApiError {
    fn from(problem: Problem) -> Self {
        Self(problem)
    }
}

impl From<InspectError> for ApiError {
    fn from(e: InspectError) -> Self {
        Self(Problem::from(e))
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let status = self.0.status;
        (status, Json(json!({ "error": self.0.message, "status": status.as_u16() }))).into_response()
    }
}
