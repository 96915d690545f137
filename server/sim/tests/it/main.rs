//! The simulated exchange over real sockets: Binance's REST and WebSocket protocol through
//! millrace's own Binance client, its oracle, rate limits and faults (`exchange`); the
//! tick-by-tick feed through millrace's own feed client (`tbt_feed`).

mod control;
mod exchange;
mod resume;
mod tbt_feed;
mod url_forms;
mod venues;

/// The control token the tests' simulators take (`POST /sim/faults`, `POST /tbt/control`).
pub const CONTROL_TOKEN: &str = "sim-test-control-token";

/// A simulator on port 0 in this process.
pub async fn start_sim(speed: f64, seed: u64) -> sim::SimHandle {
    let config = sim::SimConfig {
        speed,
        seed,
        control_token: Some(CONTROL_TOKEN.into()),
        ..sim::SimConfig::default()
    };
    sim::Sim::start(config, "127.0.0.1:0".parse().expect("an address"))
        .await
        .expect("the simulator starts")
}
