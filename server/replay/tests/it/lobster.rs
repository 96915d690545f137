//! `replay lobster` on the hand-written fixtures in `tests/fixtures/lobster` (see its README: not
//! real data) and a round trip through generated LOBSTER files.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::path::{Path, PathBuf};

use replay::lobster::{replay, run, LobsterArgs};
use shared::testkit::Rng;

fn fixture(name: &str) -> PathBuf {
    std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/lobster").join(name)
}

fn output(args: &LobsterArgs) -> (bool, String) {
    let mut out = Vec::new();
    let ok = run(args, &mut out).expect("replay runs");
    (ok, String::from_utf8(out).unwrap())
}

fn read(path: &Path) -> String {
    std::fs::read_to_string(path).unwrap()
}

#[test]
fn handmade_fixture_matches_its_orderbook_file() {
    let args =
        LobsterArgs { messages: fixture("handmade_message_3.csv"), initial_book: None, levels: 3 };
    let (ok, out) = output(&args);
    assert!(ok);
    let expected = read(&fixture("handmade_orderbook_3.csv"));
    for (i, (got, want)) in out.lines().zip(expected.lines()).enumerate() {
        assert_eq!(got, want, "row {}", i + 1);
    }
    assert_eq!(out.lines().count(), expected.lines().count());
    let s = replay(&args, &mut Vec::new()).unwrap();
    assert_eq!(s.messages, 18);
    assert_eq!(s.unknown_order_adjustments, 0);
}

#[test]
fn default_depth_is_ten_levels_of_four_columns() {
    let args =
        LobsterArgs { messages: fixture("handmade_message_3.csv"), initial_book: None, levels: 10 };
    let (_, out) = output(&args);
    let last = out.lines().last().unwrap();
    let cols: Vec<&str> = last.split(',').collect();
    assert_eq!(cols.len(), 40);
    assert_eq!(
        &cols[..12],
        "1000200,300,1000000,70,1000300,20,999800,40,1000400,5,-9999999999,0"
            .split(',')
            .collect::<Vec<_>>()
    );
    assert!(cols[12..].chunks(4).all(|c| c == ["9999999999", "0", "-9999999999", "0"]));
}

#[test]
fn seeded_fixture_adjusts_orders_that_predate_the_file() {
    let args = LobsterArgs {
        messages: fixture("seeded_message_3.csv"),
        initial_book: Some(fixture("seeded_orderbook_3.csv")),
        levels: 3,
    };
    let (ok, out) = output(&args);
    assert!(ok);
    assert_eq!(out, read(&fixture("seeded_orderbook_3.csv")));
    let s = replay(&args, &mut Vec::new()).unwrap();
    assert_eq!(s.unknown_order_adjustments, 3, "ids 901, 902, 903 were never submitted");
    assert_eq!(s.negative_qty, 0);

    // without the initial book those messages take liquidity that is not there
    let (ok, _) = output(&LobsterArgs { initial_book: None, ..args });
    assert!(!ok);
}

fn error_of(args: &LobsterArgs) -> String {
    format!("{:#}", run(args, &mut Vec::new()).expect_err("bad input is an error"))
}

#[test]
fn bad_rows_name_file_and_line() {
    let dir = std::env::temp_dir().join(format!("millrace-e2e-lobster-bad-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let messages = dir.join("m.csv");
    for (row, what) in [
        ("34200.2,8,3,50,999900,1", "unknown message type"),
        ("34200.2,1,3,50,99.99,1", "price"),
        ("34200.2,1,3,50,999900", "columns"),
        ("34200.2,1,3,50,999900,2", "direction"),
    ] {
        std::fs::write(&messages, format!("34200.1,1,1,100,1000000,1\n{row}\n")).unwrap();
        let e =
            error_of(&LobsterArgs { messages: messages.clone(), initial_book: None, levels: 3 });
        assert!(e.contains(&format!("{}:2", messages.display())) && e.contains(what), "{row}: {e}");
    }
    std::fs::write(&messages, "34200.1,1,1,100,1000000,1\n").unwrap();
    let book = dir.join("b.csv");
    std::fs::write(&book, "1000100,200,1000000\n").unwrap();
    let e = error_of(&LobsterArgs {
        messages: messages.clone(),
        initial_book: Some(book.clone()),
        levels: 3,
    });
    assert!(e.contains(&format!("{}:1", book.display())) && e.contains("multiple of 4"), "{e}");
    // a seed that does not contain message 1's own order is not LOBSTER's row 1
    std::fs::write(&book, "1000100,200,999900,100\n").unwrap();
    let e =
        error_of(&LobsterArgs { messages: messages.clone(), initial_book: Some(book), levels: 3 });
    assert!(e.contains(&format!("{}:1", messages.display())), "{e}");
    std::fs::remove_dir_all(&dir).unwrap();
}

/// Issue 15 item 14: a time of `abc`, an empty file and fractional sizes were accepted with exit
/// 0; the other replay tools refuse such input. Each is now an error naming file and line.
#[test]
fn hostile_rows_and_empty_files_are_errors_with_file_and_line() {
    let dir =
        std::env::temp_dir().join(format!("millrace-e2e-lobster-hostile-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let messages = dir.join("m.csv");
    let args = || LobsterArgs { messages: messages.clone(), initial_book: None, levels: 3 };
    for (row, what) in [
        ("abc,1,3,50,999900,1", "time \"abc\""),
        ("34200.2.1,1,3,50,999900,1", "time"),
        ("-5,1,3,50,999900,1", "time"),
        ("99999,1,3,50,999900,1", "time"),
        ("34200.2,1,3,0.5,999900,1", "size \"0.5\""),
        ("34200.2,1,3,50.25,999900,1", "size"),
        ("34200.2,1,3,50.0,999900,1", "size"),
        ("34200.2,1,3,99999999999,999900,1", "size"),
    ] {
        std::fs::write(&messages, format!("34200.1,1,1,100,1000000,1\n{row}\n")).unwrap();
        let e = error_of(&args());
        assert!(
            e.contains(&format!("{}:2:", messages.display())) && e.contains(what),
            "{row}: {e}"
        );
    }
    for empty in ["", "\n", "  \n\n"] {
        std::fs::write(&messages, empty).unwrap();
        let e = error_of(&args());
        assert!(
            e.contains(&format!("{}:1:", messages.display())) && e.contains("empty"),
            "{empty:?}: {e}"
        );
    }
    // a fractional size in the initial book is refused too
    std::fs::write(&messages, "34200.1,1,1,100,1000000,1\n").unwrap();
    let book = dir.join("b.csv");
    std::fs::write(&book, "1000100,200.5,1000000,100\n").unwrap();
    let e = error_of(&LobsterArgs { initial_book: Some(book.clone()), ..args() });
    assert!(e.contains(&format!("{}:1:", book.display())) && e.contains("size"), "{e}");
    std::fs::remove_dir_all(&dir).unwrap();
}

/// A simulated L3 book writing LOBSTER files: orders by id, prices in LOBSTER units.
struct Sim {
    /// id -> (is_bid, price, size)
    orders: BTreeMap<u64, (bool, i64, i64)>,
    next_id: u64,
}

impl Sim {
    fn levels(&self, bid: bool) -> Vec<(i64, i64)> {
        let mut m: BTreeMap<i64, i64> = BTreeMap::new();
        for &(b, p, s) in self.orders.values() {
            if b == bid {
                *m.entry(p).or_default() += s;
            }
        }
        let mut v: Vec<_> = m.into_iter().collect();
        if bid {
            v.reverse();
        }
        v
    }

    /// The generator's own rendering of LOBSTER's orderbook row.
    fn row(&self, depth: usize) -> String {
        let (asks, bids) = (self.levels(false), self.levels(true));
        let mut s = String::new();
        for d in 0..depth {
            let (ap, aq) = asks.get(d).copied().unwrap_or((9_999_999_999, 0));
            let (bp, bq) = bids.get(d).copied().unwrap_or((-9_999_999_999, 0));
            if d > 0 {
                s.push(',');
            }
            write!(s, "{ap},{aq},{bp},{bq}").unwrap();
        }
        s
    }

    fn submit(&mut self, rng: &mut Rng) -> (u8, u64, i64, i64, i8) {
        let bid = rng.chance(1, 2);
        let best_ask = self.levels(false).first().map_or(1_000_100, |l| l.0);
        let best_bid = self.levels(true).first().map_or(1_000_000, |l| l.0);
        let d = rng.top_skewed(30) as i64;
        let price = if bid { best_ask - 100 * (1 + d) } else { best_bid + 100 * (1 + d) };
        let size = 1 + rng.below(500) as i64;
        let id = self.next_id;
        self.next_id += 1 + rng.below(4);
        self.orders.insert(id, (bid, price, size));
        (1, id, size, price, if bid { 1 } else { -1 })
    }

    fn random_order(&self, rng: &mut Rng) -> Option<u64> {
        if self.orders.is_empty() {
            return None;
        }
        self.orders.keys().nth(rng.below(self.orders.len() as u64) as usize).copied()
    }

    fn take(&mut self, id: u64, size: i64) {
        let o = self.orders.get_mut(&id).unwrap();
        o.2 -= size;
        if o.2 == 0 {
            self.orders.remove(&id);
        }
    }

    /// One random message: (type, id, size, price, direction).
    fn message(&mut self, rng: &mut Rng) -> (u8, u64, i64, i64, i8) {
        let r = rng.below(100);
        let dir = |bid: bool| if bid { 1 } else { -1 };
        if r < 40 || self.orders.len() < 4 {
            return self.submit(rng);
        }
        if r < 55 {
            let id = self.random_order(rng).unwrap();
            let (bid, price, size) = self.orders[&id];
            if size > 1 {
                let part = 1 + rng.below(size as u64 - 1) as i64;
                self.take(id, part);
                return (2, id, part, price, dir(bid));
            }
            self.take(id, size);
            return (3, id, size, price, dir(bid));
        }
        if r < 80 {
            let id = self.random_order(rng).unwrap();
            let (bid, price, size) = self.orders[&id];
            self.take(id, size);
            return (3, id, size, price, dir(bid));
        }
        if r < 94 {
            // a visible execution of an order at the best level of one side
            let bid = rng.chance(1, 2);
            let Some(&(best, _)) = self.levels(bid).first() else { return self.submit(rng) };
            let at: Vec<u64> = self
                .orders
                .iter()
                .filter(|(_, o)| o.0 == bid && o.1 == best)
                .map(|(&id, _)| id)
                .collect();
            let id = at[rng.below(at.len() as u64) as usize];
            let size = 1 + rng.below(self.orders[&id].2 as u64) as i64;
            self.take(id, size);
            return (4, id, size, best, dir(bid));
        }
        match r {
            94..=96 => {
                (5, 0, 1 + rng.below(300) as i64, 1_000_000 + 100 * (rng.below(5) as i64), -1)
            }
            97..=98 => (6, 0, 1 + rng.below(9000) as i64, 1_000_000, 1),
            _ => (7, 0, 0, if rng.chance(1, 2) { -1 } else { 0 }, -1),
        }
    }
}

/// Generated LOBSTER files replay to exactly the generator's own book after every message, with
/// and without orders that predate the file.
#[test]
fn round_trip_through_generated_lobster_files() {
    let dir = std::env::temp_dir().join(format!("millrace-e2e-lobster-rt-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    for seed in 0..12u64 {
        let mut rng = Rng::new(seed);
        let mut sim = Sim { orders: BTreeMap::new(), next_id: 1 };
        let prior = seed % 2 == 1;
        if prior {
            // the day before the file: orders the message file never mentions being submitted
            for _ in 0..60 {
                sim.submit(&mut rng);
            }
        }
        let depth = [10usize, 3, 1, 25][(seed % 4) as usize];
        let (mut messages, mut expected) = (String::new(), Vec::new());
        let mut seed_row = String::new();
        for i in 0..600u64 {
            let (t, id, size, price, dir) = sim.message(&mut rng);
            writeln!(
                messages,
                "{}.{:09},{t},{id},{size},{price},{dir}",
                34_200 + i / 10,
                (i % 10) * 100_000_000 + seed
            )
            .unwrap();
            expected.push(sim.row(depth));
            if i == 0 {
                // row 1 of LOBSTER's orderbook file, deep enough to hold every level
                seed_row = sim.row(200);
            }
        }
        let msg_path = dir.join(format!("gen{seed}_message.csv"));
        std::fs::write(&msg_path, &messages).unwrap();
        let initial_book = if prior {
            let p = dir.join(format!("gen{seed}_orderbook.csv"));
            std::fs::write(&p, format!("{seed_row}\n")).unwrap();
            Some(p)
        } else {
            None
        };
        let args = LobsterArgs { messages: msg_path, initial_book, levels: depth as u16 };
        let mut out = Vec::new();
        let summary = replay(&args, &mut out).unwrap();
        let out = String::from_utf8(out).unwrap();
        let got: Vec<&str> = out.lines().collect();
        assert_eq!(got.len(), expected.len(), "seed {seed}");
        for (i, (g, e)) in got.iter().zip(&expected).enumerate() {
            assert_eq!(
                g,
                e,
                "seed {seed}: row {} after message {:?}",
                i + 1,
                messages.lines().nth(i)
            );
        }
        assert!(summary.ok(), "seed {seed}: {summary:?}");
        if prior {
            assert!(
                summary.unknown_order_adjustments > 0,
                "seed {seed}: prior orders were touched"
            );
        } else {
            assert_eq!(summary.unknown_order_adjustments, 0, "seed {seed}");
        }
    }
    std::fs::remove_dir_all(&dir).unwrap();
}
