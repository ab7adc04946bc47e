//! Starting a handler's coroutine with `coro.send(None)`.
//!
//! A handler that returns without awaiting is the common case, and through
//! the `send` method its return value arrives as a `StopIteration`: an
//! exception object, its normalisation and a traceback for every request.
//! `PyIter_Send` (Python >= 3.10) hands the value back with no exception.
//! The wheel is built for the stable ABI of 3.9, which lacks it, so it is
//! looked up in the running interpreter once; on 3.9 the method is used.

use std::ffi::{c_int, c_void};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::OnceLock;

use pyo3::exceptions::PyStopIteration;
use pyo3::intern;
use pyo3::prelude::*;

/// What `coro.send(None)` gave.
pub(crate) enum Sent<'py> {
    /// The coroutine returned this value.
    Returned(Bound<'py, PyAny>),
    /// The coroutine awaited: this is what it yielded to the event loop.
    Yielded(Bound<'py, PyAny>),
}

type IterSend = unsafe extern "C" fn(
    *mut pyo3::ffi::PyObject,
    *mut pyo3::ffi::PyObject,
    *mut *mut pyo3::ffi::PyObject,
) -> c_int;

const PYGEN_RETURN: c_int = 0;
const PYGEN_NEXT: c_int = 1;

fn iter_send() -> Option<IterSend> {
    static SEND: OnceLock<Option<IterSend>> = OnceLock::new();
    *SEND.get_or_init(|| {
        // SAFETY: a lookup by name in the symbols already loaded into this
        // process; the interpreter running this module exports its C API.
        let symbol = unsafe { libc::dlsym(libc::RTLD_DEFAULT, c"PyIter_Send".as_ptr()) };
        (!symbol.is_null()).then(|| {
            // SAFETY: `PyIter_Send` has this signature in every Python that
            // has it (stable ABI since 3.10).
            unsafe { std::mem::transmute::<*mut c_void, IterSend>(symbol) }
        })
    })
}

/// Set by the tests to run the path of Pythons without `PyIter_Send`.
static THROUGH_METHOD: AtomicBool = AtomicBool::new(false);

/// Makes `send_none` use the `send` method even where `PyIter_Send` exists
/// (for the tests of the 3.9 path on a newer Python).
#[pyfunction]
pub(crate) fn _send_through_method(on: bool) {
    THROUGH_METHOD.store(on, Ordering::Relaxed);
}

/// `coro.send(None)`; an exception the coroutine raised is the error.
pub(crate) fn send_none<'py>(coro: &Bound<'py, PyAny>) -> PyResult<Sent<'py>> {
    let py = coro.py();
    let native = iter_send().filter(|_| !THROUGH_METHOD.load(Ordering::Relaxed));
    if let Some(send) = native {
        let mut out = std::ptr::null_mut();
        // SAFETY: `coro` and `None` are live objects and the GIL is held;
        // `out` receives a new reference unless the result is an error.
        let result = unsafe { send(coro.as_ptr(), py.None().as_ptr(), &mut out) };
        return match result {
            // SAFETY: a new reference (see above).
            PYGEN_RETURN => Ok(Sent::Returned(unsafe { Bound::from_owned_ptr(py, out) })),
            PYGEN_NEXT => Ok(Sent::Yielded(unsafe { Bound::from_owned_ptr(py, out) })),
            _ => Err(PyErr::fetch(py)),
        };
    }
    match coro.call_method1(intern!(py, "send"), (py.None(),)) {
        Ok(yielded) => Ok(Sent::Yielded(yielded)),
        Err(e) if e.is_instance_of::<PyStopIteration>(py) => {
            Ok(Sent::Returned(e.value(py).getattr(intern!(py, "value"))?))
        }
        Err(e) => Err(e),
    }
}
