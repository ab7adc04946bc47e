//! `_soon`: `loop.call_soon(callback, arg, context=context)` for the two
//! callbacks the wrapper schedules per ask (a handler's step after a bare
//! `yield`, the asking task's wake-up at that turn), without asyncio's
//! Python-level scheduling: on an asyncio event loop, a native handle goes
//! straight onto the loop's ready queue, which is what `call_soon` does
//! after its checks (the loop is running: this is called from its
//! callbacks). Measured on an ask whose handler awaits once: 1-2% in the
//! bench's alternated quick runs, 6% in a sequential-ask script.
//!
//! Only where nothing would see the difference: the loop's class keeps
//! asyncio's own `call_soon` and `_run_once` (not uvloop, not a subclass
//! that schedules its own way; looked up once per class), nothing replaced
//! `asyncio.Handle._run` (as tools that time slow callbacks do: aiodebug,
//! Logfire; looked up at every call), and the loop is not in debug mode
//! (its slow-callback warnings). Against asyncio's own functions as they
//! were when first looked up; anything else gets `call_soon`.

use pyo3::exceptions::{PyKeyboardInterrupt, PySystemExit};
use pyo3::intern;
use pyo3::prelude::*;
use pyo3::sync::PyOnceLock;
use pyo3::types::{PyDict, PyString, PyType};
use pyo3::{PyTraverseError, PyVisit};

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

    /// Read by the loop's default exception handler from the handle it is
    /// running in debug mode: where the handle was made (never recorded
    /// here: debug mode gets `call_soon`'s handles).
    #[classattr]
    fn _source_traceback() -> Option<()> {
        None
    }

    /// A handle is part of the loop's cycles (its queue holds it, it holds
    /// the loop): the collector has to see through it, or a loop dropped
    /// unclosed with one queued is never freed.
    fn __traverse__(&self, visit: PyVisit<'_>) -> Result<(), PyTraverseError> {
        visit.call(&self.callback)?;
        visit.call(&self.arg)?;
        visit.call(&self.context)?;
        visit.call(&self.event_loop)
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
        let message = format!("Exception in callback {}", this.callback_repr(py));
        context.set_item("message", message)?;
        context.set_item("exception", error.into_value(py))?;
        context.set_item("handle", slf)?;
        this.event_loop
            .bind(py)
            .call_method1(intern!(py, "call_exception_handler"), (context,))?;
        Ok(())
    }

    fn __repr__(&self, py: Python<'_>) -> String {
        format!("<askpool Soon {}>", self.callback_repr(py))
    }
}

impl Soon {
    fn callback_repr(&self, py: Python<'_>) -> String {
        self.callback
            .bind(py)
            .repr()
            .map_or_else(|_| "?".to_owned(), |r| r.to_string())
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

/// asyncio's `Handle` class, and its own `BaseEventLoop.call_soon`,
/// `BaseEventLoop._run_once` and `Handle._run` as first looked up (`None`
/// if one was replaced already: nothing then goes onto a ready queue
/// directly).
struct Asyncio {
    originals: Option<Originals>,
    handle: Py<PyAny>,
}

struct Originals {
    call_soon: Py<PyAny>,
    run_once: Py<PyAny>,
    handle_run: Py<PyAny>,
}

fn asyncio(py: Python<'_>) -> PyResult<&'static Asyncio> {
    static ASYNCIO: PyOnceLock<Asyncio> = PyOnceLock::new();
    ASYNCIO.get_or_try_init(py, || {
        let asyncio = py.import("asyncio")?;
        let base = asyncio.getattr("BaseEventLoop")?;
        let handle = asyncio.getattr("Handle")?;
        let looked_up = [
            (base.getattr("call_soon")?, "call_soon"),
            (base.getattr("_run_once")?, "_run_once"),
            (handle.getattr("_run")?, "_run"),
        ];
        // asyncio's own: a function of asyncio's source by that name, not a
        // wrapper (which `functools.wraps` names as what it wraps, but whose
        // code is its own).
        let own = looked_up.iter().all(|(f, name)| {
            f.getattr("__code__").is_ok_and(|code| {
                code.getattr("co_name")
                    .is_ok_and(|n| n.eq(*name).unwrap_or(false))
                    && code
                        .getattr("co_filename")
                        .is_ok_and(|file| file.to_string().replace('\\', "/").contains("asyncio/"))
            })
        });
        let [(call_soon, _), (run_once, _), (handle_run, _)] = looked_up;
        Ok(Asyncio {
            originals: own.then(|| Originals {
                call_soon: call_soon.unbind(),
                run_once: run_once.unbind(),
                handle_run: handle_run.unbind(),
            }),
            handle: handle.unbind(),
        })
    })
}

thread_local! {
    /// The loop class last met on this thread, and whether it keeps
    /// asyncio's own `call_soon` and `_run_once` (one class held, whichever
    /// came last: a thread runs one loop at a time).
    static LAST_CLASS: std::cell::RefCell<Option<(Py<PyType>, bool)>> =
        const { std::cell::RefCell::new(None) };
}

/// Whether `kind` keeps asyncio's own `call_soon` and `_run_once`: looked
/// up once per class (a class patched after that is not seen).
fn schedules_as_asyncio(kind: &Bound<'_, PyType>, originals: &Originals) -> bool {
    let py = kind.py();
    let known = LAST_CLASS.with_borrow(|last| {
        last.as_ref()
            .filter(|(k, _)| k.as_ptr() == kind.as_ptr())
            .map(|(_, own)| *own)
    });
    if let Some(own) = known {
        return own;
    }
    let is = |name: &Bound<'_, PyString>, original: &Py<PyAny>| {
        kind.getattr(name).is_ok_and(|f| f.is(original))
    };
    let own = is(intern!(py, "call_soon"), &originals.call_soon)
        && is(intern!(py, "_run_once"), &originals.run_once);
    LAST_CLASS.with_borrow_mut(|last| *last = Some((kind.clone().unbind(), own)));
    own
}

/// The ready queue of `event_loop`, where a handle may go straight, or
/// `None` (see the module's comment).
fn ready_queue<'py>(event_loop: &Bound<'py, PyAny>) -> PyResult<Option<Bound<'py, PyAny>>> {
    let py = event_loop.py();
    let asyncio = asyncio(py)?;
    let Some(originals) = &asyncio.originals else {
        return Ok(None);
    };
    // `Handle._run` at every call: tools that time slow callbacks replace
    // it whenever they are turned on. Not looked for: a `call_soon` set on
    // the loop object itself (`mock.patch.object(loop, "call_soon")`),
    // which only the loop's `__dict__` would show; reading that makes
    // Python keep the loop's attributes in a dict of their own from then
    // on, which slows every attribute read of the loop, asyncio's own
    // included (measured: some 15% of an ask).
    let run_is_asyncios = asyncio
        .handle
        .bind(py)
        .getattr(intern!(py, "_run"))
        .is_ok_and(|f| f.is(&originals.handle_run));
    if !run_is_asyncios
        || !schedules_as_asyncio(&event_loop.get_type(), originals)
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
