//! The live connection to the server's `/ws`: a hook that keeps one WebSocket open, subscribes to
//! `heartbeat`, and reconnects with back-off ([`crate::backoff_ms`] plus jitter) when it closes.
//! Everything is cleaned up (socket closed, timer cleared) when the owning component unmounts.

use std::cell::{Cell, RefCell};
use std::rc::{Rc, Weak};
use std::time::Duration;

use leptos::prelude::*;
use send_wrapper::SendWrapper;
use shared::protocol::{ClientRequest, Heartbeat, Method, ServerFrame, Stream};
use wasm_bindgen::closure::Closure;
use wasm_bindgen::JsCast;
use web_sys::{CloseEvent, Event, MessageEvent, WebSocket};

use crate::{backoff_ms, ConnStatus};

/// Id of our SUBSCRIBE request on each new socket.
const SUBSCRIBE_ID: u64 = 1;

/// What [`use_heartbeat_feed`] gives a component.
#[derive(Clone, Copy)]
pub struct HeartbeatFeed {
    pub status: ReadSignal<ConnStatus>,
    /// The most recent heartbeat; kept across reconnects.
    pub last: ReadSignal<Option<Heartbeat>>,
}

/// Opens the feed for the current component; it closes when the component is cleaned up.
pub fn use_heartbeat_feed() -> HeartbeatFeed {
    let (status, set_status) = signal(ConnStatus::Connecting);
    let (last, set_last) = signal(None);
    let conn = Rc::new(Connection {
        url: ws_url(),
        socket: RefCell::new(None),
        retry: Cell::new(None),
        attempt: Cell::new(0),
        stopped: Cell::new(false),
        set_status,
        set_last,
    });
    conn.open();
    // Leptos cleanups must be `Send`; this one runs on the browser's only thread.
    let guard = SendWrapper::new(conn);
    on_cleanup(move || guard.stop());
    HeartbeatFeed { status, last }
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
    set_status: WriteSignal<ConnStatus>,
    set_last: WriteSignal<Option<Heartbeat>>,
}

impl Connection {
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
        let request = ClientRequest {
            method: Method::Subscribe,
            params: vec![Stream::Heartbeat.to_string()],
            id: SUBSCRIBE_ID,
        };
        let text = serde_json::to_string(&request).expect("a request always serializes");
        if let Some(socket) = self.socket.borrow().as_ref() {
            let _ = socket.ws.send_with_str(&text);
        }
    }

    fn on_text(&self, text: &str) {
        match serde_json::from_str::<ServerFrame>(text) {
            Ok(ServerFrame::Reply(reply)) if reply.is_ok() => {
                if reply.id == SUBSCRIBE_ID {
                    self.attempt.set(0);
                    self.set_status.set(ConnStatus::Live);
                }
            }
            Ok(ServerFrame::Reply(reply)) => leptos::logging::warn!("server refused request: {reply:?}"),
            Ok(ServerFrame::Push(push)) if push.stream == Stream::Heartbeat => {
                match serde_json::from_value::<Heartbeat>(push.data) {
                    Ok(hb) => {
                        self.set_status.set(ConnStatus::Live);
                        self.set_last.set(Some(hb));
                    }
                    Err(e) => leptos::logging::warn!("bad heartbeat: {e}"),
                }
            }
            Ok(ServerFrame::Push(_)) => {}
            Err(e) => leptos::logging::warn!("unreadable frame from server: {e}"),
        }
    }

    fn on_close(self: &Rc<Self>) {
        if let Some(old) = self.socket.take() {
            old.shut();
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
