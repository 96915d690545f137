//! The bytes of a recording file (docs/recording.md): blocks of records, each behind a zstd
//! skippable frame that says how long its zstd frame is and what its CRC-32 is.

use std::fs::File;
use std::io::{BufReader, Read};
use std::path::{Path, PathBuf};

use crate::{io, RecordingError};

/// A block is written once its records reach this many bytes (before compression).
pub const BLOCK_TARGET: usize = 256 << 10;
/// The most bytes a block's records may take, written or read (a longer one is refused).
pub const MAX_BLOCK: usize = 64 << 20;
/// The zstd skippable frame magic millrace's block headers use (0x184D2A50–5F are skippable).
const SKIPPABLE: u32 = 0x184D_2A5E;
const BLOCK_MAGIC: &[u8; 4] = b"MRB1";
/// Skippable magic, its size field, then MRB1, frame length, frame CRC, record count.
const HEADER_LEN: usize = 4 + 4 + 16;
/// The zstd level of a block: 1, the fastest that still packs Binance depth frames 5.7 times
/// (level 3 took a fifth longer; -3 packs 3.6 times, BENCHMARKS.md).
const LEVEL: i32 = 1;

/// What a record is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u8)]
pub enum Kind {
    /// A text frame received on a WebSocket.
    Received = 1,
    /// A text frame sent on a WebSocket (a subscription, a ping).
    Sent = 2,
    /// A WebSocket connected; `meta` is its URL.
    Connected = 3,
    /// A WebSocket ended; `meta` says why.
    Closed = 4,
    /// A REST request went out; `meta` is `GET <url>`.
    RestRequest = 5,
    /// Its answer; `meta` is the HTTP status, `body` the answer's body.
    RestAnswer = 6,
}

impl Kind {
    fn of(b: u8) -> Option<Kind> {
        Some(match b {
            1 => Kind::Received,
            2 => Kind::Sent,
            3 => Kind::Connected,
            4 => Kind::Closed,
            5 => Kind::RestRequest,
            6 => Kind::RestAnswer,
            _ => return None,
        })
    }

    pub fn as_str(self) -> &'static str {
        match self {
            Kind::Received => "received",
            Kind::Sent => "sent",
            Kind::Connected => "connected",
            Kind::Closed => "closed",
            Kind::RestRequest => "rest_request",
            Kind::RestAnswer => "rest_answer",
        }
    }
}

/// One record to write.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Record<'a> {
    pub kind: Kind,
    /// When it was received (or sent), Unix ns.
    pub time_ns: i64,
    /// The connection it belongs to (a REST request and its answer share one).
    pub conn: u64,
    pub meta: &'a str,
    pub body: &'a [u8],
}

/// Kind, time, connection, and the two lengths.
const RECORD_HEAD: usize = 1 + 8 + 8 + 4 + 4;

impl Record<'_> {
    /// Its size in a block.
    pub fn encoded_len(&self) -> usize {
        RECORD_HEAD + self.meta.len() + self.body.len()
    }

    fn encode(&self, out: &mut Vec<u8>) {
        out.push(self.kind as u8);
        out.extend_from_slice(&self.time_ns.to_le_bytes());
        out.extend_from_slice(&self.conn.to_le_bytes());
        out.extend_from_slice(&(self.meta.len() as u32).to_le_bytes());
        out.extend_from_slice(self.meta.as_bytes());
        out.extend_from_slice(&(self.body.len() as u32).to_le_bytes());
        out.extend_from_slice(self.body);
    }
}

/// One record read.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OwnedRecord {
    pub kind: Kind,
    pub time_ns: i64,
    pub conn: u64,
    pub meta: String,
    pub body: Vec<u8>,
}

impl OwnedRecord {
    pub fn as_record(&self) -> Record<'_> {
        Record {
            kind: self.kind,
            time_ns: self.time_ns,
            conn: self.conn,
            meta: &self.meta,
            body: &self.body,
        }
    }
}

/// The records of the block being filled.
#[derive(Default)]
pub(crate) struct BlockBuilder {
    raw: Vec<u8>,
    count: u32,
}

impl BlockBuilder {
    pub(crate) fn len(&self) -> usize {
        self.raw.len()
    }

    pub(crate) fn count(&self) -> u32 {
        self.count
    }

    pub(crate) fn push(&mut self, r: &Record<'_>) {
        r.encode(&mut self.raw);
        self.count += 1;
    }

    /// The block's bytes as written (header, then the zstd frame); `None` when empty. The
    /// builder is empty again afterwards.
    pub(crate) fn finish(&mut self) -> Option<Vec<u8>> {
        if self.count == 0 {
            return None;
        }
        let frame = zstd::bulk::compress(&self.raw, LEVEL).expect("compressing into memory");
        let mut out = Vec::with_capacity(HEADER_LEN + frame.len());
        out.extend_from_slice(&SKIPPABLE.to_le_bytes());
        out.extend_from_slice(&16u32.to_le_bytes());
        out.extend_from_slice(BLOCK_MAGIC);
        out.extend_from_slice(&(frame.len() as u32).to_le_bytes());
        out.extend_from_slice(&crc32fast::hash(&frame).to_le_bytes());
        out.extend_from_slice(&self.count.to_le_bytes());
        out.extend_from_slice(&frame);
        self.raw.clear();
        self.count = 0;
        Some(out)
    }
}

/// Where a file's readable part ends, and why.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Torn {
    /// The offset of the first block that could not be read (everything before it was).
    pub offset: u64,
    /// The bytes from there to the end of the file, left unread.
    pub bytes: u64,
    pub reason: String,
}

/// Reads a recording file block by block, each checked (CRC-32, lengths, record bounds) before
/// its records are given; the first block that fails ends the file ([`FileReader::torn`]).
pub struct FileReader {
    path: PathBuf,
    file: BufReader<File>,
    len: u64,
    offset: u64,
    torn: Option<Torn>,
    done: bool,
}

impl FileReader {
    pub fn open(path: &Path) -> Result<Self, RecordingError> {
        let file = File::open(path).map_err(io(path))?;
        let len = file.metadata().map_err(io(path))?.len();
        Ok(FileReader {
            path: path.to_path_buf(),
            file: BufReader::new(file),
            len,
            offset: 0,
            torn: None,
            done: false,
        })
    }

    /// Why reading stopped before the end of the file, once it did.
    pub fn torn(&self) -> Option<&Torn> {
        self.torn.as_ref()
    }

    /// The offset after the last block read whole.
    pub fn offset(&self) -> u64 {
        self.offset
    }

    /// Reads to the end; returns where the valid blocks end.
    pub fn valid_end(mut self) -> Result<u64, RecordingError> {
        while self.next_block()?.is_some() {}
        Ok(self.offset)
    }

    /// The next block's records; `None` at the end of the file or at a torn block.
    pub fn next_block(&mut self) -> Result<Option<Vec<OwnedRecord>>, RecordingError> {
        if self.done {
            return Ok(None);
        }
        let left = self.len - self.offset;
        if left == 0 {
            self.done = true;
            return Ok(None);
        }
        match self.read_block(left) {
            Ok(Ok((records, size))) => {
                self.offset += size;
                Ok(Some(records))
            }
            Ok(Err(reason)) => {
                self.torn = Some(Torn { offset: self.offset, bytes: left, reason });
                self.done = true;
                Ok(None)
            }
            Err(e) => Err(RecordingError::Io { path: self.path.clone(), source: e }),
        }
    }

    /// One block: its records and its size, or why it cannot be read (an IO error apart).
    #[allow(clippy::type_complexity)]
    fn read_block(
        &mut self,
        left: u64,
    ) -> std::io::Result<Result<(Vec<OwnedRecord>, u64), String>> {
        if left < HEADER_LEN as u64 {
            return Ok(Err(format!("{left} bytes, shorter than a block header")));
        }
        let mut h = [0u8; HEADER_LEN];
        self.file.read_exact(&mut h)?;
        let u32_at = |i: usize| u32::from_le_bytes(h[i..i + 4].try_into().expect("4 bytes"));
        if u32_at(0) != SKIPPABLE || u32_at(4) != 16 || &h[8..12] != BLOCK_MAGIC {
            return Ok(Err("not a block header".into()));
        }
        let (frame_len, crc, count) = (u32_at(12) as u64, u32_at(16), u32_at(20));
        if frame_len > left - HEADER_LEN as u64 {
            return Ok(Err(format!("a block of {frame_len} bytes with {left} left: cut short")));
        }
        if frame_len > MAX_BLOCK as u64 {
            return Ok(Err(format!("a block of {frame_len} bytes, more than {MAX_BLOCK}")));
        }
        let mut frame = vec![0u8; frame_len as usize];
        self.file.read_exact(&mut frame)?;
        if crc32fast::hash(&frame) != crc {
            return Ok(Err("the block's CRC-32 does not match".into()));
        }
        let raw = match zstd::bulk::decompress(&frame, MAX_BLOCK) {
            Ok(raw) => raw,
            Err(e) => return Ok(Err(format!("the block does not decompress: {e}"))),
        };
        Ok(decode_records(&raw, count).map(|r| (r, HEADER_LEN as u64 + frame_len)))
    }
}

/// The `count` records of a block's bytes, each within them.
fn decode_records(raw: &[u8], count: u32) -> Result<Vec<OwnedRecord>, String> {
    let mut out = Vec::with_capacity((count as usize).min(raw.len() / RECORD_HEAD + 1));
    let mut at = 0usize;
    let take = |at: &mut usize, n: usize| -> Result<&[u8], String> {
        let end =
            at.checked_add(n).filter(|&e| e <= raw.len()).ok_or("a record runs past its block")?;
        let s = &raw[*at..end];
        *at = end;
        Ok(s)
    };
    for _ in 0..count {
        let kind = take(&mut at, 1)?[0];
        let kind = Kind::of(kind).ok_or_else(|| format!("unknown record kind {kind}"))?;
        let time_ns = i64::from_le_bytes(take(&mut at, 8)?.try_into().expect("8 bytes"));
        let conn = u64::from_le_bytes(take(&mut at, 8)?.try_into().expect("8 bytes"));
        let meta_len = u32::from_le_bytes(take(&mut at, 4)?.try_into().expect("4 bytes"));
        let meta = std::str::from_utf8(take(&mut at, meta_len as usize)?)
            .map_err(|_| "a record's meta is not UTF-8")?
            .to_string();
        let body_len = u32::from_le_bytes(take(&mut at, 4)?.try_into().expect("4 bytes"));
        let body = take(&mut at, body_len as usize)?.to_vec();
        out.push(OwnedRecord { kind, time_ns, conn, meta, body });
    }
    if at != raw.len() {
        return Err(format!("{} bytes after the block's {count} records", raw.len() - at));
    }
    Ok(out)
}

/// The bytes of a block of `records`, as a recorder writes it.
#[cfg(test)]
pub(crate) fn tests_block(records: &[Record<'_>]) -> Vec<u8> {
    let mut b = BlockBuilder::default();
    for r in records {
        b.push(r);
    }
    b.finish().expect("records")
}
