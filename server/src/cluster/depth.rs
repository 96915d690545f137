//! Order books in a cluster (seed 002 against the cluster).
//!
//! - **Workers** holding `depth:{instrument}` run today's depth job with a [`DepthTap`]: every
//!   diff the exchange sends goes, as the exchange sent it, onto the JetStream stream
//!   `{prefix}_depth` (memory storage, a minute kept) with `Nats-Msg-Id` = instrument|`U`|`u`,
//!   so one copy of each diff is kept whichever replica was first; and the job answers snapshot
//!   requests on `{prefix}.booksnap.{instrument}` with its book while it is synced
//!   ([`BookSnapshotReply`]; an unsynced replica stays silent and the first answer wins).
//! - **Gateways** run the same depth job with the cluster as its exchange ([`ClusterBooks`]):
//!   the "stream" is an ordered JetStream consumer of the instrument's diffs, put back in order
//!   by a [`DiffReorder`] (a diff one replica missed comes from another a moment later), and the
//!   "REST snapshot" is a request to the workers. The job's `BookSync` applies the seed 002
//!   rules to it unchanged; the gateway's publisher then serves browsers as on one process.
//!
//! Losing a replica costs nothing: the other replica's copies of the same diffs, with the same
//! exchange ids, are the ones JetStream keeps from then on.

use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::Arc;
use std::time::{Duration, Instant};

use async_nats::jetstream::{self, consumer::push, consumer::DeliverPolicy, stream};
use binance::rest::RestError;
use binance::stream::StreamError;
use bytes::Bytes;
use futures_util::future::BoxFuture;
use futures_util::StreamExt as _;
use shared::book::Level;
use shared::cluster::bounds::Poison;
use shared::cluster::payload::{BookSnapshotReply, DiffReorder, Pushed};
use shared::fixed::Price;
use shared::protocol::InstrumentId;
use shared::sync::DepthSnapshot;
use tokio::sync::mpsc;
use tokio_tungstenite::tungstenite::Utf8Bytes;

use super::Subjects;
use crate::books::upstream::{DepthSource, DiffFeed, DiffTap, RangedSnapshot};
use crate::books::BookRegistry;
use crate::bus::nats::token;
use crate::bus::PoisonStats;
use crate::clock::wall_clock_ms;
use crate::shutdown::Shutdown;

/// How long a gateway holds a diff that does not continue the last one, waiting for the
/// missing diff from another replica (diffs come every 100 ms; replicas are ms apart).
pub const HOLD_MS: i64 = 250;

/// How long a gateway waits for a worker's snapshot.
const SNAPSHOT_TIMEOUT: Duration = Duration::from_secs(2);

/// Diffs queued for NATS before a worker drops them (counted).
const TAP_QUEUE: usize = 16_384;

/// The subject of `instrument`'s diffs.
pub fn diff_subject(subjects: &Subjects, instrument: &InstrumentId) -> String {
    format!("{}.diffs.{}", subjects.prefix, token(&instrument.to_string()))
}

/// The subject on which `instrument`'s holders answer snapshot requests.
pub fn snapshot_subject(subjects: &Subjects, instrument: &InstrumentId) -> String {
    format!("{}.booksnap.{}", subjects.prefix, token(&instrument.to_string()))
}

/// Creates (or finds) the diff stream of `subjects`, of `size_mb` MiB (`cluster.depth_stream_mb`).
pub async fn ensure_stream(
    js: &jetstream::Context,
    subjects: &Subjects,
    size_mb: u64,
) -> Result<stream::Stream, async_nats::Error> {
    Ok(js
        .get_or_create_stream(stream::Config {
            name: subjects.depth_stream(),
            subjects: vec![format!("{}.diffs.>", subjects.prefix)],
            storage: stream::StorageType::Memory,
            max_age: Duration::from_secs(60),
            duplicate_window: Duration::from_secs(30),
            max_bytes: i64::try_from(size_mb << 20).unwrap_or(i64::MAX),
            discard: stream::DiscardPolicy::Old,
            ..Default::default()
        })
        .await?)
}

/// Counters of a worker's depth tap.
#[derive(Debug, Default)]
pub struct TapStats {
    pub forwarded: AtomicU64,
    /// Diffs dropped because the queue to NATS was full.
    pub dropped: AtomicU64,
    pub snapshots_answered: AtomicU64,
}

/// A worker's side (see the module docs).
pub struct DepthTap {
    pub client: async_nats::Client,
    pub subjects: Subjects,
    queue: mpsc::Sender<(String, async_nats::HeaderMap, Bytes)>,
    pub stats: Arc<TapStats>,
}

impl DepthTap {
    /// A tap publishing through one task that ends with `shutdown`.
    pub fn new(client: async_nats::Client, subjects: Subjects, shutdown: &Shutdown) -> Arc<Self> {
        let (queue, mut rx) = mpsc::channel::<(String, async_nats::HeaderMap, Bytes)>(TAP_QUEUE);
        let stats = Arc::new(TapStats::default());
        let (c, st, token) = (client.clone(), stats.clone(), shutdown.token().clone());
        shutdown.spawn(async move {
            loop {
                let (subject, headers, body) = tokio::select! {
                    m = rx.recv() => match m { Some(m) => m, None => break },
                    () = token.cancelled() => break,
                };
                match c.publish_with_headers(subject, headers, body).await {
                    Ok(()) => st.forwarded.fetch_add(1, Relaxed),
                    Err(_) => st.dropped.fetch_add(1, Relaxed),
                };
            }
        });
        Arc::new(DepthTap { client, subjects, queue, stats })
    }

    /// Answers the gateways' snapshot requests (`{prefix}.booksnap.{instrument}`) with the
    /// synced books of this worker's depth jobs, asked of `registry`, until `shutdown`. A job
    /// that is not synced leaves the request to another replica (no answer).
    pub async fn answer_snapshots(
        self: &Arc<Self>,
        registry: Arc<BookRegistry>,
        shutdown: &Shutdown,
    ) -> Result<(), async_nats::SubscribeError> {
        let all = format!("{}.booksnap.*", self.subjects.prefix);
        let mut requests = self.client.subscribe(all).await?;
        let (tap, stop, spawner) = (self.clone(), shutdown.clone(), shutdown.clone());
        shutdown.spawn(async move {
            loop {
                let m = tokio::select! {
                    m = requests.next() => match m { Some(m) => m, None => break },
                    () = stop.stopping() => break,
                };
                let (Some(reply), Some(instrument)) = (m.reply, instrument_of(&m.subject)) else {
                    continue;
                };
                let (tap, registry) = (tap.clone(), registry.clone());
                spawner.spawn(async move {
                    let Some(b) = registry.source_books().book(&instrument).await else { return };
                    let answer = BookSnapshotReply {
                        last_update_id: b.last_update_id,
                        bids: b.bids,
                        asks: b.asks,
                        bid_floor: b.bid_floor,
                        ask_ceiling: b.ask_ceiling,
                    };
                    let body = serde_json::to_vec(&answer).expect("serialisable");
                    if tap.client.publish(reply, body.into()).await.is_ok() {
                        tap.stats.snapshots_answered.fetch_add(1, Relaxed);
                    }
                });
            }
        });
        Ok(())
    }
}

/// The instrument a `{prefix}.booksnap.{instrument}` subject names.
fn instrument_of(subject: &str) -> Option<InstrumentId> {
    let (_, token) = subject.rsplit_once(".booksnap.")?;
    crate::bus::nats::untoken(token)?.parse().ok()
}

impl DiffTap for DepthTap {
    /// Forwards one diff of `instrument` (`U` = `first`, `u` = `last`, `pu` = `prev`) as the
    /// exchange sent it.
    fn diff(
        &self,
        instrument: &InstrumentId,
        first: u64,
        last: u64,
        prev: Option<u64>,
        text: &str,
    ) {
        let mut headers = async_nats::HeaderMap::new();
        headers.insert("Nats-Msg-Id", format!("{instrument}|{first}|{last}").as_str());
        let prev = prev.unwrap_or(first.saturating_sub(1));
        headers.insert("Millrace-Prev", prev.to_string().as_str());
        headers.insert("Millrace-U", last.to_string().as_str());
        let item =
            (diff_subject(&self.subjects, instrument), headers, Bytes::from(text.to_owned()));
        if self.queue.try_send(item).is_err() {
            self.stats.dropped.fetch_add(1, Relaxed);
        }
    }
}

/// A venue's books come through the workers' relay ([`super::relay`]); Binance's diffs through
/// the diff stream.
impl DepthSource for ClusterBooks {
    fn feed_name(&self, instrument: &InstrumentId) -> String {
        match self.relayed(instrument) {
            Some(relay) => relay.feed_name(instrument),
            None => diff_subject(&self.subjects, instrument),
        }
    }

    fn open(
        &self,
        instrument: &InstrumentId,
        stall: Duration,
    ) -> BoxFuture<'static, Result<Box<dyn DiffFeed>, StreamError>> {
        let (books, instrument) = (self.clone(), instrument.clone());
        Box::pin(async move {
            if let Some(relay) = books.relayed(&instrument) {
                let feed = relay.open(&instrument, stall).await?;
                return Ok(Box::new(feed) as Box<dyn DiffFeed>);
            }
            let feed = books.feed(&instrument, stall).await?;
            Ok(Box::new(feed) as Box<dyn DiffFeed>)
        })
    }

    fn snapshot(
        &self,
        instrument: &InstrumentId,
    ) -> BoxFuture<'static, Result<RangedSnapshot, RestError>> {
        let (books, instrument) = (self.clone(), instrument.clone());
        Box::pin(async move {
            match books.relayed(&instrument) {
                Some(relay) => relay.snapshot(&instrument).await,
                None => books.snapshot(&instrument).await,
            }
        })
    }

    /// Every market's trades come from the workers' relay.
    fn trades(
        &self,
        instrument: &InstrumentId,
        registry: Arc<crate::trades::TradeRegistry>,
        shutdown: Shutdown,
    ) -> Option<BoxFuture<'static, ()>> {
        Some(self.relay.trades(instrument, registry, shutdown))
    }
}

impl DiffFeed for ClusterFeed {
    fn next_text(&mut self) -> BoxFuture<'_, Option<Result<Utf8Bytes, StreamError>>> {
        Box::pin(ClusterFeed::next_text(self))
    }

    fn age(&self) -> Duration {
        ClusterFeed::age(self)
    }
}

/// A gateway's view of the cluster as an exchange of books (see the module docs).
#[derive(Clone)]
pub struct ClusterBooks {
    pub client: async_nats::Client,
    pub subjects: Subjects,
    js: jetstream::Context,
    /// `cluster.depth_stream_mb`, should this gateway be the first to make the stream.
    stream_mb: u64,
    /// Where refused diffs are counted.
    poison: Arc<PoisonStats>,
    /// The venues' books and every market's trades, relayed by the workers.
    relay: Arc<super::relay::RelayBooks>,
}

impl ClusterBooks {
    /// The cluster's books; those of the venue sources named `venues` come through the relay.
    pub fn new(
        client: async_nats::Client,
        subjects: Subjects,
        stream_mb: u64,
        poison: Arc<PoisonStats>,
        venues: std::collections::HashSet<String>,
        bounds: Arc<dyn crate::bus::Bounds>,
    ) -> Arc<Self> {
        let js = jetstream::new(client.clone());
        let relay = super::relay::RelayBooks::new(
            client.clone(),
            &subjects.prefix,
            venues,
            poison.clone(),
            bounds,
        );
        Arc::new(ClusterBooks { client, subjects, js, stream_mb, poison, relay })
    }

    /// The relay, if `instrument`'s book comes through it.
    fn relayed(&self, instrument: &InstrumentId) -> Option<&Arc<super::relay::RelayBooks>> {
        self.relay.handles(instrument).then_some(&self.relay)
    }

    /// Opens the diff feed of `instrument` from now on; `stall` without a diff ends it.
    pub async fn feed(
        &self,
        instrument: &InstrumentId,
        stall: Duration,
    ) -> Result<ClusterFeed, StreamError> {
        let url = diff_subject(&self.subjects, instrument);
        let fail = |e: &dyn std::fmt::Display| StreamError::Connect {
            url: url.clone(),
            reason: e.to_string(),
        };
        let stream =
            ensure_stream(&self.js, &self.subjects, self.stream_mb).await.map_err(|e| fail(&e))?;
        let consumer = stream
            .create_consumer(push::OrderedConfig {
                deliver_subject: self.client.new_inbox(),
                filter_subject: url.clone(),
                deliver_policy: DeliverPolicy::New,
                ..Default::default()
            })
            .await
            .map_err(|e| fail(&e))?;
        let messages = consumer.messages().await.map_err(|e| fail(&e))?;
        Ok(ClusterFeed {
            messages,
            subject: url,
            poison: self.poison.clone(),
            levels: (Vec::new(), Vec::new()),
            reorder: DiffReorder::new(HOLD_MS),
            ready: std::collections::VecDeque::new(),
            scratch: Vec::new(),
            stall,
            last_seen: Instant::now(),
            opened: Instant::now(),
        })
    }

    /// A synced book of `instrument` from a worker that holds it, with the price range it is
    /// complete in.
    pub async fn snapshot(
        &self,
        instrument: &InstrumentId,
    ) -> Result<(DepthSnapshot, Option<Price>, Option<Price>), RestError> {
        let subject = snapshot_subject(&self.subjects, instrument);
        let answer = ask_workers(&self.client, &subject).await?;
        let fail = |reason: String| RestError::Transport {
            url: format!("nats:{subject}"),
            reason,
            timeout: false,
        };
        let r: BookSnapshotReply = serde_json::from_slice(&answer.payload)
            .map_err(|e| fail(format!("the worker's snapshot did not parse: {e}")))?;
        let snapshot =
            DepthSnapshot { last_update_id: r.last_update_id, bids: r.bids, asks: r.asks };
        Ok((snapshot, r.bid_floor, r.ask_ceiling))
    }
}

/// A snapshot request to the workers on `subject`: the first answer within [`SNAPSHOT_TIMEOUT`]
/// (an unsynced worker stays silent).
pub(super) async fn ask_workers(
    client: &async_nats::Client,
    subject: &str,
) -> Result<async_nats::Message, RestError> {
    let fail = |reason: String, timeout: bool| RestError::Transport {
        url: format!("nats:{subject}"),
        reason,
        timeout,
    };
    let ask = client.request(subject.to_string(), Bytes::new());
    tokio::time::timeout(SNAPSHOT_TIMEOUT, ask)
        .await
        .map_err(|_| fail("no synced worker answered".into(), true))?
        .map_err(|e| fail(format!("no synced worker answered: {e}"), false))
}

/// The diffs of one instrument, de-duplicated and in order (see the module docs).
pub struct ClusterFeed {
    messages: push::Ordered,
    subject: String,
    poison: Arc<PoisonStats>,
    /// Scratch for parsing a diff's body (its levels are not kept).
    levels: (Vec<Level>, Vec<Level>),
    reorder: DiffReorder<Bytes>,
    ready: std::collections::VecDeque<Bytes>,
    scratch: Vec<Bytes>,
    stall: Duration,
    last_seen: Instant,
    opened: Instant,
}

impl ClusterFeed {
    /// The next diff as the exchange sent it; an error ends the feed (like a lost connection).
    pub async fn next_text(&mut self) -> Option<Result<Utf8Bytes, StreamError>> {
        loop {
            if let Some(b) = self.ready.pop_front() {
                return Some(Utf8Bytes::try_from(b).map_err(|e| StreamError::Io(e.to_string())));
            }
            let hold = self.reorder.deadline().map(|d| {
                let wait = u64::try_from(d - wall_clock_ms()).unwrap_or(0);
                tokio::time::Instant::now() + Duration::from_millis(wait)
            });
            let stall_at = tokio::time::Instant::from_std(self.last_seen + self.stall);
            tokio::select! {
                m = self.messages.next() => match m {
                    Some(Ok(m)) => {
                        self.last_seen = Instant::now();
                        let payload = m.message.payload.clone();
                        let header = |k: &str| {
                            m.headers.as_ref()?.get(k)?.as_str().parse::<u64>().ok()
                        };
                        let headers = (header("Millrace-Prev"), header("Millrace-U"));
                        match self.check(&payload, headers) {
                            Ok((prev, u)) => {
                                let now = wall_clock_ms();
                                let pushed =
                                    self.reorder.push(prev, u, payload, now, &mut self.scratch);
                                if pushed == Pushed::Refused {
                                    self.poison.record(Poison::DiffIds, format_args!(
                                        "{}: a diff continuing from {prev} to {u}, outside the book's ids",
                                        self.subject
                                    ));
                                }
                                self.ready.extend(self.scratch.drain(..));
                            }
                            Err(kind) => self.poison.record(
                                kind,
                                format_args!("{}: a diff refused", self.subject),
                            ),
                        }
                    }
                    Some(Err(e)) => return Some(Err(StreamError::Io(e.to_string()))),
                    None => return None,
                },
                _ = tokio::time::sleep_until(hold.unwrap_or(stall_at)), if hold.is_some() => {
                    self.reorder.expire(wall_clock_ms(), &mut self.scratch);
                    self.ready.extend(self.scratch.drain(..));
                }
                _ = tokio::time::sleep_until(stall_at) => {
                    return Some(Err(StreamError::Stalled { silent_for: self.stall }));
                }
            }
        }
    }

    /// The ids of one forwarded diff, from its body (the exchange's frame, parsed as the
    /// depth job will): `(prev, u)`, `prev` being `pu` or `U − 1`. The worker's headers must
    /// say the same. (The ids are what the reorder's position follows; they are checked there,
    /// against the book's id window.)
    fn check(
        &mut self,
        payload: &Bytes,
        headers: (Option<u64>, Option<u64>),
    ) -> Result<(u64, u64), Poison> {
        let text = std::str::from_utf8(payload).map_err(|_| Poison::Unparsable)?;
        let (bids, asks) = &mut self.levels;
        let frame = match binance::fastdepth::parse_depth_frame(text, bids, asks) {
            Ok(binance::fastdepth::DepthParse::Depth(frame)) => frame,
            _ => return Err(Poison::Unparsable),
        };
        let prev = frame.prev_last_id.unwrap_or(frame.first_id.saturating_sub(1));
        if headers != (Some(prev), Some(frame.last_id)) {
            return Err(Poison::DiffHeaders);
        }
        Ok((prev, frame.last_id))
    }

    /// How long the feed has been open.
    pub fn age(&self) -> Duration {
        self.opened.elapsed()
    }

    /// Diffs dropped as duplicates after JetStream's de-dup (a redelivery).
    pub fn duplicates(&self) -> u64 {
        self.reorder.duplicates()
    }
}
