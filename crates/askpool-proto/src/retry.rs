//! Retry policy and exponential backoff with jitter (seed 004, SW4RM
//! RetryPolicy). Jitter takes its randomness from the caller, so a seeded RNG
//! gives the same schedule every run.

use std::time::Duration;

use rand_core::RngCore;

use crate::error::{AskError, CodeSet, ErrorClass};

/// How a caller re-sends a request that has not been acknowledged.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct RetryPolicy {
    /// Total sends, the first included. 1 disables retries.
    pub max_attempts: u32,
    /// Delay before the first re-send.
    pub initial_delay: Duration,
    /// Growth factor of the delay from one re-send to the next.
    pub multiplier: f64,
    /// Cap on the delay (before jitter).
    pub max_delay: Duration,
    /// Relative jitter: each delay is scaled by a factor in `[1 - jitter, 1 + jitter)`.
    pub jitter: f64,
    /// Error codes worth another attempt: a send that failed with one, or a
    /// reply carrying one, is re-sent while attempts and time remain.
    /// Default: the Transient class of the taxonomy.
    pub retryable: CodeSet,
}

impl Default for RetryPolicy {
    /// Seed 004's numbers: three retries after the first send, 1 s doubling to
    /// a 5 s cap, ±20 % jitter.
    fn default() -> Self {
        Self {
            max_attempts: 4,
            initial_delay: Duration::from_secs(1),
            multiplier: 2.0,
            max_delay: Duration::from_secs(5),
            jitter: 0.2,
            retryable: CodeSet::class(ErrorClass::Transient),
        }
    }
}

impl RetryPolicy {
    /// A policy that sends once and never re-sends.
    pub fn no_retry() -> Self {
        Self {
            max_attempts: 1,
            ..Self::default()
        }
    }

    /// Checks the policy's numbers, so a bad policy fails where it is built.
    pub fn validate(&self) -> Result<(), AskError> {
        let bad = |message: &str| {
            Err(AskError::InvalidArgument {
                message: format!("retry policy: {message}"),
            })
        };
        if self.max_attempts == 0 {
            return bad("max_attempts must be at least 1");
        }
        if !(self.multiplier.is_finite() && self.multiplier >= 1.0) {
            return bad("multiplier must be a finite number >= 1");
        }
        if !(self.jitter.is_finite() && (0.0..1.0).contains(&self.jitter)) {
            return bad("jitter must be in [0, 1)");
        }
        if self.max_delay < self.initial_delay {
            return bad("max_delay must not be below initial_delay");
        }
        Ok(())
    }

    pub fn is_retryable(&self, error: &AskError) -> bool {
        self.retryable.contains(error.code())
    }

    /// The delay before send number `attempt` (2 = first re-send), before jitter.
    #[inline]
    pub fn base_delay(&self, attempt: u32) -> Duration {
        let exponent = attempt.saturating_sub(2).min(1024) as i32;
        let secs = self.initial_delay.as_secs_f64() * self.multiplier.powi(exponent);
        let capped = secs.min(self.max_delay.as_secs_f64());
        duration_from_secs(capped)
    }

    /// The delay before send number `attempt`, with jitter drawn from `rng`.
    #[inline]
    pub fn delay(&self, attempt: u32, rng: &mut dyn RngCore) -> Duration {
        let base = self.base_delay(attempt).as_secs_f64();
        // 53 random bits -> uniform in [0, 1), then to [-1, 1).
        let unit = (rng.next_u64() >> 11) as f64 / (1u64 << 53) as f64;
        let factor = 1.0 + self.jitter * (2.0 * unit - 1.0);
        duration_from_secs(base * factor)
    }
}

/// `secs` (finite or not, never below zero) as a `Duration`, to the nearest
/// nanosecond: a float-to-integer cast saturates where
/// `Duration::from_secs_f64` would panic, and costs a tenth of it (every ask
/// computes its first re-send delay).
fn duration_from_secs(secs: f64) -> Duration {
    Duration::from_nanos((secs.max(0.0) * 1e9).round() as u64)
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::SeedableRng;

    #[test]
    fn delays_grow_then_cap() {
        let p = RetryPolicy::default();
        let secs: Vec<f64> = (2..=6).map(|a| p.base_delay(a).as_secs_f64()).collect();
        assert_eq!(secs, vec![1.0, 2.0, 4.0, 5.0, 5.0]);
    }

    #[test]
    fn jitter_stays_in_bounds_and_is_seeded() {
        let p = RetryPolicy::default();
        let mut a = rand::rngs::SmallRng::seed_from_u64(7);
        let mut b = rand::rngs::SmallRng::seed_from_u64(7);
        let mut seen_low = false;
        let mut seen_high = false;
        for _ in 0..1000 {
            let d = p.delay(3, &mut a);
            assert_eq!(d, p.delay(3, &mut b));
            let s = d.as_secs_f64();
            assert!((1.6..2.4).contains(&s), "{s}");
            seen_low |= s < 1.8;
            seen_high |= s > 2.2;
        }
        assert!(seen_low && seen_high, "jitter never spread");
    }

    #[test]
    fn validate_refuses_bad_numbers() {
        let ok = RetryPolicy::default();
        assert!(ok.validate().is_ok());
        for bad in [
            RetryPolicy {
                max_attempts: 0,
                ..ok
            },
            RetryPolicy {
                multiplier: 0.5,
                ..ok
            },
            RetryPolicy { jitter: 1.5, ..ok },
            RetryPolicy {
                jitter: f64::NAN,
                ..ok
            },
            RetryPolicy {
                max_delay: Duration::ZERO,
                ..ok
            },
        ] {
            assert!(bad.validate().is_err(), "{bad:?}");
        }
    }
}
