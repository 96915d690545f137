//! [`WorkerTasks`]: a worker's side of seed 004 — which sessions an instruction set stops and
//! starts. Instruction sets from an older leader epoch, and sets already applied, are ignored;
//! a set from a newer epoch is taken (a new leader). A "pre-reset" set names the whole wanted
//! set: sessions in it that already run are kept, so a supervisor's restart costs no reconnect.

use std::collections::BTreeSet;

use super::{Instructions, TaskId, TaskReport, WorkerStatus};

/// Who a worker's statuses are from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Identity {
    pub worker: String,
    /// Random per process start (see [`WorkerStatus::instance`]).
    pub instance: u64,
    pub max_load: u32,
}

/// What applying one instruction set changes: stop these sessions, then start these.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Change {
    pub stop: Vec<TaskId>,
    pub start: Vec<TaskId>,
}

/// The sessions a worker should hold, and the last instruction set applied.
#[derive(Debug, Clone, Default)]
pub struct WorkerTasks {
    epoch: u64,
    applied_seq: u64,
    wanted: BTreeSet<TaskId>,
    /// Bumped whenever `wanted` changes (the status's `list`).
    version: u64,
    /// The list version of the last full status, and short statuses sent since.
    last_full: Option<u64>,
    since_full: u32,
}

impl WorkerTasks {
    pub fn new() -> Self {
        Self::default()
    }

    /// The epoch and sequence number of the last set applied (reported in the status).
    pub fn applied(&self) -> (u64, u64) {
        (self.epoch, self.applied_seq)
    }

    /// The sessions to hold.
    pub fn wanted(&self) -> &BTreeSet<TaskId> {
        &self.wanted
    }

    /// Applies `set` ("pre-reset", then "end task", then "add task"); `None` if it is stale.
    pub fn apply(&mut self, set: &Instructions) -> Option<Change> {
        if set.epoch < self.epoch || (set.epoch == self.epoch && set.seq <= self.applied_seq) {
            return None;
        }
        self.epoch = set.epoch;
        self.applied_seq = set.seq;
        let mut change = Change::default();
        if set.reset {
            let new: BTreeSet<TaskId> = set.add.iter().cloned().collect();
            change.stop = self.wanted.difference(&new).cloned().collect();
            change.start = new.difference(&self.wanted).cloned().collect();
            self.wanted = new;
            self.bump(&change);
            return Some(change);
        }
        for t in &set.end {
            if self.wanted.remove(t) {
                change.stop.push(t.clone());
            }
        }
        for t in &set.add {
            if self.wanted.insert(t.clone()) {
                change.start.push(t.clone());
            }
        }
        self.bump(&change);
        Some(change)
    }

    fn bump(&mut self, change: &Change) {
        if !change.stop.is_empty() || !change.start.is_empty() {
            self.version += 1;
        }
    }

    /// The version of the wanted list (see [`WorkerStatus::list`]).
    pub fn version(&self) -> u64 {
        self.version
    }

    /// The status that says what this worker holds: every wanted task with its data age
    /// (`age`: ms since the session last had upstream data, `None` before any).
    pub fn status(
        &self,
        who: &Identity,
        leaving: bool,
        age: impl Fn(&TaskId) -> Option<u64>,
    ) -> WorkerStatus {
        WorkerStatus {
            worker: who.worker.clone(),
            instance: who.instance,
            max_load: who.max_load,
            epoch: self.epoch,
            applied_seq: self.applied_seq,
            leaving,
            list: self.version,
            tasks: self
                .wanted
                .iter()
                .map(|t| TaskReport { task: t.clone(), data_age_ms: age(t) })
                .collect(),
            ages: None,
            refused: Default::default(),
        }
    }

    /// The status to send now: the full list when it changed since the last full status, when
    /// `full` is asked (e.g. leaving) and after `short_max` short ones; else the short form.
    pub fn next_status(
        &mut self,
        who: &Identity,
        leaving: bool,
        age: impl Fn(&TaskId) -> Option<u64>,
        full: bool,
        short_max: u32,
    ) -> WorkerStatus {
        if full || self.last_full != Some(self.version) || self.since_full >= short_max {
            self.last_full = Some(self.version);
            self.since_full = 0;
            self.status(who, leaving, age)
        } else {
            self.since_full += 1;
            self.short_status(who, leaving, age)
        }
    }

    /// [`WorkerTasks::status`], short: the data ages alone (see [`WorkerStatus::ages`]).
    pub fn short_status(
        &self,
        who: &Identity,
        leaving: bool,
        age: impl Fn(&TaskId) -> Option<u64>,
    ) -> WorkerStatus {
        WorkerStatus {
            worker: who.worker.clone(),
            instance: who.instance,
            max_load: who.max_load,
            epoch: self.epoch,
            applied_seq: self.applied_seq,
            leaving,
            list: self.version,
            tasks: Vec::new(),
            refused: Default::default(),
            ages: Some(self.wanted.iter().map(age).collect()),
        }
    }

    /// Forgets every task (the worker is leaving and has stopped them).
    pub fn clear(&mut self) -> Vec<TaskId> {
        self.version += 1;
        std::mem::take(&mut self.wanted).into_iter().collect()
    }
}

#[cfg(test)]
mod tests {
    #[cfg(target_arch = "wasm32")]
    use wasm_bindgen_test::wasm_bindgen_test as test;

    use super::*;

    fn t(s: &str) -> TaskId {
        s.parse().unwrap()
    }

    fn set(epoch: u64, seq: u64, reset: bool, end: &[&str], add: &[&str]) -> Instructions {
        Instructions {
            worker: "w1".into(),
            epoch,
            seq,
            reset,
            end: end.iter().map(|s| t(s)).collect(),
            add: add.iter().map(|s| t(s)).collect(),
        }
    }

    #[test]
    fn applies_ends_then_adds_and_ignores_stale_sets() {
        let mut w = WorkerTasks::new();
        let a = "kline:sim:spot:BTC/USDT";
        let b = "depth:sim:spot:BTC/USDT";
        let c = "kline:sim:spot:ETH/USDT";
        let ch = w.apply(&set(1, 1, false, &[], &[a, b])).unwrap();
        assert_eq!(ch.start, vec![t(a), t(b)]);
        assert_eq!(w.apply(&set(1, 1, false, &[a], &[])), None, "already applied");
        let ch = w.apply(&set(1, 2, false, &[a, c], &[c])).unwrap();
        assert_eq!(ch, Change { stop: vec![t(a)], start: vec![t(c)] });
        // a new leader's pre-reset keeps b, stops c, starts a
        let ch = w.apply(&set(2, 1, true, &[], &[b, a])).unwrap();
        assert_eq!(ch, Change { stop: vec![t(c)], start: vec![t(a)] });
        assert_eq!(w.applied(), (2, 1));
        assert_eq!(w.apply(&set(1, 9, false, &[], &[c])), None, "a deposed leader");
        assert_eq!(w.wanted().len(), 2);
    }
}
