//! Where the dashboard's files come from: the directory `--static-dir` names, else the copy
//! embedded in the binary at build time (`server/build.rs`), else nowhere: then the API still
//! runs and `/` says how to build it. No directory is looked for by default: a path known at
//! build time (the build machine's `dist/`) means nothing where the binary runs, and whatever
//! sits there (an older build, another checkout, someone else's files) would be served in
//! place of the dashboard the binary was built with.

use std::path::{Path, PathBuf};

use axum::body::Body;
use axum::http::{header, Method, StatusCode, Uri};
use axum::response::{IntoResponse, Response};

mod embedded {
    include!(concat!(env!("OUT_DIR"), "/dashboard.rs"));
}

/// The dashboard a server serves.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Dashboard {
    /// Files from this directory (it has an `index.html`).
    Dir(PathBuf),
    /// The files embedded in the binary.
    Embedded,
    /// None: `/` explains how to build it.
    Missing,
}

/// Why the dashboard cannot be served as configured.
#[derive(Debug, thiserror::Error)]
#[error("--static-dir {}: no index.html; build the dashboard first with `scripts/build-client` (or pass --static-dir / set MILLRACE_STATIC_DIR to a built dist directory)", .0.display())]
pub struct NoDashboard(pub PathBuf);

impl Dashboard {
    /// The dashboard for `configured` (`server.static_dir`): that directory, which must hold an
    /// `index.html`; else the embedded copy, or none.
    pub fn choose(configured: Option<&Path>) -> Result<Dashboard, NoDashboard> {
        Self::choose_from(configured, !embedded::FILES.is_empty())
    }

    fn choose_from(configured: Option<&Path>, embedded: bool) -> Result<Dashboard, NoDashboard> {
        if let Some(dir) = configured {
            return match dir.join("index.html").is_file() {
                true => Ok(Dashboard::Dir(dir.to_path_buf())),
                false => Err(NoDashboard(dir.to_path_buf())),
            };
        }
        Ok(if embedded { Dashboard::Embedded } else { Dashboard::Missing })
    }

    /// For the start-up log line.
    pub fn describe(&self) -> String {
        match self {
            Dashboard::Dir(d) => d.display().to_string(),
            Dashboard::Embedded => format!("embedded ({} files)", embedded::FILES.len()),
            Dashboard::Missing => "none (not built: run scripts/build-client)".to_string(),
        }
    }
}

/// Serves a file of the embedded dashboard (`/` is `index.html`).
pub async fn serve_embedded(method: Method, uri: Uri) -> Response {
    serve_from(embedded::FILES, &method, &uri)
}

fn serve_from(
    files: &'static [(&'static str, &'static [u8])],
    method: &Method,
    uri: &Uri,
) -> Response {
    if method != Method::GET && method != Method::HEAD {
        return StatusCode::METHOD_NOT_ALLOWED.into_response();
    }
    let path = uri.path().trim_start_matches('/');
    let path = if path.is_empty() { "index.html" } else { path };
    match files.iter().find(|(name, _)| *name == path) {
        Some((name, bytes)) => {
            let body = if method == Method::HEAD { Body::empty() } else { Body::from(*bytes) };
            ([(header::CONTENT_TYPE, content_type(name))], body).into_response()
        }
        None => (StatusCode::NOT_FOUND, "not found").into_response(),
    }
}

/// What `/` answers when there is no dashboard: how to build one. The API runs as usual.
pub async fn serve_missing(uri: Uri) -> Response {
    match uri.path() {
        "/" | "/index.html" => {
            ([(header::CONTENT_TYPE, "text/html; charset=utf-8")], MISSING_PAGE).into_response()
        }
        _ => (StatusCode::NOT_FOUND, "not found").into_response(),
    }
}

const MISSING_PAGE: &str = "<!doctype html>\n<meta charset=utf-8>\n<title>millrace: no dashboard</title>\n\
<h1>millrace is running, without its dashboard</h1>\n\
<p>This binary was built before the dashboard was, and no <code>--static-dir</code> was given.\n\
The API works: <a href=\"/healthz\">/healthz</a>, <a href=\"/api/v1/series\">/api/v1/series</a>, <code>/ws</code>.</p>\n\
<p>To get the dashboard, in a checkout of millrace run <code>scripts/build-client</code>, then either\n\
start with <code>--static-dir dist</code> (or <code>MILLRACE_STATIC_DIR=dist</code>), or rebuild the binary\n\
(<code>cargo build --release</code> or <code>cargo install --path server</code>) to embed it.</p>\n";

fn content_type(name: &str) -> &'static str {
    match name.rsplit_once('.').map(|(_, ext)| ext) {
        Some("html") => "text/html; charset=utf-8",
        Some("js" | "mjs") => "text/javascript; charset=utf-8",
        Some("wasm") => "application/wasm",
        Some("css") => "text/css; charset=utf-8",
        Some("json") => "application/json",
        Some("svg") => "image/svg+xml",
        Some("png") => "image/png",
        Some("ico") => "image/x-icon",
        Some("txt") => "text/plain; charset=utf-8",
        _ => "application/octet-stream",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn temp_dir(tag: &str, with_index: bool) -> PathBuf {
        let d = std::env::temp_dir().join(format!("millrace-dash-{}-{tag}", std::process::id()));
        std::fs::create_dir_all(&d).unwrap();
        if with_index {
            std::fs::write(d.join("index.html"), "<title>x</title>").unwrap();
        }
        d
    }

    #[test]
    fn a_configured_directory_must_hold_the_dashboard_and_otherwise_the_embedded_one_serves() {
        let built = temp_dir("built", true);
        let empty = temp_dir("empty", false);
        assert_eq!(
            Dashboard::choose_from(Some(&built), true).unwrap(),
            Dashboard::Dir(built.clone())
        );
        let e = Dashboard::choose_from(Some(&empty), true).unwrap_err().to_string();
        assert!(e.contains("scripts/build-client"), "{e}");
        // not configured: the embedded copy, else none; never a directory
        assert_eq!(Dashboard::choose_from(None, true).unwrap(), Dashboard::Embedded);
        assert_eq!(Dashboard::choose_from(None, false).unwrap(), Dashboard::Missing);
    }

    #[test]
    fn embedded_files_are_served_with_their_type_and_others_are_not_found() {
        let files: &'static [(&str, &[u8])] =
            &[("index.html", b"<title>m</title>"), ("client_bg.wasm", b"\0asm")];
        let get = |p: &str| serve_from(files, &Method::GET, &p.parse().unwrap());
        let r = get("/");
        assert_eq!(r.status(), StatusCode::OK);
        assert_eq!(r.headers()[header::CONTENT_TYPE], "text/html; charset=utf-8");
        assert_eq!(get("/client_bg.wasm").headers()[header::CONTENT_TYPE], "application/wasm");
        assert_eq!(get("/nope.js").status(), StatusCode::NOT_FOUND);
        assert_eq!(get(&format!("/{}", "a".repeat(300))).status(), StatusCode::NOT_FOUND);
        let post = serve_from(files, &Method::POST, &"/".parse().unwrap());
        assert_eq!(post.status(), StatusCode::METHOD_NOT_ALLOWED);
    }
}
