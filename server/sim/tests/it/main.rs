//! The simulated exchange over real sockets: Binance's REST and WebSocket protocol through
//! millrace's own Binance client, its oracle, rate limits and faults (`exchange`); the
//! tick-by-tick feed through millrace's own feed client (`tbt_feed`).

mod exchange;
mod tbt_feed;

/// A simulator on port 0 in this process.
pub async fn start_sim(speed: f64, seed: u64) -> sim::SimHandle {
    let config = sim::SimConfig { speed, seed, ..sim::SimConfig::default() };
    sim::Sim::start(config, "127.0.0.1:0".parse().expect("an address"))
        .await
        .expect("the simulator starts")
}
