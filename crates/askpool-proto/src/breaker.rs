//! A circuit breaker for one target pool (DESIGN section 4, seed 002), sans-IO.
//!
//! The caller asks the breaker before each send ([`CircuitBreaker::try_acquire`])
//! and reports the outcome of every permit it got, exactly once
//! ([`CircuitBreaker::on_success`], [`CircuitBreaker::on_failure`] or
//! [`CircuitBreaker::release`]). Time is an argument; nothing here reads a
//! clock or spawns a timer: the Open -> HalfOpen move happens lazily, on the
//! first `try_acquire` at or after the open period's end.
//!
//! # States
//!
//! | state / event | `try_acquire`                                   | counted success                          | counted failure                                   | not counted / `release` |
//! |---------------|-------------------------------------------------|------------------------------------------|---------------------------------------------------|-------------------------|
//! | Closed        | permit                                          | into the window                          | into the window; -> Open if the window trips (1)  | nothing                 |
//! | Open          | `now < until`: `Unavailable`; else -> HalfOpen  | — (no permit exists: stale)              | — (stale)                                         | — (stale)               |
//! | HalfOpen      | permit if fewer than `half_open_probes` in flight, else `Unavailable` | probe slot freed; `half_open_probes` successes -> Closed (2) | -> Open again for `open_for`            | probe slot freed        |
//!
//! (1) The window trips when, over the sliding window, `requests >=
//! min_requests` and `failures / requests >= failure_rate`; or at once, on any
//! failure whose code is in [`BreakerConfig::open_on`].
//! (2) Successes are consecutive by construction: any counted failure while
//! HalfOpen re-opens the breaker. Closing resets the window.
//!
//! # What counts
//!
//! [`counts_as_failure`] decides, from the [`ErrorCode`] only:
//!
//! | code                                                                                              | counts as       |
//! |---------------------------------------------------------------------------------------------------|-----------------|
//! | `ASK_TIMEOUT`, `DEADLINE_EXCEEDED` (timeouts)                                                     | failure         |
//! | `UNAVAILABLE`, `BUFFER_FULL` (other Transient)                                                    | failure         |
//! | `DECODE_FAILURE` (Poison)                                                                         | failure         |
//! | `INTERNAL`, `HANDLER_FAILED`                                                                      | failure         |
//! | `NO_ROUTE`, `INVALID_ARGUMENT`, `VALIDATION_ERROR`, `PAYLOAD_MISMATCH`, `PERMISSION_DENIED`, `OVERSIZE_PAYLOAD`, `FAILED_PRECONDITION` | not counted |
//! | `ASK_CANCELLED`                                                                                   | not counted     |
//!
//! One cancel is not the caller's doing: a request the pool cancelled at its
//! processing timeout timed out in the pool. [`breaker_code`] gives the code
//! an outcome is reported under, `DEADLINE_EXCEEDED` for that cancel (the
//! design's breaker "opens on failure / timeout rate"), the error's own code
//! otherwise.
//!
//! A not-counted outcome is the caller's own doing (a bad request, a cancel)
//! and says nothing about the pool's health: it is neither a success nor a
//! failure, it does not enter the window's request count, and in HalfOpen it
//! only frees its probe slot. A code listed in [`BreakerConfig::open_on`]
//! always counts as a failure, whatever its class, and opens the breaker at
//! once.
//!
//! # Window
//!
//! The window is `buckets` buckets of `window / buckets` each (integer
//! nanoseconds, rounded down), aligned on the driver's clock epoch. An outcome
//! lands in the bucket of its `now`; [`CircuitBreaker::window_counts`] sums
//! the bucket of `now` and the `buckets - 1` before it, so old outcomes age out
//! a bucket at a time. Memory is `buckets` small counters.
//!
//! # Generations
//!
//! Every state change bumps a generation number, and every permit carries the
//! generation it was issued in. An outcome reported with a permit of an older
//! generation is **stale**: ignored entirely ([`Recorded::Stale`]). So a slow
//! request admitted while Closed cannot free a HalfOpen probe slot or count as
//! a probe success, and a probe that outlives its half-open round cannot
//! re-open or close the breaker.
//!
//! The driver's clock may not go backwards: the breaker keeps the latest `now`
//! it was given and uses that for an earlier one.

use std::fmt;
use std::time::Duration;

use crate::error::{AskError, CancelReason, CodeSet, ErrorCode};
use crate::frame::PoolName;
use crate::time::Timestamp;

/// The most buckets a window may have ([`BreakerConfig::validate`]).
pub const MAX_BUCKETS: u32 = 1024;

/// Whether an outcome with this code counts as a failure of the pool (table
/// in the module doc). Codes in [`BreakerConfig::open_on`] count regardless.
pub const fn counts_as_failure(code: ErrorCode) -> bool {
    use ErrorCode::*;
    match code {
        AskTimeout | DeadlineExceeded | Unavailable | BufferFull | DecodeFailure | Internal
        | HandlerFailed => true,
        NoRoute | InvalidArgument | ValidationError | PayloadMismatch | PermissionDenied
        | OversizePayload | FailedPrecondition | AskCancelled => false,
    }
}

/// The code `error` is reported to a breaker under: its own, except that a
/// request cancelled at the pool's processing timeout counts as the timeout
/// it is (`DEADLINE_EXCEEDED`). The caller's and the worker's cancels, and
/// a shutdown's, stay `ASK_CANCELLED`, which does not count.
pub fn breaker_code(error: &AskError) -> ErrorCode {
    match error {
        AskError::AskCancelled {
            reason: CancelReason::ProcessingTimeout,
        } => ErrorCode::DeadlineExceeded,
        other => other.code(),
    }
}

/// How a [`CircuitBreaker`] trips and recovers.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct BreakerConfig {
    /// Length of the sliding window the failure rate is measured over.
    pub window: Duration,
    /// How many buckets the window slides by.
    pub buckets: u32,
    /// No trip on rate below this many counted outcomes in the window.
    pub min_requests: u32,
    /// Failure fraction, in `(0, 1]`, at or above which the breaker trips.
    pub failure_rate: f64,
    /// How long the breaker stays open before it lets probes through.
    pub open_for: Duration,
    /// Probes allowed in flight while half-open, and consecutive probe
    /// successes needed to close.
    pub half_open_probes: u32,
    /// Codes that open the breaker at once.
    pub open_on: CodeSet,
}

impl Default for BreakerConfig {
    /// 10 s window in 10 buckets, at least 20 requests, 50 % failures trips
    /// it, open for 5 s, 3 probes, no code opens it at once.
    fn default() -> Self {
        Self {
            window: Duration::from_secs(10),
            buckets: 10,
            min_requests: 20,
            failure_rate: 0.5,
            open_for: Duration::from_secs(5),
            half_open_probes: 3,
            open_on: CodeSet::EMPTY,
        }
    }
}

impl BreakerConfig {
    /// Checks the numbers, so a bad config fails where it is built.
    pub fn validate(&self) -> Result<(), AskError> {
        let bad = |message: &str| {
            Err(AskError::InvalidArgument {
                message: format!("breaker config: {message}"),
            })
        };
        if self.buckets == 0 || self.buckets > MAX_BUCKETS {
            return bad("buckets must be in 1..=1024");
        }
        if self.bucket_width().is_zero() {
            return bad("window must be at least 1 ns per bucket");
        }
        if self.min_requests == 0 {
            return bad("min_requests must be at least 1");
        }
        if !(self.failure_rate.is_finite() && self.failure_rate > 0.0 && self.failure_rate <= 1.0) {
            return bad("failure_rate must be in (0, 1]");
        }
        if self.open_for.is_zero() {
            return bad("open_for must be positive");
        }
        if self.half_open_probes == 0 {
            return bad("half_open_probes must be at least 1");
        }
        Ok(())
    }

    /// The width of one bucket: `window / buckets`, rounded down to the
    /// nanosecond (zero if `buckets` is zero).
    pub fn bucket_width(&self) -> Duration {
        let nanos = u64::try_from(self.window.as_nanos()).unwrap_or(u64::MAX);
        Duration::from_nanos(nanos.checked_div(u64::from(self.buckets)).unwrap_or(0))
    }
}

/// The state without its data, for metrics and logs.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum BreakerState {
    Closed,
    Open,
    HalfOpen,
}

impl BreakerState {
    pub const fn as_str(self) -> &'static str {
        match self {
            BreakerState::Closed => "closed",
            BreakerState::Open => "open",
            BreakerState::HalfOpen => "half_open",
        }
    }

    /// The value of a breaker-state gauge: 0 closed, 1 open, 2 half-open.
    pub const fn as_gauge(self) -> u8 {
        match self {
            BreakerState::Closed => 0,
            BreakerState::Open => 1,
            BreakerState::HalfOpen => 2,
        }
    }
}

impl fmt::Display for BreakerState {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Leave to send one request. Not `Clone`: report it exactly once, with
/// [`CircuitBreaker::on_success`], [`CircuitBreaker::on_failure`] or
/// [`CircuitBreaker::release`]. A half-open probe permit that is never
/// reported keeps its probe slot taken until the breaker changes state.
#[derive(Debug, PartialEq, Eq)]
#[must_use = "a breaker permit must be reported back to the breaker"]
pub struct BreakerPermit {
    generation: u64,
    probe: bool,
}

impl BreakerPermit {
    /// The breaker generation it was issued in.
    pub fn generation(&self) -> u64 {
        self.generation
    }
    /// Whether it was issued while half-open (it holds a probe slot).
    pub fn is_probe(&self) -> bool {
        self.probe
    }
}

/// What the breaker made of a reported outcome.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Recorded {
    Success,
    Failure,
    /// A code that does not count ([`counts_as_failure`]), or a `release`.
    NotCounted,
    /// The permit's generation is over: the outcome was ignored.
    Stale,
}

/// A state change.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct BreakerTransition {
    pub from: BreakerState,
    pub to: BreakerState,
}

/// The result of reporting a permit's outcome.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct BreakerStep {
    pub recorded: Recorded,
    /// Set if this outcome changed the state (tripped, re-opened or closed).
    pub transition: Option<BreakerTransition>,
}

/// Counted outcomes in the sliding window.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct WindowCounts {
    /// Successes plus counted failures.
    pub requests: u32,
    pub failures: u32,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Phase {
    Closed,
    Open { until: Timestamp },
    HalfOpen { in_flight: u32, successes: u32 },
}

#[derive(Clone, Copy, Debug, Default)]
struct Bucket {
    /// `now / width` of the outcomes it holds.
    epoch: u64,
    requests: u32,
    failures: u32,
}

/// The circuit breaker of one target pool. See the module doc.
#[derive(Clone, Debug)]
pub struct CircuitBreaker {
    pool: PoolName,
    config: BreakerConfig,
    width_nanos: u64,
    buckets: Vec<Bucket>,
    phase: Phase,
    generation: u64,
    /// The latest `now` seen.
    clock: Timestamp,
    trips: u64,
    rejections: u64,
    stale: u64,
}

impl CircuitBreaker {
    /// A closed breaker for `pool`. Fails with `InvalidArgument` on a config
    /// that [`BreakerConfig::validate`] refuses.
    pub fn new(pool: impl Into<PoolName>, config: BreakerConfig) -> Result<Self, AskError> {
        config.validate()?;
        let width_nanos = u64::try_from(config.bucket_width().as_nanos()).unwrap_or(u64::MAX);
        Ok(Self {
            pool: pool.into(),
            buckets: vec![Bucket::default(); config.buckets as usize],
            config,
            width_nanos,
            phase: Phase::Closed,
            generation: 0,
            clock: Timestamp::ZERO,
            trips: 0,
            rejections: 0,
            stale: 0,
        })
    }

    pub fn pool(&self) -> &PoolName {
        &self.pool
    }

    pub fn config(&self) -> &BreakerConfig {
        &self.config
    }

    /// The state at `now`: an Open breaker whose period has ended reports
    /// HalfOpen (the move itself happens on the next `try_acquire`).
    pub fn state(&self, now: Timestamp) -> BreakerState {
        let now = now.max(self.clock);
        match self.phase {
            Phase::Closed => BreakerState::Closed,
            Phase::Open { until } if now < until => BreakerState::Open,
            Phase::Open { .. } | Phase::HalfOpen { .. } => BreakerState::HalfOpen,
        }
    }

    /// End of the current open period, if the breaker is open.
    pub fn open_until(&self) -> Option<Timestamp> {
        match self.phase {
            Phase::Open { until } => Some(until),
            _ => None,
        }
    }

    /// Probe permits out and not yet reported (0 unless half-open).
    pub fn probes_in_flight(&self) -> u32 {
        match self.phase {
            Phase::HalfOpen { in_flight, .. } => in_flight,
            _ => 0,
        }
    }

    /// Probe successes of the current half-open round (0 unless half-open).
    pub fn probe_successes(&self) -> u32 {
        match self.phase {
            Phase::HalfOpen { successes, .. } => successes,
            _ => 0,
        }
    }

    /// Current generation: bumped by every state change.
    pub fn generation(&self) -> u64 {
        self.generation
    }

    /// Times the breaker opened (from Closed or HalfOpen).
    pub fn trips(&self) -> u64 {
        self.trips
    }

    /// Asks refused by `try_acquire`.
    pub fn rejections(&self) -> u64 {
        self.rejections
    }

    /// Outcomes ignored because their permit was stale.
    pub fn stale_outcomes(&self) -> u64 {
        self.stale
    }

    /// Counted outcomes in the window ending at `now`.
    pub fn window_counts(&self, now: Timestamp) -> WindowCounts {
        let idx = self.epoch_of(now.max(self.clock));
        let n = self.buckets.len() as u64;
        let mut counts = WindowCounts::default();
        for b in &self.buckets {
            if b.epoch <= idx && idx - b.epoch < n {
                counts.requests = counts.requests.saturating_add(b.requests);
                counts.failures = counts.failures.saturating_add(b.failures);
            }
        }
        counts
    }

    /// Leave to send one request now, or `Unavailable` while the circuit is
    /// open (or half-open with every probe slot taken).
    pub fn try_acquire(&mut self, now: Timestamp) -> Result<BreakerPermit, AskError> {
        let now = self.tick(now);
        if let Phase::Open { until } = self.phase {
            if now < until {
                self.rejections += 1;
                let wait = until.saturating_since(now).as_millis();
                return Err(AskError::unavailable(format!(
                    "circuit open for pool {:?} (half-open in {wait} ms)",
                    self.pool.as_str()
                )));
            }
            self.enter(Phase::HalfOpen {
                in_flight: 0,
                successes: 0,
            });
        }
        match &mut self.phase {
            Phase::Closed => Ok(BreakerPermit {
                generation: self.generation,
                probe: false,
            }),
            Phase::HalfOpen { in_flight, .. } => {
                if *in_flight < self.config.half_open_probes {
                    *in_flight += 1;
                    Ok(BreakerPermit {
                        generation: self.generation,
                        probe: true,
                    })
                } else {
                    self.rejections += 1;
                    Err(AskError::unavailable(format!(
                        "circuit half-open for pool {:?}: all {} probes in flight",
                        self.pool.as_str(),
                        self.config.half_open_probes
                    )))
                }
            }
            Phase::Open { .. } => unreachable!("left Open above"),
        }
    }

    /// The request of `permit` succeeded.
    #[inline]
    pub fn on_success(&mut self, permit: BreakerPermit, now: Timestamp) -> BreakerStep {
        self.report(permit, Some(false), now)
    }

    /// The request of `permit` failed with `code`.
    pub fn on_failure(
        &mut self,
        permit: BreakerPermit,
        code: ErrorCode,
        now: Timestamp,
    ) -> BreakerStep {
        let failed = counts_as_failure(code) || self.opens_at_once(code);
        let counted = if failed { Some(true) } else { None };
        let mut step = self.report(permit, counted, now);
        if step.recorded == Recorded::Failure
            && self.phase == Phase::Closed
            && self.opens_at_once(code)
        {
            step.transition = Some(self.trip(now));
        }
        step
    }

    /// The permit was not used, or its outcome says nothing about the pool
    /// (the ask was cancelled before a result): frees a probe slot, counts
    /// nothing.
    pub fn release(&mut self, permit: BreakerPermit) -> BreakerStep {
        let now = self.clock;
        self.report(permit, None, now)
    }

    fn opens_at_once(&self, code: ErrorCode) -> bool {
        self.config.open_on.contains(code)
    }

    /// `failed`: `Some(false)` success, `Some(true)` counted failure, `None`
    /// not counted.
    // Inline: each caller passes its own constant `failed`, which folds
    // away most of the match (every ask reports one).
    #[inline]
    fn report(
        &mut self,
        permit: BreakerPermit,
        failed: Option<bool>,
        now: Timestamp,
    ) -> BreakerStep {
        let now = self.tick(now);
        if permit.generation != self.generation {
            self.stale += 1;
            return BreakerStep {
                recorded: Recorded::Stale,
                transition: None,
            };
        }
        let recorded = match failed {
            None => Recorded::NotCounted,
            Some(false) => Recorded::Success,
            Some(true) => Recorded::Failure,
        };
        let mut transition = None;
        match &mut self.phase {
            // Unreachable with a current permit: Open issues none, and
            // entering Open bumps the generation.
            Phase::Open { .. } => {}
            Phase::Closed => {
                if let Some(failed) = failed {
                    self.record(now, failed);
                    if failed && self.rate_trips(now) {
                        transition = Some(self.trip(now));
                    }
                }
            }
            Phase::HalfOpen {
                in_flight,
                successes,
            } => {
                *in_flight = in_flight.saturating_sub(1);
                match failed {
                    None => {}
                    Some(true) => transition = Some(self.trip(now)),
                    Some(false) => {
                        *successes += 1;
                        if *successes >= self.config.half_open_probes {
                            self.enter(Phase::Closed);
                            transition = Some(BreakerTransition {
                                from: BreakerState::HalfOpen,
                                to: BreakerState::Closed,
                            });
                        }
                    }
                }
            }
        }
        BreakerStep {
            recorded,
            transition,
        }
    }

    fn rate_trips(&self, now: Timestamp) -> bool {
        let c = self.window_counts(now);
        c.requests >= self.config.min_requests
            && f64::from(c.failures) >= self.config.failure_rate * f64::from(c.requests)
    }

    /// Opens the breaker for `open_for` from `now`.
    fn trip(&mut self, now: Timestamp) -> BreakerTransition {
        let from = match self.phase {
            Phase::Closed => BreakerState::Closed,
            Phase::Open { .. } => BreakerState::Open,
            Phase::HalfOpen { .. } => BreakerState::HalfOpen,
        };
        self.trips += 1;
        self.enter(Phase::Open {
            until: now + self.config.open_for,
        });
        BreakerTransition {
            from,
            to: BreakerState::Open,
        }
    }

    fn enter(&mut self, phase: Phase) {
        if matches!(phase, Phase::Closed | Phase::Open { .. }) {
            self.buckets.fill(Bucket::default());
        }
        self.phase = phase;
        self.generation += 1;
    }

    fn record(&mut self, now: Timestamp, failed: bool) {
        let idx = self.epoch_of(now);
        let n = self.buckets.len() as u64;
        let bucket = &mut self.buckets[(idx % n) as usize];
        if bucket.epoch != idx {
            *bucket = Bucket {
                epoch: idx,
                requests: 0,
                failures: 0,
            };
        }
        bucket.requests = bucket.requests.saturating_add(1);
        if failed {
            bucket.failures = bucket.failures.saturating_add(1);
        }
    }

    fn epoch_of(&self, now: Timestamp) -> u64 {
        now.as_nanos() / self.width_nanos
    }

    /// The effective `now`: never earlier than one already seen.
    fn tick(&mut self, now: Timestamp) -> Timestamp {
        self.clock = self.clock.max(now);
        self.clock
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn default_config_is_valid() {
        assert!(BreakerConfig::default().validate().is_ok());
        assert!(BreakerConfig::default().open_on.iter().next().is_none());
    }
}
