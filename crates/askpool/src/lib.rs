//! askpool: a reliable ask (request/reply) between callers and worker pools.
//!
//! This crate drives the sans-IO machines of [`askpool_proto`] with tokio:
//! a [`Node`] sends asks through a [`WorkerTransport`] and hosts
//! [`WorkerPool`]s whose inbound state lives in an `askpool-dedup` table.
//!
//! ```
//! use std::time::Duration;
//! use askpool::{Node, AskError};
//!
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> Result<(), AskError> {
//! let node: Node<String, usize> = Node::new();
//! node.pool("lengths")
//!     .concurrency(2)
//!     .handler(|msg: String, _ctx| async move { Ok(msg.len()) })?;
//!
//! let len = node.ask("lengths", "hello".to_string())
//!     .timeout(Duration::from_secs(5))
//!     .await?;
//! assert_eq!(len, 5);
//! # Ok(())
//! # }
//! ```

#[doc = include_str!("../../../README.md")]
#[cfg(doctest)]
pub struct ReadmeDoctests;

// `#[inline]` on a small function of the ask's path: the node, its pools
// and its asks are generic over the payload and reply types, so their code
// is compiled in the crate that names those types (a binding, an example),
// where a plain function of this crate is not inlined, nor one of this
// crate's codegen units into another. Each was measured (callgrind,
// `examples/ask_loop.rs`) and kept only where it cut instructions.

mod ask;
mod breakers;
mod cancel;
mod clock;
mod config;
mod deadlines;
mod dlq;
mod expiry;
mod idle_sweep;
mod node;
mod pending;
mod pool;
mod queue;
pub mod shard;
mod stages;
mod stats;
mod telemetry;
mod transport;
mod worker;

pub use ask::{AskBuilder, AskHandle, AskOptions, ReplayHook, TellBuilder, TellHandle};
pub use breakers::BreakerStats;
pub use config::{
    NodeConfig, PoolConfig, TimeoutConfig, DEFAULT_MAX_PAYLOAD_BYTES, MAX_CONCURRENCY,
};
pub use dlq::{DeadLetter, DeadLetterKind, DeadLetterReason};
pub use node::{Node, PoolBuilder, Replay, WorkerPool};
pub use pending::{LateOutcome, LateResult};
pub use stages::{StageRelay, StageSource, StageStream, MAX_RELAYED_ASKS};
pub use stats::{live_pools, NodeStats, PoolStats};
#[cfg(feature = "prometheus")]
pub use telemetry::install_prometheus;
pub use transport::{CallerEndpoint, InProcessTransport, PoolEndpoint, WorkerTransport};
pub use worker::{Request, RequestContext, Responder, Worker};

pub use askpool_dedup::{DedupConfig, DedupStats};
pub use askpool_proto::{
    AckStage, AskError, AskIds, BreakerConfig, BreakerState, CallerId, CancelReason, CausationId,
    CodeSet, CorrelationId, ErrorClass, ErrorCode, Outcome, PayloadFingerprint, PoolName, Progress,
    RequestId, RetryPolicy, StageEvent, ToCaller, ToWorker, WorkerId,
};
