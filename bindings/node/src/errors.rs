//! The error taxonomy across the boundary. Native calls that fail throw a JS
//! `Error` whose message starts with `askpool:CODE:`; the wrapper turns it into
//! the matching `AskError` subclass. Errors that end an ask travel as
//! [`ErrorInfo`] objects.

use askpool::{AskError, CancelReason, ErrorCode};
use napi_derive::napi;

const PREFIX: &str = "askpool:";

/// An `AskError` as the wrapper sees it.
#[napi(object)]
pub struct ErrorInfo {
    pub code: String,
    pub message: String,
    /// For `HANDLER_FAILED`: the name of what the handler threw.
    pub handler_name: Option<String>,
    /// For `HANDLER_FAILED`: its message.
    pub handler_message: Option<String>,
}

impl From<&AskError> for ErrorInfo {
    fn from(error: &AskError) -> Self {
        let (handler_name, handler_message) = match error {
            AskError::HandlerFailed { type_name, message } => {
                (Some(type_name.clone()), Some(message.clone()))
            }
            _ => (None, None),
        };
        Self {
            code: error.code().as_str().to_owned(),
            message: error.to_string(),
            handler_name,
            handler_message,
        }
    }
}

/// An `AskError` thrown by a native call.
pub fn throw(error: AskError) -> napi::Error {
    napi::Error::from_reason(format!("{PREFIX}{}:{error}", error.code().as_str()))
}

/// A bad argument from the wrapper (a bug there, or bad user input it passed on).
pub fn invalid(message: impl Into<String>) -> napi::Error {
    throw(AskError::InvalidArgument {
        message: message.into(),
    })
}

fn code_named(name: &str) -> Option<ErrorCode> {
    ErrorCode::ALL.into_iter().find(|c| c.as_str() == name)
}

/// The error a JS handler's throw stands for: one of the taxonomy's codes if
/// it threw an `AskError` (its own message kept), else `HandlerFailed` with
/// the thrown value's name and message.
pub fn from_handler(code: Option<&str>, name: String, message: String) -> AskError {
    let Some(code) = code.and_then(code_named) else {
        return AskError::HandlerFailed {
            type_name: name,
            message,
        };
    };
    match code {
        ErrorCode::Unavailable => AskError::Unavailable { reason: message },
        ErrorCode::DeadlineExceeded => AskError::DeadlineExceeded,
        ErrorCode::AskTimeout => AskError::AskTimeout { elapsed_ms: 0 },
        ErrorCode::BufferFull => AskError::BufferFull {
            pool: message,
            limit: 0,
        },
        ErrorCode::NoRoute => AskError::NoRoute { pool: message },
        ErrorCode::InvalidArgument => AskError::InvalidArgument { message },
        ErrorCode::ValidationError => AskError::ValidationError { message },
        ErrorCode::PayloadMismatch => AskError::PayloadMismatch,
        ErrorCode::PermissionDenied => AskError::PermissionDenied { message },
        ErrorCode::OversizePayload => AskError::OversizePayload { size: 0, limit: 0 },
        ErrorCode::FailedPrecondition => AskError::FailedPrecondition { message },
        ErrorCode::DecodeFailure => AskError::DecodeFailure { message },
        ErrorCode::Internal => AskError::Internal { message },
        ErrorCode::AskCancelled => AskError::AskCancelled {
            reason: CancelReason::Worker,
        },
        ErrorCode::HandlerFailed => AskError::HandlerFailed {
            type_name: name,
            message,
        },
    }
}
