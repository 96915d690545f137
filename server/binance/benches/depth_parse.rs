//! Upstream depth throughput over the recorded Binance stream (11 minutes of ETHUSDT spot
//! `depth@100ms` from testdata/binance-ws/hftbacktest, raw JSON frames held in memory):
//!
//! - `serde_borrowed_anchor`: the anchor, plain borrowed serde_json decoding of the
//!   frame into `&str` fields and `[&str; 2]` levels (no fixed point, no validation beyond
//!   JSON) — "~0.44 M/s here" in the issue; it shows how fast the machine of the run is;
//! - `serde_parse_frame`: the reference serde path (`wire::parse_frame_serde`);
//! - `fast_parse`: `fastdepth::parse_depth_frame` into reused level buffers;
//! - `fast_parse_apply`: what a depth job does per frame — `DepthDecoder::decode_into`: a diff
//!   that continues the synced book is parsed straight into the real `BookSync`'s book
//!   (`direct_delta`), any other (before the snapshot) is decoded into reused buffers and
//!   passed to `handle_delta_ref`; the REST snapshot is applied at its recorded place;
//! - `apply_only`: the same `BookSync` fed pre-decoded deltas, to show which part costs what.
//!
//! Throughput is in depth messages (6470 frames, ~42 levels each). Each benchmark runs twice:
//! group `depth` measures wall time as usual; group `depth_cpu` measures the benchmark thread's
//! CPU time (`CLOCK_THREAD_CPUTIME_ID`), which leaves out the time the thread waited for a core
//! — the figure that stays put while other jobs share the machine's two cores.
//!
//! `cargo bench -p server --bench depth_parse`

use std::hint::black_box;
use std::io::BufRead;

use binance::fastdepth::{parse_depth_frame, Decoded, DepthDecoder, Parsed};
use binance::wire::{self, DepthBody, StreamEvent};
use criterion::measurement::{Measurement, ValueFormatter, WallTime};
use criterion::{criterion_group, criterion_main, BatchSize, Criterion, Throughput};
use serde::Deserialize;
use shared::sync::{BookSync, ContinuityRule, DepthDelta, DepthSnapshot, SyncConfig};

/// The recording in order: depth frames as text, and the REST snapshot (decoded once: it comes
/// from REST, not from the stream being measured) after the frame it followed.
struct Capture {
    frames: Vec<String>,
    /// Index into `frames` before which the snapshot arrived.
    snapshot_at: usize,
    snapshot: DepthSnapshot,
}

fn capture() -> Capture {
    let dir = replay::input::testdata_dir().join("binance-ws/hftbacktest");
    let mut frames = Vec::new();
    let mut snapshot = None;
    for name in ["spot_ethusdt_20240808.gz", "spot_ethusdt_20240809.gz"] {
        let reader = replay::input::open(&dir.join(name)).expect("the hftbacktest capture");
        for line in reader.lines() {
            let line = line.expect("readable capture");
            let Some((_, json)) = line.split_once(' ') else { continue };
            if json.contains("\"depthUpdate\"") {
                frames.push(json.to_string());
            } else if json.contains("\"lastUpdateId\"") {
                let body: DepthBody = wire::parse_body(json).expect("the REST snapshot");
                snapshot = Some((frames.len(), body.into_snapshot()));
            }
        }
    }
    let (snapshot_at, snapshot) = snapshot.expect("a snapshot in the capture");
    Capture { frames, snapshot_at, snapshot }
}

/// A combined-stream diff as a typical borrowed serde_json decoder would take it.
#[derive(Deserialize)]
struct AnchorFrame<'a> {
    #[serde(borrow)]
    #[allow(dead_code)]
    stream: &'a str,
    #[serde(borrow)]
    data: AnchorDiff<'a>,
}

#[derive(Deserialize)]
#[allow(dead_code)]
struct AnchorDiff<'a> {
    e: &'a str,
    #[serde(rename = "E")]
    event_time: i64,
    s: &'a str,
    #[serde(rename = "U")]
    first: u64,
    u: u64,
    #[serde(borrow)]
    b: Vec<[&'a str; 2]>,
    #[serde(borrow)]
    a: Vec<[&'a str; 2]>,
}

fn config() -> SyncConfig {
    let mut config = SyncConfig::new(ContinuityRule::Spot);
    config.verify_interval_ms = None;
    config
}

/// CPU time of the calling thread, ns.
fn thread_cpu_ns() -> u64 {
    let t = cpu_time::ThreadTime::try_now().expect("the thread CPU clock");
    u64::try_from(t.as_duration().as_nanos()).expect("fits")
}

/// Criterion measurement by thread CPU time, shown as durations like wall time.
struct ThreadCpu;

impl Measurement for ThreadCpu {
    type Intermediate = u64;
    type Value = u64;
    fn start(&self) -> u64 {
        thread_cpu_ns()
    }
    fn end(&self, start: u64) -> u64 {
        thread_cpu_ns() - start
    }
    fn add(&self, a: &u64, b: &u64) -> u64 {
        a + b
    }
    fn zero(&self) -> u64 {
        0
    }
    fn to_f64(&self, v: &u64) -> f64 {
        *v as f64
    }
    fn formatter(&self) -> &dyn ValueFormatter {
        static WALL: WallTime = WallTime;
        WALL.formatter()
    }
}

fn bench_wall(c: &mut Criterion) {
    bench(c, "depth");
}

fn bench_cpu(c: &mut Criterion<ThreadCpu>) {
    bench(c, "depth_cpu");
}

fn bench<M: Measurement>(c: &mut Criterion<M>, group: &str) {
    let cap = capture();
    let n = cap.frames.len() as u64;
    assert_eq!(n, 6470);

    // fast parse + apply, the measured loop; also used once to check the outcome
    let parse_apply = |cap: &Capture| {
        let mut sync = BookSync::new(config());
        let mut decoder = DepthDecoder::new();
        for (i, text) in cap.frames.iter().enumerate() {
            if i == cap.snapshot_at {
                sync.handle_snapshot(cap.snapshot.clone(), 0);
            }
            match decoder.decode_into(text, &mut sync, |s| s.eq_ignore_ascii_case("ethusdt")) {
                Ok(Parsed::Applied) => {}
                Ok(Parsed::Decoded(Decoded::Depth))
                    if decoder.symbol().eq_ignore_ascii_case("ethusdt") =>
                {
                    sync.handle_delta_ref(decoder.delta(), 0)
                }
                other => panic!("not our diff: {other:?}"),
            }
            while sync.poll_event().is_some() {}
        }
        sync
    };
    let check = parse_apply(&cap);
    assert_eq!(check.stats().deltas_applied, 6468);
    assert_eq!(check.stats().gaps, 0);
    let levels = check.stats().levels_applied;

    let deltas: Vec<DepthDelta> = cap
        .frames
        .iter()
        .map(|t| match wire::parse_frame_serde(t) {
            Ok(StreamEvent::DepthUpdate { update, .. }) => update.delta,
            other => panic!("not a diff: {other:?}"),
        })
        .collect();

    let mut g = c.benchmark_group(group);
    g.throughput(Throughput::Elements(n));
    g.sample_size(20);
    g.bench_function("serde_borrowed_anchor", |b| {
        b.iter(|| {
            for text in &cap.frames {
                let f: AnchorFrame<'_> = serde_json::from_str(text).expect("a diff");
                black_box((f.data.u, &f.data.b, &f.data.a));
            }
        })
    });
    g.bench_function("serde_parse_frame", |b| {
        b.iter(|| {
            for text in &cap.frames {
                black_box(wire::parse_frame_serde(text).expect("a diff"));
            }
        })
    });
    g.bench_function("fast_parse", |b| {
        let (mut bids, mut asks) = (Vec::with_capacity(64), Vec::with_capacity(64));
        b.iter(|| {
            for text in &cap.frames {
                let f = parse_depth_frame(text, &mut bids, &mut asks).expect("a diff");
                black_box((&f, &bids, &asks));
            }
        })
    });
    g.bench_function("fast_parse_apply", |b| b.iter(|| black_box(parse_apply(&cap))));
    g.bench_function("apply_only", |b| {
        b.iter_batched(
            || deltas.clone(),
            |deltas| {
                let mut sync = BookSync::new(config());
                for (i, d) in deltas.into_iter().enumerate() {
                    if i == cap.snapshot_at {
                        sync.handle_snapshot(cap.snapshot.clone(), 0);
                    }
                    sync.handle_delta(d, 0);
                    while sync.poll_event().is_some() {}
                }
                sync
            },
            BatchSize::LargeInput,
        )
    });
    g.finish();
    eprintln!("{n} depth messages, {levels} levels applied");
}

criterion_group!(wall, bench_wall);
criterion_group! {
    name = cpu;
    config = Criterion::default().with_measurement(ThreadCpu);
    targets = bench_cpu
}
criterion_main!(wall, cpu);
