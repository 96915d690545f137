//! The live connection to the server's `/ws`: one WebSocket per page, shared by every widget
//! through [`Feed`]. Widgets subscribe to streams with handlers; the feed sends `SUBSCRIBE` for
//! a stream when its first subscriber comes and `UNSUBSCRIBE` when its last one goes (so the
//! server's job refcounts follow the page), re-subscribes everything after a reconnect, and
//! reconnects with back-off ([`crate::backoff_ms`] plus jitter) when the socket closes.
//! Everything is cleaned up (socket closed, timer cleared) when the owning component unmounts.

use std::cell::{Cell, RefCell};
use std::collections::HashMap;
use std::rc::{Rc, Weak};
use std::time::Duration;

use leptos::prelude::*;
use send_wrapper::SendWrapper;
use shared::protocol::{ClientRequest, Heartbeat, Method, ServerFrame, Stream};
use wasm_bindgen::closure::Closure;
use wasm_bindgen::JsCast;
use web_sys::{CloseEvent, Event, MessageEvent, WebSocket};

use crate::{backoff_ms, ConnStatus};

/// What a subscriber is told about its stream.
pub struct Handlers {
    /// A message pushed on the stream (its `data`).
    pub on_push: Box<dyn Fn(&serde_json::Value)>,
    /// The server accepted the subscription (after every (re)connect): messages flow from now.
    pub on_live: Box<dyn Fn()>,
    /// The socket closed: nothing arrives until the next `on_live`.
    pub on_lost: Box<dyn Fn()>,
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
            retry: Cell::new(None),
            attempt: Cell::new(0),
            stopped: Cell::new(false),
            status,
            set_status,
            subs: RefCell::new(Vec::new()),
            next_id: Cell::new(1),
            pending: RefCell::new(HashMap::new()),
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
    pub fn subscription(&self, stream: Stream, handlers: Handlers) -> Subscription {
        let id = self.0.add(stream, Rc::new(handlers));
        Subscription { conn: Rc::downgrade(&self.0), id }
    }

    /// How many widgets subscribe to `stream` on this page.
    pub fn subscribers(&self, stream: &Stream) -> usize {
        self.0.subs.borrow().iter().filter(|s| &s.stream == stream).count()
    }
}

/// A subscription held by its owner: dropping it unsubscribes (the last one of a stream sends
/// `UNSUBSCRIBE`).
pub struct Subscription {
    conn: Weak<Connection>,
    id: u64,
}

impl Drop for Subscription {
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
            on_push: Box::new(move |data| match serde_json::from_value::<Heartbeat>(data.clone()) {
                Ok(hb) => {
                    status.set(ConnStatus::Live);
                    set_last.set(Some(hb));
                    set_received.set(js_sys::Date::now());
                }
                Err(e) => leptos::logging::warn!("bad heartbeat: {e}"),
            }),
            on_live: Box::new(|| {}),
            on_lost: Box::new(|| {}),
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

/// An open socket and the JS callbacks it holds (dropping them invalidates the callbacks).
struct Socket {
    ws: WebSocket,
    _on_open: Closure<dyn FnMut(Event)>,
    _on_message: Closure<dyn FnMut(MessageEvent)>,
    _on_close: Closure<dyn FnMut(CloseEvent)>,
}

impl Socket {
    fn shut(self) {
        self.ws.set_onopen(None);
        self.ws.set_onmessage(None);
        self.ws.set_onclose(None);
        let _ = self.ws.close();
    }

    fn is_open(&self) -> bool {
        self.ws.ready_state() == WebSocket::OPEN
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
    /// The pending reconnect timer, if any.
    retry: Cell<Option<TimeoutHandle>>,
    /// Reconnect attempts since the feed was last live.
    attempt: Cell<u32>,
    /// Set on cleanup: never reconnect again.
    stopped: Cell<bool>,
    status: ReadSignal<ConnStatus>,
    set_status: WriteSignal<ConnStatus>,
    subs: RefCell<Vec<Sub>>,
    /// Next id for subscriptions and requests.
    next_id: Cell<u64>,
    /// Requests sent on the current socket and not answered yet: the streams they subscribe.
    pending: RefCell<HashMap<u64, Vec<Stream>>>,
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
            self.request(Method::Unsubscribe, vec![stream]);
        }
    }

    /// Sends a request on the open socket (a closed one re-subscribes everything when it opens).
    fn request(&self, method: Method, streams: Vec<Stream>) {
        let socket = self.socket.borrow();
        let Some(socket) = socket.as_ref().filter(|s| s.is_open()) else { return };
        let id = self.fresh_id();
        let request = ClientRequest { method, params: streams.iter().map(Stream::to_string).collect(), id };
        let text = serde_json::to_string(&request).expect("a request always serializes");
        if method == Method::Subscribe {
            self.pending.borrow_mut().insert(id, streams);
        }
        let _ = socket.ws.send_with_str(&text);
    }

    fn open(self: &Rc<Self>) {
        if self.stopped.get() {
            return;
        }
        let ws = match WebSocket::new(&self.url) {
            Ok(ws) => ws,
            Err(e) => {
                leptos::logging::warn!("cannot open {}: {e:?}", self.url);
                return self.schedule_reconnect();
            }
        };
        let weak = Rc::downgrade(self);
        let on_open = callback(&weak, |c, _: Event| c.on_open());
        let on_message = callback(&weak, |c, e: MessageEvent| {
            if let Some(text) = e.data().as_string() {
                c.on_text(&text);
            }
        });
        let on_close = callback(&weak, |c, _: CloseEvent| c.on_close());
        ws.set_onopen(Some(on_open.as_ref().unchecked_ref()));
        ws.set_onmessage(Some(on_message.as_ref().unchecked_ref()));
        ws.set_onclose(Some(on_close.as_ref().unchecked_ref()));
        let old = self.socket.replace(Some(Socket {
            ws,
            _on_open: on_open,
            _on_message: on_message,
            _on_close: on_close,
        }));
        if let Some(old) = old {
            old.shut();
        }
    }

    fn on_open(&self) {
        self.pending.borrow_mut().clear();
        let mut streams: Vec<Stream> = self.subs.borrow().iter().map(|s| s.stream.clone()).collect();
        streams.sort();
        streams.dedup();
        if streams.is_empty() {
            self.attempt.set(0);
            self.set_status.set(ConnStatus::Live);
        } else {
            self.request(Method::Subscribe, streams);
        }
    }

    fn on_text(&self, text: &str) {
        match serde_json::from_str::<ServerFrame>(text) {
            Ok(ServerFrame::Reply(reply)) => {
                let streams = self.pending.borrow_mut().remove(&reply.id);
                if !reply.is_ok() {
                    leptos::logging::warn!("server refused request: {reply:?}");
                    return;
                }
                self.attempt.set(0);
                self.set_status.set(ConnStatus::Live);
                let Some(streams) = streams else { return };
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
                let to: Vec<Rc<Handlers>> =
                    self.subs.borrow().iter().filter(|s| s.stream == push.stream).map(|s| s.handlers.clone()).collect();
                for h in to {
                    (h.on_push)(&push.data);
                }
            }
            Err(e) => leptos::logging::warn!("unreadable frame from server: {e}"),
        }
    }

    fn on_close(self: &Rc<Self>) {
        if let Some(old) = self.socket.take() {
            old.shut();
        }
        self.pending.borrow_mut().clear();
        let all: Vec<Rc<Handlers>> = self.subs.borrow().iter().map(|s| s.handlers.clone()).collect();
        for h in all {
            (h.on_lost)();
        }
        self.schedule_reconnect();
    }

    fn schedule_reconnect(self: &Rc<Self>) {
        if self.stopped.get() {
            return;
        }
        let attempt = self.attempt.get() + 1;
        self.attempt.set(attempt);
        self.set_status.set(ConnStatus::Reconnecting { attempt });
        // Up to 20% jitter so many tabs do not reconnect in lockstep after a server restart.
        let delay = f64::from(backoff_ms(attempt)) * (1.0 + 0.2 * js_sys::Math::random());
        let weak = Rc::downgrade(self);
        let handle = set_timeout_with_handle(
            move || {
                if let Some(c) = weak.upgrade() {
                    c.retry.set(None);
                    c.open();
                }
            },
            Duration::from_millis(delay as u64),
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
        if let Some(old) = self.socket.take() {
            old.shut();
        }
    }
}

/// A JS callback that forwards to the connection while it exists.
fn callback<E: wasm_bindgen::convert::FromWasmAbi + 'static>(
    weak: &Weak<Connection>,
    f: impl Fn(&Rc<Connection>, E) + 'static,
) -> Closure<dyn FnMut(E)> {
    let weak = weak.clone();
    Closure::new(move |e: E| {
        if let Some(c) = weak.upgrade() {
            f(&c, e);
        }
    })
}
