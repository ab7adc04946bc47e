//! The simulated network: a `WorkerTransport` that decides, with a seeded
//! RNG, what happens to every frame: drop, duplicate, reorder, delay, hold
//! behind a clog, lose to a partition, or lose a handler's reply after the
//! fact. Each node talks to it through its own [`Link`], so the network
//! knows which pool (and which incarnation of it) sent a frame. The
//! endpoints a link registers are tapped: what a pool incarnation is handed
//! and what a caller receives is recorded (first frame per key, ids) before
//! the node sees it.
//!
//! Decisions are made under one lock and frames are delivered after it is
//! released: delivering a frame runs the receiver's code, which may send
//! frames of its own.

use std::collections::VecDeque;
use std::hash::{DefaultHasher, Hash, Hasher};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use askpool::{
    AskError, AskIds, CallerEndpoint, CallerId, CorrelationId, InProcessTransport, PoolEndpoint,
    PoolName, ToCaller, ToWorker, WorkerTransport,
};
use parking_lot::Mutex;
use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};
use rustc_hash::FxHashMap;
use serde::Serialize;
use tokio::time::Instant;

use crate::config::{draw_ms, FaultConfig, Sabotage};
use crate::history::{FirstFrame, History, PoolTerminal};
use crate::model::{exec_of_error, expected_ids, Answer, Job, Key};

/// Which way a frame travels, and on which pool's path.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Dir {
    ToPool,
    ToCaller,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Path {
    pub pool: u32,
    pub dir: Dir,
}

#[derive(Clone)]
enum Frame {
    ToPool(ToWorker<Job>),
    ToCaller(ToCaller<Answer>),
}

enum Action {
    Now(Frame),
    After(Duration, Frame),
}

/// What the network did, counted.
#[derive(Default)]
struct Counters {
    frames: AtomicU64,
    dropped: AtomicU64,
    duplicated: AtomicU64,
    reordered: AtomicU64,
    delayed: AtomicU64,
    clogged: AtomicU64,
    partitioned: AtomicU64,
    lost_replies: AtomicU64,
    crash_lost: AtomicU64,
}

/// A snapshot of [`Counters`].
#[derive(Clone, Debug, Default, Serialize)]
pub struct NetStats {
    pub frames: u64,
    pub dropped: u64,
    pub duplicated: u64,
    pub reordered: u64,
    pub delayed: u64,
    /// Frames held behind a clog (all delivered when it cleared).
    pub clogged: u64,
    /// Frames lost to a partition.
    pub partitioned: u64,
    /// Replies lost after their request executed.
    pub lost_replies: u64,
    /// Frames a crashed pool incarnation tried to send.
    pub crash_lost: u64,
    /// Frames held in clogs and reorder slots right now.
    pub held_now: usize,
    pub trace_hash: u64,
}

struct Clog {
    until: Instant,
    held: VecDeque<Frame>,
}

struct NetState {
    rng: SmallRng,
    faults: FaultConfig,
    healed: bool,
    partitions: FxHashMap<u32, Instant>,
    clogs: FxHashMap<Path, Clog>,
    /// One frame per path waiting for the next to overtake it, with a
    /// ticket so its fallback flush releases only that frame.
    reorder: FxHashMap<Path, (u64, Frame)>,
    tickets: u64,
}

/// The network every node of a run is linked to.
pub struct FaultNet {
    inner: InProcessTransport<Job, Answer>,
    state: Mutex<NetState>,
    pools: FxHashMap<PoolName, u32>,
    counters: Counters,
    trace: Mutex<DefaultHasher>,
    history: Arc<History>,
    sabotage: Option<Sabotage>,
    start: Instant,
}

/// How long a reordered frame waits for one to overtake it.
const REORDER_FLUSH: Duration = Duration::from_millis(10);

impl FaultNet {
    pub fn new(
        seed: u64,
        faults: FaultConfig,
        pool_names: &[PoolName],
        history: Arc<History>,
        sabotage: Option<Sabotage>,
    ) -> Arc<Self> {
        Arc::new(Self {
            inner: InProcessTransport::new(),
            state: Mutex::new(NetState {
                rng: SmallRng::seed_from_u64(seed ^ 0x006e_6574_776f_726b),
                faults,
                healed: false,
                partitions: FxHashMap::default(),
                clogs: FxHashMap::default(),
                reorder: FxHashMap::default(),
                tickets: 0,
            }),
            pools: pool_names
                .iter()
                .enumerate()
                .map(|(i, n)| (n.clone(), i as u32))
                .collect(),
            counters: Counters::default(),
            trace: Mutex::new(DefaultHasher::new()),
            history,
            sabotage,
            start: Instant::now(),
        })
    }

    /// Time since the network was made (the run's clock for the history).
    pub fn elapsed(&self) -> Duration {
        self.start.elapsed()
    }

    pub fn pool_index(&self, name: &PoolName) -> Option<u32> {
        self.pools.get(name).copied()
    }

    /// Adds `parts` to the trace hash: two runs of a seed must add the same
    /// things in the same order at the same virtual times.
    pub fn trace(&self, parts: impl Hash) {
        let ms = self.elapsed().as_micros();
        let mut h = self.trace.lock();
        ms.hash(&mut *h);
        parts.hash(&mut *h);
    }

    /// Frames on `path` are held, in order, for `d`; then all go through.
    pub fn clog(self: &Arc<Self>, path: Path, d: Duration) {
        {
            let mut s = self.state.lock();
            if s.healed {
                return;
            }
            let until = Instant::now() + d;
            let clog = s.clogs.entry(path).or_insert_with(|| Clog {
                until,
                held: VecDeque::new(),
            });
            clog.until = clog.until.max(until);
        }
        self.trace(("clog", path.pool, path.dir as u8, d.as_millis()));
        let net = Arc::clone(self);
        tokio::spawn(async move {
            loop {
                let until = match net.state.lock().clogs.get(&path) {
                    Some(c) => c.until,
                    None => return,
                };
                tokio::time::sleep_until(until).await;
                if net.unclog(path, false) {
                    return;
                }
            }
        });
    }

    /// Ends the clog on `path` if it is over (or `force`), delivering what it
    /// held. Returns whether it ended.
    fn unclog(&self, path: Path, force: bool) -> bool {
        let held = {
            let mut s = self.state.lock();
            match s.clogs.get(&path) {
                Some(c) if force || c.until <= Instant::now() => {}
                Some(_) => return false,
                None => return true,
            }
            s.clogs.remove(&path).map(|c| c.held).unwrap_or_default()
        };
        for frame in held {
            self.deliver(frame);
        }
        true
    }

    /// Frames to and from pool `pool` are lost for `d`.
    pub fn partition(&self, pool: u32, d: Duration) {
        let mut s = self.state.lock();
        if s.healed {
            return;
        }
        let until = Instant::now() + d;
        let entry = s.partitions.entry(pool).or_insert(until);
        *entry = (*entry).max(until);
        drop(s);
        self.trace(("partition", pool, d.as_millis()));
    }

    /// Every fault ends: clogs and reorder slots release what they hold,
    /// partitions lift, and frames from now on travel untouched.
    pub fn heal(&self) {
        let (clogged, reordered) = {
            let mut s = self.state.lock();
            s.healed = true;
            s.faults = FaultConfig::none();
            s.partitions.clear();
            let clogged: Vec<Path> = s.clogs.keys().copied().collect();
            let reordered: Vec<Frame> = s.reorder.drain().map(|(_, (_, f))| f).collect();
            (clogged, reordered)
        };
        self.trace("heal");
        let mut clogged = clogged;
        clogged.sort_by_key(|p| (p.pool, p.dir as u8));
        for path in clogged {
            self.unclog(path, true);
        }
        for frame in reordered {
            self.deliver(frame);
        }
    }

    pub fn stats(&self) -> NetStats {
        let c = &self.counters;
        let get = |a: &AtomicU64| a.load(Ordering::Relaxed);
        let s = self.state.lock();
        NetStats {
            frames: get(&c.frames),
            dropped: get(&c.dropped),
            duplicated: get(&c.duplicated),
            reordered: get(&c.reordered),
            delayed: get(&c.delayed),
            clogged: get(&c.clogged),
            partitioned: get(&c.partitioned),
            lost_replies: get(&c.lost_replies),
            crash_lost: get(&c.crash_lost),
            held_now: s.clogs.values().map(|c| c.held.len()).sum::<usize>() + s.reorder.len(),
            trace_hash: self.trace.lock().clone().finish(),
        }
    }

    /// Hands a frame to its receiver now. A pool that is between two
    /// incarnations is unreachable for that instant: the frame is lost, as a
    /// packet to a restarting process is.
    fn deliver(&self, frame: Frame) {
        let _ = match frame {
            Frame::ToPool(f) => self.inner.send_to_pool(f),
            Frame::ToCaller(f) => self.inner.send_to_caller(f),
        };
    }

    fn count(&self, counter: &AtomicU64) {
        counter.fetch_add(1, Ordering::Relaxed);
    }

    /// Decides a frame's fate and carries it out.
    fn route(self: &Arc<Self>, path: Path, frame: Frame, is_outcome: bool) -> Result<(), AskError> {
        self.count(&self.counters.frames);
        let (actions, decision) = self.decide(path, frame, is_outcome);
        self.trace((path.pool, path.dir as u8, decision));
        let mut first = Ok(());
        for (i, action) in actions.into_iter().enumerate() {
            match action {
                Action::Now(frame) => {
                    let result = match frame {
                        Frame::ToPool(f) => self.inner.send_to_pool(f),
                        Frame::ToCaller(f) => self.inner.send_to_caller(f),
                    };
                    // A pool restarting right now is unreachable, not gone.
                    let result = match result {
                        Err(AskError::NoRoute { pool })
                            if self.pools.contains_key(&PoolName::new(&pool)) =>
                        {
                            Ok(())
                        }
                        r => r,
                    };
                    if i == 0 {
                        first = result;
                    }
                }
                Action::After(d, frame) => {
                    let net = Arc::clone(self);
                    tokio::spawn(async move {
                        tokio::time::sleep(d).await;
                        net.deliver(frame);
                    });
                }
            }
        }
        first
    }

    fn decide(
        self: &Arc<Self>,
        path: Path,
        frame: Frame,
        is_outcome: bool,
    ) -> (Vec<Action>, &'static str) {
        let mut s = self.state.lock();
        if s.healed {
            return (vec![Action::Now(frame)], "deliver");
        }
        let now = Instant::now();
        if s.partitions
            .get(&path.pool)
            .is_some_and(|&until| until > now)
        {
            self.count(&self.counters.partitioned);
            return (Vec::new(), "partitioned");
        }
        if let Some(clog) = s.clogs.get_mut(&path) {
            clog.held.push_back(frame);
            self.count(&self.counters.clogged);
            return (Vec::new(), "clogged");
        }
        let faults = s.faults.clone();
        if is_outcome && s.rng.random_bool(faults.lose_reply) {
            self.count(&self.counters.lost_replies);
            return (Vec::new(), "reply lost");
        }
        if s.rng.random_bool(faults.drop) {
            self.count(&self.counters.dropped);
            return (Vec::new(), "dropped");
        }
        // A frame waiting in the reorder slot goes right after this one.
        let overtaken = s.reorder.remove(&path).map(|(_, f)| f);
        if overtaken.is_none() && s.rng.random_bool(faults.reorder) {
            self.count(&self.counters.reordered);
            s.tickets += 1;
            let ticket = s.tickets;
            s.reorder.insert(path, (ticket, frame));
            drop(s);
            let net = Arc::clone(self);
            tokio::spawn(async move {
                tokio::time::sleep(REORDER_FLUSH).await;
                let frame = {
                    let mut s = net.state.lock();
                    match s.reorder.get(&path) {
                        Some((t, _)) if *t == ticket => s.reorder.remove(&path).map(|(_, f)| f),
                        _ => None,
                    }
                };
                if let Some(frame) = frame {
                    net.deliver(frame);
                }
            });
            return (Vec::new(), "held for reorder");
        }
        let mut copies = vec![frame];
        let mut decision = "deliver";
        if s.rng.random_bool(faults.duplicate) {
            self.count(&self.counters.duplicated);
            copies.push(copies[0].clone());
            decision = "duplicate";
        }
        if self.sabotage == Some(Sabotage::ForgeReplay) && is_outcome && s.rng.random_bool(0.05) {
            if let Frame::ToCaller(ToCaller::Reply {
                ids,
                outcome: Ok(answer),
                fingerprint,
            }) = &copies[0]
            {
                let forged = Frame::ToCaller(ToCaller::Reply {
                    ids: *ids,
                    outcome: Ok(Answer {
                        exec: answer.exec + 1_000_000_000,
                        ..*answer
                    }),
                    fingerprint: *fingerprint,
                });
                copies.insert(0, forged);
                decision = "forged";
            }
        }
        if self.sabotage == Some(Sabotage::ForgeIds) && is_outcome && s.rng.random_bool(0.05) {
            if let Frame::ToCaller(ToCaller::Reply { ids, .. }) = &mut copies[0] {
                ids.correlation_id =
                    CorrelationId::from_u128(ids.correlation_id.as_u128().wrapping_add(1));
                decision = "forged ids";
            }
        }
        copies.extend(overtaken);
        let mut actions = Vec::with_capacity(copies.len());
        for frame in copies {
            let d = draw_ms(&mut s.rng, &faults.delay_ms);
            if d.is_zero() {
                actions.push(Action::Now(frame));
            } else {
                self.count(&self.counters.delayed);
                actions.push(Action::After(d, frame));
            }
        }
        (actions, decision)
    }
}

/// How one node reaches the network.
pub struct Link {
    net: Arc<FaultNet>,
    side: Side,
}

enum Side {
    Caller,
    /// A pool's node: its index, its incarnation, and whether its process
    /// is still alive (a dead one sends nothing).
    Pool {
        pool: u32,
        incarnation: u32,
        alive: Arc<AtomicBool>,
    },
}

impl Link {
    pub fn caller(net: &Arc<FaultNet>) -> Arc<Self> {
        Arc::new(Self {
            net: Arc::clone(net),
            side: Side::Caller,
        })
    }

    pub fn pool(
        net: &Arc<FaultNet>,
        pool: u32,
        incarnation: u32,
        alive: Arc<AtomicBool>,
    ) -> Arc<Self> {
        Arc::new(Self {
            net: Arc::clone(net),
            side: Side::Pool {
                pool,
                incarnation,
                alive,
            },
        })
    }
}

impl WorkerTransport<Job, Answer> for Link {
    fn register_pool(
        &self,
        pool: PoolName,
        endpoint: Arc<dyn PoolEndpoint<Job>>,
    ) -> Result<(), AskError> {
        let endpoint = match (&self.side, self.net.pool_index(&pool)) {
            (Side::Pool { incarnation, .. }, Some(index)) => Arc::new(PoolTap {
                inner: endpoint,
                pool: index,
                incarnation: *incarnation,
                history: Arc::clone(&self.net.history),
                sabotage: self.net.sabotage,
            }),
            _ => endpoint,
        };
        self.net.inner.register_pool(pool, endpoint)
    }
    fn deregister_pool(&self, pool: &PoolName) {
        self.net.inner.deregister_pool(pool)
    }
    fn register_caller(
        &self,
        caller: CallerId,
        endpoint: Arc<dyn CallerEndpoint<Answer>>,
    ) -> Result<(), AskError> {
        let tap = Arc::new(CallerTap {
            inner: endpoint,
            history: Arc::clone(&self.net.history),
        });
        self.net.inner.register_caller(caller, tap)
    }
    fn deregister_caller(&self, caller: CallerId) {
        self.net.inner.deregister_caller(caller)
    }

    fn send_to_pool(&self, frame: ToWorker<Job>) -> Result<(), AskError> {
        let Some(pool) = self.net.pool_index(frame.pool()) else {
            return self.net.inner.send_to_pool(frame);
        };
        let path = Path {
            pool,
            dir: Dir::ToPool,
        };
        self.net.route(path, Frame::ToPool(frame), false)
    }

    fn send_to_caller(&self, frame: ToCaller<Answer>) -> Result<(), AskError> {
        let Side::Pool {
            pool,
            incarnation,
            alive,
        } = &self.side
        else {
            return self.net.inner.send_to_caller(frame);
        };
        if !alive.load(Ordering::Acquire) {
            self.net.count(&self.net.counters.crash_lost);
            return Ok(());
        }
        // A refusal is not terminal: the pool recorded nothing.
        let terminal = match &frame {
            ToCaller::Reply { ids, outcome, .. } => {
                let what = match outcome {
                    Ok(answer) => PoolTerminal::Outcome { exec: answer.exec },
                    Err(e) => match exec_of_error(e) {
                        Some(exec) => PoolTerminal::Outcome { exec },
                        None => PoolTerminal::Failed { code: e.code() },
                    },
                };
                Some((ids, what))
            }
            ToCaller::Cancelled { ids, .. } => Some((ids, PoolTerminal::Cancelled)),
            _ => None,
        };
        // Every reply is final and cached: losing one after the fact is
        // execute-then-lose-the-reply.
        let is_outcome = matches!(frame, ToCaller::Reply { .. });
        if let Some((ids, what)) = terminal {
            let key = Key {
                pool: *pool,
                caller: ids.caller_id,
                request: ids.request_id,
            };
            self.net.history.pool_terminal(key, *incarnation, what);
        }
        if let ToCaller::Refused { ids, .. } = &frame {
            self.net.history.refused(Key {
                pool: *pool,
                caller: ids.caller_id,
                request: ids.request_id,
            });
        }
        let path = Path {
            pool: *pool,
            dir: Dir::ToCaller,
        };
        self.net.route(path, Frame::ToCaller(frame), is_outcome)
    }
}

/// What a pool incarnation is handed, recorded before it sees it: the first
/// frame per key (a cancel first must leave a tombstone), and the ids.
struct PoolTap {
    inner: Arc<dyn PoolEndpoint<Job>>,
    pool: u32,
    incarnation: u32,
    history: Arc<History>,
    sabotage: Option<Sabotage>,
}

impl PoolEndpoint<Job> for PoolTap {
    fn deliver(&self, frame: ToWorker<Job>) {
        let ids = *frame.ids();
        let (at, first) = match &frame {
            ToWorker::Request(_) => ("request", FirstFrame::Request),
            ToWorker::Cancel { .. } => ("cancel", FirstFrame::Cancel),
        };
        self.history
            .check_ids(at, expected_ids(ids.caller_id, ids.request_id), ids, false);
        let key = Key {
            pool: self.pool,
            caller: ids.caller_id,
            request: ids.request_id,
        };
        let is_first = self.history.pool_saw(key, self.incarnation, first);
        // Sabotage: the pool never hears a cancel that came before its
        // request, so it keeps no tombstone and runs the request later.
        if is_first
            && first == FirstFrame::Cancel
            && self.sabotage == Some(Sabotage::SkipTombstones)
        {
            return;
        }
        self.inner.deliver(frame);
    }
}

/// What a caller receives, its ids held against its ask's before the
/// caller sees it: whatever reply it accepts passed here.
struct CallerTap {
    inner: Arc<dyn CallerEndpoint<Answer>>,
    history: Arc<History>,
}

impl CallerTap {
    fn check(&self, at: &'static str, ids: &AskIds) {
        let expected = expected_ids(ids.caller_id, ids.request_id);
        self.history.check_ids(at, expected, *ids, at == "reply");
    }
}

impl CallerEndpoint<Answer> for CallerTap {
    fn deliver(&self, frame: ToCaller<Answer>) {
        match &frame {
            ToCaller::AckBatch { acks, .. } => {
                for ids in acks {
                    self.check("ack", ids);
                }
            }
            ToCaller::Reply { ids, .. } => self.check("reply", ids),
            ToCaller::Refused { ids, .. } => self.check("refusal", ids),
            ToCaller::Cancelled { ids, .. } => self.check("cancelled", ids),
            ToCaller::Ack { ids } | ToCaller::Read { ids } | ToCaller::Progress { ids, .. } => {
                self.check("ack", ids)
            }
        }
        self.inner.deliver(frame);
    }
}
