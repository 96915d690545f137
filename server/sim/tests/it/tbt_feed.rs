//! The simulator's tick-by-tick feed over real sockets, through millrace's own client
//! (`tbt::feed`): the symbol list, the seed's hot spot (a stock's rate x2000, measured on the
//! wire), dropped events seen as a sequence gap and filled by re-requesting them (`/tbt/replay`),
//! after which a book rebuilt from the wire equals the simulator's true book; bad control input is
//! refused.

use std::collections::HashMap;
use std::time::{Duration, Instant};

use crate::start_sim;
use shared::l3::{L3Book, SeqPolicy};
use tbt::feed::{FeedConfig, FeedItem, TbtFeed};
use tbt::{Control, FeedEvent};

/// Events per symbol name received within `window`.
async fn count_for(
    rx: &mut tokio::sync::mpsc::Receiver<FeedItem>,
    names: &HashMap<u32, String>,
    window: Duration,
) -> HashMap<String, u64> {
    let mut counts = HashMap::new();
    let end = tokio::time::Instant::now() + window;
    while let Ok(Some(item)) = tokio::time::timeout_at(end, rx.recv()).await {
        if let FeedItem::Events(evs) = item {
            for e in evs {
                *counts.entry(names[&e.symbol].clone()).or_insert(0) += 1;
            }
        }
    }
    counts
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hot_spots_gaps_and_re_requests_over_the_wire() {
    let sim = start_sim(1.0, 5).await;
    let tbt = sim.tbt();
    let (feed, mut rx, task) = TbtFeed::new(FeedConfig {
        control_token: Some(crate::CONTROL_TOKEN.into()),
        ..FeedConfig::new(sim.rest_base())
    });
    let task = tokio::spawn(task);
    let symbols =
        match tokio::time::timeout(Duration::from_secs(10), rx.recv()).await.unwrap().unwrap() {
            FeedItem::Connected(s) => s,
            other => panic!("first item: {other:?}"),
        };
    assert_eq!(symbols.len(), 40, "the seed's 40 stocks");
    assert_eq!(symbols[0].symbol, "600000");
    assert_eq!(symbols[1].symbol, "000001");
    let names: HashMap<u32, String> = symbols.iter().map(|s| (s.idx, s.symbol.clone())).collect();

    // hot spot: ~x2000 on the wire
    let quiet = count_for(&mut rx, &names, Duration::from_secs(2)).await;
    feed.rest().control(&Control::Hotspot { symbol: "600002".into(), hot: true }).await.unwrap();
    count_for(&mut rx, &names, Duration::from_millis(300)).await;
    let hot = count_for(&mut rx, &names, Duration::from_secs(2)).await;
    feed.rest().control(&Control::Hotspot { symbol: "600002".into(), hot: false }).await.unwrap();
    let (q, h) = (quiet.get("600002").copied().unwrap_or(0).max(1), hot["600002"]);
    assert!(h > 500 * q, "hot spot raised 600002 from {q} to {h} events in 2 s");
    let cold = hot.get("000001").copied().unwrap_or(0);
    assert!(cold < 200, "a cold stock stays cold: {cold}");
    let status = feed.rest().status().await.unwrap();
    assert!(status.symbols.iter().all(|s| !s.hot));

    // A book for 000003 from its snapshot, then the wire; drop 5 of its events: a gap, which
    // the re-requested events fill.
    count_for(&mut rx, &names, Duration::from_millis(500)).await; // let the hot burst drain
    let snap = feed.snapshot("000003").await.unwrap();
    let mut book = L3Book::new(snap.venue).with_seq_policy(SeqPolicy::Contiguous);
    book.restore(snap.orders.clone(), &snap.channel_last_seq);
    tbt.drop_events("000003", 5).unwrap();
    let mut gaps = 0;
    let deadline = Instant::now() + Duration::from_secs(20);
    while gaps == 0
        || tbt.status().symbols.iter().find(|s| s.symbol == "000003").unwrap().dropping > 0
    {
        assert!(Instant::now() < deadline, "no gap seen");
        let Some(FeedItem::Events(evs)) = rx.recv().await else { continue };
        for e in evs.iter().filter(|e| names[&e.symbol] == "000003") {
            match book.handle(e.channel, e.seq, e.msg) {
                Ok(_) => {}
                Err(gap) => {
                    gaps += 1;
                    let missing: Vec<FeedEvent> =
                        feed.replay("000003", gap.expected, gap.got - 1).await.unwrap();
                    assert_eq!(
                        missing.len() as u64,
                        gap.got - gap.expected,
                        "the re-request covers the gap"
                    );
                    for m in missing {
                        book.handle(m.channel, m.seq, m.msg).unwrap();
                    }
                    book.handle(e.channel, e.seq, e.msg).unwrap();
                }
            }
        }
    }
    assert_eq!(gaps, 1);
    // checkpoint: pause, drain, compare with the simulator's true book
    tbt.pause(true);
    let end = tokio::time::Instant::now() + Duration::from_millis(800);
    while let Ok(Some(item)) = tokio::time::timeout_at(end, rx.recv()).await {
        if let FeedItem::Events(evs) = item {
            for e in evs.iter().filter(|e| names[&e.symbol] == "000003") {
                book.handle(e.channel, e.seq, e.msg).unwrap();
            }
        }
    }
    let truth = tbt.book("000003", 5000).unwrap();
    assert_eq!(book.sequencer(snap.channel_last_seq[0].0).and_then(|s| s.last()), Some(truth.seq));
    assert_eq!(book.top(5000), (truth.bids, truth.asks));
    assert!(!book.is_stale());

    // bad control input is refused, nothing changes
    for bad in [r#"{"hotspot":{"symbol":"999999","hot":true}}"#, r#"{"pause":"yes"}"#, "not json"] {
        let status = reqwest::Client::new()
            .post(format!("{}/tbt/control", sim.rest_base()))
            .bearer_auth(crate::CONTROL_TOKEN)
            .header("Content-Type", "application/json")
            .body(bad)
            .send()
            .await
            .unwrap()
            .status()
            .as_u16();
        assert!((400..500).contains(&status), "{bad}: {status}");
    }
    assert!(tbt.is_paused());
    task.abort();
    drop(feed);
    sim.shutdown();
}
