//! Jittered exponential backoff (no shared state, no RNG dependency), shared by the fleet
//! supervisor (failing spokes) and the credential cache (rejected credentials), so neither
//! reaches into the other's module for it.

use std::hash::{BuildHasher, Hasher};
use std::time::Duration;

/// Backoff bounds.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct BackoffOptions {
    /// Delay after the first failure (before jitter).
    pub initial: Duration,
    /// Upper bound of the delay (before jitter).
    pub max: Duration,
}

impl Default for BackoffOptions {
    fn default() -> Self {
        Self {
            initial: Duration::from_secs(1),
            max: Duration::from_secs(300),
        }
    }
}

/// A random factor in `[0.5, 1.0)` from the std hasher's per-instance random keys.
fn jitter_factor() -> f64 {
    let mut h = std::collections::hash_map::RandomState::new().build_hasher();
    h.write_u64(0x006b_6c65_796d);
    let bits = h.finish() >> 11; // 53 random bits
    0.5 + (bits as f64 / (1u64 << 53) as f64) * 0.5
}

impl BackoffOptions {
    /// Delay before retry number `failures` (1 = first failure): `initial * 2^(failures-1)`,
    /// capped at `max`, times a random factor in `[0.5, 1)` ("equal jitter") so that spokes
    /// failing together do not retry together.
    pub fn delay(&self, failures: u32) -> Duration {
        let exp = failures.saturating_sub(1).min(20);
        let base = self
            .initial
            .saturating_mul(1u32 << exp)
            .min(self.max.max(self.initial));
        base.mul_f64(jitter_factor())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn grows_is_capped_and_jittered() {
        let b = BackoffOptions {
            initial: Duration::from_millis(100),
            max: Duration::from_secs(1),
        };
        for n in 1..30 {
            let d = b.delay(n);
            let cap =
                Duration::from_millis(100 * (1u64 << (n - 1).min(20))).min(Duration::from_secs(1));
            assert!(d >= cap / 2 && d < cap, "failure {n}: {d:?} vs {cap:?}");
        }
        // Jitter: not every draw is the same.
        let draws: std::collections::BTreeSet<_> = (0..20).map(|_| b.delay(3)).collect();
        assert!(draws.len() > 1);
    }
}
