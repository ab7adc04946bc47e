//! The node's clock: tokio time mapped onto protocol [`Timestamp`]s, so a
//! paused tokio runtime drives the protocol deterministically.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{SystemTime, UNIX_EPOCH};

use askpool_proto::{RequestId, Timestamp};
use tokio::time::Instant;

pub(crate) struct NodeClock {
    epoch: Instant,
    /// Wall-clock microseconds at `epoch`, the time half of request ids.
    wall_epoch_micros: u64,
}

impl NodeClock {
    pub(crate) fn new(deterministic: bool) -> Self {
        let wall_epoch_micros = if deterministic {
            0
        } else {
            SystemTime::now()
                .duration_since(UNIX_EPOCH)
                .map_or(0, |d| u64::try_from(d.as_micros()).unwrap_or(u64::MAX))
        };
        Self {
            epoch: Instant::now(),
            wall_epoch_micros,
        }
    }

    pub(crate) fn now(&self) -> Timestamp {
        Timestamp::from_duration(Instant::now().saturating_duration_since(self.epoch))
    }

    pub(crate) fn instant(&self, at: Timestamp) -> Instant {
        self.epoch + at.since_epoch()
    }

    pub(crate) fn wall_micros(&self, now: Timestamp) -> u64 {
        self.wall_epoch_micros
            .saturating_add(u64::try_from(now.since_epoch().as_micros()).unwrap_or(u64::MAX))
    }
}

/// Request ids and per-ask jitter seeds, lock-free. With a fixed seed (and a
/// paused clock) every run produces the same ids.
pub(crate) struct IdSource {
    seed: u64,
    counter: AtomicU64,
}

impl IdSource {
    pub(crate) fn new(seed: u64) -> Self {
        Self {
            seed,
            counter: AtomicU64::new(0),
        }
    }

    pub(crate) fn next_u64(&self) -> u64 {
        let n = self.counter.fetch_add(1, Ordering::Relaxed);
        splitmix64(
            self.seed
                .wrapping_add(n.wrapping_mul(0x9E37_79B9_7F4A_7C15)),
        )
    }

    pub(crate) fn request_id(&self, wall_micros: u64) -> RequestId {
        RequestId::from_parts(wall_micros, self.next_u64())
    }
}

/// SplitMix64: a bijective mixer, enough to spread a counter into nonces.
fn splitmix64(mut z: u64) -> u64 {
    z = z.wrapping_add(0x9E37_79B9_7F4A_7C15);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}
