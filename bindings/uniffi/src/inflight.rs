//! What a node's binding tracks while Kotlin awaits: asks by the caller's
//! token (to cancel them) and requests by the handler's token (to reply).

use std::sync::atomic::{AtomicI64, Ordering};

use askpool::{Outcome, RequestContext};
use dashmap::DashMap;
use tokio::sync::oneshot;

use crate::payload::Msg;

pub struct Running {
    pub reply: oneshot::Sender<Outcome<Msg>>,
    pub context: RequestContext,
}

#[derive(Default)]
pub struct Inflight {
    pub asks: DashMap<i64, oneshot::Sender<()>>,
    pub requests: DashMap<i64, Running>,
    next_request: AtomicI64,
}

impl Inflight {
    pub fn request_token(&self) -> i64 {
        self.next_request.fetch_add(1, Ordering::Relaxed)
    }
}

/// Removes a request's entry however its handler future ends (a reply, a
/// panic in the callback, the pool dropping it).
pub struct RequestGuard<'a> {
    pub inflight: &'a Inflight,
    pub token: i64,
}

impl Drop for RequestGuard<'_> {
    fn drop(&mut self) {
        self.inflight.requests.remove(&self.token);
    }
}
