//! History out as files (issue 30): a series' stored candles exported as Parquet and CSV, over
//! HTTP (streamed) and from the command line, read back by readers nobody here wrote (pyarrow
//! and Python's csv module), equal to the REST klines of the same range, with typed columns
//! (a UTC millisecond timestamp, decimals of scale 8, unsigned integers).

use std::path::Path;

use shared::fixed::{Price, Volume};
use testkit::*;

const SERIES: &str = "sim:spot:BTC/USDT:1m";

/// Reads `path` with pyarrow (`parquet`) or Python's csv module (`csv`): the schema's text and
/// the rows as `[open_time_ms, open, high, low, close, volume, trades, minutes]` strings, and
/// the Parquet file's row groups.
fn python_read(kind: &str, path: &Path) -> serde_json::Value {
    let script = r#"
import csv, json, sys, datetime
kind, path = sys.argv[1], sys.argv[2]
if kind == "parquet":
    import pyarrow.parquet as pq
    f = pq.ParquetFile(path)
    t = f.read()
    rows = [[int(r["open_time"].timestamp() * 1000)] + [str(r[k]) for k in ("open", "high", "low", "close", "volume")] + [r["trades"], r["minutes"]] for r in t.to_pylist()]
    meta = {k.decode(): v.decode() for k, v in (f.metadata.metadata or {}).items() if k.startswith(b"millrace")}
    print(json.dumps({"schema": str(t.schema), "row_groups": f.num_row_groups, "meta": meta, "rows": rows}))
else:
    with open(path, newline="") as fh:
        r = list(csv.DictReader(fh))
    ms = lambda s: int(datetime.datetime.fromisoformat(s.replace("Z", "+00:00")).timestamp() * 1000)
    rows = [[ms(x["open_time"])] + [x[k] for k in ("open", "high", "low", "close", "volume")] + [int(x["trades"]), int(x["minutes"])] for x in r]
    print(json.dumps({"rows": rows}))
"#;
    let out = std::process::Command::new("python3")
        .args(["-c", script, kind])
        .arg(path)
        .output()
        .expect("python3 (scripts/setup installs pyarrow)");
    assert!(out.status.success(), "python: {}", String::from_utf8_lossy(&out.stderr));
    serde_json::from_slice(&out.stdout).unwrap()
}

/// The exported rows, as fixed point, against the REST klines (`[open time, open, high, low,
/// close, volume, close time, …, trades, …]`).
fn assert_rows_equal(what: &str, rows: &serde_json::Value, klines: &[serde_json::Value]) {
    let rows = rows.as_array().unwrap();
    assert_eq!(rows.len(), klines.len(), "{what}: as many rows as the REST answer");
    for (r, k) in rows.iter().zip(klines) {
        assert_eq!(r[0].as_i64(), k[0].as_i64(), "{what}: open time");
        for i in 1..=4 {
            let (ours, rest) = (r[i].as_str().unwrap(), k[i].as_str().unwrap());
            assert_eq!(
                Price::parse(ours).unwrap(),
                Price::parse(rest).unwrap(),
                "{what}: {ours} vs {rest}"
            );
        }
        let (ours, rest) = (r[5].as_str().unwrap(), k[5].as_str().unwrap());
        assert_eq!(Volume::parse(ours).unwrap(), Volume::parse(rest).unwrap(), "{what}: volume");
        assert_eq!(r[6].as_u64(), k[8].as_u64(), "{what}: trades");
        assert_eq!(r[7].as_u64(), Some(1), "{what}: a 1m candle is one minute");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn candles_export_as_parquet_and_csv_equal_to_the_rest_answers() {
    let config = busy_config(); // the simulator at 60x, a day of BTC 1m backfilled
    let data_dir = config.server.data_dir.clone();
    let server = TestServer::start(config).await;
    let db = server.db_path();
    eventually("a day of minutes stored", || async {
        (testkit::stored(&db, SERIES).len() >= 1_100).then_some(())
    })
    .await;
    let stored = testkit::stored(&db, SERIES);
    let (from, to) = (stored[10].open_time, stored[10 + 999].open_time);
    let klines = server
        .get_json(&format!(
            "/api/v1/klines?series={SERIES}&startTime={from}&endTime={to}&limit=1000"
        ))
        .await;
    let klines = klines.as_array().unwrap().clone();
    assert_eq!(klines.len(), 1_000);

    let dir = temp_dir("export");
    let http = reqwest::Client::new();
    for format in ["parquet", "csv"] {
        let url = format!(
            "http://{}/api/v1/export/candles?series={SERIES}&from={from}&to={to}&format={format}",
            server.addr
        );
        let resp = http.get(&url).send().await.unwrap();
        assert_eq!(resp.status(), 200, "{format}");
        let ct = resp.headers()["content-type"].to_str().unwrap().to_string();
        let file = dir.join(format!("http.{format}"));
        std::fs::write(&file, resp.bytes().await.unwrap()).unwrap();
        let read = python_read(format, &file);
        assert_rows_equal(&format!("HTTP {format} ({ct})"), &read["rows"], &klines);
        if format == "parquet" {
            let schema = read["schema"].as_str().unwrap();
            for typed in [
                "open_time: timestamp[ms, tz=UTC]",
                "open: decimal128(19, 8)",
                "volume: decimal128(38, 8)",
                "trades: uint64",
                "minutes: uint32",
            ] {
                assert!(schema.contains(typed), "{typed} in {schema}");
            }
            assert_eq!(read["meta"]["millrace.series"], SERIES);
            assert!(read["row_groups"].as_u64() >= Some(1));
        }
    }
    // refusals: a bad format, an unknown series, a range the wrong way round
    for (query, code) in [
        (format!("series={SERIES}&format=xlsx"), 400),
        ("series=sim:spot:NOPE/USDT:1m".to_string(), 400),
        (format!("series={SERIES}&from=10&to=5"), 400),
    ] {
        let (status, body) = server.get(&format!("/api/v1/export/candles?{query}")).await;
        assert_eq!(status, code, "{query}: {body}");
    }
    server.stop().await;

    // the command line reads the store as serve does
    let file = dir.join("cli.parquet");
    let out = std::process::Command::new(millrace_bin())
        .args(["export", "candles", "--series", SERIES, "--format", "parquet"])
        .args(["--from", &from.to_string(), "--to", &to.to_string()])
        .arg("--data-dir")
        .arg(&data_dir)
        .arg("--out")
        .arg(&file)
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    assert_rows_equal("CLI parquet", &python_read("parquet", &file)["rows"], &klines);
    let _ = std::fs::remove_dir_all(&dir);
}
