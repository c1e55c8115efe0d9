//! Flow control: work over the rate is delayed, not dropped (mpush manual,
//! section 6.6), with governor's GCRA limiter.

use std::num::NonZeroU32;

use governor::{DefaultDirectRateLimiter, Quota};

pub struct RateLimiter {
    limiter: DefaultDirectRateLimiter,
    /// The most one wait may take at once (the burst: one second's worth).
    burst: NonZeroU32,
}

impl RateLimiter {
    /// `rate` per second, with a burst of one second's worth.
    pub fn new(rate: u32) -> Self {
        let burst = NonZeroU32::new(rate.max(1)).unwrap_or(NonZeroU32::MIN);
        Self {
            limiter: DefaultDirectRateLimiter::direct(Quota::per_second(burst)),
            burst,
        }
    }

    /// Takes `n` tokens, waiting when there are not enough: work over the
    /// rate is delayed in slices as large as the burst, so waiting costs
    /// nothing per message.
    pub async fn acquire(&self, n: usize) {
        let mut left = n;
        let mut waited = false;
        while left > 0 {
            let slice = u32::try_from(left)
                .unwrap_or(u32::MAX)
                .min(self.burst.get());
            let cells = NonZeroU32::new(slice).unwrap_or(NonZeroU32::MIN);
            // Within the burst by construction, so only "not yet": wait on
            // tokio's timer for the time governor names, then take them.
            while let Ok(Err(not_until)) = self.limiter.check_n(cells) {
                waited = true;
                let now = governor::clock::Clock::now(self.limiter.clock());
                tokio::time::sleep(not_until.wait_time_from(now)).await;
            }
            left -= slice as usize;
        }
        if waited {
            metrics::counter!("mpush_flow_control_waits_total").increment(1);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::{Duration, Instant};

    #[tokio::test]
    async fn over_the_rate_work_waits() {
        let l = RateLimiter::new(1000);
        let t0 = Instant::now();
        // 1000 from the burst, then 500 more at 1000/s.
        for _ in 0..1500 {
            l.acquire(1).await;
        }
        let took = t0.elapsed();
        assert!(
            took >= Duration::from_millis(450) && took <= Duration::from_millis(1500),
            "{took:?}"
        );
        // In slices, and larger than the burst: the same rate.
        let t1 = Instant::now();
        l.acquire(1500).await;
        let slices = t1.elapsed();
        assert!(
            slices >= Duration::from_millis(1400) && slices <= Duration::from_millis(2500),
            "{slices:?}"
        );
    }
}
