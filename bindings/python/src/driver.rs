//! Runs Rust futures on an asyncio event loop's own thread.
//!
//! One [`LoopDriver`] per event loop. Its tasks (an ask in flight, a pool's
//! worker slot, a stage stream, ...) are polled on the loop thread, so a
//! reply produced by a handler on that loop completes the caller's asyncio
//! future in the same pass, with no thread hop. A waker fired on another
//! thread (a tokio timer, a pool on another loop) pushes its task onto a
//! queue and writes one byte to a socket the loop watches with
//! `add_reader`: it never takes the GIL, and one byte wakes a whole batch.

use std::cell::Cell;
use std::io::{Read, Write};
use std::os::fd::AsRawFd;
use std::os::unix::net::UnixStream;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Weak};

use parking_lot::{Mutex, RwLock};
use pyo3::prelude::*;

/// A task the driver polls on its loop thread.
pub(crate) trait LoopTask: Send + Sync + 'static {
    fn queued(&self) -> &AtomicBool;
    /// Polls the task once; `self` is the task's own handle, for its waker.
    fn run(self: Arc<Self>, py: Python<'_>);
    /// `run` panicked (caught by the driver, so the rest of the queue still
    /// runs): the task puts itself back in a state it can go on from.
    fn recover(self: Arc<Self>, _py: Python<'_>) {}
    /// The loop shut down (see [`LoopDriver::close`]): the task drops what
    /// it drives and cancels the asyncio future waiting for it.
    fn shut_down(self: Arc<Self>, _py: Python<'_>) {}
}

/// The tasks of a driver that complete an asyncio future, held weakly, so
/// that a loop that shuts down can cancel them.
struct Live {
    tasks: Vec<Weak<dyn LoopTask>>,
    /// Length at which finished tasks are next swept out (twice the live
    /// ones after a sweep): amortized O(1) per task.
    sweep_at: usize,
}

const LIVE_SWEEP_MIN: usize = 64;

pub(crate) struct DriverShared {
    queue: Mutex<Vec<Arc<dyn LoopTask>>>,
    /// The emptied batch of the last run, kept for its capacity: a run per
    /// ask would otherwise grow a fresh vector each time.
    spare: Mutex<Vec<Arc<dyn LoopTask>>>,
    signalled: AtomicBool,
    /// The loop shut down: nothing runs here any more.
    closed: AtomicBool,
    live: Mutex<Live>,
    /// The wake-up socket pair; `None` once released (`LoopDriver::release`).
    tx: RwLock<Option<UnixStream>>,
    rx: RwLock<Option<UnixStream>>,
}

/// Every loop's driver, for a wake-up that any of them can serve (emptying
/// the graveyard of dropped objects: `obj`). Pruned as drivers come.
static DRIVERS: Mutex<Vec<Weak<DriverShared>>> = Mutex::new(Vec::new());

/// Wakes the driver of a loop still running (the latest made), so that it
/// runs once; false if there is none (the next drain or close empties the
/// graveyard).
pub(crate) fn wake_a_driver() -> bool {
    let driver = DRIVERS
        .lock()
        .iter()
        .rev()
        .filter_map(Weak::upgrade)
        .find(|d| !d.is_closed());
    driver.map(|d| d.signal()).is_some()
}

thread_local! {
    /// The driver draining on this thread, if any: its wake-ups need no byte.
    static DRAINING: Cell<*const DriverShared> = const { Cell::new(std::ptr::null()) };
}

impl DriverShared {
    /// Queues `task` for the loop thread (once until it runs).
    pub(crate) fn schedule(&self, task: Arc<dyn LoopTask>) {
        if task.queued().swap(true, Ordering::AcqRel) {
            return;
        }
        if self.closed.load(Ordering::Acquire) {
            // Shut down by `close`, or a task that completes no future.
            return;
        }
        self.queue.lock().push(task);
        if DRAINING.with(|d| std::ptr::eq(d.get(), self)) {
            return;
        }
        self.signal();
    }

    /// Makes the loop run the driver (once per batch of wake-ups).
    fn signal(&self) {
        if !self.signalled.swap(true, Ordering::AcqRel) {
            // A full socket already holds a wake-up; nothing else can fail
            // on a connected pair.
            if let Some(tx) = self.tx.read().as_ref() {
                let _ = (&*tx).write(&[1]);
            }
        }
    }

    /// Whether the loop shut down (see [`LoopDriver::close`]).
    pub(crate) fn is_closed(&self) -> bool {
        self.closed.load(Ordering::Acquire)
    }

    /// Remembers `task` for [`LoopDriver::close`].
    pub(crate) fn track(&self, task: Weak<dyn LoopTask>) {
        let mut live = self.live.lock();
        if live.tasks.len() >= live.sweep_at {
            live.tasks.retain(|t| t.strong_count() > 0);
            live.sweep_at = (live.tasks.len() * 2).max(LIVE_SWEEP_MIN);
        }
        live.tasks.push(task);
    }

    /// Reads the wake-up bytes (the loop saw the socket readable), then runs
    /// the queue.
    fn drain_signalled(&self, py: Python<'_>) {
        let mut buf = [0u8; 256];
        if let Some(rx) = self.rx.read().as_ref() {
            while let Ok(n) = (&*rx).read(&mut buf) {
                if n < buf.len() {
                    break;
                }
            }
        }
        // After the bytes are read: a push from now on writes a new byte.
        self.signalled.store(false, Ordering::Release);
        self.run_queue(py);
    }

    /// Runs every queued task, and the tasks they wake, until none is left.
    /// A task that panics is recovered and the others run on: a panic never
    /// leaves tasks marked queued but in no queue, nor this thread marked
    /// as draining.
    fn run_queue(&self, py: Python<'_>) {
        let _draining = Draining::enter(self);
        let _runtime = crate::runtime().enter();
        let mut batch = std::mem::take(&mut *self.spare.lock());
        loop {
            std::mem::swap(&mut *self.queue.lock(), &mut batch);
            if batch.is_empty() {
                break;
            }
            for task in batch.drain(..) {
                task.queued().store(false, Ordering::Release);
                let ran = catch_unwind(AssertUnwindSafe(|| Arc::clone(&task).run(py)));
                if let Err(panic) = ran {
                    let error = crate::errors::panic_error(panic.as_ref());
                    let recovered = catch_unwind(AssertUnwindSafe(|| task.recover(py))).is_ok();
                    report_panic(py, &error, recovered);
                }
            }
        }
        *self.spare.lock() = batch;
        crate::obj::release_dropped(py);
    }
}

/// The driver of one asyncio loop (the Python wrapper keeps one per loop and
/// registers `drain` with `loop.add_reader(driver.fileno(), driver.drain)`).
#[pyclass(frozen, module = "askpool._native")]
pub(crate) struct LoopDriver {
    pub(crate) shared: Arc<DriverShared>,
}

#[pymethods]
impl LoopDriver {
    #[new]
    fn new() -> PyResult<Self> {
        let (tx, rx) = UnixStream::pair()?;
        tx.set_nonblocking(true)?;
        rx.set_nonblocking(true)?;
        let shared = Arc::new(DriverShared {
            queue: Mutex::new(Vec::new()),
            spare: Mutex::new(Vec::new()),
            signalled: AtomicBool::new(false),
            closed: AtomicBool::new(false),
            live: Mutex::new(Live {
                tasks: Vec::new(),
                sweep_at: LIVE_SWEEP_MIN,
            }),
            tx: RwLock::new(Some(tx)),
            rx: RwLock::new(Some(rx)),
        });
        let mut drivers = DRIVERS.lock();
        drivers.retain(|d| d.strong_count() > 0);
        drivers.push(Arc::downgrade(&shared));
        drop(drivers);
        Ok(Self { shared })
    }

    fn fileno(&self) -> i32 {
        self.shared
            .rx
            .read()
            .as_ref()
            .map_or(-1, AsRawFd::as_raw_fd)
    }

    /// The loop's reader callback: runs every queued task, and the tasks
    /// they wake, until none is left.
    fn drain(&self, py: Python<'_>) {
        self.shared.drain_signalled(py);
    }

    /// The loop shuts down (the wrapper calls this when the loop closes its
    /// async generators, which `asyncio.run` does once every task is done):
    /// every ask, tell, stage stream or durable wait still in flight here is
    /// cancelled (its asyncio future too), since no task is left to await
    /// it and the loop will never poll it again; left alone, each would stay
    /// pending in the node for good. Work started here afterwards fails at
    /// once.
    fn close(&self, py: Python<'_>) {
        if self.shared.closed.swap(true, Ordering::AcqRel) {
            return;
        }
        let queued = std::mem::take(&mut *self.shared.queue.lock());
        drop(queued);
        let live = std::mem::take(&mut self.shared.live.lock().tasks);
        for task in live.iter().filter_map(Weak::upgrade) {
            let shut = catch_unwind(AssertUnwindSafe(|| task.shut_down(py)));
            if let Err(panic) = shut {
                report_panic(py, &crate::errors::panic_error(panic.as_ref()), false);
            }
        }
        crate::obj::release_dropped(py);
    }

    /// Closes the wake-up socket pair, once the loop is closed (its
    /// selector, which watched the reading end, is gone): its descriptors
    /// need not wait for this object to be collected (see `close`).
    fn release(&self, py: Python<'_>) {
        self.close(py);
        self.shared.tx.write().take();
        self.shared.rx.write().take();
    }

    /// Tasks waiting to run (for tests: 0 once the loop is idle).
    fn queued(&self) -> usize {
        self.shared.queue.lock().len()
    }

    /// Tasks alive on this driver: each drives a future (an ask, a wait)
    /// until it ends or its awaiter gives up (for tests of what is left).
    fn live(&self) -> usize {
        let live = self.shared.live.lock();
        live.tasks.iter().filter(|t| t.strong_count() > 0).count()
    }
}

impl LoopDriver {
    /// The driver of `event_loop`, made and hooked to the loop by the
    /// wrapper on first use: an asyncio future of that loop must be
    /// completed by that loop's driver, on its thread (`set_result` from
    /// another loop's thread leaves its awaiter asleep).
    pub(crate) fn of(event_loop: &Bound<'_, PyAny>) -> PyResult<Arc<DriverShared>> {
        let py = event_loop.py();
        let driver = py
            .import(pyo3::intern!(py, "askpool._node"))?
            .getattr(pyo3::intern!(py, "_driver"))?
            .call1((event_loop,))?;
        Ok(Arc::clone(&driver.cast::<LoopDriver>()?.get().shared))
    }

    /// Runs `start` (which queues work on this loop, e.g. an ask to a pool
    /// hosted here), then the queue, on the loop thread: a handler that does
    /// not await has answered before the caller awaits. Wake-ups inside
    /// `start` write no byte (no syscall); inside a drain, that drain runs
    /// the new work instead.
    pub(crate) fn eager<T>(&self, py: Python<'_>, start: impl FnOnce() -> T) -> T {
        self.shared.eager(py, start)
    }
}

impl DriverShared {
    /// See [`LoopDriver::eager`]; must be called on the loop's thread.
    pub(crate) fn eager<T>(&self, py: Python<'_>, start: impl FnOnce() -> T) -> T {
        if DRAINING.with(|d| !d.get().is_null()) {
            return start();
        }
        let out = {
            let _scope = Scope::enter(self);
            start()
        };
        self.run_queue(py);
        out
    }
}

/// Tells the event loop's exception handler (asyncio's way to report an
/// error no caller awaits) that a driver task panicked.
fn report_panic(py: Python<'_>, error: &askpool::AskError, recovered: bool) {
    let message = if recovered {
        format!("askpool: a task on this event loop panicked and was recovered: {error}")
    } else {
        format!("askpool: a task on this event loop panicked and was dropped: {error}")
    };
    let report = || -> PyResult<()> {
        let context = pyo3::types::PyDict::new(py);
        context.set_item("message", message)?;
        py.import("asyncio")?
            .call_method0("get_running_loop")?
            .call_method1("call_exception_handler", (context,))?;
        Ok(())
    };
    // Nothing to do if even that fails (no running loop).
    let _ = report();
}

/// Marks this thread as running `shared`'s queue until dropped (also when
/// unwinding), then restores what it was.
struct Draining(*const DriverShared);

impl Draining {
    fn enter(shared: &DriverShared) -> Self {
        Self(DRAINING.with(|d| d.replace(shared)))
    }
}

impl Drop for Draining {
    fn drop(&mut self) {
        DRAINING.with(|d| d.set(self.0));
    }
}

/// Marks this thread as about to run `shared`'s queue.
struct Scope;

impl Scope {
    fn enter(shared: &DriverShared) -> Self {
        DRAINING.with(|d| d.set(shared));
        Scope
    }
}

impl Drop for Scope {
    fn drop(&mut self) {
        DRAINING.with(|d| d.set(std::ptr::null()));
    }
}
