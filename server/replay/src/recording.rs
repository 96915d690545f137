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

use crate::input::Origin;
use crate::venue::{replay_events, RecordedEvent};

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

/// The most bytes of frames and answers [`read_source`] holds for one source: the check keeps a
/// source's recorded text in memory (its events are ordered by receive time across the
/// connections, and a Binance-protocol book's rule is known only from its diffs), so a larger
/// recording is refused with an error rather than read until memory runs out.
pub const MAX_TEXT_BYTES: u64 = 2 << 30;

/// A source's events in receive order: (time ns, connection, where, the event).
pub type SourceEvents = Vec<(i128, usize, Origin, RecordedEvent)>;

/// Reads one source's recording: a report per file, and its events in receive order with the
/// number of connections. A recording holding more than [`MAX_TEXT_BYTES`] of text is an error.
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
    let files: Vec<_> =
        recording::list_files(dir)?.into_iter().filter(|f| f.source == source).collect();
    let mut reports = Vec::new();
    let mut conns: HashMap<u64, usize> = HashMap::new();
    // a REST request's text, until its answer
    let mut requests: HashMap<u64, String> = HashMap::new();
    let mut events = Vec::new();
    let mut text_bytes = 0u64;
    for f in files {
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
                let n = conns.len();
                let conn = *conns.entry(r.conn).or_insert(n);
                text_bytes += (r.body.len() + r.meta.len()) as u64;
                anyhow::ensure!(
                    text_bytes <= max_text,
                    "{source}: its recording holds more than {max_text} bytes of frames and \
                     answers, more than the offline check holds at once (it ends at {})",
                    f.path.display()
                );
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
                let origin = Origin { path: f.path.clone(), line: report.records as usize };
                events.push((i128::from(r.time_ns), conn, origin, event));
            }
        }
        report.connections = file_conns.len();
        report.torn = reader.torn().map(|t| TornReport {
            offset: t.offset,
            bytes: t.bytes,
            reason: t.reason.clone(),
        });
        reports.push(report);
    }
    events.sort_by_key(|e| e.0); // stable: a connection's own order is kept
    Ok((reports, conns.len(), events))
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
        let (files, connections, events) = read_source(&args.dir, &source)?;
        for f in &files {
            serde_json::to_writer(&mut *out, f)?;
            writeln!(out)?;
        }
        if dialect == Dialect::Binance {
            // its books from its diffs and its REST snapshots, by Binance's rules
            for r in crate::depth::replay_recorded(&events)? {
                ok &= r.consistent();
                serde_json::to_writer(&mut *out, &r)?;
                writeln!(out)?;
            }
            continue;
        }
        for r in replay_events(dialect, connections, events)? {
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

    /// A recording larger than the check holds is an error naming the bound, not an
    /// allocation without end; within the bound it reads whole.
    #[test]
    fn a_recording_over_the_bound_is_refused() {
        let dir =
            std::env::temp_dir().join(format!("millrace-replay-bound-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        let mut rec = recording::Recorder::new(&dir, "okx").unwrap();
        let t0 = 1_700_000_000_000_000_000i64;
        let frame = "x".repeat(1000);
        rec.append(&recording::Record {
            kind: Kind::Connected,
            time_ns: t0,
            conn: 1,
            meta: "wss://x/ws/v5/public",
            body: b"",
        })
        .unwrap();
        for i in 1..=10 {
            rec.append(&recording::Record {
                kind: Kind::Received,
                time_ns: t0 + i,
                conn: 1,
                meta: "",
                body: frame.as_bytes(),
            })
            .unwrap();
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
