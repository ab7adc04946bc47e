//! The error taxonomy as Python exceptions. The classes live in the wrapper
//! (`askpool/_errors.py`, so they can subclass two builtins); it registers a
//! factory at import and this module only calls it.

use std::sync::OnceLock;

use askpool::{AskError, ErrorCode};
use pyo3::exceptions::PyRuntimeError;
use pyo3::prelude::*;

static FACTORY: OnceLock<Py<PyAny>> = OnceLock::new();

/// `factory(code, message, type_name, handler_message) -> exception`.
#[pyfunction]
pub(crate) fn register_error_factory(factory: Py<PyAny>) {
    let _ = FACTORY.set(factory);
}

/// The exception instance for `error`.
pub(crate) fn exception(py: Python<'_>, error: &AskError) -> PyErr {
    let (type_name, handler_message) = match error {
        AskError::HandlerFailed { type_name, message } => {
            (Some(type_name.as_str()), Some(message.as_str()))
        }
        _ => (None, None),
    };
    let Some(factory) = FACTORY.get() else {
        return PyRuntimeError::new_err(error.to_string());
    };
    match factory.call1(
        py,
        (
            error.code().as_str(),
            error.to_string(),
            type_name,
            handler_message,
        ),
    ) {
        Ok(exc) => PyErr::from_value(exc.into_bound(py)),
        Err(e) => e,
    }
}

pub(crate) fn to_py<T>(result: Result<T, AskError>) -> PyResult<T> {
    result.map_err(|e| Python::attach(|py| exception(py, &e)))
}

/// The error a handler's exception becomes (see `AskError::from_handler`).
pub(crate) fn from_handler(code: Option<&str>, type_name: String, message: String) -> AskError {
    AskError::from_handler(code.and_then(ErrorCode::from_name), type_name, message)
}

/// A panic caught at the boundary, as the taxonomy's `Internal`.
pub(crate) fn panic_error(panic: &(dyn std::any::Any + Send)) -> AskError {
    let message = panic
        .downcast_ref::<&str>()
        .map(|s| s.to_string())
        .or_else(|| panic.downcast_ref::<String>().cloned())
        .unwrap_or_else(|| "unknown panic".to_owned());
    AskError::internal(format!("panic in askpool: {message}"))
}
