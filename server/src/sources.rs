//! Market-data sources: each `[[sources]]` entry becomes a [`Source`] — its REST client, its
//! WebSocket base URL and its symbol list (from `exchangeInfo`). Where a `sim` source runs an
//! embedded simulator, the composition root (`app.rs`) starts it and passes its URLs in
//! ([`Endpoint`]); this module only speaks Binance's protocol to whatever is at the URLs.
//!
//! Symbols are loaded at start-up; if a source cannot be reached, millrace still starts, the
//! source is reported as not ready (with the error) in `GET /api/v1/ops/sources`, and loading is
//! retried in the background with the one back-off until it succeeds or the service stops.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex, RwLock};
use std::time::Duration;

use binance::rest::{RestClient, RestConfig};
use binance::wire::SymbolInfo;
use binance::Product;
use shared::backoff::Backoff;
use shared::candle::Timeframe;
use shared::protocol::ops::{InstrumentInfo, SourceKind, SourceStatus};
use shared::protocol::{InstrumentId, Market, SeriesId};
use tracing::Instrument as _;

use crate::clock::wall_clock_ms;
use crate::config::SourceConfig;
use crate::jitter::Jitter;
use crate::lock::{lock, read, write};
use crate::shutdown::Shutdown;

/// Why an instrument or series cannot be served.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ResolveError {
    #[error("{instrument}: no source named {name:?} is configured")]
    NoSource { instrument: InstrumentId, name: String },
    #[error("{instrument}: source {name} serves the {market} market", market = market.as_str())]
    WrongMarket { instrument: InstrumentId, name: String, market: Market },
    #[error("source {name} is not ready yet{}", last_error.as_ref().map(|e| format!(": {e}")).unwrap_or_default())]
    NotReady { name: String, last_error: Option<String> },
    #[error("{instrument}: source {name} has no symbol {}", instrument.symbol)]
    UnknownSymbol { instrument: InstrumentId, name: String },
    #[error("{series}: timeframe {} is not offered (offered: {offered})", series.timeframe)]
    Timeframe { series: SeriesId, offered: String },
}

/// Where a source's exchange is: its REST and WebSocket base URLs, and whether millrace runs
/// it (an embedded simulator).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Endpoint {
    pub rest_base: String,
    pub ws_base: String,
    pub embedded: bool,
}

impl Endpoint {
    /// The endpoint of a source reached over the network: its configured URLs, else the
    /// exchange's own for `product`.
    pub fn remote(sc: &SourceConfig, product: binance::Product) -> Endpoint {
        Endpoint {
            rest_base: sc
                .rest_base
                .clone()
                .unwrap_or_else(|| product.default_rest_url().to_string()),
            ws_base: sc.ws_base.clone().unwrap_or_else(|| product.default_ws_url().to_string()),
            embedded: false,
        }
    }
}

/// One configured source.
pub struct Source {
    pub config: SourceConfig,
    pub product: Product,
    pub rest: Arc<RestClient>,
    pub endpoint: Endpoint,
    /// `BASE/QUOTE` -> Binance symbol info.
    symbols: RwLock<BTreeMap<String, SymbolInfo>>,
    status: Mutex<Status>,
}

#[derive(Debug, Clone, Default)]
struct Status {
    ready: bool,
    last_error: Option<String>,
    loaded_at_ms: Option<i64>,
}

/// Why a source could not be set up at start.
#[derive(Debug, thiserror::Error)]
pub enum SourceError {
    #[error("source {name}: market {} is not served over the Binance protocol", market.as_str())]
    NotBinance { name: String, market: Market },
    #[error("source {name}: {source}")]
    Rest {
        name: String,
        #[source]
        source: binance::rest::RestError,
    },
}

impl Source {
    /// The Binance symbol of `instrument`, if this source lists it.
    pub fn symbol(&self, instrument: &InstrumentId) -> Result<String, ResolveError> {
        let symbols = read(&self.symbols);
        if symbols.is_empty() {
            let last_error = lock(&self.status).last_error.clone();
            return Err(ResolveError::NotReady { name: self.config.name.clone(), last_error });
        }
        match symbols.get(&instrument.symbol) {
            Some(info) => Ok(info.symbol.clone()),
            None => Err(ResolveError::UnknownSymbol {
                instrument: instrument.clone(),
                name: self.config.name.clone(),
            }),
        }
    }

    /// Reloads the symbol list from the exchange's exchangeInfo (a cluster's task query).
    pub async fn reload_symbols(&self) -> Result<usize, binance::rest::RestError> {
        self.load_symbols().await
    }

    async fn load_symbols(&self) -> Result<usize, binance::rest::RestError> {
        let info = self.rest.exchange_info().await?;
        let mut map = BTreeMap::new();
        for s in info.symbols {
            map.insert(format!("{}/{}", s.base_asset, s.quote_asset), s);
        }
        let n = map.len();
        *write(&self.symbols) = map;
        let mut st = lock(&self.status);
        st.ready = true;
        st.last_error = None;
        st.loaded_at_ms = Some(wall_clock_ms());
        Ok(n)
    }

    fn set_error(&self, e: &dyn std::fmt::Display) {
        lock(&self.status).last_error = Some(e.to_string());
    }

    /// Loads the symbols, retrying with back-off until it works or `shutdown` stops.
    async fn keep_loading(self: Arc<Self>, shutdown: Shutdown) {
        let mut backoff = Backoff::new(Duration::from_secs(2), Duration::from_secs(60));
        let mut jitter = Jitter::new(&self.config.name);
        loop {
            tokio::select! {
                () = tokio::time::sleep(backoff.next_delay(jitter.draw())) => {}
                () = shutdown.stopping() => return,
            }
            match self.load_symbols().await {
                Ok(n) => {
                    tracing::info!(symbols = n, "source ready");
                    return;
                }
                Err(e) => self.set_error(&e),
            }
        }
    }
}

/// The endpoints of sources that name their URLs (a cluster's roles never embed a simulator:
/// they reach the exchange, or a `millrace sim`, at `rest_base` / `ws_base`).
pub fn remote_endpoints(
    configs: &[SourceConfig],
) -> Result<Vec<Endpoint>, crate::config::ConfigError> {
    configs
        .iter()
        .enumerate()
        .map(|(i, sc)| {
            let product = binance::Product::of_market(sc.market).ok_or_else(|| {
                crate::config::ConfigError::Invalid {
                    key: format!("sources[{i}].market"),
                    problem: "is not served over the Binance protocol".into(),
                }
            })?;
            if sc.kind == crate::config::SourceKind::Sim
                && (sc.rest_base.is_none() || sc.ws_base.is_none())
            {
                return Err(crate::config::ConfigError::Invalid {
                    key: format!("sources[{i}].rest_base"),
                    problem: "a cluster role needs the URLs of a running `millrace sim` (rest_base and ws_base)".into(),
                });
            }
            Ok(Endpoint::remote(sc, product))
        })
        .collect()
}

/// All sources, by name.
pub struct Sources {
    list: Vec<Arc<Source>>,
    timeframes: Vec<Timeframe>,
}

impl Sources {
    /// Builds every source at its [`Endpoint`] (one per configured source, in order) and loads
    /// their symbols; a source that cannot be reached is retried in the background, as a part
    /// of `shutdown`.
    pub async fn start(
        configs: &[SourceConfig],
        endpoints: Vec<Endpoint>,
        derived: &[Timeframe],
        shutdown: &Shutdown,
    ) -> Result<Arc<Sources>, SourceError> {
        let mut list = Vec::new();
        for (sc, endpoint) in configs.iter().zip(endpoints) {
            let product = Product::of_market(sc.market).ok_or_else(|| SourceError::NotBinance {
                name: sc.name.clone(),
                market: sc.market,
            })?;
            let mut rest_config = RestConfig::new(product, endpoint.rest_base.clone());
            if let Some(budget) = sc.rest_weight_budget_1m {
                rest_config.weight_budget_1m = budget;
            }
            let rest = RestClient::new(rest_config)
                .map_err(|source| SourceError::Rest { name: sc.name.clone(), source })?;
            list.push(Arc::new(Source {
                config: sc.clone(),
                product,
                rest: Arc::new(rest),
                endpoint,
                symbols: RwLock::default(),
                status: Mutex::default(),
            }));
        }
        for s in &list {
            let span = tracing::info_span!("source", source = %s.config.name);
            match s.load_symbols().instrument(span.clone()).await {
                Ok(n) => tracing::info!(parent: &span, symbols = n, "source ready"),
                Err(e) => {
                    tracing::warn!(parent: &span, "cannot load symbols, retrying in the background: {e}");
                    s.set_error(&e);
                    shutdown.spawn(s.clone().keep_loading(shutdown.clone()).instrument(span));
                }
            }
        }
        let mut timeframes = vec![Timeframe::M1];
        timeframes.extend(derived.iter().copied());
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
    pub fn resolve(
        &self,
        instrument: &InstrumentId,
    ) -> Result<(Arc<Source>, String), ResolveError> {
        let source = self.get(&instrument.exchange).ok_or_else(|| ResolveError::NoSource {
            instrument: instrument.clone(),
            name: instrument.exchange.clone(),
        })?;
        if source.config.market != instrument.market {
            return Err(ResolveError::WrongMarket {
                instrument: instrument.clone(),
                name: source.config.name.clone(),
                market: source.config.market,
            });
        }
        let symbol = source.symbol(instrument)?;
        Ok((source.clone(), symbol))
    }

    /// Whether `series` can be served: known source and symbol, 1m or a derived timeframe.
    pub fn validate_series(&self, series: &SeriesId) -> Result<(), ResolveError> {
        if !self.timeframes.contains(&series.timeframe) {
            let offered = self.timeframes.iter().map(|t| t.name()).collect::<Vec<_>>().join(" ");
            return Err(ResolveError::Timeframe { series: series.clone(), offered });
        }
        self.resolve(&series.instrument).map(|_| ())
    }

    /// The timeframes offered: 1m and the derived ones.
    pub fn timeframes(&self) -> &[Timeframe] {
        &self.timeframes
    }

    /// The instruments offered, for `GET /api/v1/series`.
    pub fn instruments(&self) -> Vec<InstrumentInfo> {
        let mut out = Vec::new();
        for s in &self.list {
            let symbols = read(&s.symbols);
            for (name, info) in symbols.iter() {
                out.push(InstrumentInfo {
                    id: InstrumentId::new(s.config.name.clone(), s.config.market, name.clone()),
                    source: s.config.name.clone(),
                    symbol: info.symbol.clone(),
                    status: info.status.clone(),
                    tick_size: info.tick_size(),
                    step_size: info.step_size(),
                });
            }
        }
        out
    }

    /// `GET /api/v1/ops/sources`. An embedded simulator's address is left out unless `reveal`
    /// (an admin asks): only its owner needs it.
    pub fn snapshot(&self, reveal: bool) -> Vec<SourceStatus> {
        self.list
            .iter()
            .map(|s| {
                let st = lock(&s.status).clone();
                let symbols = read(&s.symbols).len();
                SourceStatus {
                    name: s.config.name.clone(),
                    kind: s.config.kind,
                    market: s.config.market,
                    rest_base: (reveal || !s.endpoint.embedded)
                        .then(|| s.endpoint.rest_base.clone()),
                    ws_base: (reveal || !s.endpoint.embedded).then(|| s.endpoint.ws_base.clone()),
                    embedded_simulator: s.endpoint.embedded,
                    speed: (s.config.kind == SourceKind::Sim && s.endpoint.embedded)
                        .then_some(s.config.speed),
                    ready: st.ready,
                    symbols,
                    last_error: st.last_error,
                    loaded_at_ms: st.loaded_at_ms,
                    rest_used_weight_1m: s.rest.used_weight_1m(),
                    rest_weight_budget_1m: Some(s.rest.weight_ledger().1),
                    rest_budget_refusals: s.rest.budget_refusals(),
                }
            })
            .collect()
    }
}
