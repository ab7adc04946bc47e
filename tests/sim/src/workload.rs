//! One simulated run: caller nodes and pool nodes linked through the fault
//! network, a driver that issues asks, a scheduler of clogs, partitions and
//! restarts; then the faults heal, traffic stops, and everything is checked.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use askpool::{
    BreakerConfig, DedupConfig, Node, NodeConfig, NodeStats, PoolConfig, PoolName, PoolStats,
    RequestId, RetryPolicy, TimeoutConfig, WorkerPool,
};
use futures::{FutureExt, StreamExt};
use parking_lot::Mutex;
use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};
use tokio::task::JoinSet;

use crate::checker::{check, Violation};
use crate::config::{draw_ms, Sabotage, SimConfig};
use crate::history::{AskEnd, DlqSnapshot, History};
use crate::model::{
    exec_of_error, expected_ids, expected_value, explicit_ids, fingerprint, handler_error, Answer,
    Job, Key,
};
use crate::net::{Dir, FaultNet, Link, Path};
use crate::report::{peak_rss_bytes, percentiles, RunReport, Summary};

type SimNode = Node<Job, Answer>;

/// Counts a progress display reads while the run goes on.
#[derive(Default)]
pub struct Live {
    pub issued: AtomicU64,
    pub ended: AtomicU64,
    pub fulfilled: AtomicU64,
    pub failed: AtomicU64,
    pub timed_out: AtomicU64,
    pub cancelled: AtomicU64,
}

/// A pool's process: its node, and whether it is alive.
struct PoolHost {
    incarnation: u32,
    alive: Arc<AtomicBool>,
    node: SimNode,
    _pool: WorkerPool<Job, Answer>,
}

/// Dedup entries live this long: longer than any run, so nothing is evicted
/// by age while the checker counts executions per key.
const DEDUP_TTL: Duration = Duration::from_secs(3_600);

struct Cluster {
    cfg: SimConfig,
    net: Arc<FaultNet>,
    history: Arc<History>,
    names: Vec<PoolName>,
    hosts: Mutex<Vec<PoolHost>>,
    /// Stats of pool incarnations that crashed, so totals cover the run.
    retired: Mutex<Vec<PoolStats>>,
    restarts: AtomicU64,
}

impl Cluster {
    fn processing_timeout(&self) -> Duration {
        self.cfg.max_timeout()
    }

    fn max_in_flight(&self) -> usize {
        (self.cfg.window as usize / self.cfg.pools as usize).max(4)
    }

    fn start_pool(self: &Arc<Self>, index: u32, incarnation: u32) -> PoolHost {
        let alive = Arc::new(AtomicBool::new(true));
        let link = Link::pool(&self.net, index, incarnation, Arc::clone(&alive));
        let node = SimNode::with_transport(
            link,
            NodeConfig {
                seed: Some(self.cfg.seed ^ (u64::from(index) << 40) ^ u64::from(incarnation)),
                ..NodeConfig::default()
            },
        );
        let history = Arc::clone(&self.history);
        let pool = node
            .pool(self.names[index as usize].clone())
            .config(PoolConfig {
                concurrency: self.cfg.workers as usize,
                max_in_flight: self.max_in_flight(),
                dedup: DedupConfig {
                    max_terminal: self.cfg.keys_per_pool(),
                    terminal_ttl: DEDUP_TTL,
                },
                processing_timeout: Some(self.processing_timeout()),
                batch_acks: false,
            })
            .handler(move |job: Job, ctx| {
                let history = Arc::clone(&history);
                async move {
                    let ids = *ctx.ids();
                    let key = Key {
                        pool: index,
                        caller: ids.caller_id,
                        request: ctx.request_id(),
                    };
                    let expected = expected_ids(key.caller, key.request);
                    history.check_ids("handler", expected, ids, false);
                    let exec = history.exec(key, incarnation, job.payload, job.fail);
                    ctx.progress(0.5, "working").unwrap();
                    tokio::select! {
                        biased;
                        _ = tokio::time::sleep(job.work) => {}
                        _ = ctx.cancelled() => {}
                    }
                    if job.fail {
                        Err(handler_error(exec))
                    } else {
                        Ok(Answer {
                            value: expected_value(job.payload),
                            exec,
                        })
                    }
                }
            })
            .expect("a pool of a fresh node starts");
        PoolHost {
            incarnation,
            alive,
            node,
            _pool: pool,
        }
    }

    /// The pool's process dies (it sends nothing more, its memory is gone)
    /// and a new one takes its place under the same name.
    fn restart(self: &Arc<Self>, index: u32) {
        let mut hosts = self.hosts.lock();
        let old = &hosts[index as usize];
        old.alive.store(false, Ordering::Release);
        if let Some(stats) = old.node.stats().pools.into_iter().next() {
            self.retired.lock().push(stats);
        }
        old.node.shutdown();
        // Sabotage: the new process forgets, but the history is not told
        // that it is a new incarnation.
        let next = match self.cfg.sabotage {
            Some(Sabotage::ForgetDedup) => old.incarnation,
            _ => old.incarnation + 1,
        };
        hosts[index as usize] = self.start_pool(index, next);
        self.restarts.fetch_add(1, Ordering::Relaxed);
        self.net.trace(("restart", index, next));
    }
}

fn caller_config(cfg: &SimConfig, caller: u32) -> NodeConfig {
    NodeConfig {
        seed: Some(
            cfg.seed
                .wrapping_mul(31)
                .wrapping_add(u64::from(caller) + 1),
        ),
        retry: RetryPolicy {
            max_attempts: 6,
            initial_delay: Duration::from_millis(25),
            multiplier: 2.0,
            max_delay: Duration::from_millis(400),
            ..RetryPolicy::default()
        },
        default_timeout: cfg.max_timeout(),
        timeouts: TimeoutConfig {
            delivery: Some(Duration::from_millis(1_500)),
            read: None,
            processing: None,
        },
        dlq_capacity: 64,
        reconcile_capacity: 256,
        reconcile_window: Duration::from_secs(5),
        track_stages: true,
        breaker: Some(BreakerConfig::default()),
        ..NodeConfig::default()
    }
}

/// Runs `cfg` on a fresh current-thread runtime: paused (reproducible) or
/// real, as the config says.
pub fn run_blocking(cfg: SimConfig, live: Arc<Live>) -> RunReport {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .start_paused(cfg.paused)
        .build()
        .expect("a tokio runtime");
    runtime.block_on(run(cfg, live))
}

/// Runs `cfg` on the current runtime.
pub async fn run(cfg: SimConfig, live: Arc<Live>) -> RunReport {
    let started = std::time::Instant::now();
    let history = Arc::new(History::new());
    let names: Vec<PoolName> = (0..cfg.pools)
        .map(|i| PoolName::new(format!("pool-{i}")))
        .collect();
    let net = FaultNet::new(
        cfg.seed,
        cfg.faults.clone(),
        &names,
        Arc::clone(&history),
        cfg.sabotage,
    );
    let cluster = Arc::new(Cluster {
        cfg: cfg.clone(),
        net: Arc::clone(&net),
        history: Arc::clone(&history),
        names: names.clone(),
        hosts: Mutex::new(Vec::new()),
        retired: Mutex::new(Vec::new()),
        restarts: AtomicU64::new(0),
    });
    let hosts: Vec<PoolHost> = (0..cfg.pools).map(|i| cluster.start_pool(i, 0)).collect();
    *cluster.hosts.lock() = hosts;
    let callers: Vec<SimNode> = (0..cfg.callers)
        .map(|c| {
            let node = SimNode::with_transport(Link::caller(&net), caller_config(&cfg, c));
            let history = Arc::clone(&history);
            let net = Arc::clone(&net);
            node.on_late_outcome(move |late| {
                let Some(pool) = net.pool_index(&late.pool) else {
                    return;
                };
                let (exec, cancelled) = match &late.result {
                    askpool::LateResult::Reply(Ok(answer)) => (Some(answer.exec), None),
                    askpool::LateResult::Reply(Err(e)) => (exec_of_error(e), None),
                    askpool::LateResult::Cancelled(reason) => (None, Some(*reason)),
                };
                let key = Key {
                    pool,
                    caller: late.ids.caller_id,
                    request: late.ids.request_id,
                };
                history.late(key, exec, cancelled);
            });
            node
        })
        .collect();
    let baseline_tasks = tokio::runtime::Handle::current()
        .metrics()
        .num_alive_tasks();

    // Faults: clogs, partitions and restarts until the driver is done.
    let issuing = Arc::new(AtomicBool::new(true));
    let scheduler = cfg.faults.has_events().then(|| {
        let cluster = Arc::clone(&cluster);
        let issuing = Arc::clone(&issuing);
        tokio::spawn(async move { schedule_faults(cluster, issuing).await })
    });

    let mut rng = SmallRng::seed_from_u64(cfg.seed);
    // Its own stream, so that the asks a seed issues do not depend on it.
    let mut later_rng = SmallRng::seed_from_u64(cfg.seed ^ 0x006c_6174_6572);
    let window = Arc::new(tokio::sync::Semaphore::new(cfg.window as usize));
    let mut asks = JoinSet::new();
    for _ in 0..cfg.asks {
        let permit = Arc::clone(&window)
            .acquire_owned()
            .await
            .expect("the window is never closed");
        // Reap finished tasks as we go so the set stays small.
        while asks.try_join_next().is_some() {}
        let c = rng.random_range(0..cfg.callers);
        let id = rng.random_range(0..cfg.ids_per_caller);
        let pool = rng.random_range(0..cfg.pools);
        let base = (u64::from(c) << 32) | u64::from(id);
        let payload = if rng.random_bool(cfg.mismatch) {
            base | (rng.random_range(1..4u64) << 48)
        } else {
            base
        };
        let fail = (expected_value(payload) % 10_000) < (cfg.handler_error * 10_000.0) as u64;
        let work = draw_ms(&mut rng, &cfg.work_ms);
        let timeout = draw_ms(&mut rng, &cfg.timeout_ms).max(Duration::from_millis(1));
        let cancel_after = rng
            .random_bool(cfg.cancel)
            .then(|| Duration::from_millis(rng.random_range(0..timeout.as_millis() as u64)));
        let watch = rng.random_bool(cfg.watch_stages);
        // Never past half the ask's timeout: the ask's end is recorded when
        // the workload looks, so a longer pause would be charged to the
        // runtime as a missed deadline (frames slower than the timeouts).
        let await_after = later_rng.random_bool(cfg.await_later).then(|| {
            Duration::from_millis(cfg.faults.delay_ms.end.max(cfg.faults.delay_ms.start) + 5)
                .min(timeout / 2)
        });
        let node = callers[c as usize].clone();
        let key = Key {
            pool,
            caller: node.caller_id(),
            // A request id names one request to one pool: ids are drawn
            // per caller and pool (reuse across pools is not supported).
            request: RequestId::from_parts(1 + u64::from(pool), u64::from(id)),
        };
        let pool_name = names[pool as usize].clone();
        let history = Arc::clone(&history);
        let net = Arc::clone(&net);
        let live = Arc::clone(&live);
        live.issued.fetch_add(1, Ordering::Relaxed);
        asks.spawn(async move {
            let no = history.issue(key, payload, timeout, net.elapsed());
            let mut ask = node
                .ask(
                    pool_name,
                    Job {
                        ask: no,
                        payload,
                        work,
                        fail,
                    },
                )
                .request_id(key.request)
                .fingerprint(fingerprint(payload))
                .timeout(timeout);
            let (correlation, causation) = explicit_ids(key.request);
            if let Some(c) = correlation {
                ask = ask.correlation_id(c);
            }
            if let Some(c) = causation {
                ask = ask.causation_id(c);
            }
            let mut handle = ask.send();
            let expected = expected_ids(key.caller, key.request);
            history.check_ids("ask", expected, *handle.ids(), false);
            let mut stages = watch.then(|| handle.stages());
            let mut cancel_after = cancel_after;
            if let Some(pause) = await_after {
                history.awaited_late(no);
                tokio::time::sleep(pause).await;
                cancel_after = cancel_after.map(|after| after.saturating_sub(pause));
            }
            let result = match cancel_after {
                None => Some((&mut handle).await),
                Some(after) => tokio::select! {
                    biased;
                    r = &mut handle => Some(r),
                    _ = tokio::time::sleep(after) => None,
                },
            };
            drop(handle);
            let end = match result {
                Some(Ok(answer)) => AskEnd::Reply(answer),
                Some(Err(e)) => AskEnd::Error {
                    code: e.code(),
                    terminal: askpool::AckStage::terminal_for_error(&e),
                    exec: exec_of_error(&e),
                    message: e.to_string(),
                },
                None => AskEnd::LocalCancel,
            };
            let stages = stages.as_mut().map(|s| {
                let mut seen = Vec::new();
                while let Some(Some(event)) = s.next().now_or_never() {
                    seen.push(event.stage);
                }
                seen
            });
            let counter = match &end {
                AskEnd::Reply(_) => &live.fulfilled,
                AskEnd::Error { code, .. } if crate::checker::is_timeout(*code) => &live.timed_out,
                AskEnd::Error {
                    code: askpool::ErrorCode::AskCancelled,
                    ..
                }
                | AskEnd::LocalCancel => &live.cancelled,
                AskEnd::Error { .. } => &live.failed,
            };
            counter.fetch_add(1, Ordering::Relaxed);
            live.ended.fetch_add(1, Ordering::Relaxed);
            net.trace(("end", no, format!("{end:?}")));
            history.end(no, end, stages, net.elapsed());
            drop(permit);
        });
    }

    // Heal, then every outstanding ask must end within its deadline.
    issuing.store(false, Ordering::Release);
    if let Some(s) = scheduler {
        // Its only await is the gap before the next event: waiting that out
        // would keep the faults on (and, on the real clock, the run idle)
        // for up to several `event_every_ms` after the last ask was issued.
        s.abort();
        let _ = s.await;
    }
    net.heal();
    let mut violations = Vec::new();
    let guard = cfg.max_timeout() + Duration::from_secs(5);
    let drained =
        tokio::time::timeout(guard, async { while asks.join_next().await.is_some() {} }).await;
    if drained.is_err() {
        violations.push(Violation {
            invariant: "every ask ends within its deadline",
            detail: format!(
                "{} asks still outstanding {guard:?} after the faults healed",
                history.outstanding()
            ),
        });
        asks.abort_all();
    } else {
        // Every ask has ended and dropped its handle: nothing it held may
        // be left, not even a deadline that has yet to come.
        check_released(&callers, &mut violations);
    }

    // Traffic has stopped: let the frames still delayed on their way arrive
    // (healing releases only held ones) and processing deadlines pass, then
    // everything must be back within its bounds.
    let longest_delay =
        Duration::from_millis(cfg.faults.delay_ms.end.max(cfg.faults.delay_ms.start));
    tokio::time::sleep(longest_delay + cluster.processing_timeout() + Duration::from_millis(200))
        .await;
    check_bounds(&cluster, &callers, baseline_tasks, &mut violations);
    if cfg.paused {
        // On a paused clock an hour costs nothing: every cache must empty,
        // and every record kept to reconcile a late outcome must be gone.
        let reconcile_window = caller_config(&cfg, 0).reconcile_window;
        tokio::time::sleep(DEDUP_TTL.max(reconcile_window) + Duration::from_secs(1)).await;
        check_settled(&callers, &mut violations);
        for host in cluster.hosts.lock().iter() {
            host.node.evict_expired();
            for pool in host.node.stats().pools {
                if pool.dedup.terminal != 0 {
                    violations.push(Violation {
                        invariant: "caches return to their bounds",
                        detail: format!(
                            "{}: {} terminal entries left after their TTL",
                            pool.name, pool.dedup.terminal
                        ),
                    });
                }
            }
        }
    }

    for node in &callers {
        history.dead_letters(DlqSnapshot {
            caller: node.caller_id(),
            asks: node.dead_letters().iter().map(|l| l.payload.ask).collect(),
            dropped: node.stats().dlq_dropped,
            in_end_order: cfg.paused,
            seq: 0,
        });
    }
    let slack = if cfg.paused {
        Duration::ZERO
    } else {
        cfg.deadline_slack
    };
    violations.extend(history.with_log(|log| check(log, slack)));
    let summary = summarize(&cfg, &cluster, &callers, &live, started.elapsed());
    for node in &callers {
        node.shutdown();
    }
    for host in cluster.hosts.lock().iter() {
        host.node.shutdown();
    }
    RunReport {
        config: cfg,
        summary,
        violations,
    }
}

async fn schedule_faults(cluster: Arc<Cluster>, issuing: Arc<AtomicBool>) {
    let cfg = &cluster.cfg;
    let faults = &cfg.faults;
    let mut rng = SmallRng::seed_from_u64(cfg.seed ^ 0x6661_756c_7473);
    let mean = faults.event_every_ms as f64;
    let total = faults.clog_weight + faults.partition_weight + faults.restart_weight;
    while issuing.load(Ordering::Acquire) {
        // Exponential gaps: events come as a Poisson process.
        let u: f64 = rng.random_range(f64::EPSILON..1.0);
        tokio::time::sleep(Duration::from_micros((-u.ln() * mean * 1_000.0) as u64)).await;
        if !issuing.load(Ordering::Acquire) {
            return;
        }
        let pool = rng.random_range(0..cfg.pools);
        let outage = draw_ms(&mut rng, &faults.outage_ms);
        let pick = rng.random_range(0..total);
        if pick < faults.clog_weight {
            let dir = if rng.random_bool(0.5) {
                Dir::ToPool
            } else {
                Dir::ToCaller
            };
            cluster.net.clog(Path { pool, dir }, outage);
        } else if pick < faults.clog_weight + faults.partition_weight {
            cluster.net.partition(pool, outage);
        } else {
            cluster.restart(pool);
        }
    }
}

/// When traffic has stopped, every map, timer, queue and cache is within
/// its bound, and every task the run started has ended.
fn check_bounds(
    cluster: &Cluster,
    callers: &[SimNode],
    baseline_tasks: usize,
    violations: &mut Vec<Violation>,
) {
    let mut v = |detail: String| {
        violations.push(Violation {
            invariant:
                "pending maps, timers, in-flight counts, caches and DLQ return to their bounds",
            detail,
        });
    };
    for node in callers {
        let s = node.stats();
        let who = node.caller_id();
        if s.pending != 0 || s.armed_timers != 0 || s.queued_deadlines != 0 {
            v(format!(
                "caller {who:?}: {} pending asks, {} armed timers, {} queued deadlines",
                s.pending, s.armed_timers, s.queued_deadlines
            ));
        }
    }
    for host in cluster.hosts.lock().iter() {
        for p in host.node.stats().pools {
            if p.in_flight != 0 || p.queued != 0 || p.expiry_index != 0 || p.dedup.in_progress != 0
            {
                v(format!(
                    "{}: in flight {}, queued {}, expiry index {}, in-progress entries {}",
                    p.name, p.in_flight, p.queued, p.expiry_index, p.dedup.in_progress
                ));
            }
            if p.dedup.terminal > cluster.cfg.keys_per_pool() {
                v(format!("{}: {} terminal entries", p.name, p.dedup.terminal));
            }
        }
    }
    let mut every_incarnation = cluster.retired.lock().clone();
    for host in cluster.hosts.lock().iter() {
        every_incarnation.extend(host.node.stats().pools);
    }
    for p in &every_incarnation {
        if p.dedup.evicted_capacity + p.dedup.evicted_ttl != 0 {
            v(format!(
                "{}: the dedup cache evicted during the run, so executions per key cannot be checked",
                p.name
            ));
        }
    }
    let held = cluster.net.stats().held_now;
    if held != 0 {
        v(format!(
            "the network still holds {held} frames after healing"
        ));
    }
    // The workers of live pools were there before; each pool may also have
    // started its processing-deadline sweeper and its reply-cache TTL
    // sweep, and each caller node its ask-deadline sweeper and its
    // timed-out-records sweep, which live as long as their pool or node
    // (the TTL and records sweeps until nothing is left to age out).
    let tasks = tokio::runtime::Handle::current()
        .metrics()
        .num_alive_tasks();
    let allowed = baseline_tasks + 2 * (cluster.cfg.pools as usize + cluster.cfg.callers as usize);
    if tasks > allowed {
        v(format!(
            "{tasks} tasks alive after the run, at most {allowed} expected"
        ));
    }
}

/// Right after the last ask ended: each removed its pending entry, its
/// timer and its place in the deadline queue when it ended (the queue's
/// places would otherwise be held until the deadline came).
fn check_released(callers: &[SimNode], violations: &mut Vec<Violation>) {
    for node in callers {
        let s = node.stats();
        if s.pending != 0 || s.armed_timers != 0 || s.queued_deadlines != 0 {
            violations.push(Violation {
                invariant: "an ask that ends releases what it held",
                detail: format!(
                    "caller {:?}, all asks ended: {} pending asks, {} armed timers, {} queued deadlines",
                    node.caller_id(),
                    s.pending,
                    s.armed_timers,
                    s.queued_deadlines
                ),
            });
        }
    }
}

/// Long after traffic stopped (past the reconcile window): nothing is
/// pending, no timer or deadline is queued, and every record kept to
/// reconcile a late outcome has aged out.
fn check_settled(callers: &[SimNode], violations: &mut Vec<Violation>) {
    for node in callers {
        let s = node.stats();
        if s.pending != 0
            || s.armed_timers != 0
            || s.queued_deadlines != 0
            || s.timed_out_records != 0
        {
            violations.push(Violation {
                invariant: "pending asks, timers and timeout records return to 0 when traffic stops",
                detail: format!(
                    "caller {:?}, past the reconcile window: {} pending asks, {} armed timers, {} queued deadlines, {} timed-out records",
                    node.caller_id(),
                    s.pending,
                    s.armed_timers,
                    s.queued_deadlines,
                    s.timed_out_records
                ),
            });
        }
    }
}

fn summarize(
    cfg: &SimConfig,
    cluster: &Cluster,
    callers: &[SimNode],
    live: &Live,
    elapsed: Duration,
) -> Summary {
    let caller_stats: Vec<NodeStats> = callers.iter().map(|n| n.stats()).collect();
    let mut pools: Vec<PoolStats> = cluster.retired.lock().clone();
    for host in cluster.hosts.lock().iter() {
        pools.extend(host.node.stats().pools);
    }
    let latencies = cluster.history.with_log(|log| {
        log.asks
            .iter()
            // An ask awaited late ends when the workload looked: its
            // latency would be the workload's pause.
            .filter(|a| matches!(a.end, Some(AskEnd::Reply(_))) && !a.awaited_late)
            .map(|a| a.ended_at.saturating_sub(a.issued_at).as_micros() as u64)
            .collect::<Vec<_>>()
    });
    let net = cluster.net.stats();
    let get = |a: &AtomicU64| a.load(Ordering::Relaxed);
    let (timed_out_unrefused, cancelled_unexplained) = cluster.history.unexplained_ends();
    Summary {
        asks: cfg.asks,
        fulfilled: get(&live.fulfilled),
        failed: get(&live.failed),
        timed_out: get(&live.timed_out),
        cancelled: get(&live.cancelled),
        timed_out_unrefused,
        cancelled_unexplained,
        frames: net.frames,
        frames_dropped: net.dropped + net.partitioned + net.lost_replies + net.crash_lost,
        frames_dropped_at_random: net.dropped,
        frames_partitioned: net.partitioned,
        frames_duplicated: net.duplicated,
        frames_reordered: net.reordered,
        frames_delayed: net.delayed,
        frames_clogged: net.clogged,
        replies_lost: net.lost_replies,
        restarts: cluster.restarts.load(Ordering::Relaxed),
        retries: caller_stats.iter().map(|s| s.retries).sum(),
        duplicates_suppressed: pools.iter().map(|p| p.duplicate_acks + p.replays).sum(),
        handler_executions: cluster.history.executions(),
        tombstones: pools.iter().map(|p| p.tombstones).sum(),
        late_outcomes: caller_stats.iter().map(|s| s.late_outcomes).sum(),
        replies_ids_checked: cluster.history.replies_checked(),
        dlq_size: caller_stats.iter().map(|s| s.dlq_depth).sum::<usize>() as u64,
        dlq_dropped: caller_stats.iter().map(|s| s.dlq_dropped).sum(),
        breaker_trips: caller_stats
            .iter()
            .flat_map(|s| s.breakers.iter())
            .map(|b| b.trips)
            .sum(),
        latency_us: percentiles(latencies),
        peak_rss_bytes: peak_rss_bytes(),
        elapsed_ms: elapsed.as_millis() as u64,
        trace_hash: net.trace_hash,
    }
}
