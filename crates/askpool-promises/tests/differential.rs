//! Differential test: the SQLite store against the in-memory reference
//! model. One random operation stream (small id, key, pool and worker sets
//! so that collisions happen; a clock that creeps, jumps, and sometimes
//! steps back) drives both; every response and the full snapshot after
//! every step must be identical, the invariants must hold, and every kind
//! of operation must have succeeded at least once.
//!
//! `ASKPOOL_DIFF_STEPS` (default 100,000) and `ASKPOOL_DIFF_SEED` tune it.

use std::collections::BTreeMap;

use askpool_promises::{
    CallbackOutcome, CallbackRequest, ClaimRequest, CompleteRequest, Completion, CreateRequest,
    Lease, MemoryStore, SearchQuery, SqliteStore, State, Store, Target,
};
use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};

const EPISODE: usize = 1_000;
const IDS: &[&str] = &[
    "p0", "p1", "p2", "p3", "p4", "p5", "p6", "p7", "p8", "p9", "p10", "p11", "q?[0]", "q1",
];
const KEYS: &[&str] = &["k0", "k1", "k2"];
const POOLS: &[&str] = &["ga", "gb"];
const WORKERS: &[&str] = &["w0", "w1", "w2"];
const PATTERNS: &[&str] = &["*", "p*", "p1", "*1", "*[*", "q?*", "x*", "p?"];

fn pick<'a>(rng: &mut SmallRng, xs: &[&'a str]) -> &'a str {
    xs[rng.random_range(0..xs.len())]
}

fn maybe(rng: &mut SmallRng, xs: &[&str]) -> Option<String> {
    rng.random_bool(0.7).then(|| pick(rng, xs).to_owned())
}

/// The episode's state besides the stores: the clock and leases handed out.
struct Driver {
    rng: SmallRng,
    now: u64,
    leases: Vec<Lease>,
    successes: BTreeMap<&'static str, u64>,
}

impl Driver {
    fn tick(&mut self) {
        let r = &mut self.rng;
        self.now = match r.random_range(0..100) {
            0..=93 => self.now + r.random_range(0..10),
            94..=97 => self.now + r.random_range(0..8_000),
            _ => self.now.saturating_sub(r.random_range(0..2_000)),
        };
    }

    fn ok(&mut self, kind: &'static str) {
        *self.successes.entry(kind).or_default() += 1;
    }

    /// One random operation on both stores; panics on any difference.
    fn step(&mut self, model: &MemoryStore, sql: &SqliteStore) {
        self.tick();
        let now = self.now;
        let r = &mut self.rng;
        match r.random_range(0..100) {
            0..=19 => {
                let mut req = CreateRequest::new(pick(r, IDS), now + r.random_range(0..30_000))
                    .param(vec![r.random::<u8>(); r.random_range(0..4)])
                    .strict(r.random_bool(0.3));
                req.key = maybe(r, KEYS);
                if r.random_bool(0.5) {
                    req = req.tag("t", pick(r, KEYS));
                }
                if r.random_bool(0.6) {
                    let mut target = Target::pool(pick(r, POOLS));
                    target.preferred_worker = maybe(r, WORKERS);
                    req = req.target(target);
                }
                let (a, b) = (model.create(&req, now), sql.create(&req, now));
                assert_eq!(a, b, "create {req:?}");
                match a {
                    Ok(c) if c.deduplicated => self.ok("create (dedup)"),
                    Ok(_) => self.ok("create"),
                    Err(_) => {}
                }
            }
            20..=21 => {
                let before = now.saturating_sub(r.random_range(0..5_000));
                let limit = r.random_range(0..4);
                let (a, b) = (model.prune(before, limit), sql.prune(before, limit));
                assert_eq!(a, b, "prune");
                if a.is_ok_and(|n| n.pruned > 0) {
                    self.ok("prune");
                }
            }
            22..=27 => {
                let id = pick(r, IDS);
                let (a, b) = (model.get(id, now), sql.get(id, now));
                assert_eq!(a, b, "get {id}");
                if a.is_ok() {
                    self.ok("get");
                }
            }
            28..=47 => {
                let completion = Completion::ALL[r.random_range(0..3)];
                let mut req =
                    CompleteRequest::new(pick(r, IDS), completion).value(vec![r.random::<u8>(); 2]);
                req.key = maybe(r, KEYS);
                let (a, b) = (model.complete(&req, now), sql.complete(&req, now));
                assert_eq!(a, b, "complete {req:?}");
                match a {
                    Ok(c) if c.replayed => self.ok("complete (replay)"),
                    Ok(c) if c.promise.state == State::Resolved => self.ok("resolve"),
                    Ok(c) if c.promise.state == State::Rejected => self.ok("reject"),
                    Ok(_) => self.ok("cancel"),
                    Err(_) => {}
                }
            }
            48..=54 => {
                let mut q = SearchQuery::new(pick(r, PATTERNS)).limit(r.random_range(1..5));
                if r.random_bool(0.5) {
                    q.state = Some(State::ALL[r.random_range(0..5)]);
                }
                if r.random_bool(0.3) {
                    q.after = Some(pick(r, IDS).to_owned());
                }
                let (a, b) = (model.search(&q, now), sql.search(&q, now));
                assert_eq!(a, b, "search {q:?}");
                if a.is_ok_and(|hits| !hits.is_empty()) {
                    self.ok("search");
                }
            }
            55..=69 => {
                // Half the time between pending promises: most ids of the
                // small set have settled, and an execution awaits what is
                // still running (several things per suspension, so that
                // resumptions leave callbacks of ended suspensions).
                let pending: Vec<String> = model
                    .snapshot()
                    .unwrap()
                    .promises
                    .into_iter()
                    .filter(|p| p.state == State::Pending)
                    .map(|p| p.id)
                    .collect();
                let id = |r: &mut SmallRng| {
                    if !pending.is_empty() && r.random_bool(0.5) {
                        pending[r.random_range(0..pending.len())].clone()
                    } else {
                        pick(r, IDS).to_owned()
                    }
                };
                let req = CallbackRequest {
                    awaited: id(r),
                    awaiter: id(r),
                    pool: pick(r, POOLS).to_owned(),
                    preferred_worker: maybe(r, WORKERS),
                };
                let (a, b) = (
                    model.register_callback(&req, now),
                    sql.register_callback(&req, now),
                );
                assert_eq!(a, b, "register_callback {req:?}");
                match a {
                    Ok(CallbackOutcome::Registered(_)) => self.ok("callback (registered)"),
                    Ok(CallbackOutcome::AlreadyCompleted(_)) => self.ok("callback (completed)"),
                    Err(_) => {}
                }
            }
            70..=81 => {
                let req = ClaimRequest {
                    pool: pick(r, POOLS).to_owned(),
                    worker: pick(r, WORKERS).to_owned(),
                    lease_ms: r.random_range(1..3_000),
                };
                let (a, b) = (model.claim_task(&req, now), sql.claim_task(&req, now));
                assert_eq!(a, b, "claim {req:?}");
                if let Ok(Some(claimed)) = a {
                    self.leases.push(Lease::of(&claimed.task));
                    self.ok("claim");
                }
            }
            82..=87 => {
                let Some(lease) = self.lease() else { return };
                let ms = self.rng.random_range(1..3_000);
                let (a, b) = (
                    model.heartbeat(&lease, ms, now),
                    sql.heartbeat(&lease, ms, now),
                );
                assert_eq!(a, b, "heartbeat {lease:?}");
                if a.is_ok() {
                    self.ok("heartbeat");
                }
            }
            88..=95 => {
                let Some(lease) = self.lease() else { return };
                let before = model.snapshot().unwrap().callbacks.len();
                let (a, b) = (
                    model.complete_task(&lease, now),
                    sql.complete_task(&lease, now),
                );
                assert_eq!(a, b, "complete_task {lease:?}");
                if a.is_ok() {
                    self.ok("complete_task");
                    if model.snapshot().unwrap().callbacks.len() < before {
                        self.ok("complete_task (ended a suspension's callbacks)");
                    }
                }
            }
            _ => {
                let limit = r.random_range(0..4);
                let (a, b) = (model.sweep(now, limit), sql.sweep(now, limit));
                assert_eq!(a, b, "sweep");
                if a.is_ok_and(|n| n.timed_out > 0) {
                    self.ok("sweep");
                }
            }
        }
    }

    /// A lease handed out earlier (maybe lost since), or a made-up one.
    fn lease(&mut self) -> Option<Lease> {
        if self.leases.is_empty() || self.rng.random_bool(0.1) {
            return Some(Lease {
                task_id: self.rng.random_range(1..20),
                worker: pick(&mut self.rng, WORKERS).to_owned(),
                claim: self.rng.random_range(1..3),
            });
        }
        // Often the latest: a worker heartbeats and completes what it just
        // claimed, before its lease expires.
        let i = if self.rng.random_bool(0.5) {
            self.leases.len() - 1
        } else {
            self.rng.random_range(0..self.leases.len())
        };
        Some(self.leases[i].clone())
    }
}

fn env_u64(name: &str, default: u64) -> u64 {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

#[test]
fn sqlite_store_matches_the_reference_model() {
    run(
        env_u64("ASKPOOL_DIFF_STEPS", 100_000) as usize,
        env_u64("ASKPOOL_DIFF_SEED", 0x5EED_0003),
    );
}

/// The slow tier (`cargo xtask test --slow`): a million steps, other seed.
#[test]
#[ignore = "slow: a million steps"]
fn sqlite_store_matches_the_reference_model_for_a_million_steps() {
    run(1_000_000, env_u64("ASKPOOL_DIFF_SEED", 0x5EED_0004));
}

fn run(steps: usize, seed: u64) {
    let dir = tempfile::tempdir().unwrap();
    let mut successes = BTreeMap::new();
    for episode in 0..steps.div_ceil(EPISODE) {
        let model = MemoryStore::new();
        let sql = SqliteStore::open(dir.path().join(format!("e{episode}.db"))).unwrap();
        let mut d = Driver {
            rng: SmallRng::seed_from_u64(seed ^ episode as u64),
            now: 1_000_000,
            leases: Vec::new(),
            successes: std::mem::take(&mut successes),
        };
        for step in 0..EPISODE {
            let at = format!("seed {seed:#x} episode {episode} step {step}");
            let outcome = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                d.step(&model, &sql);
                let (a, b) = (model.snapshot().unwrap(), sql.snapshot().unwrap());
                assert_eq!(a, b, "snapshots differ");
                let broken = askpool_promises::violations(&a);
                assert!(broken.is_empty(), "invariants: {broken:?}");
            }));
            if let Err(panic) = outcome {
                eprintln!("differential test failed at {at}");
                std::panic::resume_unwind(panic);
            }
        }
        successes = d.successes;
        drop(sql);
        std::fs::remove_file(dir.path().join(format!("e{episode}.db"))).ok();
    }
    let kinds = [
        "create",
        "create (dedup)",
        "get",
        "resolve",
        "reject",
        "cancel",
        "complete (replay)",
        "search",
        "callback (registered)",
        "callback (completed)",
        "claim",
        "heartbeat",
        "complete_task",
        "complete_task (ended a suspension's callbacks)",
        "sweep",
        "prune",
    ];
    let never: Vec<_> = kinds
        .iter()
        .filter(|k| !successes.contains_key(*k))
        .collect();
    assert!(
        never.is_empty(),
        "never succeeded: {never:?} (all: {successes:?})"
    );
    eprintln!("{steps} steps; successes: {successes:?}");
}
