//! The askpool demo: a node with two pools, asked through a transport that
//! drops and duplicates frames. It prints what the protocol did about it.
//!
//! Run with `cargo xtask demo`.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use askpool::{AskError, Node, NodeConfig, RequestId, RetryPolicy, WorkerTransport};
use askpool_tests::{Fate, FrameKind, Tap};
use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};

const ASKS: u64 = 2_000;
const IN_FLIGHT: usize = 200;
const DROP: f64 = 0.10;
const DUPLICATE: f64 = 0.10;
const SEED: u64 = 42;
const METRICS_PORT: u16 = 9464;

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    let tap: Arc<Tap<u64, String>> = Tap::in_process();
    let rng = Mutex::new(SmallRng::seed_from_u64(SEED));
    tap.set_rule(move |_| {
        let x: f64 = rng.lock().unwrap().random();
        if x < DROP {
            Fate::Drop
        } else if x < DROP + DUPLICATE {
            Fate::Duplicate
        } else {
            Fate::Deliver
        }
    });
    let transport: Arc<dyn WorkerTransport<u64, String>> = tap.clone();
    let node = Node::with_transport(
        transport,
        NodeConfig {
            retry: RetryPolicy {
                max_attempts: 6,
                initial_delay: Duration::from_millis(20),
                multiplier: 2.0,
                max_delay: Duration::from_millis(200),
                jitter: 0.2,
                ..RetryPolicy::default()
            },
            default_timeout: Duration::from_millis(800),
            seed: Some(SEED),
            ..NodeConfig::default()
        },
    );

    // Two pools: a fast one, and a slower one whose handler is a side effect
    // we count (a payment must never be charged twice).
    // Per billing ask (its message is unique): a total alone would hide a
    // double charge behind an ask whose request never reached the pool.
    let charges: Arc<Mutex<BTreeMap<u64, u64>>> = Arc::default();
    node.pool("resize")
        .concurrency(4)
        .handler(|px: u64, _ctx| async move {
            tokio::time::sleep(Duration::from_millis(2)).await;
            Ok(format!("{px}x{px} thumbnail"))
        })
        .expect("pool resize");
    let counter = charges.clone();
    node.pool("billing")
        .concurrency(8)
        .handler(move |cents: u64, _ctx| {
            *counter.lock().unwrap().entry(cents).or_default() += 1;
            async move {
                tokio::time::sleep(Duration::from_millis(10)).await;
                Ok(format!("charged {cents} cents"))
            }
        })
        .expect("pool billing");

    let metrics_addr: std::net::SocketAddr = ([127, 0, 0, 1], METRICS_PORT).into();
    let metrics_on = match askpool::install_prometheus(metrics_addr) {
        Ok(()) => {
            println!("metrics: http://{metrics_addr}/metrics");
            true
        }
        Err(e) => {
            println!("metrics: not served ({e})");
            false
        }
    };
    println!("askpool demo: {ASKS} asks to 2 pools, {IN_FLIGHT} in flight");
    println!(
        "transport faults: drop {:.0}%, duplicate {:.0}% of every frame (seed {SEED})\n",
        DROP * 100.0,
        DUPLICATE * 100.0
    );

    let started = Instant::now();
    let semaphore = Arc::new(tokio::sync::Semaphore::new(IN_FLIGHT));
    let mut tasks = Vec::new();
    for i in 0..ASKS {
        let permit = semaphore.clone().acquire_owned().await.unwrap();
        let node = node.clone();
        tasks.push(tokio::spawn(async move {
            let pool = if i % 2 == 0 { "resize" } else { "billing" };
            let handle = node.ask(pool, i).send();
            let id = handle.request_id();
            let first = handle.await;
            // A reply lost after the Ack is not re-sent for (ADR 0007 retries
            // until the Ack): the ask times out and is dead-lettered.
            // Replaying the letter asks again with the same request id, and
            // the pool answers from its reply cache without running twice.
            let recovered = match &first {
                Err(AskError::AskTimeout { .. }) => Some(replay(&node, id).await),
                _ => None,
            };
            drop(permit);
            (pool, first, recovered)
        }));
    }

    let mut outcomes: BTreeMap<String, u64> = BTreeMap::new();
    let mut recovered_ok = 0;
    let mut recovered_total = 0;
    for task in tasks {
        let (pool, first, recovered) = task.await.unwrap();
        let key = match &first {
            Ok(_) => format!("{pool}: replied"),
            Err(e) => format!("{pool}: {}", e.code()),
        };
        *outcomes.entry(key).or_default() += 1;
        if let Some(r) = recovered {
            recovered_total += 1;
            recovered_ok += u64::from(r.is_ok());
        }
    }
    let elapsed = started.elapsed();

    let stats = node.stats();
    println!("outcomes of the first ask:");
    for (k, n) in &outcomes {
        println!("  {k:<28} {n:>6}");
    }
    println!(
        "  timed-out asks replayed from the dead-letter queue: {recovered_total}, answered: {recovered_ok}\n"
    );

    let count = |kind, fate| {
        tap.records()
            .iter()
            .filter(|r| r.frame.kind == kind && r.fate == fate)
            .count()
    };
    println!("what the transport did:");
    for kind in [
        FrameKind::Request,
        FrameKind::Ack,
        FrameKind::Read,
        FrameKind::Reply,
        FrameKind::Cancel,
    ] {
        println!(
            "  {:<10} sent {:>6}  dropped {:>5}  duplicated {:>5}",
            format!("{kind:?}"),
            tap.sent(kind).len(),
            count(kind, Fate::Drop),
            count(kind, Fate::Duplicate)
        );
    }

    println!("\nwhat the protocol did about it:");
    println!(
        "  request re-sends (retry until ack)      {:>6}",
        stats.retries
    );
    let mut runs = 0;
    let mut admitted = 0;
    for p in &stats.pools {
        runs += p.handler_runs;
        admitted += p.admitted;
        println!(
            "  pool {:<8} handler runs {:>5}  duplicate requests acked {:>4}  replayed from cache {:>4}  late replies suppressed {:>3}",
            p.name, p.handler_runs, p.duplicate_acks, p.replays, p.suppressed_replies
        );
    }
    println!(
        "  duplicate/late frames ignored by caller {:>6}",
        stats.ignored_frames
    );
    let (charged, charged_twice) = {
        let charges = charges.lock().unwrap();
        let twice: Vec<u64> = (charges.iter())
            .filter(|&(_, &n)| n > 1)
            .map(|(&ask, _)| ask)
            .collect();
        (charges.values().sum::<u64>(), twice)
    };
    println!(
        "  billing side effects: {charged} charges for {} billing asks, {} charged twice",
        ASKS / 2,
        charged_twice.len()
    );
    for b in &stats.breakers {
        println!(
            "  breaker {:<8} {:?}, tripped {} times, failed {} asks fast",
            b.pool, b.state, b.trips, b.rejections
        );
    }
    println!(
        "\nleft behind: pending {}, timers {}, in flight {}, dead letters {}",
        stats.pending,
        stats.armed_timers,
        stats.pools.iter().map(|p| p.in_flight).sum::<usize>(),
        stats.dlq_depth
    );
    println!("done in {elapsed:.2?}");
    if metrics_on {
        println!("\na few lines of /metrics:");
        for line in scrape(METRICS_PORT).lines().filter(|l| {
            l.starts_with("askpool_retries_total")
                || l.starts_with("askpool_timeouts_total")
                || l.starts_with("askpool_dedup_hits_total")
                || l.starts_with("askpool_acks_sent_total{stage=\"RECEIVED\"")
                || l.starts_with("askpool_dlq_depth")
        }) {
            println!("  {line}");
        }
    }

    // The demo is also a check: it fails loudly if the protocol broke.
    assert!(
        runs <= ASKS,
        "a handler ran more often than there were asks"
    );
    assert_eq!(runs, admitted, "each admitted request ran exactly once");
    assert!(
        charged_twice.is_empty(),
        "payments charged twice: {charged_twice:?}"
    );
    assert_eq!(stats.pending, 0);
}

async fn replay(node: &Node<u64, String>, id: RequestId) -> Result<String, AskError> {
    node.replay_dead_letter(id)?.await
}

/// GET /metrics from the exporter this process serves on loopback.
fn scrape(port: u16) -> String {
    use std::io::{Read, Write};
    let Ok(mut stream) = std::net::TcpStream::connect(("127.0.0.1", port)) else {
        return String::new();
    };
    let _ = stream.set_read_timeout(Some(Duration::from_secs(2)));
    let _ = stream.write_all(b"GET /metrics HTTP/1.0\r\nHost: localhost\r\n\r\n");
    let mut body = String::new();
    let _ = stream.read_to_string(&mut body);
    body
}
