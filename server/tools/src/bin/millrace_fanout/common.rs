//! Pieces shared by the three commands: the file-descriptor limit and `/proc` readers (from the
//! crate's [`tools::procfs`]), wall-clock microseconds, a latency histogram, durations and rates on the command
//! line, and the line protocol between `run` and its children.

use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

pub use tools::procfs::{cpu_time, loadavg, machine_busy, raise_nofile_limit, rss_bytes};

/// Wall-clock time in microseconds since the Unix epoch (the clock both processes share).
#[inline]
pub fn wall_us() -> i64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map(|d| d.as_micros() as i64).unwrap_or(0)
}

/// A command-line value that does not parse; the message says what was expected.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct BadValue(String);

/// Parses `20s`, `500ms`, `2m` or a plain number of seconds.
pub fn parse_duration(s: &str) -> Result<Duration, BadValue> {
    let s = s.trim();
    let (num, unit) = match s.find(|c: char| !(c.is_ascii_digit() || c == '.')) {
        Some(i) => (&s[..i], &s[i..]),
        None => (s, "s"),
    };
    let v: f64 = num
        .parse()
        .map_err(|_| BadValue(format!("{s:?} is not a duration (try 20s, 500ms, 2m)")))?;
    let secs = match unit {
        "ms" => v / 1000.0,
        "s" => v,
        "m" => v * 60.0,
        _ => return Err(BadValue(format!("{s:?}: unknown unit {unit:?} (use ms, s or m)"))),
    };
    if !(secs.is_finite() && secs >= 0.0) {
        return Err(BadValue(format!("{s:?} is not a duration")));
    }
    Ok(Duration::from_secs_f64(secs))
}

/// Parses `250k`, `1M`, `1.5M` or a plain number.
pub fn parse_count(s: &str) -> Result<f64, BadValue> {
    let s = s.trim();
    let (num, mult) = match s.chars().last() {
        Some('k' | 'K') => (&s[..s.len() - 1], 1e3),
        Some('m' | 'M') => (&s[..s.len() - 1], 1e6),
        _ => (s, 1.0),
    };
    let v: f64 =
        num.parse().map_err(|_| BadValue(format!("{s:?} is not a number (try 250k or 1M)")))?;
    if !(v.is_finite() && v >= 0.0) {
        return Err(BadValue(format!("{s:?} must be a non-negative number")));
    }
    Ok(v * mult)
}

/// A line of the child protocol: `KEYWORD {json}`.
pub fn line(keyword: &str, value: &serde_json::Value) -> String {
    format!("{keyword} {value}")
}

/// Prints a protocol line on stdout (Rust's stdout flushes at each newline).
pub fn emit(keyword: &str, value: serde_json::Value) {
    println!("{}", line(keyword, &value));
}

/// Most topics: the simulator's 8 symbols times its 12 timeframes.
pub const MAX_TOPICS: usize = 96;

/// The series of the first `n` topics: `sim:spot:<BASE>/USDT:1m` for the catalog's symbols
/// (BTC, ETH, BNB, SOL, XRP, ADA, DOGE, LTC), then the same symbols at 3m, 5m, … when `n > 8`.
pub fn topic_series(n: usize) -> Vec<shared::protocol::SeriesId> {
    let symbols = sim::SymbolSpec::catalog();
    (0..n.min(MAX_TOPICS))
        .map(|i| {
            let spec = &symbols[i % symbols.len()];
            let tf = shared::candle::Timeframe::ALL[i / symbols.len()];
            format!("sim:spot:{}/{}:{}", spec.base, spec.quote, tf.name())
                .parse()
                .expect("a valid series id")
        })
        .collect()
}

// ---- latency histogram ----------------------------------------------------------------------

/// Values below this are their own bucket.
const LINEAR: u64 = 64;
/// Sub-buckets per power of two above [`LINEAR`] (relative error under 1/32).
const SUB_BITS: u32 = 5;
const SUB: u64 = 1 << SUB_BITS;
/// Largest exponent kept (2^40 µs is 12 days); larger values land in the last bucket.
const MAX_EXP: u32 = 40;
/// Number of buckets.
pub const BUCKETS: usize = LINEAR as usize + ((MAX_EXP - 6 + 1) as usize) * SUB as usize;

/// Bucket of a value (microseconds).
#[inline]
pub fn bucket(v: u64) -> usize {
    if v < LINEAR {
        return v as usize;
    }
    let e = (63 - v.leading_zeros()).min(MAX_EXP);
    let v = v.min((1u64 << (MAX_EXP + 1)) - 1);
    let m = (v >> (e - SUB_BITS)) - SUB; // 0..SUB
    LINEAR as usize + (e - 6) as usize * SUB as usize + m as usize
}

/// Smallest value of bucket `b`.
pub fn bucket_low(b: usize) -> u64 {
    if (b as u64) < LINEAR {
        return b as u64;
    }
    let k = b - LINEAR as usize;
    let e = (k / SUB as usize) as u32 + 6;
    let m = (k % SUB as usize) as u64 + SUB;
    m << (e - SUB_BITS)
}

/// A histogram that many tasks record into at once (relaxed atomic adds).
pub struct AtomicHistogram {
    counts: Box<[AtomicU64]>,
}

impl Default for AtomicHistogram {
    fn default() -> Self {
        Self { counts: (0..BUCKETS).map(|_| AtomicU64::new(0)).collect() }
    }
}

impl AtomicHistogram {
    #[inline]
    pub fn record(&self, v: u64) {
        self.counts[bucket(v)].fetch_add(1, Relaxed);
    }

    /// Adds this histogram's counts into `into`.
    pub fn add_to(&self, into: &mut Histogram) {
        for (a, c) in into.counts.iter_mut().zip(self.counts.iter()) {
            *a += c.load(Relaxed);
        }
    }
}

/// A plain histogram (a snapshot, or the difference of two).
#[derive(Debug, Clone)]
pub struct Histogram {
    pub counts: Vec<u64>,
}

impl Default for Histogram {
    fn default() -> Self {
        Self { counts: vec![0; BUCKETS] }
    }
}

impl Histogram {
    pub fn count(&self) -> u64 {
        self.counts.iter().sum()
    }

    /// `self - earlier` (counts only grow).
    pub fn since(&self, earlier: &Histogram) -> Histogram {
        Histogram {
            counts: self
                .counts
                .iter()
                .zip(&earlier.counts)
                .map(|(a, b)| a.saturating_sub(*b))
                .collect(),
        }
    }

    /// The value at quantile `q` (0..=1): the middle of the bucket holding it (within 3 %).
    pub fn quantile(&self, q: f64) -> u64 {
        let n = self.count();
        if n == 0 {
            return 0;
        }
        let rank = ((q * n as f64).ceil() as u64).clamp(1, n);
        let mut seen = 0;
        for (b, &c) in self.counts.iter().enumerate() {
            seen += c;
            if seen >= rank {
                let lo = bucket_low(b);
                let hi = if b + 1 < BUCKETS { bucket_low(b + 1) } else { lo };
                return (lo + hi.saturating_sub(1)) / 2;
            }
        }
        0
    }

    /// Mean, with each value at its bucket's middle.
    pub fn mean(&self) -> f64 {
        let n = self.count();
        if n == 0 {
            return 0.0;
        }
        let mut sum = 0f64;
        for (b, &c) in self.counts.iter().enumerate() {
            if c > 0 {
                let lo = bucket_low(b);
                let hi = if b + 1 < BUCKETS { bucket_low(b + 1) } else { lo + 1 };
                sum += c as f64 * (lo + hi - 1) as f64 / 2.0;
            }
        }
        sum / n as f64
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn buckets_are_monotone_and_tight() {
        let mut last = 0;
        for v in
            [0u64, 1, 63, 64, 65, 100, 127, 128, 1000, 4095, 4096, 1_000_000, 1 << 40, u64::MAX]
        {
            let b = bucket(v);
            assert!(b >= last, "{v}");
            assert!(b < BUCKETS);
            last = b;
            if v < 1 << 40 {
                let lo = bucket_low(b);
                assert!(lo <= v, "{v} {lo}");
                assert!((v - lo) as f64 <= v as f64 / 32.0 + 1.0, "{v} {lo}");
            }
        }
    }

    #[test]
    fn quantiles() {
        let h = AtomicHistogram::default();
        for v in 1..=1000u64 {
            h.record(v);
        }
        let mut s = Histogram::default();
        h.add_to(&mut s);
        assert_eq!(s.count(), 1000);
        let p50 = s.quantile(0.5) as f64;
        assert!((p50 - 500.0).abs() < 20.0, "{p50}");
        let p99 = s.quantile(0.99) as f64;
        assert!((p99 - 990.0).abs() < 35.0, "{p99}");
    }

    #[test]
    fn durations_and_counts() {
        assert_eq!(parse_duration("20s").unwrap(), Duration::from_secs(20));
        assert_eq!(parse_duration("500ms").unwrap(), Duration::from_millis(500));
        assert_eq!(parse_duration("3").unwrap(), Duration::from_secs(3));
        assert!(parse_duration("3h").is_err());
        assert_eq!(parse_count("1.5M").unwrap(), 1_500_000.0);
        assert_eq!(parse_count("250k").unwrap(), 250_000.0);
        assert!(parse_count("x").is_err());
    }
}
