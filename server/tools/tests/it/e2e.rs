//! The end-to-end latency tool: `millrace-e2e` with a few clients for a few seconds, through one
//! process and through a cluster (supervisor, two workers, gateway on the machine's NATS and
//! PostgreSQL). Checks that it measures — samples in both modes, each update seen once by each
//! client (the cluster de-duplicates its replicas) — not how fast (BENCHMARKS.md).

use std::process::Command;

#[test]
fn a_short_run_measures_both_modes_and_sees_each_update_once() {
    let bin = testkit::millrace_bin();
    assert!(bin.exists(), "{} is built by `cargo test --workspace`", bin.display());
    let nats =
        std::env::var("MILLRACE_TEST_NATS").unwrap_or_else(|_| "nats://127.0.0.1:4222".into());
    let out = Command::new(env!("CARGO_BIN_EXE_millrace-e2e"))
        .args(["--clients", "4", "--instruments", "2", "--duration-s", "3", "--nats", &nats])
        .args(["--pg", &testkit::pg_admin_url()])
        .arg("--bin")
        .arg(&bin)
        .output()
        .expect("millrace-e2e runs");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "exit {}\nstdout:\n{stdout}\nstderr:\n{stderr}", out.status);
    let line = stdout
        .lines()
        .find_map(|l| l.strip_prefix("RESULT "))
        .unwrap_or_else(|| panic!("no RESULT line\nstdout:\n{stdout}\nstderr:\n{stderr}"));
    let r: serde_json::Value = serde_json::from_str(line).expect("RESULT is JSON");
    for mode in ["single", "cluster"] {
        let m = &r[mode];
        assert!(m["samples"].as_u64().unwrap() > 0, "{mode}: {r:#}");
        assert_eq!(m["duplicates"], 0, "{mode}: {r:#}");
        assert!(m["max_ms"].as_i64().unwrap() >= m["p50_ms"].as_i64().unwrap(), "{r:#}");
    }
}
