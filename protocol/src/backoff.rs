//! Exponential backoff with jitter for reconnects (1 s to 60 s, ±20 % by default).

use std::time::Duration;

use crate::crypto::Rng;

#[derive(Debug, Clone, PartialEq)]
pub struct BackoffConfig {
    pub initial: Duration,
    pub max: Duration,
    pub multiplier: f64,
    /// Fraction of the delay added or removed at random: 0.2 means ±20 %.
    pub jitter: f64,
}

impl Default for BackoffConfig {
    fn default() -> Self {
        Self {
            initial: Duration::from_secs(1),
            max: Duration::from_secs(60),
            multiplier: 2.0,
            jitter: 0.2,
        }
    }
}

#[derive(Debug, Clone)]
pub struct Backoff {
    config: BackoffConfig,
    attempt: u32,
}

impl Backoff {
    pub fn new(config: BackoffConfig) -> Self {
        Self { config, attempt: 0 }
    }

    /// Failed attempts since the last reset.
    pub fn attempt(&self) -> u32 {
        self.attempt
    }

    /// The delay before the next attempt, jittered, and counts the attempt.
    pub fn next_delay(&mut self, rng: &mut Rng) -> Duration {
        let base = self.base_delay();
        self.attempt = self.attempt.saturating_add(1);
        let unit = rand_core::Rng::next_u64(rng) as f64 / u64::MAX as f64; // [0, 1]
        let factor = 1.0 + self.config.jitter * (2.0 * unit - 1.0);
        base.mul_f64(factor.max(0.0))
    }

    /// The un-jittered delay of the next attempt.
    pub fn base_delay(&self) -> Duration {
        let exp = self
            .config
            .multiplier
            .powi(self.attempt.min(64) as i32)
            .min(1e9);
        self.config.initial.mul_f64(exp).min(self.config.max)
    }

    /// Back to the initial delay (after a success, or when the network is back).
    pub fn reset(&mut self) {
        self.attempt = 0;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand_core::SeedableRng;

    #[test]
    fn grows_caps_jitters_and_resets() {
        let mut rng = Rng::seed_from_u64(3);
        let mut b = Backoff::new(BackoffConfig::default());
        let expected = [1u64, 2, 4, 8, 16, 32, 60, 60, 60];
        for want in expected {
            let d = b.next_delay(&mut rng).as_secs_f64();
            let w = want as f64;
            assert!(d >= w * 0.8 && d <= w * 1.2, "{d} not within 20% of {w}");
        }
        b.reset();
        assert_eq!(b.base_delay(), Duration::from_secs(1));
    }

    #[test]
    fn jitter_spreads_delays() {
        let mut rng = Rng::seed_from_u64(9);
        let delays: Vec<Duration> = (0..50)
            .map(|_| {
                let mut b = Backoff::new(BackoffConfig::default());
                b.next_delay(&mut rng)
            })
            .collect();
        let min = delays.iter().min().expect("some");
        let max = delays.iter().max().expect("some");
        assert!(*max - *min > Duration::from_millis(200), "{min:?}..{max:?}");
    }
}
