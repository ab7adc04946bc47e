//! The messages of the simulated workload and what a correct reply to each
//! is, so the checker can tell a right answer from a wrong one.

use std::time::Duration;

use askpool::{
    AskError, AskIds, CallerId, CausationId, CorrelationId, PayloadFingerprint, RequestId,
};

/// The message an ask carries. The caller draws the work time and whether
/// the handler fails, so handlers need no randomness of their own.
#[derive(Clone, Debug)]
pub struct Job {
    /// The ask's number in the history, so that a dead letter (which keeps
    /// the message) names the ask it came from. Not part of the payload:
    /// the fingerprint covers `payload` only.
    pub ask: usize,
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

/// The correlation and causation ids the workload gives the asks of
/// `request`, if it gives any: some request ids get an explicit correlation
/// id, some an explicit causation id, some both, some neither (the runtime's
/// defaults). Every ask of one request id gets the same ones, so every frame
/// of any of them must carry them.
pub fn explicit_ids(request: RequestId) -> (Option<CorrelationId>, Option<CausationId>) {
    let n = request.nonce();
    let tag = u128::from(request.time_micros()) << 64 | u128::from(n);
    let correlation = (n % 4 == 1 || n % 4 == 2)
        .then(|| CorrelationId::from_u128(tag ^ (0xc044_e1a7_u128 << 96)));
    let causation =
        (n % 4 == 2 || n % 4 == 3).then(|| CausationId::from_u128(tag ^ (0xca05_a710_u128 << 96)));
    (correlation, causation)
}

/// The ids every frame of an ask of `request` from `caller` must carry.
pub fn expected_ids(caller: CallerId, request: RequestId) -> AskIds {
    let (correlation, causation) = explicit_ids(request);
    let mut ids = AskIds::new(request, caller);
    if let Some(c) = correlation {
        ids.correlation_id = c;
    }
    ids.causation_id = causation;
    ids
}
