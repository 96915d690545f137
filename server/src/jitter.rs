//! [`Jitter`]: the randomness of the one back-off (`shared::backoff::Backoff` takes it as an
//! argument), for every retry loop of the service.

use rand::{RngCore as _, SeedableRng as _};

/// Randomness for back-off jitter: seeded per job from the clock, the process and a salt (the
/// instrument), so jobs that failed together do not retry in lockstep.
pub struct Jitter(rand::rngs::SmallRng);

impl Jitter {
    pub fn new(salt: &str) -> Self {
        let mut seed = crate::clock::wall_clock_ms().unsigned_abs() ^ u64::from(std::process::id());
        for b in salt.bytes() {
            seed = seed.rotate_left(7) ^ u64::from(b);
        }
        Jitter(rand::rngs::SmallRng::seed_from_u64(seed))
    }

    /// The next jitter value for `Backoff::next_delay`.
    pub fn draw(&mut self) -> u32 {
        self.0.next_u32()
    }
}
