//! Deterministic helpers for tests and benchmarks on every target (including wasm32, where
//! OS randomness and threads are not available). Not used by production code paths.

/// A small, fast, seedable PRNG (xorshift64*), so randomised tests replay exactly by seed.
#[derive(Debug, Clone)]
pub struct Rng(u64);

impl Rng {
    pub fn new(seed: u64) -> Self {
        // splitmix64 of the seed, never zero
        let mut z = seed.wrapping_add(0x9E37_79B9_7F4A_7C15);
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        Self((z ^ (z >> 31)) | 1)
    }

    #[inline]
    pub fn next_u64(&mut self) -> u64 {
        let mut x = self.0;
        x ^= x >> 12;
        x ^= x << 25;
        x ^= x >> 27;
        self.0 = x;
        x.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }

    /// Uniform in `0..n` (n > 0).
    #[inline]
    pub fn below(&mut self, n: u64) -> u64 {
        ((self.next_u64() >> 32) * n) >> 32
    }

    /// True with probability `num / den`.
    #[inline]
    pub fn chance(&mut self, num: u64, den: u64) -> bool {
        self.below(den) < num
    }

    /// A distance from the top of book, skewed towards 0 the way real update streams are:
    /// roughly half of all updates land in the top 5 levels, with a long tail out to `max`.
    #[inline]
    pub fn top_skewed(&mut self, max: u64) -> u64 {
        let r = self.below(1000);
        let d = match r {
            0..=499 => self.below(5),
            500..=799 => 5 + self.below(20),
            800..=949 => 25 + self.below(100),
            _ => self.below(max.max(1)),
        };
        d.min(max.saturating_sub(1))
    }
}
