//! The caller's pending map: request id -> the slot its [`AskHandle`] polls.
//!
//! The transport completes slots directly (in process, the worker's reply is a
//! function call that stores the reply and wakes the caller's task). An Ack
//! only sets a flag: the handle reads it when it next wakes, which is when a
//! re-send would be due, so an Ack costs no wake-up.
//!
//! [`AskHandle`]: crate::AskHandle

use std::collections::VecDeque;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::task::Waker;
use std::time::Duration;

use askpool_proto::{
    AskError, AskIds, CancelReason, Outcome, PoolName, RequestId, Timestamp, ToCaller,
};
use dashmap::DashMap;
use parking_lot::{Mutex, RwLock};
use rustc_hash::{FxBuildHasher, FxHashMap};

use crate::clock::NodeClock;
use crate::dlq::DeadLetterQueue;
use crate::transport::CallerEndpoint;

/// A terminal-ish frame waiting for its handle.
pub(crate) enum SlotEvent<R> {
    Reply(Outcome<R>),
    Cancelled(CancelReason),
    /// The node shut down under the ask.
    Aborted(AskError),
}

struct SlotInner<R> {
    acked: bool,
    event: Option<SlotEvent<R>>,
    waker: Option<Waker>,
}

pub(crate) struct AskSlot<R> {
    inner: Mutex<SlotInner<R>>,
}

impl<R> AskSlot<R> {
    pub(crate) fn new() -> Self {
        Self {
            inner: Mutex::new(SlotInner {
                acked: false,
                event: None,
                waker: None,
            }),
        }
    }

    fn ack(&self) {
        self.inner.lock().acked = true;
    }

    /// Stores `event` unless one is already waiting; wakes the handle.
    /// Returns false when the event was a duplicate.
    pub(crate) fn offer(&self, event: SlotEvent<R>) -> bool {
        let waker = {
            let mut inner = self.inner.lock();
            if inner.event.is_some() {
                return false;
            }
            inner.event = Some(event);
            inner.waker.take()
        };
        if let Some(waker) = waker {
            waker.wake();
        }
        true
    }

    /// Takes what arrived since the last call and registers `waker`.
    pub(crate) fn take(&self, waker: &Waker) -> (bool, Option<SlotEvent<R>>) {
        let mut inner = self.inner.lock();
        match &inner.waker {
            Some(w) if w.will_wake(waker) => {}
            _ => inner.waker = Some(waker.clone()),
        }
        (std::mem::take(&mut inner.acked), inner.event.take())
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
    /// How long after the caller's timeout it arrived.
    pub late_by: Duration,
}

pub(crate) type LateHook<R> = Arc<dyn Fn(LateOutcome<R>) + Send + Sync>;

/// Asks that timed out recently, kept (bounded by count and age) so that a
/// late outcome can be reconciled once.
struct TimedOutAsks {
    capacity: usize,
    window: Duration,
    records: FxHashMap<RequestId, (AskIds, PoolName, Timestamp)>,
    order: VecDeque<(RequestId, Timestamp)>,
}

impl TimedOutAsks {
    fn trim(&mut self, now: Timestamp) {
        while let Some(&(id, at)) = self.order.front() {
            if self.order.len() <= self.capacity && at + self.window > now {
                break;
            }
            self.order.pop_front();
            if self.records.get(&id).is_some_and(|r| r.2 == at) {
                self.records.remove(&id);
            }
        }
    }
}

/// The caller endpoint of a node: its pending asks, what it ignored, its
/// dead letters and its record of timed-out asks.
pub(crate) struct CallerSide<M, R> {
    pub(crate) pending: DashMap<RequestId, Arc<AskSlot<R>>, FxBuildHasher>,
    /// Timers armed by live handles.
    pub(crate) armed_timers: AtomicUsize,
    /// Request frames re-sent after the first.
    pub(crate) retries: AtomicU64,
    /// Frames that arrived for an ask no longer pending (duplicates, late).
    pub(crate) ignored_frames: AtomicU64,
    pub(crate) late_outcomes: AtomicU64,
    pub(crate) dlq: Mutex<DeadLetterQueue<M>>,
    timed_out: Mutex<TimedOutAsks>,
    late_hook: RwLock<Option<LateHook<R>>>,
    clock: Arc<NodeClock>,
}

impl<M, R> CallerSide<M, R> {
    pub(crate) fn new(
        clock: Arc<NodeClock>,
        dlq_capacity: usize,
        reconcile_capacity: usize,
        reconcile_window: Duration,
    ) -> Self {
        Self {
            pending: DashMap::with_hasher(FxBuildHasher),
            armed_timers: AtomicUsize::new(0),
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
            late_hook: RwLock::new(None),
            clock,
        }
    }

    fn ignored(&self) {
        self.ignored_frames.fetch_add(1, Ordering::Relaxed);
    }

    /// Fails every pending ask with `error` (the node is shutting down).
    pub(crate) fn abort_all(&self, error: &AskError) {
        for entry in self.pending.iter() {
            entry.value().offer(SlotEvent::Aborted(error.clone()));
        }
    }

    /// Remembers that `ids` timed out, for reconciliation of a late outcome.
    pub(crate) fn record_timeout(&self, ids: AskIds, pool: PoolName, now: Timestamp) {
        let mut t = self.timed_out.lock();
        t.records.insert(ids.request_id, (ids, pool, now));
        t.order.push_back((ids.request_id, now));
        t.trim(now);
    }

    pub(crate) fn timed_out_len(&self) -> usize {
        let mut t = self.timed_out.lock();
        t.trim(self.clock.now());
        t.records.len()
    }

    pub(crate) fn set_late_hook(&self, hook: Option<LateHook<R>>) {
        *self.late_hook.write() = hook;
    }

    /// A terminal frame for an ask that is no longer pending: if it timed
    /// out recently, reconcile it once; otherwise it is a duplicate.
    fn reconcile(&self, id: RequestId, result: LateResult<R>) {
        let now = self.clock.now();
        let record = {
            let mut t = self.timed_out.lock();
            t.trim(now);
            t.records.remove(&id)
        };
        let Some((ids, pool, timed_out_at)) = record else {
            self.ignored();
            return;
        };
        self.late_outcomes.fetch_add(1, Ordering::Relaxed);
        self.dlq.lock().take(id);
        let hook = self.late_hook.read().clone();
        if let Some(hook) = hook {
            hook(LateOutcome {
                ids,
                pool,
                result,
                late_by: now.saturating_since(timed_out_at),
            });
        }
    }
}

impl<M: Send, R: Send> CallerEndpoint<R> for CallerSide<M, R> {
    fn deliver(&self, frame: ToCaller<R>) {
        let id = frame.ids().request_id;
        // Clone the slot out: a shard guard must not be held while waking.
        let Some(slot) = self.pending.get(&id).map(|s| Arc::clone(s.value())) else {
            match frame {
                ToCaller::Reply { outcome, .. } => self.reconcile(id, LateResult::Reply(outcome)),
                ToCaller::Cancelled { reason, .. } => {
                    self.reconcile(id, LateResult::Cancelled(reason))
                }
                _ => self.ignored(),
            }
            return;
        };
        let fresh = match frame {
            ToCaller::Ack { .. } | ToCaller::Progress { .. } => {
                slot.ack();
                true
            }
            ToCaller::Reply { outcome, .. } => slot.offer(SlotEvent::Reply(outcome)),
            ToCaller::Cancelled { reason, .. } => slot.offer(SlotEvent::Cancelled(reason)),
        };
        if !fresh {
            self.ignored();
        }
    }
}
