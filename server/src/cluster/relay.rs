//! Venue books and every market's trades through the cluster.
//!
//! Binance's diffs carry ids every connection shares, so a worker forwards them as the exchange
//! sent them and JetStream keeps one copy of each ([`super::depth`]). The other venues' do not
//! all: Coinbase numbers a connection's messages (`sequence_num`), Kraken proves a book by its
//! checksum alone. So a venue's book is proven where it is received: a worker's venue book job
//! keeps it by the venue's own rules (sequence, checksum, resets) and publishes it through its
//! `BookPublisher` as on one process. What crosses the bus is that publisher's output:
//!
//! - **Workers** relay, through a [`RelayBus`] under their book registry, every
//!   `depth_update@{instrument}` of a venue's book and every `trade@{instrument}` (Binance's
//!   aggregate trades too) onto `{prefix}.relay.{topic}.{worker}`, answer snapshot requests
//!   (`{prefix}.relaysnap.{instrument}[.{worker}]`) with their published book while it is synced
//!   ([`serve`]), and say every [`ALIVE_EVERY`] which relayed books they hold
//!   (`{prefix}.relayalive.{worker}`).
//! - **Gateways** ([`RelayBooks`]) sync a venue's book from one replica with the seed 002 rules
//!   millrace's browsers use: the replica's snapshot at its publisher's id, then its deltas,
//!   each checked by id and by checksum (`cs`), so the gateway's book provably equals the
//!   worker's, which provably equals the venue's. When that replica goes silent for
//!   [`RELAY_SILENCE`] or stops holding the book, the gateway syncs from another one; its own
//!   publisher sends browsers the difference, so they see no gap. Trades are heard from every
//!   replica and kept once by the venue's trade ids (the trade registry drops the second copy).

use std::collections::HashSet;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::Arc;
use std::time::{Duration, Instant};

use binance::rest::RestError;
use binance::stream::StreamError;
use bytes::Bytes;
use futures_util::future::BoxFuture;
use futures_util::StreamExt as _;
use serde::{Deserialize, Serialize};
use shared::cluster::bounds::{Poison, TimeWindow};
use shared::cluster::payload::BookSnapshotReply;
use shared::protocol::{BookHealth, InstrumentId, Stream, TradesEvent};
use tokio::sync::mpsc;
use tokio_tungstenite::tungstenite::Utf8Bytes;

use crate::books::upstream::{DiffFeed, RangedSnapshot};
use crate::books::{BookRegistry, MAX_REST_LEVELS};
use crate::bus::nats::{token, untoken};
use crate::bus::{Bounds, Bus, PoisonStats, Subscription};
use crate::clock::wall_clock_ms;
use crate::lock::lock;
use crate::shutdown::Shutdown;
use crate::trades::TradeRegistry;

/// How often a worker says which relayed books it holds.
pub const ALIVE_EVERY: Duration = Duration::from_millis(500);
/// How long a gateway follows a replica it hears nothing from.
pub const RELAY_SILENCE: Duration = Duration::from_secs(2);
/// Frames queued for NATS before a worker drops them (counted).
const RELAY_QUEUE: usize = 16_384;
/// The most trades one relayed message may carry.
const MAX_RELAYED_TRADES: usize = 10_000;
/// The most books one worker's "alive" message may list.
const MAX_ALIVE_BOOKS: usize = 100_000;
/// The longest worker id taken from the bus.
const MAX_WORKER_ID: usize = 128;
/// The most sequential trade ids a venue is taken to make per second (a relayed id further ahead
/// of the last one kept, for the time between them, is refused: one forged id far ahead would
/// make every real trade after it look like a duplicate).
const MAX_TRADES_PER_S: u64 = 100_000;
/// How far past the window's end a relayed trade's time may be. The window's end is the source's
/// clock as last estimated plus `cluster.bus_tolerance_s`; a coarse clock (Kraken's answers in
/// whole seconds) is estimated loosely until its second reading, and a trade relayed once by
/// each replica cannot wait for a fresh reading the way a candle in JetStream does. A trade's
/// time only orders the tape, so the bound is there for absurd times (a forged one years ahead).
const TRADE_CLOCK_SLACK_MS: i64 = 600_000;
/// The header naming the worker that answered a snapshot request.
const WORKER_HEADER: &str = "Millrace-Worker";

/// The subject a worker relays `topic` on.
pub fn relay_subject(prefix: &str, topic: &str, worker: &str) -> String {
    format!("{prefix}.relay.{}.{}", token(topic), token(worker))
}

/// The subject of `worker`'s list of the relayed books it holds.
pub fn alive_subject(prefix: &str, worker: &str) -> String {
    format!("{prefix}.relayalive.{}", token(worker))
}

/// The subject on which any synced replica of `instrument` answers (`worker`: only that one).
pub fn snapshot_subject(prefix: &str, instrument: &InstrumentId, worker: Option<&str>) -> String {
    match worker {
        None => format!("{prefix}.relaysnap.{}", token(&instrument.to_string())),
        Some(w) => format!("{prefix}.relaysnap.{}.{}", token(&instrument.to_string()), token(w)),
    }
}

/// Counters of a worker's relay.
#[derive(Debug, Default)]
pub struct RelayStats {
    pub relayed: AtomicU64,
    /// Frames dropped because the queue to NATS was full or NATS refused them.
    pub dropped: AtomicU64,
    pub snapshots_answered: AtomicU64,
}

/// A worker's book registry's bus: everything goes to `inner` (the worker's own), and the
/// relayed topics also go to NATS (see the module docs).
pub struct RelayBus {
    inner: Arc<dyn Bus>,
    prefix: String,
    worker: String,
    /// The venue sources' names: their books are relayed.
    venues: HashSet<String>,
    queue: mpsc::Sender<(String, Bytes)>,
    pub stats: Arc<RelayStats>,
}

impl RelayBus {
    /// A relay publishing through one task that ends with `shutdown`.
    pub fn new(
        inner: Arc<dyn Bus>,
        client: async_nats::Client,
        prefix: &str,
        worker: &str,
        venues: HashSet<String>,
        shutdown: &Shutdown,
    ) -> Arc<Self> {
        let (queue, mut rx) = mpsc::channel::<(String, Bytes)>(RELAY_QUEUE);
        let stats = Arc::new(RelayStats::default());
        let (st, stop) = (stats.clone(), shutdown.token().clone());
        shutdown.spawn(async move {
            loop {
                let (subject, body) = tokio::select! {
                    m = rx.recv() => match m { Some(m) => m, None => break },
                    () = stop.cancelled() => break,
                };
                match client.publish(subject, body).await {
                    Ok(()) => st.relayed.fetch_add(1, Relaxed),
                    Err(_) => st.dropped.fetch_add(1, Relaxed),
                };
            }
        });
        Arc::new(RelayBus {
            inner,
            prefix: prefix.to_string(),
            worker: worker.to_string(),
            venues,
            queue,
            stats,
        })
    }

    /// Whether `topic` crosses the bus: every market's trades, and a venue's book deltas.
    fn relays(&self, topic: &str) -> bool {
        if topic.starts_with("trade@") {
            return true;
        }
        topic.strip_prefix("depth_update@").is_some_and(|instrument| {
            let exchange = instrument.split(':').next().unwrap_or_default();
            self.venues.contains(exchange)
        })
    }
}

impl Bus for RelayBus {
    fn publish(&self, topic: &str, payload: Bytes) -> usize {
        if self.relays(topic) {
            let subject = relay_subject(&self.prefix, topic, &self.worker);
            if self.queue.try_send((subject, payload.clone())).is_err() {
                self.stats.dropped.fetch_add(1, Relaxed);
            }
        }
        self.inner.publish(topic, payload)
    }

    fn subscribe(&self, topic: &str) -> Subscription {
        self.inner.subscribe(topic)
    }

    fn has_subscribers(&self, topic: &str) -> bool {
        self.relays(topic) || self.inner.has_subscribers(topic)
    }
}

/// The relayed books a worker holds, every [`ALIVE_EVERY`].
#[derive(Debug, Serialize, Deserialize)]
struct Alive {
    books: Vec<InstrumentId>,
}

/// A worker's side: answers snapshot requests for its relayed books and says which it holds,
/// until `shutdown`.
pub async fn serve(
    registry: Arc<BookRegistry>,
    client: async_nats::Client,
    prefix: String,
    worker: String,
    venues: HashSet<String>,
    stats: Arc<RelayStats>,
    shutdown: &Shutdown,
) -> Result<(), async_nats::SubscribeError> {
    let mut requests = client.subscribe(format!("{prefix}.relaysnap.>")).await?;
    let ours = token(&worker);
    let relayed = {
        let venues = venues.clone();
        move |i: &InstrumentId| venues.contains(&i.exchange)
    };
    let (stop, c, reg, w, rel) =
        (shutdown.clone(), client.clone(), registry.clone(), worker.clone(), relayed.clone());
    shutdown.spawn(async move {
        loop {
            let m = tokio::select! {
                m = requests.next() => match m { Some(m) => m, None => break },
                () = stop.stopping() => break,
            };
            let Some(reply) = m.reply else { continue };
            let Some(tail) = m.subject.as_str().split_once(".relaysnap.").map(|(_, t)| t) else {
                continue;
            };
            let (instrument, asked) = match tail.split_once('.') {
                Some((i, w)) => (i, Some(w)),
                None => (tail, None),
            };
            if asked.is_some_and(|a| a != ours) {
                continue; // another replica's
            }
            let Some(instrument) = untoken(instrument).and_then(|i| i.parse().ok()) else {
                continue;
            };
            if !rel(&instrument) {
                continue;
            }
            let Some((book, health)) = reg.snapshot(&instrument) else { continue };
            if health != BookHealth::Synced || book.id == 0 {
                continue; // not synced here: leave it to another replica
            }
            // a side cut at the REST depth is complete only down (up) to its last level
            let edge = |levels: &[shared::book::Level]| {
                (levels.len() >= MAX_REST_LEVELS).then(|| levels.last().map(|l| l.price)).flatten()
            };
            let answer = BookSnapshotReply {
                last_update_id: book.id,
                bids: book.bids.clone(),
                asks: book.asks.clone(),
                bid_floor: edge(&book.bids),
                ask_ceiling: edge(&book.asks),
            };
            let mut headers = async_nats::HeaderMap::new();
            headers.insert(WORKER_HEADER, w.as_str());
            let body = serde_json::to_vec(&answer).expect("serialisable");
            if c.publish_with_headers(reply, headers, body.into()).await.is_ok() {
                stats.snapshots_answered.fetch_add(1, Relaxed);
            }
        }
    });
    let (stop, subject) = (shutdown.clone(), alive_subject(&prefix, &worker));
    shutdown.spawn(async move {
        let mut tick = tokio::time::interval(ALIVE_EVERY);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tokio::select! {
                _ = tick.tick() => {}
                () = stop.stopping() => break,
            }
            let books: Vec<InstrumentId> = registry
                .list()
                .into_iter()
                .filter(|b| b.active && relayed(&b.instrument))
                .map(|b| b.instrument)
                .collect();
            let body = serde_json::to_vec(&Alive { books }).expect("serialisable");
            let _ = client.publish(subject.clone(), body.into()).await;
        }
    });
    Ok(())
}

/// A gateway's side (see the module docs): the books of the venue sources named `venues`, and
/// every market's relayed trades.
pub struct RelayBooks {
    client: async_nats::Client,
    prefix: String,
    venues: HashSet<String>,
    /// The replica each open feed follows: its snapshots must come from the same one.
    following: std::sync::Mutex<std::collections::HashMap<InstrumentId, String>>,
    poison: Arc<PoisonStats>,
    /// The times a relayed trade may carry (its source's clock with the cluster's margins).
    bounds: Arc<dyn Bounds>,
}

impl RelayBooks {
    pub fn new(
        client: async_nats::Client,
        prefix: &str,
        venues: HashSet<String>,
        poison: Arc<PoisonStats>,
        bounds: Arc<dyn Bounds>,
    ) -> Arc<Self> {
        Arc::new(RelayBooks {
            client,
            prefix: prefix.to_string(),
            venues,
            following: Default::default(),
            poison,
            bounds,
        })
    }

    /// Whether `instrument`'s book comes through the relay (a venue's).
    pub fn handles(&self, instrument: &InstrumentId) -> bool {
        self.venues.contains(&instrument.exchange)
    }

    /// What a job's status names as its stream.
    pub fn feed_name(&self, instrument: &InstrumentId) -> String {
        let topic = Stream::DepthUpdate(instrument.clone()).to_string();
        format!("{}.relay.{}.*", self.prefix, token(&topic))
    }

    /// Asks for a synced replica's book; the answer and the replica's id.
    async fn ask(
        &self,
        instrument: &InstrumentId,
        worker: Option<&str>,
    ) -> Result<(BookSnapshotReply, String), RestError> {
        let subject = snapshot_subject(&self.prefix, instrument, worker);
        let answer = super::depth::ask_workers(&self.client, &subject).await?;
        let fail = |reason: String, timeout: bool| RestError::Transport {
            url: format!("nats:{subject}"),
            reason,
            timeout,
        };
        let who = answer
            .headers
            .as_ref()
            .and_then(|h| h.get(WORKER_HEADER))
            .map(|v| v.as_str().to_string())
            .filter(|w| !w.is_empty() && w.len() <= MAX_WORKER_ID);
        let refuse = |what: String| {
            self.poison.record(Poison::Unparsable, format_args!("{subject}: {what}"));
            fail(what, false)
        };
        let Some(who) = who else {
            return Err(refuse("a snapshot without its worker's name".into()));
        };
        if worker.is_some_and(|w| w != who) {
            return Err(refuse(format!("a snapshot asked of {worker:?} answered by {who}")));
        }
        let r: BookSnapshotReply = serde_json::from_slice(&answer.payload)
            .map_err(|e| refuse(format!("the worker's snapshot did not parse: {e}")))?;
        if r.bids.len() > MAX_REST_LEVELS || r.asks.len() > MAX_REST_LEVELS {
            return Err(refuse(format!("a snapshot of more than {MAX_REST_LEVELS} levels a side")));
        }
        Ok((r, who))
    }

    /// Opens `instrument`'s deltas from a synced replica (see the module docs).
    pub async fn open(
        &self,
        instrument: &InstrumentId,
        stall: Duration,
    ) -> Result<RelayFeed, StreamError> {
        let url = self.feed_name(instrument);
        let fail = |e: &dyn std::fmt::Display| StreamError::Connect {
            url: url.clone(),
            reason: e.to_string(),
        };
        let (_, worker) = self.ask(instrument, None).await.map_err(|e| fail(&e))?;
        let topic = Stream::DepthUpdate(instrument.clone()).to_string();
        let deltas = self
            .client
            .subscribe(relay_subject(&self.prefix, &topic, &worker))
            .await
            .map_err(|e| fail(&e))?;
        let alive = self
            .client
            .subscribe(alive_subject(&self.prefix, &worker))
            .await
            .map_err(|e| fail(&e))?;
        lock(&self.following).insert(instrument.clone(), worker.clone());
        tracing::info!(%instrument, %worker, "following a replica's book");
        Ok(RelayFeed {
            deltas,
            alive,
            instrument: instrument.clone(),
            worker,
            silence: stall.min(RELAY_SILENCE),
            last_seen: Instant::now(),
            opened: Instant::now(),
            poison: self.poison.clone(),
        })
    }

    /// The book of the replica `instrument`'s feed follows.
    pub async fn snapshot(&self, instrument: &InstrumentId) -> Result<RangedSnapshot, RestError> {
        let worker = lock(&self.following).get(instrument).cloned();
        let Some(worker) = worker else {
            return Err(RestError::Transport {
                url: self.feed_name(instrument),
                reason: "no replica followed yet".into(),
                timeout: false,
            });
        };
        let (r, _) = self.ask(instrument, Some(&worker)).await?;
        let snapshot = shared::sync::DepthSnapshot {
            last_update_id: r.last_update_id,
            bids: r.bids,
            asks: r.asks,
        };
        Ok((snapshot, r.bid_floor, r.ask_ceiling))
    }

    /// `instrument`'s trades as every replica relays them, into `registry` (which keeps each
    /// once) until `shutdown`. A message that does not parse, names another instrument, carries
    /// too many trades, a trade outside the source's clock window or an id further ahead than
    /// the venue can have come is refused and counted; while the source's clock was never read,
    /// messages are dropped (as the bus drops pushes it cannot judge).
    pub fn trades(
        &self,
        instrument: &InstrumentId,
        registry: Arc<TradeRegistry>,
        shutdown: Shutdown,
    ) -> BoxFuture<'static, ()> {
        let topic = Stream::Trade(instrument.clone()).to_string();
        let subject = format!("{}.relay.{}.*", self.prefix, token(&topic));
        let (client, poison, instrument, bounds) =
            (self.client.clone(), self.poison.clone(), instrument.clone(), self.bounds.clone());
        Box::pin(async move {
            let mut backoff = Duration::from_millis(250);
            while !shutdown.is_stopping() {
                let mut sub = match client.subscribe(subject.clone()).await {
                    Ok(s) => s,
                    Err(e) => {
                        tracing::warn!(%subject, "cannot subscribe to the relayed trades: {e}");
                        tokio::select! {
                            () = tokio::time::sleep(backoff) => {}
                            () = shutdown.stopping() => return,
                        }
                        backoff = (backoff * 2).min(Duration::from_secs(5));
                        continue;
                    }
                };
                let mut merge = TradeMerge::new(TRADE_HOLD_MS);
                loop {
                    let last = || registry.last_seq(&instrument).map(|(id, _)| id);
                    let deadline = merge.deadline().map(|at| {
                        let wait = u64::try_from(at - wall_clock_ms()).unwrap_or(0);
                        tokio::time::Instant::now() + Duration::from_millis(wait)
                    });
                    let m = tokio::select! {
                        m = sub.next() => match m { Some(m) => m, None => break },
                        () = shutdown.stopping() => return,
                        () = tokio::time::sleep_until(deadline.unwrap_or_else(tokio::time::Instant::now)), if deadline.is_some() => {
                            registry.push(&instrument, merge.release(last(), wall_clock_ms()));
                            continue;
                        }
                    };
                    let Some(mut window) = bounds.window(&instrument) else { continue };
                    let estimated_end = window.latest_ms;
                    window.latest_ms = window.latest_ms.saturating_add(TRADE_CLOCK_SLACK_MS);
                    let last = registry.last_seq(&instrument);
                    let checked = relayed_trades(&m.payload, &instrument, &window, last);
                    if let Ok(trades) = &checked {
                        if trades.iter().any(|t| t.time_ms > estimated_end) {
                            bounds.refresh(&instrument); // the clock's estimate is behind
                        }
                    }
                    match checked {
                        Ok(trades) => {
                            let out = merge.push(trades, last.map(|(id, _)| id), wall_clock_ms());
                            registry.push(&instrument, out);
                        }
                        Err(kind) => poison
                            .record(kind, format_args!("{}: relayed trades refused", m.subject)),
                    }
                }
            }
        })
    }
}

/// How long a relayed trade whose id does not follow the last one kept waits for the trades
/// before it (another replica may be behind: a worker that joined after a fail-over starts at the
/// venue's present while the surviving one still relays the moments before).
pub const TRADE_HOLD_MS: i64 = 2_000;
/// The most trades held waiting.
const MAX_HELD: usize = 100_000;

/// The replicas' copies of one market's trades merged in the order of their sequential ids (see
/// [`TRADE_HOLD_MS`]): a trade that follows the last one kept goes on at once, with whatever
/// follows it; one after a hole waits until the hole is filled or the hold ends (then the hole is
/// a gap, counted by the registry). Copies of a held trade are handed on after it, for the
/// registry to count as duplicates; trades without sequential ids are not held.
#[derive(Debug, Default)]
pub struct TradeMerge {
    /// id → the trade, when it arrived (ms), and its extra copies.
    held: std::collections::BTreeMap<u64, (shared::trade::Trade, i64, u32)>,
    hold_ms: i64,
}

impl TradeMerge {
    pub fn new(hold_ms: i64) -> Self {
        TradeMerge { held: Default::default(), hold_ms }
    }

    /// Takes relayed `trades`; returns those to keep now, in id order. `last` is the highest
    /// sequential id kept so far.
    pub fn push(
        &mut self,
        trades: Vec<shared::trade::Trade>,
        last: Option<u64>,
        now_ms: i64,
    ) -> Vec<shared::trade::Trade> {
        let mut out = Vec::new();
        for t in trades {
            match t.id.seq() {
                Some(id) if last.is_none_or(|l| id > l) => match self.held.entry(id) {
                    std::collections::btree_map::Entry::Occupied(mut e) => e.get_mut().2 += 1,
                    std::collections::btree_map::Entry::Vacant(e) => {
                        e.insert((t, now_ms, 0));
                    }
                },
                // already kept (the registry counts it a duplicate), or no sequential id
                _ => out.push(t),
            }
        }
        out.extend(self.release(last, now_ms));
        out
    }

    /// The held trades that may go on now: those that follow the last one kept, and any whose
    /// hold has ended (with the ones after them that follow).
    pub fn release(&mut self, mut last: Option<u64>, now_ms: i64) -> Vec<shared::trade::Trade> {
        let mut out = Vec::new();
        loop {
            let too_many = self.held.len() > MAX_HELD;
            let Some(entry) = self.held.first_entry() else { break };
            let id = *entry.key();
            let (_, arrived, _) = entry.get();
            let follows = last.is_none_or(|l| id == l + 1);
            if !(follows || now_ms - arrived >= self.hold_ms || too_many) {
                break;
            }
            let (t, _, copies) = entry.remove();
            for _ in 0..copies {
                out.push(t.clone());
            }
            out.insert(out.len() - copies as usize, t);
            last = Some(id);
        }
        out
    }

    /// When the first held trade's hold ends (ms), if one is held.
    pub fn deadline(&self) -> Option<i64> {
        self.held.values().next().map(|(_, at, _)| at + self.hold_ms)
    }
}

/// The trades of one relayed `trade@` push, if it is `instrument`'s and within bounds: times in
/// `window`, sequential ids no further past `last` (the highest id kept and its trade's time)
/// than [`MAX_TRADES_PER_S`] allows.
fn relayed_trades(
    payload: &[u8],
    instrument: &InstrumentId,
    window: &TimeWindow,
    last: Option<(u64, i64)>,
) -> Result<Vec<shared::trade::Trade>, Poison> {
    #[derive(Deserialize)]
    struct Pushed {
        data: TradesEvent,
    }
    let p: Pushed = serde_json::from_slice(payload).map_err(|_| Poison::Unparsable)?;
    if &p.data.s != instrument {
        return Err(Poison::ForeignSeries);
    }
    if p.data.trades.len() > MAX_RELAYED_TRADES
        || p.data.trades.iter().any(|t| t.price.raw() <= 0 || t.qty.raw() <= 0)
    {
        return Err(Poison::Unparsable);
    }
    for t in &p.data.trades {
        if t.time_ms < window.earliest_ms {
            return Err(Poison::TooOld);
        }
        if t.time_ms > window.latest_ms {
            return Err(Poison::TooNew);
        }
        if let (Some(id), Some((last_id, last_ms))) = (t.id.seq(), last) {
            let secs = u64::try_from(t.time_ms.saturating_sub(last_ms)).unwrap_or(0) / 1000 + 1;
            if id > last_id.saturating_add(secs.saturating_mul(MAX_TRADES_PER_S)) {
                return Err(Poison::DiffIds);
            }
        }
    }
    Ok(p.data.trades)
}

/// A gateway's feed of one replica's deltas of one book (see the module docs).
pub struct RelayFeed {
    deltas: async_nats::Subscriber,
    alive: async_nats::Subscriber,
    instrument: InstrumentId,
    worker: String,
    silence: Duration,
    last_seen: Instant,
    opened: Instant,
    poison: Arc<PoisonStats>,
}

impl DiffFeed for RelayFeed {
    /// The next delta as the replica published it; an error ends the feed (the job then syncs
    /// from another replica).
    fn next_text(&mut self) -> BoxFuture<'_, Option<Result<Utf8Bytes, StreamError>>> {
        Box::pin(async move {
            loop {
                let silent_at = tokio::time::Instant::from_std(self.last_seen + self.silence);
                tokio::select! {
                    m = self.deltas.next() => {
                        let m = m?;
                        self.last_seen = Instant::now();
                        return Some(Utf8Bytes::try_from(m.payload).map_err(|e| StreamError::Io(e.to_string())));
                    }
                    m = self.alive.next() => {
                        let m = m?;
                        let alive: Alive = match serde_json::from_slice(&m.payload) {
                            Ok(a) => a,
                            Err(_) => {
                                self.poison.record(Poison::Unparsable, format_args!("{}: not a worker's list of books", m.subject));
                                continue;
                            }
                        };
                        if alive.books.len() > MAX_ALIVE_BOOKS {
                            self.poison.record(Poison::Unparsable, format_args!("{}: a list of too many books", m.subject));
                            continue;
                        }
                        if !alive.books.contains(&self.instrument) {
                            return Some(Err(StreamError::Io(format!(
                                "worker {} no longer holds the book", self.worker
                            ))));
                        }
                        self.last_seen = Instant::now();
                    }
                    _ = tokio::time::sleep_until(silent_at) => {
                        return Some(Err(StreamError::Stalled { silent_for: self.silence }));
                    }
                }
            }
        })
    }

    fn age(&self) -> Duration {
        self.opened.elapsed()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use shared::fixed::{Price, Qty};
    use shared::trade::{Trade, TradeId};

    fn inst(s: &str) -> InstrumentId {
        s.parse().unwrap()
    }

    fn pushed(instrument: &InstrumentId, trades: Vec<Trade>) -> Vec<u8> {
        let push = shared::protocol::Push {
            stream: Stream::Trade(instrument.clone()),
            data: TradesEvent { s: instrument.clone(), trades },
        };
        serde_json::to_vec(&push).unwrap()
    }

    fn trade(id: u64, price: i64) -> Trade {
        Trade {
            id: TradeId::Seq(id),
            time_ms: 1_700_000_000_000,
            price: Price::from_raw(price),
            qty: Qty::from_raw(1),
            taker: None,
        }
    }

    #[test]
    fn relayed_trades_are_checked_at_the_edge() {
        let okx = inst("okx:spot:BTC/USDT");
        let now = 1_700_000_000_000;
        let w = TimeWindow::around(now, 3_600_000, 60_000);
        let check = |p: &[u8], i: &InstrumentId, last| relayed_trades(p, i, &w, last);
        let ok = pushed(&okx, vec![trade(1, 100), trade(2, 101)]);
        assert_eq!(check(&ok, &okx, None).unwrap().len(), 2);
        // another instrument's, nonsense, a zero price
        assert_eq!(
            check(&ok, &inst("okx:spot:ETH/USDT"), None).unwrap_err(),
            Poison::ForeignSeries
        );
        assert_eq!(check(b"{\"data\":1}", &okx, None).unwrap_err(), Poison::Unparsable);
        let zero = pushed(&okx, vec![trade(3, 0)]);
        assert_eq!(check(&zero, &okx, None).unwrap_err(), Poison::Unparsable);
        let many = pushed(&okx, (0..=MAX_RELAYED_TRADES as u64).map(|i| trade(i, 5)).collect());
        assert_eq!(check(&many, &okx, None).unwrap_err(), Poison::Unparsable);
        // times outside the source's clock window
        let mut late = trade(3, 100);
        late.time_ms = now + 3_600_000;
        assert_eq!(check(&pushed(&okx, vec![late]), &okx, None).unwrap_err(), Poison::TooNew);
        let mut early = trade(3, 100);
        early.time_ms = now - 7_200_000;
        assert_eq!(check(&pushed(&okx, vec![early]), &okx, None).unwrap_err(), Poison::TooOld);
        // an id further ahead than the venue can have come since the last trade kept
        let far = pushed(&okx, vec![trade(u64::MAX, 100)]);
        assert_eq!(check(&far, &okx, Some((2, now))).unwrap_err(), Poison::DiffIds);
        let near = pushed(&okx, vec![trade(2 + MAX_TRADES_PER_S, 100)]);
        assert!(check(&near, &okx, Some((2, now))).is_ok());
        // a minute later, a minute's worth more
        let later = pushed(&okx, vec![trade(2 + 60 * MAX_TRADES_PER_S, 100)]);
        assert!(check(&later, &okx, Some((2, now - 60_000))).is_ok());
    }

    /// A replica that joined after a fail-over relays the present while the other is still
    /// behind: the merge waits for the hole, so no false gap is counted, and copies go on
    /// after their original.
    #[test]
    fn replicas_trades_merge_in_id_order_and_a_real_hole_waits_its_hold() {
        let mut m = TradeMerge::new(2_000);
        let ids =
            |v: &[shared::trade::Trade]| v.iter().map(|t| t.id.seq().unwrap()).collect::<Vec<_>>();
        // kept up to 10; the new replica sends 14..=15 first
        assert!(m.push(vec![trade(14, 1), trade(15, 1)], Some(10), 0).is_empty());
        assert_eq!(m.deadline(), Some(2_000));
        // the lagging replica's 11..=15: all go on, in order, 14 and 15 with their copies
        let out = m.push((11..=15).map(|i| trade(i, 1)).collect(), Some(10), 500);
        assert_eq!(ids(&out), [11, 12, 13, 14, 14, 15, 15]);
        assert_eq!(m.deadline(), None);
        // a real hole: 18 waits, then goes on when its hold ends
        assert!(m.push(vec![trade(18, 1)], Some(15), 1_000).is_empty());
        assert!(m.release(Some(15), 2_999).is_empty());
        assert_eq!(ids(&m.release(Some(15), 3_000)), [18]);
        // ids already kept pass straight on (the registry counts them duplicates)
        assert_eq!(ids(&m.push(vec![trade(3, 1)], Some(18), 3_000)), [3]);
        // the first trade ever goes on at once
        let mut fresh = TradeMerge::new(2_000);
        assert_eq!(ids(&fresh.push(vec![trade(7, 1), trade(9, 1)], None, 0)), [7]);
    }

    #[test]
    fn subjects_keep_instruments_and_workers_apart() {
        let i = inst("sim-okx:spot:BTC/USDT");
        let topic = Stream::DepthUpdate(i.clone()).to_string();
        let a = relay_subject("mr", &topic, "w.1");
        assert_eq!(a, "mr.relay.depth_update@sim-okx:spot:BTC/USDT.w%2E1");
        assert_eq!(
            snapshot_subject("mr", &i, Some("w.1")),
            "mr.relaysnap.sim-okx:spot:BTC/USDT.w%2E1"
        );
        assert_eq!(alive_subject("mr", "w.1"), "mr.relayalive.w%2E1");
    }
}
