//! L3 book throughput: add / cancel / trade with order lookup by id, on a generated stream shaped
//! like a real tick-by-tick feed (prices skewed to the top of book, most orders cancelled, trades
//! hitting the first order of the best level, SSE-style unseen aggressors).
//!
//! The stream is generated once, outside the timing loop; each iteration replays it into a fresh
//! book (pre-sized, built outside the timing) through the sequenced `handle` path and drains the
//! emitted level updates, so the figure covers everything a live consumer pays per event.
//!
//! Run: `cargo bench -p shared --bench l3 -- --warm-up-time 1 --measurement-time 3`

#[cfg(not(target_arch = "wasm32"))]
mod bench {
    use std::hint::black_box;

    use criterion::{BatchSize, Criterion, Throughput};
    use shared::l3::{L3Book, Msg, Venue};

    const EVENTS: usize = 1_000_000;

    fn generate(n: usize, seed: u64) -> Vec<Msg> {
        shared::testkit::l3_workload(n, seed)
    }

    pub fn l3(c: &mut Criterion) {
        let events = generate(EVENTS, 42);
        // sanity: the stream is valid, so the book reports no anomaly
        let mut check = L3Book::new(Venue::Sse);
        for (i, &m) in events.iter().enumerate() {
            check.handle(1, i as u64 + 1, m).unwrap();
            check.clear_updates();
        }
        let k = check.counters();
        assert_eq!(k.cancels_not_found + k.trades_not_found + k.negative_qty_clamped, 0);
        assert!(!check.is_crossed());
        eprintln!(
            "l3 bench stream: {} events ({} adds, {} cancels, {} trades), {} live orders, {}+{} levels at the end",
            events.len(),
            k.adds,
            k.cancels,
            k.trades,
            check.order_count(),
            check.ladder().bids.len(),
            check.ladder().asks.len()
        );

        let mut g = c.benchmark_group("l3");
        g.throughput(Throughput::Elements(events.len() as u64));
        g.sample_size(20);
        g.bench_function("add_cancel_trade_sse", |b| {
            b.iter_batched_ref(
                || L3Book::with_capacity(Venue::Sse, 8 * 1024),
                |book| {
                    let mut n = 0usize;
                    for (i, &m) in events.iter().enumerate() {
                        let _ = book.handle(1, i as u64 + 1, m);
                        if i & 255 == 255 {
                            n += book.drain_updates().len();
                        }
                    }
                    black_box(n);
                },
                BatchSize::PerIteration,
            )
        });
        g.finish();
    }
}

#[cfg(not(target_arch = "wasm32"))]
criterion::criterion_group!(benches, bench::l3);
#[cfg(not(target_arch = "wasm32"))]
criterion::criterion_main!(benches);

#[cfg(target_arch = "wasm32")]
fn main() {}
