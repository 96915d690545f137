//! What a dashboard WebSocket client sends (`shared::protocol`): the request JSON the server
//! parses, and every stream name in it. Never panics; a stream name that parses prints back to a
//! name that parses to the same stream.
#![no_main]

use libfuzzer_sys::fuzz_target;
use shared::protocol::{ClientRequest, InstrumentId, SeriesId, Stream};

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else { return };
    let names: Vec<String> = match serde_json::from_str::<ClientRequest>(text) {
        Ok(request) => request.params,
        Err(_) => vec![text.to_string()],
    };
    for name in &names {
        if let Ok(stream) = name.parse::<Stream>() {
            assert_eq!(stream.to_string().parse::<Stream>().ok(), Some(stream.clone()), "{name:?}");
        }
        if let Ok(series) = name.parse::<SeriesId>() {
            assert_eq!(series.to_string().parse::<SeriesId>().ok(), Some(series.clone()));
        }
        if let Ok(instrument) = name.parse::<InstrumentId>() {
            assert_eq!(
                instrument.to_string().parse::<InstrumentId>().ok(),
                Some(instrument.clone())
            );
        }
    }
});
