//! Protocol time. The state machines never read a clock: every event carries
//! `now`, so every race is a pure function of (state, event, now) and a test
//! can place two events at the very same instant.

use std::ops::{Add, Sub};
use std::time::Duration;

/// A point on a monotonic clock, as nanoseconds since an epoch the driver picks.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Timestamp(u64);

impl Timestamp {
    pub const ZERO: Timestamp = Timestamp(0);
    pub const MAX: Timestamp = Timestamp(u64::MAX);

    pub const fn from_nanos(nanos: u64) -> Self {
        Self(nanos)
    }
    pub const fn as_nanos(self) -> u64 {
        self.0
    }
    pub fn from_duration(since_epoch: Duration) -> Self {
        Self(u64::try_from(since_epoch.as_nanos()).unwrap_or(u64::MAX))
    }
    pub const fn since_epoch(self) -> Duration {
        Duration::from_nanos(self.0)
    }
    /// Time from `earlier` to `self`, zero if `earlier` is later.
    pub fn saturating_since(self, earlier: Timestamp) -> Duration {
        Duration::from_nanos(self.0.saturating_sub(earlier.0))
    }
}

impl Add<Duration> for Timestamp {
    type Output = Timestamp;
    fn add(self, rhs: Duration) -> Timestamp {
        let nanos = u64::try_from(rhs.as_nanos()).unwrap_or(u64::MAX);
        Timestamp(self.0.saturating_add(nanos))
    }
}

impl Sub<Duration> for Timestamp {
    type Output = Timestamp;
    fn sub(self, rhs: Duration) -> Timestamp {
        let nanos = u64::try_from(rhs.as_nanos()).unwrap_or(u64::MAX);
        Timestamp(self.0.saturating_sub(nanos))
    }
}
