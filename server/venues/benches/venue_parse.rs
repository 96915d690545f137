//! Each venue's frames read and applied, against a naive baseline on the same frames in the same
//! run (issue 29: "at least 2× a serde_json-into-BTreeMap baseline"), and the checksum's cost.
//!
//! Frames: the recorded sessions in `server/replay/tests/fixtures/venues/` (the simulator's OKX,
//! Bybit, Coinbase and Kraken dialects, with their faults), every received frame that carries a
//! book (snapshots and updates, including those around the resyncs), in order, held in memory.
//!
//! - `millrace`: `venues::parse` into a reused `Vec<Message>`, each book message into its
//!   symbol's `VenueSync` (sequence rules, depth cut, the checksum where the venue sends one),
//!   its events drained: what a venue book job does per frame;
//! - `baseline`: `serde_json::from_str::<Value>` of the frame, then every book level (prices and
//!   quantities parsed exactly) into a `BTreeMap<Price, Qty>` per side and symbol, no sequence or
//!   checksum: the naive reader;
//! - `checksum`: the venue's checksum of a synced book alone (OKX: top 25, Kraken: top 10).
//!
//! `cargo bench -p venues --bench venue_parse`

use std::collections::{BTreeMap, HashMap};
use std::hint::black_box;
use std::io::{BufRead, BufReader};

use criterion::{criterion_group, criterion_main, Criterion, Throughput};
use serde_json::Value;
use shared::book::OrderBook;
use shared::venue::{checksum, Dialect, NumberFormat, VenueSync, VenueSyncConfig};
use shared::{Price, Qty};
use venues::Message;

/// The received frames of a venue's fixture, in order.
fn frames(venue: &str) -> Vec<String> {
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join(format!("../replay/tests/fixtures/venues/{venue}.capture.gz"));
    let file = std::fs::File::open(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    let reader = BufReader::new(flate2::read::GzDecoder::new(file));
    reader
        .lines()
        .map(|l| l.expect("a line"))
        .filter(|l| !l.contains(" <-> ") && !l.contains(" <- "))
        .filter_map(|l| l.split_once(": ").map(|(_, f)| f.to_string()))
        .collect()
}

fn config(d: Dialect) -> VenueSyncConfig {
    let mut c = VenueSyncConfig::new(d.sequence_rule(), d.checksum_rule());
    if d == Dialect::Kraken {
        // the fixture's pairs: tick 0.01, quantities printed with 8 places
        c.depth = Some(10);
        c.price_format = Some(NumberFormat::Fixed(2));
        c.qty_format = Some(NumberFormat::Fixed(8));
    }
    c
}

/// What a venue book job does with the frames; returns the books and the checksums verified.
fn millrace(
    d: Dialect,
    frames: &[String],
    books: &mut HashMap<String, VenueSync>,
    out: &mut Vec<Message>,
) -> u64 {
    let mut verified = 0;
    for f in frames {
        out.clear();
        let _ = venues::parse(d, f, out);
        for m in out.drain(..) {
            if let Message::Book(b) = m {
                let sync = match books.get_mut(&b.symbol) {
                    Some(s) => s,
                    None => {
                        books.entry(b.symbol.clone()).or_insert_with(|| VenueSync::new(config(d)))
                    }
                };
                sync.handle_message(b.message());
                while sync.poll_event().is_some() {}
            }
        }
    }
    for s in books.values() {
        verified += s.stats().checksums_verified;
    }
    verified
}

type Side = BTreeMap<Price, Qty>;

fn apply(side: &mut Side, p: &str, q: &str) {
    let (Ok(p), Ok(q)) = (Price::parse(p), Qty::parse(q)) else { return };
    if q.is_zero() {
        side.remove(&p);
    } else {
        side.insert(p, q);
    }
}

fn num(v: &Value) -> String {
    match v {
        Value::String(s) => s.clone(),
        other => other.to_string(),
    }
}

/// The naive reader: a JSON value, then every book level into sorted maps.
fn baseline(frames: &[String], books: &mut HashMap<String, (Side, Side)>) -> usize {
    let mut levels = 0;
    for f in frames {
        let Ok(v) = serde_json::from_str::<Value>(f) else { continue };
        // OKX `data[]`, Bybit `data`, Coinbase `events[]`, Kraken `data[]`
        let items: Vec<&Value> = match (&v["data"], &v["events"]) {
            (Value::Array(a), _) => a.iter().collect(),
            (Value::Object(_), _) => vec![&v["data"]],
            (_, Value::Array(a)) => a.iter().collect(),
            _ => continue,
        };
        for it in items {
            let symbol = ["instId", "s", "product_id", "symbol"]
                .iter()
                .find_map(|k| it[*k].as_str())
                .or_else(|| v["arg"]["instId"].as_str())
                .unwrap_or("")
                .to_string();
            let book = books.entry(symbol).or_default();
            for (key, bid) in [("bids", true), ("asks", false), ("b", true), ("a", false)] {
                for l in it[key].as_array().into_iter().flatten() {
                    let (p, q) = match l {
                        Value::Array(a) => (num(&a[0]), num(&a[1])),
                        Value::Object(_) => (num(&l["price"]), num(&l["qty"])),
                        _ => continue,
                    };
                    apply(if bid { &mut book.0 } else { &mut book.1 }, &p, &q);
                    levels += 1;
                }
            }
            for u in it["updates"].as_array().into_iter().flatten() {
                let bid = u["side"] == "bid";
                apply(
                    if bid { &mut book.0 } else { &mut book.1 },
                    &num(&u["price_level"]),
                    &num(&u["new_quantity"]),
                );
                levels += 1;
            }
        }
    }
    levels
}

/// The frames that carry a book (what the speed target is about).
fn book_frames(d: Dialect, frames: Vec<String>) -> Vec<String> {
    let mut out = Vec::new();
    frames
        .into_iter()
        .filter(|f| {
            out.clear();
            venues::parse(d, f, &mut out).is_ok()
                && out.iter().any(|m| matches!(m, Message::Book(_)))
        })
        .collect()
}

fn bench(c: &mut Criterion) {
    for (venue, d) in [
        ("okx", Dialect::Okx),
        ("bybit", Dialect::Bybit),
        ("coinbase", Dialect::Coinbase),
        ("kraken", Dialect::Kraken),
    ] {
        let frames = book_frames(d, frames(venue));
        // the millrace path must do its job before it is timed: every book synced, the
        // checksums verified where the venue sends them
        let mut books = HashMap::new();
        let mut out = Vec::new();
        let verified = millrace(d, &frames, &mut books, &mut out);
        assert!(
            !books.is_empty() && books.values().all(VenueSync::is_synced),
            "{venue}: books synced"
        );
        if d.checksum_rule() != shared::venue::ChecksumRule::None {
            assert!(verified > 100, "{venue}: {verified} checksums verified");
        }
        let mut g = c.benchmark_group(format!("venue_{venue}"));
        g.throughput(Throughput::Elements(frames.len() as u64));
        g.bench_function("millrace", |b| {
            b.iter(|| {
                let mut books = HashMap::new();
                black_box(millrace(d, &frames, &mut books, &mut out))
            })
        });
        g.bench_function("baseline_serde_json_btreemap", |b| {
            b.iter(|| {
                let mut books = HashMap::new();
                black_box(baseline(&frames, &mut books))
            })
        });
        g.finish();
        if d.checksum_rule() != shared::venue::ChecksumRule::None {
            let book: OrderBook = books.values().next().expect("a book").book().clone();
            let (price, qty) = match d {
                Dialect::Okx => (NumberFormat::Shortest, NumberFormat::Shortest),
                _ => (NumberFormat::Fixed(2), NumberFormat::Fixed(8)),
            };
            let mut scratch = String::new();
            let mut g = c.benchmark_group(format!("venue_{venue}_checksum"));
            g.throughput(Throughput::Elements(1));
            g.bench_function("checksum", |b| {
                b.iter(|| match d {
                    Dialect::Okx => {
                        black_box(checksum::okx(&book, price, qty, &mut scratch).map(|c| c as u32))
                    }
                    _ => black_box(checksum::kraken(&book, price, qty, &mut scratch)),
                })
            });
            g.finish();
        }
    }
}

criterion_group!(benches, bench);
criterion_main!(benches);
