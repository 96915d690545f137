//! The server's REST API, called with the browser's `fetch`.

use serde::Deserialize;
use shared::protocol::{InstrumentId, RestDepth, RestDepthResponse};
use wasm_bindgen::{JsCast, JsValue};
use wasm_bindgen_futures::JsFuture;
use web_sys::Response;

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

async fn get_text(path: &str) -> Result<String, String> {
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
