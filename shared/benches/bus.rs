//! The cost of checking what a cluster's process reads from the bus (ARCHITECTURE.md, "What the
//! bus carries is untrusted input"), per message, beside the work the message costs anyway:
//! - `closed_candles/check/*`: a persister's check of a closed-candle message (one live minute;
//!   a full gap-fill block of 500) against parsing the same message from its JSON;
//! - `kline_push/*`: a gateway's admission of a forming kline push with the time window
//!   (`admit`, which parses the frame) against the parse alone;
//! - `diffs/*`: a book feed's reorder with the id window, per diff in order;
//! - `control/*`: a worker status's and an instruction set's bounds.
//!
//! Run: `cargo bench -p shared --bench bus -- --warm-up-time 1 --measurement-time 4`

#[cfg(not(target_arch = "wasm32"))]
mod native {
    use criterion::{black_box, criterion_group, BatchSize, Criterion, Throughput};
    use shared::candle::{Candle, Timeframe, MINUTE_MS};
    use shared::cluster::bounds::TimeWindow;
    use shared::cluster::payload::{ClosedCandles, DiffReorder, KlineDedup, CANDLES_PER_MESSAGE};
    use shared::cluster::{Instructions, TaskId, TaskKind, TaskReport, WorkerStatus};
    use shared::protocol::{KlineEvent, KlinePayload, Push, SeriesId, Stream};
    use shared::{Price, Volume};

    const NOW: i64 = 1_764_000_000_000 / MINUTE_MS * MINUTE_MS;

    fn minute(t: i64) -> Candle {
        let p = 9_000_000_000_000 + (t / MINUTE_MS) % 997;
        Candle::one_minute(
            t,
            Price(p),
            Price(p + 50),
            Price(p - 50),
            Price(p + 7),
            Volume(123_456_789),
            42,
        )
    }

    fn message(n: usize) -> ClosedCandles {
        let block = MINUTE_MS * CANDLES_PER_MESSAGE as i64;
        let start = (NOW - 2 * block).div_euclid(block) * block;
        ClosedCandles {
            series: "sim:spot:BTC/USDT:1m".parse().unwrap(),
            candles: (0..n as i64).map(|i| minute(start + i * MINUTE_MS)).collect(),
        }
    }

    fn window() -> TimeWindow {
        TimeWindow::around(NOW, 30 * 86_400_000, 30_000)
    }

    fn bounds(c: &mut Criterion) {
        let mut group = c.benchmark_group("closed_candles");
        for n in [1, CANDLES_PER_MESSAGE] {
            let msg = message(n);
            let json = serde_json::to_vec(&msg).unwrap();
            let w = window();
            group.throughput(Throughput::Elements(1));
            group.bench_function(format!("check/{n}"), |b| b.iter(|| black_box(&msg).check(&w)));
            group.bench_function(format!("parse/{n}"), |b| {
                b.iter(|| serde_json::from_slice::<ClosedCandles>(black_box(&json)).unwrap())
            });
        }
        group.finish();

        let series: SeriesId = "sim:spot:BTC/USDT:1m".parse().unwrap();
        let frames: Vec<Vec<u8>> = (0..1_000i64)
            .map(|i| {
                let p = Price(9_000_000_000_000 + i);
                let push = Push {
                    stream: Stream::Kline(series.clone()),
                    data: KlineEvent {
                        e: "kline".into(),
                        event_time: NOW + i,
                        s: series.clone(),
                        k: KlinePayload {
                            t: NOW,
                            close_time: NOW + MINUTE_MS - 1,
                            i: Timeframe::M1,
                            o: p,
                            h: p,
                            l: p,
                            c: p,
                            v: Volume(1),
                            n: 1,
                            x: false,
                        },
                    },
                };
                serde_json::to_vec(&push).unwrap()
            })
            .collect();
        let mut group = c.benchmark_group("kline_push");
        group.throughput(Throughput::Elements(frames.len() as u64));
        let w = window();
        group.bench_function("admit_in_window", |b| {
            b.iter_batched_ref(
                KlineDedup::new,
                |d| {
                    for f in &frames {
                        black_box(d.admit(f, &w));
                    }
                },
                BatchSize::SmallInput,
            )
        });
        group.bench_function("parse_only", |b| {
            b.iter(|| {
                for f in &frames {
                    black_box(serde_json::from_slice::<Push<KlineEvent>>(f).unwrap());
                }
            })
        });
        group.finish();

        let mut group = c.benchmark_group("diffs");
        group.throughput(Throughput::Elements(10_000));
        group.bench_function("reorder_in_order", |b| {
            b.iter_batched_ref(
                || (DiffReorder::<u32>::new(250), Vec::with_capacity(16)),
                |(r, out)| {
                    let mut u = 1_000_000_000u64;
                    for i in 0..10_000u32 {
                        let next = u + 1 + u64::from(i % 50);
                        black_box(r.push(u, next, i, 0, out));
                        out.clear();
                        u = next;
                    }
                },
                BatchSize::SmallInput,
            )
        });
        group.finish();

        let task =
            |i: usize| TaskId::new(TaskKind::Kline, format!("sim:spot:S{i}/USDT").parse().unwrap());
        let status = WorkerStatus {
            worker: "worker-1".into(),
            instance: 1,
            max_load: 100,
            epoch: 7,
            applied_seq: 3,
            leaving: false,
            list: 1,
            tasks: (0..100).map(|i| TaskReport { task: task(i), data_age_ms: Some(5) }).collect(),
            ages: None,
            refused: Default::default(),
        };
        let set = Instructions {
            worker: "worker-1".into(),
            epoch: 7,
            seq: 4,
            reset: true,
            end: vec![],
            add: (0..100).map(task).collect(),
        };
        let mut group = c.benchmark_group("control");
        group.throughput(Throughput::Elements(1));
        group.bench_function("status_check/100_tasks", |b| b.iter(|| black_box(&status).check()));
        group.bench_function("instructions_check/100_tasks", |b| {
            b.iter(|| black_box(&set).check("worker-1", (7, 3), 100))
        });
        let json = serde_json::to_vec(&status).unwrap();
        group.bench_function("status_parse/100_tasks", |b| {
            b.iter(|| serde_json::from_slice::<WorkerStatus>(black_box(&json)).unwrap())
        });
        group.finish();
    }

    criterion_group!(benches, bounds);
}

#[cfg(not(target_arch = "wasm32"))]
criterion::criterion_main!(native::benches);

#[cfg(target_arch = "wasm32")]
fn main() {}
