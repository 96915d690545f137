//! Command-line interface of the `millrace` binary.

use std::io::Write;
use std::process::ExitCode;

use clap::{Parser, Subcommand};

use crate::replay;

/// millrace: real-time market data you can prove is right.
#[derive(Debug, Parser)]
#[command(name = "millrace", version = crate::VERSION, about, long_about = None)]
pub struct Cli {
    #[command(subcommand)]
    pub command: Option<Command>,
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// Run the server (the default when no subcommand is given).
    Serve(crate::http::ServeArgs),
    /// Run the simulated exchange alone, speaking Binance's REST and WebSocket protocol
    /// (point a `[[sources]]` entry's rest_base / ws_base at it).
    Sim(crate::sim::SimArgs),
    /// Replay recorded exchange data through millrace's market logic and check it.
    #[command(subcommand)]
    Replay(ReplayCommand),
}

#[derive(Debug, Subcommand)]
pub enum ReplayCommand {
    /// Sync order books from Binance depth captures and check them against bookTicker.
    Depth(replay::depth::Args),
    /// Merge Binance 1m kline archives into a timeframe; prints CSV.
    Klines(replay::klines::Args),
    /// Rebuild Shanghai tick-by-tick books from order and trade files; prints JSON per symbol.
    Sse(replay::sse::Args),
    /// Rebuild a LOBSTER book from a message file; prints LOBSTER's orderbook CSV.
    Lobster(replay::lobster::Args),
}

/// Runs a parsed command line. Replay commands exit 1 when a check fails.
pub fn run(cli: Cli) -> anyhow::Result<ExitCode> {
    match cli.command {
        None => crate::http::run_blocking(crate::http::ServeArgs::default()),
        Some(Command::Serve(args)) => crate::http::run_blocking(args),
        Some(Command::Sim(args)) => crate::sim::run_standalone(args),
        Some(Command::Replay(cmd)) => {
            let stdout = std::io::stdout();
            let mut out = std::io::BufWriter::new(stdout.lock());
            let ok = match cmd {
                ReplayCommand::Depth(a) => replay::depth::run(&a, &mut out)?,
                ReplayCommand::Klines(a) => replay::klines::run(&a, &mut out)?,
                ReplayCommand::Sse(a) => replay::sse::run(&a, &mut out)?,
                ReplayCommand::Lobster(a) => replay::lobster::run(&a, &mut out)?,
            };
            out.flush()?;
            Ok(if ok { ExitCode::SUCCESS } else { ExitCode::FAILURE })
        }
    }
}
