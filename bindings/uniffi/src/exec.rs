//! Where the binding's futures (an ask's driver, a pool worker's loop) are
//! polled. A future woken inside a hot call from the JVM (`askpool_hot_ask`,
//! `askpool_hot_reply`) is polled on that JVM thread before the call returns,
//! and the events it produces go back in the call's result. An ask whose pool
//! has an idle worker therefore hands its request to the JVM in the same call
//! that sent it, and a reply completes its caller in the call that carried
//! it: no runtime thread wakes up and the event thread is not involved. A
//! future woken anywhere else (a timer, a cancel, a runtime thread) is polled
//! on the runtime as before.
//!
//! Only the waking differs from `tokio::spawn`: the futures are the same and
//! never block, so the JVM thread runs no more than the runtime would.

use std::cell::{Cell, RefCell};
use std::collections::VecDeque;
use std::future::Future;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::pin::Pin;
use std::sync::atomic::{AtomicU8, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll};

use futures::task::{waker_ref, ArcWake};
use parking_lot::Mutex;

use crate::events::Event;
use crate::runtime::runtime;

const IDLE: u8 = 0;
const SCHEDULED: u8 = 1;
const RUNNING: u8 = 2;
/// Woken while running: polled again once the running poll returns.
const NOTIFIED: u8 = 3;
const DONE: u8 = 4;

/// Polls a hot call runs inline at most; the rest go to the runtime, so a
/// JVM thread never spins on a future that keeps waking itself.
const INLINE_POLLS: usize = 64;

/// A spawned future and its state, in one allocation (the future is
/// stored in place, not boxed apart).
struct Task<F> {
    state: AtomicU8,
    /// Locked only by the one poller the state machine admits.
    future: Mutex<Option<F>>,
}

/// A task as the ready queues hold it, whatever its future.
type Runnable = Arc<dyn Run>;

trait Run: Send + Sync {
    /// Polls until the future is pending without a wake-up, or done.
    /// Called only by whoever moved the state to `SCHEDULED`.
    fn run(self: Arc<Self>);
}

/// Runs `future` to completion: on this thread now if a hot call is in
/// progress here, else on the runtime.
pub fn spawn(future: impl Future<Output = ()> + Send + 'static) {
    let task = Arc::new(Task {
        state: AtomicU8::new(SCHEDULED),
        future: Mutex::new(Some(future)),
    });
    schedule(task);
}

impl<F: Future<Output = ()> + Send + 'static> Run for Task<F> {
    fn run(self: Arc<Self>) {
        self.state.store(RUNNING, Ordering::SeqCst);
        let waker = waker_ref(&self);
        let mut cx = Context::from_waker(&waker);
        let mut slot = self.future.lock();
        let Some(future) = slot.as_mut() else {
            self.state.store(DONE, Ordering::SeqCst);
            return;
        };
        // SAFETY: the future lives in the task's `Arc` allocation and is
        // never moved out of it: it is only polled in place or dropped in
        // place (`*slot = None`).
        let future = unsafe { Pin::new_unchecked(future) };
        let polled = catch_unwind(AssertUnwindSafe(|| future.poll(&mut cx)));
        if !matches!(polled, Ok(Poll::Pending)) {
            // Done, or panicked: dropping the future releases what it held
            // (an unanswered responder fails its request).
            *slot = None;
            self.state.store(DONE, Ordering::SeqCst);
            return;
        }
        drop(slot);
        if self
            .state
            .compare_exchange(RUNNING, IDLE, Ordering::SeqCst, Ordering::SeqCst)
            .is_err()
        {
            // NOTIFIED: woken during the poll; queue it again rather than
            // loop here, so the inline budget bounds the work.
            self.state.store(SCHEDULED, Ordering::SeqCst);
            schedule(self);
        }
    }
}

impl<F: Future<Output = ()> + Send + 'static> ArcWake for Task<F> {
    fn wake_by_ref(task: &Arc<Self>) {
        let mut state = task.state.load(Ordering::SeqCst);
        loop {
            let next = match state {
                IDLE => SCHEDULED,
                RUNNING => NOTIFIED,
                _ => return,
            };
            match task
                .state
                .compare_exchange(state, next, Ordering::SeqCst, Ordering::SeqCst)
            {
                Ok(_) => {
                    if next == SCHEDULED {
                        schedule(Arc::clone(task) as Runnable);
                    }
                    return;
                }
                Err(actual) => state = actual,
            }
        }
    }
}

/// The hot call in progress on this thread.
#[derive(Default)]
struct Scope {
    ready: VecDeque<Runnable>,
    events: Vec<Event>,
}

thread_local! {
    static SCOPE: RefCell<Option<Scope>> = const { RefCell::new(None) };
}

fn schedule(task: Runnable) {
    let mut task = Some(task);
    let _ = SCOPE.try_with(|s| {
        if let Some(scope) = s.borrow_mut().as_mut() {
            scope.ready.extend(task.take());
        }
    });
    if let Some(task) = task {
        runtime().spawn(async move { task.run() });
    }
}

/// Routes an event to the hot call in progress on this thread; gives it
/// back if there is none.
pub fn capture(event: Event) -> Option<Event> {
    let mut event = Some(event);
    let _ = SCOPE.try_with(|s| {
        if let Some(scope) = s.borrow_mut().as_mut() {
            scope.events.extend(event.take());
        }
    });
    event
}

/// Puts the enclosing call's scope (if any) back, even if the call panicked.
struct Restore(Option<Scope>);

impl Drop for Restore {
    fn drop(&mut self) {
        let outer = self.0.take();
        let left = SCOPE.with(|s| std::mem::replace(&mut *s.borrow_mut(), outer));
        if let Some(scope) = left {
            for task in scope.ready {
                runtime().spawn(async move { task.run() });
            }
            for event in scope.events {
                crate::events::enqueue(event);
            }
        }
    }
}

/// Makes the library's runtime current on this thread from now on. A
/// runtime guard per hot call cloned the runtime's handle (an `Arc`): two
/// reference-count writes per call on one line that every calling thread
/// writes. The runtime lives as long as the process, so the guard is kept
/// (forgotten) instead; guards entered later nest inside it as usual. On a
/// thread already in a runtime's context (a runtime thread, or a caller's
/// own guard) a forgotten guard would later be dropped out of order, so
/// there the call gets a guard of its own, as before.
fn enter_runtime_for_good() -> Option<tokio::runtime::EnterGuard<'static>> {
    thread_local! {
        static ENTERED: Cell<bool> = const { Cell::new(false) };
    }
    ENTERED.with(|entered| {
        if entered.get() {
            return None;
        }
        if tokio::runtime::Handle::try_current().is_ok() {
            return Some(runtime().enter());
        }
        std::mem::forget(runtime().enter());
        entered.set(true);
        None
    })
}

/// Runs `call` as a hot call: futures it wakes are polled here afterwards,
/// and the events they produce are returned (in order).
pub fn hot<T>(call: impl FnOnce() -> T) -> (T, Vec<Event>) {
    let outer = SCOPE.with(|s| s.borrow_mut().replace(Scope::default()));
    let restore = Restore(outer);
    let _entered = enter_runtime_for_good();
    let value = call();
    for _ in 0..INLINE_POLLS {
        let next = SCOPE.with(|s| s.borrow_mut().as_mut().and_then(|s| s.ready.pop_front()));
        match next {
            Some(task) => task.run(),
            None => break,
        }
    }
    let events = SCOPE.with(|s| {
        s.borrow_mut()
            .as_mut()
            .map(|s| std::mem::take(&mut s.events))
            .unwrap_or_default()
    });
    // Tasks still ready (over the budget) go to the runtime.
    drop(restore);
    (value, events)
}
