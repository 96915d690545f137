//! The simulated exchange (being written).
