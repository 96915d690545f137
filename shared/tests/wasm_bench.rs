//! The L2 and L3 benchmark workloads compiled to wasm32 and timed in the JS engine, to compare
//! with the native criterion figures (BENCHMARKS.md). Runs only on wasm32:
//!
//! `wasm-pack test --node --release shared --test wasm_bench -- --include-ignored --nocapture`
//!
//! The benches are `#[ignore]`d so that the ordinary test runs (`scripts/test`) skip them.
//!
//! Each workload is generated outside the timed region (the same generators as the native
//! benches, from `shared::testkit`), replayed `ROUNDS` times, and the best round is reported.
#![cfg(target_arch = "wasm32")]

use shared::testkit;
use wasm_bindgen_test::{console_log, wasm_bindgen_test};

const ROUNDS: usize = 5;

fn now_ms() -> f64 {
    js_sys::Date::now()
}

fn best_of(mut f: impl FnMut()) -> f64 {
    let mut best = f64::MAX;
    for _ in 0..ROUNDS {
        let t0 = now_ms();
        f();
        best = best.min(now_ms() - t0);
    }
    best
}

#[wasm_bindgen_test]
#[ignore]
fn l2_apply_throughput() {
    let (book, updates) = testkit::l2_workload(42, 1_000, 1_000_000);
    let ms = best_of(|| {
        let mut b = book.clone();
        for u in &updates {
            b.apply_update(*u);
        }
        assert!(b.bids.len() > 0);
    });
    console_log!(
        "wasm l2/apply: {:.1} M updates/s ({} updates in {:.1} ms)",
        updates.len() as f64 / ms / 1e3,
        updates.len(),
        ms
    );
    let ms = best_of(|| {
        let mut b = book.clone();
        let mut acc = 0i64;
        for u in &updates {
            b.apply_update(*u);
            for d in 0..10 {
                acc = acc.wrapping_add(b.bids.nth(d).map_or(0, |l| l.qty.raw()));
                acc = acc.wrapping_add(b.asks.nth(d).map_or(0, |l| l.qty.raw()));
            }
        }
        assert!(acc != 0);
    });
    console_log!("wasm l2/apply_read_top10: {:.1} M updates/s", updates.len() as f64 / ms / 1e3);
}

#[wasm_bindgen_test]
#[ignore]
fn l3_event_throughput() {
    use shared::l3::{L3Book, Venue};
    let events = testkit::l3_workload(1_000_000, 42);
    let ms = best_of(|| {
        let mut book = L3Book::with_capacity(Venue::Sse, 8 * 1024);
        let mut n = 0usize;
        for (i, &m) in events.iter().enumerate() {
            let _ = book.handle(1, i as u64 + 1, m);
            if i & 255 == 255 {
                n += book.drain_updates().len();
            }
        }
        assert!(n > 0);
    });
    console_log!("wasm l3/add_cancel_trade_sse: {:.1} M events/s", events.len() as f64 / ms / 1e3);
}
