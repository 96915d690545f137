//! Fault injection: the simulated exchange misbehaving on purpose, scripted from tests through
//! [`Faults`] (an `Arc<Faults>` from `SimHandle::faults`) or over HTTP (`POST /sim/faults` with
//! a [`FaultCommand`] or a list of them; `GET /sim/faults` shows the plan and the counters).
//!
//! | command (`"action"`)   | effect |
//! |------------------------|--------|
//! | `drop`                 | closes every WebSocket connection now (TCP close, no close frame), or only those subscribed to a stream of `symbol` |
//! | `skip`                 | the next `count` messages of the matching streams are not sent |
//! | `duplicate`            | the next `count` messages are sent twice |
//! | `reorder`              | the next `count` messages are each held back and sent after the following message of the same stream (adjacent swap) |
//! | `malformed`            | the next `count` messages are replaced by broken text: alternately invalid JSON and the real frame cut in half |
//! | `corrupt`              | the next `count` depth diffs carry one wrong level (update ids intact): a phantom level one price unit (10^-8) beyond the deepest changed bid (or ask), which the exchange never has, so the receiver's book silently diverges until it checks against a snapshot |
//! | `reset`                | the other venues' book streams: the next `count` messages are the venue's own reset (OKX `seqId` below `prevSeqId`, Bybit `u = 1` carrying the whole book, a fresh snapshot on Coinbase and Kraken) |
//! | `stall`                | the matching streams send nothing for `ms` milliseconds (messages are dropped; the connection stays open and keeps answering pings) |
//! | `rest_fail`            | the next `count` REST calls (optionally only those whose path starts with `path`) fail with `status`; 429 and 418 carry `Retry-After: retry_after` seconds (default 1) |
//! | `max_connection_age`   | WebSocket connections are closed (close frame) once they are `ms` old; `null` restores the configured age |
//! | `clear`                | forgets every pending fault and restores the configured maximum age |
//!
//! Message faults select streams with a [`StreamTarget`]: an exact stream name
//! (`"stream":"btcusdt@depth@100ms"`), a class (`"kind":"depth"`: `kline`, `depth`,
//! `partial_depth`, `trade`, `agg_trade`, `book_ticker`), a symbol (`"symbol":"BTCUSDT"`), any
//! combination (all given must match), or nothing for every stream. They apply to the stream as
//! a whole, so every subscriber of it sees the same fault. Every injected fault is counted in
//! [`FaultCounters`].

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::Relaxed};
use std::sync::{Mutex, OnceLock};
use std::time::Duration;

use serde::{Deserialize, Serialize};
use tokio::sync::watch;
use tokio::time::Instant;

/// A class of streams.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum StreamClass {
    /// `<sym>@kline_<interval>`.
    Kline,
    /// `<sym>@depth[@<ms>ms]` (diffs).
    Depth,
    /// `<sym>@depth<levels>[@<ms>ms]`.
    PartialDepth,
    /// `<sym>@trade`.
    Trade,
    /// `<sym>@aggTrade`.
    AggTrade,
    /// `<sym>@bookTicker`.
    BookTicker,
}

/// Which streams a message fault applies to: every given field must match; none given matches
/// every stream.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct StreamTarget {
    /// An exact stream name, as subscribed (`btcusdt@depth@100ms`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stream: Option<String>,
    /// A class of streams.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub kind: Option<StreamClass>,
    /// A Binance symbol (any case).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub symbol: Option<String>,
}

impl StreamTarget {
    /// Every stream.
    pub fn all() -> Self {
        Self::default()
    }

    /// The stream named `name` (`btcusdt@kline_1m`).
    pub fn stream(name: &str) -> Self {
        StreamTarget { stream: Some(name.to_string()), ..Self::default() }
    }

    /// Every stream of a class.
    pub fn kind(kind: StreamClass) -> Self {
        StreamTarget { kind: Some(kind), ..Self::default() }
    }

    /// Narrowed to one symbol.
    pub fn for_symbol(mut self, symbol: &str) -> Self {
        self.symbol = Some(symbol.to_string());
        self
    }

    fn matches(&self, name: &str, class: StreamClass, symbol: &str) -> bool {
        self.stream.as_deref().is_none_or(|s| s == name)
            && self.kind.is_none_or(|k| k == class)
            && self.symbol.as_deref().is_none_or(|s| s.eq_ignore_ascii_case(symbol))
    }
}

/// What happens to the next messages of a stream.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum MessageFault {
    Skip,
    Duplicate,
    Reorder,
    Malformed,
    /// Depth diffs only (other messages pass unchanged): see the module docs.
    Corrupt,
    /// The other venues' book streams only: the venue's own reset (OKX `seqId` going down,
    /// Bybit `u = 1` with the whole book, a fresh snapshot on Coinbase and Kraken).
    Reset,
}

/// One scripted fault; the JSON form of `POST /sim/faults` (see the module docs).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "action", rename_all = "snake_case")]
pub enum FaultCommand {
    Drop {
        #[serde(default)]
        symbol: Option<String>,
    },
    Skip {
        #[serde(flatten)]
        target: StreamTarget,
        count: u32,
    },
    Duplicate {
        #[serde(flatten)]
        target: StreamTarget,
        count: u32,
    },
    Reorder {
        #[serde(flatten)]
        target: StreamTarget,
        count: u32,
    },
    Malformed {
        #[serde(flatten)]
        target: StreamTarget,
        count: u32,
    },
    Corrupt {
        #[serde(flatten)]
        target: StreamTarget,
        count: u32,
    },
    Reset {
        #[serde(flatten)]
        target: StreamTarget,
        count: u32,
    },
    Stall {
        #[serde(flatten)]
        target: StreamTarget,
        ms: u64,
    },
    RestFail {
        count: u32,
        status: u16,
        #[serde(default)]
        path: Option<String>,
        #[serde(default)]
        retry_after: Option<u64>,
    },
    MaxConnectionAge {
        ms: Option<u64>,
    },
    Clear,
}

/// A pending message fault.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct MessageRule {
    pub fault: MessageFault,
    #[serde(flatten)]
    pub target: StreamTarget,
    pub remaining: u32,
}

/// An active stall.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct StallRule {
    #[serde(flatten)]
    pub target: StreamTarget,
    /// Real milliseconds left.
    pub remaining_ms: u64,
}

/// A pending REST failure.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct RestRule {
    pub status: u16,
    pub path: Option<String>,
    pub retry_after: Option<u64>,
    pub remaining: u32,
}

/// The pending faults, as `GET /sim/faults` shows them.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct FaultPlan {
    pub messages: Vec<MessageRule>,
    pub stalls: Vec<StallRule>,
    pub rest: Vec<RestRule>,
    /// The maximum WebSocket connection age in force, ms (`None`: unlimited).
    pub max_connection_age_ms: Option<u64>,
}

/// How many faults were injected, and related events, since the start.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct FaultCounters {
    /// Messages not sent (`skip`).
    pub skipped: u64,
    /// Messages sent twice.
    pub duplicated: u64,
    /// Messages sent after their successor.
    pub reordered: u64,
    /// Broken frames sent in place of messages.
    pub malformed: u64,
    /// Depth diffs sent with a phantom level (`corrupt`).
    #[serde(default)]
    pub corrupted: u64,
    /// Book messages of the other venues sent as the venue's reset (`reset`).
    #[serde(default)]
    pub resets: u64,
    /// Messages withheld by a stall.
    pub stalled: u64,
    /// Connections closed by `drop`.
    pub connections_dropped: u64,
    /// Connections closed for reaching the maximum age.
    pub connections_aged_out: u64,
    /// Connections closed because their send queue was full (slow clients).
    pub laggards_disconnected: u64,
    /// Connections closed because they did not answer pings.
    pub ping_timeouts: u64,
    /// REST calls failed by `rest_fail`.
    pub rest_failed: u64,
    /// REST calls answered 429 by the rate limiter.
    pub rate_limited: u64,
    /// REST calls answered 418 (IP banned).
    pub banned: u64,
    /// Control requests (`POST /sim/faults`, `POST /tbt/control`) refused: no or a wrong token
    /// (401/403) or not JSON (415).
    #[serde(default)]
    pub control_refused: u64,
}

#[derive(Default)]
struct Counters {
    skipped: AtomicU64,
    duplicated: AtomicU64,
    reordered: AtomicU64,
    malformed: AtomicU64,
    corrupted: AtomicU64,
    resets: AtomicU64,
    stalled: AtomicU64,
    connections_dropped: AtomicU64,
    connections_aged_out: AtomicU64,
    laggards_disconnected: AtomicU64,
    ping_timeouts: AtomicU64,
    rest_failed: AtomicU64,
    rate_limited: AtomicU64,
    banned: AtomicU64,
    control_refused: AtomicU64,
}

/// Counters other parts of the simulator bump.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Count {
    Reordered,
    Corrupted,
    Reset,
    AgedOut,
    Laggard,
    PingTimeout,
    RateLimited,
    Banned,
    ControlRefused,
}

#[derive(Debug, Default)]
struct Plan {
    messages: Vec<MessageRule>,
    stalls: Vec<(StreamTarget, Instant)>,
    rest: Vec<RestRule>,
}

/// What to do with one stream message.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Decision {
    Send,
    Withhold,
    Fault(MessageFault),
}

/// The fault plan and counters of one simulator. Cheap to share (`Arc<Faults>`); every method
/// Closes every connection (`None`) or those of a symbol; returns how many.
pub(crate) type Dropper = Box<dyn Fn(Option<&str>) -> usize + Send + Sync>;

/// takes `&self`.
pub struct Faults {
    /// Fast path: false while no message or REST fault is pending, so publishing skips the lock.
    armed: AtomicBool,
    /// The pending faults; a lock because the driver, the REST handlers and the scripting
    /// callers all touch it, each briefly.
    plan: Mutex<Plan>,
    counters: Counters,
    /// The configured maximum connection age, restored by `clear`.
    default_max_age: Option<Duration>,
    /// The maximum connection age in force; sessions watch it.
    max_age: watch::Sender<Option<Duration>>,
    /// Closes connections for `drop` (set by the server; absent in unit tests).
    dropper: OnceLock<Dropper>,
    /// Alternates the two malformed shapes.
    malformed_flip: AtomicBool,
}

impl std::fmt::Debug for Faults {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Faults")
            .field("plan", &self.plan())
            .field("counters", &self.counters())
            .finish()
    }
}

impl Faults {
    /// An empty plan; WebSocket connections close at `max_connection_age` (`None`: never).
    pub fn new(max_connection_age: Option<Duration>) -> Faults {
        Faults {
            armed: AtomicBool::new(false),
            plan: Mutex::new(Plan::default()),
            counters: Counters::default(),
            default_max_age: max_connection_age,
            max_age: watch::Sender::new(max_connection_age),
            dropper: OnceLock::new(),
            malformed_flip: AtomicBool::new(false),
        }
    }

    pub(crate) fn attach_dropper(&self, dropper: Dropper) {
        let _ = self.dropper.set(dropper);
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Plan> {
        self.plan.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Carries out one command; returns how many connections a `drop` closed (0 otherwise).
    pub fn apply(&self, cmd: FaultCommand) -> usize {
        match cmd {
            FaultCommand::Drop { symbol } => return self.drop_connections(symbol.as_deref()),
            FaultCommand::Skip { target, count } => {
                self.message_fault(MessageFault::Skip, target, count)
            }
            FaultCommand::Duplicate { target, count } => {
                self.message_fault(MessageFault::Duplicate, target, count)
            }
            FaultCommand::Reorder { target, count } => {
                self.message_fault(MessageFault::Reorder, target, count)
            }
            FaultCommand::Malformed { target, count } => {
                self.message_fault(MessageFault::Malformed, target, count)
            }
            FaultCommand::Corrupt { target, count } => {
                self.message_fault(MessageFault::Corrupt, target, count)
            }
            FaultCommand::Reset { target, count } => {
                self.message_fault(MessageFault::Reset, target, count)
            }
            FaultCommand::Stall { target, ms } => self.stall(target, Duration::from_millis(ms)),
            FaultCommand::RestFail { count, status, path, retry_after } => {
                self.fail_rest(count, status, path.as_deref(), retry_after)
            }
            FaultCommand::MaxConnectionAge { ms } => {
                self.set_max_connection_age(ms.map(Duration::from_millis))
            }
            FaultCommand::Clear => self.clear(),
        }
        0
    }

    /// Closes every WebSocket connection now (TCP close without a close frame), or only those
    /// subscribed to a stream of `symbol`. Returns how many were closed.
    pub fn drop_connections(&self, symbol: Option<&str>) -> usize {
        let Some(drop) = self.dropper.get() else { return 0 };
        let n = drop(symbol);
        self.counters.connections_dropped.fetch_add(n as u64, Relaxed);
        n
    }

    /// The next `count` messages of the matching streams get `fault`.
    pub fn message_fault(&self, fault: MessageFault, target: StreamTarget, count: u32) {
        if count == 0 {
            return;
        }
        self.lock().messages.push(MessageRule { fault, target, remaining: count });
        self.armed.store(true, Relaxed);
    }

    /// Skips the next `count` messages of the matching streams.
    pub fn skip(&self, target: StreamTarget, count: u32) {
        self.message_fault(MessageFault::Skip, target, count)
    }

    /// Sends the next `count` messages of the matching streams twice.
    pub fn duplicate(&self, target: StreamTarget, count: u32) {
        self.message_fault(MessageFault::Duplicate, target, count)
    }

    /// Swaps each of the next `count` messages with its successor on the same stream.
    pub fn reorder(&self, target: StreamTarget, count: u32) {
        self.message_fault(MessageFault::Reorder, target, count)
    }

    /// Replaces the next `count` messages with broken frames (invalid JSON, truncated).
    pub fn malformed(&self, target: StreamTarget, count: u32) {
        self.message_fault(MessageFault::Malformed, target, count)
    }

    /// The next `count` depth diffs of the matching streams carry a phantom level (see the
    /// module docs); their update ids stay right, so only a check against a snapshot finds it.
    pub fn corrupt(&self, target: StreamTarget, count: u32) {
        self.message_fault(MessageFault::Corrupt, target, count)
    }

    /// The matching streams send nothing for `duration` (the connection stays open).
    pub fn stall(&self, target: StreamTarget, duration: Duration) {
        self.lock().stalls.push((target, Instant::now() + duration));
        self.armed.store(true, Relaxed);
    }

    /// Fails the next `count` REST calls (those whose path starts with `path`, when given) with
    /// `status`; 429 and 418 carry `Retry-After: retry_after` seconds (default 1).
    pub fn fail_rest(&self, count: u32, status: u16, path: Option<&str>, retry_after: Option<u64>) {
        if count == 0 {
            return;
        }
        let rule =
            RestRule { status, path: path.map(str::to_string), retry_after, remaining: count };
        self.lock().rest.push(rule);
        self.armed.store(true, Relaxed);
    }

    /// Sets the maximum WebSocket connection age (`None`: the configured one). Open
    /// connections older than it are closed at once.
    pub fn set_max_connection_age(&self, age: Option<Duration>) {
        self.max_age.send_replace(age.or(self.default_max_age));
    }

    /// Forgets every pending fault and restores the configured maximum connection age.
    pub fn clear(&self) {
        *self.lock() = Plan::default();
        self.armed.store(false, Relaxed);
        self.max_age.send_replace(self.default_max_age);
    }

    /// The pending faults.
    pub fn plan(&self) -> FaultPlan {
        let now = Instant::now();
        let p = self.lock();
        FaultPlan {
            messages: p.messages.clone(),
            stalls: p
                .stalls
                .iter()
                .filter(|(_, until)| *until > now)
                .map(|(t, until)| StallRule {
                    target: t.clone(),
                    remaining_ms: (*until - now).as_millis() as u64,
                })
                .collect(),
            rest: p.rest.clone(),
            max_connection_age_ms: self.max_age.borrow().map(|d| d.as_millis() as u64),
        }
    }

    /// The counters.
    pub fn counters(&self) -> FaultCounters {
        let c = &self.counters;
        FaultCounters {
            skipped: c.skipped.load(Relaxed),
            duplicated: c.duplicated.load(Relaxed),
            reordered: c.reordered.load(Relaxed),
            malformed: c.malformed.load(Relaxed),
            corrupted: c.corrupted.load(Relaxed),
            resets: c.resets.load(Relaxed),
            stalled: c.stalled.load(Relaxed),
            connections_dropped: c.connections_dropped.load(Relaxed),
            connections_aged_out: c.connections_aged_out.load(Relaxed),
            laggards_disconnected: c.laggards_disconnected.load(Relaxed),
            ping_timeouts: c.ping_timeouts.load(Relaxed),
            rest_failed: c.rest_failed.load(Relaxed),
            rate_limited: c.rate_limited.load(Relaxed),
            banned: c.banned.load(Relaxed),
            control_refused: c.control_refused.load(Relaxed),
        }
    }

    /// The maximum connection age in force, watched by sessions.
    pub(crate) fn max_age(&self) -> watch::Receiver<Option<Duration>> {
        self.max_age.subscribe()
    }

    pub(crate) fn count(&self, what: Count, n: u64) {
        let c = &self.counters;
        let counter = match what {
            Count::Reordered => &c.reordered,
            Count::Corrupted => &c.corrupted,
            Count::Reset => &c.resets,
            Count::AgedOut => &c.connections_aged_out,
            Count::Laggard => &c.laggards_disconnected,
            Count::PingTimeout => &c.ping_timeouts,
            Count::RateLimited => &c.rate_limited,
            Count::Banned => &c.banned,
            Count::ControlRefused => &c.control_refused,
        };
        counter.fetch_add(n, Relaxed);
    }

    /// The fate of the next message of stream `name`.
    pub(crate) fn decide(&self, name: &str, class: StreamClass, symbol: &str) -> Decision {
        if !self.armed.load(Relaxed) {
            return Decision::Send;
        }
        let now = Instant::now();
        let mut p = self.lock();
        p.stalls.retain(|(_, until)| *until > now);
        let decision = if p.stalls.iter().any(|(t, _)| t.matches(name, class, symbol)) {
            self.counters.stalled.fetch_add(1, Relaxed);
            Decision::Withhold
        } else if let Some(rule) =
            p.messages.iter_mut().find(|r| r.target.matches(name, class, symbol))
        {
            rule.remaining -= 1;
            let f = rule.fault;
            p.messages.retain(|r| r.remaining > 0);
            let c = &self.counters;
            match f {
                MessageFault::Skip => c.skipped.fetch_add(1, Relaxed),
                MessageFault::Duplicate => c.duplicated.fetch_add(1, Relaxed),
                MessageFault::Malformed => c.malformed.fetch_add(1, Relaxed),
                // counted when the swap happens / when a depth diff was actually altered
                MessageFault::Reorder | MessageFault::Corrupt | MessageFault::Reset => 0,
            };
            Decision::Fault(f)
        } else {
            Decision::Send
        };
        self.rearm(&p);
        decision
    }

    /// The failure for the next REST call to `path`, if one is pending: (status, Retry-After).
    pub(crate) fn rest_fault(&self, path: &str) -> Option<(u16, Option<u64>)> {
        if !self.armed.load(Relaxed) {
            return None;
        }
        let mut p = self.lock();
        let rule = p
            .rest
            .iter_mut()
            .find(|r| r.path.as_deref().is_none_or(|pre| path.starts_with(pre)))?;
        rule.remaining -= 1;
        let out = (rule.status, rule.retry_after);
        p.rest.retain(|r| r.remaining > 0);
        self.rearm(&p);
        self.counters.rest_failed.fetch_add(1, Relaxed);
        Some(out)
    }

    fn rearm(&self, p: &Plan) {
        self.armed
            .store(!(p.messages.is_empty() && p.stalls.is_empty() && p.rest.is_empty()), Relaxed);
    }

    /// A broken frame in place of `frame`: alternately invalid JSON and `frame` cut in half.
    pub(crate) fn malformed_text(&self, frame: &str) -> String {
        if self.malformed_flip.fetch_xor(true, Relaxed) {
            let mut cut = frame.len() / 2;
            while !frame.is_char_boundary(cut) {
                cut -= 1;
            }
            frame[..cut].to_string()
        } else {
            "{\"e\":\"depthUpdate\",\"E\":,oops".to_string()
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn message_faults_count_down_per_matching_stream() {
        let f = Faults::new(None);
        assert_eq!(f.decide("btcusdt@trade", StreamClass::Trade, "BTCUSDT"), Decision::Send);
        f.skip(StreamTarget::kind(StreamClass::Depth).for_symbol("btcusdt"), 2);
        f.duplicate(StreamTarget::stream("ethusdt@trade"), 1);
        let d = |n, c, s| f.decide(n, c, s);
        assert_eq!(d("ethusdt@depth", StreamClass::Depth, "ETHUSDT"), Decision::Send);
        assert_eq!(
            d("btcusdt@depth", StreamClass::Depth, "BTCUSDT"),
            Decision::Fault(MessageFault::Skip)
        );
        assert_eq!(
            d("ethusdt@trade", StreamClass::Trade, "ETHUSDT"),
            Decision::Fault(MessageFault::Duplicate)
        );
        assert_eq!(d("ethusdt@trade", StreamClass::Trade, "ETHUSDT"), Decision::Send);
        assert_eq!(
            d("btcusdt@depth@100ms", StreamClass::Depth, "BTCUSDT"),
            Decision::Fault(MessageFault::Skip)
        );
        assert_eq!(d("btcusdt@depth@100ms", StreamClass::Depth, "BTCUSDT"), Decision::Send);
        assert_eq!(f.counters().skipped, 2);
        assert_eq!(f.counters().duplicated, 1);
        assert!(f.plan().messages.is_empty());
    }

    #[test]
    fn stalls_rest_failures_and_clear() {
        let f = Faults::new(Some(Duration::from_secs(86_400)));
        f.stall(StreamTarget::all(), Duration::from_secs(60));
        assert_eq!(f.decide("x@trade", StreamClass::Trade, "X"), Decision::Withhold);
        f.fail_rest(1, 500, Some("/api/v3/depth"), None);
        assert_eq!(f.rest_fault("/api/v3/klines"), None);
        assert_eq!(f.rest_fault("/api/v3/depth"), Some((500, None)));
        assert_eq!(f.rest_fault("/api/v3/depth"), None);
        f.set_max_connection_age(Some(Duration::from_millis(5)));
        assert_eq!(f.plan().max_connection_age_ms, Some(5));
        f.clear();
        assert_eq!(f.decide("x@trade", StreamClass::Trade, "X"), Decision::Send);
        assert_eq!(f.plan().max_connection_age_ms, Some(86_400_000));
        let c = f.counters();
        assert_eq!((c.stalled, c.rest_failed), (1, 1));
    }

    #[test]
    fn commands_parse_from_json() {
        let cmds: Vec<FaultCommand> = serde_json::from_str(
            r#"[{"action":"skip","stream":"btcusdt@depth@100ms","count":3},
                {"action":"stall","kind":"kline","ms":500},
                {"action":"rest_fail","count":2,"status":429,"retry_after":1,"path":"/api/v3/depth"},
                {"action":"drop","symbol":"BTCUSDT"},{"action":"drop"},
                {"action":"max_connection_age","ms":200},{"action":"clear"}]"#,
        )
        .unwrap();
        assert_eq!(
            cmds[0],
            FaultCommand::Skip { target: StreamTarget::stream("btcusdt@depth@100ms"), count: 3 }
        );
        assert_eq!(
            cmds[1],
            FaultCommand::Stall { target: StreamTarget::kind(StreamClass::Kline), ms: 500 }
        );
        assert_eq!(cmds[4], FaultCommand::Drop { symbol: None });
        assert!(serde_json::from_str::<FaultCommand>(r#"{"action":"explode"}"#).is_err());
    }
}
