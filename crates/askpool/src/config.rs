//! Configuration of nodes and pools, with the defaults a caller gets when it
//! says nothing.

use std::collections::HashMap;
use std::time::Duration;

use askpool_dedup::DedupConfig;
use askpool_proto::{AskError, BreakerConfig, PoolName, RetryPolicy};

/// SW4RM's TimeoutConfig. The total TTL of an ask is its timeout
/// ([`NodeConfig::default_timeout`] unless the ask sets one).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct TimeoutConfig {
    /// RECEIVED (the pool's Ack) must arrive within this of sending, or the
    /// ask fails with `DeadlineExceeded`. Default 10 s.
    pub delivery: Option<Duration>,
    /// READ (a worker took it) must arrive within this of sending. Default
    /// none.
    pub read: Option<Duration>,
    /// A request admitted by one of this node's pools is cancelled
    /// (`AskCancelled { ProcessingTimeout }`) if it has not finished within
    /// this, queued or running; a pool can override it. Default 5 minutes,
    /// so nothing stays in flight forever; `None` lifts the bound.
    pub processing: Option<Duration>,
}

impl TimeoutConfig {
    /// A zero deadline would fail (or cancel) every ask at once.
    pub(crate) fn validate(&self) -> Result<(), AskError> {
        for (name, value) in [
            ("delivery", self.delivery),
            ("read", self.read),
            ("processing", self.processing),
        ] {
            if value.is_some_and(|d| d.is_zero()) {
                return Err(AskError::InvalidArgument {
                    message: format!("timeouts.{name} must be positive (None lifts it)"),
                });
            }
        }
        Ok(())
    }
}

impl Default for TimeoutConfig {
    fn default() -> Self {
        Self {
            delivery: Some(Duration::from_secs(10)),
            read: None,
            processing: Some(Duration::from_secs(300)),
        }
    }
}

/// Settings of a [`Node`](crate::Node).
#[derive(Clone, Debug)]
pub struct NodeConfig {
    /// Retry policy of every ask unless the ask overrides it.
    pub retry: RetryPolicy,
    /// Timeout of every ask unless the ask overrides it (the total TTL).
    pub default_timeout: Duration,
    /// Deadlines of the ACK stages, and the processing timeout of pools.
    pub timeouts: TimeoutConfig,
    /// Retry policies for asks to particular pools; an ask's own policy
    /// overrides these, and these override `retry`.
    pub pool_retry: HashMap<PoolName, RetryPolicy>,
    /// Seed of request ids and retry jitter. `None` draws one from the OS.
    /// With a seed and a paused tokio clock, runs are reproducible.
    ///
    /// For tests and simulations: a seed fixes the caller id and the ids'
    /// nonces, so a node restarted with the same seed asks with the ids of
    /// its previous run, and a pool that still caches those answers them
    /// from its cache (unless the asks carry fingerprints). Two live nodes
    /// on one transport cannot share a seed (`InvalidArgument`).
    pub seed: Option<u64>,
    /// Most dead letters kept; the oldest is dropped (and counted) when full.
    pub dlq_capacity: usize,
    /// How many timed-out asks are remembered for late-outcome reconciliation.
    pub reconcile_capacity: usize,
    /// How long a timed-out ask is remembered for reconciliation.
    pub reconcile_window: Duration,
    /// Whether asks record their ACK lifecycle (`AskHandle::stages()`).
    pub track_stages: bool,
    /// A circuit breaker per target pool; `None` turns breakers off.
    pub breaker: Option<BreakerConfig>,
    /// The largest payload an ask may carry, in bytes, where its size is
    /// known ([`AskBuilder::payload_size`](crate::AskBuilder::payload_size):
    /// byte payloads in the bindings); a larger one fails at once with
    /// `OversizePayload`. Default 16 MiB; `None` lifts the bound.
    pub max_payload_bytes: Option<usize>,
}

/// The default of [`NodeConfig::max_payload_bytes`]: 16 MiB.
pub const DEFAULT_MAX_PAYLOAD_BYTES: usize = 16 * 1024 * 1024;

impl Default for NodeConfig {
    fn default() -> Self {
        Self {
            retry: RetryPolicy::default(),
            default_timeout: Duration::from_secs(30),
            timeouts: TimeoutConfig::default(),
            pool_retry: HashMap::new(),
            seed: None,
            dlq_capacity: 1_000,
            reconcile_capacity: 10_000,
            reconcile_window: Duration::from_secs(300),
            track_stages: true,
            breaker: Some(BreakerConfig::default()),
            max_payload_bytes: Some(DEFAULT_MAX_PAYLOAD_BYTES),
        }
    }
}

/// Most workers a pool may have. Each is a task (and, in the bindings, a
/// slot on the host's side) made when the pool starts, so the bound keeps a
/// wrapped-around negative from a host language (`-1` as an unsigned
/// 32-bit number is 4,294,967,295) from ending in an allocation failure,
/// which aborts the process, instead of an error.
pub const MAX_CONCURRENCY: usize = 65_536;

/// Settings of a [`WorkerPool`](crate::WorkerPool).
#[derive(Clone, Debug)]
pub struct PoolConfig {
    /// Worker tasks of a handler pool (each runs one request at a time), at
    /// most [`MAX_CONCURRENCY`].
    pub concurrency: usize,
    /// Requests admitted and not yet finished. A new request over it is
    /// answered `BufferFull`; nothing is dropped silently.
    pub max_in_flight: usize,
    /// Bounds of the terminal-reply cache.
    pub dedup: DedupConfig,
    /// Overrides the node's `timeouts.processing` for this pool.
    pub processing_timeout: Option<Duration>,
    /// Send the acks for one caller that fall within one scheduling tick as
    /// one `AckBatch` frame. Worth it where a frame costs (a cross-process
    /// transport); in process an ack is a function call, and the flush task
    /// per tick costs more than it saves. Default off.
    pub batch_acks: bool,
}

impl Default for PoolConfig {
    fn default() -> Self {
        Self {
            concurrency: 1,
            max_in_flight: 10_000,
            dedup: DedupConfig::default(),
            processing_timeout: None,
            batch_acks: false,
        }
    }
}

impl PoolConfig {
    pub(crate) fn validate(&self) -> Result<(), AskError> {
        let bad = |message: &str| {
            Err(AskError::InvalidArgument {
                message: format!("pool config: {message}"),
            })
        };
        if self.concurrency == 0 {
            return bad("concurrency must be at least 1");
        }
        if self.concurrency > MAX_CONCURRENCY {
            return bad(&format!(
                "concurrency must be at most {MAX_CONCURRENCY}, got {}",
                self.concurrency
            ));
        }
        if self.max_in_flight == 0 {
            return bad("max_in_flight must be at least 1");
        }
        if self.dedup.max_terminal == 0 {
            return bad("dedup.max_terminal must be at least 1");
        }
        if self.processing_timeout.is_some_and(|d| d.is_zero()) {
            return bad("processing_timeout must be positive (None uses the node's)");
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pool_config_bounds_concurrency_on_both_sides() {
        let with = |concurrency| PoolConfig {
            concurrency,
            ..PoolConfig::default()
        };
        assert!(with(1).validate().is_ok());
        assert!(with(MAX_CONCURRENCY).validate().is_ok());
        for bad in [0, MAX_CONCURRENCY + 1, u32::MAX as usize, usize::MAX] {
            match with(bad).validate() {
                Err(AskError::InvalidArgument { message }) => {
                    assert!(message.contains("concurrency"), "{message}")
                }
                other => panic!("concurrency {bad}: {other:?}"),
            }
        }
    }
}
