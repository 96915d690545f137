//! The guard of the simulator's control requests: every request that changes the simulation
//! (`POST /sim/faults`, `POST /tbt/control`: anything but `GET`/`HEAD` under `/sim/` and `/tbt/`)
//! needs `Authorization: Bearer <control token>` and a JSON body.
//!
//! - No token configured: control is disabled, `403` (fail closed; `millrace serve` passes its
//!   `server.admin_token` to the simulator it embeds, `millrace sim` takes `--control-token` /
//!   `MILLRACE_SIM_TOKEN`).
//! - A missing or wrong token: `401` (SHA-256 digests compared in constant time, so neither the
//!   token's length nor where a guess differs leaks through timing).
//! - A body that is not `Content-Type: application/json`: `415`. A web page can send a
//!   `text/plain` POST to loopback without a CORS preflight; a JSON one needs the preflight,
//!   which the simulator never grants.
//!
//! Each refusal is counted (`control_refused` in `GET /sim/faults`) and answered
//! `{"code":-1,"msg":".."}`.

use std::sync::Arc;

use axum::extract::{Request, State};
use axum::http::{header, Method, StatusCode};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use axum::Json;

use crate::faults::{Count, Faults};

/// What the guard checks against.
#[derive(Clone)]
pub(crate) struct Guard {
    pub token: Option<Arc<str>>,
    pub faults: Arc<Faults>,
}

/// Whether `given` equals `expected`, in time independent of their lengths and of where they
/// differ: their digests are compared, in constant time.
fn same_token(given: &str, expected: &str) -> bool {
    use sha2::{Digest as _, Sha256};
    use subtle::ConstantTimeEq as _;
    let (given, expected) = (Sha256::digest(given.as_bytes()), Sha256::digest(expected.as_bytes()));
    given.as_slice().ct_eq(expected.as_slice()).into()
}

/// Whether `req` carries a JSON content type (`application/json`, parameters allowed).
fn is_json(req: &Request) -> bool {
    req.headers()
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.split(';').next())
        .is_some_and(|m| m.trim().eq_ignore_ascii_case("application/json"))
}

fn refuse(guard: &Guard, status: StatusCode, msg: &str) -> Response {
    guard.faults.count(Count::ControlRefused, 1);
    (status, Json(serde_json::json!({ "code": -1, "msg": msg }))).into_response()
}

/// The middleware (see the module docs).
pub(crate) async fn guard(State(g): State<Guard>, req: Request, next: Next) -> Response {
    if matches!(*req.method(), Method::GET | Method::HEAD) {
        return next.run(req).await;
    }
    let Some(expected) = g.token.as_deref() else {
        return refuse(
            &g,
            StatusCode::FORBIDDEN,
            "simulator control is disabled: it needs a control token (embedded: server.admin_token \
             or MILLRACE_ADMIN_TOKEN; standalone: --control-token or MILLRACE_SIM_TOKEN)",
        );
    };
    let given = req
        .headers()
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer "));
    if !given.is_some_and(|t| same_token(t, expected)) {
        return refuse(
            &g,
            StatusCode::UNAUTHORIZED,
            "missing or wrong `Authorization: Bearer <token>`",
        );
    }
    if !is_json(&req) {
        return refuse(
            &g,
            StatusCode::UNSUPPORTED_MEDIA_TYPE,
            "control requests must be `Content-Type: application/json`",
        );
    }
    next.run(req).await
}

#[cfg(test)]
mod tests {
    use super::same_token;

    #[test]
    fn tokens_compare_whole() {
        assert!(same_token("secret-token", "secret-token"));
        assert!(!same_token("secret-toke", "secret-token"));
        assert!(!same_token("secret-tokeN", "secret-token"));
        assert!(!same_token("", "secret-token"));
    }
}
