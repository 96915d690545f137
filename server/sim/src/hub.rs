//! The WebSocket connection hub: who is connected, who subscribes to what, and fan-out.
//!
//! Every connection has a **bounded** queue of outgoing frames. Publishing never waits: a frame
//! that does not fit means the client is not keeping up, and the connection is dropped (counted
//! as a laggard), so a slow client never stalls the engine or the other clients. The driver asks
//! the hub which streams have subscribers at all and serialises nothing else.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use axum::extract::ws::Utf8Bytes;
use tokio::sync::{mpsc, Notify};

use crate::faults::{Count, Faults};

/// Which Binance API family a connection speaks: spot (`/ws`, `/stream`) or USD-M futures
/// (`/fapi/ws`, `/fapi/stream`; depth diffs carry `pu` and `T`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Flavour {
    Spot,
    Futures,
}

/// A stream as subscribed: flavour and the name exactly as the client wrote it (symbol lower
/// case), which the combined envelope echoes.
pub type StreamKey = (Flavour, String);

/// One connection's registration.
struct Conn {
    tx: mpsc::Sender<Utf8Bytes>,
    kill: Arc<Notify>,
    flavour: Flavour,
    /// Combined envelope (`/stream`) or raw events (`/ws`); `SET_PROPERTY combined` flips it.
    combined: bool,
    /// Subscribed stream names, in subscription order (`LIST_SUBSCRIPTIONS`).
    streams: Vec<String>,
}

#[derive(Default)]
struct Inner {
    next_id: u64,
    conns: HashMap<u64, Conn>,
    /// Subscribers of each stream; a connection appears once per stream.
    subs: HashMap<StreamKey, Vec<u64>>,
}

/// What a session gets when it registers.
pub(crate) struct Registration {
    pub id: u64,
    /// Frames to send, in order.
    pub rx: mpsc::Receiver<Utf8Bytes>,
    /// Notified when the hub drops the connection (laggard, `drop` fault, shutdown).
    pub kill: Arc<Notify>,
}

/// A frame ready to fan out: the raw event and (if anyone wants it) the combined envelope.
pub(crate) struct Frame {
    pub raw: Option<Utf8Bytes>,
    pub combined: Option<Utf8Bytes>,
}

/// The hub; shared by the driver (publishing) and the sessions (subscribing).
pub struct Hub {
    /// Connections and subscriptions; a std mutex because every critical section is short and
    /// never awaits.
    inner: Mutex<Inner>,
    /// Frames a connection may have queued before it counts as a laggard.
    queue: usize,
    faults: Arc<Faults>,
}

impl Hub {
    pub(crate) fn new(queue: usize, faults: Arc<Faults>) -> Hub {
        Hub { inner: Mutex::new(Inner::default()), queue: queue.max(1), faults }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Registers a new connection.
    pub(crate) fn register(&self, flavour: Flavour, combined: bool) -> Registration {
        let (tx, rx) = mpsc::channel(self.queue);
        let kill = Arc::new(Notify::new());
        let mut g = self.lock();
        g.next_id += 1;
        let id = g.next_id;
        g.conns.insert(id, Conn { tx, kill: kill.clone(), flavour, combined, streams: Vec::new() });
        Registration { id, rx, kill }
    }

    /// Forgets a connection and its subscriptions.
    pub(crate) fn unregister(&self, id: u64) {
        let mut g = self.lock();
        Self::remove(&mut g, id);
    }

    fn remove(g: &mut Inner, id: u64) -> Option<Conn> {
        let conn = g.conns.remove(&id)?;
        for s in &conn.streams {
            let key = (conn.flavour, s.clone());
            if let Some(v) = g.subs.get_mut(&key) {
                v.retain(|c| *c != id);
                if v.is_empty() {
                    g.subs.remove(&key);
                }
            }
        }
        Some(conn)
    }

    /// Adds subscriptions (already validated names); a name already subscribed is kept once.
    /// Returns the connection's number of streams, `None` if it is gone.
    pub(crate) fn subscribe(&self, id: u64, names: &[String]) -> Option<usize> {
        let mut g = self.lock();
        let conn = g.conns.get_mut(&id)?;
        let flavour = conn.flavour;
        let mut added = Vec::new();
        for n in names {
            if !conn.streams.contains(n) {
                conn.streams.push(n.clone());
                added.push(n.clone());
            }
        }
        let total = conn.streams.len();
        for n in added {
            g.subs.entry((flavour, n)).or_default().push(id);
        }
        Some(total)
    }

    /// Removes subscriptions.
    pub(crate) fn unsubscribe(&self, id: u64, names: &[String]) {
        let mut g = self.lock();
        let Some(conn) = g.conns.get_mut(&id) else { return };
        let flavour = conn.flavour;
        conn.streams.retain(|s| !names.contains(s));
        for n in names {
            let key = (flavour, n.clone());
            if let Some(v) = g.subs.get_mut(&key) {
                v.retain(|c| *c != id);
                if v.is_empty() {
                    g.subs.remove(&key);
                }
            }
        }
    }

    /// The connection's subscriptions, in order.
    pub(crate) fn list(&self, id: u64) -> Vec<String> {
        self.lock().conns.get(&id).map(|c| c.streams.clone()).unwrap_or_default()
    }

    /// Switches the connection between combined and raw frames; returns the new setting.
    pub(crate) fn set_combined(&self, id: u64, combined: Option<bool>) -> bool {
        let mut g = self.lock();
        match g.conns.get_mut(&id) {
            Some(c) => {
                if let Some(v) = combined {
                    c.combined = v;
                }
                c.combined
            }
            None => false,
        }
    }

    /// Every stream with at least one subscriber, and whether raw / combined frames are wanted.
    pub(crate) fn active(&self) -> Vec<(StreamKey, bool, bool)> {
        let g = self.lock();
        g.subs
            .iter()
            .map(|(k, ids)| {
                let raw = ids.iter().any(|id| g.conns.get(id).is_some_and(|c| !c.combined));
                let combined = ids.iter().any(|id| g.conns.get(id).is_some_and(|c| c.combined));
                (k.clone(), raw, combined)
            })
            .collect()
    }

    /// Number of open connections.
    pub fn connections(&self) -> usize {
        self.lock().conns.len()
    }

    /// Connections opened since start.
    pub fn connections_opened(&self) -> u64 {
        self.lock().next_id
    }

    /// Queues `frame` to every subscriber of `key`; a subscriber whose queue is full is
    /// dropped. Returns how many connections got it.
    pub(crate) fn publish(&self, key: &StreamKey, frame: &Frame) -> usize {
        let mut g = self.lock();
        let Some(ids) = g.subs.get(key) else { return 0 };
        let mut sent = 0;
        let mut laggards = Vec::new();
        for id in ids {
            let Some(c) = g.conns.get(id) else { continue };
            let text = if c.combined { &frame.combined } else { &frame.raw };
            let Some(text) = text else { continue };
            match c.tx.try_send(text.clone()) {
                Ok(()) => sent += 1,
                Err(mpsc::error::TrySendError::Full(_)) => laggards.push(*id),
                Err(mpsc::error::TrySendError::Closed(_)) => {}
            }
        }
        for id in &laggards {
            if let Some(c) = Self::remove(&mut g, *id) {
                c.kill.notify_one();
                tracing::info!(conn = id, "sim: dropping a WebSocket client that does not keep up");
            }
        }
        drop(g);
        if !laggards.is_empty() {
            self.faults.count(Count::Laggard, laggards.len() as u64);
        }
        sent
    }

    /// Drops every connection, or those subscribed to a stream of `symbol`. Returns how many.
    pub(crate) fn drop_connections(&self, symbol: Option<&str>) -> usize {
        let prefix = symbol.map(|s| format!("{}@", s.to_ascii_lowercase()));
        let mut g = self.lock();
        let ids: Vec<u64> = g
            .conns
            .iter()
            .filter(|(_, c)| {
                prefix.as_ref().is_none_or(|p| c.streams.iter().any(|s| s.starts_with(p.as_str())))
            })
            .map(|(id, _)| *id)
            .collect();
        for id in &ids {
            if let Some(c) = Self::remove(&mut g, *id) {
                c.kill.notify_one();
            }
        }
        ids.len()
    }
}
