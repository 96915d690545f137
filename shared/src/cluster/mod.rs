//! The cluster of seeds/supervisor-worker-load-balancing.md (seed 004), sans-IO.
//!
//! Workers hold long-lived upstream sessions ("tasks": one instrument's feed of one kind); a
//! supervisor assigns them by spare capacity, detects silent workers and silent tasks with one
//! low-precision timer, warms up before assigning, re-queries the task list periodically and
//! re-assigns what was orphaned. Every message between them is one-way: a worker publishes its
//! [`WorkerStatus`] every `status_interval`, the supervisor publishes [`Instructions`], gateways
//! publish their on-demand [`Demand`]. The server carries them over NATS; this module only
//! decides.
//!
//! - [`assign::Assigner`] is the supervisor's state machine: inputs `handle_*` and `tick`,
//!   outputs `poll_output`, time as an argument (ms).
//! - [`worker::WorkerTasks`] is the worker's side: which sessions an instruction set starts and
//!   stops.
//! - [`timer::LowResTimer`] is the one low-precision timer every timeout and poll goes through.
//! - [`payload`]: what the data plane carries between processes, with natural ids and de-dup.
//! - [`bounds`]: what a message read from the bus must fit (times, sizes, ids), and the kinds of
//!   [`bounds::Poison`] a reader refuses.

pub mod assign;
pub mod bounds;
pub mod payload;
pub mod timer;
pub mod worker;

#[cfg(test)]
mod simulated;

use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Serialize};

use crate::protocol::{InstrumentId, NameError};

/// What kind of upstream session a task is: `kline` (the 1m stream with the REST gap fill of
/// the kline job) or `depth` (the diff-depth stream with `BookSync`, the depth job).
pub use crate::protocol::ops::JobKind as TaskKind;

/// A malformed task id.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum TaskIdError {
    #[error("task kind {0:?} must be kline or depth")]
    Kind(String),
    #[error(
        "task id {0:?} must look like kind:exchange:market:SYMBOL (e.g. kline:sim:spot:BTC/USDT)"
    )]
    Shape(String),
    #[error(transparent)]
    Instrument(#[from] NameError),
}

/// One task: `kline:{instrument}` or `depth:{instrument}`. Ordered by kind, then instrument.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct TaskId {
    pub kind: TaskKind,
    pub instrument: InstrumentId,
}

impl TaskId {
    pub fn new(kind: TaskKind, instrument: InstrumentId) -> Self {
        TaskId { kind, instrument }
    }
}

impl fmt::Display for TaskId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}:{}", self.kind.as_str(), self.instrument)
    }
}

impl FromStr for TaskId {
    type Err = TaskIdError;
    fn from_str(s: &str) -> Result<Self, TaskIdError> {
        let (kind, instrument) =
            s.split_once(':').ok_or_else(|| TaskIdError::Shape(s.to_string()))?;
        Ok(TaskId {
            kind: kind.parse().map_err(|()| TaskIdError::Kind(kind.to_string()))?,
            instrument: instrument.parse()?,
        })
    }
}

impl Serialize for TaskId {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(self)
    }
}

impl<'de> Deserialize<'de> for TaskId {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let s = <std::borrow::Cow<'de, str>>::deserialize(d)?;
        s.parse().map_err(serde::de::Error::custom)
    }
}

/// One task a worker runs, as its status reports it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TaskReport {
    pub task: TaskId,
    /// Milliseconds since the session last received data from upstream, measured by the worker
    /// (an age, not a timestamp, so hosts need not agree on the time); `None` = nothing yet.
    pub data_age_ms: Option<u64>,
}

/// A worker's status, published every `status_interval_ms` and at once when it changes. It is
/// the only way the supervisor learns that a worker exists and is alive.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct WorkerStatus {
    pub worker: String,
    /// Random per process start: a worker restarted under the same id has lost its sessions.
    pub instance: u64,
    /// The most sessions this worker will hold (declared by the worker, `--max-load`).
    pub max_load: u32,
    /// The leader epoch and sequence number of the last instruction set applied (0, 0 = none).
    pub epoch: u64,
    pub applied_seq: u64,
    /// The worker is draining (SIGTERM): reassign its tasks now.
    pub leaving: bool,
    /// The version of the worker's task list (it changes whenever an instruction set changes
    /// the list); 0 from a worker that does not say.
    #[serde(default)]
    pub list: u64,
    /// Every session it holds — or, in a short status (`ages` given), nothing.
    pub tasks: Vec<TaskReport>,
    /// A short status: the data ages of the tasks of list version `list`, in its order (task
    /// id order), instead of the tasks themselves. A worker sends its full list whenever the
    /// list changed and every so often; at steady state the supervisor then reads numbers, not
    /// task ids. A supervisor that does not know that version takes it as a sign of life only.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ages: Option<Vec<Option<u64>>>,
    /// Messages this worker refused from the bus, by kind ([`bounds::Poison`]'s labels): the
    /// leader's report shows them (a worker serves no `/metrics`).
    #[serde(default, skip_serializing_if = "std::collections::BTreeMap::is_empty")]
    pub refused: std::collections::BTreeMap<String, u64>,
}

/// One instruction set for one worker (the seed's 指令集): applied as "pre-reset", then "end
/// task", then "add task". With `reset`, `add` is the worker's whole wanted set: the worker stops
/// what is not in it and starts what it lacks, keeping unchanged sessions (no reconnect storm
/// after a supervisor restart). A task in both `end` and `add` is restarted (it went silent and
/// no other worker could take it).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Instructions {
    pub worker: String,
    /// The issuing leader's epoch; a worker ignores sets from an older epoch.
    pub epoch: u64,
    /// Per worker and epoch, from 1; a worker ignores a set it already applied.
    pub seq: u64,
    pub reset: bool,
    pub end: Vec<TaskId>,
    pub add: Vec<TaskId>,
}

/// A gateway's on-demand tasks (what its browser sessions hold, with seed 000's refcount and
/// idle TTL applied at the gateway), the whole set each time; published when it changes and
/// every `status_interval_ms`. A gateway silent for `worker_timeout_ms` has no demand.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Demand {
    pub gateway: String,
    pub tasks: Vec<TaskId>,
}

#[cfg(test)]
mod tests {
    #[cfg(target_arch = "wasm32")]
    use wasm_bindgen_test::wasm_bindgen_test as test;

    use super::*;

    #[test]
    fn task_ids_round_trip_as_strings() {
        let t: TaskId = "depth:sim:spot:BTC/USDT".parse().unwrap();
        assert_eq!(t.kind, TaskKind::Depth);
        assert_eq!(t.instrument.to_string(), "sim:spot:BTC/USDT");
        assert_eq!(t.to_string(), "depth:sim:spot:BTC/USDT");
        let json = serde_json::to_string(&t).unwrap();
        assert_eq!(json, "\"depth:sim:spot:BTC/USDT\"");
        assert_eq!(serde_json::from_str::<TaskId>(&json).unwrap(), t);
        assert!(matches!("trade:sim:spot:BTC/USDT".parse::<TaskId>(), Err(TaskIdError::Kind(_))));
        assert!(matches!("kline".parse::<TaskId>(), Err(TaskIdError::Shape(_))));
        assert!(matches!("kline:sim:spot".parse::<TaskId>(), Err(TaskIdError::Instrument(_))));
        assert!(serde_json::from_str::<TaskId>("\"kline:x\"").is_err());
    }
}
