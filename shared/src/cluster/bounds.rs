//! What a message read from the cluster's bus must fit before anything acts on it.
//!
//! Every process of a cluster reads messages that other processes published on NATS; the bus is
//! a trust boundary like the HTTP edge. A message is checked here, sans-IO, against bounds the
//! shell passes in (the exchange's clock as a [`TimeWindow`], the sizes below); what does not
//! fit is [`Poison`]: the shell terminates it (never redelivered), counts it by kind and logs
//! the first of each kind. Nothing a message says may make a reader allocate or walk more than
//! the message itself holds, or move a high-water mark past what the exchange can have sent.

use super::{Demand, Instructions, WorkerStatus};

/// Most workers a supervisor keeps track of: a status from one more is refused.
pub const MAX_WORKERS: usize = 4_096;
/// Most gateways a supervisor keeps the demand of: a demand from one more is refused.
pub const MAX_GATEWAYS: usize = 1_024;
/// The largest load a worker may declare (`--max-load`).
pub const MAX_LOAD: u32 = 100_000;
/// Most tasks one gateway's demand may name.
pub const MAX_DEMAND_TASKS: usize = 100_000;
/// How far the sequence number of a worker's instruction sets may jump within one epoch (sets
/// lost on the way); a set beyond it would make the worker ignore the leader's next ones.
pub const MAX_SEQ_JUMP: u64 = 10_000;

/// A worker's, gateway's or supervisor's id: 1 to 64 letters, digits, `_` or `-` (a subject
/// token).
pub fn valid_id(id: &str) -> bool {
    !id.is_empty()
        && id.len() <= 64
        && id.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-')
}

impl WorkerStatus {
    /// A status's own bounds: a valid id, a load within [`MAX_LOAD`], no more tasks (or ages)
    /// than its load.
    pub fn check(&self) -> Result<(), Poison> {
        let load = self.max_load as usize;
        let ages = self.ages.as_ref().map_or(0, Vec::len);
        if !valid_id(&self.worker)
            || self.max_load > MAX_LOAD
            || self.tasks.len() > load
            || ages > load
            || self.refused.len() > Poison::ALL.len()
        {
            return Err(Poison::Status);
        }
        Ok(())
    }
}

impl Demand {
    /// A demand's own bounds: a valid gateway id, at most [`MAX_DEMAND_TASKS`] tasks.
    pub fn check(&self) -> Result<(), Poison> {
        if !valid_id(&self.gateway) || self.tasks.len() > MAX_DEMAND_TASKS {
            return Err(Poison::Demand);
        }
        Ok(())
    }
}

impl Instructions {
    /// Whether worker `worker`, which applied `applied` (epoch, seq) and holds at most
    /// `max_load` sessions, can take this set from the bus: addressed to it, no more tasks
    /// to add than its load, and within the same epoch no jump of the sequence beyond
    /// [`MAX_SEQ_JUMP`]. (A newer epoch is checked by the shell against the leader lease.)
    pub fn check(&self, worker: &str, applied: (u64, u64), max_load: u32) -> Result<(), Poison> {
        let (epoch, seq) = applied;
        if self.worker != worker
            || self.add.len() > max_load as usize
            || self.end.len() > MAX_DEMAND_TASKS
            || (self.epoch == epoch && self.seq > seq.saturating_add(MAX_SEQ_JUMP))
        {
            return Err(Poison::Instructions);
        }
        Ok(())
    }
}

/// The times a message may carry: `[earliest_ms, latest_ms]`, both included. The shell makes it
/// from the exchange's clock (`now − retention`, `now + tolerance`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TimeWindow {
    pub earliest_ms: i64,
    pub latest_ms: i64,
}

impl TimeWindow {
    /// `[now_ms − past_ms, now_ms + future_ms]`, saturating.
    pub fn around(now_ms: i64, past_ms: i64, future_ms: i64) -> TimeWindow {
        TimeWindow {
            earliest_ms: now_ms.saturating_sub(past_ms.max(0)),
            latest_ms: now_ms.saturating_add(future_ms.max(0)),
        }
    }

    pub fn contains(&self, t_ms: i64) -> bool {
        (self.earliest_ms..=self.latest_ms).contains(&t_ms)
    }

    /// Where `t_ms` lies: inside, before or after the window.
    pub fn place(&self, t_ms: i64) -> Result<(), Poison> {
        if t_ms < self.earliest_ms {
            Err(Poison::TooOld)
        } else if t_ms > self.latest_ms {
            Err(Poison::TooNew)
        } else {
            Ok(())
        }
    }
}

/// Why a message read from the bus was refused. The kinds are closed: each is a label of the
/// `millrace_bus_poison_total{kind}` counter.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Poison {
    /// Not valid JSON (or binary framing) of the subject's type.
    Unparsable,
    /// Closed candles that are not of a 1m series.
    NotOneMinute,
    /// A series, instrument or task that the cluster does not run and could not run: its source
    /// is not configured or does not list it.
    ForeignSeries,
    /// More items than the message type may carry.
    TooMany,
    /// Closed candles that are not strictly ascending within one aligned block of
    /// [`CANDLES_PER_MESSAGE`] minutes, as every worker cuts them.
    NotOneBlock,
    /// A candle that is not a consistent closed minute (on a minute boundary, `minutes = 1`,
    /// high ≥ open, close ≥ low, counts in range).
    NotClosedMinute,
    /// A time before the window: older than the cluster keeps through the bus.
    TooOld,
    /// A time after the window: later than the exchange's clock (plus its tolerance).
    TooNew,
    /// A depth diff whose headers name other ids than its body.
    DiffHeaders,
    /// A depth diff whose ids are impossible (`u` before `U`) or jump out of the book's id
    /// window.
    DiffIds,
    /// An instruction set that no leader of the cluster can have sent (its epoch is beyond the
    /// leader lease's revision, or its sequence jumps).
    Instructions,
    /// A worker status that breaks its own bounds (more tasks than its declared load, a load
    /// beyond any worker's, a malformed id).
    Status,
    /// A gateway demand beyond the bounds (too many tasks, a malformed gateway id).
    Demand,
    /// An admin request to the tick-by-tick host without valid proof (the admin token's
    /// signature, fresh and not seen before).
    Unsigned,
    /// A snapshot answer larger than a book can be, or that does not fit the request.
    Snapshot,
    /// A message its sender's role does not send: a closed candle pushed by a worker (only the
    /// persister, after storing it, pushes closed candles).
    Sender,
}

impl Poison {
    pub const ALL: [Poison; 16] = [
        Poison::Unparsable,
        Poison::NotOneMinute,
        Poison::ForeignSeries,
        Poison::TooMany,
        Poison::NotOneBlock,
        Poison::NotClosedMinute,
        Poison::TooOld,
        Poison::TooNew,
        Poison::DiffHeaders,
        Poison::DiffIds,
        Poison::Instructions,
        Poison::Status,
        Poison::Demand,
        Poison::Unsigned,
        Poison::Snapshot,
        Poison::Sender,
    ];

    /// The metric label.
    pub const fn as_str(self) -> &'static str {
        match self {
            Poison::Unparsable => "unparsable",
            Poison::NotOneMinute => "not_one_minute",
            Poison::ForeignSeries => "foreign_series",
            Poison::TooMany => "too_many",
            Poison::NotOneBlock => "not_one_block",
            Poison::NotClosedMinute => "not_closed_minute",
            Poison::TooOld => "too_old",
            Poison::TooNew => "too_new",
            Poison::DiffHeaders => "diff_headers",
            Poison::DiffIds => "diff_ids",
            Poison::Instructions => "instructions",
            Poison::Status => "status",
            Poison::Demand => "demand",
            Poison::Unsigned => "unsigned",
            Poison::Snapshot => "snapshot",
            Poison::Sender => "sender",
        }
    }

    /// Where it is in [`Poison::ALL`] (for counters kept in an array).
    pub const fn index(self) -> usize {
        self as usize
    }
}

impl std::fmt::Display for Poison {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// The id window of a book's diffs (see [`super::payload::DiffReorder`]): how far past the last
/// passed `u` a diff may continue from, and how many ids one diff may cover. Binance's busiest
/// books advance by some thousands of ids in a 100 ms diff; these bounds leave room for minutes
/// of that, while an id at `u64::MAX` (or any id an exchange cannot have reached yet) is
/// refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct IdWindow {
    /// A diff must continue from at most this far past the last passed `u` (`prev ≤ last +
    /// ahead`).
    pub ahead: u64,
    /// One diff covers at most this many ids (`u − prev`).
    pub span: u64,
    /// A diff this far or further below the last passed `u` cannot be a late copy: the last
    /// `u` itself came from a diff outside the book's ids, and the position is taken anew
    /// from this one.
    pub below: u64,
}

impl Default for IdWindow {
    fn default() -> Self {
        IdWindow { ahead: 10_000_000, span: 10_000_000, below: 10_000_000 }
    }
}

#[cfg(test)]
mod tests {
    #[cfg(target_arch = "wasm32")]
    use wasm_bindgen_test::wasm_bindgen_test as test;

    use super::*;

    const NOW: i64 = 1_700_000_040_000;

    #[test]
    fn the_window_is_the_exchange_clock_with_its_margins() {
        let w = TimeWindow::around(NOW, 3_600_000, 120_000);
        assert!(w.contains(NOW) && w.contains(NOW - 3_600_000) && w.contains(NOW + 120_000));
        assert_eq!(w.place(NOW - 3_600_001), Err(Poison::TooOld));
        assert_eq!(w.place(NOW + 120_001), Err(Poison::TooNew));
        let wide = TimeWindow::around(i64::MAX - 5, i64::MAX, i64::MAX);
        assert!(wide.contains(i64::MAX) && wide.contains(0));
    }

    #[test]
    fn control_messages_are_held_to_their_bounds() {
        use crate::cluster::{TaskId, TaskKind, TaskReport};
        let task =
            |i: usize| TaskId::new(TaskKind::Kline, format!("sim:spot:S{i}/USDT").parse().unwrap());
        let status = |worker: &str, max_load: u32, tasks: usize| WorkerStatus {
            worker: worker.into(),
            instance: 1,
            max_load,
            epoch: 0,
            applied_seq: 0,
            leaving: false,
            list: 0,
            tasks: (0..tasks).map(|i| TaskReport { task: task(i), data_age_ms: None }).collect(),
            ages: None,
            refused: Default::default(),
        };
        assert_eq!(status("worker-1", 20, 20).check(), Ok(()));
        assert_eq!(status("worker-1", 20, 21).check(), Err(Poison::Status));
        assert_eq!(status("worker.1", 20, 0).check(), Err(Poison::Status));
        assert_eq!(status("", 20, 0).check(), Err(Poison::Status));
        assert_eq!(status("w", MAX_LOAD + 1, 0).check(), Err(Poison::Status));
        let demand = |gateway: &str, n: usize| Demand {
            gateway: gateway.into(),
            tasks: (0..n).map(task).collect(),
        };
        assert_eq!(demand("gateway-a", 3).check(), Ok(()));
        assert_eq!(demand("gateway a", 3).check(), Err(Poison::Demand));
        assert_eq!(demand(&"g".repeat(65), 0).check(), Err(Poison::Demand));
        let set = |worker: &str, epoch: u64, seq: u64, add: usize| Instructions {
            worker: worker.into(),
            epoch,
            seq,
            reset: false,
            end: vec![],
            add: (0..add).map(task).collect(),
        };
        assert_eq!(set("w1", 7, 3, 2).check("w1", (7, 2), 10), Ok(()));
        assert_eq!(set("w2", 7, 3, 2).check("w1", (7, 2), 10), Err(Poison::Instructions));
        assert_eq!(set("w1", 7, 3, 11).check("w1", (7, 2), 10), Err(Poison::Instructions));
        let jump = set("w1", 7, 2 + MAX_SEQ_JUMP + 1, 0);
        assert_eq!(jump.check("w1", (7, 2), 10), Err(Poison::Instructions));
        assert_eq!(set("w1", 8, 1, 0).check("w1", (7, 2), 10), Ok(()), "a new epoch");
        assert_eq!(set("w1", u64::MAX, u64::MAX, 0).check("w1", (7, 2), 10), Ok(()), "the shell's");
    }

    #[test]
    fn every_kind_has_a_distinct_label() {
        let labels: std::collections::BTreeSet<&str> =
            Poison::ALL.iter().map(|p| p.as_str()).collect();
        assert_eq!(labels.len(), Poison::ALL.len());
        for (i, p) in Poison::ALL.iter().enumerate() {
            assert_eq!(p.index(), i);
        }
    }
}
