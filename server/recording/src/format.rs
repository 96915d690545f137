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
/// The zstd level of a block: −5, one of zstd's fast levels. On 1.46 KB Binance depth frames in
/// 256 KiB blocks it compresses a frame in 1.9 µs and unpacks it in 0.7 µs, packing them 3.0
/// times; level 1 took 2.9 µs and 1.0 µs for 6.2 times, and −4, −6 to −10 were no faster
/// (BENCHMARKS.md, "Record, replay, export"). Recording's cost is on every frame received, its
/// disk is bounded by `record.budget_mb`.
const LEVEL: i32 = -5;

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

/// One record read, owning its bytes.
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

impl From<Record<'_>> for OwnedRecord {
    fn from(r: Record<'_>) -> Self {
        OwnedRecord {
            kind: r.kind,
            time_ns: r.time_ns,
            conn: r.conn,
            meta: r.meta.to_string(),
            body: r.body.to_vec(),
        }
    }
}

/// Where one record of a [`Block`] lies in its bytes.
#[derive(Debug, Clone, Copy)]
struct Span {
    kind: Kind,
    time_ns: i64,
    conn: u64,
    meta: (usize, usize),
    body: (usize, usize),
}

/// The records of one block, checked, read into buffers that [`FileReader::read_block`] reuses:
/// reading a recording allocates per block only while its buffers grow, never per record.
#[derive(Debug, Default)]
pub struct Block {
    raw: Vec<u8>,
    spans: Vec<Span>,
}

impl Block {
    pub fn len(&self) -> usize {
        self.spans.len()
    }

    pub fn is_empty(&self) -> bool {
        self.spans.is_empty()
    }

    /// Its records in the order they were written.
    pub fn iter(&self) -> impl ExactSizeIterator<Item = Record<'_>> + '_ {
        self.spans.iter().map(|s| Record {
            kind: s.kind,
            time_ns: s.time_ns,
            conn: s.conn,
            // checked as UTF-8 when the block was read
            meta: std::str::from_utf8(&self.raw[s.meta.0..s.meta.1]).unwrap_or_default(),
            body: &self.raw[s.body.0..s.body.1],
        })
    }

    /// Reads the `count` records of `self.raw`, each within it; `Err` says why they cannot be.
    fn index(&mut self, count: u32) -> Result<(), String> {
        let raw = &self.raw;
        let spans = &mut self.spans;
        spans.clear();
        spans.reserve((count as usize).min(raw.len() / RECORD_HEAD + 1));
        let mut at = 0usize;
        let take = |at: &mut usize, n: usize| -> Result<(usize, usize), String> {
            let end = at
                .checked_add(n)
                .filter(|&e| e <= raw.len())
                .ok_or("a record runs past its block")?;
            let s = (*at, end);
            *at = end;
            Ok(s)
        };
        let le8 = |(a, b): (usize, usize)| -> [u8; 8] { raw[a..b].try_into().expect("8 bytes") };
        let le4 = |(a, b): (usize, usize)| -> u32 {
            u32::from_le_bytes(raw[a..b].try_into().expect("4 bytes"))
        };
        for _ in 0..count {
            let kind = raw[take(&mut at, 1)?.0];
            let kind = Kind::of(kind).ok_or_else(|| format!("unknown record kind {kind}"))?;
            let time_ns = i64::from_le_bytes(le8(take(&mut at, 8)?));
            let conn = u64::from_le_bytes(le8(take(&mut at, 8)?));
            let meta_len = le4(take(&mut at, 4)?);
            let meta = take(&mut at, meta_len as usize)?;
            std::str::from_utf8(&raw[meta.0..meta.1])
                .map_err(|_| "a record's meta is not UTF-8")?;
            let body_len = le4(take(&mut at, 4)?);
            let body = take(&mut at, body_len as usize)?;
            spans.push(Span { kind, time_ns, conn, meta, body });
        }
        if at != raw.len() {
            return Err(format!("{} bytes after the block's {count} records", raw.len() - at));
        }
        Ok(())
    }
}

/// The records of the block being filled.
#[derive(Default)]
pub(crate) struct BlockBuilder {
    raw: Vec<u8>,
    count: u32,
    /// Kept from block to block (a context costs more to set up than a small block to pack).
    packer: Option<zstd::bulk::Compressor<'static>>,
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
        let packer = match &mut self.packer {
            Some(p) => p,
            empty => empty.insert(zstd::bulk::Compressor::new(LEVEL).expect("a zstd context")),
        };
        let frame = packer.compress(&self.raw).expect("compressing into memory");
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
    /// The compressed frame of the block being read, and the context that unpacks it, both
    /// kept from block to block.
    frame: Vec<u8>,
    unpacker: Option<zstd::bulk::Decompressor<'static>>,
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
            frame: Vec::new(),
            unpacker: None,
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
        let mut block = Block::default();
        while self.read_block(&mut block)? {}
        Ok(self.offset)
    }

    /// The next block's records, each owning its bytes; `None` at the end of the file or at a
    /// torn block. [`FileReader::read_block`] reads without a copy per record.
    pub fn next_block(&mut self) -> Result<Option<Vec<OwnedRecord>>, RecordingError> {
        let mut block = Block::default();
        Ok(self.read_block(&mut block)?.then(|| block.iter().map(OwnedRecord::from).collect()))
    }

    /// Reads the next block into `block`; `false` at the end of the file or at a torn block
    /// (`block` is then empty).
    pub fn read_block(&mut self, block: &mut Block) -> Result<bool, RecordingError> {
        block.raw.clear();
        block.spans.clear();
        if self.done {
            return Ok(false);
        }
        let left = self.len - self.offset;
        if left == 0 {
            self.done = true;
            return Ok(false);
        }
        match self.read_one(left, block) {
            Ok(Ok(size)) => {
                self.offset += size;
                Ok(true)
            }
            Ok(Err(reason)) => {
                block.raw.clear();
                block.spans.clear();
                self.torn = Some(Torn { offset: self.offset, bytes: left, reason });
                self.done = true;
                Ok(false)
            }
            Err(e) => Err(RecordingError::Io { path: self.path.clone(), source: e }),
        }
    }

    /// One block into `block`: its size, or why it cannot be read (an IO error apart).
    fn read_one(&mut self, left: u64, block: &mut Block) -> std::io::Result<Result<u64, String>> {
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
        self.frame.resize(frame_len as usize, 0);
        self.file.read_exact(&mut self.frame)?;
        if crc32fast::hash(&self.frame) != crc {
            return Ok(Err("the block's CRC-32 does not match".into()));
        }
        // the frame says how large it unpacks (a recorder always writes it); bounded before
        // anything is reserved
        let size = match zstd::zstd_safe::get_frame_content_size(&self.frame) {
            Ok(Some(n)) if n <= MAX_BLOCK as u64 => n as usize,
            Ok(Some(n)) => {
                return Ok(Err(format!("a block of {n} bytes unpacked, over {MAX_BLOCK}")))
            }
            _ => return Ok(Err("the block's frame does not say its size".into())),
        };
        let unpacker = match &mut self.unpacker {
            Some(u) => u,
            empty => empty.insert(zstd::bulk::Decompressor::new()?),
        };
        block.raw.reserve(size);
        match unpacker.decompress_to_buffer(&self.frame, &mut block.raw) {
            Ok(n) if n == size => {}
            Ok(n) => return Ok(Err(format!("the block unpacks to {n} bytes, not {size}"))),
            Err(e) => return Ok(Err(format!("the block does not decompress: {e}"))),
        }
        Ok(block.index(count).map(|()| HEADER_LEN as u64 + frame_len))
    }
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
