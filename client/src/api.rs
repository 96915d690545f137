//! The server's REST API, called with the browser's `fetch`.

use serde::Deserialize;
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
