//! The recorder (`[record]`, docs/recording.md): every frame a recorded source receives over
//! WebSocket, what it sends there, its connections, and the REST requests and answers its sync
//! uses, with the receive time (ns) and the connection, into the `recording` crate's files per
//! source and hour.
//!
//! **Never slows ingest.** A job hands a frame to its source's [`Tap`], which queues it on a
//! bounded channel (`record.queue` frames for all sources) without waiting: when the queue is
//! full (the disk is slow) the frame is dropped from the recording, counted, and the live path
//! goes on. One thread writes: it appends each frame to its source's [`recording::Recorder`],
//! writes the blocks every [`FLUSH_EVERY`] and at stop, and every [`CLEANUP_EVERY`] deletes the
//! files past `record.retention_days` and then the oldest until `record.budget_mb` fits. A failed
//! write (the disk full, the directory gone) drops that block from the recording, counted and
//! logged, and the thread goes on with the next; the live path never sees it.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::{mpsc, Arc};
use std::time::{Duration, Instant};

use bytes::Bytes;
use recording::{Kind, Record, Recorder};

use crate::clock::{wall_clock_ms, wall_clock_ns};
use crate::config::Config;
use crate::shutdown::Shutdown;

/// How often the writer writes the blocks it is filling.
pub const FLUSH_EVERY: Duration = Duration::from_millis(200);
/// How often the writer applies the budget and the retention.
pub const CLEANUP_EVERY: Duration = Duration::from_secs(10);

/// What the recorder did, for ops and `/metrics`.
#[derive(Debug, Default)]
pub struct RecordingStats {
    /// Frames handed to the writer.
    pub queued: AtomicU64,
    /// Frames written to files.
    pub recorded: AtomicU64,
    /// Frames dropped from the recording because the queue was full.
    pub dropped_queue_full: AtomicU64,
    /// Frames dropped because their write failed.
    pub dropped_write_failed: AtomicU64,
    pub write_errors: AtomicU64,
    pub bytes_written: AtomicU64,
    pub files_deleted: AtomicU64,
}

pub use shared::protocol::ops::RecordingReport;

/// One frame on its way to the writer.
struct Item {
    source: Arc<str>,
    kind: Kind,
    time_ns: i64,
    conn: u64,
    meta: String,
    body: Bytes,
}

/// A source's side of the recorder: cheap to clone, never blocks.
#[derive(Clone)]
pub struct Tap {
    source: Arc<str>,
    queue: mpsc::SyncSender<Item>,
    stats: Arc<RecordingStats>,
}

/// The process's connection numbers (a REST request and its answer share one).
static NEXT_CONN: AtomicU64 = AtomicU64::new(1);

/// A new connection number.
pub fn next_conn() -> u64 {
    NEXT_CONN.fetch_add(1, Relaxed)
}

/// A Binance source's REST requests and answers, recorded (a request and its answer share a
/// connection number, as a venue source's do in `VenueSource::get_text`).
impl binance::rest::RestObserver for Tap {
    fn request(&self, url: &str) -> u64 {
        let conn = next_conn();
        let meta = format!("GET {}", crate::redact::redact(url));
        self.record(Kind::RestRequest, conn, meta, Bytes::new());
        conn
    }

    fn answer(&self, token: u64, status: u16, body: &[u8]) {
        self.record(Kind::RestAnswer, token, status.to_string(), Bytes::copy_from_slice(body));
    }
}

impl Tap {
    /// Queues one record of this source, timed now; dropped (and counted) when the queue is full.
    pub fn record(&self, kind: Kind, conn: u64, meta: impl Into<String>, body: Bytes) {
        let item = Item {
            source: self.source.clone(),
            kind,
            time_ns: wall_clock_ns(),
            conn,
            meta: meta.into(),
            body,
        };
        match self.queue.try_send(item) {
            Ok(()) => self.stats.queued.fetch_add(1, Relaxed),
            Err(_) => self.stats.dropped_queue_full.fetch_add(1, Relaxed),
        };
    }

    /// A received text frame.
    pub fn received(&self, conn: u64, text: &str) {
        self.record(Kind::Received, conn, "", Bytes::copy_from_slice(text.as_bytes()));
    }

    /// A sent text frame.
    pub fn sent(&self, conn: u64, text: &str) {
        self.record(Kind::Sent, conn, "", Bytes::copy_from_slice(text.as_bytes()));
    }
}

/// The recorder of one process: a [`Tap`] per recorded source and the writer thread.
pub struct Recording {
    taps: HashMap<String, Tap>,
    stats: Arc<RecordingStats>,
    last_error: Arc<std::sync::Mutex<Option<String>>>,
    dir: std::path::PathBuf,
}

impl Recording {
    /// Starts the writer for the recorded sources of `config` (none when `record.enabled` is
    /// false: every [`Recording::tap`] is then `None`).
    pub fn start(config: &Config, shutdown: &Shutdown) -> std::io::Result<Arc<Recording>> {
        let stats = Arc::new(RecordingStats::default());
        let last_error = Arc::new(std::sync::Mutex::new(None));
        let dir = config.record_dir();
        let sources: Vec<String> = config
            .sources
            .iter()
            .filter(|s| config.records(&s.name))
            .flat_map(|s| {
                // an embedded simulator's venues are sources of their own, recorded with it
                let sim = s.kind == crate::config::SourceKind::Sim && s.venues;
                let venues = crate::venue::SIM_DIALECTS
                    .iter()
                    .filter(move |_| sim)
                    .map(|d| format!("{}-{d}", s.name));
                std::iter::once(s.name.clone()).chain(venues)
            })
            .collect();
        if sources.is_empty() {
            return Ok(Arc::new(Recording { taps: HashMap::new(), stats, last_error, dir }));
        }
        let (tx, rx) = mpsc::sync_channel::<Item>(config.record.queue);
        let taps = sources
            .iter()
            .map(|s| {
                let tap =
                    Tap { source: Arc::from(s.as_str()), queue: tx.clone(), stats: stats.clone() };
                (s.clone(), tap)
            })
            .collect();
        drop(tx);
        let writer = Writer {
            dir: dir.clone(),
            budget: config.record.budget_mb.saturating_mul(1 << 20),
            retention_ms: i64::try_from(config.record.retention_days * 86_400_000)
                .unwrap_or(i64::MAX),
            recorders: HashMap::new(),
            retired: (0, 0),
            stats: stats.clone(),
            last_error: last_error.clone(),
        };
        shutdown.spawn_thread("recorder".into(), move |token| writer.run(rx, token))?;
        tracing::info!(dir = %dir.display(), ?sources, "recording");
        Ok(Arc::new(Recording { taps, stats, last_error, dir }))
    }

    /// Writes `{dir}/{source}/source.json`: what the source is (its dialect, its market), for
    /// whoever reads the recording. A failure is logged and counted; the recording goes on.
    pub fn describe(
        &self,
        source: &str,
        dialect: shared::venue::Dialect,
        market: shared::protocol::Market,
    ) {
        let dir = self.dir.join(source);
        let body = serde_json::json!({
            "format": "millrace-recording",
            "version": 1,
            "source": source,
            "dialect": dialect.as_str(),
            "market": market.as_str(),
        });
        let written = std::fs::create_dir_all(&dir)
            .and_then(|()| std::fs::write(dir.join("source.json"), format!("{body}\n")));
        if let Err(e) = written {
            self.stats.write_errors.fetch_add(1, Relaxed);
            let e = format!("{}: {e}", dir.display());
            tracing::warn!("recording: {e}");
            *crate::lock::lock(&self.last_error) = Some(e);
        }
    }

    /// The tap of `source`, if it is recorded.
    pub fn tap(&self, source: &str) -> Option<Tap> {
        self.taps.get(source).cloned()
    }

    pub fn report(&self) -> RecordingReport {
        let s = &self.stats;
        let mut sources: Vec<String> = self.taps.keys().cloned().collect();
        sources.sort();
        RecordingReport {
            enabled: !self.taps.is_empty(),
            dir: self.dir.display().to_string(),
            sources,
            queued: s.queued.load(Relaxed),
            recorded: s.recorded.load(Relaxed),
            dropped_queue_full: s.dropped_queue_full.load(Relaxed),
            dropped_write_failed: s.dropped_write_failed.load(Relaxed),
            write_errors: s.write_errors.load(Relaxed),
            bytes_written: s.bytes_written.load(Relaxed),
            files_deleted: s.files_deleted.load(Relaxed),
            last_error: crate::lock::lock(&self.last_error).clone(),
            playback: Vec::new(),
        }
    }
}

/// The writer thread's state.
struct Writer {
    dir: std::path::PathBuf,
    budget: u64,
    retention_ms: i64,
    recorders: HashMap<Arc<str>, Recorder>,
    /// Records and bytes written by recorders retired after a failed write.
    retired: (u64, u64),
    stats: Arc<RecordingStats>,
    last_error: Arc<std::sync::Mutex<Option<String>>>,
}

impl Writer {
    fn run(mut self, rx: mpsc::Receiver<Item>, token: tokio_util::sync::CancellationToken) {
        let mut flushed = Instant::now();
        let mut cleaned = Instant::now() - CLEANUP_EVERY;
        loop {
            match rx.recv_timeout(FLUSH_EVERY) {
                Ok(item) => self.append(item),
                Err(mpsc::RecvTimeoutError::Timeout) => {}
                Err(mpsc::RecvTimeoutError::Disconnected) => break,
            }
            if flushed.elapsed() >= FLUSH_EVERY {
                self.flush_all();
                flushed = Instant::now();
            }
            if cleaned.elapsed() >= CLEANUP_EVERY {
                self.cleanup();
                cleaned = Instant::now();
            }
            if token.is_cancelled() {
                // what is queued still goes to disk
                while let Ok(item) = rx.try_recv() {
                    self.append(item);
                }
                break;
            }
        }
        self.flush_all();
    }

    fn append(&mut self, item: Item) {
        let r = Record {
            kind: item.kind,
            time_ns: item.time_ns,
            conn: item.conn,
            meta: &item.meta,
            body: &item.body,
        };
        if !self.recorders.contains_key(&item.source) {
            match Recorder::new(&self.dir, &item.source) {
                Ok(rec) => {
                    self.recorders.insert(item.source.clone(), rec);
                }
                Err(e) => return self.failed(&e.to_string(), 1),
            }
        }
        let rec = self.recorders.get_mut(&item.source).expect("inserted");
        let pending = rec.pending();
        if let Err(e) = rec.append(&r) {
            // the record, and the block a failed write took with it
            let lost = pending + 1 - rec.pending().min(pending);
            self.retire(&item.source);
            self.failed(&e.to_string(), lost);
        }
        // (the counters are brought up to date with each flush, not per frame)
    }

    fn flush_all(&mut self) {
        let sources: Vec<Arc<str>> = self.recorders.keys().cloned().collect();
        for s in sources {
            let Some(rec) = self.recorders.get_mut(&s) else { continue };
            let pending = rec.pending();
            if let Err(e) = rec.flush() {
                self.retire(&s);
                self.failed(&e.to_string(), pending);
            }
        }
        self.count();
    }

    /// Drops `source`'s recorder after a failed write (the next frame opens the file again),
    /// keeping what it wrote in the counts.
    fn retire(&mut self, source: &Arc<str>) {
        if let Some(mut rec) = self.recorders.remove(source) {
            self.retired.0 += rec.records_written();
            self.retired.1 += rec.written();
            rec.discard(); // its block is lost: nothing is written on drop
        }
    }

    /// The written records and bytes, as the counters show them.
    fn count(&self) {
        let (records, bytes) = self
            .recorders
            .values()
            .fold(self.retired, |(r, b), rec| (r + rec.records_written(), b + rec.written()));
        self.stats.recorded.store(records, Relaxed);
        self.stats.bytes_written.store(bytes, Relaxed);
    }

    fn failed(&mut self, error: &str, lost: u64) {
        self.stats.write_errors.fetch_add(1, Relaxed);
        self.stats.dropped_write_failed.fetch_add(lost, Relaxed);
        let mut last = crate::lock::lock(&self.last_error);
        if last.as_deref() != Some(error) {
            tracing::warn!("recording: a write failed, its frames are dropped from the recording (live data is not): {error}");
        }
        *last = Some(error.to_string());
    }

    /// Deletes the files past the retention, then the oldest until the budget fits.
    fn cleanup(&mut self) {
        let files = match recording::list_files(&self.dir) {
            Ok(f) => f,
            Err(e) => {
                self.failed(&e.to_string(), 0);
                return;
            }
        };
        let keep: Vec<std::path::PathBuf> = self
            .recorders
            .values()
            .filter_map(|r| r.current_file().map(std::path::Path::to_path_buf))
            .collect();
        for path in
            recording::plan_cleanup(&files, self.budget, self.retention_ms, wall_clock_ms(), &keep)
        {
            match std::fs::remove_file(&path) {
                Ok(()) => self.stats.files_deleted.fetch_add(1, Relaxed),
                Err(e) => {
                    self.failed(&format!("{}: {e}", path.display()), 0);
                    continue;
                }
            };
        }
    }
}

/// One connection's recording: `Connected` when opened, `Closed` when dropped, its frames in
/// between; a no-op for a source that is not recorded.
pub struct Conn {
    tap: Option<Tap>,
    id: u64,
}

impl Conn {
    /// A connection to `url` opened now.
    pub fn open(tap: Option<Tap>, url: &str) -> Conn {
        let id = next_conn();
        if let Some(t) = &tap {
            t.record(Kind::Connected, id, shown_url(url), Bytes::new());
        }
        Conn { tap, id }
    }

    pub fn received(&self, text: &str) {
        if let Some(t) = &self.tap {
            t.received(self.id, text);
        }
    }

    pub fn sent(&self, text: &str) {
        if let Some(t) = &self.tap {
            t.sent(self.id, text);
        }
    }
}

/// `url` as a recording keeps it: redacted, except a Binance combined stream's path, which
/// millrace builds (`/stream?streams=btcusdt@depth@100ms`): its `@`s would make the whole URL
/// unreadable to the redactor (an `@` after the authority may be a password's), and the player
/// matches a Binance connection by it.
fn shown_url(url: &str) -> String {
    match url.rfind("/stream?streams=") {
        Some(i) => format!("{}{}", crate::redact::redact(&url[..i]), &url[i..]),
        None => crate::redact::redact(url),
    }
}

impl binance::stream::FrameObserver for Conn {
    fn received(&self, text: &str) {
        Conn::received(self, text);
    }

    fn sent(&self, text: &str) {
        Conn::sent(self, text);
    }
}

/// Records `conn`'s text frames from now on into `tap`, if the source is recorded: a
/// `connected` record with its URL now, one per frame, `closed` when it is dropped.
pub fn observe(tap: Option<Tap>, conn: &mut binance::stream::Connection) {
    if tap.is_some() {
        let url = conn.url().to_string();
        conn.observe(Box::new(Conn::open(tap, &url)));
    }
}

impl Drop for Conn {
    fn drop(&mut self) {
        if let Some(t) = &self.tap {
            t.record(Kind::Closed, self.id, "", Bytes::new());
        }
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn a_binance_stream_url_keeps_its_path_and_loses_its_secrets() {
        assert_eq!(
            super::shown_url("wss://stream.binance.com:9443/stream?streams=btcusdt@depth@100ms"),
            "wss://stream.binance.com:9443/stream?streams=btcusdt@depth@100ms"
        );
        let shown = super::shown_url("ws://user:secret@127.0.0.1:9/stream?streams=a@trade");
        assert!(!shown.contains("secret") && shown.ends_with("/stream?streams=a@trade"), "{shown}");
        assert!(!super::shown_url("wss://h/ws?token=abc").contains("abc"));
    }
}
