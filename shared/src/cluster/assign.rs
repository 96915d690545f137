//! [`Assigner`]: the supervisor of seed 004 as a state machine.
//!
//! Inputs: [`Assigner::handle_status`] (a worker's [`WorkerStatus`]),
//! [`Assigner::handle_demand`] (a gateway's on-demand set), [`Assigner::handle_task_list`] (the
//! answer to a task query), [`Assigner::set_leader`] / [`Assigner::resign`], and
//! [`Assigner::tick`] (the one low-precision timer, every `tick_ms`). Outputs:
//! [`Assigner::poll_output`] — instruction sets to send, and task queries to run.
//!
//! The life cycle follows the seed: a leader warms up (`warmup_ms`: collect statuses, assign
//! nothing), asks for the task list, assigns it **with reset**, then runs passively: an
//! assignment event happens only when something changed (a task list differs, a gateway's
//! demand changes, a worker joins, leaves, times out, or a task goes silent). With no change no
//! instruction is produced and a tick checks only the timer keys that came due.
//!
//! The assignment event is the seed's workflow (`assign`): an empty instruction set per worker;
//! "pre-reset" when asked; "end task" for each removed task (decrementing the holder's running
//! count); weights from spare capacity `max_load − running`; per-worker quota
//! `ceil(tasks to add × redundancy × weight)`; tasks taken from `add` into "add task"
//! instructions; all sets sent. Two additions, both needed for the redundancy the issue asks:
//! a task's replicas go to distinct workers, and a replica the quotas cannot place because of
//! that rule goes to any worker with spare capacity (counted in [`Placement::beyond_quota`]).
//! What still cannot be placed is a [`Shortfall`], visible in the report, never dropped.
//!
//! A reset keeps what the workers already run (from their statuses) up to the redundancy and
//! their max load, and sends every worker its whole wanted set: a new leader reassigns no
//! healthy task and a worker restarts no unchanged session.

use std::collections::{BTreeMap, BTreeSet, VecDeque};

use super::timer::LowResTimer;
use super::{Instructions, TaskId, WorkerStatus};
use crate::protocol::ops::{
    AssignmentRecord, ClusterReport, ClusterTask, ClusterWorker, ShortCause, Shortfall,
    SupervisorInfo, SupervisorState, SupervisorStats,
};

/// The supervisor's settings (`[cluster]`), in milliseconds.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AssignConfig {
    pub tick_ms: u64,
    pub warmup_ms: u64,
    pub worker_timeout_ms: u64,
    pub task_timeout_ms: u64,
    pub task_query_interval_ms: u64,
    /// Distinct workers per task.
    pub redundancy: u32,
}

impl Default for AssignConfig {
    fn default() -> Self {
        AssignConfig {
            tick_ms: 1_000,
            warmup_ms: 30_000,
            worker_timeout_ms: 30_000,
            task_timeout_ms: 30_000,
            task_query_interval_ms: 1_800_000,
            redundancy: 2,
        }
    }
}

/// What the shell must do.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Output {
    /// Publish this instruction set to its worker.
    Send(Instructions),
    /// Run the task query (pinned instruments × kinds, the symbol pattern through the source's
    /// exchangeInfo) and answer with [`Assigner::handle_task_list`] with this `reset`.
    QueryTasks { reset: bool },
}

/// How many replicas an assignment event placed and how (for tests and the record).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Placement {
    /// Per worker: the seed's quota and the replicas placed within it.
    pub quotas: BTreeMap<String, (u32, u32)>,
    /// Replicas placed beyond a worker's quota (only when the quotas alone cannot give a task
    /// distinct holders; always within the worker's max load).
    pub beyond_quota: u32,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Phase {
    Standby,
    WarmingUp { until_ms: u64 },
    AwaitingTasks,
    Running,
}

#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
enum Key {
    Worker(String, u64),
    Hold(String, TaskId, u64),
    Gateway(String, u64),
    Warmup,
    Query(u64),
}

#[derive(Debug, Clone)]
struct Hold {
    /// Supervisor time of the last upstream data (or of the assignment, before any).
    last_data_ms: u64,
    generation: u64,
}

#[derive(Debug, Clone)]
struct Worker {
    max_load: u32,
    instance: u64,
    last_seen_ms: u64,
    active: bool,
    leaving: bool,
    generation: u64,
    /// The tasks its last status listed, with the supervisor time of their last data.
    reported: BTreeMap<TaskId, Option<u64>>,
    /// The version of that list (`WorkerStatus::list`).
    list: u64,
    /// What this supervisor assigned it.
    holds: BTreeMap<TaskId, Hold>,
    /// Known: `reported` and `holds` have the same tasks (found so by a reconcile, and neither
    /// changed since). At steady state every status finds so without comparing a task.
    keys_match: bool,
    /// Sequence number of the next instruction set of this epoch.
    next_seq: u64,
}

/// What only `a` has and what only `b` has, of two ascending key sequences (one pass).
fn differences<'a>(
    a: impl Iterator<Item = &'a TaskId>,
    b: impl Iterator<Item = &'a TaskId>,
) -> (Vec<TaskId>, Vec<TaskId>) {
    let (mut a, mut b) = (a.peekable(), b.peekable());
    let (mut only_a, mut only_b) = (Vec::new(), Vec::new());
    loop {
        match (a.peek(), b.peek()) {
            (None, None) => break,
            (Some(x), Some(y)) if x == y => {
                a.next();
                b.next();
            }
            (Some(x), Some(y)) if x < y => only_a.extend(a.next().cloned()),
            (Some(_), Some(_)) | (None, Some(_)) => only_b.extend(b.next().cloned()),
            (Some(_), None) => only_a.extend(a.next().cloned()),
        }
    }
    (only_a, only_b)
}

impl Worker {
    fn eligible(&self) -> bool {
        self.active && !self.leaving
    }
    fn spare(&self) -> u32 {
        self.max_load.saturating_sub(self.holds.len() as u32)
    }
}

#[derive(Debug, Clone)]
struct Gateway {
    tasks: BTreeSet<TaskId>,
    last_seen_ms: u64,
    generation: u64,
}

const HISTORY: usize = 32;

/// The supervisor's state machine. See the module documentation.
#[derive(Debug)]
pub struct Assigner {
    cfg: AssignConfig,
    id: String,
    created_ms: u64,
    phase: Phase,
    epoch: u64,
    leader: Option<String>,
    timer: LowResTimer<Key>,
    generation: u64,
    workers: BTreeMap<String, Worker>,
    /// task -> workers holding it (the inverse of `Worker::holds`).
    holders: BTreeMap<TaskId, BTreeSet<String>>,
    /// task -> how many sources want it (the task list counts 1, each gateway 1).
    wanted: BTreeMap<TaskId, u32>,
    listed: BTreeSet<TaskId>,
    gateways: BTreeMap<String, Gateway>,
    short: BTreeMap<TaskId, Shortfall>,
    next_query_ms: u64,
    out: VecDeque<Output>,
    history: VecDeque<AssignmentRecord>,
    stats: SupervisorStats,
    last_placement: Placement,
}

impl Assigner {
    /// A supervisor `id`, started at `now_ms`, in standby until [`Assigner::set_leader`].
    pub fn new(cfg: AssignConfig, id: impl Into<String>, now_ms: u64) -> Self {
        Assigner {
            timer: LowResTimer::new(cfg.tick_ms),
            cfg,
            id: id.into(),
            created_ms: now_ms,
            phase: Phase::Standby,
            epoch: 0,
            leader: None,
            generation: 0,
            workers: BTreeMap::new(),
            holders: BTreeMap::new(),
            wanted: BTreeMap::new(),
            listed: BTreeSet::new(),
            gateways: BTreeMap::new(),
            short: BTreeMap::new(),
            next_query_ms: 0,
            out: VecDeque::new(),
            history: VecDeque::new(),
            stats: SupervisorStats::default(),
            last_placement: Placement::default(),
        }
    }

    pub fn config(&self) -> &AssignConfig {
        &self.cfg
    }

    pub fn is_leader(&self) -> bool {
        self.phase != Phase::Standby
    }

    /// Whether a status from `worker` would be its first (it would add a worker), and how
    /// many workers are known: the shell bounds them ([`super::bounds::MAX_WORKERS`]).
    pub fn knows_worker(&self, worker: &str) -> bool {
        self.workers.contains_key(worker)
    }

    pub fn worker_count(&self) -> usize {
        self.workers.len()
    }

    /// Whether `gateway`'s demand is known, and how many gateways' are
    /// ([`super::bounds::MAX_GATEWAYS`]).
    pub fn knows_gateway(&self, gateway: &str) -> bool {
        self.gateways.contains_key(gateway)
    }

    pub fn gateway_count(&self) -> usize {
        self.gateways.len()
    }

    pub fn is_running(&self) -> bool {
        self.phase == Phase::Running
    }

    pub fn epoch(&self) -> u64 {
        self.epoch
    }

    pub fn stats(&self) -> SupervisorStats {
        self.stats
    }

    /// The placement of the last assignment event.
    pub fn last_placement(&self) -> &Placement {
        &self.last_placement
    }

    /// The next output, if any.
    pub fn poll_output(&mut self) -> Option<Output> {
        self.out.pop_front()
    }

    fn next_generation(&mut self) -> u64 {
        self.generation += 1;
        self.generation
    }

    /// Records who leads (this supervisor's shell learns it from the lease).
    pub fn set_leader_id(&mut self, leader: Option<String>) {
        self.leader = leader;
    }

    /// This supervisor now leads with `epoch` (greater than any earlier leader's). It warms up
    /// until `warmup_ms` after it started collecting statuses (at once if it has been standing
    /// by that long), then queries the task list and assigns with reset.
    pub fn set_leader(&mut self, now_ms: u64, epoch: u64) {
        self.epoch = epoch;
        self.leader = Some(self.id.clone());
        for w in self.workers.values_mut() {
            w.next_seq = 1;
        }
        let until_ms = (self.created_ms + self.cfg.warmup_ms).max(now_ms);
        self.phase = Phase::WarmingUp { until_ms };
        self.timer.arm(until_ms, Key::Warmup);
        if until_ms <= now_ms {
            self.tick(now_ms);
        }
    }

    /// This supervisor no longer leads: it forgets its assignments (a later leadership
    /// rebuilds them from the workers' statuses) and keeps collecting.
    pub fn resign(&mut self) {
        self.phase = Phase::Standby;
        if self.leader.as_deref() == Some(self.id.as_str()) {
            self.leader = None;
        }
        for w in self.workers.values_mut() {
            w.holds.clear();
            w.keys_match = false;
        }
        self.holders.clear();
        self.short.clear();
        self.out.clear();
    }

    // ----- inputs -----

    /// A worker's status.
    pub fn handle_status(&mut self, now_ms: u64, status: &WorkerStatus) {
        self.stats.statuses += 1;
        if let Some(ages) = &status.ages {
            // A short status stands for the list of its version: usable only if that is the
            // list this supervisor holds; otherwise a sign of life, until the next full one.
            let Some(w) = self.workers.get_mut(&status.worker) else { return };
            let known = w.instance == status.instance
                && w.list == status.list
                && w.reported.len() == ages.len();
            if !known {
                if w.instance == status.instance && w.active {
                    w.last_seen_ms = now_ms;
                }
                return;
            }
        }
        let generation = self.next_generation();
        let id = status.worker.clone();
        let instance = status.instance;
        let mut vacated: Vec<TaskId> = Vec::new();
        let mut joined = false;
        let w = self.workers.entry(id.clone()).or_insert_with(|| {
            joined = true;
            Worker {
                max_load: status.max_load,
                instance,
                last_seen_ms: now_ms,
                active: false,
                leaving: false,
                generation: 0,
                reported: BTreeMap::new(),
                list: 0,
                holds: BTreeMap::new(),
                keys_match: false,
                next_seq: 1,
            }
        });
        // a restarted worker (same id, new instance) lost its sessions: the old one is gone
        if w.instance != instance {
            vacated.extend(w.holds.keys().cloned());
            w.instance = instance;
            w.next_seq = 1;
        }
        let grew = status.max_load > w.max_load;
        w.max_load = status.max_load;
        w.last_seen_ms = now_ms;
        if !w.active {
            w.active = true;
            w.generation = generation;
            joined = true;
            self.timer
                .arm(now_ms + self.cfg.worker_timeout_ms, Key::Worker(id.clone(), generation));
        }
        let started_leaving = status.leaving && !w.leaving;
        w.leaving = status.leaving;
        let at = |age: Option<u64>| age.map(|age| now_ms.saturating_sub(age));
        if let Some(ages) = &status.ages {
            // the list it stands for, checked above: the ages in its order
            for (v, age) in w.reported.values_mut().zip(ages) {
                *v = at(*age);
            }
        } else {
            // At steady state a worker reports the same tasks (in order) every time: update
            // the data times in place rather than rebuild the map.
            let same = w.reported.len() == status.tasks.len()
                && w.reported.keys().zip(&status.tasks).all(|(k, r)| *k == r.task);
            if same {
                for (v, r) in w.reported.values_mut().zip(&status.tasks) {
                    *v = at(r.data_age_ms);
                }
            } else {
                w.reported =
                    status.tasks.iter().map(|r| (r.task.clone(), at(r.data_age_ms))).collect();
                w.keys_match = false;
            }
            w.list = status.list;
        }
        // (both maps are in task order: one pass over the two, not a search per task — at
        // steady state this runs for every task of every status)
        if w.keys_match {
            for (hold, at) in w.holds.values_mut().zip(w.reported.values()) {
                if let Some(at) = at {
                    hold.last_data_ms = hold.last_data_ms.max(*at);
                }
            }
        } else {
            let mut reported = w.reported.iter().peekable();
            for (task, hold) in w.holds.iter_mut() {
                while reported.next_if(|(t, _)| *t < task).is_some() {}
                if let Some((t, Some(at))) = reported.peek() {
                    if *t == task {
                        hold.last_data_ms = hold.last_data_ms.max(*at);
                    }
                }
            }
        }
        if !self.is_running() {
            return;
        }
        for t in &vacated {
            self.unhold(&id, t);
        }
        if started_leaving {
            // drain: end everything it holds and place the replicas elsewhere at once
            let tasks: Vec<TaskId> = self.workers[&id].holds.keys().cloned().collect();
            for t in &tasks {
                self.unhold(&id, t);
            }
            let ends = vec![(id.clone(), tasks.clone())];
            vacated.extend(tasks);
            self.assign(now_ms, format!("worker {id} leaving"), vacated, &[], false, &ends);
            return;
        }
        // a status is settled when it reflects every set sent to the worker in this epoch (or
        // none was sent): only then can it be compared with what the worker was given
        let next_seq = self.workers[&id].next_seq;
        let settled =
            next_seq == 1 || (status.epoch == self.epoch && status.applied_seq + 1 >= next_seq);
        let mut ends = Vec::new();
        if settled {
            // reconcile what it runs with what it was given
            let w = &self.workers[&id];
            let (extra, dropped) = if w.keys_match {
                (Vec::new(), Vec::new())
            } else {
                differences(w.reported.keys(), w.holds.keys())
            };
            if extra.is_empty() && dropped.is_empty() {
                self.workers.get_mut(&id).expect("known worker").keys_match = true;
            }
            for t in dropped {
                self.unhold(&id, &t);
                vacated.push(t);
            }
            let mut unwanted = Vec::new();
            for t in extra {
                let room = self.workers[&id].eligible() && self.workers[&id].spare() > 0;
                let open =
                    self.wanted.contains_key(&t) && self.holder_count(&t) < self.cfg.redundancy;
                if room && open {
                    let at = self.workers[&id].reported[&t].unwrap_or(now_ms);
                    self.hold(&id, &t, at);
                    self.refresh_short(now_ms, &t);
                } else {
                    unwanted.push(t);
                }
            }
            if !unwanted.is_empty() {
                ends.push((id.clone(), unwanted));
            }
        }
        let capacity_appeared = (joined || grew) && !self.short.is_empty();
        if !vacated.is_empty() || !ends.is_empty() || capacity_appeared {
            let reason = if !vacated.is_empty() {
                format!("worker {id} restarted or dropped tasks")
            } else if !ends.is_empty() {
                format!("worker {id} runs unassigned tasks")
            } else {
                format!("worker {id} has capacity")
            };
            self.assign(now_ms, reason, vacated, &[], false, &ends);
        }
    }

    /// A gateway's whole on-demand set.
    pub fn handle_demand(&mut self, now_ms: u64, gateway: &str, tasks: &[TaskId]) {
        self.stats.demands += 1;
        let new: BTreeSet<TaskId> = tasks.iter().cloned().collect();
        let generation = self.next_generation();
        let (old, fresh) = match self.gateways.get_mut(gateway) {
            Some(g) => {
                g.last_seen_ms = now_ms;
                (std::mem::replace(&mut g.tasks, new.clone()), false)
            }
            None => {
                self.gateways.insert(
                    gateway.to_string(),
                    Gateway { tasks: new.clone(), last_seen_ms: now_ms, generation },
                );
                (BTreeSet::new(), true)
            }
        };
        if fresh {
            self.timer.arm(
                now_ms + self.cfg.worker_timeout_ms,
                Key::Gateway(gateway.to_string(), generation),
            );
        }
        if old != new {
            let (add, remove) = self.rewant(&old, &new);
            self.assign_if_running(now_ms, format!("demand of {gateway}"), add, remove, false);
        }
    }

    /// The answer to a task query: the whole listed set (pinned and pattern tasks).
    pub fn handle_task_list(&mut self, now_ms: u64, tasks: &[TaskId], reset: bool) {
        self.stats.task_lists += 1;
        let new: BTreeSet<TaskId> = tasks.iter().cloned().collect();
        let old = std::mem::replace(&mut self.listed, new.clone());
        let (add, remove) = self.rewant(&old, &new);
        if reset {
            if matches!(self.phase, Phase::AwaitingTasks | Phase::Running) {
                self.phase = Phase::Running;
                let all: Vec<TaskId> = self.wanted.keys().cloned().collect();
                self.assign(now_ms, "task query (reset)".into(), all, &remove, true, &[]);
            }
        } else if self.phase == Phase::Running && (!add.is_empty() || !remove.is_empty()) {
            self.assign(now_ms, "task query".into(), add, &remove, false, &[]);
        }
    }

    /// The low-precision timer: call every `tick_ms`.
    pub fn tick(&mut self, now_ms: u64) {
        self.stats.ticks += 1;
        let due = self.timer.due(now_ms);
        let mut vacated = Vec::new();
        let mut ends: Vec<(String, Vec<TaskId>)> = Vec::new();
        let mut reasons = Vec::new();
        let mut removed = Vec::new();
        let mut added = Vec::new();
        for key in due {
            self.stats.timer_checks += 1;
            match key {
                Key::Worker(id, generation) => {
                    let timeout = self.cfg.worker_timeout_ms;
                    let Some(w) = self.workers.get_mut(&id) else { continue };
                    if !w.active || w.generation != generation {
                        continue;
                    }
                    if now_ms < w.last_seen_ms + timeout {
                        self.timer.arm(w.last_seen_ms + timeout, Key::Worker(id, generation));
                        continue;
                    }
                    w.active = false;
                    let tasks: Vec<TaskId> = w.holds.keys().cloned().collect();
                    for t in &tasks {
                        self.unhold(&id, t);
                    }
                    if !tasks.is_empty() {
                        reasons.push(format!("worker {id} timed out"));
                    }
                    vacated.extend(tasks);
                }
                Key::Hold(id, task, generation) => {
                    let timeout = self.cfg.task_timeout_ms;
                    let Some(hold) = self.workers.get(&id).and_then(|w| w.holds.get(&task)) else {
                        continue;
                    };
                    if hold.generation != generation {
                        continue;
                    }
                    if now_ms < hold.last_data_ms + timeout {
                        let at = hold.last_data_ms + timeout;
                        self.timer.arm(at, Key::Hold(id, task, generation));
                        continue;
                    }
                    self.unhold(&id, &task);
                    reasons.push(format!("task {task} silent on {id}"));
                    match ends.iter_mut().find(|(w, _)| *w == id) {
                        Some((_, list)) => list.push(task.clone()),
                        None => ends.push((id, vec![task.clone()])),
                    }
                    vacated.push(task);
                }
                Key::Gateway(id, generation) => {
                    let timeout = self.cfg.worker_timeout_ms;
                    let Some(g) = self.gateways.get(&id) else { continue };
                    if g.generation != generation {
                        continue;
                    }
                    if now_ms < g.last_seen_ms + timeout {
                        self.timer.arm(g.last_seen_ms + timeout, Key::Gateway(id, generation));
                        continue;
                    }
                    let g = self.gateways.remove(&id).expect("present");
                    let (a, r) = self.rewant(&g.tasks, &BTreeSet::new());
                    if !r.is_empty() {
                        reasons.push(format!("gateway {id} timed out"));
                    }
                    added.extend(a);
                    removed.extend(r);
                }
                Key::Warmup => {
                    if let Phase::WarmingUp { until_ms } = self.phase {
                        if now_ms < until_ms {
                            self.timer.arm(until_ms, Key::Warmup);
                            continue;
                        }
                        self.phase = Phase::AwaitingTasks;
                        self.out.push_back(Output::QueryTasks { reset: true });
                        self.next_query_ms = now_ms + self.cfg.task_query_interval_ms;
                        self.timer.arm(self.next_query_ms, Key::Query(self.next_query_ms));
                    }
                }
                Key::Query(at) => {
                    if at != self.next_query_ms || !self.is_leader() {
                        continue;
                    }
                    if now_ms < at {
                        self.timer.arm(at, Key::Query(at));
                        continue;
                    }
                    self.out.push_back(Output::QueryTasks { reset: false });
                    self.next_query_ms = now_ms + self.cfg.task_query_interval_ms;
                    self.timer.arm(self.next_query_ms, Key::Query(self.next_query_ms));
                }
            }
        }
        if !self.is_running() {
            return;
        }
        vacated.extend(added);
        if !vacated.is_empty() || !ends.is_empty() || !removed.is_empty() {
            reasons.dedup();
            let reason = match reasons.len() {
                0 => "timer".to_string(),
                1 => reasons.pop().expect("one"),
                n => format!("{} and {} more", reasons[0], n - 1),
            };
            self.assign(now_ms, reason, vacated, &removed, false, &ends);
        }
    }

    // ----- bookkeeping -----

    fn holder_count(&self, t: &TaskId) -> u32 {
        self.holders.get(t).map_or(0, |h| h.len() as u32)
    }

    fn hold(&mut self, worker: &str, t: &TaskId, last_data_ms: u64) {
        let generation = self.next_generation();
        let w = self.workers.get_mut(worker).expect("known worker");
        w.holds.insert(t.clone(), Hold { last_data_ms, generation });
        w.keys_match = false;
        self.holders.entry(t.clone()).or_default().insert(worker.to_string());
        self.timer.arm(
            last_data_ms + self.cfg.task_timeout_ms,
            Key::Hold(worker.to_string(), t.clone(), generation),
        );
    }

    fn unhold(&mut self, worker: &str, t: &TaskId) {
        if let Some(w) = self.workers.get_mut(worker) {
            w.holds.remove(t);
            w.keys_match = false;
        }
        if let Some(h) = self.holders.get_mut(t) {
            h.remove(worker);
            if h.is_empty() {
                self.holders.remove(t);
            }
        }
    }

    /// Moves one source's wanted set from `old` to `new`; returns the tasks that became wanted
    /// and those no longer wanted by anyone.
    fn rewant(
        &mut self,
        old: &BTreeSet<TaskId>,
        new: &BTreeSet<TaskId>,
    ) -> (Vec<TaskId>, Vec<TaskId>) {
        let mut add = Vec::new();
        let mut remove = Vec::new();
        for t in old.difference(new) {
            if let Some(n) = self.wanted.get_mut(t) {
                *n -= 1;
                if *n == 0 {
                    self.wanted.remove(t);
                    remove.push(t.clone());
                }
            }
        }
        for t in new.difference(old) {
            let n = self.wanted.entry(t.clone()).or_insert(0);
            *n += 1;
            if *n == 1 {
                add.push(t.clone());
            }
        }
        (add, remove)
    }

    fn assign_if_running(
        &mut self,
        now_ms: u64,
        reason: String,
        add: Vec<TaskId>,
        remove: Vec<TaskId>,
        reset: bool,
    ) {
        if self.phase == Phase::Running {
            self.assign(now_ms, reason, add, &remove, reset, &[]);
        }
    }

    fn refresh_short(&mut self, now_ms: u64, t: &TaskId) {
        let held = self.holder_count(t);
        if !self.wanted.contains_key(t) || held >= self.cfg.redundancy {
            self.short.remove(t);
            return;
        }
        let eligible = self.workers.values().filter(|w| w.eligible()).count() as u32;
        let cause = if held < self.cfg.redundancy.min(eligible) {
            ShortCause::NoCapacity
        } else {
            ShortCause::FewWorkers
        };
        let missing = self.cfg.redundancy - held;
        let since_ms = self.short.get(t).map_or(now_ms, |s| s.since_ms);
        self.short.insert(t.clone(), Shortfall { task: t.to_string(), missing, cause, since_ms });
    }

    /// The seed's assignment event. `add`: tasks that may need replicas (tasks no longer wanted
    /// or already fully held are skipped); `remove`: tasks no longer wanted; `ends`: "end task"
    /// instructions already decided (the holds are gone), sent in the same sets and avoided as
    /// new holders of the same task in this event.
    fn assign(
        &mut self,
        now_ms: u64,
        reason: String,
        add: Vec<TaskId>,
        remove: &[TaskId],
        reset: bool,
        ends: &[(String, Vec<TaskId>)],
    ) {
        self.stats.assignments += 1;
        let redundancy = self.cfg.redundancy;
        // 1. an empty instruction set per connected worker
        let mut sets: BTreeMap<String, Instructions> = self
            .workers
            .iter()
            .filter(|(_, w)| w.active)
            .map(|(id, _)| {
                let set = Instructions {
                    worker: id.clone(),
                    epoch: self.epoch,
                    seq: 0,
                    reset: false,
                    end: Vec::new(),
                    add: Vec::new(),
                };
                (id.clone(), set)
            })
            .collect();
        let mut avoid: BTreeSet<(TaskId, String)> = BTreeSet::new();
        for (w, tasks) in ends {
            if let Some(set) = sets.get_mut(w) {
                set.end.extend(tasks.iter().cloned());
            }
            for t in tasks {
                avoid.insert((t.clone(), w.clone()));
            }
        }
        let mut ended = ends.iter().map(|(_, t)| t.len() as u32).sum::<u32>();
        // 2. pre-reset: keep what the workers run, up to the redundancy and their max load
        if reset {
            for w in self.workers.values_mut() {
                w.holds.clear();
                w.keys_match = false;
            }
            self.holders.clear();
            self.short.clear();
            let ids: Vec<String> =
                self.workers.iter().filter(|(_, w)| w.eligible()).map(|(i, _)| i.clone()).collect();
            for id in &ids {
                let reported: Vec<(TaskId, Option<u64>)> =
                    self.workers[id].reported.iter().map(|(t, a)| (t.clone(), *a)).collect();
                for (t, at) in reported {
                    let w = &self.workers[id];
                    if self.wanted.contains_key(&t)
                        && self.holder_count(&t) < redundancy
                        && w.spare() > 0
                    {
                        self.hold(id, &t, at.unwrap_or(now_ms));
                        sets.get_mut(id).expect("active").add.push(t);
                    }
                }
            }
            for set in sets.values_mut() {
                set.reset = true;
            }
        }
        // 3. end task, decrementing the holders' running counts
        for t in remove {
            let holders: Vec<String> =
                self.holders.get(t).map(|h| h.iter().cloned().collect()).unwrap_or_default();
            for w in holders {
                self.unhold(&w, t);
                if let Some(set) = sets.get_mut(&w) {
                    if !set.reset {
                        set.end.push(t.clone());
                        ended += 1;
                    }
                }
            }
            self.short.remove(t);
        }
        // the tasks to add: those asked, plus every task still short of replicas
        let mut to_add: BTreeSet<TaskId> = add.into_iter().collect();
        to_add.extend(self.short.keys().cloned());
        let to_add: Vec<TaskId> = to_add
            .into_iter()
            .filter(|t| self.wanted.contains_key(t) && self.holder_count(t) < redundancy)
            .collect();
        // 4. weights from spare capacity; 5. quotas
        let eligible: Vec<String> =
            self.workers.iter().filter(|(_, w)| w.eligible()).map(|(i, _)| i.clone()).collect();
        // (by position in `eligible`, which is in id order: the choice below looks at every
        // worker for every replica, so no map lookups or clones in it)
        let mut spare: Vec<u32> = eligible.iter().map(|id| self.workers[id].spare()).collect();
        let total_spare: u64 = spare.iter().map(|&s| u64::from(s)).sum();
        let n = to_add.len() as u64;
        let mut placement = Placement::default();
        let mut quota: Vec<u32> = Vec::with_capacity(eligible.len());
        for (id, &s) in eligible.iter().zip(&spare) {
            let q = if total_spare == 0 {
                0
            } else {
                (n * u64::from(redundancy) * u64::from(s)).div_ceil(total_spare)
            };
            let q = u32::try_from(q).unwrap_or(u32::MAX);
            quota.push(q);
            placement.quotas.insert(id.clone(), (q, 0));
        }
        // 6. take tasks from `add` into "add task" instructions
        let mut added = 0u32;
        for t in &to_add {
            let need = redundancy.saturating_sub(self.holder_count(t));
            for _ in 0..need {
                let holders = self.holders.get(t);
                let free = |i: usize, avoid_ok: bool| {
                    spare[i] > 0
                        && !holders.is_some_and(|h| h.contains(&eligible[i]))
                        && (avoid_ok
                            || avoid.is_empty()
                            || !avoid.contains(&(t.clone(), eligible[i].clone())))
                };
                // the most quota left, then the most spare, then the lowest id
                let within =
                    (0..eligible.len()).filter(|&i| quota[i] > 0 && free(i, false)).max_by(
                        |&a, &b| (quota[a], spare[a]).cmp(&(quota[b], spare[b])).then(b.cmp(&a)),
                    );
                let (pick, in_quota) = match within {
                    Some(i) => (Some(i), true),
                    None => {
                        let any = (0..eligible.len())
                            .filter(|&i| free(i, false))
                            .chain((0..eligible.len()).filter(|&i| free(i, true)))
                            .max_by(|&a, &b| spare[a].cmp(&spare[b]).then(b.cmp(&a)));
                        (any, false)
                    }
                };
                let Some(i) = pick else { break };
                let id = eligible[i].clone();
                if in_quota {
                    quota[i] -= 1;
                    placement.quotas.get_mut(&id).expect("eligible").1 += 1;
                } else {
                    placement.beyond_quota += 1;
                }
                spare[i] -= 1;
                self.hold(&id, t, now_ms);
                sets.get_mut(&id).expect("eligible is active").add.push(t.clone());
                added += 1;
            }
            self.refresh_short(now_ms, t);
        }
        // 7. send every instruction set
        let mut instructions = 0u32;
        for (id, mut set) in sets {
            if !set.reset && set.end.is_empty() && set.add.is_empty() {
                continue;
            }
            let w = self.workers.get_mut(&id).expect("active");
            set.seq = w.next_seq;
            w.next_seq += 1;
            instructions += 1;
            self.out.push_back(Output::Send(set));
        }
        self.stats.instructions_sent += u64::from(instructions);
        let unassigned = self.short.values().map(|s| s.missing).sum();
        if self.history.len() == HISTORY {
            self.history.pop_front();
        }
        self.history.push_back(AssignmentRecord {
            at_ms: now_ms,
            reason,
            reset,
            added,
            ended,
            unassigned,
            instructions,
        });
        self.last_placement = placement;
    }

    // ----- views -----

    /// Workers holding `task`.
    pub fn holders_of(&self, task: &TaskId) -> Vec<String> {
        self.holders.get(task).map(|h| h.iter().cloned().collect()).unwrap_or_default()
    }

    /// Tasks assigned to `worker`.
    pub fn tasks_of(&self, worker: &str) -> Vec<TaskId> {
        self.workers.get(worker).map(|w| w.holds.keys().cloned().collect()).unwrap_or_default()
    }

    /// Every wanted task.
    pub fn wanted(&self) -> impl Iterator<Item = &TaskId> {
        self.wanted.keys()
    }

    /// Whether `worker` is active (a status within `worker_timeout_ms`).
    pub fn is_active(&self, worker: &str) -> bool {
        self.workers.get(worker).is_some_and(|w| w.active)
    }

    pub fn shortfalls(&self) -> impl Iterator<Item = &Shortfall> {
        self.short.values()
    }

    /// The operations report at `now_ms`, with at most `max_tasks` tasks and as many
    /// shortfalls (the totals say how many there are; a report must fit a NATS message).
    pub fn report(&self, now_ms: u64, max_tasks: usize) -> ClusterReport {
        let state = match self.phase {
            Phase::Standby => SupervisorState::Standby,
            Phase::WarmingUp { .. } => SupervisorState::WarmingUp,
            Phase::AwaitingTasks => SupervisorState::AwaitingTasks,
            Phase::Running => SupervisorState::Running,
        };
        let warmup_remaining_ms = match self.phase {
            Phase::WarmingUp { until_ms } => Some(until_ms.saturating_sub(now_ms)),
            _ => None,
        };
        let workers = self
            .workers
            .iter()
            .map(|(id, w)| ClusterWorker {
                id: id.clone(),
                max_load: w.max_load,
                running: w.holds.len() as u32,
                active: w.active,
                leaving: w.leaving,
                last_seen_ms: now_ms.saturating_sub(w.last_seen_ms),
                refused: Default::default(),
            })
            .collect();
        let tasks = self
            .wanted
            .keys()
            .take(max_tasks)
            .map(|t| {
                let holders = self.holders_of(t);
                let freshest = holders
                    .iter()
                    .filter_map(|w| self.workers[w].reported.get(t).copied().flatten())
                    .max();
                ClusterTask {
                    id: t.to_string(),
                    kind: t.kind,
                    instrument: t.instrument.clone(),
                    workers: holders,
                    last_data_age_ms: freshest.map(|at| now_ms.saturating_sub(at)),
                }
            })
            .collect();
        ClusterReport {
            supervisor: SupervisorInfo {
                state,
                leader: self.leader.clone(),
                epoch: self.epoch,
                warmup_remaining_ms,
                redundancy: self.cfg.redundancy,
                stats: self.stats,
                refused: Default::default(),
            },
            workers,
            tasks,
            tasks_total: self.wanted.len(),
            unassigned: self.short.values().take(max_tasks).cloned().collect(),
            unassigned_total: self.short.len(),
            events: self.history.iter().cloned().collect(),
        }
    }
}

#[cfg(test)]
mod tests {
    #[cfg(target_arch = "wasm32")]
    use wasm_bindgen_test::wasm_bindgen_test as test;

    use super::*;

    #[test]
    fn differences_of_two_sorted_sets_in_one_pass() {
        let task = |i: u32| -> TaskId { format!("kline:sim:spot:S{i:03}/USDT").parse().unwrap() };
        let a: BTreeSet<TaskId> = [1, 2, 4, 7, 9].into_iter().map(task).collect();
        let b: BTreeSet<TaskId> = [0, 2, 3, 7, 10, 11].into_iter().map(task).collect();
        let (only_a, only_b) = differences(a.iter(), b.iter());
        assert_eq!(only_a, a.difference(&b).cloned().collect::<Vec<_>>());
        assert_eq!(only_b, b.difference(&a).cloned().collect::<Vec<_>>());
        let none = BTreeSet::new();
        assert_eq!(differences(a.iter(), none.iter()).0.len(), 5);
        assert_eq!(differences(none.iter(), b.iter()).1.len(), 6);
    }
}
