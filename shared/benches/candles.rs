//! Candle aggregation throughput: closed 1m candles through `DerivedAggregator` into every derived
//! timeframe (3m … 1d), counted in 1m candles per second.
//!
//! `aggregate_all_tf/*` feeds the candles with `push_closed_1m_batch` in batches of 200 (the
//! default flush batch; the randomized `batch_matches_one_by_one` test proves the output equals
//! feeding them one by one), `push_one_by_one/*` with `push_closed_1m`, for comparison in the
//! same run.
//!
//! Run: `cargo bench -p shared --bench candles -- --warm-up-time 1 --measurement-time 4`

#[cfg(not(target_arch = "wasm32"))]
mod native {
    use criterion::{black_box, criterion_group, BatchSize, Criterion, Throughput};
    use shared::candle::{merge, Candle, DerivedAggregator, Timeframe};
    use shared::testkit::Rng;
    use shared::{Price, Volume};

    const T0: i64 = 1_577_836_800_000; // 2020-01-01T00:00:00Z

    /// `days` of 1m candles from 2020-01-01, a random walk around 7200.00; with `gaps`, about one
    /// minute in 20 is missing.
    fn minutes(days: i64, gaps: bool) -> Vec<Candle> {
        let mut rng = Rng::new(42);
        let mut mid: i64 = 720_000_000_000;
        let mut out = Vec::with_capacity((days * 1440) as usize);
        for m in 0..days * 1440 {
            mid += rng.below(2_000_001) as i64 - 1_000_000;
            if gaps && rng.chance(1, 20) {
                continue;
            }
            let a = mid + rng.below(500_000) as i64 - 250_000;
            let b = mid + rng.below(500_000) as i64 - 250_000;
            let high = a.max(b) + rng.below(100_000) as i64;
            let low = a.min(b) - rng.below(100_000) as i64;
            out.push(Candle::one_minute(
                T0 + m * 60_000,
                Price(a),
                Price(high),
                Price(low),
                Price(b),
                Volume((rng.next_u64() >> 28) as i128),
                rng.below(1000),
            ));
        }
        out
    }

    fn derived() -> Vec<Timeframe> {
        Timeframe::ALL.into_iter().filter(|&tf| tf != Timeframe::M1).collect()
    }

    fn run(ones: &[Candle]) -> (usize, i64) {
        let mut agg = DerivedAggregator::new(&derived());
        let mut closed = 0;
        let mut check = 0i64;
        for c in ones {
            let out = agg.push_closed_1m(*c).expect("valid input");
            closed += out.len();
            if let Some((_, k)) = out.last() {
                check ^= k.close.raw();
            }
        }
        closed += agg.flush().len();
        (closed, check)
    }

    /// The same through `push_closed_1m_batch`, `batch` candles at a time; `out` is the caller's
    /// buffer, emptied after each batch as a consumer would.
    fn run_batch(
        ones: &[Candle],
        batch: usize,
        out: &mut Vec<(Timeframe, Candle)>,
    ) -> (usize, i64) {
        let mut agg = DerivedAggregator::new(&derived());
        let mut closed = 0;
        let mut check = 0i64;
        for chunk in ones.chunks(batch) {
            out.clear();
            agg.push_closed_1m_batch(chunk, out).expect("valid input");
            closed += out.len();
            for (_, k) in out.iter() {
                check ^= k.close.raw();
            }
        }
        closed += agg.flush().len();
        (closed, check)
    }

    pub fn aggregate(c: &mut Criterion) {
        let mut group = c.benchmark_group("candles");
        // Where the time goes: the same batch path with fewer timeframes configured.
        {
            use Timeframe::*;
            let ones = minutes(2, false);
            let mut out = Vec::new();
            group.throughput(Throughput::Elements(ones.len() as u64));
            let configs: [(&str, Vec<Timeframe>); 4] = [
                ("validate_only", vec![]),
                ("3m_5m", vec![M3, M5]),
                ("3m_5m_15m", vec![M3, M5, M15]),
                ("3m_to_1h", vec![M3, M5, M15, M30, H1]),
            ];
            for (name, tfs) in configs {
                group.bench_function(format!("breakdown/{name}"), |b| {
                    b.iter(|| {
                        let mut agg = DerivedAggregator::new(&tfs);
                        let mut n = 0;
                        for chunk in black_box(&ones).chunks(200) {
                            out.clear();
                            agg.push_closed_1m_batch(chunk, &mut out).expect("valid input");
                            n += out.len();
                        }
                        black_box(n)
                    })
                });
            }
        }
        let mut out = Vec::new();
        for (name, gaps) in [("contiguous", false), ("5pct_missing", true)] {
            let ones = minutes(2, gaps);
            // Sanity: a complete 2-day input closes 2 * (480 + 288 + 96 + 48 + 24 + 12 + 6 + 4 + 3
            // + 2 + 1).
            if !gaps {
                assert_eq!(run(&ones).0, 2 * 964);
            }
            assert_eq!(run_batch(&ones, 200, &mut out).0, run(&ones).0);
            assert_eq!(run_batch(&ones, ones.len(), &mut out).0, run(&ones).0);
            group.throughput(Throughput::Elements(ones.len() as u64));
            group.bench_function(format!("aggregate_all_tf/{name}"), |b| {
                b.iter(|| black_box(run_batch(black_box(&ones), 200, &mut out)))
            });
            group.bench_function(format!("aggregate_all_tf_one_batch/{name}"), |b| {
                b.iter(|| black_box(run_batch(black_box(&ones), ones.len(), &mut out)))
            });
            group.bench_function(format!("push_one_by_one/{name}"), |b| {
                b.iter(|| black_box(run(black_box(&ones))))
            });
        }

        // For comparison: re-merging each bucket's slice of 1m candles with `merge` for every
        // timeframe (what a naive implementation does when the bucket closes).
        let ones = minutes(2, false);
        group.throughput(Throughput::Elements(ones.len() as u64));
        group.bench_function("merge_slices_all_tf/contiguous", |b| {
            b.iter_batched_ref(
                || (),
                |_| {
                    let mut n = 0usize;
                    for tf in derived() {
                        for chunk in ones.chunks(tf.minutes() as usize) {
                            n += merge(tf, black_box(chunk)).map_or(0, |k| k.minutes as usize);
                        }
                    }
                    black_box(n)
                },
                BatchSize::SmallInput,
            )
        });
        group.finish();
    }

    criterion_group!(benches, aggregate);
}

#[cfg(not(target_arch = "wasm32"))]
criterion::criterion_main!(native::benches);

#[cfg(target_arch = "wasm32")]
fn main() {}
