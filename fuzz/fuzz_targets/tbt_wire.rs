//! The tick-by-tick binary wire (`tbt::wire`): decoding never panics, leaves the output untouched
//! on error, and a decoded frame encodes back to exactly the same bytes.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let mut out = Vec::new();
    match tbt::wire::decode(data, &mut out) {
        Ok(header) => {
            assert_eq!(out.len(), header.count as usize);
            assert_eq!(tbt::wire::encode(&out, header.sent_us), data);
        }
        Err(_) => assert!(out.is_empty()),
    }
});
