//! The signal a running handler reads to learn that its request was
//! cancelled. Remote cancel never interrupts a handler (ADR 0007 §6); the
//! handler may check `is_cancelled()` or await `cancelled()` and stop early.
//!
//! An atomic flag and a `Notify`, stored in the admitted request's shared
//! part ([`Admitted`](crate::pool::Admitted)) rather than behind an `Arc` of
//! its own: sharing it costs no extra allocation or reference count, unlike
//! tokio-util's `CancellationToken`, whose tree of child tokens takes a lock
//! on every clone and drop.

use std::sync::atomic::{AtomicBool, Ordering};

use tokio::sync::Notify;

#[derive(Default)]
pub(crate) struct CancelSignal {
    cancelled: AtomicBool,
    notify: Notify,
}

impl CancelSignal {
    pub(crate) fn cancel(&self) {
        self.cancelled.store(true, Ordering::Release);
        self.notify.notify_waiters();
    }

    pub(crate) fn is_cancelled(&self) -> bool {
        self.cancelled.load(Ordering::Acquire)
    }

    pub(crate) async fn cancelled(&self) {
        loop {
            let notified = self.notify.notified();
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
