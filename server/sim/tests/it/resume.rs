//! `millrace sim --state-file`: a standalone simulator restarted after a fast run resumes its
//! clock after what the last run served (it would otherwise begin at the wall clock, behind
//! every candle a server stored from it); a damaged file stops it with the file named.

use std::path::PathBuf;
use std::time::Duration;

use sim::clock::wall_clock_ms;
use sim::SimArgs;

fn args(addr: std::net::SocketAddr, speed: f64, state_file: PathBuf) -> SimArgs {
    SimArgs {
        addr,
        speed,
        seed: 3,
        symbols: vec!["BTCUSDT".into()],
        control_token: None,
        state_file: Some(state_file),
    }
}

/// A port that was free a moment ago (the simulator binds it next).
fn free_addr() -> std::net::SocketAddr {
    std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap()
}

fn saved_ms(path: &PathBuf) -> (i64, bool) {
    let v: serde_json::Value = serde_json::from_slice(&std::fs::read(path).unwrap()).unwrap();
    (v["sim_ms"].as_i64().unwrap(), v["clean"].as_bool().unwrap())
}

/// The simulator's own clock over its REST API.
async fn server_time(addr: std::net::SocketAddr) -> i64 {
    let url = format!("http://{addr}/api/v3/time");
    let v: serde_json::Value = reqwest::get(&url).await.unwrap().json().await.unwrap();
    v["serverTime"].as_i64().unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restarted_simulator_resumes_its_clock_from_the_state_file() {
    let dir = std::env::temp_dir().join(format!("millrace-sim-resume-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("clock.json");

    // A run at speed 600 for 1.5 s serves ~15 simulated minutes ahead of the wall clock.
    let addr = free_addr();
    sim::run_until(&args(addr, 600.0, path.clone()), async {
        tokio::time::sleep(Duration::from_millis(700)).await;
        let (running, clean) = saved_ms(&path);
        assert!(!clean, "saved while running");
        assert!(running > wall_clock_ms(), "ahead of the wall clock");
        tokio::time::sleep(Duration::from_millis(800)).await;
    })
    .await
    .unwrap();
    let (stopped, clean) = saved_ms(&path);
    assert!(clean, "saved at the clean stop");
    let ahead = stopped - wall_clock_ms();
    assert!(ahead > 10 * 60_000, "the first run ended {ahead} ms ahead of the wall clock");

    // Restarted at speed 1, it serves from where the first run stopped, not the wall clock.
    let addr = free_addr();
    let served = std::sync::Mutex::new(0);
    sim::run_until(&args(addr, 1.0, path.clone()), async {
        tokio::time::sleep(Duration::from_millis(300)).await;
        *served.lock().unwrap() = server_time(addr).await;
    })
    .await
    .unwrap();
    let served = *served.lock().unwrap();
    assert!(
        (stopped..stopped + 10_000).contains(&served),
        "the restarted simulator serves {served}, the first stopped at {stopped}"
    );
    let (again, _) = saved_ms(&path);
    assert!(again >= served);

    // A damaged file is an error naming it, before anything listens.
    std::fs::write(&path, "{not json").unwrap();
    let e = sim::run_until(&args(free_addr(), 1.0, path.clone()), async {}).await.unwrap_err();
    let e = format!("{e:#}");
    assert!(e.contains("clock.json") && e.contains("corrupt"), "{e}");
    std::fs::remove_dir_all(&dir).unwrap();
}
