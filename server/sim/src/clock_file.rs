//! The standalone simulator's clock across restarts (`millrace sim --state-file PATH`).
//!
//! A run at `speed` 60 serves simulated hours per real minute, so a server that follows it
//! stores candles far ahead of the wall clock. A restarted simulator whose clock began at the
//! wall clock again would be behind those candles: the server closes no new candle until the
//! simulator caught up (minutes to hours). The embedded simulator resumes after the newest
//! stored candle; a standalone one has no store, so it keeps its clock in a small file instead:
//! rewritten every [`SAVE_EVERY`] and at shutdown, read at start.

use std::io::Write as _;
use std::path::{Path, PathBuf};
use std::time::Duration;

use serde::{Deserialize, Serialize};

/// How often a running simulator rewrites its clock file.
pub const SAVE_EVERY: Duration = Duration::from_secs(1);

/// The file's contents.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct Saved {
    /// The simulated time when it was written, ms since the Unix epoch.
    sim_ms: i64,
    /// The run's speed: an unclean stop may have served up to [`SAVE_EVERY`] × speed past it.
    speed: f64,
    /// Written at a clean shutdown, so `sim_ms` is the last time the run served.
    clean: bool,
}

/// Why a clock file cannot be used.
#[derive(Debug, thiserror::Error)]
pub enum ClockFileError {
    #[error("cannot read the simulator's clock file {path}: {source}")]
    Read { path: PathBuf, source: std::io::Error },
    #[error("the simulator's clock file {path} is corrupt ({reason}); delete it to start at the wall clock")]
    Corrupt { path: PathBuf, reason: String },
    #[error("cannot write the simulator's clock file {path}: {source}")]
    Write { path: PathBuf, source: std::io::Error },
}

/// A simulator's clock file.
#[derive(Debug, Clone)]
pub struct ClockFile {
    path: PathBuf,
}

impl ClockFile {
    pub fn new(path: impl Into<PathBuf>) -> Self {
        ClockFile { path: path.into() }
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Where a simulator started at wall-clock time `wall_ms` begins: `None` (the wall clock)
    /// when there is no file or its time is not ahead of the wall clock, else after the last
    /// time the previous run can have served. A file that exists but cannot be read or parsed
    /// is an error, never silently ignored.
    pub fn resume_ms(&self, wall_ms: i64) -> Result<Option<i64>, ClockFileError> {
        let text = match std::fs::read_to_string(&self.path) {
            Ok(t) => t,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
            Err(source) => return Err(ClockFileError::Read { path: self.path.clone(), source }),
        };
        let corrupt = |reason: String| ClockFileError::Corrupt { path: self.path.clone(), reason };
        let saved: Saved = serde_json::from_str(&text).map_err(|e| corrupt(e.to_string()))?;
        if !(saved.speed.is_finite() && saved.speed > 0.0 && saved.speed <= 1e9) {
            return Err(corrupt(format!("speed {} is not a positive number", saved.speed)));
        }
        let margin = if saved.clean {
            0
        } else {
            (SAVE_EVERY.as_secs_f64() * 1000.0 * saved.speed).ceil() as i64
        };
        let resume = saved
            .sim_ms
            .checked_add(margin)
            .filter(|t| (0..=MAX_SIM_MS).contains(t))
            .ok_or_else(|| corrupt(format!("sim_ms {} is out of range", saved.sim_ms)))?;
        Ok((resume > wall_ms).then_some(resume))
    }

    /// Records simulated time `sim_ms` of a run at `speed` (`clean`: the run has stopped).
    /// The file is replaced whole: written to `<path>.tmp`, synced, then renamed over it, so a
    /// crash mid-write leaves the previous clock.
    ///
    /// The temporary file is always a new file: created with `O_CREAT | O_EXCL`, which never
    /// opens an existing path and never follows a symbolic link, so nothing planted at
    /// `<path>.tmp` (a link to another file, a file left by a crash) is ever written through;
    /// whatever is there is removed (a link itself, not what it points to) and the creation
    /// tried once more. The rename replaces `path` itself, a link there included, and writes
    /// nothing through it.
    pub fn save(&self, sim_ms: i64, speed: f64, clean: bool) -> Result<(), ClockFileError> {
        let write = || -> std::io::Result<()> {
            let mut tmp = self.path.clone().into_os_string();
            tmp.push(".tmp");
            let tmp = PathBuf::from(tmp);
            let create = || std::fs::OpenOptions::new().write(true).create_new(true).open(&tmp);
            let mut f = match create() {
                Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {
                    std::fs::remove_file(&tmp)?;
                    create()?
                }
                other => other?,
            };
            let written = serde_json::to_writer(&mut f, &Saved { sim_ms, speed, clean })
                .map_err(std::io::Error::from)
                .and_then(|()| f.write_all(b"\n"))
                .and_then(|()| f.sync_all())
                .and_then(|()| std::fs::rename(&tmp, &self.path));
            if written.is_err() {
                let _ = std::fs::remove_file(&tmp);
            }
            written
        };
        write().map_err(|source| ClockFileError::Write { path: self.path.clone(), source })
    }
}

/// The latest simulated time a clock file may hold: the year 9999.
const MAX_SIM_MS: i64 = 253_402_300_799_000;

#[cfg(test)]
mod tests {
    use super::*;

    const WALL: i64 = 1_800_000_000_000;

    /// A clock file `name` in a directory of this test's own (emptied first).
    fn file(tag: &str, name: &str) -> ClockFile {
        let dir =
            std::env::temp_dir().join(format!("millrace-simclock-{}-{tag}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        ClockFile::new(dir.join(name))
    }

    #[test]
    fn resumes_after_what_the_last_run_can_have_served() {
        let f = file("resume", "clock.json");
        assert_eq!(f.resume_ms(WALL).unwrap(), None, "no file: the wall clock");

        // Written while running at speed 60: up to a second (a simulated minute) more may
        // have been served after it.
        f.save(WALL + 3_600_000, 60.0, false).unwrap();
        assert_eq!(f.resume_ms(WALL).unwrap(), Some(WALL + 3_660_000));
        // Written at a clean stop: exactly where it stopped.
        f.save(WALL + 3_600_000, 60.0, true).unwrap();
        assert_eq!(f.resume_ms(WALL).unwrap(), Some(WALL + 3_600_000));
        // Behind the wall clock: the wall clock.
        assert_eq!(f.resume_ms(WALL + 4_000_000).unwrap(), None);
        assert!(!f.path().with_extension("json.tmp").exists(), "the temporary file is renamed");
    }

    #[test]
    fn a_damaged_file_is_an_error_that_names_it() {
        let f = file("damaged", "clock.json");
        for text in [
            "",
            "garbage",
            r#"{"sim_ms": 1}"#,
            r#"{"sim_ms": 1, "speed": -1, "clean": true}"#,
            r#"{"sim_ms": 1, "speed": 1e308, "clean": true}"#,
            r#"{"sim_ms": 9223372036854775807, "speed": 60, "clean": false}"#,
            r#"{"sim_ms": -5, "speed": 1, "clean": true}"#,
            r#"{"sim_ms": 1, "speed": 1, "clean": true, "extra": 0}"#,
        ] {
            std::fs::write(f.path(), text).unwrap();
            let e = f.resume_ms(WALL).unwrap_err();
            assert!(matches!(e, ClockFileError::Corrupt { .. }), "{text}: {e:?}");
            let msg = e.to_string();
            assert!(msg.contains("clock.json") && msg.contains("corrupt"), "{msg}");
        }
        let f = file("unwritable", "missing-dir/clock.json");
        let e = f.save(WALL, 1.0, true).unwrap_err().to_string();
        assert!(e.contains("cannot write") && e.contains("clock.json"), "{e}");
    }

    /// Links planted at the temporary path or at the clock file are never written through: the
    /// file they point to keeps its contents, and the clock is written all the same.
    #[test]
    fn links_planted_at_the_temporary_file_or_the_clock_file_are_never_written_through() {
        use std::os::unix::fs::symlink;
        let f = file("links", "clock.json");
        let dir = f.path().parent().unwrap().to_path_buf();
        let victim = dir.join("victim.txt");
        std::fs::write(&victim, "precious").unwrap();
        let tmp = dir.join("clock.json.tmp");

        // A link at the temporary path, to an existing file and to one that does not exist.
        symlink(&victim, &tmp).unwrap();
        f.save(WALL + 1_000, 1.0, true).unwrap();
        assert_eq!(std::fs::read_to_string(&victim).unwrap(), "precious");
        assert_eq!(f.resume_ms(WALL).unwrap(), Some(WALL + 1_000));
        assert!(!std::fs::symlink_metadata(f.path()).unwrap().file_type().is_symlink());
        let created = dir.join("created-through-the-link.txt");
        symlink(&created, &tmp).unwrap();
        f.save(WALL + 2_000, 1.0, true).unwrap();
        assert!(!created.exists(), "a dangling link was followed");
        assert_eq!(f.resume_ms(WALL).unwrap(), Some(WALL + 2_000));

        // A link at the clock file itself is replaced, not written through.
        std::fs::remove_file(f.path()).unwrap();
        symlink(&victim, f.path()).unwrap();
        f.save(WALL + 3_000, 1.0, true).unwrap();
        assert_eq!(std::fs::read_to_string(&victim).unwrap(), "precious");
        assert!(!std::fs::symlink_metadata(f.path()).unwrap().file_type().is_symlink());
        assert_eq!(f.resume_ms(WALL).unwrap(), Some(WALL + 3_000));

        // A file left at the temporary path (a crash between create and rename) is replaced.
        std::fs::write(&tmp, "half a clock").unwrap();
        f.save(WALL + 4_000, 1.0, true).unwrap();
        assert_eq!(f.resume_ms(WALL).unwrap(), Some(WALL + 4_000));
        assert!(!tmp.exists());
    }
}
