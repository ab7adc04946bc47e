//! A pool whose handlers are Python: each worker slot is a task on the
//! pool's event loop that pulls the next request and starts the handler's
//! coroutine with a [`Ctx`]. A slot takes its next request once the previous
//! one is answered, so a handler that finishes without awaiting lets one
//! slot drain a whole queue in one pass.

use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, OnceLock, Weak};
use std::task::{Context, Poll, Wake, Waker};

use askpool::{
    AskError, Progress, Request, RequestContext, Responder, Worker, WorkerId, WorkerPool,
};
use parking_lot::Mutex;
use pyo3::exceptions::PyRuntimeError;
use pyo3::intern;
use pyo3::prelude::*;

use crate::driver::{DriverShared, LoopDriver, LoopTask};
use crate::errors;
use crate::obj::Obj;
use crate::send::{self, Sent};
use crate::task::FutureTask;

type Pull = Pin<Box<dyn Future<Output = Option<Request<Obj, Obj>>> + Send>>;

/// Set by the test hook `_panic_in_next_dispatch`.
pub(crate) static PANIC_IN_NEXT_DISPATCH: Mutex<Option<String>> = Mutex::new(None);

pub(crate) struct SlotTask {
    /// The worker this slot pulls for (`w0`, `w1`, ...), for `ctx.worker_id`.
    worker_id: WorkerId,
    queued: AtomicBool,
    driver: Arc<DriverShared>,
    state: Mutex<SlotState>,
    /// A request is with the handler.
    busy: AtomicBool,
    /// `run` is on the stack: it takes the next request itself.
    running: AtomicBool,
    /// The wrapper's `Slot`: the asyncio task this slot's handlers run as.
    slot: Py<PyAny>,
    /// `slot.resume`, bound once rather than per request.
    resume: Py<PyAny>,
    /// The pool's handler and the context its requests copy (the `Slot`'s).
    handler: Py<PyAny>,
    context: Py<PyAny>,
}

struct SlotState {
    worker: Option<Arc<Worker<Obj, Obj>>>,
    pull: Option<Pull>,
}

impl SlotTask {
    pub(crate) fn start(
        driver: &Arc<DriverShared>,
        worker: Worker<Obj, Obj>,
        slot: &Bound<'_, PyAny>,
    ) -> PyResult<Arc<Self>> {
        let py = slot.py();
        let handler = slot.getattr(intern!(py, "_handler"))?.unbind();
        let context = slot.getattr(intern!(py, "_context"))?.unbind();
        let resume = slot.getattr(intern!(py, "resume"))?.unbind();
        let task = Arc::new(Self {
            worker_id: worker.id().clone(),
            queued: AtomicBool::new(false),
            driver: Arc::clone(driver),
            state: Mutex::new(SlotState {
                worker: Some(Arc::new(worker)),
                pull: None,
            }),
            busy: AtomicBool::new(false),
            running: AtomicBool::new(false),
            slot: slot.clone().unbind(),
            resume,
            handler,
            context,
        });
        driver.schedule(task.clone());
        Ok(task)
    }

    /// The next request, or `None` while waiting (or once the pool closed).
    fn next(self: &Arc<Self>) -> Option<Request<Obj, Obj>> {
        let waker = Waker::from(Arc::clone(self));
        let mut cx = Context::from_waker(&waker);
        let mut state = self.state.lock();
        let worker = state.worker.clone()?;
        let pull = state
            .pull
            .get_or_insert_with(|| Box::pin(async move { worker.next_request().await }));
        match pull.as_mut().poll(&mut cx) {
            Poll::Pending => None,
            Poll::Ready(Some(request)) => {
                state.pull = None;
                Some(request)
            }
            Poll::Ready(None) => {
                // Closed: the worker leaves with its queue handed back.
                state.pull = None;
                state.worker = None;
                None
            }
        }
    }
}

impl Wake for SlotTask {
    fn wake(self: Arc<Self>) {
        let driver = Arc::clone(&self.driver);
        driver.schedule(self);
    }
}

impl LoopTask for SlotTask {
    fn queued(&self) -> &AtomicBool {
        &self.queued
    }

    fn run(self: Arc<Self>, py: Python<'_>) {
        self.running.store(true, Ordering::Release);
        self.pull_and_dispatch(py);
        self.running.store(false, Ordering::Release);
    }

    /// After a panic: a pull that panicked is not polled again (a new one
    /// starts), and the slot goes on pulling. A request taken before the
    /// panic was failed when its responder was dropped (`Internal`); one
    /// whose handler was running keeps the slot busy until it answers.
    fn recover(self: Arc<Self>, _py: Python<'_>) {
        self.state.lock().pull = None;
        self.running.store(false, Ordering::Release);
        if !self.busy.load(Ordering::Acquire) {
            let driver = Arc::clone(&self.driver);
            driver.schedule(self);
        }
    }
}

impl SlotTask {
    fn pull_and_dispatch(self: &Arc<Self>, py: Python<'_>) {
        while !self.busy.load(Ordering::Acquire) {
            let Some(request) = self.next() else {
                return;
            };
            self.dispatch(py, request);
        }
    }

    /// Starts the handler right here, as the slot's asyncio task and in a
    /// fresh copy of the pool's context (`send::first_step`). One that
    /// returns without awaiting is answered at once (no `Reply` object);
    /// one that awaits goes on in the slot's task (`Slot.resume`), holding
    /// the slot until it answers.
    fn dispatch(self: &Arc<Self>, py: Python<'_>, request: Request<Obj, Obj>) {
        if let Some(message) = PANIC_IN_NEXT_DISPATCH.lock().take() {
            panic!("{message}");
        }
        let Request {
            message,
            context,
            responder,
        } = request;
        let waits = Arc::new(Waits::default());
        let ctx = Ctx {
            context,
            worker: self.worker_id.clone(),
            waits: Arc::clone(&waits),
        };
        let started = (|| {
            let event_loop = self.event_loop(py)?;
            let current = send::current_task(&event_loop)?;
            let task = self.task(&event_loop, &current)?;
            let context = self.context.bind(py).call_method0(intern!(py, "copy"))?;
            let args = (
                message.get(py).bind(py).clone(),
                Bound::new(py, ctx)?.into_any(),
            );
            let (coro, sent) = send::first_step(
                event_loop,
                task,
                current,
                &context,
                self.handler.bind(py),
                args,
            )?;
            Ok::<_, PyErr>((coro, context, sent))
        })();
        match started {
            Ok((coro, context, Sent::Yielded(first))) => {
                self.busy.store(true, Ordering::Release);
                let reply = Reply {
                    inner: Mutex::new(Some(Pending {
                        responder,
                        slot: SlotRelease(Arc::clone(self)),
                        waits: WaitsRelease(waits),
                    })),
                };
                let handed = self.resume.call1(py, (coro, first, context, reply));
                if let Err(e) = handed {
                    // The dropped `Reply` fails the request: nothing is lost.
                    e.write_unraisable(py, None);
                }
            }
            Ok((_, _, Sent::Returned(value))) => {
                responder.reply(Obj::new(value.unbind()));
                waits.release();
            }
            Err(e) => {
                fail(py, responder, &e);
                waits.release();
            }
        }
    }

    /// The running loop. A slot runs on its driver's loop only, while that
    /// loop runs (from its reader, or from a call made on it: an ask, an
    /// answer), so once the slot made a task on the running loop
    /// (`Slot._loop`, set by `_new_task`) that loop is the one: asking
    /// asyncio costs a getpid() system call per request on Python < 3.12
    /// (it checks the running loop's process).
    fn event_loop<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyAny>> {
        let known = self.slot.bind(py).getattr(intern!(py, "_loop"))?;
        if known.is_none() {
            return send::running_loop(py);
        }
        Ok(known)
    }

    /// The task the slot's next request runs as: the slot's task while it
    /// runs and no cancel of it stands, else a new one (`Slot._new_task`).
    /// `current` is the loop's current task: when it is the slot's own (a
    /// request taken in its step), it is running, so not done.
    fn task<'py>(
        &self,
        event_loop: &Bound<'py, PyAny>,
        current: &Bound<'py, PyAny>,
    ) -> PyResult<Bound<'py, PyAny>> {
        let py = event_loop.py();
        let slot = self.slot.bind(py);
        let task = slot.getattr(intern!(py, "_task"))?;
        if !task.is_none()
            && (task.is(current) || !task.call_method0(intern!(py, "done"))?.is_truthy()?)
            && !cancel_standing(&task)?
        {
            return Ok(task);
        }
        slot.call_method1(intern!(py, "_new_task"), (event_loop,))
    }
}

/// Whether a cancel of `task` was asked and not taken back (`cancelling()`,
/// Python 3.11+). Before, asyncio does not count them: a cancel asked and
/// not yet delivered is the task's `_must_cancel`, or the future it waits
/// on cancelled (the slot's waiter, by a handler that cancelled its own
/// task and returned at once); without this the next request ran as that
/// task and met the cancel. The wrapper's `Slot.resume` asks it too
/// (`_native._cancel_standing`).
#[pyfunction(name = "_cancel_standing")]
pub(crate) fn cancel_standing(task: &Bound<'_, PyAny>) -> PyResult<bool> {
    let py = task.py();
    static COUNTS: OnceLock<bool> = OnceLock::new();
    // Before 3.11 a slot's own task counts them too (`_CountingTask`); a
    // task made elsewhere (an old slot's, a test's) may not.
    if !*COUNTS.get_or_init(|| py.version_info() >= (3, 11))
        && !task.hasattr(intern!(py, "cancelling"))?
    {
        if let Ok(must) = task.getattr(intern!(py, "_must_cancel")) {
            if must.is_truthy()? {
                return Ok(true);
            }
        }
        return match task.getattr(intern!(py, "_fut_waiter")) {
            Ok(waiter) if !waiter.is_none() => {
                waiter.call_method0(intern!(py, "cancelled"))?.is_truthy()
            }
            _ => Ok(false),
        };
    }
    Ok(task
        .call_method0(intern!(py, "cancelling"))?
        .extract::<i64>()?
        > 0)
}

/// Answers a request whose handler raised `error`.
fn fail(py: Python<'_>, responder: Responder<Obj, Obj>, error: &PyErr) {
    let described = hooks(py).and_then(|h| {
        h.failure
            .call1(py, (error.value(py),))?
            .extract::<Option<(String, String, Option<String>)>>(py)
    });
    match described {
        Ok(None) => responder.cancel(),
        Ok(Some((type_name, message, code))) => {
            responder.fail(errors::from_handler(code.as_deref(), type_name, message))
        }
        Err(e) => responder.fail(AskError::internal(e.to_string())),
    }
}

/// The wrapper's function for a handler that raised: `failure(exc)` gives
/// `(type_name, message, code)`, or `None` for a cancellation.
pub(crate) struct Hooks {
    failure: Py<PyAny>,
}

static HOOKS: OnceLock<Hooks> = OnceLock::new();

fn hooks(_py: Python<'_>) -> PyResult<&'static Hooks> {
    HOOKS
        .get()
        .ok_or_else(|| PyRuntimeError::new_err("askpool._native.register_dispatch was not called"))
}

#[pyfunction]
pub(crate) fn register_dispatch(failure: Py<PyAny>) {
    let _ = HOOKS.set(Hooks { failure });
}

/// Frees its slot when the request is answered (or its `Reply` dropped).
struct SlotRelease(Arc<SlotTask>);

impl Drop for SlotRelease {
    fn drop(&mut self) {
        self.0.busy.store(false, Ordering::Release);
        if !self.0.running.load(Ordering::Acquire) {
            self.0.driver.schedule(self.0.clone());
        }
    }
}

struct Pending {
    responder: Responder<Obj, Obj>,
    slot: SlotRelease,
    waits: WaitsRelease,
}

type WaitTask = FutureTask<Pin<Box<dyn Future<Output = ()> + Send>>>;

/// The `ctx.wait_cancelled()` futures of one request. A wait ends with its
/// cancel; else it is let go when the request is answered (no cancel can
/// come any more) or when its asyncio future is done by other means (a
/// timeout around it, the handler cancelling it): otherwise each would stay
/// polled, holding its future and the request, until the pool closes.
struct Waits {
    /// `None` once the request is answered.
    tasks: Mutex<Option<Vec<Weak<WaitTask>>>>,
}

impl Waits {
    /// Records `task`; `false` if the request is already answered.
    fn add(&self, task: &Arc<WaitTask>) -> bool {
        let mut tasks = self.tasks.lock();
        let Some(tasks) = tasks.as_mut() else {
            return false;
        };
        tasks.retain(|t| t.strong_count() > 0);
        tasks.push(Arc::downgrade(task));
        true
    }

    /// The request is answered: lets every wait go.
    fn release(&self) {
        let tasks = self.tasks.lock().take();
        for task in tasks.into_iter().flatten() {
            if let Some(task) = task.upgrade() {
                task.abandon();
            }
        }
    }
}

impl Default for Waits {
    fn default() -> Self {
        Self {
            tasks: Mutex::new(Some(Vec::new())),
        }
    }
}

/// Lets the waits go when the request is answered (or its `Reply` dropped).
struct WaitsRelease(Arc<Waits>);

impl Drop for WaitsRelease {
    fn drop(&mut self) {
        self.0.release();
    }
}

/// Answers one request, once.
#[pyclass(frozen, module = "askpool._native")]
pub(crate) struct Reply {
    inner: Mutex<Option<Pending>>,
}

impl Reply {
    fn take(&self) -> PyResult<Pending> {
        let taken = self.inner.lock().take();
        taken.ok_or_else(|| {
            Python::attach(|py| {
                errors::exception(
                    py,
                    &AskError::FailedPrecondition {
                        message: "this request was already answered".into(),
                    },
                )
            })
        })
    }
}

impl Reply {
    /// Gives the request its answer, from the slot's task on the pool's
    /// loop thread. A caller awaiting on this loop is completed right here
    /// (its asyncio future set before this returns, as a pure-asyncio
    /// worker's `set_result` would), and the slot takes its next request
    /// in the same run: no wake-up byte, no extra pass of the loop. A next
    /// request's first step then runs nested in the step that answered (the
    /// slot's task step, or `Slot._step` running one as that task), which
    /// the wrapper allows for (`resume` hands the request over there).
    fn answer(&self, py: Python<'_>, give: impl FnOnce(Responder<Obj, Obj>)) -> PyResult<()> {
        let pending = self.take()?;
        let driver = Arc::clone(&pending.slot.0.driver);
        driver.eager(py, || {
            give(pending.responder);
            drop(pending.waits);
            drop(pending.slot);
        });
        Ok(())
    }

    /// As `answer`, but nothing else runs: a cancelled handler may be
    /// answered while its loop closes (`_dispatch.abandon`), when no task
    /// of the loop may run any more.
    fn answer_quietly(&self, give: impl FnOnce(Responder<Obj, Obj>)) -> PyResult<()> {
        let pending = self.take()?;
        give(pending.responder);
        Ok(())
    }
}

#[pymethods]
impl Reply {
    /// Replies with `value` (the caller receives this very object).
    pub(crate) fn ok(&self, py: Python<'_>, value: Py<PyAny>) -> PyResult<()> {
        self.answer(py, |responder| responder.reply(Obj::new(value)))
    }

    /// Fails the request. `code` is an askpool error code for taxonomy
    /// exceptions, `None` for any other exception.
    #[pyo3(signature = (type_name, message, code=None))]
    fn error(
        &self,
        py: Python<'_>,
        type_name: String,
        message: String,
        code: Option<&str>,
    ) -> PyResult<()> {
        self.answer(py, |responder| {
            responder.fail(errors::from_handler(code, type_name, message))
        })
    }

    /// The handler stopped because its request was cancelled.
    fn cancelled(&self) -> PyResult<()> {
        self.answer_quietly(Responder::cancel)
    }
}

/// What a handler knows about its request.
#[pyclass(frozen, name = "Context", module = "askpool._native")]
pub(crate) struct Ctx {
    context: RequestContext,
    worker: WorkerId,
    waits: Arc<Waits>,
}

#[pymethods]
impl Ctx {
    #[getter]
    fn request_id(&self) -> String {
        self.context.request_id().to_string()
    }
    #[getter]
    fn correlation_id(&self) -> String {
        self.context.correlation_id().to_string()
    }
    #[getter]
    fn causation_id(&self) -> Option<String> {
        self.context.ids().causation_id.map(|c| c.to_string())
    }
    #[getter]
    fn pool(&self) -> String {
        self.context.pool().to_string()
    }
    /// The worker running the request (`w0`, `w1`, ...: an ask's
    /// `preferred_worker` names one).
    #[getter]
    fn worker_id(&self) -> String {
        self.worker.to_string()
    }
    #[getter]
    fn attempt(&self) -> u32 {
        self.context.attempt()
    }
    /// Whether the request was cancelled (by its caller, its deadline, or
    /// its pool). A cancel never interrupts a handler; it may stop early.
    #[getter]
    fn cancelled(&self) -> bool {
        self.context.is_cancelled()
    }
    /// Reports progress: the caller's stage stream gets a PARTIAL event.
    /// The fraction is clamped to [0, 1]; a note's surrogates (which UTF-8
    /// cannot carry) become U+FFFD rather than failing the handler. NaN,
    /// the infinities and a note past 4096 UTF-8 bytes are
    /// `InvalidArgumentError`.
    #[pyo3(signature = (fraction, note=None))]
    fn progress(
        &self,
        fraction: f64,
        note: Option<&Bound<'_, pyo3::types::PyString>>,
    ) -> PyResult<()> {
        if !fraction.is_finite() {
            return errors::to_py(Err(AskError::InvalidArgument {
                message: format!("progress fraction must be finite, not {fraction}"),
            }));
        }
        // Clamped before the narrowing to f32: a finite float past f32's
        // range would otherwise become infinite.
        let fraction = fraction.clamp(0.0, 1.0) as f32;
        let note = match note {
            None => String::new(),
            Some(note) => match note.to_cow() {
                Ok(note) => note.into_owned(),
                // One U+FFFD per surrogate, as for a handler's error text.
                Err(_) => {
                    let py = note.py();
                    py.import(intern!(py, "askpool._dispatch"))?
                        .getattr(intern!(py, "_valid_text"))?
                        .call1((note,))?
                        .extract()?
                }
            },
        };
        errors::to_py(self.context.report(Progress::new(fraction, note)))
    }
    /// An asyncio future (of the running loop) that completes when the
    /// request is cancelled. It stays pending if the request is answered
    /// first (and is then no longer watched). The running loop may be
    /// another than the pool's (the context handed to a coroutine on
    /// another thread's loop): the wait is driven by that loop's driver.
    fn wait_cancelled<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyAny>> {
        let event_loop = send::running_loop(py)?;
        let driver = LoopDriver::of(&event_loop)?;
        let target = event_loop.call_method0(intern!(py, "create_future"))?;
        let context = self.context.clone();
        let wait: Pin<Box<dyn Future<Output = ()> + Send>> =
            Box::pin(async move { context.cancelled().await });
        let task = FutureTask::spawn(&driver, wait, target.clone().unbind(), |py, ()| {
            Ok(py.None())
        });
        if !self.waits.add(&task) {
            // Answered already: a cancel can only have come before.
            task.abandon();
            if self.context.is_cancelled() {
                target.call_method1(intern!(py, "set_result"), (py.None(),))?;
            }
            return Ok(target);
        }
        // Done by other means (a timeout around it, the handler cancelling
        // it): its wait is let go.
        task.abandon_when_done(&target)?;
        Ok(target)
    }
}

/// A pool hosted by a node, with Python handlers.
#[pyclass(frozen, module = "askpool._native")]
pub(crate) struct NativePool {
    pub(crate) pool: WorkerPool<Obj, Obj>,
}

impl NativePool {
    /// Starts `concurrency` worker slots (`w0`, `w1`, ...) on `driver`'s
    /// loop, each with a `Slot` from `new_slot()`.
    pub(crate) fn start(
        pool: WorkerPool<Obj, Obj>,
        driver: &LoopDriver,
        concurrency: usize,
        new_slot: &Bound<'_, PyAny>,
    ) -> PyResult<Self> {
        for i in 0..concurrency {
            let worker = errors::to_py(pool.worker(format!("w{i}")))?;
            SlotTask::start(&driver.shared, worker, &new_slot.call0()?)?;
        }
        Ok(Self { pool })
    }
}

#[pymethods]
impl NativePool {
    #[getter]
    fn name(&self) -> String {
        self.pool.name().to_string()
    }
    /// Leaves the transport (new asks get `NoRoute`) and cancels what is
    /// queued; the worker slots stop.
    fn close(&self, py: Python<'_>) {
        self.pool.close();
        // As a node's shutdown (`NativeNode::shutdown`).
        crate::obj::release_dropped(py);
    }
    fn stats<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, pyo3::types::PyDict>> {
        crate::stats::pool_dict(py, &self.pool.stats())
    }
}
