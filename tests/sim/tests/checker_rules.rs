//! Each invariant of the checker, on hand-made histories: a clean one
//! passes, and each breakage is reported under its own name.

use std::time::Duration;

use askpool::{AckStage, CallerId, ErrorCode, RequestId};
use askpool_sim::checker::check;
use askpool_sim::history::{AskEnd, History, PoolTerminal};
use askpool_sim::model::{expected_value, Answer, Key};

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
fn an_ask_that_never_ends_or_ends_twice() {
    let h = History::new();
    h.issue(key(1), 5, T, ms(0));
    assert_eq!(broken(&h), vec!["exactly one outcome per ask"]);

    let h = History::new();
    let no = h.issue(key(1), 5, T, ms(0));
    h.end(no, AskEnd::LocalCancel, None, ms(1));
    h.end(no, AskEnd::LocalCancel, None, ms(2));
    assert_eq!(broken(&h), vec!["exactly one outcome per ask"]);
}

#[test]
fn an_ask_that_outlives_its_deadline() {
    let h = History::new();
    let no = h.issue(key(1), 5, T, ms(0));
    let end = AskEnd::Error {
        code: ErrorCode::AskTimeout,
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
        exec: None,
        message: "already pending".into(),
    };
    h.end(no, pending, None, ms(1));
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
    h.late(key(1), Some(exec));
    assert_eq!(broken(&h), vec!["late outcomes reconcile once"]);

    let h = History::new();
    let no = h.issue(key(1), 5, T, ms(0));
    let exec = h.exec(key(1), 0, 5, false);
    let timeout = AskEnd::Error {
        code: ErrorCode::AskTimeout,
        exec: None,
        message: String::new(),
    };
    h.end(no, timeout, None, T);
    h.late(key(1), Some(exec));
    assert_eq!(broken(&h), Vec::<&str>::new());
    h.late(key(1), Some(exec));
    assert_eq!(broken(&h), vec!["late outcomes reconcile once"]);
}
