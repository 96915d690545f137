//! [`VenueSource`]: one venue source, its URLs and its instrument list.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex, RwLock};
use std::time::Duration;

use shared::backoff::Backoff;
use shared::protocol::ops::{InstrumentInfo, SourceStatus};
use shared::protocol::InstrumentId;
use shared::venue::Dialect;
use tracing::Instrument as _;
use venues::rest::Instrument;

use crate::clock::wall_clock_ms;
use crate::config::SourceConfig;
use crate::jitter::Jitter;
use crate::lock::{lock, read, write};
use crate::shutdown::Shutdown;
use crate::sources::{Endpoint, ResolveError};

/// The largest instrument list read (Kraken's and OKX's are a few hundred KiB).
const MAX_BODY_BYTES: usize = 16 << 20;

/// Why a venue's REST answer could not be had.
#[derive(Debug, thiserror::Error)]
pub enum VenueRestError {
    #[error("{venue} {what}: {reason}")]
    Transport { venue: Dialect, what: String, reason: String },
    #[error("{venue} {what}: the answer is larger than {max} bytes")]
    TooLarge { venue: Dialect, what: String, max: usize },
    #[error("{venue} {what}: HTTP {status} (rate limited): {body}")]
    RateLimited { venue: Dialect, what: String, status: u16, body: String },
    #[error("{venue} {what}: {source}")]
    Answer {
        venue: Dialect,
        what: &'static str,
        #[source]
        source: venues::WireError,
    },
    #[error("{venue} instruments: the venue listed none")]
    NoInstruments { venue: Dialect },
}

impl VenueRestError {
    /// Whether the venue said we asked too often.
    pub fn is_rate_limit(&self) -> bool {
        matches!(self, VenueRestError::RateLimited { .. })
    }
}

#[derive(Debug, Default, Clone)]
struct Status {
    ready: bool,
    last_error: Option<String>,
    loaded_at_ms: Option<i64>,
}

/// The pace a venue allows: at most one request (or one new WebSocket) per `every`, whoever
/// asks; the others wait their turn. Counted: how many were made and how many had to wait.
pub struct Pace {
    every: Duration,
    next: tokio::sync::Mutex<tokio::time::Instant>,
    made: std::sync::atomic::AtomicU64,
    waited: std::sync::atomic::AtomicU64,
}

impl Pace {
    fn new(every: Duration) -> Self {
        Pace {
            every,
            next: tokio::sync::Mutex::new(tokio::time::Instant::now()),
            made: Default::default(),
            waited: Default::default(),
        }
    }

    /// Waits for this request's turn.
    pub async fn turn(&self) {
        use std::sync::atomic::Ordering::Relaxed;
        let mut next = self.next.lock().await;
        let now = tokio::time::Instant::now();
        if *next > now {
            self.waited.fetch_add(1, Relaxed);
            tokio::time::sleep_until(*next).await;
        }
        *next = (*next).max(now) + self.every;
        self.made.fetch_add(1, Relaxed);
    }

    /// Requests allowed per minute at this pace.
    pub fn per_minute(&self) -> u32 {
        u32::try_from(60_000 / self.every.as_millis().max(1)).unwrap_or(u32::MAX)
    }

    pub fn made(&self) -> u64 {
        self.made.load(std::sync::atomic::Ordering::Relaxed)
    }

    pub fn waited(&self) -> u64 {
        self.waited.load(std::sync::atomic::Ordering::Relaxed)
    }
}

/// A venue's public limits, kept with a margin: REST requests (OKX 20 per 2 s per endpoint,
/// Bybit 600 per 5 s per IP, Coinbase 10 per second, Kraken about 1 per second) and new
/// WebSocket connections (OKX 3 per second, Bybit 500 per 5 minutes, Kraken about 150 per 10
/// minutes with bursts).
fn limits(dialect: Dialect) -> (Duration, Duration) {
    let ms = Duration::from_millis;
    match dialect {
        Dialect::Okx => (ms(120), ms(350)),
        Dialect::Bybit => (ms(50), ms(100)),
        Dialect::Coinbase => (ms(120), ms(100)),
        Dialect::Kraken => (ms(1_000), ms(500)),
        Dialect::Binance => (ms(50), ms(100)),
    }
}

/// The most pages of an instrument list read (Bybit's linear list: 1,000 a page).
const MAX_INSTRUMENT_PAGES: usize = 20;

/// One source of a venue's kind.
pub struct VenueSource {
    /// Its REST requests' pace, and its new connections'.
    pub rest_pace: Pace,
    pub connect_pace: Pace,
    pub config: SourceConfig,
    pub dialect: Dialect,
    pub endpoint: Endpoint,
    http: reqwest::Client,
    /// `BASE/QUOTE` → the venue's instrument.
    listings: RwLock<BTreeMap<String, Instrument>>,
    status: Mutex<Status>,
    /// Where its frames are recorded (`[record]`), if they are.
    pub tap: std::sync::OnceLock<crate::recording::Tap>,
    /// The venue's clock, sampled by `Sources::keep_clocks` (a cluster's bounds judge the
    /// times of this venue's candles on the bus by it).
    pub clock: crate::sources::ExchangeClock,
}

impl VenueSource {
    pub fn new(config: SourceConfig, endpoint: Endpoint) -> Self {
        let http = reqwest::Client::builder()
            .timeout(Duration::from_secs(10))
            .connect_timeout(Duration::from_secs(5))
            .build()
            .unwrap_or_default();
        let (rest, connect) = limits(config.kind.dialect());
        VenueSource {
            rest_pace: Pace::new(rest),
            connect_pace: Pace::new(connect),
            dialect: config.kind.dialect(),
            config,
            endpoint,
            http,
            listings: RwLock::default(),
            status: Mutex::default(),
            clock: crate::sources::ExchangeClock::default(),
            tap: std::sync::OnceLock::new(),
        }
    }

    /// The venue's instrument of `instrument`.
    pub fn listing(&self, instrument: &InstrumentId) -> Result<Instrument, ResolveError> {
        let listings = read(&self.listings);
        if listings.is_empty() {
            let last_error = lock(&self.status).last_error.clone();
            return Err(ResolveError::NotReady { name: self.config.name.clone(), last_error });
        }
        if instrument.market != self.config.market {
            return Err(ResolveError::WrongMarket {
                instrument: instrument.clone(),
                name: self.config.name.clone(),
                market: self.config.market,
            });
        }
        listings.get(&instrument.symbol).cloned().ok_or_else(|| ResolveError::UnknownSymbol {
            instrument: instrument.clone(),
            name: self.config.name.clone(),
        })
    }

    /// `GET {rest_base}{path}`: the answer's text, at most [`MAX_BODY_BYTES`], whatever its
    /// status (the venue's own error body says why; the readers recognise it), except a rate
    /// limit (429, 418), which is an error saying so.
    pub async fn get_text(&self, path: &str) -> Result<String, VenueRestError> {
        let url = format!("{}{path}", self.endpoint.rest_base);
        let what = path.split('?').next().unwrap_or(path).to_string();
        self.rest_pace.turn().await;
        let venue = self.dialect;
        let transport = |e: reqwest::Error, what: &str| VenueRestError::Transport {
            venue,
            what: what.to_string(),
            reason: crate::redact::redact(&e.to_string()),
        };
        let conn = crate::recording::next_conn();
        if let Some(tap) = self.tap.get() {
            let meta = format!("GET {}", crate::redact::redact(&url));
            tap.record(recording::Kind::RestRequest, conn, meta, bytes::Bytes::new());
        }
        let mut resp = self.http.get(&url).send().await.map_err(|e| transport(e, &what))?;
        let status = resp.status();
        let mut body = Vec::new();
        while let Some(chunk) = resp.chunk().await.map_err(|e| transport(e, &what))? {
            if body.len() + chunk.len() > MAX_BODY_BYTES {
                return Err(VenueRestError::TooLarge { venue, what, max: MAX_BODY_BYTES });
            }
            body.extend_from_slice(&chunk);
        }
        if let Some(tap) = self.tap.get() {
            let body = bytes::Bytes::copy_from_slice(&body);
            tap.record(recording::Kind::RestAnswer, conn, status.as_u16().to_string(), body);
        }
        let text = String::from_utf8_lossy(&body).into_owned();
        if matches!(status.as_u16(), 418 | 429) {
            let body = text.chars().take(200).collect();
            return Err(VenueRestError::RateLimited { venue, what, status: status.as_u16(), body });
        }
        Ok(text)
    }

    /// Loads the instrument list from the venue's REST API.
    pub async fn load(&self) -> Result<usize, VenueRestError> {
        let path = venues::rest::instruments_path(self.dialect, self.config.market);
        let mut text = self.get_text(path).await?;
        let mut list = Vec::new();
        // a list in pages (Bybit's linear one): at most MAX_INSTRUMENT_PAGES of them
        for page in 1.. {
            let more = venues::rest::parse_instruments(self.dialect, &text).map_err(|source| {
                VenueRestError::Answer { venue: self.dialect, what: "instruments", source }
            })?;
            list.extend(more);
            let Some(cursor) = venues::rest::next_page_cursor(self.dialect, &text) else { break };
            if page >= MAX_INSTRUMENT_PAGES {
                tracing::warn!(
                    pages = page,
                    "instrument list cut after {MAX_INSTRUMENT_PAGES} pages"
                );
                break;
            }
            let cursor: String = cursor
                .bytes()
                .map(|b| match b {
                    b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'%' | b'-' | b'_' | b'.' => {
                        char::from(b).to_string()
                    }
                    other => format!("%{other:02X}"),
                })
                .collect();
            text = self.get_text(&format!("{path}&cursor={cursor}")).await?;
        }
        let map: BTreeMap<String, Instrument> =
            list.into_iter().map(|i| (format!("{}/{}", i.base, i.quote), i)).collect();
        let n = map.len();
        if n == 0 {
            return Err(VenueRestError::NoInstruments { venue: self.dialect });
        }
        *write(&self.listings) = map;
        let mut st = lock(&self.status);
        st.ready = true;
        st.last_error = None;
        st.loaded_at_ms = Some(wall_clock_ms());
        Ok(n)
    }

    /// Loads the instruments now, and in the background with the back-off while that fails.
    pub async fn start(self: &Arc<Self>, shutdown: &Shutdown) {
        let span = tracing::info_span!("source", source = %self.config.name, venue = %self.dialect);
        match self.load().instrument(span.clone()).await {
            Ok(n) => tracing::info!(parent: &span, symbols = n, "venue source ready"),
            Err(e) => {
                tracing::warn!(parent: &span, "cannot load the instruments, retrying in the background: {e}");
                lock(&self.status).last_error = Some(e.to_string());
                let (me, stop) = (self.clone(), shutdown.clone());
                shutdown.spawn(
                    async move {
                        let mut backoff =
                            Backoff::new(Duration::from_secs(2), Duration::from_secs(60));
                        let mut jitter = Jitter::new(&me.config.name);
                        loop {
                            tokio::select! {
                                () = tokio::time::sleep(backoff.next_delay(jitter.draw())) => {}
                                () = stop.stopping() => return,
                            }
                            match me.load().await {
                                Ok(n) => {
                                    tracing::info!(symbols = n, "venue source ready");
                                    return;
                                }
                                Err(e) => lock(&me.status).last_error = Some(e.to_string()),
                            }
                        }
                    }
                    .instrument(span),
                );
            }
        }
    }

    /// Its instruments, for `GET /api/v1/series`.
    pub fn instruments(&self) -> Vec<InstrumentInfo> {
        read(&self.listings)
            .iter()
            .map(|(name, i)| InstrumentInfo {
                id: InstrumentId::new(self.config.name.clone(), self.config.market, name.clone()),
                source: self.config.name.clone(),
                symbol: i.symbol.clone(),
                status: i.status.clone(),
                tick_size: i.tick,
                step_size: i.lot,
            })
            .collect()
    }

    /// `GET /api/v1/ops/sources`.
    pub fn status(&self, reveal: bool) -> SourceStatus {
        let st = lock(&self.status).clone();
        SourceStatus {
            name: self.config.name.clone(),
            kind: self.config.kind,
            market: self.config.market,
            rest_base: (reveal || !self.endpoint.embedded).then(|| self.endpoint.rest_base.clone()),
            ws_base: (reveal || !self.endpoint.embedded).then(|| self.endpoint.ws_base.clone()),
            embedded_simulator: self.endpoint.embedded,
            speed: None,
            ready: st.ready,
            symbols: read(&self.listings).len(),
            last_error: st.last_error,
            loaded_at_ms: st.loaded_at_ms,
            // requests made, the pace's allowance a minute, and requests that waited their turn
            rest_used_weight_1m: Some(u32::try_from(self.rest_pace.made()).unwrap_or(u32::MAX)),
            rest_weight_budget_1m: Some(self.rest_pace.per_minute()),
            rest_budget_refusals: self.rest_pace.waited() + self.connect_pace.waited(),
        }
    }
}

impl crate::sources::Clocked for VenueSource {
    fn name(&self) -> &str {
        &self.config.name
    }
    fn clock(&self) -> &crate::sources::ExchangeClock {
        &self.clock
    }
    /// The venue's clock endpoint (`venues::rest::time_path`), paced like its other requests.
    fn read_time(&self) -> futures_util::future::BoxFuture<'_, Result<i64, String>> {
        Box::pin(async move {
            let text = self.get_text(venues::rest::time_path(self.dialect)).await;
            let text = text.map_err(|e| e.to_string())?;
            venues::rest::parse_server_time(self.dialect, &text).map_err(|e| e.to_string())
        })
    }
}

impl VenueSource {
    /// The recording of this source's frames, if it is recorded.
    pub fn tap(&self) -> Option<crate::recording::Tap> {
        self.tap.get().cloned()
    }
}
