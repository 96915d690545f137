//! The `millrace` binary: parses arguments, sets up tracing, and hands over to the library.

use std::process::ExitCode;

use clap::Parser;

fn main() -> ExitCode {
    let cli = server::cli::Cli::parse();
    if cli.is_long_running() {
        server::malloc::limit_arenas();
    }
    match server::cli::run(cli) {
        Ok(code) => code,
        Err(e) => {
            eprintln!("millrace: error: {e:#}");
            ExitCode::from(2)
        }
    }
}
