//! Replay of a recording as fast as possible through the depth path, against live ingest of the
//! same frames (issue 30: "at least 1 M frames/s through the depth path on one core (parse,
//! sync, publish), reported against live ingest of the same frames").
//!
//! Frames: the recorded Binance stream of `binance --bench depth_parse` (11 minutes of ETHUSDT
//! spot `depth@100ms` from testdata/binance-ws/hftbacktest: 6,470 diffs, ~42 levels each, and
//! its REST snapshot), written once into a millrace recording (`recording::Recorder`: zstd
//! blocks, each frame with its receive time) in a temporary directory.
//!
//! - `live_ingest`: the frames from memory, as a depth job gets them off its socket:
//!   `DepthDecoder::decode_into` into the real `BookSync`, its events drained, and the book
//!   published through a `BookPublisher` (in-process bus) every 100 ms of the frames' time, as
//!   `depth.publish_interval_ms` does live;
//! - `replay_recording`: the same, with every frame read from the recording file first (its
//!   blocks read, CRC-checked and decompressed, its records decoded), the REST snapshot taken
//!   from its recorded answer, all on the job's thread;
//! - `replay_read_ahead`: the same through `recording::scan`, which reads and unpacks the blocks
//!   on a reader thread ahead of the job, as the service reads a recording: the depth path (the
//!   job) has its core to itself, as live, where the socket is read elsewhere.
//!
//! `recorder_write`: the recorder's own work on the same frames (each appended with its time,
//! blocks compressed with zstd and written to a file), what recording costs per frame.
//!
//! Each runs twice: `recorded_cadence` publishes every 100 ms of the frames' own time (the live
//! run's deltas exactly; these frames are 100 ms apart, so a publish per frame), `wall_cadence`
//! every 100 ms of the run's own time (as fast as possible, a publish coalesces what came
//! between). Each runs on one thread. `cargo bench -p server --bench replay`

use std::hint::black_box;
use std::io::BufRead;
use std::path::Path;
use std::sync::Arc;

use binance::fastdepth::{Decoded, DepthDecoder, Parsed};
use binance::wire::{self, DepthBody};
use criterion::{criterion_group, criterion_main, Criterion, Throughput};
use recording::{Block, FileReader, Kind, Record, Recorder};
use server::books::BookRegistry;
use server::bus::InProcessBus;
use shared::protocol::{BookHealth, BookStatus, InstrumentId};
use shared::sync::{BookSync, ContinuityRule, SyncConfig};

const PUBLISH_NS: i64 = 100_000_000;

/// The capture's lines in order: (receive time ns, depth frame or REST snapshot body).
fn capture() -> Vec<(i64, Kind, String)> {
    let dir = replay::input::testdata_dir().join("binance-ws/hftbacktest");
    let mut out = Vec::new();
    for name in ["spot_ethusdt_20240808.gz", "spot_ethusdt_20240809.gz"] {
        let reader = replay::input::open(&dir.join(name)).expect("the hftbacktest capture");
        for line in reader.lines() {
            let line = line.expect("readable capture");
            let Some((ts, json)) = line.split_once(' ') else { continue };
            let ns = ts.parse::<i64>().unwrap_or(0);
            if json.contains("\"depthUpdate\"") {
                out.push((ns, Kind::Received, json.to_string()));
            } else if json.contains("\"lastUpdateId\"") {
                out.push((ns, Kind::RestAnswer, json.to_string()));
            }
        }
    }
    out
}

/// Writes the lines as a recording under `dir`; returns its files, oldest hour first.
fn record(dir: &Path, lines: &[(i64, Kind, String)]) -> Vec<std::path::PathBuf> {
    let mut rec = Recorder::new(dir, "binance").unwrap();
    for (ns, kind, text) in lines {
        let meta = if *kind == Kind::RestAnswer { "200" } else { "" };
        rec.append(&Record { kind: *kind, time_ns: *ns, conn: 1, meta, body: text.as_bytes() })
            .unwrap();
    }
    rec.flush().unwrap();
    drop(rec);
    recording::list_files(dir).unwrap().into_iter().map(|f| f.path).collect()
}

/// A depth job's work on one book: the frames and the snapshot in, published at its cadence.
struct Job {
    /// Publish by the frames' own time (`true`: every 100 ms of it, the live run's deltas) or
    /// by the wall clock (every 100 ms of the replay's own time).
    recorded_cadence: bool,
    wall_next: std::time::Instant,
    sync: BookSync,
    decoder: DepthDecoder,
    publisher: server::books::BookPublisher,
    next_publish: i64,
    frames: u64,
}

impl Job {
    fn new(books: &Arc<BookRegistry>, recorded_cadence: bool) -> Job {
        let mut config = SyncConfig::new(ContinuityRule::Spot);
        config.verify_interval_ms = None;
        let instrument: InstrumentId = "binance:spot:ETH/USDT".parse().unwrap();
        Job {
            recorded_cadence,
            wall_next: std::time::Instant::now(),
            sync: BookSync::new(config),
            decoder: DepthDecoder::new(),
            publisher: books.publisher(&instrument, "binance_depth", 0),
            next_publish: 0,
            frames: 0,
        }
    }

    fn on(&mut self, ns: i64, kind: Kind, text: &str) {
        if kind == Kind::RestAnswer {
            let body: DepthBody = wire::parse_body(text).expect("the REST snapshot");
            self.sync.handle_snapshot(body.into_snapshot(), 0);
            return;
        }
        self.frames += 1;
        match self.decoder.decode_into(text, &mut self.sync, |s| s.eq_ignore_ascii_case("ethusdt"))
        {
            Ok(Parsed::Applied) => {}
            Ok(Parsed::Decoded(Decoded::Depth)) => {
                self.sync.handle_delta_ref(self.decoder.delta(), 0)
            }
            other => panic!("not our diff: {other:?}"),
        }
        while self.sync.poll_event().is_some() {}
        let due = if self.recorded_cadence {
            let due = ns >= self.next_publish;
            if due {
                self.next_publish = ns + PUBLISH_NS;
            }
            due
        } else {
            let now = std::time::Instant::now();
            let due = now >= self.wall_next;
            if due {
                self.wall_next = now + std::time::Duration::from_nanos(PUBLISH_NS as u64);
            }
            due
        };
        if due {
            let synced = self.sync.is_synced();
            let status = BookStatus {
                health: if synced { BookHealth::Synced } else { BookHealth::Resyncing },
                ..BookStatus::default()
            };
            black_box(self.publisher.publish(self.sync.book(), status, ns / 1_000_000));
        }
    }
}

fn live(books: &Arc<BookRegistry>, lines: &[(i64, Kind, String)], recorded: bool) -> Job {
    let mut job = Job::new(books, recorded);
    for (ns, kind, text) in lines {
        job.on(*ns, *kind, text);
    }
    job
}

/// The recording read on the job's own thread: each block read, CRC-checked, unpacked and its
/// records indexed, then the job's work on them.
fn replayed(books: &Arc<BookRegistry>, files: &[std::path::PathBuf], recorded: bool) -> Job {
    let mut job = Job::new(books, recorded);
    let mut block = Block::default();
    for file in files {
        let mut reader = FileReader::open(file).unwrap();
        while reader.read_block(&mut block).unwrap() {
            for r in block.iter() {
                // a recorded frame is the text it was received as
                let text = std::str::from_utf8(r.body).expect("UTF-8");
                job.on(r.time_ns, r.kind, text);
            }
        }
    }
    job
}

/// The recording read as a service reads it, by `recording::scan`: the blocks read and
/// unpacked on a reader thread ahead of the job, the job's depth path on a core of its own.
fn scanned(books: &Arc<BookRegistry>, files: &[std::path::PathBuf], recorded: bool) -> Job {
    let mut job = Job::new(books, recorded);
    recording::scan(files, |r| {
        job.on(r.time_ns, r.kind, std::str::from_utf8(r.body).expect("UTF-8"));
        true
    })
    .unwrap();
    job
}

fn bench(c: &mut Criterion) {
    let lines = capture();
    let dir = testkit::temp_dir("replay-bench");
    let files = record(&dir, &lines);
    let raw: usize = lines.iter().map(|l| l.2.len()).sum();
    let written: u64 = files.iter().map(|f| std::fs::metadata(f).map_or(0, |m| m.len())).sum();
    println!("recording: {raw} bytes of frames in {written} bytes of files");
    let books = BookRegistry::new(Arc::new(InProcessBus::new(1024)));
    // both rebuild the same book, synced, from every diff
    let a = live(&books, &lines, true);
    assert_eq!(a.frames, 6470);
    for b in [replayed(&books, &files, true), scanned(&books, &files, true)] {
        assert_eq!((b.frames, b.sync.stats().deltas_applied), (6470, 6468));
        assert!(b.sync.is_synced() && b.sync.stats().gaps == 0);
        assert_eq!(a.sync.book(), b.sync.book());
    }

    let mut g = c.benchmark_group("replay");
    g.throughput(Throughput::Elements(6470));
    g.sample_size(20);
    for (name, recorded) in [("recorded_cadence", true), ("wall_cadence", false)] {
        g.bench_function(format!("live_ingest/{name}"), |bn| {
            bn.iter(|| black_box(live(&books, &lines, recorded).frames))
        });
        g.bench_function(format!("replay_recording/{name}"), |bn| {
            bn.iter(|| black_box(replayed(&books, &files, recorded).frames))
        });
        g.bench_function(format!("replay_read_ahead/{name}"), |bn| {
            bn.iter(|| black_box(scanned(&books, &files, recorded).frames))
        });
    }
    // the recorder's own work on the same frames: appended, compressed into blocks, written
    // (in the service this runs on the writer thread, off the ingest path)
    let rec_dir = dir.join("again");
    g.bench_function("recorder_write", |bn| {
        bn.iter(|| {
            let _ = std::fs::remove_dir_all(&rec_dir);
            black_box(record(&rec_dir, &lines).len())
        })
    });
    g.finish();
    let _ = std::fs::remove_dir_all(&dir);
}

criterion_group!(benches, bench);
criterion_main!(benches);
