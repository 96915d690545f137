//! Architecture invariants that a compiler does not check (see ARCHITECTURE.md, "Invariants"):
//! - `shared` stays sans-IO — no clock, no threads, no files or sockets, no IO/UI crates — and
//!   market values are never floats in its public types;
//! - no two public types of the workspace share a name;
//! - the service spawns tasks and threads only through its one shutdown mechanism;
//! - only the composition roots (the service's `app.rs`, the cluster's gateway and worker) name
//!   the concrete bus and store;
//! - only the cluster (`server/src/cluster/`) and the NATS bus (`server/src/bus/nats.rs`) name
//!   `async_nats`: the cluster is a layer around the service, not threaded through it;
//! - the service locks only through `lock.rs` (one poisoning policy);
//! - configuration (`server/src/config/`) is a leaf: it names no module of the service but the
//!   redaction of secrets and the error report, so every part reads it and it reads no part;
//! - no `Result<_, String>` crosses a module boundary;
//! - no source, script or manifest names a path outside the repository (the repository tests on
//!   its own: recorded data lives in `testdata/`).

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
            || rel == "server/src/cluster/gateway.rs"
            || rel == "server/src/cluster/worker.rs"
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
    assert!(
        hits.is_empty(),
        "concrete bus or store named outside the composition roots:\n{}",
        hits.join("\n")
    );
}

/// The NATS client is named only by the cluster and the NATS bus: the service offers plug
/// points (where closed candles go, where depth comes from, who answers for its books) and the
/// cluster fills them, so that someone editing a job can tell what a worker needs without
/// reading the cluster.
#[test]
fn only_the_cluster_and_the_nats_bus_name_async_nats() {
    let mut files = Vec::new();
    rust_files(&workspace_root().join("server/src"), &mut files);
    let hits = names_outside(&files, "async_nats", |rel| {
        rel.starts_with("server/src/cluster/") || rel == "server/src/bus/nats.rs"
    });
    assert!(hits.is_empty(), "async_nats named outside the cluster:\n{}", hits.join("\n"));
}

/// One way to lock: every lock, read, write and wait of the service goes through `lock.rs`,
/// which recovers a poisoned guard; nothing else decides what poisoning means.
#[test]
fn only_lock_rs_handles_poisoning() {
    let mut files = Vec::new();
    rust_files(&workspace_root().join("server/src"), &mut files);
    let hits = names_outside(&files, "PoisonError", |rel| rel == "server/src/lock.rs");
    assert!(hits.is_empty(), "poisoning handled outside lock.rs:\n{}", hits.join("\n"));
}

/// `file:line` of every code line naming `word` in a file that `allowed` does not pass.
fn names_outside(files: &[PathBuf], word: &str, allowed: impl Fn(&str) -> bool) -> Vec<String> {
    let mut hits = Vec::new();
    for f in files {
        let rel = relative(f);
        if allowed(&rel) {
            continue;
        }
        for (n, code) in code_lines(f) {
            if code.contains(word) {
                hits.push(format!("{rel}:{n}"));
            }
        }
    }
    hits
}

#[test]
fn a_file_naming_a_word_outside_its_rooms_is_found() {
    let dir = std::env::temp_dir().join(format!("millrace-tidy-nats-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let file = dir.join("app.rs");
    std::fs::write(&file, "// async_nats in a comment is fine\nuse async_nats::Client;\n").unwrap();
    let hits = names_outside(std::slice::from_ref(&file), "async_nats", |_| false);
    assert_eq!(hits.len(), 1, "{hits:?}");
    assert!(hits[0].ends_with(":2"), "{hits:?}");
    assert!(names_outside(&[file], "async_nats", |_| true).is_empty());
    let _ = std::fs::remove_dir_all(&dir);
}

/// The modules of the crate (`crate::NAME`) that code lines of `files` name, as `file:line NAME`,
/// leaving out those `allowed` passes.
fn crate_modules_named(files: &[PathBuf], allowed: impl Fn(&str) -> bool) -> Vec<String> {
    let mut hits = Vec::new();
    for f in files {
        for (n, code) in code_lines(f) {
            for (at, _) in code.match_indices("crate::") {
                let before = code[..at].chars().next_back();
                if before.is_some_and(|c| c.is_alphanumeric() || c == '_' || c == '$') {
                    continue;
                }
                let rest = &code[at + "crate::".len()..];
                let name: String =
                    rest.chars().take_while(|c| c.is_alphanumeric() || *c == '_').collect();
                if !allowed(&name) {
                    hits.push(format!("{}:{n} {name}", relative(f)));
                }
            }
        }
    }
    hits
}

/// Configuration is read by every part of the service, so it reads none of them: a type it
/// holds (the engine's settings, the allowed origins and hosts, the PostgreSQL URL's
/// parameters) is defined with it, and the part that uses it imports it from there.
#[test]
fn configuration_is_a_leaf() {
    let mut files = Vec::new();
    rust_files(&workspace_root().join("server/src/config"), &mut files);
    assert!(files.len() >= 2, "server/src/config/ holds the configuration");
    let hits = crate_modules_named(&files, |m| matches!(m, "config" | "redact" | "error"));
    assert!(hits.is_empty(), "configuration names other modules:\n{}", hits.join("\n"));
}

#[test]
fn a_module_named_by_configuration_is_found() {
    let dir = std::env::temp_dir().join(format!("millrace-tidy-leaf-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let file = dir.join("mod.rs");
    let text = "// crate::store in a comment is fine\nuse crate::redact::redact;\n\
                pub x: crate::l3::engine::EngineConfig,\nlet y = $crate::z;\n";
    std::fs::write(&file, text).unwrap();
    let hits = crate_modules_named(std::slice::from_ref(&file), |m| m == "redact");
    assert_eq!(hits.len(), 1, "{hits:?}");
    assert!(hits[0].ends_with(":3 l3"), "{hits:?}");
    let _ = std::fs::remove_dir_all(&dir);
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

/// Directories the walk for paths leaving the repository skips (relative to the root): build and
/// package outputs, and the recorded data (no code).
const NOT_CODE: [&str; 9] = [
    "target",
    "dist",
    "data",
    "testdata",
    "tests/browser/out",
    "fuzz/target",
    "fuzz/corpus",
    "fuzz/artifacts",
    "fuzz/coverage",
];

/// Every source, test, bench, example and build script (`.rs`), manifest (`Cargo.toml`), shell
/// script (`.sh`, or a `#!` line naming a shell) and `.mjs` file of the checkout.
fn code_and_scripts(dir: &Path, out: &mut Vec<PathBuf>) {
    for entry in std::fs::read_dir(dir).unwrap() {
        let p = entry.unwrap().path();
        let name = p.file_name().unwrap_or_default().to_string_lossy().to_string();
        if p.is_dir() {
            if name != ".git"
                && name != "node_modules"
                && !NOT_CODE.contains(&relative(&p).as_str())
            {
                code_and_scripts(&p, out);
            }
            continue;
        }
        let shell = || {
            let head = std::fs::read(&p).unwrap_or_default();
            let first = head.split(|b| *b == b'\n').next().unwrap_or_default();
            first.starts_with(b"#!") && String::from_utf8_lossy(first).contains("sh")
        };
        if name.ends_with(".rs")
            || name.ends_with(".mjs")
            || name.ends_with(".sh")
            || name == "Cargo.toml"
            || shell()
        {
            out.push(p);
        }
    }
}

/// The places in `text` (the file `file`, relative to the root) that name a path outside the
/// repository: an absolute path under a home or work directory (`/home/…`, `/root/…`, `/Users/…`,
/// `/work/…`, `~/…`), or a relative path with a `..` component that names nothing in the
/// checkout from any base it could be relative to — the file's directory, its crate's directory
/// (what `CARGO_MANIFEST_DIR` and a manifest's `path =` start from) and the root — for it
/// climbs above the root (the data directory beside the checkout) or names nothing that exists.
/// `exists` answers for a path relative to the root.
fn paths_leaving_the_repository(
    file: &Path,
    text: &str,
    exists: &dyn Fn(&Path) -> bool,
) -> Vec<String> {
    let dir = file.parent().unwrap_or(Path::new(""));
    let krate = dir
        .ancestors()
        .find(|d| exists(&d.join("Cargo.toml")))
        .unwrap_or(Path::new(""))
        .to_path_buf();
    let bases = [dir.to_path_buf(), krate, PathBuf::new()];
    let is_path_char = |c: char| c.is_ascii_alphanumeric() || "_-./~$".contains(c);
    let mut hits = Vec::new();
    for (n, line) in text.lines().enumerate() {
        let mut rest = line;
        while let Some(start) = rest.find(is_path_char) {
            let before = rest[..start].chars().last();
            let len = rest[start..].find(|c: char| !is_path_char(c)).unwrap_or(rest.len() - start);
            let token = &rest[start..start + len];
            rest = &rest[start + len..];
            let home = ["/home/", "/root/", "/Users/", "/work/", "~/"];
            if home.iter().any(|h| token.starts_with(h)) {
                hits.push(format!(
                    "{}:{}: {token} (a home or work directory)",
                    file.display(),
                    n + 1
                ));
                continue;
            }
            // `$(dirname "$0")/..`, `${dir}/..`: relative to something the line computes
            let relative_token = match token.strip_prefix('/') {
                Some(t) if matches!(before, Some(')' | '}')) => t,
                Some(_) => continue,
                None if token.contains('/') => token,
                None => continue, // `..` alone is Rust's range or struct update
            };
            let parts: Vec<&str> = relative_token.split('/').collect();
            if !parts.contains(&"..") {
                continue;
            }
            let inside = bases.iter().any(|base| {
                let mut at: Vec<String> =
                    base.components().map(|c| c.as_os_str().to_string_lossy().into()).collect();
                for (i, part) in parts.iter().enumerate() {
                    // a sentence's full stop is not part of the name
                    let part = if i + 1 == parts.len() && *part != ".." {
                        part.trim_end_matches('.')
                    } else {
                        part
                    };
                    match part {
                        "" | "." => {}
                        ".." => {
                            if at.pop().is_none() {
                                return false;
                            }
                        }
                        name => at.push(name.to_string()),
                    }
                }
                exists(&at.iter().collect::<PathBuf>())
            });
            if !inside {
                hits.push(format!(
                    "{}:{}: {token} (leaves the repository or names nothing in it)",
                    file.display(),
                    n + 1
                ));
            }
        }
    }
    hits
}

/// The repository tests on its own (a clone with no siblings passes): no source, test, bench,
/// example, build script, manifest, shell script or `.mjs` file names a path outside it.
#[test]
fn no_path_leaves_the_repository() {
    let root = workspace_root();
    let mut files = Vec::new();
    code_and_scripts(&root, &mut files);
    for must in ["scripts/test", ".ci/run", "fuzz/Cargo.toml", "server/build.rs"] {
        assert!(files.iter().any(|f| relative(f) == must), "the walk missed {must}");
    }
    assert!(files.iter().any(|f| relative(f).ends_with(".mjs")), "the walk found no .mjs file");
    let exists = |p: &Path| root.join(p).exists();
    let mut hits = Vec::new();
    // this file is left out: the test below plants the violations it must find
    for f in files.iter().filter(|f| relative(f) != "tests/it/tidy.rs") {
        let text = std::fs::read_to_string(f).unwrap();
        hits.extend(paths_leaving_the_repository(Path::new(&relative(f)), &text, &exists));
    }
    assert!(hits.is_empty(), "paths outside the repository:\n{}", hits.join("\n"));
}

/// The rule above finds each kind of path that leaves the repository, planted where it used to
/// be or could be, and passes the paths that stay inside.
#[test]
fn paths_leaving_the_repository_are_found() {
    let root = workspace_root();
    let exists = |p: &Path| root.join(p).exists();
    let check =
        |file: &str, text: &str| paths_leaving_the_repository(Path::new(file), text, &exists);
    // the data beside the checkout, spelt in pieces so this test is not itself a path leaving
    // the repository to whoever greps for one
    let beside = ["..", "shared", "data"].join("/");
    let from_manifest = [
        (
            "server/replay/src/input.rs",
            format!(r#"Path::new(env!("CARGO_MANIFEST_DIR")).join("../../{beside}")"#),
        ),
        (
            "server/tests/it/l3_replay.rs",
            format!(
                r#"PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../{beside}/sse-tick-by-tick")"#
            ),
        ),
        ("server/binance/src/wire.rs", format!("// copied from {beside}/binance-ws/cryptofeed")),
        ("README.md", format!("D={beside}")),
    ];
    for (file, text) in &from_manifest {
        assert_eq!(check(file, text).len(), 1, "not found in {file}: {text}");
    }
    let planted = [
        ("fuzz/Cargo.toml", r#"shared = { path = "../../shared" }"#),
        ("scripts/test", r#"cd "$(dirname "$0")/../..""#),
        ("tests/browser/harness.mjs", "const data = '../../../data';"),
        ("server/tests/it/main.rs", r#"let f = "/home/alice/millrace/testdata/x.gz";"#),
        ("scripts/bench", "cp out.json /work/results/"),
        ("scripts/bench", "cp out.json ~/results/"),
        ("server/benches/store.rs", r#"std::fs::read("/root/data.bin")"#),
    ];
    for (file, text) in planted {
        assert_eq!(check(file, text).len(), 1, "not found in {file}: {text}");
    }
    let fine = [
        ("fuzz/Cargo.toml", r#"shared = { path = "../shared" }"#),
        ("fuzz/Cargo.toml", r#"replay = { path = "../server/replay" }"#),
        ("scripts/test", r#"cd "$(dirname "$0")/..""#),
        ("server/tests/it/main.rs", "Candle { minutes: 1, ..*a }; for i in 0..=843 {}"),
        ("server/tests/it/main.rs", r#"// `{"code":-1,"msg":".."}`, steps `n..` applied"#),
        (
            "server/replay/src/input.rs",
            r#"Path::new(env!("CARGO_MANIFEST_DIR")).join("../../testdata")"#,
        ),
        ("scripts/bench", r#"export PATH="$HOME/.cargo/bin:$PATH""#),
        ("scripts/cluster", "mkdir -p /var/tmp/millrace-cluster"),
    ];
    for (file, text) in fine {
        assert_eq!(check(file, text), Vec::<String>::new(), "in {file}: {text}");
    }
}
