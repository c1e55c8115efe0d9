//! Flow control: a token bucket that delays work over the rate instead of
//! dropping it (mpush manual, section 6.6).

use std::time::Duration;

use parking_lot::Mutex;
use tokio::time::Instant;

pub struct RateLimiter {
    rate: f64,
    burst: f64,
    state: Mutex<(f64, Instant)>,
}

impl RateLimiter {
    /// `rate` per second, with a burst of one second's worth.
    pub fn new(rate: u32) -> Self {
        let rate = f64::from(rate.max(1));
        Self {
            rate,
            burst: rate,
            state: Mutex::new((rate, Instant::now())),
        }
    }

    /// Takes `n` tokens, waiting once (for the whole deficit) when there are
    /// not enough: work over the rate is delayed in large slices, so waiting
    /// costs nothing per message.
    pub async fn acquire(&self, n: usize) {
        let wait = {
            let mut s = self.state.lock();
            let now = Instant::now();
            let refill = now.saturating_duration_since(s.1).as_secs_f64() * self.rate;
            s.0 = (s.0 + refill).min(self.burst);
            s.1 = now;
            s.0 -= n as f64;
            if s.0 >= 0.0 {
                return;
            }
            Duration::from_secs_f64(-s.0 / self.rate)
        };
        metrics::counter!("mpush_flow_control_waits_total").increment(1);
        tokio::time::sleep(wait).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn over_the_rate_work_waits() {
        let l = RateLimiter::new(10);
        let t0 = Instant::now();
        for _ in 0..30 {
            l.acquire(1).await;
        }
        // 10 from the burst, then 20 at 10/s.
        let took = t0.elapsed();
        // In slices: one wait per slice, the same rate.
        let t1 = Instant::now();
        for _ in 0..4 {
            l.acquire(5).await;
        }
        let slices = t1.elapsed();
        assert!(
            slices >= Duration::from_millis(1900) && slices <= Duration::from_millis(2100),
            "{slices:?}"
        );
        assert!(took >= Duration::from_millis(1900) && took <= Duration::from_millis(2100));
    }
}
