//! The candlestick chart: TradingView's lightweight-charts (crosshair, zoom, pan, price and time
//! axes) with volume, fed by a [`LiveSeries`] (shared crate) that merges `GET /api/v1/klines`
//! history with the live `kline@{series}` stream.
//!
//! The stream is subscribed first; once it is live, history is fetched, so no candle falls
//! between them. After a reconnect the history is fetched again from the last candle shown, and a
//! gap seen in the stream (skipped intervals, a missed close) fetches from where it starts. The
//! chart is drawn on animation frames ([`crate::paint`]): only the candles that changed.

use std::cell::{Cell, RefCell};
use std::rc::Rc;
use std::time::Duration;

use leptos::prelude::*;
use send_wrapper::SendWrapper;
use shared::candle::{Candle, Timeframe};
use shared::chart::{Applied, Changes, LiveSeries};
use shared::protocol::{InstrumentId, KlineEvent, PushData, SeriesId, Stream};
use web_sys::Element;

use crate::api;
use crate::feed::{Feed, Handlers};
use crate::paint::{drop_chart, paint_chart, FrameSlot, Paint};

/// Candles a chart keeps (and loads at first).
pub const CHART_CANDLES: usize = 1000;

/// The timeframe buttons, where the server offers them.
pub const TIMEFRAMES: [Timeframe; 6] =
    [Timeframe::M1, Timeframe::M5, Timeframe::M15, Timeframe::H1, Timeframe::H4, Timeframe::D1];

/// A chart with no message for this long is flagged stale (the forming candle updates at least
/// every few seconds on a live market).
pub const STALE_AFTER_MS: f64 = 10_000.0;

/// One chart's state: its series, its stream, what it last drew.
pub struct ChartWidget {
    series_id: SeriesId,
    series: RefCell<LiveSeries>,
    live: Cell<bool>,
    /// A history request is in flight.
    loading: Cell<bool>,
    /// History was fetched at least once.
    loaded: Cell<bool>,
    last_message_ms: Cell<f64>,
    /// The status last drawn (`loading`, `live`, `stale`, `disconnected`, or an error).
    status: RefCell<String>,
    error: RefCell<Option<String>>,
    /// The server refused the stream: its code and message (cleared when it is live again).
    refused: RefCell<Option<String>>,
    el: RefCell<Option<Element>>,
    slot: FrameSlot,
}

impl ChartWidget {
    /// Starts following `series`; stops when the calling component is cleaned up.
    pub fn start(series_id: SeriesId) -> Rc<ChartWidget> {
        let feed = Feed::use_or_open();
        let w = Rc::new(ChartWidget {
            series: RefCell::new(LiveSeries::new(series_id.timeframe, CHART_CANDLES)),
            series_id: series_id.clone(),
            live: Cell::new(false),
            loading: Cell::new(false),
            loaded: Cell::new(false),
            last_message_ms: Cell::new(0.0),
            status: RefCell::new(String::new()),
            error: RefCell::new(None),
            refused: RefCell::new(None),
            el: RefCell::new(None),
            slot: FrameSlot::default(),
        });
        let (on_push, on_live, on_lost, on_refused) = (w.clone(), w.clone(), w.clone(), w.clone());
        feed.subscribe(
            Stream::Kline(series_id),
            Handlers {
                on_push: Box::new(move |data| match data {
                    PushData::Kline(ev) => on_push.on_kline(ev),
                    other => leptos::logging::warn!("a {} push on kline", other.kind()),
                }),
                on_live: Box::new(move || {
                    on_live.live.set(true);
                    *on_live.refused.borrow_mut() = None;
                    // first load, or what was missed while disconnected
                    let from = on_live.series.borrow().last().map(|(c, _)| c.open_time);
                    on_live.load_history(from);
                }),
                on_lost: Box::new(move || {
                    on_lost.live.set(false);
                    on_lost.slot.request(&on_lost);
                }),
                on_refused: Box::new(move |refusal| {
                    on_refused.live.set(false);
                    *on_refused.refused.borrow_mut() = Some(refusal.text());
                    on_refused.slot.request(&on_refused);
                }),
            },
        );
        let ticking = SendWrapper::new(Rc::downgrade(&w));
        let tick = set_interval_with_handle(
            move || {
                if let Some(w) = ticking.upgrade() {
                    w.slot.request(&w);
                }
            },
            Duration::from_millis(1000),
        );
        on_cleanup(move || {
            if let Ok(t) = tick {
                t.clear();
            }
        });
        w
    }

    /// Where to draw (set once the element is mounted).
    pub fn attach(self: &Rc<Self>, el: Element) {
        *self.el.borrow_mut() = Some(el);
        self.slot.request(self);
    }

    fn on_kline(self: &Rc<Self>, ev: &KlineEvent) {
        if ev.k.i != self.series_id.timeframe {
            return;
        }
        self.last_message_ms.set(js_sys::Date::now());
        let applied = self.series.borrow_mut().apply(Candle::from(&ev.k), ev.k.x);
        if applied == Applied::Gap && self.loaded.get() {
            let from = self.series.borrow().refetch_from();
            self.load_history(from);
        }
        self.slot.request(self);
    }

    /// Fetches history (from `start`, or the newest [`CHART_CANDLES`]) and merges it in.
    fn load_history(self: &Rc<Self>, start: Option<i64>) {
        if self.loading.replace(true) {
            return;
        }
        let me = self.clone();
        leptos::task::spawn_local(async move {
            let result = api::fetch_klines(&me.series_id, start, CHART_CANDLES as u32).await;
            me.loading.set(false);
            match result {
                Ok(candles) => {
                    me.series.borrow_mut().load_history(candles);
                    me.loaded.set(true);
                    *me.error.borrow_mut() = None;
                }
                Err(e) => {
                    leptos::logging::warn!("{e}");
                    *me.error.borrow_mut() = Some(e.to_string());
                }
            }
            me.slot.request(&me);
        });
    }

    fn current_status(&self) -> String {
        if let Some(r) = self.refused.borrow().as_ref() {
            return format!("refused: {r}");
        }
        if let Some(e) = self.error.borrow().as_ref() {
            return format!("error: {e}");
        }
        if !self.live.get() && self.loaded.get() {
            return "disconnected".into();
        }
        if !self.loaded.get() {
            return "loading".into();
        }
        let last = self.last_message_ms.get();
        if last > 0.0 && js_sys::Date::now() - last >= STALE_AFTER_MS {
            return "stale".into();
        }
        "live".into()
    }
}

impl Paint for ChartWidget {
    fn paint(&self) {
        self.slot.painted();
        let Some(el) = self.el.borrow().clone() else { return };
        let status = self.current_status();
        let mut series = self.series.borrow_mut();
        let changes = series.take_changes();
        let from = match changes {
            Changes::None if *self.status.borrow() == status => return,
            Changes::None => series.len(),
            Changes::All => 0,
            Changes::From(i) => i,
        };
        let mut data = Vec::with_capacity((series.len() - from) * 6);
        for c in series.candles().range(from..) {
            data.extend_from_slice(&[
                (c.open_time / 1000) as f64,
                c.open.raw() as f64 / 1e8,
                c.high.raw() as f64 / 1e8,
                c.low.raw() as f64 / 1e8,
                c.close.raw() as f64 / 1e8,
                c.volume.raw() as f64 / 1e8,
            ]);
        }
        paint_chart(
            &el,
            changes == Changes::All,
            &data,
            series.price_decimals(),
            series.len() as u32,
            &status,
        );
        *self.status.borrow_mut() = status;
    }
}

/// A chart panel: title, timeframe buttons, close button and the chart. The timeframe can be
/// changed in place (the old stream is unsubscribed, the new one subscribed).
#[component]
pub fn ChartPanel(
    instrument: InstrumentId,
    timeframe: Timeframe,
    /// Shown when set: the panel's close button calls it.
    #[prop(optional, into)]
    on_close: Option<Callback<()>>,
    /// The timeframes the server offers (buttons for the others are disabled).
    #[prop(into)]
    offered: Signal<Vec<Timeframe>>,
) -> impl IntoView {
    static NEXT: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(1);
    let widget_id = format!("chart-{}", NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed));
    let tf = RwSignal::new(timeframe);
    let name = instrument.to_string();
    let (attr_name, series_name) = (name.clone(), name.clone());
    let buttons = TIMEFRAMES
        .iter()
        .map(|&t| {
            view! {
                <button class="tf" class:active=move || tf.get() == t data-tf=t.name()
                    disabled=move || !offered.with(|o| o.is_empty() || o.contains(&t))
                    on:click=move |_| tf.set(t)>{t.name()}</button>
            }
        })
        .collect_view();
    let chart = move || {
        let series = SeriesId { instrument: instrument.clone(), timeframe: tf.get() };
        view! { <ChartCanvas series=series /> }
    };
    view! {
        <section class="card chart-panel" data-instrument=attr_name data-widget=widget_id
            data-series=move || format!("{}:{}", series_name, tf.get().name())>
            <header class="card-head">
                <h2>{name}</h2>
                <div class="tfs">{buttons}</div>
                <span class="chart-status muted"></span>
                {on_close.map(|f| view! { <button class="close" title="close" on:click=move |_| f.run(())>"×"</button> })}
            </header>
            {chart}
        </section>
    }
}

#[component]
fn ChartCanvas(series: SeriesId) -> impl IntoView {
    let widget = ChartWidget::start(series);
    let closing = SendWrapper::new(widget.clone());
    on_cleanup(move || {
        if let Some(el) = closing.el.borrow_mut().take() {
            drop_chart(&el);
        }
    });
    let widget = SendWrapper::new(widget);
    let node = NodeRef::<leptos::html::Div>::new();
    node.on_load(move |el| {
        let el: &Element = &el;
        widget.attach(el.clone());
    });
    view! { <div class="chart" node_ref=node></div> }
}
