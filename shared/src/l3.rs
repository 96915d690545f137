//! Tick-by-tick (L3) order book. (Being written; see issue 1/4.)
