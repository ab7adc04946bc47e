//! The one error taxonomy (DESIGN section 6), shared by every language.
//!
//! Each code has a class: Transient errors are retried by the caller inside the
//! deadline, Permanent errors are returned at once, Poison errors go to the
//! dead-letter queue.

use std::fmt;

/// Whether retrying can change the result.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum ErrorClass {
    /// May succeed later: retry with backoff inside the deadline.
    Transient,
    /// Retrying cannot change the result.
    Permanent,
    /// The message itself is bad: dead-letter it for a human.
    Poison,
}

/// The code of an [`AskError`], without its details. Used for classification,
/// retryable-code sets and metric labels.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum ErrorCode {
    Unavailable,
    DeadlineExceeded,
    AskTimeout,
    BufferFull,
    NoRoute,
    InvalidArgument,
    ValidationError,
    PayloadMismatch,
    PermissionDenied,
    OversizePayload,
    FailedPrecondition,
    DecodeFailure,
    Internal,
    AskCancelled,
    HandlerFailed,
}

impl ErrorCode {
    pub const ALL: [ErrorCode; 15] = [
        ErrorCode::Unavailable,
        ErrorCode::DeadlineExceeded,
        ErrorCode::AskTimeout,
        ErrorCode::BufferFull,
        ErrorCode::NoRoute,
        ErrorCode::InvalidArgument,
        ErrorCode::ValidationError,
        ErrorCode::PayloadMismatch,
        ErrorCode::PermissionDenied,
        ErrorCode::OversizePayload,
        ErrorCode::FailedPrecondition,
        ErrorCode::DecodeFailure,
        ErrorCode::Internal,
        ErrorCode::AskCancelled,
        ErrorCode::HandlerFailed,
    ];

    /// Whether a handler failing with an error of this code passes the
    /// code on to its caller (see [`AskError::from_handler`]): the codes
    /// whose error is just a message.
    pub const fn kept_from_handler(self) -> bool {
        use ErrorCode::*;
        matches!(
            self,
            Unavailable
                | InvalidArgument
                | ValidationError
                | PermissionDenied
                | FailedPrecondition
                | DecodeFailure
                | Internal
        )
    }

    /// The code spelled `name` as [`as_str`](Self::as_str) spells it.
    pub fn from_name(name: &str) -> Option<ErrorCode> {
        Self::ALL.into_iter().find(|code| code.as_str() == name)
    }

    pub const fn class(self) -> ErrorClass {
        use ErrorCode::*;
        match self {
            Unavailable | DeadlineExceeded | AskTimeout | BufferFull => ErrorClass::Transient,
            DecodeFailure => ErrorClass::Poison,
            NoRoute | InvalidArgument | ValidationError | PayloadMismatch | PermissionDenied
            | OversizePayload | FailedPrecondition | Internal | AskCancelled | HandlerFailed => {
                ErrorClass::Permanent
            }
        }
    }

    /// The stable SCREAMING_SNAKE name used by every binding (`.code` in Node,
    /// metric labels, the CLI).
    pub const fn as_str(self) -> &'static str {
        use ErrorCode::*;
        match self {
            Unavailable => "UNAVAILABLE",
            DeadlineExceeded => "DEADLINE_EXCEEDED",
            AskTimeout => "ASK_TIMEOUT",
            BufferFull => "BUFFER_FULL",
            NoRoute => "NO_ROUTE",
            InvalidArgument => "INVALID_ARGUMENT",
            ValidationError => "VALIDATION_ERROR",
            PayloadMismatch => "PAYLOAD_MISMATCH",
            PermissionDenied => "PERMISSION_DENIED",
            OversizePayload => "OVERSIZE_PAYLOAD",
            FailedPrecondition => "FAILED_PRECONDITION",
            DecodeFailure => "DECODE_FAILURE",
            Internal => "INTERNAL",
            AskCancelled => "ASK_CANCELLED",
            HandlerFailed => "HANDLER_FAILED",
        }
    }
}

impl fmt::Display for ErrorCode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A set of error codes (a bitset: `Copy`, no allocation), e.g. the codes a
/// retry policy retries or the codes that open a circuit breaker at once.
#[derive(Clone, Copy, Default, PartialEq, Eq, Hash)]
pub struct CodeSet(u32);

impl CodeSet {
    pub const EMPTY: CodeSet = CodeSet(0);

    pub fn of(codes: &[ErrorCode]) -> Self {
        codes.iter().fold(Self::EMPTY, |set, &c| set.with(c))
    }

    /// Every code of `class`.
    pub fn class(class: ErrorClass) -> Self {
        ErrorCode::ALL
            .iter()
            .filter(|c| c.class() == class)
            .fold(Self::EMPTY, |set, &c| set.with(c))
    }

    #[must_use]
    pub const fn with(self, code: ErrorCode) -> Self {
        Self(self.0 | 1 << code as u32)
    }

    #[must_use]
    pub const fn without(self, code: ErrorCode) -> Self {
        Self(self.0 & !(1 << code as u32))
    }

    pub const fn contains(self, code: ErrorCode) -> bool {
        self.0 & (1 << code as u32) != 0
    }

    pub fn iter(self) -> impl Iterator<Item = ErrorCode> {
        ErrorCode::ALL
            .into_iter()
            .filter(move |&c| self.contains(c))
    }
}

impl fmt::Debug for CodeSet {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_set().entries(self.iter()).finish()
    }
}

/// Who cancelled an ask, and why.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum CancelReason {
    /// The caller cancelled (dropped the future, called `cancel()`, ...).
    Caller,
    /// The caller's deadline passed; the cancel is best-effort cleanup.
    CallerTimeout,
    /// The worker side cancelled the request (handler or operator).
    Worker,
    /// The worker's processing timeout expired.
    ProcessingTimeout,
    /// The pool that held the request closed: closed by itself, or with
    /// its node's shutdown (or, in a binding, with the event loop its
    /// handlers ran on).
    Shutdown,
}

impl fmt::Display for CancelReason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            CancelReason::Caller => "cancelled by the caller",
            CancelReason::CallerTimeout => "the caller's deadline passed",
            CancelReason::Worker => "cancelled by the worker",
            CancelReason::ProcessingTimeout => "the processing timeout expired",
            CancelReason::Shutdown => "its pool closed",
        })
    }
}

/// An ask's failure. Cloneable: error outcomes are cached and replayed.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum AskError {
    #[error("unavailable: {reason}")]
    Unavailable { reason: String },
    #[error("deadline exceeded")]
    DeadlineExceeded,
    #[error("ask timed out after {elapsed_ms} ms")]
    AskTimeout { elapsed_ms: u64 },
    #[error("pool {pool:?} is full ({limit} requests in flight)")]
    BufferFull { pool: String, limit: usize },
    #[error("no route to pool {pool:?}")]
    NoRoute { pool: String },
    #[error("invalid argument: {message}")]
    InvalidArgument { message: String },
    #[error("validation failed: {message}")]
    ValidationError { message: String },
    #[error("request id reused with a different payload")]
    PayloadMismatch,
    #[error("permission denied: {message}")]
    PermissionDenied { message: String },
    #[error("payload of {size} bytes exceeds the limit of {limit}")]
    OversizePayload { size: usize, limit: usize },
    #[error("failed precondition: {message}")]
    FailedPrecondition { message: String },
    #[error("cannot decode message: {message}")]
    DecodeFailure { message: String },
    #[error("internal error: {message}")]
    Internal { message: String },
    #[error("ask cancelled: {reason}")]
    AskCancelled { reason: CancelReason },
    #[error("handler failed with {type_name}: {message}")]
    HandlerFailed { type_name: String, message: String },
}

impl AskError {
    pub fn code(&self) -> ErrorCode {
        use AskError::*;
        match self {
            Unavailable { .. } => ErrorCode::Unavailable,
            DeadlineExceeded => ErrorCode::DeadlineExceeded,
            AskTimeout { .. } => ErrorCode::AskTimeout,
            BufferFull { .. } => ErrorCode::BufferFull,
            NoRoute { .. } => ErrorCode::NoRoute,
            InvalidArgument { .. } => ErrorCode::InvalidArgument,
            ValidationError { .. } => ErrorCode::ValidationError,
            PayloadMismatch => ErrorCode::PayloadMismatch,
            PermissionDenied { .. } => ErrorCode::PermissionDenied,
            OversizePayload { .. } => ErrorCode::OversizePayload,
            FailedPrecondition { .. } => ErrorCode::FailedPrecondition,
            DecodeFailure { .. } => ErrorCode::DecodeFailure,
            Internal { .. } => ErrorCode::Internal,
            AskCancelled { .. } => ErrorCode::AskCancelled,
            HandlerFailed { .. } => ErrorCode::HandlerFailed,
        }
    }

    pub fn class(&self) -> ErrorClass {
        self.code().class()
    }

    pub fn is_transient(&self) -> bool {
        self.class() == ErrorClass::Transient
    }

    pub fn unavailable(reason: impl Into<String>) -> Self {
        AskError::Unavailable {
            reason: reason.into(),
        }
    }

    pub fn internal(message: impl Into<String>) -> Self {
        AskError::Internal {
            message: message.into(),
        }
    }

    /// The error a caller sees when a handler fails with an error of type
    /// `type_name` saying `message`, which carries `code` if it is one of
    /// the taxonomy's (re-raised from an inner ask, or raised on purpose).
    /// Every binding maps a handler's failure through this, so one failure
    /// reads the same in every language. A code whose error is just a
    /// message keeps it (a handler rejects poison with `DecodeFailure`, bad
    /// input with `InvalidArgument`); one whose error describes the caller's
    /// own ask (its timeout, its route, its pool's buffer, its payload, its
    /// cancellation) would misreport this ask, so it becomes
    /// `HandlerFailed` with the handler's type name and message intact.
    ///
    /// A message that already reads as that code's error (a re-raised
    /// askpool error's text: `unavailable: node closed`) loses that prefix,
    /// so the caller reads it once, as a Rust handler's `?` gives it.
    pub fn from_handler(
        code: Option<ErrorCode>,
        type_name: impl Into<String>,
        message: impl Into<String>,
    ) -> Self {
        let message = message.into();
        let Some(code) = code.filter(|code| code.kept_from_handler()) else {
            return AskError::handler_failed(type_name, message);
        };
        let prefix = Self::of_message(code, String::new())
            .expect("a kept code")
            .to_string();
        let message = match message.strip_prefix(prefix.as_str()) {
            Some(bare) => bare.to_owned(),
            None => message,
        };
        Self::of_message(code, message).expect("a kept code")
    }

    /// The error of a code whose error is just a message (one
    /// [`kept_from_handler`](ErrorCode::kept_from_handler)) saying
    /// `message`, as given; `None` for any other code.
    pub fn of_message(code: ErrorCode, message: impl Into<String>) -> Option<Self> {
        let message = message.into();
        match code {
            ErrorCode::Unavailable => Some(AskError::Unavailable { reason: message }),
            ErrorCode::InvalidArgument => Some(AskError::InvalidArgument { message }),
            ErrorCode::ValidationError => Some(AskError::ValidationError { message }),
            ErrorCode::PermissionDenied => Some(AskError::PermissionDenied { message }),
            ErrorCode::FailedPrecondition => Some(AskError::FailedPrecondition { message }),
            ErrorCode::DecodeFailure => Some(AskError::DecodeFailure { message }),
            ErrorCode::Internal => Some(AskError::Internal { message }),
            _ => None,
        }
    }

    /// What a Rust handler's error becomes for its caller: the rule of
    /// [`from_handler`](Self::from_handler) for an `AskError` value, so a
    /// Rust handler reads as a Python, Node or Kotlin one. An error that
    /// describes an ask (an inner ask's timeout or route, passed on with
    /// `?`) becomes `HandlerFailed` (type `AskError::<code>`, its message):
    /// taken as is, it misreported the caller's own ask (timed out, dead
    /// letter, late reconciliation). `HandlerFailed`, the message-only codes
    /// and `AskCancelled { reason: Worker }` (a handler stopping on its
    /// request's cancel, as a Python `CancelledError` does) pass unchanged.
    pub fn from_handler_error(self) -> Self {
        match self {
            AskError::HandlerFailed { .. }
            | AskError::AskCancelled {
                reason: CancelReason::Worker,
            } => self,
            error if error.code().kept_from_handler() => error,
            error => {
                AskError::handler_failed(format!("AskError::{:?}", error.code()), error.to_string())
            }
        }
    }

    pub fn handler_failed(type_name: impl Into<String>, message: impl Into<String>) -> Self {
        AskError::HandlerFailed {
            type_name: type_name.into(),
            message: message.into(),
        }
    }

    /// The error a caller sees for a node that has shut down.
    pub fn node_closed() -> Self {
        Self::unavailable("node closed")
    }
}

/// What a handler produced: the reply, or the error that is the reply.
pub type Outcome<R> = Result<R, AskError>;

#[cfg(test)]
mod tests {
    #[test]
    fn a_handlers_failure_keeps_message_codes_and_wraps_the_rest() {
        use super::{AskError, ErrorCode};
        for code in ErrorCode::ALL {
            assert_eq!(ErrorCode::from_name(code.as_str()), Some(code));
            let e = AskError::from_handler(Some(code), "MyError", "upstream said no");
            if code.kept_from_handler() {
                assert_eq!(e.code(), code);
            } else {
                assert_eq!(e, AskError::handler_failed("MyError", "upstream said no"));
            }
            assert!(e.to_string().contains("upstream said no"), "{code:?}: {e}");
        }
        assert_eq!(ErrorCode::from_name("NOT_A_CODE"), None);
        assert_eq!(
            AskError::from_handler(None, "ValueError", "bad"),
            AskError::handler_failed("ValueError", "bad")
        );
    }

    #[test]
    fn a_re_raised_askpool_errors_text_reads_its_code_once() {
        use super::{AskError, ErrorCode};
        // What a binding's handler re-raising an inner ask's error passes:
        // the error's own text, which already carries the code's prefix.
        let inner = AskError::unavailable("node closed");
        let e = AskError::from_handler(Some(inner.code()), "UnavailableError", inner.to_string());
        assert_eq!(e, inner);
        assert_eq!(e.to_string(), "unavailable: node closed");
        let inner = AskError::InvalidArgument {
            message: "id 7: bad".into(),
        };
        let e = AskError::from_handler(Some(ErrorCode::InvalidArgument), "X", inner.to_string());
        assert_eq!(e, inner);
        // Only its own code's prefix, and once.
        let e = AskError::from_handler(Some(ErrorCode::Internal), "X", "unavailable: x");
        assert_eq!(e.to_string(), "internal error: unavailable: x");
    }

    use super::*;

    #[test]
    fn every_code_has_the_class_of_the_design() {
        use ErrorClass::*;
        let expected = |c: ErrorCode| match c {
            ErrorCode::Unavailable
            | ErrorCode::DeadlineExceeded
            | ErrorCode::AskTimeout
            | ErrorCode::BufferFull => Transient,
            ErrorCode::DecodeFailure => Poison,
            _ => Permanent,
        };
        for code in ErrorCode::ALL {
            assert_eq!(code.class(), expected(code), "{code}");
        }
    }

    #[test]
    fn code_sets_hold_exactly_what_was_put_in() {
        let set = CodeSet::of(&[ErrorCode::BufferFull, ErrorCode::Internal]);
        for code in ErrorCode::ALL {
            let expected = matches!(code, ErrorCode::BufferFull | ErrorCode::Internal);
            assert_eq!(set.contains(code), expected, "{code}");
        }
        assert!(!set
            .without(ErrorCode::Internal)
            .contains(ErrorCode::Internal));
        let transient = CodeSet::class(ErrorClass::Transient);
        assert_eq!(
            transient.iter().collect::<Vec<_>>(),
            ErrorCode::ALL
                .into_iter()
                .filter(|c| c.class() == ErrorClass::Transient)
                .collect::<Vec<_>>()
        );
    }

    #[test]
    fn error_codes_round_trip_through_errors() {
        let samples = [
            AskError::unavailable("x"),
            AskError::DeadlineExceeded,
            AskError::AskTimeout { elapsed_ms: 1 },
            AskError::BufferFull {
                pool: "p".into(),
                limit: 1,
            },
            AskError::NoRoute { pool: "p".into() },
            AskError::InvalidArgument {
                message: "m".into(),
            },
            AskError::ValidationError {
                message: "m".into(),
            },
            AskError::PayloadMismatch,
            AskError::PermissionDenied {
                message: "m".into(),
            },
            AskError::OversizePayload { size: 2, limit: 1 },
            AskError::FailedPrecondition {
                message: "m".into(),
            },
            AskError::DecodeFailure {
                message: "m".into(),
            },
            AskError::internal("m"),
            AskError::AskCancelled {
                reason: CancelReason::Caller,
            },
            AskError::handler_failed("ValueError", "bad"),
        ];
        let codes: Vec<ErrorCode> = samples.iter().map(AskError::code).collect();
        assert_eq!(codes, ErrorCode::ALL.to_vec());
        let names: std::collections::HashSet<&str> =
            ErrorCode::ALL.iter().map(|c| c.as_str()).collect();
        assert_eq!(names.len(), ErrorCode::ALL.len());
    }
}
