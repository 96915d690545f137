//! Embeds the built dashboard in the `millrace` binary when there is one to embed, so a binary
//! installed on its own (`cargo install`) serves it. The dashboard is `dist/` at the workspace
//! root (made by `scripts/build-client`), or the directory `MILLRACE_DASHBOARD_DIR` names. Without
//! an `index.html` there, nothing is embedded and the server explains on `/` how to build it.
//!
//! Cargo re-runs this when the embedded directory changes. While there is none, it watches only
//! this file (a missing path would re-run it, and rebuild the server, on every build), so
//! `scripts/build-client` touches this file after writing `dist/`.

use std::fmt::Write as _;
use std::path::{Path, PathBuf};

fn main() {
    println!("cargo::rerun-if-env-changed=MILLRACE_DASHBOARD_DIR");
    println!("cargo::rerun-if-changed=build.rs");
    let manifest = PathBuf::from(std::env::var("CARGO_MANIFEST_DIR").expect("set by cargo"));
    let dir = match std::env::var_os("MILLRACE_DASHBOARD_DIR") {
        Some(d) => PathBuf::from(d),
        None => manifest.parent().unwrap_or(&manifest).join("dist"),
    };
    let mut files = Vec::new();
    if dir.join("index.html").is_file() {
        println!("cargo::rerun-if-changed={}", dir.display());
        collect(&dir, &dir, &mut files);
        files.sort();
    } else if std::env::var_os("MILLRACE_DASHBOARD_DIR").is_some() {
        panic!(
            "MILLRACE_DASHBOARD_DIR={}: no index.html (run scripts/build-client)",
            dir.display()
        );
    }
    let mut out = String::from(
        "/// The dashboard's files embedded at build time: path (`index.html`) and contents.\n\
         pub static FILES: &[(&str, &[u8])] = &[\n",
    );
    for (name, path) in &files {
        let _ = writeln!(out, "    ({name:?}, include_bytes!({:?})),", path.display().to_string());
    }
    out.push_str("];\n");
    let out_dir = PathBuf::from(std::env::var("OUT_DIR").expect("set by cargo"));
    std::fs::write(out_dir.join("dashboard.rs"), out).expect("OUT_DIR is writable");
}

/// Every regular file under `dir`, as (path relative to `root` with `/`, absolute path).
fn collect(root: &Path, dir: &Path, files: &mut Vec<(String, PathBuf)>) {
    let Ok(entries) = std::fs::read_dir(dir) else { return };
    for entry in entries.flatten() {
        let path = entry.path();
        if path.is_dir() {
            collect(root, &path, files);
        } else if path.is_file() {
            let rel = path.strip_prefix(root).expect("under root");
            let name =
                rel.components().map(|c| c.as_os_str().to_string_lossy()).collect::<Vec<_>>();
            let abs = path.canonicalize().unwrap_or(path.clone());
            files.push((name.join("/"), abs));
        }
    }
}
