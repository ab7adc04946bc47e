//! The dead-letter queue: asks that failed for good, kept for a human.
//!
//! An ask lands here when it ends with an error its retry policy calls
//! retryable (its retries ran out: `BufferFull` every time, `Unavailable`,
//! `AskTimeout`, ...) or with a Poison error (`DecodeFailure`). A handler's
//! reply is final and never re-sent, so a retryable error that comes as the
//! reply exhausted no retries and is not filed (a Poison one is). It keeps the
//! payload, so it can be inspected and replayed with the same request id
//! (a pool that did finish it answers from its reply cache; nothing runs
//! twice). A tell lands here the same way, filed as a tell, and is replayed
//! as one. The queue is bounded: when full, the oldest letter is dropped and
//! counted. A late outcome for a timed-out ask removes its letter.

use std::collections::VecDeque;

use askpool_proto::{
    AskError, AskIds, ErrorClass, PayloadFingerprint, PoolName, RequestId, RetryPolicy, Timestamp,
};

use crate::ask::ReplayHook;
use crate::telemetry;

/// Why an ask was dead-lettered.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DeadLetterReason {
    /// It ended with a retryable error after its attempts or time ran out.
    RetriesExhausted,
    /// It ended with a Poison error.
    Poison,
}

impl DeadLetterReason {
    /// The name every binding gives the reason (`RETRIES_EXHAUSTED`,
    /// `POISON`), spelled as error codes are.
    pub const fn as_str(self) -> &'static str {
        match self {
            DeadLetterReason::RetriesExhausted => "RETRIES_EXHAUSTED",
            DeadLetterReason::Poison => "POISON",
        }
    }
}

/// What was sent: its replay sends it the same way.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DeadLetterKind {
    /// An ask: its replay waits for the reply.
    Ask,
    /// A tell: its replay is one-way too, done when the pool accepts it
    /// (and deduplicated as a tell: a pool that ran it acknowledges it
    /// again rather than replaying its handler's answer).
    Tell,
}

impl DeadLetterKind {
    /// The name every binding gives the kind (`ASK`, `TELL`).
    pub const fn as_str(self) -> &'static str {
        match self {
            DeadLetterKind::Ask => "ASK",
            DeadLetterKind::Tell => "TELL",
        }
    }
}

/// One failed ask or tell.
#[derive(Clone, Debug)]
pub struct DeadLetter<M> {
    pub ids: AskIds,
    pub pool: PoolName,
    pub kind: DeadLetterKind,
    pub payload: M,
    /// The payload's fingerprint, if the ask had one: its replay carries it,
    /// so a pool that holds the id for another payload refuses the replay
    /// (`PayloadMismatch`) instead of answering it with the other's reply.
    pub fingerprint: Option<PayloadFingerprint>,
    pub error: AskError,
    pub attempts: u32,
    pub reason: DeadLetterReason,
    /// When it failed, on the node's clock.
    pub failed_at: Timestamp,
}

impl<M> DeadLetter<M> {
    pub fn request_id(&self) -> RequestId {
        self.ids.request_id
    }
}

/// Whether an ask that failed with `error` under `policy` is dead-lettered;
/// `replied`: the error is the pool's reply, not a refusal or a timeout.
pub(crate) fn reason_for(
    error: &AskError,
    policy: &RetryPolicy,
    replied: bool,
) -> Option<DeadLetterReason> {
    if error.class() == ErrorClass::Poison {
        Some(DeadLetterReason::Poison)
    } else if policy.is_retryable(error) && !replied {
        Some(DeadLetterReason::RetriesExhausted)
    } else {
        None
    }
}

/// A letter as the queue keeps it: with the hook its replays tell.
pub(crate) struct Filed<M, R> {
    pub(crate) letter: DeadLetter<M>,
    pub(crate) replay_hook: Option<ReplayHook<R>>,
}

pub(crate) struct DeadLetterQueue<M, R> {
    capacity: usize,
    letters: VecDeque<Filed<M, R>>,
    dropped: u64,
}

impl<M, R> DeadLetterQueue<M, R> {
    pub(crate) fn new(capacity: usize) -> Self {
        Self {
            capacity,
            letters: VecDeque::new(),
            dropped: 0,
        }
    }

    pub(crate) fn push(&mut self, letter: DeadLetter<M>, replay_hook: Option<ReplayHook<R>>) {
        if self.capacity == 0 {
            self.dropped += 1;
            return;
        }
        let before = self.letters.len();
        while self.letters.len() >= self.capacity {
            self.letters.pop_front();
            self.dropped += 1;
        }
        self.letters.push_back(Filed {
            letter,
            replay_hook,
        });
        telemetry::dlq_depth_changed(self.letters.len() as isize - before as isize);
    }

    pub(crate) fn take(&mut self, id: RequestId) -> Option<Filed<M, R>> {
        let index = self.iter().position(|l| l.request_id() == id)?;
        let taken = self.letters.remove(index);
        telemetry::dlq_depth_changed(-1);
        taken
    }

    /// Takes the letter `id` if it is of `kind` (any kind: `None`); a
    /// letter of the other kind stays queued. `Err(None)`: no such letter;
    /// `Err(Some(k))`: it is a `k`'s. One look under the queue's lock, so
    /// the kind checked is the kind taken.
    pub(crate) fn take_kind(
        &mut self,
        id: RequestId,
        kind: Option<DeadLetterKind>,
    ) -> Result<Filed<M, R>, Option<DeadLetterKind>> {
        match self.get(id) {
            None => Err(None),
            Some(letter) if kind.is_some_and(|k| k != letter.kind) => Err(Some(letter.kind)),
            Some(_) => self.take(id).ok_or(None),
        }
    }

    pub(crate) fn get(&self, id: RequestId) -> Option<&DeadLetter<M>> {
        self.iter().find(|l| l.request_id() == id)
    }

    pub(crate) fn iter(&self) -> impl Iterator<Item = &DeadLetter<M>> {
        self.letters.iter().map(|f| &f.letter)
    }

    pub(crate) fn purge(&mut self) -> usize {
        let n = self.letters.len();
        self.letters.clear();
        telemetry::dlq_depth_changed(-(n as isize));
        n
    }

    pub(crate) fn len(&self) -> usize {
        self.letters.len()
    }

    pub(crate) fn dropped(&self) -> u64 {
        self.dropped
    }
}

/// A queue dropped with its node takes its letters out of the process's
/// gauge.
impl<M, R> Drop for DeadLetterQueue<M, R> {
    fn drop(&mut self) {
        telemetry::dlq_depth_changed(-(self.letters.len() as isize));
    }
}
