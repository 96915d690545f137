//! The depth channels millrace offers its own clients
//! (seeds/local-order-book-snapshot-delta-sync.md)
//! over real sockets: `depth_update@…` deltas on `/ws`, `depth@…,N` snapshots, and the REST
//! snapshot `GET /fapi/v1/depth?symbol=…&with_id=true`. The producer here is the real
//! `BookPublisher` driven by a random book on a thread, publishing every 100 ms as the depth jobs
//! and engine shards do; the client follows the seed's algorithm with the shared sync machine.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use futures_util::StreamExt;
use shared::book::{Level, OrderBook, Side};
use shared::fixed::{Price, Qty};
use shared::protocol::{BookHealth, BookStatus};
use shared::protocol::{
    DepthUpdateEvent, InstrumentId, Market, PushData, RestDepthResponse, ServerFrame,
};
use shared::sync::{BookSync, ContinuityRule, DepthSnapshot, SyncConfig, SyncEvent};
use shared::testkit::Rng;
use testkit::*;
use tokio_tungstenite::tungstenite::Message;

type History = Arc<Mutex<BTreeMap<u64, (Vec<Level>, Vec<Level>)>>>;

fn inst() -> InstrumentId {
    InstrumentId::new("test", Market::Stock, "TEST1")
}

/// Runs a random, never-crossed book on a thread, publishing every 100 ms; records every
/// published book by update id. Every 17th publish reports the book as resyncing (not published).
fn start_producer(
    server: &TestServer,
    stop: Arc<AtomicBool>,
) -> (History, std::thread::JoinHandle<()>) {
    let books = server.app.books().clone();
    books.set_always_on(&inst());
    let history: History = Arc::default();
    let h = history.clone();
    let handle = std::thread::spawn(move || {
        let mut publisher = books.publisher(&inst(), "test", server::clock::wall_clock_ms());
        let mut rng = Rng::new(11);
        let mut book = OrderBook::new();
        let mut n = 0u64;
        while !stop.load(Ordering::Relaxed) {
            for _ in 0..1 + rng.below(30) {
                let side = if rng.below(2) == 0 { Side::Bid } else { Side::Ask };
                let off = 1 + rng.below(200) as i64;
                let price = Price::from_units(if side == Side::Bid {
                    100_000 - off
                } else {
                    100_000 + off
                });
                let qty = if rng.below(4) == 0 { 0 } else { 1 + rng.below(1000) as i64 };
                book.apply(side, price, Qty::from_units(qty));
            }
            n += 1;
            let health = if n % 17 == 0 { BookHealth::Resyncing } else { BookHealth::Synced };
            if publisher.publish(
                &book,
                BookStatus { health, ..BookStatus::default() },
                server::clock::wall_clock_ms(),
            ) {
                let (published, _) = books.snapshot(&inst()).unwrap();
                h.lock().unwrap().insert(published.id, book.top(5000));
            }
            std::thread::sleep(Duration::from_millis(100));
        }
    });
    (history, handle)
}

/// The book published with update id `id` (the producer records it just after publishing, so a
/// client may see the push first).
async fn published_at(history: &History, id: u64) -> (Vec<Level>, Vec<Level>) {
    for _ in 0..100 {
        if let Some(book) = history.lock().unwrap().get(&id).cloned() {
            return book;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    panic!("update id {id} was never published");
}

/// The next frame on `ws` if it is a push (`None` for anything else); fails if nothing arrives
/// for 2 s.
async fn next_push(ws: &mut Ws) -> Option<shared::protocol::Push<shared::protocol::PushData>> {
    let msg = tokio::time::timeout(Duration::from_secs(2), ws.next())
        .await
        .expect("pushes keep coming")
        .unwrap()
        .unwrap();
    let Message::Text(text) = msg else { return None };
    match serde_json::from_str(&text).unwrap() {
        ServerFrame::Push(push) => Some(push),
        _ => None,
    }
}

/// Applies a delta; the machine must see neither a gap nor a checksum mismatch.
fn apply_without_gap(client: &mut BookSync, ev: &DepthUpdateEvent) {
    client.handle_delta(ev.into(), 0);
    while let Some(e) = client.poll_event() {
        assert!(
            !matches!(e, SyncEvent::GapDetected { .. } | SyncEvent::ChecksumMismatch { .. }),
            "{e:?}"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_seed_client_over_ws_and_rest_stays_equal_to_the_published_book() {
    let server = TestServer::start(test_config(vec![embedded_sim_source(1.0)])).await;
    let stop = Arc::new(AtomicBool::new(false));
    let (history, producer) = start_producer(&server, stop.clone());
    tokio::time::sleep(Duration::from_millis(500)).await;

    let name = format!("depth_update@{}", inst());
    let snap_name = format!("depth@{},20", inst());
    let mut ws = server.ws().await;
    // step 1: subscribe and buffer
    assert!(request(&mut ws, "SUBSCRIBE", &[&name, &snap_name], 1).await.is_ok());
    // step 2-4: the REST snapshot
    let path = format!("/fapi/v1/depth?symbol={}&with_id=true", inst());
    let body: RestDepthResponse = serde_json::from_value(server.get_json(&path).await).unwrap();
    assert_eq!(body.code, 0);
    let mut config = SyncConfig::new(ContinuityRule::Spot);
    config.verify_interval_ms = None;
    let mut client = BookSync::new(config);
    client.handle_snapshot(DepthSnapshot::from(&body.data), 0);

    let (mut deltas, mut checked, mut snapshots) = (0, 0, 0);
    let deadline = Instant::now() + Duration::from_secs(4);
    while Instant::now() < deadline {
        let Some(push) = next_push(&mut ws).await else { continue };
        if push.stream.to_string() == name {
            let PushData::DepthUpdate(ev) = push.data else { panic!("{}", push.stream) };
            deltas += 1;
            apply_without_gap(&mut client, &ev);
            if client.is_synced() {
                let expected = published_at(&history, client.last_update_id()).await;
                assert_eq!(
                    client.book().top(5000),
                    expected,
                    "book at id {}",
                    client.last_update_id()
                );
                checked += 1;
            }
        } else {
            let PushData::Depth(ev) = push.data else { panic!("{}", push.stream) };
            assert_eq!(ev.bids.len(), 20);
            let expected = published_at(&history, ev.u).await;
            assert_eq!(ev.bids, expected.0[..20]);
            assert_eq!(ev.asks, expected.1[..20]);
            snapshots += 1;
        }
    }
    assert!(deltas >= 25 && checked >= 25, "deltas {deltas}, checked {checked}");
    assert!(snapshots >= 12, "depth@…,20 every 200 ms: {snapshots}");

    let books = server.get_json("/api/v1/ops/books").await;
    let row = books["books"]
        .as_array()
        .unwrap()
        .iter()
        .find(|b| b["instrument"] == inst().to_string())
        .unwrap();
    assert_eq!(row["source"], "test");
    assert!(row["deltas"].as_u64().unwrap() >= 25);

    // limit and bad input
    let (status, body) = server.get(&format!("/fapi/v1/depth?symbol={}&limit=5", inst())).await;
    assert_eq!(status, 200);
    let r: RestDepthResponse = serde_json::from_str(&body).unwrap();
    assert_eq!((r.data.bids.len(), r.data.asks.len()), (5, 5));
    for bad in [
        "symbol=nonsense",
        "symbol=test:stock:TEST1&limit=0",
        "symbol=test:stock:TEST1&limit=x",
        "limit=5",
    ] {
        assert_eq!(server.get(&format!("/fapi/v1/depth?{bad}")).await.0, 400, "{bad}");
    }
    assert_eq!(server.get("/fapi/v1/depth?symbol=test:stock:NOPE").await.0, 404);
    // a book nobody produces cannot be subscribed to
    let r = request(&mut ws, "SUBSCRIBE", &["depth_update@test:stock:NOPE"], 2).await;
    assert!(!r.is_ok());

    stop.store(true, Ordering::Relaxed);
    producer.join().unwrap();
    server.stop().await;
}

/// Seed 002, step 2a: instead of the REST snapshot, the first push of `depth@…,20` is the
/// snapshot. With `depth_update@…` subscribed first and buffered (step 1), its update id bridges
/// the delta stream (steps 5-7): no gap, and the book the client builds holds only levels the
/// publisher really has, with their quantities, and its top levels equal the published book.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_snapshot_from_the_first_depth_push_bridges_the_delta_stream() {
    let server = TestServer::start(test_config(vec![embedded_sim_source(1.0)])).await;
    let stop = Arc::new(AtomicBool::new(false));
    let (history, producer) = start_producer(&server, stop.clone());
    tokio::time::sleep(Duration::from_millis(500)).await;

    let name = format!("depth_update@{}", inst());
    let snap_name = format!("depth@{},20", inst());
    let mut ws = server.ws().await;
    assert!(request(&mut ws, "SUBSCRIBE", &[&name], 1).await.is_ok()); // step 1
    assert!(request(&mut ws, "SUBSCRIBE", &[&snap_name], 2).await.is_ok()); // step 2a
    let mut config = SyncConfig::new(ContinuityRule::Spot);
    config.verify_interval_ms = None;
    let mut client = BookSync::new(config);
    let (mut snapshot_at, mut checked, mut top_checked) = (None, 0, false);
    let deadline = Instant::now() + Duration::from_secs(4);
    while Instant::now() < deadline {
        let Some(push) = next_push(&mut ws).await else { continue };
        if push.stream.to_string() == snap_name {
            if snapshot_at.is_none() {
                // the first push is the snapshot (steps 3-4); later ones are not needed
                let PushData::Depth(ev) = push.data else { panic!("{}", push.stream) };
                snapshot_at = Some(ev.u);
                client.handle_snapshot((&ev).into(), 0);
            }
            continue;
        }
        let PushData::DepthUpdate(ev) = push.data else { panic!("{}", push.stream) };
        apply_without_gap(&mut client, &ev);
        if !client.is_synced() {
            continue;
        }
        let (bids, asks) = published_at(&history, client.last_update_id()).await;
        let (mine_bids, mine_asks) = client.book().top(5000);
        for (mine, theirs) in [(&mine_bids, &bids), (&mine_asks, &asks)] {
            for level in mine.iter() {
                assert!(theirs.contains(level), "{level:?} is not in the published book");
            }
        }
        if !top_checked {
            assert_eq!(mine_bids[..5], bids[..5], "top bids at the first synced id");
            assert_eq!(mine_asks[..5], asks[..5], "top asks at the first synced id");
            top_checked = true;
        }
        checked += 1;
    }
    assert!(snapshot_at.is_some(), "a depth@ push arrived");
    assert!(checked >= 20, "the bridged book was checked {checked} times");
    stop.store(true, Ordering::Relaxed);
    producer.join().unwrap();
    server.stop().await;
}
