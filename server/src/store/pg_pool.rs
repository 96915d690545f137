//! [`Pool`]: every connection the PostgreSQL store opens, at most `store.pg_pool_size`, in two
//! lanes so that reads never starve writes.
//!
//! - **Writes** ([`WRITE_LANE`] connections): the store's transactions, the reads a write needs
//!   (the newest stored minutes and the minutes of the buckets it merges:
//!   `CandleStore::last_open_times`, `candles_in`), the health check and the catalogue's
//!   refresh — the service's own work, so a flood of anonymous reads can delay none of it. Three:
//!   the persister writes a large round as two transactions at once, and backfill or the health
//!   check takes the third.
//! - **Reads**: the rest (`store.pg_pool_size` − 3), for everything else (the REST API's candles,
//!   a kline job's resume, backfill progress). The REST API's reads queue before they take a
//!   blocking thread ([`super::admission`]).
//!
//! A connection is opened when a lane first needs one more and kept; a call that finds its lane's
//! connections all busy waits for one (up to a bound: [`READ_WAIT`], [`WRITE_WAIT`]), then fails
//! with [`StoreError::Busy`] naming the key. A connection found closed, or that failed in a way
//! that may have left it unusable, is dropped and its place given to the next caller, who opens
//! a new one: a PostgreSQL restart costs each call made while it is down an error, never the
//! process.

use std::sync::{Condvar, Mutex};
use std::time::{Duration, Instant};

use postgres::Client;

use super::StoreError;
use crate::lock::{lock, wait_timeout};

/// Connections of the write lane.
pub const WRITE_LANE: usize = crate::config::cluster::PG_WRITE_LANE as usize;
/// `store.pg_pool_size` unless configured: 3 for writes and 5 for reads. A PostgreSQL server
/// allows 100 connections by default (`max_connections`, 3 of them kept for superusers), shared
/// by every gateway and worker of a cluster. Connections are opened as needed: a worker only
/// reads its kline tasks' resume points and holds one or two, so three gateways at their bound
/// (24) and twenty workers stay well below it.
pub const POOL_SIZE: usize = crate::config::cluster::PG_POOL_SIZE as usize;
/// The least `store.pg_pool_size`: the write lane and one read connection.
pub const MIN_POOL_SIZE: usize = crate::config::cluster::PG_MIN_POOL_SIZE as usize;
/// How long a read waits for a connection before it fails with [`StoreError::Busy`] (as the
/// SQLite store's readers).
pub const READ_WAIT: Duration = Duration::from_secs(10);
/// How long a write waits (the persister's rounds can take seconds); it is then retried by its
/// caller with back-off.
pub const WRITE_WAIT: Duration = Duration::from_secs(30);

/// A lane of the pool (see the module documentation).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Lane {
    Reads,
    Writes,
}

impl Lane {
    fn index(self) -> usize {
        match self {
            Lane::Reads => 0,
            Lane::Writes => 1,
        }
    }

    fn name(self) -> &'static str {
        match self {
            Lane::Reads => "read",
            Lane::Writes => "write",
        }
    }

    fn wait(self) -> Duration {
        match self {
            Lane::Reads => READ_WAIT,
            Lane::Writes => WRITE_WAIT,
        }
    }
}

/// The connections of one lane.
#[derive(Default)]
struct LaneState {
    idle: Vec<Client>,
    /// Open connections, idle and in use, plus places taken to open one.
    open: usize,
}

/// The store's connections (see the module documentation).
pub struct Pool {
    lanes: Mutex<[LaneState; 2]>,
    /// Signalled when a lane's connection is returned or its place freed.
    freed: [Condvar; 2],
    caps: [usize; 2],
}

/// What [`Pool::take`] found.
pub enum Slot {
    /// An idle connection.
    Idle(Box<Client>),
    /// A free place: open a connection, or give the place back with [`Pool::release`].
    Open,
    /// The lane's connections all stayed busy.
    Busy,
}

impl Pool {
    /// A pool of `size` connections (at least [`MIN_POOL_SIZE`]).
    pub fn new(size: usize) -> Self {
        let size = size.max(MIN_POOL_SIZE);
        Pool {
            lanes: Mutex::new(Default::default()),
            freed: [Condvar::new(), Condvar::new()],
            caps: [size - WRITE_LANE, WRITE_LANE],
        }
    }

    /// Connections `lane` may hold.
    pub fn cap(&self, lane: Lane) -> usize {
        self.caps[lane.index()]
    }

    /// An idle connection of `lane`, or a place to open one, waiting up to the lane's bound.
    pub fn take(&self, lane: Lane) -> Slot {
        let (i, deadline) = (lane.index(), Instant::now() + lane.wait());
        let mut lanes = lock(&self.lanes);
        loop {
            if let Some(client) = lanes[i].idle.pop() {
                return Slot::Idle(Box::new(client));
            }
            if lanes[i].open < self.caps[i] {
                lanes[i].open += 1;
                return Slot::Open;
            }
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return Slot::Busy;
            }
            lanes = wait_timeout(&self.freed[i], lanes, left);
        }
    }

    /// Returns a connection of `lane` to its idle list.
    pub fn give_back(&self, lane: Lane, client: Client) {
        lock(&self.lanes)[lane.index()].idle.push(client);
        self.freed[lane.index()].notify_one();
    }

    /// Frees the place of a connection of `lane` that was dropped (broken, closed) or never
    /// opened.
    pub fn release(&self, lane: Lane) {
        let mut lanes = lock(&self.lanes);
        lanes[lane.index()].open = lanes[lane.index()].open.saturating_sub(1);
        drop(lanes);
        self.freed[lane.index()].notify_one();
    }

    /// Takes every idle connection (to close them) and forgets them.
    pub fn drain(&self) -> Vec<Client> {
        let mut lanes = lock(&self.lanes);
        let mut out = Vec::new();
        for lane in lanes.iter_mut() {
            lane.open -= lane.idle.len();
            out.append(&mut lane.idle);
        }
        out
    }

    /// Open connections of each lane (reads, writes).
    pub fn open(&self) -> (usize, usize) {
        let lanes = lock(&self.lanes);
        (lanes[0].open, lanes[1].open)
    }

    /// The error of a call of `lane` that waited too long.
    pub fn busy(&self, lane: Lane) -> StoreError {
        StoreError::Busy {
            location: "the PostgreSQL store".into(),
            what: lane.name(),
            connections: self.cap(lane),
            waited: lane.wait(),
            key: "store.pg_pool_size",
        }
    }
}

/// A connection in use; returned to its lane when dropped (also if the call panicked), unless it
/// is closed or was [`PoolLease::discard`]ed.
pub struct PoolLease<'a> {
    client: Option<Client>,
    lane: Lane,
    pool: &'a Pool,
}

impl<'a> PoolLease<'a> {
    pub fn new(pool: &'a Pool, lane: Lane, client: Client) -> Self {
        PoolLease { client: Some(client), lane, pool }
    }

    pub fn client(&mut self) -> &mut Client {
        self.client.as_mut().expect("a lease holds its connection until dropped")
    }

    /// Drops the connection (it may be unusable) and frees its place.
    pub fn discard(mut self) {
        drop(self.client.take());
        self.pool.release(self.lane);
    }
}

impl Drop for PoolLease<'_> {
    fn drop(&mut self) {
        if let Some(client) = self.client.take() {
            if client.is_closed() {
                drop(client);
                self.pool.release(self.lane);
            } else {
                self.pool.give_back(self.lane, client);
            }
        }
    }
}
