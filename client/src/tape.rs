//! The trades tape: an instrument's newest trades as they happen (`trade@{instrument}`), newest
//! on top, the taker's side coloured. Pushes are gathered and drawn four times a second at most,
//! in rows of a fixed height, so a busy market neither floods the DOM nor moves the page.

use std::cell::RefCell;
use std::collections::VecDeque;
use std::rc::Rc;
use std::time::Duration;

use leptos::prelude::*;
use send_wrapper::SendWrapper;
use shared::protocol::{InstrumentId, PushData, Stream};
use shared::trade::{TakerSide, Trade};

use crate::feed::{Feed, Handlers};

/// Rows the tape shows.
pub const TAPE_ROWS: usize = 24;

/// The tape of `instrument`.
#[component]
pub fn TradesTape(
    instrument: InstrumentId,
    #[prop(optional, into)] on_close: Option<Callback<()>>,
) -> impl IntoView {
    let shown = RwSignal::new(Vec::<Trade>::new());
    let count = RwSignal::new(0u64);
    let refused = RwSignal::new(None::<String>);
    // pushes land here; the timer moves them to the signal
    let pending: Rc<RefCell<VecDeque<Trade>>> = Rc::default();
    let feed = Feed::use_or_open();
    let sink = pending.clone();
    let mut handlers = Handlers::pushes(move |data| {
        if let PushData::Trades(ev) = data {
            let mut p = sink.borrow_mut();
            for t in &ev.trades {
                if p.len() == TAPE_ROWS {
                    p.pop_front();
                }
                p.push_back(t.clone());
            }
            count.update(|c| *c += ev.trades.len() as u64);
        }
    });
    handlers.on_refused = Box::new(move |r| refused.set(Some(r.text())));
    handlers.on_live = Box::new(move || refused.set(None));
    feed.subscribe(Stream::Trade(instrument.clone()), handlers);
    let pending = SendWrapper::new(pending);
    let timer = set_interval_with_handle(
        move || {
            let mut p = pending.borrow_mut();
            if p.is_empty() {
                return;
            }
            shown.update(|s| {
                for t in p.drain(..) {
                    s.insert(0, t);
                }
                s.truncate(TAPE_ROWS);
            });
        },
        Duration::from_millis(250),
    );
    on_cleanup(move || {
        if let Ok(t) = timer {
            t.clear();
        }
    });
    let name = instrument.to_string();
    view! {
        <div class="card tape-card" data-instrument=name.clone()>
            <div class="card-head">
                <h2>{format!("{name} trades")}</h2>
                <span class="muted detail tape-count">{move || format!("{} received", count.get())}</span>
                {on_close.map(|c| view! { <button class="close" title="close" on:click=move |_| c.run(())>"×"</button> })}
            </div>
            {move || refused.get().map(|e| view! { <div class="error detail">{e}</div> })}
            <table class="tape">
                <thead><tr><th>"time (UTC)"</th><th>"price"</th><th>"qty"</th><th>"taker"</th></tr></thead>
                <tbody>
                    {move || shown.with(|s| s.iter().map(row).collect_view())}
                </tbody>
            </table>
        </div>
    }
}

fn row(t: &Trade) -> impl IntoView + use<> {
    let ms = t.time_ms.rem_euclid(86_400_000);
    let time = format!(
        "{:02}:{:02}:{:02}.{:03}",
        ms / 3_600_000,
        ms / 60_000 % 60,
        ms / 1000 % 60,
        ms % 1000
    );
    let (side, class) = match t.taker {
        Some(TakerSide::Buy) => ("buy", "tape-row buy"),
        Some(TakerSide::Sell) => ("sell", "tape-row sell"),
        None => ("", "tape-row"),
    };
    view! {
        <tr class=class data-id=t.id.to_string()>
            <td class="mono">{time}</td>
            <td class="mono price">{t.price.to_string()}</td>
            <td class="mono">{t.qty.to_string()}</td>
            <td>{side}</td>
        </tr>
    }
}
