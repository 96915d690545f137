//! L2 ladder benchmarks: `apply` on a realistic, top-of-book-skewed update stream, with and
//! without reading the top 10 after every update, and the same stream on a plain `BTreeMap`
//! ladder as the baseline the data structure was chosen against.
//!
//! `cargo bench -p shared --bench book`

use std::collections::BTreeMap;
use std::hint::black_box;

use criterion::{criterion_group, criterion_main, BatchSize, Criterion, Throughput};
use shared::book::{Level, LevelUpdate, OrderBook, Side};

const LEVELS: i64 = 1_000;
const UPDATES: usize = 1_000_000;

fn workload(seed: u64) -> (OrderBook, Vec<LevelUpdate>) {
    shared::testkit::l2_workload(seed, LEVELS, UPDATES)
}

/// The baseline: one `BTreeMap` per side.
#[derive(Clone)]
struct BTreeBook {
    bids: BTreeMap<i64, i64>,
    asks: BTreeMap<i64, i64>,
}

impl BTreeBook {
    fn from(book: &OrderBook) -> Self {
        Self {
            bids: book.bids.iter().map(|l| (l.price.raw(), l.qty.raw())).collect(),
            asks: book.asks.iter().map(|l| (l.price.raw(), l.qty.raw())).collect(),
        }
    }
    #[inline]
    fn apply(&mut self, u: &LevelUpdate) {
        let side = match u.side {
            Side::Bid => &mut self.bids,
            Side::Ask => &mut self.asks,
        };
        if u.qty.is_zero() {
            side.remove(&u.price.raw());
        } else {
            side.insert(u.price.raw(), u.qty.raw());
        }
    }
    #[inline]
    fn top10_sum(&self) -> i64 {
        self.bids.iter().rev().take(10).map(|(_, q)| q).sum::<i64>() + self.asks.iter().take(10).map(|(_, q)| q).sum::<i64>()
    }
}

#[inline]
fn top10_sum(book: &OrderBook) -> i64 {
    let mut s = 0;
    for d in 0..10 {
        s += book.bids.nth(d).map_or(0, |l: Level| l.qty.raw());
        s += book.asks.nth(d).map_or(0, |l: Level| l.qty.raw());
    }
    s
}

fn bench(c: &mut Criterion) {
    let (book, updates) = workload(42);
    let mut g = c.benchmark_group("l2");
    g.throughput(Throughput::Elements(updates.len() as u64));
    g.sample_size(10);
    g.bench_function("apply", |b| {
        b.iter_batched(
            || book.clone(),
            |mut bk| {
                for u in &updates {
                    bk.apply_update(*u);
                }
                bk
            },
            BatchSize::LargeInput,
        )
    });
    g.bench_function("apply_read_top10", |b| {
        b.iter_batched(
            || book.clone(),
            |mut bk| {
                let mut acc = 0i64;
                for u in &updates {
                    bk.apply_update(*u);
                    acc = acc.wrapping_add(top10_sum(&bk));
                }
                black_box(acc);
                bk
            },
            BatchSize::LargeInput,
        )
    });
    let base = BTreeBook::from(&book);
    g.bench_function("btreemap_apply", |b| {
        b.iter_batched(
            || base.clone(),
            |mut bk| {
                for u in &updates {
                    bk.apply(u);
                }
                bk
            },
            BatchSize::LargeInput,
        )
    });
    g.bench_function("btreemap_apply_read_top10", |b| {
        b.iter_batched(
            || base.clone(),
            |mut bk| {
                let mut acc = 0i64;
                for u in &updates {
                    bk.apply(u);
                    acc = acc.wrapping_add(bk.top10_sum());
                }
                black_box(acc);
                bk
            },
            BatchSize::LargeInput,
        )
    });
    g.finish();

    // sanity: both structures end in the same state
    let mut a = book.clone();
    let mut b = BTreeBook::from(&book);
    for u in &updates {
        a.apply_update(*u);
        b.apply(u);
    }
    assert_eq!(BTreeBook::from(&a).bids, b.bids);
    assert_eq!(BTreeBook::from(&a).asks, b.asks);
}

criterion_group!(benches, bench);
criterion_main!(benches);
