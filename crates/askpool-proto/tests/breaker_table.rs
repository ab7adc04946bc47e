//! The circuit breaker of `askpool_proto::breaker` (module doc), as scripts:
//! each case is a list of steps with the expected answer of each, plus the
//! config rules and a property test against a small independent model.
//!
//! Times are milliseconds after T0 = 100 s on the driver's clock. The cases'
//! window is 10 s in 10 buckets of 1 s, aligned on the clock's epoch, so
//! bucket boundaries fall on whole seconds after T0.

use std::time::Duration;

use askpool_proto::breaker::{counts_as_failure, MAX_BUCKETS};
use askpool_proto::{
    AskError, BreakerConfig, BreakerPermit, BreakerState, BreakerStep, BreakerTransition,
    CircuitBreaker, CodeSet, ErrorClass, ErrorCode, Recorded, Timestamp, WindowCounts,
};
use proptest::prelude::*;

use BreakerState::{Closed, HalfOpen, Open};

const T0_MS: u64 = 100_000;
const POOL: &str = "orders";

fn at(ms: u64) -> Timestamp {
    Timestamp::from_duration(Duration::from_millis(T0_MS + ms))
}

/// 10 s / 10 buckets, 4 requests minimum, 50 %, open 5 s, 2 probes.
fn config() -> BreakerConfig {
    BreakerConfig {
        window: Duration::from_secs(10),
        buckets: 10,
        min_requests: 4,
        failure_rate: 0.5,
        open_for: Duration::from_secs(5),
        half_open_probes: 2,
        open_on: CodeSet::EMPTY,
    }
}

fn tr(from: BreakerState, to: BreakerState) -> Option<BreakerTransition> {
    Some(BreakerTransition { from, to })
}

const I: ErrorCode = ErrorCode::Internal;

/// One step of a script and what it must answer.
#[derive(Clone, Debug)]
enum Step {
    /// `try_acquire` at t must give a permit, kept under this name.
    Admit(u64, &'static str),
    /// `try_acquire` at t must fail fast with `Unavailable` whose reason
    /// contains the text.
    Refuse(u64, &'static str),
    /// `on_success` of the named permit at t.
    Succeed(u64, &'static str, Recorded, Option<BreakerTransition>),
    /// `on_failure` of the named permit at t with a code.
    Fail(
        u64,
        &'static str,
        ErrorCode,
        Recorded,
        Option<BreakerTransition>,
    ),
    /// `release` of the named permit.
    Release(&'static str, Recorded),
    /// n requests admitted and succeeded at t, none changing the state.
    Successes(u64, u32),
    /// n requests admitted and failed at t with a code, recorded as `Failure`,
    /// none changing the state.
    Failures(u64, u32, ErrorCode),
    /// `state(t)`.
    State(u64, BreakerState),
    /// `window_counts(t)`: requests, failures.
    Window(u64, u32, u32),
    /// `open_until()`, in ms after T0.
    OpenUntil(Option<u64>),
    /// `probes_in_flight()`, `probe_successes()`.
    Probes(u32, u32),
    /// `trips()`, `rejections()`, `stale_outcomes()`.
    Counters(u64, u64, u64),
}

use Step::*;

struct Case {
    name: &'static str,
    config: BreakerConfig,
    script: Vec<Step>,
}

fn case(name: &'static str, config: BreakerConfig, script: Vec<Step>) -> Case {
    Case {
        name,
        config,
        script,
    }
}

fn step(recorded: Recorded, transition: Option<BreakerTransition>) -> BreakerStep {
    BreakerStep {
        recorded,
        transition,
    }
}

fn run(case: &Case) {
    let name = case.name;
    let mut b = CircuitBreaker::new(POOL, case.config).unwrap();
    assert_eq!(b.pool().as_str(), POOL);
    assert_eq!(b.state(at(0)), Closed, "[{name}] starts closed");
    let mut permits: Vec<(&'static str, BreakerPermit)> = Vec::new();
    let take = |permits: &mut Vec<(&'static str, BreakerPermit)>, id: &str, i: usize| {
        let pos = permits
            .iter()
            .position(|(n, _)| *n == id)
            .unwrap_or_else(|| panic!("[{name}] step {i}: no permit {id:?}"));
        permits.remove(pos).1
    };
    for (i, s) in case.script.iter().enumerate() {
        let ctx = format!("[{name}] step {i}: {s:?}");
        match s {
            Admit(t, id) => {
                let p = b
                    .try_acquire(at(*t))
                    .unwrap_or_else(|e| panic!("{ctx}: {e}"));
                assert_eq!(p.generation(), b.generation(), "{ctx}");
                assert_eq!(p.is_probe(), b.state(at(*t)) == HalfOpen, "{ctx}");
                permits.push((id, p));
            }
            Refuse(t, text) => match b.try_acquire(at(*t)) {
                Err(AskError::Unavailable { reason }) => {
                    assert!(reason.contains(text), "{ctx}: reason {reason:?}");
                    assert!(
                        reason.contains(&format!("pool {POOL:?}")),
                        "{ctx}: {reason:?}"
                    );
                }
                other => panic!("{ctx}: got {other:?}"),
            },
            Succeed(t, id, rec, transition) => {
                let p = take(&mut permits, id, i);
                assert_eq!(b.on_success(p, at(*t)), step(*rec, *transition), "{ctx}");
            }
            Fail(t, id, code, rec, transition) => {
                let p = take(&mut permits, id, i);
                assert_eq!(
                    b.on_failure(p, *code, at(*t)),
                    step(*rec, *transition),
                    "{ctx}"
                );
            }
            Release(id, rec) => {
                let p = take(&mut permits, id, i);
                assert_eq!(b.release(p), step(*rec, None), "{ctx}");
            }
            Successes(t, n) => {
                for _ in 0..*n {
                    let p = b
                        .try_acquire(at(*t))
                        .unwrap_or_else(|e| panic!("{ctx}: {e}"));
                    assert_eq!(
                        b.on_success(p, at(*t)),
                        step(Recorded::Success, None),
                        "{ctx}"
                    );
                }
            }
            Failures(t, n, code) => {
                for _ in 0..*n {
                    let p = b
                        .try_acquire(at(*t))
                        .unwrap_or_else(|e| panic!("{ctx}: {e}"));
                    assert_eq!(
                        b.on_failure(p, *code, at(*t)),
                        step(Recorded::Failure, None),
                        "{ctx}"
                    );
                }
            }
            State(t, want) => assert_eq!(b.state(at(*t)), *want, "{ctx}"),
            Window(t, requests, failures) => assert_eq!(
                b.window_counts(at(*t)),
                WindowCounts {
                    requests: *requests,
                    failures: *failures
                },
                "{ctx}"
            ),
            OpenUntil(t) => assert_eq!(b.open_until(), t.map(at), "{ctx}"),
            Probes(in_flight, successes) => {
                assert_eq!(b.probes_in_flight(), *in_flight, "{ctx}");
                assert_eq!(b.probe_successes(), *successes, "{ctx}");
            }
            Counters(trips, rejections, stale) => {
                assert_eq!(b.trips(), *trips, "{ctx} trips");
                assert_eq!(b.rejections(), *rejections, "{ctx} rejections");
                assert_eq!(b.stale_outcomes(), *stale, "{ctx} stale");
            }
        }
    }
}

/// Trips the `config()` breaker at t: 4 failures at once.
fn trip_at(t: u64) -> Vec<Step> {
    vec![
        Failures(t, 3, I),
        Admit(t, "tripper"),
        Fail(t, "tripper", I, Recorded::Failure, tr(Closed, Open)),
        State(t, Open),
        OpenUntil(Some(t + 5_000)),
    ]
}

fn script(parts: Vec<Vec<Step>>) -> Vec<Step> {
    parts.into_iter().flatten().collect()
}

fn cases() -> Vec<Case> {
    vec![
        case(
            "closed -> open when the failure rate reaches the threshold",
            config(),
            vec![
                Successes(0, 2),
                Failures(100, 1, I),
                Window(100, 3, 1),
                Admit(200, "a"),
                // 4 requests, 2 failures: 50 % >= 50 %.
                Fail(
                    200,
                    "a",
                    ErrorCode::AskTimeout,
                    Recorded::Failure,
                    tr(Closed, Open),
                ),
                State(200, Open),
                OpenUntil(Some(5_200)),
                Counters(1, 0, 0),
                // Opening resets the window.
                Window(200, 0, 0),
            ],
        ),
        case(
            "a rate below the threshold does not trip",
            config(),
            vec![
                Successes(0, 6),
                Failures(0, 5, ErrorCode::BufferFull),
                // 5 / 11 < 50 %.
                Window(0, 11, 5),
                State(0, Closed),
                Admit(0, "x"),
                // 6 / 12 = 50 %.
                Fail(
                    0,
                    "x",
                    ErrorCode::Unavailable,
                    Recorded::Failure,
                    tr(Closed, Open),
                ),
            ],
        ),
        case(
            "successes never trip, however many",
            config(),
            vec![Successes(0, 100), Window(0, 100, 0), State(0, Closed)],
        ),
        case(
            "no trip below min_requests, even at 100 % failures",
            config(),
            vec![
                Failures(0, 3, ErrorCode::DecodeFailure),
                Window(0, 3, 3),
                State(0, Closed),
                Admit(1, "fourth"),
                Fail(
                    1,
                    "fourth",
                    ErrorCode::HandlerFailed,
                    Recorded::Failure,
                    tr(Closed, Open),
                ),
            ],
        ),
        case(
            "a code in open_on opens at once, below min_requests",
            BreakerConfig {
                open_on: CodeSet::of(&[ErrorCode::Unavailable]),
                ..config()
            },
            vec![
                Successes(0, 1),
                Admit(0, "a"),
                Fail(
                    0,
                    "a",
                    ErrorCode::Unavailable,
                    Recorded::Failure,
                    tr(Closed, Open),
                ),
                OpenUntil(Some(5_000)),
                Counters(1, 0, 0),
            ],
        ),
        case(
            "open_on wins over the not-counted classification",
            BreakerConfig {
                open_on: CodeSet::of(&[ErrorCode::PermissionDenied]),
                ..config()
            },
            vec![
                Admit(0, "a"),
                Fail(
                    0,
                    "a",
                    ErrorCode::InvalidArgument,
                    Recorded::NotCounted,
                    None,
                ),
                Admit(0, "b"),
                Fail(
                    0,
                    "b",
                    ErrorCode::PermissionDenied,
                    Recorded::Failure,
                    tr(Closed, Open),
                ),
            ],
        ),
        case(
            "caller-side permanent errors and cancels do not count",
            config(),
            vec![
                Failures(0, 1, I),
                Admit(0, "a"),
                Fail(
                    0,
                    "a",
                    ErrorCode::InvalidArgument,
                    Recorded::NotCounted,
                    None,
                ),
                Admit(0, "b"),
                Fail(
                    0,
                    "b",
                    ErrorCode::PayloadMismatch,
                    Recorded::NotCounted,
                    None,
                ),
                Admit(0, "c"),
                Fail(0, "c", ErrorCode::NoRoute, Recorded::NotCounted, None),
                Admit(0, "d"),
                Fail(0, "d", ErrorCode::AskCancelled, Recorded::NotCounted, None),
                Admit(0, "e"),
                Release("e", Recorded::NotCounted),
                // Neither successes nor failures: the window still has 1/1.
                Window(0, 1, 1),
                State(0, Closed),
            ],
        ),
        case(
            "open fails fast with Unavailable until `until`, then half-opens lazily",
            config(),
            script(vec![
                trip_at(0),
                vec![
                    Refuse(0, "circuit open for pool \"orders\" (half-open in 5000 ms)"),
                    Refuse(1, "circuit open"),
                    Refuse(4_999, "(half-open in 1 ms)"),
                    State(4_999, Open),
                    Counters(1, 3, 0),
                    // state() reports the lapse before any try_acquire.
                    State(5_000, HalfOpen),
                    OpenUntil(Some(5_000)),
                    Admit(5_000, "probe"),
                    OpenUntil(None),
                    Probes(1, 0),
                ],
            ]),
        ),
        case(
            "half-open lets at most half_open_probes through at once",
            config(),
            script(vec![
                trip_at(0),
                vec![
                    Admit(6_000, "p1"),
                    Admit(6_000, "p2"),
                    Probes(2, 0),
                    Refuse(
                        6_000,
                        "circuit half-open for pool \"orders\": all 2 probes in flight",
                    ),
                    Refuse(9_000, "half-open"),
                    // A release frees a slot but is no success.
                    Release("p1", Recorded::NotCounted),
                    Probes(1, 0),
                    Admit(9_000, "p3"),
                    Refuse(9_000, "half-open"),
                    // So does a not-counted error.
                    Fail(
                        9_001,
                        "p3",
                        ErrorCode::ValidationError,
                        Recorded::NotCounted,
                        None,
                    ),
                    Probes(1, 0),
                    State(9_001, HalfOpen),
                    Counters(1, 3, 0),
                ],
            ]),
        ),
        case(
            "half-open closes after half_open_probes successes, with a fresh window",
            config(),
            script(vec![
                trip_at(0),
                vec![
                    Admit(5_000, "p1"),
                    Admit(5_000, "p2"),
                    Succeed(5_100, "p1", Recorded::Success, None),
                    Probes(1, 1),
                    Admit(5_100, "p3"),
                    Succeed(5_200, "p2", Recorded::Success, tr(HalfOpen, Closed)),
                    State(5_200, Closed),
                    Probes(0, 0),
                    Window(5_200, 0, 0),
                    // p3 belongs to the finished half-open round.
                    Succeed(5_300, "p3", Recorded::Stale, None),
                    Window(5_300, 0, 0),
                    Counters(1, 0, 1),
                    // Closed again: 3 failures do not trip (min 4).
                    Failures(5_400, 3, I),
                    State(5_400, Closed),
                ],
            ]),
        ),
        case(
            "a half-open failure re-opens for open_for again",
            config(),
            script(vec![
                trip_at(0),
                vec![
                    Admit(7_000, "p1"),
                    Admit(7_000, "p2"),
                    Succeed(7_000, "p1", Recorded::Success, None),
                    Fail(
                        7_500,
                        "p2",
                        ErrorCode::AskTimeout,
                        Recorded::Failure,
                        tr(HalfOpen, Open),
                    ),
                    OpenUntil(Some(12_500)),
                    Counters(2, 0, 0),
                    Refuse(12_499, "circuit open"),
                    Admit(12_500, "p3"),
                    // The success of the earlier round is not carried over.
                    Probes(1, 0),
                ],
            ]),
        ),
        case(
            "an open_on code in half-open re-opens too",
            BreakerConfig {
                open_on: CodeSet::of(&[ErrorCode::FailedPrecondition]),
                ..config()
            },
            script(vec![
                trip_at(0),
                vec![
                    Admit(5_000, "p"),
                    Fail(
                        5_000,
                        "p",
                        ErrorCode::FailedPrecondition,
                        Recorded::Failure,
                        tr(HalfOpen, Open),
                    ),
                    OpenUntil(Some(10_000)),
                ],
            ]),
        ),
        case(
            "the window slides: a whole bucket ages out at once",
            config(),
            vec![
                Failures(0, 3, I),
                Window(9_999, 3, 3),
                // 10 s later the bucket of t=0 has left the window.
                Window(10_000, 0, 0),
                Admit(10_000, "a"),
                Fail(10_000, "a", I, Recorded::Failure, None),
                Window(10_000, 1, 1),
                State(10_000, Closed),
            ],
        ),
        case(
            "the window slides bucket by bucket",
            config(),
            vec![
                Failures(0, 1, I),
                Failures(3_000, 1, I),
                Failures(6_000, 1, I),
                // Buckets 1..=10 s: the failure at 0 has aged out.
                Window(10_500, 2, 2),
                Failures(10_500, 1, I),
                Window(12_999, 3, 3),
                Admit(12_999, "a"),
                // 3 000, 6 000, 10 500, 12 999: four failures in the window.
                Fail(12_999, "a", I, Recorded::Failure, tr(Closed, Open)),
            ],
        ),
        case(
            "old successes age out too, raising the rate",
            config(),
            vec![
                Successes(0, 10),
                Failures(5_000, 3, I),
                Window(5_000, 13, 3),
                Window(10_000, 3, 3),
                Admit(10_000, "a"),
                Fail(10_000, "a", I, Recorded::Failure, tr(Closed, Open)),
            ],
        ),
        case(
            "stale permits are ignored in every later state",
            config(),
            vec![
                Admit(0, "old1"),
                Admit(0, "old2"),
                Admit(0, "old3"),
                Admit(0, "old4"),
                Failures(0, 3, I),
                Admit(0, "tripper"),
                Fail(0, "tripper", I, Recorded::Failure, tr(Closed, Open)),
                // While open.
                Fail(1_000, "old1", I, Recorded::Stale, None),
                OpenUntil(Some(5_000)),
                // While half-open: no slot freed, no success counted.
                Admit(5_000, "p1"),
                Admit(5_000, "p2"),
                Succeed(5_000, "old2", Recorded::Stale, None),
                Probes(2, 0),
                Refuse(5_000, "half-open"),
                Fail(5_000, "old3", I, Recorded::Stale, None),
                State(5_000, HalfOpen),
                Release("old4", Recorded::Stale),
                Probes(2, 0),
                Counters(1, 1, 4),
                // A probe of a round that was re-opened is stale in the next.
                Fail(5_100, "p1", I, Recorded::Failure, tr(HalfOpen, Open)),
                Admit(10_100, "q1"),
                Succeed(10_100, "p2", Recorded::Stale, None),
                Probes(1, 0),
                Succeed(10_200, "q1", Recorded::Success, None),
                Probes(0, 1),
                Counters(2, 1, 5),
            ],
        ),
        case(
            "a clock that goes backwards is held at its latest reading",
            config(),
            script(vec![
                trip_at(3_000),
                vec![
                    // Earlier than the trip: still open, still measured from 3 s.
                    Refuse(0, "(half-open in 5000 ms)"),
                    State(0, Open),
                ],
            ]),
        ),
    ]
}

#[test]
fn breaker_scripts() {
    let cases = cases();
    assert!(cases.len() >= 15);
    for c in &cases {
        run(c);
    }
}

#[test]
fn every_code_counts_as_documented() {
    for code in ErrorCode::ALL {
        let expected = match code {
            ErrorCode::NoRoute
            | ErrorCode::InvalidArgument
            | ErrorCode::ValidationError
            | ErrorCode::PayloadMismatch
            | ErrorCode::PermissionDenied
            | ErrorCode::OversizePayload
            | ErrorCode::FailedPrecondition
            | ErrorCode::AskCancelled => false,
            ErrorCode::AskTimeout
            | ErrorCode::DeadlineExceeded
            | ErrorCode::Unavailable
            | ErrorCode::BufferFull
            | ErrorCode::DecodeFailure
            | ErrorCode::Internal
            | ErrorCode::HandlerFailed => true,
        };
        assert_eq!(counts_as_failure(code), expected, "{code}");
        // Every Transient and Poison code counts.
        if code.class() != ErrorClass::Permanent {
            assert!(counts_as_failure(code), "{code}");
        }
        // And the breaker agrees, closed and half-open.
        let mut b = CircuitBreaker::new(POOL, config()).unwrap();
        let p = b.try_acquire(at(0)).unwrap();
        let want = if expected {
            Recorded::Failure
        } else {
            Recorded::NotCounted
        };
        assert_eq!(b.on_failure(p, code, at(0)).recorded, want, "{code}");
        assert_eq!(b.window_counts(at(0)).requests, u32::from(expected));
    }
}

#[test]
fn default_config() {
    let d = BreakerConfig::default();
    assert_eq!(d.window, Duration::from_secs(10));
    assert_eq!(d.buckets, 10);
    assert_eq!(d.min_requests, 20);
    assert_eq!(d.failure_rate, 0.5);
    assert_eq!(d.open_for, Duration::from_secs(5));
    assert_eq!(d.half_open_probes, 3);
    assert_eq!(d.open_on, CodeSet::EMPTY);
    assert_eq!(d.bucket_width(), Duration::from_secs(1));
    assert!(d.validate().is_ok());
    assert!(CircuitBreaker::new("p", d).is_ok());
}

#[test]
fn validate_refuses_bad_numbers() {
    let ok = config();
    let bad = [
        BreakerConfig { buckets: 0, ..ok },
        BreakerConfig {
            buckets: MAX_BUCKETS + 1,
            ..ok
        },
        BreakerConfig {
            window: Duration::ZERO,
            ..ok
        },
        BreakerConfig {
            window: Duration::from_nanos(9),
            buckets: 10,
            ..ok
        },
        BreakerConfig {
            min_requests: 0,
            ..ok
        },
        BreakerConfig {
            failure_rate: 0.0,
            ..ok
        },
        BreakerConfig {
            failure_rate: 1.01,
            ..ok
        },
        BreakerConfig {
            failure_rate: f64::NAN,
            ..ok
        },
        BreakerConfig {
            open_for: Duration::ZERO,
            ..ok
        },
        BreakerConfig {
            half_open_probes: 0,
            ..ok
        },
    ];
    for c in bad {
        assert!(
            matches!(c.validate(), Err(AskError::InvalidArgument { .. })),
            "{c:?}"
        );
        assert!(CircuitBreaker::new("p", c).is_err(), "{c:?}");
    }
    for good in [
        BreakerConfig {
            failure_rate: 1.0,
            ..ok
        },
        BreakerConfig {
            buckets: MAX_BUCKETS,
            ..ok
        },
        BreakerConfig {
            window: Duration::from_nanos(10),
            buckets: 10,
            ..ok
        },
        BreakerConfig {
            min_requests: 1,
            half_open_probes: 1,
            ..ok
        },
    ] {
        assert!(good.validate().is_ok(), "{good:?}");
    }
    // An uneven window rounds the bucket width down.
    let c = BreakerConfig {
        window: Duration::from_nanos(1_005),
        buckets: 10,
        ..ok
    };
    assert_eq!(c.bucket_width(), Duration::from_nanos(100));
}

#[test]
fn state_names_and_gauge_values() {
    assert_eq!(
        [Closed, Open, HalfOpen].map(|s| (s.as_str(), s.as_gauge())),
        [("closed", 0), ("open", 1), ("half_open", 2)]
    );
    assert_eq!(HalfOpen.to_string(), "half_open");
}

#[test]
fn generations_bump_on_every_state_change() {
    let mut b = CircuitBreaker::new(POOL, config()).unwrap();
    let g0 = b.generation();
    for _ in 0..4 {
        let p = b.try_acquire(at(0)).unwrap();
        let _ = b.on_failure(p, I, at(0));
    }
    assert_eq!(b.generation(), g0 + 1, "closed -> open");
    let p = b.try_acquire(at(5_000)).unwrap();
    assert_eq!(b.generation(), g0 + 2, "open -> half-open");
    assert_eq!(p.generation(), g0 + 2);
    let _ = b.on_success(p, at(5_000));
    let p = b.try_acquire(at(5_000)).unwrap();
    let _ = b.on_success(p, at(5_000));
    assert_eq!(b.generation(), g0 + 3, "half-open -> closed");
    // Closed traffic does not bump it.
    let p = b.try_acquire(at(5_000)).unwrap();
    let _ = b.on_success(p, at(5_000));
    assert_eq!(b.generation(), g0 + 3);
}

// ================================================================ property

#[derive(Clone, Copy, Debug)]
enum Op {
    Acquire,
    Succeed(usize),
    Fail(usize, ErrorCode),
    Release(usize),
}

fn code_strategy() -> impl Strategy<Value = ErrorCode> {
    (0usize..ErrorCode::ALL.len()).prop_map(|i| ErrorCode::ALL[i])
}

fn op_strategy() -> impl Strategy<Value = (Op, u64)> {
    let op = prop_oneof![
        4 => Just(Op::Acquire),
        3 => any::<usize>().prop_map(Op::Succeed),
        3 => (any::<usize>(), code_strategy()).prop_map(|(i, c)| Op::Fail(i, c)),
        1 => any::<usize>().prop_map(Op::Release),
    ];
    // Mostly small steps, sometimes long enough to cross an open period.
    let dt = prop_oneof![3 => 0u64..50, 1 => 0u64..3_000];
    (op, dt)
}

fn config_strategy() -> impl Strategy<Value = BreakerConfig> {
    (
        1u64..5,
        1u32..6,
        1u32..8,
        prop_oneof![Just(0.25), Just(0.5), Just(1.0)],
        100u64..3_000,
        1u32..4,
        prop::collection::vec(code_strategy(), 0..3),
    )
        .prop_map(
            |(window_s, buckets, min_requests, failure_rate, open_ms, probes, open_on)| {
                BreakerConfig {
                    window: Duration::from_secs(window_s),
                    buckets,
                    min_requests,
                    failure_rate,
                    open_for: Duration::from_millis(open_ms),
                    half_open_probes: probes,
                    open_on: CodeSet::of(&open_on),
                }
            },
        )
}

#[derive(Clone, Copy, Debug, PartialEq)]
enum ModelState {
    Closed,
    Open { until_ns: u64 },
    HalfOpen { in_flight: u32, successes: u32 },
}

/// The breaker written the plain way: the window is a list of every counted
/// outcome with its time, filtered by bucket on each read.
struct Model {
    cfg: BreakerConfig,
    width_ns: u64,
    state: ModelState,
    gen: u64,
    outcomes: Vec<(u64, bool)>,
}

impl Model {
    fn new(cfg: BreakerConfig) -> Self {
        let width_ns = cfg.window.as_nanos() as u64 / u64::from(cfg.buckets);
        Self {
            cfg,
            width_ns,
            state: ModelState::Closed,
            gen: 0,
            outcomes: Vec::new(),
        }
    }

    fn set(&mut self, state: ModelState) {
        if !matches!(state, ModelState::HalfOpen { .. }) {
            self.outcomes.clear();
        }
        self.state = state;
        self.gen += 1;
    }

    fn open(&mut self, now: u64) {
        let until_ns = now + self.cfg.open_for.as_nanos() as u64;
        self.set(ModelState::Open { until_ns });
    }

    /// `Some(probe)` if admitted.
    fn acquire(&mut self, now: u64) -> Option<bool> {
        if let ModelState::Open { until_ns } = self.state {
            if now < until_ns {
                return None;
            }
            self.set(ModelState::HalfOpen {
                in_flight: 0,
                successes: 0,
            });
        }
        match &mut self.state {
            ModelState::Closed => Some(false),
            ModelState::HalfOpen { in_flight, .. } if *in_flight < self.cfg.half_open_probes => {
                *in_flight += 1;
                Some(true)
            }
            _ => None,
        }
    }

    fn window(&self, now: u64) -> (u32, u32) {
        let now_b = now / self.width_ns;
        let buckets = u64::from(self.cfg.buckets);
        let live = self
            .outcomes
            .iter()
            .filter(|(t, _)| now_b - t / self.width_ns < buckets);
        let (mut req, mut fail) = (0, 0);
        for (_, f) in live {
            req += 1;
            fail += u32::from(*f);
        }
        (req, fail)
    }

    fn report(&mut self, gen: u64, kind: Kind, now: u64) -> Recorded {
        if gen != self.gen {
            return Recorded::Stale;
        }
        let open_on = self.cfg.open_on;
        let failed = match kind {
            Kind::Success => Some(false),
            Kind::Fail(c) if counts_as_failure(c) || open_on.contains(c) => Some(true),
            Kind::Fail(_) | Kind::Release => None,
        };
        match self.state {
            ModelState::Open { .. } => unreachable!("no current permit while open"),
            ModelState::Closed => {
                if let Some(f) = failed {
                    self.outcomes.push((now, f));
                    let (req, fails) = self.window(now);
                    let at_once = matches!(kind, Kind::Fail(c) if open_on.contains(c));
                    let by_rate = req >= self.cfg.min_requests
                        && f64::from(fails) >= self.cfg.failure_rate * f64::from(req);
                    if f && (at_once || by_rate) {
                        self.open(now);
                    }
                }
            }
            ModelState::HalfOpen {
                in_flight,
                successes,
            } => {
                let in_flight = in_flight - 1;
                match failed {
                    None => {
                        self.state = ModelState::HalfOpen {
                            in_flight,
                            successes,
                        }
                    }
                    Some(true) => self.open(now),
                    Some(false) if successes + 1 >= self.cfg.half_open_probes => {
                        self.set(ModelState::Closed)
                    }
                    Some(false) => {
                        self.state = ModelState::HalfOpen {
                            in_flight,
                            successes: successes + 1,
                        }
                    }
                }
            }
        }
        match failed {
            None => Recorded::NotCounted,
            Some(true) => Recorded::Failure,
            Some(false) => Recorded::Success,
        }
    }
}

#[derive(Clone, Copy, Debug)]
enum Kind {
    Success,
    Fail(ErrorCode),
    Release,
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(1_000))]

    #[test]
    fn breaker_matches_the_model_and_keeps_its_promises(
        cfg in config_strategy(),
        ops in prop::collection::vec(op_strategy(), 0..150),
    ) {
        let mut b = CircuitBreaker::new(POOL, cfg).unwrap();
        let mut m = Model::new(cfg);
        let mut held: Vec<BreakerPermit> = Vec::new();
        let mut now_ns = T0_MS * 1_000_000;
        for (op, dt_ms) in ops {
            now_ns += dt_ms * 1_000_000;
            let now = Timestamp::from_nanos(now_ns);
            let open_until_before = b.open_until();
            match op {
                Op::Acquire => {
                    let got = b.try_acquire(now);
                    let want = m.acquire(now_ns);
                    prop_assert_eq!(got.is_ok(), want.is_some(), "acquire {:?}", m.state);
                    match got {
                        Ok(p) => {
                            // Never admitted while open before `until`.
                            if let Some(until) = open_until_before {
                                prop_assert!(now >= until);
                            }
                            prop_assert_eq!(Some(p.is_probe()), want);
                            prop_assert_eq!(p.generation(), m.gen);
                            held.push(p);
                        }
                        Err(e) => {
                            let unavailable = matches!(e, AskError::Unavailable { .. });
                            prop_assert!(unavailable, "{}", e);
                        }
                    }
                }
                Op::Succeed(i) if !held.is_empty() => {
                    let p = held.swap_remove(i % held.len());
                    let want = m.report(p.generation(), Kind::Success, now_ns);
                    prop_assert_eq!(b.on_success(p, now).recorded, want);
                }
                Op::Fail(i, code) if !held.is_empty() => {
                    let p = held.swap_remove(i % held.len());
                    let want = m.report(p.generation(), Kind::Fail(code), now_ns);
                    prop_assert_eq!(b.on_failure(p, code, now).recorded, want, "fail {}", code);
                }
                Op::Release(i) if !held.is_empty() => {
                    let p = held.swap_remove(i % held.len());
                    let want = m.report(p.generation(), Kind::Release, now_ns);
                    prop_assert_eq!(b.release(p).recorded, want);
                }
                _ => {}
            }
            // Same state, same generation, same window.
            prop_assert_eq!(b.generation(), m.gen);
            let (state, in_flight) = match m.state {
                ModelState::Closed => (Closed, 0),
                ModelState::Open { until_ns } if now_ns < until_ns => (Open, 0),
                ModelState::Open { .. } => (HalfOpen, 0),
                ModelState::HalfOpen { in_flight, .. } => (HalfOpen, in_flight),
            };
            prop_assert_eq!(b.state(now), state);
            prop_assert_eq!(b.probes_in_flight(), in_flight);
            if let ModelState::Open { until_ns } = m.state {
                prop_assert_eq!(b.open_until(), Some(Timestamp::from_nanos(until_ns)));
            }
            let (req, fails) = m.window(now_ns);
            prop_assert_eq!(b.window_counts(now), WindowCounts { requests: req, failures: fails });
            // Never more probes out than allowed: count the current
            // generation's probe permits the harness holds.
            let probes_out = held
                .iter()
                .filter(|p| p.is_probe() && p.generation() == b.generation())
                .count() as u32;
            prop_assert!(probes_out <= cfg.half_open_probes);
            prop_assert_eq!(probes_out, b.probes_in_flight());
        }
    }
}

/// The code an outcome is reported under: a processing-timeout cancel is a
/// timeout of the pool and counts; every other cancel stays ASK_CANCELLED
/// and does not; any other error keeps its own code.
#[test]
fn a_processing_timeout_cancel_is_reported_as_a_timeout() {
    use askpool_proto::breaker::breaker_code;
    use askpool_proto::{AskError, CancelReason};
    let cancelled = |reason| AskError::AskCancelled { reason };
    assert_eq!(
        breaker_code(&cancelled(CancelReason::ProcessingTimeout)),
        ErrorCode::DeadlineExceeded
    );
    assert!(counts_as_failure(breaker_code(&cancelled(
        CancelReason::ProcessingTimeout
    ))));
    for reason in [
        CancelReason::Caller,
        CancelReason::CallerTimeout,
        CancelReason::Worker,
        CancelReason::Shutdown,
    ] {
        assert_eq!(breaker_code(&cancelled(reason)), ErrorCode::AskCancelled);
        assert!(!counts_as_failure(breaker_code(&cancelled(reason))));
    }
    for error in [
        AskError::internal("x"),
        AskError::unavailable("y"),
        AskError::PayloadMismatch,
    ] {
        assert_eq!(breaker_code(&error), error.code());
    }
}
