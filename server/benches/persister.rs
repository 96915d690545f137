//! Closed candles through the cluster's storage path, on the machine's real NATS (JetStream) and
//! PostgreSQL (a load tool, not criterion: one sustained run).
//!
//! 1. `forward`: the workers' side — [`JetStreamForward`] hands `series × minutes` closed 1m
//!    candles to the stream `{prefix}_candles` (a message per aligned block of up to 500 minutes of a series, `Nats-Msg-Id`, acknowledged),
//!    in the pipeline's 200-candle batches;
//! 2. `persist`: a [`Persister`] (lease, durable pull consumer, per-series transactions of 1m +
//!    derived candles, publication on the NATS bus, acknowledgement) drains them into a fresh
//!    database; timed from its start to the last candle written.
//!
//! The persister checks every message as it does in a gateway ([`ClusterBounds`]): its series
//! must be listed by a source (here a simulator listing the bench's instruments) and its minutes
//! lie within that exchange's clock, so the figures include the validation's cost.
//!
//! Run twice: with only 1m candles, then with the default 11 derived timeframes.
//! `cargo bench -p server --bench persister` (`MILLRACE_PERSIST_BENCH=series=…,minutes=…`;
//! `MILLRACE_TEST_PG` / `MILLRACE_TEST_NATS` pick the servers, as for the tests;
//! `MILLRACE_PG_SSLMODE=disable` or `=require` sets the store's `sslmode`, by default `prefer`,
//! which is TLS against a server that offers it).

use std::sync::atomic::Ordering::Relaxed;
use std::sync::Arc;
use std::time::{Duration, Instant};

use server::bus::nats::Publisher;
use server::bus::{Bus, NatsBus, PoisonStats};
use server::candles::writer::CandleWriter;
use server::cluster::bounds::ClusterBounds;
use server::cluster::candles::{ensure_stream, JetStreamForward, Persister, PersisterStats};
use server::cluster::Subjects;
use server::config::ClusterConfig;
use server::config::{SourceConfig, SourceKind};
use server::shutdown::Shutdown;
use server::sources::{Endpoint, Sources};
use server::store::postgres::PostgresStore;
use server::store::CandleStore;
use shared::candle::Timeframe;
use shared::protocol::SeriesId;
use testkit::PgDb;

mod common;

use common::{candle, MIN};

fn setting(name: &str, default: usize) -> usize {
    std::env::var("MILLRACE_PERSIST_BENCH")
        .ok()
        .and_then(|v| {
            v.split(',').find_map(|kv| kv.strip_prefix(&format!("{name}="))?.parse().ok())
        })
        .unwrap_or(default)
}

/// A simulator listing `series` instruments `S{i}/USDT`, and the sources that read it (their
/// clocks kept), for the persister's bounds.
async fn sources(series: usize, shutdown: &Shutdown) -> (sim::SimHandle, Arc<Sources>) {
    let spec = sim::SymbolSpec::catalog().remove(0);
    let symbols = (0..series)
        .map(|i| sim::SymbolSpec {
            symbol: format!("S{i}USDT"),
            base: format!("S{i}"),
            quote: "USDT".into(),
            ..spec.clone()
        })
        .collect();
    let config = sim::SimConfig { symbols, ..sim::SimConfig::default() };
    let sim = sim::Sim::start(config, "127.0.0.1:0".parse().unwrap()).await.unwrap();
    let source = SourceConfig {
        name: "bench".into(),
        kind: SourceKind::Sim,
        rest_base: Some(sim.rest_base()),
        ws_base: Some(sim.ws_base()),
        ..SourceConfig::default()
    };
    let endpoint = Endpoint { rest_base: sim.rest_base(), ws_base: sim.ws_base(), embedded: false };
    let sources = Sources::start(&[source], vec![endpoint], &[], shutdown).await.unwrap();
    sources.keep_clocks(Duration::from_secs(10), shutdown);
    (sim, sources)
}

async fn run(series: usize, minutes: usize, derived: Vec<Timeframe>, label: &str) {
    let nats = std::env::var("MILLRACE_TEST_NATS").unwrap_or("nats://127.0.0.1:4222".into());
    let client = async_nats::connect(&nats).await.expect("NATS (scripts/services)");
    let prefix = format!("bench{}_{}", std::process::id(), derived.len());
    let subjects = Subjects::new(&prefix);
    let cluster = ClusterConfig { tick_ms: 100, ..ClusterConfig::default() };
    let js = async_nats::jetstream::new(client.clone());
    ensure_stream(&js, &subjects, &cluster).await.unwrap();
    let db = tokio::task::block_in_place(|| PgDb::fresh("persistbench"));
    let url = match std::env::var("MILLRACE_PG_SSLMODE") {
        Ok(mode) => format!("{}?sslmode={mode}", db.url()),
        Err(_) => db.url().to_string(),
    };
    let store: Arc<dyn CandleStore> =
        Arc::new(tokio::task::block_in_place(|| PostgresStore::open(&url)).unwrap());
    let ids: Vec<SeriesId> =
        (0..series).map(|s| format!("bench:spot:S{s}/USDT:1m").parse().unwrap()).collect();
    let total = series * minutes;
    let shutdown = Shutdown::new();
    let (_sim, sources) = sources(series, &shutdown).await;
    while sources.all()[0].clock_now_ms().is_none() {
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    // the newest `minutes` closed minutes
    let first = (server::clock::wall_clock_ms() / MIN - minutes as i64 - 1) * MIN;

    // 1. forward, as the workers' pipelines do (batches of 200 per series)
    let forward = JetStreamForward::new(js.clone(), subjects.clone());
    let t0 = Instant::now();
    for start in (0..minutes).step_by(200) {
        for (s, id) in ids.iter().enumerate() {
            let batch = (start..(start + 200).min(minutes))
                .map(|m| candle(first + m as i64 * MIN, s as i64))
                .collect();
            forward.forward(id.clone(), batch).await.unwrap();
        }
    }
    let fwd = t0.elapsed();

    // 2. persist
    let bus: Arc<dyn Bus> =
        Arc::new(NatsBus::new(client.clone(), &prefix, Publisher::Gateway, 1024, &shutdown));
    let stats = Arc::new(PersisterStats::default());
    let persister = Persister {
        client: client.clone(),
        subjects: subjects.clone(),
        cluster,
        derived: derived.clone(),
        writer: CandleWriter::new(store.clone(), bus),
        id: "bench".into(),
        stats: stats.clone(),
        leading: tokio::sync::watch::channel(false).0,
        bounds: ClusterBounds::new(sources, cluster_retention_s(), 120),
        poison: Arc::new(PoisonStats::default()),
    };
    let t0 = Instant::now();
    let task = tokio::spawn(persister.run(shutdown.clone()));
    while (stats.candles.load(Relaxed) as usize) < total {
        assert!(t0.elapsed() < Duration::from_secs(600), "persister stalled: {stats:?}");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let took = t0.elapsed();
    shutdown.stop();
    let _ = task.await;
    let stored: usize = tokio::task::block_in_place(|| {
        ids.iter().map(|id| store.candles(id, Some(0), None, minutes + 1).unwrap().len()).sum()
    });
    assert_eq!(stored, total, "every candle stored once");
    println!(
        "{label}: {series} series x {minutes} minutes = {total} candles: forward {:.0} candles/s \
         ({:.2} s); persist {:.0} candles/s ({:.2} s, {} transactions, {} failures)",
        total as f64 / fwd.as_secs_f64(),
        fwd.as_secs_f64(),
        total as f64 / took.as_secs_f64(),
        took.as_secs_f64(),
        stats.batches.load(Relaxed),
        stats.write_failures.load(Relaxed),
    );
    server::cluster::remove_streams(&js, &subjects).await;
    tokio::task::block_in_place(move || {
        store.close();
        drop(store);
        drop(db);
    });
}

/// `cluster.bus_retention_s`'s default.
fn cluster_retention_s() -> u64 {
    ClusterConfig::default().bus_retention_s
}

fn main() {
    // `RUST_LOG=server::cluster::candles=debug` shows each round.
    if std::env::var_os("RUST_LOG").is_some() {
        tracing_subscriber::fmt()
            .with_env_filter(tracing_subscriber::EnvFilter::from_default_env())
            .with_writer(std::io::stderr)
            .init();
    }
    let series = setting("series", 20);
    let minutes = setting("minutes", 10_000);
    let rt = tokio::runtime::Builder::new_multi_thread().enable_all().build().unwrap();
    rt.block_on(async {
        run(series, minutes, Vec::new(), "1m only").await;
        run(series, minutes, server::config::IngestConfig::default().derived, "1m + derived").await;
    });
}
