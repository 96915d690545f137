//! The `millrace` binary's `replay sse` and `replay lobster` commands, end to end: exit codes,
//! stdout, and file:line on stderr for bad input.

use std::path::PathBuf;
use std::process::{Command, Output};

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).parent().unwrap().to_path_buf()
}

fn millrace(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_millrace")).args(args).output().expect("the binary runs")
}

fn temp_dir(name: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("millrace-cli-l3-{}-{name}", std::process::id()));
    std::fs::create_dir_all(&d).unwrap();
    d
}

#[test]
fn replay_sse_on_the_real_sample() {
    let dir = replay::input::testdata_dir().join("sse-tick-by-tick");
    let (orders, trades) = (dir.join("SHorders.zip"), dir.join("SHtrans.zip"));
    let out = millrace(&[
        "replay",
        "sse",
        "--orders",
        orders.to_str().unwrap(),
        "--trades",
        trades.to_str().unwrap(),
        "--subset",
    ]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(0), "stderr: {stderr}");
    let stdout = String::from_utf8(out.stdout).unwrap();
    let lines: Vec<serde_json::Value> =
        stdout.lines().map(|l| serde_json::from_str(l).unwrap()).collect();
    assert_eq!(lines.len(), 5);
    for l in &lines {
        assert_eq!(l["ok"], true, "{l}");
        assert_eq!(l["crossed_continuous"], 0, "{l}");
        assert_eq!(l["top5"]["bids"].as_array().unwrap().len(), 5);
    }
    // strict sequencing on a five-security subset of the channel fails with exit 1
    let out = millrace(&[
        "replay",
        "sse",
        "--orders",
        orders.to_str().unwrap(),
        "--trades",
        trades.to_str().unwrap(),
    ]);
    assert_eq!(out.status.code(), Some(1));
}

/// `millrace replay sse` over an order file of `rows` (after the header) and no trades, in a
/// temp dir of `tag`: the dir, the order file and the output.
fn replay_sse_orders(tag: &str, rows: &str) -> (PathBuf, PathBuf, Output) {
    let d = temp_dir(tag);
    let orders = d.join("orders.csv");
    let trades = d.join("trades.csv");
    let header =
        "MDTime,OrderType,OrderPrice,OrderQty,OrderBSFlag,ChannelNo,ApplSeqNum,OrderNO,SecurityID";
    std::fs::write(&orders, format!("{header}\n{rows}")).unwrap();
    std::fs::write(
        &trades,
        "MDTime,TradeBuyNo,TradeSellNo,TradeBSFlag,TradePrice,TradeQty,ChannelNo,ApplSeqNum,SecurityID\n",
    )
    .unwrap();
    let out = millrace(&[
        "replay",
        "sse",
        "--orders",
        orders.to_str().unwrap(),
        "--trades",
        trades.to_str().unwrap(),
    ]);
    (d, orders, out)
}

#[test]
fn replay_sse_bad_row_names_file_and_line() {
    let (d, orders, out) = replay_sse_orders(
        "sse",
        "09:31:00.000,2,10.01,100,1,1,1,1,600000.SH\n\
         09:31:00.000,2,10.01,100,1,1,2,2,600000.SH\n\
         09:31:00.000,5,10.01,100,1,1,3,3,600000.SH\n",
    );
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_ne!(out.status.code(), Some(0));
    assert!(stderr.contains(&format!("{}:4", orders.display())), "{stderr}");
    assert!(stderr.contains("OrderType"), "{stderr}");
    std::fs::remove_dir_all(&d).unwrap();
}

#[test]
fn replay_lobster_on_the_fixture() {
    let f = root().join("server/replay/tests/fixtures/lobster");
    let out = millrace(&[
        "replay",
        "lobster",
        "--messages",
        f.join("seeded_message_3.csv").to_str().unwrap(),
        "--initial-book",
        f.join("seeded_orderbook_3.csv").to_str().unwrap(),
        "--levels",
        "3",
    ]);
    assert_eq!(out.status.code(), Some(0), "{}", String::from_utf8_lossy(&out.stderr));
    let expected = std::fs::read_to_string(f.join("seeded_orderbook_3.csv")).unwrap();
    assert_eq!(String::from_utf8(out.stdout).unwrap(), expected);
    // default depth: 10 levels, 40 columns per row, one row per message
    let out = millrace(&[
        "replay",
        "lobster",
        "--messages",
        f.join("handmade_message_3.csv").to_str().unwrap(),
    ]);
    assert_eq!(out.status.code(), Some(0));
    let stdout = String::from_utf8(out.stdout).unwrap();
    assert_eq!(stdout.lines().count(), 18);
    assert!(stdout.lines().all(|l| l.split(',').count() == 40));
    // the same messages without the initial book take liquidity that is not there: exit 1
    let out = millrace(&[
        "replay",
        "lobster",
        "--messages",
        f.join("seeded_message_3.csv").to_str().unwrap(),
    ]);
    assert_eq!(out.status.code(), Some(1));
}

#[test]
fn replay_lobster_bad_row_names_file_and_line() {
    let d = temp_dir("lobster");
    let m = d.join("m.csv");
    std::fs::write(
        &m,
        "34200.1,1,1,100,1000000,1\n34200.2,1,2,100,1000100,-1\n34200.3,9,2,100,1000100,-1\n",
    )
    .unwrap();
    let out = millrace(&["replay", "lobster", "--messages", m.to_str().unwrap()]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_ne!(out.status.code(), Some(0));
    assert!(stderr.contains(&format!("{}:3", m.display())), "{stderr}");
    std::fs::remove_dir_all(&d).unwrap();
}

/// `millrace` run under an address-space cap of `cap_mib` MiB (`ulimit -v`): a run that tries to
/// allocate beyond it aborts instead of succeeding, so passing proves the memory bound.
fn millrace_capped(cap_mib: u64, args: &[&str]) -> Output {
    Command::new("/bin/sh")
        .arg("-c")
        .arg("ulimit -v \"$0\" && exec \"$@\"")
        .arg((cap_mib * 1024).to_string())
        .arg(env!("CARGO_BIN_EXE_millrace"))
        .args(args)
        .output()
        .expect("sh runs")
}

/// The address-space cap (MiB) the hostile-input runs must fit in; the 4 GiB declared size, the
/// 3 GiB bomb and 10,000 securities at the old ~21 KB each all exceed it.
const CAP_MIB: u64 = 160;

/// Issue 15 item 12: an OrderPrice of `3402823669209384634633746074332` overflowed unchecked and
/// printed a wrong price with `ok: true`, exit 0. Now exit 2 with file:line.
#[test]
fn replay_sse_overflowing_price_exits_2_with_file_and_line() {
    let (d, orders, out) = replay_sse_orders(
        "sse-overflow",
        "09:31:00.000,2,10.01,100,1,1,1,1,600000.SH\n\
         09:31:00.000,2,3402823669209384634633746074332,100,2,1,2,2,600000.SH\n",
    );
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "stdout: {}", String::from_utf8_lossy(&out.stdout));
    assert!(stderr.contains(&format!("{}:3", orders.display())), "{stderr}");
    assert!(stderr.contains("OrderPrice") && stderr.contains("out of range"), "{stderr}");
    std::fs::remove_dir_all(&d).unwrap();
}

/// Issue 15 item 14: `replay lobster` took a time of `abc`, an empty file and fractional sizes
/// with exit 0. Each is now exit 2 with file:line, as in the other replay tools.
#[test]
fn replay_lobster_hostile_input_exits_2_with_file_and_line() {
    let d = temp_dir("lobster-hostile");
    let m = d.join("m.csv");
    for (text, line) in [
        ("34200.1,1,1,100,1000000,1\nabc,1,2,100,1000100,-1\n", 2),
        ("34200.1,1,1,100.5,1000000,1\n", 1),
        ("34200.1,1,1,0.25,1000000,1\n", 1),
        ("", 1),
    ] {
        std::fs::write(&m, text).unwrap();
        let out = millrace(&["replay", "lobster", "--messages", m.to_str().unwrap()]);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{text:?}: {stderr}");
        assert!(stderr.contains(&format!("{}:{line}:", m.display())), "{text:?}: {stderr}");
    }
    std::fs::remove_dir_all(&d).unwrap();
}

/// A one-member zip archive whose member is `data` compressed with `method` (0 stored,
/// 8 deflate), its headers declaring `declared` bytes and `crc`.
fn zip_with(name: &str, method: u16, data: &[u8], declared: u32, crc: u32) -> Vec<u8> {
    let csize = data.len() as u32;
    let mut z = Vec::new();
    let common = |z: &mut Vec<u8>| {
        z.extend_from_slice(&20u16.to_le_bytes()); // version needed
        z.extend_from_slice(&0u16.to_le_bytes()); // flags
        z.extend_from_slice(&method.to_le_bytes());
        z.extend_from_slice(&0u16.to_le_bytes()); // time
        z.extend_from_slice(&0x21u16.to_le_bytes()); // date 1980-01-01
        z.extend_from_slice(&crc.to_le_bytes());
        z.extend_from_slice(&csize.to_le_bytes());
        z.extend_from_slice(&declared.to_le_bytes());
        z.extend_from_slice(&(name.len() as u16).to_le_bytes());
        z.extend_from_slice(&0u16.to_le_bytes()); // extra length
    };
    z.extend_from_slice(&0x0403_4b50u32.to_le_bytes());
    common(&mut z);
    z.extend_from_slice(name.as_bytes());
    z.extend_from_slice(data);
    let cd = z.len() as u32;
    z.extend_from_slice(&0x0201_4b50u32.to_le_bytes());
    z.extend_from_slice(&20u16.to_le_bytes()); // version made by
    common(&mut z);
    z.extend_from_slice(&[0; 10]); // comment length, disk, internal and external attributes
    z.extend_from_slice(&0u32.to_le_bytes()); // local header offset
    z.extend_from_slice(name.as_bytes());
    let cd_len = z.len() as u32 - cd;
    z.extend_from_slice(&0x0605_4b50u32.to_le_bytes());
    z.extend_from_slice(&[0, 0, 0, 0, 1, 0, 1, 0]);
    z.extend_from_slice(&cd_len.to_le_bytes());
    z.extend_from_slice(&cd.to_le_bytes());
    z.extend_from_slice(&0u16.to_le_bytes());
    z
}

/// A deflate stream of `mib` MiB of `byte`, about 1 KB per MiB: one sync-flushed MiB repeated (its
/// back-references only reach bytes that are `byte` too), then an empty final block.
fn deflate_bomb(byte: u8, mib: usize) -> Vec<u8> {
    use std::io::Write as _;
    let mut e = flate2::write::DeflateEncoder::new(Vec::new(), flate2::Compression::best());
    e.write_all(&vec![byte; 1 << 20]).unwrap();
    e.flush().unwrap();
    let chunk = e.get_ref().clone();
    let mut out = Vec::with_capacity(chunk.len() * mib + 5);
    for _ in 0..mib {
        out.extend_from_slice(&chunk);
    }
    out.extend_from_slice(&[0x01, 0x00, 0x00, 0xff, 0xff]);
    out
}

/// Issue 15 item 13: replay allocated a zip member's declared size up front (a 189-byte zip
/// declaring 4 GiB aborted the process) and read members whole (a 3 MB bomb took 3 GiB). Members
/// are now streamed: under a 160 MiB address-space cap each hostile archive is a clear error,
/// exit 2, and a genuine archive still replays.
#[test]
fn replay_hostile_zips_are_errors_in_bounded_memory() {
    let d = temp_dir("zips");
    let rows = "34200.1,1,1,100,1000000,1\n34200.2,1,2,200,1000100,-1\n";
    let crc = crc32fast::hash(rows.as_bytes());
    let deflated = {
        use std::io::Write as _;
        let mut e = flate2::write::DeflateEncoder::new(Vec::new(), flate2::Compression::fast());
        e.write_all(rows.as_bytes()).unwrap();
        e.finish().unwrap()
    };
    let run = |name: &str, zip: Vec<u8>| {
        let path = d.join(name);
        std::fs::write(&path, zip).unwrap();
        let out = millrace_capped(
            CAP_MIB,
            &["replay", "lobster", "--levels", "1", "--messages", path.to_str().unwrap()],
        );
        (out.status.code(), String::from_utf8_lossy(&out.stderr).into_owned(), path)
    };
    // the control: a genuine archive, stored and deflated, replays within the cap
    for (name, method, data) in [("ok-stored.zip", 0, rows.as_bytes()), ("ok.zip", 8, &deflated)] {
        let (code, stderr, _) = run(name, zip_with("m.csv", method, data, rows.len() as u32, crc));
        assert_eq!(code, Some(0), "{name}: {stderr}");
    }
    // a small archive declaring 4 GiB: no allocation of that size, an error at the member's end
    let liar = zip_with("m.csv", 8, &deflated, u32::MAX - 1, crc);
    assert!(liar.len() < 200, "{}", liar.len());
    let (code, stderr, path) = run("liar.zip", liar);
    assert_eq!(code, Some(2), "{stderr}");
    assert!(stderr.contains(&path.display().to_string()), "{stderr}");
    assert!(stderr.contains("4294967294 bytes its header declares"), "{stderr}");
    // a 3 MB bomb of 3 GiB without a newline: the line limit stops it after 1 MiB
    let bomb = deflate_bomb(b'0', 3072);
    assert!(bomb.len() < 4 << 20, "{}", bomb.len());
    let (code, stderr, path) = run("bomb.zip", zip_with("m.csv", 8, &bomb, u32::MAX - 1, 0));
    assert_eq!(code, Some(2), "{stderr}");
    assert!(stderr.contains(&format!("{}:1:", path.display())), "{stderr}");
    assert!(stderr.contains("longer than 1048576 bytes"), "{stderr}");
    // a bomb whose header understates its size: an error as soon as it inflates past it
    let (code, stderr, _) = run("under.zip", zip_with("m.csv", 8, &bomb, 1000, 0));
    assert_eq!(code, Some(2), "{stderr}");
    assert!(stderr.contains("more than the 1000 bytes its header declares"), "{stderr}");
    // a CRC that does not match the data
    let (code, stderr, _) =
        run("crc.zip", zip_with("m.csv", 8, &deflated, rows.len() as u32, crc ^ 1));
    assert_eq!(code, Some(2), "{stderr}");
    assert!(stderr.contains("CRC"), "{stderr}");
    std::fs::remove_dir_all(&d).unwrap();
}

/// Issue 15 item 13: `replay sse` held ~21 KB per security id (10,000 ids took 217 MB). One
/// order for each of 10,000 securities now replays within the same 160 MiB address-space cap.
#[test]
fn replay_sse_many_securities_fit_in_bounded_memory() {
    use std::fmt::Write as _;
    let d = temp_dir("sse-ids");
    let orders = d.join("orders.csv");
    let trades = d.join("trades.csv");
    let mut text = String::from(
        "MDTime,OrderType,OrderPrice,OrderQty,OrderBSFlag,ChannelNo,ApplSeqNum,OrderNO,SecurityID\n",
    );
    for i in 0..10_000u32 {
        let price = 1 + i % 997;
        writeln!(
            text,
            "09:31:00.000,2,{price}.01,100,{},1,{},{},{:06}.SH",
            1 + i % 2,
            i + 1,
            i + 1,
            i
        )
        .unwrap();
    }
    std::fs::write(&orders, text).unwrap();
    std::fs::write(
        &trades,
        "MDTime,TradeBuyNo,TradeSellNo,TradeBSFlag,TradePrice,TradeQty,ChannelNo,ApplSeqNum,SecurityID\n",
    )
    .unwrap();
    let out = millrace_capped(
        CAP_MIB,
        &[
            "replay",
            "sse",
            "--orders",
            orders.to_str().unwrap(),
            "--trades",
            trades.to_str().unwrap(),
        ],
    );
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(0), "{stderr}");
    assert_eq!(String::from_utf8_lossy(&out.stdout).lines().count(), 10_000);
    std::fs::remove_dir_all(&d).unwrap();
}
