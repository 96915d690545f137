//! [`ReadQueue`]: reads queue for a store's read connections on the runtime, before they take a
//! blocking thread.
//!
//! A store's calls are blocking and run on tokio's blocking threads (at most 512). A read that
//! found every read connection busy used to wait on one of those threads (SQLite) or open a
//! connection of its own (PostgreSQL), so a flood of anonymous `GET /api/v1/klines` could take
//! every blocking thread, and every connection PostgreSQL allows. Through [`super::read`], a read
//! first waits here for one of as many permits as the store has read connections — an async
//! wait, in FIFO order, holding no thread — and fails after `wait` with
//! [`StoreError::Busy`] naming the key that sizes the connections.

use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::{OwnedSemaphorePermit, Semaphore};

use super::StoreError;

/// The queue of a store's reads (see the module documentation).
#[derive(Debug)]
pub struct ReadQueue {
    permits: Arc<Semaphore>,
    size: usize,
    wait: Duration,
    /// What is full, for the error: `the PostgreSQL store`, a SQLite file.
    location: String,
    /// The configuration key that sizes the read connections.
    key: &'static str,
    refused: AtomicU64,
}

impl ReadQueue {
    /// `size` reads at once (at least one), a read waiting at most `wait`.
    pub fn new(size: usize, wait: Duration, location: String, key: &'static str) -> Self {
        let size = size.max(1);
        ReadQueue {
            permits: Arc::new(Semaphore::new(size)),
            size,
            wait,
            location,
            key,
            refused: AtomicU64::new(0),
        }
    }

    /// Waits for a permit (held until dropped), at most the store's bound.
    pub async fn enter(&self) -> Result<OwnedSemaphorePermit, StoreError> {
        match tokio::time::timeout(self.wait, self.permits.clone().acquire_owned()).await {
            Ok(Ok(permit)) => Ok(permit),
            // (the semaphore is never closed)
            Ok(Err(_)) | Err(_) => {
                self.refused.fetch_add(1, Relaxed);
                Err(self.busy())
            }
        }
    }

    /// The error of a read that waited too long.
    pub fn busy(&self) -> StoreError {
        StoreError::Busy {
            location: self.location.clone(),
            what: "read",
            connections: self.size,
            waited: self.wait,
            key: self.key,
        }
    }

    /// Reads refused since start (`millrace_store_reads_refused_total`).
    pub fn refused(&self) -> u64 {
        self.refused.load(Relaxed)
    }

    /// Reads admitted now.
    pub fn in_use(&self) -> usize {
        self.size - self.permits.available_permits()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Reads beyond the permits wait on the runtime, in order, and one that waits too long is
    /// refused with the key named and counted.
    #[tokio::test(start_paused = true)]
    async fn reads_beyond_the_permits_wait_then_are_refused_naming_the_key() {
        let a = Arc::new(ReadQueue::new(2, Duration::from_secs(10), "db".into(), "store.x"));
        let (p1, p2) = (a.enter().await.unwrap(), a.enter().await.unwrap());
        assert_eq!(a.in_use(), 2);
        let waiting = tokio::spawn({
            let a = a.clone();
            async move { a.enter().await }
        });
        tokio::time::sleep(Duration::from_secs(5)).await;
        drop(p1);
        let p3 = waiting.await.unwrap().expect("admitted when a permit came back");
        let e = a.enter().await.unwrap_err();
        assert!(matches!(e, StoreError::Busy { connections: 2, key: "store.x", .. }), "{e:?}");
        assert!(e.to_string().contains("raise store.x"), "{e}");
        assert_eq!(a.refused(), 1);
        drop((p2, p3));
        assert_eq!(a.in_use(), 0);
    }
}
