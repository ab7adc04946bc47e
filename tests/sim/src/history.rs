//! What happened in a run, recorded as it happens: asks issued and ended,
//! handler executions, the terminal frames pools sent, late outcomes. The
//! checker reads it afterwards. One lock, taken briefly: this is the test's
//! notebook, not the system under test.

use std::time::Duration;

use askpool::{AckStage, CallerId, ErrorCode, RequestId};
use parking_lot::Mutex;
use rustc_hash::FxHashMap;

use crate::model::{Answer, Key};

/// How an ask ended, as its caller saw it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum AskEnd {
    Reply(Answer),
    Error {
        code: ErrorCode,
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
    /// Asks of the same caller and request id still outstanding when this
    /// one was issued (the runtime refuses a second pending ask per id).
    pub outstanding_at_issue: u32,
    pub ends: u32,
    pub end: Option<AskEnd>,
    pub ended_at: Duration,
    pub ended_seq: u64,
    /// Stage events, when this ask's stream was watched.
    pub stages: Option<Vec<AckStage>>,
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
    Cancelled,
}

/// An outcome that arrived after its ask had timed out.
#[derive(Clone, Debug)]
pub struct LateRecord {
    pub key: Key,
    /// The execution whose outcome it was, if it was a handler's.
    pub exec: Option<u64>,
}

#[derive(Default)]
pub struct Log {
    seq: u64,
    pub asks: Vec<AskRecord>,
    pub execs: Vec<ExecRecord>,
    /// Terminal frames per (key, pool incarnation), in the order sent.
    pub pool_frames: FxHashMap<(Key, u32), Vec<PoolTerminal>>,
    pub late: Vec<LateRecord>,
    outstanding: FxHashMap<(CallerId, RequestId), u32>,
}

/// The run's notebook.
#[derive(Default)]
pub struct History {
    log: Mutex<Log>,
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
        let outstanding = log
            .outstanding
            .entry((key.caller, key.request))
            .or_default();
        let before = *outstanding;
        *outstanding += 1;
        log.asks.push(AskRecord {
            key,
            payload,
            issued_at: now,
            issued_seq: seq,
            timeout,
            outstanding_at_issue: before,
            ends: 0,
            end: None,
            ended_at: Duration::ZERO,
            ended_seq: 0,
            stages: None,
        });
        log.asks.len() - 1
    }

    /// Records how ask `no` ended.
    pub fn end(&self, no: usize, end: AskEnd, stages: Option<Vec<AckStage>>, now: Duration) {
        let mut log = self.log.lock();
        log.seq += 1;
        let seq = log.seq;
        let ask = &mut log.asks[no];
        ask.ends += 1;
        if ask.ends == 1 {
            ask.end = Some(end);
            ask.ended_at = now;
            ask.ended_seq = seq;
            ask.stages = stages;
        }
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

    pub fn late(&self, key: Key, exec: Option<u64>) {
        self.log.lock().late.push(LateRecord { key, exec });
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
