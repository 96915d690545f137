//! Helpers for millrace's cross-crate tests: locating the real data in `../shared/data`.

use std::path::PathBuf;

/// The workspace root.
pub fn workspace_root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).parent().expect("tests/ has a parent").to_path_buf()
}

/// `../shared/data` beside the checkout (override with `MILLRACE_DATA_DIR`).
pub fn data_dir() -> PathBuf {
    match std::env::var_os("MILLRACE_DATA_DIR") {
        Some(d) => PathBuf::from(d),
        None => workspace_root().join("../shared/data"),
    }
}
