//! The soak tool, small: `millrace-soak --quick` for 20 s with 40 clients and an upstream fault
//! every 3 s against a real `millrace serve`. Checks that it measures and checks — candles
//! delivered and compared with the store, faults injected, the simulator's tick-by-tick replay
//! rings filled first, RSS and CPU read — and that the
//! server passes at this size, with its simulator embedded or separate; the 10-minute figures
//! are in BENCHMARKS.md ("Soak").

use std::process::Command;

/// `millrace-soak --quick <args> --bin <the workspace's millrace>`: its result.
fn soak(args: &[&str]) -> serde_json::Value {
    let bin = testkit::millrace_bin();
    assert!(bin.exists(), "{} is built by `cargo test --workspace`", bin.display());
    crate::result_of(
        Command::new(env!("CARGO_BIN_EXE_millrace-soak"))
            .arg("--quick")
            .args(args)
            .arg("--bin")
            .arg(&bin),
    )
}

#[test]
fn a_short_soak_injects_faults_checks_every_candle_and_passes() {
    let r = soak(&["--duration", "20", "--clients", "40", "--fault-every", "3"]);
    assert_eq!(r["ok"], true, "{r:#}");
    assert_eq!(r["clients"], 40, "{r:#}");
    assert!(r["closed_candles_delivered"].as_u64().unwrap() > 40, "{r:#}");
    assert_eq!(r["series"].as_object().unwrap().len(), 8, "{r:#}");
    for (series, c) in r["series"].as_object().unwrap() {
        assert!(c["stored"].as_u64().unwrap() > 0, "{series}: {r:#}");
        assert_eq!(c["stored"], c["minutes"], "{series}: {r:#}");
    }
    assert!(r["faults"].as_array().unwrap().len() >= 4, "{r:#}");
    assert_eq!(r["fault_errors"], 0, "{r:#}");
    assert_eq!(r["fell_behind"], 0, "{r:#}");
    // the simulator's tick-by-tick replay rings were full before the first memory reading
    assert_eq!(r["tbt_fill"]["symbols"], 40, "{r:#}");
    assert_eq!(r["tbt_fill"]["history"], 20_000, "{r:#}");
    assert!(r["rss_mib"]["start"].as_f64().unwrap() > 0.0, "{r:#}");
    assert!(r["server_cpu_pct_of_one_core"].as_f64().unwrap() > 0.0, "{r:#}");
}

/// `--separate-sim`: the simulator runs as `millrace sim`, which the server reaches as a remote
/// exchange (klines, depth and the tick-by-tick feed), and the two processes are measured apart.
#[test]
fn a_soak_against_a_separate_simulator_measures_each_process() {
    let r = soak(&[
        "--warmup",
        "5",
        "--duration",
        "12",
        "--clients",
        "20",
        "--fault-every",
        "3",
        "--separate-sim",
    ]);
    assert_eq!(r["ok"], true, "{r:#}");
    assert!(r["closed_candles_delivered"].as_u64().unwrap() > 20, "{r:#}");
    assert!(r["faults"].as_array().unwrap().len() >= 2, "{r:#}");
    assert_eq!(r["fault_errors"], 0, "{r:#}");
    assert_eq!(r["tbt_fill"]["symbols"], 40, "{r:#}");
    let sim = &r["simulator"];
    for at in ["start", "half", "end"] {
        assert!(sim["rss_mib"][at].as_f64().unwrap() > 0.0, "{at}: {r:#}");
    }
    assert!(sim["cpu_pct_of_one_core"].as_f64().unwrap() > 0.0, "{r:#}");
    // the figures start after the warm-up; the reading at subscription is kept beside them
    assert_eq!(r["warmup_s"], 5, "{r:#}");
    let rss = &r["rss_mib"];
    for at in ["cold", "start", "half", "end"] {
        assert!(rss[at].as_f64().unwrap() > 0.0, "{at}: {r:#}");
    }
    let samples = rss["samples"].as_array().unwrap();
    assert!(samples.iter().any(|s| s[0] == 5), "a reading when the warm-up ends: {r:#}");
    // the server's main malloc arena: its extent, and what of it is resident
    for at in ["start", "half", "end"] {
        let size = rss[format!("heap_size_{at}")].as_f64().unwrap();
        let resident = rss[format!("heap_rss_{at}")].as_f64().unwrap();
        assert!(size > 1.0 && resident > 0.0 && resident <= size, "[heap] {at}: {r:#}");
    }
    assert_eq!(rss["heap_samples"].as_array().unwrap().len(), samples.len(), "{r:#}");
    assert_eq!(rss["half_at_s"], 6, "{r:#}");
    let measured = r["duration_s"].as_f64().unwrap();
    assert!((12.0..16.0).contains(&measured), "CPU and duration after the warm-up: {r:#}");
}
