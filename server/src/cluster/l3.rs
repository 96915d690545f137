//! The tick-by-tick books on one worker of a cluster (`[l3] host = "worker:ID"`): the host's
//! NATS responder and a gateway's [`RemoteL3`] (the service's [`RemoteBooks`] plug point).
//!
//! The engine of seed 001 runs in one process. On one machine that is the server; in a cluster
//! it is either every gateway (`host = "gateway"`, each with its own engine and feeds, as on one
//! machine) or one worker, which frees the gateways of the engine's cores:
//! - the host publishes its books on the NATS bus (their topics travel:
//!   [`crate::bus::NatsBus::share_tick_books`]); a gateway passes the host's deltas, with the
//!   host's update ids, to its browsers;
//! - everything else the API asks of the books — a book's REST snapshot (with the same ids), the
//!   engine's report, migrations, auto-balance, hot spots — is a NATS request to the host on
//!   `{prefix}.l3.request` ([`L3Request`]), answered by the same code that answers on one machine
//!   ([`super::control`]);
//! - a gateway asks for the engine's report every tick ([`RemoteL3`]): it learns the host's books
//!   (a subscription to one needs no job lease) and serves their metrics, and `/healthz` says
//!   when the host has not answered for a while.
//!
//! Admin requests are authorised by the gateway (its `admin_token`) before they are forwarded,
//! and carry a [`Proof`] that their sender holds the admin token: the host, configured with the
//! same token, refuses an admin request without a valid, fresh, unseen proof (anyone who can
//! publish on the bus could send one), and counts it ([`Poison::Unsigned`]).

use std::collections::HashSet;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures_util::future::BoxFuture;
use futures_util::StreamExt as _;
use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};
use shared::protocol::ops::{
    ApiErrorCode as Code, AutoBalanceReply, AutoBalanceRequest, BookInfo, EngineStats,
    HotspotReply, HotspotRequest, MigrateReply, MigrateRequest, ShardsReport,
};
use shared::protocol::{BookHealth, InstrumentId, Market, RestDepth};

use crate::books::BookRegistry;
use crate::bus::PoisonStats;
use crate::clock::wall_clock_ms;
use crate::cluster::proof::{self, Proof, Verifier};
use crate::l3::control::Refusal;
use crate::l3::remote::RemoteBooks;
use crate::l3::L3Books;
use crate::lock::lock;
use crate::shutdown::Shutdown;
use shared::cluster::bounds::Poison;

/// How long a gateway waits for the host's answer.
const ASK_WAIT: Duration = Duration::from_secs(2);

/// After this many refresh periods without an answer, `/healthz` reports the host missing.
const MISSED_REFRESHES: i64 = 3;

/// A request to the tick-by-tick host.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "op", content = "body", rename_all = "snake_case")]
pub enum L3Request {
    Shards,
    Books,
    Depth { instrument: InstrumentId, limit: usize },
    Migrate(MigrateRequest),
    AutoBalance(AutoBalanceRequest),
    Hotspot(HotspotRequest),
}

impl L3Request {
    /// What an admin request asks, for its proof (`None`: a read, which needs none).
    fn admin_purpose(&self) -> Option<&'static str> {
        match self {
            L3Request::Shards | L3Request::Books | L3Request::Depth { .. } => None,
            L3Request::Migrate(_) => Some("l3 migrate"),
            L3Request::AutoBalance(_) => Some("l3 auto_balance"),
            L3Request::Hotspot(_) => Some("l3 hotspot"),
        }
    }
}

/// A request as it travels: what is asked, and for an admin request its proof over the
/// request's JSON.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct L3Message {
    pub request: L3Request,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub proof: Option<Proof>,
}

impl L3Message {
    /// `request`, signed with `token` when it is an admin request.
    fn new(request: &L3Request, token: Option<&str>) -> L3Message {
        let proof = request.admin_purpose().zip(token).map(|(purpose, token)| {
            let body = serde_json::to_vec(request).expect("serialisable");
            proof::sign(token, purpose, &body, wall_clock_ms())
        });
        L3Message { request: request.clone(), proof }
    }
}

/// The subject of requests to the tick-by-tick host of the cluster under `prefix`.
pub fn request_subject(prefix: &str) -> String {
    format!("{prefix}.l3.request")
}

/// Answers the requests on `subject` with `books` until `shutdown`, each on a task of its own
/// (a hot-spot request waits for the simulator). Admin requests must carry a proof of
/// `admin_token`; refused ones are counted in `poison`.
pub async fn serve(
    books: Arc<L3Books>,
    client: async_nats::Client,
    subject: String,
    admin_token: Option<&str>,
    poison: Arc<PoisonStats>,
    shutdown: &Shutdown,
) -> Result<(), async_nats::SubscribeError> {
    let mut sub = client.subscribe(subject).await?;
    let verifier = Arc::new(Verifier::new(admin_token));
    let (spawner, stop) = (shutdown.clone(), shutdown.clone());
    shutdown.spawn(async move {
        loop {
            let m = tokio::select! {
                m = sub.next() => match m { Some(m) => m, None => break },
                () = stop.stopping() => break,
            };
            let Some(reply) = m.reply else { continue };
            let (books, client) = (books.clone(), client.clone());
            let (verifier, poison) = (verifier.clone(), poison.clone());
            spawner.spawn(async move {
                let body = answer(&books, &verifier, &poison, &m.payload).await;
                let _ = client.publish(reply, body.into()).await;
            });
        }
    });
    Ok(())
}

/// The host's answer to one request: `{"Ok":…}` or `{"Err":Refusal}`.
async fn answer(
    books: &L3Books,
    verifier: &Verifier,
    poison: &PoisonStats,
    payload: &[u8],
) -> Vec<u8> {
    let result: Result<serde_json::Value, Refusal> = match serde_json::from_slice(payload) {
        Err(e) => {
            poison.record(Poison::Unparsable, "a tick-by-tick request that does not parse");
            Err(Refusal::bad(Code::Malformed, format!("not a tick-by-tick request: {e}")))
        }
        Ok(L3Message { request, proof }) => {
            let proven = match request.admin_purpose() {
                None => Ok(()),
                Some(purpose) => {
                    let body = serde_json::to_vec(&request).expect("serialisable");
                    verifier.verify(purpose, &body, proof.as_ref(), wall_clock_ms())
                }
            };
            match proven {
                Err(e) => {
                    poison.record(Poison::Unsigned, format_args!("an admin request refused: {e}"));
                    Err(Refusal { status: 403, code: Code::Unauthorized, msg: e.to_string() })
                }
                Ok(()) => match request {
                    L3Request::Shards => Ok(value(&books.shards().await)),
                    L3Request::Books => Ok(value(&books.books())),
                    L3Request::Depth { instrument, limit } => {
                        Ok(value(&books.depth(&instrument, limit)))
                    }
                    L3Request::Migrate(r) => books.migrate(&r).map(|r| value(&r)),
                    L3Request::AutoBalance(r) => Ok(value(&books.auto_balance(&r))),
                    L3Request::Hotspot(r) => books.hotspot(&r).await.map(|r| value(&r)),
                },
            }
        }
    };
    serde_json::to_vec(&result).expect("serialisable")
}

fn value<T: Serialize>(v: &T) -> serde_json::Value {
    serde_json::to_value(v).expect("serialisable")
}

/// What a gateway last learnt from the host.
#[derive(Default)]
struct Known {
    engine: Option<EngineStats>,
    instruments: HashSet<InstrumentId>,
    /// When the host last answered, ms (0: never).
    answered_ms: i64,
    /// Why the last request failed.
    error: Option<String>,
}

/// A gateway's way to the tick-by-tick books on a worker.
pub struct RemoteL3 {
    client: async_nats::Client,
    subject: String,
    /// `l3.host`, for messages.
    host: String,
    /// The tick-by-tick sources' names: a stock of one is the host's before it first answers.
    sources: Vec<String>,
    refresh: Duration,
    started_ms: i64,
    known: Mutex<Known>,
    /// Signs forwarded admin requests (see [`Proof`]).
    admin_token: Option<String>,
}

impl RemoteL3 {
    /// Starts asking `host` for its report every `refresh`, marking its books always on in
    /// `registry` (a subscription to one needs no job).
    #[allow(clippy::too_many_arguments)]
    pub fn start(
        client: async_nats::Client,
        prefix: &str,
        host: &str,
        sources: Vec<String>,
        registry: Arc<BookRegistry>,
        refresh: Duration,
        admin_token: Option<String>,
        shutdown: &Shutdown,
    ) -> Arc<Self> {
        let remote = Arc::new(RemoteL3 {
            client,
            subject: request_subject(prefix),
            host: host.to_string(),
            sources,
            refresh,
            started_ms: wall_clock_ms(),
            known: Mutex::new(Known::default()),
            admin_token,
        });
        let (r, stop) = (remote.clone(), shutdown.clone());
        shutdown.spawn(async move {
            let mut tick = tokio::time::interval(r.refresh);
            tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            loop {
                tokio::select! {
                    _ = tick.tick() => {}
                    () = stop.stopping() => break,
                }
                if let Ok(report) = r.shards().await {
                    for s in &report.engine.symbols {
                        registry.set_always_on(&s.instrument);
                    }
                }
            }
        });
        remote
    }

    /// Asks the host; a timeout, an unreachable NATS or an unreadable answer is a 503.
    async fn ask<T: DeserializeOwned>(&self, request: &L3Request) -> Result<T, Refusal> {
        let message = L3Message::new(request, self.admin_token.as_deref());
        let body = serde_json::to_vec(&message).expect("serialisable");
        let host = &self.host;
        let asked =
            tokio::time::timeout(ASK_WAIT, self.client.request(self.subject.clone(), body.into()));
        let result = match asked.await {
            Err(_) => Err(format!(
                "the tick-by-tick host (l3.host = {host}) did not answer within {ASK_WAIT:?}"
            )),
            Ok(Err(e)) if e.kind() == async_nats::RequestErrorKind::NoResponders => Err(format!(
                "the tick-by-tick host (l3.host = {host}) is not running: nothing answers on NATS"
            )),
            Ok(Err(e)) => Err(format!(
                "the tick-by-tick host (l3.host = {host}) did not answer: {}",
                e.kind()
            )),
            Ok(Ok(m)) => serde_json::from_slice::<Result<T, Refusal>>(&m.payload).map_err(|e| {
                format!("the answer of the tick-by-tick host (l3.host = {host}) did not parse: {e}")
            }),
        };
        let mut known = lock(&self.known);
        match result {
            Ok(answer) => {
                known.answered_ms = wall_clock_ms();
                known.error = None;
                answer
            }
            Err(why) => {
                known.error = Some(why.clone());
                Err(Refusal::unavailable(why))
            }
        }
    }

    /// The engine's report (and the host's books and stats kept for later).
    pub async fn shards(&self) -> Result<ShardsReport, Refusal> {
        let report: ShardsReport = self.ask(&L3Request::Shards).await?;
        let mut known = lock(&self.known);
        known.instruments = report.engine.symbols.iter().map(|s| s.instrument.clone()).collect();
        known.engine = Some(report.engine.clone());
        Ok(report)
    }

    /// Whether `instrument`'s book is the host's: one of its books, or, before it has answered,
    /// a stock of a tick-by-tick source.
    pub fn serves(&self, instrument: &InstrumentId) -> bool {
        let known = lock(&self.known);
        if known.engine.is_some() {
            return known.instruments.contains(instrument);
        }
        instrument.market == Market::Stock && self.sources.contains(&instrument.exchange)
    }

    /// The host's published book of `instrument` (`None`: no such book there).
    pub async fn depth(
        &self,
        instrument: &InstrumentId,
        limit: usize,
    ) -> Result<Option<(RestDepth, BookHealth)>, Refusal> {
        self.ask(&L3Request::Depth { instrument: instrument.clone(), limit }).await
    }

    /// The host's published books.
    pub async fn books(&self) -> Result<Vec<BookInfo>, Refusal> {
        self.ask(&L3Request::Books).await
    }

    /// The engine's stats as last reported.
    pub fn engine(&self) -> Option<EngineStats> {
        lock(&self.known).engine.clone()
    }

    /// What `/healthz` reports while the host has not answered for [`MISSED_REFRESHES`] periods.
    pub fn problem(&self) -> Option<String> {
        let known = lock(&self.known);
        let now = wall_clock_ms();
        let since = if known.answered_ms > 0 { known.answered_ms } else { self.started_ms };
        let period = i64::try_from(self.refresh.as_millis()).unwrap_or(i64::MAX);
        if now - since <= period.saturating_mul(MISSED_REFRESHES) {
            return None;
        }
        let why = known.error.as_deref().unwrap_or("no answer yet");
        Some(format!(
            "the tick-by-tick books' host (l3.host = {}) has not answered for {} s: {why}",
            self.host,
            (now - since) / 1000
        ))
    }
}

impl RemoteBooks for RemoteL3 {
    fn serves(&self, instrument: &InstrumentId) -> bool {
        RemoteL3::serves(self, instrument)
    }

    fn shards(&self) -> BoxFuture<'_, Result<ShardsReport, Refusal>> {
        Box::pin(RemoteL3::shards(self))
    }

    fn depth(
        &self,
        instrument: &InstrumentId,
        limit: usize,
    ) -> BoxFuture<'_, Result<Option<(RestDepth, BookHealth)>, Refusal>> {
        let instrument = instrument.clone();
        Box::pin(async move { RemoteL3::depth(self, &instrument, limit).await })
    }

    fn books(&self) -> BoxFuture<'_, Result<Vec<BookInfo>, Refusal>> {
        Box::pin(RemoteL3::books(self))
    }

    fn migrate(&self, req: MigrateRequest) -> BoxFuture<'_, Result<MigrateReply, Refusal>> {
        Box::pin(async move { self.ask(&L3Request::Migrate(req)).await })
    }

    fn auto_balance(
        &self,
        req: AutoBalanceRequest,
    ) -> BoxFuture<'_, Result<AutoBalanceReply, Refusal>> {
        Box::pin(async move { self.ask(&L3Request::AutoBalance(req)).await })
    }

    fn hotspot(&self, req: HotspotRequest) -> BoxFuture<'_, Result<HotspotReply, Refusal>> {
        Box::pin(async move { self.ask(&L3Request::Hotspot(req)).await })
    }

    fn engine(&self) -> Option<EngineStats> {
        RemoteL3::engine(self)
    }

    fn problem(&self) -> Option<String> {
        RemoteL3::problem(self)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn requests_keep_their_shape_on_the_wire() {
        let depth = L3Request::Depth { instrument: "sim:stock:600000".parse().unwrap(), limit: 5 };
        let text = serde_json::to_string(&depth).unwrap();
        assert_eq!(text, r#"{"op":"depth","body":{"instrument":"sim:stock:600000","limit":5}}"#);
        assert_eq!(serde_json::from_str::<L3Request>(&text).unwrap(), depth);
        let shards = serde_json::to_string(&L3Request::Shards).unwrap();
        assert_eq!(shards, r#"{"op":"shards"}"#);
        let migrate = L3Request::Migrate(MigrateRequest { symbol: "600000".into(), target: -1 });
        let text = serde_json::to_string(&migrate).unwrap();
        assert_eq!(serde_json::from_str::<L3Request>(&text).unwrap(), migrate);
        // a refusal crosses as it is
        let r: Result<u8, Refusal> = Err(Refusal::not_found("no book"));
        let text = serde_json::to_string(&r).unwrap();
        assert_eq!(serde_json::from_str::<Result<u8, Refusal>>(&text).unwrap(), r);
    }
}
