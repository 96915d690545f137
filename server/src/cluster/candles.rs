//! Closed candles in a cluster: workers → JetStream → the persister → PostgreSQL → the bus.
//!
//! - The stream `{prefix}_candles` (file storage, work-queue retention) takes every closed 1m
//!   candle a worker's kline task produces on `{prefix}.candles.{series}`, a series' candles of
//!   one aligned block of minutes per message ([`ClosedCandles`]: a live minute alone, a gap
//!   fill in few messages — JetStream's cost is per message, not per candle), with
//!   `Nats-Msg-Id` naming the series and its minutes ([`ClosedCandles::msg_id`]; a lone
//!   candle's is (series, open time)): the replicas of a task publish the same messages and the
//!   stream keeps one of each within `cluster.dedup_window_s`. Replicas that cut a gap fill
//!   differently send overlapping messages; the persister does not write a minute again that
//!   it has written ([`MinuteRuns`], counted in [`PersisterStats::repeated`]). A worker's
//!   pipeline counts a candle as accepted when JetStream acknowledged it (stored on disk), like
//!   the single process counts a commit.
//! - The persister ([`Persister`]) consumes it through the durable pull consumer
//!   `persister`, shared by every persister; only the holder of the `persister` lease pulls, so
//!   one process writes at a time (a derived candle is the merge of its bucket's stored minutes,
//!   which two concurrent writers of a series could each read incomplete). It pulls rounds of
//!   up to `BATCH_MAX` messages and `ROUND_BYTES` (parsed as they arrive), writes a round's minutes of every
//!   series and the derived candles they complete (from each series' aggregator, `Derivers`)
//!   in one transaction through the one [`CandleWriter`] while the next round is pulled and
//!   parsed; a committed round is published, then its messages acknowledged, on a task of its
//!   own while the next round is written (publishing tens of thousands of candles took a
//!   quarter of a round). A round is what is
//!   waiting, fetched at once; only when nothing is waiting does a pull request wait (at most
//!   `PULL_WAIT`) — a request that expired while the server was still sending a full round
//!   left the client waiting seconds for its end. A failed write keeps its round and writes it
//!   again after a back-off (doubling to `RETRY_MAX`; its messages marked in progress meanwhile,
//!   `/healthz` degraded), before anything newer; a persister killed before acknowledging leaves
//!   its messages to be redelivered to the next lease holder after `ack_wait`. Writes are idempotent upserts, and
//!   the bus's kline de-dup drops a redelivered batch's second publication.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::atomic::{AtomicI64, AtomicU64, Ordering::Relaxed};
use std::sync::Arc;
use std::time::Duration;

use async_nats::jetstream::{self, consumer::pull, consumer::AckPolicy, stream, AckKind};
use bytes::Bytes;
use futures_util::future::BoxFuture;
use futures_util::StreamExt as _;
use shared::backoff::Backoff;
use shared::candle::{Candle, DerivedAggregator, Timeframe};
use shared::cluster::bounds::Poison;
use shared::cluster::payload::{ClosedCandle, ClosedCandles, MinuteRuns};
use shared::protocol::SeriesId;

use super::bounds::{ClusterBounds, Ruling};
use super::lease::RoleLease;
use super::Subjects;
use crate::bus::PoisonStats;
use crate::candles::writer::{CandleWriter, ClosedSink, Derive, Rows};
use crate::config::ClusterConfig;
use crate::error::report;
use crate::shutdown::Shutdown;
use crate::store::StoreError;

/// The durable consumer every persister shares.
pub const CONSUMER: &str = "persister";

/// Most messages a persister writes in one round.
pub const BATCH_MAX: usize = 20_000;

/// Most bytes of messages in one round: some 20,000 closed candles (a message holds one, or up
/// to `CANDLES_PER_MESSAGE` of a series).
const ROUND_BYTES: usize = 4 << 20;

/// How long one pull request waits for messages: what a closed candle may wait, at most, before
/// it is written (when fewer than `BATCH_MAX` are waiting); an idle persister pulls this often.
const PULL_WAIT: Duration = Duration::from_millis(250);

/// How long a message may stay unacknowledged before JetStream redelivers it.
const ACK_WAIT: Duration = Duration::from_secs(30);

/// The longest wait before a failed round is written again.
const RETRY_MAX: Duration = Duration::from_secs(10);

/// How often the messages of a round kept for a retry are marked in progress (well within
/// `ACK_WAIT`).
const PROGRESS_EVERY: Duration = Duration::from_secs(10);

/// Creates (or finds) the candle stream of `subjects`.
pub async fn ensure_stream(
    js: &jetstream::Context,
    subjects: &Subjects,
    cluster: &ClusterConfig,
) -> Result<stream::Stream, async_nats::Error> {
    Ok(js
        .get_or_create_stream(stream::Config {
            name: subjects.candle_stream(),
            subjects: vec![format!("{}.candles.>", subjects.prefix)],
            retention: stream::RetentionPolicy::WorkQueue,
            storage: stream::StorageType::File,
            duplicate_window: Duration::from_secs(cluster.dedup_window_s),
            max_age: Duration::from_secs(cluster.queue_max_age_s),
            ..Default::default()
        })
        .await?)
}

/// Counters of a worker's forwarding.
#[derive(Debug, Default)]
pub struct ForwardStats {
    /// Closed candles JetStream took.
    pub published: AtomicU64,
    /// Candles JetStream already had (another replica sent the same message first).
    pub duplicates: AtomicU64,
    pub failures: AtomicU64,
}

/// A worker's [`ClosedSink`]: a kline job's closed 1m candles onto the candle stream (the
/// derived rows are left: the persister derives them from what it stores).
pub struct JetStreamForward {
    js: jetstream::Context,
    subjects: Subjects,
    pub stats: Arc<ForwardStats>,
}

impl JetStreamForward {
    pub fn new(js: jetstream::Context, subjects: Subjects) -> Self {
        JetStreamForward { js, subjects, stats: Arc::default() }
    }
}

impl ClosedSink for JetStreamForward {
    fn take(&self, rows: Rows, _derive: Derive) -> BoxFuture<'static, Result<Rows, StoreError>> {
        let m1 = rows.first().filter(|(s, _)| s.timeframe == Timeframe::M1).cloned();
        let forwarded = m1.map(|(series, candles)| self.forward(series, candles));
        Box::pin(async move {
            if let Some(f) = forwarded {
                f.await?;
            }
            Ok(rows)
        })
    }
}

impl JetStreamForward {
    /// Hands `candles` of `series` (ascending) to the candle stream; `Ok` once JetStream has
    /// taken every message.
    pub fn forward(
        &self,
        series: SeriesId,
        candles: Vec<Candle>,
    ) -> BoxFuture<'static, Result<(), StoreError>> {
        let (js, stats) = (self.js.clone(), self.stats.clone());
        let subject = self.subjects.candles(&series);
        Box::pin(async move {
            let fail = |e: &dyn std::fmt::Display| {
                stats.failures.fetch_add(1, Relaxed);
                StoreError::db(
                    format!("cannot hand closed candles of {series} to JetStream ({subject})"),
                    e.to_string(),
                )
            };
            // Publish them all (one message per aligned block of minutes), then wait for the
            // acknowledgements (pipelined).
            let messages = ClosedCandles::messages(&series, &candles);
            let mut acks = Vec::with_capacity(messages.len());
            for msg in messages {
                let mut headers = async_nats::HeaderMap::new();
                headers.insert("Nats-Msg-Id", msg.msg_id().as_str());
                let body = Bytes::from(serde_json::to_vec(&msg).expect("serialisable"));
                let ack = js
                    .publish_with_headers(subject.clone(), headers, body)
                    .await
                    .map_err(|e| fail(&e))?;
                acks.push((ack, msg.candles.len() as u64));
            }
            for (ack, n) in acks {
                let ack = ack.await.map_err(|e| fail(&e))?;
                if ack.duplicate {
                    stats.duplicates.fetch_add(n, Relaxed);
                } else {
                    stats.published.fetch_add(n, Relaxed);
                }
            }
            Ok(())
        })
    }
}

/// Counters of a persister.
#[derive(Debug, Default)]
pub struct PersisterStats {
    /// Closed 1m candles written (derived ones are not counted).
    pub candles: AtomicU64,
    /// Rounds committed (one transaction each).
    pub batches: AtomicU64,
    pub write_failures: AtomicU64,
    /// Since when (wall clock, ms) writes have been failing; 0 while they succeed.
    pub failing_since_ms: AtomicI64,
    /// Messages refused (terminated, never redelivered): not closed 1m candles of a series the
    /// cluster runs, within the exchange's clock (by kind in the process's [`PoisonStats`]).
    pub malformed: AtomicU64,
    /// Messages sent back to wait (their source's symbols or clock not known yet, or a time
    /// beyond the clock while it is read again).
    pub deferred: AtomicU64,
    /// Closed candles not written again: this lease holder had written their minute (a
    /// replica's message overlapping another's).
    pub repeated: AtomicU64,
    /// Messages delivered more than once (a persister died or failed before acknowledging).
    pub redelivered: AtomicU64,
    pub lease_errors: AtomicU64,
    /// Pull requests that failed (NATS away).
    pub pull_errors: AtomicU64,
    /// 1 while this process holds the persister lease.
    pub leading: AtomicU64,
}

/// Why a persister could not start.
#[derive(Debug, thiserror::Error)]
pub enum PersisterError {
    #[error("cannot set up JetStream for the persister ({what})")]
    JetStream {
        what: String,
        #[source]
        source: async_nats::Error,
    },
}

/// A persister candidate (see the module docs).
pub struct Persister {
    pub client: async_nats::Client,
    pub subjects: Subjects,
    pub cluster: ClusterConfig,
    /// The timeframes written from the 1m candles.
    pub derived: Vec<Timeframe>,
    /// Stores, then publishes.
    pub writer: CandleWriter,
    /// Its id in the lease.
    pub id: String,
    pub stats: Arc<PersisterStats>,
    /// Told whether this candidate holds the lease, on every change (the node's backfill
    /// follows it).
    pub leading: tokio::sync::watch::Sender<bool>,
    /// What a message must fit to be written (see [`super::bounds`]).
    pub bounds: Arc<ClusterBounds>,
    /// Where refused messages are counted.
    pub poison: Arc<PoisonStats>,
}

impl Persister {
    /// Runs until `shutdown`.
    pub async fn run(self, shutdown: Shutdown) -> Result<(), PersisterError> {
        let Persister {
            client,
            subjects,
            cluster,
            derived,
            writer,
            id,
            stats,
            leading,
            bounds,
            poison,
        } = self;
        let gate = Gate { bounds, poison, stats: stats.clone() };
        let js = jetstream::new(client);
        let err = |what: &str| {
            let what = what.to_string();
            move |source| PersisterError::JetStream { what, source }
        };
        let stream = ensure_stream(&js, &subjects, &cluster).await.map_err(err("candle stream"))?;
        let consumer: jetstream::consumer::Consumer<pull::Config> = stream
            .get_or_create_consumer(
                CONSUMER,
                pull::Config {
                    durable_name: Some(CONSUMER.into()),
                    ack_policy: AckPolicy::Explicit,
                    ack_wait: ACK_WAIT,
                    max_ack_pending: (BATCH_MAX * 4) as i64,
                    ..Default::default()
                },
            )
            .await
            .map_err(|e| err("persister consumer")(e.into()))?;
        let kv =
            super::kv_bucket(&js, &subjects.lease_bucket(), Duration::from_secs(cluster.lease_s))
                .await
                .map_err(err("lease bucket"))?;
        let mut lease = RoleLease::new(kv, "persister", &id);
        let every = Duration::from_millis(cluster.tick_ms);
        let retry = Duration::from_millis(cluster.tick_ms.max(500));
        let mut next_keep = tokio::time::Instant::now();
        // The round being written and the next one (pulled meanwhile).
        let (mut current, mut ahead) = (Pulled::default(), Pulled::default());
        // Committed rounds are published, then acknowledged, in order, on a task of their own
        // while the next round is written (at most one waits).
        let (committed, mut to_publish) = tokio::sync::mpsc::channel::<(Rows, Vec<Msg>)>(1);
        let publisher = {
            let writer = writer.clone();
            shutdown.spawn(async move {
                while let Some((rows, msgs)) = to_publish.recv().await {
                    writer.publish(&rows);
                    ack_all(msgs).await;
                }
            })
        };
        // Each series' derived candles as of the minutes written while holding the lease
        // (see `Derivers`); forgotten when the lease is, as another node writes then.
        let mut derivers = Derivers::new(&derived);
        // A failed write's back-off (doubling from `retry` to `RETRY_MAX`), when it ends, and
        // when the held messages are next marked in progress.
        let mut backoff = Backoff::new(retry, RETRY_MAX).with_jitter(0);
        let mut retry_at: Option<tokio::time::Instant> = None;
        let mut progress_at = tokio::time::Instant::now();
        while !shutdown.is_stopping() {
            // Hold the lease (renewed every tick); pull only while holding it.
            if tokio::time::Instant::now() >= next_keep {
                next_keep += every;
                if let Ok(Some(epoch)) = lease.keep(&stats.lease_errors).await {
                    tracing::info!(%id, epoch, "persisting closed candles");
                }
                stats.leading.store(u64::from(lease.held()), Relaxed);
                leading
                    .send_if_modified(|was| std::mem::replace(was, lease.held()) != lease.held());
            }
            if !lease.held() {
                // What was written is acknowledged (by the publishing task); what was pulled
                // goes back at once, for the new holder.
                derivers.clear();
                current.send_back().await;
                ahead.send_back().await;
                (retry_at, progress_at) = (None, tokio::time::Instant::now());
                backoff.reset();
                tokio::select! {
                    () = tokio::time::sleep_until(next_keep) => {}
                    () = shutdown.stopping() => break,
                }
                continue;
            }
            // A round whose write failed is written again after a back-off, before anything
            // newer: the store takes the minutes in order, and a database that is away is not
            // asked again and again. Its messages (and the next round's, already pulled) stay
            // ours meanwhile (in-progress acknowledgements keep JetStream from redelivering
            // them); the lease renewal goes on.
            if let Some(at) = retry_at {
                let now = tokio::time::Instant::now();
                if now < at {
                    if now >= progress_at {
                        progress_at = now + PROGRESS_EVERY;
                        current.in_progress().await;
                        ahead.in_progress().await;
                    }
                    tokio::select! {
                        () = tokio::time::sleep_until(at.min(next_keep)) => {}
                        () = shutdown.stopping() => break,
                    }
                    continue;
                }
            }
            if current.is_empty() {
                if !ahead.is_empty() {
                    std::mem::swap(&mut current, &mut ahead);
                    continue;
                }
                if let Err(e) = pull(&consumer, &mut current, &gate).await {
                    pull_failed(&e, &stats, retry, &shutdown).await;
                }
                continue;
            }
            // Write this round while the next one is pulled (on a task of its own: receiving
            // and parsing a round is as long as writing one) and the last one published and
            // acknowledged.
            let next = ahead.is_empty().then(|| {
                let (consumer, gate, mut round) =
                    (consumer.clone(), gate.clone(), std::mem::take(&mut ahead));
                shutdown.spawn(async move {
                    let r = pull(&consumer, &mut round, &gate).await;
                    (round, r)
                })
            });
            let done = persist(&mut current, &mut derivers, &writer, &stats).await;
            if let Some(next) = next {
                let pulled = match next.await {
                    Ok((round, r)) => {
                        ahead = round;
                        r
                    }
                    Err(e) => Err(e.into()),
                };
                if let Err(e) = pulled {
                    pull_failed(&e, &stats, retry, &shutdown).await;
                }
            }
            match done {
                Some(round) => {
                    // (the publishing task ends only when this sender is dropped)
                    let _ = committed.send(round).await;
                    backoff.reset();
                    retry_at = None;
                    stats.failing_since_ms.store(0, Relaxed);
                    std::mem::swap(&mut current, &mut ahead);
                }
                None => {
                    let delay = backoff.next_delay(1 << 31);
                    retry_at = Some(tokio::time::Instant::now() + delay);
                    let _ = stats.failing_since_ms.compare_exchange(
                        0,
                        crate::clock::wall_clock_ms(),
                        Relaxed,
                        Relaxed,
                    );
                    tracing::warn!(retry_in = ?delay, "persister: the round is kept and written again");
                }
            }
        }
        drop(committed);
        let _ = publisher.await; // the last rounds published and acknowledged
        current.send_back().await;
        ahead.send_back().await;
        leading.send_replace(false);
        lease.release().await;
        Ok(())
    }
}

/// A pulled round: its closed candles by series (parsed while the round before is written)
/// and their messages, to be acknowledged once they are committed.
#[derive(Default)]
struct Pulled {
    msgs: Vec<Msg>,
    by_series: BTreeMap<SeriesId, BTreeMap<i64, Candle>>,
    /// Candles whose minute an earlier message of the round had (overlapping replicas).
    repeated: usize,
}

impl Pulled {
    fn is_empty(&self) -> bool {
        self.msgs.is_empty()
    }

    /// Takes a message: its closed candles join the round if they fit their bounds
    /// ([`ClusterBounds::closed_candles`]); poison is counted and terminated (never
    /// redelivered); a message that cannot be judged yet goes back for later.
    async fn take(&mut self, m: Msg, gate: &Gate) {
        let delivered = m.info().map_or(1, |i| u64::try_from(i.delivered).unwrap_or(1));
        if delivered > 1 {
            gate.stats.redelivered.fetch_add(1, Relaxed);
        }
        // Closed candles of a series (a single `ClosedCandle` is what earlier workers sent).
        let parsed = serde_json::from_slice::<ClosedCandles>(&m.payload).or_else(|_| {
            serde_json::from_slice::<ClosedCandle>(&m.payload)
                .map(|c| ClosedCandles { series: c.series, candles: vec![c.candle] })
        });
        let verdict = match &parsed {
            Ok(msg) => gate.bounds.closed_candles(msg, delivered),
            Err(_) => Ruling::Refuse(Poison::Unparsable),
        };
        match (verdict, parsed) {
            (Ruling::Take, Ok(msg)) => {
                let minutes = self.by_series.entry(msg.series).or_default();
                for c in msg.candles {
                    if minutes.insert(c.open_time, c).is_some() {
                        self.repeated += 1;
                    }
                }
                self.msgs.push(m);
            }
            (Ruling::Wait, _) => {
                gate.stats.deferred.fetch_add(1, Relaxed);
                let _ = m.ack_with(AckKind::Nak(Some(WAIT))).await;
            }
            (Ruling::Refuse(_), _) | (Ruling::Take, Err(_)) => {
                let kind = match verdict {
                    Ruling::Refuse(kind) => kind,
                    _ => Poison::Unparsable,
                };
                gate.stats.malformed.fetch_add(1, Relaxed);
                gate.poison.record(kind, format_args!("{}: closed candles refused", m.subject));
                let _ = m.ack_with(AckKind::Term).await;
            }
        }
    }

    /// Tells JetStream the round is still being worked on (its `ack_wait` starts again).
    async fn in_progress(&self) {
        for m in &self.msgs {
            let _ = m.ack_with(AckKind::Progress).await;
        }
    }

    /// Sends the round back at once, for the next holder of the lease.
    async fn send_back(&mut self) {
        self.by_series.clear();
        self.repeated = 0;
        for m in self.msgs.drain(..) {
            let _ = m.ack_with(AckKind::Nak(None)).await;
        }
    }
}

/// What a persister's pulls judge messages by, and count them in.
#[derive(Clone)]
struct Gate {
    bounds: Arc<ClusterBounds>,
    poison: Arc<PoisonStats>,
    stats: Arc<PersisterStats>,
}

/// How long a message that cannot be judged yet waits before it is delivered again.
const WAIT: Duration = Duration::from_secs(2);

/// Pulls one round into `round`.
async fn pull(
    consumer: &jetstream::consumer::Consumer<pull::Config>,
    round: &mut Pulled,
    gate: &Gate,
) -> Result<(), async_nats::Error> {
    // What is waiting, at once (no expiry: a request that expires while the server is still
    // sending a full round can leave the client waiting seconds for its end).
    let mut messages =
        consumer.fetch().max_messages(BATCH_MAX).max_bytes(ROUND_BYTES).messages().await?;
    take_all(&mut messages, round, gate).await?;
    if !round.is_empty() {
        return Ok(());
    }
    // Nothing waiting: wait for the next messages, at most `PULL_WAIT`.
    let mut messages = consumer
        .batch()
        .max_messages(BATCH_MAX)
        .max_bytes(ROUND_BYTES)
        .expires(PULL_WAIT)
        .messages()
        .await?;
    take_all(&mut messages, round, gate).await
}

/// Takes a pull request's messages into `round`. The server ends a request that reached
/// `ROUND_BYTES` with a status (409) the client reports as an error: after messages, an error
/// ends the round (what arrived is kept); before any, it is the pull's failure.
async fn take_all(
    messages: &mut pull::Batch,
    round: &mut Pulled,
    gate: &Gate,
) -> Result<(), async_nats::Error> {
    let before = round.msgs.len();
    while let Some(m) = messages.next().await {
        match m {
            Ok(m) => round.take(m, gate).await,
            Err(e) if round.msgs.len() > before => {
                tracing::debug!(error = %e, messages = round.msgs.len() - before, "persister: pull ended");
                break;
            }
            Err(e) => return Err(e),
        }
    }
    Ok(())
}

/// A failed pull: counted, logged, and a pause before the next.
async fn pull_failed(
    e: &async_nats::Error,
    stats: &PersisterStats,
    retry: Duration,
    shutdown: &Shutdown,
) {
    tracing::warn!(error = %e, "persister: pull failed");
    stats.pull_errors.fetch_add(1, Relaxed);
    tokio::select! {
        () = tokio::time::sleep(retry) => {}
        () = shutdown.stopping() => {}
    }
}

type Msg = jetstream::Message;

/// Acknowledges `msgs` (a committed round).
async fn ack_all(msgs: Vec<Msg>) {
    for m in msgs {
        let _ = m.ack().await;
    }
}

/// The persister's derived candles: one [`DerivedAggregator`] per 1m series, fed the minutes
/// this lease holder wrote. A round whose minutes of a series follow those (the usual case)
/// takes that series' derived candles from its aggregator: a bucket it saw every minute of is
/// final as it is (a closed minute never changes), and only one built from fewer minutes (the
/// first after taking the lease, a bucket that lost a minute) is completed from the store. A
/// series' first round, or a round with a late minute, has its derived candles merged from the
/// store (`Derive::EachSeries`). So at steady state a round reads nothing: re-reading every
/// bucket's stored minutes was half the round's work with the default 11 timeframes, and at the
/// day's last minute a whole day of minutes per series.
///
/// It also knows which minutes of each series this holder has written ([`MinuteRuns`]): a
/// minute written already (a replica's message overlapping another's) is not written again.
struct Derivers {
    timeframes: Vec<Timeframe>,
    aggs: BTreeMap<SeriesId, DerivedAggregator>,
    written: BTreeMap<SeriesId, MinuteRuns>,
}

/// One round's rows and how they were derived, with each series' aggregator as it will be
/// once the round has committed.
struct Round {
    rows: Vec<(SeriesId, Vec<Candle>)>,
    derive: Derive,
    next: Vec<(SeriesId, DerivedAggregator)>,
    /// The open times of the 1m candles to write, by series (those written already are left
    /// out).
    minutes: Vec<(SeriesId, Vec<i64>)>,
    /// How many 1m candles were left out.
    repeated: usize,
}

impl Derivers {
    fn new(timeframes: &[Timeframe]) -> Self {
        Derivers {
            timeframes: timeframes.to_vec(),
            aggs: BTreeMap::new(),
            written: BTreeMap::new(),
        }
    }

    fn clear(&mut self) {
        self.aggs.clear();
        self.written.clear();
    }

    /// The rows of a round of 1m candles (each series' minutes ascending, distinct).
    fn round(&self, by_series: BTreeMap<SeriesId, Vec<Candle>>) -> Round {
        let mut rows = Vec::with_capacity(by_series.len() * (1 + self.timeframes.len()));
        let (mut written, mut aggregated) = (BTreeMap::new(), BTreeSet::new());
        let mut next = Vec::with_capacity(by_series.len());
        let mut closed = Vec::new();
        let (mut fresh, mut repeated) = (Vec::with_capacity(by_series.len()), 0);
        for (series, mut minutes) in by_series {
            if let Some(runs) = self.written.get(&series) {
                let before = minutes.len();
                minutes.retain(|c| !runs.contains(c.open_time));
                repeated += before - minutes.len();
                if minutes.is_empty() {
                    continue;
                }
            }
            fresh.push((series.clone(), minutes.iter().map(|c| c.open_time).collect()));
            let old = self.aggs.get(&series);
            let last = old.and_then(DerivedAggregator::last_minute);
            let mut agg = old.cloned().unwrap_or_else(|| DerivedAggregator::new(&self.timeframes));
            // what follows the minutes it has seen (a late one is written, not fed)
            let from = last.map_or(0, |last| minutes.partition_point(|c| c.open_time <= last));
            closed.clear();
            let fed = agg.push_closed_1m_batch(&minutes[from..], &mut closed).is_ok();
            let follows = last.is_some() && from == 0;
            rows.push((series.clone(), minutes));
            if fed && follows {
                aggregated.insert(series.clone());
                let mut by_tf: BTreeMap<Timeframe, Vec<Candle>> = BTreeMap::new();
                for (tf, c) in &closed {
                    by_tf.entry(*tf).or_default().push(*c);
                }
                for (tf, candles) in by_tf {
                    let id = SeriesId { instrument: series.instrument.clone(), timeframe: tf };
                    rows.push((id, candles));
                }
            } else if let Some(last) = last {
                written.insert(series.clone(), last);
            }
            if fed {
                next.push((series, agg));
            }
        }
        let derive =
            Derive::EachSeries { timeframes: self.timeframes.clone(), written, aggregated };
        Round { rows, derive, next, minutes: fresh, repeated }
    }

    /// The round committed: its series' aggregators move on, and its minutes are written.
    fn committed(
        &mut self,
        next: Vec<(SeriesId, DerivedAggregator)>,
        minutes: Vec<(SeriesId, Vec<i64>)>,
    ) {
        self.aggs.extend(next);
        for (series, opens) in minutes {
            let runs = self.written.entry(series).or_default();
            for t in opens {
                runs.insert(t);
            }
        }
    }
}

/// Writes one round — every series' minutes and the derived candles they complete, in one
/// transaction — and returns its rows and messages once it committed, to be published and
/// acknowledged (while the next round is written); a failed write leaves the round as it was,
/// to be written again.
async fn persist(
    round: &mut Pulled,
    derivers: &mut Derivers,
    writer: &CandleWriter,
    stats: &PersisterStats,
) -> Option<(Rows, Vec<Msg>)> {
    if round.by_series.is_empty() {
        return Some((Vec::new(), std::mem::take(&mut round.msgs)));
    }
    let by_series: BTreeMap<SeriesId, Vec<Candle>> =
        round.by_series.iter().map(|(s, c)| (s.clone(), c.values().copied().collect())).collect();
    let n: usize = by_series.values().map(Vec::len).sum();
    if tracing::enabled!(tracing::Level::DEBUG) {
        for (series, c) in &by_series {
            let (first, last) = (c[0].open_time, c[c.len() - 1].open_time);
            tracing::debug!(%series, n = c.len(), first, last, "persister: round");
        }
    }
    let Round { rows, derive, next, minutes, repeated } = derivers.round(by_series);
    let fresh: usize = minutes.iter().map(|(_, m)| m.len()).sum();
    let written = if rows.is_empty() {
        Ok(rows) // every minute was written already
    } else {
        commit_round(writer, rows, derive).await
    };
    match written {
        Ok(rows) => {
            tracing::debug!(
                n,
                fresh,
                repeated,
                messages = round.msgs.len(),
                "persister: round committed"
            );
            stats.candles.fetch_add(fresh as u64, Relaxed);
            stats.repeated.fetch_add((repeated + round.repeated) as u64, Relaxed);
            round.repeated = 0;
            stats.batches.fetch_add(1, Relaxed);
            derivers.committed(next, minutes);
            round.by_series.clear();
            Some((rows, std::mem::take(&mut round.msgs)))
        }
        Err(e) => {
            stats.write_failures.fetch_add(1, Relaxed);
            tracing::error!("persister: write failed: {}", report(&e));
            None
        }
    }
}

/// Rounds of at least this many rows are written as two transactions at once.
const SPLIT_ROWS: usize = 8_000;

/// Commits a round's rows: a large one as two transactions at once on two connections, each
/// holding whole instruments (an instrument's minutes and derived candles stay in one
/// transaction): one transaction's round trips leave PostgreSQL idle, the other's fill it
/// (measured: 84–93 k candles/s with derived, one transaction; 94–114 k, two). The round has committed
/// when both have; if one fails, the whole round is written again (upserts: the other half's
/// rows are written the same again).
async fn commit_round(
    writer: &CandleWriter,
    rows: Rows,
    derive: Derive,
) -> Result<Rows, StoreError> {
    let commit = |rows: Rows, derive: Derive| {
        let store = writer.store().clone();
        writer.commit(rows, derive, move |b| store.write(b))
    };
    let total: usize = rows.iter().map(|(_, c)| c.len()).sum();
    if total < SPLIT_ROWS {
        return commit(rows, derive).await;
    }
    // Each instrument's rows (its 1m row, then its derived rows) go to the lighter half.
    let (mut halves, mut sizes): ([Rows; 2], [usize; 2]) = Default::default();
    let mut side = 0;
    let mut last: Option<shared::protocol::InstrumentId> = None;
    for (series, candles) in rows {
        if last.as_ref() != Some(&series.instrument) {
            side = usize::from(sizes[1] < sizes[0]);
            last = Some(series.instrument.clone());
        }
        sizes[side] += candles.len();
        halves[side].push((series, candles));
    }
    let [a, b] = halves;
    if b.is_empty() {
        return commit(a, derive).await;
    }
    let (ra, rb) = tokio::join!(commit(a, derive.clone()), commit(b, derive));
    let mut rows = ra?;
    rows.extend(rb?);
    Ok(rows)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::bus::InProcessBus;
    use crate::store::sqlite::SqliteStore;
    use crate::store::CandleStore;
    use shared::candle::{merge, MINUTE_MS};
    use shared::fixed::{Price, Volume};

    fn minute(t: i64) -> Candle {
        let p = 1_000 + (t / MINUTE_MS) % 97;
        Candle::one_minute(t, Price(p), Price(p + 7), Price(p - 3), Price(p + 2), Volume(5), 2)
    }

    /// A fresh SQLite store in a directory of its own, and a writer on it.
    fn sqlite_writer(tag: &str) -> (std::path::PathBuf, Arc<dyn CandleStore>, CandleWriter) {
        let dir = std::env::temp_dir().join(format!("millrace-{tag}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        let store: Arc<dyn CandleStore> = Arc::new(SqliteStore::open(&dir.join("t.db")).unwrap());
        let writer = CandleWriter::new(store.clone(), Arc::new(InProcessBus::new(16)));
        (dir, store, writer)
    }

    /// Every derived candle of `m1`'s instrument stored equals the merge of its bucket's stored
    /// minutes, and every bucket ended by the newest stored minute is stored.
    fn derived_match(store: &dyn CandleStore, m1: &SeriesId, tfs: &[Timeframe], what: &str) {
        let stored = store.candles(m1, Some(0), None, 100_000).unwrap();
        let newest = stored.last().unwrap().open_time;
        for &tf in tfs {
            let series = SeriesId { instrument: m1.instrument.clone(), timeframe: tf };
            let derived = store.candles(&series, Some(0), None, 100_000).unwrap();
            let mut open = tf.bucket_open(stored[0].open_time);
            while open + tf.duration_ms() - MINUTE_MS <= newest {
                let inside: Vec<Candle> = stored
                    .iter()
                    .filter(|c| c.open_time >= open && c.open_time < open + tf.duration_ms())
                    .copied()
                    .collect();
                let want = merge(tf, &inside);
                let got = derived.iter().find(|c| c.open_time == open).copied();
                assert_eq!(got, want, "{what}: {series}, the bucket at {open}");
                open += tf.duration_ms();
            }
        }
    }

    /// A round large enough to be written as two transactions: every instrument's rows land
    /// (in one of them), and its derived candles are right.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_large_round_is_written_as_two_transactions_of_whole_instruments() {
        let (dir, store, writer) = sqlite_writer("split");
        let tfs = [Timeframe::M5, Timeframe::H1];
        let mut derivers = Derivers::new(&tfs);
        let ids: Vec<SeriesId> =
            (0..3).map(|i| format!("sim:spot:S{i}/USDT:1m").parse().unwrap()).collect();
        let t0 = 1_700_000_000_000_i64.div_euclid(3_600_000) * 3_600_000;
        for round in 0..2_i64 {
            let by_series: BTreeMap<SeriesId, Vec<Candle>> = ids
                .iter()
                .map(|id| {
                    let minutes = (round * 3_000..(round + 1) * 3_000)
                        .map(|m| minute(t0 + m * MINUTE_MS))
                        .collect();
                    (id.clone(), minutes)
                })
                .collect();
            let Round { rows, derive, next, minutes, .. } = derivers.round(by_series);
            let shape = |rows: &Rows| {
                let mut v: Vec<(String, usize)> =
                    rows.iter().map(|(s, c)| (s.to_string(), c.len())).collect();
                v.sort();
                v
            };
            let planned = shape(&rows);
            assert!(planned.iter().map(|(_, n)| n).sum::<usize>() >= SPLIT_ROWS);
            let written = commit_round(&writer, rows, derive).await.unwrap();
            // (a series' first round has its derived candles made in the write, from the store)
            let got = shape(&written);
            for (series, n) in &planned {
                assert!(got.iter().any(|(s, m)| s == series && m >= n), "round {round}: {series}");
            }
            derivers.committed(next, minutes);
            for id in &ids {
                let stored = store.candles(id, Some(0), None, 100_000).unwrap();
                assert_eq!(stored.len() as i64, (round + 1) * 3_000);
                derived_match(store.as_ref(), id, &tfs, &format!("round {round}"));
            }
        }
        let _ = std::fs::remove_dir_all(dir);
    }

    /// Rounds as a persister gets them after reconnects and failed writes: runs in order, minutes
    /// that never come, minutes that come late, rounds sent again. After every round each
    /// derived candle stored equals the merge of its bucket's stored minutes, and every bucket
    /// that has ended by the newest stored minute is stored.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn derived_candles_from_the_aggregators_equal_the_merge_of_the_stored_minutes() {
        let (dir, store, writer) = sqlite_writer("derivers");
        let tfs = [Timeframe::M3, Timeframe::M5, Timeframe::M15, Timeframe::H1];
        let mut derivers = Derivers::new(&tfs);
        let m1: SeriesId = "sim:spot:BTC/USDT:1m".parse().unwrap();
        let t0 = 1_700_000_000_000_i64.div_euclid(3_600_000) * 3_600_000 + 17 * MINUTE_MS;
        // a small deterministic generator (xorshift)
        let mut x = 0x9E37_79B9_7F4A_7C15_u64;
        let mut rnd = move |n: u64| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x % n
        };
        let (mut next, mut held_back, mut sent): (i64, Vec<i64>, Vec<i64>) = (0, vec![], vec![]);
        let (mut aggregated_rounds, mut repeated_minutes) = (0, 0);
        for round in 0..120 {
            let mut opens: Vec<i64> = Vec::new();
            for _ in 0..1 + rnd(12) {
                match rnd(10) {
                    0 => held_back.push(next), // comes late
                    1 => {}                    // never comes
                    _ => opens.push(next),
                }
                next += 1;
            }
            if rnd(4) == 0 && !held_back.is_empty() {
                opens.push(held_back.remove(0));
            }
            if rnd(8) == 0 && !sent.is_empty() {
                opens.push(sent[rnd(sent.len() as u64) as usize]); // a round sent again
            }
            opens.sort_unstable();
            opens.dedup();
            if opens.is_empty() {
                continue;
            }
            sent.extend(&opens);
            let minutes: Vec<Candle> = opens.iter().map(|i| minute(t0 + i * MINUTE_MS)).collect();
            if rnd(10) == 0 {
                derivers.clear(); // the lease moved: the next holder knows nothing
            }
            let Round { rows, derive, next: aggs, minutes, repeated } =
                derivers.round(BTreeMap::from([(m1.clone(), minutes)]));
            repeated_minutes += repeated;
            if let Derive::EachSeries { aggregated, .. } = &derive {
                aggregated_rounds += usize::from(!aggregated.is_empty());
            }
            if !rows.is_empty() {
                let s = store.clone();
                writer.write(rows, derive, move |b| s.write(b)).await.unwrap();
            }
            derivers.committed(aggs, minutes);

            derived_match(store.as_ref(), &m1, &tfs, &format!("round {round}"));
        }
        assert!(aggregated_rounds > 40, "most rounds followed the last: {aggregated_rounds}");
        assert!(repeated_minutes > 0, "rounds sent again were left out");
        let _ = std::fs::remove_dir_all(dir);
    }
}
