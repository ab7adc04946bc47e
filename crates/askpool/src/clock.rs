//! The node's clock: tokio time mapped onto protocol [`Timestamp`]s, so a
//! paused tokio runtime drives the protocol deterministically.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{SystemTime, UNIX_EPOCH};

use askpool_proto::{RequestId, Timestamp};
use tokio::time::Instant;

use crate::shard::{Sharded, MAX_SHARDS};

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

    // Inline: read several times per ask, from generic code that is
    // compiled in the user's crate, where a plain function is not inlined.
    #[inline]
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

/// Request ids, lock-free. With a fixed seed (and a paused clock) every run
/// produces the same ids.
///
/// Without one, each thread counts on its own (one counter for every
/// asking thread was a line they all wrote on every ask), and an id's
/// nonce carries the asking thread's shard in its low bits: the caller's
/// pending map keeps the ask in that shard, which the same thread then
/// mostly uses (see `pending`).
pub(crate) struct IdSource {
    seed: u64,
    deterministic: bool,
    counter: AtomicU64,
    per_thread: Sharded<AtomicU64>,
}

impl IdSource {
    pub(crate) fn new(seed: u64, deterministic: bool) -> Self {
        Self {
            seed,
            deterministic,
            counter: AtomicU64::new(0),
            per_thread: Sharded::default(),
        }
    }

    pub(crate) fn next_u64(&self) -> u64 {
        let n = self.counter.fetch_add(1, Ordering::Relaxed);
        splitmix64(
            self.seed
                .wrapping_add(n.wrapping_mul(0x9E37_79B9_7F4A_7C15)),
        )
    }

    #[inline]
    pub(crate) fn request_id(&self, wall_micros: u64) -> RequestId {
        if self.deterministic {
            return RequestId::from_parts(wall_micros, self.next_u64());
        }
        let shard = self.per_thread.my_index();
        let n = self.per_thread.get(shard).fetch_add(1, Ordering::Relaxed);
        RequestId::from_parts(wall_micros, sharded_nonce(self.seed, n, shard as u64))
    }
}

/// Bits of a nonce below its mixed part: room for [`MAX_SHARDS`] shards.
const SHARD_BITS: u32 = MAX_SHARDS.trailing_zeros();

/// A nonce that is `shard` in its low [`SHARD_BITS`] bits and a bijective
/// mix of `seed + n` in the others: distinct for every `(n, shard)` of one
/// source (SplitMix64's steps, each a bijection of the 60-bit word).
fn sharded_nonce(seed: u64, n: u64, shard: u64) -> u64 {
    const WIDTH: u32 = 64 - SHARD_BITS;
    const MASK: u64 = (1 << WIDTH) - 1;
    let mut z = seed.wrapping_add(n.wrapping_mul(0x9E37_79B9_7F4A_7C15)) & MASK;
    z = ((z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9)) & MASK;
    z = ((z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB)) & MASK;
    z ^= z >> 31;
    (z << SHARD_BITS) | shard
}

/// The shard (among `count`, a power of two up to [`MAX_SHARDS`]) that an
/// id's nonce names.
pub(crate) fn shard_of(id: RequestId, count: usize) -> usize {
    (id.nonce() as usize) & (count - 1)
}

/// SplitMix64: a bijective mixer, enough to spread a counter into nonces.
fn splitmix64(mut z: u64) -> u64 {
    z = z.wrapping_add(0x9E37_79B9_7F4A_7C15);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashSet;

    #[test]
    fn sharded_nonces_are_distinct_and_name_their_shard() {
        let mut seen = HashSet::new();
        for shard in 0..MAX_SHARDS as u64 {
            for n in 0..5_000 {
                let nonce = sharded_nonce(42, n, shard);
                assert_eq!(nonce & (MAX_SHARDS as u64 - 1), shard);
                assert!(seen.insert(nonce), "nonce {nonce:x} made twice");
            }
        }
    }

    #[test]
    fn ids_made_on_a_thread_name_its_shard_unless_reproducible() {
        let ids = IdSource::new(7, false);
        let count = crate::shard::shard_count();
        let mine = crate::shard::thread_shard(count);
        let id = ids.request_id(1);
        assert_eq!(shard_of(id, count), mine);
        assert_ne!(ids.request_id(1), id);
        let a = IdSource::new(7, true);
        let b = IdSource::new(7, true);
        assert_eq!(
            a.request_id(1),
            b.request_id(1),
            "a seed makes the same ids"
        );
    }
}
