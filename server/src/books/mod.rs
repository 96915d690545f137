//! The books millrace publishes to its own clients — the server side of
//! seeds/local-order-book-snapshot-delta-sync.md, for every book whatever rebuilds it (a Binance
//! depth job syncing with `shared::sync::BookSync`, or a shard of the tick-by-tick engine).
//!
//! A producer owns a [`BookPublisher`] and calls [`BookPublisher::publish`] with its current book
//! about every 100 ms. The publisher **diffs** that book against the last one it published and
//! sends the changed levels as one `depth_update@{instrument}` event (`U`/`u`/`pu` and the top-10
//! checksum `cs`), plus `depth@{instrument},{levels}` snapshots every 200 ms for the sizes that
//! have subscribers, and keeps the published book for `GET /fapi/v1/depth`. Diffing (rather than
//! forwarding the producer's own changes) costs the producer nothing per event, and makes the
//! published stream self-consistent whatever happened upstream: after a resync, a job restart or
//! a migration between shards, the next delta takes a client from exactly what it was sent to
//! exactly the new book.
//!
//! Rules kept here:
//! - **Only a trustworthy book is published.** A producer says how its book is ([`BookHealth`]);
//!   while it is resyncing or stale, or whenever the book is crossed, nothing is sent, and the REST
//!   snapshot is marked `stale`. Clients keep the last consistent book; ops shows why.
//! - **Update ids strictly increase per instrument**, across restarts of its job (the registry
//!   keeps the last id) and across restarts of the process (a new instrument's ids start at the
//!   wall clock in microseconds, and one id is used per 100 ms publish). They stay below 2^53, so
//!   JavaScript clients compare them exactly.
//! - **One producer per book.** A new publisher for an instrument retires the previous one (a
//!   generation number), so a job that is being replaced can never interleave ids.

pub mod l3;

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex, RwLock};

use bytes::Bytes;
use serde::Serialize;
use shared::book::{Level, OrderBook, Side};
use shared::protocol::{
    DepthSnapshotEvent, DepthUpdateEvent, InstrumentId, Push, RestDepth, Stream, CHECKSUM_LEVELS, DEPTH_LEVELS,
};

use crate::bus::{Bus, InProcessBus};

/// Deltas are published at most this often (the seed's `depth_update` throttle).
pub const DELTA_INTERVAL_MS: i64 = 100;
/// Snapshots on `depth@…` are published at most this often (the seed's `depth` throttle).
pub const SNAPSHOT_INTERVAL_MS: i64 = 200;
/// Most levels per side kept in the REST snapshot.
pub const MAX_REST_LEVELS: usize = 5000;

/// How trustworthy a producer's book is right now.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Default)]
#[serde(rename_all = "snake_case")]
pub enum BookHealth {
    /// In sync with its source: published.
    Synced,
    /// Synced from full snapshots only (Binance `depth20` fallback while REST snapshots fail):
    /// published, but only the snapshot's depth is known.
    SnapshotMode,
    /// Waiting for a snapshot or a bridging event after a gap / reconnect: not published.
    #[default]
    Resyncing,
    /// A sequence gap the producer has not recovered from: not published.
    Stale,
}

impl BookHealth {
    pub fn is_publishable(self) -> bool {
        matches!(self, BookHealth::Synced | BookHealth::SnapshotMode)
    }
}

/// What a producer reports with every publish: its health and its counters (shown in
/// `/api/v1/ops/books` and `/metrics`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Default)]
pub struct BookStatus {
    pub health: BookHealth,
    /// Sequence / update-id gaps seen upstream.
    pub gaps: u64,
    /// Times the book was rebuilt from a snapshot after it was once synced.
    pub resyncs: u64,
    /// Periodic verifications that found the book different from a fresh snapshot.
    pub drift: u64,
    /// Periodic verifications done.
    pub verifications: u64,
    /// Upstream events applied.
    pub events: u64,
}

/// The last published state of a book: what `GET /fapi/v1/depth` serves.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PublishedBook {
    /// Update id this book reflects (the `u` of the last delta; 0 before the first publish).
    pub id: u64,
    /// When it was published, ms since the epoch.
    pub time_ms: i64,
    /// Best first.
    pub bids: Vec<Level>,
    pub asks: Vec<Level>,
    /// Top-10 checksum, as in every delta's `cs`.
    pub checksum: u32,
}

/// One row of `/api/v1/ops/books`.
#[derive(Debug, Clone, Serialize)]
pub struct BookInfo {
    pub instrument: InstrumentId,
    /// Who rebuilds it: `binance_depth`, `l3_sse`, ...
    pub source: String,
    /// Whether a producer is attached.
    pub active: bool,
    #[serde(flatten)]
    pub status: BookStatus,
    /// Last published update id.
    pub id: u64,
    pub checksum: u32,
    pub bid_levels: usize,
    pub ask_levels: usize,
    pub best_bid: Option<Level>,
    pub best_ask: Option<Level>,
    /// Deltas published since the book was registered.
    pub deltas: u64,
    /// Publishes skipped because the book was crossed.
    pub crossed_skipped: u64,
    /// Last publish, ms since the epoch (0 = never).
    pub published_ms: i64,
}

/// One published book's shared part. Locked once per publish (every 100 ms) and per REST / ops
/// read, never per upstream event.
struct BookCell {
    instrument: InstrumentId,
    state: Mutex<CellState>,
}

struct CellState {
    source: String,
    /// The current producer's generation; publishes from older ones are ignored.
    generation: u64,
    active: bool,
    status: BookStatus,
    /// Last id issued (`u` of the last delta).
    last_id: u64,
    published: Arc<PublishedBook>,
    deltas: u64,
    crossed_skipped: u64,
}

/// Every published book, by instrument.
pub struct BookRegistry {
    bus: Arc<InProcessBus>,
    cells: RwLock<BTreeMap<InstrumentId, Arc<BookCell>>>,
    /// Books that are rebuilt all the time (tick-by-tick shards), so subscribing to them needs no
    /// job lease.
    always_on: RwLock<std::collections::BTreeSet<InstrumentId>>,
}

impl BookRegistry {
    pub fn new(bus: Arc<InProcessBus>) -> Arc<Self> {
        Arc::new(Self { bus, cells: RwLock::new(BTreeMap::new()), always_on: RwLock::default() })
    }

    /// Marks `instrument`'s book as always on (see [`Self::is_always_on`]).
    pub fn set_always_on(&self, instrument: &InstrumentId) {
        self.always_on.write().expect("book registry lock").insert(instrument.clone());
    }

    /// Whether `instrument`'s book is kept without subscribers (no depth job to lease).
    pub fn is_always_on(&self, instrument: &InstrumentId) -> bool {
        self.always_on.read().expect("book registry lock").contains(instrument)
    }

    /// A publisher for `instrument`, retiring any previous one. `now_ms` is the wall clock; a new
    /// instrument's ids start at `now_ms * 1000`, an existing one's continue after its last id.
    pub fn publisher(&self, instrument: &InstrumentId, source: &str, now_ms: i64) -> BookPublisher {
        let cell = {
            let mut cells = self.cells.write().expect("book registry lock");
            cells
                .entry(instrument.clone())
                .or_insert_with(|| {
                    Arc::new(BookCell {
                        instrument: instrument.clone(),
                        state: Mutex::new(CellState {
                            source: source.to_string(),
                            generation: 0,
                            active: false,
                            status: BookStatus::default(),
                            last_id: (now_ms.max(0) as u64).saturating_mul(1000),
                            published: Arc::new(PublishedBook {
                                id: 0,
                                time_ms: 0,
                                bids: Vec::new(),
                                asks: Vec::new(),
                                checksum: OrderBook::new().checksum(CHECKSUM_LEVELS),
                            }),
                            deltas: 0,
                            crossed_skipped: 0,
                        }),
                    })
                })
                .clone()
        };
        let (generation, last_id, published) = {
            let mut st = cell.state.lock().expect("book cell lock");
            st.generation += 1;
            st.active = true;
            st.source = source.to_string();
            st.status = BookStatus::default();
            (st.generation, st.last_id, st.published.clone())
        };
        let mut last = OrderBook::new();
        last.replace(&published.bids, &published.asks);
        let topic_delta = Stream::DepthUpdate(instrument.clone()).to_string();
        let topic_depth = DEPTH_LEVELS
            .iter()
            .map(|&levels| (levels, Stream::Depth { instrument: instrument.clone(), levels }.to_string()))
            .collect();
        BookPublisher {
            cell,
            bus: self.bus.clone(),
            generation,
            last,
            last_id,
            last_snapshot_ms: i64::MIN,
            topic_delta,
            topic_depth,
            changed_bids: Vec::new(),
            changed_asks: Vec::new(),
            status: BookStatus::default(),
        }
    }

    /// Whether millrace has (or had) a book for `instrument`.
    pub fn contains(&self, instrument: &InstrumentId) -> bool {
        self.cells.read().expect("book registry lock").contains_key(instrument)
    }

    /// The last published book of `instrument` and its health.
    pub fn snapshot(&self, instrument: &InstrumentId) -> Option<(Arc<PublishedBook>, BookHealth)> {
        let cell = self.cells.read().expect("book registry lock").get(instrument)?.clone();
        let st = cell.state.lock().expect("book cell lock");
        let health = if st.active { st.status.health } else { BookHealth::Stale };
        Some((st.published.clone(), health))
    }

    /// The REST answer for `instrument`: the last published book cut to `limit` levels per side.
    pub fn rest_depth(&self, instrument: &InstrumentId, limit: usize) -> Option<(RestDepth, BookHealth)> {
        let (book, health) = self.snapshot(instrument)?;
        let n = limit.min(MAX_REST_LEVELS);
        Some((
            RestDepth { id: book.id, bids: book.bids.iter().take(n).copied().collect(), asks: book.asks.iter().take(n).copied().collect() },
            health,
        ))
    }

    /// Every book, for `/api/v1/ops/books`.
    pub fn list(&self) -> Vec<BookInfo> {
        let cells: Vec<Arc<BookCell>> = self.cells.read().expect("book registry lock").values().cloned().collect();
        cells
            .iter()
            .map(|cell| {
                let st = cell.state.lock().expect("book cell lock");
                let p = &st.published;
                let mut status = st.status;
                if !st.active {
                    status.health = BookHealth::Stale;
                }
                BookInfo {
                    instrument: cell.instrument.clone(),
                    source: st.source.clone(),
                    active: st.active,
                    status,
                    id: p.id,
                    checksum: p.checksum,
                    bid_levels: p.bids.len(),
                    ask_levels: p.asks.len(),
                    best_bid: p.bids.first().copied(),
                    best_ask: p.asks.first().copied(),
                    deltas: st.deltas,
                    crossed_skipped: st.crossed_skipped,
                    published_ms: p.time_ms,
                }
            })
            .collect()
    }
}

/// The producer's side of one book (see the module docs). Not shared: it moves with the book
/// (e.g. between engine shards).
pub struct BookPublisher {
    cell: Arc<BookCell>,
    bus: Arc<InProcessBus>,
    generation: u64,
    /// The book as last published (what every in-sync client holds).
    last: OrderBook,
    last_id: u64,
    last_snapshot_ms: i64,
    topic_delta: String,
    topic_depth: Vec<(u16, String)>,
    changed_bids: Vec<Level>,
    changed_asks: Vec<Level>,
    /// The status last reported, so an unchanged book with an unchanged status costs no lock.
    status: BookStatus,
}

impl BookPublisher {
    pub fn instrument(&self) -> &InstrumentId {
        &self.cell.instrument
    }

    /// Publishes what changed in `book` since the last publish (see the module docs). Call about
    /// every [`DELTA_INTERVAL_MS`]; `now_ms` is the wall clock. Returns whether a delta was sent.
    pub fn publish(&mut self, book: &OrderBook, status: BookStatus, now_ms: i64) -> bool {
        if !status.health.is_publishable() {
            self.report(status, false);
            return false;
        }
        if book.is_crossed() {
            self.report(status, true);
            return false;
        }
        diff_side(self.last.side(Side::Bid), book.side(Side::Bid), &mut self.changed_bids);
        diff_side(self.last.side(Side::Ask), book.side(Side::Ask), &mut self.changed_asks);
        let changed = !self.changed_bids.is_empty() || !self.changed_asks.is_empty();
        if changed {
            let Some(id) = self.next_id() else {
                return false; // retired: a newer producer owns the book
            };
            for l in &self.changed_bids {
                self.last.apply(Side::Bid, l.price, l.qty);
            }
            for l in &self.changed_asks {
                self.last.apply(Side::Ask, l.price, l.qty);
            }
            let cs = self.last.checksum(CHECKSUM_LEVELS);
            let event = DepthUpdateEvent {
                e: "depthUpdate".into(),
                event_time: now_ms,
                s: self.cell.instrument.clone(),
                first_id: id,
                u: id,
                pu: self.last_id,
                b: std::mem::take(&mut self.changed_bids),
                a: std::mem::take(&mut self.changed_asks),
                cs,
            };
            self.last_id = id;
            self.store_published(now_ms, cs, status);
            let push = Push { stream: Stream::DepthUpdate(self.cell.instrument.clone()), data: &event };
            self.bus.publish(&self.topic_delta, frame(&push));
            self.changed_bids = event.b;
            self.changed_asks = event.a;
            self.changed_bids.clear();
            self.changed_asks.clear();
        } else {
            self.report(status, false);
        }
        if now_ms.saturating_sub(self.last_snapshot_ms) >= SNAPSHOT_INTERVAL_MS {
            self.last_snapshot_ms = now_ms;
            self.publish_snapshots(now_ms);
        }
        changed
    }

    /// The id for the next delta, or `None` when a newer publisher took over.
    fn next_id(&mut self) -> Option<u64> {
        let mut st = self.cell.state.lock().expect("book cell lock");
        if st.generation != self.generation {
            return None;
        }
        st.last_id += 1;
        Some(st.last_id)
    }

    fn store_published(&mut self, now_ms: i64, checksum: u32, status: BookStatus) {
        let published = Arc::new(PublishedBook {
            id: self.last_id,
            time_ms: now_ms,
            bids: self.last.side(Side::Bid).iter().take(MAX_REST_LEVELS).collect(),
            asks: self.last.side(Side::Ask).iter().take(MAX_REST_LEVELS).collect(),
            checksum,
        });
        let mut st = self.cell.state.lock().expect("book cell lock");
        if st.generation == self.generation {
            st.published = published;
            st.status = status;
            st.deltas += 1;
        }
        self.status = status;
    }

    /// Records `status` in the cell (only when it changed, or for a crossed book).
    fn report(&mut self, status: BookStatus, crossed: bool) {
        if status == self.status && !crossed {
            return;
        }
        let mut st = self.cell.state.lock().expect("book cell lock");
        if st.generation == self.generation {
            st.status = status;
            if crossed {
                st.crossed_skipped += 1;
            }
        }
        self.status = status;
    }

    fn publish_snapshots(&self, now_ms: i64) {
        for (levels, topic) in &self.topic_depth {
            if self.bus.subscriber_count(topic) == 0 {
                continue;
            }
            let n = *levels as usize;
            let (bids, asks) = self.last.top(n);
            let event = DepthSnapshotEvent {
                event_time: now_ms,
                s: self.cell.instrument.clone(),
                u: self.last_id,
                bids,
                asks,
            };
            let push = Push { stream: Stream::Depth { instrument: self.cell.instrument.clone(), levels: *levels }, data: &event };
            self.bus.publish(topic, frame(&push));
        }
    }
}

impl Drop for BookPublisher {
    fn drop(&mut self) {
        if let Ok(mut st) = self.cell.state.lock() {
            if st.generation == self.generation {
                st.active = false;
            }
        }
    }
}

fn frame<T: Serialize>(push: &Push<T>) -> Bytes {
    Bytes::from(serde_json::to_vec(push).expect("a depth push always serializes"))
}

/// The levels of `new` that differ from `old` (quantity 0 for a level that is gone), best first.
/// Both ladders iterate best first, so one merge pass over both does it.
fn diff_side(old: &shared::book::Ladder, new: &shared::book::Ladder, out: &mut Vec<Level>) {
    out.clear();
    let better = |a: &Level, b: &Level| match old.side() {
        Side::Bid => a.price > b.price,
        Side::Ask => a.price < b.price,
    };
    let mut o = old.iter().peekable();
    let mut n = new.iter().peekable();
    loop {
        match (o.peek(), n.peek()) {
            (None, None) => break,
            (Some(a), None) => {
                out.push(Level::new(a.price, shared::fixed::Qty::ZERO));
                o.next();
            }
            (None, Some(b)) => {
                out.push(*b);
                n.next();
            }
            (Some(a), Some(b)) => {
                if a.price == b.price {
                    if a.qty != b.qty {
                        out.push(*b);
                    }
                    o.next();
                    n.next();
                } else if better(a, b) {
                    out.push(Level::new(a.price, shared::fixed::Qty::ZERO));
                    o.next();
                } else {
                    out.push(*b);
                    n.next();
                }
            }
        }
    }
}

#[cfg(test)]
mod tests;
