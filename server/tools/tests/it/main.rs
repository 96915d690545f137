//! The load tools end to end, small: they run, measure and exit cleanly (their full-size figures
//! are in BENCHMARKS.md).

mod depth_load;
mod e2e;
mod fanout;
mod soak;

/// Runs `command` (a load tool), which must succeed, and returns the JSON of its `RESULT` line.
fn result_of(command: &mut std::process::Command) -> serde_json::Value {
    let out = command.output().expect("the tool runs");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "exit {}\nstdout:\n{stdout}\nstderr:\n{stderr}", out.status);
    let line = stdout
        .lines()
        .find_map(|l| l.strip_prefix("RESULT "))
        .unwrap_or_else(|| panic!("no RESULT line\nstdout:\n{stdout}\nstderr:\n{stderr}"));
    serde_json::from_str(line).expect("RESULT is JSON")
}
