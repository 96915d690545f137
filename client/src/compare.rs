//! The compare card: one `BASE/QUOTE` across every venue that lists it, live.
//!
//! Each venue's book is followed on `depth@{instrument},5` (its best bid and ask, pushed every
//! 200 ms; the subscription also keeps the book's job running), and its upstream sync health
//! (`GET /api/v1/ops/books`, every two seconds): synced or resyncing, with the venue's gaps,
//! resyncs, checksum mismatches and verified checksums. A row shows best bid and ask, the exact
//! mid and spread, the venue's last trade (`trade@{instrument}`), and how old its book data is.

use std::collections::BTreeMap;
use std::time::Duration;

use leptos::prelude::*;
use shared::protocol::ops::BooksReport;
use shared::protocol::{BookHealth, BookStatus, InstrumentId, PushData, Stream};
use shared::Level;

use crate::api;
use crate::feed::{Feed, Handlers};

/// One venue's line.
#[derive(Debug, Clone, Default, PartialEq)]
struct Row {
    bid: Option<Level>,
    ask: Option<Level>,
    /// When the last push arrived (ms, the browser's clock).
    seen_ms: f64,
    status: Option<BookStatus>,
    /// The venue's last trade.
    last: Option<shared::trade::Trade>,
}

/// The card of `symbol` (`BTC/USDT`) over `instruments` (every venue's id of it).
#[component]
pub fn CompareCard(
    symbol: String,
    instruments: Vec<InstrumentId>,
    #[prop(optional, into)] on_close: Option<Callback<()>>,
) -> impl IntoView {
    let rows: RwSignal<BTreeMap<InstrumentId, Row>> =
        RwSignal::new(instruments.iter().map(|i| (i.clone(), Row::default())).collect());
    let feed = Feed::use_or_open();
    for id in &instruments {
        let key = id.clone();
        feed.subscribe(
            Stream::Depth { instrument: id.clone(), levels: 5 },
            Handlers::pushes(move |data| {
                if let PushData::Depth(ev) = data {
                    let (bid, ask) = (ev.bids.first().copied(), ev.asks.first().copied());
                    rows.update(|r| {
                        if let Some(row) = r.get_mut(&key) {
                            row.bid = bid;
                            row.ask = ask;
                            row.seen_ms = js_sys::Date::now();
                        }
                    });
                }
            }),
        );
    }
    // and each venue's last trade
    for id in &instruments {
        let key = id.clone();
        feed.subscribe(
            Stream::Trade(id.clone()),
            Handlers::pushes(move |data| {
                if let PushData::Trades(ev) = data {
                    if let Some(t) = ev.trades.last() {
                        rows.update(|r| {
                            if let Some(row) = r.get_mut(&key) {
                                row.last = Some(t.clone());
                            }
                        });
                    }
                }
            }),
        );
    }
    // the upstream health of each book, and a clock for the data age
    let now = RwSignal::new(js_sys::Date::now());
    let poll = move || {
        leptos::task::spawn_local(async move {
            if let Ok(report) = api::get_json::<BooksReport>("/api/v1/ops/books").await {
                rows.update(|r| {
                    for b in report.books {
                        if let Some(row) = r.get_mut(&b.instrument) {
                            row.status = Some(b.status);
                        }
                    }
                });
            }
        });
    };
    poll();
    let ticks = std::cell::Cell::new(0u32);
    let timer = set_interval_with_handle(
        move || {
            now.set(js_sys::Date::now());
            ticks.set(ticks.get() + 1);
            if ticks.get() % 4 == 0 {
                poll();
            }
        },
        Duration::from_millis(500),
    );
    on_cleanup(move || {
        if let Ok(t) = timer {
            t.clear();
        }
    });
    let title = symbol.clone();
    view! {
        <div class="card compare-card" data-symbol=symbol.clone()>
            <div class="card-head">
                <h2>{format!("{title} across venues")}</h2>
                {on_close.map(|c| view! { <button class="close" title="close" on:click=move |_| c.run(())>"×"</button> })}
            </div>
            <table class="compare">
                <thead><tr>
                    <th>"venue"</th><th>"bid"</th><th>"ask"</th><th>"mid"</th><th>"spread"</th><th>"last trade"</th><th>"age"</th><th>"sync"</th>
                </tr></thead>
                <tbody>
                    {move || rows.with(|r| r.iter().map(|(id, row)| view_row(id, row, now.get())).collect_view())}
                </tbody>
            </table>
        </div>
    }
}

fn level(l: Option<Level>) -> String {
    l.map(|l| format!("{} × {}", l.price, l.qty)).unwrap_or_else(|| "—".into())
}

fn view_row(id: &InstrumentId, row: &Row, now: f64) -> impl IntoView + use<> {
    let (mid, spread) = match (row.bid, row.ask) {
        (Some(b), Some(a)) => (
            shared::ladder::mid_string(b.price, a.price),
            a.price.checked_sub(b.price).map(|s| s.to_string()).unwrap_or_default(),
        ),
        _ => ("—".into(), "—".into()),
    };
    let last = row
        .last
        .as_ref()
        .map(|t| {
            let side = match t.taker {
                Some(shared::trade::TakerSide::Buy) => " buy",
                Some(shared::trade::TakerSide::Sell) => " sell",
                None => "",
            };
            format!("{} × {}{side}", t.price, t.qty)
        })
        .unwrap_or_else(|| "—".into());
    let age = if row.seen_ms > 0.0 {
        format!("{:.1} s", (now - row.seen_ms).max(0.0) / 1000.0)
    } else {
        "—".into()
    };
    let (badge, class, detail) = match row.status {
        Some(s) => {
            let (word, class) = match s.health {
                BookHealth::Synced => ("synced", "badge ok"),
                BookHealth::SnapshotMode => ("snapshot", "badge warn"),
                _ => ("resyncing", "badge warn"),
            };
            let detail = format!(
                "gaps {} · resyncs {} · checksum failures {} · checksums verified {}",
                s.gaps, s.resyncs, s.drift, s.verifications
            );
            (word, class, detail)
        }
        None => ("waiting", "badge", String::new()),
    };
    view! {
        <tr class="compare-row" data-instrument=id.to_string() data-health=badge>
            <td class="mono">{id.exchange.clone()}</td>
            <td class="mono bid">{level(row.bid)}</td>
            <td class="mono ask">{level(row.ask)}</td>
            <td class="mono mid">{mid}</td>
            <td class="mono spread">{spread}</td>
            <td class="mono last">{last}</td>
            <td class="mono age">{age}</td>
            <td><span class=class title=detail>{badge}</span></td>
        </tr>
    }
}
