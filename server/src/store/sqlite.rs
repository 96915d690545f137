//! SQLite implementation of [`super::CandleStore`] (being written).
