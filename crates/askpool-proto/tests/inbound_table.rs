//! The inbound (worker-side) table of DESIGN section 3, cell by cell, through
//! `askpool_proto::inbound::step`.

use std::collections::HashSet;

use askpool_proto::inbound::step;
use askpool_proto::{
    AskError, CancelReason, FingerprintRecord, InboundAction, InboundEvent, InboundPhase,
    InboundState, InboundTransition, Outcome, PayloadFingerprint,
};

type State = InboundState<u32>;
type Event = InboundEvent<u32>;
type Action = InboundAction<u32>;

const FP1: PayloadFingerprint = PayloadFingerprint::from_u128(0x1111);
const FP2: PayloadFingerprint = PayloadFingerprint::from_u128(0x2222);

const ALL_REASONS: [CancelReason; 5] = [
    CancelReason::Caller,
    CancelReason::CallerTimeout,
    CancelReason::Worker,
    CancelReason::ProcessingTimeout,
    CancelReason::Shutdown,
];

fn in_progress(fingerprint: FingerprintRecord) -> State {
    State::InProgress { fingerprint }
}

fn replied(fingerprint: FingerprintRecord, outcome: Outcome<u32>) -> State {
    State::Replied {
        fingerprint,
        outcome,
    }
}

fn cancelled(fingerprint: FingerprintRecord, reason: CancelReason) -> State {
    State::Cancelled {
        fingerprint,
        reason,
    }
}

fn request(fingerprint: Option<PayloadFingerprint>) -> Event {
    Event::Request { fingerprint }
}

fn cancel(reason: CancelReason) -> Event {
    Event::Cancel { reason }
}

fn finished(outcome: Outcome<u32>) -> Event {
    Event::HandlerFinished { outcome }
}

fn handler_error() -> AskError {
    AskError::handler_failed("ValueError", "bad input")
}

/// The column an event belongs to.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
enum Column {
    Request,
    Cancel,
    HandlerFinished,
}

fn column(event: &Event) -> Column {
    match event {
        Event::Request { .. } => Column::Request,
        Event::Cancel { .. } => Column::Cancel,
        Event::HandlerFinished { .. } => Column::HandlerFinished,
    }
}

fn phase_of(state: Option<&State>) -> InboundPhase {
    state.map_or(InboundPhase::Absent, State::phase)
}

/// The state stored after applying `t` to `current` (`next: None` = unchanged).
fn stored_after(current: Option<&State>, t: &InboundTransition<u32>) -> Option<State> {
    t.next.clone().or_else(|| current.cloned())
}

struct Cell {
    name: &'static str,
    current: Option<State>,
    event: Event,
    next: Option<State>,
    action: Action,
}

#[test]
fn every_cell_of_the_inbound_table() {
    let checked = FingerprintRecord::Checked(FP1);
    let cells = vec![
        // --- absent ---
        Cell {
            name: "absent / AskRequest -> InProgress, run handler once, Ack",
            current: None,
            event: request(Some(FP1)),
            next: Some(in_progress(checked)),
            action: Action::RunHandlerAndAck,
        },
        Cell {
            name: "absent / AskCancel -> Cancelled tombstone",
            current: None,
            event: cancel(CancelReason::Caller),
            next: Some(cancelled(
                FingerprintRecord::Tombstone,
                CancelReason::Caller,
            )),
            action: Action::RecordTombstone,
        },
        Cell {
            name: "absent / handler finishes -> ignored, stays absent",
            current: None,
            event: finished(Ok(9)),
            next: None,
            action: Action::Ignore,
        },
        // --- InProgress ---
        Cell {
            name: "InProgress / AskRequest -> Ack, handler not re-run",
            current: Some(in_progress(checked)),
            event: request(Some(FP1)),
            next: None,
            action: Action::Ack,
        },
        Cell {
            name: "InProgress / AskCancel -> Cancelled, send AskCancelled",
            current: Some(in_progress(checked)),
            event: cancel(CancelReason::Caller),
            next: Some(cancelled(checked, CancelReason::Caller)),
            action: Action::SendCancelled(CancelReason::Caller),
        },
        Cell {
            name: "InProgress / handler finishes -> Replied, send reply, cache it",
            current: Some(in_progress(checked)),
            event: finished(Ok(9)),
            next: Some(replied(checked, Ok(9))),
            action: Action::SendReply(Ok(9)),
        },
        // --- Replied ---
        Cell {
            name: "Replied / AskRequest -> replay cached reply",
            current: Some(replied(checked, Ok(7))),
            event: request(Some(FP1)),
            next: None,
            action: Action::Replay(Ok(7)),
        },
        Cell {
            name: "Replied / AskCancel -> ignore",
            current: Some(replied(checked, Ok(7))),
            event: cancel(CancelReason::Caller),
            next: None,
            action: Action::Ignore,
        },
        Cell {
            name: "Replied / handler finishes -> ignore",
            current: Some(replied(checked, Ok(7))),
            event: finished(Ok(9)),
            next: None,
            action: Action::Ignore,
        },
        // --- Cancelled ---
        Cell {
            name: "Cancelled / AskRequest -> send AskCancelled with the stored reason",
            current: Some(cancelled(checked, CancelReason::Worker)),
            event: request(Some(FP1)),
            next: None,
            action: Action::SendCancelled(CancelReason::Worker),
        },
        Cell {
            name: "Cancelled / AskCancel -> ignore",
            current: Some(cancelled(checked, CancelReason::Worker)),
            event: cancel(CancelReason::Caller),
            next: None,
            action: Action::Ignore,
        },
        Cell {
            name: "Cancelled / handler finishes -> suppress, no reply ever",
            current: Some(cancelled(checked, CancelReason::Worker)),
            event: finished(Ok(9)),
            next: None,
            action: Action::SuppressReply,
        },
    ];

    // The table above must be the whole table: 4 rows x 3 columns, each once.
    let covered: HashSet<(InboundPhase, Column)> = cells
        .iter()
        .map(|c| (phase_of(c.current.as_ref()), column(&c.event)))
        .collect();
    assert_eq!(covered.len(), 12, "a cell is missing or listed twice");
    assert_eq!(cells.len(), 12);

    for cell in &cells {
        let t = step(cell.current.as_ref(), cell.event.clone());
        assert_eq!(t.action, cell.action, "[{}] action", cell.name);
        assert_eq!(t.next, cell.next, "[{}] next state", cell.name);
        // The state the runtime stores afterwards.
        let expected_stored = cell.next.clone().or_else(|| cell.current.clone());
        assert_eq!(
            stored_after(cell.current.as_ref(), &t),
            expected_stored,
            "[{}] stored state",
            cell.name
        );
        // step is a pure function: the same inputs give the same output.
        assert_eq!(
            step(cell.current.as_ref(), cell.event.clone()),
            t,
            "[{}] step is not deterministic",
            cell.name
        );
    }
}

#[test]
fn absent_request_records_the_fingerprint_it_carried() {
    let cases = [
        ("checked fp1", Some(FP1), FingerprintRecord::Checked(FP1)),
        ("checked fp2", Some(FP2), FingerprintRecord::Checked(FP2)),
        ("no fingerprint", None, FingerprintRecord::Unchecked),
    ];
    for (name, fp, record) in cases {
        let t = step::<u32>(None, request(fp));
        assert_eq!(t.action, Action::RunHandlerAndAck, "[{name}]");
        assert_eq!(t.next, Some(in_progress(record)), "[{name}]");
        assert!(
            !t.next.unwrap().is_terminal(),
            "[{name}] InProgress is terminal"
        );
    }
}

#[test]
fn cancel_before_request_leaves_a_tombstone_that_answers_every_request() {
    for reason in ALL_REASONS {
        let t = step::<u32>(None, cancel(reason));
        assert_eq!(t.action, Action::RecordTombstone, "[{reason:?}]");
        let tombstone = t.next.expect("a tombstone is stored");
        assert_eq!(
            tombstone,
            cancelled(FingerprintRecord::Tombstone, reason),
            "[{reason:?}]"
        );
        assert!(tombstone.is_terminal());
        assert_eq!(tombstone.fingerprint(), FingerprintRecord::Tombstone);

        // The request that arrives later, with any fingerprint (or none), is
        // answered AskCancelled and never run; the tombstone stays as it is.
        for fp in [None, Some(FP1), Some(FP2)] {
            let name = format!("tombstone({reason:?}) / request {fp:?}");
            let t = step(Some(&tombstone), request(fp));
            assert_eq!(t.action, Action::SendCancelled(reason), "[{name}]");
            assert_ne!(t.action, Action::RunHandlerAndAck, "[{name}]");
            assert_eq!(t.next, None, "[{name}] tombstone changed");
            // A retry of the same request gets the same answer.
            let again = step(Some(&tombstone), request(fp));
            assert_eq!(again, t, "[{name}] second request");
        }
        // A handler never ran for it; a stray finish is suppressed all the same.
        let t = step(Some(&tombstone), finished(Ok(1)));
        assert_eq!(t.action, Action::SuppressReply, "[{reason:?}] stray finish");
        assert_eq!(t.next, None);
    }
}

#[test]
fn fingerprint_mismatch_is_rejected_in_every_stored_state() {
    let stored_fp = FingerprintRecord::Checked(FP1);
    let states: Vec<(&str, State)> = vec![
        ("InProgress", in_progress(stored_fp)),
        ("Replied(Ok)", replied(stored_fp, Ok(7))),
        ("Replied(Err)", replied(stored_fp, Err(handler_error()))),
        ("Cancelled", cancelled(stored_fp, CancelReason::Caller)),
    ];
    for (name, state) in &states {
        let t = step(Some(state), request(Some(FP2)));
        assert_eq!(
            t.action,
            Action::RejectMismatch,
            "[{name}] fp2 vs stored fp1"
        );
        assert_eq!(t.next, None, "[{name}] state changed on a mismatch");
        // The matching fingerprint is still served as usual afterwards.
        let ok = step(Some(state), request(Some(FP1)));
        assert_ne!(ok.action, Action::RejectMismatch, "[{name}] fp1 rejected");
    }
}

#[test]
fn entry_created_unchecked_fails_a_checked_request_closed() {
    // Created by a request without a fingerprint...
    let created = step::<u32>(None, request(None));
    assert_eq!(created.action, Action::RunHandlerAndAck);
    let running = created.next.expect("entry stored");
    assert_eq!(running.fingerprint(), FingerprintRecord::Unchecked);

    let states: Vec<(&str, State)> = vec![
        ("InProgress", running.clone()),
        (
            "Replied",
            step(Some(&running), finished(Ok(3))).next.expect("replied"),
        ),
        (
            "Cancelled",
            step(Some(&running), cancel(CancelReason::Caller))
                .next
                .expect("cancelled"),
        ),
    ];
    for (name, state) in &states {
        assert_eq!(
            state.fingerprint(),
            FingerprintRecord::Unchecked,
            "[{name}]"
        );
        for fp in [FP1, FP2] {
            let t = step(Some(state), request(Some(fp)));
            assert_eq!(
                t.action,
                Action::RejectMismatch,
                "[{name}] checked request {fp:?} on an unchecked entry"
            );
            assert_eq!(t.next, None, "[{name}]");
        }
        // Another unchecked request is a plain duplicate.
        let t = step(Some(state), request(None));
        assert_ne!(t.action, Action::RejectMismatch, "[{name}] unchecked dup");
    }
}

#[test]
fn unchecked_duplicate_of_a_checked_entry_is_admitted() {
    let fp = FingerprintRecord::Checked(FP1);
    let cases: Vec<(&str, State, Action)> = vec![
        ("InProgress", in_progress(fp), Action::Ack),
        ("Replied", replied(fp, Ok(7)), Action::Replay(Ok(7))),
        (
            "Cancelled",
            cancelled(fp, CancelReason::ProcessingTimeout),
            Action::SendCancelled(CancelReason::ProcessingTimeout),
        ),
    ];
    for (name, state, action) in cases {
        let t = step(Some(&state), request(None));
        assert_eq!(t.action, action, "[{name}]");
        assert_eq!(t.next, None, "[{name}]");
    }
}

#[test]
fn late_reply_after_cancel_is_suppressed() {
    for reason in ALL_REASONS {
        for outcome in [Ok(5), Err(handler_error())] {
            let name = format!("{reason:?} then {outcome:?}");
            let started = step::<u32>(None, request(Some(FP1)));
            assert_eq!(started.action, Action::RunHandlerAndAck, "[{name}]");
            let running = started.next.unwrap();

            let c = step(Some(&running), cancel(reason));
            assert_eq!(c.action, Action::SendCancelled(reason), "[{name}]");
            let cancelled_state = c.next.expect("moved to Cancelled");
            assert_eq!(cancelled_state.phase(), InboundPhase::Cancelled);

            let late = step(Some(&cancelled_state), finished(outcome.clone()));
            assert_eq!(late.action, Action::SuppressReply, "[{name}]");
            assert_eq!(late.next, None, "[{name}] the late reply was stored");

            // A retried request still gets AskCancelled, not the late outcome.
            let retry = step(Some(&cancelled_state), request(Some(FP1)));
            assert_eq!(retry.action, Action::SendCancelled(reason), "[{name}]");
        }
    }
}

#[test]
fn error_outcomes_are_cached_and_replayed_identically() {
    let errors = vec![
        handler_error(),
        AskError::internal("boom"),
        AskError::ValidationError {
            message: "field x".into(),
        },
        AskError::BufferFull {
            pool: "p".into(),
            limit: 8,
        },
        AskError::AskCancelled {
            reason: CancelReason::Worker,
        },
        AskError::DeadlineExceeded,
    ];
    for error in errors {
        let name = error.code().to_string();
        let running = step::<u32>(None, request(Some(FP1))).next.unwrap();
        let done = step(Some(&running), finished(Err(error.clone())));
        assert_eq!(
            done.action,
            Action::SendReply(Err(error.clone())),
            "[{name}]"
        );
        let cached = done.next.expect("replied state stored");
        assert_eq!(
            cached,
            replied(FingerprintRecord::Checked(FP1), Err(error.clone())),
            "[{name}]"
        );
        for fp in [Some(FP1), None] {
            let replay = step(Some(&cached), request(fp));
            assert_eq!(
                replay.action,
                Action::Replay(Err(error.clone())),
                "[{name}]"
            );
            assert_eq!(replay.next, None, "[{name}]");
        }
    }
}

#[test]
fn first_terminal_state_wins() {
    let fp = FingerprintRecord::Checked(FP1);
    let terminals: Vec<(&str, State)> = vec![
        ("Replied(Ok)", replied(fp, Ok(7))),
        ("Replied(Err)", replied(fp, Err(handler_error()))),
        (
            "Replied unchecked",
            replied(FingerprintRecord::Unchecked, Ok(1)),
        ),
        ("Cancelled(Caller)", cancelled(fp, CancelReason::Caller)),
        ("Cancelled(Shutdown)", cancelled(fp, CancelReason::Shutdown)),
        (
            "Cancelled tombstone",
            cancelled(FingerprintRecord::Tombstone, CancelReason::CallerTimeout),
        ),
    ];
    let mut events: Vec<Event> = vec![
        request(None),
        request(Some(FP1)),
        request(Some(FP2)),
        finished(Ok(99)),
        finished(Err(AskError::internal("late"))),
    ];
    events.extend(ALL_REASONS.into_iter().map(cancel));

    for (name, state) in &terminals {
        assert!(state.is_terminal(), "[{name}]");
        for event in &events {
            let t = step(Some(state), event.clone());
            assert_eq!(t.next, None, "[{name}] / {event:?} moved a terminal state");
            assert!(
                !matches!(t.action, Action::RunHandlerAndAck | Action::SendReply(_)),
                "[{name}] / {event:?} -> {:?}",
                t.action
            );
        }
    }

    // Sequences: whichever of reply / cancel lands first is final.
    let running = step::<u32>(None, request(Some(FP1))).next.unwrap();
    let replied_first = step(Some(&running), finished(Ok(4))).next.unwrap();
    let after = step(Some(&replied_first), cancel(CancelReason::Caller));
    assert_eq!(after.action, Action::Ignore);
    assert_eq!(
        stored_after(Some(&replied_first), &after),
        Some(replied(fp, Ok(4)))
    );

    let cancelled_first = step(Some(&running), cancel(CancelReason::Caller))
        .next
        .unwrap();
    let after = step(Some(&cancelled_first), finished(Ok(4)));
    assert_eq!(after.action, Action::SuppressReply);
    assert_eq!(
        stored_after(Some(&cancelled_first), &after),
        Some(cancelled(fp, CancelReason::Caller))
    );
    // A second cancel does not overwrite the first reason.
    let second = step(Some(&cancelled_first), cancel(CancelReason::Shutdown));
    assert_eq!(second.action, Action::Ignore);
    assert_eq!(second.next, None);
    assert_eq!(
        step(Some(&cancelled_first), request(Some(FP1))).action,
        Action::SendCancelled(CancelReason::Caller)
    );
}
