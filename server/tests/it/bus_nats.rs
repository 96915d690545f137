//! The NATS bus on the machine's real NATS: a frame published in one process's bus reaches the
//! subscribers of another (two buses, two connections, one prefix), topics with NATS's special
//! characters stay apart, other prefixes hear nothing, and a dropped subscription is left.

use std::time::{Duration, Instant};

use bytes::Bytes;
use server::bus::nats::Publisher;
use server::bus::{Bus, NatsBus, Subscription};
use server::shutdown::Shutdown;

fn nats_url() -> String {
    std::env::var("MILLRACE_TEST_NATS").unwrap_or_else(|_| "nats://127.0.0.1:4222".into())
}

async fn bus(prefix: &str, stop: &Shutdown) -> NatsBus {
    bus_of(prefix, 64, stop).await
}

/// A bus whose local subscribers each hold up to `capacity` frames.
async fn bus_of(prefix: &str, capacity: usize, stop: &Shutdown) -> NatsBus {
    let client = async_nats::connect(nats_url()).await.expect("NATS (run scripts/services)");
    NatsBus::new(client, prefix, Publisher::Gateway, capacity, stop)
}

/// Publishes `payload` on `from` until `sub` receives it (the subscription reaches the server
/// asynchronously), then returns what was received.
async fn first(
    from: &NatsBus,
    topic: &str,
    payload: &'static str,
    sub: &mut Subscription,
) -> Bytes {
    let t0 = Instant::now();
    loop {
        from.publish(topic, Bytes::from_static(payload.as_bytes()));
        if let Ok(Ok(m)) = tokio::time::timeout(Duration::from_millis(100), sub.recv()).await {
            return m.payload;
        }
        assert!(t0.elapsed() < Duration::from_secs(5), "nothing received on {topic}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn frames_cross_processes_by_topic_and_prefix() {
    let stop = Shutdown::new();
    let prefix = format!("tbus{}", std::process::id());
    let (a, b) = (bus(&prefix, &stop).await, bus(&prefix, &stop).await);
    let other = bus(&format!("{prefix}x"), &stop).await;
    // (any topic but the kline ones, which are de-duplicated, and the local book topics)
    let t1 = "ticker@sim:spot:BTC/USDT";
    let t2 = "ticker@sim:spot:BTC.X/USDT"; // a dot: must not become a second subject token
    let mut s1 = b.subscribe(t1);
    let mut s2 = b.subscribe(t2);
    let mut elsewhere = other.subscribe(t1);
    assert_eq!(&first(&a, t1, "one", &mut s1).await[..], b"one");
    assert_eq!(&first(&a, t2, "two", &mut s2).await[..], b"two");
    // in order, and nothing of t2 on t1
    for i in 0..50 {
        a.publish(t1, Bytes::from(format!("n{i}")));
    }
    let mut got = Vec::new();
    while got.len() < 50 {
        let m = tokio::time::timeout(Duration::from_secs(2), s1.recv()).await.unwrap().unwrap();
        if m.payload.starts_with(b"n") {
            got.push(String::from_utf8(m.payload.to_vec()).unwrap());
        }
    }
    assert_eq!(got, (0..50).map(|i| format!("n{i}")).collect::<Vec<_>>());
    while let Ok(Some(m)) = s2.try_recv() {
        assert!(m.payload.starts_with(b"two"), "{:?}", m.payload);
    }
    // another prefix hears nothing
    assert!(tokio::time::timeout(Duration::from_millis(300), elsewhere.recv()).await.is_err());
    // a process's books and heartbeat stay in it
    for local in ["depth_update@sim:spot:BTC/USDT", "depth@sim:spot:BTC/USDT,20", "heartbeat"] {
        let mut there = b.subscribe(local);
        let mut here = a.subscribe(local);
        assert_eq!(a.publish(local, Bytes::from_static(b"mine")), 1, "{local}: delivered here");
        assert_eq!(&here.recv().await.unwrap().payload[..], b"mine");
        let crossed = tokio::time::timeout(Duration::from_millis(300), there.recv()).await;
        assert!(crossed.is_err(), "{local} crossed to another process");
    }
    assert!(b.stats().received.load(std::sync::atomic::Ordering::Relaxed) >= 52);
    assert_eq!(a.stats().dropped.load(std::sync::atomic::Ordering::Relaxed), 0);
    assert!(a.connected() && b.connected());
    stop.stop();
    assert!(stop.stopped(Duration::from_secs(5)).await, "a bus task did not stop");
}

/// A kline push frame of `sim:spot:BTC/USDT:1m`.
fn kline(open: i64, event: i64, closed: bool) -> Bytes {
    let series: shared::protocol::SeriesId = "sim:spot:BTC/USDT:1m".parse().unwrap();
    let p = shared::fixed::Price(100);
    let c = shared::candle::Candle::one_minute(open, p, p, p, p, shared::fixed::Volume(1), 1);
    server::candles::writer::kline_frame(&series, &c, closed, event)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kline_pushes_of_two_replicas_arrive_once_and_in_order() {
    let stop = Shutdown::new();
    let prefix = format!("tbusk{}", std::process::id());
    let (a, b, gateway) =
        (bus(&prefix, &stop).await, bus(&prefix, &stop).await, bus(&prefix, &stop).await);
    let topic = "kline@sim:spot:BTC/USDT:1m";
    let mut sub = gateway.subscribe(topic);
    tokio::time::sleep(Duration::from_millis(200)).await; // the NATS subscription is up
                                                          // Replica a sends forming updates 1, 3 and the close; then replica b (slower) 2, 3 and the
                                                          // close: all of b's are old or already seen.
    let mut got = Vec::new();
    for (bus, events) in [(&a, [1, 3]), (&b, [2, 3])] {
        for e in events {
            bus.publish(topic, kline(0, e, false));
        }
        bus.publish(topic, kline(0, 60_000, true));
        while let Ok(Ok(m)) = tokio::time::timeout(Duration::from_millis(500), sub.recv()).await {
            let push: shared::protocol::Push<shared::protocol::KlineEvent> =
                serde_json::from_slice(&m.payload).unwrap();
            got.push((push.data.event_time, push.data.k.x));
        }
    }
    assert_eq!(got, vec![(1, false), (3, false), (60_000, true)], "each once, never older");
    let dups = gateway.stats().duplicates.load(std::sync::atomic::Ordering::Relaxed);
    assert_eq!(dups, 3, "b's 2 and 3 and its close were dropped");
    stop.stop();
    assert!(stop.stopped(Duration::from_secs(5)).await);
}

/// A worker publishes on its own side of the bus: its forming candles reach a gateway's
/// subscribers, a closed candle does not (only the persister pushes closed candles, after
/// storing them).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_closed_candle_from_a_workers_side_reaches_no_subscriber() {
    let stop = Shutdown::new();
    let prefix = format!("tbusw{}", std::process::id());
    let client = async_nats::connect(nats_url()).await.unwrap();
    let worker = NatsBus::new(client, &prefix, Publisher::Worker, 64, &stop);
    let gateway = bus(&prefix, &stop).await;
    let topic = "kline@sim:spot:BTC/USDT:1m";
    let mut sub = gateway.subscribe(topic);
    tokio::time::sleep(Duration::from_millis(200)).await; // the NATS subscription is up
    worker.publish(topic, kline(0, 1, false));
    worker.publish(topic, kline(0, 60_000, true));
    worker.publish(topic, kline(60_000, 60_001, false));
    let mut got = Vec::new();
    while let Ok(Ok(m)) = tokio::time::timeout(Duration::from_millis(500), sub.recv()).await {
        let push: shared::protocol::Push<shared::protocol::KlineEvent> =
            serde_json::from_slice(&m.payload).unwrap();
        got.push((push.data.event_time, push.data.k.x));
    }
    assert_eq!(got, vec![(1, false), (60_001, false)], "the forming candles only");
    assert_eq!(gateway.stats().refused.load(std::sync::atomic::Ordering::Relaxed), 1);
    stop.stop();
    assert!(stop.stopped(Duration::from_secs(5)).await);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn frames_published_together_arrive_one_by_one_in_order_and_once() {
    let stop = Shutdown::new();
    let prefix = format!("tbusb{}", std::process::id());
    // (the gateway's subscribers with the default queue: 1,024 frames)
    let (a, b, gateway) =
        (bus(&prefix, &stop).await, bus(&prefix, &stop).await, bus_of(&prefix, 1024, &stop).await);
    let topic = "kline@sim:spot:BTC/USDT:1m";
    let mut sub = gateway.subscribe(topic);
    tokio::time::sleep(Duration::from_millis(200)).await; // the NATS subscription is up
                                                          // A persister's round: 5,000 closed minutes of one series at once (packed into a few NATS
                                                          // messages); then the same again (a redelivered round): each reaches the subscriber once.
    let round: Vec<Bytes> =
        (0..5_000).map(|i| kline(i * 60_000, i * 60_000 + 60_000, true)).collect();
    a.publish_all(topic, round.clone());
    b.publish_all(topic, round.clone());
    let mut got = Vec::new();
    while let Ok(Ok(m)) = tokio::time::timeout(Duration::from_millis(500), sub.recv()).await {
        got.push(m.payload);
    }
    assert_eq!(got.len(), round.len(), "each frame once");
    assert!(got == round, "in order");
    let stats = gateway.stats();
    assert_eq!(stats.duplicates.load(std::sync::atomic::Ordering::Relaxed), 5_000);
    let received = stats.received.load(std::sync::atomic::Ordering::Relaxed);
    assert!(received < 100, "{received} NATS messages for 10,000 frames");
    stop.stop();
    assert!(stop.stopped(Duration::from_secs(5)).await);
}
