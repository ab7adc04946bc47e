//! The caller's circuit breakers, one per target pool (askpool-proto's
//! [`CircuitBreaker`] driven with the node's clock).
//!
//! An ask takes a permit when it starts; while its pool's breaker is open it
//! fails at once with `Unavailable` and sends nothing. Its final outcome is
//! reported on the permit: success, a failure (the breaker decides which
//! codes count), or a release when the caller cancelled.

use askpool_proto::breaker::{breaker_code, counts_as_failure};
use askpool_proto::{
    AskError, BreakerConfig, BreakerPermit, BreakerState, CircuitBreaker, PoolName, Timestamp,
};
use parking_lot::Mutex;

use crate::telemetry;
use rustc_hash::FxHashMap;

/// A snapshot of one pool's breaker.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct BreakerStats {
    pub pool: String,
    pub state: BreakerState,
    /// Times it opened (from closed, or again from half-open).
    pub trips: u64,
    /// Asks it failed fast.
    pub rejections: u64,
}

/// Most breakers a node keeps. A breaker exists only for a pool that gave an
/// outcome that counts (a success, or a failure that counts), so names of
/// pools that never existed (`NoRoute`) create none; past this many, a closed
/// breaker makes room.
pub(crate) const MAX_BREAKERS: usize = 4_096;

pub(crate) struct Breakers {
    config: Option<BreakerConfig>,
    by_pool: Mutex<FxHashMap<PoolName, CircuitBreaker>>,
}

/// How an ask ended, for its breaker.
pub(crate) enum Verdict<'a> {
    Success,
    Failure(&'a AskError),
    /// The caller gave up: neither success nor failure.
    Release,
}

impl Breakers {
    pub(crate) fn new(config: Option<BreakerConfig>) -> Result<Self, AskError> {
        if let Some(config) = &config {
            config.validate()?;
        }
        Ok(Self {
            config,
            by_pool: Mutex::default(),
        })
    }

    /// A permit to ask `pool`: `Ok(None)` when breakers are off or the pool
    /// has no breaker yet (it never failed: it is closed).
    pub(crate) fn acquire(
        &self,
        pool: &PoolName,
        now: Timestamp,
    ) -> Result<Option<BreakerPermit>, AskError> {
        if self.config.is_none() {
            return Ok(None);
        }
        match self.by_pool.lock().get_mut(pool) {
            Some(breaker) => {
                // An Open breaker whose time is up turns HalfOpen here, not
                // in `report`: its gauge is told here too.
                let generation = breaker.generation();
                let permit = breaker.try_acquire(now);
                if breaker.generation() != generation {
                    telemetry::breaker_state(pool.as_str(), breaker.state(now));
                }
                permit.map(Some)
            }
            None => Ok(None),
        }
    }

    pub(crate) fn report(
        &self,
        pool: &PoolName,
        permit: Option<BreakerPermit>,
        verdict: Verdict<'_>,
        now: Timestamp,
    ) {
        let Some(config) = self.config else {
            return;
        };
        let mut by_pool = self.by_pool.lock();
        let permit = match permit {
            Some(permit) => permit,
            // The ask started before its pool had a breaker (or breakers
            // are new to it): its outcome counts all the same.
            None => {
                if !by_pool.contains_key(pool) {
                    // Successes create it as failures do, or the window would
                    // miss every success before the first failure; outcomes
                    // that do not count (NoRoute, ...) create nothing.
                    let counts = match verdict {
                        Verdict::Success => true,
                        Verdict::Failure(error) => {
                            let code = breaker_code(error);
                            counts_as_failure(code) || config.open_on.contains(code)
                        }
                        Verdict::Release => false,
                    };
                    if !counts {
                        return;
                    }
                    if by_pool.len() >= MAX_BREAKERS {
                        let closed = by_pool
                            .iter()
                            .find(|(_, b)| b.state(now) == BreakerState::Closed)
                            .map(|(name, _)| name.clone());
                        match closed {
                            Some(name) => {
                                by_pool.remove(&name);
                            }
                            None => return,
                        }
                    }
                    by_pool.insert(
                        pool.clone(),
                        CircuitBreaker::new(pool.clone(), config)
                            .expect("config validated at start"),
                    );
                }
                let breaker = by_pool.get_mut(pool).expect("present or just inserted");
                // Open or probing: an outcome from before does not count. It
                // must not take a probe slot either (`try_acquire` would
                // move an Open breaker whose time is up to HalfOpen and
                // count this old outcome as its probe).
                if breaker.state(now) != BreakerState::Closed {
                    return;
                }
                match breaker.try_acquire(now) {
                    Ok(permit) => permit,
                    Err(_) => return,
                }
            }
        };
        let Some(breaker) = by_pool.get_mut(pool) else {
            return;
        };
        let step = match verdict {
            Verdict::Success => breaker.on_success(permit, now),
            Verdict::Failure(error) => breaker.on_failure(permit, breaker_code(error), now),
            Verdict::Release => breaker.release(permit),
        };
        if let Some(transition) = step.transition {
            telemetry::breaker_state(pool.as_str(), transition.to);
            tracing::info!(pool = %pool, from = ?transition.from, to = ?transition.to, "circuit breaker");
        }
    }

    #[cfg(test)]
    pub(crate) fn len(&self) -> usize {
        self.by_pool.lock().len()
    }

    pub(crate) fn stats(&self, now: Timestamp) -> Vec<BreakerStats> {
        let mut stats: Vec<_> = self
            .by_pool
            .lock()
            .values()
            .map(|b| BreakerStats {
                pool: b.pool().to_string(),
                state: b.state(now),
                trips: b.trips(),
                rejections: b.rejections(),
            })
            .collect();
        stats.sort_by(|a, b| a.pool.cmp(&b.pool));
        stats
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_breaker_map_is_bounded() {
        let breakers = Breakers::new(Some(BreakerConfig::default())).unwrap();
        let failure = AskError::internal("down");
        for i in 0..MAX_BREAKERS + 500 {
            let pool = PoolName::new(format!("pool-{i}"));
            breakers.report(&pool, None, Verdict::Failure(&failure), Timestamp::ZERO);
        }
        assert_eq!(breakers.len(), MAX_BREAKERS);
        // Uncounted outcomes never create one; a success does.
        let fresh = Breakers::new(Some(BreakerConfig::default())).unwrap();
        let pool = PoolName::new("p");
        let mismatch = AskError::PayloadMismatch;
        fresh.report(&pool, None, Verdict::Failure(&mismatch), Timestamp::ZERO);
        fresh.report(&pool, None, Verdict::Release, Timestamp::ZERO);
        assert_eq!(fresh.len(), 0);
        fresh.report(&pool, None, Verdict::Success, Timestamp::ZERO);
        assert_eq!(fresh.len(), 1);
    }
}
