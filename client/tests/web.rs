//! Browser tests of the dashboard's components: mount, change signals, assert on the DOM.
//! Run by scripts/test with `wasm-pack test --headless --chrome client`.

use client::{backoff_ms, format_utc_time, ConnStatus, HeartbeatPanel};
use leptos::prelude::*;
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
