//! History out as files (issue 30): a series' stored candles as Parquet or CSV, read from the
//! store in chunks of [`CHUNK`] rows so memory stays flat for any range, for
//! `millrace export candles` and `GET /api/v1/export/candles`; an instrument's trades from the
//! recording ([`trades`], `millrace export trades`).
//!
//! **Parquet** (the Arrow and Parquet crates): typed columns — `open_time` a timestamp (ms, UTC),
//! prices and the volume decimals of scale 8 (millrace's fixed point, exactly), `trades` and
//! `minutes` unsigned integers — one row group per chunk, zstd-compressed, and the series in the
//! file's key-value metadata (`millrace.series`). **CSV**: a header, then one line per candle,
//! the time in RFC 3339 (ms, UTC) and the numbers as millrace prints them (exact decimals).

use std::io::Write;
use std::sync::Arc;

use arrow_array::{
    Decimal128Array, RecordBatch, StringArray, TimestampMillisecondArray, TimestampNanosecondArray,
    UInt32Array, UInt64Array,
};
use arrow_schema::{DataType, Field, Schema, TimeUnit};
use parquet::arrow::ArrowWriter;
use parquet::basic::{Compression, ZstdLevel};
use parquet::file::metadata::KeyValue;
use parquet::file::properties::WriterProperties;
use parquet::schema::types::ColumnPath;
use shared::candle::Candle;
use shared::protocol::{InstrumentId, SeriesId};
use shared::trade::{TakerSide, Trade};

use crate::store::{CandleStore, StoreError};

/// ExportRows read from the store and written as one row group at a time.
pub const CHUNK: usize = 65_536;
/// Decimal precision of a price (an `i64` of 10^-8 units: at most 19 digits).
const PRICE_PRECISION: u8 = 19;
/// Decimal precision of a volume (an `i128` of 10^-8 units).
const VOLUME_PRECISION: u8 = 38;

/// The file format of an export.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Format {
    Parquet,
    Csv,
}

impl std::str::FromStr for Format {
    type Err = ExportError;
    fn from_str(s: &str) -> Result<Self, ExportError> {
        match s {
            "parquet" => Ok(Format::Parquet),
            "csv" => Ok(Format::Csv),
            other => Err(ExportError::Format(other.to_string())),
        }
    }
}

impl Format {
    pub fn content_type(self) -> &'static str {
        match self {
            Format::Parquet => "application/vnd.apache.parquet",
            Format::Csv => "text/csv; charset=utf-8",
        }
    }

    pub fn extension(self) -> &'static str {
        match self {
            Format::Parquet => "parquet",
            Format::Csv => "csv",
        }
    }
}

/// Why an export failed.
#[derive(Debug, thiserror::Error)]
pub enum ExportError {
    #[error("format {0:?}: parquet or csv")]
    Format(String),
    #[error(transparent)]
    Store(#[from] StoreError),
    #[error("writing the Parquet file: {0}")]
    Parquet(#[from] parquet::errors::ParquetError),
    #[error("building the Arrow columns: {0}")]
    Arrow(#[from] arrow_schema::ArrowError),
    #[error("writing the file: {0}")]
    Io(#[from] std::io::Error),
    #[error("more than {max} rows in the range (narrow it, or raise limits.max_export_rows)")]
    TooMany { max: u64 },
    #[error(transparent)]
    Recorded(#[from] crate::recorded::RecordedError),
    #[error("{0}")]
    NotRecorded(String),
}

/// What an export writes a row of: its Arrow columns and its CSV line.
pub trait ExportRows: Sized {
    /// The CSV header (with its newline).
    const CSV_HEADER: &'static [u8];
    /// The Parquet columns dictionary-encoded: those of a few distinct values. Every other is
    /// written plain (then zstd): prices, volumes and times are nearly all distinct, and a
    /// dictionary tried on them and given up cost 40 % of the export and made the file larger
    /// (BENCHMARKS.md).
    const DICTIONARY_COLUMNS: &'static [&'static str] = &[];
    /// The Arrow schema.
    fn schema() -> Arc<Schema>;
    /// One chunk as Arrow columns.
    fn batch(schema: &Arc<Schema>, rows: &[Self]) -> Result<RecordBatch, ExportError>;
    /// Appends its CSV line (with its newline) to `line`.
    fn csv(&self, line: &mut String);
}

fn utc_ms() -> DataType {
    DataType::Timestamp(TimeUnit::Millisecond, Some("UTC".into()))
}

fn price_type() -> DataType {
    DataType::Decimal128(PRICE_PRECISION, 8)
}

/// A column of fixed-point values (10^-8 units) as decimals of scale 8.
fn decimals(
    values: impl Iterator<Item = i128>,
    precision: u8,
) -> Result<arrow_array::ArrayRef, ExportError> {
    Ok(Arc::new(Decimal128Array::from_iter_values(values).with_precision_and_scale(precision, 8)?))
}

fn times(values: impl Iterator<Item = i64>) -> arrow_array::ArrayRef {
    Arc::new(TimestampMillisecondArray::from_iter_values(values).with_timezone("UTC"))
}

impl ExportRows for Candle {
    const CSV_HEADER: &'static [u8] = b"open_time,open,high,low,close,volume,trades,minutes\n";

    fn schema() -> Arc<Schema> {
        Arc::new(Schema::new(vec![
            Field::new("open_time", utc_ms(), false),
            Field::new("open", price_type(), false),
            Field::new("high", price_type(), false),
            Field::new("low", price_type(), false),
            Field::new("close", price_type(), false),
            Field::new("volume", DataType::Decimal128(VOLUME_PRECISION, 8), false),
            Field::new("trades", DataType::UInt64, false),
            Field::new("minutes", DataType::UInt32, false),
        ]))
    }

    fn batch(schema: &Arc<Schema>, candles: &[Candle]) -> Result<RecordBatch, ExportError> {
        let price = |f: fn(&Candle) -> i64| {
            decimals(candles.iter().map(|c| i128::from(f(c))), PRICE_PRECISION)
        };
        let columns: Vec<arrow_array::ArrayRef> = vec![
            times(candles.iter().map(|c| c.open_time)),
            price(|c| c.open.raw())?,
            price(|c| c.high.raw())?,
            price(|c| c.low.raw())?,
            price(|c| c.close.raw())?,
            decimals(candles.iter().map(|c| c.volume.raw()), VOLUME_PRECISION)?,
            Arc::new(UInt64Array::from_iter_values(candles.iter().map(|c| c.trades))),
            Arc::new(UInt32Array::from_iter_values(candles.iter().map(|c| c.minutes))),
        ];
        Ok(RecordBatch::try_new(schema.clone(), columns)?)
    }

    fn csv(&self, line: &mut String) {
        use std::fmt::Write as _;
        venues::write_rfc3339(line, self.open_time);
        let c = self;
        let _ = writeln!(
            line,
            ",{},{},{},{},{},{},{}",
            c.open, c.high, c.low, c.close, c.volume, c.trades, c.minutes
        );
    }
}

/// The Arrow schema of exported candles.
pub fn candle_schema() -> Arc<Schema> {
    Candle::schema()
}

/// A trade as exported: the venue's trade with the time millrace received it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TradeRow {
    /// When millrace received it (Unix ns).
    pub received_ns: i64,
    pub trade: Trade,
}

impl ExportRows for TradeRow {
    const CSV_HEADER: &'static [u8] = b"time,id,price,qty,taker,received_ns\n";
    const DICTIONARY_COLUMNS: &'static [&'static str] = &["taker"];

    fn schema() -> Arc<Schema> {
        Arc::new(Schema::new(vec![
            Field::new("time", utc_ms(), false),
            Field::new("id", DataType::Utf8, false),
            Field::new("price", price_type(), false),
            Field::new("qty", DataType::Decimal128(PRICE_PRECISION, 8), false),
            Field::new("taker", DataType::Utf8, true),
            Field::new(
                "received",
                DataType::Timestamp(TimeUnit::Nanosecond, Some("UTC".into())),
                false,
            ),
        ]))
    }

    fn batch(schema: &Arc<Schema>, rows: &[TradeRow]) -> Result<RecordBatch, ExportError> {
        let columns: Vec<arrow_array::ArrayRef> = vec![
            times(rows.iter().map(|r| r.trade.time_ms)),
            Arc::new(StringArray::from_iter_values(rows.iter().map(|r| r.trade.id.to_string()))),
            decimals(rows.iter().map(|r| i128::from(r.trade.price.raw())), PRICE_PRECISION)?,
            decimals(rows.iter().map(|r| i128::from(r.trade.qty.raw())), PRICE_PRECISION)?,
            Arc::new(StringArray::from_iter(rows.iter().map(|r| r.trade.taker.map(taker)))),
            Arc::new(
                TimestampNanosecondArray::from_iter_values(rows.iter().map(|r| r.received_ns))
                    .with_timezone("UTC"),
            ),
        ];
        Ok(RecordBatch::try_new(schema.clone(), columns)?)
    }

    fn csv(&self, line: &mut String) {
        use std::fmt::Write as _;
        let t = &self.trade;
        venues::write_rfc3339(line, t.time_ms);
        let side = t.taker.map(taker).unwrap_or_default();
        let _ = writeln!(line, ",{},{},{},{side},{}", t.id, t.price, t.qty, self.received_ns);
    }
}

fn taker(side: TakerSide) -> &'static str {
    match side {
        TakerSide::Buy => "buy",
        TakerSide::Sell => "sell",
    }
}

/// A file being written, chunk by chunk.
pub enum ExportFile<W: Write + Send, R: ExportRows> {
    Parquet { writer: Box<ArrowWriter<W>>, schema: Arc<Schema> },
    Csv(W, std::marker::PhantomData<R>),
}

/// A file of candles.
pub type CandleFile<W> = ExportFile<W, Candle>;

impl<W: Write + Send, R: ExportRows> ExportFile<W, R> {
    /// Starts a file of `what` (a series, an instrument: the Parquet file's `millrace.{key}`
    /// metadata) in `format` on `out`.
    pub fn new(format: Format, key: &str, what: &str, mut out: W) -> Result<Self, ExportError> {
        Ok(match format {
            Format::Parquet => {
                let schema = R::schema();
                let props = R::DICTIONARY_COLUMNS
                    .iter()
                    .fold(WriterProperties::builder(), |p, c| {
                        p.set_column_dictionary_enabled(ColumnPath::from(*c), true)
                    })
                    .set_dictionary_enabled(false)
                    .set_compression(Compression::ZSTD(ZstdLevel::default()))
                    .set_key_value_metadata(Some(vec![KeyValue::new(
                        format!("millrace.{key}"),
                        what.to_string(),
                    )]))
                    .build();
                let writer = ArrowWriter::try_new(out, schema.clone(), Some(props))?;
                ExportFile::Parquet { writer: Box::new(writer), schema }
            }
            Format::Csv => {
                out.write_all(R::CSV_HEADER)?;
                ExportFile::Csv(out, std::marker::PhantomData)
            }
        })
    }

    /// Writes one chunk (one row group in Parquet).
    pub fn write(&mut self, rows: &[R]) -> Result<(), ExportError> {
        if rows.is_empty() {
            return Ok(());
        }
        match self {
            ExportFile::Parquet { writer, schema } => {
                writer.write(&R::batch(schema, rows)?)?;
                writer.flush()?; // the chunk's row group, out
            }
            ExportFile::Csv(out, _) => {
                let mut line = String::with_capacity(128);
                for r in rows {
                    line.clear();
                    r.csv(&mut line);
                    out.write_all(line.as_bytes())?;
                }
                out.flush()?;
            }
        }
        Ok(())
    }

    /// Ends the file; returns the writer.
    pub fn finish(self) -> Result<W, ExportError> {
        match self {
            ExportFile::Parquet { writer, .. } => Ok(writer.into_inner()?),
            ExportFile::Csv(mut out, _) => {
                out.flush()?;
                Ok(out)
            }
        }
    }
}

/// What an export covers and how it is written.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ExportRange {
    /// The first and last time (ms, inclusive): a candle's open time, a trade's time.
    pub from: i64,
    pub to: i64,
    /// The most rows written; more is an error ([`ExportError::TooMany`]).
    pub max_rows: u64,
    pub format: Format,
}

/// Writes `series`' stored candles of the range to `out`, reading [`CHUNK`] rows at a time. The
/// next chunk is read (on a thread of its own, joined before this returns) while one is written,
/// two chunks at most held. Returns the rows written and the writer.
pub fn candles<W: Write + Send>(
    store: &dyn CandleStore,
    series: &SeriesId,
    range: ExportRange,
    out: W,
) -> Result<(u64, W), ExportError> {
    let ExportRange { from, to, max_rows, format } = range;
    let mut file = CandleFile::new(format, "series", &series.to_string(), out)?;
    let (tx, rx) = std::sync::mpsc::sync_channel::<Result<Vec<Candle>, StoreError>>(1);
    let rows = std::thread::scope(|scope| -> Result<u64, ExportError> {
        scope.spawn(move || {
            let mut start = from;
            while start <= to {
                let chunk = store.candles(series, Some(start), Some(to), CHUNK);
                let (last, full) = match &chunk {
                    Ok(c) => (c.last().map(|c| c.open_time), c.len() == CHUNK),
                    Err(_) => (None, false),
                };
                let failed = chunk.is_err();
                if (last.is_some() || failed) && tx.send(chunk).is_err() {
                    return; // the writer stopped
                }
                match last.and_then(|t| t.checked_add(1)) {
                    Some(next) if full && !failed => start = next,
                    _ => return,
                }
            }
        });
        let mut rows = 0u64;
        for chunk in rx {
            let chunk = chunk?;
            rows += chunk.len() as u64;
            if rows > max_rows {
                return Err(ExportError::TooMany { max: max_rows });
            }
            file.write(&chunk)?;
        }
        Ok(rows)
    })?;
    let mut out = file.finish()?;
    out.flush()?;
    Ok((rows, out))
}

/// A writer handing what is written to a channel in pieces of about [`PIECE`] bytes (a streamed
/// HTTP body). A closed channel (the client left) is an error that ends the export.
pub struct ChannelWriter {
    tx: tokio::sync::mpsc::Sender<std::io::Result<bytes::Bytes>>,
    buf: Vec<u8>,
}

/// The size of a streamed piece.
const PIECE: usize = 256 << 10;

impl ChannelWriter {
    pub fn new(tx: tokio::sync::mpsc::Sender<std::io::Result<bytes::Bytes>>) -> Self {
        ChannelWriter { tx, buf: Vec::with_capacity(PIECE) }
    }

    fn send(&mut self) -> std::io::Result<()> {
        if self.buf.is_empty() {
            return Ok(());
        }
        let piece = bytes::Bytes::from(std::mem::replace(&mut self.buf, Vec::with_capacity(PIECE)));
        self.tx
            .blocking_send(Ok(piece))
            .map_err(|_| std::io::Error::new(std::io::ErrorKind::BrokenPipe, "the client left"))
    }
}

impl Write for ChannelWriter {
    fn write(&mut self, data: &[u8]) -> std::io::Result<usize> {
        self.buf.extend_from_slice(data);
        if self.buf.len() >= PIECE {
            self.send()?;
        }
        Ok(data.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        self.send()
    }
}

/// How far out of its time's order a trade may arrive and still be found by a ranged export
/// (see [`crate::recorded::trade_receive_range`]): the hours read are widened by this much of
/// trade time each side.
const ORDER_JITTER_MS: i64 = 60_000;

/// What a trades export reads: the venue's own symbol of `instrument` in the recording at
/// `record_dirs` (the first is described; a cluster's workers' are merged with it).
#[derive(Debug, Clone)]
pub struct RecordedTrades {
    dirs: Vec<std::path::PathBuf>,
    instrument: InstrumentId,
    symbol: String,
}

impl RecordedTrades {
    /// Finds `instrument` in the recording: an error says why it cannot be exported (no
    /// recording of its source, another market, no such instrument listed).
    pub fn find(
        record_dirs: &[std::path::PathBuf],
        instrument: &InstrumentId,
    ) -> Result<Self, ExportError> {
        let source = &instrument.exchange;
        let Some(record_dir) = record_dirs.first() else {
            return Err(ExportError::NotRecorded(format!(
                "{instrument}: no recording of source {source}"
            )));
        };
        let (dialect, market) = crate::recorded::describe(record_dir, source)?;
        if market != instrument.market {
            return Err(ExportError::NotRecorded(format!(
                "{instrument}: the recording of {source} is of the {} market",
                market.as_str()
            )));
        }
        let symbol = crate::recorded::venue_symbol(record_dir, source, dialect, instrument)?
            .ok_or_else(|| {
                ExportError::NotRecorded(format!(
                    "{instrument}: the recording of {source} lists no such instrument"
                ))
            })?;
        Ok(RecordedTrades { dirs: record_dirs.to_vec(), instrument: instrument.clone(), symbol })
    }
}

/// Writes `instrument`'s trades of the range (the venue's trade times) from the recording at
/// `record_dirs` (`[record]`; millrace keeps no trades table: every trade it received is in the
/// recording, with when it came; several directories — a cluster's workers' — are merged by
/// trade id, [`crate::recorded::read_merged`]) to `out`, [`CHUNK`] rows a row group, in the
/// order they were received, a trade recorded twice (a duplicate frame, a replica's copy) written
/// once by that merge. Returns the rows written and the writer.
pub fn trades<W: Write + Send>(
    record_dirs: &[std::path::PathBuf],
    instrument: &InstrumentId,
    range: ExportRange,
    out: W,
) -> Result<(u64, W), ExportError> {
    recorded_trades(&RecordedTrades::find(record_dirs, instrument)?, range, out)
}

/// [`trades`] of a recording already found.
pub fn recorded_trades<W: Write + Send>(
    found: &RecordedTrades,
    range: ExportRange,
    out: W,
) -> Result<(u64, W), ExportError> {
    let ExportRange { from, to, max_rows, format } = range;
    let RecordedTrades { dirs: record_dirs, instrument, symbol } = found;
    let source = &instrument.exchange;
    let mut file =
        ExportFile::<W, TradeRow>::new(format, "instrument", &instrument.to_string(), out)?;
    let mut chunk: Vec<TradeRow> = Vec::with_capacity(CHUNK);
    let mut rows = 0u64;
    let mut failed: Option<ExportError> = None;
    let channels = crate::recorded::Channels::parse("trade")?;
    // the hours that hold the range's trades (all of them when the range is open)
    let window = if from <= 0 && to == i64::MAX {
        Some((None, None))
    } else {
        crate::recorded::trade_receive_range(
            record_dirs,
            source,
            symbol,
            (from, to),
            ORDER_JITTER_MS,
        )?
        .map(|(lo, hi)| (Some(lo), Some(hi)))
    };
    // (`None`: no recorded hour holds a trade of the range, the file has its header only)
    if let Some((lo, hi)) = window {
        crate::recorded::read_merged(record_dirs, source, lo, hi, channels, &mut |line| {
            let shared::protocol::replay::ReplayLine::Trade { time_ns, symbol: s, trades, .. } =
                line
            else {
                return true;
            };
            if s != *symbol {
                return true;
            }
            for trade in trades {
                if trade.time_ms < from || trade.time_ms > to {
                    continue;
                }
                rows += 1;
                if rows > max_rows {
                    failed = Some(ExportError::TooMany { max: max_rows });
                    return false;
                }
                chunk.push(TradeRow { received_ns: time_ns, trade });
                if chunk.len() == CHUNK {
                    if let Err(e) = file.write(&chunk) {
                        failed = Some(e);
                        return false;
                    }
                    chunk.clear();
                }
            }
            true
        })?;
    }
    if let Some(e) = failed {
        return Err(e);
    }
    file.write(&chunk)?;
    let mut out = file.finish()?;
    out.flush()?;
    Ok((rows, out))
}
