//! # millrace dashboard
//!
//! A Leptos CSR app compiled to WebAssembly and served by `millrace serve` from `dist/`. Components
//! live here; `main.rs` only mounts [`App`]. Browser IO lives in [`api`] (REST) and [`feed`] (the
//! `/ws` WebSocket); the wire types come from `shared::protocol`.
//!
//! Stable DOM ids used by tests: `#version`, `#conn-status`, `#heartbeat-seq`, `#heartbeat-time`;
//! each order book is a `.book-card` with `data-instrument` and `data-update-id` (the update id
//! of the book shown), a `.badge` (`synced` / `resyncing` / `snapshot mode`) with `.gaps`,
//! `.resyncs` and `.mismatches`, and a `.ladder` (see [`ladder`]).

pub mod api;
pub mod depth;
pub mod feed;
pub mod ladder;

use leptos::prelude::*;
use shared::protocol::{Heartbeat, InstrumentId};

pub use depth::{use_depth_book, BadgeState, BookBadge, DepthBook};
pub use feed::{use_heartbeat_feed, Feed, HeartbeatFeed};
pub use ladder::{bar_width, LadderTable};

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

/// Delay before reconnect attempt `attempt` (1, 2, ...): 500 ms doubling up to 10 s.
pub fn backoff_ms(attempt: u32) -> u32 {
    const FIRST_MS: u32 = 500;
    const MAX_MS: u32 = 10_000;
    FIRST_MS.saturating_mul(1 << attempt.saturating_sub(1).min(16)).min(MAX_MS)
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
    let fetched = RwSignal::new(None::<Result<String, String>>);
    leptos::task::spawn_local(async move {
        fetched.set(Some(api::fetch_version().await));
    });
    provide_context(Feed::open());
    let feed = use_heartbeat_feed();
    let books = books_from_query();
    // The heartbeat carries the version too: use it if the REST call failed.
    let version = Signal::derive(move || match fetched.get() {
        Some(Ok(v)) => Some(v),
        _ => feed.last.with(|hb| hb.as_ref().map(|hb| hb.version.clone())),
    });
    let version_error = move || matches!(fetched.get(), Some(Err(_))) && version.with(Option::is_none);

    view! {
        <main class="shell">
            <header class="top">
                <h1>"millrace"</h1>
                <span class="muted">"server "</span>
                <span id="version" class="mono" class:error=version_error>
                    {move || match version.get() {
                        Some(v) => v,
                        None if version_error() => "unavailable".to_string(),
                        None => "…".to_string(),
                    }}
                </span>
            </header>
            <HeartbeatPanel status=feed.status heartbeat=feed.last />
            <section class="books">
                {books.into_iter().map(|instrument| view! { <BookCard instrument=instrument /> }).collect_view()}
            </section>
        </main>
    }
}

/// Connection status and the last heartbeat.
#[component]
pub fn HeartbeatPanel(
    /// Connection state shown in `#conn-status`.
    #[prop(into)]
    status: Signal<ConnStatus>,
    /// The most recent heartbeat, if any arrived.
    #[prop(into)]
    heartbeat: Signal<Option<Heartbeat>>,
) -> impl IntoView {
    let label = move || status.get().label();
    let detail = move || match status.get() {
        ConnStatus::Reconnecting { attempt } => format!("attempt {attempt}"),
        _ => String::new(),
    };
    let seq = move || heartbeat.with(|hb| hb.as_ref().map_or("—".to_string(), |hb| hb.seq.to_string()));
    let time = move || {
        heartbeat.with(|hb| hb.as_ref().map_or("—".to_string(), |hb| format_utc_time(hb.server_time_ms) + " UTC"))
    };
    view! {
        <section class="card">
            <h2>"Server heartbeat"</h2>
            <dl>
                <dt>"connection"</dt>
                <dd>
                    <span id="conn-status" class=move || format!("pill {}", label())>{label}</span>
                    <span class="muted detail">{detail}</span>
                </dd>
                <dt>"last seq"</dt>
                <dd id="heartbeat-seq" class="mono">{seq}</dd>
                <dt>"server time"</dt>
                <dd id="heartbeat-time" class="mono">{time}</dd>
            </dl>
        </section>
    }
}

/// The books to open: `?books=a,b` in the page's URL, else the simulator's BTC/USDT.
fn books_from_query() -> Vec<InstrumentId> {
    let search = web_sys::window().and_then(|w| w.location().search().ok()).unwrap_or_default();
    let wanted = search
        .trim_start_matches('?')
        .split('&')
        .find_map(|kv| kv.strip_prefix("books="))
        .map(|v| String::from(js_sys::decode_uri_component(v).unwrap_or_else(|_| v.into())));
    let names = wanted.unwrap_or_else(|| "sim:spot:BTC/USDT".to_string());
    names
        .split(',')
        .filter_map(|n| match n.trim().parse::<InstrumentId>() {
            Ok(i) => Some(i),
            Err(e) => {
                leptos::logging::warn!("?books: {n}: {e}");
                None
            }
        })
        .collect()
}

/// One locally synced order book: its status badge and its ladder.
#[component]
pub fn BookCard(instrument: InstrumentId) -> impl IntoView {
    let name = instrument.to_string();
    let book = use_depth_book(instrument);
    let badge = book.badge;
    let state = move || badge.get().state.label();
    let title = name.clone();
    view! {
        <section class="card book-card" data-instrument=name data-update-id=move || badge.get().update_id.to_string()>
            <h2>{title}</h2>
            <div class="badge-line">
                <span class=move || format!("pill badge {}", state().replace(' ', "-"))>{state}</span>
                <span class="muted detail">
                    "gaps " <span class="gaps mono">{move || badge.get().gaps}</span>
                    " · resyncs " <span class="resyncs mono">{move || badge.get().resyncs}</span>
                    " · checksum mismatches " <span class="mismatches mono">{move || badge.get().checksum_mismatches}</span>
                </span>
            </div>
            <LadderTable ladder=book.ladder />
        </section>
    }
}
