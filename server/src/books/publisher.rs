//! [`BookPublisher`]: a producer's handle on one published book — `shared::publish::BookDiff`
//! (the diff and the events) wired to the registry's cell (ids, the REST book, ops counters) and
//! the bus (the `depth_update@` and `depth@…,N` topics).

use std::sync::atomic::Ordering::Relaxed;
use std::sync::Arc;

use bytes::Bytes;
use serde::Serialize;
use shared::book::{OrderBook, Side, CHECKSUM_LEVELS};
use shared::protocol::{BookStatus, InstrumentId, Push, Stream, DEPTH_LEVELS};
use shared::publish::{BookDiff, Verdict};

use super::{BookCell, PublishedBook, MAX_REST_LEVELS, SNAPSHOT_INTERVAL_MS};
use crate::bus::Bus;
use crate::lock::lock;

/// The producer's side of one book (see the module docs of [`super`]). Not shared: it moves with
/// the book (e.g. between engine shards).
pub struct BookPublisher {
    cell: Arc<BookCell>,
    bus: Arc<dyn Bus>,
    /// This producer's generation; a newer producer of the same book retires it.
    generation: u64,
    /// The published book and the events that change it.
    diff: BookDiff,
    last_snapshot_ms: i64,
    topic_delta: String,
    topic_depth: Vec<(u16, String)>,
    /// The status last reported, so an unchanged book with an unchanged status costs no lock.
    status: BookStatus,
}

impl BookPublisher {
    pub(super) fn new(
        cell: Arc<BookCell>,
        bus: Arc<dyn Bus>,
        generation: u64,
        diff: BookDiff,
    ) -> Self {
        let instrument = diff.instrument().clone();
        let topic_delta = Stream::DepthUpdate(instrument.clone()).to_string();
        let topic_depth = DEPTH_LEVELS
            .iter()
            .map(|&levels| {
                (levels, Stream::Depth { instrument: instrument.clone(), levels }.to_string())
            })
            .collect();
        BookPublisher {
            cell,
            bus,
            generation,
            diff,
            last_snapshot_ms: i64::MIN,
            topic_delta,
            topic_depth,
            status: BookStatus::default(),
        }
    }

    pub fn instrument(&self) -> &InstrumentId {
        &self.cell.instrument
    }

    /// Publishes what changed in `book` since the last publish (see the module docs). Call about
    /// every [`super::DELTA_INTERVAL_MS`]; `now_ms` is the wall clock. Returns whether a delta
    /// was sent.
    pub fn publish(&mut self, book: &OrderBook, status: BookStatus, now_ms: i64) -> bool {
        let changed = match self.diff.check(book, status.health) {
            Verdict::Withheld => {
                self.report(status, false);
                return false;
            }
            Verdict::Crossed => {
                self.report(status, true);
                return false;
            }
            Verdict::Unchanged => {
                self.report(status, false);
                false
            }
            Verdict::Changed => {
                if !self.owns_next_id() {
                    return false; // retired: a newer producer owns the book
                }
                let event = self.diff.mint(now_ms);
                self.store_published(now_ms, event.cs, status);
                let push = Push {
                    stream: Stream::DepthUpdate(self.cell.instrument.clone()),
                    data: &event,
                };
                self.bus.publish(&self.topic_delta, frame(&push));
                self.diff.recycle(event);
                true
            }
        };
        if now_ms.saturating_sub(self.last_snapshot_ms) >= SNAPSHOT_INTERVAL_MS {
            self.last_snapshot_ms = now_ms;
            self.publish_snapshots(now_ms);
        }
        changed
    }

    /// Takes the book's next update id for this producer, or `false` when a newer publisher took
    /// over.
    fn owns_next_id(&mut self) -> bool {
        let mut st = lock(&self.cell.state);
        if st.generation != self.generation {
            return false;
        }
        debug_assert_eq!(st.last_id, self.diff.last_id(), "one producer per book");
        st.last_id += 1;
        true
    }

    fn store_published(&mut self, now_ms: i64, checksum: u32, status: BookStatus) {
        let last = self.diff.last();
        debug_assert_eq!(checksum, last.checksum(CHECKSUM_LEVELS));
        let mut st = lock(&self.cell.state);
        if st.generation == self.generation {
            // Refilled in place unless a reader (a REST answer being written) still holds it:
            // a publish every 100 ms per book allocates nothing once the book's size is reached.
            if Arc::get_mut(&mut st.published).is_none() {
                st.published = Arc::new(PublishedBook::empty());
            }
            let p = Arc::get_mut(&mut st.published).expect("the cell's only reference");
            p.id = self.diff.last_id();
            p.time_ms = now_ms;
            p.bids.clear();
            p.bids.extend(last.side(Side::Bid).iter().take(MAX_REST_LEVELS));
            p.asks.clear();
            p.asks.extend(last.side(Side::Ask).iter().take(MAX_REST_LEVELS));
            p.checksum = checksum;
            st.status = status;
            st.deltas += 1;
            self.cell.overridden.store(false, Relaxed);
        }
        drop(st);
        self.status = status;
    }

    /// Records `status` in the cell (only when it changed, for a crossed book, or when the
    /// cell's status was overridden meanwhile).
    fn report(&mut self, status: BookStatus, crossed: bool) {
        if status == self.status && !crossed && !self.cell.overridden.load(Relaxed) {
            return;
        }
        let mut st = lock(&self.cell.state);
        if st.generation == self.generation {
            st.status = status;
            self.cell.overridden.store(false, Relaxed);
            if crossed {
                st.crossed_skipped += 1;
            }
        }
        self.status = status;
    }

    fn publish_snapshots(&self, now_ms: i64) {
        for (levels, topic) in &self.topic_depth {
            if !self.bus.has_subscribers(topic) {
                continue;
            }
            let event = self.diff.snapshot(*levels, now_ms);
            let push = Push {
                stream: Stream::Depth { instrument: self.cell.instrument.clone(), levels: *levels },
                data: &event,
            };
            self.bus.publish(topic, frame(&push));
        }
    }
}

impl Drop for BookPublisher {
    fn drop(&mut self) {
        let mut st = lock(&self.cell.state);
        if st.generation == self.generation {
            st.active = false;
        }
    }
}

fn frame<T: Serialize>(push: &Push<T>) -> Bytes {
    Bytes::from(serde_json::to_vec(push).expect("a depth push always serializes"))
}
