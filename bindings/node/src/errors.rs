//! The error taxonomy across the boundary. Native calls that fail throw a JS
//! `Error` whose message starts with `askpool:CODE:`; the wrapper turns it into
//! the matching `AskError` subclass. Errors that end an ask travel as
//! [`ErrorInfo`] objects.

use askpool::{AskError, ErrorCode};
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

/// The error a JS handler's throw stands for (see `AskError::from_handler`:
/// the same mapping in every binding).
pub fn from_handler(code: Option<&str>, name: String, message: String) -> AskError {
    AskError::from_handler(code.and_then(ErrorCode::from_name), name, message)
}
