//! A locally synced order book in the browser: the seed's algorithm run by the shared sync
//! machine (`shared::sync::BookSync`, millrace's own API rule and checksums). Subscribes
//! `depth_update@{instrument}` on the page's [`Feed`], fetches `GET /fapi/v1/depth` once the
//! subscription is live (step 1 before step 2), bridges, applies deltas, verifies each delta's
//! top-10 checksum, and starts over on a gap, a checksum mismatch or a lost connection.

use std::cell::{Cell, RefCell};
use std::rc::Rc;

use leptos::prelude::*;
use shared::book::DepthLadder;
use shared::protocol::{DepthUpdateEvent, InstrumentId, Stream};
use shared::sync::{BookSync, ContinuityRule, SyncConfig, SyncEvent, SyncState, SyncStats};

use crate::api;
use crate::feed::{Feed, Handlers};

/// Levels per side the ladder shows.
pub const LADDER_LEVELS: usize = 20;

/// What the status badge of a book shows.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct BookBadge {
    pub state: BadgeState,
    /// Update id of the book shown (0 before the first snapshot).
    pub update_id: u64,
    pub gaps: u64,
    pub resyncs: u64,
    pub checksum_mismatches: u64,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum BadgeState {
    Synced,
    #[default]
    Resyncing,
    SnapshotMode,
}

impl BadgeState {
    pub fn label(self) -> &'static str {
        match self {
            BadgeState::Synced => "synced",
            BadgeState::Resyncing => "resyncing",
            BadgeState::SnapshotMode => "snapshot mode",
        }
    }
}

impl BookBadge {
    fn of(sync: &BookSync) -> Self {
        let state = match sync.state() {
            SyncState::Synced => BadgeState::Synced,
            SyncState::SnapshotMode => BadgeState::SnapshotMode,
            SyncState::AwaitingSnapshot | SyncState::Bridging => BadgeState::Resyncing,
        };
        let SyncStats { gaps, resyncs, checksum_mismatches, .. } = *sync.stats();
        BookBadge { state, update_id: sync.last_update_id(), gaps, resyncs, checksum_mismatches }
    }
}

/// What [`use_depth_book`] gives a component.
#[derive(Clone, Copy)]
pub struct DepthBook {
    pub ladder: ReadSignal<DepthLadder>,
    pub badge: ReadSignal<BookBadge>,
}

struct State {
    instrument: InstrumentId,
    sync: RefCell<BookSync>,
    /// The subscription is live on the current socket.
    live: Cell<bool>,
    /// A snapshot request is in flight.
    fetching: Cell<bool>,
    /// The machine asked for a snapshot that has not been requested yet.
    want_snapshot: Cell<bool>,
    /// Snapshot requests that failed in a row: the next waits `backoff_ms(failures)`.
    failures: Cell<u32>,
    set_ladder: WriteSignal<DepthLadder>,
    set_badge: WriteSignal<BookBadge>,
}

/// Keeps `instrument`'s book in sync while the calling component lives.
pub fn use_depth_book(instrument: InstrumentId) -> DepthBook {
    let feed = Feed::use_or_open();
    let (ladder, set_ladder) = signal(DepthLadder::default());
    let (badge, set_badge) = signal(BookBadge::default());
    let mut config = SyncConfig::new(ContinuityRule::Spot);
    config.verify_interval_ms = None;
    // Snapshot mode needs the `depth@…,20` stream, which this page does not subscribe yet: keep
    // retrying the REST snapshot (with back-off) instead of falling back to a mode it cannot leave.
    config.snapshot_failures_before_fallback = u32::MAX;
    let state = Rc::new(State {
        instrument: instrument.clone(),
        sync: RefCell::new(BookSync::new(config)),
        live: Cell::new(false),
        fetching: Cell::new(false),
        want_snapshot: Cell::new(false),
        failures: Cell::new(0),
        set_ladder,
        set_badge,
    });
    state.drain();
    let (on_push, on_live, on_lost) = (state.clone(), state.clone(), state);
    feed.subscribe(
        Stream::DepthUpdate(instrument),
        Handlers {
            on_push: Box::new(move |data| match serde_json::from_value::<DepthUpdateEvent>(data.clone()) {
                Ok(ev) => {
                    on_push.sync.borrow_mut().handle_delta((&ev).into(), now_ms());
                    on_push.drain();
                }
                Err(e) => leptos::logging::warn!("bad depth_update: {e}"),
            }),
            on_live: Box::new(move || {
                on_live.live.set(true);
                on_live.drain();
            }),
            on_lost: Box::new(move || {
                on_lost.live.set(false);
                on_lost.sync.borrow_mut().handle_connection_lost(now_ms());
                on_lost.drain();
            }),
        },
    );
    DepthBook { ladder, badge }
}

fn now_ms() -> i64 {
    js_sys::Date::now() as i64
}

impl State {
    /// Handles what the machine reported; redraws once if the book changed.
    fn drain(self: &Rc<Self>) {
        let mut changed = false;
        {
            let mut sync = self.sync.borrow_mut();
            while let Some(ev) = sync.poll_event() {
                // only a book the machine vouches for is drawn: after a gap or a checksum
                // mismatch the last good ladder stays, under a "resyncing" badge
                match ev {
                    SyncEvent::NeedSnapshot { .. } => self.want_snapshot.set(true),
                    SyncEvent::BookChanged { .. } => changed = true,
                    _ => {}
                }
            }
            if changed {
                self.set_ladder.set(DepthLadder::of(sync.book(), LADDER_LEVELS));
            }
            self.set_badge.set(BookBadge::of(&sync));
        }
        if self.want_snapshot.get() && self.live.get() && !self.fetching.get() {
            self.fetch_snapshot();
        }
    }

    fn fetch_snapshot(self: &Rc<Self>) {
        self.want_snapshot.set(false);
        self.fetching.set(true);
        let me = self.clone();
        leptos::task::spawn_local(async move {
            let failures = me.failures.get();
            if failures > 0 {
                sleep_ms(crate::backoff_ms(failures)).await;
            }
            let result = api::fetch_depth(&me.instrument, 1000).await;
            me.fetching.set(false);
            {
                let mut sync = me.sync.borrow_mut();
                match result {
                    Ok(depth) => {
                        me.failures.set(0);
                        sync.handle_snapshot((&depth).into(), now_ms());
                    }
                    Err(e) => {
                        leptos::logging::warn!("{e}");
                        me.failures.set(failures + 1);
                        sync.handle_snapshot_failed(now_ms());
                    }
                }
            }
            me.drain();
        });
    }
}

/// Resolves after `ms` milliseconds (a browser timer).
async fn sleep_ms(ms: u32) {
    let promise = js_sys::Promise::new(&mut |resolve, _| {
        let window = web_sys::window().expect("a browser window");
        let _ = window.set_timeout_with_callback_and_timeout_and_arguments_0(&resolve, ms as i32);
    });
    let _ = wasm_bindgen_futures::JsFuture::from(promise).await;
}
