//! [`DataDirLock`]: one `millrace serve` per data directory.
//!
//! Two servers on one data directory would both write its SQLite file (two ingest jobs per
//! series racing over the same rows, two backfills walking the same window). SQLite's own locks
//! serialise the transactions but not the services, so the directory itself is locked: an
//! exclusive `flock` on `<data_dir>/millrace.lock`, taken before the store is opened and held
//! for the life of the process (the kernel drops it when the process ends, however it ends, so
//! a `kill -9` never leaves a stale lock behind). The holder writes its pid into the file; a
//! second server reads it back for its error message and exits. `flock` is advisory and local:
//! it does not protect a data directory on a network file system shared by two hosts.

use std::fs::{File, OpenOptions};
use std::io::{Read as _, Seek as _, SeekFrom, Write as _};
use std::path::{Path, PathBuf};

/// The lock file's name inside the data directory.
pub const LOCK_FILE: &str = "millrace.lock";

/// Why the data directory could not be locked.
#[derive(Debug, thiserror::Error)]
pub enum DirLockError {
    #[error(
        "the data directory {dir} is in use by another millrace process{} (it holds {file}); \
         stop that process, or give this one another directory (--data-dir, key \
         `server.data_dir`)",
        holder.map(|pid| format!(" (pid {pid})")).unwrap_or_default()
    )]
    Held { dir: String, file: String, holder: Option<u32> },
    #[error("cannot lock the data directory {dir} (lock file {file})")]
    Io {
        dir: String,
        file: String,
        #[source]
        source: std::io::Error,
    },
}

/// The held lock of a data directory; released when dropped (or when the process ends).
#[derive(Debug)]
pub struct DataDirLock {
    /// Open for the life of the lock: closing it releases the `flock`.
    _file: File,
    path: PathBuf,
}

impl DataDirLock {
    /// Creates `dir` if needed and takes its lock without waiting; an error names the holder's
    /// pid when another process holds it.
    pub fn acquire(dir: &Path) -> Result<DataDirLock, DirLockError> {
        let path = dir.join(LOCK_FILE);
        let io = |source| DirLockError::Io {
            dir: dir.display().to_string(),
            file: path.display().to_string(),
            source,
        };
        std::fs::create_dir_all(dir).map_err(io)?;
        let mut file = OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .open(&path)
            .map_err(io)?;
        match rustix::fs::flock(&file, rustix::fs::FlockOperation::NonBlockingLockExclusive) {
            Ok(()) => {}
            Err(rustix::io::Errno::WOULDBLOCK) => {
                let mut text = String::new();
                let _ = file.read_to_string(&mut text);
                return Err(DirLockError::Held {
                    dir: dir.display().to_string(),
                    file: path.display().to_string(),
                    holder: text.trim().parse().ok(),
                });
            }
            Err(e) => return Err(io(e.into())),
        }
        file.set_len(0)
            .and_then(|()| file.seek(SeekFrom::Start(0)))
            .and_then(|_| writeln!(file, "{}", std::process::id()))
            .and_then(|()| file.sync_data())
            .map_err(io)?;
        Ok(DataDirLock { _file: file, path })
    }

    /// The lock file.
    pub fn path(&self) -> &Path {
        &self.path
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_second_lock_on_the_same_directory_is_refused_until_the_first_is_dropped() {
        let dir = std::env::temp_dir().join(format!("millrace-dirlock-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        let first = DataDirLock::acquire(&dir).unwrap();
        let pid = std::process::id();
        assert_eq!(std::fs::read_to_string(first.path()).unwrap().trim(), pid.to_string());
        match DataDirLock::acquire(&dir) {
            Err(e @ DirLockError::Held { holder: Some(p), .. }) if p == pid => {
                let msg = e.to_string();
                assert!(msg.contains(&dir.display().to_string()), "{msg}");
                assert!(msg.contains(&format!("pid {pid}")), "{msg}");
            }
            other => panic!("expected the lock to be held by {pid}: {other:?}"),
        }
        drop(first);
        let again = DataDirLock::acquire(&dir).unwrap();
        drop(again);
        let _ = std::fs::remove_dir_all(&dir);
    }
}
