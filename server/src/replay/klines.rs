//! `millrace replay klines` (being written; see issue 1/4).

/// Arguments of `millrace replay klines`.
#[derive(Debug, clap::Args)]
pub struct Args {
    /// Input files.
    pub files: Vec<std::path::PathBuf>,
}

/// Runs the replay, writing results to `out`; returns whether every check passed.
pub fn run(_args: &Args, _out: &mut dyn std::io::Write) -> anyhow::Result<bool> {
    anyhow::bail!("replay klines is not written yet")
}
