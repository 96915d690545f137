//! Architecture invariants that a compiler does not check (see ARCHITECTURE.md, "Invariants"):
//! - `shared` stays sans-IO — no clock, no threads, no files or sockets, no IO/UI crates — and
//!   market values are never floats in its public types;
//! - no two public types of the workspace share a name;
//! - the service spawns tasks and threads only through its one shutdown mechanism;
//! - only the composition root names the concrete bus and store;
//! - no `Result<_, String>` crosses a module boundary.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use crate::workspace_root;

fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    for entry in std::fs::read_dir(dir).unwrap() {
        let p = entry.unwrap().path();
        if p.is_dir() {
            rust_files(&p, out);
        } else if p.extension().is_some_and(|e| e == "rs") {
            out.push(p);
        }
    }
}

/// Every library and binary source file of the workspace (not tests, benches or examples).
fn source_files() -> Vec<PathBuf> {
    let root = workspace_root();
    let mut files = Vec::new();
    for dir in ["shared/src", "server/src", "client/src"] {
        rust_files(&root.join(dir), &mut files);
    }
    for krate in ["binance", "tbt", "sim", "replay", "tools", "testkit"] {
        rust_files(&root.join("server").join(krate).join("src"), &mut files);
    }
    files
}

/// The lines of `path` before its unit tests, without comments.
fn code_lines(path: &Path) -> Vec<(usize, String)> {
    let text = std::fs::read_to_string(path).unwrap();
    let lib = text.split("#[cfg(test)]").next().unwrap_or_default().to_string();
    lib.lines()
        .enumerate()
        .map(|(n, l)| (n + 1, l.split("//").next().unwrap_or("").to_string()))
        .collect()
}

fn relative(p: &Path) -> String {
    p.strip_prefix(workspace_root()).unwrap_or(p).display().to_string()
}

#[test]
fn shared_does_no_io_and_reads_no_clock() {
    let mut files = Vec::new();
    rust_files(&workspace_root().join("shared/src"), &mut files);
    assert!(files.len() >= 7, "found {files:?}");
    let forbidden = [
        "std::time",
        "Instant::now",
        "SystemTime",
        "std::thread",
        "std::fs",
        "std::net",
        "std::process",
        "std::env",
        "tokio",
        "web_sys",
        "js_sys",
        "println!",
        "eprintln!",
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
    for krate in
        ["tokio", "web-sys", "axum", "leptos", "reqwest", "gloo", "mio", "async-std", "getrandom"]
    {
        assert!(
            !deps.lines().any(|l| l.trim_start().starts_with(krate)),
            "shared/Cargo.toml [dependencies] names {krate}"
        );
    }
}

/// Market values are integers; the only floats of `shared` are UI figures that say so on their
/// line (`// float: not a market value`).
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
            if line.contains("// float: not a market value") {
                continue;
            }
            let code = line.split("//").next().unwrap_or("");
            if code.contains("f64") || code.contains("f32") {
                hits.push(format!("{}:{}", f.display(), n + 1));
            }
        }
    }
    assert!(hits.is_empty(), "floats in shared:\n{}", hits.join("\n"));
}

#[test]
fn no_two_public_types_share_a_name() {
    let mut seen: BTreeMap<String, Vec<String>> = BTreeMap::new();
    for f in source_files() {
        for (n, code) in code_lines(&f) {
            let t = code.trim_start();
            for kind in ["pub struct ", "pub enum ", "pub trait ", "pub type "] {
                if let Some(rest) = t.strip_prefix(kind) {
                    let name: String =
                        rest.chars().take_while(|c| c.is_alphanumeric() || *c == '_').collect();
                    seen.entry(name).or_default().push(format!("{}:{n}", relative(&f)));
                }
            }
        }
    }
    let dups: Vec<String> = seen
        .iter()
        .filter(|(_, at)| at.len() > 1)
        .map(|(name, at)| format!("{name}: {}", at.join(", ")))
        .collect();
    assert!(seen.len() > 100, "found only {} public types", seen.len());
    assert!(dups.is_empty(), "public types sharing a name:\n{}", dups.join("\n"));
}

/// The service starts tasks and threads only through `shutdown.rs` (so a stopped service leaves
/// none behind); the SQLite store owns its checkpoint thread and joins it itself, and the
/// PostgreSQL store closes its blocking connections on a thread it joins at once when dropped.
#[test]
fn the_service_spawns_only_through_its_shutdown() {
    let mut files = Vec::new();
    rust_files(&workspace_root().join("server/src"), &mut files);
    let allowed =
        ["server/src/shutdown.rs", "server/src/store/sqlite.rs", "server/src/store/postgres.rs"];
    let mut hits = Vec::new();
    for f in &files {
        if allowed.iter().any(|a| relative(f) == *a) {
            continue;
        }
        for (n, code) in code_lines(f) {
            for word in [
                "tokio::spawn(",
                "thread::spawn(",
                "thread::Builder",
                "runtime.spawn(",
                "Handle::current().spawn(",
            ] {
                if code.contains(word) {
                    hits.push(format!("{}:{n}: {word}", relative(f)));
                }
            }
        }
    }
    assert!(hits.is_empty(), "spawns outside shutdown.rs:\n{}", hits.join("\n"));
}

/// Everything but the composition root depends on the `Bus`, `CandleStore` and `BackfillStore`
/// traits, not on an implementation.
#[test]
fn only_the_composition_root_names_a_concrete_bus_or_store() {
    let mut files = Vec::new();
    rust_files(&workspace_root().join("server/src"), &mut files);
    let mut hits = Vec::new();
    for f in &files {
        let rel = relative(f);
        let unit_tests = rel.ends_with("/tests.rs");
        if unit_tests
            || rel == "server/src/app.rs"
            || rel.starts_with("server/src/bus/")
            || rel.starts_with("server/src/store/")
        {
            continue;
        }
        for (n, code) in code_lines(f) {
            for word in ["InProcessBus", "NatsBus", "SqliteStore", "PostgresStore"] {
                if code.contains(word) {
                    hits.push(format!("{rel}:{n}: {word}"));
                }
            }
        }
    }
    assert!(hits.is_empty(), "concrete bus or store named outside app.rs:\n{}", hits.join("\n"));
}

/// Errors that cross a module boundary are types, not strings.
#[test]
fn no_public_function_returns_a_string_error() {
    let mut hits = Vec::new();
    for f in source_files() {
        let text = std::fs::read_to_string(&f).unwrap();
        let lib = text.split("#[cfg(test)]").next().unwrap_or_default();
        // signatures may span lines: join each `pub fn` up to its body
        for (i, _) in lib.match_indices("pub fn ").chain(lib.match_indices("pub async fn ")) {
            let sig = &lib[i..lib[i..].find('{').map_or(lib.len(), |j| i + j)];
            let sig: String = sig.split_whitespace().collect::<Vec<_>>().join(" ");
            if sig.contains(", String>") && sig.contains("Result<") {
                let line = lib[..i].lines().count() + 1;
                hits.push(format!("{}:{line}: {sig}", relative(&f)));
            }
        }
    }
    assert!(hits.is_empty(), "public functions returning Result<_, String>:\n{}", hits.join("\n"));
}
