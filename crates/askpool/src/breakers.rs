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
use std::sync::Arc;

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
    by_pool: Mutex<FxHashMap<PoolName, Arc<Mutex<Held>>>>,
}

/// One pool's breaker as the map holds it. An ask keeps the handle with
/// its permit ([`Permit`]) and reports its outcome straight to it, without
/// looking its pool up again, while the breaker is still the map's own for
/// that pool (`removed` unset).
struct Held {
    breaker: CircuitBreaker,
    /// Taken out of the map (it made room for another pool's): a report on
    /// a permit it issued goes through the map, as if never held.
    removed: bool,
}

/// A pool's circuit-breaker permit, with the breaker that issued it.
pub(crate) struct Permit {
    permit: BreakerPermit,
    breaker: Arc<Mutex<Held>>,
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
    #[inline]
    pub(crate) fn acquire(
        &self,
        pool: &PoolName,
        now: Timestamp,
    ) -> Result<Option<Permit>, AskError> {
        if self.config.is_none() {
            return Ok(None);
        }
        // The map's lock, then the breaker's (the order everywhere).
        let by_pool = self.by_pool.lock();
        let Some(held) = by_pool.get(pool) else {
            return Ok(None);
        };
        let mut guard = held.lock();
        let breaker = &mut guard.breaker;
        // An Open breaker whose time is up turns HalfOpen here, not in
        // `report`: its gauge is told here too.
        let generation = breaker.generation();
        let permit = breaker.try_acquire(now);
        if breaker.generation() != generation {
            telemetry::breaker_state(pool.as_str(), breaker.state(now));
        }
        let permit = permit?;
        Ok(Some(Permit {
            permit,
            breaker: Arc::clone(held),
        }))
    }

    #[inline]
    pub(crate) fn report(
        &self,
        pool: &PoolName,
        permit: Option<Permit>,
        verdict: Verdict<'_>,
        now: Timestamp,
    ) {
        let Some(config) = self.config else {
            return;
        };
        let permit = match permit {
            Some(Permit { permit, breaker }) => {
                // The breaker that issued the permit, while the map still
                // holds it for `pool` (a removal marks it under this lock):
                // the one the map would give.
                let mut held = breaker.lock();
                if !held.removed {
                    Self::apply(pool, &mut held.breaker, permit, verdict, now);
                    return;
                }
                Some(permit)
            }
            None => None,
        };
        let mut by_pool = self.by_pool.lock();
        // The ask started before its pool had a breaker (or breakers are
        // new to it): its outcome counts all the same.
        if permit.is_none() && !by_pool.contains_key(pool) {
            // Successes create it as failures do, or the window would miss
            // every success before the first failure; outcomes that do not
            // count (NoRoute, ...) create nothing.
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
                    .find(|(_, b)| b.lock().breaker.state(now) == BreakerState::Closed)
                    .map(|(name, _)| name.clone());
                match closed {
                    Some(name) => {
                        if let Some(gone) = by_pool.remove(&name) {
                            gone.lock().removed = true;
                        }
                    }
                    None => return,
                }
            }
            let breaker =
                CircuitBreaker::new(pool.clone(), config).expect("config validated at start");
            let held = Held {
                breaker,
                removed: false,
            };
            by_pool.insert(pool.clone(), Arc::new(Mutex::new(held)));
        }
        let Some(held) = by_pool.get(pool) else {
            return;
        };
        let mut held = held.lock();
        let breaker = &mut held.breaker;
        let permit = match permit {
            Some(permit) => permit,
            None => {
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
        Self::apply(pool, breaker, permit, verdict, now);
    }

    /// Reports `verdict` on `permit` to `breaker`, `pool`'s.
    fn apply(
        pool: &PoolName,
        breaker: &mut CircuitBreaker,
        permit: BreakerPermit,
        verdict: Verdict<'_>,
        now: Timestamp,
    ) {
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
            .map(|held| {
                let b = &held.lock().breaker;
                BreakerStats {
                    pool: b.pool().to_string(),
                    state: b.state(now),
                    trips: b.trips(),
                    rejections: b.rejections(),
                }
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
