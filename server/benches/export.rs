//! Export throughput (issue 30): a series' candles out of the store as Parquet, from SQLite and
//! from PostgreSQL (a load tool, not criterion: each figure is one whole export).
//!
//! One series of `rows` 1m candles (default 1,000,000) is written to a fresh store, then exported
//! whole with [`server::export::candles`] into a sink, three times: Parquet (the target), and
//! CSV beside it; the store's own read of the same rows (in the same 65,536-row chunks, nothing
//! written) is the anchor of each run. PostgreSQL is `MILLRACE_TEST_PG` (as for the tests) and
//! skipped, saying so, when it cannot be reached; its table is analyzed after the load (as
//! autovacuum does within a minute of one).
//!
//! `cargo bench -p server --bench export` (`MILLRACE_EXPORT_BENCH=rows=…` to change the run).

use std::time::Instant;

use server::export::{candles, ExportRange, Format, CHUNK};
use server::store::{CandleStore, SeriesRows};
use shared::protocol::SeriesId;

mod common;

use common::{candle, MIN};

fn fill(store: &dyn CandleStore, series: &SeriesId, rows: usize) {
    let mut t = 0i64;
    while (t / MIN) < rows as i64 {
        let n = (rows as i64 - t / MIN).min(20_000);
        let batch: Vec<_> = (0..n).map(|i| candle(t + i * MIN, 1)).collect();
        store.write(&[SeriesRows { series, candles: &batch }]).unwrap();
        t += n * MIN;
    }
}

/// The store's own read of every row, chunk by chunk.
fn read_only(store: &dyn CandleStore, series: &SeriesId) -> (u64, f64) {
    let t0 = Instant::now();
    let (mut start, mut rows) = (0i64, 0u64);
    loop {
        let chunk = store.candles(series, Some(start), None, CHUNK).unwrap();
        let Some(last) = chunk.last() else { break };
        rows += chunk.len() as u64;
        start = last.open_time + 1;
        if chunk.len() < CHUNK {
            break;
        }
    }
    (rows, t0.elapsed().as_secs_f64())
}

fn export(store: &dyn CandleStore, series: &SeriesId, format: Format) -> (u64, f64, u64) {
    struct Counted(u64);
    impl std::io::Write for Counted {
        fn write(&mut self, b: &[u8]) -> std::io::Result<usize> {
            self.0 += b.len() as u64;
            Ok(b.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }
    let t0 = Instant::now();
    let range = ExportRange { from: 0, to: i64::MAX, max_rows: u64::MAX, format };
    let (rows, out) = candles(store, series, range, Counted(0)).unwrap();
    (rows, t0.elapsed().as_secs_f64(), out.0)
}

fn run(name: &str, store: &dyn CandleStore, series: &SeriesId, rows: usize, after_fill: &dyn Fn()) {
    let t0 = Instant::now();
    fill(store, series, rows);
    after_fill();
    println!("  {name}: {rows} candles written in {:.1} s", t0.elapsed().as_secs_f64());
    for round in 1..=3 {
        let (n, read) = read_only(store, series);
        assert_eq!(n as usize, rows);
        let (n, parquet, bytes) = export(store, series, Format::Parquet);
        assert_eq!(n as usize, rows);
        let (_, csv, csv_bytes) = export(store, series, Format::Csv);
        println!(
            "  {name} #{round}: Parquet {:.2} M rows/s ({:.1} MB), CSV {:.2} M rows/s ({:.1} MB); \
             the store's read alone {:.2} M rows/s",
            n as f64 / parquet / 1e6,
            bytes as f64 / 1e6,
            n as f64 / csv / 1e6,
            csv_bytes as f64 / 1e6,
            n as f64 / read / 1e6,
        );
    }
}

fn main() {
    if std::env::args().any(|a| a == "--list") {
        return; // `cargo test --benches` lists benches; this one writes a million rows
    }
    let rows = std::env::var("MILLRACE_EXPORT_BENCH")
        .ok()
        .and_then(|s| s.strip_prefix("rows=").and_then(|n| n.parse().ok()))
        .unwrap_or(1_000_000usize);
    let series: SeriesId = "binance:spot:BTC/USDT:1m".parse().unwrap();
    println!(
        "Export of one series' candles, whole (load {})",
        std::fs::read_to_string("/proc/loadavg").unwrap_or_default().trim()
    );
    let dir = testkit::temp_dir("export-bench");
    let sqlite = server::store::sqlite::SqliteStore::open(&dir.join("candles.db")).unwrap();
    run("SQLite", &sqlite, &series, rows, &|| {});
    drop(sqlite);
    let _ = std::fs::remove_dir_all(&dir);
    match std::panic::catch_unwind(|| testkit::PgDb::fresh("bench_export")) {
        Ok(db) => {
            let store = server::store::postgres::PostgresStore::open(db.url()).unwrap();
            // the statistics autovacuum gathers a minute after a bulk load, at once: without
            // them PostgreSQL plans a sort of the whole series for every chunk
            let analyze = || db.client().batch_execute("ANALYZE candles").unwrap();
            run("PostgreSQL", &store, &series, rows, &analyze);
        }
        Err(_) => println!("  PostgreSQL: not reachable (MILLRACE_TEST_PG), skipped"),
    }
}
