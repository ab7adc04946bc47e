//! What the binding tracks while Kotlin works: asks by the caller's token
//! (per node, to cancel them) and running requests by a process-wide token
//! (to reply to them with one top-level call, no object handle to clone).

use std::sync::atomic::{AtomicI64, Ordering};
use std::sync::LazyLock;

use askpool::{RequestContext, Responder};
use dashmap::DashMap;
use rustc_hash::FxBuildHasher;
use tokio::sync::oneshot;

use crate::payload::Msg;

pub struct Running {
    pub responder: Responder<Msg, Msg>,
    /// Lets the pool's worker take its next request.
    pub done: oneshot::Sender<()>,
    pub context: RequestContext,
    /// The request's message, kept until the request ends: the JVM looks
    /// its object up without a hold of its own (`events::push_unheld`).
    pub _message: Msg,
}

/// Keyed by small integers from this process: Fx hashing, not SipHash.
pub type IdMap<V> = DashMap<i64, V, FxBuildHasher>;

static REQUESTS: LazyLock<IdMap<Running>> = LazyLock::new(IdMap::default);
static NEXT_REQUEST: AtomicI64 = AtomicI64::new(1);

pub fn requests() -> &'static IdMap<Running> {
    &REQUESTS
}

pub fn request_token() -> i64 {
    NEXT_REQUEST.fetch_add(1, Ordering::Relaxed)
}

/// Removes a request's entry however its worker stops waiting (a reply, a
/// panic in a callback, the pool closing): an unanswered responder dropped
/// here fails the request (`Internal`) or cancels it (shutdown).
pub struct RequestGuard(pub i64);

impl Drop for RequestGuard {
    fn drop(&mut self) {
        REQUESTS.remove(&self.0);
    }
}
