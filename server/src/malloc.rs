//! Fewer glibc malloc arenas for the long-running commands.
//!
//! glibc gives threads that allocate at the same time arenas of their own (up to 8 per core)
//! and keeps what is freed in each arena for that arena's later use. In a server whose tasks
//! move between worker and blocking threads, that shows as RSS creeping up in steps while the
//! heap stays flat: the 10-minute soak's server grew ~1 MiB at several faults with no heap
//! growth, and with one arena that drift nearly stopped (docs/soak.md).
//!
//! The arena count must be set before the first allocation: from the environment
//! (`MALLOC_ARENA_MAX`) or by `mallopt`, which needs `unsafe` (forbidden in this workspace).
//! So [`limit_arenas`] re-executes the binary once, in place (same process id, same
//! arguments), with `MALLOC_ARENA_MAX` set. A value already in the environment, the
//! operator's own or that of the first execution, is kept as it is.

/// The arena count set when the environment has none: the soak was measured with one arena
/// against glibc's default of 8 per core (docs/soak.md).
pub const ARENAS: &str = "1";

/// The variable glibc reads at start.
pub const VAR: &str = "MALLOC_ARENA_MAX";

/// Re-executes the running binary with [`VAR`] set, unless it is set already. Returns only if
/// nothing needed doing, or if the re-execution failed (then with a warning on stderr, and
/// glibc's default arenas). Call it first thing in `main`, before any thread exists.
pub fn limit_arenas() {
    // Only glibc reads the variable; elsewhere there is nothing to do.
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    if std::env::var_os(VAR).is_none() {
        use std::os::unix::process::CommandExt as _;
        let mut args = std::env::args_os();
        let argv0 = args.next().unwrap_or_else(|| "millrace".into());
        // `/proc/self/exe` is this very binary, even if its file was replaced since it started.
        let err = std::process::Command::new("/proc/self/exe")
            .arg0(argv0)
            .args(args)
            .env(VAR, ARENAS)
            .exec();
        eprintln!(
            "warning: cannot re-execute with {VAR}={ARENAS} ({err}); running with glibc's default malloc arenas"
        );
    }
}
