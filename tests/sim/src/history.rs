//! What happened in a run, recorded as it happens: asks issued and ended,
//! handler executions, the terminal frames pools sent, the first frame each
//! pool incarnation saw per key, late outcomes, frames whose ids were not
//! their ask's, and the dead letters left at the end. The checker reads it
//! afterwards. One lock, taken briefly: this is the test's
//! notebook, not the system under test.

use std::time::Duration;

use std::sync::atomic::{AtomicU64, Ordering};

use askpool::{AckStage, AskIds, CallerId, CancelReason, ErrorCode, RequestId};
use parking_lot::Mutex;
use rustc_hash::{FxHashMap, FxHashSet};

use crate::model::{Answer, Key};

/// How an ask ended, as its caller saw it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum AskEnd {
    Reply(Answer),
    Error {
        code: ErrorCode,
        /// The terminal stage the error maps to.
        terminal: AckStage,
        /// The execution a handler error came from.
        exec: Option<u64>,
        message: String,
    },
    /// The caller gave up first (dropped the handle).
    LocalCancel,
}

#[derive(Clone, Debug)]
pub struct AskRecord {
    pub key: Key,
    pub payload: u64,
    pub issued_at: Duration,
    pub issued_seq: u64,
    pub timeout: Duration,
    /// How it ended; `None` while it has not.
    pub end: Option<AskEnd>,
    pub ended_at: Duration,
    pub ended_seq: u64,
    /// Stage events, when this ask's stream was watched.
    pub stages: Option<Vec<AckStage>>,
    /// The workload awaited it a while after sending it: its end time is
    /// when the workload looked, not when the outcome came.
    pub awaited_late: bool,
}

/// One handler execution.
#[derive(Clone, Debug)]
pub struct ExecRecord {
    pub key: Key,
    pub incarnation: u32,
    pub payload: u64,
    pub fail: bool,
}

/// A terminal frame a pool sent (before the network did anything to it).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PoolTerminal {
    /// A handler's outcome (a reply or a handler error), by execution.
    Outcome {
        exec: u64,
    },
    /// A reply whose error no handler made (a reply is final, whatever its
    /// error, and cached like any other).
    Failed {
        code: ErrorCode,
    },
    Cancelled,
}

/// An outcome that arrived after its ask had timed out.
#[derive(Clone, Debug)]
pub struct LateRecord {
    pub key: Key,
    /// The execution whose outcome it was, if it was a handler's.
    pub exec: Option<u64>,
    /// Why the request was cancelled, if the late outcome was a cancel.
    pub cancelled: Option<CancelReason>,
    pub seq: u64,
}

impl LateRecord {
    /// Whether it is the outcome of the work (a reply, or the worker's own
    /// cancel), not a cancel that did no work: the pool's answer to the
    /// caller's cancel, its processing timeout or its closing.
    pub fn is_genuine(&self) -> bool {
        !matches!(
            self.cancelled,
            Some(
                CancelReason::Caller
                    | CancelReason::CallerTimeout
                    | CancelReason::ProcessingTimeout
                    | CancelReason::Shutdown
            )
        )
    }
}

/// The first frame a pool incarnation was handed for a key.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FirstFrame {
    Request,
    /// A cancel before any request: the pool must keep a tombstone, and
    /// never run the key in this incarnation.
    Cancel,
}

/// A frame whose ids were not the ones its ask was given.
#[derive(Clone, Debug)]
pub struct IdsMismatch {
    /// Where it was seen: "reply", "frame to the caller", "request", ...
    pub at: &'static str,
    pub expected: AskIds,
    pub got: AskIds,
}

/// A caller's dead-letter queue when the run was over.
#[derive(Clone, Debug)]
pub struct DlqSnapshot {
    pub caller: CallerId,
    /// The asks whose letters it holds, oldest first.
    pub asks: Vec<usize>,
    /// Letters it dropped because it was full.
    pub dropped: u64,
    /// Whether letters were queued in the order the history records their
    /// asks' ends (one thread), so a letter dropped for room is older than
    /// every letter left.
    pub in_end_order: bool,
    /// When it was taken, in the history's sequence (set by
    /// [`History::dead_letters`]): a late outcome after it took no letter
    /// from it.
    pub seq: u64,
}

#[derive(Default)]
pub struct Log {
    seq: u64,
    pub asks: Vec<AskRecord>,
    pub execs: Vec<ExecRecord>,
    /// Terminal frames per (key, pool incarnation), in the order sent.
    pub pool_frames: FxHashMap<(Key, u32), Vec<PoolTerminal>>,
    pub late: Vec<LateRecord>,
    /// Per (key, pool incarnation), the first frame the pool was handed.
    pub pool_first: FxHashMap<(Key, u32), FirstFrame>,
    pub ids_mismatches: Vec<IdsMismatch>,
    /// The dead letters left at the end of the run, per caller (empty when
    /// the run did not look: a hand-made history).
    pub dead_letters: Vec<DlqSnapshot>,
    /// Keys some attempt of which a pool refused (full, closed).
    pub refused: FxHashSet<Key>,
    outstanding: FxHashMap<(CallerId, RequestId), u32>,
}

/// The run's notebook.
#[derive(Default)]
pub struct History {
    log: Mutex<Log>,
    replies_checked: AtomicU64,
}

impl History {
    pub fn new() -> Self {
        Self::default()
    }

    /// Records an ask being issued; returns its number.
    pub fn issue(&self, key: Key, payload: u64, timeout: Duration, now: Duration) -> usize {
        let mut log = self.log.lock();
        log.seq += 1;
        let seq = log.seq;
        *log.outstanding
            .entry((key.caller, key.request))
            .or_default() += 1;
        log.asks.push(AskRecord {
            key,
            payload,
            issued_at: now,
            issued_seq: seq,
            timeout,
            end: None,
            ended_at: Duration::ZERO,
            ended_seq: 0,
            stages: None,
            awaited_late: false,
        });
        log.asks.len() - 1
    }

    /// Ask `no` is awaited late (see `AskRecord::awaited_late`).
    pub fn awaited_late(&self, no: usize) {
        self.log.lock().asks[no].awaited_late = true;
    }

    /// Records how ask `no` ended (once: its future resolves once, and the
    /// workload records that).
    pub fn end(&self, no: usize, end: AskEnd, stages: Option<Vec<AckStage>>, now: Duration) {
        let mut log = self.log.lock();
        log.seq += 1;
        let seq = log.seq;
        let ask = &mut log.asks[no];
        assert!(ask.end.is_none(), "ask {no} recorded as ended twice");
        ask.end = Some(end);
        ask.ended_at = now;
        ask.ended_seq = seq;
        ask.stages = stages;
        let id = (ask.key.caller, ask.key.request);
        if let Some(n) = log.outstanding.get_mut(&id) {
            *n -= 1;
            if *n == 0 {
                log.outstanding.remove(&id);
            }
        }
    }

    /// Records a handler execution starting; returns its number.
    pub fn exec(&self, key: Key, incarnation: u32, payload: u64, fail: bool) -> u64 {
        let mut log = self.log.lock();
        log.execs.push(ExecRecord {
            key,
            incarnation,
            payload,
            fail,
        });
        log.execs.len() as u64 - 1
    }

    pub fn pool_terminal(&self, key: Key, incarnation: u32, frame: PoolTerminal) {
        self.log
            .lock()
            .pool_frames
            .entry((key, incarnation))
            .or_default()
            .push(frame);
    }

    pub fn late(&self, key: Key, exec: Option<u64>, cancelled: Option<CancelReason>) {
        let mut log = self.log.lock();
        log.seq += 1;
        let seq = log.seq;
        log.late.push(LateRecord {
            key,
            exec,
            cancelled,
            seq,
        });
    }

    /// Records that pool incarnation `incarnation` was handed a request
    /// (or a cancel) for `key`; returns whether it was the first frame for
    /// the key there.
    pub fn pool_saw(&self, key: Key, incarnation: u32, frame: FirstFrame) -> bool {
        let mut log = self.log.lock();
        let mut first = false;
        log.pool_first.entry((key, incarnation)).or_insert_with(|| {
            first = true;
            frame
        });
        first
    }

    /// Holds a frame's ids against the ones its ask was given; `reply`
    /// counts the replies checked.
    pub fn check_ids(&self, at: &'static str, expected: AskIds, got: AskIds, reply: bool) {
        if reply {
            self.replies_checked.fetch_add(1, Ordering::Relaxed);
        }
        if expected != got {
            self.log
                .lock()
                .ids_mismatches
                .push(IdsMismatch { at, expected, got });
        }
    }

    /// Replies whose ids were checked.
    /// A pool refused an attempt of `key`.
    pub fn refused(&self, key: Key) {
        self.log.lock().refused.insert(key);
    }

    /// Timed-out asks whose key no pool ever refused, and asks answered
    /// AskCancelled whose key no ask timed out or gave up on: in a run
    /// without faults or cancels, what nothing explains.
    pub fn unexplained_ends(&self) -> (u64, u64) {
        let log = self.log.lock();
        let timed_out = |a: &AskRecord| matches!(&a.end, Some(AskEnd::Error { code, .. }) if crate::checker::is_timeout(*code));
        let gave_up: FxHashSet<Key> = log
            .asks
            .iter()
            .filter(|a| timed_out(a) || matches!(a.end, Some(AskEnd::LocalCancel)))
            .map(|a| a.key)
            .collect();
        let timeouts = log
            .asks
            .iter()
            .filter(|a| timed_out(a) && !log.refused.contains(&a.key))
            .count() as u64;
        let cancels = log
            .asks
            .iter()
            .filter(|a| {
                matches!(
                    &a.end,
                    Some(AskEnd::Error {
                        code: ErrorCode::AskCancelled,
                        ..
                    })
                ) && !gave_up.contains(&a.key)
            })
            .count() as u64;
        (timeouts, cancels)
    }

    pub fn replies_checked(&self) -> u64 {
        self.replies_checked.load(Ordering::Relaxed)
    }

    pub fn dead_letters(&self, mut snapshot: DlqSnapshot) {
        let mut log = self.log.lock();
        log.seq += 1;
        snapshot.seq = log.seq;
        log.dead_letters.push(snapshot);
    }

    pub fn executions(&self) -> u64 {
        self.log.lock().execs.len() as u64
    }

    /// Asks issued and not yet ended.
    pub fn outstanding(&self) -> usize {
        self.log
            .lock()
            .outstanding
            .values()
            .map(|&n| n as usize)
            .sum()
    }

    pub fn with_log<T>(&self, f: impl FnOnce(&Log) -> T) -> T {
        f(&self.log.lock())
    }
}
