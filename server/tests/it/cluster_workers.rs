//! The cluster as processes over the machine's real NATS (JetStream) and PostgreSQL: the
//! simulated exchange (in this process, on its own port), a supervisor and four workers (child
//! processes of the `millrace` binary), and a gateway (a `serve` with `[cluster] enabled`, in
//! this process, running the persister). Each run has its own subject prefix, JetStream
//! stream, lease bucket and database.
//!
//! Candles, checked through a `kill -9` of a worker and a SIGTERM (drain) of another:
//! - every task is held by `redundancy` distinct live workers again within `worker_timeout_s`
//!   + 2 ticks (kill) and within 2 s (drain);
//! - the stored 1m candles equal the exchange's, with no hole; every closed candle was written
//!   once (the persister's count equals the stored rows: the replicas' copies were dropped by
//!   JetStream's de-dup) and reached a browser client once.
//!
//! Books: the gateway's book of an instrument, synced from the workers' forwarded diffs and
//! snapshots, equals the exchange's at the same update id, and a `kill -9` of a worker holding
//! it costs its clients nothing — no gap, no resync, an unbroken chain of deltas.
//!
//! Control: `kill -9` of the leading supervisor — the standby leads and no upstream session is
//! restarted; a stalled upstream — its task is reassigned after `task_timeout_s`; a browser's
//! subscription to an unpinned instrument — a task while it lasts, gone after the idle TTL.
//!
//! Redundancy 3: three replicas send every closed candle and every diff; the persister writes
//! each candle once, a browser sees each once, and the diff stream keeps each diff once.
//!
//! Backfill: two gateways, one backfilling (the persister lease holder); when it goes away the
//! other resumes from the stored progress, and the stored window equals the exchange's.
//!
//! Restarts: a NATS server of the test's own killed and started again, then a PostgreSQL server
//! of the test's own stopped (immediate shutdown) and started again — the stored series still
//! equals the exchange's, with no hole.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use server::config::Config;
use server::config::{BusConfig, BusKind, ClusterConfig, StoreConfig, StoreKind};
use shared::candle::Candle;
use shared::cluster::TaskKind;
use shared::protocol::ops::ClusterReport;
use shared::protocol::{Push, PushData, ServerFrame};
use sim::SimHandle;
use testkit::*;

pub(crate) const BTC: &str = "sim:spot:BTC/USDT";
pub(crate) const ETH: &str = "sim:spot:ETH/USDT";
const TICK_MS: u64 = 200;
const WORKER_TIMEOUT_S: u64 = 2;

pub(crate) fn nats_url() -> String {
    std::env::var("MILLRACE_TEST_NATS").unwrap_or_else(|_| "nats://127.0.0.1:4222".into())
}

pub(crate) fn cluster_config(sim: &SimHandle, pg: &PgDb, prefix: &str, redundancy: u32) -> Config {
    let mut c = test_config(vec![external_sim_source(sim)]);
    c.bus = BusConfig {
        kind: BusKind::Nats,
        url: nats_url(),
        prefix: prefix.into(),
        ..BusConfig::default()
    };
    c.store =
        StoreConfig { kind: StoreKind::Postgres, url: Some(pg.url().into()), ..Default::default() };
    c.cluster = ClusterConfig {
        enabled: true,
        warmup_s: 1,
        tick_ms: TICK_MS,
        status_interval_ms: TICK_MS,
        worker_timeout_s: WORKER_TIMEOUT_S,
        task_timeout_s: 10,
        redundancy,
        lease_s: 2,
        depth_stream_mb: 16,
        instruments: [BTC, ETH].iter().map(|s| s.parse().unwrap()).collect(),
        kinds: vec![TaskKind::Kline],
        ..ClusterConfig::default()
    };
    c
}

/// One test's cluster: the simulator and the gateway in this process, a database of its own,
/// and the roles (supervisors, workers) as child processes by name.
pub(crate) struct TestCluster {
    pub(crate) sim: SimHandle,
    pub(crate) pg: PgDb,
    pub(crate) gateway: TestServer,
    roles: BTreeMap<String, ChildRole>,
    dir: std::path::PathBuf,
    /// Deletes the run's JetStream streams, however it ends (after the roles are gone).
    _streams: ClusterStreams,
}

impl TestCluster {
    /// The simulator at `speed`, a fresh database, and the gateway of `tag`'s configuration
    /// (changed by `configure`); no role yet.
    pub(crate) async fn start(
        tag: &str,
        speed: f64,
        seed: u64,
        configure: impl FnOnce(&mut Config),
    ) -> Self {
        TestCluster::start_on(&pg_admin_url(), tag, speed, seed, configure).await
    }

    /// [`TestCluster::start`] with its database on the PostgreSQL server of `admin`.
    async fn start_on(
        admin: &str,
        tag: &str,
        speed: f64,
        seed: u64,
        configure: impl FnOnce(&mut Config),
    ) -> Self {
        let sim = start_sim(speed, seed).await;
        TestCluster::start_with_sim_on(admin, sim, tag, |_, c| configure(c)).await
    }

    /// [`TestCluster::start`] on a simulator already started, whose addresses the
    /// configuration may use (another venue's dialect, say).
    pub(crate) async fn start_with_sim(
        sim: SimHandle,
        tag: &str,
        configure: impl FnOnce(&SimHandle, &mut Config),
    ) -> Self {
        TestCluster::start_with_sim_on(&pg_admin_url(), sim, tag, configure).await
    }

    async fn start_with_sim_on(
        admin: &str,
        sim: SimHandle,
        tag: &str,
        configure: impl FnOnce(&SimHandle, &mut Config),
    ) -> Self {
        let pg = tokio::task::block_in_place(|| PgDb::fresh_on(admin, tag));
        let prefix = test_prefix(tag);
        let mut config = cluster_config(&sim, &pg, &prefix, 2);
        configure(&sim, &mut config);
        let streams = ClusterStreams::new(&config.bus.url, &prefix);
        let gateway = TestServer::start(config).await;
        TestCluster {
            sim,
            pg,
            gateway,
            roles: BTreeMap::new(),
            dir: temp_dir(tag),
            _streams: streams,
        }
    }

    /// Starts `millrace supervisor --id id`.
    pub(crate) fn supervisor(&mut self, id: &str) {
        let args = ["supervisor", "--id", id];
        let role = ChildRole::start(id, &args, &self.gateway.config, &self.dir, "info");
        self.roles.insert(id.to_string(), role);
    }

    /// Starts `millrace worker --id id --max-load 10` with `more` arguments.
    pub(crate) fn worker(&mut self, id: &str, more: &[&str]) {
        let mut args = vec!["worker", "--id", id, "--max-load", "10"];
        args.extend_from_slice(more);
        let role = ChildRole::start(id, &args, &self.gateway.config, &self.dir, "info");
        self.roles.insert(id.to_string(), role);
    }

    pub(crate) fn role(&mut self, id: &str) -> &mut ChildRole {
        self.roles.get_mut(id).expect("a role of this cluster")
    }

    pub(crate) async fn stop(self) {
        drop(self.roles);
        self.gateway.stop().await;
        self.sim.shutdown();
        tokio::task::block_in_place(|| drop(self.pg));
    }
}

pub(crate) async fn report(gateway: &TestServer) -> Option<ClusterReport> {
    let (status, body) = gateway.get("/api/v1/ops/cluster").await;
    (status == 200).then(|| serde_json::from_str(&body).expect("a ClusterReport"))
}

/// Waits until every task is held by `n` distinct active workers, none of them in `gone`;
/// returns the report.
pub(crate) async fn fully_assigned(gateway: &TestServer, n: usize, gone: &[&str]) -> ClusterReport {
    let tasks = gateway.config.cluster.pinned_tasks().len();
    eventually(&format!("every task on {n} live workers (not {gone:?})"), || async {
        let r = report(gateway).await?;
        let active: Vec<&str> =
            r.workers.iter().filter(|w| w.active && !w.leaving).map(|w| w.id.as_str()).collect();
        let ok = r.tasks.len() == tasks
            && r.tasks.iter().all(|t| {
                t.workers.len() == n
                    && t.workers.iter().all(|w| active.contains(&w.as_str()))
                    && !t.workers.iter().any(|w| gone.contains(&w.as_str()))
            });
        ok.then_some(r)
    })
    .await
}

/// Waits until `/healthz` says degraded (503); returns its status and body.
pub(crate) async fn degraded(gateway: &TestServer) -> (u16, String) {
    eventually("/healthz to say degraded", || async {
        let (status, body) = gateway.get("/healthz").await;
        (status == 503 && body.contains("\"degraded\"")).then_some((status, body))
    })
    .await
}

/// Waits until `/healthz` says ok again.
pub(crate) async fn healthy(gateway: &TestServer) {
    eventually("/healthz to say ok", || async {
        let (status, body) = gateway.get("/healthz").await;
        (status == 200 && body == r#"{"status":"ok"}"#).then_some(())
    })
    .await
}

/// A gateway's persister counters, as its `/metrics` shows them: candles written, candles left
/// out as written already, failed writes, redelivered messages.
pub(crate) async fn persister(gateway: &TestServer) -> (u64, u64, u64, u64) {
    let (_, m) = gateway.get("/metrics").await;
    let value = |name: &str| {
        m.lines()
            .find_map(|l| l.strip_prefix(name)?.strip_prefix(' ')?.trim().parse().ok())
            .unwrap_or_else(|| panic!("{name} in /metrics"))
    };
    (
        value("millrace_persister_candles_total"),
        value("millrace_persister_repeated_total"),
        value("millrace_persister_write_failures_total"),
        value("millrace_persister_redelivered_total"),
    )
}

/// The stored candles of `series`, oldest first.
pub(crate) fn stored_pg(pg: &PgDb, series: &str) -> Vec<Candle> {
    use server::store::CandleStore as _;
    tokio::task::block_in_place(|| {
        let store = server::store::postgres::PostgresStore::open(pg.url()).unwrap();
        let out = store.candles(&series.parse().unwrap(), Some(0), None, 1_000_000).unwrap();
        drop(store);
        out
    })
}

/// Waits until the stored 1m candles of BTC, from the first to the last stored, equal the
/// exchange's (no hole, no difference); returns them. The persister writes rounds in order, but
/// a minute can still reach JetStream after the next one (a replica's gap fill after a
/// reconnect, messages redelivered after `ack_wait`): the bound is that moment, not forever.
async fn stored_settles(c: &TestCluster) -> Vec<Candle> {
    eventually("the stored BTC minutes to equal the exchange's, without a hole", || async {
        let stored = stored_pg(&c.pg, "sim:spot:BTC/USDT:1m");
        let (first, last) = (stored.first()?.open_time, stored.last()?.open_time);
        (stored == c.sim.closed_klines("BTCUSDT", first, last)).then_some(stored)
    })
    .await
}

pub(crate) async fn stored_count(pg: &PgDb, series: &'static str) -> usize {
    let url = pg.url().to_string();
    tokio::task::spawn_blocking(move || {
        let mut c = postgres::Client::connect(&url, postgres::NoTls).unwrap();
        let q = "SELECT count(*) FROM candles c JOIN series s ON s.id = c.series_id \
                 WHERE s.name = $1";
        let n: i64 = c.query_one(q, &[&series]).map(|r| r.get(0)).unwrap_or(0);
        n as usize
    })
    .await
    .unwrap()
}

/// Waits until `series` has `n` more stored candles than `from`; returns the count.
pub(crate) async fn stored_grows(pg: &PgDb, series: &'static str, from: usize, n: usize) -> usize {
    eventually(&format!("{n} more stored candles of {series}"), || async {
        let c = stored_count(pg, series).await;
        (c >= from + n).then_some(c)
    })
    .await
}

/// A browser client on the gateway: closed 1m candles of BTC seen, by open time.
pub(crate) fn watch_closed(
    mut ws: Ws,
) -> (std::sync::Arc<std::sync::Mutex<BTreeMap<i64, u32>>>, tokio::task::JoinHandle<()>) {
    let seen = std::sync::Arc::new(std::sync::Mutex::new(BTreeMap::new()));
    let keep = seen.clone();
    let task = tokio::spawn(async move {
        loop {
            if let ServerFrame::Push(Push { data: PushData::Kline(ev), .. }) =
                next_frame(&mut ws).await
            {
                if ev.k.x {
                    *keep.lock().unwrap().entry(ev.k.t).or_insert(0) += 1;
                }
            }
        }
    });
    (seen, task)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn workers_killed_and_drained_lose_and_repeat_no_candle() {
    let mut c = TestCluster::start("cluster", 60.0, 41, |_| {}).await;
    c.supervisor("sup1");
    for i in 1..=4 {
        c.worker(&format!("w{i}"), &["--drain-s", "5"]);
    }
    let mut ws = c.gateway.ws().await;
    let btc_1m = format!("kline@{BTC}:1m");
    request(&mut ws, "SUBSCRIBE", &[btc_1m.as_str()], 1).await;
    let (seen, watcher) = watch_closed(ws);

    let r = fully_assigned(&c.gateway, 2, &[]).await;
    let n0 = stored_grows(&c.pg, "sim:spot:BTC/USDT:1m", 0, 5).await;

    // kill -9 a worker holding BTC: its tasks move within worker_timeout_s + 2 ticks.
    let victim =
        r.tasks.iter().find(|t| t.instrument.to_string() == BTC).unwrap().workers[0].clone();
    let t0 = Instant::now();
    c.role(&victim).kill9();
    fully_assigned(&c.gateway, 2, &[victim.as_str()]).await;
    let kill_failover = t0.elapsed();
    eprintln!("fail-over after kill -9 of {victim}: {kill_failover:?}");
    let bound = Duration::from_millis(WORKER_TIMEOUT_S * 1000 + 2 * TICK_MS);
    // + the report's own polling (25 ms) and NATS round trips
    assert!(kill_failover <= bound + Duration::from_millis(300), "{kill_failover:?} > {bound:?}");
    let n1 = stored_grows(&c.pg, "sim:spot:BTC/USDT:1m", n0, 5).await;

    // SIGTERM another holder: it announces it is leaving, its tasks move at once.
    let r = report(&c.gateway).await.unwrap();
    let leaving =
        r.tasks.iter().flat_map(|t| t.workers.iter()).find(|w| **w != victim).unwrap().clone();
    let t0 = Instant::now();
    c.role(&leaving).sigterm();
    fully_assigned(&c.gateway, 2, &[victim.as_str(), leaving.as_str()]).await;
    let drain_failover = t0.elapsed();
    eprintln!("fail-over on drain of {leaving}: {drain_failover:?}");
    assert!(drain_failover <= Duration::from_secs(2), "{drain_failover:?}");
    let status = c.role(&leaving).exited(Duration::from_secs(15)).await;
    assert!(status.is_some_and(|s| s.success()), "the drained worker exits cleanly: {status:?}");
    stored_grows(&c.pg, "sim:spot:BTC/USDT:1m", n1, 5).await;

    // The stored 1m series equals the exchange's, contiguous.
    let stored = stored_settles(&c).await;
    assert!(stored.windows(2).all(|w| w[1].open_time - w[0].open_time == 60_000), "no hole");
    // Written once each: the persister wrote as many 1m candles as are stored.
    let eth = stored_pg(&c.pg, "sim:spot:ETH/USDT:1m");
    let written = persister(&c.gateway).await.0 as usize;
    let rows = stored_pg(&c.pg, "sim:spot:BTC/USDT:1m").len() + eth.len();
    eprintln!("stored 1m rows {rows}, written by the persister {written}");
    assert_eq!(written, rows, "each closed candle reached the store once");
    // Derived candles are merges of the stored minutes of their bucket.
    for c5 in stored_pg(&c.pg, "sim:spot:BTC/USDT:5m") {
        let minutes: Vec<Candle> = stored
            .iter()
            .filter(|m| m.open_time >= c5.open_time && m.open_time < c5.open_time + 300_000)
            .copied()
            .collect();
        if minutes.len() == 5 {
            assert_eq!(Some(c5), shared::candle::merge(shared::candle::Timeframe::M5, &minutes));
        }
    }
    // The browser saw every closed minute once, without a hole.
    watcher.abort();
    let seen = seen.lock().unwrap().clone();
    eprintln!("closed candles pushed to the browser: {}", seen.len());
    assert!(seen.len() >= 10, "{seen:?}");
    assert!(seen.values().all(|&n| n == 1), "each closed candle pushed once: {seen:?}");
    let opens: Vec<i64> = seen.keys().copied().collect();
    assert!(opens.windows(2).all(|w| w[1] - w[0] == 60_000), "no hole: {opens:?}");

    c.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_gateway_book_follows_the_workers_through_a_kill() {
    use crate::depth_faults::{matches_sim, status, watch_bus};
    use shared::protocol::BookHealth;
    let mut c = TestCluster::start("clusterbook", 1.0, 43, |config| {
        config.cluster.instruments = vec![BTC.parse().unwrap()];
        config.cluster.kinds = vec![TaskKind::Depth];
        config.depth.verify_interval_ms = 0; // no periodic re-snapshot: a resync would show
    })
    .await;
    c.supervisor("sup1");
    for i in 1..=4 {
        c.worker(&format!("w{i}"), &[]);
    }
    let r = fully_assigned(&c.gateway, 2, &[]).await;
    // A browser's subscription starts the gateway's book of BTC (and asks the cluster for it).
    let _lease = c.gateway.app.subscribe_depth(&BTC.parse().unwrap()).unwrap();
    let watch = watch_bus(&c.gateway, BTC);
    let s0 = matches_sim(&c.gateway, &c.sim, BTC, "BTCUSDT", BookHealth::Synced).await;
    assert!(s0.stream.contains("diffs"), "fed by the cluster: {}", s0.stream);

    // Both first holders are killed, one after the other (so whichever replica's copies
    // JetStream was keeping, that one dies), each replaced in time by another worker.
    let first = r.tasks[0].workers.clone();
    for (i, victim) in first.iter().enumerate() {
        c.role(victim).kill9();
        fully_assigned(&c.gateway, 2, &first[..=i].iter().map(|s| s.as_str()).collect::<Vec<_>>())
            .await;
        // the replacement is connected and forwarding before the next kill
        tokio::time::sleep(Duration::from_secs(2)).await;
    }
    tokio::time::sleep(Duration::from_secs(1)).await;
    let s1 = matches_sim(&c.gateway, &c.sim, BTC, "BTCUSDT", BookHealth::Synced).await;
    assert!(s1.last_update_id > s0.last_update_id);
    assert_eq!(s1.sync.gaps, s0.sync.gaps, "no gap through the kill: {:?}", s1.sync);
    assert_eq!(s1.sync.resyncs, s0.sync.resyncs, "no resync through the kill: {:?}", s1.sync);
    let (_, job) = status(&c.gateway, BTC);
    eprintln!("gateway book after the kill: {:?}; job {job}", s1.sync);
    watch.stop.store(true, std::sync::atomic::Ordering::Relaxed);
    watch.assert_clean("BTC through the kill");

    c.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_standby_leads_without_restarts_a_silent_task_moves_and_demand_comes_and_goes() {
    use sim::{StreamClass, StreamTarget};
    let mut c = TestCluster::start("clusterlead", 60.0, 47, |config| {
        config.cluster.task_timeout_s = 3;
        config.ingest.ondemand_idle_ttl_s = 1;
    })
    .await;
    c.supervisor("sup1");
    c.supervisor("sup2");
    for i in 1..=3 {
        c.worker(&format!("w{i}"), &[]);
    }
    let r = fully_assigned(&c.gateway, 2, &[]).await;
    let n0 = stored_grows(&c.pg, "sim:spot:BTC/USDT:1m", 0, 3).await;

    // kill -9 of the leader: the standby leads, and no upstream session is restarted.
    let leader = r.supervisor.leader.clone().expect("a leader");
    let opened = c.sim.connections_opened();
    let t0 = Instant::now();
    c.role(&leader).kill9();
    let r = eventually("the standby leads", || async {
        let r = report(&c.gateway).await?;
        (r.supervisor.leader.as_deref().is_some_and(|l| l != leader)
            && r.supervisor.state == shared::protocol::ops::SupervisorState::Running)
            .then_some(r)
    })
    .await;
    eprintln!("standby {:?} leads after {:?}", r.supervisor.leader, t0.elapsed());
    fully_assigned(&c.gateway, 2, &[]).await;
    let n1 = stored_grows(&c.pg, "sim:spot:BTC/USDT:1m", n0, 3).await;
    assert_eq!(c.sim.connections_opened(), opened, "a session was restarted by the fail-over");

    // A stalled upstream: the silent task is unassigned and reassigned after task_timeout_s.
    let t0 = Instant::now();
    c.sim.faults().stall(
        StreamTarget::kind(StreamClass::Kline).for_symbol("BTCUSDT"),
        Duration::from_secs(5),
    );
    eventually("the silent task reassigned", || async {
        let r = report(&c.gateway).await?;
        r.events.iter().any(|e| e.reason.contains("silent")).then_some(())
    })
    .await;
    let silent_after = t0.elapsed();
    eprintln!("silent task reassigned after {silent_after:?}");
    // task_timeout_s counts from the last data (just before the stall), as the workers'
    // statuses report it every status_interval_ms; the timer checks every tick
    assert!(
        silent_after >= Duration::from_millis(3000 - TICK_MS)
            && silent_after <= Duration::from_millis(3000 + 3 * TICK_MS + 500),
        "{silent_after:?}: task_timeout_s is 3 s"
    );
    // ... and once the exchange talks again nothing is missing.
    stored_grows(&c.pg, "sim:spot:BTC/USDT:1m", n1, 8).await;
    stored_settles(&c).await;

    // On demand: a browser's subscription to an instrument nobody pinned becomes a task of the
    // cluster (seed 000's lease at the gateway, its demand at the supervisor) ...
    let sol = "sim:spot:SOL/USDT";
    let sol_task = format!("kline:{sol}");
    let mut ws = c.gateway.ws().await;
    let stream = format!("kline@{sol}:1m");
    request(&mut ws, "SUBSCRIBE", &[stream.as_str()], 1).await;
    eventually("SOL assigned on demand", || async {
        let r = report(&c.gateway).await?;
        r.tasks.iter().any(|t| t.id == sol_task && t.workers.len() == 2).then_some(())
    })
    .await;
    stored_grows(&c.pg, "sim:spot:SOL/USDT:1m", 0, 3).await;
    // ... and leaves it once the last session has gone and the idle TTL has passed.
    drop(ws);
    eventually("SOL no longer a task", || async {
        let r = report(&c.gateway).await?;
        (!r.tasks.iter().any(|t| t.id == sol_task)).then_some(())
    })
    .await;

    c.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_redundancy_3_every_candle_and_diff_goes_downstream_once() {
    use async_nats::jetstream::consumer::{push, DeliverPolicy};
    use futures_util::StreamExt as _;
    use shared::protocol::BookHealth;
    let mut c = TestCluster::start("clusterthree", 60.0, 53, |config| {
        config.cluster.redundancy = 3;
        config.cluster.instruments = vec![BTC.parse().unwrap()];
        config.cluster.kinds = vec![TaskKind::Kline, TaskKind::Depth];
    })
    .await;
    c.supervisor("sup1");
    for i in 1..=3 {
        c.worker(&format!("w{i}"), &[]);
    }
    let mut ws = c.gateway.ws().await;
    let stream = format!("kline@{BTC}:1m");
    request(&mut ws, "SUBSCRIBE", &[stream.as_str()], 1).await;
    let (seen, watcher) = watch_closed(ws);
    fully_assigned(&c.gateway, 3, &[]).await;
    let _lease = c.gateway.app.subscribe_depth(&BTC.parse().unwrap()).unwrap();
    // (at 60x the book moves every tick: synced is enough here; equality is checked at 1x)
    eventually("the gateway's book synced from the cluster", || async {
        let (s, _) = crate::depth_faults::status(&c.gateway, BTC);
        (s.health == BookHealth::Synced).then_some(())
    })
    .await;
    stored_grows(&c.pg, "sim:spot:BTC/USDT:1m", 0, 10).await;

    // Closed candles: three replicas sent each; the persister wrote each once, the browser saw
    // each once.
    let stored = stored_pg(&c.pg, "sim:spot:BTC/USDT:1m");
    let written = persister(&c.gateway).await.0 as usize;
    assert!(
        written >= stored.len() && written <= stored.len() + 1,
        "{written} vs {}",
        stored.len()
    );
    watcher.abort();
    let seen = seen.lock().unwrap().clone();
    assert!(seen.len() >= 5 && seen.values().all(|&n| n == 1), "{seen:?}");

    // Depth diffs: every diff the stream kept has a natural id of its own.
    let client = async_nats::connect(nats_url()).await.unwrap();
    let js = async_nats::jetstream::new(client.clone());
    let prefix = &c.gateway.config.bus.prefix;
    let diffs = js.get_stream(format!("{prefix}_depth")).await.unwrap();
    let consumer = diffs
        .create_consumer(push::OrderedConfig {
            deliver_subject: client.new_inbox(),
            deliver_policy: DeliverPolicy::All,
            ..Default::default()
        })
        .await
        .unwrap();
    let total = diffs.cached_info().state.messages as usize;
    let mut messages = consumer.messages().await.unwrap();
    let mut ids = std::collections::BTreeSet::new();
    let mut read = 0;
    while read < total {
        let m = tokio::time::timeout(Duration::from_secs(5), messages.next())
            .await
            .expect("the stream's diffs")
            .unwrap()
            .unwrap();
        // (instrument, U, u): the subject names the instrument, the headers the ids
        let h = m.headers.as_ref().expect("a forwarded diff's headers");
        let header = |k: &str| h.get(k).map(|v| v.to_string()).expect("the diff's ids");
        ids.insert((m.subject.to_string(), header("Millrace-Prev"), header("Millrace-U")));
        read += 1;
    }
    eprintln!("{total} diffs kept, {} natural ids", ids.len());
    assert!(total > 20, "diffs flowed: {total}");
    assert_eq!(ids.len(), total, "a diff kept twice");
    c.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_nats_restart_then_a_postgres_restart_lose_nothing() {
    let mut nats = OwnNats::start(temp_dir("ownnats"));
    let url = nats.url();
    let pg_server = tokio::task::block_in_place(|| OwnPostgres::start(temp_dir("ownpg")));
    let admin = pg_server.admin_url();
    let mut c = TestCluster::start_on(&admin, "clusterrestart", 60.0, 59, |config| {
        config.bus.url = url;
        config.cluster.instruments = vec![BTC.parse().unwrap()];
        config.cluster.kinds = vec![TaskKind::Kline];
    })
    .await;
    c.supervisor("sup1");
    for i in 1..=2 {
        c.worker(&format!("w{i}"), &[]);
    }
    fully_assigned(&c.gateway, 2, &[]).await;
    let n0 = stored_grows(&c.pg, "sim:spot:BTC/USDT:1m", 0, 5).await;

    // NATS goes away for 3 s (kill -9) and comes back with its JetStream store; health says
    // so meanwhile.
    assert_eq!(c.gateway.get("/healthz").await.0, 200);
    nats.kill9();
    let t0 = Instant::now();
    let (status, body) = degraded(&c.gateway).await;
    assert!(body.contains("bus.url"), "{status}: {body}");
    tokio::time::sleep(Duration::from_secs(3).saturating_sub(t0.elapsed())).await;
    nats.restart();
    let n1 = stored_grows(&c.pg, "sim:spot:BTC/USDT:1m", n0, 8).await;
    healthy(&c.gateway).await;

    // PostgreSQL goes away for 3 s, the hard way (immediate shutdown: no checkpoint, every
    // connection cut; WAL recovery when it starts again), then comes back. The persister keeps
    // its round and writes it again after a back-off; health says so meanwhile.
    tokio::task::block_in_place(|| pg_server.down("immediate"));
    let t0 = Instant::now();
    // (the gateway's own check of the store, every tick, and its persister's failing writes)
    for what in ["does not answer", "cannot write closed candles"] {
        eventually(&format!("/healthz: the store {what}"), || async {
            let (status, body) = c.gateway.get("/healthz").await;
            (status == 503 && body.contains(what) && body.contains("store.url")).then_some(())
        })
        .await;
    }
    tokio::time::sleep(Duration::from_secs(3).saturating_sub(t0.elapsed())).await;
    tokio::task::block_in_place(|| pg_server.up());
    stored_grows(&c.pg, "sim:spot:BTC/USDT:1m", n1, 8).await;
    healthy(&c.gateway).await;

    // Nothing lost: the rounds that failed while PostgreSQL was away are written once it is
    // back (a minute may land just after the next one, never not at all).
    let stored = stored_settles(&c).await;
    assert!(stored.windows(2).all(|w| w[1].open_time - w[0].open_time == 60_000), "no hole");
    let (written, _, failures, redelivered) = persister(&c.gateway).await;
    eprintln!(
        "after the restarts: {} stored, {written} written, {failures} write failures, {redelivered} redelivered",
        stored.len(),
    );
    c.stop().await;
    tokio::task::block_in_place(|| drop(pg_server));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_gateway_at_a_time_backfills_and_the_next_resumes_where_it_stopped() {
    use server::config::BackfillTaskConfig;
    const XRP_1M: &str = "sim:spot:XRP/USDT:1m";
    let c = TestCluster::start("clusterfill", 60.0, 61, |config| {
        config.cluster.id = Some("g1".into());
        config.server.admin_token = Some("fill-token".into());
        config.backfill = vec![BackfillTaskConfig {
            series: XRP_1M.into(),
            retention_days: 3,
            batch_limit: 100,
            pause_ms: 300,
            ..Default::default()
        }];
    })
    .await;
    let TestCluster { sim, pg, gateway: g1, roles, dir: _, _streams } = c;
    let task = |b: &serde_json::Value| b["tasks"][0].clone();
    // The first gateway holds the persister lease, so it backfills.
    eventually("g1 backfilling", || async {
        let b = g1.get_json("/api/v1/ops/backfill").await;
        (b["runs_here"] == true && task(&b)["batches"].as_u64().unwrap_or(0) >= 2).then_some(())
    })
    .await;
    let mut config = g1.config.clone();
    config.cluster.id = Some("g2".into());
    config.server.data_dir = temp_dir("clusterfill2");
    let g2 = TestServer::start(config).await;
    tokio::time::sleep(Duration::from_millis(3 * TICK_MS)).await;
    let b2 = g2.get_json("/api/v1/ops/backfill").await;
    assert_eq!(b2["runs_here"], false, "{b2}");
    assert_eq!(task(&b2)["running"], false, "{b2}");
    // (its progress is the shared one, read from PostgreSQL: g1's)
    assert!(task(&b2)["window"].is_null(), "g2 has not run: {b2}");
    // Asked to start, the second refuses and says who does it.
    let auth = [("Authorization", "Bearer fill-token")];
    let body = format!(r#"{{"series":"{XRP_1M}"}}"#);
    let (s, reply) =
        http(g2.addr, "POST", "/api/v1/admin/backfill/start", &auth, &body).await.unwrap();
    assert_eq!(s, 409, "{reply}");
    assert!(reply.contains("other_node") && reply.contains("persister lease"), "{reply}");

    // The first goes away mid-run; the second takes the lease and resumes from the stored
    // progress instead of starting over.
    let b1 = g1.get_json("/api/v1/ops/backfill").await;
    assert_eq!(task(&b1)["state"], "running", "g1 is still at it: {b1}");
    let written_by_g1 = task(&b1)["candles_written"].as_u64().unwrap();
    g1.stop().await;
    let done = eventually("g2 to finish the backfill", || async {
        let b = g2.get_json("/api/v1/ops/backfill").await;
        let t = task(&b);
        (b["runs_here"] == true && t["state"] == "done" && t["running"] == false).then_some(t)
    })
    .await;
    eprintln!("g1 wrote {written_by_g1} (at least) before it stopped; g2's run: {done}");
    assert!(done["progress"].as_f64().unwrap() > 0.999, "{done}");
    assert_eq!(done["covered"].as_array().unwrap().len(), 1, "one covered range: {done}");
    let (lo, hi) = (done["window"][0].as_i64().unwrap(), done["window"][1].as_i64().unwrap());
    let window = ((hi - lo) / 60_000 + 1) as u64;
    let written_by_g2 = done["candles_written"].as_u64().unwrap();
    assert!(
        written_by_g1 + written_by_g2 <= window + 200,
        "g2 fetched only what g1 had not: {written_by_g1} + {written_by_g2} vs {window}"
    );

    // The stored window equals the exchange's, without a hole, and its derived candles are the
    // merges of its minutes.
    let stored: Vec<Candle> = stored_pg(&pg, XRP_1M)
        .into_iter()
        .filter(|c| c.open_time >= lo && c.open_time <= hi)
        .collect();
    assert_eq!(stored.len() as u64, window, "no hole");
    assert_eq!(stored, sim.closed_klines("XRPUSDT", lo, hi), "stored = the exchange's");
    let m5 = stored_pg(&pg, "sim:spot:XRP/USDT:5m");
    let mut checked = 0;
    for c5 in m5.iter().filter(|c| c.open_time >= lo && c.open_time + 240_000 <= hi) {
        let minutes: Vec<Candle> = stored
            .iter()
            .filter(|m| m.open_time >= c5.open_time && m.open_time < c5.open_time + 300_000)
            .copied()
            .collect();
        assert_eq!(Some(*c5), shared::candle::merge(shared::candle::Timeframe::M5, &minutes));
        checked += 1;
    }
    assert!(checked as u64 >= window / 5 - 2, "{checked} derived candles checked");

    drop(roles);
    g2.stop().await;
    sim.shutdown();
    tokio::task::block_in_place(|| drop(pg));
}

/// `[l3] host = "worker:w1"`: the tick-by-tick engine runs on worker w1 alone; the gateway runs
/// none, passes w1's book deltas to its browsers and forwards the rest (REST snapshots, the
/// engine's report, books, admin) over NATS. A seed-002 client on the gateway follows a stock's
/// book through a migration and a hot spot and ends equal to the simulator's true book; when w1
/// is killed, health says so.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_tick_by_tick_books_run_on_one_worker_behind_the_gateway() {
    use crate::l3_service::SeedClient;
    // the workers send the admin token with the hot spot to the standalone simulator
    const TOKEN: &str = SIM_CONTROL_TOKEN;
    let mut c = TestCluster::start("clusterl3", 1.0, 47, |config| {
        config.l3.host = "worker:w1".into();
        config.server.admin_token = Some(TOKEN.into());
        config.cluster.instruments = vec![BTC.parse().unwrap()];
    })
    .await;
    assert!(c.gateway.app.l3().here().is_none(), "the gateway runs no engine");
    c.supervisor("sup1");
    c.worker("w1", &[]);
    c.worker("w2", &[]);
    let tbt = c.sim.tbt();
    let symbols = tbt.symbols().len();
    assert!(symbols >= 40, "{symbols} simulated stocks");

    // The engine's report, asked of w1 through the gateway, lists every stock.
    let deadline = Instant::now() + Duration::from_secs(30);
    let shards = loop {
        let (status, body) = c.gateway.get("/api/v1/ops/shards").await;
        if status == 200 {
            let v: serde_json::Value = serde_json::from_str(&body).unwrap();
            if v["engine"]["symbols"].as_array().map_or(0, |s| s.len()) == symbols {
                break v;
            }
        }
        assert!(Instant::now() < deadline, "no engine report through the gateway: {status} {body}");
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    assert_eq!(shards["sources"][0]["name"], "sim", "{}", shards["sources"]);

    let code = "600004";
    let instrument = format!("sim:stock:{code}");
    let mut client = SeedClient::start_instrument(&c.gateway, &instrument).await;
    client.pump(2_000).await;

    // Admin through the gateway, carried out by w1: a migration to a new shard, a hot spot.
    let admin = |path: &'static str, body: serde_json::Value| {
        let addr = c.gateway.addr;
        async move {
            let auth = format!("Bearer {TOKEN}");
            let headers = [("Authorization", auth.as_str()), ("Content-Type", "application/json")];
            http(addr, "POST", path, &headers, &body.to_string()).await.unwrap()
        }
    };
    let shard_of = |v: &serde_json::Value| {
        v["engine"]["symbols"]
            .as_array()
            .unwrap()
            .iter()
            .find(|s| s["instrument"] == instrument.as_str())
            .unwrap()["shard"]
            .as_u64()
            .unwrap()
    };
    let before = shard_of(&shards);
    let (status, body) =
        admin("/api/v1/admin/shards/migrate", serde_json::json!({"symbol": code, "target": -1}))
            .await;
    assert_eq!(status, 200, "{body}");
    let (status, body) =
        admin("/api/v1/admin/sim/hotspot", serde_json::json!({"symbol": code, "hot": true})).await;
    assert_eq!(status, 200, "{body}");
    // refusals cross as they are
    let (status, body) =
        admin("/api/v1/admin/shards/migrate", serde_json::json!({"symbol": "999999", "target": 0}))
            .await;
    assert_eq!(status, 404, "{body}");
    assert!(body.contains("unknown_book"), "{body}");
    let (status, _) =
        http(c.gateway.addr, "POST", "/api/v1/admin/shards/auto_balance", &[], "{\"on\":false}")
            .await
            .unwrap();
    assert_eq!(status, 401, "the gateway checks the token before forwarding");
    client.pump(3_000).await;
    let after = c.gateway.get_json("/api/v1/ops/shards").await;
    assert_ne!(shard_of(&after), before, "migrated on w1");
    assert_eq!(
        after["engine"]["symbols"]
            .as_array()
            .unwrap()
            .iter()
            .find(|s| s["instrument"] == instrument.as_str())
            .unwrap()["hot"],
        true
    );
    admin("/api/v1/admin/sim/hotspot", serde_json::json!({"symbol": code, "hot": false})).await;

    // Quiet: the client's book equals the simulator's true book and the host's snapshot.
    tbt.pause(true);
    client.pump(2_000).await;
    assert!(client.problems.is_empty(), "{:?}", client.problems);
    assert!(client.sync.is_synced(), "{:?}", client.sync.state());
    assert!(client.deltas > 20, "only {} deltas", client.deltas);
    let truth = tbt.book(code, 5000).unwrap();
    assert_eq!(client.sync.book().top(5000), (truth.bids, truth.asks), "vs the simulator");
    let path = format!("/fapi/v1/depth?symbol={instrument}&with_id=true&limit=5000");
    let r: shared::protocol::RestDepthResponse =
        serde_json::from_value(c.gateway.get_json(&path).await).unwrap();
    assert_eq!(r.data.id, client.sync.last_update_id(), "the host's ids, unchanged");
    tbt.pause(false);

    // The host's books are in the gateway's ops, metrics and health.
    let books = c.gateway.get_json("/api/v1/ops/books").await;
    let stocks = books["books"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|b| b["instrument"].as_str().unwrap().contains(":stock:"))
        .count();
    assert_eq!(stocks, symbols, "{books}");
    let (_, metrics) = c.gateway.get("/metrics").await;
    assert!(metrics.contains("millrace_l3_shard_symbols"), "engine metrics through the gateway");
    healthy(&c.gateway).await;
    let (status, _) = c.gateway.get("/fapi/v1/depth?symbol=sim:stock:999999").await;
    assert_eq!(status, 404);

    // Without its host, the gateway says so.
    c.role("w1").kill9();
    let (status, body) = degraded(&c.gateway).await;
    assert_eq!(status, 503);
    assert!(body.contains("l3.host = worker:w1"), "{body}");
    let (status, body) = c.gateway.get("/api/v1/ops/shards").await;
    assert_eq!(status, 503, "{body}");
    c.stop().await;
}

/// Two replicas hand the same 1,500 closed minutes to JetStream, cut into batches differently
/// (as two workers' gap fills after different reconnects): the same messages are kept once by
/// JetStream, overlapping ones are dropped by the persister, and every minute is written once,
/// equal to what was sent.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn replicas_cutting_a_gap_fill_differently_write_each_minute_once() {
    use server::cluster::candles::JetStreamForward;
    use shared::fixed::{Price, Volume};
    let c = TestCluster::start("clustercut", 1.0, 59, |config| {
        config.cluster.instruments = vec![];
    })
    .await;
    // an instrument the simulator lists that no task runs; 1,500 minutes that have closed (the
    // persister takes only series the cluster may run, within the exchange's clock)
    let series = "sim:spot:LTC/USDT:1m";
    let id: shared::protocol::SeriesId = series.parse().unwrap();
    let t0 = (server::clock::wall_clock_ms() / 60_000 - 1_600) * 60_000;
    let minutes: Vec<Candle> = (0..1_500_i64)
        .map(|m| {
            let p = Price(1_000 + m % 37);
            Candle::one_minute(t0 + m * 60_000, p, Price(p.0 + 5), Price(p.0 - 5), p, Volume(3), 2)
        })
        .collect();
    let client = async_nats::connect(nats_url()).await.unwrap();
    let subjects = server::cluster::Subjects::new(&c.gateway.config.bus.prefix);
    let js = async_nats::jetstream::new(client);
    let (a, b) =
        (JetStreamForward::new(js.clone(), subjects.clone()), JetStreamForward::new(js, subjects));
    // A fills the gap at once; B in pieces; then B at once too (as A did: the same messages)
    a.forward(id.clone(), minutes.clone()).await.unwrap();
    for part in minutes.chunks(137) {
        b.forward(id.clone(), part.to_vec()).await.unwrap();
    }
    let relaxed = std::sync::atomic::Ordering::Relaxed;
    let before = b.stats.duplicates.load(relaxed);
    b.forward(id.clone(), minutes.clone()).await.unwrap();
    assert_eq!(b.stats.duplicates.load(relaxed) - before, 1_500, "the same messages kept once");
    let (sent_a, sent_b) = (a.stats.published.load(relaxed), b.stats.published.load(relaxed));
    eventually("every minute stored", || async {
        (stored_pg(&c.pg, series) == minutes).then_some(())
    })
    .await;
    // (the counters move just after the commit the store shows)
    let (written, repeated) = eventually("every message taken", || async {
        let (w, r, _, _) = persister(&c.gateway).await;
        (w + r >= sent_a + sent_b).then_some((w, r))
    })
    .await;
    eprintln!("JetStream took {sent_a} + {sent_b} candles; written {written}, left out {repeated}");
    assert_eq!(written, 1_500, "each minute written once");
    assert_eq!(written + repeated, sent_a + sent_b, "the rest was left out");
    assert_eq!(stored_pg(&c.pg, series), minutes);
    c.stop().await;
}
