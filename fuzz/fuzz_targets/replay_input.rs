//! The replay tools' inputs (`server/replay`): the fuzz input is written to a file and given to
//! `replay klines`, `lobster`, `depth` or `sse` (the first byte picks the tool and whether the
//! file is a `.zip`, so the streaming zip reader is fuzzed too). Every input must give a result
//! or an error, never a panic or an unbounded allocation.
#![no_main]

use std::io::Write as _;
use std::path::PathBuf;

use libfuzzer_sys::fuzz_target;
use replay::depth::DepthArgs;
use replay::klines::KlinesArgs;
use replay::lobster::LobsterArgs;
use replay::sse::SseArgs;
use shared::candle::Timeframe;
use shared::Price;

fn path(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("millrace-fuzz-replay-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    dir.join(name)
}

fn write(name: &str, data: &[u8]) -> PathBuf {
    let p = path(name);
    std::fs::File::create(&p).unwrap().write_all(data).unwrap();
    p
}

const TFS: [Timeframe; 4] = [Timeframe::M1, Timeframe::M5, Timeframe::H1, Timeframe::D1];

fuzz_target!(|data: &[u8]| {
    let Some((&sel, rest)) = data.split_first() else { return };
    let ext = if sel & 0x80 != 0 { "zip" } else { "csv" };
    let mut sink = std::io::sink();
    match sel & 0x3 {
        0 => {
            let files = vec![write(&format!("k.{ext}"), rest)];
            let tf = TFS[(sel >> 2 & 3) as usize];
            let _ = replay::klines::run(&KlinesArgs { tf, files }, &mut sink);
        }
        1 => {
            // messages, then an optional initial book after a 0xff byte
            let (m, book) = match rest.iter().position(|&b| b == 0xff) {
                Some(i) => (&rest[..i], Some(write("b.csv", &rest[i + 1..]))),
                None => (rest, None),
            };
            let args = LobsterArgs {
                messages: write(&format!("m.{ext}"), m),
                initial_book: book,
                levels: 1 + u16::from(sel >> 2 & 7),
            };
            let _ = replay::lobster::run(&args, &mut sink);
        }
        2 => {
            let files = vec![write(&format!("d.{ext}"), rest)];
            let _ = replay::depth::run(&DepthArgs { files, venue: shared::venue::Dialect::Binance }, &mut sink);
        }
        _ => {
            let i = rest.iter().position(|&b| b == 0xff).unwrap_or(rest.len());
            let orders = write(&format!("o.{ext}"), &rest[..i]);
            let trades = write("t.csv", rest.get(i + 1..).unwrap_or_default());
            let tick = Price::from_raw([1, 1_000_000, 1_000, 100_000_000][(sel >> 2 & 3) as usize]);
            let args = SseArgs { orders, trades, tick, subset: sel & 0x10 != 0 };
            let _ = replay::sse::run(&args, &mut sink);
        }
    }
});
