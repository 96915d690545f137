//! The assignment logic against a simulated cluster in simulated time: workers that apply
//! instruction sets with [`WorkerTasks`] and send statuses, gateways that change their demand,
//! and random joins, deaths, restarts, drains, task additions and removals, stalls and
//! supervisor fail-overs. Every property the issue lists is checked on every seed.

use std::collections::{BTreeMap, BTreeSet};

#[cfg(target_arch = "wasm32")]
use wasm_bindgen_test::wasm_bindgen_test as test;

use super::assign::{AssignConfig, Assigner, Output};
use super::worker::{Identity, WorkerTasks};
use super::{Instructions, TaskId, TaskKind, WorkerStatus};
use crate::protocol::ops::ShortCause;
use crate::protocol::{InstrumentId, Market};
use crate::testkit::Rng;

const TICK: u64 = 1_000;

fn cfg(redundancy: u32) -> AssignConfig {
    AssignConfig {
        tick_ms: TICK,
        warmup_ms: 5_000,
        worker_timeout_ms: 10_000,
        task_timeout_ms: 8_000,
        task_query_interval_ms: 60_000,
        redundancy,
    }
}

fn task(kind: TaskKind, i: u32) -> TaskId {
    TaskId::new(kind, InstrumentId::new("sim", Market::Spot, format!("S{i:03}/USDT")))
}

struct SimWorker {
    max_load: u32,
    instance: u64,
    tasks: WorkerTasks,
    /// Sessions started, and when (for the data ages), and how many times each was started.
    started_at: BTreeMap<TaskId, u64>,
    alive: bool,
    leaving: bool,
    starts: u64,
    stops: u64,
}

impl SimWorker {
    fn new(max_load: u32, instance: u64) -> Self {
        SimWorker {
            max_load,
            instance,
            tasks: WorkerTasks::new(),
            started_at: BTreeMap::new(),
            alive: true,
            leaving: false,
            starts: 0,
            stops: 0,
        }
    }

    /// Its status: the full list when it changed and every 4th time, else the short form (data
    /// ages only), as `millrace worker` does.
    fn status(&mut self, id: &str, now: u64, stalled: &BTreeSet<TaskId>) -> WorkerStatus {
        let started = &self.started_at;
        // stalled instruments send nothing after the session started
        let age =
            |t: &TaskId| started.get(t).map(|&at| if stalled.contains(t) { now - at } else { 0 });
        let who =
            Identity { worker: id.to_string(), instance: self.instance, max_load: self.max_load };
        self.tasks.next_status(&who, self.leaving, age, false, 3)
    }

    fn apply(&mut self, set: &Instructions, now: u64) {
        if let Some(change) = self.tasks.apply(set) {
            for t in change.stop {
                self.started_at.remove(&t);
                self.stops += 1;
            }
            for t in change.start {
                self.started_at.insert(t, now);
                self.starts += 1;
            }
        }
        assert!(
            self.started_at.len() as u32 <= self.max_load,
            "worker over its max load {} after {set:?}",
            self.max_load
        );
    }
}

struct World {
    now: u64,
    rng: Rng,
    sup: Assigner,
    standby: Assigner,
    epoch: u64,
    workers: BTreeMap<String, SimWorker>,
    demand: BTreeMap<String, BTreeSet<TaskId>>,
    listed: BTreeSet<TaskId>,
    stalled: BTreeSet<TaskId>,
    sent: Vec<Instructions>,
    next_instance: u64,
    redundancy: u32,
}

impl World {
    fn new(seed: u64, redundancy: u32) -> Self {
        let mut sup = Assigner::new(cfg(redundancy), "s1", 0);
        sup.set_leader(0, 1);
        World {
            now: 0,
            rng: Rng::new(seed),
            sup,
            standby: Assigner::new(cfg(redundancy), "s2", 0),
            epoch: 1,
            workers: BTreeMap::new(),
            demand: BTreeMap::new(),
            listed: BTreeSet::new(),
            stalled: BTreeSet::new(),
            sent: Vec::new(),
            next_instance: 1,
            redundancy,
        }
    }

    fn add_worker(&mut self, id: &str, max_load: u32) {
        self.next_instance += 1;
        self.workers.insert(id.to_string(), SimWorker::new(max_load, self.next_instance));
    }

    /// One tick: every live worker's status, the timer, then the outputs delivered.
    fn step(&mut self) {
        self.now += TICK;
        let now = self.now;
        for (id, w) in &mut self.workers {
            if w.alive {
                let st = w.status(id, now, &self.stalled);
                self.sup.handle_status(now, &st);
                self.standby.handle_status(now, &st);
            }
        }
        for (g, tasks) in &self.demand {
            let tasks: Vec<TaskId> = tasks.iter().cloned().collect();
            self.sup.handle_demand(now, g, &tasks);
            self.standby.handle_demand(now, g, &tasks);
        }
        self.sup.tick(now);
        self.standby.tick(now);
        self.drain_outputs();
    }

    fn drain_outputs(&mut self) {
        let now = self.now;
        while let Some(out) = self.sup.poll_output() {
            match out {
                Output::Send(set) => {
                    assert!(
                        now >= 5_000,
                        "an instruction set during the warm-up: {set:?} at {now}"
                    );
                    // a task both ended and added is a restart of a silent session (the only
                    // worker that can take it is the one it went silent on)
                    if !set.reset {
                        for t in set.add.iter().filter(|t| set.end.contains(t)) {
                            let w = &self.workers[&set.worker];
                            let fresh = w.alive && !self.stalled.contains(t);
                            assert!(!fresh, "a healthy task both ended and added: {set:?}");
                        }
                    }
                    let adds: BTreeSet<_> = set.add.iter().collect();
                    assert_eq!(adds.len(), set.add.len(), "a task given twice: {set:?}");
                    if let Some(w) = self.workers.get_mut(&set.worker) {
                        if w.alive {
                            w.apply(&set, now);
                        }
                    }
                    self.sent.push(set);
                }
                Output::QueryTasks { reset } => {
                    let tasks: Vec<TaskId> = self.listed.iter().cloned().collect();
                    self.sup.handle_task_list(now, &tasks, reset);
                }
            }
        }
    }

    fn run(&mut self, ticks: u32) {
        for _ in 0..ticks {
            self.step();
        }
    }

    fn eligible(&self) -> BTreeSet<String> {
        self.workers
            .iter()
            .filter(|(_, w)| w.alive && !w.leaving)
            .map(|(id, _)| id.clone())
            .collect()
    }

    fn wanted(&self) -> BTreeSet<TaskId> {
        let mut all = self.listed.clone();
        for d in self.demand.values() {
            all.extend(d.iter().cloned());
        }
        all
    }

    /// The invariants of a settled cluster.
    fn check_settled(&self, seed: u64) {
        let eligible = self.eligible();
        let wanted = self.wanted();
        let mut load: BTreeMap<String, u32> = BTreeMap::new();
        let mut ample = true;
        for id in &eligible {
            let w = &self.workers[id];
            ample &= w.max_load as usize >= wanted.len();
        }
        for t in &wanted {
            let holders = self.sup.holders_of(t);
            let distinct: BTreeSet<_> = holders.iter().collect();
            assert_eq!(distinct.len(), holders.len(), "seed {seed}: {t} held twice by one worker");
            for h in &holders {
                assert!(
                    eligible.contains(h),
                    "seed {seed}: {t} held by {h}, not an eligible worker"
                );
                *load.entry(h.clone()).or_default() += 1;
                if !self.stalled.contains(t) {
                    assert!(
                        self.workers[h].started_at.contains_key(t),
                        "seed {seed}: {h} is assigned {t} but does not run it"
                    );
                }
            }
            let expect = (self.redundancy as usize).min(eligible.len());
            let short = self.sup.shortfalls().find(|s| s.task == t.to_string());
            if ample {
                assert_eq!(
                    holders.len(),
                    expect,
                    "seed {seed}: {t} has {holders:?} of {eligible:?}"
                );
            }
            if holders.len() < self.redundancy as usize {
                let s = short.unwrap_or_else(|| panic!("seed {seed}: {t} short but not reported"));
                assert_eq!(s.missing as usize, self.redundancy as usize - holders.len());
                if holders.len() >= expect {
                    assert_eq!(s.cause, ShortCause::FewWorkers, "seed {seed}: {t}");
                }
            } else {
                assert!(short.is_none(), "seed {seed}: {t} fully held but reported short");
            }
        }
        for (id, n) in &load {
            assert!(*n <= self.workers[id].max_load, "seed {seed}: {id} over its max load");
        }
        // nothing runs that nobody wants, on a live worker
        for (id, w) in &self.workers {
            if w.alive && !w.leaving {
                for t in w.started_at.keys() {
                    assert!(
                        self.sup.holders_of(t).contains(id),
                        "seed {seed}: {id} runs {t}, which is not assigned to it"
                    );
                }
            }
        }
    }
}

#[test]
fn warm_up_then_reset_assignment_with_redundancy() {
    let mut w = World::new(1, 2);
    for i in 0..3 {
        w.add_worker(&format!("w{i}"), 10);
    }
    w.listed = (0..6).map(|i| task(TaskKind::Kline, i)).collect();
    w.run(4);
    assert!(w.sent.is_empty(), "nothing is assigned during the warm-up");
    assert!(!w.sup.is_running());
    w.run(2);
    assert!(w.sup.is_running());
    assert!(w.sent.iter().all(|s| s.reset), "the first assignment is a reset");
    w.run(2);
    w.check_settled(1);
    let report = w.sup.report(w.now, usize::MAX);
    assert_eq!(report.workers.iter().map(|w| w.running).sum::<u32>(), 12);
}

fn listed_now(w: &mut World, tasks: impl IntoIterator<Item = TaskId>) {
    w.listed = tasks.into_iter().collect();
    let tasks: Vec<TaskId> = w.listed.iter().cloned().collect();
    let now = w.now;
    w.sup.handle_task_list(now, &tasks, false);
}

#[test]
fn quotas_follow_the_seed_formula() {
    let mut w = World::new(2, 1);
    w.add_worker("a", 10);
    w.add_worker("b", 30);
    w.run(8);
    // 8 tasks × redundancy 1 × weights 10/40 and 30/40 → quotas 2 and 6, exactly met
    listed_now(&mut w, (0..8).map(|i| task(TaskKind::Depth, i)));
    let placement = w.sup.last_placement().clone();
    assert_eq!(placement.quotas["a"], (2, 2));
    assert_eq!(placement.quotas["b"], (6, 6));
    assert_eq!(placement.beyond_quota, 0);
    w.drain_outputs();
    w.check_settled(2);
}

#[test]
fn distinct_holders_go_beyond_quota_within_max_load_and_the_rest_is_reported_short() {
    let mut w = World::new(2, 2);
    w.add_worker("a", 5);
    w.add_worker("b", 30);
    w.run(8);
    // 8 tasks × 2 × weights 5/35 and 30/35 → quotas ceil(2.29) = 3 and ceil(13.7) = 14. Every
    // task needs both workers: a takes 3 within its quota, 2 beyond it (its max load is 5),
    // and 3 tasks stay one replica short for lack of capacity.
    listed_now(&mut w, (0..8).map(|i| task(TaskKind::Depth, i)));
    let placement = w.sup.last_placement().clone();
    assert_eq!(placement.quotas["a"], (3, 3));
    assert_eq!(placement.quotas["b"], (14, 8));
    assert_eq!(placement.beyond_quota, 2);
    let short: Vec<_> = w.sup.shortfalls().cloned().collect();
    assert_eq!(short.len(), 3, "{short:?}");
    assert!(short.iter().all(|s| s.cause == ShortCause::NoCapacity && s.missing == 1));
    let record = w.sup.report(w.now, usize::MAX).events.pop().unwrap();
    assert_eq!((record.added, record.unassigned), (13, 3));
    w.drain_outputs();
    w.check_settled(2);
    // capacity appears: the shortfall is placed at once
    w.workers.get_mut("a").unwrap().max_load = 8;
    w.step();
    assert_eq!(w.sup.shortfalls().count(), 0);
    w.check_settled(2);
}

#[test]
fn removes_free_capacity_before_adds_in_one_event() {
    let mut w = World::new(3, 1);
    w.add_worker("a", 2);
    w.listed = [task(TaskKind::Kline, 0), task(TaskKind::Kline, 1)].into();
    w.run(8);
    w.check_settled(3);
    let before = w.sent.len();
    // one task out, one in: the worker is full, so the add fits only because the end came first
    listed_now(&mut w, [task(TaskKind::Kline, 0), task(TaskKind::Kline, 2)]);
    w.drain_outputs();
    let set = &w.sent[before];
    assert_eq!(set.end, vec![task(TaskKind::Kline, 1)]);
    assert_eq!(set.add, vec![task(TaskKind::Kline, 2)]);
    assert_eq!(w.sup.shortfalls().count(), 0);
    w.check_settled(3);
}

#[test]
fn a_dead_worker_is_detected_within_one_tick_of_its_timeout() {
    let mut w = World::new(4, 2);
    for i in 0..3 {
        w.add_worker(&format!("w{i}"), 10);
    }
    w.listed = (0..5).map(|i| task(TaskKind::Kline, i)).collect();
    w.run(8);
    w.check_settled(4);
    let last_status = w.now;
    w.workers.get_mut("w1").unwrap().alive = false;
    while w.sup.is_active("w1") {
        w.step();
        assert!(w.now <= last_status + 10_000 + TICK, "w1 still active at {}", w.now);
    }
    assert!(w.now >= last_status + 10_000, "w1 timed out early at {}", w.now);
    w.check_settled(4);
}

#[test]
fn a_draining_worker_hands_over_at_once() {
    let mut w = World::new(5, 2);
    for i in 0..3 {
        w.add_worker(&format!("w{i}"), 10);
    }
    w.listed = (0..6).map(|i| task(TaskKind::Depth, i)).collect();
    w.run(8);
    let held = w.sup.tasks_of("w2");
    assert!(!held.is_empty());
    w.workers.get_mut("w2").unwrap().leaving = true;
    w.step(); // its next status says it is leaving: reassigned in the same tick
    assert!(w.sup.tasks_of("w2").is_empty());
    assert!(w.workers["w2"].started_at.is_empty(), "the leaving worker was told to end its tasks");
    w.check_settled(5);
}

#[test]
fn a_silent_task_is_reassigned_after_the_task_timeout() {
    let mut w = World::new(6, 1);
    w.add_worker("a", 10);
    w.add_worker("b", 10);
    w.listed = (0..4).map(|i| task(TaskKind::Kline, i)).collect();
    w.run(8);
    let t = task(TaskKind::Kline, 2);
    let first = w.sup.holders_of(&t);
    assert_eq!(first.len(), 1);
    w.stalled.insert(t.clone());
    let stalled_at = w.now;
    while w.sup.holders_of(&t) == first {
        w.step();
        assert!(w.now <= stalled_at + 8_000 + 2 * TICK, "not reassigned at {}", w.now);
    }
    assert_ne!(w.sup.holders_of(&t), first, "moved to the other worker");
}

#[test]
fn with_no_change_no_work_is_done() {
    let mut w = World::new(7, 2);
    for i in 0..4 {
        w.add_worker(&format!("w{i}"), 50);
    }
    w.listed = (0..40).map(|i| task(TaskKind::Kline, i)).collect();
    w.run(10);
    let before = w.sup.stats();
    let sent = w.sent.len();
    w.run(300);
    let after = w.sup.stats();
    assert_eq!(after.assignments, before.assignments);
    assert_eq!(after.instructions_sent, before.instructions_sent);
    assert_eq!(w.sent.len(), sent);
    // the timer checks each key about once per timeout period, not per message
    let checks = after.timer_checks - before.timer_checks;
    let keys = 4 + 80; // workers + holds
    assert!(checks <= keys * 300 / 8 + keys, "{checks} timer checks in 300 ticks");
}

#[test]
fn a_new_leader_keeps_every_healthy_session() {
    let mut w = World::new(8, 2);
    for i in 0..3 {
        w.add_worker(&format!("w{i}"), 20);
    }
    w.listed = (0..12).map(|i| task(TaskKind::Depth, i)).collect();
    w.run(10);
    w.check_settled(8);
    let starts: u64 = w.workers.values().map(|x| x.starts).sum();
    let stops: u64 = w.workers.values().map(|x| x.stops).sum();
    // the leader dies; the standby (collecting statuses all along) takes over with epoch 2
    std::mem::swap(&mut w.sup, &mut w.standby);
    w.standby.resign();
    w.epoch += 1;
    let now = w.now;
    w.sup.set_leader(now, w.epoch);
    w.drain_outputs();
    w.run(3);
    assert!(w.sup.is_running());
    assert!(w.sent.iter().any(|s| s.epoch == 2 && s.reset));
    assert_eq!(w.workers.values().map(|x| x.starts).sum::<u64>(), starts, "no session restarted");
    assert_eq!(w.workers.values().map(|x| x.stops).sum::<u64>(), stops, "no session stopped");
    w.check_settled(8);
}

/// Random joins, deaths, restarts, drains, demand and task-list changes, stalls and leader
/// changes; after each burst the cluster settles and every invariant holds.
#[test]
fn random_histories_keep_every_invariant() {
    for seed in 0..60u64 {
        let redundancy = 1 + (seed % 3) as u32;
        let mut w = World::new(seed, redundancy);
        let n0 = 2 + w.rng.below(4);
        for i in 0..n0 {
            let load = 4 + w.rng.below(30) as u32;
            w.add_worker(&format!("w{i}"), load);
        }
        let mut next_worker = n0;
        w.listed = (0..w.rng.below(20) as u32).map(|i| task(TaskKind::Kline, i)).collect();
        w.run(8);
        w.check_settled(seed);
        for _round in 0..12 {
            for _ in 0..1 + w.rng.below(3) {
                match w.rng.below(9) {
                    0 => {
                        let load = 1 + w.rng.below(40) as u32;
                        w.add_worker(&format!("w{next_worker}"), load);
                        next_worker += 1;
                    }
                    1 => {
                        // kill -9
                        let ids: Vec<String> = w.eligible().into_iter().collect();
                        if ids.len() > 1 {
                            let id = &ids[w.rng.below(ids.len() as u64) as usize];
                            w.workers.get_mut(id).unwrap().alive = false;
                        }
                    }
                    2 => {
                        // restart under the same id: a new instance with no sessions
                        let ids: Vec<String> = w.eligible().into_iter().collect();
                        let id = ids[w.rng.below(ids.len() as u64) as usize].clone();
                        let load = w.workers[&id].max_load;
                        w.add_worker(&id, load);
                    }
                    3 => {
                        let ids: Vec<String> = w.eligible().into_iter().collect();
                        if ids.len() > 1 {
                            let id = &ids[w.rng.below(ids.len() as u64) as usize];
                            w.workers.get_mut(id).unwrap().leaving = true;
                        }
                    }
                    4 => {
                        let g = format!("g{}", w.rng.below(3));
                        let set = (0..w.rng.below(8) as u32)
                            .map(|_| task(TaskKind::Depth, w.rng.below(12) as u32))
                            .collect();
                        w.demand.insert(g, set);
                    }
                    5 => {
                        let k = w.rng.below(25) as u32;
                        listed_now(&mut w, (0..k).map(|i| task(TaskKind::Kline, i)));
                    }
                    6 => {
                        let g = format!("g{}", w.rng.below(3));
                        w.demand.remove(&g); // the gateway dies: its demand times out
                    }
                    7 => {
                        // leader fail-over
                        std::mem::swap(&mut w.sup, &mut w.standby);
                        w.standby.resign();
                        w.epoch += 1;
                        let (now, epoch) = (w.now, w.epoch);
                        w.sup.set_leader(now, epoch);
                    }
                    _ => {
                        // raise a worker's max load (capacity appears)
                        let ids: Vec<String> = w.eligible().into_iter().collect();
                        let id = ids[w.rng.below(ids.len() as u64) as usize].clone();
                        w.workers.get_mut(&id).unwrap().max_load += 5;
                    }
                }
            }
            w.drain_outputs();
            // settle: dead workers and dead gateways time out (10 s), the warm-up of a new
            // leader ends, every instruction set is applied and reported
            w.run(14);
            w.check_settled(seed);
        }
    }
}

#[test]
fn a_short_status_counts_only_for_the_list_it_stands_for() {
    let mut w = World::new(7, 1);
    w.add_worker("w1", 10);
    listed_now(&mut w, [task(TaskKind::Kline, 1)]);
    w.run(5);
    let before = w.sup.report(w.now, 10);
    let held = before.tasks[0].workers.clone();
    assert_eq!(held, vec!["w1".to_string()]);
    // A short status of a list version the supervisor never saw: a sign of life, nothing else
    // (its ages are not taken, its missing task list does not read as "dropped everything").
    let sim = &w.workers["w1"];
    let who = Identity { worker: "w1".into(), instance: sim.instance, max_load: sim.max_load };
    let mut short = sim.tasks.short_status(&who, false, |_| Some(0));
    short.list += 7;
    short.ages = Some(Vec::new());
    w.now += TICK;
    w.sup.handle_status(w.now, &short);
    let r = w.sup.report(w.now, 10);
    assert_eq!(r.workers[0].last_seen_ms, 0, "seen alive");
    assert_eq!(r.tasks[0].workers, held, "nothing reassigned");
    assert_eq!(
        r.supervisor.stats.assignments,
        w.sup.report(w.now, 10).supervisor.stats.assignments
    );
}
