//! The caller-side state machine of one ask (DESIGN section 3, seed 004).
//!
//! | state / event   | start          | Ack            | Reply               | AskCancelled   | timer (resend due)   | timer (deadline)        | local cancel          | send failed          |
//! |-----------------|----------------|----------------|---------------------|----------------|----------------------|-------------------------|-----------------------|----------------------|
//! | Unacked         | send #1        | -> Acked       | -> Done(reply)*     | -> Done(fail)  | send #n+1 (if < max) | -> Done(timeout)+cancel | -> Done(cancel)+cancel| retry or Done(error) |
//! | Acked           | —              | ignore         | -> Done(reply)*     | -> Done(fail)  | — (no resend)        | -> Done(timeout)+cancel | -> Done(cancel)+cancel| ignore               |
//! | Done            | —              | ignore         | ignore (duplicate)  | ignore         | —                    | —                       | ignore                | ignore               |
//!
//! \* The pool's reply is final, whatever error it carries: the handler ran
//! (or its cached outcome was replayed), so nothing is re-sent. A refusal
//! (`AskRefused`: the pool turned the attempt away before running it, e.g.
//! `BufferFull` at admission) carrying a retryable error (the policy's
//! `retryable` codes, by default the Transient class) is retried like a
//! failed send while attempts and time remain ([`CallerAsk::on_refused`]).
//!
//! With [`StageTimeouts`], a missed delivery (no Ack) or read (no READ)
//! deadline fails the ask with `DeadlineExceeded` plus a cancel, like the
//! total deadline does with `AskTimeout`.
//!
//! Every send carries the same request id; re-sends are spaced by
//! [`RetryPolicy`] backoff with jitter and never scheduled at or past the
//! deadline. The driver asks [`CallerAsk::next_wakeup`] when to call
//! [`CallerAsk::on_timer`]; frames that arrive at the same instant as a timer
//! are fed first, so a reply that made it wins over its deadline.

use std::time::Duration;

use rand_core::RngCore;

use crate::error::{AskError, CancelReason};
use crate::retry::RetryPolicy;
use crate::time::Timestamp;

/// A frame the driver must send for this ask.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CallerSend {
    /// Send (or re-send) the request, with this attempt number.
    Request { attempt: u32 },
    /// Send a best-effort `AskCancel`.
    Cancel { reason: CancelReason },
}

/// How the ask ended.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Resolution {
    /// The reply (or refusal) frame just fed is the ask's outcome: deliver it.
    Replied,
    /// The ask failed with this error.
    Failed(AskError),
}

/// What one event asks of the driver. Both fields may be set (a timeout
/// resolves the ask *and* sends a cancel).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct CallerStep {
    pub send: Option<CallerSend>,
    pub resolution: Option<Resolution>,
}

impl CallerStep {
    fn send(send: CallerSend) -> Self {
        Self {
            send: Some(send),
            resolution: None,
        }
    }
    fn resolve(resolution: Resolution) -> Self {
        Self {
            send: None,
            resolution: Some(resolution),
        }
    }
    fn nothing() -> Self {
        Self::default()
    }
}

/// Where the ask stands.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CallerPhase {
    /// Created, `start` not yet called.
    Idle,
    /// Sent, no Ack yet: re-sends are scheduled.
    Unacked,
    /// The pool accepted it: waiting for the outcome, no re-sends.
    Acked,
    /// Resolved. Every later event is ignored.
    Done,
}

/// The state of one ask at the caller.
#[derive(Clone, Debug)]
pub struct CallerAsk {
    policy: RetryPolicy,
    started: Timestamp,
    deadline: Timestamp,
    phase: CallerPhase,
    attempts_sent: u32,
    /// Whether any send reached the transport (the worker may have it).
    delivered: bool,
    next_resend: Option<Timestamp>,
    /// SW4RM delivery timeout: RECEIVED (the Ack) must come by then.
    delivery_deadline: Option<Timestamp>,
    /// SW4RM read timeout: READ must come by then.
    read_deadline: Option<Timestamp>,
    read: bool,
}

/// Deadlines for the ACK stages before the outcome, each counted from the
/// moment the ask was sent (SW4RM's TimeoutConfig; the total TTL is the
/// ask's own timeout). A stage deadline at or past the total one is moot.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct StageTimeouts {
    /// RECEIVED (the pool's Ack) must arrive within this.
    pub delivery: Option<Duration>,
    /// READ (a worker took it) must arrive within this.
    pub read: Option<Duration>,
}

impl CallerAsk {
    // Inline: built by value and handed on by value, a 128-byte machine is
    // otherwise copied in and out of each call.
    #[inline]
    pub fn new(policy: RetryPolicy, started: Timestamp, timeout: Duration) -> Self {
        Self {
            policy,
            started,
            deadline: started + timeout,
            phase: CallerPhase::Idle,
            attempts_sent: 0,
            delivered: false,
            next_resend: None,
            delivery_deadline: None,
            read_deadline: None,
            read: false,
        }
    }

    /// Adds stage deadlines. Missing one fails the ask with
    /// `DeadlineExceeded` and sends a best-effort cancel.
    #[must_use]
    #[inline]
    pub fn with_stage_timeouts(mut self, timeouts: StageTimeouts) -> Self {
        let before_total = |d: Duration| Some(self.started + d).filter(|t| *t < self.deadline);
        self.delivery_deadline = timeouts.delivery.and_then(before_total);
        self.read_deadline = timeouts.read.and_then(before_total);
        self
    }

    pub fn phase(&self) -> CallerPhase {
        self.phase
    }
    pub fn deadline(&self) -> Timestamp {
        self.deadline
    }
    pub fn started(&self) -> Timestamp {
        self.started
    }
    pub fn policy(&self) -> &RetryPolicy {
        &self.policy
    }
    pub fn attempts_sent(&self) -> u32 {
        self.attempts_sent
    }
    pub fn is_done(&self) -> bool {
        self.phase == CallerPhase::Done
    }

    /// When the driver must call [`on_timer`](Self::on_timer) next; `None`
    /// once the ask is resolved (no timer may outlive it).
    #[inline]
    pub fn next_wakeup(&self) -> Option<Timestamp> {
        let read = self.read_deadline.filter(|_| !self.read);
        let earliest = |a: Timestamp, b: Option<Timestamp>| b.map_or(a, |b| a.min(b));
        match self.phase {
            CallerPhase::Done | CallerPhase::Idle => None,
            CallerPhase::Acked => Some(earliest(self.deadline, read)),
            CallerPhase::Unacked => Some(earliest(
                earliest(
                    earliest(self.deadline, self.next_resend),
                    self.delivery_deadline,
                ),
                read,
            )),
        }
    }

    /// Sends the first attempt at once.
    // Inline, with the steps below: every ask starts, and the first
    // re-send's delay it schedules is a chain of small calls otherwise.
    #[inline]
    pub fn start(&mut self, now: Timestamp, rng: &mut dyn RngCore) -> CallerStep {
        if self.phase != CallerPhase::Idle {
            return CallerStep::nothing();
        }
        if now >= self.deadline {
            return self.finish(Resolution::Failed(self.timeout_error(now)));
        }
        self.phase = CallerPhase::Unacked;
        self.send_attempt(now, rng)
    }

    /// The transport accepted the last send.
    pub fn on_sent(&mut self) {
        self.delivered = true;
    }

    /// The transport refused the last send.
    pub fn on_send_failed(
        &mut self,
        now: Timestamp,
        error: AskError,
        rng: &mut dyn RngCore,
    ) -> CallerStep {
        if self.phase != CallerPhase::Unacked {
            return CallerStep::nothing();
        }
        self.retry_or_fail(now, error, rng)
    }

    /// `AskAck` (or a progress frame, which implies it) arrived.
    pub fn on_ack(&mut self) {
        if self.phase == CallerPhase::Unacked {
            self.phase = CallerPhase::Acked;
            self.next_resend = None;
        }
    }

    /// A worker took the request (READ); implies the Ack.
    pub fn on_read(&mut self) {
        if matches!(self.phase, CallerPhase::Unacked | CallerPhase::Acked) {
            self.read = true;
            self.on_ack();
        }
    }

    /// `AskReply` arrived: the request's outcome, live or replayed, error
    /// or not. It is final: the pool caches it under the request id, so a
    /// re-send would only replay it (a handler's transient error included).
    #[inline]
    pub fn on_reply(&mut self) -> CallerStep {
        match self.phase {
            CallerPhase::Done | CallerPhase::Idle => CallerStep::nothing(),
            _ => self.finish(Resolution::Replied),
        }
    }

    /// `AskRefused` arrived: the pool turned an attempt away before running
    /// it (full, closing, payload mismatch) and recorded nothing. A
    /// retryable refusal is re-sent while attempts and time are left;
    /// anything else is the ask's outcome. After an Ack it is ignored: the
    /// pool holds the request (it acks duplicates, never refuses them), so
    /// the refusal answers an earlier attempt that came back late.
    pub fn on_refused(
        &mut self,
        now: Timestamp,
        error: &AskError,
        rng: &mut dyn RngCore,
    ) -> CallerStep {
        match self.phase {
            CallerPhase::Done | CallerPhase::Idle | CallerPhase::Acked => CallerStep::nothing(),
            _ if self.policy.is_retryable(error) && self.can_resend(now) => {
                self.schedule_resend(now, rng);
                if self.next_resend.is_some() {
                    self.phase = CallerPhase::Unacked;
                    CallerStep::nothing()
                } else {
                    self.finish(Resolution::Replied)
                }
            }
            _ => self.finish(Resolution::Replied),
        }
    }

    /// `AskCancelled` arrived from the worker.
    pub fn on_cancelled(&mut self, reason: CancelReason) -> CallerStep {
        match self.phase {
            CallerPhase::Done | CallerPhase::Idle => CallerStep::nothing(),
            _ => self.finish(Resolution::Failed(AskError::AskCancelled { reason })),
        }
    }

    /// The time from [`next_wakeup`](Self::next_wakeup) has come.
    pub fn on_timer(&mut self, now: Timestamp, rng: &mut dyn RngCore) -> CallerStep {
        match self.phase {
            CallerPhase::Done | CallerPhase::Idle => CallerStep::nothing(),
            _ if now >= self.deadline => {
                let mut step = self.finish(Resolution::Failed(self.timeout_error(now)));
                step.send = Some(CallerSend::Cancel {
                    reason: CancelReason::CallerTimeout,
                });
                step
            }
            CallerPhase::Unacked if self.delivery_deadline.is_some_and(|t| now >= t) => {
                self.miss_stage_deadline()
            }
            _ if !self.read && self.read_deadline.is_some_and(|t| now >= t) => {
                self.miss_stage_deadline()
            }
            CallerPhase::Unacked if self.next_resend.is_some_and(|t| now >= t) => {
                self.send_attempt(now, rng)
            }
            _ => CallerStep::nothing(),
        }
    }

    fn miss_stage_deadline(&mut self) -> CallerStep {
        let mut step = self.finish(Resolution::Failed(AskError::DeadlineExceeded));
        step.send = Some(CallerSend::Cancel {
            reason: CancelReason::CallerTimeout,
        });
        step
    }

    /// The caller gave up (dropped the future, `cancel()`, host cancellation).
    pub fn cancel(&mut self) -> CallerStep {
        match self.phase {
            CallerPhase::Done => CallerStep::nothing(),
            CallerPhase::Idle => self.finish(Resolution::Failed(AskError::AskCancelled {
                reason: CancelReason::Caller,
            })),
            _ => {
                let mut step = self.finish(Resolution::Failed(AskError::AskCancelled {
                    reason: CancelReason::Caller,
                }));
                step.send = Some(CallerSend::Cancel {
                    reason: CancelReason::Caller,
                });
                step
            }
        }
    }

    /// The node shut down under the ask.
    pub fn abort(&mut self, error: AskError) -> CallerStep {
        match self.phase {
            CallerPhase::Done => CallerStep::nothing(),
            _ => self.finish(Resolution::Failed(error)),
        }
    }

    #[inline]
    fn send_attempt(&mut self, now: Timestamp, rng: &mut dyn RngCore) -> CallerStep {
        self.attempts_sent += 1;
        self.next_resend = None;
        if self.attempts_sent < self.policy.max_attempts {
            self.schedule_resend(now, rng);
        }
        CallerStep::send(CallerSend::Request {
            attempt: self.attempts_sent,
        })
    }

    fn can_resend(&self, now: Timestamp) -> bool {
        self.attempts_sent < self.policy.max_attempts && now < self.deadline
    }

    /// Schedules the next re-send, unless it would fall at or past the deadline.
    #[inline]
    fn schedule_resend(&mut self, now: Timestamp, rng: &mut dyn RngCore) {
        let at = now + self.policy.delay(self.attempts_sent + 1, rng);
        self.next_resend = (at < self.deadline).then_some(at);
    }

    fn retry_or_fail(
        &mut self,
        now: Timestamp,
        error: AskError,
        rng: &mut dyn RngCore,
    ) -> CallerStep {
        let retryable = self.policy.is_retryable(&error);
        if retryable && self.can_resend(now) {
            self.schedule_resend(now, rng);
            if self.next_resend.is_some() {
                return CallerStep::nothing();
            }
        }
        if self.delivered && retryable {
            // An earlier attempt reached the pool; its reply may still come.
            return CallerStep::nothing();
        }
        self.finish(Resolution::Failed(error))
    }

    fn timeout_error(&self, now: Timestamp) -> AskError {
        let elapsed = now.saturating_since(self.started);
        AskError::AskTimeout {
            elapsed_ms: u64::try_from(elapsed.as_millis()).unwrap_or(u64::MAX),
        }
    }

    fn finish(&mut self, resolution: Resolution) -> CallerStep {
        self.phase = CallerPhase::Done;
        self.next_resend = None;
        CallerStep::resolve(resolution)
    }
}
