//! Storage and bus throughput.
//!
//! - `store/write/*`: closed 1m candles persisted per second into a real SQLite file (under
//!   `target/tmp`, on disk) through [`SqliteStore::write`]: batches of 200 rows across 8 series
//!   (the pipeline's `batch_max`), of 5,000 rows, and a replay of already stored rows (upserts).
//!   Every batch is one transaction; new batches append after the previous ones, as live ingest
//!   and newest-first backfill pages do.
//! - `store/raw/*`: the same rows through plain rusqlite (SQLite defaults plus WAL and
//!   `synchronous = NORMAL`, one prepared single-row upsert, one transaction per batch) into the
//!   store's layout (a table per series) and into one clustered `(series_id, open_time) WITHOUT
//!   ROWID` table: the baselines the store and its layout were chosen against.
//! - `store/read/*`: a chart load (`candles`, newest 1,000 rows).
//! - `bus/*`: [`InProcessBus`] publish cost, and messages delivered per second to N subscribers
//!   (each a tokio task receiving every message), on a 2-worker runtime.
//!
//! `cargo bench -p server --bench store` (a filter selects: `-- store/write`, `-- bus`).
//! With `MILLRACE_STORE_LOAD` set it is a load tool instead (see [`load`]).

use std::hint::black_box;
use std::path::PathBuf;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use criterion::{criterion_group, Criterion, Throughput};
use server::bus::{Bus, InProcessBus};
use server::store::sqlite::{SqliteOptions, SqliteStore};
use server::store::{CandleStore, SeriesRows};
use shared::candle::Candle;
use shared::protocol::SeriesId;

mod common;

use common::{candle, MIN};

fn db_path(name: &str) -> PathBuf {
    let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("bench-store");
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join(format!("{name}.db"));
    for suffix in ["", "-wal", "-shm"] {
        let _ = std::fs::remove_file(format!("{}{suffix}", path.display()));
    }
    path
}

fn series(n: usize) -> Vec<SeriesId> {
    (0..n).map(|i| format!("binance:spot:SYM{i}/USDT:1m").parse().unwrap()).collect()
}

/// Fills `out[s]` with `per_series` candles of series `s` starting at minute `*next`.
fn next_batch(out: &mut [Vec<Candle>], per_series: usize, next: &mut i64) {
    for (s, rows) in out.iter_mut().enumerate() {
        rows.clear();
        rows.extend((0..per_series as i64).map(|i| candle((*next + i) * MIN, s as i64)));
    }
    *next += per_series as i64;
}

fn store_write(c: &mut Criterion) {
    let mut g = c.benchmark_group("store/write");
    for (name, n_series, rows) in [("batch200_8series", 8, 200), ("batch5000_8series", 8, 5000)] {
        let store = SqliteStore::open(&db_path(name)).unwrap();
        let ids = series(n_series);
        let mut bufs = vec![Vec::new(); n_series];
        let mut next = 0;
        g.throughput(Throughput::Elements(rows as u64));
        g.bench_function(name, |b| {
            b.iter(|| {
                next_batch(&mut bufs, rows / n_series, &mut next);
                let batch: Vec<SeriesRows<'_>> = ids
                    .iter()
                    .zip(&bufs)
                    .map(|(series, candles)| SeriesRows { series, candles })
                    .collect();
                store.write(&batch).unwrap()
            })
        });
    }
    // Replays: every row already stored (the upsert's update path).
    {
        let store = SqliteStore::open(&db_path("upsert200")).unwrap();
        let ids = series(8);
        let mut bufs = vec![Vec::new(); 8];
        let mut next = 0;
        next_batch(&mut bufs, 25, &mut next);
        let batch: Vec<SeriesRows<'_>> =
            ids.iter().zip(&bufs).map(|(series, candles)| SeriesRows { series, candles }).collect();
        store.write(&batch).unwrap();
        g.throughput(Throughput::Elements(200));
        g.bench_function("upsert200_existing", |b| b.iter(|| store.write(&batch).unwrap()));
    }
    g.finish();
}

/// The candle layout the store replaced (one clustered table for all series), for comparison.
const SINGLE_TABLE: &str = "CREATE TABLE candles (
    series_id INTEGER NOT NULL, open_time INTEGER NOT NULL, open INTEGER NOT NULL,
    high INTEGER NOT NULL, low INTEGER NOT NULL, close INTEGER NOT NULL, volume ANY NOT NULL,
    trades INTEGER NOT NULL, minutes INTEGER NOT NULL, PRIMARY KEY (series_id, open_time)
) STRICT, WITHOUT ROWID";

/// Plain rusqlite with SQLite's defaults plus WAL and `synchronous = NORMAL` (so checkpoints run
/// inside commits), one prepared single-row upsert per table, one transaction per batch of 200
/// rows over 8 series: into the store's layout (a table per series) and into the single
/// clustered table it replaced.
fn store_raw(c: &mut Criterion) {
    let mut g = c.benchmark_group("store/raw");
    g.throughput(Throughput::Elements(200));
    for layout in ["per_series_tables", "single_table"] {
        let mut conn = rusqlite::Connection::open(db_path(&format!("raw-{layout}"))).unwrap();
        conn.execute_batch("PRAGMA journal_mode = WAL; PRAGMA synchronous = NORMAL;").unwrap();
        let upserts: Vec<String> = (0..8)
            .map(|s| {
                let set = "open = excluded.open, high = excluded.high, low = excluded.low, close = excluded.close, \
                           volume = excluded.volume, trades = excluded.trades, minutes = excluded.minutes";
                if layout == "single_table" {
                    format!(
                        "INSERT INTO candles (series_id, open_time, open, high, low, close, volume, trades, minutes) \
                         VALUES ({s}, ?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8) ON CONFLICT (series_id, open_time) DO UPDATE SET {set}"
                    )
                } else {
                    conn.execute_batch(&server::store::sqlite::candle_table_ddl(s)).unwrap();
                    format!(
                        "INSERT INTO candles_{s} (open_time, open, high, low, close, volume, trades, minutes) \
                         VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8) ON CONFLICT (open_time) DO UPDATE SET {set}"
                    )
                }
            })
            .collect();
        if layout == "single_table" {
            conn.execute_batch(SINGLE_TABLE).unwrap();
        }
        let mut bufs = vec![Vec::new(); 8];
        let mut next = 0;
        g.bench_function(format!("{layout}_batch200_8series"), |b| {
            b.iter(|| {
                next_batch(&mut bufs, 25, &mut next);
                let tx = conn.transaction().unwrap();
                for (sql, rows) in upserts.iter().zip(&bufs) {
                    let mut stmt = tx.prepare_cached(sql).unwrap();
                    for c in rows {
                        stmt.execute(rusqlite::params![
                            c.open_time,
                            c.open.raw(),
                            c.high.raw(),
                            c.low.raw(),
                            c.close.raw(),
                            c.volume.raw() as i64,
                            c.trades as i64,
                            c.minutes
                        ])
                        .unwrap();
                    }
                }
                tx.commit().unwrap();
            })
        });
    }
    g.finish();
}

fn store_read(c: &mut Criterion) {
    let mut g = c.benchmark_group("store/read");
    let store = SqliteStore::open(&db_path("read")).unwrap();
    let ids = series(4);
    let mut bufs = vec![Vec::new(); 4];
    let mut next = 0;
    for _ in 0..50 {
        next_batch(&mut bufs, 5000, &mut next);
        let batch: Vec<SeriesRows<'_>> =
            ids.iter().zip(&bufs).map(|(series, candles)| SeriesRows { series, candles }).collect();
        store.write(&batch).unwrap();
    }
    g.throughput(Throughput::Elements(1000));
    g.bench_function("newest1000_of_250k", |b| {
        b.iter(|| {
            let rows = store.candles(&ids[1], None, None, 1000).unwrap();
            assert_eq!(rows.len(), 1000);
            rows
        })
    });
    g.finish();
}

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().unwrap()
}

/// Messages per round: the publisher waits for every subscriber between rounds, so with a
/// channel of 1,024 nobody lags and every message counts as delivered.
const ROUND: usize = 512;

fn bus_fanout(c: &mut Criterion) {
    let rt = runtime();
    let mut g = c.benchmark_group("bus");
    let payload = Bytes::from(vec![b'x'; 200]);

    g.throughput(Throughput::Elements(1));
    {
        let bus = InProcessBus::default();
        let _other = bus.subscribe("kline@binance:spot:ETH/USDT:1m");
        g.bench_function("publish_no_subscribers", |b| {
            b.iter(|| bus.publish(black_box("kline@binance:spot:BTC/USDT:1m"), payload.clone()))
        });
        let _lagging = bus.subscribe("kline@binance:spot:BTC/USDT:1m");
        g.bench_function("publish_1_idle_subscriber", |b| {
            b.iter(|| bus.publish(black_box("kline@binance:spot:BTC/USDT:1m"), payload.clone()))
        });
    }

    for subs in [1usize, 100, 1000, 5000] {
        g.throughput(Throughput::Elements((ROUND * subs) as u64));
        g.bench_function(format!("delivered_to_{subs}_subscribers"), |b| {
            b.iter_custom(|iters| {
                rt.block_on(async {
                    let bus = InProcessBus::new(1024);
                    let topic = "kline@binance:spot:BTC/USDT:1m";
                    let done = Arc::new(AtomicUsize::new(0));
                    let round_done = Arc::new(tokio::sync::Notify::new());
                    let mut tasks = Vec::with_capacity(subs);
                    for _ in 0..subs {
                        let mut sub = bus.subscribe(topic);
                        let (done, round_done) = (done.clone(), round_done.clone());
                        tasks.push(tokio::spawn(async move {
                            let mut bytes = 0usize;
                            for _ in 0..iters {
                                for _ in 0..ROUND {
                                    bytes += sub.recv().await.unwrap().payload.len();
                                }
                                if done.fetch_add(1, Ordering::AcqRel) + 1 == subs {
                                    done.store(0, Ordering::Release);
                                    round_done.notify_one();
                                }
                            }
                            black_box(bytes)
                        }));
                    }
                    let start = Instant::now();
                    for _ in 0..iters {
                        for _ in 0..ROUND {
                            bus.publish(topic, payload.clone());
                        }
                        round_done.notified().await;
                    }
                    let elapsed = start.elapsed();
                    for t in tasks {
                        t.await.unwrap();
                    }
                    elapsed
                })
            })
        });
    }
    g.finish();
}

criterion_group! {
    name = benches;
    config = Criterion::default().sample_size(20).warm_up_time(Duration::from_secs(1)).measurement_time(Duration::from_secs(5));
    targets = store_write, store_raw, store_read, bus_fanout
}

/// The load tool: `MILLRACE_STORE_LOAD=batches=3000,rows=200,series=8 cargo bench -p server
/// --bench store` writes that many back-to-back batches into a fresh file and prints sustained
/// rows/s, the CPU time the process used (writer and checkpointer) and the bytes it wrote: a
/// steadier figure than wall time on a machine shared with other work. `writer_cache_kib=N` sets
/// the writer's page cache (`store.sqlite_writer_cache_kib`).
fn load(spec: &str) {
    let writer_cache = server::store::sqlite::WRITER_CACHE_KIB as usize;
    let mut cfg =
        [("batches", 3000usize), ("rows", 200), ("series", 8), ("writer_cache_kib", writer_cache)];
    for kv in spec.split(',').filter(|kv| !kv.is_empty()) {
        let (k, v) = kv.split_once('=').expect("key=value");
        let slot = cfg
            .iter_mut()
            .find(|(name, _)| *name == k)
            .unwrap_or_else(|| panic!("unknown key {k}"));
        slot.1 = v.parse().expect("a number");
    }
    let [(_, batches), (_, rows), (_, n_series), (_, writer_cache_kib)] = cfg;
    let path = db_path("load");
    let store = SqliteStore::open_with(
        &path,
        SqliteOptions { writer_cache_kib: writer_cache_kib as u32, ..SqliteOptions::default() },
    )
    .unwrap();
    let ids = series(n_series);
    let mut bufs = vec![Vec::new(); n_series];
    let mut next = 0;
    let (cpu0, io0, t0) = (cpu_seconds(), written_bytes(), Instant::now());
    for _ in 0..batches {
        next_batch(&mut bufs, rows / n_series, &mut next);
        let batch: Vec<SeriesRows<'_>> =
            ids.iter().zip(&bufs).map(|(series, candles)| SeriesRows { series, candles }).collect();
        store.write(&batch).unwrap();
    }
    let wall = t0.elapsed().as_secs_f64();
    drop(store); // stops the checkpointer; the last connection checkpoints the rest
    let (cpu, io) = (cpu_seconds() - cpu0, written_bytes() - io0);
    let total = (batches * (rows / n_series) * n_series) as f64;
    let file = std::fs::metadata(&path).map(|m| m.len()).unwrap_or(0);
    println!(
        "{batches} batches x {rows} rows over {n_series} series, writer cache {writer_cache_kib} KiB: \
         {:.0} rows/s wall ({wall:.2} s), \
         {:.2} us CPU/row, {:.0} bytes written/row, file {:.1} MiB, load {}",
        total / wall,
        cpu / total * 1e6,
        io as f64 / total,
        file as f64 / (1 << 20) as f64,
        std::fs::read_to_string("/proc/loadavg").unwrap_or_default().trim(),
    );
}

/// User + system CPU seconds of this process (Linux; 0 elsewhere).
fn cpu_seconds() -> f64 {
    let stat = std::fs::read_to_string("/proc/self/stat").unwrap_or_default();
    let fields: Vec<&str> =
        stat.rsplit_once(')').map_or("", |(_, r)| r).split_whitespace().collect();
    let ticks = |i: usize| fields.get(i).and_then(|v| v.parse::<f64>().ok()).unwrap_or(0.0);
    (ticks(11) + ticks(12)) / 100.0 // utime, stime (fields 14, 15), in USER_HZ = 100
}

/// Bytes this process wrote through write calls (`wchar`, Linux; 0 elsewhere).
fn written_bytes() -> u64 {
    std::fs::read_to_string("/proc/self/io")
        .unwrap_or_default()
        .lines()
        .find_map(|l| l.strip_prefix("wchar: ").and_then(|v| v.parse().ok()))
        .unwrap_or(0)
}

fn main() {
    if let Ok(spec) = std::env::var("MILLRACE_STORE_LOAD") {
        load(&spec);
        return;
    }
    benches();
    Criterion::default().configure_from_args().final_summary();
}
