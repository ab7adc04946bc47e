//! What a simulation run does: its workload, its faults, and its clock.

use std::ops::Range;
use std::time::Duration;

use serde::Serialize;

/// Faults the network applies to frames. Probabilities are per frame.
#[derive(Clone, Debug, Serialize)]
pub struct FaultConfig {
    /// A frame vanishes (its sender believes it was sent).
    pub drop: f64,
    /// A frame arrives twice.
    pub duplicate: f64,
    /// A frame is held back until the next frame on its path has passed it.
    pub reorder: f64,
    /// Every frame waits a time drawn uniformly from this range (ms) before
    /// it arrives; an empty range (`0..0`) means no delay.
    pub delay_ms: Range<u64>,
    /// A reply a handler produced is lost after its outcome was cached: the
    /// request executed, the caller never hears (execute-then-lose-the-reply).
    pub lose_reply: f64,
    /// Mean time between the fault events below while faults are on (ms).
    pub event_every_ms: u64,
    /// Relative weights of the fault events: clog a path (frames on it are
    /// held, in order, until the clog ends), partition a pool (frames to and
    /// from it are lost), restart a pool (its process dies and comes back).
    pub clog_weight: u32,
    pub partition_weight: u32,
    pub restart_weight: u32,
    /// How long a clog or a partition lasts (ms, uniform).
    pub outage_ms: Range<u64>,
}

impl FaultConfig {
    /// No faults at all.
    pub fn none() -> Self {
        Self {
            drop: 0.0,
            duplicate: 0.0,
            reorder: 0.0,
            delay_ms: 0..0,
            lose_reply: 0.0,
            event_every_ms: 0,
            clog_weight: 0,
            partition_weight: 0,
            restart_weight: 0,
            outage_ms: 0..0,
        }
    }

    /// Whether clog / partition / restart events happen.
    pub fn has_events(&self) -> bool {
        self.event_every_ms > 0
            && self.clog_weight + self.partition_weight + self.restart_weight > 0
    }
}

/// The longest duration a run accepts, in milliseconds (an hour).
pub const MAX_MS: u64 = 3_600_000;

/// Most pools, and most callers, a run accepts (each is a node).
pub const MAX_NODES: u32 = 256;

/// A whole run.
#[derive(Clone, Debug, Serialize)]
pub struct SimConfig {
    pub seed: u64,
    /// Asks issued in total.
    pub asks: u64,
    /// Caller nodes; each draws its request ids from its own small pool.
    pub callers: u32,
    /// Distinct request ids per caller: small, so ids collide and are reused
    /// (replays, payload mismatches, already-pending refusals).
    pub ids_per_caller: u32,
    /// Worker pools, each hosted by its own node (a process that can crash).
    pub pools: u32,
    /// Concurrent handlers per pool.
    pub workers: u32,
    /// Asks outstanding at once (the driver waits for a slot).
    pub window: u32,
    /// How long a handler works (ms, uniform).
    pub work_ms: Range<u64>,
    /// Timeout of each ask (ms, uniform).
    pub timeout_ms: Range<u64>,
    /// Share of asks whose caller gives up (cancels) before the timeout.
    pub cancel: f64,
    /// Share of reused ids sent with a different payload.
    pub mismatch: f64,
    /// Share of payloads whose handler fails (the error is cached and
    /// replayed like a reply).
    pub handler_error: f64,
    /// Share of asks whose stage stream is watched and checked.
    pub watch_stages: f64,
    /// Share of asks first awaited only a while after they were sent (the
    /// longest frame delay and a little more): their Ack has mostly come by
    /// then, so they wait for their deadline in the node's shared deadline
    /// queue rather than on a timer of their own.
    pub await_later: f64,
    pub faults: FaultConfig,
    /// Paused tokio clock (reproducible, time jumps) or the real one.
    pub paused: bool,
    /// On the real clock, how much later than its timeout an ask may end
    /// before the deadline invariant fails: scheduling delay on a loaded
    /// machine, not protocol time. Ignored on the paused clock, where
    /// deadlines are checked exactly.
    pub deadline_slack: Duration,
    /// Deliberately break the protocol (to show that the checker notices).
    pub sabotage: Option<Sabotage>,
}

/// Protocol breakage a test can switch on to prove the checker catches it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
pub enum Sabotage {
    /// The network delivers, ahead of a real reply, a copy with a forged
    /// execution number: a replay that differs from the original.
    ForgeReplay,
    /// A pool loses its dedup state without the restart being recorded: to
    /// the checker, a key then runs twice within one incarnation.
    ForgetDedup,
    /// The network changes the correlation id of some replies: the caller
    /// accepts a reply that does not carry its ask's ids.
    ForgeIds,
    /// A pool never hears a cancel that arrives before its request, so it
    /// keeps no tombstone and runs the request when it comes.
    SkipTombstones,
}

impl SimConfig {
    /// The tier `cargo xtask test` runs for each of its seeds: every fault
    /// on, moderate rates, a paused clock.
    pub fn test_tier(seed: u64, asks: u64) -> Self {
        Self {
            seed,
            asks,
            callers: 3,
            ids_per_caller: 96,
            pools: 2,
            workers: 4,
            window: 64,
            work_ms: 0..40,
            timeout_ms: 300..2_000,
            cancel: 0.05,
            mismatch: 0.05,
            handler_error: 0.05,
            watch_stages: 0.25,
            await_later: 0.25,
            faults: FaultConfig {
                drop: 0.05,
                duplicate: 0.05,
                reorder: 0.05,
                delay_ms: 0..20,
                lose_reply: 0.02,
                event_every_ms: 400,
                clog_weight: 2,
                partition_weight: 1,
                restart_weight: 1,
                outage_ms: 50..400,
            },
            paused: true,
            deadline_slack: Duration::ZERO,
            sabotage: None,
        }
    }

    /// The request-id space of one pool: the most dedup entries it can hold
    /// for this run, so the cache never has to evict during the run (and a
    /// second execution of a key is then always a bug).
    pub fn keys_per_pool(&self) -> usize {
        (self.callers as usize) * (self.ids_per_caller as usize)
    }

    /// The longest an ask may live.
    pub fn max_timeout(&self) -> Duration {
        Duration::from_millis(self.timeout_ms.end.max(self.timeout_ms.start + 1))
    }

    pub fn validate(&self) -> Result<(), String> {
        let p = |name: &str, x: f64| {
            if (0.0..=1.0).contains(&x) {
                Ok(())
            } else {
                Err(format!("{name} must be a probability in 0..=1, got {x}"))
            }
        };
        p("drop", self.faults.drop)?;
        p("dup", self.faults.duplicate)?;
        p("reorder", self.faults.reorder)?;
        p("lose-reply", self.faults.lose_reply)?;
        p("cancel", self.cancel)?;
        p("mismatch", self.mismatch)?;
        p("handler-error", self.handler_error)?;
        p("watch-stages", self.watch_stages)?;
        p("await-later", self.await_later)?;
        let positive = |name: &str, x: u64| {
            if x == 0 {
                Err(format!("{name} must be at least 1"))
            } else {
                Ok(())
            }
        };
        positive("asks", self.asks)?;
        positive("callers", self.callers.into())?;
        positive("ids-per-caller", self.ids_per_caller.into())?;
        positive("pools", self.pools.into())?;
        positive("workers", self.workers.into())?;
        positive("window", self.window.into())?;
        // Each pool and each caller is a node of its own (a pool's reply
        // cache alone takes about a megabyte up front): a mistyped count
        // must be refused, not exhaust the machine's memory.
        for (name, n) in [("pools", self.pools), ("callers", self.callers)] {
            if n > MAX_NODES {
                return Err(format!("{name} must be at most {MAX_NODES}, got {n}"));
            }
        }
        if self.workers as usize > askpool::MAX_CONCURRENCY {
            return Err(format!(
                "workers must be at most {}, got {}",
                askpool::MAX_CONCURRENCY,
                self.workers
            ));
        }
        let range = |name: &str, r: &Range<u64>| {
            if r.start > r.end {
                Err(format!(
                    "{name}: the range {}..{} is backwards",
                    r.start, r.end
                ))
            } else {
                Ok(())
            }
        };
        range("delay-ms", &self.faults.delay_ms)?;
        range("work-ms", &self.work_ms)?;
        range("timeout-ms", &self.timeout_ms)?;
        range("outage-ms", &self.faults.outage_ms)?;
        // The run adds these to clock readings and to each other, and on the
        // real clock waits them out after traffic stops: past this bound a
        // run overflows or never ends.
        let bounded = |name: &str, ms: u64| {
            if ms > MAX_MS {
                Err(format!(
                    "{name} must be at most {MAX_MS} ms (an hour), got {ms}"
                ))
            } else {
                Ok(())
            }
        };
        bounded("delay-ms", self.faults.delay_ms.end)?;
        bounded("work-ms", self.work_ms.end)?;
        bounded("timeout-ms", self.timeout_ms.end)?;
        bounded("outage-ms", self.faults.outage_ms.end)?;
        bounded("outage-every-ms", self.faults.event_every_ms)?;
        if self.timeout_ms.start == 0 {
            return Err("timeout-ms must start at 1 ms or more".into());
        }
        Ok(())
    }
}

/// Draws from a half-open ms range; an empty range gives its start.
pub(crate) fn draw_ms(rng: &mut impl rand::Rng, range: &Range<u64>) -> Duration {
    if range.end <= range.start {
        Duration::from_millis(range.start)
    } else {
        Duration::from_millis(rng.random_range(range.clone()))
    }
}
