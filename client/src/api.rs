//! The server's REST API, through `gloo-net`'s fetch. Every answer is read into the
//! `shared::protocol` type the server wrote it from (so a field renamed on either side fails to
//! compile, or fails here with the field's name); every failure is a [`FetchError`].

use gloo_net::http::{Request, Response};
use serde::de::DeserializeOwned;
use serde::Serialize;
use shared::candle::Candle;
use shared::protocol::ops::{ApiErrorBody, KlineRow, VersionInfo};
use shared::protocol::{InstrumentId, RestDepth, RestDepthResponse, SeriesId};

/// Why a request to the server did not give its answer.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum FetchError {
    /// The request did not complete (network, server down, CORS).
    #[error("{path}: {msg}")]
    Network { path: String, msg: String },
    /// The server answered with an error status; `msg` is its own message when it sent one.
    #[error("{path}: HTTP {status}: {msg}")]
    Refused { path: String, status: u16, msg: String },
    /// The answer is not what the endpoint returns.
    #[error("{path}: bad answer: {msg}")]
    Decode { path: String, msg: String },
}

impl FetchError {
    /// 401/403: the admin token is missing or wrong, or admin actions are disabled.
    pub fn is_unauthorized(&self) -> bool {
        matches!(self, FetchError::Refused { status: 401 | 403, .. })
    }

    /// The server's own message (for a refusal), else the whole error.
    pub fn message(&self) -> String {
        match self {
            FetchError::Refused { msg, .. } => msg.clone(),
            other => other.to_string(),
        }
    }
}

/// The server's version.
pub async fn fetch_version() -> Result<String, FetchError> {
    Ok(get_json::<VersionInfo>("/api/v1/version").await?.version)
}

/// `GET /fapi/v1/depth?symbol=…&with_id=true&limit=…`: a book snapshot with its update id.
pub async fn fetch_depth(instrument: &InstrumentId, limit: u16) -> Result<RestDepth, FetchError> {
    let symbol = String::from(js_sys::encode_uri_component(&instrument.to_string()));
    let path = format!("/fapi/v1/depth?symbol={symbol}&with_id=true&limit={limit}");
    let response: RestDepthResponse = get_json(&path).await?;
    if response.code != 0 {
        return Err(FetchError::Decode { path, msg: format!("code {}", response.code) });
    }
    Ok(response.data)
}

/// `GET /api/v1/klines`: stored closed candles of `series`, oldest first; with `start`, the
/// oldest `limit` from it, else the newest `limit`.
pub async fn fetch_klines(
    series: &SeriesId,
    start: Option<i64>,
    limit: u32,
) -> Result<Vec<Candle>, FetchError> {
    let name = String::from(js_sys::encode_uri_component(&series.to_string()));
    let mut path = format!("/api/v1/klines?series={name}&limit={limit}");
    if let Some(t) = start {
        path += &format!("&startTime={t}");
    }
    let rows: Vec<KlineRow> = get_json(&path).await?;
    Ok(rows.iter().map(|r| r.candle(1)).collect())
}

/// `GET path` decoded as JSON into `T`.
pub async fn get_json<T: DeserializeOwned>(path: &str) -> Result<T, FetchError> {
    let response = Request::get(path).send().await.map_err(|e| network(path, e))?;
    decode(path, response).await
}

/// `POST path` with a JSON body and `Authorization: Bearer <token>`; the answer decoded as `R`.
pub async fn admin_post<B: Serialize, R: DeserializeOwned>(
    path: &str,
    body: &B,
    token: &str,
) -> Result<R, FetchError> {
    let request = Request::post(path)
        .header("authorization", &format!("Bearer {token}"))
        .json(body)
        .map_err(|e| FetchError::Decode { path: path.to_string(), msg: e.to_string() })?;
    let response = request.send().await.map_err(|e| network(path, e))?;
    decode(path, response).await
}

fn network(path: &str, e: gloo_net::Error) -> FetchError {
    FetchError::Network { path: path.to_string(), msg: e.to_string() }
}

/// A 2xx answer as `T`; any other status as [`FetchError::Refused`] with the server's message.
async fn decode<T: DeserializeOwned>(path: &str, response: Response) -> Result<T, FetchError> {
    let text = response.text().await.map_err(|e| network(path, e))?;
    if !response.ok() {
        let msg = serde_json::from_str::<ApiErrorBody>(&text)
            .map(|b| b.msg)
            .unwrap_or_else(|_| text.clone());
        return Err(FetchError::Refused { path: path.to_string(), status: response.status(), msg });
    }
    serde_json::from_str(&text)
        .map_err(|e| FetchError::Decode { path: path.to_string(), msg: e.to_string() })
}
