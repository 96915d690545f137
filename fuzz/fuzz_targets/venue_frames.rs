//! The venues' frames and REST answers (`server/venues`): the first input byte picks the venue
//! and whether the rest is a WebSocket frame, an instrument list or a candle page. Every input
//! must give messages or an error, never a panic; a book that parses is fed to the venue's sync
//! machine, which must not panic either.
#![no_main]

use libfuzzer_sys::fuzz_target;
use shared::venue::{Dialect, VenueSync, VenueSyncConfig};

const DIALECTS: [Dialect; 4] = [Dialect::Okx, Dialect::Bybit, Dialect::Coinbase, Dialect::Kraken];

fuzz_target!(|data: &[u8]| {
    let Some((&pick, rest)) = data.split_first() else { return };
    let Ok(text) = std::str::from_utf8(rest) else { return };
    let dialect = DIALECTS[usize::from(pick % 4)];
    match pick / 4 % 3 {
        0 => {
            let mut out = Vec::new();
            match venues::parse(dialect, text, &mut out) {
                Ok(()) => {
                    let mut sync = VenueSync::new(VenueSyncConfig::new(
                        dialect.sequence_rule(),
                        dialect.checksum_rule(),
                    ));
                    for m in &out {
                        if let venues::Message::Book(b) = m {
                            sync.handle_message(b.message());
                            while sync.poll_event().is_some() {}
                        }
                    }
                }
                Err(_) => {}
            }
        }
        1 => {
            let _ = venues::rest::parse_instruments(dialect, text);
        }
        _ => {
            let _ = venues::rest::parse_candles(dialect, text);
        }
    }
});
