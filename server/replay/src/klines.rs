//! `millrace replay klines [--tf TF] FILE...`: merges Binance 1m kline archives into a timeframe
//! with the same [`DerivedAggregator`] the live ingest uses, and prints CSV.
//!
//! ## Input
//! Binance public-data kline files (`.zip` or `.csv`, see [`input::open`]), 12 columns:
//! `open_time, open, high, low, close, volume, close_time, quote_volume, trades, taker_buy_base,
//! taker_buy_quote, ignore`.
//! - A header row is accepted as the first line of a file when its first field is not a number
//!   and names the open time (`open_time`, `open time`, `timestamp`, …).
//! - Timestamps are milliseconds, or microseconds (16 digits and more, Binance's archives from
//!   2025 on), which are converted to milliseconds.
//! - Each row must be a 1m kline: `close_time = open_time + 59.999 s`, `low <= open, close <=
//!   high`; every numeric column must parse exactly (fixed-point, no floats).
//! - The files are read in the order given and must form one time-ordered series: a repeated or
//!   earlier minute is an error, as is any malformed row. Errors name `file:line`. Blank lines
//!   are skipped. Missing minutes are allowed and handled by the aggregator's rules (no invented
//!   candles; a derived candle is built from the minutes that exist).
//!
//! ## Output
//! `open_time,open,high,low,close,volume,trades` with a header line; `open_time` in ms, numbers
//! as the shortest exact decimal. `--tf 1m` passes the 1m rows through (validated). Buckets still
//! open at the end of the input are closed and printed; a note on stderr counts candles built from
//! fewer minutes than their timeframe has.

use std::io::Write;
use std::path::PathBuf;

use anyhow::Context as _;
use shared::candle::{Candle, CandleError, DerivedAggregator, Timeframe, MINUTE_MS};
use shared::{Price, Qty, Volume};

use crate::input::{self, InputError, Origin};

/// Arguments of `millrace replay klines`.
#[derive(Debug, clap::Args)]
pub struct KlinesArgs {
    /// Timeframe to merge into: 1m 3m 5m 15m 30m 1h 2h 4h 6h 8h 12h 1d (1m passes through).
    #[arg(long, default_value = "1d")]
    pub tf: Timeframe,
    /// Binance 1m kline files (.zip or .csv), read in this order as one time-ordered series.
    #[arg(required = true)]
    pub files: Vec<PathBuf>,
}

/// The CSV header printed before the candles.
pub const HEADER: &str = "open_time,open,high,low,close,volume,trades";

/// Number of columns in a Binance kline row.
const COLUMNS: usize = 12;

/// Timestamps at or above this are microseconds (10^15 ms would be the year 33658).
const MICROS_FROM: i64 = 1_000_000_000_000_000;

/// Runs the replay, writing results to `out`; returns whether every check passed.
pub fn run(args: &KlinesArgs, out: &mut dyn Write) -> anyhow::Result<bool> {
    let mut agg = DerivedAggregator::new(&[args.tf]);
    let mut rows = 0u64;
    let mut written = 0u64;
    let mut incomplete = 0u64;
    writeln!(out, "{HEADER}")?;
    let mut emit = |out: &mut dyn Write, closed: &[(Timeframe, Candle)]| -> anyhow::Result<()> {
        for (_, c) in closed {
            write_candle(out, c)?;
            written += 1;
            if !c.is_complete(args.tf) {
                incomplete += 1;
            }
        }
        Ok(())
    };
    for path in &args.files {
        input::for_each_line(path, |origin, line| {
            if line.trim().is_empty() {
                return Ok(());
            }
            let candle = match parse_row(line) {
                Ok(c) => c,
                Err(Row::Header) if origin.line == 1 => return Ok(()),
                Err(Row::Header) => {
                    return Err(bad(
                        origin,
                        "a header row is only allowed as the first line of a file",
                    ))
                }
                Err(Row::Bad(message)) => return Err(bad(origin, message)),
            };
            let closed =
                agg.push_closed_1m(candle).map_err(|e| bad(origin, describe(&e, &candle)))?;
            rows += 1;
            emit(out, closed)
        })?;
    }
    let closed = agg.flush();
    emit(out, closed)?;
    if rows == 0 {
        anyhow::bail!("no kline rows in {}", list(&args.files));
    }
    if incomplete > 0 {
        eprintln!(
            "note: {incomplete} of {written} {} candles were built from fewer 1m klines than the timeframe has \
             (missing minutes, or the input starts or ends inside a bucket)",
            args.tf
        );
    }
    out.flush().context("writing the output")?;
    Ok(true)
}

fn bad(origin: &Origin, message: impl Into<String>) -> anyhow::Error {
    InputError::new(origin.clone(), message).into()
}

fn list(files: &[PathBuf]) -> String {
    files.iter().map(|f| f.display().to_string()).collect::<Vec<_>>().join(", ")
}

/// One CSV row: `open_time,open,high,low,close,volume,trades`.
pub fn write_candle(out: &mut dyn Write, c: &Candle) -> std::io::Result<()> {
    writeln!(
        out,
        "{},{},{},{},{},{},{}",
        c.open_time, c.open, c.high, c.low, c.close, c.volume, c.trades
    )
}

/// Why a row did not give a kline.
#[derive(Debug, PartialEq, Eq)]
enum Row {
    /// A header row (`open_time,open,...`).
    Header,
    /// A malformed row, with what is wrong with it.
    Bad(String),
}

/// Parses one Binance kline row into a 1m candle (checking every column).
fn parse_row(line: &str) -> Result<Candle, Row> {
    let mut f = [""; COLUMNS];
    let mut n = 0;
    for field in line.split(',') {
        if n < COLUMNS {
            f[n] = field.trim();
        }
        n += 1;
    }
    if f[0].parse::<i64>().is_err() && looks_like_header(f[0]) {
        return Err(Row::Header);
    }
    if n != COLUMNS {
        return Err(Row::Bad(format!(
            "expected {COLUMNS} comma-separated columns, found {n} (truncated line?)"
        )));
    }
    let open_time = timestamp(f[0], "open_time")?;
    let close_time = timestamp(f[6], "close_time")?;
    if open_time % MINUTE_MS != 0 || close_time != open_time + MINUTE_MS - 1 {
        return Err(Row::Bad(format!(
            "open_time {} / close_time {} do not span one whole minute: not a 1m kline",
            f[0], f[6]
        )));
    }
    let price = |i: usize, name: &str| {
        Price::parse(f[i])
            .map_err(|e| Row::Bad(format!("{name} {:?} is not a valid price: {e}", f[i])))
    };
    let qty = |i: usize, name: &str| {
        Qty::parse(f[i])
            .map_err(|e| Row::Bad(format!("{name} {:?} is not a valid quantity: {e}", f[i])))
    };
    let (open, high, low, close) =
        (price(1, "open")?, price(2, "high")?, price(3, "low")?, price(4, "close")?);
    let volume = qty(5, "volume")?;
    qty(7, "quote_volume")?;
    let trades: u64 = f[8]
        .parse()
        .map_err(|_| Row::Bad(format!("trades {:?} is not a non-negative integer", f[8])))?;
    qty(9, "taker_buy_base")?;
    qty(10, "taker_buy_quote")?;
    if f[11].is_empty() || Price::parse(f[11]).is_err() {
        return Err(Row::Bad(format!(
            "last column (ignore) {:?} is not a number (truncated line?)",
            f[11]
        )));
    }
    Ok(Candle::one_minute(
        open_time,
        open,
        high,
        low,
        close,
        Volume::from_raw(volume.raw() as i128),
        trades,
    ))
}

/// Whether a non-numeric first field names the open time column.
fn looks_like_header(first: &str) -> bool {
    let name: String = first
        .trim_matches(|c| c == '"' || c == '\u{feff}')
        .to_ascii_lowercase()
        .replace([' ', '_', '-'], "");
    matches!(
        name.as_str(),
        "opentime" | "opentimems" | "opentimeus" | "timestamp" | "time" | "starttime" | "t"
    )
}

/// A timestamp column in ms; microsecond values (>= 10^15) are converted.
fn timestamp(s: &str, name: &str) -> Result<i64, Row> {
    let v: i64 =
        s.parse().ok().filter(|v| *v >= 0).ok_or_else(|| {
            Row::Bad(format!("{name} {s:?} is not a timestamp (integer ms or µs)"))
        })?;
    Ok(if v >= MICROS_FROM { v / 1000 } else { v })
}

/// A message for an aggregator rejection, with the times in UTC.
fn describe(e: &CandleError, c: &Candle) -> String {
    match e {
        CandleError::Duplicate { open_time } => {
            format!(
                "duplicate 1m kline at {} (open_time {open_time}): that minute was already read",
                utc(*open_time)
            )
        }
        CandleError::OutOfOrder { open_time, last } => format!(
            "1m kline at {} (open_time {open_time}) is out of order: the previous one was at {}; \
             files must be given oldest first and form one series",
            utc(*open_time),
            utc(*last)
        ),
        CandleError::Inconsistent { reason, .. } => format!(
            "inconsistent kline at {}: {reason} (open {}, high {}, low {}, close {})",
            utc(c.open_time),
            c.open,
            c.high,
            c.low,
            c.close
        ),
        other => other.to_string(),
    }
}

/// `YYYY-MM-DD HH:MM` (UTC) of a ms timestamp, for messages.
fn utc(ms: i64) -> String {
    let days = ms.div_euclid(86_400_000);
    let mins = ms.rem_euclid(86_400_000) / 60_000;
    // Howard Hinnant's civil_from_days.
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    let y = yoe + era * 400 + i64::from(m <= 2);
    format!("{y:04}-{m:02}-{d:02} {:02}:{:02} UTC", mins / 60, mins % 60)
}

#[cfg(test)]
mod tests {
    use super::*;

    const ROW: &str =
        "1577836800000,7195.24000000,7196.25000000,7183.14000000,7186.68000000,51.64281200,\
                       1577836859999,371233.51835535,493,19.59823000,140888.41428273,0";

    #[test]
    fn parses_a_binance_row_exactly() {
        let c = parse_row(ROW).unwrap();
        assert_eq!(c.open_time, 1_577_836_800_000);
        assert_eq!(c.open, Price::parse("7195.24").unwrap());
        assert_eq!(c.high, Price::parse("7196.25").unwrap());
        assert_eq!(c.low, Price::parse("7183.14").unwrap());
        assert_eq!(c.close, Price::parse("7186.68").unwrap());
        assert_eq!(c.volume, Volume::parse("51.642812").unwrap());
        assert_eq!((c.trades, c.minutes), (493, 1));
        let mut buf = Vec::new();
        write_candle(&mut buf, &c).unwrap();
        assert_eq!(
            String::from_utf8(buf).unwrap(),
            "1577836800000,7195.24,7196.25,7183.14,7186.68,51.642812,493\n"
        );
    }

    #[test]
    fn accepts_microsecond_timestamps() {
        let us = ROW.replacen("1577836800000", "1577836800000000", 1).replacen(
            "1577836859999",
            "1577836859999999",
            1,
        );
        assert_eq!(parse_row(&us).unwrap(), parse_row(ROW).unwrap());
    }

    #[test]
    fn detects_headers() {
        let h =
            "open_time,open,high,low,close,volume,close_time,quote_volume,count,taker_buy_volume,\
                 taker_buy_quote_volume,ignore";
        assert_eq!(parse_row(h), Err(Row::Header));
        assert_eq!(parse_row("Open time,Open,High,Low,Close,Volume"), Err(Row::Header));
        assert!(matches!(
            parse_row("\u{feff}timestamp,o,h,l,c,v,ct,qv,n,tb,tq,i"),
            Err(Row::Header)
        ));
        assert!(matches!(parse_row("price,open,high"), Err(Row::Bad(_))));
    }

    #[test]
    fn rejects_bad_rows_with_reasons() {
        let msg = |line: &str| match parse_row(line) {
            Err(Row::Bad(m)) => m,
            other => panic!("{line}: {other:?}"),
        };
        assert!(msg("1577836800000,7195.24000000,7196.2").contains("found 3"));
        assert!(msg(&format!("{ROW},0")).contains("found 13"));
        assert!(msg(&ROW.replacen("7183.14000000", "abc", 1)).contains("low \"abc\""));
        assert!(msg(&ROW.replacen("7195.24000000", "7195.2400000001", 1)).contains("open"));
        assert!(msg(&ROW.replacen(",493,", ",-4,", 1)).contains("trades"));
        assert!(msg(&ROW.replacen("1577836859999", "1577840399999", 1)).contains("not a 1m kline"));
        assert!(msg(&ROW.replacen("1577836800000", "1577836800001", 1)).contains("not a 1m kline"));
        assert!(msg(&ROW[..ROW.len() - 1]).contains("ignore"));
        assert!(msg(&ROW.replacen("51.64281200", "-1", 1)).contains("volume"));
    }

    #[test]
    fn formats_utc() {
        assert_eq!(utc(1_577_836_800_000), "2020-01-01 00:00 UTC");
        assert_eq!(utc(1_577_923_199_999), "2020-01-01 23:59 UTC");
        assert_eq!(utc(0), "1970-01-01 00:00 UTC");
        assert_eq!(utc(-60_000), "1969-12-31 23:59 UTC");
        assert_eq!(utc(951_782_400_000), "2000-02-29 00:00 UTC");
    }
}
