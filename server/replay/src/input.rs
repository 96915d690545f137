//! Opening recorded files: plain text, gzip (`.gz`) or the first member of a `.zip`, read line by
//! line with the file name and line number kept for error messages.

use std::collections::{BTreeMap, BinaryHeap};
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

/// A file's lines, read one at a time: what [`for_each_line`] walks, and each file of a
/// [`for_each_merged`] stream.
pub struct Lines {
    reader: Box<dyn BufRead>,
    buf: Vec<u8>,
    origin: Origin,
}

impl Lines {
    pub fn open(path: &Path) -> anyhow::Result<Lines> {
        Ok(Lines {
            reader: open(path)?,
            buf: Vec::with_capacity(4096),
            origin: Origin { path: path.to_path_buf(), line: 0 },
        })
    }

    /// The next line (without its newline) and where it is; `None` at the end of the file. A
    /// line longer than [`MAX_LINE_BYTES`] or not valid UTF-8 is an error naming it.
    pub fn next_line(&mut self) -> anyhow::Result<Option<(&Origin, &str)>> {
        self.buf.clear();
        // At most one byte past the limit is read, so an endless line costs MAX_LINE_BYTES.
        let n = (&mut self.reader)
            .take(MAX_LINE_BYTES as u64 + 1)
            .read_until(b'\n', &mut self.buf)
            .with_context(|| {
                format!(
                    "{}: read failed after line {}",
                    self.origin.path.display(),
                    self.origin.line
                )
            })?;
        if n == 0 {
            return Ok(None);
        }
        self.origin.line += 1;
        if self.buf.len() > MAX_LINE_BYTES && self.buf.last() != Some(&b'\n') {
            return Err(InputError::new(
                self.origin.clone(),
                format!("line is longer than {MAX_LINE_BYTES} bytes (MAX_LINE_BYTES)"),
            )
            .into());
        }
        while matches!(self.buf.last(), Some(b'\n' | b'\r')) {
            self.buf.pop();
        }
        let line = std::str::from_utf8(&self.buf)
            .map_err(|_| InputError::new(self.origin.clone(), "line is not valid UTF-8"))?;
        Ok(Some((&self.origin, line)))
    }
}

/// Reads `path` line by line, calling `f(origin, line)` for each line (without the newline).
/// Stops at the first error `f` returns. A file that is not valid UTF-8 is an error naming the
/// line.
pub fn for_each_line(
    path: &Path,
    mut f: impl FnMut(&Origin, &str) -> anyhow::Result<()>,
) -> anyhow::Result<()> {
    let mut lines = Lines::open(path)?;
    while let Some((origin, line)) = lines.next_line()? {
        f(origin, line)?;
    }
    Ok(())
}

/// The most bytes of lines [`for_each_merged`] holds at once to put several files' items into
/// receive order (1 GiB): more is an error naming the file and its disorder, never an allocation
/// without end.
pub const MAX_HELD_BYTES: u64 = 1 << 30;

/// How far out of time order a sequence of times is: the most any time lies before one seen
/// ahead of it (0 for a sequence in order). What a [`ReorderWindow`] needs to be told.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Disorder {
    latest: Option<i128>,
    /// The measure so far, ns.
    pub most_ns: u128,
}

impl Disorder {
    pub fn see(&mut self, ts: i128) {
        match self.latest {
            Some(latest) if ts < latest => self.most_ns = self.most_ns.max(latest.abs_diff(ts)),
            Some(latest) if ts <= latest => {}
            _ => self.latest = Some(ts),
        }
    }
}

/// Items that arrive in about time order, handed on in exact time order (equal times in the
/// order they arrived, as a stable sort puts them). Told the [`Disorder`] of what will arrive,
/// it holds an item only while one still to come could precede it.
pub struct ReorderWindow<T> {
    disorder_ns: u128,
    /// By time, then arrival.
    held: BTreeMap<(i128, u64), (T, u64)>,
    arrived: u64,
    latest: i128,
}

impl<T> ReorderWindow<T> {
    pub fn new(disorder_ns: u128) -> Self {
        ReorderWindow { disorder_ns, held: BTreeMap::new(), arrived: 0, latest: i128::MIN }
    }

    /// Holds `item` of time `ts`, `bytes` long (given back by [`ReorderWindow::pop`]).
    pub fn push(&mut self, ts: i128, bytes: u64, item: T) {
        self.latest = self.latest.max(ts);
        self.held.insert((ts, self.arrived), (item, bytes));
        self.arrived += 1;
    }

    /// The time of the earliest item held, once nothing still to come can precede it.
    pub fn ready(&self) -> Option<i128> {
        let &(ts, _) = self.held.keys().next()?;
        // nothing still to come lies before `latest - disorder`
        (self.latest.abs_diff(ts) >= self.disorder_ns).then_some(ts)
    }

    /// The earliest item held (ready or not: at the end, everything is), with its time and
    /// length.
    pub fn pop(&mut self) -> Option<(i128, T, u64)> {
        let ((ts, _), (item, bytes)) = self.held.pop_first()?;
        Some((ts, item, bytes))
    }

    /// The time of the earliest item held.
    pub fn first(&self) -> Option<i128> {
        self.held.keys().next().map(|&(ts, _)| ts)
    }
}

/// What [`survey`] found of one file: its earliest item's time, and how far out of time order
/// its items are.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FileSurvey {
    /// The earliest time of an item in the file; `None` when it has none.
    pub first_ns: Option<i128>,
    /// The most any item's time lies before an item above it in the file, ns (0 when the file
    /// is in time order).
    pub disorder_ns: u128,
}

/// The first pass over `files` for [`for_each_merged`]: each line through `parse` (an item and
/// its receive time, or `None` for a line that holds none), each item shown to `learn`; what
/// each file's times are like.
pub fn survey<T>(
    files: &[PathBuf],
    mut parse: impl FnMut(usize, &Origin, &str) -> anyhow::Result<Option<(i128, T)>>,
    mut learn: impl FnMut(usize, &T),
) -> anyhow::Result<Vec<FileSurvey>> {
    let mut out = Vec::with_capacity(files.len());
    for (i, path) in files.iter().enumerate() {
        let mut first_ns: Option<i128> = None;
        let mut disorder = Disorder::default();
        let mut lines = Lines::open(path)?;
        while let Some((origin, line)) = lines.next_line()? {
            let Some((ts, item)) = parse(i, origin, line)? else { continue };
            learn(i, &item);
            first_ns = Some(first_ns.map_or(ts, |f| f.min(ts)));
            disorder.see(ts);
        }
        out.push(FileSurvey { first_ns, disorder_ns: disorder.most_ns });
    }
    Ok(out)
}

/// One file of a [`for_each_merged`] stream: its items in time order through a reorder window
/// as wide as its disorder.
struct FileStream<T> {
    lines: Lines,
    disorder_ns: u128,
    /// Items read and not yet handed on.
    window: ReorderWindow<(Origin, T)>,
    /// The time of the last item handed on.
    released: i128,
    ended: bool,
}

impl<T> FileStream<T> {
    /// The time of the file's next item in time order, reading as far as it takes to know that
    /// no item still to come precedes it; `None` at the end.
    fn head(
        &mut self,
        file: usize,
        parse: &mut impl FnMut(usize, &Origin, &str) -> anyhow::Result<Option<(i128, T)>>,
        held_bytes: &mut u64,
        max_held: u64,
    ) -> anyhow::Result<Option<i128>> {
        loop {
            if self.ended {
                return Ok(self.window.first());
            }
            if let Some(ts) = self.window.ready() {
                return Ok(Some(ts));
            }
            let Some((origin, line)) = self.lines.next_line()? else {
                self.ended = true;
                continue;
            };
            let Some((ts, item)) = parse(file, origin, line)? else { continue };
            if ts < self.released {
                return Err(bad(
                    origin,
                    "the file changed while it was read: this line lies further out of time \
                     order than the first reading found",
                ));
            }
            let bytes = line.len() as u64;
            *held_bytes += bytes;
            if *held_bytes > max_held {
                return Err(bad(
                    origin,
                    format!(
                        "the files' lines are up to {} ms out of time order, and ordering them \
                         holds more than {max_held} bytes of lines at once",
                        self.disorder_ns / 1_000_000
                    ),
                ));
            }
            self.window.push(ts, bytes, (origin.clone(), item));
        }
    }
}

/// Calls `each(file, origin, time, item)` with the items of all `files` in receive-time order,
/// reading them as a stream: items of equal time in file order, then line order, exactly as a
/// stable sort of all files' items read one file after another puts them. `parse` reads a line
/// as [`survey`]'s did (which gave `surveyed`). A file is opened when its first item is due and
/// closed at its end, and each holds only the items its disorder could still put behind one
/// to come: more than `max_held` bytes of lines held in all is an error.
pub fn for_each_merged<T>(
    files: &[PathBuf],
    surveyed: &[FileSurvey],
    max_held: u64,
    mut parse: impl FnMut(usize, &Origin, &str) -> anyhow::Result<Option<(i128, T)>>,
    mut each: impl FnMut(usize, Origin, i128, T) -> anyhow::Result<()>,
) -> anyhow::Result<()> {
    use std::cmp::Reverse;
    // each file's next item by (time, file); a file not yet opened stands in with its first time
    let mut heads: BinaryHeap<Reverse<(i128, usize)>> =
        surveyed.iter().enumerate().filter_map(|(i, s)| Some(Reverse((s.first_ns?, i)))).collect();
    let mut streams: Vec<Option<FileStream<T>>> = files.iter().map(|_| None).collect();
    let mut held_bytes = 0u64;
    while let Some(Reverse((_, i))) = heads.pop() {
        let stream = match &mut streams[i] {
            Some(stream) => {
                let (ts, (origin, item), bytes) = stream.window.pop().expect("a head is held");
                held_bytes -= bytes;
                stream.released = ts;
                each(i, origin, ts, item)?;
                stream
            }
            slot @ None => slot.insert(FileStream {
                lines: Lines::open(&files[i])?,
                disorder_ns: surveyed[i].disorder_ns,
                window: ReorderWindow::new(surveyed[i].disorder_ns),
                released: i128::MIN,
                ended: false,
            }),
        };
        match stream.head(i, &mut parse, &mut held_bytes, max_held)? {
            Some(ts) => heads.push(Reverse((ts, i))),
            None => streams[i] = None, // closed
        }
    }
    Ok(())
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

#[cfg(test)]
mod tests {
    use super::*;

    /// `<time> <label>` lines; a blank line holds no item.
    fn parse(_: usize, origin: &Origin, line: &str) -> anyhow::Result<Option<(i128, String)>> {
        if line.is_empty() {
            return Ok(None);
        }
        let (ts, label) = line.split_once(' ').ok_or_else(|| bad(origin, "no label"))?;
        let ts = ts.parse().map_err(|_| bad(origin, format!("bad time {ts:?}")))?;
        Ok(Some((ts, label.to_string())))
    }

    fn write_files(name: &str, files: &[Vec<String>]) -> (PathBuf, Vec<PathBuf>) {
        let dir =
            std::env::temp_dir().join(format!("millrace-merge-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        let paths = files
            .iter()
            .enumerate()
            .map(|(i, lines)| {
                let path = dir.join(format!("{i}.txt"));
                std::fs::write(&path, lines.iter().map(|l| format!("{l}\n")).collect::<String>())
                    .unwrap();
                path
            })
            .collect();
        (dir, paths)
    }

    fn merged(
        paths: &[PathBuf],
        max_held: u64,
    ) -> anyhow::Result<Vec<(i128, usize, usize, String)>> {
        let surveyed = survey(paths, parse, |_, _| {})?;
        let mut got = Vec::new();
        for_each_merged(paths, &surveyed, max_held, parse, |file, origin, ts, label| {
            got.push((ts, file, origin.line, label));
            Ok(())
        })?;
        Ok(got)
    }

    /// Random files, in time order or written out of it, some overlapping and some after one
    /// another, merge into exactly the order a stable sort of all their items gives.
    #[test]
    fn files_merge_as_a_stable_sort_of_all_their_items() {
        let mut rng = shared::testkit::Rng::new(7);
        for case in 0..200 {
            let nfiles = 1 + rng.below(4) as usize;
            let mut files = Vec::new();
            for f in 0..nfiles {
                let mut t = if rng.chance(1, 3) { f as i128 * 1_000 } else { 0 };
                let disorder = rng.below(4) as i128 * 5;
                let lines = (0..rng.below(40))
                    .map(|k| {
                        if rng.chance(1, 10) {
                            return String::new();
                        }
                        t += rng.below(4) as i128; // ties are common
                        let back =
                            if disorder > 0 { rng.below(disorder as u64 + 1) as i128 } else { 0 };
                        format!("{} f{f}l{k}", t - back)
                    })
                    .collect();
                files.push(lines);
            }
            let (dir, paths) = write_files(&format!("stable{case}"), &files);
            let mut want = Vec::new();
            for (f, path) in paths.iter().enumerate() {
                for_each_line(path, |origin, line| {
                    if let Some((ts, label)) = parse(f, origin, line)? {
                        want.push((ts, f, origin.line, label));
                    }
                    Ok(())
                })
                .unwrap();
            }
            want.sort_by_key(|w| w.0);
            assert_eq!(merged(&paths, 1 << 20).unwrap(), want, "case {case}: {files:?}");
            let _ = std::fs::remove_dir_all(&dir);
        }
    }

    /// Only a file's disorder is held: a file far out of order is refused past the bound, one
    /// in order streams within a tiny bound, and absurd times neither overflow nor panic.
    #[test]
    fn the_merge_holds_only_the_disorder_and_bounds_it() {
        let in_order: Vec<String> = (0..1000).map(|i| format!("{i} {}", "x".repeat(50))).collect();
        let mut reversed = in_order.clone();
        reversed.reverse();
        let (dir, paths) = write_files("bound", &[in_order, reversed]);
        // in order: one line held at a time
        assert_eq!(merged(&paths[..1], 100).unwrap().len(), 1000);
        let err = merged(&paths[1..], 10_000).unwrap_err().to_string();
        assert!(
            err.contains("out of time order") && err.contains("more than 10000 bytes"),
            "{err}"
        );
        assert_eq!(merged(&paths[1..], 1 << 20).unwrap().len(), 1000);
        let _ = std::fs::remove_dir_all(&dir);
        let extremes = vec![
            format!("{} max", i128::MAX),
            format!("{} min", i128::MIN),
            "0 zero".to_string(),
            format!("{} max2", i128::MAX),
        ];
        let (dir, paths) = write_files("extremes", &[extremes.clone(), extremes]);
        let got: Vec<String> = merged(&paths, 1 << 20).unwrap().into_iter().map(|g| g.3).collect();
        assert_eq!(got, ["min", "min", "zero", "zero", "max", "max2", "max", "max2"]);
        let _ = std::fs::remove_dir_all(&dir);
    }
}
