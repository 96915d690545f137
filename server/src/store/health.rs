//! [`StoreHealth`]: what a store's own calls ran into lately, for [`super::CandleStore::problems`]
//! and so for `/healthz`. Both stores keep one: SQLite and PostgreSQL fail in different ways, but
//! a failing write, a failed read and corrupt data mean the same to an operator.

use std::sync::Mutex;
use std::time::Duration;

use super::StoreError;
use crate::lock::lock;

/// How long a failed read keeps the store reported in `/healthz` after it failed.
pub const READ_FAILURE_SHOWN: Duration = Duration::from_secs(60);

/// A store's recent failures.
#[derive(Debug)]
pub struct StoreHealth {
    /// Where the store is (a file, a URL without its password), for the log and the report.
    location: String,
    /// What to do about corrupt data, for the report.
    remedy: &'static str,
    state: Mutex<State>,
}

#[derive(Debug, Default)]
struct State {
    /// The first error that said the stored data is damaged: reported until the process ends
    /// (damaged data does not heal).
    corrupt: Option<String>,
    /// Since when (wall-clock ms) writes fail, and the last error; cleared by a write that
    /// commits.
    write_failing: Option<(i64, String)>,
    /// When (wall-clock ms) a read last failed, and why; cleared by a read that succeeds, and
    /// shown for at most [`READ_FAILURE_SHOWN`].
    read_failed: Option<(i64, String)>,
}

impl StoreHealth {
    /// No failures yet, of the store at `location`; `remedy` is what to do about corrupt data.
    pub fn new(location: String, remedy: &'static str) -> Self {
        StoreHealth { location, remedy, state: Mutex::default() }
    }

    /// Notes a failed read or write; `corrupt` when the error says the stored data is damaged.
    pub fn failed(&self, write: bool, corrupt: bool, e: &StoreError) {
        let now = crate::clock::wall_clock_ms();
        let why = crate::error::report(e);
        let mut h = lock(&self.state);
        if corrupt && h.corrupt.is_none() {
            tracing::error!(store = self.location, error = %why, "the store is corrupt");
            h.corrupt = Some(why.clone());
        }
        if write {
            let since = h.write_failing.as_ref().map_or(now, |(t, _)| *t);
            h.write_failing = Some((since, why));
        } else {
            h.read_failed = Some((now, why));
        }
    }

    /// Notes a read that succeeded: reads are no longer failing.
    pub fn read(&self) {
        lock(&self.state).read_failed = None;
    }

    /// Notes a write that committed: writes are no longer failing.
    pub fn wrote(&self) {
        if let Some((since, _)) = lock(&self.state).write_failing.take() {
            let secs = (crate::clock::wall_clock_ms() - since) / 1000;
            tracing::info!(store = self.location, "store writes succeed again after {secs} s");
        }
    }

    /// What is wrong with the store now, one sentence each.
    pub fn problems(&self) -> Vec<String> {
        let (location, remedy) = (&self.location, self.remedy);
        let now = crate::clock::wall_clock_ms();
        let h = lock(&self.state);
        let mut out = Vec::new();
        if let Some(why) = &h.corrupt {
            out.push(format!("the store {location} is corrupt ({why}); {remedy}"));
        }
        if let Some((since, why)) = &h.write_failing {
            let secs = (now - since).max(0) / 1000;
            out.push(format!(
                "writes to the store {location} have failed for {secs} s ({why}); closed \
                 candles are kept and written again"
            ));
        }
        if let Some((at, why)) = &h.read_failed {
            let ago = Duration::from_millis(u64::try_from(now - at).unwrap_or(0));
            if ago < READ_FAILURE_SHOWN {
                out.push(format!(
                    "a read of the store {location} failed {} s ago ({why})",
                    ago.as_secs()
                ));
            }
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn err() -> StoreError {
        StoreError::Corrupt { table: "candles", detail: "a negative volume".into() }
    }

    #[test]
    fn failures_are_reported_until_they_clear() {
        let h = StoreHealth::new("db".into(), "restore it");
        assert!(h.problems().is_empty());
        h.failed(true, false, &err());
        h.failed(false, false, &err());
        let p = h.problems();
        assert_eq!(p.len(), 2, "{p:?}");
        assert!(p[0].starts_with("writes to the store db have failed for 0 s"), "{p:?}");
        assert!(p[1].starts_with("a read of the store db failed 0 s ago"), "{p:?}");
        h.wrote();
        assert_eq!(h.problems().len(), 1, "reads still failing");
        h.read();
        assert!(h.problems().is_empty());
        h.failed(false, true, &err());
        h.read();
        let p = h.problems();
        assert_eq!(p.len(), 1, "corrupt data stays reported: {p:?}");
        assert!(p[0].starts_with("the store db is corrupt (") && p[0].ends_with("; restore it"));
    }
}
