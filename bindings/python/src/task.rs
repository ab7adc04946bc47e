//! A Rust future whose output completes an asyncio future, polled on the
//! loop thread by the [`LoopDriver`](crate::driver::LoopDriver).

use std::future::Future;
use std::panic::AssertUnwindSafe;
use std::pin::Pin;
use std::sync::atomic::AtomicBool;
use std::sync::Arc;
use std::task::{Context, Poll, Wake, Waker};

use askpool::AskError;
use parking_lot::Mutex;
use pyo3::intern;
use pyo3::prelude::*;
use pyo3::sync::PyOnceLock;
use pyo3::types::{PyString, PyType};

use crate::driver::{DriverShared, LoopTask};
use crate::errors;

/// Turns a future's output into the asyncio future's result.
pub(crate) type Convert<T> = fn(Python<'_>, T) -> Result<Py<PyAny>, AskError>;

pub(crate) struct FutureTask<F: Future> {
    queued: AtomicBool,
    driver: Arc<DriverShared>,
    pub(crate) future: Mutex<Option<F>>,
    /// Released once completed or abandoned: the asyncio future usually
    /// holds this task, and Python's GC cannot see the cycle through Rust.
    target: Mutex<Option<Py<PyAny>>>,
    convert: Convert<F::Output>,
}

impl<F> FutureTask<F>
where
    F: Future + Unpin + Send + 'static,
    F::Output: 'static,
{
    /// Starts polling `future` on `driver`'s loop; `target` gets its output.
    pub(crate) fn spawn(
        driver: &Arc<DriverShared>,
        future: F,
        target: Py<PyAny>,
        convert: Convert<F::Output>,
    ) -> Arc<Self> {
        if driver.is_closed() {
            // Its loop shut down: nothing would ever poll the future.
            drop(future);
            Python::attach(|py| {
                let error = AskError::FailedPrecondition {
                    message: "this event loop has shut down".to_owned(),
                };
                complete(py, target.bind(py), Err(error));
            });
            return Arc::new(Self {
                queued: AtomicBool::new(false),
                driver: Arc::clone(driver),
                future: Mutex::new(None),
                target: Mutex::new(None),
                convert,
            });
        }
        let task = Arc::new(Self {
            queued: AtomicBool::new(false),
            driver: Arc::clone(driver),
            future: Mutex::new(Some(future)),
            target: Mutex::new(Some(target)),
            convert,
        });
        let dyn_task: Arc<dyn LoopTask> = task.clone();
        driver.track(Arc::downgrade(&dyn_task));
        driver.schedule(dyn_task);
        task
    }

    /// Drops the future (cancelling what it drives); `target` is left alone.
    pub(crate) fn abandon(&self) -> Option<F> {
        let target = self.target.lock().take();
        drop(target);
        self.future.lock().take()
    }

    /// Abandons this task once `target` is done by other means than the
    /// task (its caller cancelled it): what the future drives is cancelled
    /// too, instead of going on unawaited. Holds the task weakly.
    pub(crate) fn abandon_when_done(self: &Arc<Self>, target: &Bound<'_, PyAny>) -> PyResult<()> {
        let task = Arc::downgrade(self);
        let callback = AbandonWhenDone(Box::new(move || {
            if let Some(task) = task.upgrade() {
                drop(task.abandon());
            }
        }));
        target.call_method1(intern!(target.py(), "add_done_callback"), (callback,))?;
        Ok(())
    }
}

/// The done callback of [`FutureTask::abandon_when_done`].
#[pyclass(frozen, module = "askpool._native")]
pub(crate) struct AbandonWhenDone(Box<dyn Fn() + Send + Sync>);

#[pymethods]
impl AbandonWhenDone {
    fn __call__(&self, _future: &Bound<'_, PyAny>) {
        (self.0)();
    }
}

impl<F> Wake for FutureTask<F>
where
    F: Future + Unpin + Send + 'static,
    F::Output: 'static,
{
    fn wake(self: Arc<Self>) {
        let driver = Arc::clone(&self.driver);
        driver.schedule(self);
    }
    fn wake_by_ref(self: &Arc<Self>) {
        self.driver.schedule(self.clone());
    }
}

impl<F> LoopTask for FutureTask<F>
where
    F: Future + Unpin + Send + 'static,
    F::Output: 'static,
{
    fn queued(&self) -> &AtomicBool {
        &self.queued
    }

    fn run(self: Arc<Self>, py: Python<'_>) {
        let waker = Waker::from(Arc::clone(&self));
        let mut cx = Context::from_waker(&waker);
        let output = {
            let mut slot = self.future.lock();
            let Some(future) = slot.as_mut() else {
                return;
            };
            let polled =
                std::panic::catch_unwind(AssertUnwindSafe(|| Pin::new(future).poll(&mut cx)));
            match polled {
                Ok(Poll::Pending) => return,
                Ok(Poll::Ready(output)) => {
                    *slot = None;
                    Ok(output)
                }
                Err(panic) => {
                    *slot = None;
                    Err(errors::panic_error(panic.as_ref()))
                }
            }
        };
        let Some(target) = self.target.lock().take() else {
            return;
        };
        let result = output.and_then(|output| (self.convert)(py, output));
        complete(py, target.bind(py), result);
    }

    fn shut_down(self: Arc<Self>, py: Python<'_>) {
        // Dropping the future cancels what it drives (an ask: the pool is
        // told, the node forgets it).
        let future = self.future.lock().take();
        drop(future);
        let Some(target) = self.target.lock().take() else {
            return;
        };
        let target = target.bind(py);
        let done = target
            .call_method0(intern!(py, "done"))
            .and_then(|d| d.is_truthy())
            .unwrap_or(true);
        if !done {
            if let Err(e) = target.call_method0(intern!(py, "cancel")) {
                e.write_unraisable(py, Some(target));
            }
        }
    }
}

/// `asyncio.Future` and its `set_result` / `set_exception`, looked up once.
struct FutureMethods {
    class: Py<PyType>,
    set_result: Py<PyAny>,
    set_exception: Py<PyAny>,
}

fn future_methods(py: Python<'_>) -> PyResult<&'static FutureMethods> {
    static METHODS: PyOnceLock<FutureMethods> = PyOnceLock::new();
    METHODS.get_or_try_init(py, || {
        let class = py
            .import(intern!(py, "asyncio"))?
            .getattr(intern!(py, "Future"))?;
        Ok(FutureMethods {
            set_result: class.getattr(intern!(py, "set_result"))?.unbind(),
            set_exception: class.getattr(intern!(py, "set_exception"))?.unbind(),
            class: class.cast_into::<PyType>()?.unbind(),
        })
    })
}

/// Future types seen to keep `asyncio.Future`'s two methods (the wrapper's
/// handles, the loop's futures): a few, so the list stays short.
static PLAIN_TYPES: Mutex<Vec<Py<PyType>>> = Mutex::new(Vec::new());
const PLAIN_TYPES_MAX: usize = 8;

/// Whether `target`'s type is `asyncio.Future` or a subclass that does not
/// override `set_result` / `set_exception`.
fn plain_future(methods: &FutureMethods, target: &Bound<'_, PyAny>) -> PyResult<bool> {
    let py = target.py();
    let class = target.get_type();
    if class.is(methods.class.bind(py)) {
        return Ok(true);
    }
    if PLAIN_TYPES.lock().iter().any(|t| class.is(t.bind(py))) {
        return Ok(true);
    }
    let plain = class.is_subclass(methods.class.bind(py))?
        && class
            .getattr(intern!(py, "set_result"))?
            .is(methods.set_result.bind(py))
        && class
            .getattr(intern!(py, "set_exception"))?
            .is(methods.set_exception.bind(py));
    let mut known = PLAIN_TYPES.lock();
    if plain && known.len() < PLAIN_TYPES_MAX {
        known.push(class.unbind());
    }
    Ok(plain)
}

/// `target.<name>(arg)`: through the method of `asyncio.Future` itself when
/// `target` is a future that keeps it (every future the wrapper makes),
/// which spares looking the name up and making a bound method per ask.
fn call_future_method(
    py: Python<'_>,
    target: &Bound<'_, PyAny>,
    pick: fn(&FutureMethods) -> &Py<PyAny>,
    name: &Bound<'_, PyString>,
    arg: Py<PyAny>,
) -> PyResult<()> {
    let methods = future_methods(py)?;
    if plain_future(methods, target)? {
        pick(methods).call1(py, (target, arg))?;
    } else {
        target.call_method1(name, (arg,))?;
    }
    Ok(())
}

/// Sets `target`'s result or exception. One already done (cancelled by
/// other means than `AskHandle.cancel`) keeps its state; any other failure
/// to set it is reported as unraisable, not lost.
pub(crate) fn complete(
    py: Python<'_>,
    target: &Bound<'_, PyAny>,
    result: Result<Py<PyAny>, AskError>,
) {
    let outcome = match result {
        Ok(value) => call_future_method(
            py,
            target,
            |m| &m.set_result,
            intern!(py, "set_result"),
            value,
        ),
        Err(error) => {
            let exc = errors::exception(py, &error).into_value(py).into_any();
            call_future_method(
                py,
                target,
                |m| &m.set_exception,
                intern!(py, "set_exception"),
                exc,
            )
        }
    };
    if let Err(e) = outcome {
        let done = target
            .call_method0(intern!(py, "done"))
            .and_then(|d| d.is_truthy())
            .unwrap_or(false);
        if !done {
            e.write_unraisable(py, Some(target));
        }
    }
}
