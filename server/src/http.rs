//! The HTTP/WebSocket server (being written; see issue 1/4).

use std::process::ExitCode;

/// Arguments of `millrace serve`.
#[derive(Debug, Default, clap::Args)]
pub struct ServeArgs {}

/// Runs the server until Ctrl-C / SIGTERM.
pub fn run_blocking(_args: ServeArgs) -> anyhow::Result<ExitCode> {
    anyhow::bail!("serve is not written yet")
}
