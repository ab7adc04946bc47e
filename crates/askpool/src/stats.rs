//! Counters and gauges a node exposes, for tests, the demo and operators.

use std::sync::atomic::{AtomicUsize, Ordering};

use askpool_dedup::DedupStats;

use crate::breakers::BreakerStats;

/// A snapshot of one pool.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct PoolStats {
    pub name: String,
    /// Requests admitted and not yet finished (InProgress entries).
    pub in_flight: usize,
    /// Places held in the pool's queues: admitted requests waiting for a
    /// worker, plus requests cancelled while they waited, not yet skipped
    /// by a worker (a queue holds at most `2 * max_in_flight`, beyond
    /// which the cancelled ones are dropped). 0 once the pool is closed.
    pub queued: usize,
    pub dedup: DedupStats,
    /// Requests admitted for the first time.
    pub admitted: u64,
    /// Handler runs started (at most one per admitted request).
    pub handler_runs: u64,
    /// Duplicates of a running request, answered with an Ack.
    pub duplicate_acks: u64,
    /// Duplicates of a finished request, answered from the cache.
    pub replays: u64,
    /// Replies dropped because the request was cancelled first.
    pub suppressed_replies: u64,
    pub payload_mismatches: u64,
    /// Requests refused with `BufferFull`.
    pub rejected_full: u64,
    /// Running or queued requests cancelled.
    pub cancels: u64,
    /// Cancels that arrived before their request.
    pub tombstones: u64,
    /// Running requests cancelled by their processing deadline.
    pub expired: u64,
    /// Places held by the expiry index: running requests, plus finished ones
    /// not yet compacted away (at most `2 * in_flight + 64`); 0 when none runs.
    pub expiry_index: usize,
}

/// A snapshot of a node.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct NodeStats {
    /// Asks in the pending map.
    pub pending: usize,
    /// Retry/deadline timers armed by live asks.
    pub armed_timers: usize,
    /// Places held by the node's shared ask-deadline queue: asks waiting
    /// only for their deadline, plus places of asks that ended, not yet
    /// compacted away; 0 when no ask waits there.
    pub queued_deadlines: usize,
    /// Request frames re-sent after the first attempt.
    pub retries: u64,
    /// Frames for asks that were no longer pending (duplicates).
    pub ignored_frames: u64,
    /// Outcomes that arrived after their ask timed out, reconciled once.
    pub late_outcomes: u64,
    /// Timed-out asks remembered for reconciliation.
    pub timed_out_records: usize,
    pub dlq_depth: usize,
    /// Dead letters dropped because the queue was full.
    pub dlq_dropped: u64,
    /// The breakers of the pools this node has asked.
    pub breakers: Vec<BreakerStats>,
    pub pools: Vec<PoolStats>,
}

impl NodeStats {
    pub fn pool(&self, name: &str) -> Option<&PoolStats> {
        self.pools.iter().find(|p| p.name == name)
    }
    pub fn breaker(&self, pool: &str) -> Option<&BreakerStats> {
        self.breakers.iter().find(|b| b.pool == pool)
    }
}

static LIVE_POOLS: AtomicUsize = AtomicUsize::new(0);

/// Pools alive in this process: declared and not yet dropped (a closed
/// pool lives on while a handler, a request or a handle still holds it).
/// For leak tests: what a closed pool held (its reply cache, about 1 MiB at
/// the default bound) is gone once this is back to where it was.
pub fn live_pools() -> usize {
    LIVE_POOLS.load(Ordering::Relaxed)
}

/// Counts its pool in [`live_pools`] while it lives.
pub(crate) struct LivePool(());

impl LivePool {
    pub(crate) fn new() -> Self {
        LIVE_POOLS.fetch_add(1, Ordering::Relaxed);
        Self(())
    }
}

impl Drop for LivePool {
    fn drop(&mut self) {
        LIVE_POOLS.fetch_sub(1, Ordering::Relaxed);
    }
}
