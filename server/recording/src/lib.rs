//! millrace's own recordings (docs/recording.md): every upstream frame a source received, with
//! its receive time, its connection and, for REST, its request, in files per source and hour.
//!
//! A file is `{dir}/{source}/{YYYY-MM-DD}/{HH}.mrec.zst` (the hour, UTC, of its records' receive
//! times) and a sequence of blocks. A block is a zstd *skippable* frame holding its header
//! (`MRB1`, the length and CRC-32 of the frame that follows, its record count) and then one zstd
//! frame of its records, so the file is a valid zstd stream (`zstd -d` gives the records, the
//! headers skipped) and a reader can check each block before it trusts it. A process killed
//! while writing leaves at most one torn block at the end: [`FileReader`] stops there and says
//! so ([`Torn`]), losing only that block, and [`Recorder`] cuts it off before it appends again.
//!
//! Sans async: the service runs a [`Recorder`] per source on a task of its own, fed by a bounded
//! queue, so recording never holds up ingest (`server/src/recording.rs`).

mod format;
mod layout;

pub use format::{Block, FileReader, Kind, OwnedRecord, Record, Torn, BLOCK_TARGET, MAX_BLOCK};
pub use layout::{file_path, list_files, plan_cleanup, valid_source_name, RecordingFile};

use std::fs::{File, OpenOptions};
use std::io::Write;
use std::path::{Path, PathBuf};

/// What can go wrong with a recording.
#[derive(Debug, thiserror::Error)]
pub enum RecordingError {
    #[error("{path}: {source}")]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error(
        "source name {0:?} cannot name a recording directory (letters, digits, '-', '_', '.' only)"
    )]
    SourceName(String),
    #[error("a record of {0} bytes is larger than a block may be ({MAX_BLOCK})")]
    TooLarge(usize),
}

fn io(path: &Path) -> impl FnOnce(std::io::Error) -> RecordingError + '_ {
    move |source| RecordingError::Io { path: path.to_path_buf(), source }
}

/// The file being appended to.
struct Open {
    path: PathBuf,
    file: File,
    /// The first and last receive time (ns) the file takes: its hour.
    hour: (i64, i64),
}

/// Writes one source's records into its hourly files (see the module docs). Records are kept
/// in a block until [`BLOCK_TARGET`] bytes, a record of another hour, or [`Recorder::flush`].
pub struct Recorder {
    dir: PathBuf,
    source: String,
    open: Option<Open>,
    block: format::BlockBuilder,
    /// Bytes and records written to files so far.
    written: u64,
    records_written: u64,
}

impl Recorder {
    /// A recorder of `source` under `dir` (nothing is created before the first record).
    pub fn new(dir: &Path, source: &str) -> Result<Self, RecordingError> {
        if !valid_source_name(source) {
            return Err(RecordingError::SourceName(source.to_string()));
        }
        Ok(Recorder {
            dir: dir.to_path_buf(),
            source: source.to_string(),
            open: None,
            block: format::BlockBuilder::default(),
            written: 0,
            records_written: 0,
        })
    }

    /// Bytes written to files so far.
    pub fn written(&self) -> u64 {
        self.written
    }

    /// Records written to files so far.
    pub fn records_written(&self) -> u64 {
        self.records_written
    }

    /// Drops the block being filled (its records are not written).
    pub fn discard(&mut self) {
        self.block = format::BlockBuilder::default();
    }

    /// Records in the block being filled (lost if its write fails).
    pub fn pending(&self) -> u64 {
        u64::from(self.block.count())
    }

    /// The file being appended to, if any.
    pub fn current_file(&self) -> Option<&Path> {
        self.open.as_ref().map(|o| o.path.as_path())
    }

    /// Adds one record; writes the block when it is full or the record is of another hour.
    pub fn append(&mut self, r: &Record<'_>) -> Result<(), RecordingError> {
        let size = r.encoded_len();
        if size > MAX_BLOCK {
            return Err(RecordingError::TooLarge(size));
        }
        let other_hour =
            self.open.as_ref().is_some_and(|o| !(o.hour.0..=o.hour.1).contains(&r.time_ns));
        if other_hour || self.block.len() + size > MAX_BLOCK {
            self.flush()?;
            if other_hour {
                self.open = None;
            }
        }
        if self.open.is_none() {
            self.open = Some(self.open_file(r.time_ns)?);
        }
        self.block.push(r);
        if self.block.len() >= BLOCK_TARGET {
            self.flush()?;
        }
        Ok(())
    }

    /// Writes the block being filled, if it holds a record. If the write fails, the block's
    /// records are lost (and the file is not trusted further: the next record reopens it, cutting
    /// off what the failed write left).
    pub fn flush(&mut self) -> Result<(), RecordingError> {
        let count = u64::from(self.block.count());
        let Some(open) = &mut self.open else { return Ok(()) };
        let Some(bytes) = self.block.finish() else { return Ok(()) };
        if let Err(e) = open.file.write_all(&bytes) {
            let path = open.path.clone();
            self.open = None;
            return Err(RecordingError::Io { path, source: e });
        }
        self.written += bytes.len() as u64;
        self.records_written += count;
        Ok(())
    }

    /// Opens the file of `time_ns`'s hour for appending, cutting off a torn block a killed
    /// process left at its end.
    fn open_file(&mut self, time_ns: i64) -> Result<Open, RecordingError> {
        let path = file_path(&self.dir, &self.source, time_ns)?;
        if let Some(parent) = path.parent() {
            std::fs::create_dir_all(parent).map_err(io(parent))?;
        }
        if path.exists() {
            let valid_end = FileReader::open(&path)?.valid_end()?;
            let f = OpenOptions::new().write(true).open(&path).map_err(io(&path))?;
            f.set_len(valid_end).map_err(io(&path))?;
        }
        let file = OpenOptions::new().create(true).append(true).open(&path).map_err(io(&path))?;
        Ok(Open { path, file, hour: layout::hour_of(time_ns) })
    }
}

impl Drop for Recorder {
    fn drop(&mut self) {
        let _ = self.flush();
    }
}

#[cfg(test)]
mod tests;

/// How many blocks [`scan`] reads ahead of its caller.
const AHEAD: usize = 2;

/// Calls `each` with the records of `files`, in order; `each` returns `false` to stop. The
/// files are read, and their blocks checked and unpacked, on a thread of their own, up to
/// [`AHEAD`] blocks ahead: the caller's work on the records overlaps the reading, as a live
/// source's overlaps its socket's (a replay's depth path keeps its core). Blocks circulate
/// between the two threads, so nothing is allocated per block once they have grown. A torn
/// tail ends its file, as with [`FileReader`], and is returned with its file; an unreadable
/// file ends the scan with its error.
pub fn scan(
    files: &[PathBuf],
    mut each: impl FnMut(Record<'_>) -> bool,
) -> Result<Vec<(PathBuf, Torn)>, RecordingError> {
    use std::sync::mpsc::sync_channel;
    std::thread::scope(|s| {
        let (full_tx, full_rx) = sync_channel::<Block>(AHEAD);
        let (free_tx, free_rx) = sync_channel::<Block>(AHEAD + 1);
        for _ in 0..AHEAD {
            let _ = free_tx.send(Block::default());
        }
        let reader = std::thread::Builder::new()
            .name("recording-read".into())
            .spawn_scoped(s, move || -> Result<Vec<(PathBuf, Torn)>, RecordingError> {
                let mut spare = Some(Block::default());
                let mut torn = Vec::new();
                for path in files {
                    let mut file = FileReader::open(path)?;
                    loop {
                        // the caller stopped: nothing more to read
                        let Some(mut block) = spare.take().or_else(|| free_rx.recv().ok()) else {
                            return Ok(torn);
                        };
                        if !file.read_block(&mut block)? {
                            spare = Some(block);
                            break;
                        }
                        if full_tx.send(block).is_err() {
                            return Ok(torn);
                        }
                    }
                    torn.extend(file.torn().map(|t| (path.clone(), t.clone())));
                }
                Ok(torn)
            })
            .map_err(|e| RecordingError::Io {
                path: PathBuf::from("(a reader thread)"),
                source: e,
            })?;
        for block in full_rx.iter() {
            if !block.iter().all(&mut each) {
                break;
            }
            let _ = free_tx.send(block);
        }
        // a reader waiting to send or for a block is let go
        drop((full_rx, free_tx));
        reader.join().unwrap_or_else(|panic| std::panic::resume_unwind(panic))
    })
}
