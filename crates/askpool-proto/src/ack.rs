//! The SW4RM ACK lifecycle of one ask, as the caller sees it (DESIGN section 4,
//! seed 002).
//!
//! An [`AckTracker`] starts at `SENT` when the caller sends the request and
//! moves forward as the pool's frames arrive: `RECEIVED` (the Ack: accepted
//! into the pool's queue), `READ` (a worker took and validated it), any number
//! of `PARTIAL` progress events, then exactly one terminal stage.
//!
//! # Stages
//!
//! | stage       | rank | terminal | set by                                           |
//! |-------------|------|----------|--------------------------------------------------|
//! | `SENT`      | 0    | no       | the caller, at [`AckTracker::new`]               |
//! | `RECEIVED`  | 1    | no       | the pool's Ack                                   |
//! | `READ`      | 2    | no       | the worker that took the request                 |
//! | `PARTIAL`   | 3    | no       | the worker's progress reports (repeatable)       |
//! | `FULFILLED` | 4    | yes      | an `Ok` reply                                    |
//! | `REJECTED`  | 4    | yes      | an error reply refusing the request (see below)  |
//! | `FAILED`    | 4    | yes      | an error reply after processing started          |
//! | `TIMED_OUT` | 4    | yes      | the caller's deadline, or a timeout error reply  |
//!
//! # Transitions of [`AckTracker::advance`]
//!
//! Rows are the current stage, columns the stage fed. `ok` applies it;
//! every other cell is refused with the [`StageError`] named and changes
//! nothing. `T` is any of the four terminals.
//!
//! | from \ to  | SENT          | RECEIVED      | READ          | PARTIAL       | T             |
//! |------------|---------------|---------------|---------------|---------------|---------------|
//! | `SENT`     | Repeated      | ok            | ok            | Illegal       | ok            |
//! | `RECEIVED` | Illegal       | Repeated      | ok            | ok            | ok            |
//! | `READ`     | Illegal       | Illegal       | Repeated      | ok            | ok            |
//! | `PARTIAL`  | Illegal       | Illegal       | Illegal       | ok            | ok            |
//! | T          | AfterTerminal | AfterTerminal | AfterTerminal | AfterTerminal | AfterTerminal |
//!
//! - Stages only move forward, and forward **jumps** are legal: the Ack (or
//!   the READ report) may be lost or never sent, e.g. an admission refusal
//!   (`BUFFER_FULL`) is a `SENT -> REJECTED` jump, and a reply whose Ack was
//!   lost is `SENT -> FULFILLED`.
//! - `PARTIAL` is legal from `RECEIVED`, `READ` or `PARTIAL`: a progress
//!   report implies the request was received (the worker may not report
//!   `READ` separately). It is **refused from `SENT`**: no progress report can
//!   precede the pool's Ack on an ordered link. A driver that receives one
//!   anyway (lossy cross-process link) feeds `RECEIVED` first, then the
//!   progress.
//! - Repeated `PARTIAL` events are progress, not repeats. Their fraction, if
//!   given, must be in `[0, 1]` ([`StageError::InvalidProgress`]) and must not
//!   be lower than the last one reported ([`StageError::ProgressDecreased`]);
//!   its note and metadata must be within [`Progress::MAX_BYTES`] and
//!   [`Progress::MAX_METADATA`] ([`StageError::OversizeProgress`]);
//!   an equal fraction is fine. A `PARTIAL` without a fraction
//!   ([`AckTracker::advance`] with [`AckStage::Partial`]) is a heartbeat and
//!   leaves the last fraction as it was.
//! - Any other stage fed twice is [`StageError::Repeated`] (a duplicate Ack is
//!   normal: the caller re-sends until acknowledged). A backward move is
//!   [`StageError::Illegal`]. The first terminal wins: anything after it is
//!   [`StageError::AfterTerminal`]. The driver drops the frame in every error
//!   case; none of them is fatal to the ask.
//!
//! # Late reconciliation
//!
//! After the caller recorded `TIMED_OUT` locally, the pool's real outcome may
//! still arrive. [`AckTracker::reconcile`] records it **once**: it is legal
//! only when the current stage is `TIMED_OUT` and the outcome is `FULFILLED`,
//! `REJECTED` or `FAILED`. The current stage stays `TIMED_OUT` (the failed
//! future stays failed; [`AckTracker::stage`]), the record's outcome becomes
//! the reconciled one ([`AckTracker::reconciled`],
//! [`AckTracker::effective_stage`]), and a [`LateOutcome`] is returned for the
//! late-outcome event and metric. The driver then clears the ask's retries and
//! DLQ mark. The checks run in this order: the outcome must be a terminal other
//! than `TIMED_OUT` ([`StageError::NotAnOutcome`]), the current stage must be
//! `TIMED_OUT` ([`StageError::NotTimedOut`]), and no outcome may have been
//! reconciled yet ([`StageError::AlreadyReconciled`]).
//!
//! # Outcome to terminal stage
//!
//! [`AckStage::terminal_for_error`] / [`AckStage::terminal_for_code`] /
//! [`AckStage::terminal_for_outcome`]:
//!
//! | outcome                                                                                                                                                          | terminal    |
//! |------------------------------------------------------------------------------------------------------------------------------------------------------------------|-------------|
//! | `Ok(_)`                                                                                                                                                          | `FULFILLED` |
//! | `INVALID_ARGUMENT`, `VALIDATION_ERROR`, `PAYLOAD_MISMATCH`, `PERMISSION_DENIED`, `OVERSIZE_PAYLOAD`, `FAILED_PRECONDITION`, `NO_ROUTE`, `DECODE_FAILURE`, `BUFFER_FULL`, `UNAVAILABLE` | `REJECTED`  |
//! | `ASK_TIMEOUT`, `DEADLINE_EXCEEDED`                                                                                                                               | `TIMED_OUT` |
//! | `HANDLER_FAILED`, `INTERNAL`, `ASK_CANCELLED`                                                                                                                    | `FAILED`    |
//!
//! One error maps by more than its code: `ASK_CANCELLED` because the pool's
//! processing timeout expired is `TIMED_OUT` (seed 002: "processing exceeded
//! configured deadline"); every other cancel is `FAILED`.
//!
//! `REJECTED` means the request was refused before any processing (policy,
//! validation, routing, admission); `FAILED` means processing started and did
//! not succeed (or was cancelled).
//!
//! # Time and memory
//!
//! Every event carries `now`; the tracker reads no clock. Durations saturate
//! at zero if the driver's `now` goes backwards. The history holds `SENT`, at
//! most one each of `RECEIVED` and `READ`, the terminal, and the **last
//! [`MAX_PARTIAL_EVENTS`] `PARTIAL` events**: older progress events are
//! dropped (counted by [`AckTracker::partial_events`]), so a chatty worker
//! cannot grow an ask's record without bound.

use std::fmt;
use std::time::Duration;

use crate::error::{AskError, CancelReason, ErrorCode, Outcome};
use crate::time::Timestamp;

/// How many `PARTIAL` events [`AckTracker::history`] keeps (the most recent).
pub const MAX_PARTIAL_EVENTS: usize = 32;

/// A stage of the ACK lifecycle.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum AckStage {
    Sent,
    Received,
    Read,
    Partial,
    Fulfilled,
    Rejected,
    Failed,
    TimedOut,
}

impl AckStage {
    /// Every stage, in rank order (terminals last).
    pub const ALL: [AckStage; 8] = [
        AckStage::Sent,
        AckStage::Received,
        AckStage::Read,
        AckStage::Partial,
        AckStage::Fulfilled,
        AckStage::Rejected,
        AckStage::Failed,
        AckStage::TimedOut,
    ];

    /// The four terminal stages.
    pub const TERMINALS: [AckStage; 4] = [
        AckStage::Fulfilled,
        AckStage::Rejected,
        AckStage::Failed,
        AckStage::TimedOut,
    ];

    /// Fulfilled, Rejected, Failed and TimedOut end the lifecycle.
    pub const fn is_terminal(self) -> bool {
        matches!(
            self,
            AckStage::Fulfilled | AckStage::Rejected | AckStage::Failed | AckStage::TimedOut
        )
    }

    /// Position in the lifecycle: stages only move to a higher rank (or stay
    /// at `PARTIAL`). All terminals share the highest rank, 4.
    pub const fn rank(self) -> u8 {
        match self {
            AckStage::Sent => 0,
            AckStage::Received => 1,
            AckStage::Read => 2,
            AckStage::Partial => 3,
            AckStage::Fulfilled | AckStage::Rejected | AckStage::Failed | AckStage::TimedOut => 4,
        }
    }

    /// The stable SCREAMING_SNAKE name (metric label `stage`, bindings).
    pub const fn as_str(self) -> &'static str {
        match self {
            AckStage::Sent => "SENT",
            AckStage::Received => "RECEIVED",
            AckStage::Read => "READ",
            AckStage::Partial => "PARTIAL",
            AckStage::Fulfilled => "FULFILLED",
            AckStage::Rejected => "REJECTED",
            AckStage::Failed => "FAILED",
            AckStage::TimedOut => "TIMED_OUT",
        }
    }

    /// The terminal stage of an error outcome (table in the module doc).
    pub const fn terminal_for_code(code: ErrorCode) -> AckStage {
        use ErrorCode::*;
        match code {
            InvalidArgument | ValidationError | PayloadMismatch | PermissionDenied
            | OversizePayload | FailedPrecondition | NoRoute | DecodeFailure | BufferFull
            | Unavailable => AckStage::Rejected,
            AskTimeout | DeadlineExceeded => AckStage::TimedOut,
            HandlerFailed | Internal | AskCancelled => AckStage::Failed,
        }
    }

    /// The terminal stage of an error outcome (table in the module doc).
    pub fn terminal_for_error(error: &AskError) -> AckStage {
        match error {
            // The pool gave up at its processing deadline: seed 002's
            // TIMED_OUT ("processing exceeded configured deadline").
            AskError::AskCancelled {
                reason: CancelReason::ProcessingTimeout,
            } => AckStage::TimedOut,
            error => Self::terminal_for_code(error.code()),
        }
    }

    /// The terminal stage of an outcome: `Ok` is `FULFILLED`, an error maps by
    /// [`terminal_for_error`](Self::terminal_for_error).
    pub fn terminal_for_outcome<R>(outcome: &Outcome<R>) -> AckStage {
        match outcome {
            Ok(_) => AckStage::Fulfilled,
            Err(e) => Self::terminal_for_error(e),
        }
    }
}

impl fmt::Display for AckStage {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A progress report carried by a `PARTIAL` event.
#[derive(Clone, Debug, PartialEq)]
pub struct Progress {
    /// Completed fraction, in `[0, 1]`, never lower than the previous report.
    pub fraction: f32,
    /// Human-readable context, e.g. `"2300/5000 records"`.
    pub note: String,
    /// Key/value details for tools (SW4RM's partial-ack metadata).
    pub metadata: Vec<(String, String)>,
}

impl Progress {
    /// The most a report may carry, in UTF-8 bytes: its note and every
    /// metadata key and value together. A caller keeps up to 64 stage events
    /// per ask (and an ask's record keeps its last 32 reports), so this is
    /// what bounds the memory progress reports take.
    pub const MAX_BYTES: usize = 4096;
    /// The most metadata entries a report may carry (empty keys and values
    /// cost no bytes, but each entry costs memory).
    pub const MAX_METADATA: usize = 32;

    pub fn new(fraction: f32, note: impl Into<String>) -> Self {
        Self {
            fraction,
            note: note.into(),
            metadata: Vec::new(),
        }
    }

    #[must_use]
    pub fn with(mut self, key: impl Into<String>, value: impl Into<String>) -> Self {
        self.metadata.push((key.into(), value.into()));
        self
    }

    /// The bytes the report carries: its note and its metadata's keys and
    /// values (what [`MAX_BYTES`](Self::MAX_BYTES) bounds).
    pub fn size(&self) -> usize {
        self.metadata
            .iter()
            .fold(self.note.len(), |n, (k, v)| n + k.len() + v.len())
    }

    /// Whether the report is within [`MAX_BYTES`](Self::MAX_BYTES) and
    /// [`MAX_METADATA`](Self::MAX_METADATA).
    pub fn within_bounds(&self) -> bool {
        self.check_bounds().is_ok()
    }

    /// `InvalidArgument` for a report past the bounds, saying which; what a
    /// handler's `progress` call gets.
    pub fn check_bounds(&self) -> Result<(), crate::AskError> {
        if self.metadata.len() > Self::MAX_METADATA {
            return Err(crate::AskError::InvalidArgument {
                message: format!(
                    "a progress report carries at most {} metadata entries, not {}",
                    Self::MAX_METADATA,
                    self.metadata.len()
                ),
            });
        }
        let size = self.size();
        if size > Self::MAX_BYTES {
            return Err(crate::AskError::InvalidArgument {
                message: format!(
                    "a progress report's note and metadata are {size} bytes; at most {} are allowed",
                    Self::MAX_BYTES
                ),
            });
        }
        Ok(())
    }

    /// The fraction for a host whose numbers are `f64` (JS, Python): the
    /// `f64` nearest the fraction's shortest decimal form, so the `0.1` a
    /// handler reported comes back as `0.1`, not as the kept `f32`'s exact
    /// value `0.10000000149011612`.
    pub fn fraction_f64(&self) -> f64 {
        // `f32`'s Display is the shortest decimal that reads back as it.
        self.fraction
            .to_string()
            .parse()
            .unwrap_or(f64::from(self.fraction))
    }
}

/// One applied stage change, as recorded in the history and streamed to the
/// caller.
#[derive(Clone, Debug, PartialEq)]
pub struct StageEvent {
    pub stage: AckStage,
    /// When the driver fed it.
    pub at: Timestamp,
    /// Time since the previous event (the time spent in the previous stage);
    /// zero for `SENT`.
    pub since_previous: Duration,
    /// Time since `SENT`.
    pub since_sent: Duration,
    /// Set only on `PARTIAL` events reported with a fraction.
    pub progress: Option<Progress>,
}

/// The reconciled outcome of an ask that had timed out locally.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LateOutcome {
    /// `FULFILLED`, `REJECTED` or `FAILED`.
    pub stage: AckStage,
    /// When the late outcome arrived.
    pub at: Timestamp,
    /// Time from the local `TIMED_OUT` to the late outcome.
    pub late_by: Duration,
}

/// Why a stage change was refused. A refused change never alters the tracker.
#[derive(Clone, Debug, PartialEq, thiserror::Error)]
pub enum StageError {
    /// A backward move, or `PARTIAL` before `RECEIVED`.
    #[error("illegal ack stage transition {from} -> {to}")]
    Illegal { from: AckStage, to: AckStage },
    /// The same non-`PARTIAL` stage fed twice (e.g. a duplicate Ack).
    #[error("ack stage {stage} reported twice")]
    Repeated { stage: AckStage },
    /// The lifecycle already ended; the first terminal wins.
    #[error("ack already terminal at {terminal}; {to} refused")]
    AfterTerminal { terminal: AckStage, to: AckStage },
    /// A progress fraction outside `[0, 1]` (or NaN).
    #[error("progress fraction {fraction} is not in [0, 1]")]
    InvalidProgress { fraction: f32 },
    /// A progress report past [`Progress::MAX_BYTES`] or
    /// [`Progress::MAX_METADATA`] (a peer that did not check it).
    #[error("progress report of {size} bytes and {entries} metadata entries is past its bounds")]
    OversizeProgress { size: usize, entries: usize },
    /// A progress fraction lower than the last one reported.
    #[error("progress went backwards from {previous} to {fraction}")]
    ProgressDecreased { previous: f32, fraction: f32 },
    /// `reconcile` takes FULFILLED, REJECTED or FAILED only.
    #[error("{stage} is not an outcome that can reconcile a timeout")]
    NotAnOutcome { stage: AckStage },
    /// `reconcile` is legal only after a local TIMED_OUT.
    #[error("cannot reconcile an ask at {current}: only a timed-out ask is reconciled")]
    NotTimedOut { current: AckStage },
    /// A timed-out ask is reconciled once.
    #[error("ask already reconciled to {reconciled}")]
    AlreadyReconciled { reconciled: AckStage },
}

/// The ACK lifecycle of one ask at the caller. See the module doc for the
/// transition table.
#[derive(Clone, Debug)]
pub struct AckTracker {
    stage: AckStage,
    sent_at: Timestamp,
    last_at: Timestamp,
    /// When the terminal stage was recorded.
    terminal_at: Option<Timestamp>,
    last_fraction: Option<f32>,
    /// Every `PARTIAL` event ever applied, dropped ones included.
    partial_events: u64,
    history: Vec<StageEvent>,
    late: Option<LateOutcome>,
}

impl AckTracker {
    /// A tracker at `SENT`, sent at `sent_at`.
    pub fn new(sent_at: Timestamp) -> Self {
        let mut history = Vec::with_capacity(4);
        history.push(StageEvent {
            stage: AckStage::Sent,
            at: sent_at,
            since_previous: Duration::ZERO,
            since_sent: Duration::ZERO,
            progress: None,
        });
        Self {
            stage: AckStage::Sent,
            sent_at,
            last_at: sent_at,
            terminal_at: None,
            last_fraction: None,
            partial_events: 0,
            history,
            late: None,
        }
    }

    /// The stage recorded locally. Stays `TIMED_OUT` after a reconciliation.
    pub fn stage(&self) -> AckStage {
        self.stage
    }

    /// The stage of the ack record: the reconciled outcome if there is one,
    /// else [`stage`](Self::stage).
    pub fn effective_stage(&self) -> AckStage {
        self.late.map_or(self.stage, |l| l.stage)
    }

    pub fn is_terminal(&self) -> bool {
        self.stage.is_terminal()
    }

    pub fn sent_at(&self) -> Timestamp {
        self.sent_at
    }

    /// When the terminal stage was recorded, if it was.
    pub fn terminal_at(&self) -> Option<Timestamp> {
        self.terminal_at
    }

    /// The last progress fraction reported, if any.
    pub fn last_fraction(&self) -> Option<f32> {
        self.last_fraction
    }

    /// How many `PARTIAL` events were applied, including those the bounded
    /// history has dropped.
    pub fn partial_events(&self) -> u64 {
        self.partial_events
    }

    /// The outcome a timed-out ask was reconciled to.
    pub fn reconciled(&self) -> Option<AckStage> {
        self.late.map(|l| l.stage)
    }

    pub fn late_outcome(&self) -> Option<&LateOutcome> {
        self.late.as_ref()
    }

    /// The applied events in order, starting with `SENT`; only the last
    /// [`MAX_PARTIAL_EVENTS`] `PARTIAL` events are kept.
    pub fn history(&self) -> &[StageEvent] {
        &self.history
    }

    /// Moves to `to` (table in the module doc). `to` may be
    /// [`AckStage::Partial`]: a progress heartbeat without a fraction.
    pub fn advance(&mut self, to: AckStage, now: Timestamp) -> Result<StageEvent, StageError> {
        self.apply(to, None, now).cloned()
    }

    /// [`advance`](Self::advance) without a copy of the event: it is
    /// borrowed from the history, for a driver that copies it only when
    /// someone reads it (most asks have no stage reader).
    #[inline]
    pub fn record(&mut self, to: AckStage, now: Timestamp) -> Result<&StageEvent, StageError> {
        self.apply(to, None, now)
    }

    /// A `PARTIAL` event with a progress report.
    pub fn advance_partial(
        &mut self,
        progress: Progress,
        now: Timestamp,
    ) -> Result<StageEvent, StageError> {
        self.apply(AckStage::Partial, Some(progress), now).cloned()
    }

    /// [`advance_partial`](Self::advance_partial), the event borrowed as in
    /// [`record`](Self::record).
    pub fn record_partial(
        &mut self,
        progress: Progress,
        now: Timestamp,
    ) -> Result<&StageEvent, StageError> {
        self.apply(AckStage::Partial, Some(progress), now)
    }

    /// Records the late outcome of a timed-out ask, once (module doc).
    pub fn reconcile(
        &mut self,
        outcome_stage: AckStage,
        now: Timestamp,
    ) -> Result<LateOutcome, StageError> {
        if !outcome_stage.is_terminal() || outcome_stage == AckStage::TimedOut {
            return Err(StageError::NotAnOutcome {
                stage: outcome_stage,
            });
        }
        if self.stage != AckStage::TimedOut {
            return Err(StageError::NotTimedOut {
                current: self.stage,
            });
        }
        if let Some(late) = self.late {
            return Err(StageError::AlreadyReconciled {
                reconciled: late.stage,
            });
        }
        let timed_out_at = self.terminal_at.unwrap_or(self.last_at);
        let late = LateOutcome {
            stage: outcome_stage,
            at: now,
            late_by: now.saturating_since(timed_out_at),
        };
        self.late = Some(late);
        Ok(late)
    }

    /// Checks `to` against the current stage without applying it.
    fn check(&self, to: AckStage) -> Result<(), StageError> {
        let from = self.stage;
        if from.is_terminal() {
            return Err(StageError::AfterTerminal { terminal: from, to });
        }
        if to == AckStage::Partial {
            return match from {
                AckStage::Received | AckStage::Read | AckStage::Partial => Ok(()),
                _ => Err(StageError::Illegal { from, to }),
            };
        }
        if to == from {
            return Err(StageError::Repeated { stage: to });
        }
        if to.rank() < from.rank() {
            return Err(StageError::Illegal { from, to });
        }
        Ok(())
    }

    // Inline (across crates, into a driver's `record`): with no progress
    // report, its checks fold away; a tracked ask records three stages.
    #[inline]
    fn apply(
        &mut self,
        to: AckStage,
        progress: Option<Progress>,
        now: Timestamp,
    ) -> Result<&StageEvent, StageError> {
        self.check(to)?;
        if let Some(p) = &progress {
            if !p.within_bounds() {
                return Err(StageError::OversizeProgress {
                    size: p.size(),
                    entries: p.metadata.len(),
                });
            }
            if !(0.0..=1.0).contains(&p.fraction) {
                return Err(StageError::InvalidProgress {
                    fraction: p.fraction,
                });
            }
            if let Some(previous) = self.last_fraction {
                if p.fraction < previous {
                    return Err(StageError::ProgressDecreased {
                        previous,
                        fraction: p.fraction,
                    });
                }
            }
        }
        // Checked: from here on the event is applied.
        if let Some(p) = &progress {
            self.last_fraction = Some(p.fraction);
        }
        let event = StageEvent {
            stage: to,
            at: now,
            since_previous: now.saturating_since(self.last_at),
            since_sent: now.saturating_since(self.sent_at),
            progress,
        };
        if to == AckStage::Partial {
            self.partial_events += 1;
            if self.partial_events > MAX_PARTIAL_EVENTS as u64 {
                // Partials are contiguous and come after SENT/RECEIVED/READ:
                // drop the oldest one.
                if let Some(i) = self
                    .history
                    .iter()
                    .position(|e| e.stage == AckStage::Partial)
                {
                    self.history.remove(i);
                }
            }
        }
        if to.is_terminal() {
            self.terminal_at = Some(now);
        }
        self.stage = to;
        self.last_at = now;
        self.history.push(event);
        Ok(self.history.last().expect("just pushed"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_fraction_reads_back_as_the_decimal_reported() {
        for f in [0.1, 0.2, 0.3, 1.0 / 3.0, 0.999_999, 0.0, 1.0] {
            let p = Progress::new(f as f32, "");
            assert_eq!(p.fraction_f64() as f32, p.fraction, "{f}");
        }
        assert_eq!(Progress::new(0.1, "").fraction_f64(), 0.1);
        assert_eq!(Progress::new(0.25, "").fraction_f64(), 0.25);
    }

    #[test]
    fn every_code_maps_to_a_terminal() {
        for code in ErrorCode::ALL {
            let stage = AckStage::terminal_for_code(code);
            assert!(stage.is_terminal(), "{code}");
            assert_ne!(stage, AckStage::Fulfilled, "{code}");
        }
        assert_eq!(
            AckStage::terminal_for_outcome::<()>(&Ok(())),
            AckStage::Fulfilled
        );
    }

    #[test]
    fn names_are_distinct() {
        let names: std::collections::HashSet<&str> =
            AckStage::ALL.iter().map(|s| s.as_str()).collect();
        assert_eq!(names.len(), AckStage::ALL.len());
    }
}
