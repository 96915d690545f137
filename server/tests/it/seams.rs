//! The service's seams are real: it runs unchanged on a second bus and a second store (here
//! recording wrappers of the in-process bus and of SQLite), and its order of work is observable
//! through them — every closed candle reaches the bus only after the store committed it. And a
//! stopped service leaves no task behind.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use server::app::Backends;
use server::bus::{Bus, InProcessBus, Subscription};
use server::store::sqlite::SqliteStore;
use server::store::{
    BackfillProgress, BackfillStore, CandleStore, SeriesInfo, SeriesRows, StoreError,
};
use shared::candle::Candle;
use shared::protocol::{KlineEvent, Push, SeriesId};
use testkit::*;

/// One event of the shared log: a commit of 1m candles, or a publish.
#[derive(Debug, Clone)]
enum Event {
    /// 1m open times committed by one store write.
    Committed(Vec<i64>),
    Published {
        topic: String,
        payload: Bytes,
    },
}

#[derive(Default)]
struct Log {
    events: Mutex<Vec<Event>>,
    publishes: AtomicU64,
    writes: AtomicU64,
}

/// A bus that records every publish, then hands it to the in-process bus.
struct RecordingBus {
    inner: InProcessBus,
    log: Arc<Log>,
}

impl Bus for RecordingBus {
    fn publish(&self, topic: &str, payload: Bytes) -> usize {
        self.log.publishes.fetch_add(1, Ordering::Relaxed);
        self.log
            .events
            .lock()
            .unwrap()
            .push(Event::Published { topic: topic.to_string(), payload: payload.clone() });
        self.inner.publish(topic, payload)
    }

    fn subscribe(&self, topic: &str) -> Subscription {
        self.inner.subscribe(topic)
    }

    fn has_subscribers(&self, topic: &str) -> bool {
        self.inner.has_subscribers(topic)
    }
}

/// A store that records every committed write of 1m candles, storing through SQLite.
struct RecordingStore {
    inner: SqliteStore,
    log: Arc<Log>,
}

impl RecordingStore {
    fn record(&self, batch: &[SeriesRows<'_>]) {
        self.log.writes.fetch_add(1, Ordering::Relaxed);
        let minutes: Vec<i64> = batch
            .iter()
            .filter(|r| r.series.timeframe == shared::candle::Timeframe::M1)
            .flat_map(|r| r.candles.iter().map(|c| c.open_time))
            .collect();
        self.log.events.lock().unwrap().push(Event::Committed(minutes));
    }
}

impl CandleStore for RecordingStore {
    fn write(&self, batch: &[SeriesRows<'_>]) -> Result<usize, StoreError> {
        let n = self.inner.write(batch)?;
        self.record(batch);
        Ok(n)
    }

    fn candles(
        &self,
        series: &SeriesId,
        start: Option<i64>,
        end: Option<i64>,
        limit: usize,
    ) -> Result<Vec<Candle>, StoreError> {
        self.inner.candles(series, start, end, limit)
    }

    fn last_open_time(&self, series: &SeriesId) -> Result<Option<i64>, StoreError> {
        self.inner.last_open_time(series)
    }

    fn series(&self) -> Result<Vec<SeriesInfo>, StoreError> {
        self.inner.series()
    }
}

impl BackfillStore for RecordingStore {
    fn backfill_progress(&self, task: &str) -> Result<Option<BackfillProgress>, StoreError> {
        self.inner.backfill_progress(task)
    }

    fn save_backfill_progress(&self, progress: &BackfillProgress) -> Result<(), StoreError> {
        self.inner.save_backfill_progress(progress)
    }

    fn write_with_progress(
        &self,
        batch: &[SeriesRows<'_>],
        progress: &BackfillProgress,
    ) -> Result<usize, StoreError> {
        let n = self.inner.write_with_progress(batch, progress)?;
        self.record(batch);
        Ok(n)
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_service_runs_on_a_second_bus_and_store_and_publishes_after_persisting() {
    let log = Arc::new(Log::default());
    let mut config = test_config(vec![embedded_sim_source(60.0)]);
    config.ingest.pinned = vec!["sim:spot:BTC/USDT".into()];
    config.depth.pinned = vec!["sim:spot:BTC/USDT".into()];
    let store = Arc::new(RecordingStore {
        inner: SqliteStore::open(&config.db_path()).unwrap(),
        log: log.clone(),
    });
    let bus = Arc::new(RecordingBus {
        inner: InProcessBus::new(config.limits.bus_capacity),
        log: log.clone(),
    });
    let backends = Backends { bus, store: store.clone(), backfill_store: store, data_lock: None };
    let server = TestServer::start_with(config, backends).await;
    let mut ws = server.ws().await;
    let reply = request(
        &mut ws,
        "SUBSCRIBE",
        &["kline@sim:spot:BTC/USDT:1m", "depth_update@sim:spot:BTC/USDT"],
        1,
    )
    .await;
    assert!(reply.is_ok(), "{reply:?}");
    // Closed candles and book deltas reach the client through the recording bus.
    let (mut closed, mut deltas) = (0, 0);
    while closed < 3 || deltas < 3 {
        if let shared::protocol::ServerFrame::Push(push) = next_frame(&mut ws).await {
            match push.data {
                shared::protocol::PushData::Kline(ev) if ev.k.x => closed += 1,
                shared::protocol::PushData::DepthUpdate(_) => deltas += 1,
                _ => {}
            }
        }
    }
    server.stop().await;
    assert!(log.writes.load(Ordering::Relaxed) >= 3 && log.publishes.load(Ordering::Relaxed) > 6);

    // Every closed 1m candle published was committed before.
    let events = log.events.lock().unwrap().clone();
    let mut committed = std::collections::HashSet::new();
    let mut checked = 0;
    for e in &events {
        match e {
            Event::Committed(minutes) => committed.extend(minutes.iter().copied()),
            Event::Published { topic, payload } if topic == "kline@sim:spot:BTC/USDT:1m" => {
                let push: Push<KlineEvent> = serde_json::from_slice(payload).unwrap();
                if push.data.k.x {
                    assert!(
                        committed.contains(&push.data.k.t),
                        "published before it was stored: {}",
                        push.data.k.t
                    );
                    checked += 1;
                }
            }
            Event::Published { .. } => {}
        }
    }
    assert!(checked >= 3, "{checked} closed candles checked");
}

/// A stopped service leaves no task of its own running: its runtime's live tasks go to zero.
#[test]
fn a_stopped_service_leaves_no_task_behind() {
    let runtime =
        tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().unwrap();
    runtime.block_on(async {
        let server = TestServer::start(busy_config()).await;
        // the tick-by-tick books register once the exchange's feed lists them (later under load)
        let stock: shared::protocol::InstrumentId = "sim:stock:600000".parse().unwrap();
        testkit::eventually("the tick-by-tick book of 600000", || async {
            server.app.books().is_always_on(&stock).then_some(())
        })
        .await;
        let mut ws = server.ws().await;
        let streams = [
            "heartbeat",
            "kline@sim:spot:SOL/USDT:5m",
            "depth_update@sim:spot:XRP/USDT",
            "depth@sim:stock:600000,20",
        ];
        let reply = request(&mut ws, "SUBSCRIBE", &streams, 1).await;
        assert!(reply.is_ok(), "{reply:?}");
        // pushes flow (the jobs run, the books publish)
        let mut pushes = 0;
        while pushes < 5 {
            if let shared::protocol::ServerFrame::Push(_) = next_frame(&mut ws).await {
                pushes += 1;
            }
        }
        server.stop().await;
        drop(ws);
    });
    // Whatever the service spawned has ended (or ends within moments: sockets closing).
    let metrics = runtime.metrics();
    let deadline = std::time::Instant::now() + Duration::from_secs(5);
    while metrics.num_alive_tasks() > 0 {
        assert!(
            std::time::Instant::now() < deadline,
            "{} tasks still alive after stop",
            metrics.num_alive_tasks()
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}
