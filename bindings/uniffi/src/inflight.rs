//! What the binding tracks while Kotlin works: asks by the caller's token
//! (per node, to cancel them) and running requests by a process-wide token
//! (to reply to them with one top-level call, no object handle to clone).

use std::sync::atomic::{AtomicI64, Ordering};
use std::sync::LazyLock;

use askpool::{Outcome, RequestContext};
use dashmap::DashMap;
use tokio::sync::oneshot;

use crate::payload::Msg;

pub struct Running {
    pub reply: oneshot::Sender<Outcome<Msg>>,
    pub context: RequestContext,
}

static REQUESTS: LazyLock<DashMap<i64, Running>> = LazyLock::new(DashMap::new);
static NEXT_REQUEST: AtomicI64 = AtomicI64::new(1);

pub fn requests() -> &'static DashMap<i64, Running> {
    &REQUESTS
}

pub fn request_token() -> i64 {
    NEXT_REQUEST.fetch_add(1, Ordering::Relaxed)
}

/// Removes a request's entry however its handler future ends (a reply, a
/// panic in the callback, the pool dropping it).
pub struct RequestGuard(pub i64);

impl Drop for RequestGuard {
    fn drop(&mut self) {
        REQUESTS.remove(&self.0);
    }
}
