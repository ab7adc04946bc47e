//! The caller's pending map: request id -> the slot its [`AskHandle`] polls.
//!
//! The transport completes slots directly (in process, the worker's reply is a
//! function call that stores the reply and wakes the caller's task); on a
//! transport that hands frames over directly, the node's own pools hold the
//! slot of each ask they admitted and skip the routing by id
//! ([`CallerSide::deliver_direct`]). An Ack
//! only sets a flag: the handle reads it when it next wakes, which is when a
//! re-send would be due, so an Ack costs no wake-up.
//!
//! [`AskHandle`]: crate::AskHandle

use std::collections::VecDeque;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Weak};
use std::task::{Context, Poll, Waker};
use std::time::Duration;

use askpool_proto::{
    AckStage, AckTracker, AskError, AskIds, CancelReason, Outcome, PayloadFingerprint, PoolName,
    Progress, RequestId, StageError, StageEvent, Timestamp, ToCaller,
};
use parking_lot::{Mutex, MutexGuard, RwLock};
use rustc_hash::FxHashMap;

use crate::clock::{shard_of, NodeClock};
use crate::deadlines::{DeadlineOwner, DeadlineQueue};
use crate::dlq::DeadLetterQueue;
use crate::expiry::ExpiryKey;
use crate::idle_sweep::{IdleSweep, IdleSweepOwner};
use crate::shard::ShardedMap;
use crate::telemetry;
use crate::transport::CallerEndpoint;

/// A terminal-ish frame waiting for its handle.
pub(crate) enum SlotEvent<R> {
    Reply(Outcome<R>),
    /// The pool turned an attempt away (see `ToCaller::Refused`).
    Refused(AskError),
    Cancelled(CancelReason),
    /// The node shut down under the ask.
    Aborted(AskError),
}

struct SlotInner<R> {
    acked: bool,
    read: bool,
    /// A reply was offered (whether or not the handle took it since): a
    /// progress report after it is no PARTIAL stage.
    answered: bool,
    /// The node's deadline queue found the ask's deadline due.
    deadline_due: bool,
    event: Option<SlotEvent<R>>,
    /// The ask timed out and its handle no longer reads events: an outcome
    /// offered now is a late outcome (see `AskSlot::close`).
    closed: bool,
    waker: Option<Waker>,
    /// Inline, not boxed: one allocation per ask (the slot) instead of two.
    stages: Option<StageLog>,
}

/// What became of an event offered to a slot.
pub(crate) enum Offered<R> {
    Taken,
    /// One was already waiting: this one is a duplicate.
    Duplicate,
    /// The ask timed out: the event is handed back for reconciliation.
    Closed(SlotEvent<R>),
}

/// The ACK lifecycle of one ask, and the events not yet read by its stream.
struct StageLog {
    tracker: AckTracker,
    /// The ask's span; each stage is a span inside it that closes when the
    /// next stage begins.
    span: tracing::Span,
    stage_span: tracing::Span,
    /// Events not yet read by the ask's stream; `None` until a stream is
    /// opened, which starts it from the tracker's history (most asks never
    /// open one, and need not copy every event twice).
    unread: Option<VecDeque<StageEvent>>,
    waker: Option<Waker>,
}

/// Stage events kept for a stream that is not reading; the oldest progress
/// reports go first.
const MAX_UNREAD_STAGE_EVENTS: usize = 64;

/// Wakes `waker`, if any: called once the slot's lock is released, since a
/// waker may run code that takes it again.
fn wake(waker: Option<Waker>) {
    if let Some(waker) = waker {
        waker.wake();
    }
}

impl StageLog {
    /// Moves the ask to `stage` (`PARTIAL` with its report, if any);
    /// returns the stream's waker to wake once the slot's lock is released.
    #[must_use = "the stream's waker is woken after the slot's lock is released"]
    fn advance(
        &mut self,
        stage: AckStage,
        progress: Option<Progress>,
        now: Timestamp,
    ) -> Option<Waker> {
        let event = match progress {
            Some(progress) => self.tracker.record_partial(progress, now),
            None => self.tracker.record(stage, now),
        };
        Self::push(
            event,
            &mut self.unread,
            &self.span,
            &mut self.stage_span,
            &mut self.waker,
        )
    }

    /// Reports an event the tracker applied (to telemetry, the ask's span
    /// and an open stream, which alone gets a copy of it).
    fn push(
        event: Result<&StageEvent, StageError>,
        unread: &mut Option<VecDeque<StageEvent>>,
        span: &tracing::Span,
        stage_span: &mut tracing::Span,
        waker: &mut Option<Waker>,
    ) -> Option<Waker> {
        // A refused transition is a duplicate or reordered frame: the
        // tracker is unchanged and there is nothing to report.
        if let Ok(event) = event {
            telemetry::stage_duration(event.stage, event.since_previous);
            *stage_span = if event.stage.is_terminal() {
                tracing::debug!(parent: span, stage = event.stage.as_str(), "ask ended");
                tracing::Span::none()
            } else {
                tracing::debug_span!(parent: span, "ack_stage", stage = event.stage.as_str())
            };
            if let Some(unread) = unread {
                if unread.len() == MAX_UNREAD_STAGE_EVENTS {
                    // The oldest progress report goes; the lifecycle
                    // stages (SENT, RECEIVED, READ) stay, as in the
                    // tracker's own history.
                    let partial = unread.iter().position(|e| e.stage == AckStage::Partial);
                    unread.remove(partial.unwrap_or(0));
                }
                unread.push_back(event.clone());
            }
            return waker.take();
        }
        None
    }
}

/// What arrived for an ask since its handle last looked.
pub(crate) struct Arrivals<R> {
    pub(crate) acked: bool,
    pub(crate) read: bool,
    pub(crate) deadline_due: bool,
    pub(crate) event: Option<SlotEvent<R>>,
}

pub(crate) struct AskSlot<R> {
    inner: Mutex<SlotInner<R>>,
    /// Whether the slot is in its node's pending map: a pool answering
    /// straight into the slot (`CallerSide::deliver_direct`) does so only
    /// while it is, and routes the frame as the transport would otherwise.
    pending: AtomicBool,
    /// The ask's payload fingerprint, if it has one.
    fingerprint: Option<PayloadFingerprint>,
    /// A tell: it ends at its Ack, so the Ack wakes its handle (an ask's
    /// Ack only sets a flag the handle reads when it next wakes).
    ends_at_ack: bool,
}

impl<R> AskSlot<R> {
    /// [`new`](Self::new), shared. Written straight into its allocation:
    /// `Arc::new` takes the slot by value, made on the stack and copied
    /// twice (hundreds of bytes, most of them its stage log).
    pub(crate) fn new_shared(
        track_from: Option<Timestamp>,
        fingerprint: Option<PayloadFingerprint>,
        ends_at_ack: bool,
        span: &tracing::Span,
    ) -> Arc<Self> {
        let mut slot = Arc::new_uninit();
        Arc::get_mut(&mut slot)
            .expect("a new Arc is not shared")
            .write(Self::new(track_from, fingerprint, ends_at_ack, span));
        // SAFETY: written just above.
        unsafe { slot.assume_init() }
    }

    /// A slot; `track_from` starts its ACK lifecycle at SENT.
    pub(crate) fn new(
        track_from: Option<Timestamp>,
        fingerprint: Option<PayloadFingerprint>,
        ends_at_ack: bool,
        span: &tracing::Span,
    ) -> Self {
        Self {
            fingerprint,
            ends_at_ack,
            pending: AtomicBool::new(false),
            inner: Mutex::new(SlotInner {
                acked: false,
                read: false,
                answered: false,
                deadline_due: false,
                event: None,
                closed: false,
                waker: None,
                stages: track_from.map(|sent_at| {
                    let tracker = AckTracker::new(sent_at);
                    StageLog {
                        tracker,
                        span: span.clone(),
                        stage_span: tracing::debug_span!(parent: span, "ack_stage", stage = "SENT"),
                        unread: None,
                        waker: None,
                    }
                }),
            }),
        }
    }

    /// Whether `frame` can be about this ask. A fingerprinted ask takes
    /// only an outcome of a request with its fingerprint (fail closed: not
    /// one without any); anything else is the outcome of an earlier request
    /// that reused the id.
    fn answers(&self, frame: &ToCaller<R>) -> bool {
        match frame {
            ToCaller::Reply { fingerprint, .. } | ToCaller::Refused { fingerprint, .. } => {
                self.answers_outcome(*fingerprint)
            }
            _ => true,
        }
    }

    /// [`answers`](Self::answers) for an outcome (a reply or a refusal) of
    /// a request with `fingerprint`.
    fn answers_outcome(&self, fingerprint: Option<PayloadFingerprint>) -> bool {
        self.fingerprint
            .is_none_or(|ours| fingerprint == Some(ours))
    }

    #[inline]
    fn ack(&self, stage: AckStage, now: impl FnOnce() -> Timestamp) {
        let mut inner = self.inner.lock();
        let first = !inner.acked;
        inner.acked = true;
        if stage == AckStage::Read {
            inner.read = true;
        }
        let stage_waker = inner
            .stages
            .as_mut()
            .and_then(|log| log.advance(stage, None, now()));
        let waker = if first && self.ends_at_ack {
            inner.waker.take()
        } else {
            None
        };
        drop(inner);
        wake(stage_waker);
        wake(waker);
    }

    fn progress(&self, progress: Progress, now: impl FnOnce() -> Timestamp) {
        let mut inner = self.inner.lock();
        inner.acked = true;
        // A report from a request already answered (its reply waiting for
        // the handle, or taken and about to be recorded) is no PARTIAL:
        // those come between READ and the terminal stage.
        if inner.answered {
            return;
        }
        let Some(log) = &mut inner.stages else {
            return;
        };
        let now = now();
        // Progress implies the pool received the request.
        let mut waker = None;
        if log.tracker.stage() == AckStage::Sent {
            waker = log.advance(AckStage::Received, None, now);
        }
        let waker = log
            .advance(AckStage::Partial, Some(progress), now)
            .or(waker);
        drop(inner);
        wake(waker);
    }

    /// Records the ask's terminal stage (once it is resolved).
    pub(crate) fn record_terminal(&self, stage: AckStage, now: Timestamp) {
        self.record_terminal_after(|_| stage, now);
    }

    /// Records the terminal `pick` chooses from the stage the ask reached.
    #[inline]
    fn record_terminal_after(&self, pick: impl FnOnce(AckStage) -> AckStage, now: Timestamp) {
        let mut inner = self.inner.lock();
        let waker = inner.stages.as_mut().and_then(|log| {
            let stage = pick(log.tracker.stage());
            log.advance(stage, None, now)
        });
        drop(inner);
        wake(waker);
    }

    /// Records the end of an ask its node cut short (it shut down): a
    /// request the pool had accepted failed, as when its pool closes under
    /// it; one it never acknowledged was refused (REJECTED is a refusal
    /// before any processing).
    pub(crate) fn record_cut_short(&self, now: Timestamp) {
        self.record_terminal_after(
            |reached| match reached {
                AckStage::Sent => AckStage::Rejected,
                _ => AckStage::Failed,
            },
            now,
        );
    }

    /// Reconciles a late outcome into the ACK record; `None` if the ask is
    /// not tracked or the outcome cannot reconcile (a late timeout).
    fn reconcile(&self, stage: AckStage, now: Timestamp) -> Option<AckStage> {
        let mut inner = self.inner.lock();
        let log = inner.stages.as_mut()?;
        let late = log.tracker.reconcile(stage, now).ok()?;
        let waker = log.waker.take();
        drop(inner);
        wake(waker);
        Some(late.stage)
    }

    /// Stores `event` unless one is already waiting or the slot is closed;
    /// wakes the handle.
    #[inline]
    pub(crate) fn offer(&self, event: SlotEvent<R>) -> Offered<R> {
        let waker = {
            let mut inner = self.inner.lock();
            if inner.closed {
                return Offered::Closed(event);
            }
            // An outcome takes the place of a refusal not yet read: the
            // refusal answered another attempt, and would only be re-sent.
            let refusal_waiting = matches!(inner.event, Some(SlotEvent::Refused(_)));
            if inner.event.is_some() && (!refusal_waiting || matches!(event, SlotEvent::Refused(_)))
            {
                return Offered::Duplicate;
            }
            inner.answered |= matches!(event, SlotEvent::Reply(_));
            inner.event = Some(event);
            inner.waker.take()
        };
        wake(waker);
        Offered::Taken
    }

    /// Closes the slot of an ask that timed out, once its timeout is on
    /// record for reconciliation: a reply offered later is handed back (the
    /// deliverer reconciles it), and one that arrived since the handle last
    /// looked is returned, so a reply crossing the timeout is a late outcome
    /// rather than lost in a slot nobody reads.
    pub(crate) fn close(&self) -> Option<SlotEvent<R>> {
        let mut inner = self.inner.lock();
        inner.closed = true;
        // A cancellation too: the pool's own (shutdown, processing timeout)
        // is a late outcome; its answer to this ask's timeout cancel is
        // told apart by `CallerSide::reconcile`. A refusal did nothing.
        inner
            .event
            .take()
            .filter(|event| matches!(event, SlotEvent::Reply(_) | SlotEvent::Cancelled(_)))
    }

    /// The ask's deadline is due (from the node's deadline queue): wakes
    /// the handle, which applies it after whatever frames arrived.
    fn deadline_due(&self) {
        let waker = {
            let mut inner = self.inner.lock();
            inner.deadline_due = true;
            inner.waker.take()
        };
        wake(waker);
    }

    /// Wakes the handle with nothing new (see `CallerSide::orphaned`).
    fn nudge(&self) {
        let waker = self.inner.lock().waker.take();
        wake(waker);
    }

    /// Takes what arrived since the last call and registers `waker`.
    #[inline]
    pub(crate) fn take(&self, waker: &Waker) -> Arrivals<R> {
        let mut inner = self.inner.lock();
        match &inner.waker {
            Some(w) if w.will_wake(waker) => {}
            _ => inner.waker = Some(waker.clone()),
        }
        Arrivals {
            acked: std::mem::take(&mut inner.acked),
            read: std::mem::take(&mut inner.read),
            deadline_due: std::mem::take(&mut inner.deadline_due),
            event: inner.event.take(),
        }
    }

    /// Starts the unread queue of the ask's stream: the events so far, then
    /// every event from now on. `false` if a stream is open already.
    pub(crate) fn open_stream(&self) -> bool {
        let mut inner = self.inner.lock();
        match &mut inner.stages {
            Some(log) if log.unread.is_some() => false,
            Some(log) => {
                log.unread = Some(log.tracker.history().iter().cloned().collect());
                true
            }
            None => true,
        }
    }

    /// The ask's stream was dropped: a stream opened later starts again from
    /// the record (and nothing queues for the dropped one meanwhile).
    pub(crate) fn close_stream(&self) {
        let mut inner = self.inner.lock();
        if let Some(log) = &mut inner.stages {
            log.unread = None;
            log.waker = None;
        }
    }

    /// The next unread stage event; `Ready(None)` after the terminal one.
    pub(crate) fn poll_stage(&self, cx: &mut Context<'_>) -> Poll<Option<StageEvent>> {
        let mut inner = self.inner.lock();
        let Some(log) = &mut inner.stages else {
            return Poll::Ready(None);
        };
        let unread = log.unread.get_or_insert_with(VecDeque::new);
        if let Some(event) = unread.pop_front() {
            return Poll::Ready(Some(event));
        }
        if log.tracker.is_terminal() {
            return Poll::Ready(None);
        }
        log.waker = Some(cx.waker().clone());
        Poll::Pending
    }
}

/// What finally arrived for an ask that had already timed out at the caller.
#[derive(Clone, Debug)]
pub enum LateResult<R> {
    Reply(Outcome<R>),
    Cancelled(CancelReason),
}

/// A late outcome: the worker finished an ask after the caller gave up on
/// it (SW4RM late-ACK reconciliation). The ask's future stays failed; its
/// dead letter, if any, is removed.
#[derive(Clone, Debug)]
pub struct LateOutcome<R> {
    pub ids: AskIds,
    pub pool: PoolName,
    pub result: LateResult<R>,
    /// The stage the ACK record was reconciled to (FULFILLED, REJECTED or
    /// FAILED); `None` when the ask's stages were not tracked.
    pub stage: Option<AckStage>,
    /// How long after the caller's timeout it arrived.
    pub late_by: Duration,
}

pub(crate) type LateHook<R> = Arc<dyn Fn(LateOutcome<R>) + Send + Sync>;

/// Asks that timed out recently, kept (bounded by count and age) so that a
/// late outcome can be reconciled once.
struct TimedOutAsk<R> {
    ids: AskIds,
    pool: PoolName,
    at: Timestamp,
    slot: Arc<AskSlot<R>>,
}

struct TimedOutAsks<R> {
    capacity: usize,
    window: Duration,
    records: FxHashMap<RequestId, TimedOutAsk<R>>,
    order: VecDeque<(RequestId, Timestamp)>,
}

impl<R> TimedOutAsks<R> {
    /// Forgets the records past the window or the capacity; returns them,
    /// to be dropped once the lock is released (a slot's waker may run
    /// anything when it goes, even the drop of the node, which takes this
    /// lock: `CallerSide::forget`).
    #[must_use = "dropped outside the lock"]
    fn trim(&mut self, now: Timestamp) -> Vec<TimedOutAsk<R>> {
        let mut gone = Vec::new();
        while let Some(&(id, at)) = self.order.front() {
            if self.order.len() <= self.capacity && at + self.window > now {
                break;
            }
            self.order.pop_front();
            if self.records.get(&id).is_some_and(|r| r.at == at) {
                gone.extend(self.records.remove(&id));
            }
        }
        gone
    }

    /// How long until the oldest record leaves by age (the capacity is
    /// kept by `trim` at every record).
    fn next_due(&self, now: Timestamp) -> Option<Duration> {
        let &(_, at) = self.order.front()?;
        Some((at + self.window).saturating_since(now))
    }
}

/// The pending asks of a node by request id, in per-thread shards: the shard
/// an id's nonce names (`clock::shard_of`). An id the node made names the
/// shard of the thread that asked, which mostly also takes the reply and
/// ends the ask, so the shard's lock and map stay in that thread's cache.
/// An id given by the user names a shard at random.
pub(crate) struct PendingMap<R> {
    map: ShardedMap<RequestId, Arc<AskSlot<R>>>,
}

impl<R> PendingMap<R> {
    fn shard(&self, id: RequestId) -> MutexGuard<'_, FxHashMap<RequestId, Arc<AskSlot<R>>>> {
        self.map.lock(shard_of(id, self.map.shards()))
    }

    /// Enters `slot` under `id`; false (and nothing changes) if `id` is
    /// already pending.
    #[inline]
    pub(crate) fn insert_new(&self, id: RequestId, slot: &Arc<AskSlot<R>>) -> bool {
        match self.shard(id).entry(id) {
            std::collections::hash_map::Entry::Occupied(_) => false,
            std::collections::hash_map::Entry::Vacant(v) => {
                // Under the shard's lock, as the removal's store.
                slot.pending.store(true, Ordering::Relaxed);
                v.insert(Arc::clone(slot));
                true
            }
        }
    }

    #[inline]
    pub(crate) fn get(&self, id: RequestId) -> Option<Arc<AskSlot<R>>> {
        self.shard(id).get(&id).cloned()
    }

    #[inline]
    pub(crate) fn remove(&self, id: RequestId) {
        // Dropped outside the lock.
        let slot = {
            let mut shard = self.shard(id);
            let slot = shard.remove(&id);
            if let Some(slot) = &slot {
                slot.pending.store(false, Ordering::Relaxed);
            }
            slot
        };
        drop(slot);
    }

    pub(crate) fn len(&self) -> usize {
        self.map.len()
    }
}

impl<R> Default for PendingMap<R> {
    fn default() -> Self {
        Self {
            map: ShardedMap::default(),
        }
    }
}

/// The caller endpoint of a node: its pending asks, what it ignored, its
/// dead letters and its record of timed-out asks.
pub(crate) struct CallerSide<M, R> {
    pub(crate) pending: PendingMap<R>,
    /// Timers armed by live handles (of their own; see `deadlines`).
    pub(crate) armed_timers: AtomicUsize,
    /// Asks that wait only for their deadline, swept by one timer.
    pub(crate) deadlines: DeadlineQueue<Arc<AskSlot<R>>>,
    pub(crate) weak_self: Weak<CallerSide<M, R>>,
    /// Request frames re-sent after the first.
    pub(crate) retries: AtomicU64,
    /// Frames that arrived for an ask no longer pending (duplicates, late).
    pub(crate) ignored_frames: AtomicU64,
    pub(crate) late_outcomes: AtomicU64,
    pub(crate) dlq: Mutex<DeadLetterQueue<M, R>>,
    timed_out: Mutex<TimedOutAsks<R>>,
    /// Drops timed-out records past their window while no ask times out
    /// (each new record trims the old ones too).
    timed_out_sweep: IdleSweep,
    late_hook: RwLock<Option<LateHook<R>>>,
    clock: Arc<NodeClock>,
    /// Set as the node shuts down, before it leaves its transport: from
    /// then on the transport drops frames for it, and so does
    /// `deliver_direct`.
    closed: AtomicBool,
}

impl<M, R> CallerSide<M, R> {
    pub(crate) fn new(
        clock: Arc<NodeClock>,
        dlq_capacity: usize,
        reconcile_capacity: usize,
        reconcile_window: Duration,
    ) -> Arc<Self> {
        Arc::new_cyclic(|weak_self| Self {
            pending: PendingMap::default(),
            armed_timers: AtomicUsize::new(0),
            deadlines: DeadlineQueue::default(),
            weak_self: weak_self.clone(),
            retries: AtomicU64::new(0),
            ignored_frames: AtomicU64::new(0),
            late_outcomes: AtomicU64::new(0),
            dlq: Mutex::new(DeadLetterQueue::new(dlq_capacity)),
            timed_out: Mutex::new(TimedOutAsks {
                capacity: reconcile_capacity,
                window: reconcile_window,
                records: FxHashMap::default(),
                order: VecDeque::new(),
            }),
            timed_out_sweep: IdleSweep::new(),
            late_hook: RwLock::new(None),
            clock,
            closed: AtomicBool::new(false),
        })
    }

    fn ignored(&self) {
        self.ignored_frames.fetch_add(1, Ordering::Relaxed);
    }

    /// The node is shutting down (see `closed`).
    pub(crate) fn close(&self) {
        self.closed.store(true, Ordering::Release);
    }

    /// The node is gone: drops what only it could reach (the late-outcome
    /// hook, dead letters with their payloads and hooks, timed-out
    /// records), for a pool that outlives it still holds this caller side.
    pub(crate) fn forget(&self) {
        self.timed_out_sweep.stop();
        let hook = self.late_hook.write().take();
        let letters = std::mem::replace(&mut *self.dlq.lock(), DeadLetterQueue::new(0));
        let records = {
            let mut t = self.timed_out.lock();
            (std::mem::take(&mut t.records), std::mem::take(&mut t.order))
        };
        // Dropped outside the locks: a payload's or a hook's drop may run
        // anything.
        drop((hook, letters, records));
    }

    /// A frame from one of the node's own pools about an ask whose slot the
    /// pool holds, on a transport that hands frames over directly (see
    /// `WorkerTransport::hands_over_directly`): delivered into `slot` as
    /// the transport's routing would (`deliver`) while the slot is the
    /// pending one for its id, else routed. `now` is the pool's clock (the
    /// node's), when it read it for this frame already.
    pub(crate) fn deliver_direct(
        &self,
        slot: &AskSlot<R>,
        frame: ToCaller<R>,
        now: Option<Timestamp>,
    ) where
        M: Send,
        R: Send,
    {
        if self.closed.load(Ordering::Acquire) {
            // The transport has no route to a closed caller: it drops the frame.
            return;
        }
        if !slot.pending.load(Ordering::Relaxed) || !slot.answers(&frame) {
            return self.deliver(frame);
        }
        let ids = *frame.ids().expect("a direct frame is about one ask");
        self.deliver_to(slot, ids, frame, || now.unwrap_or_else(|| self.clock.now()));
    }

    /// [`deliver_direct`](Self::deliver_direct) of an Ack (`stage`
    /// RECEIVED) or a Read (READ), which every slot of their ids answers:
    /// `frame` makes the frame only if it is routed.
    #[inline]
    pub(crate) fn stage_direct(
        &self,
        slot: &AskSlot<R>,
        ids: &AskIds,
        stage: AckStage,
        now: Option<Timestamp>,
        frame: impl FnOnce(AskIds) -> ToCaller<R>,
    ) where
        M: Send,
        R: Send,
    {
        if self.closed.load(Ordering::Acquire) {
            return;
        }
        if !slot.pending.load(Ordering::Relaxed) {
            return self.deliver(frame(*ids));
        }
        slot.ack(stage, || now.unwrap_or_else(|| self.clock.now()));
    }

    /// [`deliver_direct`](Self::deliver_direct) of a reply, the frame made
    /// only if it is routed.
    #[inline]
    pub(crate) fn reply_direct(
        &self,
        slot: &AskSlot<R>,
        ids: &AskIds,
        outcome: Outcome<R>,
        fingerprint: Option<PayloadFingerprint>,
    ) where
        M: Send,
        R: Send,
    {
        if self.closed.load(Ordering::Acquire) {
            return;
        }
        if !slot.pending.load(Ordering::Relaxed) || !slot.answers_outcome(fingerprint) {
            return self.deliver(ToCaller::Reply {
                ids: *ids,
                outcome,
                fingerprint,
            });
        }
        self.offer_reply(slot, ids, outcome, fingerprint);
    }

    /// Offers a reply to the slot of its ask: reconciled if the ask timed
    /// out (its slot closed), counted as ignored if it is a duplicate.
    #[inline]
    fn offer_reply(
        &self,
        slot: &AskSlot<R>,
        ids: &AskIds,
        outcome: Outcome<R>,
        fingerprint: Option<PayloadFingerprint>,
    ) {
        match slot.offer(SlotEvent::Reply(outcome)) {
            Offered::Closed(event) => self.reconcile_event(*ids, fingerprint, event),
            Offered::Taken => {}
            Offered::Duplicate => self.ignored(),
        }
    }

    /// Fails every pending ask with `error` (the node is shutting down).
    pub(crate) fn abort_all(&self, error: &AskError) {
        for slot in self.pending.map.values() {
            slot.offer(SlotEvent::Aborted(error.clone()));
        }
    }

    /// Remembers that `ids` timed out, for reconciliation of a late outcome.
    pub(crate) fn record_timeout(
        &self,
        ids: AskIds,
        pool: PoolName,
        slot: Arc<AskSlot<R>>,
        now: Timestamp,
    ) where
        M: Send + 'static,
        R: Send + 'static,
    {
        let (replaced, gone, window) = {
            let mut t = self.timed_out.lock();
            let replaced = t.records.insert(
                ids.request_id,
                TimedOutAsk {
                    ids,
                    pool,
                    at: now,
                    slot,
                },
            );
            t.order.push_back((ids.request_id, now));
            (replaced, t.trim(now), t.window)
        };
        // Outside the lock (see `trim`).
        drop((replaced, gone));
        self.timed_out_sweep.arm(&self.weak_self, window);
    }

    /// Records held, without trimming them first (as `timed_out_len` does).
    #[cfg(test)]
    pub(crate) fn timed_out_held(&self) -> usize {
        self.timed_out.lock().records.len()
    }

    pub(crate) fn timed_out_len(&self) -> usize {
        let (len, gone) = {
            let mut t = self.timed_out.lock();
            let gone = t.trim(self.clock.now());
            (t.records.len(), gone)
        };
        drop(gone);
        len
    }

    pub(crate) fn set_late_hook(&self, hook: Option<LateHook<R>>) {
        *self.late_hook.write() = hook;
    }

    /// A terminal frame for an ask that is no longer pending: if it timed
    /// out recently, reconcile it once; otherwise it is a duplicate.
    /// Reconciles an outcome taken back from a closed slot (see
    /// [`AskSlot::close`]).
    pub(crate) fn reconcile_event(
        &self,
        ids: AskIds,
        fingerprint: Option<PayloadFingerprint>,
        event: SlotEvent<R>,
    ) {
        match event {
            SlotEvent::Reply(outcome) => self.reconcile(ToCaller::Reply {
                ids,
                outcome,
                fingerprint,
            }),
            SlotEvent::Cancelled(reason) => self.reconcile(ToCaller::Cancelled { ids, reason }),
            // The node shut down, or an attempt was turned away: nothing is
            // late.
            SlotEvent::Aborted(_) | SlotEvent::Refused(_) => {}
        }
    }

    fn reconcile(&self, frame: ToCaller<R>) {
        if let ToCaller::Cancelled {
            reason:
                CancelReason::Caller
                | CancelReason::CallerTimeout
                | CancelReason::ProcessingTimeout
                | CancelReason::Shutdown,
            ..
        } = frame
        {
            // The pool's answer to this caller's own cancel, come after the
            // ask ended, its processing timeout (a timeout too, which no
            // outcome reconciles to), or its closing: the work was
            // cancelled, not done; nothing is late and the dead letter
            // stays, to be replayed.
            self.ignored();
            return;
        }
        let id = frame.ids().expect("not a batch").request_id;
        let now = self.clock.now();
        let (record, gone) = {
            let mut t = self.timed_out.lock();
            let gone = t.trim(now);
            let record = match t.records.get(&id) {
                Some(r) if r.slot.answers(&frame) => t.records.remove(&id),
                _ => None,
            };
            (record, gone)
        };
        drop(gone);
        let result = match frame {
            ToCaller::Reply { outcome, .. } => LateResult::Reply(outcome),
            ToCaller::Cancelled { reason, .. } => LateResult::Cancelled(reason),
            _ => unreachable!("only terminal frames reconcile"),
        };
        let Some(record) = record else {
            self.ignored();
            return;
        };
        self.late_outcomes.fetch_add(1, Ordering::Relaxed);
        telemetry::late_outcome();
        // Dropped last, outside the lock: its payload or replay hook may
        // hold the last clone of the node, whose drop locks the DLQ
        // (`CallerSide::forget`).
        let letter = self.dlq.lock().take(id);
        let stage = record.slot.reconcile(
            match &result {
                LateResult::Reply(outcome) => AckStage::terminal_for_outcome(outcome),
                LateResult::Cancelled(_) => AckStage::Failed,
            },
            now,
        );
        let hook = self.late_hook.read().clone();
        if let Some(hook) = hook {
            hook(LateOutcome {
                ids: record.ids,
                pool: record.pool,
                result,
                stage,
                late_by: now.saturating_since(record.at),
            });
        }
        drop(letter);
    }
}

impl<M: Send + 'static, R: Send + 'static> IdleSweepOwner for CallerSide<M, R> {
    fn idle_sweep(&self) -> &IdleSweep {
        &self.timed_out_sweep
    }
    fn sweep_idle(&self) -> Option<Duration> {
        let now = self.clock.now();
        let (next, gone) = {
            let mut t = self.timed_out.lock();
            let gone = t.trim(now);
            (t.next_due(now), gone)
        };
        // Outside the lock (see `trim`).
        drop(gone);
        next
    }
}

impl<M: Send + 'static, R: Send + 'static> DeadlineOwner for CallerSide<M, R> {
    type Item = Arc<AskSlot<R>>;
    fn deadlines(&self) -> &DeadlineQueue<Arc<AskSlot<R>>> {
        &self.deadlines
    }
    fn clock(&self) -> &NodeClock {
        &self.clock
    }
    fn fire(&self, _key: ExpiryKey, slot: Arc<AskSlot<R>>) {
        slot.deadline_due();
    }
    /// Wakes the asks waiting for their deadline (not due): each one's next
    /// poll starts a sweeper on its own runtime.
    fn orphaned(&self) {
        for slot in self.deadlines.waiting() {
            slot.nudge();
        }
    }
}

impl<M: Send, R: Send> CallerEndpoint<R> for CallerSide<M, R> {
    fn deliver(&self, frame: ToCaller<R>) {
        let (ids, frame) = match frame {
            ToCaller::AckBatch { acks, .. } => {
                for ids in acks {
                    self.deliver(ToCaller::Ack { ids });
                }
                return;
            }
            frame => (*frame.ids().expect("not a batch"), frame),
        };
        let id = ids.request_id;
        // Cloned out: a shard's lock must not be held while waking.
        let slot = self.pending.get(id).filter(|slot| slot.answers(&frame));
        let Some(slot) = slot else {
            match frame {
                ToCaller::Reply { .. } | ToCaller::Cancelled { .. } => self.reconcile(frame),
                // A refusal included: nothing was done, nothing is late.
                _ => self.ignored(),
            }
            return;
        };
        self.deliver_to(&slot, ids, frame, || self.clock.now());
    }
}

impl<M, R> CallerSide<M, R> {
    /// Delivers a frame about the ask of `slot`, the pending slot of
    /// `ids.request_id`, which `answers` it.
    fn deliver_to(
        &self,
        slot: &AskSlot<R>,
        ids: AskIds,
        frame: ToCaller<R>,
        now: impl FnOnce() -> Timestamp,
    ) {
        let fresh = match frame {
            ToCaller::Ack { .. } => {
                slot.ack(AckStage::Received, now);
                true
            }
            // READ implies RECEIVED: the Ack may have been lost.
            ToCaller::Read { .. } => {
                slot.ack(AckStage::Read, now);
                true
            }
            ToCaller::Progress { progress, .. } => {
                slot.progress(progress, now);
                true
            }
            ToCaller::Reply {
                outcome,
                fingerprint,
                ..
            } => return self.offer_reply(slot, &ids, outcome, fingerprint),
            // The slot of a timed-out ask is closed: the refusal of an
            // attempt is handed back, and dropped (nothing was done).
            ToCaller::Refused { error, .. } => {
                matches!(slot.offer(SlotEvent::Refused(error)), Offered::Taken)
            }
            // On a closed slot (the ask timed out) it is reconciled: a
            // cancel of the pool's own (shutdown, processing timeout, the
            // worker) is a late outcome; its answer to the ask's own cancel
            // is not, which `reconcile` tells apart.
            ToCaller::Cancelled { reason, .. } => match slot.offer(SlotEvent::Cancelled(reason)) {
                Offered::Closed(event) => return self.reconcile_event(ids, None, event),
                offered => matches!(offered, Offered::Taken),
            },
            ToCaller::AckBatch { .. } => unreachable!("unpacked above"),
        };
        if !fresh {
            self.ignored();
        }
    }
}
