use super::*;
use crate::bus::{Bus, InProcessBus, Subscription};
use shared::book::{Level, Side};
use shared::fixed::{Price, Qty};
use shared::protocol::Market;
use shared::protocol::{DepthSnapshotEvent, DepthUpdateEvent, Stream};
use shared::sync::{BookSync, ContinuityRule, DepthSnapshot, SyncConfig};
use shared::testkit::{mutate_book, Rng};

fn inst() -> InstrumentId {
    InstrumentId::new("sim", Market::Spot, "BTC/USDT")
}

fn synced() -> BookStatus {
    BookStatus { health: BookHealth::Synced, ..BookStatus::default() }
}

fn drain(sub: &mut Subscription) -> Vec<serde_json::Value> {
    let mut out = Vec::new();
    loop {
        match sub.try_recv() {
            Ok(Some(m)) => out.push(serde_json::from_slice(&m.payload).unwrap()),
            Ok(None) => return out,
            Err(e) => panic!("bus: {e:?}"),
        }
    }
}

/// A client following the seed's algorithm (the shared sync machine with the spot rule, fed the
/// REST snapshot and the pushed deltas) holds exactly the producer's book after every publish,
/// through unhealthy periods, crossed books and a producer restart.
#[test]
fn a_client_synced_from_rest_and_deltas_equals_the_producer() {
    let bus: Arc<dyn Bus> = Arc::new(InProcessBus::new(4096));
    let reg = BookRegistry::new(bus.clone());
    let mut sub = bus.subscribe(&Stream::DepthUpdate(inst()).to_string());
    let mut publisher = reg.publisher(&inst(), "test", 1_700_000_000_000);
    let mut rng = Rng::new(42);
    let mut book = OrderBook::new();
    let mut now = 1_700_000_000_000i64;

    // the producer runs a while before the client arrives
    for _ in 0..20 {
        mutate_book(&mut book, &mut rng);
        now += 100;
        publisher.publish(&book, synced(), now);
    }
    drain(&mut sub);
    let mut config = SyncConfig::new(ContinuityRule::Spot);
    config.verify_interval_ms = None;
    let mut client = BookSync::new(config);
    let (rest, health) = reg.rest_depth(&inst(), 1000).unwrap();
    assert_eq!(health, BookHealth::Synced);
    client.handle_snapshot(DepthSnapshot::from(&rest), now);

    let mut last_u = rest.id;
    for step in 0..2000 {
        mutate_book(&mut book, &mut rng);
        now += 100;
        let health = match step % 97 {
            0..=4 => BookHealth::Resyncing,
            5 => BookHealth::Stale,
            _ => BookHealth::Synced,
        };
        if step == 700 {
            // the job restarts: a new publisher continues the ids from the registry
            drop(publisher);
            publisher = reg.publisher(&inst(), "test", now);
        }
        let mut shown = book.clone();
        if step % 151 == 0 {
            // a crossed book is never published
            shown.apply(Side::Bid, Price::from_units(2000), Qty::from_units(1));
        }
        publisher.publish(&shown, BookStatus { health, ..synced() }, now);
        for push in drain(&mut sub) {
            let ev: DepthUpdateEvent = serde_json::from_value(push["data"].clone()).unwrap();
            assert!(ev.u > last_u, "ids strictly increase");
            assert_eq!(ev.pu, last_u);
            last_u = ev.u;
            client.handle_delta((&ev).into(), now);
        }
        // synced from the first bridging delta on (the seed's step 5)
        assert!(last_u == rest.id || client.is_synced(), "step {step}: {:?}", client.state());
        while let Some(e) = client.poll_event() {
            assert!(
                !matches!(
                    e,
                    shared::sync::SyncEvent::ChecksumMismatch { .. }
                        | shared::sync::SyncEvent::GapDetected { .. }
                ),
                "step {step}: {e:?}"
            );
        }
        let published = step % 97 > 5 && step % 151 != 0 && last_u > rest.id;
        if published {
            assert_eq!(client.book().top(1000), book.top(1000), "step {step}");
            let (rest, health) = reg.rest_depth(&inst(), 1000).unwrap();
            assert_eq!(health, BookHealth::Synced);
            assert_eq!(rest.id, last_u);
            assert_eq!((rest.bids, rest.asks), book.top(1000));
        }
    }
    let info = &reg.list()[0];
    assert!(info.crossed_skipped > 0);
    assert!(info.deltas > 1000);
}

#[test]
fn a_retired_publisher_cannot_publish_and_ids_survive_restarts() {
    let bus: Arc<dyn Bus> = Arc::new(InProcessBus::new(64));
    let reg = BookRegistry::new(bus.clone());
    let mut sub = bus.subscribe(&Stream::DepthUpdate(inst()).to_string());
    let mut old = reg.publisher(&inst(), "a", 1_000);
    let mut book = OrderBook::new();
    book.apply(Side::Bid, Price::from_units(5), Qty::from_units(1));
    assert!(old.publish(&book, synced(), 1_100));
    let first: DepthUpdateEvent =
        serde_json::from_value(drain(&mut sub).remove(0)["data"].clone()).unwrap();
    assert_eq!(first.u, 1_000 * 1000 + 1);

    let mut new = reg.publisher(&inst(), "b", 0);
    book.apply(Side::Bid, Price::from_units(6), Qty::from_units(1));
    assert!(!old.publish(&book, synced(), 1_200), "the retired publisher is inert");
    assert!(drain(&mut sub).is_empty());
    drop(old); // dropping the retired one does not mark the book inactive
    assert!(reg.list()[0].active);
    assert!(new.publish(&book, synced(), 1_300));
    let next: DepthUpdateEvent =
        serde_json::from_value(drain(&mut sub).remove(0)["data"].clone()).unwrap();
    assert_eq!(next.pu, first.u);
    assert_eq!(next.u, first.u + 1);
    // the new publisher diffed against what was published, so only the new level is sent
    assert_eq!(next.b, vec![Level::new(Price::from_units(6), Qty::from_units(1))]);
    drop(new);
    let (_, health) = reg.snapshot(&inst()).unwrap();
    assert_eq!(health, BookHealth::Stale, "no producer: the REST book is stale");
}

#[test]
fn snapshots_go_only_to_subscribed_sizes_every_200_ms() {
    let bus: Arc<dyn Bus> = Arc::new(InProcessBus::new(64));
    let reg = BookRegistry::new(bus.clone());
    let mut sub20 = bus.subscribe(&Stream::Depth { instrument: inst(), levels: 20 }.to_string());
    let mut publisher = reg.publisher(&inst(), "a", 0);
    let mut book = OrderBook::new();
    for i in 1..=30 {
        book.apply(Side::Bid, Price::from_units(100 - i), Qty::from_units(i));
        book.apply(Side::Ask, Price::from_units(100 + i), Qty::from_units(i));
    }
    for t in (0..1000).step_by(100) {
        publisher.publish(&book, synced(), 10_000 + t);
    }
    let snaps = drain(&mut sub20);
    assert_eq!(snaps.len(), 5, "every 200 ms over 1 s");
    let ev: DepthSnapshotEvent = serde_json::from_value(snaps[4]["data"].clone()).unwrap();
    assert_eq!(ev.bids.len(), 20);
    assert_eq!(ev.bids[0], Level::new(Price::from_units(99), Qty::from_units(1)));
    assert_eq!(ev.u, reg.snapshot(&inst()).unwrap().0.id);
    assert_eq!(snaps[0]["stream"], "depth@sim:spot:BTC/USDT,20");
}

/// The published book is refilled in place at each publish, unless a reader still holds it: that
/// reader keeps what it took, and the next reader sees the new book.
#[test]
fn a_publish_refills_the_published_book_unless_a_reader_holds_it() {
    let bus: Arc<dyn Bus> = Arc::new(InProcessBus::new(64));
    let reg = BookRegistry::new(bus);
    let mut publisher = reg.publisher(&inst(), "test", 1_700_000_000_000);
    let mut rng = Rng::new(7);
    let mut book = OrderBook::new();
    let mut now = 1_700_000_000_000i64;
    let mut publish = |book: &mut OrderBook, rng: &mut Rng| loop {
        mutate_book(book, rng);
        now += 100;
        if publisher.publish(book, synced(), now) {
            return;
        }
    };
    let levels = |book: &OrderBook| {
        (book.bids.iter().collect::<Vec<_>>(), book.asks.iter().collect::<Vec<_>>())
    };
    publish(&mut book, &mut rng);
    let (first, _) = reg.snapshot(&inst()).unwrap();
    assert_eq!((first.bids.clone(), first.asks.clone()), levels(&book));
    let at = Arc::as_ptr(&first);
    drop(first);
    publish(&mut book, &mut rng);
    let (held, _) = reg.snapshot(&inst()).unwrap();
    assert_eq!(Arc::as_ptr(&held), at, "no reader held it: refilled in place");
    assert_eq!((held.bids.clone(), held.asks.clone()), levels(&book));
    let kept = (held.id, held.bids.clone(), held.asks.clone());
    publish(&mut book, &mut rng);
    assert_eq!((held.id, held.bids.clone(), held.asks.clone()), kept, "a reader's copy stays");
    let (next, _) = reg.snapshot(&inst()).unwrap();
    assert_ne!(Arc::as_ptr(&next), at);
    assert!(next.id > held.id);
    assert_eq!((next.bids.clone(), next.asks.clone()), levels(&book));
}
