//! The retry policy's `retryable` codes decide what the caller re-sends.

use std::time::Duration;

use askpool_proto::{
    AskError, CallerAsk, CallerSend, CodeSet, ErrorClass, ErrorCode, Resolution, RetryPolicy,
    Timestamp,
};
use rand::rngs::SmallRng;
use rand::SeedableRng;

fn at(ms: u64) -> Timestamp {
    Timestamp::ZERO + Duration::from_millis(ms)
}

fn policy(retryable: CodeSet) -> RetryPolicy {
    RetryPolicy {
        max_attempts: 3,
        initial_delay: Duration::from_millis(100),
        jitter: 0.0,
        retryable,
        ..RetryPolicy::default()
    }
}

/// Starts an ask, feeds a refusal carrying `error` (a pool turned the
/// attempt away), and says whether the ask ended (`Some`) or scheduled a
/// re-send (`None`).
fn refused_with(retryable: CodeSet, error: AskError) -> Option<Resolution> {
    let mut rng = SmallRng::seed_from_u64(1);
    let mut ask = CallerAsk::new(policy(retryable), at(0), Duration::from_secs(10));
    ask.start(at(0), &mut rng);
    ask.on_sent();
    let step = ask.on_refused(at(1), &error, &mut rng);
    if step.resolution.is_none() {
        // The re-send comes at the backoff time, with the next attempt number.
        let resend = ask.on_timer(at(101), &mut rng);
        assert_eq!(resend.send, Some(CallerSend::Request { attempt: 2 }));
    }
    step.resolution
}

#[test]
fn default_policy_retries_the_transient_class() {
    assert_eq!(
        RetryPolicy::default().retryable,
        CodeSet::class(ErrorClass::Transient)
    );
    let transient = CodeSet::class(ErrorClass::Transient);
    assert_eq!(
        refused_with(
            transient,
            AskError::BufferFull {
                pool: "p".into(),
                limit: 1
            }
        ),
        None
    );
    assert_eq!(
        refused_with(transient, AskError::internal("x")),
        Some(Resolution::Replied)
    );
}

#[test]
fn a_configured_code_is_retried_and_a_removed_one_is_not() {
    let with_internal = CodeSet::class(ErrorClass::Transient).with(ErrorCode::Internal);
    assert_eq!(refused_with(with_internal, AskError::internal("x")), None);
    let nothing = CodeSet::EMPTY;
    assert_eq!(
        refused_with(
            nothing,
            AskError::BufferFull {
                pool: "p".into(),
                limit: 1
            }
        ),
        Some(Resolution::Replied)
    );
}

#[test]
fn a_send_failure_outside_the_set_fails_at_once() {
    let mut rng = SmallRng::seed_from_u64(1);
    let mut ask = CallerAsk::new(policy(CodeSet::EMPTY), at(0), Duration::from_secs(10));
    ask.start(at(0), &mut rng);
    let step = ask.on_send_failed(at(0), AskError::unavailable("down"), &mut rng);
    assert_eq!(
        step.resolution,
        Some(Resolution::Failed(AskError::unavailable("down")))
    );
}
