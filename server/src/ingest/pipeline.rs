//! The candle pipeline of one instrument (seed §§6-9): forming candles throttled and published
//! for live charts; closed 1m candles buffered ([`FlushBatch`]: 200 candles or 0.5 s), sorted and
//! de-duplicated, merged into every derived timeframe ([`DerivedAggregator`]), **persisted in one
//! transaction and only then published**.
//!
//! The pipeline is IO-light and connector-agnostic: the kline job feeds it candles from the
//! exchange stream and from REST gap fills, and calls [`CandlePipeline::tick`] on a timer.
//! A failed persist keeps the rows and retries them (nothing accepted is dropped, nothing is
//! published before it is stored); the job keeps ingesting meanwhile.

use std::sync::atomic::Ordering::Relaxed;
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use shared::candle::{merge, Candle, DerivedAggregator, FlushBatch, FlushConfig, Timeframe};
use shared::protocol::{InstrumentId, KlineEvent, KlinePayload, Push, SeriesId, Stream};

use super::supervisor::JobHealth;
use crate::bus::Bus;
use crate::config::IngestConfig;
use crate::store::{CandleStore, SeriesRows, StoreError};

/// The publishing side of a bus, object safe.
pub trait Publisher: Send + Sync + 'static {
    fn publish(&self, topic: &str, payload: Bytes) -> usize;
    fn has_subscribers(&self, topic: &str) -> bool;
}

impl<B: Bus> Publisher for B {
    fn publish(&self, topic: &str, payload: Bytes) -> usize {
        Bus::publish(self, topic, payload)
    }
    fn has_subscribers(&self, topic: &str) -> bool {
        self.subscriber_count(topic) > 0
    }
}

/// The `kline@{series}` push frame for `candle`.
pub fn kline_frame(series: &SeriesId, candle: &Candle, closed: bool, event_time: i64) -> Bytes {
    let tf = series.timeframe;
    let push = Push {
        stream: Stream::Kline(series.clone()),
        data: KlineEvent {
            e: "kline".into(),
            event_time,
            s: series.clone(),
            k: KlinePayload {
                t: candle.open_time,
                close_time: candle.open_time + tf.duration_ms() - 1,
                i: tf,
                o: candle.open,
                h: candle.high,
                l: candle.low,
                c: candle.close,
                v: candle.volume,
                n: candle.trades,
                x: closed,
            },
        },
    };
    Bytes::from(serde_json::to_vec(&push).expect("a kline push always serializes"))
}

/// Replaces every derived candle built from fewer minutes than its timeframe has (the job
/// started, or history arrived, in the middle of its bucket) by the merge of every 1m candle of
/// the bucket in the store and in this batch, so a derived candle is always the merge of the
/// stored minutes of its bucket, whoever stored them (live ingest or backfill).
fn complete_from_store(store: &dyn CandleStore, rows: &mut [(SeriesId, Vec<Candle>)]) -> Result<(), StoreError> {
    let Some(m1) = rows.iter().position(|(s, _)| s.timeframe == Timeframe::M1) else { return Ok(()) };
    let series_1m = rows[m1].0.clone();
    let batch_1m: std::collections::BTreeMap<i64, Candle> = rows[m1].1.iter().map(|c| (c.open_time, *c)).collect();
    for (series, candles) in rows.iter_mut() {
        let tf = series.timeframe;
        if tf == Timeframe::M1 {
            continue;
        }
        for c in candles.iter_mut().filter(|c| c.minutes < tf.minutes()) {
            let end = c.open_time + tf.duration_ms();
            let mut minutes: std::collections::BTreeMap<i64, Candle> = store
                .candles(&series_1m, Some(c.open_time), Some(end - shared::candle::MINUTE_MS), tf.minutes() as usize)?
                .into_iter()
                .map(|m| (m.open_time, m))
                .collect();
            minutes.extend(batch_1m.range(c.open_time..end).map(|(t, m)| (*t, *m)));
            let all: Vec<Candle> = minutes.into_values().collect();
            if let Some(m) = merge(tf, &all) {
                *c = m;
            }
        }
    }
    Ok(())
}

/// Publishes stored closed candles of `series` on `topic` (skipped when nobody listens). Call only
/// after the transaction holding them committed: persist, then publish.
pub fn publish_closed(bus: &dyn Publisher, topic: &str, series: &SeriesId, candles: &[Candle]) {
    if !bus.has_subscribers(topic) {
        return;
    }
    let d = series.timeframe.duration_ms();
    for c in candles {
        bus.publish(topic, kline_frame(series, c, true, c.open_time + d));
    }
}

/// One series the pipeline writes and publishes.
struct Out {
    tf: Timeframe,
    series: SeriesId,
    topic: String,
}

/// Rows persisted but not yet published, or waiting for a retry of the persist.
struct Pending {
    rows: Vec<(usize, Vec<Candle>)>,
}

/// The pipeline of one instrument.
pub struct CandlePipeline {
    outs: Vec<Out>,
    batch: FlushBatch,
    agg: DerivedAggregator,
    store: Arc<dyn CandleStore>,
    bus: Arc<dyn Publisher>,
    health: Arc<JobHealth>,
    forming: Option<(Candle, i64)>,
    forming_dirty: bool,
    forming_every: Duration,
    last_forming_publish: Option<Instant>,
    /// Newest closed 1m open time accepted (buffered, flushed or filled).
    last_closed: Option<i64>,
    pending: Option<Pending>,
    persist_retry: Duration,
    retry_at: Option<Instant>,
}

impl CandlePipeline {
    /// Opens the pipeline of `instrument`: reads the newest stored 1m candle (older ones are
    /// dropped as already emitted) and primes the derived aggregator with the stored 1m candles
    /// of the current day, so derived buckets in progress continue where they were.
    pub async fn open(
        instrument: &InstrumentId,
        config: &IngestConfig,
        store: Arc<dyn CandleStore>,
        bus: Arc<dyn Publisher>,
        health: Arc<JobHealth>,
        now_ms: i64,
    ) -> Result<Self, StoreError> {
        let series_1m = SeriesId { instrument: instrument.clone(), timeframe: Timeframe::M1 };
        let mut outs = vec![Out { tf: Timeframe::M1, topic: format!("kline@{series_1m}"), series: series_1m.clone() }];
        for &tf in &config.derived {
            let series = SeriesId { instrument: instrument.clone(), timeframe: tf };
            outs.push(Out { tf, topic: format!("kline@{series}"), series });
        }
        let mut agg = DerivedAggregator::new(&config.derived);
        let (last, primer) = {
            let store = store.clone();
            let s = series_1m.clone();
            let largest = config.derived.iter().map(|t| t.duration_ms()).max().unwrap_or(60_000);
            tokio::task::spawn_blocking(move || -> Result<_, StoreError> {
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
            .await
            .map_err(|e| StoreError::Db(format!("store task failed: {e}")))??
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
            store,
            bus,
            health,
            forming: None,
            forming_dirty: false,
            forming_every: Duration::from_millis(config.forming_min_interval_ms),
            last_forming_publish: None,
            last_closed: last,
            pending: None,
            persist_retry: Duration::from_millis(config.persist_retry_ms),
            retry_at: None,
        })
    }

    /// Newest closed 1m open time accepted so far (stored, buffered or being filled).
    pub fn last_closed(&self) -> Option<i64> {
        self.last_closed
    }

    /// Newest 1m open time persisted.
    pub fn last_persisted(&self) -> Option<i64> {
        self.batch.last_emitted()
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
        for out in &self.outs {
            if !self.bus.has_subscribers(&out.topic) {
                continue;
            }
            if let Some(c) = self.agg.forming(out.tf, Some(&f)) {
                self.bus.publish(&out.topic, kline_frame(&out.series, &c, false, event_time));
            }
        }
    }

    /// A closed 1m candle (from the stream or a REST fill). Flushes when the batch is full.
    pub async fn on_closed(&mut self, candle: Candle, now_ms: i64) {
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
        if self.batch.push(candle, now_ms) {
            self.flush(now_ms).await;
        }
    }

    /// Marks minutes up to `open_time` as accounted for (a REST fill found no candle for them).
    pub fn mark_filled_through(&mut self, open_time: i64) {
        if self.last_closed.is_none_or(|l| open_time > l) {
            self.last_closed = Some(open_time);
        }
    }

    /// Timer: flushes when due, retries a failed persist, publishes a throttled forming candle.
    pub async fn tick(&mut self, now_ms: i64, now: Instant) {
        if self.pending.is_some() && self.retry_at.is_none_or(|t| now >= t) {
            self.persist_pending().await;
        }
        if self.batch.is_due(now_ms) {
            self.flush(now_ms).await;
        }
        if self.forming_dirty
            && self.last_forming_publish.is_none_or(|t| now.duration_since(t) >= self.forming_every)
        {
            self.publish_forming(now);
        }
    }

    /// Flushes the buffer now: sort, de-dup, derive, persist, then publish.
    pub async fn flush(&mut self, now_ms: i64) {
        let closed = self.batch.flush(now_ms);
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
            let i = self.outs.iter().position(|o| o.tf == tf).expect("aggregator timeframes are ours");
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
        self.persist_pending().await;
    }

    async fn persist_pending(&mut self) {
        let Some(mut pending) = self.pending.take() else { return };
        let store = self.store.clone();
        let owned: Vec<(SeriesId, Vec<Candle>)> =
            pending.rows.iter().map(|(i, v)| (self.outs[*i].series.clone(), v.clone())).collect();
        let joined = tokio::task::spawn_blocking(move || {
            let mut owned = owned;
            let result = complete_from_store(store.as_ref(), &mut owned).and_then(|()| {
                let batch: Vec<SeriesRows<'_>> =
                    owned.iter().map(|(s, c)| SeriesRows { series: s, candles: c }).collect();
                store.write(&batch)
            });
            (result, owned)
        })
        .await;
        let result = match joined {
            Ok((result, owned)) => {
                for ((_, rows), (_, completed)) in pending.rows.iter_mut().zip(owned) {
                    *rows = completed;
                }
                result
            }
            Err(e) => Err(StoreError::Db(format!("store task failed: {e}"))),
        };
        match result {
            Ok(_) => {
                self.retry_at = None;
                self.health.persisted_batches.fetch_add(1, Relaxed);
                // Persisted: now, and only now, publish.
                for (i, candles) in &pending.rows {
                    let out = &self.outs[*i];
                    if let Some(last) = candles.last().filter(|_| *i == 0) {
                        self.health.last_closed_open_time.store(last.open_time, Relaxed);
                    }
                    publish_closed(self.bus.as_ref(), &out.topic, &out.series, candles);
                }
            }
            Err(e) => {
                self.health.persist_failures.fetch_add(1, Relaxed);
                self.health.error(format!("persist failed, will retry: {e}"));
                tracing::error!("persisting candles failed, retrying in {:?}: {e}", self.persist_retry);
                self.retry_at = Some(Instant::now() + self.persist_retry);
                self.pending = Some(pending);
            }
        }
    }

    /// Flushes everything buffered and tries hard to persist it (shutdown).
    pub async fn close(&mut self, now_ms: i64) {
        self.flush(now_ms).await;
        for _ in 0..5 {
            if self.pending.is_none() {
                return;
            }
            tokio::time::sleep(self.persist_retry).await;
            self.persist_pending().await;
        }
        if self.pending.is_some() {
            tracing::error!("shutting down with candles that could not be persisted");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::sqlite::SqliteStore;
    use shared::fixed::{Price, Volume};

    fn minute(t: i64, p: i64) -> Candle {
        Candle::one_minute(t, Price(p), Price(p + 5), Price(p - 5), Price(p + 1), Volume(10), 3)
    }

    #[test]
    fn partial_derived_candles_are_completed_from_stored_minutes() {
        let dir = std::env::temp_dir().join(format!("millrace-pipeline-{}", std::process::id()));
        let store = SqliteStore::open(&dir.join("t.db")).unwrap();
        let m1: SeriesId = "sim:spot:BTC/USDT:1m".parse().unwrap();
        let m5: SeriesId = "sim:spot:BTC/USDT:5m".parse().unwrap();
        let t0 = 1_700_000_100_000_i64.div_euclid(300_000) * 300_000;
        // Minutes 0-2 of the bucket were stored earlier (e.g. by backfill) ...
        let early: Vec<Candle> = (0..3).map(|i| minute(t0 + i * 60_000, 100 + i)).collect();
        store.write(&[SeriesRows { series: &m1, candles: &early }]).unwrap();
        // ... the live job saw only minutes 3-4, so its 5m candle has minutes = 2.
        let late: Vec<Candle> = (3..5).map(|i| minute(t0 + i * 60_000, 100 + i)).collect();
        let partial = merge(Timeframe::M5, &late).unwrap();
        assert_eq!(partial.minutes, 2);
        let mut rows = vec![(m1.clone(), late.clone()), (m5.clone(), vec![partial])];
        complete_from_store(&store, &mut rows).unwrap();
        let all: Vec<Candle> = early.iter().chain(&late).copied().collect();
        assert_eq!(rows[1].1, vec![merge(Timeframe::M5, &all).unwrap()]);
        assert_eq!(rows[1].1[0].minutes, 5);
        // A complete candle is left alone.
        let full = merge(Timeframe::M5, &all).unwrap();
        let mut rows = vec![(m1, vec![]), (m5, vec![full])];
        complete_from_store(&store, &mut rows).unwrap();
        assert_eq!(rows[1].1, vec![full]);
        let _ = std::fs::remove_dir_all(dir);
    }
}
