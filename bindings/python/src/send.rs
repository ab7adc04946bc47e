//! A handler's first step, run by the extension as its slot's asyncio task
//! and in its request's context (see `_dispatch.py`), without the Python
//! frames and the `StopIteration` a step through Python costs.
//!
//! Done as a task's step does it: the running task is swapped for the
//! slot's (`asyncio.tasks._leave_task` / `_enter_task`), the request's
//! context entered (`PyContext_Enter` / `PyContext_Exit`), and the
//! coroutine started with `PyIter_Send`, which hands a returned value back
//! with no exception. The wheel is built for the stable ABI of 3.9, which
//! has none of the three C functions, so they are looked up in the running
//! interpreter once; where one is missing (the context calls always exist;
//! `PyIter_Send` from 3.10), the Python way is used.

use std::ffi::{c_int, c_void, CStr};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::OnceLock;

use pyo3::exceptions::PyStopIteration;
use pyo3::intern;
use pyo3::prelude::*;
use pyo3::sync::PyOnceLock;
use pyo3::types::PyDict;

/// How a handler's first step ended.
pub(crate) enum Sent<'py> {
    /// The coroutine returned this value.
    Returned(Bound<'py, PyAny>),
    /// The coroutine awaited: this is what it yielded to the event loop.
    Yielded(Bound<'py, PyAny>),
}

impl<'py> From<(bool, Bound<'py, PyAny>)> for Sent<'py> {
    /// A step as `send_here` and `returned_or_yielded` give it.
    fn from((returned, value): (bool, Bound<'py, PyAny>)) -> Self {
        if returned {
            Sent::Returned(value)
        } else {
            Sent::Yielded(value)
        }
    }
}

type IterSend = unsafe extern "C" fn(
    *mut pyo3::ffi::PyObject,
    *mut pyo3::ffi::PyObject,
    *mut *mut pyo3::ffi::PyObject,
) -> c_int;
type ContextSwitch = unsafe extern "C" fn(*mut pyo3::ffi::PyObject) -> c_int;

const PYGEN_RETURN: c_int = 0;
const PYGEN_NEXT: c_int = 1;

struct CApi {
    iter_send: Option<IterSend>,
    context_enter: Option<ContextSwitch>,
    context_exit: Option<ContextSwitch>,
}

fn symbol(name: &CStr) -> *mut c_void {
    // SAFETY: a lookup by name in the symbols already loaded into this
    // process; the interpreter running this module exports its C API.
    unsafe { libc::dlsym(libc::RTLD_DEFAULT, name.as_ptr()) }
}

fn c_api() -> &'static CApi {
    static API: OnceLock<CApi> = OnceLock::new();
    API.get_or_init(|| {
        let send = symbol(c"PyIter_Send");
        let enter = symbol(c"PyContext_Enter");
        let exit = symbol(c"PyContext_Exit");
        // SAFETY: each has this signature in every Python that has it
        // (`PyIter_Send` since 3.10, the context calls since 3.7).
        unsafe {
            CApi {
                iter_send: (!send.is_null())
                    .then(|| std::mem::transmute::<*mut c_void, IterSend>(send)),
                context_enter: (!enter.is_null())
                    .then(|| std::mem::transmute::<*mut c_void, ContextSwitch>(enter)),
                context_exit: (!exit.is_null())
                    .then(|| std::mem::transmute::<*mut c_void, ContextSwitch>(exit)),
            }
        }
    })
}

/// Set by the tests to run the path of Pythons without the C functions.
static THROUGH_PYTHON: AtomicBool = AtomicBool::new(false);

/// Makes the first step go through Python's own calls (`Context.run`, the
/// `send` method) even where the C functions exist, for the tests of that
/// path on a newer Python.
#[pyfunction]
pub(crate) fn _send_through_method(on: bool) {
    THROUGH_PYTHON.store(on, Ordering::Relaxed);
}

/// asyncio's bookkeeping of the task a loop runs.
struct TaskSwitch {
    current_task: Py<PyAny>,
    /// `asyncio.tasks._current_tasks` where `current_task` is the Python
    /// function that does no more than `_current_tasks.get(loop)` (Python
    /// < 3.12): the dict is read directly, without a Python frame per
    /// request, and the task swap is done on it (`swap_in_dict`), as
    /// `_enter_task` and `_leave_task` (C or Python) do there. `None` where
    /// `current_task` is asyncio's C function.
    current_tasks: Option<Py<PyDict>>,
    enter_task: Py<PyAny>,
    leave_task: Py<PyAny>,
    get_running_loop: Py<PyAny>,
}

fn task_switch(py: Python<'_>) -> PyResult<&'static TaskSwitch> {
    static SWITCH: PyOnceLock<TaskSwitch> = PyOnceLock::new();
    SWITCH.get_or_try_init(py, || {
        let tasks = py.import("asyncio.tasks")?;
        let current_task = tasks.getattr("current_task")?;
        let current_tasks = match current_task.hasattr("__code__")? {
            true => tasks
                .getattr("_current_tasks")
                .ok()
                .and_then(|d| d.cast_into::<PyDict>().ok())
                .map(Bound::unbind),
            false => None,
        };
        Ok(TaskSwitch {
            current_task: current_task.unbind(),
            current_tasks,
            enter_task: tasks.getattr("_enter_task")?.unbind(),
            leave_task: tasks.getattr("_leave_task")?.unbind(),
            get_running_loop: py.import("asyncio")?.getattr("get_running_loop")?.unbind(),
        })
    })
}

/// The running loop's current task swapped for another until dropped (also
/// when unwinding), as a task's step does around the step. Nothing to swap
/// when that task is already the current one: a request the slot takes
/// while its own task runs (an answer from the slot's task starts the next
/// request there, see `Reply::answer`); leaving and entering it again
/// would change nothing, at four calls into asyncio per request.
struct AsTask<'py> {
    switch: &'static TaskSwitch,
    event_loop: Bound<'py, PyAny>,
    /// `None` when nothing was swapped.
    task: Option<Bound<'py, PyAny>>,
    caller: Option<Bound<'py, PyAny>>,
}

/// Where asyncio's current tasks are a dict the extension reads (see
/// `TaskSwitch::current_tasks`), `_leave_task(loop, from)` followed by
/// `_enter_task(loop, to)` is that dict's entry for `loop` going from
/// `from` to `to` (absent for `None`), which this does directly, without
/// two calls into asyncio; `false` (nothing changed) when the entry is not
/// `from`, where those calls raise asyncio's own error.
fn swap_in_dict(
    switch: &TaskSwitch,
    event_loop: &Bound<'_, PyAny>,
    from: Option<&Bound<'_, PyAny>>,
    to: Option<&Bound<'_, PyAny>>,
) -> PyResult<bool> {
    let py = event_loop.py();
    let Some(tasks) = &switch.current_tasks else {
        return Ok(false);
    };
    let tasks = tasks.bind(py);
    let found = tasks.get_item(event_loop)?;
    let expected = match (&found, from) {
        (None, None) => true,
        (Some(found), Some(from)) => found.is(from),
        _ => false,
    };
    if !expected {
        return Ok(false);
    }
    match to {
        Some(to) => tasks.set_item(event_loop, to)?,
        None => tasks.del_item(event_loop)?,
    }
    Ok(true)
}

impl<'py> AsTask<'py> {
    /// `caller` is the loop's current task (`current_task`), or `None`.
    fn enter(
        switch: &'static TaskSwitch,
        event_loop: Bound<'py, PyAny>,
        task: Bound<'py, PyAny>,
        caller: Bound<'py, PyAny>,
    ) -> PyResult<Self> {
        let py = event_loop.py();
        if caller.is(&task) {
            return Ok(Self {
                switch,
                event_loop,
                task: None,
                caller: None,
            });
        }
        let caller = (!caller.is_none()).then_some(caller);
        if !swap_in_dict(switch, &event_loop, caller.as_ref(), Some(&task))? {
            if let Some(caller) = &caller {
                switch.leave_task.bind(py).call1((&event_loop, caller))?;
            }
            if let Err(e) = switch.enter_task.bind(py).call1((&event_loop, &task)) {
                if let Some(caller) = &caller {
                    let _ = switch.enter_task.bind(py).call1((&event_loop, caller));
                }
                return Err(e);
            }
        }
        Ok(Self {
            switch,
            event_loop,
            task: Some(task),
            caller,
        })
    }
}

impl Drop for AsTask<'_> {
    fn drop(&mut self) {
        let Some(task) = &self.task else {
            return;
        };
        let py = self.event_loop.py();
        match swap_in_dict(
            self.switch,
            &self.event_loop,
            Some(task),
            self.caller.as_ref(),
        ) {
            Ok(true) => return,
            Ok(false) => {}
            Err(e) => e.write_unraisable(py, None),
        }
        // Nothing to do if these fail: the loop is in a state no task can
        // be run from anyway; the error is reported, not raised.
        if let Err(e) = self
            .switch
            .leave_task
            .bind(py)
            .call1((&self.event_loop, task))
        {
            e.write_unraisable(py, None);
        }
        if let Some(caller) = &self.caller {
            if let Err(e) = self
                .switch
                .enter_task
                .bind(py)
                .call1((&self.event_loop, caller))
            {
                e.write_unraisable(py, None);
            }
        }
    }
}

/// `context` entered until dropped (also when unwinding).
struct InContext<'a, 'py> {
    context: &'a Bound<'py, PyAny>,
    exit: ContextSwitch,
}

impl<'a, 'py> InContext<'a, 'py> {
    fn enter(
        context: &'a Bound<'py, PyAny>,
        enter: ContextSwitch,
        exit: ContextSwitch,
    ) -> PyResult<Self> {
        // SAFETY: `context` is a live `contextvars.Context` (a fresh copy,
        // never entered) and the GIL is held.
        if unsafe { enter(context.as_ptr()) } != 0 {
            return Err(PyErr::fetch(context.py()));
        }
        Ok(Self { context, exit })
    }
}

impl Drop for InContext<'_, '_> {
    fn drop(&mut self) {
        // SAFETY: entered by `enter` on this thread, which still holds the GIL.
        if unsafe { (self.exit)(self.context.as_ptr()) } != 0 {
            PyErr::fetch(self.context.py()).write_unraisable(self.context.py(), None);
        }
    }
}

/// The exception being handled where the first step is run (a caller's
/// `except` block around its ask) set aside until dropped: the handler's
/// `sys.exc_info()`, and the implicit context of what it raises, are its
/// own, as in a task's step run from the loop.
struct NoHandledException {
    saved: [*mut pyo3::ffi::PyObject; 3],
}

impl NoHandledException {
    fn set_aside(_py: Python<'_>) -> Self {
        let mut saved = [std::ptr::null_mut(); 3];
        // SAFETY: the GIL is held; GetExcInfo gives new references (or
        // null), which SetExcInfo takes back on drop; SetExcInfo with nulls
        // clears the handled exception.
        unsafe {
            pyo3::ffi::PyErr_GetExcInfo(&mut saved[0], &mut saved[1], &mut saved[2]);
            if !saved[1].is_null() {
                pyo3::ffi::PyErr_SetExcInfo(
                    std::ptr::null_mut(),
                    std::ptr::null_mut(),
                    std::ptr::null_mut(),
                );
            }
        }
        Self { saved }
    }
}

impl Drop for NoHandledException {
    fn drop(&mut self) {
        let [t, v, tb] = self.saved;
        // SAFETY: as in `set_aside`, on the same thread, still holding the GIL.
        unsafe {
            if v.is_null() {
                // Nothing was set aside; release what GetExcInfo gave.
                pyo3::ffi::Py_XDECREF(t);
                pyo3::ffi::Py_XDECREF(tb);
            } else {
                pyo3::ffi::PyErr_SetExcInfo(t, v, tb);
            }
        }
    }
}

/// The running loop (the extension dispatches on its loop's thread).
pub(crate) fn running_loop(py: Python<'_>) -> PyResult<Bound<'_, PyAny>> {
    task_switch(py)?.get_running_loop.bind(py).call0()
}

/// `asyncio.current_task(event_loop)`: the task running now, or `None`.
pub(crate) fn current_task<'py>(event_loop: &Bound<'py, PyAny>) -> PyResult<Bound<'py, PyAny>> {
    let py = event_loop.py();
    let switch = task_switch(py)?;
    if let Some(tasks) = &switch.current_tasks {
        return Ok(tasks
            .bind(py)
            .get_item(event_loop)?
            .unwrap_or_else(|| py.None().into_bound(py)));
    }
    switch.current_task.bind(py).call1((event_loop,))
}

/// A handler registered as a wrapper of an `async def` (`functools.wraps`)
/// may still return something else: the request fails with a `TypeError`
/// that says so, not an `AttributeError` about `send`. Looked at only when
/// the first step failed (the hot path checks nothing).
fn no_coroutine(returned: &Bound<'_, PyAny>) -> Option<PyErr> {
    let py = returned.py();
    match returned.hasattr(intern!(py, "send")) {
        Ok(true) => None,
        _ => Some(pyo3::exceptions::PyTypeError::new_err(format!(
            "a pool handler must return a coroutine (call an `async def`), not {}",
            returned
                .get_type()
                .name()
                .map_or_else(|_| "an object".to_owned(), |n| n.to_string())
        ))),
    }
}

/// Runs `handler(message, ctx)` and its coroutine's first step as `task` of
/// `event_loop`, in `context`: the coroutine, and what its step gave.
/// `current` is the loop's current task (`current_task`), or `None`.
pub(crate) fn first_step<'py>(
    event_loop: Bound<'py, PyAny>,
    task: Bound<'py, PyAny>,
    current: Bound<'py, PyAny>,
    context: &Bound<'py, PyAny>,
    handler: &Bound<'py, PyAny>,
    args: (Bound<'py, PyAny>, Bound<'py, PyAny>),
) -> PyResult<(Bound<'py, PyAny>, Sent<'py>)> {
    let py = event_loop.py();
    let _as_task = AsTask::enter(task_switch(py)?, event_loop, task, current)?;
    let _no_handled = NoHandledException::set_aside(py);
    let api = c_api();
    let native = !THROUGH_PYTHON.load(Ordering::Relaxed);
    if let (true, Some(enter), Some(exit), Some(_)) =
        (native, api.context_enter, api.context_exit, api.iter_send)
    {
        let _in_context = InContext::enter(context, enter, exit)?;
        let coro = handler.call1(args)?;
        let none = py.None().into_bound(py);
        let stepped = send_here(&coro, &none).map_err(|e| no_coroutine(&coro).unwrap_or(e))?;
        return Ok((coro, Sent::from(stepped)));
    }
    // The Python way: `context.run(handler, ...)`, then `context.run(coro.send, None)`.
    let run = context.getattr(intern!(py, "run"))?;
    let coro = run.call1((handler, args.0, args.1))?;
    if let Some(e) = no_coroutine(&coro) {
        return Err(e);
    }
    let stepped = returned_or_yielded(
        py,
        run.call1((coro.getattr(intern!(py, "send"))?, py.None())),
    )?;
    Ok((coro, Sent::from(stepped)))
}

/// A later step of a handler's coroutine (`_dispatch._Resume`):
/// `context.run(coro.send, value)`, but a return comes back as
/// `(True, value)` and a yield as `(False, yielded)`, where the Python call
/// raises a `StopIteration` that the wrapper catches, once per request.
/// Done as the first step is (`PyContext_Enter`, `PyIter_Send`), the Python
/// way where those are missing (or the tests ask for it).
#[pyfunction]
pub(crate) fn _send_in<'py>(
    context: &Bound<'py, PyAny>,
    coro: &Bound<'py, PyAny>,
    value: &Bound<'py, PyAny>,
) -> PyResult<(bool, Bound<'py, PyAny>)> {
    let py = context.py();
    let api = c_api();
    let native = !THROUGH_PYTHON.load(Ordering::Relaxed);
    if let (true, Some(enter), Some(exit)) = (native, api.context_enter, api.context_exit) {
        let _in_context = InContext::enter(context, enter, exit)?;
        return send_here(coro, value);
    }
    let run = context.getattr(intern!(py, "run"))?;
    returned_or_yielded(py, run.call1((coro.getattr(intern!(py, "send"))?, value)))
}

/// `coro.send(value)` in the context entered now, with a return handed back
/// as `(true, value)` rather than raised as a `StopIteration`.
fn send_here<'py>(
    coro: &Bound<'py, PyAny>,
    value: &Bound<'py, PyAny>,
) -> PyResult<(bool, Bound<'py, PyAny>)> {
    let py = coro.py();
    let send = c_api().iter_send;
    if let (true, Some(send)) = (!THROUGH_PYTHON.load(Ordering::Relaxed), send) {
        let mut out = std::ptr::null_mut();
        // SAFETY: `coro` and `value` are live objects and the GIL is held;
        // `out` receives a new reference unless the result is an error.
        let result = unsafe { send(coro.as_ptr(), value.as_ptr(), &mut out) };
        return match result {
            // SAFETY: a new reference (see above).
            PYGEN_RETURN => Ok((true, unsafe { Bound::from_owned_ptr(py, out) })),
            PYGEN_NEXT => Ok((false, unsafe { Bound::from_owned_ptr(py, out) })),
            _ => Err(PyErr::fetch(py)),
        };
    }
    returned_or_yielded(py, coro.call_method1(intern!(py, "send"), (value,)))
}

/// A step's outcome through Python's own `send`: a `StopIteration` is the
/// coroutine's return.
fn returned_or_yielded<'py>(
    py: Python<'py>,
    stepped: PyResult<Bound<'py, PyAny>>,
) -> PyResult<(bool, Bound<'py, PyAny>)> {
    match stepped {
        Ok(yielded) => Ok((false, yielded)),
        Err(e) if e.is_instance_of::<PyStopIteration>(py) => {
            Ok((true, e.value(py).getattr(intern!(py, "value"))?))
        }
        Err(e) => Err(e),
    }
}

/// The next step of a handler whose last step yielded nothing (a bare
/// `yield`, `asyncio.sleep(0)`'s), run from a loop callback that runs in
/// the request's context (`_dispatch.Slot._step`), as a task's step would
/// run it: as the slot's `task`, parked meanwhile on its idle waiter. A
/// return answers `reply` before the task is swapped out again, so that a
/// next request the answer starts runs its first step as that task with
/// nothing to swap, as it does from the task's own step. `(True, None)`
/// once answered, `(False, yielded)` for a step that awaited.
#[pyfunction]
pub(crate) fn _step_as<'py>(
    event_loop: Bound<'py, PyAny>,
    task: Bound<'py, PyAny>,
    coro: &Bound<'py, PyAny>,
    reply: &Bound<'py, crate::pool::Reply>,
) -> PyResult<(bool, Bound<'py, PyAny>)> {
    let py = event_loop.py();
    let current = current_task(&event_loop)?;
    let _as_task = AsTask::enter(task_switch(py)?, event_loop, task, current)?;
    let none = py.None().into_bound(py);
    let (returned, value) = send_here(coro, &none)?;
    if !returned {
        return Ok((false, value));
    }
    reply.get().ok(py, value.unbind())?;
    Ok((true, none))
}
