//! The invariants of the protocol, checked over a run's history, per request
//! id, against what the state model allows.
//!
//! Crash model: a pool that restarts loses its dedup table and everything in
//! flight; nothing it had admitted gets an answer from it. A request the
//! caller re-sends afterwards (it never saw an Ack) runs again in the new
//! incarnation. So a key may run once per incarnation of its pool, and the
//! checker allows exactly that: two executions of one key in one
//! incarnation are a violation, whatever the faults.

use std::collections::BTreeMap;
use std::time::Duration;

use askpool::{AckStage, ErrorCode};
use rustc_hash::FxHashMap;
use serde::Serialize;

use crate::history::{AskEnd, Log, PoolTerminal};
use crate::model::{expected_value, Key};

/// One broken invariant.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Violation {
    pub invariant: &'static str,
    pub detail: String,
}

impl std::fmt::Display for Violation {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}: {}", self.invariant, self.detail)
    }
}

/// Codes that answer an ask whose id timed out at its caller.
pub fn is_timeout(code: ErrorCode) -> bool {
    matches!(code, ErrorCode::AskTimeout | ErrorCode::DeadlineExceeded)
}

/// Checks every invariant the history alone can show. `slack` is how late
/// past its deadline an ask may end (zero on a paused clock: the runtime's
/// timers fire exactly; scheduling delay on a real one).
pub fn check(log: &Log, slack: Duration) -> Vec<Violation> {
    let mut out = Vec::new();
    let mut v = |invariant: &'static str, detail: String| {
        out.push(Violation { invariant, detail });
    };

    // At most one execution per key per incarnation.
    let mut runs: BTreeMap<(Key, u32), Vec<u64>> = BTreeMap::new();
    for (exec, e) in log.execs.iter().enumerate() {
        runs.entry((e.key, e.incarnation))
            .or_default()
            .push(exec as u64);
    }
    for ((key, incarnation), execs) in &runs {
        if execs.len() > 1 {
            v(
                "at most one execution per cached key",
                format!(
                    "{key:?} ran {} times in incarnation {incarnation}: execs {execs:?}",
                    execs.len()
                ),
            );
        }
    }

    // What pools sent per key and incarnation: the first terminal wins, and
    // every later one repeats it exactly (no reply after a cancel, replays
    // identical to the original).
    for ((key, incarnation), frames) in &log.pool_frames {
        let first = frames[0];
        for later in &frames[1..] {
            if *later != first {
                let what = match (first, later) {
                    (PoolTerminal::Cancelled, PoolTerminal::Outcome { .. }) => {
                        "no reply after an accepted cancel"
                    }
                    _ => "replays equal the original",
                };
                v(
                    what,
                    format!(
                        "{key:?} (incarnation {incarnation}): first {first:?}, later {later:?}"
                    ),
                );
            }
        }
        for frame in frames {
            if let PoolTerminal::Outcome { exec } = frame {
                match log.execs.get(*exec as usize) {
                    Some(e) if e.key == *key && e.incarnation == *incarnation => {}
                    other => v(
                        "replays equal the original",
                        format!("{key:?} sent the outcome of exec {exec}, which is {other:?}"),
                    ),
                }
            }
        }
    }

    // Each ask: exactly one outcome, within its deadline, and a right one.
    let mut timeouts: FxHashMap<Key, u32> = FxHashMap::default();
    let mut payloads: FxHashMap<Key, Vec<(u64, u64)>> = FxHashMap::default();
    for ask in &log.asks {
        payloads
            .entry(ask.key)
            .or_default()
            .push((ask.issued_seq, ask.payload));
    }
    for (no, ask) in log.asks.iter().enumerate() {
        match ask.ends {
            1 => {}
            0 => {
                v(
                    "exactly one outcome per ask",
                    format!("ask {no} ({:?}) never ended", ask.key),
                );
                continue;
            }
            n => v(
                "exactly one outcome per ask",
                format!("ask {no} ({:?}) ended {n} times", ask.key),
            ),
        }
        let took = ask.ended_at.saturating_sub(ask.issued_at);
        if took > ask.timeout + slack {
            v(
                "every ask ends within its deadline",
                format!(
                    "ask {no} ({:?}) took {took:?}, its timeout was {:?}",
                    ask.key, ask.timeout
                ),
            );
        }
        let end = ask.end.as_ref().expect("an ended ask has an end");
        let exec = match end {
            AskEnd::Reply(answer) => {
                if answer.value != expected_value(ask.payload) {
                    v(
                        "replies are right",
                        format!(
                            "ask {no} got value {} for payload {}",
                            answer.value, ask.payload
                        ),
                    );
                }
                Some(answer.exec)
            }
            AskEnd::Error {
                code: ErrorCode::HandlerFailed,
                exec,
                message,
            } => {
                if exec.is_none() {
                    v(
                        "replies are right",
                        format!("ask {no} got a handler error no handler made: {message}"),
                    );
                }
                *exec
            }
            AskEnd::Error {
                code: ErrorCode::PayloadMismatch,
                ..
            } => {
                let other = payloads[&ask.key]
                    .iter()
                    .any(|&(seq, p)| seq < ask.ended_seq && p != ask.payload);
                if !other {
                    v(
                        "mismatch only for a different payload",
                        format!("ask {no} ({:?}) got PayloadMismatch but no other payload was ever sent for its id", ask.key),
                    );
                }
                None
            }
            AskEnd::Error {
                code: ErrorCode::InvalidArgument,
                message,
                ..
            } => {
                if ask.outstanding_at_issue == 0 {
                    v(
                        "errors have a cause",
                        format!("ask {no} refused ({message}) with no other ask of its id pending"),
                    );
                }
                None
            }
            AskEnd::Error { code, .. } => {
                if is_timeout(*code) {
                    *timeouts.entry(ask.key).or_default() += 1;
                }
                None
            }
            AskEnd::LocalCancel => None,
        };
        if let Some(exec) = exec {
            match log.execs.get(exec as usize) {
                Some(e) if e.key == ask.key && e.payload == ask.payload => {
                    let failed = matches!(end, AskEnd::Error { .. });
                    if e.fail != failed {
                        v(
                            "replays equal the original",
                            format!(
                                "ask {no} got {end:?} from exec {exec}, which {} fail",
                                if e.fail { "did" } else { "did not" }
                            ),
                        );
                    }
                }
                other => v(
                    "replays equal the original",
                    format!(
                        "ask {no} ({:?}, payload {}) got the outcome of exec {exec}: {other:?}",
                        ask.key, ask.payload
                    ),
                ),
            }
        }
        if let Some(stages) = &ask.stages {
            check_stages(no, stages, end, &mut v);
        }
    }

    // Late outcomes: each answers one timed-out ask, and is a real outcome.
    let mut late_per_key: FxHashMap<Key, u32> = FxHashMap::default();
    for late in &log.late {
        *late_per_key.entry(late.key).or_default() += 1;
        if let Some(exec) = late.exec {
            match log.execs.get(exec as usize) {
                Some(e) if e.key == late.key => {}
                other => v(
                    "late outcomes reconcile once",
                    format!(
                        "late outcome for {:?} names exec {exec}: {other:?}",
                        late.key
                    ),
                ),
            }
        }
    }
    for (key, n) in late_per_key {
        let timed_out = timeouts.get(&key).copied().unwrap_or(0);
        if n > timed_out {
            v(
                "late outcomes reconcile once",
                format!("{key:?}: {n} late outcomes for {timed_out} timed-out asks"),
            );
        }
    }
    out
}

/// Stages move forward only, with one terminal that matches the outcome.
fn check_stages(
    no: usize,
    stages: &[AckStage],
    end: &AskEnd,
    v: &mut impl FnMut(&'static str, String),
) {
    for pair in stages.windows(2) {
        let (a, b) = (pair[0], pair[1]);
        let forward = b.rank() > a.rank() || (a == AckStage::Partial && b == AckStage::Partial);
        if !forward || a.is_terminal() {
            v(
                "ack stages are monotone",
                format!("ask {no}: {a:?} then {b:?} in {stages:?}"),
            );
        }
    }
    if stages.first() != Some(&AckStage::Sent) {
        v(
            "ack stages are monotone",
            format!("ask {no}: stages start {stages:?}"),
        );
    }
    let terminal = stages.iter().copied().find(|s| s.is_terminal());
    let expected = match end {
        AskEnd::Reply(_) => Some(AckStage::Fulfilled),
        AskEnd::Error { code, .. } => Some(AckStage::terminal_for_code(*code)),
        AskEnd::LocalCancel => None,
    };
    if expected.is_some() && terminal != expected {
        v(
            "ack stages are monotone",
            format!("ask {no} ended {end:?} but its stages are {stages:?}"),
        );
    }
}
