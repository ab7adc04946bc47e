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

/// The error a handler's exception becomes. An exception of the taxonomy
/// whose code carries just a message keeps its code (a handler can reject
/// poison with `DecodeFailureError`); anything else is `HandlerFailed`.
pub(crate) fn from_handler(code: Option<&str>, type_name: String, message: String) -> AskError {
    let code = code.and_then(|c| ErrorCode::ALL.into_iter().find(|k| k.as_str() == c));
    match code {
        Some(ErrorCode::Unavailable) => AskError::Unavailable { reason: message },
        Some(ErrorCode::InvalidArgument) => AskError::InvalidArgument { message },
        Some(ErrorCode::ValidationError) => AskError::ValidationError { message },
        Some(ErrorCode::PermissionDenied) => AskError::PermissionDenied { message },
        Some(ErrorCode::FailedPrecondition) => AskError::FailedPrecondition { message },
        Some(ErrorCode::DecodeFailure) => AskError::DecodeFailure { message },
        Some(ErrorCode::Internal) => AskError::Internal { message },
        _ => AskError::handler_failed(type_name, message),
    }
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
