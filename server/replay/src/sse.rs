//! `millrace replay sse`: rebuilds Shanghai (SSE) tick-by-tick order books from the vendor's order
//! (逐笔委托) and trade (逐笔成交) files and checks the invariants a correct rebuild must keep.
//!
//! ## Input
//! Two CSV files (plain, `.gz` or `.zip`) with a header row; columns are found by name, so their
//! order does not matter and extra columns are ignored:
//! * orders: `MDTime, OrderType (2 new, 10 cancel), OrderPrice, OrderQty, OrderBSFlag (1 buy,
//!   2 sell), ChannelNo, ApplSeqNum, OrderNO, SecurityID`;
//! * trades: `MDTime, TradeBuyNo, TradeSellNo, TradeBSFlag (1 buy-initiated, 2 sell-initiated,
//!   0 call auction; B/S/N accepted too), TradePrice, TradeQty, ChannelNo, ApplSeqNum, SecurityID`.
//!
//! Prices are written as binary floats (`15.929999999999999`) and are snapped to `--tick`
//! (default 0.01) with [`Price::parse_snapped`]; nothing is ever parsed into a float.
//!
//! ## Sequencing
//! Orders and trades of one channel share one ApplSeqNum sequence. All rows are merged per channel
//! by ApplSeqNum (a stable sort, so the files may be grouped by security as vendors write them)
//! and fed through one [`Sequencer`] per channel; the same number twice is a duplicate, dropped
//! and counted against the symbol of the dropped row.
//!
//! * Default (`strict`): the channel's numbers must be contiguous. A jump is a gap: every symbol
//!   on that channel is charged one `seq_gaps` (the lost message could have been any of theirs)
//!   and marked stale, the loss is accepted and the replay continues; the check fails.
//! * `--subset` (`increasing`): for files that keep only some securities of a channel — like the
//!   five-stock sample in `testdata/sse-tick-by-tick`, whose channel 1 numbers run from 1 to
//!   13,847,862 with 177,565 holes belonging to other securities. Numbers must still increase
//!   strictly per channel (duplicates are dropped and counted), but holes are allowed and only
//!   reported (`channel_seq_holes`). A lost message of a kept security cannot be told apart from
//!   another security's message by sequence number alone in such a file; the book invariants
//!   below are then the guard.
//!
//! ## Book semantics and checks
//! Each SecurityID gets an [`L3Book`] with [`Venue::Sse`] rules (see `shared::l3`): cancels are
//! order-stream rows; a continuous trade's aggressor was never published (SSE publishes only the
//! part of an order that rests) and is counted in `unseen_order_refs`; call-auction trades
//! (TradeBSFlag 0) consume both orders. The checks, per symbol, are: the book is never crossed
//! after an event during continuous trading (09:30-11:30, 13:00-14:57; auction crossing is
//! expected and only reported), every cancel and every passive trade side finds its order, no
//! quantity would go negative, no sequence gap, and an L2 book fed the emitted level updates
//! equals the L3 book's ladder at the end.

use std::collections::HashMap;
use std::io::Write;
use std::path::{Path, PathBuf};

use anyhow::Context as _;
use serde::Serialize;

use shared::l3::{L3Book, Msg, SeqGap, SeqPolicy, SeqVerdict, Sequencer, TradeKind, Venue};
use shared::{Level, OrderBook, Price, Qty, Side};

use crate::input::{for_each_line, InputError, Origin};

/// Arguments of `millrace replay sse`.
#[derive(Debug, Clone, clap::Args)]
pub struct SseArgs {
    /// Order file (逐笔委托): CSV, .gz or .zip.
    #[arg(long)]
    pub orders: PathBuf,
    /// Trade file (逐笔成交): CSV, .gz or .zip.
    #[arg(long)]
    pub trades: PathBuf,
    /// Price tick the float-printed prices are snapped to.
    #[arg(long, default_value = "0.01", value_parser = parse_tick)]
    pub tick: Price,
    /// The files hold only some securities of each channel: ApplSeqNum must increase strictly
    /// per channel, but holes (other securities' messages) are allowed.
    #[arg(long)]
    pub subset: bool,
}

fn parse_tick(s: &str) -> Result<Price, String> {
    let p = Price::parse(s).map_err(|e| e.to_string())?;
    if p.raw() <= 0 {
        return Err("tick must be positive".into());
    }
    Ok(p)
}

/// Milliseconds of the day.
type TimeMs = u32;

const fn hms(h: u32, m: u32) -> TimeMs {
    (h * 3600 + m * 60) * 1000
}

/// Continuous trading: 09:30-11:30 and 13:00-14:57 (the close is a call auction).
fn is_continuous(t: TimeMs) -> bool {
    (hms(9, 30)..hms(11, 30)).contains(&t) || (hms(13, 0)..hms(14, 57)).contains(&t)
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    Order,
    Cancel,
    Trade,
}

/// One row of either file, normalised.
#[derive(Debug, Clone, Copy)]
struct Event {
    channel: u32,
    seq: u64,
    time: TimeMs,
    symbol: u32,
    kind: Kind,
    msg: Msg,
}

/// Column positions, found by header name.
struct Columns {
    idx: Vec<usize>,
    max: usize,
}

impl Columns {
    fn from_header(origin: &Origin, header: &str, names: &[&str]) -> Result<Self, InputError> {
        let header = header.trim_start_matches('\u{feff}');
        let fields: Vec<&str> = header.split(',').map(str::trim).collect();
        let mut idx = Vec::with_capacity(names.len());
        for name in names {
            match fields.iter().position(|f| f == name) {
                Some(i) => idx.push(i),
                None => {
                    return Err(InputError::new(
                        origin.clone(),
                        format!("header has no column {name:?} (header: {header:?})"),
                    ))
                }
            }
        }
        let max = idx.iter().copied().max().unwrap_or(0);
        Ok(Self { idx, max })
    }
}

/// Symbols by name, numbered in order of first appearance.
#[derive(Default)]
struct Symbols {
    ids: HashMap<String, u32>,
    names: Vec<String>,
}

impl Symbols {
    fn id(&mut self, name: &str) -> u32 {
        if let Some(&i) = self.ids.get(name) {
            return i;
        }
        let i = self.names.len() as u32;
        self.ids.insert(name.to_string(), i);
        self.names.push(name.to_string());
        i
    }
}

/// Splits a data row and picks the wanted columns, or says what is wrong with it.
fn pick<'a>(
    origin: &Origin,
    line: &'a str,
    cols: &Columns,
    names: &[&str],
) -> Result<Vec<&'a str>, InputError> {
    let fields: Vec<&str> = line.split(',').collect();
    if fields.len() <= cols.max {
        return Err(InputError::new(
            origin.clone(),
            format!("row has {} columns, expected at least {}", fields.len(), cols.max + 1),
        ));
    }
    let mut out = Vec::with_capacity(cols.idx.len());
    for (k, &i) in cols.idx.iter().enumerate() {
        let f = fields[i].trim();
        if f.is_empty() {
            return Err(InputError::new(origin.clone(), format!("column {} is empty", names[k])));
        }
        out.push(f);
    }
    Ok(out)
}

fn num<T: std::str::FromStr>(origin: &Origin, name: &str, s: &str) -> Result<T, InputError> {
    s.parse()
        .map_err(|_| InputError::new(origin.clone(), format!("{name} {s:?} is not an integer")))
}

fn price(origin: &Origin, name: &str, s: &str, tick: Price) -> Result<Price, InputError> {
    Price::parse_snapped(s, tick)
        .map_err(|e| InputError::new(origin.clone(), format!("{name} {s:?} is not a price: {e}")))
}

fn qty(origin: &Origin, name: &str, s: &str) -> Result<Qty, InputError> {
    Qty::parse(s).map_err(|e| {
        InputError::new(origin.clone(), format!("{name} {s:?} is not a quantity: {e}"))
    })
}

/// `HH:MM:SS(.fff)` to milliseconds of the day.
fn time(origin: &Origin, s: &str) -> Result<TimeMs, InputError> {
    let bad = || InputError::new(origin.clone(), format!("MDTime {s:?} is not HH:MM:SS.fff"));
    let (hms_part, frac) = s.split_once('.').unwrap_or((s, ""));
    let mut it = hms_part.split(':');
    let (Some(h), Some(m), Some(sec), None) = (it.next(), it.next(), it.next(), it.next()) else {
        return Err(bad());
    };
    let p = |x: &str, max: u32| -> Option<u32> {
        if x.is_empty() || x.len() > 2 || !x.bytes().all(|b| b.is_ascii_digit()) {
            return None;
        }
        x.parse().ok().filter(|&v| v < max)
    };
    let (h, m, sec) =
        (p(h, 24).ok_or_else(bad)?, p(m, 60).ok_or_else(bad)?, p(sec, 61).ok_or_else(bad)?);
    if !frac.bytes().all(|b| b.is_ascii_digit()) || frac.len() > 9 {
        return Err(bad());
    }
    let mut ms = 0u32;
    for (i, b) in frac.bytes().take(3).enumerate() {
        ms += (b - b'0') as u32 * [100, 10, 1][i];
    }
    Ok((h * 3600 + m * 60 + sec) * 1000 + ms)
}

const ORDER_COLS: [&str; 9] = [
    "MDTime",
    "OrderType",
    "OrderPrice",
    "OrderQty",
    "OrderBSFlag",
    "ChannelNo",
    "ApplSeqNum",
    "OrderNO",
    "SecurityID",
];

const TRADE_COLS: [&str; 9] = [
    "MDTime",
    "TradeBuyNo",
    "TradeSellNo",
    "TradeBSFlag",
    "TradePrice",
    "TradeQty",
    "ChannelNo",
    "ApplSeqNum",
    "SecurityID",
];

/// Reads a CSV with a header, calling `row(origin, fields)` with the wanted columns in order.
fn read_csv(
    path: &Path,
    names: &[&str],
    mut row: impl FnMut(&Origin, &[&str]) -> Result<(), InputError>,
) -> anyhow::Result<usize> {
    let mut cols: Option<Columns> = None;
    let mut rows = 0usize;
    for_each_line(path, |origin, line| {
        if line.trim().is_empty() {
            return Ok(());
        }
        match &cols {
            None => cols = Some(Columns::from_header(origin, line, names)?),
            Some(c) => {
                let fields = pick(origin, line, c, names)?;
                row(origin, &fields)?;
                rows += 1;
            }
        }
        Ok(())
    })?;
    if cols.is_none() {
        return Err(InputError::new(
            Origin { path: path.to_path_buf(), line: 1 },
            "file is empty (no header)",
        )
        .into());
    }
    Ok(rows)
}

fn read_orders(
    path: &Path,
    tick: Price,
    symbols: &mut Symbols,
    events: &mut Vec<Event>,
) -> anyhow::Result<usize> {
    read_csv(path, &ORDER_COLS, |o, f| {
        let time = time(o, f[0])?;
        let kind = match f[1] {
            "2" => Kind::Order,
            "10" => Kind::Cancel,
            other => {
                return Err(InputError::new(
                    o.clone(),
                    format!("unknown OrderType {other:?} (expected 2 or 10)"),
                ))
            }
        };
        let price = price(o, "OrderPrice", f[2], tick)?;
        let qty = qty(o, "OrderQty", f[3])?;
        let side = match f[4] {
            "1" | "B" => Side::Bid,
            "2" | "S" => Side::Ask,
            other => {
                return Err(InputError::new(
                    o.clone(),
                    format!("unknown OrderBSFlag {other:?} (expected 1 or 2)"),
                ))
            }
        };
        let channel = num(o, "ChannelNo", f[5])?;
        let seq = num(o, "ApplSeqNum", f[6])?;
        let id = num(o, "OrderNO", f[7])?;
        let symbol = symbols.id(f[8]);
        let msg = match kind {
            Kind::Order => Msg::Add { id, side, price, qty },
            _ => Msg::Cancel { id, side, price, qty },
        };
        events.push(Event { channel, seq, time, symbol, kind, msg });
        Ok(())
    })
}

fn read_trades(
    path: &Path,
    tick: Price,
    symbols: &mut Symbols,
    events: &mut Vec<Event>,
) -> anyhow::Result<usize> {
    read_csv(path, &TRADE_COLS, |o, f| {
        let time = time(o, f[0])?;
        let buy_id = num(o, "TradeBuyNo", f[1])?;
        let sell_id = num(o, "TradeSellNo", f[2])?;
        let kind = match f[3] {
            "1" | "B" => TradeKind::BuyInitiated,
            "2" | "S" => TradeKind::SellInitiated,
            "0" | "N" => TradeKind::Auction,
            other => {
                return Err(InputError::new(
                    o.clone(),
                    format!("unknown TradeBSFlag {other:?} (expected 0, 1 or 2)"),
                ))
            }
        };
        let price = price(o, "TradePrice", f[4], tick)?;
        let qty = qty(o, "TradeQty", f[5])?;
        let channel = num(o, "ChannelNo", f[6])?;
        let seq = num(o, "ApplSeqNum", f[7])?;
        let symbol = symbols.id(f[8]);
        events.push(Event {
            channel,
            seq,
            time,
            symbol,
            kind: Kind::Trade,
            msg: Msg::Trade { buy_id, sell_id, price, qty, kind },
        });
        Ok(())
    })
}

/// The bids and asks of the final book, best first.
#[derive(Debug, Serialize)]
pub struct Top {
    pub bids: Vec<Level>,
    pub asks: Vec<Level>,
}

/// One symbol's result line.
#[derive(Debug, Serialize)]
pub struct Report {
    pub symbol: String,
    pub channel: u32,
    /// New-order rows (OrderType 2).
    pub orders: u64,
    /// Cancel rows (OrderType 10).
    pub cancels: u64,
    /// Trade rows.
    pub trades: u64,
    pub unseen_order_refs: u64,
    pub cancels_not_found: u64,
    pub trades_not_found: u64,
    pub duplicate_order_ids: u64,
    /// Events after which the book was crossed during continuous trading (must be 0).
    pub crossed_continuous: u64,
    /// Events after which the book was crossed outside continuous trading (call auctions).
    pub crossed_outside_continuous: u64,
    /// Quantities that would have gone negative (clamped; must be 0).
    pub negative_qty: u64,
    pub seq_gaps: u64,
    pub seq_duplicates: u64,
    /// Holes in the channel's sequence (allowed with `--subset`; the same figure for every
    /// symbol of the channel).
    pub channel_seq_holes: u64,
    pub seq_mode: &'static str,
    pub stale: bool,
    /// An L2 book fed the emitted level updates equals the L3 ladder.
    pub l2_matches: bool,
    pub live_orders: usize,
    pub top5: Top,
    pub ok: bool,
}

struct SymState {
    book: L3Book,
    l2: OrderBook,
    channel: Option<u32>,
    orders: u64,
    cancels: u64,
    trades: u64,
    crossed_continuous: u64,
    crossed_outside: u64,
    seq_gaps: u64,
    seq_duplicates: u64,
}

/// One normalised row for a live replay ([`crate::tbt::replay`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TimedEvent {
    /// MDTime, milliseconds of the day.
    pub time_ms: u32,
    pub channel: u32,
    pub seq: u64,
    /// Index into [`Loaded::symbols`].
    pub symbol: u32,
    pub msg: Msg,
}

/// The files of a day, ready to be replayed live.
#[derive(Debug, Clone)]
pub struct Loaded {
    /// SecurityIDs in order of first appearance.
    pub symbols: Vec<String>,
    /// Every row once: each channel in ApplSeqNum order (a number seen twice on a channel is
    /// dropped, as `replay sse` does), channels merged by MDTime.
    pub events: Vec<TimedEvent>,
    /// Rows dropped as repeated channel sequence numbers.
    pub duplicates: u64,
    /// Rows read per SecurityID (orders + cancels + trades, before dropping repeats).
    pub rows: Vec<u64>,
}

/// Reads an order file and a trade file for a live replay (see [`Loaded`]).
pub fn load(orders: &Path, trades: &Path, tick: Price) -> anyhow::Result<Loaded> {
    let mut symbols = Symbols::default();
    let mut events = Vec::new();
    read_orders(orders, tick, &mut symbols, &mut events)
        .with_context(|| format!("reading orders {}", orders.display()))?;
    read_trades(trades, tick, &mut symbols, &mut events)
        .with_context(|| format!("reading trades {}", trades.display()))?;
    let mut rows = vec![0u64; symbols.names.len()];
    for e in &events {
        rows[e.symbol as usize] += 1;
    }
    events.sort_by_key(|e| (e.channel, e.seq));
    // per channel, in sequence order, without repeated numbers
    let mut channels: Vec<Vec<TimedEvent>> = Vec::new();
    let mut duplicates = 0u64;
    for e in &events {
        let t = TimedEvent {
            time_ms: e.time,
            channel: e.channel,
            seq: e.seq,
            symbol: e.symbol,
            msg: e.msg,
        };
        match channels.last_mut() {
            Some(c) if c.last().is_some_and(|l| l.channel == e.channel) => {
                if c.last().is_some_and(|l| l.seq == e.seq) {
                    duplicates += 1;
                } else {
                    c.push(t);
                }
            }
            _ => channels.push(vec![t]),
        }
    }
    // merge the channels by time; each stays in sequence order
    let mut heads = vec![0usize; channels.len()];
    let mut merged = Vec::with_capacity(events.len());
    loop {
        let next = (0..channels.len())
            .filter(|&c| heads[c] < channels[c].len())
            .min_by_key(|&c| (channels[c][heads[c]].time_ms, c));
        let Some(c) = next else { break };
        merged.push(channels[c][heads[c]]);
        heads[c] += 1;
    }
    Ok(Loaded { symbols: symbols.names, events: merged, duplicates, rows })
}

/// Replays the files and returns one report per symbol (sorted by symbol).
pub fn replay(args: &SseArgs) -> anyhow::Result<Vec<Report>> {
    let mut symbols = Symbols::default();
    let mut events = Vec::new();
    read_orders(&args.orders, args.tick, &mut symbols, &mut events)
        .with_context(|| format!("reading orders {}", args.orders.display()))?;
    read_trades(&args.trades, args.tick, &mut symbols, &mut events)
        .with_context(|| format!("reading trades {}", args.trades.display()))?;
    // One stream per channel, in ApplSeqNum order; stable, so an order row precedes a trade row
    // with the same number (which is then the duplicate).
    events.sort_by_key(|e| (e.channel, e.seq));

    let policy = if args.subset { SeqPolicy::Increasing } else { SeqPolicy::Contiguous };
    let mut states: Vec<SymState> = (0..symbols.names.len())
        .map(|_| SymState {
            // Grows with the security's own orders: a file of many securities with few orders
            // each costs a few hundred bytes per security (room for 4,096 orders up front cost
            // ~21 KB each, 217 MB for 10,000 securities).
            book: L3Book::new(Venue::Sse),
            l2: OrderBook::new(),
            channel: None,
            orders: 0,
            cancels: 0,
            trades: 0,
            crossed_continuous: 0,
            crossed_outside: 0,
            seq_gaps: 0,
            seq_duplicates: 0,
        })
        .collect();
    // symbols of each channel, for charging gaps
    let mut channel_symbols: HashMap<u32, Vec<u32>> = HashMap::new();
    for e in &events {
        let st = &mut states[e.symbol as usize];
        if st.channel.is_none() {
            st.channel = Some(e.channel);
        }
        let v = channel_symbols.entry(e.channel).or_default();
        if !v.contains(&e.symbol) {
            v.push(e.symbol);
        }
    }
    let mut sequencers: HashMap<u32, Sequencer> = HashMap::new();

    for e in &events {
        let seqr = sequencers.entry(e.channel).or_insert_with(|| Sequencer::new(policy));
        match seqr.check(e.seq) {
            Ok(SeqVerdict::Apply) => {}
            Ok(SeqVerdict::Duplicate) => {
                states[e.symbol as usize].seq_duplicates += 1;
                continue;
            }
            Err(SeqGap { .. }) => {
                // A file cannot be retransmitted: charge every symbol of the channel, accept the
                // loss and go on.
                for &s in &channel_symbols[&e.channel] {
                    let st = &mut states[s as usize];
                    st.seq_gaps += 1;
                    st.book.mark_stale();
                }
                seqr.skip_to(e.seq);
                let verdict = seqr.check(e.seq);
                debug_assert_eq!(verdict, Ok(SeqVerdict::Apply));
            }
        }
        let st = &mut states[e.symbol as usize];
        match e.kind {
            Kind::Order => st.orders += 1,
            Kind::Cancel => st.cancels += 1,
            Kind::Trade => st.trades += 1,
        }
        st.book.apply(e.msg);
        for u in st.book.drain_updates() {
            st.l2.apply_update(u);
        }
        if st.book.is_crossed() {
            if is_continuous(e.time) {
                st.crossed_continuous += 1;
            } else {
                st.crossed_outside += 1;
            }
        }
    }

    let mut reports: Vec<Report> = states
        .into_iter()
        .enumerate()
        .map(|(i, st)| {
            let c = *st.book.counters();
            let channel = st.channel.unwrap_or(0);
            let holes = sequencers.get(&channel).map_or(0, |s| s.holes());
            let (bids, asks) = st.book.top(5);
            let l2_matches = &st.l2 == st.book.ladder();
            let ok = st.crossed_continuous == 0
                && c.cancels_not_found == 0
                && c.trades_not_found == 0
                && c.negative_qty_clamped == 0
                && st.seq_gaps == 0
                && l2_matches;
            Report {
                symbol: symbols.names[i].clone(),
                channel,
                orders: st.orders,
                cancels: st.cancels,
                trades: st.trades,
                unseen_order_refs: c.unseen_order_refs,
                cancels_not_found: c.cancels_not_found,
                trades_not_found: c.trades_not_found,
                duplicate_order_ids: c.duplicate_order_ids,
                crossed_continuous: st.crossed_continuous,
                crossed_outside_continuous: st.crossed_outside,
                negative_qty: c.negative_qty_clamped,
                seq_gaps: st.seq_gaps,
                seq_duplicates: st.seq_duplicates,
                channel_seq_holes: holes,
                seq_mode: if args.subset { "subset" } else { "strict" },
                stale: st.book.is_stale(),
                l2_matches,
                live_orders: st.book.order_count(),
                top5: Top { bids, asks },
                ok,
            }
        })
        .collect();
    reports.sort_by(|a, b| a.symbol.cmp(&b.symbol));
    Ok(reports)
}

/// Runs the replay, writing one JSON object per symbol to `out`; returns whether every check
/// passed.
pub fn run(args: &SseArgs, out: &mut dyn Write) -> anyhow::Result<bool> {
    let reports = replay(args)?;
    let mut ok = true;
    for r in &reports {
        ok &= r.ok;
        serde_json::to_writer(&mut *out, r)?;
        out.write_all(b"\n")?;
    }
    if !args.subset && reports.iter().any(|r| r.seq_gaps > 0) {
        eprintln!(
            "millrace replay sse: ApplSeqNum jumps within a channel (seq_gaps). If these files hold only \
             some securities of each channel (vendor extracts usually do), rerun with --subset: numbers \
             must then only increase, and the holes are reported as channel_seq_holes."
        );
    }
    Ok(ok)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn o() -> Origin {
        Origin { path: "x.csv".into(), line: 7 }
    }

    #[test]
    fn parses_times() {
        assert_eq!(time(&o(), "09:15:00.280").unwrap(), hms(9, 15) + 280);
        assert_eq!(time(&o(), "14:57:00").unwrap(), hms(14, 57));
        assert_eq!(time(&o(), "13:00:00.5").unwrap(), hms(13, 0) + 500);
        for bad in ["9:15", "09:15:00:00", "xx:00:00", "25:00:00", "09:15:00.2a", ""] {
            let e = time(&o(), bad).unwrap_err();
            assert!(e.to_string().starts_with("x.csv:7: MDTime"), "{e}");
        }
    }

    #[test]
    fn continuous_windows() {
        assert!(!is_continuous(hms(9, 25)));
        assert!(is_continuous(hms(9, 30)));
        assert!(!is_continuous(hms(11, 30)));
        assert!(!is_continuous(hms(12, 0)));
        assert!(is_continuous(hms(13, 0)));
        assert!(is_continuous(hms(14, 57) - 1));
        assert!(!is_continuous(hms(14, 57)));
    }
}
