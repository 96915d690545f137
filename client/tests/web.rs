//! Browser tests of the dashboard's components: mount, change signals, assert on the DOM.
//! Run by scripts/test with `wasm-pack test --headless --chrome client`.

use client::paint::paint_book;
use client::{
    bar_scale, book_text, format_utc_time, BadgeState, BookBadge, ConnStatus, HeartbeatPanel,
};
use leptos::prelude::*;
use shared::book::{Level, OrderBook};
use shared::fixed::{Price, Qty};
use shared::ladder::DepthLadder;
use shared::protocol::Heartbeat;
use wasm_bindgen::JsCast;
use wasm_bindgen_test::*;

wasm_bindgen_test_configure!(run_in_browser);

fn text(selector: &str) -> String {
    let doc = web_sys::window().unwrap().document().unwrap();
    doc.query_selector(selector)
        .unwrap()
        .unwrap_or_else(|| panic!("{selector} missing"))
        .text_content()
        .unwrap()
}

#[wasm_bindgen_test]
async fn heartbeat_panel_follows_its_signals() {
    let doc = web_sys::window().unwrap().document().unwrap();
    let host = doc.create_element("div").unwrap().unchecked_into::<web_sys::HtmlElement>();
    doc.body().unwrap().append_child(&host).unwrap();

    let status = RwSignal::new(ConnStatus::Connecting);
    let heartbeat = RwSignal::new(None::<Heartbeat>);
    let mounted = leptos::mount::mount_to(
        host,
        move || view! { <HeartbeatPanel status=status heartbeat=heartbeat /> },
    );

    assert_eq!(text("#conn-status"), "connecting");
    assert_eq!(text("#heartbeat-seq"), "—");

    status.set(ConnStatus::Live);
    heartbeat.set(Some(Heartbeat {
        seq: 42,
        server_time_ms: 1_700_000_000_123,
        version: "0.1.0".into(),
    }));
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
fn utc_time_formatting() {
    assert_eq!(format_utc_time(0), "00:00:00.000");
    assert_eq!(format_utc_time(86_399_999), "23:59:59.999");
    assert_eq!(format_utc_time(-1), "23:59:59.999");
}

fn book(bids: &[(&str, &str)], asks: &[(&str, &str)]) -> OrderBook {
    let lv = |&(p, q): &(&str, &str)| Level::new(Price::parse(p).unwrap(), Qty::parse(q).unwrap());
    let mut b = OrderBook::new();
    b.replace(&bids.iter().map(lv).collect::<Vec<_>>(), &asks.iter().map(lv).collect::<Vec<_>>());
    b
}

/// Paints `ladder` into a fresh book card the way a `BookWidget` does; returns the card.
fn paint(card: &web_sys::Element, badge: &BookBadge, stale: &str, ladder: &DepthLadder) {
    let body = card.first_element_child().unwrap();
    paint_book(&body, 20, &book_text(badge, stale, ladder));
}

fn rows(card: &web_sys::Element, selector: &str) -> Vec<String> {
    let list = card.query_selector_all(selector).unwrap();
    (0..list.length()).map(|i| list.item(i).unwrap().text_content().unwrap()).collect()
}

#[wasm_bindgen_test]
fn ladder_shows_asks_above_bids_with_depth_bars_spread_and_mid() {
    let doc = web_sys::window().unwrap().document().unwrap();
    let card = doc.create_element("section").unwrap();
    card.set_attribute("data-widget", "book-test").unwrap();
    card.set_inner_html("<div class=\"book-body\"></div>");
    doc.body().unwrap().append_child(&card).unwrap();

    let first = book(&[("100", "1"), ("99", "2"), ("98", "3")], &[("101", "4"), ("102.5", "1")]);
    let badge = BookBadge {
        state: BadgeState::Synced,
        update_id: 41,
        gaps: 1,
        resyncs: 2,
        checksum_mismatches: 3,
    };
    paint(&card, &badge, "", &DepthLadder::of(&first, 20));

    // asks worst first, so the best ask is next to the spread row; bids best first; every side
    // keeps 20 rows (empty ones hidden) so the card never changes height
    assert_eq!(rows(&card, ".ladder .ask-row").len(), 20);
    assert_eq!(rows(&card, ".ladder .bid-row").len(), 20);
    assert_eq!(rows(&card, ".ladder .ask-row:not(.empty) .price"), ["102.5", "101"]);
    assert_eq!(rows(&card, ".ladder .ask-row:not(.empty) .cum"), ["5", "4"]);
    assert_eq!(rows(&card, ".ladder .bid-row:not(.empty) .price"), ["100", "99", "98"]);
    assert_eq!(rows(&card, ".ladder .bid-row:not(.empty) .cum"), ["1", "3", "6"]);
    assert_eq!(rows(&card, ".ladder .spread"), ["1"]);
    assert_eq!(rows(&card, ".ladder .mid"), ["100.5"]);
    let bars = card.query_selector_all(".ladder .bid-row:not(.empty) .bar").unwrap();
    let last_bar = bars.item(2).unwrap().unchecked_into::<web_sys::HtmlElement>();
    assert_eq!(last_bar.style().get_property_value("transform").unwrap(), "scaleX(1)");
    let first_bar = bars.item(0).unwrap().unchecked_into::<web_sys::HtmlElement>();
    assert_eq!(first_bar.style().get_property_value("transform").unwrap(), "scaleX(0.166)");
    // the badge and the card's attributes
    assert_eq!(rows(&card, ".badge"), ["synced"]);
    assert_eq!(
        (rows(&card, ".gaps"), rows(&card, ".resyncs"), rows(&card, ".mismatches")),
        (vec!["1".to_string()], vec!["2".to_string()], vec!["3".to_string()])
    );
    assert_eq!(card.get_attribute("data-update-id").as_deref(), Some("41"));
    assert_eq!(card.get_attribute("data-state").as_deref(), Some("synced"));
    assert!(!card.class_list().contains("stale"));

    // the book moves: rows, totals and the middle row follow; a stale flag shows
    let badge = BookBadge { state: BadgeState::Resyncing, update_id: 42, ..badge };
    paint(
        &card,
        &badge,
        "stale 6s",
        &DepthLadder::of(&book(&[("100.25", "2")], &[("100.5", "1")]), 20),
    );
    assert_eq!(rows(&card, ".ladder .ask-row:not(.empty) .price"), ["100.5"]);
    assert_eq!(rows(&card, ".ladder .bid-row:not(.empty) .qty"), ["2"]);
    assert_eq!(rows(&card, ".ladder .spread"), ["0.25"]);
    assert_eq!(rows(&card, ".ladder .mid"), ["100.375"]);
    assert_eq!(rows(&card, ".badge"), ["resyncing"]);
    assert_eq!(rows(&card, ".stale-flag"), ["stale 6s"]);
    assert!(card.class_list().contains("stale"));

    // an empty book shows dashes, not stale numbers
    paint(&card, &badge, "", &DepthLadder::default());
    assert!(
        rows(&card, ".ladder .bid-row:not(.empty)").is_empty()
            && rows(&card, ".ladder .ask-row:not(.empty)").is_empty()
    );
    assert_eq!(rows(&card, ".ladder .mid"), ["—"]);
    card.remove();
}

#[wasm_bindgen_test]
fn bar_scales_are_exact() {
    assert_eq!(bar_scale(0), "0.000");
    assert_eq!(bar_scale(166), "0.166");
    assert_eq!(bar_scale(1000), "1.000");
}

/// The feed hook against a real `millrace serve` (scripts/test starts one and passes its `/ws`
/// address at build time): a widget's subscription delivers pushes while it lives, and cleaning
/// the widget up unsubscribes its stream (pushes stop) while the page's other streams keep going.
#[wasm_bindgen_test]
async fn feed_subscribes_while_a_widget_lives_and_unsubscribes_when_it_goes() {
    use std::cell::Cell;
    use std::rc::Rc;

    use client::depth::sleep_ms;
    use client::feed::{Feed, Handlers};
    use shared::protocol::Stream;

    let Some(url) = option_env!("MILLRACE_TEST_WS") else {
        panic!("build with MILLRACE_TEST_WS=ws://host:port/ws of a running `millrace serve` (scripts/test does)")
    };
    let page = Owner::new();
    page.set();
    let feed = Feed::open_url(url);
    let counter = || Rc::new(Cell::new(0u32));
    let (beats, klines, kline_lives) = (counter(), counter(), counter());
    let count = |c: &Rc<Cell<u32>>| {
        let c = c.clone();
        Box::new(move || c.set(c.get() + 1))
    };
    let (b, k) = (count(&beats), count(&klines));
    feed.subscribe(
        Stream::Heartbeat,
        Handlers {
            on_push: Box::new(move |_| b()),
            on_live: Box::new(|| {}),
            on_lost: Box::new(|| {}),
            on_refused: Box::new(|_| {}),
        },
    );
    let kline: Stream = "kline@sim:spot:BTC/USDT:1m".parse().unwrap();
    let widget = page.child();
    widget.with(|| {
        feed.subscribe(
            kline.clone(),
            Handlers {
                on_push: Box::new(move |_| k()),
                on_live: count(&kline_lives),
                on_lost: Box::new(|| {}),
                on_refused: Box::new(|_| {}),
            },
        )
    });
    assert_eq!(feed.subscribers(&kline), 1);

    let mut waited = 0;
    while (klines.get() < 3 || beats.get() < 1) && waited < 15_000 {
        sleep_ms(100).await;
        waited += 100;
    }
    assert!(
        klines.get() >= 3 && beats.get() >= 1,
        "pushes: {} klines, {} heartbeats in {waited} ms",
        klines.get(),
        beats.get()
    );
    assert_eq!(feed.status().get_untracked(), ConnStatus::Live);
    assert_eq!(kline_lives.get(), 1, "on_live once per connection");

    // the widget goes: UNSUBSCRIBE is sent; once it is through, no kline arrives any more
    widget.cleanup();
    assert_eq!(feed.subscribers(&kline), 0);
    sleep_ms(500).await;
    let (k0, b0) = (klines.get(), beats.get());
    sleep_ms(3_000).await;
    assert_eq!(klines.get(), k0, "klines still pushed after the last subscriber went");
    assert!(
        beats.get() >= b0 + 2,
        "the page's other stream keeps flowing: {} -> {}",
        b0,
        beats.get()
    );
    page.cleanup();
}

/// A stream the server refuses reaches its own widget, with the server's code and message, and
/// holds back none of the page's other streams: both are subscribed before the socket opens, so
/// they go out together (the server refuses a request as a whole).
#[wasm_bindgen_test]
async fn a_refused_stream_reaches_its_widget_and_holds_back_no_other() {
    use std::cell::{Cell, RefCell};
    use std::rc::Rc;

    use client::depth::sleep_ms;
    use client::feed::{Feed, Handlers, StreamRefusal};
    use shared::protocol::{ErrorCode, Stream};

    let Some(url) = option_env!("MILLRACE_TEST_WS") else {
        panic!("build with MILLRACE_TEST_WS=ws://host:port/ws of a running `millrace serve` (scripts/test does)")
    };
    let page = Owner::new();
    page.set();
    let feed = Feed::open_url(url);
    let beats = Rc::new(Cell::new(0u32));
    let b = beats.clone();
    feed.subscribe(Stream::Heartbeat, Handlers::pushes(move |_| b.set(b.get() + 1)));
    let refused: Rc<RefCell<Option<StreamRefusal>>> = Rc::new(RefCell::new(None));
    let (r, lives) = (refused.clone(), Rc::new(Cell::new(0u32)));
    let l = lives.clone();
    let unknown: Stream = "kline@sim:spot:NOPE/USDT:1m".parse().unwrap();
    feed.subscribe(
        unknown,
        Handlers {
            on_push: Box::new(|_| {}),
            on_live: Box::new(move || l.set(l.get() + 1)),
            on_lost: Box::new(|| {}),
            on_refused: Box::new(move |refusal| *r.borrow_mut() = Some(refusal.clone())),
        },
    );
    let mut waited = 0;
    while (refused.borrow().is_none() || beats.get() < 1) && waited < 15_000 {
        sleep_ms(100).await;
        waited += 100;
    }
    let refusal = refused.borrow().clone().expect("the unknown series is refused to its widget");
    assert_eq!(refusal.code, ErrorCode::UnknownSeries, "{refusal:?}");
    assert!(!refusal.msg.is_empty(), "the server's message is passed on");
    assert_eq!(refusal.retry_in, None, "an unknown series is not asked for again");
    assert!(refusal.text().starts_with("unknown_series: "), "{}", refusal.text());
    assert!(beats.get() >= 1, "the heartbeat flows beside the refused stream ({waited} ms)");
    assert_eq!(feed.status().get_untracked(), ConnStatus::Live);
    assert_eq!(lives.get(), 0);
    page.cleanup();
}
