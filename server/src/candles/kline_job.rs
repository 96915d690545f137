//! The kline job: the data plane of one instrument (seed §§6-10). It keeps one upstream
//! connection to `<symbol>@kline_1m` over the Binance protocol (real Binance or the simulator) and
//! feeds the [`CandlePipeline`].
//!
//! **No holes, no duplicates.** Whenever the stream might have missed something — on every
//! (re)connect, and whenever a closed minute arrives that does not directly follow the last one
//! accepted (a skipped or lost message) — the missing closed 1m candles are fetched from REST
//! (`/api/v3/klines`, paged, only rows whose close time is before the exchange's clock) and
//! pushed into the pipeline **before** the stream's newer candles, so the stored series stays
//! contiguous. Duplicates (a re-sent or re-fetched minute) are dropped by the flush batch.
//!
//! **Reconnects** back off from `reconnect_base_ms` (seed: 2 s), doubling to a cap, with
//! jitter; a connection that stayed healthy resets the back-off. A connection silent for
//! `stall_timeout_ms` is treated as dead. Binance closes connections after 24 h: after
//! `planned_reconnect_after_s` the job opens the new connection first and only then drops the
//! old one, and the REST fill covers anything in between, so a planned reconnect leaves no gap.
//!
//! **An exchange clock behind the store** (a restarted simulator whose clock started before the
//! candles an earlier, faster run stored) closes no new candle until it catches up; the job
//! reports it in its health (`/healthz` degraded, naming the job), a metric and a log line.

use std::sync::atomic::Ordering::Relaxed;
use std::sync::Arc;
use std::time::{Duration, Instant};

use shared::candle::{Candle, Timeframe, MINUTE_MS};

use binance::rest::{RestClient, RestError};
use binance::stream::{connect_with, Connection, StreamConfig, StreamError};
use binance::wire::{StreamEvent, StreamKind, StreamName};
use shared::backoff::Backoff;

use super::pipeline::CandlePipeline;
use super::writer::CandleOut;
use crate::clock::{wall_clock_ms as now_ms, Now};
use crate::config::{Config, IngestConfig};
use crate::jitter::Jitter;
use crate::jobs::supervisor::{JobFuture, JobRunner};
use crate::jobs::{JobContext, JobHealth};
use crate::sources::{ResolveError, Sources};
use shared::protocol::{InstrumentId, SeriesId};

/// Most rows per REST kline request (Binance's maximum).
const REST_PAGE: u16 = 1000;

/// Everything a kline job needs besides its [`JobContext`].
#[derive(Clone)]
pub struct KlineJobDeps {
    pub config: IngestConfig,
    pub rest: Arc<RestClient>,
    pub ws_base: String,
    /// The Binance symbol (`BTCUSDT`).
    pub symbol: String,
    /// Where it resumes from and where its candles go.
    pub out: CandleOut,
    /// How far back (by the exchange's clock) a gap fill reaches at most; `None`: to the last
    /// stored minute, however old. A cluster worker's closed candles older than the cluster
    /// accepts from the bus (`cluster.bus_retention_s`) would be refused, so its fills stop
    /// there: older history is backfill's.
    pub gap_fill_max_age_ms: Option<i64>,
    /// The source's recording, if it is recorded: every frame of the job's connections.
    pub recording: Option<crate::recording::Tap>,
}

/// Starts kline jobs for a [`crate::jobs::Supervisor`] (the service's, or a cluster worker's
/// whose closed candles go to the cluster).
pub struct KlineRunner {
    config: IngestConfig,
    sources: Arc<Sources>,
    out: CandleOut,
    gap_fill_max_age_ms: Option<i64>,
}

impl KlineRunner {
    pub fn new(config: &Config, sources: Arc<Sources>, out: impl Into<CandleOut>) -> Self {
        let out = out.into();
        KlineRunner { config: config.ingest.clone(), sources, out, gap_fill_max_age_ms: None }
    }

    /// Gap fills reach back at most `max_age_ms` (see [`KlineJobDeps::gap_fill_max_age_ms`]).
    pub fn gap_fill_within(mut self, max_age_ms: i64) -> Self {
        self.gap_fill_max_age_ms = Some(max_age_ms);
        self
    }
}

impl JobRunner for KlineRunner {
    fn validate(&self, series: &SeriesId) -> Result<(), ResolveError> {
        self.sources.validate_series(series)
    }

    fn validate_instrument(&self, instrument: &InstrumentId) -> Result<(), ResolveError> {
        if let Some(v) = self.sources.venue(&instrument.exchange) {
            return v.listing(instrument).map(|_| ());
        }
        self.sources.resolve(instrument).map(|_| ())
    }

    fn run(&self, ctx: JobContext) -> JobFuture {
        let sources = self.sources.clone();
        let config = self.config.clone();
        let out = self.out.clone();
        let gap_fill_max_age_ms = self.gap_fill_max_age_ms;
        if let Some(venue) = sources.venue(&ctx.instrument.exchange).cloned() {
            // another venue's candles: its own job, into the same pipeline
            return Box::pin(async move {
                let Some(listing) = crate::venue::listing_for(&ctx, &venue).await else { return };
                let deps =
                    crate::venue::kline_job::VenueKlineDeps { source: venue, listing, out, config };
                crate::venue::kline_job::run(ctx, deps).await;
            });
        }
        Box::pin(async move {
            let Some((source, symbol)) = crate::jobs::resolve_source(&sources, &ctx).await else {
                return;
            };
            let deps = KlineJobDeps {
                config,
                rest: source.rest.clone(),
                ws_base: source.endpoint.ws_base.clone(),
                symbol,
                out,
                gap_fill_max_age_ms,
                recording: source.tap(),
            };
            run(ctx, deps).await;
        })
    }
}

/// Runs the job until it is stopped; connection failures are counted as crashes and retried.
pub async fn run(ctx: JobContext, deps: KlineJobDeps) {
    let health = ctx.health.clone();
    let mut backoff = Backoff::new(
        Duration::from_millis(deps.config.reconnect_base_ms),
        Duration::from_millis(deps.config.reconnect_cap_ms),
    )
    .with_healthy_after(Duration::from_millis(deps.config.reconnect_reset_after_ms));
    let mut jitter = Jitter::new(&deps.symbol);
    let Some(mut pipeline) =
        CandlePipeline::open_for_job(&ctx, &deps.config, &deps.out, &mut backoff, &mut jitter)
            .await
    else {
        return;
    };
    backoff.reset();
    let stream = StreamName::new(&deps.symbol, StreamKind::Kline(Timeframe::M1)).to_string();
    let stream_config = StreamConfig {
        stall_timeout: Duration::from_millis(deps.config.stall_timeout_ms),
        planned_reconnect_after: Duration::from_secs(deps.config.planned_reconnect_after_s),
        ..StreamConfig::default()
    };
    let streams = [stream.as_str()];
    // A connection opened ahead of time for a planned reconnect.
    let mut next_conn: Option<Connection> = None;
    while !ctx.is_stopped() {
        let conn = match next_conn.take() {
            Some(c) => Ok(c),
            None => {
                tokio::select! {
                    c = connect_with(&deps.ws_base, &streams, stream_config.clone()) => c,
                    _ = ctx.stopped() => break,
                }
            }
        };
        let mut conn = match conn {
            Ok(mut c) => {
                crate::recording::observe(deps.recording.clone(), &mut c);
                c
            }
            Err(e) => {
                health.crash(format!("connect {}: {e}", deps.ws_base));
                if ctx.sleep(backoff.next_delay(jitter.draw())).await {
                    break;
                }
                continue;
            }
        };
        health.connects.fetch_add(1, Relaxed);
        health.connected.store(true, Relaxed);
        let connected_at = Instant::now();
        // Anything closed while we were away comes from REST before the stream's candles.
        if let Err(e) = fill_gap(&deps, &mut pipeline, None, &health).await {
            health.crash(format!("REST gap fill: {e}"));
            health.connected.store(false, Relaxed);
            pipeline.flush(Now::read()).await;
            if ctx.sleep(e.retry_after().unwrap_or_else(|| backoff.next_delay(jitter.draw()))).await
            {
                break;
            }
            continue;
        }
        let mut tick = tokio::time::interval(Duration::from_millis(50));
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let outcome = loop {
            tokio::select! {
                ev = conn.next() => match ev {
                    Some(Ok(event)) => {
                        health.messages.fetch_add(1, Relaxed);
                        health.last_message_at_ms.store(now_ms(), Relaxed);
                        if let Err(e) = on_event(&deps, &mut pipeline, event, &health).await {
                            break Err(format!("REST gap fill: {e}"));
                        }
                        if pipeline.is_backlogged() {
                            break Ok(());
                        }
                    }
                    Some(Err(e @ StreamError::Malformed { .. })) => {
                        health.malformed.fetch_add(1, Relaxed);
                        tracing::warn!(symbol = %deps.symbol, "malformed frame from upstream: {e}");
                    }
                    Some(Err(e)) => break Err(format!("stream: {e}")),
                    None => break Err("stream closed by the server".to_string()),
                },
                _ = tick.tick() => {
                    pipeline.tick(Now::read()).await;
                    if conn.is_reconnect_due() {
                        break Ok(());
                    }
                }
                _ = ctx.stopped() => break Ok(()),
            }
        };
        match outcome {
            Ok(()) if ctx.is_stopped() => break,
            Ok(()) if pipeline.is_backlogged() => {
                health.connected.store(false, Relaxed);
                drop(conn);
                if wait_for_store(&ctx, &mut pipeline).await {
                    break;
                }
            }
            Ok(()) => {
                // Planned reconnect: open the successor before letting this one go.
                tracing::info!(symbol = %deps.symbol, "planned reconnect after {:?}", conn.age());
                match connect_with(&deps.ws_base, &streams, stream_config.clone()).await {
                    Ok(c) => next_conn = Some(c),
                    Err(e) => health.crash(format!("planned reconnect: {e}")),
                }
                drop(conn);
            }
            Err(reason) => {
                health.connected.store(false, Relaxed);
                health.crash(reason);
                pipeline.flush(Now::read()).await;
                backoff.connection_ended(connected_at.elapsed());
                if ctx.sleep(backoff.next_delay(jitter.draw())).await {
                    break;
                }
            }
        }
    }
    health.connected.store(false, Relaxed);
    pipeline.close(Now::read()).await;
}

/// Back-pressure: the store refuses closed candles and `max_pending_candles` of them wait, so
/// the job has let its connection go. Retries the persist until it succeeds (the minutes that
/// close meanwhile come from REST once the job reconnects); `true` if stopped meanwhile.
async fn wait_for_store(ctx: &JobContext, pipeline: &mut CandlePipeline) -> bool {
    let waiting = pipeline.waiting();
    ctx.health.error(format_args!(
        "ingest paused: the store refuses closed candles and {waiting} wait (ingest.max_pending_candles); resuming once they are stored"
    ));
    tracing::warn!(waiting, "ingest paused until the store takes the waiting closed candles");
    while pipeline.store_failing() {
        if ctx.sleep(Duration::from_millis(50)).await {
            return true;
        }
        pipeline.tick(Now::read()).await;
    }
    tracing::info!("the store takes closed candles again; ingest resumes");
    false
}

async fn on_event(
    deps: &KlineJobDeps,
    pipeline: &mut CandlePipeline,
    event: StreamEvent,
    health: &JobHealth,
) -> Result<(), RestError> {
    let StreamEvent::Kline { kline, .. } = event else { return Ok(()) };
    if kline.timeframe != Timeframe::M1 || !kline.symbol.eq_ignore_ascii_case(&deps.symbol) {
        health.malformed.fetch_add(1, Relaxed);
        return Ok(());
    }
    check_exchange_clock(&deps.symbol, health, pipeline.last_closed(), kline.event_time);
    let mut candle = kline.candle;
    candle.minutes = 1;
    let open = candle.open_time;
    // A minute before this one that we have not seen closed: the stream skipped it.
    let expected = pipeline.last_closed().map(|l| l + MINUTE_MS);
    let missed_before = |first_unseen: i64| expected.is_some_and(|e| first_unseen > e);
    if kline.closed {
        if missed_before(open) {
            fill_gap(deps, pipeline, Some(open - MINUTE_MS), health).await?;
        }
        pipeline.on_closed(candle, Now::read()).await;
    } else {
        if missed_before(open) {
            fill_gap(deps, pipeline, Some(open - MINUTE_MS), health).await?;
        }
        pipeline.on_forming(candle, kline.event_time, Instant::now());
    }
    Ok(())
}

/// Slack of the "exchange's clock behind" check (a real exchange's REST and stream clocks may
/// differ a little).
const BEHIND_TOLERANCE_MS: i64 = 1_000;

/// Compares the exchange's clock `exchange_ms` with the close of the newest stored candle (open
/// time `last_closed`). While the exchange has not reached that close, no candle can close that
/// the store does not already have, and nothing would say why: a restarted simulator whose clock
/// started behind an earlier, faster run is the known case. Records the lag in the job's health
/// (`/healthz` degraded, naming the job; `millrace_job_exchange_behind_ms`), logs when it starts
/// and ends; returns it (0: not behind).
fn check_exchange_clock(
    symbol: &str,
    health: &JobHealth,
    last_closed: Option<i64>,
    exchange_ms: i64,
) -> i64 {
    let lag = last_closed.map_or(0, |l| l + MINUTE_MS - exchange_ms);
    let behind = if lag > BEHIND_TOLERANCE_MS { lag } else { 0 };
    let was = health.exchange_behind_ms.swap(behind, Relaxed);
    if behind > 0 && was == 0 {
        tracing::warn!(
            symbol,
            exchange_ms,
            last_closed_open_time = last_closed,
            behind_s = behind / 1000,
            "the exchange's clock is behind the newest stored candle: no candle closes until it catches up"
        );
    } else if behind == 0 && was > 0 {
        tracing::info!(symbol, "the exchange's clock has reached the newest stored candle again");
    }
    behind
}

/// Most time the job waits for the exchange's REST clock to reach a minute its stream has already
/// shown closed (the REST side of an exchange may lag its stream, notably under load).
const CLOCK_CATCH_UP: Duration = Duration::from_secs(5);

/// The exchange's time, once it has passed the minute `through` (when given): the stream proved
/// that minute closed (a newer candle arrived), so REST must be able to serve it. A fill that
/// trusted a lagging clock would stop short and leave a hole; if the clock does not catch up in
/// [`CLOCK_CATCH_UP`], the fill fails and the job reconnects and fills again instead.
async fn exchange_time_through(
    deps: &KlineJobDeps,
    through: Option<i64>,
) -> Result<i64, RestError> {
    let deadline = Instant::now() + CLOCK_CATCH_UP;
    loop {
        let now = deps.rest.server_time().await?;
        let Some(t) = through else { return Ok(now) };
        if Timeframe::M1.bucket_open(now) - MINUTE_MS >= t {
            return Ok(now);
        }
        if Instant::now() >= deadline {
            return Err(RestError::Api {
                status: 503,
                code: None,
                msg: format!("the exchange's clock ({now}) has not passed the minute {t} its stream showed closed"),
            });
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Fetches the closed 1m candles after the last accepted one (through `through`, or up to the
/// exchange's current minute) from REST and feeds them to the pipeline, oldest first.
/// Without any stored candle there is nothing to continue: live ingest starts fresh (history is
/// the backfill's job).
async fn fill_gap(
    deps: &KlineJobDeps,
    pipeline: &mut CandlePipeline,
    through: Option<i64>,
    health: &JobHealth,
) -> Result<(), RestError> {
    let Some(last) = pipeline.last_closed() else { return Ok(()) };
    let server_now = exchange_time_through(deps, through).await?;
    check_exchange_clock(&deps.symbol, health, Some(last), server_now);
    // A row is closed when its close time has passed on the exchange's clock.
    let limit_open =
        through.unwrap_or(i64::MAX).min(Timeframe::M1.bucket_open(server_now) - MINUTE_MS);
    let mut from = last + MINUTE_MS;
    if let Some(max_age) = deps.gap_fill_max_age_ms {
        let oldest = Timeframe::M1.bucket_open(server_now.saturating_sub(max_age));
        if from < oldest {
            tracing::warn!(symbol = %deps.symbol, from, oldest, "the gap fill starts at the oldest minute the cluster takes from the bus (cluster.bus_retention_s); older minutes are left to backfill");
            from = oldest;
        }
    }
    let mut filled = 0u64;
    while from <= limit_open {
        if pipeline.is_backlogged() {
            // The store refuses candles: the rest is fetched again once it takes them.
            health.gap_filled_candles.fetch_add(filled, Relaxed);
            return Ok(());
        }
        let rows = deps
            .rest
            .klines(
                &deps.symbol,
                Timeframe::M1,
                Some(from),
                Some(limit_open + MINUTE_MS - 1),
                REST_PAGE,
            )
            .await?;
        let mut newest = None;
        for row in &rows {
            if row.close_time >= server_now
                || row.candle.open_time > limit_open
                || row.candle.open_time < from
            {
                continue;
            }
            let mut c: Candle = row.candle;
            c.minutes = 1;
            newest = Some(c.open_time);
            filled += 1;
            pipeline.on_closed(c, Now::read()).await;
        }
        match newest {
            Some(t) => from = t + MINUTE_MS,
            None => break, // the exchange has no candles in the rest of the range
        }
        if rows.len() < REST_PAGE as usize {
            break;
        }
    }
    // Minutes the exchange has no candle for are accounted for too: do not ask again.
    if limit_open >= last + MINUTE_MS {
        pipeline.mark_filled_through(limit_open);
    }
    if filled > 0 {
        health.gap_filled_candles.fetch_add(filled, Relaxed);
        tracing::info!(symbol = %deps.symbol, filled, "filled missing closed candles from REST");
        // Persist the fill before anything newer is published.
        pipeline.flush(Now::read()).await;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_exchange_clock_behind_the_newest_stored_candle_is_reported_until_it_catches_up() {
        let h = JobHealth::default();
        let last = 10 * MINUTE_MS; // the newest stored candle closes at 11 min
                                   // nothing stored: nothing to be behind
        assert_eq!(check_exchange_clock("BTCUSDT", &h, None, 0), 0);
        // a forming candle of the next minute: in step
        assert_eq!(check_exchange_clock("BTCUSDT", &h, Some(last), 11 * MINUTE_MS + 5), 0);
        assert_eq!(h.exchange_behind_ms.load(Relaxed), 0);
        // within the tolerance: clocks differ a little
        assert_eq!(check_exchange_clock("BTCUSDT", &h, Some(last), 11 * MINUTE_MS - 900), 0);
        // a restarted exchange 30 minutes behind
        let behind = check_exchange_clock("BTCUSDT", &h, Some(last), last - 29 * MINUTE_MS);
        assert_eq!(behind, 30 * MINUTE_MS);
        assert_eq!(h.exchange_behind_ms.load(Relaxed), 30 * MINUTE_MS);
        // catching up: still behind, by less
        check_exchange_clock("BTCUSDT", &h, Some(last), last);
        assert_eq!(h.exchange_behind_ms.load(Relaxed), MINUTE_MS);
        // caught up: cleared
        check_exchange_clock("BTCUSDT", &h, Some(last), 11 * MINUTE_MS);
        assert_eq!(h.exchange_behind_ms.load(Relaxed), 0);
    }

    /// A gap fill bounded to the last hour (a cluster worker's, by `cluster.bus_retention_s`)
    /// fetches that hour and no older minute, however old the newest stored minute is; an
    /// unbounded one fetches every minute since.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_gap_fill_reaches_back_no_further_than_its_bound() {
        use crate::bus::InProcessBus;
        use crate::candles::writer::CandleWriter;
        use crate::store::sqlite::SqliteStore;
        use crate::store::{CandleStore, SeriesRows};
        use binance::rest::RestConfig;
        use shared::{Price, Volume};
        let sim = sim::Sim::start(sim::SimConfig::default(), "127.0.0.1:0".parse().unwrap())
            .await
            .unwrap();
        let instrument: InstrumentId = "sim:spot:BTC/USDT".parse().unwrap();
        let series = SeriesId { instrument: instrument.clone(), timeframe: Timeframe::M1 };
        let now = sim.now_ms();
        let old = Timeframe::M1.bucket_open(now) - 3 * 3_600_000;
        let p = Price(9_000_000_000_000);
        let first = Candle::one_minute(old, p, p, p, p, Volume(1), 1);
        for (bound, tag) in [(Some(3_600_000), "bounded"), (None, "unbounded")] {
            let dir =
                std::env::temp_dir().join(format!("millrace-gapfill-{tag}-{}", std::process::id()));
            let _ = std::fs::remove_dir_all(&dir);
            let store: Arc<dyn CandleStore> =
                Arc::new(SqliteStore::open(&dir.join("t.db")).unwrap());
            store.write(&[SeriesRows { series: &series, candles: &[first] }]).unwrap();
            let writer = CandleWriter::new(store.clone(), Arc::new(InProcessBus::new(16)));
            let rest = RestClient::new(RestConfig::new(binance::Product::Spot, sim.rest_base()));
            let deps = KlineJobDeps {
                config: IngestConfig::default(),
                rest: Arc::new(rest.unwrap()),
                ws_base: sim.ws_base(),
                symbol: "BTCUSDT".into(),
                out: writer.into(),
                gap_fill_max_age_ms: bound,
                recording: None,
            };
            let health = Arc::new(JobHealth::default());
            let out = deps.out.clone();
            let mut pipeline =
                CandlePipeline::open(&instrument, &deps.config, out, health.clone(), now_ms())
                    .await
                    .unwrap();
            fill_gap(&deps, &mut pipeline, None, &health).await.unwrap();
            pipeline.flush(Now::read()).await;
            let stored = store.candles(&series, Some(0), None, 100_000).unwrap();
            assert_eq!(stored[0].open_time, old, "{tag}");
            let second = stored[1].open_time;
            match bound {
                Some(max_age) => assert!(second >= now - max_age - MINUTE_MS, "{tag}: {second}"),
                None => assert_eq!(second, old + MINUTE_MS, "{tag}"),
            }
            assert!(stored.len() > 55, "{tag}: {} minutes", stored.len());
            store.close();
            let _ = std::fs::remove_dir_all(&dir);
        }
        sim.shutdown();
    }
}
