//! Browser tests of the dashboard's components: mount, change signals, assert on the DOM.
//! Run by scripts/test with `wasm-pack test --headless --chrome client`.

use client::{backoff_ms, bar_width, format_utc_time, ConnStatus, HeartbeatPanel, LadderTable};
use leptos::prelude::*;
use shared::book::{DepthLadder, Level, OrderBook};
use shared::fixed::{Price, Qty};
use shared::protocol::Heartbeat;
use wasm_bindgen::JsCast;
use wasm_bindgen_test::*;

wasm_bindgen_test_configure!(run_in_browser);

fn text(selector: &str) -> String {
    let doc = web_sys::window().unwrap().document().unwrap();
    doc.query_selector(selector).unwrap().unwrap_or_else(|| panic!("{selector} missing")).text_content().unwrap()
}

#[wasm_bindgen_test]
async fn heartbeat_panel_follows_its_signals() {
    let doc = web_sys::window().unwrap().document().unwrap();
    let host = doc.create_element("div").unwrap().unchecked_into::<web_sys::HtmlElement>();
    doc.body().unwrap().append_child(&host).unwrap();

    let status = RwSignal::new(ConnStatus::Connecting);
    let heartbeat = RwSignal::new(None::<Heartbeat>);
    let mounted = leptos::mount::mount_to(host, move || view! { <HeartbeatPanel status=status heartbeat=heartbeat /> });

    assert_eq!(text("#conn-status"), "connecting");
    assert_eq!(text("#heartbeat-seq"), "—");

    status.set(ConnStatus::Live);
    heartbeat.set(Some(Heartbeat { seq: 42, server_time_ms: 1_700_000_000_123, version: "0.1.0".into() }));
    leptos::task::tick().await;
    assert_eq!(text("#conn-status"), "live");
    assert_eq!(text("#heartbeat-seq"), "42");
    assert_eq!(text("#heartbeat-time"), "22:13:20.123 UTC");

    status.set(ConnStatus::Reconnecting { attempt: 3 });
    leptos::task::tick().await;
    assert_eq!(text("#conn-status"), "reconnecting");
    assert_eq!(text("#heartbeat-seq"), "42", "the last heartbeat stays visible while reconnecting");
    drop(mounted);
}

#[wasm_bindgen_test]
fn backoff_doubles_up_to_ten_seconds() {
    let delays: Vec<u32> = (1..=7).map(backoff_ms).collect();
    assert_eq!(delays, [500, 1000, 2000, 4000, 8000, 10_000, 10_000]);
    assert_eq!(backoff_ms(u32::MAX), 10_000);
}

#[wasm_bindgen_test]
fn utc_time_formatting() {
    assert_eq!(format_utc_time(0), "00:00:00.000");
    assert_eq!(format_utc_time(86_399_999), "23:59:59.999");
    assert_eq!(format_utc_time(-1), "23:59:59.999");
}

fn texts(selector: &str) -> Vec<String> {
    let doc = web_sys::window().unwrap().document().unwrap();
    let list = doc.query_selector_all(selector).unwrap();
    (0..list.length()).map(|i| list.item(i).unwrap().text_content().unwrap()).collect()
}

fn book(bids: &[(&str, &str)], asks: &[(&str, &str)]) -> OrderBook {
    let lv = |&(p, q): &(&str, &str)| Level::new(Price::parse(p).unwrap(), Qty::parse(q).unwrap());
    let mut b = OrderBook::new();
    b.replace(&bids.iter().map(lv).collect::<Vec<_>>(), &asks.iter().map(lv).collect::<Vec<_>>());
    b
}

#[wasm_bindgen_test]
async fn ladder_shows_asks_above_bids_with_depth_bars_spread_and_mid() {
    let doc = web_sys::window().unwrap().document().unwrap();
    let host = doc.create_element("div").unwrap().unchecked_into::<web_sys::HtmlElement>();
    doc.body().unwrap().append_child(&host).unwrap();

    let first = book(&[("100", "1"), ("99", "2"), ("98", "3")], &[("101", "4"), ("102.5", "1")]);
    let ladder = RwSignal::new(DepthLadder::of(&first, 20));
    let mounted = leptos::mount::mount_to(host, move || view! { <LadderTable ladder=ladder /> });

    // asks worst first, so the best ask is next to the spread row; bids best first
    assert_eq!(texts(".ladder .ask-row .price"), ["102.5", "101"]);
    assert_eq!(texts(".ladder .ask-row .cum"), ["5", "4"]);
    assert_eq!(texts(".ladder .bid-row .price"), ["100", "99", "98"]);
    assert_eq!(texts(".ladder .bid-row .cum"), ["1", "3", "6"]);
    assert_eq!(text(".ladder .spread"), "1");
    assert_eq!(text(".ladder .mid"), "100.5");
    let bar = doc.query_selector(".ladder .bid-row:last-child .bar").unwrap().unwrap();
    assert_eq!(bar.get_attribute("style").as_deref(), Some("width:100.0%"));

    // the book moves: rows, totals and the middle row follow
    ladder.set(DepthLadder::of(&book(&[("100.25", "2")], &[("100.5", "1")]), 20));
    leptos::task::tick().await;
    assert_eq!(texts(".ladder .ask-row .price"), ["100.5"]);
    assert_eq!(texts(".ladder .bid-row .qty"), ["2"]);
    assert_eq!(text(".ladder .spread"), "0.25");
    assert_eq!(text(".ladder .mid"), "100.375");

    // an empty book shows dashes, not stale numbers
    ladder.set(DepthLadder::default());
    leptos::task::tick().await;
    assert!(texts(".ladder .bid-row").is_empty() && texts(".ladder .ask-row").is_empty());
    assert_eq!(text(".ladder .mid"), "—");
    drop(mounted);
}

#[wasm_bindgen_test]
fn bar_widths_are_exact_percentages() {
    assert_eq!(bar_width(0), "0.0%");
    assert_eq!(bar_width(166), "16.6%");
    assert_eq!(bar_width(1000), "100.0%");
}
