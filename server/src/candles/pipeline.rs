//! The candle pipeline of one instrument (seed §§6-9): forming candles throttled and published
//! for live charts; closed 1m candles buffered ([`FlushBatch`]: 200 candles or 0.5 s), sorted and
//! de-duplicated, merged into every derived timeframe ([`DerivedAggregator`]), **persisted in one
//! transaction and only then published**.
//!
//! The pipeline is IO-light and connector-agnostic: the kline job feeds it candles from the
//! exchange stream and from REST gap fills, and calls [`CandlePipeline::tick`] on a timer.
//! A failed persist keeps the rows and retries them after a back-off (`persist_retry_ms` doubling
//! to `persist_retry_cap_ms`; nothing accepted is dropped, nothing is published before it is
//! stored); the job keeps ingesting meanwhile, up to
//! `max_pending_candles` closed 1m candles waiting ([`CandlePipeline::is_backlogged`]): then the
//! kline job stops taking candles from the exchange until the store has taken the waiting ones,
//! and fetches what closed meanwhile from REST (the exchange keeps it), so the buffer stays
//! bounded and nothing is lost.

use std::sync::atomic::Ordering::Relaxed;
use std::sync::Arc;
use std::time::{Duration, Instant};

use shared::backoff::Backoff;
use shared::candle::{Candle, DerivedAggregator, FlushBatch, FlushConfig, Timeframe};
use shared::protocol::{InstrumentId, SeriesId, Stream};

use super::writer::{kline_frame, CandleOut, Derive, Rows};
use crate::clock::Now;
use crate::config::IngestConfig;
use crate::error::report;
use crate::jitter::Jitter;
use crate::jobs::JobHealth;
use crate::store::{blocking, StoreError};

/// One series the pipeline writes and publishes.
struct Out {
    tf: Timeframe,
    series: SeriesId,
    topic: String,
}

/// Rows waiting for a retry of their persist, by index into `outs` (the 1m series first).
struct Pending {
    rows: Vec<(usize, Vec<Candle>)>,
}

/// The pipeline of one instrument.
pub struct CandlePipeline {
    outs: Vec<Out>,
    batch: FlushBatch,
    agg: DerivedAggregator,
    /// Where it resumes from, and where its candles go.
    out: CandleOut,
    health: Arc<JobHealth>,
    forming: Option<(Candle, i64)>,
    forming_dirty: bool,
    forming_every: Duration,
    last_forming_publish: Option<Instant>,
    /// Newest closed 1m open time accepted (buffered, flushed or filled).
    last_closed: Option<i64>,
    pending: Option<Pending>,
    /// Retries of a failed persist: `persist_retry_ms` doubling to `persist_retry_cap_ms`,
    /// reset by a persist that succeeds.
    persist_retry: Backoff,
    jitter: Jitter,
    retry_at: Option<Instant>,
    /// The back-off after a failed persist, started by the next time the pipeline is given
    /// (the attempt may have waited on the store for seconds: the delay counts from its end).
    retry_delay: Option<Duration>,
    /// Most closed 1m candles waiting (buffered or failed to persist) before the job pauses.
    max_pending: usize,
}

impl CandlePipeline {
    /// Opens the pipeline of `instrument`: reads the newest stored 1m candle (older ones are
    /// dropped as already emitted) and primes the derived aggregator with the stored 1m candles
    /// of the current day, so derived buckets in progress continue where they were.
    pub async fn open(
        instrument: &InstrumentId,
        config: &IngestConfig,
        output: CandleOut,
        health: Arc<JobHealth>,
        now_ms: i64,
    ) -> Result<Self, StoreError> {
        let out = |tf| {
            let series = SeriesId { instrument: instrument.clone(), timeframe: tf };
            Out { tf, topic: Stream::Kline(series.clone()).to_string(), series }
        };
        let outs: Vec<Out> =
            std::iter::once(Timeframe::M1).chain(config.derived.iter().copied()).map(out).collect();
        let series_1m = outs[0].series.clone();
        let mut agg = DerivedAggregator::new(&config.derived);
        let (last, primer) = {
            let store = output.store.clone();
            let s = series_1m;
            let largest = config.derived.iter().map(|t| t.duration_ms()).max().unwrap_or(60_000);
            blocking(move || {
                let last = store.last_open_time(&s)?;
                let primer = match last {
                    Some(last) => {
                        let from = last - last.rem_euclid(largest);
                        store.candles(&s, Some(from), Some(last), 100_000)?
                    }
                    None => Vec::new(),
                };
                Ok((last, primer))
            })
            .await?
        };
        if !primer.is_empty() {
            // Their derived candles were stored with them; only the aggregator state matters.
            let mut discard = Vec::new();
            let mut from = 0;
            while let Err((i, _)) = agg.push_closed_1m_batch(&primer[from..], &mut discard) {
                from += i + 1;
            }
        }
        if let Some(t) = last {
            health.last_closed_open_time.store(t, Relaxed);
        }
        let flush = FlushConfig { batch_max: config.batch_max, flush_ms: config.flush_ms as i64 };
        Ok(Self {
            outs,
            batch: FlushBatch::new(flush, now_ms).with_last_emitted(last),
            agg,
            out: output,
            health,
            forming: None,
            forming_dirty: false,
            forming_every: Duration::from_millis(config.forming_min_interval_ms),
            last_forming_publish: None,
            last_closed: last,
            pending: None,
            persist_retry: Backoff::new(
                Duration::from_millis(config.persist_retry_ms),
                Duration::from_millis(config.persist_retry_cap_ms),
            ),
            jitter: Jitter::new(&instrument.to_string()),
            retry_at: None,
            retry_delay: None,
            max_pending: config.max_pending_candles,
        })
    }

    /// [`Self::open`] for a kline job: a failure is the job's crash and is retried with
    /// `backoff`; `None` when the job is stopped meanwhile.
    pub async fn open_for_job(
        ctx: &crate::jobs::supervisor::JobContext,
        config: &IngestConfig,
        output: &CandleOut,
        backoff: &mut shared::backoff::Backoff,
        jitter: &mut crate::jitter::Jitter,
    ) -> Option<Self> {
        loop {
            let now = crate::clock::wall_clock_ms();
            match Self::open(&ctx.instrument, config, output.clone(), ctx.health.clone(), now).await
            {
                Ok(p) => return Some(p),
                Err(e) => {
                    let e = crate::error::report(&e);
                    ctx.health.crash(format_args!("cannot open the candle pipeline: {e}"));
                    if ctx.sleep(backoff.next_delay(jitter.draw())).await {
                        return None;
                    }
                }
            }
        }
    }

    /// Newest closed 1m open time accepted so far (stored, buffered or being filled).
    pub fn last_closed(&self) -> Option<i64> {
        self.last_closed
    }

    /// Newest 1m open time persisted.
    pub fn last_persisted(&self) -> Option<i64> {
        self.batch.last_emitted()
    }

    /// Closed 1m candles accepted and not yet stored: buffered, or waiting for a retry of a
    /// failed persist.
    pub fn waiting(&self) -> usize {
        let failed = self
            .pending
            .as_ref()
            .and_then(|p| p.rows.iter().find(|(i, _)| *i == 0))
            .map_or(0, |(_, v)| v.len());
        failed + self.batch.len()
    }

    /// Whether the store has failed and `max_pending_candles` candles wait for it: the job must
    /// take no more until [`CandlePipeline::store_failing`] is over.
    pub fn is_backlogged(&self) -> bool {
        self.pending.is_some() && self.waiting() >= self.max_pending
    }

    /// Whether a failed persist waits for its retry.
    pub fn store_failing(&self) -> bool {
        self.pending.is_some()
    }

    /// A forming (not final) 1m candle from the exchange. Published at most every
    /// `forming_min_interval_ms` (leading edge now, trailing edge from [`CandlePipeline::tick`]).
    pub fn on_forming(&mut self, candle: Candle, event_time: i64, now: Instant) {
        if self.last_closed.is_some_and(|l| candle.open_time <= l) {
            return; // stale: its minute already closed
        }
        self.forming = Some((candle, event_time));
        self.forming_dirty = true;
        if self.last_forming_publish.is_none_or(|t| now.duration_since(t) >= self.forming_every) {
            self.publish_forming(now);
        }
    }

    fn publish_forming(&mut self, now: Instant) {
        let Some((f, event_time)) = self.forming else { return };
        self.forming_dirty = false;
        self.last_forming_publish = Some(now);
        let bus = &self.out.bus;
        for out in &self.outs {
            if !bus.has_subscribers(&out.topic) {
                continue;
            }
            if let Some(c) = self.agg.forming(out.tf, Some(&f)) {
                bus.publish(&out.topic, kline_frame(&out.series, &c, false, event_time));
            }
        }
    }

    /// A closed 1m candle (from the stream or a REST fill). Flushes when the batch is full.
    pub async fn on_closed(&mut self, candle: Candle, now: Now) {
        if let Err(e) = candle.check() {
            self.health.malformed.fetch_add(1, Relaxed);
            tracing::warn!(open_time = candle.open_time, "dropping an invalid closed candle: {e}");
            return;
        }
        if self.batch.last_emitted().is_some_and(|l| candle.open_time <= l) {
            return; // already stored: a duplicate
        }
        self.health.closed_candles.fetch_add(1, Relaxed);
        if self.last_closed.is_none_or(|l| candle.open_time > l) {
            self.last_closed = Some(candle.open_time);
        }
        if self.forming.is_some_and(|(f, _)| f.open_time <= candle.open_time) {
            self.forming = None;
        }
        if self.batch.push(candle, now.ms) {
            self.flush(now).await;
        }
    }

    /// Marks minutes up to `open_time` as accounted for (a REST fill found no candle for them).
    pub fn mark_filled_through(&mut self, open_time: i64) {
        if self.last_closed.is_none_or(|l| open_time > l) {
            self.last_closed = Some(open_time);
        }
    }

    /// Timer: flushes when due, retries a failed persist, publishes a throttled forming candle.
    pub async fn tick(&mut self, now: Now) {
        if self.pending.is_some() && self.retry_due(now.at) {
            self.persist_pending().await;
        }
        if self.batch.is_due(now.ms) {
            self.flush(now).await;
        }
        if self.forming_dirty
            && self
                .last_forming_publish
                .is_none_or(|t| now.at.duration_since(t) >= self.forming_every)
        {
            self.publish_forming(now.at);
        }
    }

    /// Flushes the buffer now: sort, de-dup, derive, persist, then publish.
    pub async fn flush(&mut self, now: Now) {
        let closed = self.batch.flush(now.ms);
        if closed.is_empty() {
            return;
        }
        let mut rows: Vec<(usize, Vec<Candle>)> = vec![(0, closed)];
        let mut derived = Vec::new();
        let mut from = 0;
        while let Err((i, e)) = self.agg.push_closed_1m_batch(&rows[0].1[from..], &mut derived) {
            // The batch is sorted and newer than anything persisted, so a rejection means the
            // aggregator saw the minute before (primed from the store): skip it and go on.
            tracing::debug!("derived aggregation skipped a candle: {e}");
            from += i + 1;
        }
        for (tf, c) in derived.into_iter().filter(|(tf, _)| *tf != Timeframe::M1) {
            let i =
                self.outs.iter().position(|o| o.tf == tf).expect("aggregator timeframes are ours");
            match rows.iter_mut().find(|(j, _)| *j == i) {
                Some((_, v)) => v.push(c),
                None => rows.push((i, vec![c])),
            }
        }
        match self.pending.as_mut() {
            // An earlier batch is still waiting for the store: keep order, append.
            Some(p) => {
                for (i, v) in rows {
                    match p.rows.iter_mut().find(|(j, _)| *j == i) {
                        Some((_, pv)) => pv.extend(v),
                        None => p.rows.push((i, v)),
                    }
                }
            }
            None => self.pending = Some(Pending { rows }),
        }
        // While the store fails, the rows wait for the scheduled retry (`tick`): the job goes on
        // taking candles in between instead of waiting on the store at every flush.
        if self.retry_due(now.at) {
            self.persist_pending().await;
        }
    }

    /// Whether a persist may be tried at `now`: none failed, or the back-off since the failure
    /// has passed (it starts at the first `now` given after the failure).
    fn retry_due(&mut self, now: Instant) -> bool {
        if let Some(delay) = self.retry_delay.take() {
            self.retry_at = Some(now + delay);
        }
        self.retry_at.is_none_or(|t| now >= t)
    }

    /// Persists the pending rows; on failure the next attempt waits a back-off delay.
    async fn persist_pending(&mut self) {
        let Some(pending) = self.pending.take() else { return };
        let rows: Rows =
            pending.rows.iter().map(|(i, v)| (self.outs[*i].series.clone(), v.clone())).collect();
        match self.out.closed.take(rows, Derive::CompletePartial).await {
            Ok(written) => {
                self.retry_at = None;
                self.retry_delay = None;
                self.persist_retry.reset();
                self.health.persisted_batches.fetch_add(1, Relaxed);
                if let Some(last) = written.first().and_then(|(_, m1)| m1.last()) {
                    self.health.last_closed_open_time.store(last.open_time, Relaxed);
                }
            }
            Err(e) => {
                let e = report(&e);
                self.health.persist_failures.fetch_add(1, Relaxed);
                let delay = self.persist_retry.next_delay(self.jitter.draw());
                tracing::error!("persisting candles failed, retrying in {delay:?}: {e}");
                self.retry_delay = Some(delay);
                self.pending = Some(pending);
                let paused = if self.is_backlogged() {
                    "; ingest paused until the store takes them (ingest.max_pending_candles)"
                } else {
                    ""
                };
                let waiting = self.waiting();
                self.health.error(format_args!(
                    "persist failed, will retry ({waiting} closed candles wait): {e}{paused}"
                ));
            }
        }
    }

    /// Flushes everything buffered and tries hard to persist it (shutdown).
    pub async fn close(&mut self, now: Now) {
        self.flush(now).await;
        for _ in 0..5 {
            if self.pending.is_none() {
                return;
            }
            tokio::time::sleep(self.persist_retry.base).await;
            self.persist_pending().await;
        }
        if self.pending.is_some() {
            tracing::error!("shutting down with candles that could not be persisted");
        }
    }
}

#[cfg(test)]
mod tests {
    use shared::{Price, Volume};

    use super::*;
    use crate::bus::{Bus, InProcessBus};
    use crate::candles::writer::CandleWriter;
    use crate::store::sqlite::SqliteStore;
    use crate::store::CandleStore;

    fn forming(open_time: i64, close: i64) -> Candle {
        let p = Price::from_raw(close);
        Candle {
            open_time,
            open: p,
            high: p,
            low: p,
            close: p,
            volume: Volume::from_raw(1),
            trades: 1,
            minutes: 1,
        }
    }

    /// Seed §6: a forming candle is published at most every `forming_min_interval_ms` (250 ms):
    /// the first update at once (leading edge), the newest one after the interval (trailing
    /// edge, from `tick`), never more often, and the last state is never lost.
    #[tokio::test]
    async fn forming_candles_are_published_at_most_every_250_ms_and_the_newest_always() {
        let dir = std::env::temp_dir().join(format!("millrace-forming-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        let store: Arc<dyn CandleStore> = Arc::new(SqliteStore::open(&dir.join("t.db")).unwrap());
        let bus = Arc::new(InProcessBus::new(1024));
        let config = IngestConfig { derived: vec![], ..IngestConfig::default() };
        assert_eq!(config.forming_min_interval_ms, 250);
        let instrument: InstrumentId = "sim:spot:BTC/USDT".parse().unwrap();
        let writer = CandleWriter::new(store, bus.clone());
        let health = Arc::new(JobHealth::default());
        let mut pipeline =
            CandlePipeline::open(&instrument, &config, writer.into(), health, 0).await.unwrap();
        let mut sub = bus.subscribe("kline@sim:spot:BTC/USDT:1m");

        // 100 updates of one forming minute, 10 ms apart, with the job's tick between them
        let t0 = Instant::now();
        let mut published = Vec::new();
        for i in 0..100i64 {
            let now = t0 + Duration::from_millis(10 * i as u64);
            pipeline.on_forming(forming(60_000, 1_000 + i), 60_000 + 10 * i, now);
            pipeline.tick(Now { ms: 60_000 + 10 * i, at: now }).await;
            while let Ok(Some(m)) = sub.try_recv() {
                published.push((10 * i, m.payload));
            }
        }
        // the trailing edge: the newest update goes out once its interval has passed
        pipeline.tick(Now { ms: 61_000, at: t0 + Duration::from_millis(1_000) }).await;
        while let Ok(Some(m)) = sub.try_recv() {
            published.push((1_000, m.payload));
        }
        let at: Vec<i64> = published.iter().map(|(t, _)| *t).collect();
        assert_eq!(at, [0, 250, 500, 750, 1_000], "publication times (ms)");
        let last: serde_json::Value = serde_json::from_slice(&published[4].1).unwrap();
        assert_eq!(last["data"]["k"]["c"], Price::from_raw(1_099).to_string(), "{last}");
        let _ = std::fs::remove_dir_all(&dir);
    }
}
