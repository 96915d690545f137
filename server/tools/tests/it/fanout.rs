//! The fan-out load tool end to end: `millrace-fanout run --quick` starts the real service and a
//! clients process (both children of the tool), measures idle memory and one load step, stops
//! both, and reports. This checks that the tool works — deliveries arrive, latency is measured,
//! nothing crashed — not how fast it is (that is measured in docs/bench-fanout.md). Once on one
//! process, once as a cluster gateway fed over the machine's NATS (`--gateway`).

use std::process::Command;

#[test]
fn quick_run_delivers_and_exits_cleanly() {
    check_quick_run(&[]);
}

#[test]
fn quick_run_through_a_cluster_gateway_delivers_and_exits_cleanly() {
    let nats =
        std::env::var("MILLRACE_TEST_NATS").unwrap_or_else(|_| "nats://127.0.0.1:4222".into());
    let r = check_quick_run(&["--gateway", &nats, "--pg", &testkit::pg_admin_url()]);
    assert_eq!(r["options"]["gateway"], true, "{r:#}");
}

/// Runs `millrace-fanout run --quick` with `extra` arguments and checks its result.
fn check_quick_run(extra: &[&str]) -> serde_json::Value {
    let r = crate::result_of(
        Command::new(env!("CARGO_BIN_EXE_millrace-fanout")).args(["run", "--quick"]).args(extra),
    );

    assert_eq!(r["server_exit_ok"], true, "{r:#}");
    assert_eq!(r["clients_exit_ok"], true, "{r:#}");
    assert_eq!(r["subscribed"], 500, "{r:#}");

    let idle = &r["idle"];
    assert_eq!(idle["connections"], 500, "{r:#}");
    assert_eq!(idle["clients_exit_ok"], true, "{r:#}");
    assert!(idle["bytes_per_connection"].as_f64().unwrap() > 0.0, "{r:#}");

    let step = &r["steps"][0];
    assert!(step["deliveries_per_s"].as_f64().unwrap() > 0.0, "{r:#}");
    assert!(step["publish_per_s"].as_f64().unwrap() > 0.0, "{r:#}");
    assert!(step["latency_ms"]["samples"].as_u64().unwrap() > 0, "{r:#}");
    assert!(
        step["latency_ms"]["max"].as_f64().unwrap() >= step["latency_ms"]["p50"].as_f64().unwrap(),
        "{r:#}"
    );
    assert_eq!(step["client_read_errors"], 0, "{r:#}");
    r
}
