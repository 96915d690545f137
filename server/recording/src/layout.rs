//! Where recording files are, and which go when the disk budget or the retention says so.

use std::path::{Path, PathBuf};

use crate::{io, RecordingError};

const HOUR_NS: i64 = 3_600_000_000_000;

/// Whether `source` may name a directory: letters, digits, `-`, `_` and `.`, not only dots.
pub fn valid_source_name(source: &str) -> bool {
    !source.is_empty()
        && source.len() <= 128
        && source.bytes().all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.'))
        && !source.bytes().all(|b| b == b'.')
}

/// The first and last ns of `time_ns`'s hour.
pub(crate) fn hour_of(time_ns: i64) -> (i64, i64) {
    let start = time_ns.div_euclid(HOUR_NS) * HOUR_NS;
    (start, start + HOUR_NS - 1)
}

/// `{dir}/{source}/{YYYY-MM-DD}/{HH}.mrec.zst` of `time_ns`'s hour (UTC).
pub fn file_path(dir: &Path, source: &str, time_ns: i64) -> Result<PathBuf, RecordingError> {
    if !valid_source_name(source) {
        return Err(RecordingError::SourceName(source.to_string()));
    }
    let mut stamp = String::new();
    venues::write_rfc3339(&mut stamp, time_ns.div_euclid(1_000_000));
    // 2023-02-09T20:32:50.714Z
    let (date, hour) = (&stamp[..10], &stamp[11..13]);
    Ok(dir.join(source).join(date).join(format!("{hour}.mrec.zst")))
}

/// One recording file found on disk.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RecordingFile {
    pub source: String,
    /// The start of its hour, Unix ms.
    pub hour_ms: i64,
    pub path: PathBuf,
    pub len: u64,
}

/// Every recording file under `dir`, oldest hour first (a name that is not a recording's is
/// left alone).
pub fn list_files(dir: &Path) -> Result<Vec<RecordingFile>, RecordingError> {
    let mut out = Vec::new();
    let read = |p: &Path| std::fs::read_dir(p).map_err(io(p));
    if !dir.exists() {
        return Ok(out);
    }
    for source in read(dir)? {
        let source = source.map_err(io(dir))?;
        let name = source.file_name().to_string_lossy().into_owned();
        if !valid_source_name(&name) || !source.path().is_dir() {
            continue;
        }
        for day in read(&source.path())? {
            let day = day.map_err(io(dir))?;
            let Some(day_ms) = day_start_ms(&day.file_name().to_string_lossy()) else { continue };
            for f in read(&day.path())? {
                let f = f.map_err(io(dir))?;
                let fname = f.file_name().to_string_lossy().into_owned();
                let Some(h) = fname.strip_suffix(".mrec.zst").and_then(|h| h.parse::<i64>().ok())
                else {
                    continue;
                };
                if !(0..24).contains(&h) {
                    continue;
                }
                let len = f.metadata().map_err(io(&f.path()))?.len();
                out.push(RecordingFile {
                    source: name.clone(),
                    hour_ms: day_ms + h * 3_600_000,
                    path: f.path(),
                    len,
                });
            }
        }
    }
    out.sort_by(|a, b| (a.hour_ms, &a.source).cmp(&(b.hour_ms, &b.source)));
    Ok(out)
}

/// The start of a `YYYY-MM-DD` day, Unix ms.
fn day_start_ms(name: &str) -> Option<i64> {
    if name.len() != 10 {
        return None;
    }
    venues::parse_rfc3339_ms(&format!("{name}T00:00:00Z"))
}

/// The files to delete, oldest first: those older than `retention_ms` before `now_ms`, then the
/// oldest until the rest fit in `budget_bytes`. Files in `keep` (being written) are never taken.
pub fn plan_cleanup(
    files: &[RecordingFile],
    budget_bytes: u64,
    retention_ms: i64,
    now_ms: i64,
    keep: &[PathBuf],
) -> Vec<PathBuf> {
    let mut total: u64 = files.iter().map(|f| f.len).sum();
    let mut out = Vec::new();
    for f in files {
        if keep.contains(&f.path) {
            continue;
        }
        let expired = f.hour_ms + 3_600_000 <= now_ms.saturating_sub(retention_ms);
        if expired || total > budget_bytes {
            total -= f.len;
            out.push(f.path.clone());
        }
    }
    out
}
