//! Browser wire protocol (being written).
