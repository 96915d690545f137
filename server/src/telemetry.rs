//! Logging: `tracing` to stderr, filtered by `RUST_LOG` (default `info`), ANSI colours only on a
//! terminal. Every job and session runs inside a span that names what it serves (see
//! ARCHITECTURE.md, "Tracing fields"), so `RUST_LOG=info millrace` says which job a line is about.

/// Installs the global subscriber; a second call (tests, tools) is a no-op.
pub fn init() {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
    let _ = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .try_init();
}
