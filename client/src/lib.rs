//! # millrace dashboard
//!
//! A Leptos CSR app compiled to WebAssembly and served by `millrace serve` from `dist/`. `main.rs`
//! only mounts [`App`]. Views: [`market::MarketView`] (picker, charts, books) and the operations
//! view (`#ops`). Browser IO lives in [`api`] (REST) and [`feed`] (the `/ws` WebSocket, shared by
//! every widget); streaming widgets draw on animation frames through [`paint`].
//!
//! Stable DOM hooks used by tests: `#version`, `#conn-status`, `#heartbeat-seq`, `#heartbeat-time`,
//! `#feed-stale`; the picker `#instrument-search` with `.picker-item[data-instrument]` and its
//! `.open-chart` / `.open-book` buttons; each chart is a `.chart-panel` (`data-series`,
//! `data-bars`, `data-last-time`, `data-last-close`, `data-status`, timeframe buttons
//! `button.tf[data-tf]`, `.close`); each order book is a `.book-card` with `data-instrument`,
//! `data-update-id` (the update id of the book shown) and `data-state`, a `.badge`
//! (`synced` / `resyncing` / `snapshot mode`) with `.gaps`, `.resyncs` and `.mismatches`, a
//! `.stale-flag`, a `.mode-switch`, a `.close` and a `.ladder` (`.ask-row` / `.bid-row`, empty
//! rows have `.empty`; cells `.price`, `.qty`, `.cum`, `.bar`; `.spread`, `.mid`).

pub mod api;
pub mod chart;
pub mod compare;
pub mod depth;
pub mod feed;
pub mod market;
pub mod ops;
pub mod paint;
pub mod tape;

use std::time::Duration;

use leptos::prelude::*;
use shared::protocol::Heartbeat;

pub use depth::{bar_scale, book_text, BadgeState, BookBadge, BookCard, BookWidget};
pub use feed::{use_heartbeat_feed, Feed, FeedSubscription, HeartbeatFeed};

/// State of the dashboard's WebSocket to the server.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ConnStatus {
    /// First connection attempt in progress.
    Connecting,
    /// Connected and subscribed.
    Live,
    /// The socket closed; the next attempt (counted from 1) is scheduled or in progress.
    Reconnecting { attempt: u32 },
}

impl ConnStatus {
    /// The word shown in `#conn-status`.
    pub fn label(self) -> &'static str {
        match self {
            ConnStatus::Connecting => "connecting",
            ConnStatus::Live => "live",
            ConnStatus::Reconnecting { .. } => "reconnecting",
        }
    }
}

/// `HH:MM:SS.mmm` UTC of a Unix time in ms.
pub fn format_utc_time(ms: i64) -> String {
    let day_ms = ms.rem_euclid(86_400_000);
    let (h, m, s, milli) =
        (day_ms / 3_600_000, day_ms / 60_000 % 60, day_ms / 1000 % 60, day_ms % 1000);
    format!("{h:02}:{m:02}:{s:02}.{milli:03}")
}

/// The whole dashboard.
#[component]
pub fn App() -> impl IntoView {
    let fetched = RwSignal::new(None::<Result<String, api::FetchError>>);
    leptos::task::spawn_local(async move {
        fetched.set(Some(api::fetch_version().await));
    });
    provide_context(Feed::open());
    let feed = use_heartbeat_feed();
    // The heartbeat carries the version too: use it if the REST call failed.
    let version = Signal::derive(move || match fetched.get() {
        Some(Ok(v)) => Some(v),
        _ => feed.last.with(|hb| hb.as_ref().map(|hb| hb.version.clone())),
    });
    let version_error =
        move || matches!(fetched.get(), Some(Err(_))) && version.with(Option::is_none);
    let tab = RwSignal::new(current_tab());
    let on_hash = window_event_listener(leptos::ev::hashchange, move |_| tab.set(current_tab()));
    on_cleanup(move || on_hash.remove());

    view! {
        <main class="shell">
            <header class="top">
                <h1>"millrace"</h1>
                <nav class="tabs">
                    <a href="#market" class:active=move || tab.get() == Tab::Market>"Market"</a>
                    <a href="#ops" id="ops-tab" class:active=move || tab.get() == Tab::Ops>"Operations"</a>
                </nav>
                <HeartbeatPanel status=feed.status heartbeat=feed.last received=feed.received />
                <span class="muted">"server "</span>
                <span id="version" class="mono" class:error=version_error>
                    {move || match version.get() {
                        Some(v) => v,
                        None if version_error() => "unavailable".to_string(),
                        None => "…".to_string(),
                    }}
                </span>
            </header>
            {move || match tab.get() {
                Tab::Market => view! { <market::MarketView /> }.into_any(),
                Tab::Ops => view! { <ops::OpsView /> }.into_any(),
            }}
        </main>
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Tab {
    Market,
    Ops,
}

fn current_tab() -> Tab {
    let hash = web_sys::window().and_then(|w| w.location().hash().ok()).unwrap_or_default();
    if hash == "#ops" {
        Tab::Ops
    } else {
        Tab::Market
    }
}

/// Heartbeats older than this (by the browser's clock) flag the feed stale.
pub const FEED_STALE_AFTER_MS: f64 = 3_000.0;

/// Connection status, the last heartbeat, and a stale flag when heartbeats stop arriving.
#[component]
pub fn HeartbeatPanel(
    /// Connection state shown in `#conn-status`.
    #[prop(into)]
    status: Signal<ConnStatus>,
    /// The most recent heartbeat, if any arrived.
    #[prop(into)]
    heartbeat: Signal<Option<Heartbeat>>,
    /// When it arrived (`Date.now()`, 0 before the first); without it the stale flag is never shown.
    #[prop(optional, into)]
    received: Option<Signal<f64>>,
) -> impl IntoView {
    let label = move || status.get().label();
    let detail = move || match status.get() {
        ConnStatus::Reconnecting { attempt } => format!("attempt {attempt}"),
        _ => String::new(),
    };
    let seq =
        move || heartbeat.with(|hb| hb.as_ref().map_or("—".to_string(), |hb| hb.seq.to_string()));
    let time = move || {
        heartbeat.with(|hb| {
            hb.as_ref().map_or("—".to_string(), |hb| format_utc_time(hb.server_time_ms) + " UTC")
        })
    };
    // re-evaluated every second: a socket that stays open but goes quiet is stale, not live
    let now = RwSignal::new(js_sys::Date::now());
    if received.is_some() {
        if let Ok(h) = set_interval_with_handle(
            move || now.set(js_sys::Date::now()),
            Duration::from_millis(1000),
        ) {
            on_cleanup(move || h.clear());
        }
    }
    // a page that never got a heartbeat counts from when it opened
    let opened = js_sys::Date::now();
    let stale = move || {
        let last = received?.get().max(opened);
        let age = now.get() - last;
        (age >= FEED_STALE_AFTER_MS).then(|| format!("no data for {}s", (age / 1000.0) as u64))
    };
    view! {
        <section class="heartbeat">
            <span id="conn-status" class=move || format!("pill {}", label())>{label}</span>
            <span class="muted detail">{detail}</span>
            <span id="feed-stale" class="pill stale" class:hidden=move || stale().is_none()>{move || stale().unwrap_or_default()}</span>
            <span class="muted">" seq "</span>
            <span id="heartbeat-seq" class="mono">{seq}</span>
            <span class="muted">" · "</span>
            <span id="heartbeat-time" class="mono">{time}</span>
        </section>
    }
}
