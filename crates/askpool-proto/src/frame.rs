//! The frames of the worker-pool ask protocol (DESIGN section 3).
//!
//! In process they pass as objects, generic over the payload `M` and the reply
//! `R`; nothing here serializes. A cross-process transport encodes them.

use std::fmt;
use std::time::Duration;

use smol_str::SmolStr;

use crate::ack::Progress;
use crate::error::{AskError, CancelReason, Outcome};
use crate::fingerprint::PayloadFingerprint;
use crate::ids::{AskIds, CallerId};

macro_rules! name {
    ($(#[$doc:meta])* $name:ident) => {
        $(#[$doc])*
        ///
        /// Up to 23 bytes the name is stored inline (no allocation, and a
        /// clone is a copy, not a reference count that every ask on every
        /// core would write); a longer one is shared.
        #[derive(Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
        pub struct $name(SmolStr);

        impl $name {
            pub fn new(name: impl AsRef<str>) -> Self {
                Self(SmolStr::new(name.as_ref()))
            }
            pub fn as_str(&self) -> &str {
                &self.0
            }
        }
        impl From<&str> for $name {
            fn from(s: &str) -> Self {
                Self::new(s)
            }
        }
        impl From<String> for $name {
            fn from(s: String) -> Self {
                Self(SmolStr::from(s))
            }
        }
        impl From<&$name> for $name {
            fn from(s: &$name) -> Self {
                s.clone()
            }
        }
        impl fmt::Display for $name {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str(&self.0)
            }
        }
        impl fmt::Debug for $name {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                write!(f, "{:?}", &*self.0)
            }
        }
    };
}

name!(
    /// Name of a worker pool (a process group).
    PoolName
);

impl PoolName {
    /// Longest name a pool may have, in bytes.
    pub const MAX_LEN: usize = 255;

    /// A pool's name must say something and stay short: it is a label on
    /// metrics and in every error about the pool.
    pub fn validate(&self) -> Result<(), AskError> {
        check_name_len("a pool name", self.as_str(), Self::MAX_LEN)
    }

    /// The name as an error shows it: at most [`MAX_LEN`](Self::MAX_LEN)
    /// bytes, so that asking a name of megabytes does not make an error of
    /// megabytes.
    pub fn for_error(&self) -> String {
        let s = self.as_str();
        if s.len() <= Self::MAX_LEN {
            return s.to_owned();
        }
        let mut end = Self::MAX_LEN;
        while !s.is_char_boundary(end) {
            end -= 1;
        }
        format!("{}...", &s[..end])
    }
}
name!(
    /// Name of one worker inside a pool.
    WorkerId
);

impl WorkerId {
    /// Longest id a worker may have, in bytes.
    pub const MAX_LEN: usize = 255;

    /// An empty id could not be told from "no preferred worker" in a log or
    /// an error, and every request that prefers a worker carries its id.
    pub fn validate(&self) -> Result<(), AskError> {
        check_name_len("a worker id", self.as_str(), Self::MAX_LEN)
    }
}

fn check_name_len(what: &str, name: &str, max: usize) -> Result<(), AskError> {
    let len = name.len();
    if len == 0 || len > max {
        return Err(AskError::InvalidArgument {
            message: format!("{what} is 1 to {max} bytes, not {len}"),
        });
    }
    Ok(())
}

/// Everything a request carries besides its payload.
#[derive(Clone, Debug, PartialEq)]
pub struct RequestMeta {
    pub ids: AskIds,
    pub pool: PoolName,
    pub preferred_worker: Option<WorkerId>,
    /// Time the caller had left for the ask when it sent this attempt.
    /// Clocks are per node, so a deadline travels as a budget: the receiver
    /// adds it to its own `now`.
    pub budget: Duration,
    /// 1 for the first send, 2 for the first retry, ...
    pub attempt: u32,
    pub fingerprint: Option<PayloadFingerprint>,
    /// `false` for a tell: the worker runs and dedups it but sends nothing back.
    pub expects_reply: bool,
}

/// `AskRequest`: meta plus the payload object.
#[derive(Clone, Debug)]
pub struct Envelope<M> {
    pub meta: RequestMeta,
    pub payload: M,
}

/// Frames that travel from a caller to a pool.
#[derive(Clone, Debug)]
pub enum ToWorker<M> {
    Request(Envelope<M>),
    Cancel {
        ids: AskIds,
        pool: PoolName,
        reason: CancelReason,
    },
}

impl<M> ToWorker<M> {
    pub fn ids(&self) -> &AskIds {
        match self {
            ToWorker::Request(env) => &env.meta.ids,
            ToWorker::Cancel { ids, .. } => ids,
        }
    }
    pub fn pool(&self) -> &PoolName {
        match self {
            ToWorker::Request(env) => &env.meta.pool,
            ToWorker::Cancel { pool, .. } => pool,
        }
    }
}

/// Frames that travel from a pool back to the caller. Every one carries the
/// request's ids unchanged.
#[derive(Clone, Debug)]
pub enum ToCaller<R> {
    /// `AskAck`: the pool accepted the request (RECEIVED). Stops retries.
    Ack { ids: AskIds },
    /// A worker took the request (READ).
    Read { ids: AskIds },
    /// `AskReply`: the terminal outcome, live or replayed from the cache.
    /// `fingerprint` is that of the request the outcome answers: a caller
    /// whose ask is fingerprinted accepts only an outcome with the same one,
    /// so the stale outcome of an earlier request that reused the id (with
    /// another payload) can never complete it.
    Reply {
        ids: AskIds,
        outcome: Outcome<R>,
        fingerprint: Option<PayloadFingerprint>,
    },
    /// `AskRefused`: the pool turned this attempt away before running it
    /// (full, closing, a payload mismatch) and recorded nothing, so unlike
    /// a reply's error a retryable refusal is worth re-sending.
    /// `fingerprint` as for `Reply`.
    Refused {
        ids: AskIds,
        error: AskError,
        fingerprint: Option<PayloadFingerprint>,
    },
    /// `AskCancelled`: the request was cancelled at the worker.
    Cancelled { ids: AskIds, reason: CancelReason },
    /// `AskProgress`: a partial ack (fraction, note, metadata).
    Progress { ids: AskIds, progress: Progress },
    /// Several `AskAck`s for one caller, sent within one scheduling tick.
    AckBatch { caller: CallerId, acks: Vec<AskIds> },
}

impl<R> ToCaller<R> {
    /// The caller the frame goes to.
    pub fn caller(&self) -> CallerId {
        match self {
            ToCaller::AckBatch { caller, .. } => *caller,
            ToCaller::Ack { ids }
            | ToCaller::Read { ids }
            | ToCaller::Reply { ids, .. }
            | ToCaller::Refused { ids, .. }
            | ToCaller::Cancelled { ids, .. }
            | ToCaller::Progress { ids, .. } => ids.caller_id,
        }
    }

    /// The ids of the one ask the frame is about; `None` for a batch.
    pub fn ids(&self) -> Option<&AskIds> {
        match self {
            ToCaller::AckBatch { .. } => None,
            ToCaller::Ack { ids }
            | ToCaller::Read { ids }
            | ToCaller::Reply { ids, .. }
            | ToCaller::Refused { ids, .. }
            | ToCaller::Cancelled { ids, .. }
            | ToCaller::Progress { ids, .. } => Some(ids),
        }
    }
}
