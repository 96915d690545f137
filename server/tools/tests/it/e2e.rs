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
    let r = crate::result_of(
        Command::new(env!("CARGO_BIN_EXE_millrace-e2e"))
            .args(["--clients", "4", "--instruments", "2", "--duration-s", "3", "--nats", &nats])
            .args(["--pg", &testkit::pg_admin_url()])
            .arg("--bin")
            .arg(&bin),
    );
    for mode in ["single", "cluster"] {
        let m = &r[mode];
        assert!(m["samples"].as_u64().unwrap() > 0, "{mode}: {r:#}");
        assert_eq!(m["duplicates"], 0, "{mode}: {r:#}");
        assert!(m["max_ms"].as_i64().unwrap() >= m["p50_ms"].as_i64().unwrap(), "{r:#}");
    }
}
