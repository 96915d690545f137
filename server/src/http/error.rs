//! [`ApiError`]: every REST error answer, `{"code":"…","msg":"…"}`
//! ([`shared::protocol::ops::ApiErrorBody`]) with its status. A server-side failure (5xx) is
//! logged once, here, with its causes; a client's mistake (4xx) is counted by the handler and
//! not logged.

use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::Json;
use shared::protocol::ops::{ApiErrorBody, ApiErrorCode};

use crate::error::report;

/// An error answer of the REST API.
#[derive(Debug)]
pub struct ApiError {
    status: StatusCode,
    code: ApiErrorCode,
    msg: String,
}

impl ApiError {
    pub fn new(status: StatusCode, code: ApiErrorCode, msg: impl Into<String>) -> Self {
        Self { status, code, msg: msg.into() }
    }

    /// 400: the request is wrong; `msg` says how.
    pub fn bad(code: ApiErrorCode, msg: impl Into<String>) -> Self {
        Self::new(StatusCode::BAD_REQUEST, code, msg)
    }

    /// 404: nothing of that name.
    pub fn not_found(code: ApiErrorCode, msg: impl Into<String>) -> Self {
        Self::new(StatusCode::NOT_FOUND, code, msg)
    }

    /// 500: the server failed; the answer carries the error with its causes.
    pub fn internal(error: &(dyn std::error::Error + 'static)) -> Self {
        Self::new(StatusCode::INTERNAL_SERVER_ERROR, ApiErrorCode::Internal, report(error))
    }

    pub fn status(&self) -> StatusCode {
        self.status
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        if self.status.is_server_error() {
            tracing::error!(status = self.status.as_u16(), code = ?self.code, msg = %self.msg, "API request failed");
        }
        (self.status, Json(ApiErrorBody { code: self.code, msg: self.msg })).into_response()
    }
}

/// A tick-by-tick request refused here or by the books' host: the same status and error.
impl From<crate::l3::control::Refusal> for ApiError {
    fn from(r: crate::l3::control::Refusal) -> Self {
        let status = StatusCode::from_u16(r.status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
        ApiError::new(status, r.code, r.msg)
    }
}
