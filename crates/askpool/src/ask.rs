//! The caller's side of one ask: [`AskBuilder`] and the [`AskHandle`] future
//! that drives askpool-proto's caller state machine.
//!
//! The handle owns the machine and the payload (for re-sends). Its next
//! wake-up waits in the node's deadline queue when it is the ask's deadline
//! and nothing else is pending (one tokio timer for all such asks), else on a
//! timer of the handle's own. Each poll feeds what arrived in the ask's slot
//! to the machine first, then fires the wake-up if it is due, then performs
//! the sends the machine asked for. Dropping an unfinished handle cancels the
//! ask: a best-effort `AskCancel` goes out and its pending entry is removed.

use std::future::{Future, IntoFuture};
use std::pin::Pin;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::task::{Context, Poll, Waker};
use std::time::Duration;

use askpool_proto::{
    AckStage, AskError, AskIds, CallerAsk, CallerSend, CallerStep, CausationId, CorrelationId,
    Envelope, PayloadFingerprint, PoolName, RequestId, RequestMeta, Resolution, RetryPolicy,
    StageTimeouts, Timestamp, ToWorker, WorkerId,
};
use rand::rngs::SmallRng;
use rand::SeedableRng;
use tokio::time::Sleep;

use crate::breakers::{Permit, Verdict};
use crate::dlq::{self, DeadLetter, DeadLetterKind, DeadLetterReason};
use crate::expiry::ExpiryKey;
use crate::node::{Node, NodeShared};
use crate::pending::{Arrivals, AskSlot, SlotEvent};
use crate::stages::{StageSource, StageStream};
use crate::telemetry;

/// The options of an ask or a tell, as plain data: what a binding parses
/// once and hands to either builder ([`AskBuilder::options`],
/// [`TellBuilder::options`]). `None` is the node's default.
#[derive(Clone, Debug, Default)]
pub struct AskOptions {
    pub timeout: Option<Duration>,
    /// Ignored by a tell.
    pub preferred_worker: Option<WorkerId>,
    pub request_id: Option<RequestId>,
    pub correlation_id: Option<CorrelationId>,
    pub causation_id: Option<CausationId>,
    pub retry: Option<RetryPolicy>,
    pub fingerprint: Option<PayloadFingerprint>,
    /// The payload's size in bytes, where the caller knows it.
    pub payload_size: Option<usize>,
}

/// Options of one ask; `send()` (or `.await`) sends it.
#[must_use = "an ask is sent by .send() or .await"]
pub struct AskBuilder<'a, M: Clone + Send + 'static, R: Clone + Send + 'static> {
    node: &'a Node<M, R>,
    pool: PoolName,
    payload: M,
    options: AskOptions,
    /// A tell: done at the Ack, no reply wanted.
    one_way: bool,
    /// A dead letter's replay: if it fails in any way, the letter goes back
    /// to the queue (with this reason unless the new error has its own).
    refile: Option<DeadLetterReason>,
    /// Told the outcome of this ask's dead letter's replays.
    replay_hook: Option<ReplayHook<R>>,
}

/// Told the outcome of a dead letter's replay (see
/// [`AskBuilder::on_replay_outcome`]).
pub type ReplayHook<R> = Arc<dyn Fn(Result<R, AskError>) + Send + Sync>;

impl<'a, M: Clone + Send + 'static, R: Clone + Send + 'static> AskBuilder<'a, M, R> {
    pub(crate) fn new(node: &'a Node<M, R>, pool: PoolName, payload: M) -> Self {
        Self {
            node,
            pool,
            payload,
            options: AskOptions::default(),
            one_way: false,
            refile: None,
            replay_hook: None,
        }
    }

    /// Makes this ask the replay of a dead letter filed for `reason`.
    pub(crate) fn refile_on_failure(mut self, reason: DeadLetterReason) -> Self {
        self.refile = Some(reason);
        self
    }

    /// Calls `hook` with the outcome of every replay of this ask's dead
    /// letter ([`Node::replay_dead_letter`](crate::Node::replay_dead_letter)),
    /// whoever replays it: an outcome kept elsewhere (a durable ask's
    /// promise) learns what the replay got. Not called for this ask itself,
    /// nor for a replay refused before it was sent or dropped unfinished. It
    /// runs where the replay is polled, cancelled or dropped (an outcome
    /// that had arrived counts): it must not block for long. A panic in it
    /// is logged; the replay ends as it did.
    pub fn on_replay_outcome(
        mut self,
        hook: impl Fn(Result<R, AskError>) + Send + Sync + 'static,
    ) -> Self {
        self.replay_hook = Some(Arc::new(hook));
        self
    }

    /// A replay carries its letter's hook (and files it with the letter if
    /// it fails again).
    pub(crate) fn replay_hook(mut self, hook: Option<ReplayHook<R>>) -> Self {
        self.replay_hook = hook;
        self
    }

    /// Sets every option at once (replacing those set before).
    pub fn options(mut self, options: AskOptions) -> Self {
        self.options = options;
        self
    }

    /// Fails the ask with `AskTimeout` after `timeout` (default: the node's).
    pub fn timeout(mut self, timeout: Duration) -> Self {
        self.options.timeout = Some(timeout);
        self
    }
    /// Routes to this worker while it is alive, else to any worker of the pool.
    pub fn preferred_worker(mut self, worker: impl Into<WorkerId>) -> Self {
        self.options.preferred_worker = Some(worker.into());
        self
    }
    /// Uses this request id instead of a fresh one: the way to retry an ask
    /// across a caller restart and still be deduplicated. An id names one
    /// request to one pool: reusing it for another pool is not supported
    /// (frames carry no pool, so a late answer from the first pool, whose
    /// cancel was lost, may answer the ask to the second).
    pub fn request_id(mut self, id: RequestId) -> Self {
        self.options.request_id = Some(id);
        self
    }
    pub fn correlation_id(mut self, id: CorrelationId) -> Self {
        self.options.correlation_id = Some(id);
        self
    }
    pub fn causation_id(mut self, id: CausationId) -> Self {
        self.options.causation_id = Some(id);
        self
    }
    /// Overrides the node's retry policy for this ask.
    pub fn retry(mut self, policy: RetryPolicy) -> Self {
        self.options.retry = Some(policy);
        self
    }
    /// Guards the request id against reuse with another payload.
    pub fn fingerprint(mut self, fingerprint: PayloadFingerprint) -> Self {
        self.options.fingerprint = Some(fingerprint);
        self
    }
    /// The payload's size in bytes, where the caller knows it (a byte
    /// payload, an encoded one): over the node's
    /// [`max_payload_bytes`](crate::NodeConfig::max_payload_bytes) the ask
    /// fails at once with `OversizePayload` and nothing is sent. An
    /// in-process object has no size and is not checked.
    pub fn payload_size(mut self, bytes: usize) -> Self {
        self.options.payload_size = Some(bytes);
        self
    }

    /// Sends the request now and returns the handle that awaits its outcome.
    pub fn send(self) -> AskHandle<M, R> {
        AskHandle::start(self)
    }
}

/// Why an ask polled where no tokio runtime is current cannot wait.
fn outside_runtime() -> AskError {
    AskError::FailedPrecondition {
        message: "an ask that waits for a timer must be polled inside a tokio runtime".into(),
    }
}

impl<'a, M: Clone + Send + 'static, R: Clone + Send + 'static> IntoFuture for AskBuilder<'a, M, R> {
    type Output = Result<R, AskError>;
    type IntoFuture = AskHandle<M, R>;
    fn into_future(self) -> AskHandle<M, R> {
        self.send()
    }
}

/// One ask in flight. A `Future` of the reply; dropping it cancels the ask.
///
/// The first attempt goes out when the handle is created. Like every Rust
/// future, the handle does its later work (re-sends, the timeout) while it is
/// polled: await it, or `tokio::spawn` it to let it run in the background.
/// Its timers are tokio's: it may be moved to (or polled from) another tokio
/// runtime, even after the one it started on was dropped; polled where no
/// tokio runtime is current while it has to wait for a timer, it fails with
/// `FailedPrecondition` (and cancels the ask at the pool).
#[must_use = "dropping an AskHandle cancels the ask"]
pub struct AskHandle<M: Clone + Send + 'static, R: Clone + Send + 'static> {
    node: Arc<NodeShared<M, R>>,
    slot: Arc<AskSlot<R>>,
    machine: CallerAsk,
    meta: RequestMeta,
    payload: Option<M>,
    rng: SmallRng,
    /// A timer of the ask's own, for re-sends and stage deadlines, and the
    /// runtime whose timer driver it is registered with.
    timer: Option<(Timestamp, tokio::runtime::Id, Pin<Box<Sleep>>)>,
    /// The ask's place in the node's deadline queue, once it waits for
    /// nothing but its deadline (most asks: in process the Ack arrives
    /// inside the send), and whether that deadline came.
    queued_deadline: Option<ExpiryKey>,
    deadline_fired: bool,
    /// An outcome decided outside `poll` (refused at start, `cancel()`).
    /// `Ok(None)` is a tell's acknowledgement.
    /// Boxed: rare, and the handle is moved whole (by every `.await` of
    /// it), which an outcome inline would make 40 bytes longer.
    early: Option<Box<Result<Option<R>, AskError>>>,
    /// Whether the slot is in the pending map.
    registered: bool,
    /// The pool's circuit-breaker permit, reported when the ask ends.
    permit: Option<Permit>,
    /// Set on a dead letter's replay (see `AskBuilder::refile`).
    refile: Option<DeadLetterReason>,
    /// See `AskBuilder::on_replay_outcome`: filed with the dead letter, and
    /// called when this ask is a replay (`refile` set).
    replay_hook: Option<ReplayHook<R>>,
    /// Whether the ask's end was reported to the breaker.
    settled: bool,
    /// Whether its outcome is the pool's reply (live or replayed): final,
    /// never re-sent, so an error in it exhausted no retries.
    replied: bool,
    /// Whether its node cut it short (shut down under it).
    cut_short: bool,
    span: tracing::Span,
    finished: bool,
}

impl<M: Clone + Send + 'static, R: Clone + Send + 'static> AskHandle<M, R> {
    fn start(mut b: AskBuilder<'_, M, R>) -> Self {
        let node = Arc::clone(&b.node.shared);
        // Read in place: the options are most of the builder's bytes, and
        // a copy of them would be made for nothing.
        let preferred_worker = b.options.preferred_worker.take();
        let options = &b.options;
        let now = node.clock.now();
        let request_id = options
            .request_id
            .unwrap_or_else(|| node.ids.request_id(node.clock.wall_micros(now)));
        let mut ids = AskIds::new(request_id, node.caller_id);
        if let Some(c) = options.correlation_id {
            ids.correlation_id = c;
        }
        ids.causation_id = options.causation_id;
        let timeout = options.timeout.unwrap_or(node.config.default_timeout);
        let policy = options.retry.unwrap_or_else(|| node.retry_policy(&b.pool));
        let span = tracing::debug_span!(
            "ask",
            request_id = %request_id,
            correlation_id = %ids.correlation_id,
            pool = %b.pool,
        );
        let mut handle = Self {
            machine: CallerAsk::new(policy, now, timeout).with_stage_timeouts(StageTimeouts {
                delivery: node.config.timeouts.delivery,
                read: node.config.timeouts.read.filter(|_| !b.one_way),
            }),
            meta: RequestMeta {
                ids,
                pool: b.pool,
                preferred_worker,
                budget: timeout,
                attempt: 0,
                fingerprint: options.fingerprint,
                expects_reply: !b.one_way,
            },
            rng: SmallRng::seed_from_u64(jitter_seed(request_id, node.caller_id)),
            slot: AskSlot::new_shared(
                node.config.track_stages.then_some(now),
                options.fingerprint,
                b.one_way,
                &span,
            ),
            payload: Some(b.payload),
            timer: None,
            queued_deadline: None,
            deadline_fired: false,
            early: None,
            registered: false,
            permit: None,
            refile: b.refile,
            replay_hook: b.replay_hook,
            settled: false,
            replied: false,
            cut_short: false,
            span,
            finished: false,
            node,
        };
        // The node's own policies were validated when it was made.
        let policy = options.retry.map(|_| policy);
        if let Err(e) = handle.admit(policy, options.payload_size, now) {
            // A refused ask never reached the wire; its stage stream ends,
            // and its outcome counts (a breaker's refusals among them).
            handle.slot.record_terminal(AckStage::Rejected, now);
            telemetry::end_to_end(Some(&e), Duration::ZERO);
            if let Some(reason) = handle.refile {
                // A replay refused at once (breaker open, id pending, node
                // closing) keeps its letter.
                handle.file_dead_letter(&e, reason, now);
            }
            handle.early = Some(Box::new(Err(e)));
            handle.payload = None;
            return handle;
        }
        let step = handle.machine.start(now, &mut handle.rng);
        if let Some(error) = handle.perform(step, now) {
            handle.conclude(&error, now);
            handle.early = Some(Box::new(Err(error)));
            handle.release();
        }
        handle
    }

    /// What a failed ask leaves behind: a dead letter if its error was
    /// retryable or poison, a timeout record for late reconciliation.
    fn conclude(&mut self, error: &AskError, now: Timestamp) {
        telemetry::end_to_end(Some(error), now.saturating_since(self.machine.started()));
        tracing::debug!(parent: &self.span, %error, "ask failed");
        self.settle_breaker(Verdict::Failure(error), now);
        if self.cut_short {
            self.slot.record_cut_short(now);
        } else {
            self.slot
                .record_terminal(AckStage::terminal_for_error(error), now);
        }
        // The dead letter first: a late outcome reconciled below (or on
        // another thread as soon as the timeout is on record) takes it.
        // Asks failed by the shutdown are no dead letters, but a replay's
        // letter goes back whatever the error (a pool gone since is
        // `NoRoute`, permanent): its payload is nowhere else.
        let closed = self.node.is_closed();
        let reason = (!closed)
            .then(|| dlq::reason_for(error, self.machine.policy(), self.replied))
            .flatten();
        if let Some(reason) = reason.or(self.refile) {
            self.file_dead_letter(error, reason, now);
        }
        if closed {
            return;
        }
        // The caller's own timeouts (the ask's, a stage deadline) can still
        // be answered by the pool: keep them to reconcile. (A pool's
        // processing timeout is TIMED_OUT too, but the pool is done with it;
        // so is a reply carrying a timeout error: the reply is final.)
        if AckStage::terminal_for_code(error.code()) == AckStage::TimedOut && !self.replied {
            self.node.caller.record_timeout(
                self.meta.ids,
                self.meta.pool.clone(),
                self.slot.clone(),
                now,
            );
            if let Some(event) = self.slot.close() {
                let fingerprint = self.meta.fingerprint;
                (self.node.caller).reconcile_event(self.meta.ids, fingerprint, event);
            }
        }
    }

    fn file_dead_letter(&mut self, error: &AskError, reason: DeadLetterReason, now: Timestamp) {
        let Some(payload) = self.payload.take() else {
            return;
        };
        let mut dlq = self.node.caller.dlq.lock();
        let letter = DeadLetter {
            ids: self.meta.ids,
            pool: self.meta.pool.clone(),
            kind: if self.meta.expects_reply {
                DeadLetterKind::Ask
            } else {
                DeadLetterKind::Tell
            },
            payload,
            fingerprint: self.meta.fingerprint,
            error: error.clone(),
            attempts: self.machine.attempts_sent(),
            reason,
            failed_at: now,
        };
        dlq.push(letter, self.replay_hook.clone());
    }

    /// Checks that the ask may start (a valid policy of its own, payload within bounds,
    /// open node, closed breaker) and enters it in the pending map.
    fn admit(
        &mut self,
        policy: Option<RetryPolicy>,
        payload_size: Option<usize>,
        now: Timestamp,
    ) -> Result<(), AskError> {
        if let Some(policy) = policy {
            policy.validate()?;
        }
        // A zero budget could not even make its first attempt: it would
        // only fill the dead-letter queue with asks never sent.
        if self.meta.budget.is_zero() {
            return Err(AskError::InvalidArgument {
                message: "an ask's timeout must be positive".into(),
            });
        }
        if let Some(worker) = &self.meta.preferred_worker {
            worker.validate()?;
        }
        if let (Some(size), Some(limit)) = (payload_size, self.node.config.max_payload_bytes) {
            if size > limit {
                return Err(AskError::OversizePayload { size, limit });
            }
        }
        if self.node.is_closed() {
            return Err(AskError::node_closed());
        }
        self.permit = self.node.breakers.acquire(&self.meta.pool, now)?;
        let id = self.meta.ids.request_id;
        if !self.node.caller.pending.insert_new(id, &self.slot) {
            self.settle_breaker(Verdict::Release, now);
            return Err(AskError::InvalidArgument {
                message: format!("request id {id} is already pending on this node"),
            });
        }
        // A shutdown between the check above and the insert aborted the
        // asks it found pending, not this one: looked at again now, after
        // the insert (the pending map's lock orders the two), it is seen.
        if self.node.is_closed() {
            self.node.caller.pending.remove(id);
            self.settle_breaker(Verdict::Release, now);
            return Err(AskError::node_closed());
        }
        self.registered = true;
        telemetry::pending(1.0);
        Ok(())
    }

    pub fn request_id(&self) -> RequestId {
        self.meta.ids.request_id
    }

    pub fn ids(&self) -> &AskIds {
        &self.meta.ids
    }

    /// Cancels the ask: it resolves to `AskCancelled` and a best-effort
    /// `AskCancel` goes to the pool. Does nothing once the ask has ended,
    /// or once its outcome arrived (a reply not yet polled stands).
    pub fn cancel(&mut self) {
        if self.finished || self.early.is_some() {
            return;
        }
        // Its outcome is what the next poll gives.
        self.early = self.give_up().map(Box::new);
        self.release();
    }

    /// Its caller gives up on the ask (`cancel()`, or the handle dropped):
    /// an outcome that already arrived stands, else the ask is cancelled
    /// (the terminal stage and the outcome recorded). The outcome, if any.
    fn give_up(&mut self) -> Option<Result<Option<R>, AskError>> {
        if let Some(result) = self.ended_by_arrivals() {
            return Some(result);
        }
        let now = self.node.clock.now();
        let step = self.machine.cancel();
        let error = self.perform(step, now)?;
        telemetry::end_to_end(Some(&error), now.saturating_since(self.machine.started()));
        self.slot
            .record_terminal(AckStage::terminal_for_error(&error), now);
        Some(Err(error))
    }

    /// The ask's ACK lifecycle as a stream of stage events (SENT, RECEIVED,
    /// READ, PARTIAL progress, one terminal), each with its time and the
    /// time since the previous stage. One stream per ask (a second one ends
    /// at once); it can be polled
    /// from another task while this handle is awaited. Empty when the node
    /// was configured with `track_stages: false`.
    pub fn stages(&self) -> StageStream<R> {
        StageStream::of_ask(self.slot())
    }

    /// What opens [`stages`](Self::stages) later, even after this handle is
    /// gone (it keeps the ask's stage record, not the ask).
    pub fn stage_source(&self) -> StageSource<R> {
        StageSource::of_ask(self.slot())
    }

    pub(crate) fn slot(&self) -> Arc<AskSlot<R>> {
        Arc::clone(&self.slot)
    }

    /// Performs the machine's send; returns the ask's error if the step (or
    /// a failed send) failed it.
    fn perform(&mut self, step: CallerStep, now: Timestamp) -> Option<AskError> {
        let CallerStep { send, resolution } = step;
        match send {
            Some(CallerSend::Request { attempt }) => {
                if attempt > 1 {
                    self.node.caller.retries.fetch_add(1, Ordering::Relaxed);
                    telemetry::retry();
                    tracing::debug!(parent: &self.span, attempt, "re-sending");
                }
                self.meta.attempt = attempt;
                self.meta.budget = self.machine.deadline().saturating_since(now);
                let payload = self
                    .payload
                    .clone()
                    .expect("payload kept until the ask ends");
                let frame = ToWorker::Request(Envelope {
                    meta: self.meta.clone(),
                    payload,
                });
                match self.node.transport.send_to_pool(frame) {
                    Ok(()) => self.machine.on_sent(),
                    Err(error) => {
                        let step = self.machine.on_send_failed(now, error, &mut self.rng);
                        return self.perform(step, now);
                    }
                }
            }
            Some(CallerSend::Cancel { reason }) => {
                // Best effort: a pool that is gone has nothing to cancel.
                let _ = self.node.transport.send_to_pool(ToWorker::Cancel {
                    ids: self.meta.ids,
                    pool: self.meta.pool.clone(),
                    reason,
                });
            }
            None => {}
        }
        match resolution {
            Some(Resolution::Failed(error)) => Some(error),
            Some(Resolution::Replied) => unreachable!("only a reply frame resolves as Replied"),
            None => None,
        }
    }

    /// Reports the ask's end to its pool's breaker, once.
    fn settle_breaker(&mut self, verdict: Verdict<'_>, now: Timestamp) {
        if self.settled {
            return;
        }
        self.settled = true;
        let permit = self.permit.take();
        self.node
            .breakers
            .report(&self.meta.pool, permit, verdict, now);
    }

    /// Removes everything the ask holds: pending entry, timer, payload, and
    /// a breaker permit not yet reported (released: the caller gave up).
    fn release(&mut self) {
        if self.permit.is_some() {
            let now = self.node.clock.now();
            self.settle_breaker(Verdict::Release, now);
        }
        self.settled = true;
        if self.registered {
            self.node.caller.pending.remove(self.meta.ids.request_id);
            self.registered = false;
            telemetry::pending(-1.0);
        }
        if self.timer.take().is_some() {
            self.node
                .caller
                .armed_timers
                .fetch_sub(1, Ordering::Relaxed);
        }
        if let Some(key) = self.queued_deadline.take() {
            self.node.caller.deadlines.remove(key);
        }
        self.payload = None;
    }

    fn finish(
        &mut self,
        result: Result<Option<R>, AskError>,
        now: Timestamp,
    ) -> Poll<Result<Option<R>, AskError>> {
        match &result {
            Err(error) => self.conclude(error, now),
            Ok(reply) => {
                tracing::debug!(parent: &self.span, "ask answered");
                self.settle_breaker(Verdict::Success, now);
                // A tell ends at its Ack: RECEIVED is as far as it is
                // tracked, and it has no end-to-end latency (send to
                // FULFILLED).
                if reply.is_some() {
                    telemetry::end_to_end(None, now.saturating_since(self.machine.started()));
                    self.slot.record_terminal(AckStage::Fulfilled, now);
                }
            }
        }
        if let (Some(hook), Some(_)) = (&self.replay_hook, self.refile) {
            // Told while the id is still pending here: what records the
            // outcome elsewhere is done before another ask of the id can
            // start. A tell's acknowledgement (`None`) is no outcome.
            // A hook's panic must not keep the id pending (`release` below)
            // nor unwind out of a drop: it is logged, the ask ends as it did.
            let told = match &result {
                Ok(Some(reply)) => Some(Ok(reply.clone())),
                Ok(None) => None,
                Err(error) => Some(Err(error.clone())),
            };
            if let Some(outcome) = told {
                let hook = std::panic::AssertUnwindSafe(|| hook(outcome));
                if std::panic::catch_unwind(hook).is_err() {
                    tracing::error!(parent: &self.span, "a replay hook panicked");
                }
            }
        }
        self.release();
        self.finished = true;
        Poll::Ready(result)
    }

    /// Whether the wake-up at `at` is due. The ask's own deadline, when
    /// nothing else is left to wait for and no timer of its own exists,
    /// waits in the node's deadline queue; anything else on a timer of its
    /// own.
    fn poll_wakeup(&mut self, at: Timestamp, cx: &mut Context<'_>) -> Poll<Result<(), AskError>> {
        if self.timer.is_none() && at == self.machine.deadline() {
            let caller = &self.node.caller;
            if self.queued_deadline.is_some() {
                if self.deadline_fired {
                    return Poll::Ready(Ok(()));
                }
                // Its sweeper may have gone with a runtime since; polled
                // where no runtime can start another, nothing would wake it.
                if !caller.deadlines.keep_alive(&caller.weak_self) {
                    return Poll::Ready(Err(outside_runtime()));
                }
                return Poll::Pending;
            }
            let slot = Arc::clone(&self.slot);
            if let Ok(key) = caller.deadlines.try_insert(&caller.weak_self, at, slot) {
                self.queued_deadline = Some(key);
                return Poll::Pending;
            }
        }
        self.poll_timer(at, cx)
    }

    /// Points the timer at `at` and polls it. A tokio timer belongs to the
    /// runtime it was made on and panics when polled after that runtime
    /// shut down, so a handle polled on another runtime (moved, or its
    /// first runtime dropped) makes its timer again on the current one.
    /// Outside any tokio runtime there is no timer to wait on: the ask
    /// fails with `FailedPrecondition` instead of panicking.
    fn poll_timer(&mut self, at: Timestamp, cx: &mut Context<'_>) -> Poll<Result<(), AskError>> {
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            return Poll::Ready(Err(outside_runtime()));
        };
        let runtime = runtime.id();
        let deadline = self.node.clock.instant(at);
        match &mut self.timer {
            Some((armed_at, armed_on, sleep)) => {
                if *armed_on != runtime {
                    *sleep = Box::pin(tokio::time::sleep_until(deadline));
                    *armed_on = runtime;
                    *armed_at = at;
                } else if *armed_at != at {
                    sleep.as_mut().reset(deadline);
                    *armed_at = at;
                }
            }
            None => {
                self.node
                    .caller
                    .armed_timers
                    .fetch_add(1, Ordering::Relaxed);
                let sleep = Box::pin(tokio::time::sleep_until(deadline));
                self.timer = Some((at, runtime, sleep));
            }
        }
        let (_, _, sleep) = self.timer.as_mut().expect("armed above");
        sleep.as_mut().poll(cx).map(Ok)
    }
}

// The timer is boxed and no field is ever pinned in place, so moving the
// handle is fine whatever `M` and `R` are.
impl<M: Clone + Send + 'static, R: Clone + Send + 'static> Unpin for AskHandle<M, R> {}

impl<M: Clone + Send + 'static, R: Clone + Send + 'static> AskHandle<M, R> {
    /// Drives the ask. `Ok(None)` is a tell's acknowledgement.
    fn poll_outcome(&mut self, cx: &mut Context<'_>) -> Poll<Result<Option<R>, AskError>> {
        let this = self;
        if let Some(result) = this.early.take().map(|early| *early) {
            // Concluded where it was decided (start or cancel).
            this.release();
            this.finished = true;
            return Poll::Ready(result);
        }
        if this.finished {
            return Poll::Ready(Err(AskError::internal("ask polled after it completed")));
        }
        // A fired timer guarantees `now` reaches its instant even if the
        // clocks disagree by rounding. The clock is read only when a step
        // needs it (a reply, a fired timer), not to arm the timer.
        let mut floor = Timestamp::ZERO;
        let mut clock = LazyNow::default();
        loop {
            if let Some(done) = this.apply_arrivals(cx.waker(), floor, &mut clock, false) {
                return done;
            }
            let Some(at) = this.machine.next_wakeup() else {
                let now = clock.get(&this.node, floor);
                return this.finish(Err(AskError::internal("ask left without an outcome")), now);
            };
            // The timer says whether the wake-up is due; the clock is read
            // once it fired (a deadline already past fires at once).
            if floor >= at {
                let now = clock.get(&this.node, floor);
                let step = this.machine.on_timer(now, &mut this.rng);
                if let Some(error) = this.perform(step, now) {
                    return this.finish(Err(error), now);
                }
                continue;
            }
            match this.poll_wakeup(at, cx) {
                Poll::Ready(Ok(())) => {
                    floor = at;
                    clock = LazyNow::default();
                }
                Poll::Ready(Err(error)) => {
                    // Nothing can wake the ask: end it, and cancel it at
                    // the pool (best effort), as dropping it would.
                    let now = clock.get(&this.node, floor);
                    let step = this.machine.cancel();
                    let _ = this.perform(step, now);
                    return this.finish(Err(error), now);
                }
                Poll::Pending => return Poll::Pending,
            }
        }
    }

    /// Applies what arrived for the ask (Ack, Read, a reply, a refusal, a
    /// cancel, the shutdown) until nothing is left: `Some` once that ended
    /// it (its outcome, as `poll` returns it), `None` if it goes on.
    /// `waker` is registered for what arrives next.
    /// `giving_up` (a cancel or a drop): a refusal is no outcome to keep
    /// (it would be re-sent, and the caller is giving up): it is passed over
    /// and the cancel goes ahead, filing no letter and failing no breaker.
    fn apply_arrivals(
        &mut self,
        waker: &Waker,
        floor: Timestamp,
        clock: &mut LazyNow,
        giving_up: bool,
    ) -> Option<Poll<Result<Option<R>, AskError>>> {
        loop {
            let Arrivals {
                acked,
                read,
                deadline_due,
                event,
            } = self.slot.take(waker);
            self.deadline_fired |= deadline_due;
            if read {
                self.machine.on_read();
            }
            if acked {
                self.machine.on_ack();
                if !self.meta.expects_reply {
                    let now = clock.get(&self.node, floor);
                    return Some(self.finish(Ok(None), now));
                }
            }
            match event {
                Some(SlotEvent::Reply(outcome)) => {
                    if self.machine.on_reply().resolution == Some(Resolution::Replied) {
                        self.replied = true;
                        let now = clock.get(&self.node, floor);
                        return Some(self.finish(outcome.map(Some), now));
                    }
                    continue;
                }
                Some(SlotEvent::Refused(_)) if giving_up => continue,
                Some(SlotEvent::Refused(error)) => {
                    let now = clock.get(&self.node, floor);
                    let step = self.machine.on_refused(now, &error, &mut self.rng);
                    if step.resolution == Some(Resolution::Replied) {
                        return Some(self.finish(Err(error), now));
                    }
                    continue;
                }
                Some(SlotEvent::Cancelled(reason)) => {
                    if let Some(Resolution::Failed(e)) =
                        self.machine.on_cancelled(reason).resolution
                    {
                        let now = clock.get(&self.node, floor);
                        return Some(self.finish(Err(e), now));
                    }
                    continue;
                }
                Some(SlotEvent::Aborted(error)) => {
                    self.machine.abort(error.clone());
                    self.cut_short = true;
                    let now = clock.get(&self.node, floor);
                    return Some(self.finish(Err(error), now));
                }
                None => return None,
            }
        }
    }

    /// An ask its caller gives up on (`cancel()`, or dropped) that already
    /// ended by what arrived keeps that outcome: a reply that came before
    /// the cancel, or a tell's Ack (a tell dropped once sent is the usual
    /// fire-and-forget, accepted in process within `send()`). Not while the
    /// thread unwinds: the outcome's hooks run no user code then.
    fn ended_by_arrivals(&mut self) -> Option<Result<Option<R>, AskError>> {
        if std::thread::panicking() {
            return None;
        }
        let (waker, floor) = (Waker::noop(), Timestamp::ZERO);
        match self.apply_arrivals(waker, floor, &mut LazyNow::default(), true) {
            Some(Poll::Ready(result)) => Some(result),
            _ => None,
        }
    }
}

/// The seed of an ask's retry jitter: its whole request id and its caller,
/// so that asks with ids that share a half (ids a user builds, the same id
/// from two callers) do not re-send in lockstep. Reproducible, like the ids.
fn jitter_seed(id: RequestId, caller: askpool_proto::CallerId) -> u64 {
    let id = id.as_u128();
    (id as u64)
        ^ ((id >> 64) as u64).rotate_left(29)
        ^ caller.as_u64().wrapping_mul(0x9E37_79B9_7F4A_7C15)
}

/// The node's clock read at most once per step of `poll_outcome`, and never
/// below `floor` (the instant of a timer that fired).
#[derive(Default)]
struct LazyNow(Option<Timestamp>);

impl LazyNow {
    fn get<M, R>(&mut self, node: &NodeShared<M, R>, floor: Timestamp) -> Timestamp {
        *self.0.get_or_insert_with(|| node.clock.now().max(floor))
    }
}

impl<M: Clone + Send + 'static, R: Clone + Send + 'static> Future for AskHandle<M, R> {
    type Output = Result<R, AskError>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        self.get_mut().poll_outcome(cx).map(|result| {
            result.and_then(|reply| {
                reply.ok_or_else(|| AskError::internal("an ask resolved without a reply"))
            })
        })
    }
}

impl<M: Clone + Send + 'static, R: Clone + Send + 'static> Drop for AskHandle<M, R> {
    fn drop(&mut self) {
        if !self.finished && self.early.is_none() {
            self.give_up();
        }
        self.release();
    }
}

/// Options of one tell (a one-way message); `send()` (or `.await`) sends it.
#[must_use = "a tell is sent by .send() or .await"]
pub struct TellBuilder<'a, M: Clone + Send + 'static, R: Clone + Send + 'static> {
    inner: AskBuilder<'a, M, R>,
}

impl<'a, M: Clone + Send + 'static, R: Clone + Send + 'static> TellBuilder<'a, M, R> {
    pub(crate) fn new(node: &'a Node<M, R>, pool: PoolName, payload: M) -> Self {
        let mut inner = AskBuilder::new(node, pool, payload);
        inner.one_way = true;
        Self { inner }
    }
    /// Sets every option at once (replacing those set before); a tell has
    /// no preferred worker.
    pub fn options(mut self, options: AskOptions) -> Self {
        self.inner = self.inner.options(AskOptions {
            preferred_worker: None,
            ..options
        });
        self
    }
    /// Fails the tell with `AskTimeout` if the pool has not accepted it by then.
    pub fn timeout(mut self, timeout: Duration) -> Self {
        self.inner = self.inner.timeout(timeout);
        self
    }
    /// Uses this request id: a duplicate tell with the same id is not run again.
    pub fn request_id(mut self, id: RequestId) -> Self {
        self.inner = self.inner.request_id(id);
        self
    }
    pub fn retry(mut self, policy: RetryPolicy) -> Self {
        self.inner = self.inner.retry(policy);
        self
    }
    pub fn fingerprint(mut self, fingerprint: PayloadFingerprint) -> Self {
        self.inner = self.inner.fingerprint(fingerprint);
        self
    }
    pub fn correlation_id(mut self, id: CorrelationId) -> Self {
        self.inner = self.inner.correlation_id(id);
        self
    }
    pub fn causation_id(mut self, id: CausationId) -> Self {
        self.inner = self.inner.causation_id(id);
        self
    }
    /// See [`AskBuilder::payload_size`].
    pub fn payload_size(mut self, bytes: usize) -> Self {
        self.inner = self.inner.payload_size(bytes);
        self
    }
    /// See [`AskBuilder::refile_on_failure`].
    pub(crate) fn refile_on_failure(mut self, reason: DeadLetterReason) -> Self {
        self.inner = self.inner.refile_on_failure(reason);
        self
    }
    /// See [`AskBuilder::replay_hook`].
    pub(crate) fn replay_hook(mut self, hook: Option<ReplayHook<R>>) -> Self {
        self.inner = self.inner.replay_hook(hook);
        self
    }
    /// Sends the tell now; the handle resolves when the pool accepts it.
    pub fn send(self) -> TellHandle<M, R> {
        TellHandle {
            inner: self.inner.send(),
        }
    }
}

impl<'a, M: Clone + Send + 'static, R: Clone + Send + 'static> IntoFuture
    for TellBuilder<'a, M, R>
{
    type Output = Result<RequestId, AskError>;
    type IntoFuture = TellHandle<M, R>;
    fn into_future(self) -> TellHandle<M, R> {
        self.send()
    }
}

/// A tell in flight: re-sent like an ask until the pool acknowledges it, then
/// resolves to its request id. A refusal (`BufferFull`, `NoRoute`, ...) is an
/// error; nothing comes back after the Ack. Dropping it before then cancels.
#[must_use = "dropping a TellHandle before the pool accepted it cancels the tell"]
pub struct TellHandle<M: Clone + Send + 'static, R: Clone + Send + 'static> {
    inner: AskHandle<M, R>,
}

impl<M: Clone + Send + 'static, R: Clone + Send + 'static> TellHandle<M, R> {
    pub fn request_id(&self) -> RequestId {
        self.inner.request_id()
    }

    /// Gives the tell up: it resolves to `AskCancelled` unless the pool's
    /// acceptance already arrived (which stands). Looks only at what has
    /// arrived: a re-send that came due is not made now (polling instead
    /// could send the very tell being given up, and have it accepted).
    pub fn cancel(&mut self) {
        self.inner.cancel();
    }

    pub fn ids(&self) -> &AskIds {
        self.inner.ids()
    }
}

impl<M: Clone + Send + 'static, R: Clone + Send + 'static> Future for TellHandle<M, R> {
    type Output = Result<RequestId, AskError>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let this = self.get_mut();
        let id = this.inner.request_id();
        this.inner.poll_outcome(cx).map(|result| result.map(|_| id))
    }
}

impl<M: Clone + Send + 'static, R: Clone + Send + 'static> std::fmt::Debug for AskHandle<M, R> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AskHandle")
            .field("ids", &self.meta.ids)
            .field("pool", &self.meta.pool)
            .field("phase", &self.machine.phase())
            .field("attempts", &self.machine.attempts_sent())
            .finish()
    }
}

impl<M: Clone + Send + 'static, R: Clone + Send + 'static> std::fmt::Debug for TellHandle<M, R> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_tuple("TellHandle").field(&self.inner).finish()
    }
}
