//! The inbound (worker-side) state machine of DESIGN section 3, per dedup key.
//!
//! | state / event | AskRequest                      | AskCancel                          | handler finishes            |
//! |---------------|---------------------------------|------------------------------------|-----------------------------|
//! | absent        | -> InProgress, run once, Ack    | -> Cancelled tombstone             | — (ignored)                 |
//! | InProgress    | Ack (handler not re-run)        | -> Cancelled, send AskCancelled    | -> Replied, send + cache    |
//! | Replied       | replay cached Reply (same ids)  | ignore                             | — (ignored)                 |
//! | Cancelled     | send AskCancelled               | ignore                             | suppress: no Reply ever     |
//!
//! Before any duplicate is answered its fingerprint is checked against the
//! entry's ([`FingerprintRecord::admits`]): a mismatch is answered
//! `PayloadMismatch` and changes nothing. First terminal state wins: nothing
//! leaves Replied or Cancelled except eviction.
//!
//! [`step`] is the whole table: a pure function of the current state and the
//! event. The runtime stores the states (askpool-dedup) and performs the
//! [`InboundAction`]s.

use crate::error::{CancelReason, Outcome};
use crate::fingerprint::{FingerprintRecord, PayloadFingerprint};

/// The stored state of one dedup key. Absent is `None`.
#[derive(Clone, Debug, PartialEq)]
pub enum InboundState<R> {
    InProgress {
        fingerprint: FingerprintRecord,
    },
    Replied {
        fingerprint: FingerprintRecord,
        outcome: Outcome<R>,
    },
    Cancelled {
        fingerprint: FingerprintRecord,
        reason: CancelReason,
    },
}

impl<R> InboundState<R> {
    /// Replied and Cancelled are terminal: only eviction removes them.
    pub fn is_terminal(&self) -> bool {
        !matches!(self, InboundState::InProgress { .. })
    }

    pub fn fingerprint(&self) -> FingerprintRecord {
        match self {
            InboundState::InProgress { fingerprint }
            | InboundState::Replied { fingerprint, .. }
            | InboundState::Cancelled { fingerprint, .. } => *fingerprint,
        }
    }

    pub fn phase(&self) -> InboundPhase {
        match self {
            InboundState::InProgress { .. } => InboundPhase::InProgress,
            InboundState::Replied { .. } => InboundPhase::Replied,
            InboundState::Cancelled { .. } => InboundPhase::Cancelled,
        }
    }
}

/// The rows of the table, without their data.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum InboundPhase {
    Absent,
    InProgress,
    Replied,
    Cancelled,
}

/// The columns of the table.
#[derive(Clone, Debug, PartialEq)]
pub enum InboundEvent<R> {
    Request {
        fingerprint: Option<PayloadFingerprint>,
    },
    Cancel {
        reason: CancelReason,
    },
    HandlerFinished {
        outcome: Outcome<R>,
    },
}

/// What the runtime must do after a step.
#[derive(Clone, Debug, PartialEq)]
pub enum InboundAction<R> {
    /// First request: hand it to a worker (once) and send `AskAck`.
    RunHandlerAndAck,
    /// Duplicate of a running request: send `AskAck`, do not run it again.
    Ack,
    /// Duplicate of a finished request: send the cached reply, ids unchanged.
    Replay(Outcome<R>),
    /// The handler finished first: send its reply (already cached).
    SendReply(Outcome<R>),
    /// Answer `AskCancelled` with this reason. For a cancel of a running
    /// request the runtime also signals the handler's cancellation token.
    SendCancelled(CancelReason),
    /// A cancel arrived before its request: the tombstone is recorded, and the
    /// request, if it ever comes, is answered `AskCancelled` without running.
    RecordTombstone,
    /// Same key, different payload: answer `PayloadMismatch`; nothing changes.
    RejectMismatch,
    /// The handler finished after a cancel: its reply is dropped, never sent.
    SuppressReply,
    /// Nothing to do.
    Ignore,
}

/// The result of one step: the state to store (`None` = leave it as it is)
/// and the action to perform.
#[derive(Clone, Debug, PartialEq)]
pub struct InboundTransition<R> {
    pub next: Option<InboundState<R>>,
    pub action: InboundAction<R>,
}

impl<R> InboundTransition<R> {
    fn stay(action: InboundAction<R>) -> Self {
        Self { next: None, action }
    }
    fn to(next: InboundState<R>, action: InboundAction<R>) -> Self {
        Self {
            next: Some(next),
            action,
        }
    }
}

/// The table of DESIGN section 3. `current` is `None` for an absent key.
// Inline: a driver calls it with a known event (a request, a handler's
// outcome) twice per request, and the rest of the table folds away.
#[inline]
pub fn step<R: Clone>(
    current: Option<&InboundState<R>>,
    event: InboundEvent<R>,
) -> InboundTransition<R> {
    use InboundAction as A;
    use InboundState as S;
    match (current, event) {
        // --- absent ---
        (None, InboundEvent::Request { fingerprint }) => InboundTransition::to(
            S::InProgress {
                fingerprint: FingerprintRecord::of(fingerprint),
            },
            A::RunHandlerAndAck,
        ),
        (None, InboundEvent::Cancel { reason }) => InboundTransition::to(
            S::Cancelled {
                fingerprint: FingerprintRecord::Tombstone,
                reason,
            },
            A::RecordTombstone,
        ),
        // No entry to complete: InProgress entries are never evicted, so this
        // only happens for a handler that outlived a worker restart.
        (None, InboundEvent::HandlerFinished { .. }) => InboundTransition::stay(A::Ignore),

        // --- duplicates of any stored request: the fingerprint gate first ---
        (Some(state), InboundEvent::Request { fingerprint })
            if !state.fingerprint().admits(fingerprint) =>
        {
            InboundTransition::stay(A::RejectMismatch)
        }

        // --- InProgress ---
        (Some(S::InProgress { .. }), InboundEvent::Request { .. }) => {
            InboundTransition::stay(A::Ack)
        }
        (Some(S::InProgress { fingerprint }), InboundEvent::Cancel { reason }) => {
            InboundTransition::to(
                S::Cancelled {
                    fingerprint: *fingerprint,
                    reason,
                },
                A::SendCancelled(reason),
            )
        }
        (Some(S::InProgress { fingerprint }), InboundEvent::HandlerFinished { outcome }) => {
            InboundTransition::to(
                S::Replied {
                    fingerprint: *fingerprint,
                    outcome: outcome.clone(),
                },
                A::SendReply(outcome),
            )
        }

        // --- Replied ---
        (Some(S::Replied { outcome, .. }), InboundEvent::Request { .. }) => {
            InboundTransition::stay(A::Replay(outcome.clone()))
        }
        (Some(S::Replied { .. }), InboundEvent::Cancel { .. }) => {
            InboundTransition::stay(A::Ignore)
        }
        (Some(S::Replied { .. }), InboundEvent::HandlerFinished { .. }) => {
            InboundTransition::stay(A::Ignore)
        }

        // --- Cancelled ---
        (Some(S::Cancelled { reason, .. }), InboundEvent::Request { .. }) => {
            InboundTransition::stay(A::SendCancelled(*reason))
        }
        (Some(S::Cancelled { .. }), InboundEvent::Cancel { .. }) => {
            InboundTransition::stay(A::Ignore)
        }
        (Some(S::Cancelled { .. }), InboundEvent::HandlerFinished { .. }) => {
            InboundTransition::stay(A::SuppressReply)
        }
    }
}
