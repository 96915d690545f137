//! A venue kline job: one instrument's 1m candles from OKX (`candle1m`, with `confirm`), Bybit
//! (`kline.1`, with `confirm`), Kraken (`ohlc` interval 1: a minute is closed when the next one
//! begins, and then read from REST: its stream has no sequence, so a lost last update of the
//! minute would otherwise be stored as the minute) or Coinbase (its stream is 5-minute only: 1m
//! candles folded from `market_trades` by
//! `shared::trade::TradeFold`), into the same [`CandlePipeline`] as Binance's: stored, derived,
//! then published.
//!
//! **No holes.** On every (re)connect, and whenever a closed minute does not follow the last one
//! accepted, the missing closed minutes are read from the venue's REST candles
//! (`venues::rest::candles_page`, newest first, paged back to the gap's start; the newest row
//! of a fill is the forming minute unless the venue says it closed) and pushed before the
//! stream's newer candles. Coinbase's minutes without a trade come the same way. A series with
//! nothing stored starts at the stream (history is backfill's, not done for venues yet).

use std::sync::atomic::Ordering::Relaxed;
use std::sync::Arc;
use std::time::{Duration, Instant};

use futures_util::{SinkExt, StreamExt};
use shared::backoff::Backoff;
use shared::candle::{Candle, MINUTE_MS};
use shared::trade::TradeFold;
use shared::venue::Dialect;
use tokio_tungstenite::tungstenite::Message as WsMessage;
use venues::rest::Instrument;
use venues::Message;

use super::VenueSource;
use crate::candles::pipeline::CandlePipeline;
use crate::candles::writer::CandleOut;
use crate::clock::{wall_clock_ms as now_ms, Now};
use crate::config::IngestConfig;
use crate::jitter::Jitter;
use crate::jobs::supervisor::JobContext;

/// Pages of REST candles one fill reads at most.
const MAX_FILL_PAGES: usize = 100;

/// What a venue kline job needs besides its [`JobContext`].
pub struct VenueKlineDeps {
    pub source: Arc<VenueSource>,
    pub listing: Instrument,
    pub out: CandleOut,
    pub config: IngestConfig,
}

/// The candle channel's URL and subscription frames.
fn channel(dialect: Dialect, ws_base: &str, symbol: &str) -> (String, Vec<String>, Option<String>) {
    match dialect {
        // OKX serves candles on its business endpoint
        Dialect::Okx => (
            ws_base.replace("/ws/v5/public", "/ws/v5/business"),
            vec![venues::okx::subscribe("candle1m", symbol)],
            Some("ping".into()),
        ),
        Dialect::Bybit => (
            ws_base.to_string(),
            vec![venues::bybit::subscribe(&[&format!("kline.1.{symbol}")])],
            Some(venues::bybit::ping()),
        ),
        Dialect::Kraken => (
            ws_base.to_string(),
            vec![serde_json::json!({"method": "subscribe",
                "params": {"channel": "ohlc", "symbol": [symbol], "interval": 1}})
            .to_string()],
            Some(venues::kraken::ping_v2()),
        ),
        Dialect::Coinbase | Dialect::Binance => (
            ws_base.to_string(),
            vec![
                venues::coinbase::subscribe("market_trades", &[symbol]),
                venues::coinbase::subscribe("heartbeats", &[]),
            ],
            None,
        ),
    }
}

/// What the stream gave: a forming candle, a closed one, or one it closed by starting the
/// next (Kraken).
enum Got {
    Forming(Candle),
    Closed(Candle),
    /// Its last update may have been lost (Kraken's `ohlc` has no sequence): the minute is read
    /// from REST, which has it whole, and the stream's values are kept only where REST has none.
    Ended(Candle),
}

/// Runs the job until `ctx` stops it.
pub async fn run(ctx: JobContext, deps: VenueKlineDeps) {
    let health = ctx.health.clone();
    let mut backoff = Backoff::new(
        Duration::from_millis(deps.config.reconnect_base_ms),
        Duration::from_millis(deps.config.reconnect_cap_ms),
    )
    .with_healthy_after(Duration::from_millis(deps.config.reconnect_reset_after_ms));
    let mut jitter = Jitter::new(&ctx.instrument.to_string());
    let Some(mut pipeline) =
        CandlePipeline::open_for_job(&ctx, &deps.config, &deps.out, &mut backoff, &mut jitter)
            .await
    else {
        return;
    };
    let dialect = deps.source.dialect;
    let symbol = deps.listing.symbol.clone();
    let (url, subscribe, ping) = channel(dialect, &deps.source.endpoint.ws_base, &symbol);
    while !ctx.is_stopped() {
        let connected_at = Instant::now();
        let end = connection(&ctx, &deps, &mut pipeline, &url, &subscribe, ping.as_deref()).await;
        health.connected.store(false, Relaxed);
        pipeline.flush(Now::read()).await;
        match end {
            None => break,
            Some(why) => {
                health.crash(format!("{dialect} candles of {symbol}: {why}"));
                backoff.connection_ended(connected_at.elapsed());
                if ctx.sleep(backoff.next_delay(jitter.draw())).await {
                    break;
                }
            }
        }
    }
    pipeline.close(Now::read()).await;
}

/// One connection; `None` when the job was stopped, else why it ended.
async fn connection(
    ctx: &JobContext,
    deps: &VenueKlineDeps,
    pipeline: &mut CandlePipeline,
    url: &str,
    subscribe: &[String],
    ping: Option<&str>,
) -> Option<String> {
    let dialect = deps.source.dialect;
    tokio::select! {
        () = deps.source.connect_pace.turn() => {}
        () = ctx.stopped() => return None,
    }
    let connect = tokio_tungstenite::connect_async(url);
    let ws = tokio::select! {
        r = tokio::time::timeout(Duration::from_secs(10), connect) => r,
        () = ctx.stopped() => return None,
    };
    let mut ws = match ws {
        Ok(Ok((ws, _))) => ws,
        Ok(Err(e)) => return Some(format!("connect: {}", crate::redact::redact(&e.to_string()))),
        Err(_) => return Some("connect: timed out after 10 s".into()),
    };
    ctx.health.connects.fetch_add(1, Relaxed);
    ctx.health.connected.store(true, Relaxed);
    let rec = crate::recording::Conn::open(deps.source.tap(), url);
    for f in subscribe {
        rec.sent(f);
        if let Err(e) = ws.send(WsMessage::Text(f.clone().into())).await {
            return Some(format!("subscribe: {e}"));
        }
    }
    // anything closed while we were away, before the stream's candles
    if let Some(last) = pipeline.last_closed() {
        if let Err(e) = fill(deps, pipeline, last + MINUTE_MS, None).await {
            return Some(format!("REST gap fill: {e}"));
        }
    }
    let mut tick = tokio::time::interval(Duration::from_millis(50));
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut keepalive = tokio::time::interval_at(
        tokio::time::Instant::now() + super::book_job::PING_EVERY,
        super::book_job::PING_EVERY,
    );
    let stall = Duration::from_millis(deps.config.stall_timeout_ms.max(1_000));
    let mut last_frame = tokio::time::Instant::now();
    let mut messages = Vec::new();
    let mut forming: Option<Candle> = None;
    let mut fold = TradeFold::new();
    // Coinbase: the minute the trades start in was partly before them: never stored from the
    // fold (a fill reads it from REST)
    let mut partial_minute: Option<i64> = None;
    let mut seq = shared::venue::ConnectionSequence::default();
    loop {
        let frame = tokio::select! {
            () = ctx.stopped() => return None,
            _ = tick.tick() => {
                pipeline.tick(Now::read()).await;
                if last_frame.elapsed() > stall {
                    return Some(format!("nothing received for {} ms", stall.as_millis()));
                }
                continue;
            }
            _ = keepalive.tick() => {
                if let Some(p) = ping {
                    rec.sent(p);
                    if let Err(e) = ws.send(WsMessage::Text(p.to_string().into())).await {
                        return Some(format!("ping: {e}"));
                    }
                }
                continue;
            }
            f = ws.next() => f,
        };
        last_frame = tokio::time::Instant::now();
        let text = match frame {
            Some(Ok(WsMessage::Text(t))) => {
                rec.received(t.as_str());
                t
            }
            Some(Ok(WsMessage::Close(c))) => return Some(format!("closed by the venue: {c:?}")),
            Some(Ok(_)) => continue,
            Some(Err(e)) => return Some(e.to_string()),
            None => return Some("the connection ended".into()),
        };
        ctx.health.messages.fetch_add(1, Relaxed);
        ctx.health.last_message_at_ms.store(now_ms(), Relaxed);
        messages.clear();
        if let Err(e) = venues::parse(dialect, &text, &mut messages) {
            ctx.health.malformed.fetch_add(1, Relaxed);
            ctx.health.error(&e);
            continue;
        }
        let mut got: Vec<Got> = Vec::new();
        for m in messages.drain(..) {
            match m {
                // Coinbase's connection-wide sequence: a lost message may be a lost trade,
                // so the minutes it touched come from REST
                Message::Sequence { seq: n } => {
                    if let shared::venue::ConnectionVerdict::Gap { .. } = seq.observe(n) {
                        return Some("a message was lost (sequence_num gap)".into());
                    }
                }
                Message::Candle(c) if c.minutes == 1 && c.symbol == deps.listing.symbol => {
                    match c.closed {
                        Some(true) => got.push(Got::Closed(c.candle)),
                        Some(false) => got.push(Got::Forming(c.candle)),
                        // Kraken: a minute closes when the next begins
                        None => {
                            if let Some(f) = forming.take_if(|f| f.open_time < c.candle.open_time) {
                                got.push(Got::Ended(f));
                            }
                            forming = Some(c.candle);
                            got.push(Got::Forming(c.candle));
                        }
                    }
                }
                Message::Trades { symbol, trades }
                    if dialect == Dialect::Coinbase && symbol == deps.listing.symbol =>
                {
                    for t in &trades {
                        let minute = t.time_ms - t.time_ms.rem_euclid(MINUTE_MS);
                        partial_minute.get_or_insert(minute);
                        if let Some(c) = fold.push(t) {
                            if Some(c.open_time) != partial_minute {
                                got.push(Got::Closed(c));
                            }
                        }
                    }
                    if let Some(f) = fold.forming() {
                        got.push(Got::Forming(*f));
                    }
                }
                Message::Refused { code, message, .. } => {
                    ctx.health.error(format!("{dialect} refusal: {code} {message}"));
                }
                _ => {}
            }
        }
        for g in got {
            let (c, ended) = match g {
                Got::Forming(c) => {
                    pipeline.on_forming(c, now_ms(), Instant::now());
                    continue;
                }
                Got::Closed(c) => (c, false),
                Got::Ended(c) => (c, true),
            };
            if let Some(last) = pipeline.last_closed() {
                if c.open_time <= last {
                    continue; // already accepted
                }
                if c.open_time > last + MINUTE_MS {
                    if let Err(e) = fill(deps, pipeline, last + MINUTE_MS, Some(c.open_time)).await
                    {
                        return Some(format!("REST gap fill: {e}"));
                    }
                }
            }
            let c = if ended {
                match rest_minute(deps, c.open_time).await {
                    Ok(whole) => whole.unwrap_or(c),
                    Err(e) => return Some(format!("REST read of a closed minute: {e}")),
                }
            } else {
                c
            };
            ctx.health.closed_candles.fetch_add(1, Relaxed);
            pipeline.on_closed(c, Now::read()).await;
        }
    }
}

/// The venue's REST candle of the minute opening at `open_time`, if its REST candles hold it
/// committed: a later minute follows it (Kraken's newest row is the forming one, whatever it
/// is, until the venue commits it).
async fn rest_minute(deps: &VenueKlineDeps, open_time: i64) -> Result<Option<Candle>, String> {
    let dialect = deps.source.dialect;
    let path = venues::rest::candles_page(
        dialect,
        deps.source.config.market,
        &deps.listing.symbol,
        open_time,
        Some(open_time + MINUTE_MS),
    );
    let body = deps.source.get_text(&path).await.map_err(|e| e.to_string())?;
    let page = venues::rest::parse_candles(dialect, &body).map_err(|e| e.to_string())?;
    let later = page.iter().any(|r| r.candle.open_time > open_time);
    Ok(page.into_iter().map(|r| r.candle).find(|c| later && c.open_time == open_time))
}

/// Pushes the venue's closed 1m candles with open times in `[from, below)` (`below: None`: up
/// to the forming minute, which is left out) into the pipeline, oldest first.
async fn fill(
    deps: &VenueKlineDeps,
    pipeline: &mut CandlePipeline,
    from: i64,
    below: Option<i64>,
) -> Result<usize, String> {
    let dialect = deps.source.dialect;
    let mut rows: Vec<venues::rest::CandleRow> = Vec::new();
    let mut cursor = below;
    let mut newest_dropped = below.is_some();
    for _ in 0..MAX_FILL_PAGES {
        let path = venues::rest::candles_page(
            dialect,
            deps.source.config.market,
            &deps.listing.symbol,
            from,
            cursor,
        );
        let body = deps.source.get_text(&path).await.map_err(|e| e.to_string())?;
        let mut page = venues::rest::parse_candles(dialect, &body).map_err(|e| e.to_string())?;
        page.retain(|r| {
            r.candle.open_time >= from && cursor.is_none_or(|c| r.candle.open_time < c)
        });
        page.sort_by_key(|r| r.candle.open_time);
        if !newest_dropped {
            // the newest row of the first page is the forming minute unless the venue says
            // it closed
            if page.last().is_some_and(|r| r.closed != Some(true)) {
                page.pop();
            }
            newest_dropped = true;
        }
        let Some(oldest) = page.first().map(|r| r.candle.open_time) else { break };
        let done = oldest <= from || dialect == Dialect::Kraken;
        rows.extend(page);
        if done {
            break;
        }
        cursor = Some(oldest);
    }
    rows.retain(|r| r.closed != Some(false));
    rows.sort_by_key(|r| r.candle.open_time);
    rows.dedup_by_key(|r| r.candle.open_time);
    let n = rows.len();
    for r in rows {
        if pipeline.last_closed().is_some_and(|l| r.candle.open_time <= l) {
            continue;
        }
        pipeline.on_closed(r.candle, Now::read()).await;
    }
    if let Some(b) = below {
        pipeline.mark_filled_through(b - MINUTE_MS);
    }
    Ok(n)
}
