//! The plug points of a depth job, for a layer around the service (the cluster fills them; the
//! single process leaves them empty):
//! - [`DepthSource`]: where an instrument's diffs and snapshots come from instead of the exchange
//!   (a gateway's come from the cluster's workers);
//! - [`DiffTap`]: who hears every diff the job receives, as the exchange sent it (a worker
//!   forwards them to the cluster);
//! - [`SourceBooks`]: the synced books of the running depth jobs, at the exchange's update ids,
//!   for whoever asks through the book registry (a worker answers the gateways' snapshot
//!   requests with them).
//!
//! A depth job knows none of the layers: it syncs whatever feed it is given with the seed 002
//! rules and publishes as it always does.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::Duration;

use binance::rest::RestError;
use binance::stream::StreamError;
use futures_util::future::BoxFuture;
use shared::book::Level;
use shared::fixed::Price;
use shared::protocol::InstrumentId;
use shared::sync::DepthSnapshot;
use tokio::sync::{mpsc, oneshot};
use tokio_tungstenite::tungstenite::Utf8Bytes;

use crate::lock::lock;

/// An open feed of one instrument's diff frames (the exchange's text, in order).
pub trait DiffFeed: Send {
    /// The next frame; an error (or `None`) ends the feed, like a lost connection.
    fn next_text(&mut self) -> BoxFuture<'_, Option<Result<Utf8Bytes, StreamError>>>;
    /// How long it has been open.
    fn age(&self) -> Duration;
}

/// A snapshot and the price range it is complete in (`None`: the whole side).
pub type RangedSnapshot = (DepthSnapshot, Option<Price>, Option<Price>);

/// Where a depth job's diffs and snapshots come from, other than the exchange. Such a source
/// has no partial-book stream to fall back to: the job keeps asking it for snapshots.
pub trait DepthSource: Send + Sync + 'static {
    /// What the job's status names as its stream.
    fn feed_name(&self, instrument: &InstrumentId) -> String;
    /// Opens `instrument`'s feed from now on; `stall` without a frame ends it.
    fn open(
        &self,
        instrument: &InstrumentId,
        stall: Duration,
    ) -> BoxFuture<'static, Result<Box<dyn DiffFeed>, StreamError>>;
    /// A synced book of `instrument` with the range it is complete in.
    fn snapshot(
        &self,
        instrument: &InstrumentId,
    ) -> BoxFuture<'static, Result<RangedSnapshot, RestError>>;
    /// The market's trades from this source, into `registry` until `shutdown` (run beside the
    /// book's job); `None` when it has none.
    fn trades(
        &self,
        instrument: &InstrumentId,
        registry: std::sync::Arc<crate::trades::TradeRegistry>,
        shutdown: crate::shutdown::Shutdown,
    ) -> Option<BoxFuture<'static, ()>> {
        let _ = (instrument, registry, shutdown);
        None
    }
}

/// Hears every diff a depth job receives: `U` = `first`, `u` = `last`, `pu` = `prev`, and the
/// frame as the exchange sent it.
pub trait DiffTap: Send + Sync + 'static {
    fn diff(&self, instrument: &InstrumentId, first: u64, last: u64, prev: Option<u64>, text: &str);
}

/// A depth job's synced book at the exchange's update id, pruned to the range it is complete
/// in, and that range.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SourceBook {
    pub last_update_id: u64,
    /// Best first.
    pub bids: Vec<Level>,
    pub asks: Vec<Level>,
    pub bid_floor: Option<Price>,
    pub ask_ceiling: Option<Price>,
}

/// A question to a depth job: its book now (`None` while it is not synced).
pub type BookQuestion = oneshot::Sender<Option<SourceBook>>;

/// Questions a job takes at once before askers wait (a job answers between two frames).
const QUESTIONS: usize = 16;

/// How long an asker waits for a job's answer.
const ANSWER_WAIT: Duration = Duration::from_secs(1);

/// The running depth jobs' books, by instrument (see the module docs).
#[derive(Default)]
pub struct SourceBooks {
    /// Each running job's question channel, with the job's generation (a restarted job's
    /// registration replaces the old one; the old one's end removes nothing). Guards a map
    /// touched at job start, stop and per question.
    jobs: Mutex<HashMap<InstrumentId, (u64, mpsc::Sender<BookQuestion>)>>,
    next: std::sync::atomic::AtomicU64,
}

/// A job's registration; dropping it deregisters the job.
pub struct Answering<'a> {
    books: &'a SourceBooks,
    instrument: InstrumentId,
    generation: u64,
    pub questions: mpsc::Receiver<BookQuestion>,
}

impl Drop for Answering<'_> {
    fn drop(&mut self) {
        let mut jobs = lock(&self.books.jobs);
        if jobs.get(&self.instrument).is_some_and(|(g, _)| *g == self.generation) {
            jobs.remove(&self.instrument);
        }
    }
}

impl SourceBooks {
    /// Registers the job of `instrument`: it answers the questions it receives.
    pub fn answer(&self, instrument: &InstrumentId) -> Answering<'_> {
        let (tx, rx) = mpsc::channel(QUESTIONS);
        let generation = self.next.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        lock(&self.jobs).insert(instrument.clone(), (generation, tx));
        Answering { books: self, instrument: instrument.clone(), generation, questions: rx }
    }

    /// The synced book of `instrument`'s running job; `None` when no job runs it, it is not
    /// synced, or it does not answer within a second.
    pub async fn book(&self, instrument: &InstrumentId) -> Option<SourceBook> {
        let job = lock(&self.jobs).get(instrument).map(|(_, tx)| tx.clone())?;
        let (tx, rx) = oneshot::channel();
        job.try_send(tx).ok()?;
        tokio::time::timeout(ANSWER_WAIT, rx).await.ok()?.ok()?
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_registered_job_answers_and_a_gone_one_does_not() {
        let books = SourceBooks::default();
        let i: InstrumentId = "sim:spot:BTC/USDT".parse().unwrap();
        assert_eq!(books.book(&i).await, None, "no job");
        let mut job = books.answer(&i);
        let answering = async {
            let q = job.questions.recv().await.unwrap();
            let book = SourceBook {
                last_update_id: 7,
                bids: vec![],
                asks: vec![],
                bid_floor: None,
                ask_ceiling: None,
            };
            q.send(Some(book)).unwrap();
        };
        let (asked, ()) = tokio::join!(books.book(&i), answering);
        assert_eq!(asked.unwrap().last_update_id, 7);
        // a restarted job replaces the old registration; the old one's end removes nothing
        let newer = books.answer(&i);
        drop(job);
        assert!(lock(&books.jobs).contains_key(&i));
        drop(newer);
        assert!(!lock(&books.jobs).contains_key(&i));
    }
}
