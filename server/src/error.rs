//! Errors across the service: each module has its own `thiserror` enum, keeping a cause as its
//! `source` (not repeated in its message); where an error is shown to a person — a log line, a
//! job's `last_error`, an API answer — [`report`] prints it with its causes.

use std::fmt::Write as _;

/// `error: cause: cause's cause …`, the whole chain on one line.
pub fn report(error: &(dyn std::error::Error + 'static)) -> String {
    let mut out = error.to_string();
    let mut cause = error.source();
    while let Some(c) = cause {
        let _ = write!(out, ": {c}");
        cause = c.source();
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::StoreError;

    #[test]
    fn the_chain_is_printed_once() {
        let io = std::io::Error::other("disk I/O error");
        let e = StoreError::db("data/millrace.db", io);
        assert_eq!(e.to_string(), "data/millrace.db");
        assert_eq!(report(&e), "data/millrace.db: disk I/O error");
    }
}
