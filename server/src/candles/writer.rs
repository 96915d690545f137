//! [`CandleWriter`]: the one way closed candles reach the store and then the bus, for live
//! ingest (the pipeline) and for backfill alike.
//!
//! - **Derived = merge of stored minutes.** A derived candle is written as the merge of every 1m
//!   candle of its bucket that is stored or in the same write (`merge_from`), whoever
//!   stored the minutes (live ingest, a gap fill, backfill), so a derived series never disagrees
//!   with its 1m series.
//! - **One transaction.** The 1m candles and every derived candle they change are committed
//!   together (with backfill's coverage record, when the caller commits through it), so a crash
//!   never leaves them out of step.
//! - **Persist, then publish.** The candles reach the bus only after the commit returned.
//! - **One writer of a series at a time.** The merge reads the stored minutes before the
//!   transaction writes: two writes of one series at once (live ingest and backfill meeting in
//!   a bucket, or a gap fill) could each miss the other's minutes and leave a derived candle
//!   short. A write holds its 1m series ([`SeriesLocks`]) from the read to the commit; writes
//!   of other series go on in parallel. Across processes the cluster has one writer (the
//!   persister lease's holder, which also runs backfill).
//!
//! The store is blocking: the write runs on a blocking thread.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Arc, Condvar, Mutex};

use bytes::Bytes;
use futures_util::future::BoxFuture;
use shared::candle::{try_merge, Candle, Timeframe, MINUTE_MS};
use shared::protocol::{InstrumentId, KlineEvent, KlinePayload, Push, SeriesId, Stream};

use crate::bus::Bus;
use crate::lock::lock;
use crate::store::{CandleStore, SeriesRows, StoreError};

/// How the derived candles of a write are made.
#[derive(Debug, Clone)]
pub enum Derive {
    /// Live ingest: the derived candles come with the write (the pipeline's aggregator made
    /// them); one built from fewer minutes than its timeframe has (the job started, or history
    /// arrived, in the middle of its bucket) is replaced by the merge of its bucket.
    CompletePartial,
    /// Backfill: the derived candle of every bucket of `timeframes` that the 1m range
    /// `[lo, hi]` touches and that has ended by the minute `newest`.
    Buckets { timeframes: Vec<Timeframe>, lo: i64, hi: i64, newest: i64 },
    /// The cluster's persister, writing many instruments' closed minutes at once. A 1m series
    /// in `aggregated` comes with the derived candles the persister's aggregator closed (rows
    /// of the same instrument after it; its minutes followed those it wrote before): those
    /// built from fewer minutes than their timeframe has are completed from the store, as
    /// `CompletePartial` does. Every other 1m series (the first write of a series by this
    /// holder of the lease, or one with a late minute) gets `Buckets` over its own minutes
    /// (`lo`, `hi` = `newest` = its first and last), widened to the newest minute of that
    /// series written before (`written`, or else the newest stored): a bucket that ended in
    /// between (its last minute never came) is written, and a late minute (a gap filled after
    /// a reconnect, a round written again after a failure) rewrites the ended bucket it
    /// belongs to.
    EachSeries {
        timeframes: Vec<Timeframe>,
        written: BTreeMap<SeriesId, i64>,
        aggregated: BTreeSet<SeriesId>,
    },
}

/// Rows of one write: the 1m series first, then derived series.
pub type Rows = Vec<(SeriesId, Vec<Candle>)>;

/// Where a kline job's closed candles go: the plug point of the candle flow. The service's is
/// the [`CandleWriter`] (stored, then published); a layer around the service plugs in another
/// (a cluster worker hands them to the cluster, whose persister stores and publishes them).
/// `Ok` means the candles are durably taken: the job counts them as persisted.
pub trait ClosedSink: Send + Sync + 'static {
    /// Takes one write's rows (the 1m row first, then the derived rows the aggregator made),
    /// completed as `derive` says; returns them as taken.
    fn take(&self, rows: Rows, derive: Derive) -> BoxFuture<'static, Result<Rows, StoreError>>;
}

/// Where a kline job reads where to resume, publishes its forming candles and sends its closed
/// ones (see [`ClosedSink`]).
#[derive(Clone)]
pub struct CandleOut {
    /// Read at start: the newest stored minute, the derived aggregator's primer.
    pub store: Arc<dyn CandleStore>,
    /// Forming candles.
    pub bus: Arc<dyn Bus>,
    pub closed: Arc<dyn ClosedSink>,
}

impl From<CandleWriter> for CandleOut {
    /// The service's: the writer's store and bus, closed candles stored then published.
    fn from(w: CandleWriter) -> Self {
        CandleOut { store: w.store.clone(), bus: w.bus.clone(), closed: Arc::new(w) }
    }
}

impl ClosedSink for CandleWriter {
    fn take(&self, rows: Rows, derive: Derive) -> BoxFuture<'static, Result<Rows, StoreError>> {
        let writer = self.clone();
        Box::pin(async move {
            let store = writer.store.clone();
            writer.write(rows, derive, move |batch| store.write(batch)).await
        })
    }
}

/// Writes closed candles, then publishes them (see the module docs). Cheap to clone.
#[derive(Clone)]
pub struct CandleWriter {
    store: Arc<dyn CandleStore>,
    bus: Arc<dyn Bus>,
    locks: Arc<SeriesLocks>,
}

impl CandleWriter {
    pub fn new(store: Arc<dyn CandleStore>, bus: Arc<dyn Bus>) -> Self {
        Self { store, bus, locks: Arc::default() }
    }

    pub fn store(&self) -> &Arc<dyn CandleStore> {
        &self.store
    }

    pub fn bus(&self) -> &Arc<dyn Bus> {
        &self.bus
    }

    /// Completes `rows` (1m first) as `derive` says, commits them through `commit` in one
    /// transaction, then publishes them. Returns the rows as written.
    pub async fn write<C>(&self, rows: Rows, derive: Derive, commit: C) -> Result<Rows, StoreError>
    where
        C: FnOnce(&[SeriesRows<'_>]) -> Result<usize, StoreError> + Send + 'static,
    {
        let rows = self.commit(rows, derive, commit).await?;
        self.publish(&rows);
        Ok(rows)
    }

    /// Publishes committed rows (the second half of [`CandleWriter::write`], for a caller that
    /// publishes one write while it commits the next: the cluster's persister).
    pub fn publish(&self, rows: &Rows) {
        for (series, candles) in rows {
            publish_closed(self.bus.as_ref(), series, candles);
        }
    }

    /// [`CandleWriter::write`] without the publication: the rows once committed, for
    /// [`CandleWriter::publish`].
    pub async fn commit<C>(&self, rows: Rows, derive: Derive, commit: C) -> Result<Rows, StoreError>
    where
        C: FnOnce(&[SeriesRows<'_>]) -> Result<usize, StoreError> + Send + 'static,
    {
        let (store, locks) = (self.store.clone(), self.locks.clone());
        let rows = crate::store::blocking(move || {
            let mut rows = rows;
            let _held = locks.hold(
                rows.iter().filter(|(s, _)| s.timeframe == Timeframe::M1).map(|(s, _)| s.clone()),
            );
            complete(store.as_ref(), &mut rows, &derive)?;
            let batch: Vec<SeriesRows<'_>> =
                rows.iter().map(|(s, c)| SeriesRows { series: s, candles: c }).collect();
            commit(&batch)?;
            Ok(rows)
        })
        .await?;
        // Committed: now, and only now, may they be published.
        Ok(rows)
    }
}

/// The 1m series being written by this process's [`CandleWriter`]s (see the module docs).
#[derive(Debug, Default)]
pub struct SeriesLocks {
    held: Mutex<BTreeSet<SeriesId>>,
    released: Condvar,
}

impl SeriesLocks {
    /// Waits until none of `series` is held, then holds them all until the guard is dropped
    /// (all at once, so two writes of overlapping sets never wait for each other in a circle).
    /// Blocking.
    pub fn hold(&self, series: impl IntoIterator<Item = SeriesId>) -> SeriesHold<'_> {
        let series: BTreeSet<SeriesId> = series.into_iter().collect();
        let mut held = lock(&self.held);
        while series.iter().any(|s| held.contains(s)) {
            held = crate::lock::wait(&self.released, held);
        }
        held.extend(series.iter().cloned());
        SeriesHold { locks: self, series }
    }
}

/// Series held by [`SeriesLocks::hold`].
pub struct SeriesHold<'a> {
    locks: &'a SeriesLocks,
    series: BTreeSet<SeriesId>,
}

impl Drop for SeriesHold<'_> {
    fn drop(&mut self) {
        let mut held = lock(&self.locks.held);
        for s in &self.series {
            held.remove(s);
        }
        drop(held);
        self.locks.released.notify_all();
    }
}

/// Applies `derive` to `rows` (blocking: reads the store, once for all series of the write).
fn complete(store: &dyn CandleStore, rows: &mut Rows, derive: &Derive) -> Result<(), StoreError> {
    let plans: Vec<Plan> = match derive {
        Derive::EachSeries { timeframes, written, aggregated } => {
            let m1: Vec<(SeriesId, Vec<Candle>)> = rows
                .iter()
                .filter(|(s, c)| s.timeframe == Timeframe::M1 && !c.is_empty())
                .cloned()
                .collect();
            // The newest minute written before of each series merged from the store: known to
            // this writer, or else the store's (one read for all).
            let unknown: Vec<SeriesId> = m1
                .iter()
                .map(|(s, _)| s)
                .filter(|s| !aggregated.contains(*s) && !written.contains_key(*s))
                .cloned()
                .collect();
            let stored_newest: BTreeMap<SeriesId, Option<i64>> =
                unknown.iter().cloned().zip(store.last_open_times(&unknown)?).collect();
            // each instrument's derived rows, found in one pass (a round has thousands)
            let mut derived_of: BTreeMap<&InstrumentId, Vec<usize>> = BTreeMap::new();
            for (r, (s, _)) in rows.iter().enumerate() {
                if s.timeframe != Timeframe::M1 {
                    derived_of.entry(&s.instrument).or_default().push(r);
                }
            }
            m1.into_iter()
                .map(|(series_1m, minutes)| {
                    if aggregated.contains(&series_1m) {
                        let derived = derived_of.get(&series_1m.instrument);
                        let derived = derived.map_or(&[][..], Vec::as_slice);
                        return Plan::partial(rows, derived, series_1m, minutes);
                    }
                    let (first, last) =
                        (minutes[0].open_time, minutes[minutes.len() - 1].open_time);
                    let before = written
                        .get(&series_1m)
                        .copied()
                        .or_else(|| stored_newest.get(&series_1m).copied().flatten());
                    let (lo, hi) = match before {
                        Some(before) => (first.min(before + MINUTE_MS), last.max(before)),
                        None => (first, last),
                    };
                    let span = Span { lo, hi, newest: hi, before };
                    Plan::ended(series_1m, minutes, timeframes, span)
                })
                .collect()
        }
        _ => {
            let Some((series_1m, minutes)) =
                rows.first().filter(|(s, _)| s.timeframe == Timeframe::M1).cloned()
            else {
                return Ok(());
            };
            match derive {
                Derive::Buckets { timeframes, lo, hi, newest } => {
                    let span = Span { lo: *lo, hi: *hi, newest: *newest, before: None };
                    vec![Plan::ended(series_1m, minutes, timeframes, span)]
                }
                _ => {
                    let derived: Vec<usize> = (1..rows.len())
                        .filter(|&r| {
                            rows[r].0.instrument == series_1m.instrument
                                && rows[r].0.timeframe != Timeframe::M1
                        })
                        .collect();
                    vec![Plan::partial(rows, &derived, series_1m, minutes)]
                }
            }
        }
    };
    let ranges: Vec<(SeriesId, i64, i64)> = plans
        .iter()
        .flat_map(|p| p.ranges.iter().map(|&(first, end)| (p.series_1m.clone(), first, end)))
        .collect();
    let mut stored = store.candles_in(&ranges)?.into_iter();
    for plan in plans {
        if plan.ranges.is_empty() {
            continue;
        }
        let mut all: BTreeMap<i64, Candle> = BTreeMap::new();
        for &(first, end) in &plan.ranges {
            all.extend(stored.next().unwrap_or_default().into_iter().map(|c| (c.open_time, c)));
            all.extend(
                plan.minutes
                    .iter()
                    .filter(|c| c.open_time >= first && c.open_time <= end)
                    .map(|c| (c.open_time, *c)),
            );
        }
        match plan.need {
            Need::Ended(opens) => {
                for (tf, opens) in opens {
                    let series =
                        SeriesId { instrument: plan.series_1m.instrument.clone(), timeframe: tf };
                    rows.push((series, merge_from(&all, tf, &opens)));
                }
            }
            Need::Partial(at) => {
                for (r, i) in at {
                    let tf = rows[r].0.timeframe;
                    let c = &mut rows[r].1[i];
                    if let Some(m) = merge_from(&all, tf, &[c.open_time]).pop() {
                        *c = m;
                    }
                }
            }
        }
    }
    Ok(())
}

/// What the derived candles of one 1m series of a write need from the store.
struct Plan {
    series_1m: SeriesId,
    /// Its minutes in the write (they win over stored ones).
    minutes: Vec<Candle>,
    need: Need,
    /// The stored minutes to read: disjoint ranges `[first, end]`, ascending (one per run of
    /// adjacent buckets).
    ranges: Vec<(i64, i64)>,
}

enum Need {
    /// The candles of the buckets opening at these times are appended to the write, each the
    /// merge of its bucket's minutes.
    Ended(Vec<(Timeframe, Vec<i64>)>),
    /// The candles at these places of the write (row, index) were built from fewer minutes than
    /// their timeframe has: each is replaced by the merge of its bucket's minutes.
    Partial(Vec<(usize, usize)>),
}

impl Plan {
    /// Every bucket of `timeframes` that holds a minute of the write, one of the span's ends
    /// (`lo`, `hi`) or the newest minute written before (`before`: its bucket may have ended
    /// since without its last minute), and that has ended by the span's newest minute. Any
    /// other bucket holds no minute of this write and was written when its minutes were, so
    /// its candle cannot change: the walk is bounded by the write's own minutes, whatever times
    /// they carry.
    fn ended(
        series_1m: SeriesId,
        minutes: Vec<Candle>,
        timeframes: &[Timeframe],
        span: Span,
    ) -> Plan {
        let Span { lo, hi, newest, before } = span;
        let mut opens_of = Vec::with_capacity(timeframes.len());
        let mut buckets: Vec<(i64, i64)> = Vec::new();
        for &tf in timeframes {
            let mut opens: Vec<i64> = minutes
                .iter()
                .map(|c| c.open_time)
                .chain([lo, hi])
                .chain(before)
                .map(|t| tf.bucket_open(t))
                .filter(|&open| open + tf.duration_ms() - MINUTE_MS <= newest)
                .collect();
            opens.sort_unstable();
            opens.dedup();
            buckets.extend(opens.iter().map(|&o| (o, o + tf.duration_ms() - MINUTE_MS)));
            opens_of.push((tf, opens));
        }
        Plan { series_1m, minutes, need: Need::Ended(opens_of), ranges: merge_ranges(buckets) }
    }

    /// The candles of `series_1m`'s instrument in `rows` (but its 1m) built from fewer minutes
    /// than their timeframe has.
    /// `derived`: the indices in `rows` of the instrument's derived rows.
    fn partial(rows: &Rows, derived: &[usize], series_1m: SeriesId, minutes: Vec<Candle>) -> Plan {
        let mut at = Vec::new();
        let mut buckets = Vec::new();
        for &r in derived {
            let (s, candles) = &rows[r];
            let tf = s.timeframe;
            for (i, c) in candles.iter().enumerate().filter(|(_, c)| c.minutes < tf.minutes()) {
                at.push((r, i));
                buckets.push((c.open_time, c.open_time + tf.duration_ms() - MINUTE_MS));
            }
        }
        Plan { series_1m, minutes, need: Need::Partial(at), ranges: merge_ranges(buckets) }
    }
}

/// `ranges` (`[first, end]` of 1m open times) as disjoint ranges, ascending: overlapping and
/// adjacent ones merged.
fn merge_ranges(mut ranges: Vec<(i64, i64)>) -> Vec<(i64, i64)> {
    ranges.sort_unstable();
    let mut out: Vec<(i64, i64)> = Vec::with_capacity(ranges.len());
    for (first, end) in ranges {
        match out.last_mut() {
            Some(last) if first <= last.1.saturating_add(MINUTE_MS) => last.1 = last.1.max(end),
            _ => out.push((first, end)),
        }
    }
    out
}

/// A 1m range `[lo, hi]`, the newest minute known to have closed, and the newest minute of
/// the series written before this write, if known.
#[derive(Debug, Clone, Copy)]
struct Span {
    lo: i64,
    hi: i64,
    newest: i64,
    before: Option<i64>,
}

/// The `tf` candles of the buckets opening at `opens` (ascending), each the merge of every 1m
/// candle of its bucket in `all`. A bucket without any minute has no candle.
fn merge_from(all: &BTreeMap<i64, Candle>, tf: Timeframe, opens: &[i64]) -> Vec<Candle> {
    opens
        .iter()
        .filter_map(|&open| {
            let inside: Vec<Candle> =
                all.range(open..open + tf.duration_ms()).map(|(_, c)| *c).collect();
            // Stored and incoming 1m candles passed `Candle::check`, so their sums fit; a bucket
            // whose sum would not is left out, never written wrapped.
            try_merge(tf, &inside).unwrap_or_else(|e| {
                tracing::warn!("derived {tf} candle at {open} not written: {e}");
                None
            })
        })
        .collect()
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

/// Publishes stored closed candles of `series` (skipped when nobody listens). Call only after the
/// transaction holding them committed: persist, then publish.
fn publish_closed(bus: &dyn Bus, series: &SeriesId, candles: &[Candle]) {
    let topic = Stream::Kline(series.clone()).to_string();
    if candles.is_empty() || !bus.has_subscribers(&topic) {
        return;
    }
    let d = series.timeframe.duration_ms();
    let frames = candles.iter().map(|c| kline_frame(series, c, true, c.open_time + d)).collect();
    bus.publish_all(&topic, frames);
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::sqlite::SqliteStore;
    use shared::candle::merge;
    use shared::fixed::{Price, Volume};

    fn minute(t: i64, p: i64) -> Candle {
        Candle::one_minute(t, Price(p), Price(p + 5), Price(p - 5), Price(p + 1), Volume(10), 3)
    }

    #[test]
    fn partial_derived_candles_are_completed_from_stored_minutes() {
        let dir = std::env::temp_dir().join(format!("millrace-writer-{}", std::process::id()));
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
        complete(&store, &mut rows, &Derive::CompletePartial).unwrap();
        let all: Vec<Candle> = early.iter().chain(&late).copied().collect();
        let full = merge(Timeframe::M5, &all).unwrap();
        assert_eq!(rows[1].1, vec![full]);
        assert_eq!(rows[1].1[0].minutes, 5);
        // A complete candle is left alone.
        let mut rows = vec![(m1.clone(), vec![]), (m5.clone(), vec![full])];
        complete(&store, &mut rows, &Derive::CompletePartial).unwrap();
        assert_eq!(rows[1].1, vec![full]);
        // Backfill: every ended bucket the page touches, from stored + page minutes; the bucket
        // still open at `newest` is left out.
        let page: Vec<Candle> = (5..8).map(|i| minute(t0 + i * 60_000, 100 + i)).collect();
        let mut rows = vec![(m1, page.clone())];
        let derive = Derive::Buckets {
            timeframes: vec![Timeframe::M5],
            lo: t0 + 3 * 60_000,
            hi: t0 + 7 * 60_000,
            newest: t0 + 8 * 60_000,
        };
        complete(&store, &mut rows, &derive).unwrap();
        assert_eq!(rows[1].0, m5);
        assert_eq!(
            rows[1].1,
            vec![merge(Timeframe::M5, &early).unwrap()],
            "minutes 3-4 are not stored yet"
        );
        let _ = std::fs::remove_dir_all(dir);
    }

    #[test]
    fn a_write_waits_for_the_other_writer_of_its_series_only() {
        use std::sync::atomic::{AtomicBool, Ordering::SeqCst};
        let locks = Arc::new(SeriesLocks::default());
        let (btc, eth): (SeriesId, SeriesId) =
            ("sim:spot:BTC/USDT:1m".parse().unwrap(), "sim:spot:ETH/USDT:1m".parse().unwrap());
        let first = locks.hold([btc.clone()]);
        // Another series goes on at once.
        drop(locks.hold([eth.clone()]));
        // A write that includes the held series waits until the first is done.
        let done = Arc::new(AtomicBool::new(false));
        let waiter = {
            let (locks, done, both) = (locks.clone(), done.clone(), [eth, btc]);
            std::thread::spawn(move || {
                let _held = locks.hold(both);
                done.store(true, SeqCst);
            })
        };
        std::thread::sleep(std::time::Duration::from_millis(100));
        assert!(!done.load(SeqCst), "it waits while BTC is being written");
        drop(first);
        waiter.join().unwrap();
        assert!(done.load(SeqCst));
        assert!(lock(&locks.held).is_empty(), "everything released");
    }

    #[test]
    fn the_persister_writes_a_bucket_whose_last_minute_never_came_and_rewrites_one_a_late_minute_joins(
    ) {
        let dir = std::env::temp_dir().join(format!("millrace-writer-late-{}", std::process::id()));
        let store = SqliteStore::open(&dir.join("t.db")).unwrap();
        let m1: SeriesId = "sim:spot:ETH/USDT:1m".parse().unwrap();
        let m5: SeriesId = "sim:spot:ETH/USDT:5m".parse().unwrap();
        let t0 = 1_700_000_100_000_i64.div_euclid(300_000) * 300_000;
        let at = |i: i64| minute(t0 + i * 60_000, 100 + i);
        let each = |written: &[(SeriesId, i64)]| Derive::EachSeries {
            timeframes: vec![Timeframe::M5],
            written: written.iter().cloned().collect(),
            aggregated: BTreeSet::new(),
        };
        let m5_of = |rows: &Rows| rows.iter().find(|(s, _)| *s == m5).map(|(_, c)| c.clone());
        // Minutes 0-2 written; 3 is late and 4 never comes; the next write starts at 5.
        let early: Vec<Candle> = (0..3).map(at).collect();
        store.write(&[SeriesRows { series: &m1, candles: &early }]).unwrap();
        // The bucket that ended between the writes is written from its stored minutes, whether
        // the writer knows what it wrote before or reads the store's newest minute.
        for known in [vec![(m1.clone(), t0 + 2 * 60_000)], vec![]] {
            let mut rows = vec![(m1.clone(), vec![at(5)])];
            complete(&store, &mut rows, &each(&known)).unwrap();
            assert_eq!(m5_of(&rows), Some(vec![merge(Timeframe::M5, &early).unwrap()]));
        }
        store.write(&[SeriesRows { series: &m1, candles: &[at(5)] }]).unwrap();
        // Minute 3 arrives late (a gap fill), after minute 5 was written: its ended bucket is
        // written again with it.
        let all: Vec<Candle> = (0..4).map(at).collect();
        for known in [vec![(m1.clone(), t0 + 5 * 60_000)], vec![]] {
            let mut rows = vec![(m1.clone(), vec![at(3)])];
            complete(&store, &mut rows, &each(&known)).unwrap();
            assert_eq!(m5_of(&rows), Some(vec![merge(Timeframe::M5, &all).unwrap()]));
        }
        // Without either (a write of the first minutes of a series), only its own buckets.
        let fresh: SeriesId = "sim:spot:SOL/USDT:1m".parse().unwrap();
        let mut rows = vec![(fresh, vec![at(5)])];
        complete(&store, &mut rows, &each(&[])).unwrap();
        assert!(rows.iter().skip(1).all(|(_, c)| c.is_empty()), "no derived candle: {rows:?}");
        let _ = std::fs::remove_dir_all(dir);
    }

    /// The walk over buckets is bounded by the write's own minutes: minutes ten years apart
    /// (or at the ends of time, the out-of-memory batch of a forged bus message) plan a few
    /// buckets per timeframe and read a few ranges, never every bucket in between.
    #[test]
    fn a_plan_walks_the_buckets_of_its_minutes_not_the_time_between_them() {
        let m1: SeriesId = "sim:spot:BTC/USDT:1m".parse().unwrap();
        let tfs = [Timeframe::M3, Timeframe::M5, Timeframe::H1, Timeframe::D1];
        let ten_years = 10 * 365 * 86_400_000_i64;
        for (first, last) in [(0, ten_years), (0, (1 << 53) / MINUTE_MS * MINUTE_MS)] {
            let minutes = vec![minute(first, 100), minute(last, 100)];
            let span = Span { lo: first, hi: last, newest: last, before: None };
            let plan = Plan::ended(m1.clone(), minutes, &tfs, span);
            let Need::Ended(opens) = &plan.need else { panic!("ended") };
            for (tf, opens) in opens {
                assert!(opens.len() <= 2, "{tf}: {} buckets", opens.len());
            }
            assert!(plan.ranges.len() <= 2, "{:?}", plan.ranges);
        }
        // the newest minute written before has its bucket planned too (it may have ended since)
        let before = 1_700_000_100_000 / 300_000 * 300_000 + 60_000;
        let late = before - 30 * MINUTE_MS;
        let span = Span {
            lo: late,
            hi: before + 20 * MINUTE_MS,
            newest: before + 20 * MINUTE_MS,
            before: Some(before),
        };
        let plan = Plan::ended(
            m1,
            vec![minute(late, 1), minute(before + 20 * MINUTE_MS, 1)],
            &[Timeframe::M5],
            span,
        );
        let Need::Ended(opens) = &plan.need else { panic!("ended") };
        assert!(opens[0].1.contains(&Timeframe::M5.bucket_open(before)), "{opens:?}");
        assert_eq!(
            merge_ranges(vec![(0, 10), (60_010, 70_000), (5, 20), (200_000, 200_000)]),
            vec![(0, 70_000), (200_000, 200_000)]
        );
    }
}
