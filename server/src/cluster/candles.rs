//! Closed candles in a cluster: workers → JetStream → the persister → PostgreSQL → the bus.
//!
//! - The stream `{prefix}_candles` (file storage, work-queue retention) takes every closed 1m
//!   candle a worker's kline task produces, one message per candle on
//!   `{prefix}.candles.{series}`, with `Nats-Msg-Id` = (series, open time)
//!   ([`ClosedCandle::msg_id`]): the replicas of a task publish the same candles and the stream
//!   keeps one of each within `cluster.dedup_window_s`. A worker's pipeline counts a candle as
//!   accepted when JetStream acknowledged it (stored on disk), like the single process counts
//!   a commit.
//! - The persister ([`Persister`]) consumes it through the durable pull consumer
//!   `persister`, shared by every persister; only the holder of the `persister` lease pulls, so
//!   one process writes at a time (a derived candle is the merge of its bucket's stored minutes,
//!   which two concurrent writers of a series could each read incomplete). It pulls rounds of
//!   up to `BATCH_MAX` messages, writes a round's minutes of every series and the derived
//!   candles they complete in one transaction through the one [`CandleWriter`] (which publishes
//!   them after the commit) while the next round is pulled, and acknowledges the round's
//!   messages only after the commit (while the next round is written). A round is what is
//!   waiting, fetched at once; only when nothing is waiting does a pull request wait (at most
//!   `PULL_WAIT`) — a request that expired while the server was still sending a full round
//!   left the client waiting seconds for its end. A failed write is negatively acknowledged
//!   with a delay and comes back; a persister killed before acknowledging leaves its messages to be
//!   redelivered to the next lease holder after `ack_wait`. Writes are idempotent upserts, and
//!   the bus's kline de-dup drops a redelivered batch's second publication.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::Arc;
use std::time::Duration;

use async_nats::jetstream::{self, consumer::pull, consumer::AckPolicy, stream, AckKind};
use bytes::Bytes;
use futures_util::future::BoxFuture;
use futures_util::StreamExt as _;
use shared::candle::{Candle, Timeframe};
use shared::cluster::payload::ClosedCandle;
use shared::protocol::SeriesId;

use super::config::ClusterConfig;
use super::lease::RoleLease;
use super::Subjects;
use crate::candles::writer::{CandleWriter, Derive, ForwardClosed};
use crate::error::report;
use crate::shutdown::Shutdown;
use crate::store::StoreError;

/// The durable consumer every persister shares.
pub const CONSUMER: &str = "persister";

/// Most messages a persister writes in one round.
pub const BATCH_MAX: usize = 20_000;

/// How long one pull request waits for messages: what a closed candle may wait, at most, before
/// it is written (when fewer than `BATCH_MAX` are waiting); an idle persister pulls this often.
const PULL_WAIT: Duration = Duration::from_millis(250);

/// How long a message may stay unacknowledged before JetStream redelivers it.
const ACK_WAIT: Duration = Duration::from_secs(30);

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
    pub published: AtomicU64,
    /// Candles JetStream already had (another replica sent them first).
    pub duplicates: AtomicU64,
    pub failures: AtomicU64,
}

/// A worker's [`ForwardClosed`]: closed 1m candles onto the candle stream.
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

impl ForwardClosed for JetStreamForward {
    fn forward(
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
            // Publish them all, then wait for the acknowledgements (pipelined).
            let mut acks = Vec::with_capacity(candles.len());
            for candle in candles {
                let msg = ClosedCandle { series: series.clone(), candle };
                let mut headers = async_nats::HeaderMap::new();
                headers.insert("Nats-Msg-Id", msg.msg_id().as_str());
                let body = Bytes::from(serde_json::to_vec(&msg).expect("serialisable"));
                let ack = js
                    .publish_with_headers(subject.clone(), headers, body)
                    .await
                    .map_err(|e| fail(&e))?;
                acks.push(ack);
            }
            for ack in acks {
                let ack = ack.await.map_err(|e| fail(&e))?;
                if ack.duplicate {
                    stats.duplicates.fetch_add(1, Relaxed);
                } else {
                    stats.published.fetch_add(1, Relaxed);
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
    /// Messages that were not a closed candle (terminated, never redelivered).
    pub malformed: AtomicU64,
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
}

impl Persister {
    /// Runs until `shutdown`.
    pub async fn run(self, shutdown: Shutdown) -> Result<(), PersisterError> {
        let Persister { client, subjects, cluster, derived, writer, id, stats, leading } = self;
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
        // The round being written, the next one (pulled meanwhile), and the last one written
        // (acknowledged meanwhile).
        let (mut current, mut ahead, mut written): (Vec<Msg>, Vec<Msg>, Vec<Msg>) =
            (Vec::new(), Vec::new(), Vec::new());
        // The newest minute written of each series while holding the lease (see
        // `Derive::EachSeries`; without it the store's newest is read); forgotten when the
        // lease is, as another node writes then.
        let mut newest_written: BTreeMap<SeriesId, i64> = BTreeMap::new();
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
                // What was written is acknowledged; what was pulled goes back at once, for the
                // new holder.
                ack_all(std::mem::take(&mut written)).await;
                newest_written.clear();
                for m in current.drain(..) {
                    let _ = m.ack_with(AckKind::Nak(None)).await;
                }
                tokio::select! {
                    () = tokio::time::sleep_until(next_keep) => {}
                    () = shutdown.stopping() => break,
                }
                continue;
            }
            if current.is_empty() {
                let (pulled, ()) = tokio::join!(
                    pull(&consumer, &mut current),
                    ack_all(std::mem::take(&mut written))
                );
                if let Err(e) = pulled {
                    pull_failed(&e, &stats, retry, &shutdown).await;
                }
                continue;
            }
            // Write this round while the next one is pulled and the last one acknowledged.
            let (done, pulled, ()) = tokio::join!(
                persist(&mut current, &derived, &writer, &mut newest_written, &stats, retry),
                pull(&consumer, &mut ahead),
                ack_all(std::mem::take(&mut written))
            );
            written = done;
            if let Err(e) = pulled {
                pull_failed(&e, &stats, retry, &shutdown).await;
            }
            std::mem::swap(&mut current, &mut ahead);
        }
        ack_all(written).await;
        for m in current.drain(..) {
            let _ = m.ack_with(AckKind::Nak(None)).await;
        }
        leading.send_replace(false);
        lease.release().await;
        Ok(())
    }
}

/// Pulls one round into `batch`.
async fn pull(
    consumer: &jetstream::consumer::Consumer<pull::Config>,
    batch: &mut Vec<Msg>,
) -> Result<(), async_nats::Error> {
    // What is waiting, at once (no expiry: a request that expires while the server is still
    // sending a full round can leave the client waiting seconds for its end).
    let mut messages = consumer.fetch().max_messages(BATCH_MAX).messages().await?;
    while let Some(m) = messages.next().await {
        batch.push(m?);
    }
    if !batch.is_empty() {
        return Ok(());
    }
    // Nothing waiting: wait for the next messages, at most `PULL_WAIT`.
    let mut messages =
        consumer.batch().max_messages(BATCH_MAX).expires(PULL_WAIT).messages().await?;
    while let Some(m) = messages.next().await {
        batch.push(m?);
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

/// Writes one round — every series' minutes and the derived candles they complete, in one
/// transaction — and returns its messages once it committed, to be acknowledged (while the next
/// round is written); a failed write sends them back after `retry` (written again then: upserts
/// are idempotent).
async fn persist(
    batch: &mut Vec<Msg>,
    derived: &[Timeframe],
    writer: &CandleWriter,
    newest_written: &mut BTreeMap<SeriesId, i64>,
    stats: &PersisterStats,
    retry: Duration,
) -> Vec<Msg> {
    let mut by_series: BTreeMap<SeriesId, BTreeMap<i64, Candle>> = BTreeMap::new();
    let mut msgs = Vec::with_capacity(batch.len());
    for m in batch.drain(..) {
        if m.info().is_ok_and(|i| i.delivered > 1) {
            stats.redelivered.fetch_add(1, Relaxed);
        }
        match serde_json::from_slice::<ClosedCandle>(&m.payload) {
            Ok(c) if c.series.timeframe == Timeframe::M1 && c.candle.check().is_ok() => {
                by_series.entry(c.series).or_default().insert(c.candle.open_time, c.candle);
                msgs.push(m);
            }
            _ => {
                stats.malformed.fetch_add(1, Relaxed);
                tracing::warn!(subject = %m.subject, "persister: not a closed 1m candle, dropped");
                let _ = m.ack_with(AckKind::Term).await;
            }
        }
    }
    if by_series.is_empty() {
        return Vec::new();
    }
    let rows: Vec<(SeriesId, Vec<Candle>)> =
        by_series.into_iter().map(|(s, c)| (s, c.into_values().collect())).collect();
    let n: usize = rows.iter().map(|(_, c)| c.len()).sum();
    let store = writer.store().clone();
    let written: BTreeMap<SeriesId, i64> =
        rows.iter().filter_map(|(s, _)| newest_written.get(s).map(|&t| (s.clone(), t))).collect();
    let newest: Vec<(SeriesId, i64)> =
        rows.iter().map(|(s, c)| (s.clone(), c[c.len() - 1].open_time)).collect();
    let derive = Derive::EachSeries { timeframes: derived.to_vec(), written };
    if tracing::enabled!(tracing::Level::DEBUG) {
        for (series, c) in &rows {
            let (first, last) = (c[0].open_time, c[c.len() - 1].open_time);
            tracing::debug!(%series, n = c.len(), first, last, "persister: round");
        }
    }
    match writer.write(rows, derive, move |b| store.write(b)).await {
        Ok(_) => {
            tracing::debug!(n, messages = msgs.len(), "persister: round committed");
            stats.candles.fetch_add(n as u64, Relaxed);
            stats.batches.fetch_add(1, Relaxed);
            for (series, t) in newest {
                let e = newest_written.entry(series).or_insert(t);
                *e = (*e).max(t);
            }
            msgs
        }
        Err(e) => {
            stats.write_failures.fetch_add(1, Relaxed);
            tracing::error!("persister: write failed, will retry: {}", report(&e));
            for m in msgs {
                let _ = m.ack_with(AckKind::Nak(Some(retry))).await;
            }
            Vec::new()
        }
    }
}
