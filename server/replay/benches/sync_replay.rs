//! The shared sync machine replaying a recorded Binance stream (11 minutes of ETHUSDT spot from
//! testdata/binance-ws/hftbacktest), JSON parsing excluded: decoded deltas and the snapshot
//! are prepared once, then fed to a fresh `BookSync` per iteration.
//!
//! `cargo bench -p server --bench sync_replay`

use criterion::{criterion_group, criterion_main, BatchSize, Criterion, Throughput};
use replay::depth::{book_inputs, BookInput};
use shared::sync::{BookSync, ContinuityRule, SyncConfig};

fn bench(c: &mut Criterion) {
    let dir = replay::input::testdata_dir().join("binance-ws/hftbacktest");
    let files = [dir.join("spot_ethusdt_20240808.gz"), dir.join("spot_ethusdt_20240809.gz")];
    let inputs = book_inputs(&files).expect("the hftbacktest capture");
    let (_, inputs) = inputs.get("ETHUSDT").expect("ETHUSDT in the capture").clone();
    let levels: u64 = inputs
        .iter()
        .map(|i| match i {
            BookInput::Delta(d) => (d.bids.len() + d.asks.len()) as u64,
            BookInput::Snapshot(_) => 0,
        })
        .sum();
    let mut config = SyncConfig::new(ContinuityRule::Spot);
    config.verify_interval_ms = None;

    let run = |inputs: Vec<BookInput>| {
        let mut sync = BookSync::new(config.clone());
        for input in inputs {
            match input {
                BookInput::Delta(d) => sync.handle_delta(d, 0),
                BookInput::Snapshot(s) => sync.handle_snapshot(s, 0),
            }
            while sync.poll_event().is_some() {}
        }
        sync
    };
    let check = run(inputs.clone());
    assert_eq!(check.stats().deltas_applied, 6468);
    assert_eq!(check.stats().gaps, 0);

    let mut g = c.benchmark_group("sync");
    g.throughput(Throughput::Elements(levels));
    g.sample_size(20);
    g.bench_function("replay_ethusdt_level_updates", |b| {
        b.iter_batched(|| inputs.clone(), run, BatchSize::LargeInput)
    });
    g.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
