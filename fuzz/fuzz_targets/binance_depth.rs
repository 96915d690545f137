//! A Binance stream frame through serde (`wire::parse_frame_serde`, the reference) and through
//! the fast depth decoder (`fastdepth::DepthDecoder`, which must equal it for every input): the
//! same event, or both errors. `scan_depth`, the fast path alone, must never disagree either.
#![no_main]

use binance::fastdepth::{scan_depth, Decoded, DepthDecoder};
use binance::wire::{parse_frame_serde, StreamEvent};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else { return };
    let reference = parse_frame_serde(text);
    let mut decoder = DepthDecoder::new();
    let fast = decoder.decode(text).map(|d| match d {
        Decoded::Depth => decoder.event(),
        Decoded::Other(e) => e,
    });
    match (&reference, &fast) {
        (Ok(a), Ok(b)) => assert_eq!(a, b, "{text:?}"),
        (Err(_), Err(_)) => {}
        _ => panic!("serde and fastdepth disagree on {text:?}: {reference:?} vs {fast:?}"),
    }
    let (mut bids, mut asks) = (Vec::new(), Vec::new());
    if let Some(frame) = scan_depth(text, &mut bids, &mut asks) {
        match reference {
            Ok(StreamEvent::DepthUpdate { update, .. }) => {
                assert_eq!(update.delta.bids, bids, "{text:?}");
                assert_eq!(update.delta.asks, asks, "{text:?}");
                assert_eq!(update.delta.first_id, frame.first_id, "{text:?}");
                assert_eq!(update.delta.last_id, frame.last_id, "{text:?}");
                assert_eq!(update.symbol, frame.symbol, "{text:?}");
            }
            other => panic!("scan_depth took {text:?}, serde says {other:?}"),
        }
    }
});
