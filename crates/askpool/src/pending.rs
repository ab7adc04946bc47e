//! The caller's pending map: request id -> the slot its [`AskHandle`] polls.
//!
//! The transport completes slots directly (in process, the worker's reply is a
//! function call that stores the reply and wakes the caller's task). An Ack
//! only sets a flag: the handle reads it when it next wakes, which is when a
//! re-send would be due, so an Ack costs no wake-up.
//!
//! [`AskHandle`]: crate::AskHandle

use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::task::Waker;

use askpool_proto::{AskError, CancelReason, Outcome, RequestId, ToCaller};
use dashmap::DashMap;
use parking_lot::Mutex;
use rustc_hash::FxBuildHasher;

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

/// The caller endpoint of a node: its pending asks and what it ignored.
pub(crate) struct CallerSide<R> {
    pub(crate) pending: DashMap<RequestId, Arc<AskSlot<R>>, FxBuildHasher>,
    /// Timers armed by live handles.
    pub(crate) armed_timers: AtomicUsize,
    /// Request frames re-sent after the first.
    pub(crate) retries: AtomicU64,
    /// Frames that arrived for an ask no longer pending (duplicates, late).
    pub(crate) ignored_frames: AtomicU64,
}

impl<R> CallerSide<R> {
    pub(crate) fn new() -> Self {
        Self {
            pending: DashMap::with_hasher(FxBuildHasher),
            armed_timers: AtomicUsize::new(0),
            retries: AtomicU64::new(0),
            ignored_frames: AtomicU64::new(0),
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
}

impl<R: Send> CallerEndpoint<R> for CallerSide<R> {
    fn deliver(&self, frame: ToCaller<R>) {
        let id = frame.ids().request_id;
        // Clone the slot out: a shard guard must not be held while waking.
        let Some(slot) = self.pending.get(&id).map(|s| Arc::clone(s.value())) else {
            self.ignored();
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
