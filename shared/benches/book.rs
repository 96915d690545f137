//! L2 ladder benchmarks: `apply` on a realistic, top-of-book-skewed update stream, with and
//! without reading the top 10 after every update, and the same stream on a plain `BTreeMap`
//! ladder as the baseline the data structure was chosen against. The `variants` group runs earlier
//! layouts of the ladder on the same stream, for same-run comparisons (`VARIANTS=old,...` picks).
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
        self.bids.iter().rev().take(10).map(|(_, q)| q).sum::<i64>()
            + self.asks.iter().take(10).map(|(_, q)| q).sum::<i64>()
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

/// Earlier ladder layouts, kept to compare against in the same run (`variants` group): `old` is
/// the previous `Ladder` (linear scan of the top 8, binary search, every delete/insert shifts),
/// `tuned_search` the same with the current search but no tombstones.
mod variants {
    use shared::book::{LevelUpdate, OrderBook, Side};

    pub trait Lad: Clone {
        fn from_levels(keys: &[i64], qtys: &[i64]) -> Self;
        fn apply(&mut self, key: i64, qty: i64) -> bool;
        fn nth_qty(&self, d: usize) -> i64;
    }

    #[derive(Clone)]
    pub struct VBook<L> {
        bids: L,
        asks: L,
    }

    impl<L: Lad> VBook<L> {
        pub fn from(book: &OrderBook) -> Self {
            let side = |l: &shared::book::Ladder, neg: bool| {
                let mut kq: Vec<(i64, i64)> = l
                    .iter()
                    .map(|l| (if neg { -l.price.raw() } else { l.price.raw() }, l.qty.raw()))
                    .collect();
                kq.sort();
                let k: Vec<i64> = kq.iter().map(|p| p.0).collect();
                let q: Vec<i64> = kq.iter().map(|p| p.1).collect();
                L::from_levels(&k, &q)
            };
            Self { bids: side(&book.bids, false), asks: side(&book.asks, true) }
        }
        #[inline]
        pub fn apply_update(&mut self, u: LevelUpdate) -> bool {
            match u.side {
                Side::Bid => self.bids.apply(u.price.raw(), u.qty.raw()),
                Side::Ask => self.asks.apply(u.price.raw().wrapping_neg(), u.qty.raw()),
            }
        }
        #[inline]
        pub fn top10_sum(&self) -> i64 {
            let mut s = 0;
            for d in 0..10 {
                s += self.bids.nth_qty(d);
                s += self.asks.nth_qty(d);
            }
            s
        }
    }

    /// The original ladder: linear scan of the top 8, then binary search.
    #[derive(Clone)]
    pub struct Base {
        keys: Vec<i64>,
        qtys: Vec<i64>,
    }
    impl Base {
        #[inline]
        fn find(&self, key: i64) -> Result<usize, usize> {
            let n = self.keys.len();
            let stop = n.saturating_sub(8);
            let mut i = n;
            while i > stop {
                let k = self.keys[i - 1];
                if k == key {
                    return Ok(i - 1);
                }
                if k < key {
                    return Err(i);
                }
                i -= 1;
            }
            self.keys[..stop].binary_search(&key)
        }
    }
    impl Lad for Base {
        fn from_levels(keys: &[i64], qtys: &[i64]) -> Self {
            Self { keys: keys.to_vec(), qtys: qtys.to_vec() }
        }
        #[inline]
        fn apply(&mut self, key: i64, qty: i64) -> bool {
            match self.find(key) {
                Ok(i) => {
                    if qty == 0 {
                        self.keys.remove(i);
                        self.qtys.remove(i);
                        true
                    } else if self.qtys[i] != qty {
                        self.qtys[i] = qty;
                        true
                    } else {
                        false
                    }
                }
                Err(i) => {
                    if qty == 0 {
                        false
                    } else {
                        self.keys.insert(i, key);
                        self.qtys.insert(i, qty);
                        true
                    }
                }
            }
        }
        #[inline]
        fn nth_qty(&self, d: usize) -> i64 {
            match self.keys.len().checked_sub(d + 1) {
                Some(i) => self.qtys[i],
                None => 0,
            }
        }
    }

    /// The original ladder with the final search (linear 4, then the next 64, then the rest) but
    /// no tombstones: every delete/insert shifts the slots above.
    #[derive(Clone)]
    pub struct TunedSearch {
        keys: Vec<i64>,
        qtys: Vec<i64>,
    }
    impl TunedSearch {
        #[inline]
        fn find(&self, key: i64) -> Result<usize, usize> {
            let n = self.keys.len();
            let stop = n.saturating_sub(4);
            let mut i = n;
            while i > stop {
                let k = self.keys[i - 1];
                if k == key {
                    return Ok(i - 1);
                }
                if k < key {
                    return Err(i);
                }
                i -= 1;
            }
            if stop > 64 && self.keys[stop - 64] <= key {
                let lo = stop - 64;
                return match self.keys[lo..stop].binary_search(&key) {
                    Ok(i) => Ok(lo + i),
                    Err(i) => Err(lo + i),
                };
            }
            self.keys[..stop].binary_search(&key)
        }
    }
    impl Lad for TunedSearch {
        fn from_levels(keys: &[i64], qtys: &[i64]) -> Self {
            Self { keys: keys.to_vec(), qtys: qtys.to_vec() }
        }
        #[inline]
        fn apply(&mut self, key: i64, qty: i64) -> bool {
            match self.find(key) {
                Ok(i) => {
                    if qty == 0 {
                        self.keys.remove(i);
                        self.qtys.remove(i);
                        true
                    } else if self.qtys[i] != qty {
                        self.qtys[i] = qty;
                        true
                    } else {
                        false
                    }
                }
                Err(i) => {
                    if qty == 0 {
                        false
                    } else {
                        self.keys.insert(i, key);
                        self.qtys.insert(i, qty);
                        true
                    }
                }
            }
        }
        #[inline]
        fn nth_qty(&self, d: usize) -> i64 {
            match self.keys.len().checked_sub(d + 1) {
                Some(i) => self.qtys[i],
                None => 0,
            }
        }
    }
}

fn bench_variants(c: &mut Criterion) {
    use variants::*;
    let (book, updates) = workload(42);
    let mut g = c.benchmark_group("variants");
    g.throughput(Throughput::Elements(updates.len() as u64));
    g.sample_size(10);
    fn run<L: Lad>(
        g: &mut criterion::BenchmarkGroup<'_, criterion::measurement::WallTime>,
        name: &str,
        book: &OrderBook,
        updates: &[LevelUpdate],
    ) {
        let base = VBook::<L>::from(book);
        // sanity: same final state as the real book
        let mut a = book.clone();
        let mut b = base.clone();
        let mut ch = 0usize;
        for u in updates {
            ch += (a.apply_update(*u) != b.apply_update(*u)) as usize;
        }
        assert_eq!(ch, 0, "{name} disagrees");
        let tb: i64 = (0..10)
            .map(|d| a.bids.nth(d).unwrap().qty.raw() + a.asks.nth(d).unwrap().qty.raw())
            .sum();
        assert_eq!(tb, b.top10_sum(), "{name} disagrees");
        g.bench_function(format!("{name}/apply"), |bn| {
            bn.iter_batched(
                || base.clone(),
                |mut bk| {
                    for u in updates {
                        bk.apply_update(*u);
                    }
                    bk
                },
                BatchSize::LargeInput,
            )
        });
        g.bench_function(format!("{name}/apply_read_top10"), |bn| {
            bn.iter_batched(
                || base.clone(),
                |mut bk| {
                    let mut acc = 0i64;
                    for u in updates {
                        bk.apply_update(*u);
                        acc = acc.wrapping_add(bk.top10_sum());
                    }
                    black_box(acc);
                    bk
                },
                BatchSize::LargeInput,
            )
        });
    }
    let only = std::env::var("VARIANTS").unwrap_or_default();
    macro_rules! v {
        ($name:expr, $t:ty) => {
            if only.is_empty() || only.split(',').any(|s| s == $name) {
                run::<$t>(&mut g, $name, &book, &updates);
            }
        };
    }
    v!("old", Base);
    v!("tuned_search", TunedSearch);
    g.finish();
}

criterion_group!(benches, bench, bench_variants);
criterion_main!(benches);
