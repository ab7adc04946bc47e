//! The ACK lifecycle tables of `askpool_proto::ack` (module doc), cell by cell,
//! plus progress rules, exact durations, the bounded history, and a property
//! test against a small model.
//!
//! Times are milliseconds after the ask was sent; the ask is sent at 10 s on
//! the driver's clock, so "since sent" and "since the epoch" cannot be confused.

use std::time::Duration;

use askpool_proto::ack::MAX_PARTIAL_EVENTS;
use askpool_proto::{
    AckStage, AckTracker, AskError, CancelReason, ErrorCode, LateOutcome, Progress, StageError,
};
use proptest::prelude::*;

use AckStage::*;

const T0_NANOS: u64 = 10_000_000_000;

fn at(ms: u64) -> askpool_proto::Timestamp {
    askpool_proto::Timestamp::from_nanos(T0_NANOS) + Duration::from_millis(ms)
}

fn ms(n: u64) -> Duration {
    Duration::from_millis(n)
}

/// A tracker sent at 0 ms and brought to `stage` by a legal path, one event
/// every 10 ms.
fn tracker_at(stage: AckStage) -> AckTracker {
    let path: &[AckStage] = match stage {
        Sent => &[],
        Received => &[Received],
        Read => &[Received, Read],
        Partial => &[Received, Read, Partial],
        terminal => &[Received, Read, terminal],
    };
    let mut t = AckTracker::new(at(0));
    for (i, s) in path.iter().enumerate() {
        t.advance(*s, at(10 * (i as u64 + 1)))
            .unwrap_or_else(|e| panic!("path to {stage}: {e}"));
    }
    assert_eq!(t.stage(), stage);
    t
}

// ====================================================================== stages

#[test]
fn stage_names_ranks_and_terminality() {
    let expected = [
        (Sent, "SENT", 0, false),
        (Received, "RECEIVED", 1, false),
        (Read, "READ", 2, false),
        (Partial, "PARTIAL", 3, false),
        (Fulfilled, "FULFILLED", 4, true),
        (Rejected, "REJECTED", 4, true),
        (Failed, "FAILED", 4, true),
        (TimedOut, "TIMED_OUT", 4, true),
    ];
    assert_eq!(AckStage::ALL.len(), expected.len());
    for (stage, (s, name, rank, terminal)) in AckStage::ALL.iter().zip(expected) {
        assert_eq!(*stage, s);
        assert_eq!(stage.as_str(), name);
        assert_eq!(stage.to_string(), name);
        assert_eq!(stage.rank(), rank, "{stage}");
        assert_eq!(stage.is_terminal(), terminal, "{stage}");
        assert_eq!(AckStage::TERMINALS.contains(stage), terminal, "{stage}");
    }
}

#[test]
fn every_error_code_maps_to_its_terminal() {
    let expected = |c: ErrorCode| match c {
        ErrorCode::InvalidArgument
        | ErrorCode::ValidationError
        | ErrorCode::PayloadMismatch
        | ErrorCode::PermissionDenied
        | ErrorCode::OversizePayload
        | ErrorCode::FailedPrecondition
        | ErrorCode::NoRoute
        | ErrorCode::DecodeFailure
        | ErrorCode::BufferFull
        | ErrorCode::Unavailable => Rejected,
        ErrorCode::AskTimeout | ErrorCode::DeadlineExceeded => TimedOut,
        ErrorCode::HandlerFailed | ErrorCode::Internal | ErrorCode::AskCancelled => Failed,
    };
    for code in ErrorCode::ALL {
        assert_eq!(AckStage::terminal_for_code(code), expected(code), "{code}");
    }
    let samples = [
        (AskError::unavailable("x"), Rejected),
        (AskError::DeadlineExceeded, TimedOut),
        (AskError::AskTimeout { elapsed_ms: 5 }, TimedOut),
        (
            AskError::BufferFull {
                pool: "p".into(),
                limit: 1,
            },
            Rejected,
        ),
        (AskError::NoRoute { pool: "p".into() }, Rejected),
        (AskError::PayloadMismatch, Rejected),
        (
            AskError::DecodeFailure {
                message: "m".into(),
            },
            Rejected,
        ),
        (AskError::internal("boom"), Failed),
        (AskError::handler_failed("ValueError", "bad"), Failed),
        (
            AskError::AskCancelled {
                reason: CancelReason::Worker,
            },
            Failed,
        ),
        // The pool's processing deadline: a timeout, whatever the code says.
        (
            AskError::AskCancelled {
                reason: CancelReason::ProcessingTimeout,
            },
            TimedOut,
        ),
    ];
    for (error, stage) in samples {
        assert_eq!(AckStage::terminal_for_error(&error), stage, "{error}");
        assert_eq!(
            AckStage::terminal_for_outcome::<u8>(&Err(error.clone())),
            stage,
            "{error}"
        );
    }
    assert_eq!(AckStage::terminal_for_outcome::<u8>(&Ok(7)), Fulfilled);
}

// ============================================================ advance: 64 cells

/// Expected answer of one `advance` cell.
#[derive(Clone, Copy, Debug, PartialEq)]
enum Cell {
    /// Applied.
    Ok,
    /// `Illegal { from, to }`: backward, or PARTIAL before RECEIVED.
    Ill,
    /// `Repeated { stage }`.
    Rep,
    /// `AfterTerminal { terminal, to }`.
    Aft,
}

use Cell::{Aft, Ill, Rep};

/// The transition table of the module doc, written out. Rows: from; columns:
/// to, in `AckStage::ALL` order.
#[rustfmt::skip]
const ADVANCE: [[Cell; 8]; 8] = [
    //             SENT RECEIVED READ     PARTIAL  FULFILL  REJECT   FAILED   TIMED_OUT
    /* SENT     */ [Rep, Cell::Ok, Cell::Ok, Ill,     Cell::Ok, Cell::Ok, Cell::Ok, Cell::Ok],
    /* RECEIVED */ [Ill, Rep,      Cell::Ok, Cell::Ok, Cell::Ok, Cell::Ok, Cell::Ok, Cell::Ok],
    /* READ     */ [Ill, Ill,      Rep,      Cell::Ok, Cell::Ok, Cell::Ok, Cell::Ok, Cell::Ok],
    /* PARTIAL  */ [Ill, Ill,      Ill,      Cell::Ok, Cell::Ok, Cell::Ok, Cell::Ok, Cell::Ok],
    /* FULFILL  */ [Aft, Aft,      Aft,      Aft,      Aft,      Aft,      Aft,      Aft],
    /* REJECT   */ [Aft, Aft,      Aft,      Aft,      Aft,      Aft,      Aft,      Aft],
    /* FAILED   */ [Aft, Aft,      Aft,      Aft,      Aft,      Aft,      Aft,      Aft],
    /* TIMEDOUT */ [Aft, Aft,      Aft,      Aft,      Aft,      Aft,      Aft,      Aft],
];

#[test]
fn advance_table_every_from_to_pair() {
    let mut cells = 0;
    for (r, &from) in AckStage::ALL.iter().enumerate() {
        for (c, &to) in AckStage::ALL.iter().enumerate() {
            cells += 1;
            let mut t = tracker_at(from);
            let before_history = t.history().to_vec();
            let before_terminal_at = t.terminal_at();
            let now = at(1_000);
            let got = t.advance(to, now);
            match ADVANCE[r][c] {
                Cell::Ok => {
                    let ev = got.unwrap_or_else(|e| panic!("{from} -> {to}: {e}"));
                    assert_eq!(ev.stage, to);
                    assert_eq!(ev.at, now);
                    assert_eq!(ev.progress, None);
                    assert_eq!(t.stage(), to, "{from} -> {to}");
                    assert_eq!(t.history().len(), before_history.len() + 1);
                    assert_eq!(t.history().last(), Some(&ev));
                    assert_eq!(
                        t.terminal_at(),
                        to.is_terminal().then_some(now),
                        "{from} -> {to}"
                    );
                    assert_eq!(t.is_terminal(), to.is_terminal());
                }
                expected => {
                    let err = got.expect_err(&format!("{from} -> {to} must be refused"));
                    let want = match expected {
                        Ill => StageError::Illegal { from, to },
                        Rep => StageError::Repeated { stage: to },
                        Aft => StageError::AfterTerminal { terminal: from, to },
                        Cell::Ok => unreachable!(),
                    };
                    assert_eq!(err, want, "{from} -> {to}");
                    // Refused: nothing changed.
                    assert_eq!(t.stage(), from, "{from} -> {to}");
                    assert_eq!(t.history(), &before_history[..], "{from} -> {to}");
                    assert_eq!(t.terminal_at(), before_terminal_at);
                }
            }
        }
    }
    assert_eq!(cells, 64);
}

#[test]
fn advance_table_agrees_with_the_rank_rule() {
    // The written table is the rule "forward only, partial after received,
    // nothing after a terminal": cross-check it against that statement.
    for (r, &from) in AckStage::ALL.iter().enumerate() {
        for (c, &to) in AckStage::ALL.iter().enumerate() {
            let legal = !from.is_terminal()
                && if to == Partial {
                    from.rank() >= Received.rank()
                } else {
                    to.rank() > from.rank()
                };
            assert_eq!(ADVANCE[r][c] == Cell::Ok, legal, "{from} -> {to}");
        }
    }
}

#[test]
fn advance_partial_follows_the_partial_column() {
    for (r, &from) in AckStage::ALL.iter().enumerate() {
        let mut t = tracker_at(from);
        let got = t.advance_partial(Progress::new(0.5, "half"), at(1_000));
        let partial_col = 3;
        match ADVANCE[r][partial_col] {
            Cell::Ok => {
                let ev = got.unwrap();
                assert_eq!(ev.stage, Partial);
                assert_eq!(ev.progress, Some(Progress::new(0.5, "half")));
                assert_eq!(t.last_fraction(), Some(0.5));
            }
            Ill => assert_eq!(got, Err(StageError::Illegal { from, to: Partial })),
            Aft => assert_eq!(
                got,
                Err(StageError::AfterTerminal {
                    terminal: from,
                    to: Partial
                })
            ),
            Rep => unreachable!("partial never repeats"),
        }
    }
}

// ======================================================= reconcile: 64 cells

#[test]
fn reconcile_table_every_current_and_outcome_stage() {
    let mut cells = 0;
    for &current in &AckStage::ALL {
        for &outcome in &AckStage::ALL {
            cells += 1;
            let mut t = tracker_at(current);
            let before = t.history().to_vec();
            // TIMED_OUT was recorded at 30 ms (third event of the path).
            let got = t.reconcile(outcome, at(5_030));
            let is_outcome = matches!(outcome, Fulfilled | Rejected | Failed);
            if !is_outcome {
                assert_eq!(
                    got,
                    Err(StageError::NotAnOutcome { stage: outcome }),
                    "{current} reconcile {outcome}"
                );
                assert_eq!(t.reconciled(), None);
            } else if current != TimedOut {
                assert_eq!(
                    got,
                    Err(StageError::NotTimedOut { current }),
                    "{current} reconcile {outcome}"
                );
                assert_eq!(t.reconciled(), None);
            } else {
                let late = got.unwrap();
                assert_eq!(
                    late,
                    LateOutcome {
                        stage: outcome,
                        at: at(5_030),
                        late_by: ms(5_000),
                    }
                );
                assert_eq!(t.reconciled(), Some(outcome));
                assert_eq!(t.late_outcome(), Some(&late));
                assert_eq!(t.effective_stage(), outcome);
                // The local record stays timed out: the future stays failed.
                assert_eq!(t.stage(), TimedOut);
                assert!(t.is_terminal());

                // Exactly once: every later reconcile is refused...
                for &again in &AckStage::ALL {
                    let err = t.reconcile(again, at(6_000)).unwrap_err();
                    if matches!(again, Fulfilled | Rejected | Failed) {
                        assert_eq!(
                            err,
                            StageError::AlreadyReconciled {
                                reconciled: outcome
                            }
                        );
                    } else {
                        assert_eq!(err, StageError::NotAnOutcome { stage: again });
                    }
                }
                // ...and so is every advance.
                for &to in &AckStage::ALL {
                    assert_eq!(
                        t.advance(to, at(6_000)),
                        Err(StageError::AfterTerminal {
                            terminal: TimedOut,
                            to
                        })
                    );
                }
                assert_eq!(t.reconciled(), Some(outcome));
                assert_eq!(t.late_outcome().unwrap().at, at(5_030));
            }
            // Reconciliation never touches the stage history.
            assert_eq!(t.history(), &before[..]);
            if t.reconciled().is_none() {
                assert_eq!(t.effective_stage(), current);
            }
        }
    }
    assert_eq!(cells, 64);
}

#[test]
fn reconcile_of_a_direct_timeout_measures_from_the_timeout() {
    let mut t = AckTracker::new(at(0));
    t.advance(TimedOut, at(10_000)).unwrap();
    let late = t.reconcile(Fulfilled, at(10_250)).unwrap();
    assert_eq!(late.late_by, ms(250));
    // A late outcome at the very instant of the timeout is late by zero.
    let mut t = AckTracker::new(at(0));
    t.advance(TimedOut, at(10_000)).unwrap();
    assert_eq!(t.reconcile(Failed, at(10_000)).unwrap().late_by, ms(0));
}

// ======================================================== progress rules

#[test]
fn progress_fraction_must_be_in_unit_range() {
    for bad in [
        -0.01f32,
        1.0001,
        2.0,
        -1.0,
        f32::NAN,
        f32::INFINITY,
        f32::NEG_INFINITY,
    ] {
        let mut t = tracker_at(Read);
        let before = t.history().to_vec();
        let err = t
            .advance_partial(Progress::new(bad, "x"), at(100))
            .unwrap_err();
        match err {
            StageError::InvalidProgress { fraction } => {
                assert!(fraction.to_bits() == bad.to_bits(), "{fraction} vs {bad}")
            }
            other => panic!("{bad}: {other:?}"),
        }
        assert_eq!(t.stage(), Read);
        assert_eq!(t.history(), &before[..]);
        assert_eq!(t.last_fraction(), None);
        assert_eq!(t.partial_events(), 0);
    }
    for good in [0.0f32, 0.25, 1.0] {
        let mut t = tracker_at(Read);
        assert!(t.advance_partial(Progress::new(good, "x"), at(100)).is_ok());
        assert_eq!(t.last_fraction(), Some(good));
    }
}

/// A report past its bounds (from a peer that did not check them) is
/// refused and changes nothing: the caller keeps the newest reports of each
/// ask, so their size is what bounds that memory.
#[test]
fn progress_past_its_bounds_is_refused() {
    let too_long = Progress::new(0.5, "x".repeat(Progress::MAX_BYTES + 1));
    let split = Progress::new(0.5, "x".repeat(Progress::MAX_BYTES)).with("k", "");
    let mut too_many = Progress::new(0.5, "");
    for _ in 0..=Progress::MAX_METADATA {
        too_many = too_many.with("", "");
    }
    for (bad, size, entries) in [
        (too_long, Progress::MAX_BYTES + 1, 0),
        (split, Progress::MAX_BYTES + 1, 1),
        (too_many, 0, Progress::MAX_METADATA + 1),
    ] {
        assert!(!bad.within_bounds());
        assert!(bad.check_bounds().is_err());
        let mut t = tracker_at(Read);
        let before = t.history().to_vec();
        assert_eq!(
            t.advance_partial(bad, at(100)),
            Err(StageError::OversizeProgress { size, entries })
        );
        assert_eq!(t.stage(), Read);
        assert_eq!(t.history(), &before[..]);
        assert_eq!(t.partial_events(), 0);
    }
    let mut full = Progress::new(0.5, "x".repeat(Progress::MAX_BYTES - 1)).with("k", "");
    for _ in 1..Progress::MAX_METADATA {
        full = full.with("", "");
    }
    assert!(full.within_bounds() && full.check_bounds().is_ok());
    let mut t = tracker_at(Read);
    assert!(t.advance_partial(full, at(100)).is_ok());
    assert_eq!(t.partial_events(), 1);
}

#[test]
fn progress_fraction_never_decreases() {
    let mut t = tracker_at(Received);
    t.advance_partial(Progress::new(0.2, "a"), at(100)).unwrap();
    t.advance_partial(Progress::new(0.5, "b"), at(200)).unwrap();
    // Equal is fine.
    t.advance_partial(Progress::new(0.5, "c"), at(300)).unwrap();
    let before = t.history().to_vec();
    assert_eq!(
        t.advance_partial(Progress::new(0.4, "d"), at(400)),
        Err(StageError::ProgressDecreased {
            previous: 0.5,
            fraction: 0.4
        })
    );
    assert_eq!(t.history(), &before[..]);
    assert_eq!(t.last_fraction(), Some(0.5));
    assert_eq!(t.partial_events(), 3);
    // A heartbeat (no fraction) does not reset the floor.
    let hb = t.advance(Partial, at(500)).unwrap();
    assert_eq!(hb.progress, None);
    assert_eq!(t.last_fraction(), Some(0.5));
    assert!(t.advance_partial(Progress::new(0.1, "e"), at(600)).is_err());
    t.advance_partial(Progress::new(1.0, "done"), at(700))
        .unwrap();
    t.advance(Fulfilled, at(800)).unwrap();
    let stages: Vec<AckStage> = t.history().iter().map(|e| e.stage).collect();
    assert_eq!(
        stages,
        vec![Sent, Received, Partial, Partial, Partial, Partial, Partial, Fulfilled]
    );
    let notes: Vec<&str> = t
        .history()
        .iter()
        .filter_map(|e| e.progress.as_ref().map(|p| p.note.as_str()))
        .collect();
    assert_eq!(notes, vec!["a", "b", "c", "done"]);
}

#[test]
fn transition_errors_take_precedence_over_progress_errors() {
    let mut t = tracker_at(Fulfilled);
    assert_eq!(
        t.advance_partial(Progress::new(7.0, "x"), at(100)),
        Err(StageError::AfterTerminal {
            terminal: Fulfilled,
            to: Partial
        })
    );
    let mut t = tracker_at(Sent);
    assert_eq!(
        t.advance_partial(Progress::new(f32::NAN, "x"), at(100)),
        Err(StageError::Illegal {
            from: Sent,
            to: Partial
        })
    );
}

#[test]
fn progress_before_the_ack_needs_received_first() {
    // The documented recipe for a progress frame that overtook the Ack.
    let mut t = AckTracker::new(at(0));
    assert!(t.advance_partial(Progress::new(0.3, "x"), at(50)).is_err());
    t.advance(Received, at(50)).unwrap();
    t.advance_partial(Progress::new(0.3, "x"), at(50)).unwrap();
    // READ after progress is a backward move.
    assert_eq!(
        t.advance(Read, at(60)),
        Err(StageError::Illegal {
            from: Partial,
            to: Read
        })
    );
}

// ============================================================= durations

#[test]
fn durations_are_exact() {
    let mut t = AckTracker::new(at(0));
    assert_eq!(t.sent_at(), at(0));
    let sent = t.history()[0].clone();
    assert_eq!(sent.stage, Sent);
    assert_eq!(sent.at, at(0));
    assert_eq!(sent.since_previous, Duration::ZERO);
    assert_eq!(sent.since_sent, Duration::ZERO);

    let script: [(AckStage, u64, u64, u64); 5] = [
        // stage, at ms, since previous ms, since sent ms
        (Received, 2, 2, 2),
        (Read, 47, 45, 47),
        (Partial, 1_047, 1_000, 1_047),
        (Partial, 1_047, 0, 1_047),
        (Fulfilled, 2_387, 1_340, 2_387),
    ];
    for (stage, when, prev, total) in script {
        let ev = t.advance(stage, at(when)).unwrap();
        assert_eq!(ev.at, at(when), "{stage}");
        assert_eq!(ev.since_previous, ms(prev), "{stage} at {when}");
        assert_eq!(ev.since_sent, ms(total), "{stage} at {when}");
    }
    assert_eq!(t.terminal_at(), Some(at(2_387)));
    assert_eq!(t.history().len(), 6);

    // Nanosecond precision, not just milliseconds.
    let mut t = AckTracker::new(askpool_proto::Timestamp::from_nanos(1));
    let ev = t
        .advance(Received, askpool_proto::Timestamp::from_nanos(8))
        .unwrap();
    assert_eq!(ev.since_previous, Duration::from_nanos(7));
}

#[test]
fn a_clock_that_goes_backwards_saturates_to_zero() {
    let mut t = AckTracker::new(at(100));
    let ev = t.advance(Received, at(50)).unwrap();
    assert_eq!(ev.since_previous, Duration::ZERO);
    assert_eq!(ev.since_sent, Duration::ZERO);
    assert_eq!(ev.at, at(50));
    let ev = t.advance(Read, at(70)).unwrap();
    assert_eq!(ev.since_previous, ms(20));
    assert_eq!(ev.since_sent, Duration::ZERO);
}

// ======================================================= bounded history

#[test]
fn history_keeps_the_last_partial_events_only() {
    assert_eq!(MAX_PARTIAL_EVENTS, 32);
    const N: u64 = 100;
    let mut t = tracker_at(Read); // Sent 0, Received 10, Read 20
    for i in 0..N {
        let ev = t
            .advance_partial(
                Progress::new(i as f32 / N as f32, format!("step {i}")),
                at(100 + i),
            )
            .unwrap();
        // since_previous is measured from the previous event even when that
        // event has been dropped from the history.
        let expected_prev = if i == 0 { 80 } else { 1 };
        assert_eq!(ev.since_previous, ms(expected_prev), "step {i}");
        let partials = t.history().iter().filter(|e| e.stage == Partial).count();
        assert_eq!(partials as u64, (i + 1).min(MAX_PARTIAL_EVENTS as u64));
        assert!(t.history().len() <= 3 + MAX_PARTIAL_EVENTS);
    }
    assert_eq!(t.partial_events(), N);
    t.advance(Failed, at(1_000)).unwrap();

    let h = t.history();
    assert_eq!(h.len(), 3 + MAX_PARTIAL_EVENTS + 1);
    assert_eq!(
        h[..3].iter().map(|e| e.stage).collect::<Vec<_>>(),
        vec![Sent, Received, Read]
    );
    assert_eq!(h.last().unwrap().stage, Failed);
    // The kept partials are the last 32, in order.
    let kept: Vec<String> = h[3..3 + MAX_PARTIAL_EVENTS]
        .iter()
        .map(|e| e.progress.as_ref().unwrap().note.clone())
        .collect();
    let want: Vec<String> = (N - MAX_PARTIAL_EVENTS as u64..N)
        .map(|i| format!("step {i}"))
        .collect();
    assert_eq!(kept, want);
    // Timestamps in the history never go backwards.
    assert!(h.windows(2).all(|w| w[0].at <= w[1].at));
}

// ================================================================ property

/// One generated operation on a tracker.
#[derive(Clone, Debug)]
enum Op {
    Advance(AckStage),
    Progress(f32),
    Reconcile(AckStage),
}

fn stage_strategy() -> impl Strategy<Value = AckStage> {
    (0usize..8).prop_map(|i| AckStage::ALL[i])
}

fn op_strategy() -> impl Strategy<Value = (Op, u64)> {
    let op = prop_oneof![
        4 => stage_strategy().prop_map(Op::Advance),
        3 => prop_oneof![
            8 => 0.0f32..=1.0,
            1 => Just(-0.5f32),
            1 => Just(1.5f32),
            1 => Just(f32::NAN),
        ]
        .prop_map(Op::Progress),
        2 => stage_strategy().prop_map(Op::Reconcile),
    ];
    (op, 0u64..500)
}

/// The independent model: a rank, a terminal flag, a fraction floor and a
/// reconciled flag.
#[derive(Debug, Default)]
struct Model {
    stage_rank: u8,
    current: Option<AckStage>,
    floor: Option<f32>,
    reconciled: bool,
}

impl Model {
    fn stage(&self) -> AckStage {
        self.current.unwrap_or(Sent)
    }
    fn accepts_advance(&self, to: AckStage) -> bool {
        let from = self.stage();
        if from.is_terminal() {
            return false;
        }
        if to == Partial {
            return matches!(from, Received | Read | Partial);
        }
        to.rank() > self.stage_rank
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(2_000))]

    #[test]
    fn stages_never_move_backwards_and_end_once(
        ops in prop::collection::vec(op_strategy(), 0..80)
    ) {
        let mut t = AckTracker::new(at(0));
        let mut m = Model::default();
        let mut now = 0u64;
        let mut reconciles = 0;
        for (op, dt) in ops {
            now += dt;
            let before_len = t.history().len();
            let before_stage = t.stage();
            match op {
                Op::Advance(to) => {
                    let ok = t.advance(to, at(now)).is_ok();
                    prop_assert_eq!(ok, m.accepts_advance(to), "advance {} from {}", to, before_stage);
                    if ok {
                        m.current = Some(to);
                        m.stage_rank = to.rank();
                    }
                }
                Op::Progress(f) => {
                    let ok = t.advance_partial(Progress::new(f, ""), at(now)).is_ok();
                    let want = m.accepts_advance(Partial)
                        && (0.0..=1.0).contains(&f)
                        && m.floor.is_none_or(|floor| f >= floor);
                    prop_assert_eq!(ok, want, "progress {} from {}", f, before_stage);
                    if ok {
                        m.current = Some(Partial);
                        m.stage_rank = Partial.rank();
                        m.floor = Some(f);
                    }
                }
                Op::Reconcile(s) => {
                    let ok = t.reconcile(s, at(now)).is_ok();
                    let want = m.stage() == TimedOut
                        && matches!(s, Fulfilled | Rejected | Failed)
                        && !m.reconciled;
                    prop_assert_eq!(ok, want, "reconcile {} at {}", s, before_stage);
                    if ok {
                        m.reconciled = true;
                        reconciles += 1;
                    }
                }
            }
            prop_assert_eq!(t.stage(), m.stage());
            if t.stage() == before_stage && !matches!(t.stage(), Partial) {
                // No stage change (refused, or a reconcile): no new event.
                prop_assert_eq!(t.history().len(), before_len);
            }
            let h = t.history();
            prop_assert_eq!(h[0].stage, Sent);
            prop_assert_eq!(h.last().unwrap().stage, t.stage());
            // Ranks never go down along the history.
            prop_assert!(h.windows(2).all(|w| w[0].stage.rank() <= w[1].stage.rank()));
            // At most one terminal, and only as the last event.
            let terminals = h.iter().filter(|e| e.stage.is_terminal()).count();
            prop_assert!(terminals <= 1);
            prop_assert_eq!(terminals == 1, t.is_terminal());
            prop_assert!(h.iter().filter(|e| e.stage == Partial).count() <= MAX_PARTIAL_EVENTS);
            prop_assert!(reconciles <= 1);
            prop_assert_eq!(t.reconciled().is_some(), m.reconciled);
            if let Some(r) = t.reconciled() {
                prop_assert_eq!(t.stage(), TimedOut);
                prop_assert!(matches!(r, Fulfilled | Rejected | Failed));
            }
        }
    }
}
