//! Every instrument's recent trades, in memory: what its producer (a venue book job, a Binance
//! depth job's aggTrade stream) reported, published on `trade@{instrument}` and kept for
//! `GET /api/v1/trades`.
//!
//! Where the venue numbers trades one after another (Binance aggTrade ids, Kraken and Coinbase
//! trade ids, simulated OKX ids), a duplicate is dropped and a gap is counted with the ids it
//! misses (`GET /api/v1/trades` reports them), so a hole after a reconnect is visible, never
//! silent. Ids that are not numbers (Bybit's) are checked against the newest
//! [`TEXT_IDS_KEPT`] such ids, so a trade heard twice (a cluster gateway hears each from every
//! replica) is kept once.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, RwLock};

use bytes::Bytes;
use serde::Serialize;
use shared::protocol::{InstrumentId, Push, Stream, TradesEvent};
use shared::trade::{IdVerdict, RecentTrades, Trade, TradeIds};

use crate::bus::Bus;
use crate::lock::{lock, read, write};

/// Trades kept per instrument.
pub const RECENT_TRADES: usize = 1_000;
/// Non-numeric trade ids remembered per instrument, to drop a trade heard again.
pub const TEXT_IDS_KEPT: usize = 4_096;

/// What an instrument's trades went through.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
pub struct TradeStats {
    /// Trades received (duplicates included).
    pub received: u64,
    /// Trades with an id already seen: dropped.
    pub duplicates: u64,
    /// Times the ids skipped, and the ids missing in all.
    pub gaps: u64,
    pub missing: u64,
    /// Trades a REST fill recovered for a hole the stream left.
    pub filled: u64,
}

struct Cell {
    recent: RecentTrades,
    ids: TradeIds,
    /// The newest non-numeric ids, oldest first, and the same as a set.
    text_ids: (std::collections::VecDeque<String>, std::collections::HashSet<String>),
    stats: TradeStats,
    topic: String,
}

/// Every instrument's trades.
pub struct TradeRegistry {
    bus: Arc<dyn Bus>,
    cells: RwLock<HashMap<InstrumentId, Arc<Mutex<Cell>>>>,
}

impl TradeRegistry {
    pub fn new(bus: Arc<dyn Bus>) -> Arc<Self> {
        Arc::new(TradeRegistry { bus, cells: RwLock::default() })
    }

    fn cell(&self, instrument: &InstrumentId) -> Arc<Mutex<Cell>> {
        if let Some(c) = read(&self.cells).get(instrument) {
            return c.clone();
        }
        write(&self.cells)
            .entry(instrument.clone())
            .or_insert_with(|| {
                Arc::new(Mutex::new(Cell {
                    recent: RecentTrades::new(RECENT_TRADES),
                    ids: TradeIds::new(),
                    text_ids: Default::default(),
                    stats: TradeStats::default(),
                    topic: Stream::Trade(instrument.clone()).to_string(),
                }))
            })
            .clone()
    }

    /// Trades of `instrument`, oldest first: duplicates dropped, gaps counted, the rest kept
    /// and published.
    pub fn push(&self, instrument: &InstrumentId, trades: Vec<Trade>) {
        if trades.is_empty() {
            return;
        }
        let cell = self.cell(instrument);
        let mut c = lock(&cell);
        let mut fresh = Vec::with_capacity(trades.len());
        for t in trades {
            c.stats.received += 1;
            if let Some(id) = t.id.seq() {
                match c.ids.observe(id) {
                    IdVerdict::Duplicate => {
                        c.stats.duplicates += 1;
                        continue;
                    }
                    IdVerdict::Gap { from, to } => {
                        c.stats.gaps += 1;
                        c.stats.missing += to - from + 1;
                    }
                    IdVerdict::First | IdVerdict::Next => {}
                }
            } else if let shared::trade::TradeId::Text(id) = &t.id {
                let (order, set) = &mut c.text_ids;
                if !set.insert(id.clone()) {
                    c.stats.duplicates += 1;
                    continue;
                }
                order.push_back(id.clone());
                if order.len() > TEXT_IDS_KEPT {
                    if let Some(old) = order.pop_front() {
                        set.remove(&old);
                    }
                }
            }
            c.recent.push(t.clone());
            fresh.push(t);
        }
        if fresh.is_empty() || !self.bus.has_subscribers(&c.topic) {
            return;
        }
        let push = Push {
            stream: Stream::Trade(instrument.clone()),
            data: TradesEvent { s: instrument.clone(), trades: fresh },
        };
        let payload = Bytes::from(serde_json::to_vec(&push).expect("trades always serialize"));
        self.bus.publish(&c.topic, payload);
    }

    /// The highest sequential trade id of `instrument` and the time of its newest trade kept.
    pub fn last_seq(&self, instrument: &InstrumentId) -> Option<(u64, i64)> {
        let cell = read(&self.cells).get(instrument)?.clone();
        let c = lock(&cell);
        let time = c.recent.newest_first(1).next()?.time_ms;
        Some((c.ids.last()?, time))
    }

    /// Counts trades a REST fill recovered.
    pub fn note_filled(&self, instrument: &InstrumentId, n: u64) {
        lock(&self.cell(instrument)).stats.filled += n;
    }

    /// The newest `limit` trades of `instrument`, newest first, and its counters; `None` when
    /// none was ever received.
    pub fn recent(
        &self,
        instrument: &InstrumentId,
        limit: usize,
    ) -> Option<(Vec<Trade>, TradeStats)> {
        let cell = read(&self.cells).get(instrument)?.clone();
        let c = lock(&cell);
        Some((c.recent.newest_first(limit).cloned().collect(), c.stats))
    }
}

/// A Binance market's trades, beside its depth job: `<sym>@aggTrade` into `registry`,
/// reconnecting with the ingest back-off, until `shutdown`. Aggregate trade ids follow one
/// another, so a hole (a reconnect, a lost frame) is seen at the next trade and filled first from
/// `GET /aggTrades?fromId=` (at most [`FILL_PAGES`] pages of 1,000); what REST cannot give stays
/// a counted gap.
#[allow(clippy::too_many_arguments)]
pub async fn binance_agg_trades(
    registry: Arc<TradeRegistry>,
    instrument: InstrumentId,
    ws_base: String,
    rest: Arc<binance::rest::RestClient>,
    symbol: String,
    ingest: crate::config::IngestConfig,
    recording: Option<crate::recording::Tap>,
    shutdown: crate::shutdown::Shutdown,
) {
    use binance::stream::{connect_with, StreamConfig};
    use binance::wire::WsAggTrade;
    use std::time::Duration;

    let stream = format!("{}@aggTrade", symbol.to_ascii_lowercase());
    let config = StreamConfig {
        stall_timeout: Duration::from_millis(ingest.stall_timeout_ms),
        planned_reconnect_after: Duration::from_secs(ingest.planned_reconnect_after_s),
        ..StreamConfig::default()
    };
    let mut backoff = shared::backoff::Backoff::new(
        Duration::from_millis(ingest.reconnect_base_ms),
        Duration::from_millis(ingest.reconnect_cap_ms),
    );
    backoff.healthy_after = Duration::from_millis(ingest.reconnect_reset_after_ms);
    let mut jitter = crate::jitter::Jitter::new(&stream);
    let mut malformed: u64 = 0;
    let mut last: Option<u64> = None;
    let streams = [stream.as_str()];
    while !shutdown.is_stopping() {
        let conn = tokio::select! {
            c = connect_with(&ws_base, &streams, config.clone()) => c,
            () = shutdown.stopping() => return,
        };
        match conn {
            Ok(mut conn) => {
                crate::recording::observe(recording.clone(), &mut conn);
                loop {
                    let text = tokio::select! {
                        t = conn.next_text() => t,
                        () = shutdown.stopping() => return,
                    };
                    let Some(Ok(text)) = text else { break };
                    // a raw event, or the combined stream's `{"stream":…,"data":{…}}`
                    #[derive(serde::Deserialize)]
                    struct Combined {
                        data: WsAggTrade,
                    }
                    let event = serde_json::from_str::<WsAggTrade>(&text)
                        .or_else(|_| serde_json::from_str::<Combined>(&text).map(|c| c.data));
                    match event {
                        Ok(a) => {
                            if let Some(l) = last.filter(|&l| a.agg_trade_id > l + 1) {
                                let filled =
                                    fill_agg_trades(&rest, &symbol, l + 1, a.agg_trade_id).await;
                                registry.note_filled(&instrument, filled.len() as u64);
                                registry.push(&instrument, filled);
                            }
                            last = Some(last.map_or(a.agg_trade_id, |l| l.max(a.agg_trade_id)));
                            let t = agg_trade(
                                a.agg_trade_id,
                                a.trade_time,
                                a.price,
                                a.qty,
                                a.buyer_is_maker,
                            );
                            registry.push(&instrument, vec![t]);
                        }
                        // a subscription answer or a broken frame: counted, logged once
                        Err(e) => {
                            malformed += 1;
                            if malformed == 1 && !text.contains("\"result\"") {
                                tracing::warn!(%stream, "an aggTrade frame could not be read: {e}");
                            }
                        }
                    }
                }
            }
            Err(e) => tracing::info!(%stream, "cannot connect the trade stream: {e}"),
        }
        tokio::select! {
            () = tokio::time::sleep(backoff.next_delay(jitter.draw())) => {}
            () = shutdown.stopping() => return,
        }
    }
}

/// Pages of a REST fill at most.
pub const FILL_PAGES: usize = 10;

/// The aggregate trades with ids in `[from, below)` from REST, oldest first (as many as REST
/// gives; a failure is logged and ends the fill).
async fn fill_agg_trades(
    rest: &binance::rest::RestClient,
    symbol: &str,
    from: u64,
    below: u64,
) -> Vec<Trade> {
    let mut out = Vec::new();
    let mut next = from;
    for _ in 0..FILL_PAGES {
        if next >= below {
            break;
        }
        let want = u16::try_from((below - next).min(1000)).unwrap_or(1000);
        match rest.agg_trades(symbol, next, want).await {
            Ok(rows) => {
                let Some(end) = rows.last().map(|r| r.agg_trade_id) else { break };
                let wanted =
                    rows.into_iter().filter(|r| r.agg_trade_id >= next && r.agg_trade_id < below);
                out.extend(wanted.map(|r| {
                    agg_trade(r.agg_trade_id, r.trade_time, r.price, r.qty, r.buyer_is_maker)
                }));
                next = end + 1;
            }
            Err(e) => {
                tracing::warn!(%symbol, "aggTrades gap fill {next}..{below}: {e}");
                break;
            }
        }
    }
    out
}

/// A Binance trade (aggregate or single, stream or REST) as a [`Trade`]: the buyer being the
/// maker means the taker sold.
pub(crate) fn agg_trade(
    id: u64,
    time_ms: i64,
    price: shared::Price,
    qty: shared::Qty,
    buyer_is_maker: bool,
) -> Trade {
    use shared::trade::{TakerSide, TradeId};
    let taker = if buyer_is_maker { TakerSide::Sell } else { TakerSide::Buy };
    Trade { id: TradeId::Seq(id), time_ms, price, qty, taker: Some(taker) }
}
