//! Book sync state machine (being written).
