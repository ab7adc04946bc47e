//! The messages of the simulated workload and what a correct reply to each
//! is, so the checker can tell a right answer from a wrong one.

use std::time::Duration;

use askpool::{AskError, CallerId, PayloadFingerprint, RequestId};

/// The message an ask carries. The caller draws the work time and whether
/// the handler fails, so handlers need no randomness of their own.
#[derive(Clone, Debug)]
pub struct Job {
    pub payload: u64,
    pub work: Duration,
    pub fail: bool,
}

/// A handler's reply: the value computed from the payload, and the number
/// of the execution that computed it (a replay carries the original's).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Answer {
    pub value: u64,
    pub exec: u64,
}

/// The value a correct handler returns for `payload`.
pub fn expected_value(payload: u64) -> u64 {
    payload.wrapping_mul(0x9e37_79b9_7f4a_7c15).rotate_left(17) ^ 0x5bd1
}

/// The type name a failing simulated handler reports.
pub const HANDLER_ERROR_TYPE: &str = "SimulatedFailure";

/// The error a failing handler returns: it names its execution, so a
/// replayed error can be traced to the run that produced it.
pub fn handler_error(exec: u64) -> AskError {
    AskError::HandlerFailed {
        type_name: HANDLER_ERROR_TYPE.into(),
        message: format!("exec {exec}"),
    }
}

/// The execution a simulated handler error came from.
pub fn exec_of_error(error: &AskError) -> Option<u64> {
    match error {
        AskError::HandlerFailed { type_name, message } if type_name == HANDLER_ERROR_TYPE => {
            message.strip_prefix("exec ")?.parse().ok()
        }
        _ => None,
    }
}

/// The fingerprint of a payload: the same payload, the same fingerprint.
pub fn fingerprint(payload: u64) -> PayloadFingerprint {
    PayloadFingerprint::from_u128(u128::from(expected_value(payload)) << 64 | u128::from(payload))
}

/// A dedup key as the checker sees it: which pool, which caller, which id.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Key {
    pub pool: u32,
    pub caller: CallerId,
    pub request: RequestId,
}
