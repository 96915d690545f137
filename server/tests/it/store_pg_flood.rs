//! A flood of anonymous reads against a service on PostgreSQL (a server of the test's own, so the
//! flood can exhaust nobody else's connections): the store's connections stay within
//! `store.pg_pool_size`, the reads wait for them without taking a blocking thread each, every
//! read is answered (or refused with the typed error after the bound), and closed candles keep
//! being committed meanwhile.

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering::Relaxed};
use std::sync::Arc;
use std::time::{Duration, Instant};

use server::config::StoreKind;
use server::store::postgres::PostgresStore;
use server::store::CandleStore;
use testkit::{embedded_sim_source, http_get, test_config, OwnPostgres, TestServer};

use super::store::{rows, run, sid, MIN};

/// Reads at once.
const CLIENTS: usize = 500;
/// How long the flood lasts at least (waves of `CLIENTS` reads): a minute closes every second.
const FLOOD: Duration = Duration::from_secs(5);

/// Threads of this process now (the server runs in it).
fn threads() -> usize {
    let status = std::fs::read_to_string("/proc/self/status").unwrap();
    let line = status.lines().find(|l| l.starts_with("Threads:")).unwrap();
    line.split_whitespace().nth(1).unwrap().parse().unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_flood_of_reads_stays_within_the_pool_and_commits_go_on() {
    let dir = testkit::temp_dir("pg-flood");
    let pg = tokio::task::block_in_place(|| OwnPostgres::start(dir.join("pg")));
    let url = format!("postgres://postgres@127.0.0.1:{}/market", pg.port);
    let connections = || -> i64 {
        pg.socket_client()
            .query_one(
                "SELECT count(*) FROM pg_stat_activity WHERE datname = 'market' \
                 AND backend_type = 'client backend'",
                &[],
            )
            .unwrap()
            .get(0)
    };
    // a series nobody ingests, with history enough that each read takes a while
    let history = sid("sim:spot:SOL/USDT:1m");
    tokio::task::block_in_place(|| {
        pg.socket_client().batch_execute("CREATE DATABASE market").unwrap();
        let store = PostgresStore::open(&url).unwrap();
        for part in 0..4 {
            store.write(&[rows(&history, &run(part * 5_000 * MIN, 5_000, 1))]).unwrap();
        }
        drop(store);
        while connections() > 0 {
            std::thread::sleep(Duration::from_millis(20));
        }
    });

    let mut config = test_config(vec![embedded_sim_source(60.0)]);
    config.ingest.pinned = vec!["sim:spot:BTC/USDT".into(), "sim:spot:ETH/USDT".into()];
    config.store.kind = StoreKind::Postgres;
    config.store.url = Some(url.clone());
    config.store.pg_pool_size = 8;
    config.limits.max_connections_per_ip = 4 * CLIENTS;
    let server = TestServer::start(config).await;
    let committed = || -> i64 {
        postgres::Client::connect(&pg.socket_url("market"), postgres::NoTls)
            .unwrap()
            .query_one(
                "SELECT count(*) FROM candles c JOIN series s ON s.id = c.series_id \
                 WHERE s.name = 'sim:spot:BTC/USDT:1m'",
                &[],
            )
            .unwrap()
            .get(0)
    };
    // candles are being committed before the flood
    let before = testkit::eventually("closed candles committed", || async {
        let n = tokio::task::block_in_place(committed);
        (n >= 3).then_some(n)
    })
    .await;

    // sample the store's connections and this process's threads through the flood
    let stop = Arc::new(AtomicBool::new(false));
    let baseline_threads = threads();
    let sampler = {
        let (stop, admin_url) = (stop.clone(), pg.socket_url("postgres"));
        std::thread::spawn(move || {
            let mut admin = postgres::Client::connect(&admin_url, postgres::NoTls).unwrap();
            let (mut most, mut most_threads, mut samples) = (0i64, 0usize, 0usize);
            while !stop.load(Relaxed) {
                let n: i64 = admin
                    .query_one(
                        "SELECT count(*) FROM pg_stat_activity WHERE datname = 'market' \
                         AND backend_type = 'client backend'",
                        &[],
                    )
                    .unwrap()
                    .get(0);
                most = most.max(n);
                most_threads = most_threads.max(threads());
                samples += 1;
                std::thread::sleep(Duration::from_millis(5));
            }
            (most, most_threads, samples)
        })
    };

    let (ok, refused) = (Arc::new(AtomicUsize::new(0)), Arc::new(AtomicUsize::new(0)));
    let started = Instant::now();
    // waves of CLIENTS reads at once, for long enough that several minutes close meanwhile
    let mut waves = 0;
    while waves == 0 || started.elapsed() < FLOOD {
        let clients: Vec<_> = (0..CLIENTS)
            .map(|_| {
                let (addr, ok, refused) = (server.addr, ok.clone(), refused.clone());
                tokio::spawn(async move {
                    let path = "/api/v1/klines?series=sim:spot:SOL/USDT:1m&limit=100";
                    let (status, body) = http_get(addr, path).await.expect("an answer");
                    match status {
                        200 => {
                            let rows: Vec<serde_json::Value> = serde_json::from_str(&body).unwrap();
                            assert_eq!(rows.len(), 100);
                            ok.fetch_add(1, Relaxed);
                        }
                        // waited longer than the bound: the typed error, naming the key
                        503 => {
                            assert!(body.contains("store.pg_pool_size"), "{body}");
                            assert!(body.contains("\"unavailable\""), "{body}");
                            refused.fetch_add(1, Relaxed);
                        }
                        other => panic!("GET {path}: {other} {body}"),
                    }
                })
            })
            .collect();
        for c in clients {
            c.await.unwrap();
        }
        waves += 1;
    }
    let (after, took) = (tokio::task::block_in_place(committed), started.elapsed());
    stop.store(true, Relaxed);
    let (most, most_threads, samples) = sampler.join().unwrap();
    let (ok, refused) = (ok.load(Relaxed), refused.load(Relaxed));
    eprintln!(
        "{ok} reads answered, {refused} refused in {took:?} ({waves} waves); at most {most} connections \
         ({samples} samples), threads {baseline_threads} -> at most {most_threads}; BTC 1m rows \
         {before} -> {after}"
    );
    assert!(samples > 100, "sampled often: {samples}");
    assert!(most <= 8, "the store held {most} connections, more than store.pg_pool_size (8)");
    assert_eq!(ok + refused, waves * CLIENTS, "every read answered");
    assert!(ok > 0, "{ok} answered, {refused} refused");
    assert!(
        most_threads < baseline_threads + 64,
        "waiting reads took threads: {baseline_threads} -> {most_threads}"
    );
    // at 60x a minute closes every second: the writes went on through the flood
    assert!(after >= before + 3, "committed during the flood: {before} -> {after}");
    let metrics = server.get("/metrics").await.1;
    let counted = format!("millrace_store_reads_refused_total {refused}");
    assert!(metrics.contains(&counted), "{counted} in /metrics");
    server.stop().await;
}
