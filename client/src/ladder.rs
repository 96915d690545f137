//! The order-book ladder widget: the best levels of both sides with cumulative depth bars, the
//! spread and the mid, drawn from a [`DepthLadder`] (computed by `shared`, exact fixed point).
//!
//! Asks are listed above the spread row, worst first, so the best ask sits right above it; bids
//! follow, best first. Every row has the same fixed parts (price, quantity, cumulative, bar), so
//! a ladder of the same depth keeps its height while the book changes.
//!
//! DOM for tests: `.ladder` holds `.ask-row` and `.bid-row` rows (cells `.price`, `.qty`,
//! `.cum`, bar `.bar` with its width in percent), and `.spread` / `.mid` in the middle row.

use leptos::prelude::*;
use shared::book::{DepthLadder, DepthRow};

/// `permille` thousandths as a CSS percentage, exactly (`1000` → `100.0%`).
pub fn bar_width(permille: u16) -> String {
    format!("{}.{}%", permille / 10, permille % 10)
}

/// One ladder: `ladder` is re-read whenever it changes.
#[component]
pub fn LadderTable(
    /// The rows to show (computed with `DepthLadder::of(book, 20)`).
    #[prop(into)]
    ladder: Signal<DepthLadder>,
) -> impl IntoView {
    let row = |r: &DepthRow, class: &'static str| {
        let width = bar_width(r.bar_permille);
        view! {
            <div class=format!("row {class}")>
                <span class="bar" style=format!("width:{width}")></span>
                <span class="price mono">{r.price.to_string()}</span>
                <span class="qty mono">{r.qty.to_string()}</span>
                <span class="cum mono">{r.cumulative.to_string()}</span>
            </div>
        }
    };
    let asks = move || ladder.with(|l| l.asks.iter().rev().map(|r| row(r, "ask-row")).collect_view());
    let bids = move || ladder.with(|l| l.bids.iter().map(|r| row(r, "bid-row")).collect_view());
    let spread = move || ladder.with(|l| l.spread().map_or("—".to_string(), |s| s.to_string()));
    let mid = move || ladder.with(|l| l.mid_string().unwrap_or_else(|| "—".to_string()));
    view! {
        <div class="ladder">
            <div class="row head muted">
                <span class="price">"price"</span>
                <span class="qty">"qty"</span>
                <span class="cum">"total"</span>
            </div>
            {asks}
            <div class="row middle">
                <span class="muted">"spread "</span>
                <span class="spread mono">{spread}</span>
                <span class="muted">" mid "</span>
                <span class="mid mono">{mid}</span>
            </div>
            {bids}
        </div>
    }
}
