//! [`SseReplay`]: the Shanghai tick-by-tick files (逐笔委托 + 逐笔成交) replayed as live
//! [`FeedEvent`] batches, at the original pace (by MDTime), faster, or as fast as possible.
//!
//! The rows are read and normalised by [`replay::sse::load`] (the same parsing as
//! `millrace replay sse`): per channel in ApplSeqNum order without repeated numbers, channels
//! merged by time. A channel carries several securities, so one security's numbers have holes:
//! consumers sequence them with `SeqPolicy::Increasing`.

use std::path::Path;
use std::sync::atomic::Ordering::Relaxed;
use std::sync::mpsc::SyncSender;
use std::sync::Arc;
use std::time::{Duration, Instant};

use shared::l3::{SeqPolicy, Venue};
use shared::protocol::{InstrumentId, Market};
use shared::Price;
use tokio_util::sync::CancellationToken;

use replay::sse::{load, Loaded};
use tbt::FeedEvent;

use super::engine::{EngineHandle, TickEvent};
use super::feed::{tick_event, L3Output};
use super::FeedCounters;
use crate::books::BookRegistry;
use crate::config::ReplaySourceConfig;

/// Most events per batch.
const MAX_BATCH: usize = 4096;

/// A day of Shanghai tick-by-tick data, loaded and ready to be replayed.
pub struct SseReplay {
    loaded: Loaded,
}

impl SseReplay {
    pub fn load(orders: &Path, trades: &Path, tick: Price) -> anyhow::Result<Self> {
        Ok(Self { loaded: load(orders, trades, tick)? })
    }

    /// SecurityIDs; a [`FeedEvent::symbol`] indexes this list.
    pub fn symbols(&self) -> &[String] {
        &self.loaded.symbols
    }

    /// Events that will be sent.
    pub fn len(&self) -> usize {
        self.loaded.events.len()
    }

    pub fn is_empty(&self) -> bool {
        self.loaded.events.is_empty()
    }

    /// Rows in the files per symbol (before repeated sequence numbers were dropped).
    pub fn rows(&self) -> &[u64] {
        &self.loaded.rows
    }

    /// Rows dropped as repeated channel sequence numbers.
    pub fn duplicates(&self) -> u64 {
        self.loaded.duplicates
    }

    /// Sends every event to `sink` in batches: paced so that MDTime advances `speed` times as fast
    /// as the wall clock (`speed` 1 = the original pace), or as fast as the sink takes them when
    /// `speed` is 0. Stops early when `stopped()` says so or `sink` returns false. Returns the
    /// events sent.
    pub fn run(
        &self,
        speed: f64,
        stopped: impl Fn() -> bool,
        mut sink: impl FnMut(Vec<FeedEvent>) -> bool,
    ) -> usize {
        let events = &self.loaded.events;
        let Some(first) = events.first() else { return 0 };
        let t0 = first.time_ms;
        let start = Instant::now();
        let mut sent = 0;
        let mut i = 0;
        while i < events.len() {
            if stopped() {
                break;
            }
            // events due by now (all of them when unpaced), up to a batch
            let due_ms = if speed > 0.0 {
                start.elapsed().as_secs_f64() * 1000.0 * speed
            } else {
                f64::INFINITY
            };
            let mut j = i;
            while j < events.len()
                && j - i < MAX_BATCH
                && f64::from(events[j].time_ms.saturating_sub(t0)) <= due_ms
            {
                j += 1;
            }
            if j == i {
                // nothing due yet: sleep until the next event is (at most 50 ms, to notice `stop`)
                let next_ms = f64::from(events[i].time_ms.saturating_sub(t0)) / speed;
                let wait = (next_ms - start.elapsed().as_secs_f64() * 1000.0).clamp(0.1, 50.0);
                std::thread::sleep(Duration::from_secs_f64(wait / 1000.0));
                continue;
            }
            let batch: Vec<FeedEvent> = events[i..j]
                .iter()
                .map(|e| FeedEvent { symbol: e.symbol, channel: e.channel, seq: e.seq, msg: e.msg })
                .collect();
            sent += batch.len();
            i = j;
            if !sink(batch) {
                break;
            }
        }
        sent
    }
}

/// Replays a recorded day into the engine (see [`ReplaySourceConfig`]).
pub(super) struct ReplayThread {
    pub config: ReplaySourceConfig,
    pub engine: EngineHandle,
    pub registry: Arc<BookRegistry>,
    pub tx: SyncSender<Vec<TickEvent>>,
    pub counters: Arc<FeedCounters>,
}

impl ReplayThread {
    /// Replays until the end of the files or until `stop` is cancelled.
    pub(super) fn run(self, stop: &CancellationToken) {
        let c = &self.config;
        let tick = Price::parse(&c.tick).unwrap_or(Price::from_raw(1_000_000));
        let replay = match SseReplay::load(&c.orders, &c.trades, tick) {
            Ok(r) => r,
            Err(e) => {
                tracing::error!(error = format!("{e:#}"), "cannot load the tick-by-tick replay");
                return;
            }
        };
        let mut idx = Vec::with_capacity(replay.symbols().len());
        for code in replay.symbols() {
            let instrument = InstrumentId::new(c.name.clone(), Market::Stock, code.clone());
            let output = L3Output::new(&self.registry, &instrument, Venue::Sse, None);
            match self.engine.add_symbol(
                instrument.clone(),
                Venue::Sse,
                SeqPolicy::Increasing,
                Box::new(output),
            ) {
                Ok(i) => idx.push(i),
                Err(e) => {
                    tracing::error!(%instrument, error = %e, "cannot register a replayed book");
                    return;
                }
            }
            self.registry.set_always_on(&instrument);
        }
        tracing::info!(
            symbols = idx.len(),
            events = replay.len(),
            speed = c.speed,
            "tick-by-tick replay started"
        );
        let sent = replay.run(
            c.speed,
            || stop.is_cancelled(),
            |batch| {
                self.counters.events.fetch_add(batch.len() as u64, Relaxed);
                let events = batch.iter().map(|e| tick_event(idx[e.symbol as usize], e)).collect();
                self.tx.send(events).is_ok()
            },
        );
        self.counters.done.store(sent == replay.len(), Relaxed);
        tracing::info!(sent, "tick-by-tick replay ended");
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::path::PathBuf;

    fn data() -> PathBuf {
        replay::input::testdata_dir().join("sse-tick-by-tick")
    }

    fn day() -> SseReplay {
        let d = data();
        SseReplay::load(
            &d.join("SHorders.zip"),
            &d.join("SHtrans.zip"),
            Price::parse("0.01").unwrap(),
        )
        .unwrap()
    }

    /// Every row of the real files is sent once (less the repeated numbers), per channel in
    /// increasing sequence order, in time order overall.
    #[test]
    fn sends_every_row_in_channel_order() {
        let r = day();
        assert_eq!(r.symbols().len(), 5);
        let rows: u64 = r.rows().iter().sum();
        assert_eq!(rows, 149_359 + 109_616, "the data README's row counts");
        let mut got = Vec::new();
        let sent = r.run(
            0.0,
            || false,
            |b| {
                got.extend(b);
                true
            },
        );
        assert_eq!(sent as u64, rows - r.duplicates());
        assert_eq!(got.len(), sent);
        let mut per_symbol = [0u64; 5];
        let mut last_seq = std::collections::HashMap::new();
        for e in &got {
            per_symbol[e.symbol as usize] += 1;
            let prev = last_seq.insert(e.channel, e.seq);
            assert!(prev.is_none_or(|p| p < e.seq), "channel {} goes back at {}", e.channel, e.seq);
        }
        let dup_free: u64 = per_symbol.iter().sum();
        assert_eq!(dup_free + r.duplicates(), rows);
        for (i, n) in per_symbol.iter().enumerate() {
            assert!(*n > 1000, "{}: {n} events", r.symbols()[i]);
        }
    }

    /// At speed 600 the first 30 seconds of MDTime take about 50 ms of wall time.
    #[test]
    fn paced_replay_follows_the_clock() {
        let r = day();
        let t0 = r.loaded.events[0].time_ms;
        let start = Instant::now();
        let mut n = 0usize;
        let sent = r.run(
            600.0,
            || false,
            |b| {
                n += b.len();
                // stop once 30 s of exchange time have been sent
                r.loaded.events[n - 1].time_ms.saturating_sub(t0) < 30_000
            },
        );
        let took = start.elapsed();
        assert!(sent > 0);
        assert!(took >= Duration::from_millis(40), "too fast for the pace: {took:?}");
        assert!(took < Duration::from_secs(5), "far too slow: {took:?}");
    }
}
