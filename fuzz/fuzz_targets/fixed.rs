//! `shared::fixed` parsing: never panics; whatever parses formats back to the same value; the
//! snapped parser agrees with the exact one wherever the exact one accepts; the wide volume parser
//! of the Binance wire agrees with `Volume::parse` where that accepts.
#![no_main]

use libfuzzer_sys::fuzz_target;
use shared::fixed::{parse_raw, parse_raw_snapped, ParseDecimalError};
use shared::{Price, Qty, Volume};

fuzz_target!(|data: &[u8]| {
    let Some((&sel, rest)) = data.split_first() else { return };
    let Ok(s) = std::str::from_utf8(rest) else { return };
    let exact = parse_raw(s);
    if let Ok(raw) = exact {
        let p = Price::from_raw(raw);
        assert_eq!(Price::parse(&p.to_string()), Ok(p), "{s:?}");
        assert_eq!(Price::parse(&p.to_string_fixed(8)), Ok(p), "{s:?}");
        // tick 1 raw unit: snapping an exact value changes nothing
        assert_eq!(parse_raw_snapped(s, 1), Ok(raw), "{s:?}");
    }
    if let Ok(q) = Qty::parse(s) {
        assert!(q.raw() >= 0);
        assert_eq!(Qty::parse(&q.to_string()), Ok(q));
    }
    if let Ok(v) = Volume::parse(s) {
        assert_eq!(binance::wire::parse_volume(s), Ok(v), "{s:?}");
    }
    if let Ok(v) = binance::wire::parse_volume(s) {
        assert!(v.raw() >= 0);
        assert_eq!(binance::wire::parse_volume(&v.to_string()), Ok(v), "{s:?}");
    }
    // a tick from the selector byte: 1 raw unit up to whole units, and nonsense ones
    let tick = match sel % 6 {
        0 => 1,
        1 => 1_000_000,
        2 => 100_000_000,
        3 => i64::MAX,
        4 => 0,
        _ => -(sel as i64),
    };
    match parse_raw_snapped(s, tick) {
        Ok(raw) => {
            assert!(tick > 0 && raw % tick == 0, "{s:?} tick {tick}: {raw}");
            // the snapped value is within half a tick of the exact one, when that is known
            if let Ok(e) = exact {
                let d = (i128::from(raw) - i128::from(e)).abs();
                assert!(d * 2 <= i128::from(tick), "{s:?} tick {tick}: {raw} vs {e}");
            }
        }
        Err(ParseDecimalError::BadTick) => assert!(tick <= 0),
        Err(_) => {}
    }
    let _ = Price::parse_snapped(s, Price::from_raw(tick));
    let _ = Volume::parse_snapped(s, Volume::from_raw(i128::from(tick) << (sel % 3 * 40)));
});
