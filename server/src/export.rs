//! History out as files (issue 30): a series' stored candles as Parquet or CSV, read from the
//! store in chunks of [`CHUNK`] rows so memory stays flat for any range, for
//! `millrace export candles` and `GET /api/v1/export/candles`.
//!
//! **Parquet** (the Arrow and Parquet crates): typed columns — `open_time` a timestamp (ms, UTC),
//! prices and the volume decimals of scale 8 (millrace's fixed point, exactly), `trades` and
//! `minutes` unsigned integers — one row group per chunk, zstd-compressed, and the series in the
//! file's key-value metadata (`millrace.series`). **CSV**: a header, then one line per candle,
//! the time in RFC 3339 (ms, UTC) and the numbers as millrace prints them (exact decimals).

use std::io::Write;
use std::sync::Arc;

use arrow_array::{
    Decimal128Array, RecordBatch, TimestampMillisecondArray, UInt32Array, UInt64Array,
};
use arrow_schema::{DataType, Field, Schema, TimeUnit};
use parquet::arrow::ArrowWriter;
use parquet::basic::{Compression, ZstdLevel};
use parquet::file::metadata::KeyValue;
use parquet::file::properties::WriterProperties;
use shared::candle::Candle;
use shared::protocol::SeriesId;

use crate::store::{CandleStore, StoreError};

/// Rows read from the store and written as one row group at a time.
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
}

/// The Arrow schema of exported candles.
pub fn candle_schema() -> Arc<Schema> {
    let price = || DataType::Decimal128(PRICE_PRECISION, 8);
    Arc::new(Schema::new(vec![
        Field::new(
            "open_time",
            DataType::Timestamp(TimeUnit::Millisecond, Some("UTC".into())),
            false,
        ),
        Field::new("open", price(), false),
        Field::new("high", price(), false),
        Field::new("low", price(), false),
        Field::new("close", price(), false),
        Field::new("volume", DataType::Decimal128(VOLUME_PRECISION, 8), false),
        Field::new("trades", DataType::UInt64, false),
        Field::new("minutes", DataType::UInt32, false),
    ]))
}

/// One chunk of candles as Arrow columns.
fn batch(schema: &Arc<Schema>, candles: &[Candle]) -> Result<RecordBatch, ExportError> {
    let price = |f: fn(&Candle) -> i64| {
        Decimal128Array::from_iter_values(candles.iter().map(|c| i128::from(f(c))))
            .with_precision_and_scale(PRICE_PRECISION, 8)
    };
    let columns: Vec<arrow_array::ArrayRef> = vec![
        Arc::new(
            TimestampMillisecondArray::from_iter_values(candles.iter().map(|c| c.open_time))
                .with_timezone("UTC"),
        ),
        Arc::new(price(|c| c.open.raw())?),
        Arc::new(price(|c| c.high.raw())?),
        Arc::new(price(|c| c.low.raw())?),
        Arc::new(price(|c| c.close.raw())?),
        Arc::new(
            Decimal128Array::from_iter_values(candles.iter().map(|c| c.volume.raw()))
                .with_precision_and_scale(VOLUME_PRECISION, 8)?,
        ),
        Arc::new(UInt64Array::from_iter_values(candles.iter().map(|c| c.trades))),
        Arc::new(UInt32Array::from_iter_values(candles.iter().map(|c| c.minutes))),
    ];
    Ok(RecordBatch::try_new(schema.clone(), columns)?)
}

/// A file being written, chunk by chunk.
pub enum CandleFile<W: Write + Send> {
    Parquet { writer: Box<ArrowWriter<W>>, schema: Arc<Schema> },
    Csv(W),
}

impl<W: Write + Send> CandleFile<W> {
    /// Starts a file of `series` in `format` on `out`.
    pub fn new(format: Format, series: &SeriesId, mut out: W) -> Result<Self, ExportError> {
        Ok(match format {
            Format::Parquet => {
                let schema = candle_schema();
                let props = WriterProperties::builder()
                    .set_compression(Compression::ZSTD(ZstdLevel::default()))
                    .set_key_value_metadata(Some(vec![KeyValue::new(
                        "millrace.series".to_string(),
                        series.to_string(),
                    )]))
                    .build();
                let writer = ArrowWriter::try_new(out, schema.clone(), Some(props))?;
                CandleFile::Parquet { writer: Box::new(writer), schema }
            }
            Format::Csv => {
                out.write_all(b"open_time,open,high,low,close,volume,trades,minutes\n")?;
                CandleFile::Csv(out)
            }
        })
    }

    /// Writes one chunk (one row group in Parquet).
    pub fn write(&mut self, candles: &[Candle]) -> Result<(), ExportError> {
        if candles.is_empty() {
            return Ok(());
        }
        match self {
            CandleFile::Parquet { writer, schema } => {
                writer.write(&batch(schema, candles)?)?;
                writer.flush()?; // the chunk's row group, out
            }
            CandleFile::Csv(out) => {
                let mut line = String::with_capacity(128);
                for c in candles {
                    line.clear();
                    venues::write_rfc3339(&mut line, c.open_time);
                    use std::fmt::Write as _;
                    let _ = writeln!(
                        line,
                        ",{},{},{},{},{},{},{}",
                        c.open, c.high, c.low, c.close, c.volume, c.trades, c.minutes
                    );
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
            CandleFile::Parquet { writer, .. } => Ok(writer.into_inner()?),
            CandleFile::Csv(mut out) => {
                out.flush()?;
                Ok(out)
            }
        }
    }
}

/// Writes `series`' stored candles with `from <= open_time <= to` to `out` in `format`, reading
/// [`CHUNK`] rows at a time; at most `max_rows`. Returns the rows written and the writer.
pub fn candles<W: Write + Send>(
    store: &dyn CandleStore,
    series: &SeriesId,
    from: i64,
    to: i64,
    max_rows: u64,
    format: Format,
    out: W,
) -> Result<(u64, W), ExportError> {
    let mut file = CandleFile::new(format, series, out)?;
    let (mut start, mut rows) = (from, 0u64);
    while start <= to {
        let chunk = store.candles(series, Some(start), Some(to), CHUNK)?;
        let Some(last) = chunk.last() else { break };
        rows += chunk.len() as u64;
        if rows > max_rows {
            return Err(ExportError::TooMany { max: max_rows });
        }
        start = last.open_time + 1;
        file.write(&chunk)?;
        if chunk.len() < CHUNK {
            break;
        }
    }
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
