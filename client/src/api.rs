//! The server's REST API, called with the browser's `fetch`.

use serde::Deserialize;
use shared::candle::Candle;
use shared::protocol::{InstrumentId, RestDepth, RestDepthResponse, SeriesId};
use shared::{Price, Volume};
use wasm_bindgen::{JsCast, JsValue};
use wasm_bindgen_futures::JsFuture;
use web_sys::{Headers, RequestInit, Response};

/// Body of `GET /api/v1/version`.
#[derive(Debug, Deserialize)]
struct VersionInfo {
    version: String,
}

/// The server's version, or a message saying why it could not be read.
pub async fn fetch_version() -> Result<String, String> {
    let body = get_text("/api/v1/version").await?;
    let info: VersionInfo =
        serde_json::from_str(&body).map_err(|e| format!("/api/v1/version: bad JSON: {e}"))?;
    Ok(info.version)
}

/// `GET /fapi/v1/depth?symbol=…&with_id=true&limit=…`: a book snapshot with its update id.
pub async fn fetch_depth(instrument: &InstrumentId, limit: u16) -> Result<RestDepth, String> {
    let symbol = String::from(js_sys::encode_uri_component(&instrument.to_string()));
    let path = format!("/fapi/v1/depth?symbol={symbol}&with_id=true&limit={limit}");
    let body = get_text(&path).await?;
    let response: RestDepthResponse = serde_json::from_str(&body).map_err(|e| format!("{path}: bad JSON: {e}"))?;
    if response.code != 0 {
        return Err(format!("{path}: code {}", response.code));
    }
    Ok(response.data)
}

/// `GET /api/v1/klines`: stored closed candles of `series`, oldest first; with `start`, the
/// oldest `limit` from it, else the newest `limit`.
pub async fn fetch_klines(series: &SeriesId, start: Option<i64>, limit: u32) -> Result<Vec<Candle>, String> {
    let name = String::from(js_sys::encode_uri_component(&series.to_string()));
    let mut path = format!("/api/v1/klines?series={name}&limit={limit}");
    if let Some(t) = start {
        path += &format!("&startTime={t}");
    }
    let rows: Vec<(i64, String, String, String, String, String, i64, serde_json::Value, u64)> = get_json(&path).await?;
    rows.into_iter()
        .map(|(t, o, h, l, c, v, _, _, n)| {
            let p = |s: &str| Price::parse(s).map_err(|e| format!("{path}: bad price {s:?}: {e}"));
            let volume = Volume::parse(&v).map_err(|e| format!("{path}: bad volume {v:?}: {e}"))?;
            Ok(Candle::one_minute(t, p(&o)?, p(&h)?, p(&l)?, p(&c)?, volume, n))
        })
        .collect()
}

/// `GET path` decoded as JSON into `T`.
pub async fn get_json<T: serde::de::DeserializeOwned>(path: &str) -> Result<T, String> {
    let body = get_text(path).await?;
    serde_json::from_str(&body).map_err(|e| format!("{path}: bad JSON: {e}"))
}

/// Why an admin request failed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum AdminError {
    /// 401/403: the token is missing or wrong (or admin actions are disabled); `msg` is the server's.
    Unauthorized(String),
    /// Anything else: network, HTTP status with the server's message, bad JSON.
    Failed(String),
}

impl std::fmt::Display for AdminError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            AdminError::Unauthorized(m) | AdminError::Failed(m) => f.write_str(m),
        }
    }
}

/// `POST path` with a JSON body and `Authorization: Bearer <token>`; the reply's JSON.
pub async fn admin_post(path: &str, body: &serde_json::Value, token: &str) -> Result<serde_json::Value, AdminError> {
    let failed = |e: JsValue| AdminError::Failed(format!("{path}: {}", e.as_string().unwrap_or_else(|| format!("{e:?}"))));
    let init = RequestInit::new();
    init.set_method("POST");
    init.set_body(&JsValue::from_str(&body.to_string()));
    let headers = Headers::new().map_err(failed)?;
    headers.set("content-type", "application/json").map_err(failed)?;
    headers.set("authorization", &format!("Bearer {token}")).map_err(failed)?;
    init.set_headers(&headers);
    let window = web_sys::window().ok_or_else(|| AdminError::Failed("no window".into()))?;
    let response: Response = JsFuture::from(window.fetch_with_str_and_init(path, &init))
        .await
        .map_err(failed)?
        .dyn_into()
        .map_err(failed)?;
    let text = JsFuture::from(response.text().map_err(failed)?).await.map_err(failed)?.as_string().unwrap_or_default();
    let json: serde_json::Value = serde_json::from_str(&text).unwrap_or(serde_json::Value::Null);
    if response.ok() {
        return Ok(json);
    }
    let msg = json.get("msg").and_then(|m| m.as_str()).map_or_else(|| format!("HTTP {}", response.status()), str::to_string);
    match response.status() {
        401 | 403 => Err(AdminError::Unauthorized(msg)),
        s => Err(AdminError::Failed(format!("{path}: HTTP {s}: {msg}"))),
    }
}

/// `GET path` as text; a non-2xx status is an error.
pub async fn get_text(path: &str) -> Result<String, String> {
    let js_err = |e: JsValue| format!("{path}: {}", e.as_string().unwrap_or_else(|| format!("{e:?}")));
    let window = web_sys::window().ok_or("no window")?;
    let response: Response = JsFuture::from(window.fetch_with_str(path))
        .await
        .map_err(js_err)?
        .dyn_into()
        .map_err(js_err)?;
    if !response.ok() {
        return Err(format!("{path}: HTTP {}", response.status()));
    }
    let text = JsFuture::from(response.text().map_err(js_err)?).await.map_err(js_err)?;
    text.as_string().ok_or_else(|| format!("{path}: body is not text"))
}
