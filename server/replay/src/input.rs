//! Opening recorded files: plain text, gzip (`.gz`) or the first member of a `.zip`, read line by
//! line with the file name and line number kept for error messages.

use std::fmt;
use std::fs::File;
use std::io::{self, BufRead, BufReader, Read, Seek, SeekFrom};
use std::path::{Path, PathBuf};

use anyhow::Context as _;

/// The recorded exchange data the tests, benches and examples check millrace against: the
/// workspace's `testdata/` (its README names each file's origin, licence and known facts).
/// Located from this crate's manifest directory (`server/replay`), so it is found from any
/// working directory and in any checkout.
pub fn testdata_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .ancestors()
        .nth(2)
        .expect("the replay crate lives two levels below the workspace root")
        .join("testdata")
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

/// The longest line the replay tools read (1 MiB; real exchange rows are well under 1 KB). A
/// longer one is an error naming the file and line, so a file (or a decompressed zip or gzip
/// member) without newlines can never make the reader buffer it whole.
pub const MAX_LINE_BYTES: usize = 1 << 20;

/// Opens `path` for reading, transparently decompressing `.gz` and `.zip` (first member). Both
/// are streamed: memory stays bounded whatever size a zip member's header declares, and a member
/// that inflates to more (or fewer) bytes than it declares, or fails its CRC, is an error.
pub fn open(path: &Path) -> anyhow::Result<Box<dyn BufRead>> {
    let file = File::open(path).with_context(|| format!("cannot open {}", path.display()))?;
    let name = path.to_string_lossy().to_ascii_lowercase();
    if name.ends_with(".gz") {
        Ok(Box::new(BufReader::with_capacity(1 << 16, flate2::read::MultiGzDecoder::new(file))))
    } else if name.ends_with(".zip") {
        Ok(Box::new(BufReader::with_capacity(1 << 16, ZipMember::first(path, file)?)))
    } else {
        Ok(Box::new(BufReader::with_capacity(1 << 16, file)))
    }
}

/// The first member of a zip archive, inflated as it is read. The central directory says where
/// the member's data starts, how it is compressed, its size and CRC; the declared size is only
/// checked against, never allocated.
struct ZipMember {
    inner: Box<dyn Read>,
    declared: u64,
    crc: u32,
    read: u64,
    hasher: crc32fast::Hasher,
}

impl ZipMember {
    fn first(path: &Path, file: File) -> anyhow::Result<ZipMember> {
        let mut archive = zip::ZipArchive::new(BufReader::new(file))
            .with_context(|| format!("{} is not a readable zip archive", path.display()))?;
        let (method, start, compressed, declared, crc) = {
            let member = archive
                .by_index_raw(0)
                .with_context(|| format!("{} has no readable member", path.display()))?;
            if member.encrypted() {
                anyhow::bail!("{}: the zip member is encrypted", path.display());
            }
            (
                member.compression(),
                member.data_start(),
                member.compressed_size(),
                member.size(),
                member.crc32(),
            )
        };
        let mut file = archive.into_inner().into_inner();
        file.seek(SeekFrom::Start(start))
            .with_context(|| format!("cannot read {}", path.display()))?;
        let raw = file.take(compressed);
        let inner: Box<dyn Read> = match method {
            zip::CompressionMethod::Stored => Box::new(raw),
            zip::CompressionMethod::Deflated => Box::new(flate2::read::DeflateDecoder::new(raw)),
            other => anyhow::bail!(
                "{}: the zip member is compressed with {other}; only stored and deflate are read",
                path.display()
            ),
        };
        Ok(ZipMember { inner, declared, crc, read: 0, hasher: crc32fast::Hasher::new() })
    }
}

impl Read for ZipMember {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        let n = self.inner.read(buf)?;
        self.read += n as u64;
        if self.read > self.declared {
            return Err(io::Error::new(
                io::ErrorKind::InvalidData,
                format!(
                    "the zip member inflates to more than the {} bytes its header declares",
                    self.declared
                ),
            ));
        }
        self.hasher.update(&buf[..n]);
        if n == 0 && !buf.is_empty() {
            if self.read != self.declared {
                return Err(io::Error::new(
                    io::ErrorKind::InvalidData,
                    format!(
                        "the zip member ends after {} of the {} bytes its header declares",
                        self.read, self.declared
                    ),
                ));
            }
            if self.hasher.clone().finalize() != self.crc {
                return Err(io::Error::new(
                    io::ErrorKind::InvalidData,
                    "the zip member fails its CRC check",
                ));
            }
        }
        Ok(n)
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
        // At most one byte past the limit is read, so an endless line costs MAX_LINE_BYTES.
        let n = (&mut reader)
            .take(MAX_LINE_BYTES as u64 + 1)
            .read_until(b'\n', &mut buf)
            .with_context(|| {
                format!("{}: read failed after line {}", path.display(), origin.line)
            })?;
        if n == 0 {
            return Ok(());
        }
        origin.line += 1;
        if buf.len() > MAX_LINE_BYTES && buf.last() != Some(&b'\n') {
            return Err(InputError::new(
                origin,
                format!("line is longer than {MAX_LINE_BYTES} bytes (MAX_LINE_BYTES)"),
            )
            .into());
        }
        while matches!(buf.last(), Some(b'\n' | b'\r')) {
            buf.pop();
        }
        let line = std::str::from_utf8(&buf)
            .map_err(|_| InputError::new(origin.clone(), "line is not valid UTF-8"))?;
        f(&origin, line)?;
    }
}

/// An [`InputError`] at `origin`.
pub(crate) fn bad(origin: &Origin, msg: impl Into<String>) -> anyhow::Error {
    InputError::new(origin.clone(), msg).into()
}

/// Parses `secs.frac` (cryptofeed) into nanoseconds, exactly.
pub(crate) fn parse_secs(origin: &Origin, s: &str) -> anyhow::Result<i128> {
    let (int, frac) = s.split_once('.').unwrap_or((s, ""));
    // i64 seconds: a larger value is not a timestamp (and would overflow the nanoseconds)
    let int: i64 = int.parse().map_err(|_| bad(origin, format!("bad timestamp {s:?}")))?;
    let int = int as i128;
    let mut frac_ns: i128 = 0;
    for (i, c) in frac.bytes().enumerate() {
        if !c.is_ascii_digit() {
            return Err(bad(origin, format!("bad timestamp {s:?}")));
        }
        if i < 9 {
            frac_ns = frac_ns * 10 + (c - b'0') as i128;
        }
    }
    frac_ns *= 10i128.pow(9u32.saturating_sub(frac.len() as u32));
    Ok(int * 1_000_000_000 + frac_ns)
}
