//! `_soon`: `loop.call_soon(callback, arg, context=context)` for the two
//! callbacks the wrapper schedules per ask (a handler's step after a bare
//! `yield`, the asking task's wake-up at that turn), without asyncio's
//! Python-level scheduling: on an asyncio event loop (a `BaseEventLoop`
//! whose `call_soon` and `_run_once` are asyncio's own, not in debug mode),
//! a native handle goes straight onto the loop's ready queue, which is what
//! `call_soon` does after its checks (the loop is running: this is called
//! from its callbacks). Measured: about 5% off an ask whose handler awaits
//! once. Any other loop (uvloop, a subclass that schedules its own way, a
//! loop in debug mode, with its slow-callback warnings) gets `call_soon`.

use pyo3::exceptions::{PyKeyboardInterrupt, PySystemExit};
use pyo3::intern;
use pyo3::prelude::*;
use pyo3::sync::PyOnceLock;
use pyo3::types::{PyDict, PyString, PyType};

/// What `BaseEventLoop._run_once` needs of a handle on its ready queue: a
/// `_cancelled` flag (never set: nothing gets this handle to cancel it) and
/// `_run`, which runs the callback as `asyncio.Handle._run` does.
#[pyclass(module = "askpool._native", frozen)]
pub(crate) struct Soon {
    callback: Py<PyAny>,
    arg: Py<PyAny>,
    context: Py<PyAny>,
    event_loop: Py<PyAny>,
}

#[pymethods]
impl Soon {
    // A class attribute, not a getter: `_run_once` reads it for every
    // handle, and a plain attribute is the cheapest read.
    #[classattr]
    fn _cancelled() -> bool {
        false
    }

    /// Read by a loop in debug mode (which may have been turned on since
    /// this was queued) to name a slow callback.
    #[getter]
    fn _callback(&self, py: Python<'_>) -> Py<PyAny> {
        self.callback.clone_ref(py)
    }

    /// As `asyncio.Handle._run`: the callback in its context; an exception
    /// out of it goes to the loop's exception handler, but for `SystemExit`
    /// and `KeyboardInterrupt`, which leave the loop.
    fn _run(slf: &Bound<'_, Self>) -> PyResult<()> {
        let py = slf.py();
        let this = slf.get();
        let ran = call_method(
            this.context.bind(py),
            intern!(py, "run"),
            this.callback.bind(py),
            Some(this.arg.bind(py)),
        );
        let Err(error) = ran else {
            return Ok(());
        };
        if error.is_instance_of::<PySystemExit>(py)
            || error.is_instance_of::<PyKeyboardInterrupt>(py)
        {
            return Err(error);
        }
        let context = PyDict::new(py);
        let message = format!(
            "Exception in callback {}",
            this.callback
                .bind(py)
                .repr()
                .map_or_else(|_| "?".to_owned(), |r| r.to_string())
        );
        context.set_item("message", message)?;
        context.set_item("exception", error.into_value(py))?;
        context.set_item("handle", slf)?;
        this.event_loop
            .bind(py)
            .call_method1(intern!(py, "call_exception_handler"), (context,))?;
        Ok(())
    }

    fn __repr__(&self, py: Python<'_>) -> String {
        let callback = self
            .callback
            .bind(py)
            .repr()
            .map_or_else(|_| "?".to_owned(), |r| r.to_string());
        format!("<askpool Soon {callback}>")
    }
}

/// `on.name(first, second)` through `PyObject_CallMethodObjArgs`, which
/// makes neither a bound method nor an argument tuple (the limited API has
/// no vectorcall before 3.12, and pyo3's calls build both).
fn call_method<'py>(
    on: &Bound<'py, PyAny>,
    name: &Bound<'py, PyString>,
    first: &Bound<'py, PyAny>,
    second: Option<&Bound<'py, PyAny>>,
) -> PyResult<Bound<'py, PyAny>> {
    let end = std::ptr::null_mut::<pyo3::ffi::PyObject>();
    // SAFETY: live objects, the GIL held; the argument list ends with NULL
    // as the variadic call requires; a new reference or NULL comes back.
    unsafe {
        let result = pyo3::ffi::PyObject_CallMethodObjArgs(
            on.as_ptr(),
            name.as_ptr(),
            first.as_ptr(),
            second.map_or(end, Bound::as_ptr),
            end,
        );
        Bound::from_owned_ptr_or_err(on.py(), result)
    }
}

/// `asyncio.BaseEventLoop`'s own `call_soon` and `_run_once`.
struct AsyncioLoop {
    call_soon: Py<PyAny>,
    run_once: Py<PyAny>,
}

fn asyncio_loop(py: Python<'_>) -> PyResult<&'static AsyncioLoop> {
    static ASYNCIO: PyOnceLock<AsyncioLoop> = PyOnceLock::new();
    ASYNCIO.get_or_try_init(py, || {
        let base = py.import("asyncio")?.getattr("BaseEventLoop")?;
        Ok(AsyncioLoop {
            call_soon: base.getattr("call_soon")?.unbind(),
            run_once: base.getattr("_run_once")?.unbind(),
        })
    })
}

thread_local! {
    /// Loop classes met on this thread, and whether their loops schedule
    /// as asyncio's (looked up once per class; a class is kept alive here).
    static CLASSES: std::cell::RefCell<Vec<(Py<PyType>, bool)>> =
        const { std::cell::RefCell::new(Vec::new()) };
}

/// Whether `kind`'s `call_soon` and `_run_once` are asyncio's own.
fn schedules_as_asyncio(kind: &Bound<'_, PyType>) -> PyResult<bool> {
    let py = kind.py();
    let known = CLASSES.with_borrow(|classes| {
        classes
            .iter()
            .find(|(k, _)| k.as_ptr() == kind.as_ptr())
            .map(|(_, own)| *own)
    });
    if let Some(own) = known {
        return Ok(own);
    }
    let asyncio = asyncio_loop(py)?;
    let inherited = |name: &str, theirs: &Py<PyAny>| kind.getattr(name).is_ok_and(|f| f.is(theirs));
    let own =
        inherited("call_soon", &asyncio.call_soon) && inherited("_run_once", &asyncio.run_once);
    CLASSES.with_borrow_mut(|classes| classes.push((kind.clone().unbind(), own)));
    Ok(own)
}

/// The ready queue of `event_loop`, where a handle may go straight, or
/// `None` (see the module's comment).
fn ready_queue<'py>(event_loop: &Bound<'py, PyAny>) -> PyResult<Option<Bound<'py, PyAny>>> {
    let py = event_loop.py();
    if !schedules_as_asyncio(&event_loop.get_type())?
        || event_loop.getattr(intern!(py, "_debug"))?.is_truthy()?
    {
        return Ok(None);
    }
    event_loop.getattr(intern!(py, "_ready")).map(Some)
}

/// `event_loop.call_soon(callback, arg, context=context)`, from the loop's
/// own thread while it runs.
#[pyfunction]
pub(crate) fn _soon(
    event_loop: &Bound<'_, PyAny>,
    callback: Py<PyAny>,
    arg: Py<PyAny>,
    context: Option<Py<PyAny>>,
) -> PyResult<()> {
    let py = event_loop.py();
    match ready_queue(event_loop)? {
        Some(ready) => {
            // As `asyncio.Handle`: the current context, copied, if none.
            let context = match context {
                Some(context) => context,
                None => py
                    .import(intern!(py, "contextvars"))?
                    .call_method0(intern!(py, "copy_context"))?
                    .unbind(),
            };
            let handle = Bound::new(
                py,
                Soon {
                    callback,
                    arg,
                    context,
                    event_loop: event_loop.clone().unbind(),
                },
            )?;
            call_method(&ready, intern!(py, "append"), handle.as_any(), None)?;
        }
        None => {
            let kwargs = PyDict::new(py);
            kwargs.set_item(intern!(py, "context"), context)?;
            event_loop.call_method(intern!(py, "call_soon"), (callback, arg), Some(&kwargs))?;
        }
    }
    Ok(())
}
