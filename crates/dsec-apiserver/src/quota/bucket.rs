//! A token bucket: `rate` tokens a second, holding at most `rate` (bursts
//! of one second's worth), so over any window of t seconds at most
//! `rate * (t + 1)` calls pass.

use std::time::Instant;

#[derive(Debug, Clone)]
pub struct Bucket {
    tokens: f64,
    at: Instant,
}

impl Bucket {
    /// A full bucket.
    pub fn full(rate: u64, now: Instant) -> Bucket {
        Bucket { tokens: rate as f64, at: now }
    }

    fn refill(&mut self, rate: u64, now: Instant) {
        let dt = now.saturating_duration_since(self.at).as_secs_f64();
        self.tokens = (self.tokens + dt * rate as f64).min(rate as f64);
        self.at = now;
    }

    /// Whether `n` tokens are there now (without taking them).
    pub fn has(&mut self, n: u64, rate: u64, now: Instant) -> bool {
        self.refill(rate, now);
        self.tokens >= n as f64
    }

    /// Takes `n` tokens; call only after `has` said yes at `now`.
    pub fn take(&mut self, n: u64) {
        self.tokens -= n as f64;
    }

    /// Tokens taken and not yet refilled, for `project show`.
    pub fn in_use(&mut self, rate: u64, now: Instant) -> f64 {
        self.refill(rate, now);
        (rate as f64 - self.tokens).max(0.0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn a_bucket_passes_its_rate_and_a_burst_of_one_second() {
        let t0 = Instant::now();
        let mut b = Bucket::full(3, t0);
        let mut passed = 0;
        for _ in 0..10 {
            if b.has(1, 3, t0) {
                b.take(1);
                passed += 1;
            }
        }
        assert_eq!(passed, 3, "the burst");
        assert!(!b.has(1, 3, t0 + Duration::from_millis(300)), "0.9 of a token after 300 ms");
        assert!(b.has(1, 3, t0 + Duration::from_millis(334)));
        assert!(b.has(1, 3, t0 + Duration::from_secs(100)));
        assert_eq!(b.in_use(3, t0 + Duration::from_secs(100)), 0.0, "never more than full");
    }
}
