//! The caller table of `askpool_proto::caller` (module doc), cell by cell.
//!
//! Each case is a script of events with, after each one, the expected step
//! (send + resolution), phase and next wakeup. Times are milliseconds after
//! the ask was created; the policy has no jitter, so every time is exact:
//! re-sends 1 s, 2 s, 4 s (cap 5 s) after the previous send.

use std::time::Duration;

use askpool_proto::{
    AskError, CallerAsk, CallerPhase, CallerSend, CallerStep, CancelReason, ErrorClass, Resolution,
    RetryPolicy, Timestamp,
};
use rand::rngs::SmallRng;
use rand::SeedableRng;

/// The ask is created at 10 s on the driver's clock, not at zero, so a
/// confusion between "since creation" and "since the epoch" shows.
const T0_NANOS: u64 = 10_000_000_000;
/// Default timeout of the cases, in ms.
const D: u64 = 30_000;

fn at(ms: u64) -> Timestamp {
    Timestamp::from_nanos(T0_NANOS) + Duration::from_millis(ms)
}

fn policy(max_attempts: u32) -> RetryPolicy {
    RetryPolicy {
        max_attempts,
        initial_delay: Duration::from_secs(1),
        multiplier: 2.0,
        max_delay: Duration::from_secs(5),
        jitter: 0.0,
        ..RetryPolicy::default()
    }
}

fn rng() -> SmallRng {
    SmallRng::seed_from_u64(0x5eed)
}

fn buffer_full() -> AskError {
    AskError::BufferFull {
        pool: "pool".into(),
        limit: 4,
    }
}

fn unavailable() -> AskError {
    AskError::unavailable("link down")
}

fn no_route() -> AskError {
    AskError::NoRoute {
        pool: "pool".into(),
    }
}

fn handler_failed() -> AskError {
    AskError::handler_failed("ValueError", "bad")
}

fn timeout(elapsed_ms: u64) -> Resolution {
    Resolution::Failed(AskError::AskTimeout { elapsed_ms })
}

fn cancelled(reason: CancelReason) -> Resolution {
    Resolution::Failed(AskError::AskCancelled { reason })
}

#[derive(Clone, Debug)]
enum Op {
    Start(u64),
    /// The transport accepted the last send.
    Sent,
    SendFailed(u64, AskError),
    Ack,
    /// The outcome, its error if any (final whatever the error: cached).
    /// The error only names the cell: the machine does not look at it.
    Reply(u64, #[allow(dead_code)] Option<AskError>),
    /// The pool turned an attempt away with this error (nothing cached).
    Refused(u64, AskError),
    WorkerCancelled(CancelReason),
    Timer(u64),
    Cancel,
    Abort(AskError),
}

#[derive(Clone, Debug, PartialEq)]
struct Expect {
    step: CallerStep,
    phase: CallerPhase,
    /// ms, like the ops.
    wakeup: Option<u64>,
}

/// Nothing sent, nothing resolved.
fn quiet(phase: CallerPhase, wakeup: Option<u64>) -> Expect {
    Expect {
        step: CallerStep::default(),
        phase,
        wakeup,
    }
}

/// Sends the request with this attempt number; next wakeup at `wakeup` ms.
fn sends(attempt: u32, wakeup: u64) -> Expect {
    Expect {
        step: CallerStep {
            send: Some(CallerSend::Request { attempt }),
            resolution: None,
        },
        phase: CallerPhase::Unacked,
        wakeup: Some(wakeup),
    }
}

fn done(resolution: Resolution) -> Expect {
    Expect {
        step: CallerStep {
            send: None,
            resolution: Some(resolution),
        },
        phase: CallerPhase::Done,
        wakeup: None,
    }
}

fn done_and_cancel(resolution: Resolution, reason: CancelReason) -> Expect {
    Expect {
        step: CallerStep {
            send: Some(CallerSend::Cancel { reason }),
            resolution: Some(resolution),
        },
        phase: CallerPhase::Done,
        wakeup: None,
    }
}

struct Case {
    name: &'static str,
    max_attempts: u32,
    timeout_ms: u64,
    script: Vec<(Op, Expect)>,
}

fn case(name: &'static str, max_attempts: u32, timeout_ms: u64, script: Vec<(Op, Expect)>) -> Case {
    Case {
        name,
        max_attempts,
        timeout_ms,
        script,
    }
}

fn apply(ask: &mut CallerAsk, op: &Op, rng: &mut SmallRng) -> CallerStep {
    match op {
        Op::Start(ms) => ask.start(at(*ms), rng),
        Op::Sent => {
            ask.on_sent();
            CallerStep::default()
        }
        Op::SendFailed(ms, e) => ask.on_send_failed(at(*ms), e.clone(), rng),
        Op::Ack => {
            ask.on_ack();
            CallerStep::default()
        }
        Op::Reply(..) => ask.on_reply(),
        Op::Refused(ms, e) => ask.on_refused(at(*ms), e, rng),
        Op::WorkerCancelled(reason) => ask.on_cancelled(*reason),
        Op::Timer(ms) => ask.on_timer(at(*ms), rng),
        Op::Cancel => ask.cancel(),
        Op::Abort(e) => ask.abort(e.clone()),
    }
}

fn op_time(op: &Op) -> Option<u64> {
    match op {
        Op::Start(ms)
        | Op::SendFailed(ms, _)
        | Op::Reply(ms, _)
        | Op::Refused(ms, _)
        | Op::Timer(ms) => Some(*ms),
        _ => None,
    }
}

fn run(case: &Case) {
    let mut ask = CallerAsk::new(
        policy(case.max_attempts),
        at(0),
        Duration::from_millis(case.timeout_ms),
    );
    assert_eq!(
        ask.deadline(),
        at(case.timeout_ms),
        "[{}] deadline",
        case.name
    );
    assert_eq!(ask.phase(), CallerPhase::Idle, "[{}]", case.name);
    assert_eq!(
        ask.next_wakeup(),
        None,
        "[{}] wakeup before start",
        case.name
    );
    let mut rng = rng();
    for (i, (op, expect)) in case.script.iter().enumerate() {
        let step = apply(&mut ask, op, &mut rng);
        let got = Expect {
            step: step.clone(),
            phase: ask.phase(),
            wakeup: ask
                .next_wakeup()
                .map(|t| t.saturating_since(at(0)).as_millis() as u64),
        };
        assert_eq!(&got, expect, "[{}] op #{i} {op:?}", case.name);
        // The exact timestamp too (the ms conversion above could hide a
        // sub-millisecond offset).
        assert_eq!(
            ask.next_wakeup(),
            expect.wakeup.map(at),
            "[{}] op #{i} {op:?}: exact wakeup",
            case.name
        );
        assert_eq!(ask.is_done(), expect.phase == CallerPhase::Done);
        if let Some(CallerSend::Request { attempt }) = step.send {
            assert_eq!(attempt, ask.attempts_sent(), "[{}] op #{i}", case.name);
            let now = op_time(op).expect("a request is sent by start or a timer");
            assert!(
                now < case.timeout_ms,
                "[{}] op #{i}: request sent at {now} ms, deadline {} ms",
                case.name,
                case.timeout_ms
            );
        }
    }
}

fn cases() -> Vec<Case> {
    use CallerPhase::{Acked, Done, Idle, Unacked};
    vec![
        // ------------------------------------------------------------ Idle
        case(
            "Idle / events before start are ignored",
            4,
            D,
            vec![
                (Op::Ack, quiet(Idle, None)),
                (Op::Reply(0, None), quiet(Idle, None)),
                (Op::WorkerCancelled(CancelReason::Worker), quiet(Idle, None)),
                (Op::Timer(D), quiet(Idle, None)),
                (Op::SendFailed(0, no_route()), quiet(Idle, None)),
                (Op::Start(0), sends(1, 1_000)),
            ],
        ),
        case(
            "Idle / local cancel before start: Failed(Caller), nothing to cancel remotely",
            4,
            D,
            vec![
                (Op::Cancel, done(cancelled(CancelReason::Caller))),
                (Op::Start(0), quiet(Done, None)),
            ],
        ),
        // -------------------------------------------------- Unacked: start
        case(
            "Unacked / start: attempt 1 at once, first re-send after initial_delay",
            4,
            D,
            vec![(Op::Start(0), sends(1, 1_000))],
        ),
        case(
            "start twice: the second is a no-op",
            4,
            D,
            vec![
                (Op::Start(0), sends(1, 1_000)),
                (Op::Start(10), quiet(Unacked, Some(1_000))),
            ],
        ),
        case(
            "start with now == deadline fails at once with no send",
            4,
            1_000,
            vec![(Op::Start(1_000), done(timeout(1_000)))],
        ),
        case(
            "start with now > deadline fails at once with no send",
            4,
            1_000,
            vec![
                (Op::Start(5_000), done(timeout(5_000))),
                (Op::Timer(6_000), quiet(Done, None)),
            ],
        ),
        case(
            "start with a zero timeout fails at once with no send",
            4,
            0,
            vec![(Op::Start(0), done(timeout(0)))],
        ),
        // ---------------------------------------- Unacked: timer (re-send)
        case(
            "Unacked / timer: re-sends at backoff times, attempts 2..max, then only the deadline",
            4,
            D,
            vec![
                (Op::Start(0), sends(1, 1_000)),
                (Op::Sent, quiet(Unacked, Some(1_000))),
                (Op::Timer(1_000), sends(2, 3_000)),
                (Op::Sent, quiet(Unacked, Some(3_000))),
                (Op::Timer(3_000), sends(3, 7_000)),
                (Op::Timer(7_000), sends(4, D)),
                // max_attempts reached: a timer before the deadline sends nothing.
                (Op::Timer(12_000), quiet(Unacked, Some(D))),
                (
                    Op::Timer(D),
                    done_and_cancel(timeout(D), CancelReason::CallerTimeout),
                ),
            ],
        ),
        case(
            "Unacked / backoff is capped at max_delay",
            6,
            D,
            vec![
                (Op::Start(0), sends(1, 1_000)),
                (Op::Timer(1_000), sends(2, 3_000)),
                (Op::Timer(3_000), sends(3, 7_000)),
                (Op::Timer(7_000), sends(4, 12_000)),
                (Op::Timer(12_000), sends(5, 17_000)),
                (Op::Timer(17_000), sends(6, D)),
            ],
        ),
        case(
            "Unacked / timer before the re-send is due: nothing",
            4,
            D,
            vec![
                (Op::Start(0), sends(1, 1_000)),
                (Op::Timer(999), quiet(Unacked, Some(1_000))),
                (Op::Timer(1_000), sends(2, 3_000)),
            ],
        ),
        case(
            "Unacked / late timer: re-send, next one timed from when it fired",
            4,
            D,
            vec![
                (Op::Start(0), sends(1, 1_000)),
                (Op::Timer(1_500), sends(2, 3_500)),
            ],
        ),
        case(
            "max_attempts 1: no re-send at all, only the deadline",
            1,
            D,
            vec![
                (Op::Start(0), sends(1, D)),
                (Op::Timer(1_000), quiet(Unacked, Some(D))),
                (
                    Op::Timer(D),
                    done_and_cancel(timeout(D), CancelReason::CallerTimeout),
                ),
            ],
        ),
        // ------------------------------------------------- deadline limits
        case(
            "no re-send is scheduled exactly at the deadline (first re-send)",
            4,
            1_000,
            vec![
                (Op::Start(0), sends(1, 1_000)),
                (
                    Op::Timer(1_000),
                    done_and_cancel(timeout(1_000), CancelReason::CallerTimeout),
                ),
            ],
        ),
        case(
            "no re-send is scheduled exactly at the deadline (later re-send)",
            4,
            3_000,
            vec![
                (Op::Start(0), sends(1, 1_000)),
                (Op::Timer(1_000), sends(2, 3_000)),
                (
                    Op::Timer(3_000),
                    done_and_cancel(timeout(3_000), CancelReason::CallerTimeout),
                ),
            ],
        ),
        case(
            "a re-send 1 ms before the deadline is still made",
            4,
            3_001,
            vec![
                (Op::Start(0), sends(1, 1_000)),
                (Op::Timer(1_000), sends(2, 3_000)),
                (Op::Timer(3_000), sends(3, 3_001)),
                (
                    Op::Timer(3_001),
                    done_and_cancel(timeout(3_001), CancelReason::CallerTimeout),
                ),
            ],
        ),
        case(
            "Unacked / deadline with attempts left -> AskTimeout + Cancel(CallerTimeout)",
            4,
            D,
            vec![
                (Op::Start(0), sends(1, 1_000)),
                (
                    Op::Timer(D + 5),
                    done_and_cancel(timeout(D + 5), CancelReason::CallerTimeout),
                ),
            ],
        ),
        // ------------------------------------------------------ Unacked: Ack
        case(
            "Unacked / Ack -> Acked: re-sends stop, next wakeup is the deadline",
            4,
            D,
            vec![
                (Op::Start(0), sends(1, 1_000)),
                (Op::Ack, quiet(Acked, Some(D))),
                (Op::Timer(1_000), quiet(Acked, Some(D))),
                (Op::Timer(D - 1), quiet(Acked, Some(D))),
            ],
        ),
        case(
            "Unacked / Ack after a re-send stops the later ones",
            4,
            D,
            vec![
                (Op::Start(0), sends(1, 1_000)),
                (Op::Timer(1_000), sends(2, 3_000)),
                (Op::Ack, quiet(Acked, Some(D))),
                (Op::Timer(3_000), quiet(Acked, Some(D))),
                (Op::Timer(7_000), quiet(Acked, Some(D))),
            ],
        ),
        // ---------------------------------------------------- Unacked: Reply
        case(
            "Unacked / Reply(Ok) -> Done(Replied)",
            4,
            D,
            vec![
                (Op::Start(0), sends(1, 1_000)),
                (Op::Reply(500, None), done(Resolution::Replied)),
            ],
        ),
        case(
            "Unacked / permanent-error reply -> Replied at once (attempts left)",
            4,
            D,
            vec![
                (Op::Start(0), sends(1, 1_000)),
                (Op::Reply(500, Some(handler_failed())), done(Resolution::Replied)),
            ],
        ),
        case(
            "Unacked / transient-error reply (the handler's, cached) -> Replied at once, no re-send",
            4,
            D,
            vec![
                (Op::Start(0), sends(1, 1_000)),
                (Op::Reply(500, Some(unavailable())), done(Resolution::Replied)),
                (Op::Timer(1_000), quiet(Done, None)),
            ],
        ),
        case(
            "Unacked / permanent refusal (PayloadMismatch) -> Replied at once",
            4,
            D,
            vec![
                (Op::Start(0), sends(1, 1_000)),
                (Op::Refused(500, AskError::PayloadMismatch), done(Resolution::Replied)),
            ],
        ),
        case(
            "Unacked / poison-error reply -> Replied at once",
            4,
            D,
            vec![
                (Op::Start(0), sends(1, 1_000)),
                (
                    Op::Reply(
                        500,
                        Some(AskError::DecodeFailure {
                            message: "garbage".into(),
                        }),
                    ),
                    done(Resolution::Replied),
                ),
            ],
        ),
        case(
            "Unacked / transient refusal (BufferFull) with attempts and time left -> retried",
            4,
            D,
            vec![
                (Op::Start(0), sends(1, 1_000)),
                (Op::Refused(200, buffer_full()), quiet(Unacked, Some(1_200))),
                (Op::Timer(1_200), sends(2, 3_200)),
                (Op::Reply(3_300, None), done(Resolution::Replied)),
            ],
        ),
        case(
            "Unacked / transient refusal, attempts exhausted -> Replied",
            2,
            D,
            vec![
                (Op::Start(0), sends(1, 1_000)),
                (Op::Timer(1_000), sends(2, D)),
                (Op::Refused(1_100, buffer_full()), done(Resolution::Replied)),
            ],
        ),
        case(
            "Unacked / transient refusal, no time for another send -> Replied",
            4,
            1_500,
            vec![
                (Op::Start(0), sends(1, 1_000)),
                // 600 + 1000 >= 1500: the re-send would fall past the deadline.
                (Op::Refused(600, unavailable()), done(Resolution::Replied)),
            ],
        ),
        case(
            "Unacked / transient refusal whose re-send would land exactly on the deadline -> Replied",
            4,
            1_600,
            vec![
                (Op::Start(0), sends(1, 1_000)),
                // 600 + 1000 == 1600: at the deadline is too late.
                (Op::Refused(600, buffer_full()), done(Resolution::Replied)),
            ],
        ),
        case(
            "a refusal at the very instant of the deadline wins over it",
            4,
            D,
            vec![
                (Op::Start(0), sends(1, 1_000)),
                (Op::Refused(D, buffer_full()), done(Resolution::Replied)),
                (Op::Timer(D), quiet(Done, None)),
            ],
        ),
        // --------------------------------------------- Unacked: AskCancelled
        case(
            "Unacked / AskCancelled from the worker -> Failed(AskCancelled{reason})",
            4,
            D,
            vec![
                (Op::Start(0), sends(1, 1_000)),
                (
                    Op::WorkerCancelled(CancelReason::ProcessingTimeout),
                    done(cancelled(CancelReason::ProcessingTimeout)),
                ),
            ],
        ),
        // --------------------------------------------- Unacked: local cancel
        case(
            "Unacked / local cancel -> Failed(AskCancelled{Caller}) + Cancel frame",
            4,
            D,
            vec![
                (Op::Start(0), sends(1, 1_000)),
                (
                    Op::Cancel,
                    done_and_cancel(cancelled(CancelReason::Caller), CancelReason::Caller),
                ),
            ],
        ),
        case(
            "abort (node shut down) -> Failed(error), no frame",
            4,
            D,
            vec![
                (Op::Start(0), sends(1, 1_000)),
                (
                    Op::Abort(AskError::node_closed()),
                    done(Resolution::Failed(AskError::node_closed())),
                ),
            ],
        ),
        // ---------------------------------------------- Unacked: send failed
        case(
            "Unacked / send failed (transient), attempts left -> retry from the failure time",
            4,
            D,
            vec![
                (Op::Start(0), sends(1, 1_000)),
                (Op::SendFailed(100, unavailable()), quiet(Unacked, Some(1_100))),
                (Op::Timer(1_100), sends(2, 3_100)),
            ],
        ),
        case(
            "Unacked / send failed (permanent) -> Failed(error) at once",
            4,
            D,
            vec![
                (Op::Start(0), sends(1, 1_000)),
                (
                    Op::SendFailed(0, no_route()),
                    done(Resolution::Failed(no_route())),
                ),
            ],
        ),
        case(
            "Unacked / send failed (permanent) after an earlier delivered send -> Failed at once",
            4,
            D,
            vec![
                (Op::Start(0), sends(1, 1_000)),
                (Op::Sent, quiet(Unacked, Some(1_000))),
                (Op::Timer(1_000), sends(2, 3_000)),
                (
                    Op::SendFailed(1_000, no_route()),
                    done(Resolution::Failed(no_route())),
                ),
            ],
        ),
        case(
            "Unacked / send failed (transient), max_attempts 1, never delivered -> Failed",
            1,
            D,
            vec![
                (Op::Start(0), sends(1, D)),
                (
                    Op::SendFailed(0, buffer_full()),
                    done(Resolution::Failed(buffer_full())),
                ),
            ],
        ),
        case(
            "Unacked / every send failed (transient), attempts exhausted -> Failed",
            2,
            D,
            vec![
                (Op::Start(0), sends(1, 1_000)),
                (Op::SendFailed(0, unavailable()), quiet(Unacked, Some(1_000))),
                (Op::Timer(1_000), sends(2, D)),
                (
                    Op::SendFailed(1_000, unavailable()),
                    done(Resolution::Failed(unavailable())),
                ),
            ],
        ),
        case(
            "Unacked / send failed (transient), exhausted, earlier send delivered -> keep waiting",
            2,
            D,
            vec![
                (Op::Start(0), sends(1, 1_000)),
                (Op::Sent, quiet(Unacked, Some(1_000))),
                (Op::Timer(1_000), sends(2, D)),
                (Op::SendFailed(1_000, unavailable()), quiet(Unacked, Some(D))),
                (Op::Reply(2_000, None), done(Resolution::Replied)),
            ],
        ),
        case(
            "Unacked / exhausted transient send failure, delivered earlier, then the deadline",
            2,
            D,
            vec![
                (Op::Start(0), sends(1, 1_000)),
                (Op::Sent, quiet(Unacked, Some(1_000))),
                (Op::Timer(1_000), sends(2, D)),
                (Op::SendFailed(1_000, unavailable()), quiet(Unacked, Some(D))),
                (
                    Op::Timer(D),
                    done_and_cancel(timeout(D), CancelReason::CallerTimeout),
                ),
            ],
        ),
        case(
            "Unacked / send failed (transient), no time for a re-send, never delivered -> Failed",
            4,
            1_500,
            vec![
                (Op::Start(0), sends(1, 1_000)),
                (
                    Op::SendFailed(600, unavailable()),
                    done(Resolution::Failed(unavailable())),
                ),
            ],
        ),
        case(
            "Unacked / send failed (transient), re-send would land exactly on the deadline -> Failed",
            4,
            1_600,
            vec![
                (Op::Start(0), sends(1, 1_000)),
                (
                    Op::SendFailed(600, unavailable()),
                    done(Resolution::Failed(unavailable())),
                ),
            ],
        ),
        case(
            "Unacked / send failed (transient), no time for a re-send, delivered earlier -> wait",
            4,
            1_500,
            vec![
                (Op::Start(0), sends(1, 1_000)),
                (Op::Sent, quiet(Unacked, Some(1_000))),
                (Op::Timer(1_000), sends(2, 1_500)),
                (Op::SendFailed(1_000, unavailable()), quiet(Unacked, Some(1_500))),
                (
                    Op::Timer(1_500),
                    done_and_cancel(timeout(1_500), CancelReason::CallerTimeout),
                ),
            ],
        ),
        // ------------------------------------------------------------ Acked
        case(
            "Acked / Ack again: ignored",
            4,
            D,
            vec![
                (Op::Start(0), sends(1, 1_000)),
                (Op::Ack, quiet(Acked, Some(D))),
                (Op::Ack, quiet(Acked, Some(D))),
            ],
        ),
        case(
            "Acked / Reply(Ok) -> Replied",
            4,
            D,
            vec![
                (Op::Start(0), sends(1, 1_000)),
                (Op::Ack, quiet(Acked, Some(D))),
                (Op::Reply(5_000, None), done(Resolution::Replied)),
            ],
        ),
        case(
            "Acked / permanent-error reply -> Replied",
            4,
            D,
            vec![
                (Op::Start(0), sends(1, 1_000)),
                (Op::Ack, quiet(Acked, Some(D))),
                (Op::Reply(5_000, Some(handler_failed())), done(Resolution::Replied)),
            ],
        ),
        case(
            "Acked / transient-error reply (the handler's, cached) -> Replied, no re-send",
            4,
            D,
            vec![
                (Op::Start(0), sends(1, 1_000)),
                (Op::Ack, quiet(Acked, Some(D))),
                (Op::Reply(500, Some(unavailable())), done(Resolution::Replied)),
            ],
        ),
        case(
            "Acked / transient-error reply after the delivery deadline -> Replied, not DeadlineExceeded",
            4,
            D,
            vec![
                (Op::Start(0), sends(1, 1_000)),
                (Op::Ack, quiet(Acked, Some(D))),
                (Op::Reply(12_000, Some(unavailable())), done(Resolution::Replied)),
                (Op::Timer(12_000), quiet(Done, None)),
            ],
        ),
        case(
            "Acked / refusal (a late answer to an earlier attempt): ignored, the pool holds the request",
            4,
            D,
            vec![
                (Op::Start(0), sends(1, 1_000)),
                (Op::Ack, quiet(Acked, Some(D))),
                (Op::Refused(500, buffer_full()), quiet(Acked, Some(D))),
                (Op::Refused(600, AskError::PayloadMismatch), quiet(Acked, Some(D))),
                (Op::Timer(1_000), quiet(Acked, Some(D))),
                (Op::Reply(5_000, None), done(Resolution::Replied)),
            ],
        ),
        case(
            "Acked / refusal with attempts exhausted: ignored too",
            1,
            D,
            vec![
                (Op::Start(0), sends(1, D)),
                (Op::Ack, quiet(Acked, Some(D))),
                (Op::Refused(500, buffer_full()), quiet(Acked, Some(D))),
                (Op::Reply(700, None), done(Resolution::Replied)),
            ],
        ),
        case(
            "Acked / AskCancelled from the worker -> Failed(AskCancelled{reason})",
            4,
            D,
            vec![
                (Op::Start(0), sends(1, 1_000)),
                (Op::Ack, quiet(Acked, Some(D))),
                (
                    Op::WorkerCancelled(CancelReason::Shutdown),
                    done(cancelled(CancelReason::Shutdown)),
                ),
            ],
        ),
        case(
            "Acked / timer before the deadline: no re-send",
            4,
            D,
            vec![
                (Op::Start(0), sends(1, 1_000)),
                (Op::Ack, quiet(Acked, Some(D))),
                (Op::Timer(1_000), quiet(Acked, Some(D))),
                (Op::Timer(3_000), quiet(Acked, Some(D))),
            ],
        ),
        case(
            "Acked / deadline -> AskTimeout + Cancel(CallerTimeout)",
            4,
            D,
            vec![
                (Op::Start(0), sends(1, 1_000)),
                (Op::Ack, quiet(Acked, Some(D))),
                (
                    Op::Timer(D),
                    done_and_cancel(timeout(D), CancelReason::CallerTimeout),
                ),
            ],
        ),
        case(
            "Acked / local cancel -> Failed(AskCancelled{Caller}) + Cancel frame",
            4,
            D,
            vec![
                (Op::Start(0), sends(1, 1_000)),
                (Op::Ack, quiet(Acked, Some(D))),
                (
                    Op::Cancel,
                    done_and_cancel(cancelled(CancelReason::Caller), CancelReason::Caller),
                ),
            ],
        ),
        case(
            "Acked / send failed: ignored (transient and permanent)",
            4,
            D,
            vec![
                (Op::Start(0), sends(1, 1_000)),
                (Op::Ack, quiet(Acked, Some(D))),
                (Op::SendFailed(100, unavailable()), quiet(Acked, Some(D))),
                (Op::SendFailed(100, no_route()), quiet(Acked, Some(D))),
            ],
        ),
    ]
}

#[test]
fn every_cell_of_the_caller_table() {
    let cases = cases();
    let mut names = std::collections::HashSet::new();
    for case in &cases {
        assert!(names.insert(case.name), "duplicate case name {}", case.name);
        run(case);
    }
}

/// Ways an ask reaches Done, with the attempts sent by then.
fn to_done(how: &str) -> CallerAsk {
    let mut rng = rng();
    let mut ask = CallerAsk::new(policy(4), at(0), Duration::from_millis(D));
    if how == "start past deadline" {
        let s = ask.start(at(D), &mut rng);
        assert_eq!(s.resolution, Some(timeout(D)));
        return ask;
    }
    assert_eq!(
        ask.start(at(0), &mut rng).send,
        Some(CallerSend::Request { attempt: 1 })
    );
    let step = match how {
        "reply ok" | "reply permanent" => ask.on_reply(),
        "refused transient at deadline" => ask.on_refused(at(D), &buffer_full(), &mut rng),
        "worker cancelled" => ask.on_cancelled(CancelReason::Worker),
        "timeout" => ask.on_timer(at(D), &mut rng),
        "acked then timeout" => {
            ask.on_ack();
            ask.on_timer(at(D), &mut rng)
        }
        "local cancel" => ask.cancel(),
        "send failed permanent" => ask.on_send_failed(at(0), no_route(), &mut rng),
        "abort" => ask.abort(AskError::node_closed()),
        other => unreachable!("{other}"),
    };
    assert!(
        step.resolution.is_some(),
        "[{how}] did not resolve: {step:?}"
    );
    ask
}

#[test]
fn done_ignores_every_later_event() {
    let ways = [
        "start past deadline",
        "reply ok",
        "reply permanent",
        "refused transient at deadline",
        "worker cancelled",
        "timeout",
        "acked then timeout",
        "local cancel",
        "send failed permanent",
        "abort",
    ];
    let events: Vec<(&str, Op)> = vec![
        ("start", Op::Start(0)),
        ("ack", Op::Ack),
        ("sent", Op::Sent),
        ("duplicate reply ok", Op::Reply(20, None)),
        (
            "duplicate reply transient",
            Op::Reply(20, Some(buffer_full())),
        ),
        ("late refusal transient", Op::Refused(20, buffer_full())),
        (
            "duplicate reply permanent",
            Op::Reply(20, Some(handler_failed())),
        ),
        (
            "worker cancelled",
            Op::WorkerCancelled(CancelReason::Worker),
        ),
        ("timer at a re-send time", Op::Timer(1_000)),
        ("timer at the deadline", Op::Timer(D)),
        ("timer long after", Op::Timer(10 * D)),
        ("local cancel", Op::Cancel),
        ("send failed transient", Op::SendFailed(20, unavailable())),
        ("send failed permanent", Op::SendFailed(20, no_route())),
        ("abort", Op::Abort(AskError::internal("x"))),
    ];
    for how in ways {
        for (name, op) in &events {
            let mut ask = to_done(how);
            let attempts = ask.attempts_sent();
            assert!(ask.is_done(), "[{how}]");
            assert_eq!(ask.next_wakeup(), None, "[{how}] wakeup outlived the ask");
            let mut rng = rng();
            // Twice: a duplicate of the duplicate is ignored too.
            for _ in 0..2 {
                let step = apply(&mut ask, op, &mut rng);
                assert_eq!(step, CallerStep::default(), "[Done via {how}] / {name}");
                assert_eq!(ask.phase(), CallerPhase::Done, "[Done via {how}] / {name}");
                assert_eq!(ask.next_wakeup(), None, "[Done via {how}] / {name}");
                assert_eq!(ask.attempts_sent(), attempts, "[Done via {how}] / {name}");
            }
        }
    }
}

#[test]
fn transient_and_permanent_errors_used_here_are_classed_as_assumed() {
    // The cases above rely on these classes; if the taxonomy changes, this
    // names the reason instead of a confusing table failure.
    for e in [buffer_full(), unavailable()] {
        assert_eq!(e.class(), ErrorClass::Transient, "{e:?}");
    }
    for e in [no_route(), handler_failed()] {
        assert_eq!(e.class(), ErrorClass::Permanent, "{e:?}");
    }
}

/// With jitter, every re-send stays within `[1 - j, 1 + j)` of its backoff,
/// stays before the deadline, and a seed fixes the whole schedule.
#[test]
fn jittered_schedule_is_bounded_and_seeded() {
    let run = |seed: u64, timeout: Duration| -> Vec<(Timestamp, u32)> {
        let policy = RetryPolicy {
            max_attempts: 8,
            ..RetryPolicy::default()
        };
        let mut rng = SmallRng::seed_from_u64(seed);
        let mut ask = CallerAsk::new(policy, at(0), timeout);
        let mut sends = Vec::new();
        let first = ask.start(at(0), &mut rng);
        sends.push((
            at(0),
            match first.send {
                Some(CallerSend::Request { attempt }) => attempt,
                other => panic!("start sent {other:?}"),
            },
        ));
        loop {
            let now = ask.next_wakeup().expect("pending until resolved");
            let step = ask.on_timer(now, &mut rng);
            match (step.send, step.resolution) {
                (Some(CallerSend::Request { attempt }), None) => sends.push((now, attempt)),
                (Some(CallerSend::Cancel { .. }), Some(_)) => {
                    assert_eq!(now, ask.deadline());
                    break;
                }
                other => panic!("unexpected timer step {other:?}"),
            }
        }
        sends
    };
    let policy = RetryPolicy::default();
    let long = Duration::from_secs(60);
    for seed in 0..50 {
        let sends = run(seed, long);
        assert_eq!(sends, run(seed, long), "seed {seed} not reproducible");
        assert_eq!(sends.len(), 8, "seed {seed}: {sends:?}");
        for (i, pair) in sends.windows(2).enumerate() {
            let (t0, a0) = pair[0];
            let (t1, a1) = pair[1];
            assert_eq!(a1, a0 + 1, "seed {seed}");
            assert_eq!(a1 as usize, i + 2);
            let gap = t1.saturating_since(t0).as_secs_f64();
            let base = policy.base_delay(a1).as_secs_f64();
            let (lo, hi) = (base * (1.0 - policy.jitter), base * (1.0 + policy.jitter));
            assert!(
                gap >= lo - 1e-6 && gap < hi + 1e-6,
                "seed {seed}: gap before attempt {a1} is {gap}, expected [{lo}, {hi})"
            );
        }
        // With a short timeout no send is at or past the deadline.
        let short = Duration::from_millis(4_500);
        for (t, _) in run(seed, short) {
            assert!(t < at(4_500), "seed {seed}: send at {t:?}");
        }
    }
}
