//! RFC 3339 UTC times (`2023-02-09T20:32:50.714964855Z`), as Coinbase and Kraken send them.

/// Milliseconds since the epoch of a UTC RFC 3339 time; the fraction beyond milliseconds is
/// cut. `None` for anything else (an offset other than `Z`, a field out of range).
pub fn parse_rfc3339_ms(s: &str) -> Option<i64> {
    let b = s.as_bytes();
    if b.len() < 20
        || b.len() > 40
        || b[4] != b'-'
        || b[7] != b'-'
        || (b[10] != b'T' && b[10] != b't')
    {
        return None;
    }
    if b[13] != b':' || b[16] != b':' || *b.last()? != b'Z' {
        return None;
    }
    let num = |r: core::ops::Range<usize>| -> Option<i64> {
        b[r].iter()
            .try_fold(0i64, |acc, &c| c.is_ascii_digit().then(|| acc * 10 + i64::from(c - b'0')))
    };
    let (year, month, day) = (num(0..4)?, num(5..7)?, num(8..10)?);
    let (hour, minute, second) = (num(11..13)?, num(14..16)?, num(17..19)?);
    if !(1..=12).contains(&month)
        || !(1..=31).contains(&day)
        || hour > 23
        || minute > 59
        || second > 60
    {
        return None;
    }
    let mut millis = 0;
    let rest = &b[19..b.len() - 1];
    if !rest.is_empty() {
        let (&dot, frac) = rest.split_first()?;
        if dot != b'.' || frac.is_empty() || !frac.iter().all(u8::is_ascii_digit) {
            return None;
        }
        for i in 0..3 {
            millis = millis * 10 + frac.get(i).map_or(0, |&c| i64::from(c - b'0'));
        }
    }
    let days = days_from_civil(year, month, day);
    Some(((days * 24 + hour) * 60 + minute) * 60_000 + second * 1000 + millis)
}

/// `2023-02-09T20:32:50.714Z` for ms since the epoch.
pub fn write_rfc3339(out: &mut String, ms: i64) {
    use core::fmt::Write;
    let days = ms.div_euclid(86_400_000);
    let in_day = ms.rem_euclid(86_400_000);
    let (y, m, d) = civil_from_days(days);
    let (h, min, s, milli) =
        (in_day / 3_600_000, in_day / 60_000 % 60, in_day / 1000 % 60, in_day % 1000);
    write!(out, "{y:04}-{m:02}-{d:02}T{h:02}:{min:02}:{s:02}.{milli:03}Z")
        .expect("writing to a String");
}

/// Days since 1970-01-01 of a proleptic Gregorian date (Howard Hinnant's algorithm).
fn days_from_civil(y: i64, m: i64, d: i64) -> i64 {
    let y = if m <= 2 { y - 1 } else { y };
    let era = y.div_euclid(400);
    let yoe = y - era * 400;
    let mp = (m + 9) % 12;
    let doy = (153 * mp + 2) / 5 + d - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    era * 146_097 + doe - 719_468
}

fn civil_from_days(z: i64) -> (i64, i64, i64) {
    let z = z + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    (yoe + era * 400 + i64::from(m <= 2), m, d)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_and_writes_utc_times() {
        assert_eq!(parse_rfc3339_ms("1970-01-01T00:00:00Z"), Some(0));
        // 2023-02-09T20:32:50.714Z, checked with `date -u -d @1675974770.714`
        assert_eq!(parse_rfc3339_ms("2023-02-09T20:32:50.714964855Z"), Some(1_675_974_770_714));
        assert_eq!(parse_rfc3339_ms("2023-09-25T07:49:37.708706Z"), Some(1_695_628_177_708));
        assert_eq!(parse_rfc3339_ms("2023-09-25T07:49:37+02:00"), None);
        assert_eq!(parse_rfc3339_ms("2023-13-25T07:49:37Z"), None);
        let mut s = String::new();
        write_rfc3339(&mut s, 1_675_974_770_714);
        assert_eq!(s, "2023-02-09T20:32:50.714Z");
        for ms in [-86_400_001, 0, 951_782_400_000, 4_102_444_800_123] {
            s.clear();
            write_rfc3339(&mut s, ms);
            assert_eq!(parse_rfc3339_ms(&s), Some(ms), "{s}");
        }
    }
}
