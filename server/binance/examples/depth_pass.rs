//! One pass of the depth benchmark's loops over the recorded ETHUSDT stream, for instruction
//! counts under `valgrind --tool=callgrind` (deterministic where wall time on a shared machine is
//! not). `cargo build --release -p server --example depth_pass`, then
//! `valgrind --tool=callgrind target/release/examples/depth_pass [parse|parse_apply|apply]`.

use std::io::BufRead;

use binance::fastdepth::{parse_depth_frame, Decoded, DepthDecoder, Parsed};
use binance::wire::{self, DepthBody, StreamEvent};
use shared::sync::{BookSync, ContinuityRule, SyncConfig};

fn main() {
    let mode = std::env::args().nth(1).unwrap_or_else(|| "parse_apply".into());
    let passes: usize = std::env::args().nth(2).and_then(|s| s.parse().ok()).unwrap_or(1);
    let dir = replay::input::testdata_dir().join("binance-ws/hftbacktest");
    let (mut frames, mut snapshot) = (Vec::new(), None);
    for name in ["spot_ethusdt_20240808.gz", "spot_ethusdt_20240809.gz"] {
        for line in replay::input::open(&dir.join(name)).expect("capture").lines() {
            let line = line.expect("line");
            let Some((_, json)) = line.split_once(' ') else { continue };
            if json.contains("\"depthUpdate\"") {
                frames.push(json.to_string());
            } else if json.contains("\"lastUpdateId\"") {
                let body: DepthBody = wire::parse_body(json).expect("snapshot");
                snapshot = Some((frames.len(), body.into_snapshot()));
            }
        }
    }
    let (at, snap) = snapshot.expect("a snapshot");
    let mut config = SyncConfig::new(ContinuityRule::Spot);
    config.verify_interval_ms = None;
    let deltas: Vec<_> = frames
        .iter()
        .map(|t| match wire::parse_frame_serde(t) {
            Ok(StreamEvent::DepthUpdate { update, .. }) => update.delta,
            other => panic!("{other:?}"),
        })
        .collect();
    let (mut bids, mut asks) = (Vec::with_capacity(64), Vec::with_capacity(64));
    let mut decoder = DepthDecoder::new();
    let mut total = 0u64;
    for _ in 0..passes {
        let mut sync = BookSync::new(config.clone());
        for (i, text) in frames.iter().enumerate() {
            if i == at && mode != "parse" {
                sync.handle_snapshot(snap.clone(), 0);
            }
            match mode.as_str() {
                "parse" => {
                    parse_depth_frame(text, &mut bids, &mut asks).expect("a diff");
                    total += (bids.len() + asks.len()) as u64;
                }
                "apply" => sync.handle_delta(deltas[i].clone(), 0),
                _ => match decoder
                    .decode_into(text, &mut sync, |s| s.eq_ignore_ascii_case("ethusdt"))
                {
                    Ok(Parsed::Applied) => {}
                    Ok(Parsed::Decoded(Decoded::Depth))
                        if decoder.symbol().eq_ignore_ascii_case("ethusdt") =>
                    {
                        sync.handle_delta_ref(decoder.delta(), 0)
                    }
                    other => panic!("{other:?}"),
                },
            }
            while sync.poll_event().is_some() {}
        }
        total += sync.stats().levels_applied;
    }
    println!("{mode}: {} frames x {passes}, {total}", frames.len());
}
