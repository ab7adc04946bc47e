//! The foreign traits Kotlin implements. Every method is synchronous and
//! takes primitives on the hot path: a call costs one FFI crossing, and the
//! Kotlin side hands the work to a coroutine, so the runtime's threads never
//! wait on host code.

use crate::error::Failure;

/// One stage change of an ask's ACK lifecycle.
#[derive(Clone, Debug, uniffi::Record)]
pub struct Stage {
    /// `SENT`, `RECEIVED`, `READ`, `PARTIAL`, `FULFILLED`, ...
    pub stage: String,
    pub since_previous_micros: u64,
    pub since_sent_micros: u64,
    pub progress: Option<f32>,
    pub note: Option<String>,
}

/// Receives the outcomes of a node's asks, keyed by the caller's token.
/// Host-object replies, the common case, arrive as events instead
/// (`askpool_hot_wait`): a callback costs far more in JNA.
#[uniffi::export(with_foreign)]
pub trait AskListener: Send + Sync {
    fn on_reply_bytes(&self, token: i64, data: Vec<u8>);
    /// A tell was accepted by its pool. The runtime reports that as an
    /// event (`events::TOLD`); only the bench's callback floor calls this.
    fn on_told(&self, token: i64);
    fn on_failure(&self, token: i64, failure: Failure);
    fn on_stage(&self, token: i64, stage: Stage);
    /// The ask's stage stream ended (after its terminal stage).
    fn on_stages_end(&self, token: i64);
}

/// Runs a pool's requests. `request` keys the reply (`request_reply`).
/// Requests with a host object arrive as events (`askpool_hot_wait`).
#[uniffi::export(with_foreign)]
pub trait HostHandler: Send + Sync {
    fn handle_bytes(&self, request: i64, data: Vec<u8>);
    /// The request was cancelled (by its caller, a timeout or shutdown).
    fn cancelled(&self, request: i64);
}
