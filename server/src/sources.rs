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
use std::time::{Duration, Instant};

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
use crate::venue::VenueSource;

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
    #[error("{instrument}: source {name} is a {venue} source, not Binance's")]
    NotBinance { instrument: InstrumentId, name: String, venue: shared::venue::Dialect },
    #[error("{instrument}: trades of tick-by-tick books are not published")]
    NoTrades { instrument: InstrumentId },
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
        let dialect = sc.kind.dialect();
        if dialect != shared::venue::Dialect::Binance {
            let (rest, ws) = crate::venue::default_urls(dialect, sc.market);
            return Endpoint {
                rest_base: sc.rest_base.clone().unwrap_or_else(|| rest.to_string()),
                ws_base: sc.ws_base.clone().unwrap_or_else(|| ws.to_string()),
                embedded: false,
            };
        }
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
    /// The exchange's clock as sampled by [`Sources::keep_clocks`] (a cluster's gateway bounds
    /// the times of what it reads from the bus by it).
    clock: ExchangeClock,
    /// Where its frames are recorded (`[record]`), if they are.
    tap: std::sync::OnceLock<crate::recording::Tap>,
}

impl Source {
    /// The recording of this source's frames, if it is recorded.
    pub fn tap(&self) -> Option<crate::recording::Tap> {
        self.tap.get().cloned()
    }
}

/// The exchange's clock as this process sees it: samples of the exchange's `/time` against the
/// local monotonic clock, extrapolated at the rate measured between the last two samples (a
/// simulator may run at any speed; a real exchange's rate is 1). Kept by
/// [`Sources::keep_clocks`], which samples again at once when asked ([`ExchangeClock::refresh`]).
#[derive(Debug, Default)]
pub struct ExchangeClock {
    /// The last two samples: (local instant, the exchange's ms), the older first. Guards a
    /// few integers.
    samples: Mutex<[Option<Sample>; 2]>,
    wanted: tokio::sync::Notify,
}

impl ExchangeClock {
    /// The exchange's time now, if it was ever sampled.
    pub fn now_ms(&self) -> Option<i64> {
        let [prev, last] = *lock(&self.samples);
        let (at, ms) = last?;
        let elapsed = i64::try_from(at.elapsed().as_millis()).unwrap_or(i64::MAX);
        Some(extrapolate(prev.map(|(p, m)| (p, m, at, ms)), ms, elapsed))
    }

    /// Whether two readings far enough apart to measure the rate were taken.
    fn has_rate(&self) -> bool {
        lock(&self.samples)[0].is_some()
    }

    /// When it was last sampled.
    pub fn sampled_at(&self) -> Option<Instant> {
        lock(&self.samples)[1].map(|(at, _)| at)
    }

    /// Asks for a fresh sample (a reader found a time beyond the estimate).
    pub fn refresh(&self) {
        self.wanted.notify_one();
    }

    fn record(&self, at: Instant, exchange_ms: i64) {
        let mut s = lock(&self.samples);
        // a sample less than a second after the last replaces it: too close to measure a rate
        if s[1].is_some_and(|(last, _)| at.duration_since(last) >= Duration::from_secs(1)) {
            s[0] = s[1];
        }
        s[1] = Some((at, exchange_ms));
    }
}

/// A reading of the exchange's clock: when (locally), and what it said (ms).
type Sample = (Instant, i64);

/// The exchange's time `elapsed_ms` after a sample of `ms`, at the rate between that sample
/// and the one before (`prev`: its instant and ms, then the last's) when they are at least a
/// second apart and the exchange's clock went forward; else at rate 1. The rate is bounded to
/// [0, 10,000] (a simulator's speed).
fn extrapolate(prev: Option<(Instant, i64, Instant, i64)>, ms: i64, elapsed_ms: i64) -> i64 {
    let rate = prev.and_then(|(p_at, p_ms, at, ms)| {
        let local = i128::try_from(at.duration_since(p_at).as_millis()).ok()?;
        (local >= 1_000 && ms >= p_ms).then(|| (i128::from(ms - p_ms), local))
    });
    let ahead = match rate {
        Some((num, den)) => {
            (i128::from(elapsed_ms) * num / den).min(i128::from(elapsed_ms) * 10_000)
        }
        None => i128::from(elapsed_ms),
    };
    ms.saturating_add(i64::try_from(ahead).unwrap_or(i64::MAX))
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

    /// The exchange's time now, as last read by [`Sources::keep_clocks`] (`None`: never read).
    pub fn clock_now_ms(&self) -> Option<i64> {
        self.clock.now_ms()
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
    /// Sources of the other venues' kinds ([`crate::venue`]).
    venues: Vec<Arc<VenueSource>>,
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
        Self::start_with(configs, endpoints, Vec::new(), derived, None, shutdown).await
    }

    /// [`Self::start`] with more venue sources than the configured ones (an embedded
    /// simulator's four dialects).
    pub async fn start_with(
        configs: &[SourceConfig],
        endpoints: Vec<Endpoint>,
        extra: Vec<(SourceConfig, Endpoint)>,
        derived: &[Timeframe],
        recording: Option<&crate::recording::Recording>,
        shutdown: &Shutdown,
    ) -> Result<Arc<Sources>, SourceError> {
        let mut list = Vec::new();
        let mut venues = Vec::new();
        let all = configs.iter().cloned().zip(endpoints).chain(extra);
        for (sc, endpoint) in all {
            if sc.kind.dialect() != shared::venue::Dialect::Binance {
                let v = Arc::new(VenueSource::new(sc, endpoint));
                // recorded from its first request on (its instrument list: a reader needs it)
                if let Some(tap) = recording.and_then(|r| r.tap(&v.config.name)) {
                    let _ = v.tap.set(tap);
                    recording.expect("a tap").describe(&v.config.name, v.dialect, v.config.market);
                }
                v.start(shutdown).await;
                venues.push(v);
                continue;
            }
            let sc = &sc;
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
                clock: ExchangeClock::default(),
                tap: std::sync::OnceLock::new(),
            }));
            if let (Some(r), Some(s)) = (recording, list.last()) {
                if let Some(tap) = r.tap(&s.config.name) {
                    // its REST answers too (snapshots, gap fills, the symbol list, the clock)
                    s.rest.observe(Arc::new(tap.clone()));
                    let _ = s.tap.set(tap);
                    r.describe(&s.config.name, s.config.kind.dialect(), s.config.market);
                }
            }
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
        Ok(Arc::new(Sources { list, venues, timeframes }))
    }

    /// The source named `name`.
    pub fn get(&self, name: &str) -> Option<&Arc<Source>> {
        self.list.iter().find(|s| s.config.name == name)
    }

    /// The venue source named `name` (OKX, Bybit, Coinbase, Kraken).
    pub fn venue(&self, name: &str) -> Option<&Arc<VenueSource>> {
        self.venues.iter().find(|s| s.config.name == name)
    }

    /// Every venue source.
    pub fn venues(&self) -> &[Arc<VenueSource>] {
        &self.venues
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
        if let Some(v) = self.venue(&instrument.exchange) {
            return Err(ResolveError::NotBinance {
                instrument: instrument.clone(),
                name: v.config.name.clone(),
                venue: v.dialect,
            });
        }
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

    /// Whether `instrument` is listed by one of the sources (Binance's or a venue's).
    pub fn validate_instrument(&self, instrument: &InstrumentId) -> Result<(), ResolveError> {
        if let Some(v) = self.venue(&instrument.exchange) {
            return v.listing(instrument).map(|_| ());
        }
        self.resolve(instrument).map(|_| ())
    }

    /// Whether `series` can be served: known source and symbol, 1m or a derived timeframe.
    pub fn validate_series(&self, series: &SeriesId) -> Result<(), ResolveError> {
        if !self.timeframes.contains(&series.timeframe) {
            let offered = self.timeframes.iter().map(|t| t.name()).collect::<Vec<_>>().join(" ");
            return Err(ResolveError::Timeframe { series: series.clone(), offered });
        }
        self.validate_instrument(&series.instrument)
    }

    /// Samples every source's clock (Binance's `/time`, each venue's own) now and then every
    /// `every`, or sooner when a reader asks ([`ExchangeClock::refresh`]; at most one sample a
    /// second), until `shutdown`. A failed sample keeps the last estimate and is retried at the
    /// next turn.
    pub fn keep_clocks(&self, every: Duration, shutdown: &Shutdown) {
        for s in &self.list {
            keep_clock(s.clone(), every, shutdown);
        }
        for v in &self.venues {
            keep_clock(v.clone(), every, shutdown);
        }
    }

    /// The clock of `instrument`'s source, if it is one of ours.
    pub fn clock(&self, instrument: &InstrumentId) -> Option<&ExchangeClock> {
        if let Some(v) = self.venue(&instrument.exchange) {
            return Some(&v.clock);
        }
        self.get(&instrument.exchange).map(|s| &s.clock)
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
        for v in &self.venues {
            out.extend(v.instruments());
        }
        out
    }

    /// `GET /api/v1/ops/sources`. An embedded simulator's address is left out unless `reveal`
    /// (an admin asks): only its owner needs it.
    pub fn snapshot(&self, reveal: bool) -> Vec<SourceStatus> {
        let venues = self.venues.iter().map(|v| v.status(reveal));
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
            .chain(venues)
            .collect()
    }
}

/// A source whose clock [`Sources::keep_clocks`] samples.
pub trait Clocked: Send + Sync + 'static {
    fn name(&self) -> &str;
    fn clock(&self) -> &ExchangeClock;
    /// The exchange's time now (Unix ms), as its clock endpoint says.
    fn read_time(&self) -> futures_util::future::BoxFuture<'_, Result<i64, String>>;
}

impl Clocked for Source {
    fn name(&self) -> &str {
        &self.config.name
    }
    fn clock(&self) -> &ExchangeClock {
        &self.clock
    }
    fn read_time(&self) -> futures_util::future::BoxFuture<'_, Result<i64, String>> {
        Box::pin(async move { self.rest.server_time().await.map_err(|e| e.to_string()) })
    }
}

/// Samples `s`'s clock until `shutdown` (see [`Sources::keep_clocks`]).
fn keep_clock<S: Clocked>(s: Arc<S>, every: Duration, shutdown: &Shutdown) {
    let stop = shutdown.clone();
    let span = tracing::info_span!("source_clock", source = %s.name());
    shutdown.spawn(
        async move {
            let mut failing = false;
            loop {
                let asked = Instant::now();
                match s.read_time().await {
                    Ok(ms) => {
                        // the answer's time is about the middle of the request
                        s.clock().record(asked + asked.elapsed() / 2, ms);
                        if std::mem::take(&mut failing) {
                            tracing::info!("the exchange's clock answers again");
                        }
                    }
                    Err(e) if !failing => {
                        failing = true;
                        tracing::warn!("cannot read the exchange's clock: {e}");
                    }
                    Err(_) => {}
                }
                // the second reading a second after the first: the rate is known at once
                let wait = if s.clock().has_rate() { every } else { Duration::from_secs(1) };
                let next = tokio::time::sleep(wait);
                tokio::select! {
                    () = next => {}
                    () = s.clock().wanted.notified() => {
                        tokio::time::sleep(Duration::from_secs(1).saturating_sub(asked.elapsed())).await;
                    }
                    () = stop.stopping() => return,
                }
            }
        }
        .instrument(span),
    );
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_exchange_clock_is_extrapolated_at_its_measured_rate() {
        let t0 = Instant::now();
        let t1 = t0 + Duration::from_secs(10);
        // one sample: rate 1
        assert_eq!(extrapolate(None, 1_000_000, 500), 1_000_500);
        // a simulator at speed 60: ten local seconds were ten exchange minutes
        let prev = Some((t0, 1_000_000, t1, 1_000_000 + 600_000));
        assert_eq!(extrapolate(prev, 1_600_000, 1_000), 1_600_000 + 60_000);
        // samples too close to measure, or an exchange clock that went back (a restart): rate 1
        let close = Some((t0, 1_000_000, t0 + Duration::from_millis(200), 1_000_000 + 12_000));
        assert_eq!(extrapolate(close, 1_012_000, 1_000), 1_013_000);
        let back = Some((t0, 5_000_000, t1, 1_000_000));
        assert_eq!(extrapolate(back, 1_000_000, 1_000), 1_001_000);
        // an absurd rate is bounded
        let wild = Some((t0, 0, t1, i64::MAX / 2));
        assert_eq!(extrapolate(wild, 0, 1_000), 10_000_000);
    }

    #[test]
    fn samples_a_second_apart_measure_the_rate() {
        let c = ExchangeClock::default();
        assert_eq!(c.now_ms(), None);
        let t0 = Instant::now() - Duration::from_secs(20);
        c.record(t0, 1_000_000);
        c.record(t0 + Duration::from_millis(10), 1_000_010); // too close: replaces
        c.record(t0 + Duration::from_secs(10), 1_000_010 + 600_000); // speed 60
        let now = c.now_ms().unwrap();
        // about ten more local seconds at speed 60
        let want = 1_600_010 + 600_000;
        assert!((now - want).abs() < 6_000, "{now} vs {want}");
    }
}
