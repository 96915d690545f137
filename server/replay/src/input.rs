//! Opening recorded files: plain text, gzip (`.gz`) or the first member of a `.zip`, read line by
//! line with the file name and line number kept for error messages.

use std::fmt;
use std::fs::File;
use std::io::{BufRead, BufReader, Cursor, Read};
use std::path::{Path, PathBuf};

use anyhow::Context as _;

/// The real exchange data the tests and benchmarks check millrace against: `../shared/data`
/// beside the checkout (see its README for the known facts), or `MILLRACE_SHARED_DATA`.
pub fn shared_data_dir() -> PathBuf {
    match std::env::var_os("MILLRACE_SHARED_DATA") {
        Some(d) => PathBuf::from(d),
        None => Path::new(env!("CARGO_MANIFEST_DIR")).join("../../../shared/data"),
    }
}

/// Where a piece of input came from: `file:line`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Origin {
    pub path: PathBuf,
    pub line: usize,
}

impl fmt::Display for Origin {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}:{}", self.path.display(), self.line)
    }
}

/// A bad line in an input file. The message says what was wrong with it.
#[derive(Debug, thiserror::Error)]
#[error("{origin}: {message}")]
pub struct InputError {
    pub origin: Origin,
    pub message: String,
}

impl InputError {
    pub fn new(origin: Origin, message: impl Into<String>) -> Self {
        Self { origin, message: message.into() }
    }
}

/// Opens `path` for reading, transparently decompressing `.gz` and `.zip` (first member).
pub fn open(path: &Path) -> anyhow::Result<Box<dyn BufRead>> {
    let file = File::open(path).with_context(|| format!("cannot open {}", path.display()))?;
    let name = path.to_string_lossy().to_ascii_lowercase();
    if name.ends_with(".gz") {
        Ok(Box::new(BufReader::with_capacity(1 << 16, flate2::read::MultiGzDecoder::new(file))))
    } else if name.ends_with(".zip") {
        let mut archive = zip::ZipArchive::new(BufReader::new(file))
            .with_context(|| format!("{} is not a readable zip archive", path.display()))?;
        let mut member = archive
            .by_index(0)
            .with_context(|| format!("{} has no readable member", path.display()))?;
        // Archives here are tens of MB at most; reading the member whole keeps the reader simple.
        let mut buf = Vec::with_capacity(member.size() as usize);
        member
            .read_to_end(&mut buf)
            .with_context(|| format!("cannot decompress {}", path.display()))?;
        Ok(Box::new(Cursor::new(buf)))
    } else {
        Ok(Box::new(BufReader::with_capacity(1 << 16, file)))
    }
}

/// Reads `path` line by line, calling `f(origin, line)` for each line (without the newline).
/// Stops at the first error `f` returns. A file that is not valid UTF-8 is an error naming the
/// line.
pub fn for_each_line(
    path: &Path,
    mut f: impl FnMut(&Origin, &str) -> anyhow::Result<()>,
) -> anyhow::Result<()> {
    let mut reader = open(path)?;
    let mut buf = Vec::with_capacity(4096);
    let mut origin = Origin { path: path.to_path_buf(), line: 0 };
    loop {
        buf.clear();
        let n = reader.read_until(b'\n', &mut buf).with_context(|| {
            format!("{}: read failed after line {}", path.display(), origin.line)
        })?;
        if n == 0 {
            return Ok(());
        }
        origin.line += 1;
        while matches!(buf.last(), Some(b'\n' | b'\r')) {
            buf.pop();
        }
        let line = std::str::from_utf8(&buf)
            .map_err(|_| InputError::new(origin.clone(), "line is not valid UTF-8"))?;
        f(&origin, line)?;
    }
}
