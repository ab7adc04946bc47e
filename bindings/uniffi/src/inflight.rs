//! What the binding tracks while Kotlin works: asks by the caller's token
//! (per node, to cancel them) and running requests by a process-wide token
//! (to reply to them with one top-level call, no object handle to clone).
//!
//! Running requests are kept per thread (`askpool::shard`): a request is
//! entered by the thread its worker runs on and, in process, answered by
//! the same thread (the handler runs inside the hot call), so its entry and
//! its shard's lock stay in that thread's cache. A token names its shard in
//! its top bits; one map and one token counter for the process were lines
//! that every asking thread wrote on every request.

use std::sync::LazyLock;

use askpool::shard::Sharded;
use askpool::{RequestContext, Responder};
use parking_lot::Mutex;
use rustc_hash::FxHashMap;
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

#[derive(Default)]
struct RequestShard {
    /// Tokens handed out by this shard so far.
    issued: i64,
    running: FxHashMap<i64, Running>,
}

/// Where a token keeps its shard (shard + 1, so no token is 0).
const SHARD_SHIFT: u32 = 48;

static REQUESTS: LazyLock<Sharded<Mutex<RequestShard>>> = LazyLock::new(Sharded::default);

fn shard_of(token: i64) -> Option<&'static Mutex<RequestShard>> {
    let shard = usize::try_from(token >> SHARD_SHIFT).ok()?.checked_sub(1)?;
    (shard < REQUESTS.len()).then(|| REQUESTS.get(shard))
}

/// Enters a running request in the calling thread's shard; returns its token.
pub fn enter_request(running: Running) -> i64 {
    let index = REQUESTS.my_index();
    let mut shard = REQUESTS.get(index).lock();
    shard.issued += 1;
    let token = ((index as i64 + 1) << SHARD_SHIFT) | shard.issued;
    shard.running.insert(token, running);
    token
}

/// Takes a running request out (to answer it); `None` if it already ended.
pub fn take_request(token: i64) -> Option<Running> {
    shard_of(token)?.lock().running.remove(&token)
}

/// What `read` makes of a running request, under its shard's lock (so
/// `read` must not call back into the binding).
pub fn read_request<T>(token: i64, read: impl FnOnce(&Running) -> T) -> Option<T> {
    shard_of(token)?.lock().running.get(&token).map(read)
}

/// Requests handed to host handlers and not answered yet.
pub fn requests_len() -> usize {
    REQUESTS
        .iter()
        .map(|shard| shard.lock().running.len())
        .sum()
}

/// Removes a request's entry however its worker stops waiting (a reply, a
/// panic in a callback, the pool closing): an unanswered responder dropped
/// here fails the request (`Internal`) or cancels it (shutdown).
pub struct RequestGuard(pub i64);

impl Drop for RequestGuard {
    fn drop(&mut self) {
        take_request(self.0);
    }
}
