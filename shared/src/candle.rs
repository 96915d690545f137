//! Candles: timeframes, UTC bucket alignment, 1m -> derived merging, flush batches.
//! (Being written; see issue 1/4.)
