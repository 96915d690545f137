//! Market-data sources: each `[[sources]]` entry becomes a [`Source`] — its REST client, its
//! WebSocket base URL and its symbol list (from `exchangeInfo`). A `sim` source without explicit
//! URLs starts the embedded simulator on loopback and points at it, so the real Binance
//! connector code path runs against it.
//!
//! Symbols are loaded at start-up; if a source cannot be reached, millrace still starts, the
//! source is reported as not ready (with the error) in `GET /api/v1/ops/sources`, and loading is
//! retried in the background.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex, RwLock};
use std::time::Duration;

use serde::Serialize;
use shared::candle::Timeframe;
use shared::protocol::{InstrumentId, SeriesId};

use crate::binance::rest::{RestClient, RestConfig};
use crate::binance::wire::SymbolInfo;
use crate::binance::Venue;
use crate::config::{Config, SourceConfig, SourceKind};
use crate::sim::{Sim, SimConfig, SimHandle};

/// One configured source.
pub struct Source {
    pub config: SourceConfig,
    pub venue: Venue,
    pub rest: Arc<RestClient>,
    pub rest_base: String,
    pub ws_base: String,
    /// `BASE/QUOTE` -> Binance symbol info.
    symbols: RwLock<BTreeMap<String, SymbolInfo>>,
    status: Mutex<Status>,
    /// The embedded simulator, when this source runs one.
    pub sim: Option<SimHandle>,
}

#[derive(Debug, Clone, Default, Serialize)]
struct Status {
    ready: bool,
    last_error: Option<String>,
    loaded_at_ms: Option<i64>,
}

impl Source {
    /// The Binance symbol of `instrument`, if this source lists it.
    pub fn symbol(&self, instrument: &InstrumentId) -> Result<String, String> {
        let symbols = self.symbols.read().unwrap_or_else(|p| p.into_inner());
        if symbols.is_empty() {
            let err = self.status.lock().unwrap_or_else(|p| p.into_inner()).last_error.clone();
            return Err(format!(
                "source {} is not ready yet{}",
                self.config.name,
                err.map(|e| format!(": {e}")).unwrap_or_default()
            ));
        }
        match symbols.get(&instrument.symbol) {
            Some(info) => Ok(info.symbol.clone()),
            None => Err(format!("{instrument}: source {} has no symbol {}", self.config.name, instrument.symbol)),
        }
    }

    async fn load_symbols(&self) -> Result<usize, String> {
        let info = self.rest.exchange_info().await.map_err(|e| e.to_string())?;
        let mut map = BTreeMap::new();
        for s in info.symbols {
            map.insert(format!("{}/{}", s.base_asset, s.quote_asset), s);
        }
        let n = map.len();
        *self.symbols.write().unwrap_or_else(|p| p.into_inner()) = map;
        let mut st = self.status.lock().unwrap_or_else(|p| p.into_inner());
        st.ready = true;
        st.last_error = None;
        st.loaded_at_ms = Some(crate::ingest::supervisor::now_ms());
        Ok(n)
    }

    fn set_error(&self, e: &str) {
        let mut st = self.status.lock().unwrap_or_else(|p| p.into_inner());
        st.last_error = Some(e.to_string());
    }
}

/// All sources, by name.
pub struct Sources {
    list: Vec<Arc<Source>>,
    timeframes: Vec<Timeframe>,
}

impl Sources {
    /// Builds every source (starting embedded simulators) and loads their symbols; a source
    /// that cannot be reached is retried in the background.
    pub async fn start(config: &Config) -> anyhow::Result<Arc<Sources>> {
        let mut list = Vec::new();
        for sc in &config.sources {
            let venue = Venue::of_market(sc.market).ok_or_else(|| {
                anyhow::anyhow!("source {}: market {} is not served over the Binance protocol", sc.name, sc.market.as_str())
            })?;
            let (sim, rest_base, ws_base) = match (sc.kind, &sc.rest_base, &sc.ws_base) {
                (SourceKind::Sim, None, None) => {
                    let cfg = SimConfig { seed: sc.seed, speed: sc.speed, ..SimConfig::default() };
                    let handle = Sim::start(cfg, sc.sim_addr).await?;
                    // The simulator serves USD-M futures under /fapi (REST and streams).
                    let w = match venue {
                        Venue::Spot => handle.ws_base(),
                        Venue::Futures => handle.futures_ws_base(),
                    };
                    let r = handle.rest_base();
                    tracing::info!(source = %sc.name, rest = %r, ws = %w, speed = sc.speed, "embedded simulator started");
                    (Some(handle), r, w)
                }
                (_, r, w) => (
                    None,
                    r.clone().unwrap_or_else(|| venue.default_rest_url().to_string()),
                    w.clone().unwrap_or_else(|| venue.default_ws_url().to_string()),
                ),
            };
            let rest = Arc::new(RestClient::new(RestConfig::new(venue, rest_base.clone()))?);
            list.push(Arc::new(Source {
                config: sc.clone(),
                venue,
                rest,
                rest_base,
                ws_base,
                symbols: RwLock::default(),
                status: Mutex::default(),
                sim,
            }));
        }
        for s in &list {
            match s.load_symbols().await {
                Ok(n) => tracing::info!(source = %s.config.name, symbols = n, "source ready"),
                Err(e) => {
                    tracing::warn!(source = %s.config.name, "cannot load symbols, retrying in the background: {e}");
                    s.set_error(&e);
                    let s = s.clone();
                    tokio::spawn(async move {
                        let mut delay = Duration::from_secs(2);
                        loop {
                            tokio::time::sleep(delay).await;
                            match s.load_symbols().await {
                                Ok(n) => {
                                    tracing::info!(source = %s.config.name, symbols = n, "source ready");
                                    break;
                                }
                                Err(e) => s.set_error(&e),
                            }
                            delay = (delay * 2).min(Duration::from_secs(60));
                        }
                    });
                }
            }
        }
        let mut timeframes = vec![Timeframe::M1];
        timeframes.extend(config.ingest.derived.iter().copied());
        Ok(Arc::new(Sources { list, timeframes }))
    }

    /// The source named `name`.
    pub fn get(&self, name: &str) -> Option<&Arc<Source>> {
        self.list.iter().find(|s| s.config.name == name)
    }

    /// Every source.
    pub fn all(&self) -> &[Arc<Source>] {
        &self.list
    }

    /// The source and Binance symbol of `instrument`.
    pub fn resolve(&self, instrument: &InstrumentId) -> Result<(Arc<Source>, String), String> {
        let source = self
            .get(&instrument.exchange)
            .ok_or_else(|| format!("{instrument}: no source named {:?} is configured", instrument.exchange))?;
        if source.config.market != instrument.market {
            return Err(format!(
                "{instrument}: source {} serves the {} market",
                source.config.name,
                source.config.market.as_str()
            ));
        }
        let symbol = source.symbol(instrument)?;
        Ok((source.clone(), symbol))
    }

    /// Whether `series` can be served: known source and symbol, 1m or a derived timeframe.
    pub fn validate_series(&self, series: &SeriesId) -> Result<(), String> {
        if !self.timeframes.contains(&series.timeframe) {
            return Err(format!(
                "{series}: timeframe {} is not offered (offered: {})",
                series.timeframe,
                self.timeframes.iter().map(|t| t.name()).collect::<Vec<_>>().join(" ")
            ));
        }
        self.resolve(&series.instrument).map(|_| ())
    }

    /// The instruments offered, for `GET /api/v1/series`.
    pub fn instruments(&self) -> Vec<serde_json::Value> {
        let mut out = Vec::new();
        for s in &self.list {
            let symbols = s.symbols.read().unwrap_or_else(|p| p.into_inner());
            for (name, info) in symbols.iter() {
                out.push(serde_json::json!({
                    "id": InstrumentId::new(s.config.name.clone(), s.config.market, name.clone()).to_string(),
                    "source": s.config.name,
                    "symbol": info.symbol,
                    "status": info.status,
                    "tick_size": info.tick_size().map(|p| p.to_string()),
                    "step_size": info.step_size().map(|q| q.to_string()),
                }));
            }
        }
        out
    }

    /// `GET /api/v1/ops/sources`.
    pub fn snapshot(&self) -> Vec<serde_json::Value> {
        self.list
            .iter()
            .map(|s| {
                let st = s.status.lock().unwrap_or_else(|p| p.into_inner()).clone();
                let n = s.symbols.read().unwrap_or_else(|p| p.into_inner()).len();
                serde_json::json!({
                    "name": s.config.name,
                    "kind": s.config.kind,
                    "market": s.config.market,
                    "rest_base": s.rest_base,
                    "ws_base": s.ws_base,
                    "embedded_simulator": s.sim.is_some(),
                    "speed": if s.sim.is_some() { Some(s.config.speed) } else { None },
                    "ready": st.ready,
                    "symbols": n,
                    "last_error": st.last_error,
                    "loaded_at_ms": st.loaded_at_ms,
                    "rest_used_weight_1m": s.rest.used_weight_1m(),
                })
            })
            .collect()
    }
}
