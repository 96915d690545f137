//! `millrace replay recording DIR`: checks millrace's own recording (docs/recording.md) offline.
//!
//! For each recorded source (`{dir}/{source}/source.json` says its dialect and market), every
//! file is read block by block, oldest hour first; a torn block (a process killed while writing
//! it) ends its file and is reported with its offset, the blocks before it are kept. Prints one
//! JSON object per file (records by kind, connections, its time range, the torn tail if any) and,
//! for another venue's recording, one per book and trades as `millrace replay depth --venue`
//! does: each connection's frames through the venue's own rules, books synced, gaps, resyncs,
//! checksums, crossed books. Exit status 1 when a book's check fails.

use std::collections::{BTreeMap, HashMap};
use std::io::Write;
use std::path::{Path, PathBuf};

use anyhow::Context as _;
use recording::{FileReader, Kind};
use serde::Serialize;
use shared::venue::Dialect;

use crate::input::{Disorder, Origin, ReorderWindow};
use crate::venue::{EventReplay, RecordedEvent};

/// Arguments of `millrace replay recording`.
#[derive(Debug, clap::Args)]
pub struct RecordingArgs {
    /// The recording directory (`record.dir`; by default `{data_dir}/recordings`).
    pub dir: PathBuf,
    /// Only this source's recording.
    #[arg(long)]
    pub source: Option<String>,
}

/// What one file held.
#[derive(Debug, Clone, Serialize, PartialEq, Eq)]
pub struct FileReport {
    pub file: String,
    pub source: String,
    pub blocks: u64,
    pub records: u64,
    /// Records by kind (`received`, `sent`, `connected`, `closed`, `rest_request`, `rest_answer`).
    pub kinds: BTreeMap<&'static str, u64>,
    pub connections: usize,
    /// The first and last receive time, Unix ns.
    pub first_ns: Option<i64>,
    pub last_ns: Option<i64>,
    /// Where the readable part ends and why, when a torn block ends the file early.
    pub torn: Option<TornReport>,
}

#[derive(Debug, Clone, Serialize, PartialEq, Eq)]
pub struct TornReport {
    pub offset: u64,
    pub bytes: u64,
    pub reason: String,
}

/// What `source.json` says of a recorded source.
#[derive(Debug, serde::Deserialize)]
struct Described {
    dialect: String,
}

/// The most bytes of frames and answers the check holds at once for one source. It reads a
/// recording as a stream, in receive order, holding only the events that a later record, written
/// out of that order, could still come before (records are written in about the order they are
/// received: a connection's own are in order, and the recorder's queue interleaves them); a
/// recording whose disorder would make it hold more is refused with an error rather than read
/// until memory runs out. [`read_source`], which returns a source's events whole, holds at most
/// this much in all.
pub const MAX_TEXT_BYTES: u64 = 2 << 30;

/// A source's events in receive order: (time ns, connection, where, the event).
pub type SourceEvents = Vec<(i128, usize, Origin, RecordedEvent)>;

/// What a first pass over a source's files found: a report per file, its connections, and
/// how far out of receive order its records were written.
#[derive(Debug, Clone)]
pub struct Survey {
    pub files: Vec<FileReport>,
    /// Connection ids, in order of first appearance, and their index.
    connections: HashMap<u64, usize>,
    /// The most any record's time lies before a record written ahead of it, ns.
    pub disorder_ns: u128,
}

impl Survey {
    pub fn connections(&self) -> usize {
        self.connections.len()
    }
}

/// The recording's files of `source`, oldest hour first.
fn source_files(dir: &Path, source: &str) -> anyhow::Result<Vec<recording::RecordingFile>> {
    Ok(recording::list_files(dir)?.into_iter().filter(|f| f.source == source).collect())
}

/// The first pass over `source`'s recording: each file's blocks, records, kinds, connections,
/// time range and torn tail, and the recording's disorder.
pub fn survey(dir: &Path, source: &str) -> anyhow::Result<Survey> {
    let mut survey = Survey { files: Vec::new(), connections: HashMap::new(), disorder_ns: 0 };
    let mut disorder = Disorder::default();
    for f in source_files(dir, source)? {
        let mut reader = FileReader::open(&f.path)?;
        let mut report = FileReport {
            file: f.path.display().to_string(),
            source: source.to_string(),
            blocks: 0,
            records: 0,
            kinds: BTreeMap::new(),
            connections: 0,
            first_ns: None,
            last_ns: None,
            torn: None,
        };
        let mut file_conns = std::collections::HashSet::new();
        while let Some(block) = reader.next_block()? {
            report.blocks += 1;
            for r in block {
                report.records += 1;
                *report.kinds.entry(r.kind.as_str()).or_default() += 1;
                report.first_ns.get_or_insert(r.time_ns);
                report.last_ns = Some(r.time_ns);
                file_conns.insert(r.conn);
                let n = survey.connections.len();
                survey.connections.entry(r.conn).or_insert(n);
                disorder.see(i128::from(r.time_ns));
            }
        }
        report.connections = file_conns.len();
        report.torn = reader.torn().map(|t| TornReport {
            offset: t.offset,
            bytes: t.bytes,
            reason: t.reason.clone(),
        });
        survey.files.push(report);
    }
    survey.disorder_ns = disorder.most_ns;
    Ok(survey)
}

/// An event waiting in [`for_each_event`]'s reorder window.
struct Held {
    conn: usize,
    origin: Origin,
    event: RecordedEvent,
}

/// Calls `each` with `source`'s events in receive order (records of equal time in the order
/// they were written), reading the files again as a stream. An event is handed on once the
/// records read since are far enough ahead in time that none still to come can precede it
/// ([`Survey::disorder_ns`] says how far back one can lie), so only that window is held: more
/// than `max_held` bytes of it is an error.
pub fn for_each_event(
    dir: &Path,
    source: &str,
    survey: &Survey,
    max_held: u64,
    mut each: impl FnMut(i128, usize, Origin, RecordedEvent) -> anyhow::Result<()>,
) -> anyhow::Result<()> {
    let mut window = ReorderWindow::new(survey.disorder_ns);
    let mut held_bytes = 0u64;
    // a REST request's text, until its answer
    let mut requests: HashMap<u64, String> = HashMap::new();
    for f in source_files(dir, source)? {
        let mut reader = FileReader::open(&f.path)?;
        let mut line = 0usize;
        while let Some(block) = reader.next_block()? {
            for r in block {
                line += 1;
                let text = || String::from_utf8_lossy(&r.body).into_owned();
                let event = match r.kind {
                    Kind::Connected => RecordedEvent::Connected,
                    Kind::Sent => RecordedEvent::Sent(text()),
                    Kind::Received => RecordedEvent::Received(text()),
                    Kind::RestRequest => {
                        requests.insert(r.conn, r.meta.clone());
                        continue;
                    }
                    Kind::RestAnswer => {
                        let request = requests.remove(&r.conn).unwrap_or_default();
                        RecordedEvent::RestAnswer { request, body: text() }
                    }
                    Kind::Closed => continue,
                };
                let conn = *survey
                    .connections
                    .get(&r.conn)
                    .context("the recording changed since it was surveyed")?;
                let bytes = (r.body.len() + r.meta.len()) as u64;
                held_bytes += bytes;
                anyhow::ensure!(
                    held_bytes <= max_held,
                    "{source}: its records are written up to {} ms out of receive order, and \
                     ordering them holds more than {max_held} bytes of frames and answers at \
                     once (at {})",
                    survey.disorder_ns / 1_000_000,
                    f.path.display()
                );
                let origin = Origin { path: f.path.clone(), line };
                window.push(i128::from(r.time_ns), bytes, Held { conn, origin, event });
                while window.ready().is_some() {
                    let (time_ns, h, bytes) = window.pop().expect("ready");
                    held_bytes -= bytes;
                    each(time_ns, h.conn, h.origin, h.event)?;
                }
            }
        }
    }
    while let Some((time_ns, h, _)) = window.pop() {
        each(time_ns, h.conn, h.origin, h.event)?;
    }
    Ok(())
}

/// Reads one source's recording whole: a report per file, and its events in receive order with
/// the number of connections. A recording holding more than [`MAX_TEXT_BYTES`] of text is an
/// error.
pub fn read_source(
    dir: &Path,
    source: &str,
) -> anyhow::Result<(Vec<FileReport>, usize, SourceEvents)> {
    read_source_within(dir, source, MAX_TEXT_BYTES)
}

fn read_source_within(
    dir: &Path,
    source: &str,
    max_text: u64,
) -> anyhow::Result<(Vec<FileReport>, usize, SourceEvents)> {
    let survey = survey(dir, source)?;
    let mut events = Vec::new();
    let mut text_bytes = 0u64;
    for_each_event(dir, source, &survey, max_text, |time_ns, conn, origin, event| {
        text_bytes += match &event {
            RecordedEvent::Connected => 0,
            RecordedEvent::Sent(t) | RecordedEvent::Received(t) => t.len() as u64,
            RecordedEvent::RestAnswer { request, body } => (request.len() + body.len()) as u64,
        };
        anyhow::ensure!(
            text_bytes <= max_text,
            "{source}: its recording holds more than {max_text} bytes of frames and answers, \
             more than it is read into memory whole (`millrace replay recording` reads it as a \
             stream)"
        );
        events.push((time_ns, conn, origin, event));
        Ok(())
    })?;
    let connections = survey.connections();
    Ok((survey.files, connections, events))
}

/// Runs the check, printing one JSON object per file and per book; returns whether every book's
/// check passed.
pub fn run(args: &RecordingArgs, out: &mut dyn Write) -> anyhow::Result<bool> {
    let mut sources: Vec<String> = std::fs::read_dir(&args.dir)
        .with_context(|| format!("{}: not a recording directory", args.dir.display()))?
        .filter_map(|e| e.ok())
        .filter(|e| e.path().join("source.json").is_file())
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .filter(|s| args.source.as_ref().is_none_or(|want| want == s))
        .collect();
    sources.sort();
    if sources.is_empty() {
        anyhow::bail!("{}: no recorded source (no {{source}}/source.json)", args.dir.display());
    }
    let mut ok = true;
    for source in sources {
        let described = std::fs::read_to_string(args.dir.join(&source).join("source.json"))?;
        let described: Described =
            serde_json::from_str(&described).with_context(|| format!("{source}/source.json"))?;
        let dialect: Dialect = described.dialect.parse().map_err(|_| {
            anyhow::anyhow!("{source}/source.json: unknown dialect {:?}", described.dialect)
        })?;
        let survey = survey(&args.dir, &source)?;
        for f in &survey.files {
            serde_json::to_writer(&mut *out, f)?;
            writeln!(out)?;
        }
        let events =
            |each: &mut dyn FnMut(i128, usize, Origin, RecordedEvent) -> anyhow::Result<()>| {
                for_each_event(&args.dir, &source, &survey, MAX_TEXT_BYTES, each)
            };
        if dialect == Dialect::Binance {
            // its books from its diffs and its REST snapshots, by Binance's rules: a first
            // reading learns each symbol's rule and each connection's symbols, the second syncs
            let mut books = crate::depth::RecordedBooks::default();
            events(&mut |_, conn, origin, event| books.learn(conn, &origin, &event))?;
            events(&mut |time_ns, conn, origin, event| books.step(time_ns, conn, &origin, event))?;
            for r in books.finish() {
                ok &= r.consistent();
                serde_json::to_writer(&mut *out, &r)?;
                writeln!(out)?;
            }
            continue;
        }
        let mut replay = EventReplay::new(dialect, survey.connections());
        events(&mut |_, conn, origin, event| replay.on(conn, origin, event))?;
        for r in replay.finish() {
            ok &= r.ok;
            serde_json::to_writer(&mut *out, &r)?;
            writeln!(out)?;
        }
    }
    Ok(ok)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn put(rec: &mut recording::Recorder, kind: Kind, time_ns: i64, conn: u64, body: &str) {
        rec.append(&recording::Record { kind, time_ns, conn, meta: "", body: body.as_bytes() })
            .unwrap();
    }

    /// A new recording of source `okx` in a directory of its own, and its first time.
    fn new_recording(name: &str) -> (PathBuf, recording::Recorder, i64) {
        let dir =
            std::env::temp_dir().join(format!("millrace-replay-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        let rec = recording::Recorder::new(&dir, "okx").unwrap();
        (dir, rec, 1_700_000_000_000_000_000i64)
    }

    /// Records written out of receive order (two connections' frames interleaved by the
    /// recorder's queue) come out of the stream in receive order, equal times in written order,
    /// as a stable sort of the whole recording puts them; the window it holds is bounded.
    #[test]
    fn a_recording_streams_in_receive_order_holding_only_its_disorder() {
        let (dir, mut rec, t0) = new_recording("order");
        let written = [
            (Kind::Connected, 0, 1, ""),
            (Kind::Connected, 1, 2, ""),
            (Kind::Received, 100, 1, "a100"),
            (Kind::Received, 50, 2, "b50"),
            (Kind::Received, 120, 1, "a120"),
            (Kind::Received, 60, 2, "b60"),
            (Kind::Received, 60, 1, "a60"),
            (Kind::Received, 200, 2, "b200"),
            (Kind::Received, 130, 1, "a130"),
            (Kind::Received, 300, 1, "a300"),
        ];
        for (kind, t, conn, body) in written {
            put(&mut rec, kind, t0 + t, conn, body);
        }
        rec.flush().unwrap();
        drop(rec);
        let survey = survey(&dir, "okx").unwrap();
        assert_eq!((survey.connections(), survey.disorder_ns), (2, 70)); // 130 after 200
        let mut got = Vec::new();
        for_each_event(&dir, "okx", &survey, 1 << 20, |t, conn, _, e| {
            got.push((t - i128::from(t0), conn, e));
            Ok(())
        })
        .unwrap();
        let mut want: Vec<_> = written
            .iter()
            .map(|&(kind, t, conn, body)| {
                let e = match kind {
                    Kind::Connected => RecordedEvent::Connected,
                    _ => RecordedEvent::Received(body.to_string()),
                };
                (i128::from(t), conn as usize - 1, e)
            })
            .collect();
        want.sort_by_key(|w| w.0);
        assert_eq!(got, want);
        // read whole, the same
        let (_, _, events) = read_source(&dir, "okx").unwrap();
        let whole: Vec<_> =
            events.into_iter().map(|(t, c, _, e)| (t - i128::from(t0), c, e)).collect();
        assert_eq!(whole, want);
        // a window larger than the bound is refused, naming the disorder
        let err =
            for_each_event(&dir, "okx", &survey, 8, |_, _, _, _| Ok(())).unwrap_err().to_string();
        assert!(err.contains("out of receive order") && err.contains("more than 8 bytes"), "{err}");
        let _ = std::fs::remove_dir_all(&dir);
    }

    /// A recording larger than the check holds is an error naming the bound, not an
    /// allocation without end; within the bound it reads whole.
    #[test]
    fn a_recording_over_the_bound_is_refused() {
        let (dir, mut rec, t0) = new_recording("bound");
        let frame = "x".repeat(1000);
        put(&mut rec, Kind::Connected, t0, 1, "");
        for i in 1..=10 {
            put(&mut rec, Kind::Received, t0 + i, 1, &frame);
        }
        rec.flush().unwrap();
        drop(rec);
        let (files, connections, events) = read_source_within(&dir, "okx", 20_000).unwrap();
        assert_eq!((files.len(), connections, events.len()), (1, 1, 11));
        let err = read_source_within(&dir, "okx", 5_000).unwrap_err().to_string();
        assert!(err.contains("okx: its recording holds more than 5000 bytes"), "{err}");
        let _ = std::fs::remove_dir_all(&dir);
    }
}
