//! The protocol's rules, in one place. Every store runs its operations
//! through these functions, so the in-memory store and the SQLite store
//! cannot disagree on a decision, only on storing it (which the
//! differential test checks).
//!
//! # Timeouts
//! A pending promise whose `timeout_at <= now` is timed out the moment any
//! operation touches it (get, create, complete, search, callback
//! registration, claim) and by [`Store::sweep`](crate::Store::sweep). It
//! settles as `TimedOut` with `settled_at = timeout_at` and no value, with
//! the same side effects as any settlement (below).
//!
//! # Create
//! - Unknown id: the promise is created, `Pending` (or `TimedOut` at once if
//!   its timeout has passed). With a target and still pending, an invoke
//!   task goes to the target pool.
//! - Known id: a duplicate if the request carries a key equal to the stored
//!   create key, and, for a **strict** promise, the promise is still pending.
//!   A duplicate returns the stored promise (`deduplicated: true`) and
//!   changes nothing. Anything else is `AlreadyExists`.
//!
//! # Complete (resolve, reject, cancel)
//! - Unknown id: `NotFound`.
//! - Pending: settles it (state, value, complete key, `settled_at = now`).
//! - Settled, the request's key equals the stored complete key and (strict
//!   promise only) the requested state is the state it has: a replay, the
//!   stored promise comes back (`replayed: true`).
//! - Settled by its timeout, **non-strict** promise, any key: also a replay
//!   (the caller lost the race to the timeout and learns the outcome).
//! - Otherwise `AlreadySettled`.
//!
//! # Settlement side effects (one transaction with the settlement)
//! The promise's invoke task is completed (deleted). Each callback on it is
//! removed; one whose awaiter is still pending and still in the suspension
//! the callback was registered in (`callback.epoch == awaiter.resume_epoch`)
//! creates a resume task to the callback's pool, preferring its worker,
//! unless a resume task for that awaiter and suspension already exists (a
//! suspension is woken once; the awaiter then looks at all it awaited).
//! One registered for the next suspension (`resume_epoch + 1`, see
//! Callbacks) creates that suspension's resume task `Waiting`. A settling
//! awaiter's unclaimed resume tasks (`Ready` or `Waiting`) are deleted:
//! nothing is left to resume; a claimed one stays for its worker to
//! complete (the resumed execution settling its own promise), and is
//! dropped rather than claimed again if its lease expires. The callbacks
//! it registered as an awaiter are removed (they would wake nothing).
//!
//! # Callbacks
//! Registering `Resume(awaiter, awaited)`: both must exist (`NotFound`),
//! the awaiter must be pending (`AlreadySettled`). A settled awaited
//! promise answers `AlreadyCompleted` and stores nothing. Otherwise the
//! callback is stored with the awaiter's current `resume_epoch`, or the
//! next one while a resume task of the current one exists: the awaiter is
//! then running (or about to run) from that task, and what it awaits now
//! is for its next suspension, which the task's completion begins. The same
//! registration again returns the stored callback.
//!
//! # Tasks
//! A worker claims the first claimable task of its pool: tasks preferring
//! it first, then the rest, each by id. A task is claimable when it is
//! ready or its lease has expired (`lease_expires_at <= now`), its
//! execution has not ended (an invoke task's promise, a resume task's
//! awaiter, both touched, are pending), and, if it
//! prefers another worker, once [`PREFERENCE_GRACE_MS`] have passed since it
//! was created (the preferred worker gets the first chance). A claim bumps
//! the task's `claims` counter, the fencing token of heartbeats and
//! completion: they need the same worker and counter and an unexpired lease,
//! else `LeaseLost`. An invoke task completes with its promise; completing
//! a resume task ends the awaiter's suspension (`resume_epoch + 1`), so its
//! older callbacks wake nothing (they are removed), and makes the new
//! suspension's `Waiting`
//! resume task `Ready` (created now, for the preference grace).

use std::collections::BTreeMap;

use crate::error::PromiseError;
use crate::model::{Completion, Millis, Promise, State, Task, TaskState, MAX_TIME};

/// How long a task that prefers a worker is reserved for that worker.
pub const PREFERENCE_GRACE_MS: Millis = 5_000;

/// Longest id, key, pool or worker name accepted.
pub const MAX_NAME_BYTES: usize = 1_024;

/// Largest param or value a promise holds, in either store (SQLite's own
/// limit is about 1 GB; past it a write failed as a storage error).
pub const MAX_VALUE_BYTES: usize = 256 << 20;

/// Most bytes of tags (keys and values together) a promise holds: they are
/// labels for search, not data.
pub const MAX_TAGS_BYTES: usize = 64 << 10;

/// What a create of an existing promise is.
pub(crate) fn create_existing(p: &Promise, key: Option<&str>) -> Result<(), PromiseError> {
    let same_key = key.is_some() && key == p.create_key.as_deref();
    if same_key && (!p.strict || p.state == State::Pending) {
        Ok(())
    } else {
        Err(PromiseError::AlreadyExists { id: p.id.clone() })
    }
}

pub(crate) enum CompleteDecision {
    Settle,
    Replay,
}

pub(crate) fn complete(
    p: &Promise,
    completion: Completion,
    key: Option<&str>,
) -> Result<CompleteDecision, PromiseError> {
    if p.state == State::Pending {
        return Ok(CompleteDecision::Settle);
    }
    let same_key = key.is_some() && key == p.complete_key.as_deref();
    if same_key && (!p.strict || p.state == completion.state()) {
        return Ok(CompleteDecision::Replay);
    }
    if !p.strict && p.state == State::TimedOut {
        return Ok(CompleteDecision::Replay);
    }
    Err(PromiseError::AlreadySettled {
        id: p.id.clone(),
        state: p.state,
    })
}

pub(crate) fn is_expired(p: &Promise, now: Millis) -> bool {
    p.state == State::Pending && now >= p.timeout_at
}

/// Whether `worker` may claim `task` now.
pub fn claimable(task: &Task, worker: &str, now: Millis) -> bool {
    let free = match task.state {
        TaskState::Ready => true,
        TaskState::Claimed => task.lease_expires_at.is_some_and(|at| at <= now),
        TaskState::Waiting => false,
    };
    let allowed = match &task.preferred_worker {
        None => true,
        Some(w) if w == worker => true,
        Some(_) => now >= task.created_at.saturating_add(PREFERENCE_GRACE_MS),
    };
    free && allowed
}

/// The claim check of heartbeats and task completion.
pub(crate) fn holds_lease(task: &Task, worker: &str, claim: u32, now: Millis) -> bool {
    task.state == TaskState::Claimed
        && task.lease_owner.as_deref() == Some(worker)
        && task.claims == claim
        && task.lease_expires_at.is_some_and(|at| now < at)
}

pub(crate) fn clamp(t: Millis) -> Millis {
    t.min(MAX_TIME)
}

pub(crate) fn check_name(what: &str, s: &str) -> Result<(), PromiseError> {
    if s.is_empty() {
        return Err(PromiseError::invalid(format!("{what} must not be empty")));
    }
    if s.len() > MAX_NAME_BYTES {
        return Err(PromiseError::invalid(format!(
            "{what} is {} bytes; at most {MAX_NAME_BYTES}",
            s.len()
        )));
    }
    if s.contains('\0') {
        return Err(PromiseError::invalid(format!(
            "{what} must not contain NUL"
        )));
    }
    Ok(())
}

pub(crate) fn check_value(what: &str, bytes: &[u8]) -> Result<(), PromiseError> {
    if bytes.len() > MAX_VALUE_BYTES {
        return Err(PromiseError::invalid(format!(
            "{what} is {} bytes; a promise holds at most {MAX_VALUE_BYTES}",
            bytes.len()
        )));
    }
    Ok(())
}

pub(crate) fn check_tags(tags: &BTreeMap<String, String>) -> Result<(), PromiseError> {
    let bytes: usize = tags.iter().map(|(k, v)| k.len() + v.len()).sum();
    if bytes > MAX_TAGS_BYTES {
        return Err(PromiseError::invalid(format!(
            "tags are {bytes} bytes; a promise holds at most {MAX_TAGS_BYTES}"
        )));
    }
    Ok(())
}

pub(crate) fn check_opt_name(what: &str, s: Option<&str>) -> Result<(), PromiseError> {
    s.map_or(Ok(()), |s| check_name(what, s))
}
