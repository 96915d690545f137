//! What the API asks of the tick-by-tick books — the engine's report, a book's REST snapshot,
//! migrations, auto-balance, a simulator's hot spots — answered by the process that runs them
//! ([`L3Books`]), whether the request came from its own HTTP handlers or, in a cluster whose
//! `[l3] host` is a worker, over NATS from a gateway ([`super::remote`]). Refusals are typed
//! ([`Refusal`]) so that they cross NATS and become the same HTTP error either way.

use std::collections::HashMap;
use std::sync::atomic::Ordering::Relaxed;
use std::time::Duration;

use shared::protocol::ops::{
    AdminResult, ApiErrorCode as Code, AutoBalanceReply, AutoBalanceRequest, BookInfo,
    HotspotReply, HotspotRequest, MigrateReply, MigrateRequest, ShardsReport, TickSourceKind,
    TickSourceStats,
};
use shared::protocol::{BookHealth, InstrumentId, Market, RestDepth};

use super::engine::{SymbolIdx, Target};
use super::L3Books;

/// How long `GET /api/v1/ops/shards` waits for a simulator's hot-spot state.
const SIM_STATUS_WAIT: Duration = Duration::from_millis(300);

/// A refused tick-by-tick request: the HTTP status and error the API answers with.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize, thiserror::Error)]
#[error("{msg}")]
pub struct Refusal {
    pub status: u16,
    pub code: Code,
    pub msg: String,
}

impl Refusal {
    pub fn bad(code: Code, msg: impl Into<String>) -> Self {
        Refusal { status: 400, code, msg: msg.into() }
    }
    pub fn not_found(msg: impl Into<String>) -> Self {
        Refusal { status: 404, code: Code::UnknownBook, msg: msg.into() }
    }
    pub fn unavailable(msg: impl Into<String>) -> Self {
        Refusal { status: 503, code: Code::Unavailable, msg: msg.into() }
    }
}

impl L3Books {
    /// `GET /api/v1/ops/shards`: the engine, its sources' counters, and which symbols a
    /// simulator has made hot.
    pub async fn shards(&self) -> ShardsReport {
        let sources = self
            .sources
            .iter()
            .map(|s| {
                let c = &s.counters;
                TickSourceStats {
                    name: s.name.clone(),
                    kind: if s.rest.is_some() {
                        TickSourceKind::Sim
                    } else {
                        TickSourceKind::Replay
                    },
                    events: c.events.load(Relaxed),
                    unknown_symbol: c.unknown_symbol.load(Relaxed),
                    connect_snapshots: c.connect_snapshots.load(Relaxed),
                    recoveries: c.recoveries.load(Relaxed),
                    recovery_failures: c.recovery_failures.load(Relaxed),
                    held_dropped: c.held_dropped.load(Relaxed),
                    silences: c.silences.load(Relaxed),
                    replay_done: c.done.load(Relaxed),
                }
            })
            .collect();
        let mut engine = self.handle.stats();
        // Hot spots are the simulator's state: ask it (briefly) and mark its symbols.
        let mut hot: HashMap<(String, String), bool> = HashMap::new();
        for s in &self.sources {
            let Some(rest) = &s.rest else { continue };
            match tokio::time::timeout(SIM_STATUS_WAIT, rest.status()).await {
                Ok(Ok(status)) => hot.extend(
                    status.symbols.into_iter().map(|sym| ((s.name.clone(), sym.symbol), sym.hot)),
                ),
                Ok(Err(e)) => tracing::debug!(source = %s.name, "simulator status: {e}"),
                Err(_) => {
                    tracing::debug!(source = %s.name, "simulator status: no answer in {SIM_STATUS_WAIT:?}")
                }
            }
        }
        for sym in &mut engine.symbols {
            let id = &sym.instrument;
            sym.hot = hot.get(&(id.exchange.clone(), id.symbol.clone())).copied();
        }
        ShardsReport { engine, sources }
    }

    /// A tick-by-tick book named by instrument id (`sim:stock:600000`) or, when unambiguous, by
    /// its code alone (`600000`).
    fn named(&self, text: &str) -> Result<(InstrumentId, SymbolIdx), Refusal> {
        let not_found = || {
            Refusal::not_found(format!(
                "no tick-by-tick book {text:?} (see GET /api/v1/ops/shards)"
            ))
        };
        if text.contains(':') {
            let inst: InstrumentId =
                text.parse().map_err(|e| Refusal::bad(Code::BadStream, format!("{e}")))?;
            let idx = self.handle.symbol(&inst).ok_or_else(not_found)?;
            return Ok((inst, idx));
        }
        let matches: Vec<_> = self
            .handle
            .stats()
            .symbols
            .into_iter()
            .filter(|s| s.instrument.symbol == text)
            .collect();
        match matches.as_slice() {
            [one] => Ok((one.instrument.clone(), one.symbol)),
            [] => Err(not_found()),
            _ => Err(Refusal::bad(
                Code::Ambiguous,
                format!("{text:?} names several books; use the instrument id"),
            )),
        }
    }

    /// `POST /api/v1/admin/shards/migrate`.
    pub fn migrate(&self, req: &MigrateRequest) -> Result<MigrateReply, Refusal> {
        let (inst, idx) = self.named(&req.symbol)?;
        let target = Target::from_api(req.target)
            .map_err(|e| Refusal::bad(Code::BadTarget, e.to_string()))?;
        let from = self.handle.stats().symbol(idx).map(|s| s.shard);
        self.handle
            .migrate(idx, target)
            .map_err(|e| Refusal::bad(Code::MigrateRefused, e.to_string()))?;
        Ok(MigrateReply { result: AdminResult::Migrating, symbol: inst, from, target: req.target })
    }

    /// `POST /api/v1/admin/shards/auto_balance`.
    pub fn auto_balance(&self, req: &AutoBalanceRequest) -> AutoBalanceReply {
        self.handle.set_auto_balance(req.on);
        AutoBalanceReply { result: AdminResult::Ok, auto_balance: req.on }
    }

    /// `POST /api/v1/admin/sim/hotspot`: asks the simulator serving the book.
    pub async fn hotspot(&self, req: &HotspotRequest) -> Result<HotspotReply, Refusal> {
        let (inst, _) = self.named(&req.symbol)?;
        let rest = self.sim_rest(&inst).ok_or_else(|| {
            Refusal::bad(
                Code::NotSimulated,
                format!("{inst} does not come from a simulator; hot spots are a simulator control"),
            )
        })?;
        let cmd = tbt::Control::Hotspot { symbol: inst.symbol.clone(), hot: req.hot };
        rest.control(&cmd).await.map_err(|e| Refusal {
            status: 502,
            code: Code::SimulatorError,
            msg: format!("the simulator refused: {e}"),
        })?;
        Ok(HotspotReply { result: AdminResult::Ok, symbol: inst, hot: req.hot })
    }

    /// The last published book of `instrument` cut to `limit` levels, as `GET /fapi/v1/depth`
    /// serves it; `None` for an instrument the engine does not rebuild.
    pub fn depth(
        &self,
        instrument: &InstrumentId,
        limit: usize,
    ) -> Option<(RestDepth, BookHealth)> {
        self.handle.symbol(instrument)?;
        self.registry.rest_depth(instrument, limit)
    }

    /// The published tick-by-tick books, for `GET /api/v1/ops/books`.
    pub fn books(&self) -> Vec<BookInfo> {
        let mut books = self.registry.list();
        books.retain(|b| b.instrument.market == Market::Stock);
        books
    }
}
