//! Architecture invariants that a compiler does not check (see ARCHITECTURE.md, "Invariants"):
//! `shared` stays sans-IO — no clock, no threads, no files or sockets, no IO/UI crates — and
//! market values are never floats in its public types.

use std::path::Path;

use e2e::workspace_root;

fn rust_files(dir: &Path, out: &mut Vec<std::path::PathBuf>) {
    for entry in std::fs::read_dir(dir).unwrap() {
        let p = entry.unwrap().path();
        if p.is_dir() {
            rust_files(&p, out);
        } else if p.extension().is_some_and(|e| e == "rs") {
            out.push(p);
        }
    }
}

#[test]
fn shared_does_no_io_and_reads_no_clock() {
    let mut files = Vec::new();
    rust_files(&workspace_root().join("shared/src"), &mut files);
    assert!(files.len() >= 7, "found {files:?}");
    let forbidden = [
        "std::time", "Instant::now", "SystemTime", "std::thread", "std::fs", "std::net", "std::process",
        "std::env", "tokio", "web_sys", "js_sys", "println!", "eprintln!",
    ];
    let mut hits = Vec::new();
    for f in &files {
        let text = std::fs::read_to_string(f).unwrap();
        for (n, line) in text.lines().enumerate() {
            let code = line.split("//").next().unwrap_or("");
            for word in forbidden {
                if code.contains(word) {
                    hits.push(format!("{}:{}: {word}", f.display(), n + 1));
                }
            }
        }
    }
    assert!(hits.is_empty(), "shared must stay sans-IO:\n{}", hits.join("\n"));
}

#[test]
fn shared_depends_on_no_io_or_ui_crate() {
    let manifest = std::fs::read_to_string(workspace_root().join("shared/Cargo.toml")).unwrap();
    let deps = manifest.split("[dependencies]").nth(1).unwrap().split("\n[").next().unwrap();
    for krate in ["tokio", "web-sys", "axum", "leptos", "reqwest", "gloo", "mio", "async-std", "getrandom"] {
        assert!(
            !deps.lines().any(|l| l.trim_start().starts_with(krate)),
            "shared/Cargo.toml [dependencies] names {krate}"
        );
    }
}

#[test]
fn shared_public_types_hold_no_floats() {
    let mut files = Vec::new();
    rust_files(&workspace_root().join("shared/src"), &mut files);
    let mut hits = Vec::new();
    for f in &files {
        let text = std::fs::read_to_string(f).unwrap();
        // only the library part, not the unit tests at the end of a file
        let lib = text.split("#[cfg(test)]").next().unwrap();
        for (n, line) in lib.lines().enumerate() {
            let code = line.split("//").next().unwrap_or("");
            if code.contains("f64") || code.contains("f32") {
                hits.push(format!("{}:{}", f.display(), n + 1));
            }
        }
    }
    assert!(hits.is_empty(), "floats in shared:\n{}", hits.join("\n"));
}
