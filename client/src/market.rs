//! The market view: the instrument picker (grouped by venue), the open charts, the open order
//! books and the compare cards (one `BASE/QUOTE` across every venue that lists it).
//!
//! What is open lives in the page's URL
//! (`?charts=sim:spot:BTC/USDT:1m,…&books=sim:stock:600000,…&compare=BTC/USDT`),
//! so a reload or a shared link opens the same view; without a query the view opens the
//! simulator's BTC/USDT chart (1m) and book. Charts and books have stable keys: opening or closing
//! one never remounts (or resubscribes) the others.

use leptos::prelude::*;
use shared::candle::Timeframe;
use shared::protocol::ops::{Catalog, ShardsReport};
use shared::protocol::{InstrumentId, SeriesId};

use crate::api::{self, FetchError};
use crate::chart::ChartPanel;
use crate::compare::CompareCard;
use crate::depth::BookCard;
use crate::tape::TradesTape;

/// One entry of the picker.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PickerEntry {
    pub id: InstrumentId,
    /// Candles are offered (a source's instrument); tick-by-tick books have none.
    pub chart: bool,
    /// What to show beside the id: the exchange symbol or the venue.
    pub note: String,
}

/// Entries whose id or note contains every word of `query` (case-insensitive), in order.
pub fn filter_entries<'a>(entries: &'a [PickerEntry], query: &str) -> Vec<&'a PickerEntry> {
    let words: Vec<String> = query.split_whitespace().map(str::to_lowercase).collect();
    entries
        .iter()
        .filter(|e| {
            let hay = format!("{} {}", e.id, e.note).to_lowercase();
            words.iter().all(|w| hay.contains(w.as_str()))
        })
        .collect()
}

/// Everything the server offers: source instruments (charts and books) and tick-by-tick books.
async fn load_entries() -> Result<(Vec<PickerEntry>, Vec<Timeframe>), FetchError> {
    let catalog: Catalog = api::get_json("/api/v1/series").await?;
    let mut entries: Vec<PickerEntry> = catalog
        .instruments
        .into_iter()
        .map(|i| PickerEntry { id: i.id, chart: true, note: i.symbol })
        .collect();
    // the tick-by-tick books (book only); a failure here still leaves the sources' instruments
    if let Ok(shards) = api::get_json::<ShardsReport>("/api/v1/ops/shards").await {
        for s in shards.engine.symbols {
            if !entries.iter().any(|e| e.id == s.instrument) {
                entries.push(PickerEntry {
                    id: s.instrument,
                    chart: false,
                    note: s.venue.as_str().into(),
                });
            }
        }
    }
    Ok((entries, catalog.timeframes))
}

/// What the page's URL asks to open.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct OpenSet {
    pub charts: Vec<SeriesId>,
    pub books: Vec<InstrumentId>,
    /// `BASE/QUOTE` symbols compared across venues.
    pub compare: Vec<String>,
    /// Instruments whose trades tape is open.
    pub tapes: Vec<InstrumentId>,
}

impl OpenSet {
    /// Reads `?charts=…&books=…` (each a comma-separated list; bad names are skipped with a
    /// warning). With neither key: BTC/USDT's 1m chart and book on the simulator.
    pub fn from_query(search: &str) -> OpenSet {
        let value = |key: &str| {
            search.trim_start_matches('?').split('&').find_map(|kv| kv.strip_prefix(key)).map(|v| {
                let v = v.replace('+', " ");
                String::from(js_sys::decode_uri_component(&v).unwrap_or_else(|_| v.as_str().into()))
            })
        };
        let (charts, books, compare) = (value("charts="), value("books="), value("compare="));
        let tapes = value("tapes=");
        if charts.is_none() && books.is_none() && compare.is_none() && tapes.is_none() {
            let btc: InstrumentId = "sim:spot:BTC/USDT".parse().expect("a valid id");
            return OpenSet {
                charts: vec![SeriesId { instrument: btc.clone(), timeframe: Timeframe::M1 }],
                books: vec![btc],
                compare: Vec::new(),
                tapes: Vec::new(),
            };
        }
        let compare = compare
            .unwrap_or_default()
            .split(',')
            .map(str::trim)
            .filter(|s| is_pair(s))
            .map(str::to_string)
            .collect();
        OpenSet {
            charts: parse_list(charts.as_deref()),
            books: parse_list(books.as_deref()),
            compare,
            tapes: parse_list(tapes.as_deref()),
        }
    }

    /// The query that reopens this set.
    pub fn to_query(&self) -> String {
        let join = |names: Vec<String>| names.join(",");
        let mut q = format!(
            "?charts={}&books={}",
            join(self.charts.iter().map(|s| s.to_string()).collect()),
            join(self.books.iter().map(|b| b.to_string()).collect())
        );
        if !self.compare.is_empty() {
            q.push_str(&format!("&compare={}", self.compare.join(",")));
        }
        if !self.tapes.is_empty() {
            q.push_str(&format!(
                "&tapes={}",
                join(self.tapes.iter().map(|t| t.to_string()).collect())
            ));
        }
        q
    }
}

/// `BASE/QUOTE`: two non-empty alphanumeric names.
fn is_pair(s: &str) -> bool {
    let ok =
        |p: &str| !p.is_empty() && p.len() <= 20 && p.bytes().all(|b| b.is_ascii_alphanumeric());
    s.split_once('/').is_some_and(|(b, q)| ok(b) && ok(q))
}

fn parse_list<T: std::str::FromStr>(list: Option<&str>) -> Vec<T>
where
    T::Err: std::fmt::Display,
{
    list.unwrap_or("")
        .split(',')
        .map(str::trim)
        .filter(|n| !n.is_empty())
        .filter_map(|n| match n.parse::<T>() {
            Ok(v) => Some(v),
            Err(e) => {
                leptos::logging::warn!("query: {n}: {e}");
                None
            }
        })
        .collect()
}

/// The market view.
#[component]
pub fn MarketView() -> impl IntoView {
    let search = web_sys::window().and_then(|w| w.location().search().ok()).unwrap_or_default();
    let start = OpenSet::from_query(&search);
    let next_key = StoredValue::new(0u64);
    let keyed = move |n: usize| {
        (0..n)
            .map(|_| {
                let k = next_key.get_value();
                next_key.set_value(k + 1);
                k
            })
            .collect::<Vec<_>>()
    };
    let charts =
        RwSignal::new(keyed(start.charts.len()).into_iter().zip(start.charts).collect::<Vec<_>>());
    let books =
        RwSignal::new(keyed(start.books.len()).into_iter().zip(start.books).collect::<Vec<_>>());
    let compares = RwSignal::new(
        keyed(start.compare.len()).into_iter().zip(start.compare).collect::<Vec<_>>(),
    );
    let tapes =
        RwSignal::new(keyed(start.tapes.len()).into_iter().zip(start.tapes).collect::<Vec<_>>());
    // keep the URL in step, so a reload reopens the same view
    Effect::new(move |_| {
        let set = OpenSet {
            charts: charts.with(|c| c.iter().map(|(_, s)| s.clone()).collect()),
            books: books.with(|b| b.iter().map(|(_, i)| i.clone()).collect()),
            compare: compares.with(|c| c.iter().map(|(_, s)| s.clone()).collect()),
            tapes: tapes.with(|t| t.iter().map(|(_, i)| i.clone()).collect()),
        };
        if let Some(history) = web_sys::window().and_then(|w| w.history().ok()) {
            let hash = web_sys::window().and_then(|w| w.location().hash().ok()).unwrap_or_default();
            let _ = history.replace_state_with_url(
                &wasm_bindgen::JsValue::NULL,
                "",
                Some(&(set.to_query() + &hash)),
            );
        }
    });

    let entries = RwSignal::new(Vec::<PickerEntry>::new());
    let offered = RwSignal::new(Vec::<Timeframe>::new());
    let load_error = RwSignal::new(None::<String>);
    leptos::task::spawn_local(async move {
        match load_entries().await {
            Ok((e, t)) => {
                entries.set(e);
                offered.set(t);
            }
            Err(e) => load_error.set(Some(e.to_string())),
        }
    });

    let open_chart = move |id: InstrumentId| {
        let k = keyed(1)[0];
        charts.update(|c| c.push((k, SeriesId { instrument: id, timeframe: Timeframe::M1 })));
    };
    let open_book = move |id: InstrumentId| {
        let k = keyed(1)[0];
        books.update(|b| b.push((k, id)));
    };
    let open_tape = move |id: InstrumentId| {
        let k = keyed(1)[0];
        tapes.update(|t| t.push((k, id)));
    };
    let open_compare = move |id: InstrumentId| {
        let k = keyed(1)[0];
        compares.update(|c| c.push((k, id.symbol)));
    };

    view! {
        <div class="market">
            <InstrumentPicker entries=entries error=load_error on_chart=Callback::new(open_chart) on_book=Callback::new(open_book)
                on_compare=Callback::new(open_compare) on_tape=Callback::new(open_tape) />
            <section class="compares">
                <For each=move || compares.get() key=|(k, _)| *k let:item>
                    {
                        let (k, symbol) = item;
                        // every venue's spot instrument of this symbol, once the catalogue is in
                        move || {
                            let ids: Vec<InstrumentId> = entries.with(|e| {
                                e.iter().filter(|e| e.id.symbol == symbol && e.id.market == shared::protocol::Market::Spot).map(|e| e.id.clone()).collect()
                            });
                            (!ids.is_empty()).then(|| view! {
                                <CompareCard symbol=symbol.clone() instruments=ids
                                    on_close=Callback::new(move |_| compares.update(|c| c.retain(|(x, _)| *x != k))) />
                            })
                        }
                    }
                </For>
            </section>
            <section class="charts">
                <For each=move || charts.get() key=|(k, _)| *k let:item>
                    {
                        let (k, s) = item;
                        view! {
                            <ChartPanel instrument=s.instrument timeframe=s.timeframe offered=offered
                                on_close=Callback::new(move |_| charts.update(|c| c.retain(|(x, _)| *x != k))) />
                        }
                    }
                </For>
            </section>
            <section class="tapes">
                <For each=move || tapes.get() key=|(k, _)| *k let:item>
                    {
                        let (k, i) = item;
                        view! { <TradesTape instrument=i on_close=Callback::new(move |_| tapes.update(|t| t.retain(|(x, _)| *x != k))) /> }
                    }
                </For>
            </section>
            <section class="books">
                <For each=move || books.get() key=|(k, _)| *k let:item>
                    {
                        let (k, i) = item;
                        view! { <BookCard instrument=i on_close=Callback::new(move |_| books.update(|b| b.retain(|(x, _)| *x != k))) /> }
                    }
                </For>
            </section>
        </div>
    }
}

/// The searchable instrument list (grouped by venue) with "chart", "book", "compare" and
/// "trades" buttons per entry; choosing one closes the list, so it covers nothing it opened.
#[component]
pub fn InstrumentPicker(
    #[prop(into)] entries: Signal<Vec<PickerEntry>>,
    #[prop(into)] error: Signal<Option<String>>,
    on_chart: Callback<InstrumentId>,
    on_book: Callback<InstrumentId>,
    on_compare: Callback<InstrumentId>,
    on_tape: Callback<InstrumentId>,
) -> impl IntoView {
    let query = RwSignal::new(String::new());
    let open = RwSignal::new(false);
    let matches = move || {
        let q = query.get();
        entries
            .with(|all| filter_entries(all, &q).into_iter().take(60).cloned().collect::<Vec<_>>())
    };
    view! {
        <div class="picker" on:focusin=move |_| open.set(true)>
            <input id="instrument-search" type="search" placeholder="Search instruments (e.g. btc, 600000, sse)…"
                autocomplete="off" prop:value=query
                on:input=move |ev| { query.set(event_target_value(&ev)); open.set(true); }
                on:keydown=move |ev| if ev.key() == "Escape" { open.set(false) } />
            <span class="muted detail">{move || entries.with(|e| format!("{} instruments", e.len()))}</span>
            {move || error.get().map(|e| view! { <span class="error detail">{e}</span> })}
            <button class="picker-toggle" on:click=move |_| open.update(|o| *o = !*o)>
                {move || if open.get() { "hide list" } else { "show list" }}
            </button>
            <ul class="picker-list" class:open=open>
                {move || {
                    // grouped by venue (the source), each group headed by its name
                    let mut list = matches();
                    list.sort_by(|a, b| a.id.exchange.cmp(&b.id.exchange));
                    let mut last: Option<String> = None;
                    list.into_iter().map(|e| {
                        let head = (last.as_deref() != Some(e.id.exchange.as_str())).then(|| {
                            last = Some(e.id.exchange.clone());
                            view! { <li class="picker-group" data-venue=e.id.exchange.clone()>{e.id.exchange.clone()}</li> }
                        });
                        let (for_chart, for_book, for_compare) = (e.id.clone(), e.id.clone(), e.id.clone());
                        let for_tape = e.id.clone();
                        // trades come with a source's book (not the tick-by-tick books')
                        let trades = e.id.market != shared::protocol::Market::Stock;
                        let pair = e.id.symbol.contains('/');
                        view! {
                            {head}
                            <li class="picker-item" data-instrument=e.id.to_string()>
                                <span class="mono">{e.id.to_string()}</span>
                                <span class="muted">{e.note.clone()}</span>
                                <button class="open-chart" disabled=!e.chart title="open a chart" on:click=move |_| { open.set(false); on_chart.run(for_chart.clone()) }>"chart"</button>
                                <button class="open-book" title="open the order book" on:click=move |_| { open.set(false); on_book.run(for_book.clone()) }>"book"</button>
                                <button class="open-compare" disabled=!pair title="compare this pair across venues" on:click=move |_| { open.set(false); on_compare.run(for_compare.clone()) }>"compare"</button>
                                <button class="open-tape" disabled=!trades title="open the trades tape" on:click=move |_| { open.set(false); on_tape.run(for_tape.clone()) }>"trades"</button>
                            </li>
                        }
                    }).collect_view()
                }}
            </ul>
        </div>
    }
}
