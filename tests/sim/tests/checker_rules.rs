//! Each invariant of the checker, on hand-made histories: a clean one
//! passes, and each breakage is reported under its own name.

use std::time::Duration;

use askpool::{AckStage, CallerId, CancelReason, CorrelationId, ErrorCode, RequestId};
use askpool_sim::checker::check;
use askpool_sim::history::{AskEnd, DlqSnapshot, FirstFrame, History, PoolTerminal};
use askpool_sim::model::{expected_ids, expected_value, Answer, Key};

fn key(n: u64) -> Key {
    Key {
        pool: 0,
        caller: CallerId::from_u64(9),
        request: RequestId::from_parts(1, n),
    }
}

const T: Duration = Duration::from_millis(100);
fn ms(n: u64) -> Duration {
    Duration::from_millis(n)
}

/// One ask of `k` with `payload` answered by its own execution.
fn answered(h: &History, k: Key, payload: u64, incarnation: u32) -> u64 {
    let no = h.issue(k, payload, T, ms(0));
    let exec = h.exec(k, incarnation, payload, false);
    h.pool_terminal(k, incarnation, PoolTerminal::Outcome { exec });
    let answer = Answer {
        value: expected_value(payload),
        exec,
    };
    h.end(no, AskEnd::Reply(answer), None, ms(10));
    exec
}

fn broken(h: &History) -> Vec<&'static str> {
    h.with_log(|log| check(log, Duration::ZERO))
        .into_iter()
        .map(|v| v.invariant)
        .collect()
}

#[test]
fn a_clean_history_passes() {
    let h = History::new();
    let exec = answered(&h, key(1), 5, 0);
    // A replay of the same execution to a second ask of the id.
    let no = h.issue(key(1), 5, T, ms(20));
    h.pool_terminal(key(1), 0, PoolTerminal::Outcome { exec });
    h.end(
        no,
        AskEnd::Reply(Answer {
            value: expected_value(5),
            exec,
        }),
        Some(vec![
            AckStage::Sent,
            AckStage::Received,
            AckStage::Fulfilled,
        ]),
        ms(30),
    );
    // After a restart the key may run again (the crash model).
    answered(&h, key(1), 5, 1);
    assert_eq!(broken(&h), Vec::<&str>::new());
}

#[test]
fn two_executions_in_one_incarnation() {
    let h = History::new();
    answered(&h, key(1), 5, 0);
    answered(&h, key(1), 5, 0);
    assert!(broken(&h).contains(&"at most one execution per cached key"));
}

#[test]
fn a_reply_after_a_cancel() {
    let h = History::new();
    let exec = h.exec(key(1), 0, 5, false);
    h.pool_terminal(key(1), 0, PoolTerminal::Cancelled);
    h.pool_terminal(key(1), 0, PoolTerminal::Outcome { exec });
    assert_eq!(broken(&h), vec!["no reply after an accepted cancel"]);
}

#[test]
fn a_replay_that_differs() {
    let h = History::new();
    let a = h.exec(key(1), 0, 5, false);
    let b = h.exec(key(2), 0, 5, false);
    h.pool_terminal(key(1), 0, PoolTerminal::Outcome { exec: a });
    h.pool_terminal(key(1), 0, PoolTerminal::Outcome { exec: b });
    assert!(broken(&h).contains(&"replays equal the original"));
}

#[test]
fn an_ask_that_never_ends() {
    let h = History::new();
    h.issue(key(1), 5, T, ms(0));
    assert_eq!(broken(&h), vec!["exactly one outcome per ask"]);
}

#[test]
fn an_ask_that_outlives_its_deadline() {
    let h = History::new();
    let no = h.issue(key(1), 5, T, ms(0));
    let end = AskEnd::Error {
        code: ErrorCode::AskTimeout,
        terminal: AckStage::terminal_for_code(ErrorCode::AskTimeout),
        exec: None,
        message: String::new(),
    };
    h.end(no, end, None, T + ms(1));
    assert_eq!(broken(&h), vec!["every ask ends within its deadline"]);
}

#[test]
fn a_wrong_value_or_another_payloads_reply() {
    let h = History::new();
    let no = h.issue(key(1), 5, T, ms(0));
    let exec = h.exec(key(1), 0, 5, false);
    h.end(
        no,
        AskEnd::Reply(Answer {
            value: expected_value(5) + 1,
            exec,
        }),
        None,
        ms(1),
    );
    assert_eq!(broken(&h), vec!["replies are right"]);

    let h = History::new();
    let exec = answered(&h, key(1), 5, 0);
    let no = h.issue(key(1), 6, T, ms(20));
    h.end(
        no,
        AskEnd::Reply(Answer {
            value: expected_value(6),
            exec,
        }),
        None,
        ms(21),
    );
    assert_eq!(broken(&h), vec!["replays equal the original"]);
}

#[test]
fn refusals_need_a_cause() {
    let mismatch = AskEnd::Error {
        code: ErrorCode::PayloadMismatch,
        terminal: AckStage::terminal_for_code(ErrorCode::PayloadMismatch),
        exec: None,
        message: String::new(),
    };
    let h = History::new();
    let no = h.issue(key(1), 5, T, ms(0));
    h.end(no, mismatch.clone(), None, ms(1));
    assert_eq!(broken(&h), vec!["mismatch only for a different payload"]);

    let h = History::new();
    answered(&h, key(1), 6, 0);
    let no = h.issue(key(1), 5, T, ms(20));
    h.end(no, mismatch, None, ms(21));
    assert_eq!(broken(&h), Vec::<&str>::new());

    let h = History::new();
    let no = h.issue(key(1), 5, T, ms(0));
    let pending = AskEnd::Error {
        code: ErrorCode::InvalidArgument,
        terminal: AckStage::terminal_for_code(ErrorCode::InvalidArgument),
        exec: None,
        message: "already pending".into(),
    };
    h.end(no, pending.clone(), None, ms(1));
    assert_eq!(broken(&h), vec!["errors have a cause"]);

    // Another ask of the id issued after this one but sent first (the log
    // holds an ask's issue before its send): it was pending during this
    // one, which is cause enough (a real-clock run reported this once).
    let h = History::new();
    let refused = h.issue(key(1), 5, T, ms(0));
    let first = h.issue(key(1), 5, T, ms(0));
    h.end(refused, pending.clone(), None, ms(1));
    h.end(first, AskEnd::LocalCancel, None, ms(2));
    assert_eq!(broken(&h), Vec::<&str>::new());
    // One that ended before this one was issued is no cause.
    let h = History::new();
    let earlier = h.issue(key(1), 5, T, ms(0));
    h.end(earlier, AskEnd::LocalCancel, None, ms(1));
    let refused = h.issue(key(1), 5, T, ms(2));
    h.end(refused, pending, None, ms(3));
    assert_eq!(broken(&h), vec!["errors have a cause"]);
}

/// A history of one answered ask whose stage stream was `stages`.
fn with_stages(stages: Vec<AckStage>) -> History {
    let h = History::new();
    let no = h.issue(key(1), 5, T, ms(0));
    let exec = h.exec(key(1), 0, 5, false);
    let reply = AskEnd::Reply(Answer {
        value: expected_value(5),
        exec,
    });
    h.end(no, reply, Some(stages), ms(1));
    h
}

#[test]
fn stages_that_go_backwards_or_miss_their_terminal() {
    use AckStage::*;
    let monotone = vec!["ack stages are monotone"];
    assert_eq!(
        broken(&with_stages(vec![Sent, Read, Received, Fulfilled])),
        monotone
    );
    assert_eq!(broken(&with_stages(vec![Sent, Received])), monotone);
    assert_eq!(
        broken(&with_stages(vec![Sent, Received, Fulfilled, Failed])),
        monotone
    );
    assert_eq!(broken(&with_stages(vec![Received, Fulfilled])), monotone);
    assert!(broken(&with_stages(vec![
        Sent, Received, Read, Partial, Partial, Fulfilled
    ]))
    .is_empty());
}

#[test]
fn a_late_outcome_without_a_timed_out_ask() {
    let h = History::new();
    let exec = answered(&h, key(1), 5, 0);
    h.late(key(1), Some(exec), None);
    assert_eq!(broken(&h), vec!["late outcomes reconcile once"]);

    let h = History::new();
    let no = h.issue(key(1), 5, T, ms(0));
    let exec = h.exec(key(1), 0, 5, false);
    let timeout = AskEnd::Error {
        code: ErrorCode::AskTimeout,
        terminal: AckStage::terminal_for_code(ErrorCode::AskTimeout),
        exec: None,
        message: String::new(),
    };
    h.end(no, timeout, None, T);
    h.late(key(1), Some(exec), None);
    assert_eq!(broken(&h), Vec::<&str>::new());
    h.late(key(1), Some(exec), None);
    assert_eq!(broken(&h), vec!["late outcomes reconcile once"]);
}

fn timed_out(h: &History, k: Key, at: u64) -> usize {
    let no = h.issue(k, 5, T, ms(at));
    let timeout = AskEnd::Error {
        code: ErrorCode::AskTimeout,
        terminal: AckStage::terminal_for_code(ErrorCode::AskTimeout),
        exec: None,
        message: String::new(),
    };
    h.end(no, timeout, None, ms(at) + T);
    no
}

#[test]
fn a_cancel_that_did_no_work_is_not_a_late_outcome() {
    // The answer to the caller's own cancel, and the pool's processing
    // timeout (a timeout, which no outcome reconciles to).
    for reason in [
        CancelReason::CallerTimeout,
        CancelReason::Caller,
        CancelReason::ProcessingTimeout,
        CancelReason::Shutdown,
    ] {
        let h = History::new();
        timed_out(&h, key(1), 0);
        h.late(key(1), None, Some(reason));
        assert_eq!(
            broken(&h),
            vec!["a cancel that did no work is not a late outcome"]
        );
    }
    // The worker's own cancel (its handler gave up) is one.
    let h = History::new();
    timed_out(&h, key(1), 0);
    h.late(key(1), None, Some(CancelReason::Worker));
    assert_eq!(broken(&h), Vec::<&str>::new());
}

fn dlq(h: &History, asks: Vec<usize>, dropped: u64) {
    h.dead_letters(DlqSnapshot {
        caller: key(1).caller,
        asks,
        dropped,
        in_end_order: true,
        seq: 0,
    });
}

#[test]
fn a_timed_out_asks_dead_letter_stays_until_a_late_outcome() {
    const GONE: &str = "a timed-out ask keeps its dead letter unless a late outcome came";
    // Kept: fine.
    let h = History::new();
    let a = timed_out(&h, key(1), 0);
    dlq(&h, vec![a], 0);
    assert_eq!(broken(&h), Vec::<&str>::new());

    // Gone with no late outcome and nothing dropped: broken.
    let h = History::new();
    timed_out(&h, key(1), 0);
    dlq(&h, vec![], 0);
    assert_eq!(broken(&h), vec![GONE]);

    // Gone because the pool's answer to the timeout's cancel took it.
    let h = History::new();
    timed_out(&h, key(1), 0);
    h.late(key(1), None, Some(CancelReason::CallerTimeout));
    dlq(&h, vec![], 0);
    let b = broken(&h);
    assert!(b.contains(&GONE), "{b:?}");

    // Gone with a genuine late outcome: fine.
    let h = History::new();
    let exec = h.exec(key(1), 0, 5, false);
    timed_out(&h, key(1), 0);
    h.late(key(1), Some(exec), None);
    dlq(&h, vec![], 0);
    assert_eq!(broken(&h), Vec::<&str>::new());

    // Dropped for room: only a letter older than every one left can be.
    let h = History::new();
    let old = timed_out(&h, key(1), 0);
    let new = timed_out(&h, key(2), 200);
    let _ = old;
    dlq(&h, vec![new], 1);
    assert_eq!(broken(&h), Vec::<&str>::new());
    let h = History::new();
    let old = timed_out(&h, key(1), 0);
    timed_out(&h, key(2), 200);
    dlq(&h, vec![old], 1);
    assert_eq!(broken(&h), vec![GONE]);

    // A letter of an ask that did not fail.
    let h = History::new();
    answered(&h, key(1), 5, 0);
    dlq(&h, vec![0], 0);
    assert_eq!(broken(&h), vec!["dead letters are failed asks"]);
}

#[test]
fn a_request_after_its_cancel_runs() {
    let h = History::new();
    assert!(h.pool_saw(key(1), 0, FirstFrame::Cancel));
    assert!(!h.pool_saw(key(1), 0, FirstFrame::Request));
    // Another incarnation forgot the tombstone: it may run the key.
    assert!(h.pool_saw(key(1), 1, FirstFrame::Request));
    answered(&h, key(1), 5, 1);
    assert_eq!(broken(&h), Vec::<&str>::new());
    h.exec(key(1), 0, 5, false);
    assert_eq!(broken(&h), vec!["a request after its cancel never runs"]);
}

#[test]
fn ids_that_changed_on_the_way() {
    let h = History::new();
    let k = key(1);
    let ids = expected_ids(k.caller, k.request);
    h.check_ids("reply", ids, ids, true);
    assert_eq!(broken(&h), Vec::<&str>::new());
    assert_eq!(h.replies_checked(), 1);
    let mut forged = ids;
    forged.correlation_id = CorrelationId::from_u128(7);
    h.check_ids("reply", ids, forged, true);
    assert_eq!(broken(&h), vec!["ids propagate unchanged"]);
}

#[test]
fn a_late_outcome_that_leaves_its_dead_letter() {
    let h = History::new();
    let exec = h.exec(key(1), 0, 5, false);
    let a = timed_out(&h, key(1), 0);
    h.late(key(1), Some(exec), None);
    dlq(&h, vec![a], 0);
    assert_eq!(
        broken(&h),
        vec!["a late outcome takes its ask's dead letter"]
    );
}
