//! Cross-crate tests: architecture invariants no compiler checks (`tidy`).

mod tidy;

/// The workspace root.
pub fn workspace_root() -> std::path::PathBuf {
    std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("tests/ has a parent")
        .to_path_buf()
}
