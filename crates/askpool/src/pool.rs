//! The inbound side of a worker pool: admission, dedup, routing to workers.
//!
//! Frames arrive through [`PoolEndpoint::deliver`]. Each one is one step of
//! askpool-proto's inbound table, applied atomically to the key's entry in the
//! dedup table; this module only performs the resulting action. Admitted
//! requests wait in a flume queue (the pool's, or the preferred worker's) for
//! a worker; the queue is bounded by `max_in_flight`, enforced at admission.

use std::any::Any;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Weak};

use crate::cancel::CancelSignal;
use askpool_dedup::{DedupState, DedupStats, DedupTable};
use askpool_proto::inbound::{self, InboundAction, InboundEvent, InboundState};
use askpool_proto::{
    AckStage, AskError, AskIds, CallerId, CancelReason, DedupKey, Envelope, ErrorCode, Outcome,
    PoolName, Progress, RequestMeta, Timestamp, ToCaller, ToWorker, WorkerId,
};
use parking_lot::{Mutex, RwLock};
use rustc_hash::FxHashMap;

use crate::clock::NodeClock;
use crate::config::PoolConfig;
use crate::deadlines::{DeadlineOwner, DeadlineQueue};
use crate::expiry::{Expiring, ExpiryKey};
use crate::idle_sweep::{IdleSweep, IdleSweepOwner};
use crate::pending::{AskSlot, CallerSide};
use crate::queue::QueueSignal;
use crate::shard::StripedCounter;
use crate::stats::{LivePool, PoolStats};
use crate::telemetry;
use crate::transport::{PoolEndpoint, WorkerTransport};

/// What the dedup table stores per key: the protocol state, plus the running
/// request (for its cancel signal) while it is in progress.
pub(crate) struct Entry<R> {
    state: InboundState<R>,
    running: Option<Arc<Admitted>>,
    /// Where the running request sits in the pool's expiry index.
    expiry: Option<ExpiryKey>,
}

impl<R> DedupState for Entry<R> {
    fn is_terminal(&self) -> bool {
        self.state.is_terminal()
    }
}

/// What a worker queue carries: requests, and at the end a sentinel that
/// tells waiting workers the pool closed (cheaper than a shutdown signal
/// every dequeue has to select on).
pub(crate) enum Work<M> {
    Item(WorkItem<M>),
    Closed,
}

/// A named worker's own queue as the pool sees it: asks that prefer the
/// worker are sent here, and a close takes back what is still queued.
pub(crate) struct WorkerQueue<M> {
    pub(crate) tx: flume::Sender<Work<M>>,
    pub(crate) rx: flume::Receiver<Work<M>>,
    pub(crate) signal: Arc<QueueSignal>,
}

impl<M> WorkerQueue<M> {
    /// Queues `work` and wakes the worker; gives it back if the worker is gone.
    fn push(&self, work: Work<M>) -> Result<(), Work<M>> {
        self.signal.push(&self.tx, work)
    }
}

/// An ask's slot and the caller side of the node that holds it (see
/// `PoolShared::local_slot_of`).
type LocalSlot<'a, M, R> = (Arc<AskSlot<R>>, &'a CallerSide<M, R>);

/// What an admitted request shares between its dedup entry, its queue item,
/// its handler's context and its responder: one allocation per request.
pub(crate) struct Admitted {
    pub(crate) meta: RequestMeta,
    /// Set when the request is cancelled (by its caller, a processing
    /// timeout or the pool); the handler may read it.
    pub(crate) cancel: CancelSignal,
    /// The pending slot of the ask that sent it, when that ask is the
    /// pool's own node's on a transport that hands frames over directly
    /// (an `AskSlot<R>`: this struct does not know `R`). Weak: a request
    /// (its queue item, its handler's context, a context a handler keeps)
    /// must not keep a finished ask's slot, with its waker and spans; a
    /// slot gone is an ask no longer pending, whose frames are routed.
    pub(crate) reply_to: Option<Weak<dyn Any + Send + Sync>>,
}

/// An admitted request on its way to a worker.
pub(crate) struct WorkItem<M> {
    /// Shared: a queued item, a handler's future and the context stay small
    /// to move, and taking a request clones no ids or names.
    pub(crate) request: Arc<Admitted>,
    pub(crate) payload: M,
}

#[derive(Default)]
pub(crate) struct PoolCounters {
    /// Striped: written by every request.
    pub(crate) admitted: StripedCounter,
    pub(crate) handler_runs: StripedCounter,
    pub(crate) duplicate_acks: AtomicU64,
    pub(crate) replays: AtomicU64,
    pub(crate) suppressed_replies: AtomicU64,
    pub(crate) payload_mismatches: AtomicU64,
    pub(crate) rejected_full: AtomicU64,
    pub(crate) cancels: AtomicU64,
    pub(crate) tombstones: AtomicU64,
    pub(crate) expired: AtomicU64,
    /// Reply-cache evictions (capacity, TTL) already added to the
    /// process's counter (`Node::stats` publishes what is new).
    evictions_published: [AtomicU64; 2],
}

impl PoolCounters {
    /// Evictions (capacity, TTL) not yet published, of the totals `dedup`
    /// gives; each is published once, whoever publishes first.
    pub(crate) fn unpublished_evictions(&self, dedup: &DedupStats) -> (u64, u64) {
        let [capacity, ttl] = &self.evictions_published;
        let new = |published: &AtomicU64, total: u64| {
            total.saturating_sub(published.fetch_max(total, Ordering::Relaxed))
        };
        (
            new(capacity, dedup.evicted_capacity),
            new(ttl, dedup.evicted_ttl),
        )
    }
}

pub(crate) struct PoolShared<M, R> {
    pub(crate) name: PoolName,
    pub(crate) config: PoolConfig,
    /// Its in-progress count is the pool's in-flight count (a second
    /// counter would be two more writes per request on a shared line).
    table: DedupTable<Entry<R>>,
    pub(crate) queue_tx: flume::Sender<Work<M>>,
    pub(crate) queue_rx: flume::Receiver<Work<M>>,
    /// Wakes an idle worker when the shared queue gets work (`queue`).
    /// Workers wait on this (and their own inbox's) instead of a channel's
    /// `recv_async`, which allocates and unlinks a waiter hook on every wait.
    pub(crate) work: QueueSignal,
    pub(crate) workers: RwLock<FxHashMap<WorkerId, WorkerQueue<M>>>,
    /// Items in all the workers' inboxes (see `drop_cancelled`).
    pub(crate) inbox_items: Arc<AtomicUsize>,
    transport: Arc<dyn WorkerTransport<M, R>>,
    clock: Arc<NodeClock>,
    closed: AtomicBool,
    pub(crate) counters: PoolCounters,
    /// Running requests by processing deadline (bounded by max in-flight).
    expiries: DeadlineQueue<Expiring>,
    weak_self: Weak<PoolShared<M, R>>,
    /// Acks waiting for the end of the tick (`batch_acks`), per caller.
    ack_buffer: Mutex<FxHashMap<CallerId, Vec<AskIds>>>,
    flush_scheduled: AtomicBool,
    /// A pass of `drop_cancelled` runs.
    compacting: AtomicBool,
    /// Set when the pool closes: running handlers see it in their context.
    closing: CancelSignal,
    /// Applies the reply cache's TTL while no request comes (the table
    /// applies it on its own operations only).
    ttl_sweep: IdleSweep,
    /// The pool's own node's caller, and its id, when the transport hands
    /// frames over directly: that caller's asks are answered straight into
    /// their slots (`Admitted::reply_to`). A pool kept after its node is
    /// gone (a binding's worker, a request, a context) keeps this much of
    /// it: the node let go of the caller side's contents (hooks, dead
    /// letters, records) when it was dropped (`CallerSide::forget`).
    local_caller: Option<(CallerId, Arc<CallerSide<M, R>>)>,
    _live: LivePool,
}

/// Which entry of a key a step may change.
#[derive(Clone, Copy)]
enum Only<'a> {
    /// Whatever entry holds the key (a request arriving, a caller's cancel).
    Any,
    /// The in-progress entry indexed under this expiry (a processing timeout).
    Expiring(ExpiryKey),
    /// The entry of this very request, or a terminal one. A request whose
    /// entry ended (cancelled), was evicted and whose key was admitted again
    /// is another request's now: its handler's late answer or cancel must
    /// not end the new one.
    Running(&'a Arc<Admitted>),
}

/// Flushes a pool's buffered acks when dropped (see `buffer_ack`).
struct FlushOnDrop<M: Send + 'static, R: Clone + Send + 'static>(Weak<PoolShared<M, R>>);

impl<M: Send + 'static, R: Clone + Send + 'static> Drop for FlushOnDrop<M, R> {
    fn drop(&mut self) {
        if let Some(pool) = self.0.upgrade() {
            pool.flush_acks();
        }
    }
}

impl<M: Send + 'static, R: Clone + Send + 'static> PoolShared<M, R> {
    pub(crate) fn new(
        name: PoolName,
        config: PoolConfig,
        transport: Arc<dyn WorkerTransport<M, R>>,
        clock: Arc<NodeClock>,
        local_caller: Option<(CallerId, Arc<CallerSide<M, R>>)>,
    ) -> Arc<Self> {
        let (queue_tx, queue_rx) = flume::unbounded();
        Arc::new_cyclic(|weak_self| Self {
            table: DedupTable::new(config.dedup),
            name,
            config,
            queue_tx,
            queue_rx,
            work: QueueSignal::shared(),
            workers: RwLock::default(),
            inbox_items: Arc::default(),
            transport,
            clock,
            closed: AtomicBool::new(false),
            counters: PoolCounters::default(),
            expiries: DeadlineQueue::default(),
            weak_self: weak_self.clone(),
            ack_buffer: Mutex::default(),
            flush_scheduled: AtomicBool::new(false),
            compacting: AtomicBool::new(false),
            closing: CancelSignal::default(),
            ttl_sweep: IdleSweep::new(),
            local_caller,
            _live: LivePool::new(),
        })
    }

    /// `SeqCst`, as the close's store: `enqueue` pushes then looks at this,
    /// `close` sets it then looks at the queue (see `QueueSignal`), and
    /// each must see the other's write (free on x86 and ARM).
    pub(crate) fn is_closed(&self) -> bool {
        self.closed.load(Ordering::SeqCst)
    }

    /// One step of the inbound table for `key`. Keeps the expiry index in
    /// step with the entries that are InProgress (the in-flight count is the
    /// table's own count of them), and
    /// returns the action plus the running request the step ended (whose
    /// cancel signal a Cancel step sets). `None` means a new request was
    /// refused because the pool is full, or (with `only_if`) that the entry
    /// was no longer the one that expired.
    ///
    /// `starting` is the request an `InboundEvent::Request` would start;
    /// `only` says which entry the step may change.
    fn step(
        &self,
        key: DedupKey,
        now: Timestamp,
        event: InboundEvent<R>,
        starting: Option<&Arc<Admitted>>,
        only: Only<'_>,
    ) -> Option<(InboundAction<R>, Option<Arc<Admitted>>)> {
        // The table takes the room for a new request before the step runs,
        // so requests admitted at once on several threads stay within
        // `max_in_flight` (its in-progress count is the pool's in-flight).
        let max = self.config.max_in_flight;
        self.table
            .apply_bounded(key, now, max, |current, has_room| {
                match only {
                    Only::Any => {}
                    Only::Expiring(expected) => {
                        if current.is_none_or(|e| e.is_terminal() || e.expiry != Some(expected)) {
                            return (None, None);
                        }
                    }
                    Only::Running(request) => {
                        let other = |e: &Entry<R>| {
                            !e.is_terminal()
                                && !e.running.as_ref().is_some_and(|r| Arc::ptr_eq(r, request))
                        };
                        if current.is_some_and(other) {
                            return (None, None);
                        }
                    }
                }
                let is_new = current.is_none() && matches!(event, InboundEvent::Request { .. });
                if is_new && !has_room {
                    return (None, None);
                }
                let transition = inbound::step(current.map(|e| &e.state), event);
                let mut request = None;
                let next = transition.next.map(|state| {
                    if state.is_terminal() {
                        if let Some(running) = current.filter(|e| !e.is_terminal()) {
                            request = running.running.clone();
                            if let Some(expiry) = running.expiry {
                                self.expiries.remove(expiry);
                            }
                        }
                        Entry {
                            state,
                            running: None,
                            expiry: None,
                        }
                    } else {
                        let started =
                            Arc::clone(starting.expect("only a request starts a handler"));
                        let expiry = self.processing_deadline(now).map(|at| {
                            let meta = &started.meta;
                            let what = Expiring {
                                ids: meta.ids,
                                expects_reply: meta.expects_reply,
                            };
                            self.index_expiry(at, what)
                        });
                        Entry {
                            state,
                            running: Some(started),
                            expiry,
                        }
                    }
                });
                (next, Some((transition.action, request)))
            })
    }

    /// Enters a running request in the expiry index (under the dedup lock;
    /// the sweeper never holds the index while it takes that lock).
    fn index_expiry(&self, at: Timestamp, what: Expiring) -> ExpiryKey {
        self.expiries.insert(&self.weak_self, at, what)
    }

    /// The processing deadline of a request admitted now. Not the caller's
    /// deadline: work that finishes after its caller gave up is a late
    /// outcome the caller reconciles (SW4RM), not something to cut short.
    fn processing_deadline(&self, now: Timestamp) -> Option<Timestamp> {
        self.config.processing_timeout.map(|d| now + d)
    }

    /// A step just left a terminal entry in the reply cache: it goes at
    /// its TTL even if no request comes to apply it (see `idle_sweep`).
    fn cached_until_ttl(&self) {
        let ttl = self.config.dedup.terminal_ttl;
        if !ttl.is_zero() {
            self.ttl_sweep.arm(&self.weak_self, ttl);
        }
    }

    /// Cancels a running request whose processing deadline passed, unless
    /// it is no longer the entry that was indexed under `key`.
    fn expire(&self, key: ExpiryKey, what: Expiring) {
        let reason = CancelReason::ProcessingTimeout;
        self.cancel_step(what.ids, reason, what.expects_reply, Only::Expiring(key));
    }

    fn send(&self, frame: ToCaller<R>) {
        if self.config.batch_acks {
            if let ToCaller::Ack { ids } = frame {
                self.buffer_ack(ids);
                return;
            }
        }
        self.send_now(frame);
    }

    /// Holds an Ack until the end of the scheduling tick, so that the acks
    /// for one caller travel as one `AckBatch` frame.
    fn buffer_ack(&self, ids: AskIds) {
        self.ack_buffer
            .lock()
            .entry(ids.caller_id)
            .or_default()
            .push(ids);
        if self.flush_scheduled.swap(true, Ordering::AcqRel) {
            return;
        }
        match tokio::runtime::Handle::try_current() {
            Ok(runtime) => {
                // The flush is the guard's drop: it happens even if the task
                // never runs (its runtime shuts down first), or the flag
                // would stay set and every later ack would wait here forever.
                let flush = FlushOnDrop(self.weak_self.clone());
                runtime.spawn(async move {
                    // Let the tick's other tasks add their acks first.
                    tokio::task::yield_now().await;
                    drop(flush);
                });
            }
            Err(_) => self.flush_acks(),
        }
    }

    fn flush_acks(&self) {
        self.flush_scheduled.store(false, Ordering::Release);
        let batches = std::mem::take(&mut *self.ack_buffer.lock());
        for (caller, mut acks) in batches {
            let frame = if acks.len() == 1 {
                ToCaller::Ack {
                    ids: acks.pop().expect("one ack"),
                }
            } else {
                ToCaller::AckBatch { caller, acks }
            };
            self.send_now(frame);
        }
    }

    /// Sends a frame about `request`: straight into its ask's slot when
    /// the ask is this node's own (see `Admitted::reply_to`), else through
    /// the transport. `now` is the pool's clock if it was read for this
    /// frame. Acks that wait for the end of the tick (`batch_acks`) are
    /// batched as before.
    fn send_about(&self, request: &Admitted, frame: ToCaller<R>, now: Option<Timestamp>) {
        let batched = self.config.batch_acks && matches!(frame, ToCaller::Ack { .. });
        if let Some((slot, caller)) = (!batched).then(|| self.local_slot_of(request)).flatten() {
            Self::note_sent(&frame);
            caller.deliver_direct(&slot, frame, now);
            return;
        }
        self.send(frame);
    }

    /// The slot of `request`'s ask and this node's caller side, when the
    /// ask is this node's own and its slot is still alive (see
    /// `Admitted::reply_to`): where a frame about it goes directly.
    #[inline(always)]
    fn local_slot_of(&self, request: &Admitted) -> Option<LocalSlot<'_, M, R>> {
        let slot = request.reply_to.as_ref()?.upgrade()?;
        let (_, caller) = self.local_caller.as_ref()?;
        Some((slot.downcast::<AskSlot<R>>().ok()?, caller))
    }

    /// [`send_about`](Self::send_about) for an Ack (`RECEIVED`) or a Read
    /// (`READ`), which carry nothing but the ids: delivered into the ask's
    /// slot without making the frame, when it goes there.
    /// `local` is the ask's slot where the caller has it at hand already.
    #[inline]
    fn stage_about(
        &self,
        request: &Admitted,
        stage: AckStage,
        now: Option<Timestamp>,
        local: Option<LocalSlot<'_, M, R>>,
    ) {
        let ids = &request.meta.ids;
        let frame = |ids| match stage {
            AckStage::Read => ToCaller::Read { ids },
            _ => ToCaller::Ack { ids },
        };
        let batched = self.config.batch_acks && stage != AckStage::Read;
        let local = || local.or_else(|| self.local_slot_of(request));
        if let Some((slot, caller)) = (!batched).then(local).flatten() {
            telemetry::ack_sent(stage, None);
            caller.stage_direct(&slot, ids, stage, now, frame);
            return;
        }
        self.send(frame(*ids));
    }

    /// [`send_about`](Self::send_about) for the reply to `request`:
    /// offered to the ask's slot without making the frame, when it goes
    /// there.
    #[inline]
    fn reply_about(&self, request: &Admitted, outcome: Outcome<R>) {
        let meta = &request.meta;
        if let Some((slot, caller)) = self.local_slot_of(request) {
            telemetry::ack_sent(
                AckStage::terminal_for_outcome(&outcome),
                outcome.as_ref().err().map(AskError::code),
            );
            caller.reply_direct(&slot, &meta.ids, outcome, meta.fingerprint);
            return;
        }
        self.send(ToCaller::Reply {
            ids: meta.ids,
            outcome,
            fingerprint: meta.fingerprint,
        });
    }

    /// The pending slot of the ask that sent `ids`, if it is this node's
    /// own (see `local_caller`), and this node's caller side.
    fn local_slot(&self, ids: &AskIds) -> Option<LocalSlot<'_, M, R>> {
        let (caller_id, caller) = self.local_caller.as_ref()?;
        if ids.caller_id != *caller_id {
            return None;
        }
        Some((caller.pending.get(ids.request_id)?, caller))
    }

    /// Counts a frame sent back to a caller (`askpool_acks_sent_total`).
    fn note_sent(frame: &ToCaller<R>) {
        let (stage, code): (AckStage, Option<ErrorCode>) = match frame {
            ToCaller::AckBatch { acks, .. } => {
                for _ in 0..acks.len() {
                    telemetry::ack_sent(AckStage::Received, None);
                }
                return;
            }
            ToCaller::Ack { .. } => (AckStage::Received, None),
            ToCaller::Read { .. } => (AckStage::Read, None),
            ToCaller::Progress { .. } => (AckStage::Partial, None),
            ToCaller::Reply { outcome, .. } => (
                AckStage::terminal_for_outcome(outcome),
                outcome.as_ref().err().map(AskError::code),
            ),
            ToCaller::Refused { error, .. } => {
                (AckStage::terminal_for_error(error), Some(error.code()))
            }
            ToCaller::Cancelled { reason, .. } => (
                AckStage::terminal_for_error(&AskError::AskCancelled { reason: *reason }),
                Some(ErrorCode::AskCancelled),
            ),
        };
        telemetry::ack_sent(stage, code);
    }

    fn send_now(&self, frame: ToCaller<R>) {
        Self::note_sent(&frame);
        // A caller that is gone has nobody to tell; its asks already ended.
        let _ = self.transport.send_to_caller(frame);
    }

    /// Admits a request. An ask hears the table's answer; a tell (one-way)
    /// hears only whether it was accepted: an Ack, or the error that refused
    /// it, so that a refused tell is never lost silently.
    fn admit(&self, env: Envelope<M>) {
        // The envelope is read where it lies and its meta moved once, into
        // the request: each move of it on the way is a copy of its bytes.
        let meta = &env.meta;
        let ids = meta.ids;
        // Loaded while the request is built (an allocation, the caller's
        // slot, a clock read): a new id's bucket is a cache miss.
        self.table.prefetch(&ids.dedup_key());
        let fingerprint = meta.fingerprint;
        let refuse = |error: AskError| {
            self.send(ToCaller::Refused {
                ids,
                error,
                fingerprint,
            })
        };
        if self.is_closed() {
            refuse(AskError::unavailable(format!(
                "pool {} is closed",
                self.name
            )));
            return;
        }
        let event = InboundEvent::Request { fingerprint };
        let expects_reply = meta.expects_reply;
        // Built before the table is consulted, so that a new entry can hold
        // it; a duplicate (rare) drops it again.
        // Found here once: the request keeps it weakly, and its Ack goes
        // to it from here, not found again from there.
        let local = self.local_slot(&ids);
        let reply_to =
            (local.as_ref()).map(|(slot, _)| Arc::downgrade(slot) as Weak<dyn Any + Send + Sync>);
        let request = Arc::new(Admitted {
            meta: env.meta,
            cancel: CancelSignal::default(),
            reply_to,
        });
        let payload = env.payload;
        // Read here, not taken from the caller: its reading comes before
        // the payload's clone and the breaker's lock (time a processing
        // deadline and the RECEIVED stage must not lose).
        let now = self.clock.now();
        let Some((action, _)) = self.step(ids.dedup_key(), now, event, Some(&request), Only::Any)
        else {
            self.counters.rejected_full.fetch_add(1, Ordering::Relaxed);
            refuse(AskError::BufferFull {
                pool: self.name.to_string(),
                limit: self.config.max_in_flight,
            });
            return;
        };
        let answer = match action {
            InboundAction::RunHandlerAndAck => {
                self.counters.admitted.add(1);
                self.stage_about(&request, AckStage::Received, Some(now), local);
                self.enqueue(WorkItem { request, payload });
                return;
            }
            InboundAction::RejectMismatch => {
                self.counters
                    .payload_mismatches
                    .fetch_add(1, Ordering::Relaxed);
                refuse(AskError::PayloadMismatch);
                return;
            }
            InboundAction::Ack => {
                self.counters.duplicate_acks.fetch_add(1, Ordering::Relaxed);
                telemetry::dedup_hit(false);
                ToCaller::Ack { ids }
            }
            InboundAction::Replay(outcome) => {
                self.counters.replays.fetch_add(1, Ordering::Relaxed);
                telemetry::dedup_hit(true);
                // Admitted: the incoming fingerprint is the cached one's.
                ToCaller::Reply {
                    ids,
                    outcome,
                    fingerprint,
                }
            }
            InboundAction::SendCancelled(reason) => ToCaller::Cancelled { ids, reason },
            _ => unreachable!("the inbound table answers a request with none of the other actions"),
        };
        // A duplicate tell was accepted before: acknowledge it again. A
        // cancelled key is refused to a tell as to an ask: the table's
        // answer, or the tell would be acknowledged and never run.
        self.send(
            if expects_reply || matches!(answer, ToCaller::Cancelled { .. }) {
                answer
            } else {
                ToCaller::Ack { ids }
            },
        );
    }

    /// Hands an admitted request to its preferred worker if that worker is
    /// alive, else to the pool's shared queue.
    pub(crate) fn enqueue(&self, mut item: WorkItem<M>) {
        if item.request.meta.preferred_worker.is_some() {
            // Checked and pushed under the registry's read lock: a worker
            // leaving, and a close, take the write lock before they drain an
            // inbox, so no push lands in an inbox after its last drain.
            let workers = self.workers.read();
            if self.is_closed() {
                drop(workers);
                self.cancel_item(item, CancelReason::Shutdown);
                return;
            }
            let inbox = (item.request.meta.preferred_worker.as_ref()).and_then(|w| workers.get(w));
            if let Some(inbox) = inbox {
                match inbox.push(Work::Item(item)) {
                    Ok(()) => {
                        // Under the read lock, as the push (see above).
                        self.drop_cancelled(&inbox.signal, &inbox.tx, &inbox.rx);
                        self.drop_cancelled_in_inboxes(&workers);
                        return;
                    }
                    Err(Work::Item(back)) => item = back,
                    Err(Work::Closed) => unreachable!(),
                }
            }
        }
        if self.is_closed() {
            self.cancel_item(item, CancelReason::Shutdown);
            return;
        }
        // The pool holds the receiver too, so this send cannot fail.
        let _ = self.work.push(&self.queue_tx, Work::Item(item));
        self.drop_cancelled(&self.work, &self.queue_tx, &self.queue_rx);
        // Closed since the check above: `close` may have drained the queue
        // before this push landed, leaving the item behind its sentinel.
        if self.is_closed() {
            self.cancel_queued();
        }
    }

    /// Keeps a queue within twice `max_in_flight`. A request cancelled
    /// while it waits (its caller timed out or gave up) stays in the queue,
    /// payload and all, until a worker reaches it and skips it; meanwhile
    /// its entry is terminal, so it no longer counts against
    /// `max_in_flight` and the pool admits another. With workers that are
    /// stuck (or gone, or a pull pool nobody pulls) the queue grew without
    /// bound. Live requests are in-progress entries, at most
    /// `max_in_flight`, so a queue that holds twice that holds at least
    /// as many cancelled ones: one pass takes everything queued, drops
    /// those, and puts the live ones back in their order (after anything
    /// pushed meanwhile). Each pass drops at least `max_in_flight` items.
    fn drop_cancelled(
        &self,
        signal: &QueueSignal,
        tx: &flume::Sender<Work<M>>,
        rx: &flume::Receiver<Work<M>>,
    ) {
        let bound = self.config.max_in_flight.saturating_mul(2);
        if signal.len() < bound || self.compacting.swap(true, Ordering::Acquire) {
            return;
        }
        Self::keep_live(signal, tx, rx);
        self.compacting.store(false, Ordering::Release);
    }

    /// Keeps the workers' inboxes together within twice `max_in_flight`,
    /// as `drop_cancelled` keeps each: with many workers that do not pull
    /// (stuck, or pull workers nobody drives), each inbox could hold that
    /// many cancelled requests, payloads and all, for as long as its
    /// worker lives. Called under the registry's read lock (`workers`).
    fn drop_cancelled_in_inboxes(&self, workers: &FxHashMap<WorkerId, WorkerQueue<M>>) {
        let bound = self.config.max_in_flight.saturating_mul(2);
        if self.inbox_items.load(Ordering::Relaxed) < bound
            || self.compacting.swap(true, Ordering::Acquire)
        {
            return;
        }
        for inbox in workers.values() {
            Self::keep_live(&inbox.signal, &inbox.tx, &inbox.rx);
        }
        self.compacting.store(false, Ordering::Release);
    }

    /// One pass over a queue: drops the cancelled requests it holds and puts
    /// the others back in their order (after anything pushed meanwhile).
    fn keep_live(signal: &QueueSignal, tx: &flume::Sender<Work<M>>, rx: &flume::Receiver<Work<M>>) {
        for _ in 0..signal.len() {
            match signal.take(rx) {
                None => break,
                Some(Work::Item(item)) if item.request.cancel.is_cancelled() => {}
                Some(work) => {
                    let _ = signal.push(tx, work);
                }
            }
        }
    }

    /// Cancels every request in the shared queue (the pool is closed) and
    /// leaves one sentinel there for the workers still to see.
    fn cancel_queued(&self) {
        while let Some(work) = self.work.take(&self.queue_rx) {
            if let Work::Item(item) = work {
                self.cancel_item(item, CancelReason::Shutdown);
            }
        }
        let _ = self.work.push(&self.queue_tx, Work::Closed);
        self.work.wake_all();
    }

    /// A cancel for `ids`, from the caller or from the worker side.
    pub(crate) fn cancel(&self, ids: AskIds, reason: CancelReason, reply: bool) {
        self.cancel_step(ids, reason, reply, Only::Any);
    }

    /// A cancel from the worker side of `request` (its responder).
    pub(crate) fn cancel_running(&self, request: &Arc<Admitted>, reason: CancelReason) {
        let meta = &request.meta;
        self.cancel_step(meta.ids, reason, meta.expects_reply, Only::Running(request));
    }

    /// One Cancel step of the table: signals the running handler and
    /// answers `AskCancelled`, or records a tombstone. With `only_if` it is
    /// a processing-timeout expiry, counted as such.
    fn cancel_step(&self, ids: AskIds, reason: CancelReason, reply: bool, only: Only<'_>) {
        let now = self.clock.now();
        let event = InboundEvent::Cancel { reason };
        let Some((action, running)) = self.step(ids.dedup_key(), now, event, None, only) else {
            return;
        };
        self.cached_until_ttl();
        match action {
            InboundAction::SendCancelled(reason) => {
                let counter = match only {
                    Only::Expiring(_) => &self.counters.expired,
                    _ => &self.counters.cancels,
                };
                counter.fetch_add(1, Ordering::Relaxed);
                if let Some(running) = running {
                    running.cancel.cancel();
                }
                if reply {
                    self.send(ToCaller::Cancelled { ids, reason });
                }
            }
            InboundAction::RecordTombstone => {
                self.counters.tombstones.fetch_add(1, Ordering::Relaxed);
            }
            _ => {}
        }
    }

    pub(crate) fn cancel_item(&self, item: WorkItem<M>, reason: CancelReason) {
        let meta = &item.request.meta;
        self.cancel(meta.ids, reason, meta.expects_reply);
    }

    /// The handler of `request` finished with `outcome`.
    pub(crate) fn finish(&self, request: &Arc<Admitted>, outcome: Outcome<R>) {
        let meta = &request.meta;
        let event = InboundEvent::HandlerFinished { outcome };
        let now = self.clock.now();
        let key = meta.ids.dedup_key();
        let Some((action, _)) = self.step(key, now, event, None, Only::Running(request)) else {
            // Its key belongs to a request admitted since: a late answer.
            self.counters
                .suppressed_replies
                .fetch_add(1, Ordering::Relaxed);
            return;
        };
        self.cached_until_ttl();
        match action {
            InboundAction::SendReply(outcome) if meta.expects_reply => {
                self.reply_about(request, outcome);
            }
            InboundAction::SuppressReply => {
                self.counters
                    .suppressed_replies
                    .fetch_add(1, Ordering::Relaxed);
            }
            _ => {}
        }
    }

    /// A worker took the request (the READ stage).
    pub(crate) fn read(&self, request: &Admitted) {
        let meta = &request.meta;
        if meta.expects_reply {
            self.stage_about(request, AckStage::Read, None, None);
        }
    }

    pub(crate) fn progress(&self, request: &Admitted, progress: Progress) {
        let frame = ToCaller::Progress {
            ids: request.meta.ids,
            progress,
        };
        self.send_about(request, frame, None);
    }

    /// Stops admitting, cancels what is queued, and leaves the transport.
    pub(crate) fn close(&self) {
        if self.closed.swap(true, Ordering::SeqCst) {
            return;
        }
        self.transport.deregister_pool(&self.name);
        self.cancel_queued();
        // What the workers' own queues hold is cancelled too: a worker may
        // keep its `Worker` (a binding's handle) and never pull again. Taken
        // under the write lock (see `enqueue`), cancelled after it.
        let mut queued = Vec::new();
        for inbox in self.workers.write().values() {
            while let Some(work) = inbox.signal.take(&inbox.rx) {
                if let Work::Item(item) = work {
                    queued.push(item);
                }
            }
            // `push` wakes the inbox's worker if it waits (else it finds the
            // sentinel on its next look).
            let _ = inbox.push(Work::Closed);
        }
        for item in queued {
            self.cancel_item(item, CancelReason::Shutdown);
        }
        self.expiries.close();
        // Nothing can ask a closed pool again, so its cached replies go now
        // (a binding's pool object may outlive the close by long, holding
        // replies of any size); a reply a running handler still gives is
        // recorded after this, one per worker at most.
        self.table.clear_terminal();
        self.ttl_sweep.stop();
        // Handlers still running are not stopped, but told, as on a cancel:
        // nothing else would (the processing-timeout sweep just ended).
        self.closing.cancel();
    }

    pub(crate) fn closing(&self) -> &CancelSignal {
        &self.closing
    }

    #[cfg(test)]
    pub(crate) fn ttl_sweep_armed(&self) -> bool {
        self.ttl_sweep.is_armed()
    }

    pub(crate) fn stats(&self) -> PoolStats {
        let c = &self.counters;
        let get = |a: &AtomicU64| a.load(Ordering::Relaxed);
        PoolStats {
            name: self.name.to_string(),
            in_flight: self.table.in_progress(),
            // A closed pool cancelled what it held; its queues hold only
            // the markers that stop its workers.
            queued: if self.is_closed() {
                0
            } else {
                self.queue_rx.len()
                    + (self.workers.read().values())
                        .map(|w| w.tx.len())
                        .sum::<usize>()
            },
            dedup: self.table.stats(),
            admitted: c.admitted.count(),
            handler_runs: c.handler_runs.count(),
            duplicate_acks: get(&c.duplicate_acks),
            replays: get(&c.replays),
            suppressed_replies: get(&c.suppressed_replies),
            payload_mismatches: get(&c.payload_mismatches),
            rejected_full: get(&c.rejected_full),
            cancels: get(&c.cancels),
            tombstones: get(&c.tombstones),
            expired: get(&c.expired),
            expiry_index: self.expiries.len(),
        }
    }

    /// Removes terminal entries whose TTL has passed.
    pub(crate) fn evict_expired(&self) {
        self.table.evict_expired(self.clock.now());
    }
}

impl<M: Send + 'static, R: Clone + Send + 'static> DeadlineOwner for PoolShared<M, R> {
    type Item = Expiring;
    fn deadlines(&self) -> &DeadlineQueue<Expiring> {
        &self.expiries
    }
    fn clock(&self) -> &NodeClock {
        &self.clock
    }
    fn fire(&self, key: ExpiryKey, what: Expiring) {
        self.expire(key, what);
    }
}

impl<M: Send + 'static, R: Clone + Send + 'static> IdleSweepOwner for PoolShared<M, R> {
    fn idle_sweep(&self) -> &IdleSweep {
        &self.ttl_sweep
    }
    fn sweep_idle(&self) -> Option<std::time::Duration> {
        // A closed pool dropped its cache (`close`).
        if self.is_closed() {
            return None;
        }
        let now = self.clock.now();
        (self.table.sweep_expired(now)).map(|due| due.saturating_since(now))
    }
}

/// What a node does with its pools, whatever their message types.
pub(crate) trait PoolControl: Send + Sync {
    fn close(&self);
    fn stats(&self) -> PoolStats;
    /// See [`PoolCounters::unpublished_evictions`].
    fn unpublished_evictions(&self, dedup: &DedupStats) -> (u64, u64);
    fn evict_expired(&self);
}

impl<M: Send + 'static, R: Clone + Send + 'static> PoolControl for PoolShared<M, R> {
    fn close(&self) {
        PoolShared::close(self);
    }
    fn stats(&self) -> PoolStats {
        PoolShared::stats(self)
    }
    fn unpublished_evictions(&self, dedup: &DedupStats) -> (u64, u64) {
        self.counters.unpublished_evictions(dedup)
    }
    fn evict_expired(&self) {
        PoolShared::evict_expired(self);
    }
}

impl<M: Send + 'static, R: Clone + Send + 'static> PoolEndpoint<M> for PoolShared<M, R> {
    fn deliver(&self, frame: ToWorker<M>) {
        match frame {
            ToWorker::Request(env) => self.admit(env),
            ToWorker::Cancel { ids, reason, .. } => self.cancel(ids, reason, true),
        }
    }
}
