//! The error taxonomy as the generated code sees it, in both directions
//! (outcomes to Kotlin, handler failures from Kotlin).

use askpool::{AskError, CancelReason};

#[derive(Clone, Copy, Debug, PartialEq, Eq, uniffi::Enum)]
pub enum CancelCause {
    Caller,
    CallerTimeout,
    Worker,
    ProcessingTimeout,
    Shutdown,
}

impl From<CancelReason> for CancelCause {
    fn from(r: CancelReason) -> Self {
        match r {
            CancelReason::Caller => CancelCause::Caller,
            CancelReason::CallerTimeout => CancelCause::CallerTimeout,
            CancelReason::Worker => CancelCause::Worker,
            CancelReason::ProcessingTimeout => CancelCause::ProcessingTimeout,
            CancelReason::Shutdown => CancelCause::Shutdown,
        }
    }
}

impl From<CancelCause> for CancelReason {
    fn from(c: CancelCause) -> Self {
        match c {
            CancelCause::Caller => CancelReason::Caller,
            CancelCause::CallerTimeout => CancelReason::CallerTimeout,
            CancelCause::Worker => CancelReason::Worker,
            CancelCause::ProcessingTimeout => CancelReason::ProcessingTimeout,
            CancelCause::Shutdown => CancelReason::Shutdown,
        }
    }
}

/// One variant per code of the taxonomy, with the same fields.
#[derive(Clone, Debug, PartialEq, uniffi::Enum)]
pub enum Fault {
    Unavailable { reason: String },
    DeadlineExceeded,
    AskTimeout { elapsed_ms: u64 },
    BufferFull { pool: String, limit: u64 },
    NoRoute { pool: String },
    InvalidArgument { message: String },
    ValidationError { message: String },
    PayloadMismatch,
    PermissionDenied { message: String },
    OversizePayload { size: u64, limit: u64 },
    FailedPrecondition { message: String },
    DecodeFailure { message: String },
    Internal { message: String },
    AskCancelled { reason: CancelCause },
    HandlerFailed { type_name: String, message: String },
}

/// A failed outcome: the fault, its class and the runtime's message.
#[derive(Clone, Debug, uniffi::Record)]
pub struct Failure {
    pub fault: Fault,
    /// `TRANSIENT`, `PERMANENT` or `POISON`.
    pub class: String,
    pub message: String,
}

/// What a synchronous call of this crate fails with.
#[derive(Debug, thiserror::Error, uniffi::Error)]
pub enum NativeError {
    #[error("{}", failure.message)]
    Ask { failure: Failure },
}

impl From<AskError> for NativeError {
    fn from(e: AskError) -> Self {
        NativeError::Ask {
            failure: Failure::from(&e),
        }
    }
}

impl From<&AskError> for Failure {
    fn from(e: &AskError) -> Self {
        use AskError as E;
        let fault = match e.clone() {
            E::Unavailable { reason } => Fault::Unavailable { reason },
            E::DeadlineExceeded => Fault::DeadlineExceeded,
            E::AskTimeout { elapsed_ms } => Fault::AskTimeout { elapsed_ms },
            E::BufferFull { pool, limit } => Fault::BufferFull {
                pool,
                limit: limit as u64,
            },
            E::NoRoute { pool } => Fault::NoRoute { pool },
            E::InvalidArgument { message } => Fault::InvalidArgument { message },
            E::ValidationError { message } => Fault::ValidationError { message },
            E::PayloadMismatch => Fault::PayloadMismatch,
            E::PermissionDenied { message } => Fault::PermissionDenied { message },
            E::OversizePayload { size, limit } => Fault::OversizePayload {
                size: size as u64,
                limit: limit as u64,
            },
            E::FailedPrecondition { message } => Fault::FailedPrecondition { message },
            E::DecodeFailure { message } => Fault::DecodeFailure { message },
            E::Internal { message } => Fault::Internal { message },
            E::AskCancelled { reason } => Fault::AskCancelled {
                reason: reason.into(),
            },
            E::HandlerFailed { type_name, message } => Fault::HandlerFailed { type_name, message },
        };
        Failure {
            fault,
            class: format!("{:?}", e.class()).to_uppercase(),
            message: e.to_string(),
        }
    }
}

impl From<Fault> for AskError {
    fn from(f: Fault) -> Self {
        use AskError as E;
        let usize_of = |n: u64| usize::try_from(n).unwrap_or(usize::MAX);
        match f {
            Fault::Unavailable { reason } => E::Unavailable { reason },
            Fault::DeadlineExceeded => E::DeadlineExceeded,
            Fault::AskTimeout { elapsed_ms } => E::AskTimeout { elapsed_ms },
            Fault::BufferFull { pool, limit } => E::BufferFull {
                pool,
                limit: usize_of(limit),
            },
            Fault::NoRoute { pool } => E::NoRoute { pool },
            Fault::InvalidArgument { message } => E::InvalidArgument { message },
            Fault::ValidationError { message } => E::ValidationError { message },
            Fault::PayloadMismatch => E::PayloadMismatch,
            Fault::PermissionDenied { message } => E::PermissionDenied { message },
            Fault::OversizePayload { size, limit } => E::OversizePayload {
                size: usize_of(size),
                limit: usize_of(limit),
            },
            Fault::FailedPrecondition { message } => E::FailedPrecondition { message },
            Fault::DecodeFailure { message } => E::DecodeFailure { message },
            Fault::Internal { message } => E::Internal { message },
            Fault::AskCancelled { reason } => E::AskCancelled {
                reason: reason.into(),
            },
            Fault::HandlerFailed { type_name, message } => E::HandlerFailed { type_name, message },
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use askpool::ErrorCode;

    fn samples() -> Vec<AskError> {
        let s = || "x".to_string();
        vec![
            AskError::Unavailable { reason: s() },
            AskError::DeadlineExceeded,
            AskError::AskTimeout { elapsed_ms: 7 },
            AskError::BufferFull {
                pool: s(),
                limit: 3,
            },
            AskError::NoRoute { pool: s() },
            AskError::InvalidArgument { message: s() },
            AskError::ValidationError { message: s() },
            AskError::PayloadMismatch,
            AskError::PermissionDenied { message: s() },
            AskError::OversizePayload { size: 9, limit: 4 },
            AskError::FailedPrecondition { message: s() },
            AskError::DecodeFailure { message: s() },
            AskError::Internal { message: s() },
            AskError::AskCancelled {
                reason: CancelReason::ProcessingTimeout,
            },
            AskError::HandlerFailed {
                type_name: "T".into(),
                message: s(),
            },
        ]
    }

    #[test]
    fn every_code_survives_the_round_trip() {
        let errors = samples();
        let codes: Vec<ErrorCode> = errors.iter().map(AskError::code).collect();
        assert_eq!(codes, ErrorCode::ALL.to_vec());
        for e in errors {
            let failure = Failure::from(&e);
            assert_eq!(failure.message, e.to_string());
            assert_eq!(failure.class, format!("{:?}", e.class()).to_uppercase());
            assert_eq!(AskError::from(failure.fault), e);
        }
    }
}
