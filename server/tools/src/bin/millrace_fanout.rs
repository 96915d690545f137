//! `millrace-fanout`: the WebSocket fan-out load tool (issue 2/4 "Live server", section Speed).
//!
//! It measures what the live service does with many browser connections: deliveries per second
//! to thousands of WebSocket clients, publish-to-receive latency, and server memory per idle
//! connection. Three commands:
//!
//! - `serve` starts the **real** millrace service in this process ([`server::app::App::start`]:
//!   embedded simulator source, no pinned jobs, no backfill, data in a temp dir) and serves it
//!   with [`server::http::serve_app`] (the real router, WebSocket sessions and bus). A publisher
//!   thread publishes kline push frames serialised by the real serialiser
//!   ([`server::candles::writer::kline_frame`]) on `kline@sim:spot:<BASE>/USDT:1m` at a set
//!   total rate. The candles are **synthetic load** (a seeded random walk on the catalog price),
//!   pushed through the real bus and sessions; their event time `E` is the publish wall-clock
//!   time, at tick boundaries, so a client on the same machine measures publish-to-receive
//!   latency from the payload. Commands on stdin: `rate <messages/s>`, `stats`, `quit`.
//! - `clients` opens N WebSocket connections from a separate process (tokio-tungstenite on a
//!   multi-threaded runtime), subscribes each through the normal
//!   `{"method":"SUBSCRIBE","params":["kline@…"],"id":1}` request (which takes a job lease like
//!   a dashboard does), counts the frames it receives and records latency (`now − E`) of the
//!   publisher's frames. Timed (`--duration`) or driven by stdin commands (`mark`, `report`).
//! - `run` orchestrates both as child processes of itself: (1) server RSS before and after N
//!   idle connections (connected, nothing subscribed) gives bytes per idle connection; (2) N
//!   subscribed clients and the publisher at increasing target delivery rates; each step
//!   reports deliveries/s counted at the clients, the publish rate achieved, p50/p99/max
//!   latency, lagging drops (the server's `millrace_ws_dropped_lagging_total` and close code
//!   4000 seen by clients) and CPU of both processes. `--quick` is a small run for tests.
//!
//! Child processes talk over stdin/stdout lines: a keyword, a space and a JSON object
//! (`READY {...}`, `STATS {...}`, `REPORT {...}`); `run` ends with `RESULT {...}`.
//!
//! Method and figures: docs/bench-fanout.md.

use std::process::ExitCode;

use clap::Parser;

// The crate root's modules live in the directory named after it (a crate root resolves `mod`
// like a `mod.rs`, hence the paths).
#[path = "millrace_fanout/clients.rs"]
mod clients;
#[path = "millrace_fanout/common.rs"]
mod common;
#[path = "millrace_fanout/run.rs"]
mod run;
#[path = "millrace_fanout/serve.rs"]
mod serve;

/// WebSocket fan-out load tool for the millrace live service: deliveries per second to thousands
/// of WebSocket clients, publish-to-receive latency, server memory per idle connection.
#[derive(Debug, Parser)]
#[command(name = "millrace-fanout", version = server::VERSION)]
#[command(after_help = "Typical use (release build!):\n  \
    cargo build --release -p server --bin millrace-fanout\n  \
    target/release/millrace-fanout run                # 5000 clients, rate steps, 20 s each\n  \
    target/release/millrace-fanout run --quick        # 500 clients, one 5 s step\n\
    Or by hand, in two terminals:\n  \
    millrace-fanout serve --addr 127.0.0.1:9000 --rate 1600\n  \
    millrace-fanout clients --url ws://127.0.0.1:9000/ws --clients 5000 --duration 20s")]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, clap::Subcommand)]
enum Command {
    /// Run the real millrace service plus a synthetic kline publisher (stdin: rate N | stats |
    /// quit).
    Serve(serve::ServeOpts),
    /// Open N WebSocket clients, subscribe, count deliveries and measure latency.
    Clients(clients::ClientsOpts),
    /// Start `serve` and `clients` as child processes and measure memory, throughput and latency.
    Run(run::RunOpts),
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    if matches!(cli.command, Command::Serve(_)) {
        // The service in this process runs with the allocator setting of the `millrace` binary.
        server::malloc::limit_arenas();
    }
    let result = match cli.command {
        Command::Serve(o) => serve::main(o),
        Command::Clients(o) => clients::main(o),
        Command::Run(o) => run::main(o),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("millrace-fanout: error: {e:#}");
            ExitCode::from(2)
        }
    }
}
