//! The live connection to the server's `/ws`: one WebSocket per page, shared by every widget
//! through [`Feed`]. Widgets subscribe to streams with handlers; the feed sends `SUBSCRIBE` for
//! a stream when its first subscriber comes and `UNSUBSCRIBE` when its last one goes (so the
//! server's job refcounts follow the page), re-subscribes everything after a reconnect, and
//! reconnects with the shared back-off (`shared::backoff::Backoff`, jittered) when the socket
//! closes. The socket is `gloo-net`'s; a reader and a writer task own its halves.
//!
//! Each stream is subscribed in a request of its own, because the server applies a request all
//! or nothing: a stream the server refuses (`capacity_exhausted`, `unknown_series`, …) never
//! holds back the page's other streams. The refusal goes to that stream's widgets
//! ([`Handlers::on_refused`], with the server's code and message); a refusal that can pass
//! (capacity, lag, an internal error) is retried for that stream alone, 2 s doubling to 60 s.
//! Everything is cleaned up (socket closed, timer cleared) when the owning component unmounts.

use std::cell::{Cell, RefCell};
use std::collections::HashMap;
use std::rc::{Rc, Weak};
use std::time::Duration;

use futures_channel::mpsc;
use futures_util::future::{abortable, AbortHandle};
use futures_util::{SinkExt as _, StreamExt as _};
use gloo_net::websocket::futures::WebSocket;
use gloo_net::websocket::Message;
use leptos::prelude::*;
use leptos::task::spawn_local;
use send_wrapper::SendWrapper;
use shared::backoff::Backoff;
use shared::protocol::{
    ClientRequest, ErrorBody, ErrorCode, Heartbeat, Method, PushData, ServerFrame, Stream,
};

use crate::ConnStatus;

/// The feed's reconnect delays: 500 ms doubling to 10 s, ±20 % jitter.
fn reconnect_backoff() -> Backoff {
    Backoff::new(Duration::from_millis(500), Duration::from_secs(10))
}

/// Waits before a refused stream is asked for again: 2 s doubling to 60 s, ±20 % jitter.
fn refusal_backoff() -> Backoff {
    Backoff::new(Duration::from_secs(2), Duration::from_secs(60))
}

/// What a subscriber is told about its stream.
pub struct Handlers {
    /// A message pushed on the stream (its `data`, read as the stream's type once per frame).
    pub on_push: Box<dyn Fn(&PushData)>,
    /// The server accepted the subscription (after every (re)connect): messages flow from now.
    pub on_live: Box<dyn Fn()>,
    /// The socket closed: nothing arrives until the next `on_live`.
    pub on_lost: Box<dyn Fn()>,
    /// The server refused the subscription; nothing arrives until the next `on_live`.
    pub on_refused: Box<dyn Fn(&StreamRefusal)>,
}

impl Handlers {
    /// Handlers that only take pushes.
    pub fn pushes(on_push: impl Fn(&PushData) + 'static) -> Handlers {
        Handlers {
            on_push: Box::new(on_push),
            on_live: Box::new(|| {}),
            on_lost: Box::new(|| {}),
            on_refused: Box::new(|_| {}),
        }
    }
}

/// The server's refusal of one stream.
#[derive(Debug, Clone, PartialEq)]
pub struct StreamRefusal {
    pub code: ErrorCode,
    /// The server's message, as it sent it.
    pub msg: String,
    /// When the feed asks again (`None`: it does not; the request cannot succeed as it is).
    pub retry_in: Option<Duration>,
}

impl StreamRefusal {
    /// What a widget shows: `capacity_exhausted: <the server's message> (retrying in 4 s)`.
    pub fn text(&self) -> String {
        let code = serde_json::to_value(self.code)
            .ok()
            .and_then(|v| v.as_str().map(str::to_string))
            .unwrap_or_default();
        match self.retry_in {
            Some(d) => format!("{code}: {} (retrying in {} s)", self.msg, d.as_secs().max(1)),
            None => format!("{code}: {}", self.msg),
        }
    }
}

/// Whether a refusal with `code` can pass if the same request is made later.
pub fn is_retryable(code: ErrorCode) -> bool {
    matches!(
        code,
        ErrorCode::CapacityExhausted
            | ErrorCode::Preempted
            | ErrorCode::Lagging
            | ErrorCode::Internal
            | ErrorCode::Unavailable
            | ErrorCode::TooManyConnections
            | ErrorCode::TooManyJobStarts
    )
}

/// The page's shared feed. Cheap to clone; use it on the browser's thread only.
#[derive(Clone)]
pub struct Feed(SendWrapper<Rc<Connection>>);

impl Feed {
    /// Opens a feed to the page's own server; it closes when the calling component is cleaned up.
    pub fn open() -> Feed {
        Feed::open_url(ws_url())
    }

    /// Opens a feed to `url` (`ws://host/ws`); it closes when the calling component is cleaned up.
    pub fn open_url(url: impl Into<String>) -> Feed {
        let (status, set_status) = signal(ConnStatus::Connecting);
        let conn = Rc::new(Connection {
            url: url.into(),
            socket: RefCell::new(None),
            generation: Cell::new(0),
            retry: Cell::new(None),
            backoff: RefCell::new(reconnect_backoff()),
            stopped: Cell::new(false),
            status,
            set_status,
            subs: RefCell::new(Vec::new()),
            next_id: Cell::new(1),
            pending: RefCell::new(HashMap::new()),
            refused: RefCell::new(HashMap::new()),
        });
        conn.open();
        // Leptos cleanups must be `Send`; this one runs on the browser's only thread.
        let guard = SendWrapper::new(conn.clone());
        on_cleanup(move || guard.stop());
        Feed(SendWrapper::new(conn))
    }

    /// The feed in context, or a new one put there.
    pub fn use_or_open() -> Feed {
        use_context::<Feed>().unwrap_or_else(|| {
            let feed = Feed::open();
            provide_context(feed.clone());
            feed
        })
    }

    pub fn status(&self) -> ReadSignal<ConnStatus> {
        self.0.status
    }

    /// Subscribes to `stream` until the calling component is cleaned up.
    pub fn subscribe(&self, stream: Stream, handlers: Handlers) {
        let sub = SendWrapper::new(self.subscription(stream, handlers));
        on_cleanup(move || drop(sub));
    }

    /// Subscribes to `stream` until the returned handle is dropped.
    pub fn subscription(&self, stream: Stream, handlers: Handlers) -> FeedSubscription {
        let id = self.0.add(stream, Rc::new(handlers));
        FeedSubscription { conn: Rc::downgrade(&self.0), id }
    }

    /// How many widgets subscribe to `stream` on this page.
    pub fn subscribers(&self, stream: &Stream) -> usize {
        self.0.subs.borrow().iter().filter(|s| &s.stream == stream).count()
    }
}

/// A subscription held by its owner: dropping it unsubscribes (the last one of a stream sends
/// `UNSUBSCRIBE`).
pub struct FeedSubscription {
    conn: Weak<Connection>,
    id: u64,
}

impl Drop for FeedSubscription {
    fn drop(&mut self) {
        if let Some(c) = self.conn.upgrade() {
            c.remove(self.id);
        }
    }
}

/// What [`use_heartbeat_feed`] gives a component.
#[derive(Clone, Copy)]
pub struct HeartbeatFeed {
    pub status: ReadSignal<ConnStatus>,
    /// The most recent heartbeat; kept across reconnects.
    pub last: ReadSignal<Option<Heartbeat>>,
    /// When it arrived (`Date.now()`), 0 before the first.
    pub received: ReadSignal<f64>,
}

/// The connection status and the server's heartbeats, on the page's feed.
pub fn use_heartbeat_feed() -> HeartbeatFeed {
    let feed = Feed::use_or_open();
    let (last, set_last) = signal(None);
    let (received, set_received) = signal(0.0);
    let status = feed.0.set_status;
    feed.subscribe(
        Stream::Heartbeat,
        Handlers {
            on_push: Box::new(move |data| match data {
                PushData::Heartbeat(hb) => {
                    status.set(ConnStatus::Live);
                    set_last.set(Some(hb.clone()));
                    set_received.set(js_sys::Date::now());
                }
                other => leptos::logging::warn!("a {} push on heartbeat", other.kind()),
            }),
            on_live: Box::new(|| {}),
            on_lost: Box::new(|| {}),
            on_refused: Box::new(|_| {}),
        },
    );
    HeartbeatFeed { status: feed.status(), last, received }
}

/// `ws://host/ws` (or `wss://` on https) for the page's own host.
fn ws_url() -> String {
    let location = web_sys::window().expect("a browser window").location();
    let scheme = if location.protocol().as_deref() == Ok("https:") { "wss" } else { "ws" };
    let host = location.host().unwrap_or_else(|_| "127.0.0.1:8080".into());
    format!("{scheme}://{host}/ws")
}

/// One WebSocket connection: what its reader and writer tasks need to be stopped. Dropping it
/// stops both; the socket closes when they let go of its halves.
struct Socket {
    /// Text frames for the writer task (which waits for the socket to open first).
    out: mpsc::UnboundedSender<String>,
    /// Set once the socket is open and the subscriptions were re-sent.
    open: Cell<bool>,
    reader: AbortHandle,
    writer: AbortHandle,
}

impl Drop for Socket {
    fn drop(&mut self) {
        self.reader.abort();
        self.writer.abort();
    }
}

struct Sub {
    id: u64,
    stream: Stream,
    handlers: Rc<Handlers>,
}

struct Connection {
    url: String,
    /// The current socket, if one is open or opening.
    socket: RefCell<Option<Socket>>,
    /// Counts sockets, so the tasks of a replaced one cannot touch its successor.
    generation: Cell<u64>,
    /// The pending reconnect timer, if any.
    retry: Cell<Option<TimeoutHandle>>,
    /// Delays between reconnect attempts (reset when the feed is live).
    backoff: RefCell<Backoff>,
    /// Set on cleanup: never reconnect again.
    stopped: Cell<bool>,
    status: ReadSignal<ConnStatus>,
    set_status: WriteSignal<ConnStatus>,
    subs: RefCell<Vec<Sub>>,
    /// Next id for subscriptions and requests.
    next_id: Cell<u64>,
    /// Requests sent on the current socket and not answered yet: the streams they subscribe.
    pending: RefCell<HashMap<u64, Vec<Stream>>>,
    /// Streams the server refused, with their retry back-off and pending retry timer.
    refused: RefCell<HashMap<Stream, Retry>>,
}

/// A refused stream's next attempt.
struct Retry {
    backoff: Backoff,
    timer: Option<TimeoutHandle>,
}

impl Drop for Retry {
    fn drop(&mut self) {
        if let Some(t) = self.timer.take() {
            t.clear();
        }
    }
}

impl Connection {
    fn fresh_id(&self) -> u64 {
        let id = self.next_id.get();
        self.next_id.set(id + 1);
        id
    }

    fn add(self: &Rc<Self>, stream: Stream, handlers: Rc<Handlers>) -> u64 {
        let id = self.fresh_id();
        let first = !self.subs.borrow().iter().any(|s| s.stream == stream);
        self.subs.borrow_mut().push(Sub { id, stream: stream.clone(), handlers: handlers.clone() });
        if first {
            self.request(Method::Subscribe, vec![stream]);
        } else if self.status.get_untracked() == ConnStatus::Live
            && !self.pending.borrow().values().any(|streams| streams.contains(&stream))
            && !self.refused.borrow().contains_key(&stream)
        {
            // already flowing for another subscriber: this one is live once it is set up
            queue_microtask(move || (handlers.on_live)());
        }
        id
    }

    fn remove(&self, id: u64) {
        let stream = {
            let mut subs = self.subs.borrow_mut();
            let Some(at) = subs.iter().position(|s| s.id == id) else { return };
            subs.remove(at).stream
        };
        if !self.subs.borrow().iter().any(|s| s.stream == stream) {
            // a refused stream was never subscribed: drop its retry instead
            if self.refused.borrow_mut().remove(&stream).is_none() {
                self.request(Method::Unsubscribe, vec![stream]);
            }
        }
    }

    /// Sends a request on the open socket (a closed one re-subscribes everything when it opens).
    fn request(&self, method: Method, streams: Vec<Stream>) {
        let socket = self.socket.borrow();
        let Some(socket) = socket.as_ref().filter(|s| s.open.get()) else { return };
        let id = self.fresh_id();
        let request =
            ClientRequest { method, params: streams.iter().map(Stream::to_string).collect(), id };
        let text = serde_json::to_string(&request).expect("a request always serializes");
        if method == Method::Subscribe {
            self.pending.borrow_mut().insert(id, streams);
        }
        let _ = socket.out.unbounded_send(text);
    }

    fn open(self: &Rc<Self>) {
        if self.stopped.get() {
            return;
        }
        let ws = match WebSocket::open(&self.url) {
            Ok(ws) => ws,
            Err(e) => {
                leptos::logging::warn!("cannot open {}: {e}", self.url);
                return self.schedule_reconnect();
            }
        };
        let generation = self.generation.get() + 1;
        self.generation.set(generation);
        let (mut write, mut read) = ws.split();
        let (out, mut outgoing) = mpsc::unbounded::<String>();
        // The writer waits for the socket to open, tells the connection (which re-sends the
        // subscriptions), then sends what it is given.
        let weak = Rc::downgrade(self);
        let (writer, writer_handle) = abortable(async move {
            if futures_util::future::poll_fn(|cx| write.poll_ready_unpin(cx)).await.is_err() {
                return;
            }
            if let Some(c) = weak.upgrade().filter(|c| c.generation.get() == generation) {
                c.on_open();
            }
            while let Some(text) = outgoing.next().await {
                if write.send(Message::Text(text)).await.is_err() {
                    return;
                }
            }
        });
        // The reader hands frames to the connection until the socket closes.
        let weak = Rc::downgrade(self);
        let (reader, reader_handle) = abortable(async move {
            while let Some(frame) = read.next().await {
                let Some(c) = weak.upgrade() else { return };
                match frame {
                    Ok(Message::Text(text)) => c.on_text(&text),
                    Ok(Message::Bytes(_)) => {
                        leptos::logging::warn!("binary frame from the server ignored")
                    }
                    Err(_) => break,
                }
            }
            if let Some(c) = weak.upgrade().filter(|c| c.generation.get() == generation) {
                c.on_close();
            }
        });
        spawn_local(async move {
            let _ = writer.await;
        });
        spawn_local(async move {
            let _ = reader.await;
        });
        let old = self.socket.replace(Some(Socket {
            out,
            open: Cell::new(false),
            reader: reader_handle,
            writer: writer_handle,
        }));
        drop(old);
    }

    fn on_open(&self) {
        if let Some(socket) = self.socket.borrow().as_ref() {
            socket.open.set(true);
        }
        self.pending.borrow_mut().clear();
        // retries wait for nothing now: every stream is asked for again on this socket
        for retry in self.refused.borrow_mut().values_mut() {
            if let Some(t) = retry.timer.take() {
                t.clear();
            }
        }
        let mut streams: Vec<Stream> =
            self.subs.borrow().iter().map(|s| s.stream.clone()).collect();
        streams.sort();
        streams.dedup();
        if streams.is_empty() {
            self.backoff.borrow_mut().reset();
            self.set_status.set(ConnStatus::Live);
        }
        // one request per stream: the server refuses a request as a whole
        for stream in streams {
            self.request(Method::Subscribe, vec![stream]);
        }
    }

    /// The server refused `streams` (subscribed in one request): tell their widgets, and ask
    /// again later when the refusal can pass.
    fn on_refused(self: &Rc<Self>, streams: Vec<Stream>, error: &ErrorBody) {
        for stream in streams {
            if !self.subs.borrow().iter().any(|s| s.stream == stream) {
                continue; // its last widget went while the request was out
            }
            let retry_in = is_retryable(error.code).then(|| {
                let random = (js_sys::Math::random() * f64::from(u32::MAX)) as u32;
                let mut refused = self.refused.borrow_mut();
                let retry = refused
                    .entry(stream.clone())
                    .or_insert_with(|| Retry { backoff: refusal_backoff(), timer: None });
                let delay = retry.backoff.next_delay(random);
                let weak = Rc::downgrade(self);
                let again = stream.clone();
                retry.timer = set_timeout_with_handle(
                    move || {
                        if let Some(c) = weak.upgrade() {
                            c.retry(again);
                        }
                    },
                    delay,
                )
                .ok();
                delay
            });
            if retry_in.is_none() {
                self.refused
                    .borrow_mut()
                    .insert(stream.clone(), Retry { backoff: refusal_backoff(), timer: None });
            }
            let refusal = StreamRefusal { code: error.code, msg: error.msg.clone(), retry_in };
            leptos::logging::warn!("server refused {stream}: {}", refusal.text());
            let told: Vec<Rc<Handlers>> = self
                .subs
                .borrow()
                .iter()
                .filter(|s| s.stream == stream)
                .map(|s| s.handlers.clone())
                .collect();
            for h in told {
                (h.on_refused)(&refusal);
            }
        }
    }

    /// Asks again for a refused stream, if a widget still wants it.
    fn retry(&self, stream: Stream) {
        if let Some(retry) = self.refused.borrow_mut().get_mut(&stream) {
            retry.timer = None;
        }
        if self.subs.borrow().iter().any(|s| s.stream == stream) {
            self.request(Method::Subscribe, vec![stream]);
        }
    }

    fn on_text(self: &Rc<Self>, text: &str) {
        match serde_json::from_str::<ServerFrame>(text) {
            Ok(ServerFrame::Reply(reply)) if reply.stream.is_some() => {
                // unasked: the server ended a stream (e.g. `preempted`); ask again later
                if let (Some(stream), Some(error)) = (reply.stream.clone(), &reply.error) {
                    self.on_refused(vec![stream], error);
                }
            }
            Ok(ServerFrame::Reply(reply)) => {
                let streams = self.pending.borrow_mut().remove(&reply.id);
                // the server answers: the connection is live, whatever it says of one stream
                self.backoff.borrow_mut().reset();
                self.set_status.set(ConnStatus::Live);
                if let Some(error) = &reply.error {
                    match streams {
                        Some(streams) => self.on_refused(streams, error),
                        None => leptos::logging::warn!("server refused request: {reply:?}"),
                    }
                    return;
                }
                let Some(streams) = streams else { return };
                {
                    let mut refused = self.refused.borrow_mut();
                    for s in &streams {
                        refused.remove(s);
                    }
                }
                let live: Vec<Rc<Handlers>> = self
                    .subs
                    .borrow()
                    .iter()
                    .filter(|s| streams.contains(&s.stream))
                    .map(|s| s.handlers.clone())
                    .collect();
                for h in live {
                    (h.on_live)();
                }
            }
            Ok(ServerFrame::Push(push)) => {
                let to: Vec<Rc<Handlers>> = self
                    .subs
                    .borrow()
                    .iter()
                    .filter(|s| s.stream == push.stream)
                    .map(|s| s.handlers.clone())
                    .collect();
                for h in to {
                    (h.on_push)(&push.data);
                }
            }
            Err(e) => leptos::logging::warn!("unreadable frame from server: {e}"),
        }
    }

    fn on_close(self: &Rc<Self>) {
        drop(self.socket.take());
        self.pending.borrow_mut().clear();
        for retry in self.refused.borrow_mut().values_mut() {
            if let Some(t) = retry.timer.take() {
                t.clear();
            }
        }
        let all: Vec<Rc<Handlers>> =
            self.subs.borrow().iter().map(|s| s.handlers.clone()).collect();
        for h in all {
            (h.on_lost)();
        }
        self.schedule_reconnect();
    }

    fn schedule_reconnect(self: &Rc<Self>) {
        if self.stopped.get() {
            return;
        }
        // Jitter so many tabs do not reconnect in lockstep after a server restart.
        let random = (js_sys::Math::random() * f64::from(u32::MAX)) as u32;
        let delay = self.backoff.borrow_mut().next_delay(random);
        let attempt = self.backoff.borrow().attempt();
        self.set_status.set(ConnStatus::Reconnecting { attempt });
        let weak = Rc::downgrade(self);
        let handle = set_timeout_with_handle(
            move || {
                if let Some(c) = weak.upgrade() {
                    c.retry.set(None);
                    c.open();
                }
            },
            delay,
        );
        match handle {
            Ok(h) => {
                if let Some(old) = self.retry.replace(Some(h)) {
                    old.clear();
                }
            }
            Err(e) => leptos::logging::warn!("cannot schedule reconnect: {e:?}"),
        }
    }

    fn stop(&self) {
        self.stopped.set(true);
        if let Some(h) = self.retry.take() {
            h.clear();
        }
        self.refused.borrow_mut().clear();
        drop(self.socket.take());
    }
}
