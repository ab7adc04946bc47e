//! The signal a running handler reads to learn that its request was
//! cancelled. Remote cancel never interrupts a handler (ADR 0007 §6); the
//! handler may check `is_cancelled()` or await `cancelled()` and stop early.
//!
//! An atomic flag and a `Notify` behind one `Arc`: cloning and dropping are a
//! reference count, unlike tokio-util's `CancellationToken` whose tree of
//! child tokens takes a lock on every clone and drop.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use tokio::sync::Notify;

#[derive(Clone, Default)]
pub(crate) struct CancelSignal(Arc<Inner>);

#[derive(Default)]
struct Inner {
    cancelled: AtomicBool,
    notify: Notify,
}

impl CancelSignal {
    pub(crate) fn new() -> Self {
        Self::default()
    }

    pub(crate) fn cancel(&self) {
        self.0.cancelled.store(true, Ordering::Release);
        self.0.notify.notify_waiters();
    }

    pub(crate) fn is_cancelled(&self) -> bool {
        self.0.cancelled.load(Ordering::Acquire)
    }

    pub(crate) async fn cancelled(&self) {
        loop {
            let notified = self.0.notify.notified();
            tokio::pin!(notified);
            // Register before checking the flag, so a cancel between the
            // check and the wait is not missed.
            notified.as_mut().enable();
            if self.is_cancelled() {
                return;
            }
            notified.await;
        }
    }
}
