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

pub mod depth_job;
mod publisher;
pub mod upstream;

use std::collections::{BTreeMap, BTreeSet};
use std::sync::atomic::{AtomicBool, Ordering::Relaxed};
use std::sync::{Arc, Mutex, RwLock};

use shared::book::{Level, OrderBook, CHECKSUM_LEVELS};
use shared::protocol::ops::BookInfo;
use shared::protocol::{BookHealth, BookStatus, InstrumentId, RestDepth};
use shared::publish::BookDiff;

pub use publisher::BookPublisher;

use crate::bus::Bus;
use crate::lock::{lock, read, write};

/// Deltas are published at most this often (the seed's `depth_update` throttle).
pub const DELTA_INTERVAL_MS: i64 = 100;
/// Snapshots on `depth@…` are published at most this often (the seed's `depth` throttle).
pub const SNAPSHOT_INTERVAL_MS: i64 = 200;
/// Most levels per side kept in the REST snapshot.
pub const MAX_REST_LEVELS: usize = 5000;

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

impl PublishedBook {
    /// Nothing published yet: no levels, and the checksum of an empty book.
    fn empty() -> Self {
        PublishedBook {
            id: 0,
            time_ms: 0,
            bids: Vec::new(),
            asks: Vec::new(),
            checksum: OrderBook::new().checksum(CHECKSUM_LEVELS),
        }
    }
}

/// One published book's shared part. Locked once per publish (every 100 ms) and per REST / ops
/// read, never per upstream event.
struct BookCell {
    instrument: InstrumentId,
    state: Mutex<CellState>,
    /// The status was set from outside the producer ([`BookRegistry::mark_stale`]): its next
    /// report must reach the cell even if the producer's own status did not change.
    overridden: AtomicBool,
}

impl BookCell {
    fn new(instrument: &InstrumentId, source: &str, now_ms: i64) -> Self {
        BookCell {
            instrument: instrument.clone(),
            state: Mutex::new(CellState {
                source: source.to_string(),
                generation: 0,
                active: false,
                status: BookStatus::default(),
                last_id: u64::try_from(now_ms).unwrap_or(0).saturating_mul(1000),
                published: Arc::new(PublishedBook::empty()),
                deltas: 0,
                crossed_skipped: 0,
            }),
            overridden: AtomicBool::new(false),
        }
    }
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
    bus: Arc<dyn Bus>,
    cells: RwLock<BTreeMap<InstrumentId, Arc<BookCell>>>,
    /// Books that are rebuilt all the time (tick-by-tick shards), so subscribing to them needs no
    /// job lease.
    always_on: RwLock<BTreeSet<InstrumentId>>,
    /// The running depth jobs' synced books at the exchange's ids, on request (a plug point:
    /// see [`upstream`]).
    source_books: upstream::SourceBooks,
    /// The instruments' recent trades: a book's job reports its market's trades too.
    trades: Arc<crate::trades::TradeRegistry>,
}

impl BookRegistry {
    pub fn new(bus: Arc<dyn Bus>) -> Arc<Self> {
        Arc::new(Self {
            trades: crate::trades::TradeRegistry::new(bus.clone()),
            bus,
            cells: RwLock::new(BTreeMap::new()),
            always_on: RwLock::default(),
            source_books: upstream::SourceBooks::default(),
        })
    }

    /// Every instrument's recent trades ([`crate::trades`]).
    pub fn trades(&self) -> &Arc<crate::trades::TradeRegistry> {
        &self.trades
    }

    /// The running depth jobs' synced books (see [`upstream::SourceBooks`]).
    pub fn source_books(&self) -> &upstream::SourceBooks {
        &self.source_books
    }

    /// Marks `instrument`'s book as always on (see [`Self::is_always_on`]).
    pub fn set_always_on(&self, instrument: &InstrumentId) {
        write(&self.always_on).insert(instrument.clone());
    }

    /// Whether `instrument`'s book is kept without subscribers (no depth job to lease).
    pub fn is_always_on(&self, instrument: &InstrumentId) -> bool {
        read(&self.always_on).contains(instrument)
    }

    /// A publisher for `instrument`, retiring any previous one. `now_ms` is the wall clock; a new
    /// instrument's ids start at `now_ms * 1000`, an existing one's continue after its last id.
    pub fn publisher(&self, instrument: &InstrumentId, source: &str, now_ms: i64) -> BookPublisher {
        let cell = write(&self.cells)
            .entry(instrument.clone())
            .or_insert_with(|| Arc::new(BookCell::new(instrument, source, now_ms)))
            .clone();
        let (generation, diff) = {
            let mut st = lock(&cell.state);
            st.generation += 1;
            st.active = true;
            st.source = source.to_string();
            st.status = BookStatus::default();
            let p = &st.published;
            let diff = BookDiff::new(instrument.clone(), &p.bids, &p.asks, st.last_id);
            (st.generation, diff)
        };
        BookPublisher::new(cell, self.bus.clone(), generation, diff)
    }

    /// Reports `instrument`'s book `stale` until its producer publishes again: for a producer
    /// whose feed went silent (nothing arrives, so it has nothing to publish). Returns whether
    /// the book is active (and was marked).
    pub fn mark_stale(&self, instrument: &InstrumentId) -> bool {
        let Some(cell) = read(&self.cells).get(instrument).cloned() else { return false };
        let mut st = lock(&cell.state);
        if !st.active {
            return false;
        }
        st.status.health = BookHealth::Stale;
        cell.overridden.store(true, Relaxed);
        true
    }

    /// Whether millrace has (or had) a book for `instrument`.
    pub fn contains(&self, instrument: &InstrumentId) -> bool {
        read(&self.cells).contains_key(instrument)
    }

    /// The last published book of `instrument` and its health.
    pub fn snapshot(&self, instrument: &InstrumentId) -> Option<(Arc<PublishedBook>, BookHealth)> {
        let cell = read(&self.cells).get(instrument)?.clone();
        let st = lock(&cell.state);
        let health = if st.active { st.status.health } else { BookHealth::Stale };
        Some((st.published.clone(), health))
    }

    /// The REST answer for `instrument`: the last published book cut to `limit` levels per side.
    pub fn rest_depth(
        &self,
        instrument: &InstrumentId,
        limit: usize,
    ) -> Option<(RestDepth, BookHealth)> {
        let (book, health) = self.snapshot(instrument)?;
        let n = limit.min(MAX_REST_LEVELS);
        let cut = |side: &[Level]| side.iter().take(n).copied().collect();
        Some((RestDepth { id: book.id, bids: cut(&book.bids), asks: cut(&book.asks) }, health))
    }

    /// Every book, for `/api/v1/ops/books`.
    pub fn list(&self) -> Vec<BookInfo> {
        let cells: Vec<Arc<BookCell>> = read(&self.cells).values().cloned().collect();
        cells
            .iter()
            .map(|cell| {
                let st = lock(&cell.state);
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

#[cfg(test)]
mod tests;
