//! Stopping: one mechanism for every task and thread of the service.
//!
//! A [`Shutdown`] is a part of the service that can be stopped: a `CancellationToken` its tasks
//! and threads watch, and a `TaskTracker` that knows when they have all ended. Parts nest: a
//! [`Shutdown::child`] is stopped with its parent or on its own (a job, a backfill run), and the
//! parent's [`Shutdown::stopped`] waits for its children's tasks too. Nothing in the service
//! calls `tokio::spawn` or `std::thread::spawn` itself (a tidy test checks): everything runs
//! through [`Shutdown::spawn`], [`Shutdown::spawn_until_stopped`] or
//! [`Shutdown::spawn_thread`], so a stopped service leaves no task or thread behind.
//!
//! The order in which parts stop is the composition root's (`App::stop`).

use std::future::Future;
use std::time::Duration;

use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

/// A stoppable part of the service. Cheap to clone; clones are the same part.
#[derive(Clone, Debug, Default)]
pub struct Shutdown {
    token: CancellationToken,
    tracker: TaskTracker,
}

impl Shutdown {
    /// The root of a service.
    pub fn new() -> Self {
        Self::default()
    }

    /// A part of this part: stopped when this one is, or alone with its own [`Shutdown::stop`].
    /// This part's [`Shutdown::stopped`] waits for the child's tasks as well.
    pub fn child(&self) -> Shutdown {
        let child = Shutdown { token: self.token.child_token(), tracker: TaskTracker::new() };
        let (token, tracker) = (child.token.clone(), child.tracker.clone());
        // Once the child is stopped (by itself or with us), wait for its tasks inside our own
        // tracker, so our `stopped` includes them.
        self.tracker.spawn(async move {
            token.cancelled().await;
            tracker.close();
            tracker.wait().await;
        });
        child
    }

    /// The token this part's tasks and threads watch.
    pub fn token(&self) -> &CancellationToken {
        &self.token
    }

    /// Whether this part has been asked to stop.
    pub fn is_stopping(&self) -> bool {
        self.token.is_cancelled()
    }

    /// Completes when this part is asked to stop. Cancel safe.
    pub async fn stopping(&self) {
        self.token.cancelled().await;
    }

    /// Runs `task` on the current runtime as a part of this one. The task must end by itself
    /// soon after [`Shutdown::stopping`] completes (it owns its cleanup: a final flush, a close
    /// frame).
    pub fn spawn<F>(&self, task: F) -> JoinHandle<F::Output>
    where
        F: Future + Send + 'static,
        F::Output: Send + 'static,
    {
        self.tracker.spawn(task)
    }

    /// Runs `task` until it ends or this part is asked to stop, whichever is first (for loops
    /// with nothing to clean up: timers, retries, pumps).
    pub fn spawn_until_stopped<F>(&self, task: F) -> JoinHandle<()>
    where
        F: Future<Output = ()> + Send + 'static,
    {
        let token = self.token.clone();
        self.tracker.spawn(async move {
            tokio::select! {
                () = token.cancelled() => {}
                () = task => {}
            }
        })
    }

    /// Runs `body` on an OS thread named `name` as a part of this one; it gets the token and
    /// must return soon after it is cancelled.
    pub fn spawn_thread<F>(
        &self,
        name: String,
        body: F,
    ) -> std::io::Result<std::thread::JoinHandle<()>>
    where
        F: FnOnce(CancellationToken) + Send + 'static,
    {
        let token = self.token.clone();
        let alive = self.tracker.token();
        std::thread::Builder::new().name(name).spawn(move || {
            let _alive = alive;
            body(token);
        })
    }

    /// A guard that counts as a running task of this part while it lives: for work that runs in
    /// a task someone else spawned (a WebSocket session axum runs after the upgrade), so that
    /// [`Shutdown::stopped`] waits for it too.
    pub fn guard(&self) -> tokio_util::task::task_tracker::TaskTrackerToken {
        self.tracker.token()
    }

    /// Asks every task and thread of this part (and of its children) to stop; returns at once.
    pub fn stop(&self) {
        self.token.cancel();
    }

    /// Asks this part to stop and waits until all its tasks and threads (its children's too)
    /// have ended, at most `timeout`. Returns whether they all did.
    pub async fn stopped(&self, timeout: Duration) -> bool {
        self.stop();
        self.tracker.close();
        tokio::time::timeout(timeout, self.tracker.wait()).await.is_ok()
    }

    /// Tasks and threads of this part still running (children count as one each).
    pub fn running(&self) -> usize {
        self.tracker.len()
    }
}

/// Completes on Ctrl-C or SIGTERM: the process's request to stop.
pub async fn signal() {
    let ctrl_c = async {
        if let Err(e) = tokio::signal::ctrl_c().await {
            tracing::error!("cannot listen for Ctrl-C: {e}");
            std::future::pending::<()>().await;
        }
    };
    #[cfg(unix)]
    let term = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut s) => {
                s.recv().await;
            }
            Err(e) => {
                tracing::error!("cannot listen for SIGTERM: {e}");
                std::future::pending::<()>().await;
            }
        }
    };
    #[cfg(not(unix))]
    let term = std::future::pending::<()>();
    tokio::select! {
        () = ctrl_c => {},
        () = term => {},
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::sync::Arc;

    #[tokio::test]
    async fn stopped_waits_for_tasks_threads_and_children() {
        let root = Shutdown::new();
        let done = Arc::new(AtomicBool::new(false));
        let flushed = done.clone();
        root.spawn({
            let s = root.clone();
            async move {
                s.stopping().await;
                tokio::time::sleep(Duration::from_millis(50)).await; // a final flush
                flushed.store(true, Ordering::SeqCst);
            }
        });
        let child = root.child();
        let thread_done = Arc::new(AtomicBool::new(false));
        let t = thread_done.clone();
        child
            .spawn_thread("test".into(), move |token| {
                while !token.is_cancelled() {
                    std::thread::sleep(Duration::from_millis(5));
                }
                t.store(true, Ordering::SeqCst);
            })
            .unwrap();
        root.spawn_until_stopped(std::future::pending());
        assert!(root.stopped(Duration::from_secs(5)).await);
        assert!(done.load(Ordering::SeqCst) && thread_done.load(Ordering::SeqCst));
        assert_eq!(root.running(), 0);
    }

    #[tokio::test]
    async fn a_child_stops_alone_and_a_stuck_task_times_out() {
        let root = Shutdown::new();
        let job = root.child();
        job.spawn_until_stopped(std::future::pending());
        assert!(job.stopped(Duration::from_secs(1)).await);
        assert!(!root.is_stopping(), "stopping a child leaves its parent running");
        root.spawn(std::future::pending::<()>()); // ignores the token
        assert!(!root.stopped(Duration::from_millis(50)).await);
    }
}
