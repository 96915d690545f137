//! One WebSocket session on `GET /ws`: requests in, replies and pushes out.
//!
//! Requests are handled by [`Session::handle_text`], which does no socket IO: it returns the
//! reply and changes which streams the session receives. A `kline@{series}` subscription takes a
//! [`Lease`] on the series' ingest job (so the supervisor's refcount counts this tab) and a bus
//! subscription; `depth_update@{instrument}` and `depth@{instrument},{levels}` take a lease on the
//! instrument's depth job (books of the tick-by-tick engine are always on and need none);
//! unsubscribing or closing the socket drops both. A subscription that would start a job spends
//! one of the connection's and the address's job starts ([`super::starts`]). The async
//! [`session`] loop owns the socket. A bad request is answered with an error reply; the socket
//! stays open. A violation of the WebSocket protocol itself ends the connection with a close
//! frame saying why (RFC 6455 7.4.1): 1002 (reserved bits, an unmasked frame, a bad opcode or
//! fragment), 1007 (a text message that is not UTF-8) or 1009 (a frame or message over
//! [`MAX_TRANSPORT_BYTES`]).
//!
//! Slow clients never hold anyone up: the bus keeps `limits.bus_capacity` messages per topic, and
//! a client that falls further behind is closed with code 4000 and reason `lagging: …` (its
//! dashboard reconnects and reloads state); a send that takes longer than
//! `limits.send_timeout_ms` drops the client too.
//!
//! Liveness ([`Liveness`]): the server pings every connection each `limits.ws_ping_interval_ms`;
//! one that sends nothing (a Pong or anything else) within `limits.ws_pong_timeout_ms` of an
//! unanswered ping is closed (1001; a dead socket is simply dropped), and a session holding no
//! subscription (`heartbeat` counts as one) for `limits.ws_idle_timeout_ms` is closed with 1008
//! and reason `idle: …`. Both are counted (`millrace_ws_closed_total{reason}`).
//!
//! A subscription whose job is preempted (stopped at full capacity to give another client
//! address its fair share; see [`crate::jobs::supervisor`]) ends: the client gets an unasked
//! reply `{"id":0,"stream":"…","error":{"code":"preempted",…}}` and the socket stays open.

use std::collections::BTreeMap;
use std::pin::Pin;
use std::sync::atomic::Ordering::Relaxed;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use futures_util::{SinkExt as _, StreamExt as _};
use shared::protocol::{ClientRequest, ErrorCode, Method, Reply, Stream};

use crate::sources::ResolveError;
use tokio::sync::broadcast;
use tokio::time::Instant;
use tokio_tungstenite::tungstenite::protocol::frame::coding::{Data, OpCode};
use tokio_tungstenite::tungstenite::protocol::frame::{CloseFrame, Frame};
use tokio_tungstenite::tungstenite::{Error as WsError, Message, Utf8Bytes};
use tokio_util::sync::WaitForCancellationFutureOwned;

use super::starts::Bucket;
use super::upgrade::Socket;
use super::Sessions;
use crate::bus::{RecvError, Subscription};
use crate::jobs::{Lease, SubscribeError};
use crate::metrics::Metrics;

/// Largest frame the transport reads at all; larger ones end the connection.
pub const MAX_TRANSPORT_BYTES: usize = 1024 * 1024;

/// Bytes the transport reads from a client per syscall (its read buffer, allocated and zeroed
/// per connection, and zeroed again at every read attempt): requests are small, and idle
/// connections should cost little. 1 KiB: 4.1 KB of server RSS per idle connection, against
/// 7.5 KB with 4 KiB and 141 KB with tungstenite's default 128 KiB (docs/bench-fanout.md).
pub const READ_BUFFER_BYTES: usize = 1024;

/// Close code "going away" (RFC 6455 7.4.1), sent when the server shuts down.
const GOING_AWAY: u16 = 1001;
/// Close code for a client that fell behind (application range 4000-4999).
pub const LAGGING: u16 = 4000;
/// Close code "policy violation" (RFC 6455 7.4.1), sent to a session idle too long.
pub const POLICY: u16 = 1008;
/// Close codes for a client's protocol violations (RFC 6455 7.4.1).
pub const PROTOCOL_ERROR: u16 = 1002;
pub const INVALID_PAYLOAD: u16 = 1007;
pub const MESSAGE_TOO_BIG: u16 = 1009;

/// The close frame a failed read calls for: a protocol violation by the client gets its code
/// and a reason; a connection that is simply gone gets none.
fn violation_close(e: WsError) -> Option<CloseFrame> {
    use tokio_tungstenite::tungstenite::error::ProtocolError;
    let (code, reason) = match e {
        WsError::Protocol(ProtocolError::ResetWithoutClosingHandshake) => return None,
        WsError::Protocol(p) => (PROTOCOL_ERROR, format!("protocol error: {p}")),
        WsError::Utf8(_) => (INVALID_PAYLOAD, "a text message that is not valid UTF-8".to_string()),
        WsError::Capacity(_) => (
            MESSAGE_TOO_BIG,
            format!("frames and messages are at most {MAX_TRANSPORT_BYTES} bytes"),
        ),
        _ => return None,
    };
    // A close reason is at most 123 bytes.
    let mut reason = reason;
    while reason.len() > 123 {
        reason.pop();
    }
    Some(close_frame(code, reason))
}

fn close_frame(code: u16, reason: impl Into<Utf8Bytes>) -> CloseFrame {
    CloseFrame { code: code.into(), reason: reason.into() }
}

/// A live stream subscription of this connection.
struct Sub {
    /// Reference on the ingest job (none for books that are always on, e.g. tick-by-tick ones);
    /// dropped with the subscription.
    _lease: Option<Lease>,
    /// Completes if the lease's job is preempted; kept across polls, so waiting for a message
    /// registers nothing new per message.
    preempted: Option<Pin<Box<WaitForCancellationFutureOwned>>>,
    rx: Subscription,
}

/// What a subscription has next: a message from the bus, or the end of its job by preemption.
enum Next {
    Recv(Result<crate::bus::Message, RecvError>),
    Preempted,
}

impl Sub {
    fn new(lease: Option<Lease>, rx: Subscription) -> Sub {
        let preempted = lease.as_ref().map(|l| Box::pin(l.preempted_owned()));
        Sub { _lease: lease, preempted, rx }
    }

    async fn next(&mut self) -> Next {
        let Sub { preempted, rx, .. } = self;
        match preempted {
            Some(preempted) => tokio::select! {
                biased;
                () = preempted.as_mut() => Next::Preempted,
                r = rx.recv() => Next::Recv(r),
            },
            None => Next::Recv(rx.recv().await),
        }
    }
}

/// Why a push could not be taken: the client lagged on a stream (name, messages skipped), or a
/// stream's job was preempted (the subscription is removed already).
enum Interrupt {
    Lagged(String, u64),
    Preempted(String),
}

/// When a connection is pinged, and when it is closed for silence or for holding no
/// subscription (see the module docs). Times are tokio's, so tests can pause them.
#[derive(Debug)]
struct Liveness {
    ping_every: Duration,
    pong_timeout: Duration,
    idle_timeout: Duration,
    next_ping: Instant,
    /// The first ping the client has not answered (nor sent anything since).
    unanswered: Option<Instant>,
    /// Since when the session holds no subscription.
    idle_since: Option<Instant>,
}

/// What [`Liveness::due`] calls for.
#[derive(Debug, PartialEq, Eq)]
enum Due {
    Ping,
    PongTimeout,
    Idle,
    Nothing,
}

impl Liveness {
    /// A connection opened at `now`, with no subscription yet.
    fn new(limits: &crate::config::LimitsConfig, now: Instant) -> Self {
        let ping_every = Duration::from_millis(limits.ws_ping_interval_ms);
        Liveness {
            ping_every,
            pong_timeout: Duration::from_millis(limits.ws_pong_timeout_ms),
            idle_timeout: Duration::from_millis(limits.ws_idle_timeout_ms),
            next_ping: now + ping_every,
            unanswered: None,
            idle_since: Some(now),
        }
    }

    /// When [`Liveness::due`] has something to do next.
    fn next_wake(&self) -> Instant {
        let pong = self.unanswered.map(|t| t + self.pong_timeout);
        let idle = self.idle_since.map(|t| t + self.idle_timeout);
        [pong, idle].into_iter().flatten().fold(self.next_ping, Instant::min)
    }

    /// The client sent something: it is alive.
    fn heard(&mut self) {
        self.unanswered = None;
    }

    /// Whether the session holds no subscription (since [`Liveness::holds`] last said so).
    fn is_idle(&self) -> bool {
        self.idle_since.is_some()
    }

    /// The session holds `subscriptions` now.
    fn holds(&mut self, subscriptions: usize, now: Instant) {
        if subscriptions == 0 {
            self.idle_since.get_or_insert(now);
        } else {
            self.idle_since = None;
        }
    }

    /// What is due at `now`: a close first, then a ping (which it counts as sent).
    fn due(&mut self, now: Instant) -> Due {
        if self.unanswered.is_some_and(|t| now >= t + self.pong_timeout) {
            return Due::PongTimeout;
        }
        if self.idle_since.is_some_and(|t| now >= t + self.idle_timeout) {
            return Due::Idle;
        }
        if now >= self.next_ping {
            self.next_ping = now + self.ping_every;
            self.unanswered.get_or_insert(now);
            return Due::Ping;
        }
        Due::Nothing
    }
}

/// The request-handling state of one connection.
pub struct Session {
    sessions: Arc<Sessions>,
    /// `Some` while the client is subscribed to `heartbeat`.
    heartbeat: Option<broadcast::Receiver<Arc<str>>>,
    /// Market-data subscriptions by stream name.
    subs: BTreeMap<String, Sub>,
    /// The client's address, for the per-IP job-start limit.
    ip: Option<crate::client_addr::ClientAddr>,
    /// Job starts left to this connection.
    starts: Bucket,
}

impl Drop for Session {
    fn drop(&mut self) {
        self.sessions.metrics.subscriptions.fetch_sub(self.subs.len() as i64, Relaxed);
    }
}

impl Session {
    /// A session of a client at `ip` (`None`: not limited per IP).
    pub fn new(sessions: Arc<Sessions>, ip: Option<crate::client_addr::ClientAddr>) -> Self {
        let starts = Bucket::full(
            sessions.limits.max_job_starts_per_min_per_connection,
            tokio::time::Instant::now(),
        );
        Self { sessions, heartbeat: None, subs: BTreeMap::new(), ip, starts }
    }

    /// Is the client subscribed to `heartbeat`?
    pub fn is_subscribed_to_heartbeat(&self) -> bool {
        self.heartbeat.is_some()
    }

    /// Stream names this connection is subscribed to (besides `heartbeat`).
    pub fn subscriptions(&self) -> Vec<String> {
        self.subs.keys().cloned().collect()
    }

    fn count(&self) -> usize {
        self.subs.len() + usize::from(self.heartbeat.is_some())
    }

    /// Handles one text frame and returns the reply to send. A request naming several streams
    /// is applied only if every name is acceptable; otherwise the first bad one is reported and
    /// nothing changes.
    pub fn handle_text(&mut self, text: &str) -> Reply {
        self.sessions.metrics.ws_requests.fetch_add(1, Relaxed);
        let reply = self.handle(text);
        if !reply.is_ok() {
            self.sessions.metrics.ws_request_errors.fetch_add(1, Relaxed);
        }
        reply
    }

    fn handle(&mut self, text: &str) -> Reply {
        let max = self.sessions.limits.max_message_bytes;
        if text.len() > max {
            return Reply::error(
                0,
                ErrorCode::TooLarge,
                format!("request of {} bytes exceeds the limit of {max}", text.len()),
            );
        }
        let request: ClientRequest = match serde_json::from_str(text) {
            Ok(r) => r,
            Err(e) => return Reply::error(id_of(text), ErrorCode::Malformed, malformed_msg(&e)),
        };
        let mut streams = Vec::with_capacity(request.params.len());
        for name in &request.params {
            match name.parse::<Stream>() {
                Ok(s) => streams.push(s),
                Err(e) => return Reply::error(request.id, ErrorCode::BadStream, e.to_string()),
            }
        }
        match request.method {
            Method::Unsubscribe => {
                for stream in streams {
                    match stream {
                        Stream::Heartbeat => self.heartbeat = None,
                        other => {
                            if self.subs.remove(&other.to_string()).is_some() {
                                self.sessions.metrics.subscriptions.fetch_sub(1, Relaxed);
                            }
                        }
                    }
                }
                Reply::ok(request.id)
            }
            Method::Subscribe => {
                let new: Vec<&Stream> = {
                    let mut seen = std::collections::BTreeSet::new();
                    streams
                        .iter()
                        .filter(|s| match s {
                            Stream::Heartbeat => self.heartbeat.is_none(),
                            other => !self.subs.contains_key(&other.to_string()),
                        })
                        .filter(|s| seen.insert(s.to_string()))
                        .collect()
                };
                let limit = self.sessions.limits.max_subscriptions_per_connection;
                if self.count() + new.len() > limit {
                    return Reply::error(
                        request.id,
                        ErrorCode::TooManySubscriptions,
                        format!(
                            "a connection may hold {limit} subscriptions; this one holds {}",
                            self.count()
                        ),
                    );
                }
                // Streams nobody follows start a job each: within this connection's and this
                // address's job starts, or not at all.
                let starts: Vec<bool> = new.iter().map(|s| (self.sessions.starts_job)(s)).collect();
                let starting = starts.iter().filter(|&&b| b).count();
                if starting > 0 {
                    let per_connection = self.sessions.limits.max_job_starts_per_min_per_connection;
                    let taken = self.sessions.ip_starts.take(
                        starting,
                        &mut self.starts,
                        per_connection,
                        self.ip,
                    );
                    if let Err(e) = taken {
                        self.sessions
                            .metrics
                            .subscriptions_refused_job_starts
                            .fetch_add(1, Relaxed);
                        return Reply::error(
                            request.id,
                            ErrorCode::TooManyJobStarts,
                            e.to_string(),
                        );
                    }
                }
                // Take every lease first, so a refusal leaves nothing half-subscribed.
                let mut taken = Vec::new();
                for (i, stream) in new.iter().enumerate() {
                    let lease = match stream {
                        Stream::Heartbeat => continue,
                        Stream::Kline(series) => {
                            self.sessions.supervisor.subscribe_as(series, self.ip).map(Some)
                        }
                        Stream::Depth { instrument, .. } | Stream::DepthUpdate(instrument) => {
                            (self.sessions.depth_leases)(instrument, self.ip)
                        }
                        // trades come with the book's job (a venue's, or Binance's aggTrade
                        // beside its depth); tick-by-tick books publish none
                        Stream::Trade(instrument)
                            if instrument.market == shared::protocol::Market::Stock =>
                        {
                            Err(SubscribeError::Unknown(ResolveError::NoTrades {
                                instrument: instrument.clone(),
                            }))
                        }
                        Stream::Trade(instrument) => {
                            (self.sessions.depth_leases)(instrument, self.ip)
                        }
                    };
                    match lease {
                        Ok(lease) => taken.push((stream.to_string(), lease)),
                        Err(e) => {
                            let code = match e {
                                SubscribeError::Unknown(_) => ErrorCode::UnknownSeries,
                                SubscribeError::CapacityExhausted { .. } => {
                                    self.sessions
                                        .metrics
                                        .subscriptions_refused_capacity
                                        .fetch_add(1, Relaxed);
                                    ErrorCode::CapacityExhausted
                                }
                                SubscribeError::FairShare { .. } => {
                                    self.sessions
                                        .metrics
                                        .subscriptions_refused_capacity
                                        .fetch_add(1, Relaxed);
                                    ErrorCode::CapacityExhausted
                                }
                                SubscribeError::RateLimited { .. } => {
                                    self.sessions
                                        .metrics
                                        .subscriptions_refused_rate
                                        .fetch_add(1, Relaxed);
                                    ErrorCode::TooManyJobStarts
                                }
                                SubscribeError::ShuttingDown => ErrorCode::Internal,
                            };
                            // The jobs of this stream and the ones after it did not start:
                            // their starts are given back (the earlier ones' did start).
                            let unstarted = starts[i..].iter().filter(|&&b| b).count();
                            if unstarted > 0 {
                                self.sessions.ip_starts.give_back(
                                    unstarted,
                                    &mut self.starts,
                                    self.ip,
                                );
                            }
                            return Reply::error(request.id, code, format!("{stream}: {e}"));
                        }
                    }
                }
                if new.iter().any(|s| matches!(s, Stream::Heartbeat)) {
                    self.heartbeat = Some(self.sessions.heartbeats.subscribe());
                }
                for (name, lease) in taken {
                    tracing::debug!(stream = %name, "subscribed");
                    let rx = self.sessions.bus.subscribe(&name);
                    self.subs.insert(name, Sub::new(lease, rx));
                    self.sessions.metrics.subscriptions.fetch_add(1, Relaxed);
                }
                Reply::ok(request.id)
            }
        }
    }
}

/// The next heartbeat frame, or pending forever while unsubscribed.
async fn next_heartbeat(heartbeat: &mut Option<broadcast::Receiver<Arc<str>>>) -> Arc<str> {
    loop {
        let Some(rx) = heartbeat.as_mut() else {
            return std::future::pending().await;
        };
        match rx.recv().await {
            Ok(frame) => return frame,
            // Heartbeats are disposable: a slow client skips to the newest.
            Err(broadcast::error::RecvError::Lagged(missed)) => {
                tracing::debug!(missed, "heartbeat receiver lagged");
                *rx = rx.resubscribe();
            }
            Err(broadcast::error::RecvError::Closed) => *heartbeat = None,
        }
    }
}

/// The next market-data frame of any subscription, or why there is none: a stream this client
/// lagged on, or one whose job was preempted (removed here). Pending forever without
/// subscriptions. A subscription whose bus closed is removed.
async fn next_push(
    subs: &mut BTreeMap<String, Sub>,
    metrics: &Metrics,
) -> Result<Bytes, Interrupt> {
    loop {
        if subs.is_empty() {
            return std::future::pending().await;
        }
        let (name, next) = if subs.len() == 1 {
            let (name, sub) = subs.iter_mut().next().expect("one subscription");
            (name, sub.next().await)
        } else {
            let futures = subs.iter_mut().map(|(name, sub)| {
                Box::pin(async move {
                    let r = sub.next().await;
                    (name, r)
                })
            });
            futures_util::future::select_all(futures).await.0
        };
        match next {
            Next::Recv(Ok(msg)) => return Ok(msg.payload),
            Next::Recv(Err(RecvError::Lagged { skipped })) => {
                return Err(Interrupt::Lagged(name.clone(), skipped))
            }
            Next::Recv(Err(RecvError::Closed)) => {
                let name = name.clone();
                subs.remove(&name);
                metrics.subscriptions.fetch_sub(1, Relaxed);
            }
            Next::Preempted => {
                let name = name.clone();
                subs.remove(&name);
                metrics.subscriptions.fetch_sub(1, Relaxed);
                return Err(Interrupt::Preempted(name));
            }
        }
    }
}

impl Session {
    /// One more frame already buffered on a subscription, without waiting, so a burst goes out
    /// in one socket flush. Looks from the `from`-th subscription on and leaves `from` at the one
    /// that had it, so a burst asks each empty subscription once.
    fn next_ready(&mut self, from: &mut usize) -> Result<Option<Bytes>, (String, u64)> {
        for (i, (name, sub)) in self.subs.iter_mut().enumerate().skip(*from) {
            match sub.rx.try_recv() {
                Ok(Some(msg)) => {
                    *from = i;
                    return Ok(Some(msg.payload));
                }
                Ok(None) | Err(RecvError::Closed) => {}
                Err(RecvError::Lagged { skipped }) => return Err((name.clone(), skipped)),
            }
        }
        Ok(None)
    }
}

/// Most frames written per socket flush.
const WRITE_BATCH: usize = 64;

/// Pushes longer than this go out as fragments of this size (RFC 6455 5.4; clients get whole
/// messages). The transport writes each frame at once into the connection's batch
/// ([`super::batch`]), but keeps its own frame buffer at the capacity of the largest frame it
/// ever wrote: unfragmented, one large `depth_update` after a resync left each depth client
/// holding up to 64 KB for good (docs/soak.md).
pub const FRAGMENT_BYTES: usize = 2048;

/// Feeds one text message (valid UTF-8) to the transport, fragmented when long.
async fn feed_text<S>(socket: &mut S, mut payload: Bytes) -> Result<(), WsError>
where
    S: futures_util::Sink<Message, Error = WsError> + Unpin,
{
    let mut opcode = OpCode::Data(Data::Text);
    while payload.len() > FRAGMENT_BYTES {
        let part = payload.split_to(FRAGMENT_BYTES);
        socket.feed(Message::Frame(Frame::message(part, opcode, false))).await?;
        opcode = OpCode::Data(Data::Continue);
    }
    socket.feed(Message::Frame(Frame::message(payload, opcode, true))).await
}

/// The request id of an unparseable frame if it has one, else 0.
fn id_of(text: &str) -> u64 {
    serde_json::from_str::<serde_json::Value>(text)
        .ok()
        .and_then(|v| v.get("id").and_then(|id| id.as_u64()))
        .unwrap_or(0)
}

fn malformed_msg(e: &serde_json::Error) -> String {
    format!(
        "not a request ({e}); send {{\"method\":\"SUBSCRIBE\"|\"UNSUBSCRIBE\",\"params\":[\"kline@sim:spot:BTC/USDT:1m\"],\"id\":1}}"
    )
}

/// Runs one connection until the client leaves, the socket fails, the server shuts down, or the
/// client is closed for silence or idleness ([`Liveness`]).
pub async fn session(
    mut socket: Socket,
    sessions: Arc<Sessions>,
    ip: Option<crate::client_addr::ClientAddr>,
) {
    let send_timeout = Duration::from_millis(sessions.limits.send_timeout_ms);
    let metrics = sessions.metrics.clone();
    let shutdown = sessions.shutdown.clone();
    let mut liveness = Liveness::new(&sessions.limits, Instant::now());
    let mut session = Session::new(sessions, ip);
    let wake = tokio::time::sleep_until(liveness.next_wake());
    tokio::pin!(wake);
    tracing::debug!("websocket session started");
    loop {
        // the clock is read only when the session starts or stops holding subscriptions, not
        // per push
        let count = session.count();
        if (count == 0) != liveness.is_idle() {
            liveness.holds(count, Instant::now());
        }
        let next_wake = liveness.next_wake();
        if wake.deadline() != next_wake {
            wake.as_mut().reset(next_wake);
        }
        // The frame this turn writes first, and whether more buffered pushes follow it.
        let mut first: Option<Bytes> = None;
        let mut drain = false;
        let mut lagged: Option<(String, u64)> = None;
        let reply: Option<Message> = tokio::select! {
            msg = socket.next() => {
                if let Some(Ok(_)) = &msg {
                    liveness.heard();
                }
                match msg {
                    Some(Ok(Message::Text(text))) => Some(reply_frame(session.handle_text(text.as_str()))),
                    Some(Ok(Message::Binary(_))) => Some(reply_frame(Reply::error(
                        0,
                        ErrorCode::Malformed,
                        "binary frames are not accepted; send JSON text frames",
                    ))),
                    Some(Ok(Message::Ping(_) | Message::Pong(_) | Message::Frame(_))) => None,
                    Some(Ok(Message::Close(_))) | None => break,
                    Some(Err(e)) => {
                        tracing::debug!("websocket read failed: {e}");
                        if let Some(close) = violation_close(e) {
                            metrics.ws_protocol_violations.fetch_add(1, Relaxed);
                            let _ = tokio::time::timeout(send_timeout, socket.send(Message::Close(Some(close)))).await;
                        }
                        break;
                    }
                }
            },
            frame = next_heartbeat(&mut session.heartbeat) => {
                first = Some(Bytes::copy_from_slice(frame.as_bytes()));
                None
            }
            push = next_push(&mut session.subs, &metrics) => {
                match push {
                    Ok(payload) => {
                        first = Some(payload);
                        drain = true;
                        None
                    }
                    Err(Interrupt::Lagged(stream, skipped)) => {
                        lagged = Some((stream, skipped));
                        None
                    }
                    Err(Interrupt::Preempted(stream)) => Some(preempted_frame(&stream)),
                }
            }
            () = &mut wake => match liveness.due(Instant::now()) {
                Due::Ping => Some(Message::Ping(Bytes::new())),
                Due::Nothing => None,
                Due::PongTimeout => {
                    metrics.ws_closed_pong_timeout.fetch_add(1, Relaxed);
                    let ms = liveness.pong_timeout.as_millis();
                    tracing::info!("closing a websocket that answered no ping within {ms} ms");
                    let reason = format!("no pong within {ms} ms of a ping (limits.ws_pong_timeout_ms)");
                    // The socket may be dead: the close frame gets little time.
                    let wait = send_timeout.min(liveness.pong_timeout);
                    let _ = tokio::time::timeout(wait, socket.send(Message::Close(Some(close_frame(GOING_AWAY, reason))))).await;
                    break;
                }
                Due::Idle => {
                    metrics.ws_closed_idle.fetch_add(1, Relaxed);
                    let ms = liveness.idle_timeout.as_millis();
                    tracing::debug!("closing a websocket that held no subscription for {ms} ms");
                    let reason = format!("idle: no subscription for {ms} ms (limits.ws_idle_timeout_ms)");
                    let _ = tokio::time::timeout(send_timeout, socket.send(Message::Close(Some(close_frame(POLICY, reason))))).await;
                    break;
                }
            },
            () = shutdown.stopping() => {
                let close = close_frame(GOING_AWAY, "server shutting down");
                let _ = tokio::time::timeout(send_timeout, socket.send(Message::Close(Some(close)))).await;
                break;
            }
        };
        if lagged.is_none() {
            // Frames are fed as they are taken from the bus (up to WRITE_BATCH); the transport
            // collects them and sends them in one write at the flush.
            let write = async {
                let mut pushes = 0u64;
                if let Some(r) = reply {
                    socket.feed(r).await?;
                }
                let mut next = first;
                let mut taken = 0;
                let mut from = 0;
                while let Some(payload) = next.take() {
                    taken += 1;
                    // Payloads are JSON text serialised by our publishers.
                    if std::str::from_utf8(&payload).is_ok() {
                        feed_text(&mut socket, payload).await?;
                        pushes += 1;
                    }
                    if drain && taken < WRITE_BATCH {
                        match session.next_ready(&mut from) {
                            Ok(more) => next = more,
                            // Closed below as lagging; the close frame flushes what was fed.
                            Err(l) => {
                                lagged = Some(l);
                                return Ok(pushes);
                            }
                        }
                    }
                }
                socket.flush().await.map(|()| pushes)
            };
            match tokio::time::timeout(send_timeout, write).await {
                Ok(Ok(pushes)) => {
                    metrics.ws_messages_sent.fetch_add(pushes, Relaxed);
                }
                Ok(Err(e)) => {
                    tracing::debug!("websocket write failed: {e}");
                    break;
                }
                Err(_) => {
                    metrics.ws_dropped_slow_send.fetch_add(1, Relaxed);
                    tracing::info!(
                        "dropping a client whose send took longer than {send_timeout:?}"
                    );
                    break;
                }
            }
        }
        if let Some((stream, skipped)) = lagged {
            metrics.ws_dropped_lagging.fetch_add(1, Relaxed);
            tracing::info!(%stream, skipped, "dropping a client that fell behind");
            let reason =
                format!("lagging: {skipped} messages of {stream} skipped; reconnect to resync");
            let reason: String = reason.chars().take(120).collect();
            let close = close_frame(LAGGING, reason);
            let _ =
                tokio::time::timeout(send_timeout, socket.send(Message::Close(Some(close)))).await;
            break;
        }
    }
    tracing::debug!("websocket session ended");
}

/// The unasked reply telling a client that `stream` ended: its job was preempted.
fn preempted_frame(stream: &str) -> Message {
    let msg = format!(
        "{stream}: preempted: on-demand capacity is full and this stream's job was stopped to \
         give another client address its fair share; subscribe again later"
    );
    let reply = match stream.parse::<Stream>() {
        Ok(s) => Reply::stream_ended(s, ErrorCode::Preempted, msg),
        Err(_) => Reply::error(0, ErrorCode::Preempted, msg),
    };
    reply_frame(reply)
}

fn reply_frame(reply: Reply) -> Message {
    Message::Text(serde_json::to_string(&reply).expect("a reply always serializes").into())
}

#[cfg(test)]
mod tests {
    use futures_util::SinkExt as _;
    use tokio::io::AsyncReadExt as _;
    use tokio_tungstenite::tungstenite::protocol::{Role, WebSocket};
    use tokio_tungstenite::WebSocketStream;

    use super::*;

    /// (FIN, opcode, payload length) of each unmasked frame in `wire`, and the bytes they use.
    fn frames(wire: &[u8]) -> (Vec<(bool, u8, usize)>, usize) {
        let mut out = Vec::new();
        let mut at = 0;
        while wire.len() >= at + 2 {
            let (fin, opcode) = (wire[at] & 0x80 != 0, wire[at] & 0x0f);
            let (len, header) = match wire[at + 1] & 0x7f {
                126 if wire.len() >= at + 4 => {
                    (usize::from(u16::from_be_bytes([wire[at + 2], wire[at + 3]])), 4)
                }
                126 | 127 => break,
                n => (usize::from(n), 2),
            };
            if wire.len() < at + header + len {
                break;
            }
            out.push((fin, opcode, len));
            at += header + len;
        }
        (out, at)
    }

    #[test]
    fn liveness_pings_then_closes_a_silent_or_idle_connection() {
        let limits = crate::config::LimitsConfig {
            ws_ping_interval_ms: 200,
            ws_pong_timeout_ms: 300,
            ws_idle_timeout_ms: 800,
            ..Default::default()
        };
        let ms = Duration::from_millis;
        let t0 = Instant::now();
        // no subscription: pings at 200, 400 (unanswered since 200), then idle at 800 ... but
        // the pong timeout (200 + 300) comes first
        let mut l = Liveness::new(&limits, t0);
        assert_eq!(l.next_wake(), t0 + ms(200));
        assert_eq!(l.due(t0 + ms(199)), Due::Nothing);
        assert_eq!(l.due(t0 + ms(200)), Due::Ping);
        assert_eq!(l.due(t0 + ms(400)), Due::Ping);
        assert_eq!(l.next_wake(), t0 + ms(500));
        assert_eq!(l.due(t0 + ms(500)), Due::PongTimeout);
        // answered pings: the idle timeout closes it
        let mut l = Liveness::new(&limits, t0);
        for at in [200, 400, 600] {
            assert_eq!(l.due(t0 + ms(at)), Due::Ping);
            l.heard();
        }
        assert_eq!(l.next_wake(), t0 + ms(800));
        assert_eq!(l.due(t0 + ms(800)), Due::Idle);
        // a subscription: never idle; subscribing again after none restarts the idle clock
        let mut l = Liveness::new(&limits, t0);
        l.holds(1, t0 + ms(700));
        for at in (1..20).map(|n| n * 200) {
            assert_eq!(l.due(t0 + ms(at)), Due::Ping, "{at}");
            l.heard();
        }
        l.holds(0, t0 + ms(3900));
        l.holds(0, t0 + ms(3950));
        for at in [4000, 4200, 4400, 4600] {
            assert_eq!(l.due(t0 + ms(at)), Due::Ping, "{at}");
            l.heard();
        }
        assert_eq!(l.next_wake(), t0 + ms(4700));
        assert_eq!(l.due(t0 + ms(4700)), Due::Idle);
    }

    #[tokio::test]
    async fn long_pushes_go_out_as_fragments_and_arrive_whole() {
        let (server_io, mut client_io) = tokio::io::duplex(1 << 20);
        let mut server = WebSocketStream::from_raw_socket(server_io, Role::Server, None).await;
        let long: String =
            (0..2 * FRAGMENT_BYTES + 1808).map(|i| char::from(b'a' + (i % 26) as u8)).collect();
        let exact: String = "x".repeat(FRAGMENT_BYTES);
        let short = r#"{"short":1}"#;
        for text in [long.as_str(), exact.as_str(), short] {
            feed_text(&mut server, Bytes::from(text.to_owned())).await.unwrap();
        }
        server.flush().await.unwrap();

        let mut wire = Vec::new();
        while frames(&wire).0.len() < 5 {
            let mut buf = [0; 4096];
            let n = tokio::time::timeout(Duration::from_secs(5), client_io.read(&mut buf))
                .await
                .expect("the frames arrive")
                .unwrap();
            assert!(n > 0, "the stream ended early");
            wire.extend_from_slice(&buf[..n]);
        }
        let (got, used) = frames(&wire);
        const TEXT: u8 = 1;
        const CONTINUATION: u8 = 0;
        assert_eq!(
            got,
            [
                (false, TEXT, FRAGMENT_BYTES),
                (false, CONTINUATION, FRAGMENT_BYTES),
                (true, CONTINUATION, 1808),
                (true, TEXT, FRAGMENT_BYTES),
                (true, TEXT, short.len()),
            ]
        );
        assert_eq!(used, wire.len(), "nothing but those frames");

        // A client reassembles each message.
        let mut client = WebSocket::from_raw_socket(std::io::Cursor::new(wire), Role::Client, None);
        for text in [long.as_str(), exact.as_str(), short] {
            assert_eq!(client.read().unwrap(), Message::Text(text.into()));
        }
    }
}
