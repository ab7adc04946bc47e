//! Waking the JS thread. Every future the binding drives (asks, workers'
//! pulls, stage streams) is polled on the JS thread; its waker puts its task
//! id on the ready list. A wake on the JS thread itself needs nothing more:
//! the wrapper drains after every call into the addon. A wake from another
//! thread (a tokio timer) calls the threadsafe function once per batch.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::task::Wake;
use std::thread::ThreadId;

use napi::threadsafe_function::{ThreadsafeFunction, ThreadsafeFunctionCallMode};
use napi::Status;
use parking_lot::{Mutex, RwLock};

/// The wrapper's `wake()` callback. Weak: it never keeps the process alive
/// (the wrapper holds a referenced timer while asks are pending).
pub type WakeFn = ThreadsafeFunction<(), (), (), Status, false, true>;

thread_local! {
    static THREAD: ThreadId = std::thread::current().id();
}

pub struct Shared {
    ready: Mutex<Vec<u32>>,
    scheduled: AtomicBool,
    /// Calls of the threadsafe function: wakes that crossed threads.
    pub thread_wakes: AtomicU64,
    js_thread: ThreadId,
    wake: RwLock<Option<WakeFn>>,
}

impl Shared {
    pub fn new(wake: WakeFn) -> Self {
        Self {
            ready: Mutex::default(),
            scheduled: AtomicBool::new(false),
            thread_wakes: AtomicU64::new(0),
            js_thread: THREAD.with(|t| *t),
            wake: RwLock::new(Some(wake)),
        }
    }

    pub fn push_ready(&self, id: u32) {
        self.ready.lock().push(id);
        self.poke();
    }

    /// Asks for a drain soon (a task made ready, a slot freed), once per
    /// batch; on the JS thread the wrapper drains after every call anyway.
    pub fn poke(&self) {
        if THREAD.with(|t| *t) == self.js_thread {
            return;
        }
        // A drain asked for already (the common case in a burst of frees):
        // no write to the shared line.
        if !self.scheduled.load(Ordering::Acquire) && !self.scheduled.swap(true, Ordering::AcqRel) {
            if let Some(wake) = self.wake.read().as_ref() {
                self.thread_wakes.fetch_add(1, Ordering::Relaxed);
                wake.call((), ThreadsafeFunctionCallMode::NonBlocking);
            }
        }
    }

    /// A drain starts: a wake asked for from now on calls again. Before the
    /// drain takes the freed slots, so that one freed after it asks anew.
    pub fn rearm(&self) {
        self.scheduled.store(false, Ordering::Release);
    }

    /// Swaps the ready list with `into` (empty), so both allocations are reused.
    pub fn take_ready(&self, into: &mut Vec<u32>) {
        self.rearm();
        std::mem::swap(&mut *self.ready.lock(), into);
    }

    /// Puts back ids that could not be polled in this drain.
    pub fn requeue(&self, ids: &[u32]) {
        self.ready.lock().extend_from_slice(ids);
    }

    /// Drops the threadsafe function: nothing can call into JS any more.
    pub fn release(&self) {
        self.wake.write().take();
    }
}

/// The waker of one task.
pub struct TaskWaker {
    pub id: u32,
    /// Set while the id is on the ready list, so a burst of wakes queues it once.
    pub queued: AtomicBool,
    pub shared: Arc<Shared>,
}

impl Wake for TaskWaker {
    fn wake(self: Arc<Self>) {
        self.wake_by_ref();
    }

    fn wake_by_ref(self: &Arc<Self>) {
        if !self.queued.swap(true, Ordering::AcqRel) {
            self.shared.push_ready(self.id);
        }
    }
}
