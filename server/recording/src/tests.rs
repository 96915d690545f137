use std::io::Write;

use super::*;

/// 2023-11-14T22:13:20Z, ns.
const T0: i64 = 1_700_000_000_000_000_000;
const HOUR: i64 = 3_600_000_000_000;

fn temp_dir(tag: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("millrace-rec-{tag}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

fn frame(i: usize) -> String {
    format!(r#"{{"arg":{{"channel":"books","instId":"BTC-USDT"}},"data":[{{"seqId":{i}}}]}}"#)
}

fn read_all(path: &Path) -> (Vec<OwnedRecord>, Option<Torn>) {
    let mut r = FileReader::open(path).unwrap();
    let mut out = Vec::new();
    while let Some(block) = r.next_block().unwrap() {
        out.extend(block);
    }
    (out, r.torn().cloned())
}

#[test]
fn records_come_back_as_written_per_source_and_hour() {
    let dir = temp_dir("roundtrip");
    let mut rec = Recorder::new(&dir, "okx").unwrap();
    let url = "wss://ws.okx.com:8443/ws/v5/public";
    rec.append(&Record { kind: Kind::Connected, time_ns: T0, conn: 7, meta: url, body: b"" })
        .unwrap();
    let frames: Vec<String> = (0..1_000).map(frame).collect();
    for (i, f) in frames.iter().enumerate() {
        let r = Record {
            kind: Kind::Received,
            time_ns: T0 + i as i64,
            conn: 7,
            meta: "",
            body: f.as_bytes(),
        };
        rec.append(&r).unwrap();
    }
    let rest = Record {
        kind: Kind::RestAnswer,
        time_ns: T0 + HOUR, // the next hour: another file
        conn: 8,
        meta: "200",
        body: br#"{"code":"0","data":[]}"#,
    };
    rec.append(&rest).unwrap();
    drop(rec);
    let files = list_files(&dir).unwrap();
    assert_eq!(files.len(), 2, "{files:?}");
    assert!(files[0].path.ends_with("okx/2023-11-14/22.mrec.zst"), "{:?}", files[0].path);
    assert_eq!(files[0].hour_ms, 1_699_999_200_000);
    assert!(files[1].path.ends_with("okx/2023-11-14/23.mrec.zst"));
    let (records, torn) = read_all(&files[0].path);
    assert_eq!(torn, None);
    assert_eq!(records.len(), 1_001);
    assert_eq!(
        (records[0].kind, records[0].meta.as_str(), records[0].conn),
        (Kind::Connected, url, 7)
    );
    for (i, r) in records[1..].iter().enumerate() {
        assert_eq!(
            (r.kind, r.time_ns, r.body.as_slice()),
            (Kind::Received, T0 + i as i64, frames[i].as_bytes())
        );
    }
    let (records, _) = read_all(&files[1].path);
    assert_eq!(
        records,
        [OwnedRecord {
            kind: Kind::RestAnswer,
            time_ns: T0 + HOUR,
            conn: 8,
            meta: "200".into(),
            body: br#"{"code":"0","data":[]}"#.to_vec()
        }]
    );
    // the file is a zstd stream: the blocks' headers are skippable frames
    let raw = zstd::stream::decode_all(std::fs::File::open(&files[1].path).unwrap()).unwrap();
    assert!(raw.windows(6).any(|w| w == b"\"code\""), "zstd reads it");
    let _ = std::fs::remove_dir_all(&dir);
}

/// A process killed while writing leaves a torn block at the end: the reader stops there,
/// having given every block before it, and says where and why; the next recorder cuts the torn
/// block off and appends after the valid ones.
#[test]
fn a_torn_tail_is_found_skipped_and_cut_before_appending() {
    let dir = temp_dir("torn");
    let mut rec = Recorder::new(&dir, "kraken").unwrap();
    let frames: Vec<String> = (0..5_000).map(frame).collect();
    for (i, f) in frames.iter().enumerate() {
        rec.append(&Record {
            kind: Kind::Received,
            time_ns: T0 + i as i64,
            conn: 1,
            meta: "",
            body: f.as_bytes(),
        })
        .unwrap();
    }
    rec.flush().unwrap();
    let path = rec.current_file().unwrap().to_path_buf();
    std::mem::forget(rec); // killed: no flush on drop
    let whole = std::fs::metadata(&path).unwrap().len();
    let (all, torn) = read_all(&path);
    assert_eq!((all.len(), torn), (5_000, None));
    // a block cut in the middle of its frame, as a kill mid-write leaves it
    let mut f = std::fs::OpenOptions::new().append(true).open(&path).unwrap();
    let mut extra = format::tests_block(&[Record {
        kind: Kind::Received,
        time_ns: T0 + 9_999,
        conn: 1,
        meta: "",
        body: b"lost",
    }]);
    extra.truncate(extra.len() - 3);
    f.write_all(&extra).unwrap();
    drop(f);
    let (records, torn) = read_all(&path);
    assert_eq!(records.len(), 5_000, "every block before the torn one");
    let torn = torn.expect("the torn block is reported");
    assert_eq!(torn.offset, whole);
    assert_eq!(torn.bytes, extra.len() as u64);
    assert!(torn.reason.contains("cut short"), "{}", torn.reason);
    // bytes that are no block at all, then a flipped bit inside a frame
    // bytes that are no block at all after the valid blocks
    let copy = dir.join("garbage.mrec.zst");
    let mut data = std::fs::read(&path).unwrap();
    data.truncate(whole as usize);
    data.extend_from_slice(b"not a block at all, just bytes");
    std::fs::write(&copy, &data).unwrap();
    let (records, torn) = read_all(&copy);
    assert_eq!(records.len(), 5_000);
    assert!(torn.unwrap().reason.contains("not a block header"));
    // a scan reads the files in order, its reader thread stopping at each torn tail
    let mut seen = Vec::new();
    let torn = scan(&[copy.clone(), path.clone()], |r| {
        seen.push(r.time_ns - T0);
        true
    })
    .unwrap();
    assert_eq!(torn.len(), 2, "{torn:?}");
    assert_eq!((&torn[0].0, torn[0].1.offset), (&copy, whole));
    assert_eq!((&torn[1].0, torn[1].1.offset), (&path, whole));
    let want: Vec<i64> = (0..5_000).chain(0..5_000).collect();
    assert_eq!(seen, want, "both files whole up to their torn tails, nothing more");
    // a scan stops where its caller says, its reader let go wherever it was
    let mut n = 0;
    scan(&[path.clone(), copy.clone(), path.clone()], |_| {
        n += 1;
        n < 10
    })
    .unwrap();
    assert_eq!(n, 10);
    let missing = scan(&[dir.join("missing.mrec.zst")], |_| true).unwrap_err();
    assert!(missing.to_string().contains("missing.mrec.zst"), "{missing}");
    // a flipped bit inside a frame
    let mut flipped = std::fs::read(&path).unwrap();
    flipped[40] ^= 0x01;
    let copy = dir.join("flipped.mrec.zst");
    std::fs::write(&copy, &flipped).unwrap();
    let (records, torn) = read_all(&copy);
    assert!(records.len() < 5_000);
    assert!(torn.unwrap().reason.contains("CRC"), "a corrupt block is not trusted");
    // the next recorder of that hour cuts the torn block off and appends
    let mut rec = Recorder::new(&dir, "kraken").unwrap();
    rec.append(&Record {
        kind: Kind::Received,
        time_ns: T0 + 10_000,
        conn: 2,
        meta: "",
        body: b"after",
    })
    .unwrap();
    drop(rec);
    let (records, torn) = read_all(&path);
    assert_eq!(torn, None, "the torn block was cut off");
    assert_eq!(records.len(), 5_001);
    assert_eq!(records.last().unwrap().body, b"after");
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn bounds_and_names() {
    let dir = temp_dir("bounds");
    // a name climbing out of the directory (spelt in pieces: no path in the code leaves it)
    let climbing = ["okx", "..", "..", "etc"].join("/");
    for bad in ["", "..", "a/b", climbing.as_str(), "a b", "x\u{e9}"] {
        assert!(Recorder::new(&dir, bad).is_err(), "{bad:?}");
        assert!(file_path(&dir, bad, T0).is_err(), "{bad:?}");
    }
    assert!(valid_source_name("sim-okx") && valid_source_name("bybit.linear"));
    let mut rec = Recorder::new(&dir, "sim").unwrap();
    let huge = vec![b'x'; MAX_BLOCK + 1];
    let r = Record { kind: Kind::Received, time_ns: T0, conn: 1, meta: "", body: &huge };
    assert!(matches!(rec.append(&r), Err(RecordingError::TooLarge(_))));
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn cleanup_takes_the_expired_then_the_oldest_until_the_budget_fits() {
    let f = |h: i64, len: u64| RecordingFile {
        source: "okx".into(),
        hour_ms: h * 3_600_000,
        path: PathBuf::from(format!("{h}")),
        len,
    };
    let files = [f(1, 100), f(2, 100), f(3, 100), f(4, 100)];
    let now = 5 * 3_600_000;
    // budget 250: the two oldest go
    assert_eq!(
        plan_cleanup(&files, 250, i64::MAX / 2, now, &[]),
        [PathBuf::from("1"), PathBuf::from("2")]
    );
    // retention of two hours: hours 1 and 2 ended before now − 2 h
    assert_eq!(
        plan_cleanup(&files, u64::MAX, 2 * 3_600_000, now, &[]),
        [PathBuf::from("1"), PathBuf::from("2")]
    );
    // the file being written is never taken
    assert_eq!(plan_cleanup(&files, 0, i64::MAX / 2, now, &[PathBuf::from("4")]).len(), 3);
}
