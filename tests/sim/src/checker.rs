//! The invariants of the protocol, checked over a run's history, per request
//! id, against what the state model allows.
//!
//! Crash model: a pool that restarts loses its dedup table and everything in
//! flight; nothing it had admitted gets an answer from it. A request the
//! caller re-sends afterwards (it never saw an Ack) runs again in the new
//! incarnation. So a key may run once per incarnation of its pool, and the
//! checker allows exactly that: two executions of one key in one
//! incarnation are a violation, whatever the faults.
//!
//! The same holds for a tombstone: a cancel that reached a pool incarnation
//! before any request for its key makes that incarnation answer the key's
//! requests `AskCancelled`; none of them may run there.

use std::collections::BTreeMap;
use std::time::Duration;

use askpool::{AckStage, ErrorClass, ErrorCode};
use rustc_hash::{FxHashMap, FxHashSet};
use serde::Serialize;

use crate::history::{AskEnd, FirstFrame, Log, PoolTerminal};
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
    // A cancel before any request: that incarnation never runs the key.
    for ((key, incarnation), first) in &log.pool_first {
        if *first != FirstFrame::Cancel {
            continue;
        }
        if let Some(execs) = runs.get(&(*key, *incarnation)) {
            v(
                "a request after its cancel never runs",
                format!(
                    "{key:?} (incarnation {incarnation}) was cancelled before any request, then ran: execs {execs:?}"
                ),
            );
        }
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
                    (
                        PoolTerminal::Cancelled,
                        PoolTerminal::Outcome { .. } | PoolTerminal::Failed { .. },
                    ) => "no reply after an accepted cancel",
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
    // Each ask's lifetime in the log's order: (ask, issued, ended).
    let mut lifetimes: FxHashMap<Key, Vec<(usize, u64, u64)>> = FxHashMap::default();
    for (no, ask) in log.asks.iter().enumerate() {
        payloads
            .entry(ask.key)
            .or_default()
            .push((ask.issued_seq, ask.payload));
        let ended = if ask.end.is_some() {
            ask.ended_seq
        } else {
            u64::MAX
        };
        lifetimes
            .entry(ask.key)
            .or_default()
            .push((no, ask.issued_seq, ended));
    }
    for (no, ask) in log.asks.iter().enumerate() {
        let Some(end) = &ask.end else {
            v(
                "exactly one outcome per ask",
                format!("ask {no} ({:?}) never ended", ask.key),
            );
            continue;
        };
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
                ..
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
                // Refused as already pending: another ask of its id lived
                // at some time during this one. Not only at its issue: the
                // workload logs an ask's issue before it sends it, so one
                // issued just after (on another thread) may be sent first.
                let overlapped = lifetimes[&ask.key].iter().any(|&(other, issued, ended)| {
                    other != no && issued < ask.ended_seq && ended > ask.issued_seq
                });
                if !overlapped {
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

    // Late outcomes: each answers one timed-out ask, and is a real outcome:
    // the pool's answer to the caller's own cancel, its processing timeout
    // or its closing is not one.
    let mut late_per_key: FxHashMap<Key, u32> = FxHashMap::default();
    for late in &log.late {
        *late_per_key.entry(late.key).or_default() += 1;
        if !late.is_genuine() {
            v(
                "a cancel that did no work is not a late outcome",
                format!(
                    "late outcome for {:?}: Cancelled({:?})",
                    late.key,
                    late.cancelled.expect("only a cancel is not genuine")
                ),
            );
        }
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

    check_dead_letters(log, &mut v);

    // Every frame of an ask, either way, carries the ids it was given.
    for m in &log.ids_mismatches {
        v(
            "ids propagate unchanged",
            format!("{}: expected {:?}, got {:?}", m.at, m.expected, m.got),
        );
    }
    out
}

/// A timed-out ask leaves a dead letter, which only a genuine late outcome
/// of its request id takes away (or the queue, dropping its oldest letter
/// for room); and a genuine late outcome does take one: held against the
/// letters left at the end of the run.
fn check_dead_letters(log: &Log, v: &mut impl FnMut(&'static str, String)) {
    let mut timed_out: BTreeMap<Key, Vec<usize>> = BTreeMap::new();
    // Asks that may have left a letter: failed with a transient or poison
    // error (a timeout always does).
    let mut may_letter: FxHashMap<Key, usize> = FxHashMap::default();
    for (no, ask) in log.asks.iter().enumerate() {
        if let Some(AskEnd::Error { code, .. }) = &ask.end {
            if is_timeout(*code) {
                timed_out.entry(ask.key).or_default().push(no);
            }
            if code.class() != ErrorClass::Permanent {
                *may_letter.entry(ask.key).or_default() += 1;
            }
        }
    }
    for snapshot in &log.dead_letters {
        let mut reconciled: FxHashMap<Key, usize> = FxHashMap::default();
        for late in &log.late {
            if late.is_genuine() && late.key.caller == snapshot.caller && late.seq < snapshot.seq {
                *reconciled.entry(late.key).or_default() += 1;
            }
        }
        let mut oldest_left: Option<u64> = None;
        for &no in &snapshot.asks {
            match log.asks.get(no) {
                Some(ask) if ask.key.caller == snapshot.caller => {
                    let failed = matches!(
                        &ask.end,
                        Some(AskEnd::Error { code, .. }) if code.class() != ErrorClass::Permanent
                    );
                    if !failed {
                        v(
                            "dead letters are failed asks",
                            format!(
                                "a dead letter of {:?} names ask {no}, which ended {:?}",
                                snapshot.caller, ask.end
                            ),
                        );
                    }
                    oldest_left = Some(oldest_left.map_or(ask.ended_seq, |o| o.min(ask.ended_seq)));
                }
                other => v(
                    "dead letters are failed asks",
                    format!(
                        "a dead letter of {:?} names ask {no}: {other:?}",
                        snapshot.caller
                    ),
                ),
            }
        }
        let left: FxHashSet<usize> = snapshot.asks.iter().copied().collect();
        // A genuine late outcome takes a letter of its request id: at most
        // (letters ever queued) - (late outcomes) are left.
        let mut left_per_key: BTreeMap<Key, usize> = BTreeMap::new();
        for &no in &snapshot.asks {
            if let Some(ask) = log.asks.get(no) {
                if let Some(AskEnd::Error { code, .. }) = &ask.end {
                    if code.class() != ErrorClass::Permanent {
                        *left_per_key.entry(ask.key).or_default() += 1;
                    }
                }
            }
        }
        for (key, n) in &left_per_key {
            let queued = may_letter.get(key).copied().unwrap_or(0);
            let late = reconciled.get(key).copied().unwrap_or(0);
            if *n + late > queued {
                v(
                    "a late outcome takes its ask's dead letter",
                    format!(
                        "{key:?}: {n} letters left, {late} genuine late outcomes, at most {queued} letters ever queued"
                    ),
                );
            }
        }
        for (key, asks) in timed_out
            .range(..)
            .filter(|(k, _)| k.caller == snapshot.caller)
        {
            let missing: Vec<usize> = asks
                .iter()
                .copied()
                .filter(|no| !left.contains(no))
                .collect();
            if missing.is_empty() {
                continue;
            }
            let late = reconciled.get(key).copied().unwrap_or(0);
            // A letter dropped for room was queued before every letter left.
            let droppable = match (snapshot.dropped, snapshot.in_end_order) {
                (0, _) => 0,
                (_, false) => missing.len(),
                (_, true) => missing
                    .iter()
                    .filter(|&&no| oldest_left.is_none_or(|o| log.asks[no].ended_seq < o))
                    .count(),
            };
            if missing.len() > late + droppable {
                v(
                    "a timed-out ask keeps its dead letter unless a late outcome came",
                    format!(
                        "{key:?}: timed-out asks {asks:?}, letters of {missing:?} gone; {late} genuine late outcomes, {} letters dropped for room ({droppable} of these could be)",
                        snapshot.dropped
                    ),
                );
            }
        }
    }
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
        AskEnd::Error { terminal, .. } => Some(*terminal),
        AskEnd::LocalCancel => None,
    };
    if expected.is_some() && terminal != expected {
        v(
            "ack stages are monotone",
            format!("ask {no} ended {end:?} but its stages are {stages:?}"),
        );
    }
}
