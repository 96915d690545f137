//! A recording played back as the venue it recorded (`[[sources]] kind = "recording"`).
//!
//! The player is a local WebSocket and REST server on 127.0.0.1 that speaks what the recording
//! holds, and the source is an ordinary venue source of the recorded dialect pointed at it: the
//! frames go through the very connector code of a live source (the venue's reader, its sync
//! machine, the candle and trade pipelines), and books, candles and trades are rebuilt, stored
//! and served as they were.
//!
//! - **Connections.** A connection that opens the URL (path and query) of a recorded connection
//!   that never sent a frame (a Binance stream, subscribed by its URL) takes the earliest such,
//!   not yet played. Else it sends its first frame (its subscription) and takes the earliest
//!   recorded connection, not yet played, whose first sent frame was the same. Its received
//!   frames are sent at their recorded pace (times the speed; as fast as possible at speed 0)
//!   and it is closed where the recorded one ended. What the job sends
//!   meanwhile (a resubscription, a ping) is read and left: the recording already holds the
//!   venue's answer to it. A connection that asks for what the recording does not hold (or for
//!   more of it than it holds) is kept open and silent, and counted.
//! - **REST.** A request takes the earliest recorded answer, not yet served, to the same path
//!   and query. One whose recorded answers were all served gets a 404, as the recorded run got
//!   no more (with `loop`, they are served again from the first). A request never recorded
//!   gets the last recorded answer to the same path (the earliest of that path not asked for is
//!   then taken as asked for: a query holding the clock differs from run to run); else a 404
//!   saying so.
//! - **Order.** At any speed the answers keep their recorded place among the frames: a frame
//!   waits until every answer received before it was sent, and then for its recorded lead over
//!   the frame (at the playback's speed), at most `SETTLE_CAP` (100 ms), so the job has taken
//!   the answer first; an answer waits until the connections playing have sent the frames
//!   received before it (a Binance book's snapshot lands among its diffs where it did, and a
//!   drop after it comes after it). A wait for an answer ends after `ORDER_WAIT` (a request the
//!   recorded run made and this one does not), counted.
//! - **Loop.** With `loop = true` a subscription whose recorded connections were all played
//!   starts again from its first, and a connection that played its last frame is closed so the
//!   job comes back for it.
//! - **Bounds.** The range is read once at start to index it: each connection's URL, first sent
//!   frame, first and last times and frame count, and the REST answers, at most [`MAX_BYTES`] of
//!   them (a range holding more is refused: narrow `from`/`to`). A connection's frames are not
//!   held: while it plays, a reader of its own reads them from the files (from its first time,
//!   the hours it spans only) a bounded queue ahead of the socket, so a played range of any
//!   length takes the memory of its answers and of a few blocks a connection. A torn file tail
//!   is skipped as the replay tools skip it.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::path::Path;
use std::sync::atomic::{AtomicI64, AtomicU64, Ordering::Relaxed};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::body::Body;
use axum::extract::ws::{Message, WebSocket};
use axum::extract::{FromRequestParts, Request, State, WebSocketUpgrade};
use axum::http::{header, StatusCode};
use axum::response::{IntoResponse, Response};
use recording::Kind;
use shared::protocol::ops::PlaybackReport;

use crate::config::Playback;
use crate::lock::lock;
use crate::shutdown::Shutdown;

/// The most bytes of REST answers a played range may hold (they are kept in memory; frames are
/// read from the files as they play).
pub const MAX_BYTES: u64 = 1 << 30;
/// How many frames a playing connection's reader reads ahead of its socket.
const READ_AHEAD_FRAMES: usize = 512;
/// How long a connection may take to send its subscription.
const FIRST_FRAME_WAIT: Duration = Duration::from_secs(30);

/// Why a recording cannot be played.
#[derive(Debug, thiserror::Error)]
pub enum PlaybackError {
    #[error("{dir}: {source}")]
    Read {
        dir: String,
        #[source]
        source: recording::RecordingError,
    },
    #[error("{dir}: the range holds more than {max} bytes of REST answers: narrow `from`/`to`")]
    TooLarge { dir: String, max: u64 },
    #[error("{dir}: no recorded frame in the range")]
    Empty { dir: String },
    #[error("cannot listen for the player: {0}")]
    Listen(#[source] std::io::Error),
}

/// One recorded WebSocket connection, as indexed (its frames are read as it plays).
#[derive(Debug, Default)]
struct RecordedConn {
    /// Its connection id in the recording.
    id: u64,
    /// The path and query it opened (a Binance stream's subscription is its URL).
    target: Option<String>,
    /// Its first sent frame (its subscription): what a new connection is matched by.
    first_sent: Option<String>,
    /// When it opened (its first record), Unix ns.
    start_ns: i64,
    /// The earliest receive time among its records (where its reader starts).
    min_ns: i64,
    /// Its first received frame or close, Unix ns.
    first_frame_ns: Option<i64>,
    /// Its received frames and closes in the range: what its reader delivers.
    frames: u64,
}

#[derive(Debug)]
enum Frame {
    Text { time_ns: i64, text: String },
    Close { time_ns: i64 },
}

/// One recorded REST answer.
#[derive(Debug)]
struct RecordedAnswer {
    /// When it was received, Unix ns.
    time_ns: i64,
    /// The request's path and query.
    target: String,
    status: u16,
    body: bytes::Bytes,
}

impl RecordedAnswer {
    fn path(&self) -> &str {
        self.target.split('?').next().unwrap_or(&self.target)
    }
}

/// What the player has given out.
#[derive(Debug, Default)]
struct Claims {
    conns: Vec<bool>,
    /// Each answer: asked for (its request was made again, or it was given up on).
    answers: Vec<bool>,
    /// Each answer: when it was sent (or given up on); the frames after it wait for this.
    sent: Vec<Option<tokio::time::Instant>>,
    /// Recently sent answers: their recorded time and when they were sent (see [`SETTLE_CAP`]).
    recent: Vec<(i64, tokio::time::Instant)>,
}

#[derive(Debug, Default)]
struct Counters {
    played: AtomicU64,
    finished: AtomicU64,
    frames: AtomicU64,
    unmatched: AtomicU64,
    answered: AtomicU64,
    rest_unmatched: AtomicU64,
    /// Waits for the recorded order (see [`Recorded::wait_for`]) given up.
    waits_given_up: AtomicU64,
}

struct Recorded {
    source: String,
    playback: Playback,
    /// Where the recorded source's files are read from while connections play: the recording
    /// directory, the recorded source's name in it, and the range's receive times.
    files: (std::path::PathBuf, String),
    range_ns: (i64, i64),
    conns: Vec<RecordedConn>,
    answers: Vec<RecordedAnswer>,
    claims: Mutex<Claims>,
    /// The receive time of the earliest recorded answer not sent yet (`i64::MAX`: none).
    pending_answer_ns: AtomicI64,
    /// Each recorded connection's progress while it plays: the time of its next frame (every
    /// earlier one sent); `i64::MAX` while it does not play.
    progress: Vec<AtomicI64>,
    /// Woken when an answer is asked for or a connection moves on.
    moved: tokio::sync::Notify,
    counters: Counters,
    first_ns: Option<i64>,
    last_ns: Option<i64>,
}

/// A recording being played back; stops with the shutdown it was started under.
pub struct Player {
    addr: SocketAddr,
    recorded: Arc<Recorded>,
}

impl Player {
    /// Reads the recording's range and starts serving it on an ephemeral port of 127.0.0.1.
    pub async fn start(
        source: &str,
        playback: &Playback,
        shutdown: &Shutdown,
    ) -> Result<Player, PlaybackError> {
        let p = playback.clone();
        let name = source.to_string();
        let read = tokio::task::spawn_blocking(move || read(&name, p))
            .await
            .map_err(|e| PlaybackError::Listen(std::io::Error::other(e.to_string())))??;
        let recorded = Arc::new(read);
        let listener =
            tokio::net::TcpListener::bind(("127.0.0.1", 0)).await.map_err(PlaybackError::Listen)?;
        let addr = listener.local_addr().map_err(PlaybackError::Listen)?;
        let app = axum::Router::new()
            .fallback(serve)
            .with_state(Played { recorded: recorded.clone(), shutdown: shutdown.clone() });
        let stop = shutdown.token().clone();
        shutdown.spawn(async move {
            let served =
                axum::serve(listener, app).with_graceful_shutdown(stop.cancelled_owned()).await;
            if let Err(e) = served {
                tracing::warn!("recording player: {e}");
            }
        });
        tracing::info!(source, %addr, connections = recorded.conns.len(), answers = recorded.answers.len(), "recording player started");
        Ok(Player { addr, recorded })
    }

    /// The REST base the source reads (`http://127.0.0.1:port`).
    pub fn rest_base(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// The WebSocket URL the source's jobs connect to (a Binance stream's path follows the
    /// host, as at `wss://stream.binance.com:9443/stream?streams=…`).
    pub fn ws_base(&self) -> String {
        match self.recorded.playback.dialect {
            shared::venue::Dialect::Binance => format!("ws://{}", self.addr),
            _ => format!("ws://{}/ws", self.addr),
        }
    }

    pub fn report(&self) -> PlaybackReport {
        let r = &self.recorded;
        let c = &r.counters;
        PlaybackReport {
            source: r.source.clone(),
            dir: r.playback.dir.display().to_string(),
            speed: r.playback.speed,
            looped: r.playback.looped,
            connections: r.conns.len(),
            connections_played: c.played.load(Relaxed),
            connections_finished: c.finished.load(Relaxed),
            frames_played: c.frames.load(Relaxed),
            unmatched_connections: c.unmatched.load(Relaxed),
            rest_answered: c.answered.load(Relaxed),
            rest_unmatched: c.rest_unmatched.load(Relaxed),
            order_waits_given_up: c.waits_given_up.load(Relaxed),
            first_ns: r.first_ns,
            last_ns: r.last_ns,
        }
    }
}

/// Reads the recorded source at `p.dir` in its range.
fn read(source: &str, p: Playback) -> Result<Recorded, PlaybackError> {
    let dir_text = p.dir.display().to_string();
    let err = |source| PlaybackError::Read { dir: dir_text.clone(), source };
    let recorded_name = p.dir.file_name().map(|n| n.to_string_lossy().into_owned());
    let parent = p.dir.parent().unwrap_or(Path::new("."));
    let (from_ns, to_ns) = (
        p.from_ms.map_or(i64::MIN, |ms| ms.saturating_mul(1_000_000)),
        p.to_ms.map_or(i64::MAX, |ms| ms.saturating_mul(1_000_000)),
    );
    let mut conns: Vec<RecordedConn> = Vec::new();
    // a connection id's index; a second `connected` of one id (another process run) is another
    let mut index: HashMap<u64, usize> = HashMap::new();
    let mut requests: HashMap<u64, String> = HashMap::new();
    let mut answers = Vec::new();
    let (mut bytes, mut first_ns, mut last_ns) = (0u64, None, None);
    let mut too_large = false;
    let source_name = recorded_name.unwrap_or_default();
    let torn = crate::recorded::scan_range(parent, &source_name, from_ns, to_ns, |r| {
        let mut conn = |index: &mut HashMap<u64, usize>, fresh: bool| {
            let n = conns.len();
            let at = *index.entry(r.conn).or_insert(n);
            let at = if at == n || fresh {
                conns.push(RecordedConn {
                    id: r.conn,
                    start_ns: r.time_ns,
                    min_ns: r.time_ns,
                    ..RecordedConn::default()
                });
                index.insert(r.conn, conns.len() - 1);
                conns.len() - 1
            } else {
                at
            };
            let c = &mut conns[at];
            c.min_ns = c.min_ns.min(r.time_ns);
            at
        };
        match r.kind {
            Kind::Connected => {
                let fresh = index.contains_key(&r.conn);
                let at = conn(&mut index, fresh);
                conns[at].target = Some(target_of(r.meta));
            }
            Kind::Sent => {
                let at = conn(&mut index, false);
                let c = &mut conns[at];
                if c.first_sent.is_none() {
                    c.first_sent = Some(String::from_utf8_lossy(r.body).into_owned());
                }
            }
            Kind::Received | Kind::Closed => {
                let at = conn(&mut index, false);
                let c = &mut conns[at];
                c.first_frame_ns.get_or_insert(r.time_ns);
                c.frames += 1;
                if r.kind == Kind::Received {
                    first_ns.get_or_insert(r.time_ns);
                    last_ns = Some(r.time_ns);
                }
            }
            Kind::RestRequest => {
                requests.insert(r.conn, r.meta.to_string());
            }
            Kind::RestAnswer => {
                bytes += r.body.len() as u64;
                if bytes > MAX_BYTES {
                    too_large = true;
                    return false;
                }
                if let Some(request) = requests.remove(&r.conn) {
                    answers.push(RecordedAnswer {
                        time_ns: r.time_ns,
                        target: target_of(&request),
                        status: r.meta.parse().unwrap_or(200),
                        body: bytes::Bytes::copy_from_slice(r.body),
                    });
                }
            }
        }
        true
    })
    .map_err(err)?;
    if too_large {
        return Err(PlaybackError::TooLarge { dir: dir_text, max: MAX_BYTES });
    }
    for (file, t) in torn {
        tracing::warn!(file = %file.display(), offset = t.offset, reason = %t.reason, "recording player: a torn tail is skipped");
    }
    // a REST request's connection id is never a WebSocket's: only connections that sent or
    // received a frame are played
    conns.retain(|c| c.first_sent.is_some() || c.frames != 0);
    tracing::debug!(
        source,
        connections = conns.len(),
        answers = answers.len(),
        "recording player: range indexed"
    );
    if conns.is_empty() && answers.is_empty() {
        return Err(PlaybackError::Empty { dir: dir_text });
    }
    let claims = Mutex::new(Claims {
        conns: vec![false; conns.len()],
        answers: vec![false; answers.len()],
        sent: vec![None; answers.len()],
        recent: Vec::new(),
    });
    let pending_answer_ns =
        AtomicI64::new(answers.iter().map(|a| a.time_ns).min().unwrap_or(i64::MAX));
    Ok(Recorded {
        source: source.to_string(),
        files: (parent.to_path_buf(), source_name),
        range_ns: (from_ns, to_ns),
        playback: p,
        progress: conns.iter().map(|_| AtomicI64::new(i64::MAX)).collect(),
        conns,
        answers,
        claims,
        pending_answer_ns,
        moved: tokio::sync::Notify::new(),
        counters: Counters::default(),
        first_ns,
        last_ns,
    })
}

/// The path and query of a recorded request (`GET https://host/path?query`), its host left out.
fn target_of(request: &str) -> String {
    let url = request.strip_prefix("GET ").unwrap_or(request);
    let rest = url.split_once("://").map_or(url, |(_, r)| r);
    match rest.find('/') {
        Some(i) => rest[i..].to_string(),
        None => "/".to_string(),
    }
}

#[derive(Clone)]
struct Played {
    recorded: Arc<Recorded>,
    shutdown: Shutdown,
}

async fn serve(State(p): State<Played>, req: Request) -> Response {
    let wants_ws = req
        .headers()
        .get(header::UPGRADE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.eq_ignore_ascii_case("websocket"));
    let target = req.uri().path_and_query().map_or("/", |t| t.as_str()).to_string();
    if wants_ws {
        let (mut parts, _) = req.into_parts();
        return match WebSocketUpgrade::from_request_parts(&mut parts, &()).await {
            Ok(ws) => ws
                .on_failed_upgrade(|e| tracing::warn!("recording player: upgrade failed: {e}"))
                .on_upgrade(move |socket| play(socket, p, target))
                .into_response(),
            Err(e) => e.into_response(),
        };
    }
    let r = &p.recorded;
    // the recorded answer given (`body`), and the one whose place among the frames it takes
    // (`taken`: the frames received after that one wait until it is sent)
    let found = {
        let mut claims = lock(&r.claims);
        let exact = |a: &RecordedAnswer| recorded_ends_with(&a.target, &target);
        let mut next = (0..r.answers.len()).find(|&i| !claims.answers[i] && exact(&r.answers[i]));
        if next.is_none() && r.playback.looped {
            // looped: the request's answers again from the first, as its connections are
            // (their order among the frames held on the first pass only)
            for i in (0..r.answers.len()).filter(|&i| exact(&r.answers[i])) {
                claims.answers[i] = false;
            }
            next = (0..r.answers.len()).find(|&i| exact(&r.answers[i]));
        }
        let found = match next {
            Some(i) => Some((i, Some(i))),
            // each recorded answer to this request was given: the recorded run got no more
            None if r.answers.iter().any(exact) => None,
            None => {
                // (a request whose query holds the clock: the earliest of its path not asked
                // for is taken as asked for, the last one's body is given)
                let path = target.split('?').next().unwrap_or(&target);
                let same = |a: &RecordedAnswer| recorded_ends_with(a.path(), path);
                let taken =
                    (0..r.answers.len()).find(|&i| !claims.answers[i] && same(&r.answers[i]));
                r.answers.iter().rposition(same).map(|body| (body, taken))
            }
        };
        if let Some((_, Some(i))) = found {
            claims.answers[i] = true;
        }
        found
    };
    let Some((i, taken)) = found else {
        tracing::debug!(source = %r.source, %target, "recording player: no recorded answer");
        r.counters.rest_unmatched.fetch_add(1, Relaxed);
        let body = serde_json::json!({"error": format!("{target}: not in the recording, or each of its recorded answers was given")});
        return (StatusCode::NOT_FOUND, axum::Json(body)).into_response();
    };
    r.counters.answered.fetch_add(1, Relaxed);
    let a = &r.answers[i];
    // as recorded: the answer after every frame received before it on the connections playing
    let answer_ns = taken.map_or(a.time_ns, |t| r.answers[t].time_ns);
    let stop = p.shutdown.token().clone();
    r.wait_for(&stop, None, || r.progress.iter().all(|p| p.load(Relaxed) >= answer_ns)).await;
    if let Some(t) = taken {
        r.answer_sent(t);
    }
    let status = StatusCode::from_u16(a.status).unwrap_or(StatusCode::OK);
    Response::builder()
        .status(status)
        .header(header::CONTENT_TYPE, "application/json")
        .body(Body::from(a.body.clone()))
        .unwrap_or_else(|_| StatusCode::INTERNAL_SERVER_ERROR.into_response())
}

/// Whether a recorded target (a venue's path, perhaps under a simulator's prefix such as
/// `/okx`) ends with the requested one at a path boundary.
fn recorded_ends_with(recorded: &str, asked: &str) -> bool {
    recorded.ends_with(asked)
        && (recorded.len() == asked.len()
            || asked.starts_with('/')
            || recorded.as_bytes()[recorded.len() - asked.len() - 1] == b'/')
}

/// How long a connection or an answer waits for the recorded order before it goes on (a
/// request the recorded run made and this one does not).
const ORDER_WAIT: Duration = Duration::from_secs(2);

/// The most of its recorded lead an answer keeps over the frames received after it, from when
/// it is sent, at any speed (as fast as possible too): the job takes the answer before them, as
/// it did live. Without it, a job reading an answer (a Binance snapshot: a thousand levels) and
/// a socket at once may read a frame that came after the answer first, e.g. a close that cost
/// it the snapshot, where the recorded run had the snapshot applied. It costs at most this per
/// answer where nothing is sent.
const SETTLE_CAP: Duration = Duration::from_millis(100);

impl Recorded {
    /// Notes that answer `t` is being sent now (see [`SETTLE_CAP`]).
    fn answer_sent(&self, t: usize) {
        let now = tokio::time::Instant::now();
        let mut claims = lock(&self.claims);
        if claims.sent[t].is_none() {
            claims.sent[t] = Some(now);
            claims.recent.retain(|&(_, at)| at + SETTLE_CAP > now);
            claims.recent.push((self.answers[t].time_ns, now));
        }
        self.answers_moved(&claims);
    }

    /// When a frame received at `time_ns` may be sent after the answers received before it
    /// that were sent last: each answer's recorded lead over it (at the playback's speed),
    /// at most [`SETTLE_CAP`], after the answer was sent. `None`: now.
    fn settle(&self, time_ns: i64) -> Option<tokio::time::Instant> {
        let now = tokio::time::Instant::now();
        let mut claims = lock(&self.claims);
        claims.recent.retain(|&(_, at)| at + SETTLE_CAP > now);
        let speed = self.playback.speed.unwrap_or(1.0);
        claims
            .recent
            .iter()
            .filter(|&&(answer_ns, _)| answer_ns < time_ns)
            .map(|&(answer_ns, at)| {
                let lead = Duration::from_nanos(((time_ns - answer_ns) as f64 / speed) as u64);
                at + lead.min(SETTLE_CAP)
            })
            .max()
            .filter(|&at| at > now)
    }

    /// Notes which answers were sent (`claims`): the earliest not yet, and wakes waiters.
    fn answers_moved(&self, claims: &Claims) {
        let pending = (0..self.answers.len())
            .filter(|&i| claims.sent[i].is_none())
            .map(|i| self.answers[i].time_ns)
            .min()
            .unwrap_or(i64::MAX);
        self.pending_answer_ns.store(pending, Relaxed);
        self.moved.notify_waiters();
    }

    /// Waits until `ready` (checked whenever an answer is asked for or a connection moves on),
    /// for at most [`ORDER_WAIT`], reading and leaving what `socket`'s client sends meanwhile;
    /// `false` when it gave up or the player stops or the socket's client left (then `ready()`
    /// may still be false).
    async fn wait_for(
        &self,
        stop: &tokio_util::sync::CancellationToken,
        mut socket: Option<&mut WebSocket>,
        ready: impl Fn() -> bool,
    ) -> bool {
        let deadline = tokio::time::Instant::now() + ORDER_WAIT;
        loop {
            let moved = self.moved.notified();
            tokio::pin!(moved);
            moved.as_mut().enable();
            if ready() {
                return true;
            }
            let read = async {
                match socket.as_deref_mut() {
                    Some(s) => s.recv().await.is_some_and(|m| m.is_ok()),
                    None => std::future::pending().await,
                }
            };
            tokio::select! {
                () = stop.cancelled() => return false,
                () = &mut moved => {}
                () = tokio::time::sleep_until(deadline) => {
                    self.counters.waits_given_up.fetch_add(1, Relaxed);
                    return false;
                }
                open = read => if !open {
                    return false;
                },
            }
        }
    }

    /// Reads recorded connection `at`'s received frames and its close from the files into `tx`,
    /// in recorded order, from its earliest time on (the hours it spans only), until all of
    /// them are sent or the receiver is gone. Another connection of the same id (a later process
    /// run's, which begins with its own `connected`) ends it.
    fn read_frames(
        &self,
        at: usize,
        tx: &tokio::sync::mpsc::Sender<Frame>,
    ) -> Result<(), recording::RecordingError> {
        let c = &self.conns[at];
        let (dir, name) = &self.files;
        let (from_ns, to_ns) = (c.min_ns.max(self.range_ns.0), self.range_ns.1);
        let (mut left, mut begun) = (c.frames, false);
        crate::recorded::scan_range(dir, name, from_ns, to_ns, |r| {
            if r.conn != c.id {
                return true;
            }
            if r.kind == Kind::Connected && begun {
                return false;
            }
            begun = true;
            let frame = match r.kind {
                Kind::Received => Frame::Text {
                    time_ns: r.time_ns,
                    text: String::from_utf8_lossy(r.body).into_owned(),
                },
                Kind::Closed => Frame::Close { time_ns: r.time_ns },
                _ => return true,
            };
            left -= 1;
            tx.blocking_send(frame).is_ok() && left != 0
        })?;
        Ok(())
    }

    /// Claims the earliest recorded connection that `matches` and was not played yet (with
    /// `loop`, all of them played: again from the first).
    fn claim(&self, matches: impl Fn(&RecordedConn) -> bool) -> Option<usize> {
        let mut claims = lock(&self.claims);
        let same = |i: usize| matches(&self.conns[i]);
        let mut at = (0..self.conns.len()).find(|&i| same(i) && !claims.conns[i]);
        if at.is_none() && self.playback.looped {
            for i in (0..self.conns.len()).filter(|&i| same(i)) {
                claims.conns[i] = false;
            }
            at = (0..self.conns.len()).find(|&i| same(i));
        }
        if let Some(i) = at {
            claims.conns[i] = true;
        }
        at
    }
}

/// Plays one connection: its URL, or else its subscription, picks the recorded connection
/// (see the module docs).
async fn play(mut socket: WebSocket, p: Played, target: String) {
    let stop = p.shutdown.token().clone();
    let r = &p.recorded;
    // a connection that never sent a frame was subscribed by its URL (Binance's streams)
    let by_url = |c: &RecordedConn| {
        c.first_sent.is_none()
            && c.target.as_deref().is_some_and(|t| recorded_ends_with(t, &target))
    };
    let (claimed, first) = match r.claim(by_url) {
        Some(at) => (Some(at), target),
        // every one of them played: nothing is coming for this URL
        None if r.conns.iter().any(by_url) => (None, target),
        None => {
            let first = tokio::select! {
                () = stop.cancelled() => return,
                first = tokio::time::timeout(FIRST_FRAME_WAIT, socket.recv()) => first,
            };
            let first = match first {
                Ok(Some(Ok(Message::Text(t)))) => t.to_string(),
                _ => return,
            };
            (r.claim(|c| c.first_sent.as_deref() == Some(first.as_str())), first)
        }
    };
    let Some(at) = claimed else {
        tracing::debug!(source = %r.source, first = %first, "recording player: no recorded connection subscribed so");
        r.counters.unmatched.fetch_add(1, Relaxed);
        idle(socket, &stop).await;
        return;
    };
    r.counters.played.fetch_add(1, Relaxed);
    let conn = &r.conns[at];
    let playing = Playing::start(r, at);
    tracing::debug!(source = %r.source, at, frames = conn.frames, first = %first, "recording player: a connection plays");
    let started = tokio::time::Instant::now();
    let due = |time_ns: i64| {
        let speed = r.playback.speed?;
        let ns = (time_ns - conn.start_ns).max(0) as f64 / speed;
        Some(started + Duration::from_nanos(ns as u64))
    };
    // its frames, read from the files a bounded queue ahead (the reader stops when this
    // connection ends: its receiver is dropped)
    let (tx, mut frames) = tokio::sync::mpsc::channel::<Frame>(READ_AHEAD_FRAMES);
    if conn.frames != 0 {
        let reader = p.recorded.clone();
        tokio::task::spawn_blocking(move || {
            if let Err(e) = reader.read_frames(at, &tx) {
                tracing::warn!(source = %reader.source, "recording player: a connection's frames cannot be read: {e}");
            }
        });
    }
    loop {
        let frame = tokio::select! {
            () = stop.cancelled() => return,
            frame = frames.recv() => frame,
        };
        let Some(frame) = frame else { break };
        let (time_ns, text) = match frame {
            Frame::Text { time_ns, text } => (time_ns, Some(text)),
            Frame::Close { time_ns } => (time_ns, None),
        };
        // as recorded: a frame after every answer received before it was asked for (a
        // Binance book's snapshot lands among its diffs where it did)
        r.progress[at].store(time_ns, Relaxed);
        r.moved.notify_waiters();
        if r.pending_answer_ns.load(Relaxed) < time_ns
            && !r
                .wait_for(&stop, Some(&mut socket), || r.pending_answer_ns.load(Relaxed) >= time_ns)
                .await
        {
            if stop.is_cancelled() {
                return;
            }
            // not asked for this time: taken as asked and sent, so the frames go on
            let mut claims = lock(&r.claims);
            let now = tokio::time::Instant::now();
            for (i, a) in r.answers.iter().enumerate() {
                if a.time_ns < time_ns {
                    claims.answers[i] = true;
                    claims.sent[i].get_or_insert(now);
                }
            }
            r.answers_moved(&claims);
        }
        let at = match (due(time_ns), r.settle(time_ns)) {
            (Some(due), Some(settle)) => Some(due.max(settle)),
            (due, settle) => due.or(settle),
        };
        if let Some(at) = at {
            // what the job sends meanwhile is read and left
            loop {
                tokio::select! {
                    () = stop.cancelled() => return,
                    () = tokio::time::sleep_until(at) => break,
                    m = socket.recv() => match m {
                        Some(Ok(_)) => {}
                        _ => return,
                    },
                }
            }
        }
        let Some(text) = text else {
            // ended as the recorded one did; the client reads every frame before the close
            // and answers it (a socket dropped at once could fail a send of the client's
            // before it read them)
            drop(playing);
            r.counters.finished.fetch_add(1, Relaxed);
            if socket.send(Message::Close(None)).await.is_ok() {
                let _ = tokio::time::timeout(FIRST_FRAME_WAIT, idle(socket, &stop)).await;
            }
            return;
        };
        let sent = tokio::select! {
            () = stop.cancelled() => return,
            sent = socket.send(Message::Text(text.into())) => sent,
        };
        if sent.is_err() {
            return;
        }
        r.counters.frames.fetch_add(1, Relaxed);
    }
    drop(playing);
    r.counters.finished.fetch_add(1, Relaxed);
    if r.playback.looped && socket.send(Message::Close(None)).await.is_ok() {
        let _ = tokio::time::timeout(FIRST_FRAME_WAIT, idle(socket, &stop)).await;
        return;
    }
    idle(socket, &stop).await;
}

/// A recorded connection playing: its progress is followed (answers wait for its frames) until
/// this is dropped.
struct Playing<'a> {
    recorded: &'a Recorded,
    at: usize,
}

impl<'a> Playing<'a> {
    fn start(recorded: &'a Recorded, at: usize) -> Playing<'a> {
        let first = recorded.conns[at].first_frame_ns.unwrap_or(i64::MAX);
        recorded.progress[at].store(first, Relaxed);
        Playing { recorded, at }
    }
}

impl Drop for Playing<'_> {
    fn drop(&mut self) {
        self.recorded.progress[self.at].store(i64::MAX, Relaxed);
        self.recorded.moved.notify_waiters();
    }
}

/// Keeps a connection open and silent until its client leaves or the player stops.
async fn idle(mut socket: WebSocket, stop: &tokio_util::sync::CancellationToken) {
    loop {
        tokio::select! {
            () = stop.cancelled() => return,
            m = socket.recv() => match m {
                Some(Ok(_)) => {}
                _ => return,
            },
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn frames_of(r: &Recorded, at: usize) -> Vec<String> {
        let (tx, mut rx) = tokio::sync::mpsc::channel(READ_AHEAD_FRAMES);
        r.read_frames(at, &tx).unwrap();
        drop(tx);
        let mut out = Vec::new();
        while let Ok(f) = rx.try_recv() {
            out.push(match f {
                Frame::Text { text, .. } => text,
                Frame::Close { .. } => "(closed)".to_string(),
            });
        }
        out
    }

    /// A connection's frames are read from the files as it plays: each recorded connection gets
    /// its own, across an hour's file boundary, a second run's connection of the same id its
    /// own, and only the range's.
    #[test]
    fn each_connection_reads_its_own_frames_from_the_files() {
        const HOUR: i64 = 3_600_000_000_000;
        let t0 = 1_700_000_000_000_000_000 / HOUR * HOUR + HOUR - 2_000_000_000;
        let dir = testkit::temp_dir("player-index");
        let mut rec = recording::Recorder::new(&dir, "okx").unwrap();
        let mut put = |kind, ms: i64, conn, meta: &str, body: &str| {
            let time_ns = t0 + ms * 1_000_000;
            rec.append(&recording::Record { kind, time_ns, conn, meta, body: body.as_bytes() })
                .unwrap();
        };
        put(Kind::Connected, 0, 1, "wss://x/ws/v5/public", "");
        put(Kind::Sent, 1, 1, "", "sub-a");
        put(Kind::Connected, 2, 2, "wss://x/ws/v5/public", "");
        put(Kind::Sent, 3, 2, "", "sub-b");
        for i in 0..4 {
            // the last two after the hour: another file
            put(Kind::Received, 10 + i * 700, 1, "", &format!("a{i}"));
            put(Kind::Received, 11 + i * 700, 2, "", &format!("b{i}"));
        }
        put(Kind::RestRequest, 2500, 9, "GET https://x/api/v5/public/time", "");
        put(Kind::RestAnswer, 2501, 9, "200", "{\"ts\":1}");
        put(Kind::Closed, 2600, 1, "", "");
        // a later run reuses connection id 1
        put(Kind::Connected, 3000, 1, "wss://x/ws/v5/public", "");
        put(Kind::Sent, 3001, 1, "", "sub-a");
        put(Kind::Received, 3002, 1, "", "c0");
        rec.flush().unwrap();
        drop(rec);
        assert_eq!(recording::list_files(&dir).unwrap().len(), 2, "two hours' files");
        let playback = |from_ms: Option<i64>| Playback {
            dir: dir.join("okx"),
            dialect: shared::venue::Dialect::Okx,
            from_ms,
            to_ms: None,
            speed: None,
            looped: false,
        };
        let r = read("okx", playback(None)).unwrap();
        assert_eq!(r.conns.len(), 3);
        assert_eq!(r.conns.iter().map(|c| c.frames).collect::<Vec<_>>(), [5, 4, 1]);
        assert_eq!(frames_of(&r, 0), ["a0", "a1", "a2", "a3", "(closed)"]);
        assert_eq!(frames_of(&r, 1), ["b0", "b1", "b2", "b3"]);
        assert_eq!(frames_of(&r, 2), ["c0"]);
        assert_eq!(r.answers.len(), 1);
        // a range that begins within the connections: their frames from there on
        let r = read("okx", playback(Some(t0 / 1_000_000 + 1000))).unwrap();
        assert_eq!(frames_of(&r, 0), ["a2", "a3", "(closed)"]);
        assert_eq!(frames_of(&r, 1), ["b2", "b3"]);
        assert_eq!(frames_of(&r, 2), ["c0"]);
        let _ = std::fs::remove_dir_all(&dir);
    }

    /// A request takes its recorded answers in order, and once they are used up a 404 (the
    /// recorded run got no more), or with `loop` the first again; a request never recorded
    /// whose path was (a query holding the clock) gets the path's last answer.
    #[tokio::test]
    async fn each_recorded_answer_is_given_once_in_order() {
        let dir = testkit::temp_dir("player-answers");
        let mut rec = recording::Recorder::new(&dir, "sim").unwrap();
        let t0 = 1_700_000_000_000_000_000;
        let answers = [
            (1, "GET http://x/api/v3/depth?symbol=BTCUSDT&limit=1000", "{\"n\":1}"),
            (2, "GET http://x/api/v3/klines?symbol=BTCUSDT&startTime=5", "[5]"),
            (3, "GET http://x/api/v3/depth?symbol=BTCUSDT&limit=1000", "{\"n\":2}"),
        ];
        for (conn, request, body) in answers {
            let time_ns = t0 + conn as i64 * 1_000_000;
            for (kind, meta, body) in
                [(Kind::RestRequest, request, ""), (Kind::RestAnswer, "200", body)]
            {
                rec.append(&recording::Record { kind, time_ns, conn, meta, body: body.as_bytes() })
                    .unwrap();
            }
        }
        rec.flush().unwrap();
        drop(rec);
        let client = reqwest::Client::new();
        for looped in [false, true] {
            let shutdown = Shutdown::new();
            let playback = Playback {
                dir: dir.join("sim"),
                dialect: shared::venue::Dialect::Binance,
                from_ms: None,
                to_ms: None,
                speed: None,
                looped,
            };
            let player = Player::start("sim", &playback, &shutdown).await.unwrap();
            let get = |path: &str| {
                let url = format!("{}{path}", player.rest_base());
                let client = client.clone();
                async move {
                    let r = client.get(url).send().await.unwrap();
                    (r.status().as_u16(), r.text().await.unwrap())
                }
            };
            let depth = "/api/v3/depth?symbol=BTCUSDT&limit=1000";
            assert_eq!(get(depth).await, (200, "{\"n\":1}".into()));
            assert_eq!(get("/api/v3/klines?symbol=BTCUSDT&startTime=9").await.1, "[5]");
            assert_eq!(get(depth).await, (200, "{\"n\":2}".into()));
            let third = get(depth).await;
            if looped {
                assert_eq!(third, (200, "{\"n\":1}".into()));
            } else {
                assert_eq!(third.0, 404, "{third:?}");
                assert!(third.1.contains("each of its recorded answers was given"), "{third:?}");
                assert_eq!(player.report().rest_unmatched, 1);
            }
            assert_eq!(get("/api/v3/klines?symbol=BTCUSDT&startTime=10").await.1, "[5]");
            assert_eq!(get("/api/v3/ping").await.0, 404);
            shutdown.stop();
        }
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn a_recorded_request_is_matched_by_its_path_and_query_under_any_prefix() {
        assert_eq!(
            target_of("GET http://127.0.0.1:4000/okx/api/v5/market/books?instId=BTC-USDT&sz=400"),
            "/okx/api/v5/market/books?instId=BTC-USDT&sz=400"
        );
        assert_eq!(target_of("GET https://www.okx.com"), "/");
        assert!(recorded_ends_with("/okx/api/v5/public/time", "/api/v5/public/time"));
        assert!(recorded_ends_with("/api/v5/public/time", "/api/v5/public/time"));
        assert!(!recorded_ends_with("/okx/api/v5/public/time", "/v5/public/times"));
        assert!(!recorded_ends_with("/okx/xapi/v5", "api/v5"));
    }
}
