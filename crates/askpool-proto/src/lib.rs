//! Sans-IO core of askpool: the worker-pool ask protocol as pure state machines.
//!
//! No async runtime, no I/O, no clock: time is an argument ([`Timestamp`]) and
//! randomness is injected, so every race of the protocol is a pure function of
//! (state, event, now) and is tested as such. The `askpool` crate drives these
//! machines with tokio, the way `quinn` drives `quinn-proto`.
//!
//! - [`inbound`]: the worker-side table (DESIGN section 3), one dedup key.
//! - [`ack`]: the SW4RM ACK lifecycle of one ask at the caller (DESIGN section 4).
//! - [`breaker`]: the circuit breaker of one target pool (DESIGN section 4).
//! - [`caller`]: one ask at the caller: send, re-send until Ack, timeout, cancel.
//! - [`retry`]: [`RetryPolicy`] and jittered exponential backoff.
//! - [`error`]: the error taxonomy and its classes.
//! - [`frame`], [`ids`], [`fingerprint`], [`time`]: the data they speak.

pub mod ack;
pub mod breaker;
pub mod caller;
pub mod error;
pub mod fingerprint;
pub mod frame;
pub mod ids;
pub mod inbound;
pub mod retry;
pub mod time;

pub use ack::{AckStage, AckTracker, LateOutcome, Progress, StageError, StageEvent};
pub use breaker::{
    BreakerConfig, BreakerPermit, BreakerState, BreakerStep, BreakerTransition, CircuitBreaker,
    Recorded, WindowCounts,
};
pub use caller::{CallerAsk, CallerPhase, CallerSend, CallerStep, Resolution, StageTimeouts};
pub use error::{AskError, CancelReason, CodeSet, ErrorClass, ErrorCode, Outcome};
pub use fingerprint::{FingerprintRecord, PayloadFingerprint};
pub use frame::{Envelope, PoolName, RequestMeta, ToCaller, ToWorker, WorkerId};
pub use ids::{AskIds, CallerId, CausationId, CorrelationId, DedupKey, ParseIdError, RequestId};
pub use inbound::{InboundAction, InboundEvent, InboundPhase, InboundState, InboundTransition};
pub use retry::RetryPolicy;
pub use time::Timestamp;
