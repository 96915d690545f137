//! A locally synced order book in the browser: the seed's algorithm run by the shared sync
//! machine (`shared::sync::BookSync`, millrace's own API rule and checksums).
//!
//! In delta mode the widget subscribes `depth_update@{instrument}` on the page's [`Feed`], fetches
//! `GET /fapi/v1/depth` once the subscription is live (step 1 before step 2), bridges, applies
//! deltas, verifies each delta's top-10 checksum, and starts over on a gap, a checksum mismatch or
//! a lost connection. The machine's timers run on a one-second tick: periodic verification
//! against a fresh snapshot, and, when snapshots keep failing, the fallback to snapshot mode
//! (`depth@{instrument},20`, subscribed only while the machine is there) and the retry of delta
//! mode. The card's switch puts the book in snapshot mode on purpose.
//!
//! Drawing happens on animation frames ([`crate::paint`]): only a book the machine vouches for
//! (synced, or a snapshot in snapshot mode) is drawn, so after a gap or a checksum mismatch the
//! last good ladder stays under a "resyncing" badge. A book with no message for
//! [`STALE_AFTER_MS`], or whose connection is down, is flagged stale.

use std::cell::{Cell, RefCell};
use std::fmt::Write as _;
use std::rc::Rc;
use std::time::Duration;

use leptos::prelude::*;
use send_wrapper::SendWrapper;
use shared::backoff::Backoff;
use shared::ladder::DepthLadder;
use shared::protocol::{InstrumentId, PushData, Stream};
use shared::sync::{
    BookSync, ContinuityRule, SyncConfig, SyncEvent, SyncMode, SyncState, SyncStats,
};
use web_sys::Element;

use crate::api;
use crate::feed::{Feed, FeedSubscription, Handlers};
use crate::paint::{paint_book, FrameSlot, Paint};

/// Levels per side the ladder shows (and the snapshot stream carries).
pub const LADDER_LEVELS: usize = 20;

/// A book with no message for this long is flagged stale.
pub const STALE_AFTER_MS: f64 = 5_000.0;

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

    /// The CSS class of the badge (and the card's `data-state`).
    pub fn css(self) -> &'static str {
        match self {
            BadgeState::Synced => "synced",
            BadgeState::Resyncing => "resyncing",
            BadgeState::SnapshotMode => "snapshot-mode",
        }
    }
}

impl BookBadge {
    /// The badge of `sync`, showing the book drawn at `shown_id`.
    pub fn of(sync: &BookSync, shown_id: u64) -> Self {
        let state = match sync.state() {
            SyncState::Synced => BadgeState::Synced,
            SyncState::SnapshotMode => BadgeState::SnapshotMode,
            SyncState::AwaitingSnapshot | SyncState::Bridging => BadgeState::Resyncing,
        };
        let SyncStats { gaps, resyncs, checksum_mismatches, .. } = *sync.stats();
        BookBadge { state, update_id: shown_id, gaps, resyncs, checksum_mismatches }
    }
}

/// `permille` thousandths as a CSS scale factor, exactly (`166` → `0.166`, `1000` → `1.000`).
/// Depth bars are full-width and scaled (`transform: scaleX(…)`), so a moving bar never shifts
/// layout.
pub fn bar_scale(permille: u16) -> String {
    format!("{}.{:03}", permille / 1000, permille % 1000)
}

/// The text `paint.js`'s `paint_book` draws: the badge, the stale flag and the ladder.
pub fn book_text(badge: &BookBadge, stale: &str, ladder: &DepthLadder) -> String {
    let mut t = String::with_capacity(64 + 48 * (ladder.asks.len() + ladder.bids.len()));
    let dash = || "—".to_string();
    let _ = write!(
        t,
        "{}\t{}\t{}\t{}\t{}\t{}\t{}\t{}\t{}\t{}\t{}",
        badge.state.label(),
        badge.state.css(),
        badge.update_id,
        badge.gaps,
        badge.resyncs,
        badge.checksum_mismatches,
        stale,
        ladder.spread().map_or_else(dash, |s| s.to_string()),
        ladder.mid_string().unwrap_or_else(dash),
        ladder.asks.len(),
        ladder.bids.len(),
    );
    for r in ladder.asks.iter().chain(&ladder.bids) {
        let _ =
            write!(t, "\t{}\t{}\t{}\t{}", r.price, r.qty, r.cumulative, bar_scale(r.bar_permille));
    }
    t
}

/// One book's widget: its sync machine, its subscriptions and what it last drew.
pub struct BookWidget {
    instrument: InstrumentId,
    feed: Feed,
    sync: RefCell<BookSync>,
    /// The delta subscription is live on the current socket.
    live: Cell<bool>,
    /// A snapshot request is in flight.
    fetching: Cell<bool>,
    /// The machine asked for a snapshot (or a verification) that has not been requested yet.
    want_snapshot: Cell<bool>,
    /// Waits between failed snapshot requests (500 ms doubling to 10 s; reset by a good one).
    backoff: RefCell<Backoff>,
    /// The wait before the next request, after a failure.
    retry_in: Cell<Option<Duration>>,
    /// `depth@{instrument},20`, held while the machine is in snapshot mode.
    snapshot_stream: RefCell<Option<FeedSubscription>>,
    /// When the last message for this book arrived (`Date.now()`), 0 before the first.
    last_message_ms: Cell<f64>,
    /// The server refused the book's stream: its code and message (cleared when it is live).
    refused: RefCell<Option<String>>,
    /// The ladder drawn and its update id.
    shown: RefCell<(DepthLadder, u64)>,
    /// The machine vouched for a new book since the last frame.
    book_changed: Cell<bool>,
    /// The machine's badge (without the update id) when it was last looked at.
    badge_seen: Cell<BookBadge>,
    body: RefCell<Option<Element>>,
    slot: FrameSlot,
}

impl BookWidget {
    /// Starts syncing `instrument` in `mode`; everything stops when the calling component is
    /// cleaned up.
    pub fn start(instrument: InstrumentId, mode: SyncMode) -> Rc<BookWidget> {
        let feed = Feed::use_or_open();
        let mut config = SyncConfig::new(ContinuityRule::Spot);
        config.mode = mode;
        let w = Rc::new(BookWidget {
            instrument: instrument.clone(),
            feed: feed.clone(),
            sync: RefCell::new(BookSync::new(config)),
            live: Cell::new(false),
            fetching: Cell::new(false),
            want_snapshot: Cell::new(false),
            backoff: RefCell::new(
                Backoff::new(Duration::from_millis(500), Duration::from_secs(10)).with_jitter(0),
            ),
            retry_in: Cell::new(None),
            snapshot_stream: RefCell::new(None),
            last_message_ms: Cell::new(0.0),
            refused: RefCell::new(None),
            shown: RefCell::new((DepthLadder::default(), 0)),
            book_changed: Cell::new(false),
            badge_seen: Cell::new(BookBadge::default()),
            body: RefCell::new(None),
            slot: FrameSlot::default(),
        });
        if mode == SyncMode::Delta {
            let (on_push, on_live, on_lost, on_refused) =
                (w.clone(), w.clone(), w.clone(), w.clone());
            feed.subscribe(
                Stream::DepthUpdate(instrument),
                Handlers {
                    on_push: Box::new(move |data| match data {
                        PushData::DepthUpdate(ev) => {
                            on_push.last_message_ms.set(js_sys::Date::now());
                            on_push.sync.borrow_mut().handle_delta(ev.into(), now_ms());
                            on_push.drain();
                        }
                        other => leptos::logging::warn!("a {} push on depth_update", other.kind()),
                    }),
                    on_live: Box::new(move || {
                        on_live.live.set(true);
                        on_live.refused.borrow_mut().take();
                        on_live.drain();
                    }),
                    on_lost: Box::new(move || {
                        on_lost.live.set(false);
                        on_lost.sync.borrow_mut().handle_connection_lost(now_ms());
                        on_lost.drain();
                    }),
                    on_refused: Box::new(move |refusal| {
                        on_refused.live.set(false);
                        *on_refused.refused.borrow_mut() = Some(refusal.text());
                        on_refused.slot.request(&on_refused);
                    }),
                },
            );
        }
        // The machine's timers and the stale flag, once a second.
        let ticking = SendWrapper::new(Rc::downgrade(&w));
        let tick = set_interval_with_handle(
            move || {
                if let Some(w) = ticking.upgrade() {
                    w.sync.borrow_mut().handle_timeout(now_ms());
                    w.drain();
                    w.slot.request(&w);
                }
            },
            Duration::from_millis(1000),
        );
        let stopping = SendWrapper::new(w.clone());
        on_cleanup(move || {
            if let Ok(t) = tick {
                t.clear();
            }
            stopping.snapshot_stream.borrow_mut().take();
        });
        w.drain();
        w
    }

    /// Where to draw (set once the body element is mounted).
    pub fn attach(self: &Rc<Self>, body: Element) {
        *self.body.borrow_mut() = Some(body);
        self.slot.request(self);
    }

    /// Handles what the machine reported: snapshot requests, the snapshot stream, redraws.
    fn drain(self: &Rc<Self>) {
        let mut redraw = false;
        let snapshot_mode;
        {
            let mut sync = self.sync.borrow_mut();
            while let Some(ev) = sync.poll_event() {
                match ev {
                    SyncEvent::NeedSnapshot { .. } | SyncEvent::VerifyDue => {
                        self.want_snapshot.set(true)
                    }
                    SyncEvent::BookChanged { .. }
                    | SyncEvent::Synced { .. }
                    | SyncEvent::Drift { .. } => {
                        self.book_changed.set(true);
                        redraw = true;
                    }
                    _ => redraw = true,
                }
            }
            snapshot_mode = sync.state() == SyncState::SnapshotMode;
            // the badge follows the machine at once (a resync may last only a few frames)
            let badge = BookBadge::of(&sync, 0);
            if self.badge_seen.replace(badge) != badge {
                redraw = true;
            }
        }
        self.follow_snapshot_stream(snapshot_mode);
        if redraw {
            self.slot.request(self);
        }
        // in snapshot mode the stream brings the snapshots; REST is for delta mode
        if !snapshot_mode && self.want_snapshot.get() && self.live.get() && !self.fetching.get() {
            self.fetch_snapshot();
        }
    }

    /// Subscribes `depth@…,20` while the machine is in snapshot mode, and only then.
    fn follow_snapshot_stream(self: &Rc<Self>, snapshot_mode: bool) {
        let held = self.snapshot_stream.borrow().is_some();
        if snapshot_mode == held {
            return;
        }
        if !snapshot_mode {
            self.snapshot_stream.borrow_mut().take();
            return;
        }
        let (on_push, on_lost) = (Rc::downgrade(self), Rc::downgrade(self));
        let (on_live, on_refused) = (Rc::downgrade(self), Rc::downgrade(self));
        let sub = self.feed.subscription(
            Stream::Depth { instrument: self.instrument.clone(), levels: LADDER_LEVELS as u16 },
            Handlers {
                on_push: Box::new(move |data| {
                    let Some(w) = on_push.upgrade() else { return };
                    match data {
                        PushData::Depth(ev) => {
                            w.last_message_ms.set(js_sys::Date::now());
                            w.sync.borrow_mut().handle_snapshot(ev.into(), now_ms());
                            w.drain();
                        }
                        other => leptos::logging::warn!("a {} push on depth", other.kind()),
                    }
                }),
                on_live: Box::new(move || {
                    if let Some(w) = on_live.upgrade() {
                        w.refused.borrow_mut().take();
                    }
                }),
                on_lost: Box::new(move || {
                    if let Some(w) = on_lost.upgrade() {
                        w.slot.request(&w);
                    }
                }),
                on_refused: Box::new(move |refusal| {
                    if let Some(w) = on_refused.upgrade() {
                        *w.refused.borrow_mut() = Some(refusal.text());
                        w.slot.request(&w);
                    }
                }),
            },
        );
        *self.snapshot_stream.borrow_mut() = Some(sub);
    }

    fn fetch_snapshot(self: &Rc<Self>) {
        self.want_snapshot.set(false);
        self.fetching.set(true);
        let me = self.clone();
        leptos::task::spawn_local(async move {
            if let Some(wait) = me.retry_in.take() {
                sleep_ms(u32::try_from(wait.as_millis()).unwrap_or(u32::MAX)).await;
            }
            let result = api::fetch_depth(&me.instrument, 1000).await;
            me.fetching.set(false);
            {
                let mut sync = me.sync.borrow_mut();
                match result {
                    Ok(depth) => {
                        me.backoff.borrow_mut().reset();
                        sync.handle_snapshot((&depth).into(), now_ms());
                    }
                    Err(e) => {
                        leptos::logging::warn!("{e}");
                        me.retry_in.set(Some(me.backoff.borrow_mut().next_delay(1 << 31)));
                        sync.handle_snapshot_failed(now_ms());
                    }
                }
            }
            me.drain();
        });
    }

    /// Why the book is stale, or `""`.
    fn stale_label(&self) -> String {
        if let Some(r) = self.refused.borrow().as_ref() {
            return format!("refused: {r}");
        }
        let in_snapshot_mode = self.snapshot_stream.borrow().is_some();
        if !in_snapshot_mode
            && !self.live.get()
            && self.feed.status().get_untracked() != crate::ConnStatus::Live
        {
            return "disconnected".into();
        }
        let last = self.last_message_ms.get();
        if last == 0.0 {
            return String::new();
        }
        let age = js_sys::Date::now() - last;
        if age >= STALE_AFTER_MS {
            format!("stale {}s", (age / 1000.0) as u64)
        } else {
            String::new()
        }
    }
}

impl Paint for BookWidget {
    fn paint(&self) {
        self.slot.painted();
        let Some(body) = self.body.borrow().clone() else { return };
        let sync = self.sync.borrow();
        let vouched = match sync.state() {
            SyncState::Synced => true,
            SyncState::SnapshotMode => sync.is_synced(),
            SyncState::AwaitingSnapshot | SyncState::Bridging => false,
        };
        let mut shown = self.shown.borrow_mut();
        if vouched && self.book_changed.replace(false) {
            *shown = (DepthLadder::of(sync.book(), LADDER_LEVELS), sync.last_update_id());
        }
        let badge = BookBadge::of(&sync, shown.1);
        paint_book(&body, LADDER_LEVELS as u32, &book_text(&badge, &self.stale_label(), &shown.0));
    }
}

fn now_ms() -> i64 {
    js_sys::Date::now() as i64
}

/// Resolves after `ms` milliseconds (a browser timer).
pub async fn sleep_ms(ms: u32) {
    let promise = js_sys::Promise::new(&mut |resolve, _| {
        let window = web_sys::window().expect("a browser window");
        let _ = window.set_timeout_with_callback_and_timeout_and_arguments_0(&resolve, ms as i32);
    });
    let _ = wasm_bindgen_futures::JsFuture::from(promise).await;
}

/// One order book card: the title, the mode switch, the close button, and the body drawn by its
/// [`BookWidget`] (badge, stale flag, ladder). `data-widget` names it for the frame statistics.
#[component]
pub fn BookCard(
    instrument: InstrumentId,
    /// Shown when set: the card's close button calls it.
    #[prop(optional, into)]
    on_close: Option<Callback<()>>,
    /// Start in snapshot mode.
    #[prop(optional)]
    snapshot_mode: bool,
) -> impl IntoView {
    static NEXT: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(1);
    let widget_id = format!("book-{}", NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed));
    let name = instrument.to_string();
    let attr_name = name.clone();
    let mode = RwSignal::new(if snapshot_mode { SyncMode::SnapshotOnly } else { SyncMode::Delta });
    let switch_label = move || match mode.get() {
        SyncMode::Delta => "snapshots",
        SyncMode::SnapshotOnly => "diffs",
    };
    let body = move || {
        let m = mode.get();
        view! { <BookBody instrument=instrument.clone() mode=m /> }
    };
    view! {
        <section class="card book-card" data-instrument=attr_name data-widget=widget_id data-mode=move || match mode.get() {
            SyncMode::Delta => "delta",
            SyncMode::SnapshotOnly => "snapshot",
        }>
            <header class="card-head">
                <h2>{name}</h2>
                <button class="mode-switch" title="switch between the locally synced diff book and the depth@…,20 snapshot stream"
                    on:click=move |_| mode.update(|m| *m = match m { SyncMode::Delta => SyncMode::SnapshotOnly, SyncMode::SnapshotOnly => SyncMode::Delta })>
                    {switch_label}
                </button>
                {on_close.map(|f| view! { <button class="close" title="close" on:click=move |_| f.run(())>"×"</button> })}
            </header>
            {body}
        </section>
    }
}

/// The part of a book card a [`BookWidget`] draws.
#[component]
fn BookBody(instrument: InstrumentId, mode: SyncMode) -> impl IntoView {
    let widget = SendWrapper::new(BookWidget::start(instrument, mode));
    let node = NodeRef::<leptos::html::Div>::new();
    node.on_load(move |el| {
        let el: &Element = &el;
        widget.attach(el.clone());
    });
    view! { <div class="book-body" node_ref=node></div> }
}
