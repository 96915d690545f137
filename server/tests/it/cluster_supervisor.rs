//! The supervisor role over the machine's real NATS (JetStream on), each test under its own
//! subject prefix and lease bucket: two supervisors (one leads), workers that speak the
//! protocol (status out, instruction sets in, applied with `WorkerTasks`), a killed worker's
//! tasks reassigned, and the leader's loss taken over by the standby with no session restarted.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use futures_util::StreamExt as _;
use server::cluster::supervisor;
use server::cluster::Subjects;
use server::config::ClusterConfig;
use server::shutdown::Shutdown;
use shared::cluster::worker::{Identity, WorkerTasks};
use shared::cluster::{Instructions, TaskId, TaskKind};
use shared::protocol::ops::{ClusterReport, SupervisorState};
use shared::protocol::{InstrumentId, Market};

fn nats_url() -> String {
    std::env::var("MILLRACE_TEST_NATS").unwrap_or_else(|_| "nats://127.0.0.1:4222".into())
}

fn prefix(tag: &str) -> String {
    format!("t{}_{tag}_{}", std::process::id(), Instant::now().elapsed().as_nanos() % 1000)
}

async fn client() -> async_nats::Client {
    async_nats::connect(nats_url()).await.expect("NATS at 127.0.0.1:4222 (run scripts/services)")
}

fn cluster_config() -> ClusterConfig {
    ClusterConfig {
        enabled: true,
        warmup_s: 1,
        tick_ms: 100,
        status_interval_ms: 100,
        worker_timeout_s: 2,
        task_timeout_s: 5,
        redundancy: 2,
        lease_s: 2,
        instruments: (0..4)
            .map(|i| InstrumentId::new("sim", Market::Spot, format!("S{i}/USDT")))
            .collect(),
        kinds: TaskKind::ALL.to_vec(),
        ..ClusterConfig::default()
    }
}

/// A worker that speaks the protocol: its sessions are the set its instruction sets name.
struct TestWorker {
    tasks: Arc<Mutex<WorkerTasks>>,
    /// Session starts and stops, per task.
    starts: Arc<Mutex<BTreeMap<TaskId, u32>>>,
    stops: Arc<Mutex<BTreeMap<TaskId, u32>>>,
    stop: Shutdown,
}

impl TestWorker {
    async fn start(id: &str, max_load: u32, subjects: &Subjects) -> TestWorker {
        let nats = client().await;
        let tasks = Arc::new(Mutex::new(WorkerTasks::new()));
        let starts = Arc::new(Mutex::new(BTreeMap::<TaskId, u32>::new()));
        let stops = Arc::new(Mutex::new(BTreeMap::<TaskId, u32>::new()));
        let stop = Shutdown::new();
        let mut instr = nats.subscribe(subjects.instructions(id)).await.unwrap();
        {
            let (tasks, starts, stops) = (tasks.clone(), starts.clone(), stops.clone());
            stop.spawn_until_stopped(async move {
                while let Some(m) = instr.next().await {
                    let set: Instructions = serde_json::from_slice(&m.payload).unwrap();
                    let change = tasks.lock().unwrap().apply(&set);
                    if let Some(change) = change {
                        for t in change.stop {
                            *stops.lock().unwrap().entry(t).or_default() += 1;
                        }
                        for t in change.start {
                            *starts.lock().unwrap().entry(t).or_default() += 1;
                        }
                    }
                }
            });
        }
        {
            let (tasks, subject, id) = (tasks.clone(), subjects.status(), id.to_string());
            let instance = rand_instance();
            stop.spawn_until_stopped(async move {
                let mut every = tokio::time::interval(Duration::from_millis(100));
                loop {
                    every.tick().await;
                    let status = {
                        let t = tasks.lock().unwrap();
                        let who = Identity { worker: id.clone(), instance, max_load };
                        t.status(&who, false, |_| Some(0))
                    };
                    let body = serde_json::to_vec(&status).unwrap();
                    nats.publish(subject.clone(), body.into()).await.unwrap();
                }
            });
        }
        TestWorker { tasks, starts, stops, stop }
    }

    fn wanted(&self) -> Vec<TaskId> {
        self.tasks.lock().unwrap().wanted().iter().cloned().collect()
    }

    fn restarts(&self) -> (u32, u32) {
        (self.starts.lock().unwrap().values().sum(), self.stops.lock().unwrap().values().sum())
    }
}

fn rand_instance() -> u64 {
    use std::hash::{BuildHasher as _, Hasher as _};
    let mut h = std::collections::hash_map::RandomState::new().build_hasher();
    h.write_u64(Instant::now().elapsed().as_nanos() as u64);
    h.finish()
}

/// Every task held by exactly `n` distinct workers of `workers`.
fn held(workers: &[&TestWorker], tasks: &[TaskId], n: usize) -> bool {
    tasks.iter().all(|t| workers.iter().filter(|w| w.wanted().contains(t)).count() == n)
}

async fn wait_for(what: &str, within: Duration, mut ok: impl FnMut() -> bool) -> Duration {
    let t0 = Instant::now();
    while !ok() {
        assert!(t0.elapsed() < within, "{what}: not within {within:?}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    t0.elapsed()
}

async fn report(nats: &async_nats::Client, subjects: &Subjects) -> Option<ClusterReport> {
    let m = tokio::time::timeout(
        Duration::from_secs(1),
        nats.request(subjects.report(), bytes::Bytes::new()),
    )
    .await
    .ok()?
    .ok()?;
    serde_json::from_slice(&m.payload).ok()
}

fn start_supervisor(
    id: &str,
    nats: async_nats::Client,
    subjects: &Subjects,
    cluster: &ClusterConfig,
) -> (Shutdown, tokio::task::JoinHandle<()>) {
    let stop = Shutdown::new();
    let (subjects, cluster, id, token) =
        (subjects.clone(), cluster.clone(), id.to_string(), stop.clone());
    let handle = tokio::spawn(async move {
        supervisor::run(nats, subjects, cluster, None, id, token).await.unwrap();
    });
    (stop, handle)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn assigns_reassigns_a_dead_worker_and_fails_over_without_restarts() {
    let subjects = Subjects::new(&prefix("sup"));
    let _streams = testkit::ClusterStreams::new(&nats_url(), &subjects.prefix);
    let cluster = cluster_config();
    let tasks = cluster.pinned_tasks();
    assert_eq!(tasks.len(), 8);
    let w: Vec<TestWorker> = futures_util::future::join_all(
        ["w1", "w2", "w3"].iter().map(|id| TestWorker::start(id, 10, &subjects)),
    )
    .await;
    let (stop1, s1) = start_supervisor("s1", client().await, &subjects, &cluster);
    tokio::time::sleep(Duration::from_millis(300)).await;
    let (stop2, s2) = start_supervisor("s2", client().await, &subjects, &cluster);
    let nats = client().await;

    // warm-up (1 s), then every task on 2 distinct workers
    let all: Vec<&TestWorker> = w.iter().collect();
    wait_for("first assignment", Duration::from_secs(5), || held(&all, &tasks, 2)).await;
    let r = report(&nats, &subjects).await.expect("the leader answers");
    assert_eq!(r.supervisor.state, SupervisorState::Running);
    assert_eq!(r.supervisor.leader.as_deref(), Some("s1"));
    assert_eq!(r.workers.len(), 3);
    assert!(r.tasks.iter().all(|t| t.workers.len() == 2), "{:?}", r.tasks);
    assert!(r.unassigned.is_empty());

    // steady state: no assignment event while nothing changes
    let before = report(&nats, &subjects).await.unwrap().supervisor.stats;
    tokio::time::sleep(Duration::from_secs(2)).await;
    let after = report(&nats, &subjects).await.unwrap().supervisor.stats;
    assert_eq!(after.assignments, before.assignments);
    assert_eq!(after.instructions_sent, before.instructions_sent);
    assert!(after.statuses > before.statuses);

    // kill a worker: its tasks move to the other two within worker_timeout + 2 ticks
    w[2].stop.stop();
    w[2].stop.stopped(Duration::from_secs(1)).await;
    let live = [&w[0], &w[1]];
    let took = wait_for("reassignment", Duration::from_millis(2000 + 200 + 1500), || {
        held(&live, &tasks, 2)
    })
    .await;
    assert!(took <= Duration::from_millis(2000 + 200 + 1000), "{took:?}");

    // the leader dies without a word: the standby takes over once the lease ages out, and no
    // healthy session is stopped or restarted
    let counts: Vec<(u32, u32)> = live.iter().map(|w| w.restarts()).collect();
    s1.abort();
    drop(stop1);
    let t0 = Instant::now();
    loop {
        let r = report(&nats, &subjects).await;
        if r.is_some_and(|r| r.supervisor.leader.as_deref() == Some("s2")) {
            break;
        }
        assert!(t0.elapsed() < Duration::from_secs(8), "the standby did not take over");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert!(held(&live, &tasks, 2));
    let r = report(&nats, &subjects).await.unwrap();
    assert_eq!(r.supervisor.state, SupervisorState::Running);
    assert!(r.supervisor.epoch > 0);
    let now: Vec<(u32, u32)> = live.iter().map(|w| w.restarts()).collect();
    assert_eq!(now, counts, "sessions restarted by the fail-over");
    stop2.stop();
    stop2.stopped(Duration::from_secs(2)).await;
    let _ = s2.await;
}
