//! PostgreSQL store throughput, against raw COPY measured in the same run (a load tool, not
//! criterion: each figure is one sustained run of many transactions).
//!
//! For each batch size (200 rows, the live pipeline's `batch_max`; 5,000 rows, a persister
//! draining JetStream), in a fresh database each:
//! - `raw COPY`: the rows COPYed into a bare table with the same columns and primary key, one
//!   transaction per batch, no upsert: the most PostgreSQL takes in, the anchor;
//! - `store COPY+upsert`: [`PostgresStore::write`] with [`WriteMethod::CopyStaging`];
//! - `store unnest upsert`: [`PostgresStore::write`] with [`WriteMethod::Unnest`];
//! - `store upsert, rows exist`: the default method re-writing stored rows (the update path).
//!
//! `cargo bench -p server --bench store_pg` (`MILLRACE_PG_BENCH=batches=…,series=…` to change the
//! run; `MILLRACE_TEST_PG` picks the server, as for the tests).

use std::io::Write as _;
use std::time::Instant;

use server::store::postgres::{copy_text, PgOptions, PostgresStore, WriteMethod};
use server::store::{CandleStore, SeriesRows};
use shared::candle::Candle;
use shared::protocol::SeriesId;
use testkit::PgDb;

mod common;

use common::{candle, MIN};

/// `batches` batches of `rows` rows over `series` series, new minutes each batch.
fn batches(n: usize, rows: usize, series: usize) -> Vec<Vec<Vec<Candle>>> {
    let per = (rows / series) as i64;
    (0..n as i64)
        .map(|b| {
            (0..series as i64)
                .map(|s| (0..per).map(|i| candle((b * per + i) * MIN, s)).collect())
                .collect()
        })
        .collect()
}

fn options(method: WriteMethod) -> PgOptions {
    PgOptions { method, ..PgOptions::default() }
}

fn through_store(store: &PostgresStore, ids: &[SeriesId], data: &[Vec<Vec<Candle>>]) -> f64 {
    let t0 = Instant::now();
    let mut rows = 0;
    for batch in data {
        let b: Vec<SeriesRows<'_>> =
            ids.iter().zip(batch).map(|(series, candles)| SeriesRows { series, candles }).collect();
        rows += store.write(&b).unwrap();
    }
    rows as f64 / t0.elapsed().as_secs_f64()
}

fn raw_copy(db: &PgDb, data: &[Vec<Vec<Candle>>]) -> f64 {
    let mut client = db.client();
    client
        .batch_execute(
            "CREATE TABLE raw (series_id integer NOT NULL, open_time bigint NOT NULL,
               open bigint NOT NULL, high bigint NOT NULL, low bigint NOT NULL,
               close bigint NOT NULL, volume numeric(40, 0) NOT NULL,
               trades numeric(20, 0) NOT NULL, minutes bigint NOT NULL,
               PRIMARY KEY (series_id, open_time))",
        )
        .unwrap();
    let t0 = Instant::now();
    let mut rows = 0;
    for batch in data {
        let batch_rows: Vec<(i32, &Candle)> = batch
            .iter()
            .enumerate()
            .flat_map(|(s, candles)| candles.iter().map(move |c| (s as i32, c)))
            .collect();
        rows += batch_rows.len();
        let text = copy_text(&batch_rows);
        let mut tx = client.transaction().unwrap();
        let mut w = tx.copy_in("COPY raw FROM STDIN").unwrap();
        w.write_all(&text).unwrap();
        w.finish().unwrap();
        tx.commit().unwrap();
    }
    rows as f64 / t0.elapsed().as_secs_f64()
}

fn main() {
    if std::env::args().any(|a| a == "--list") {
        return; // `cargo test --benches` lists benches; this one needs PostgreSQL
    }
    let mut cfg = [("batches", 0usize), ("series", 8)];
    if let Ok(spec) = std::env::var("MILLRACE_PG_BENCH") {
        for kv in spec.split(',').filter(|kv| !kv.is_empty()) {
            let (k, v) = kv.split_once('=').expect("key=value");
            let slot = cfg.iter_mut().find(|(n, _)| *n == k).expect("batches or series");
            slot.1 = v.parse().expect("a number");
        }
    }
    let [(_, n_batches), (_, n_series)] = cfg;
    let ids: Vec<SeriesId> =
        (0..n_series).map(|i| format!("binance:spot:SYM{i}/USDT:1m").parse().unwrap()).collect();
    println!(
        "PostgreSQL store writes, rows/s (load {})",
        std::fs::read_to_string("/proc/loadavg").unwrap_or_default().trim()
    );
    for rows in [200usize, 5000] {
        let n = if n_batches > 0 { n_batches } else { 400_000 / rows };
        let data = batches(n, rows, n_series);
        let raw = raw_copy(&PgDb::fresh("bench_raw"), &data);
        let db = PgDb::fresh("bench_copy");
        let store = PostgresStore::open_with(db.url(), options(WriteMethod::CopyStaging)).unwrap();
        let copy = through_store(&store, &ids, &data);
        let again = through_store(&store, &ids, &data);
        drop(store);
        let db = PgDb::fresh("bench_unnest");
        let store = PostgresStore::open_with(db.url(), options(WriteMethod::Unnest)).unwrap();
        let unnest = through_store(&store, &ids, &data);
        println!(
            "  {n} batches x {rows} rows over {n_series} series: raw COPY {raw:.0}, \
             store COPY+upsert {copy:.0} ({:.0} % of raw), store unnest upsert {unnest:.0} \
             ({:.0} %), store upsert, rows exist {again:.0}",
            copy / raw * 100.0,
            unnest / raw * 100.0,
        );
    }
}
