//! The durable part of `cargo xtask demo`: durable asks on the embedded
//! defaults (in-process transport, a SQLite file) outliving the process that
//! made them.
//!
//! A first caller makes durable asks; some are answered and recorded, then
//! its process stops (runtime and node dropped, as a crash would) while the
//! others still run. A restarted caller opens the same file and awaits every
//! id: the recorded ones answer from the file without running again, the
//! pending ones are asked again under the same ids.
//!
//! `cargo run -p askpool-promises --example restart -- [FILE]` (default
//! `promises-demo.db` in the current directory; the file is made anew).

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use askpool::Node;
use askpool_promises::{DurableAsk, DurablePromises, SqliteStore, State};

/// Asks made by the first caller, and how many of them its pool answers
/// before the stop (the others wait for a slow dependency).
const ASKS: usize = 12;
const ANSWERED_BEFORE_STOP: usize = 8;

type Runs = Arc<Mutex<BTreeMap<String, u32>>>;

/// A node with the pool "invoices": it renders an invoice, counting its runs
/// per request id; with `stall_from`, messages numbered from there on wait
/// (for longer than the first caller lives).
fn invoices_node(runs: &Runs, stall_from: Option<usize>) -> Node<String, String> {
    let node = Node::new();
    let runs = Arc::clone(runs);
    node.pool("invoices")
        .concurrency(4)
        .handler(move |order: String, ctx| {
            let runs = Arc::clone(&runs);
            async move {
                *runs
                    .lock()
                    .unwrap()
                    .entry(ctx.request_id().to_string())
                    .or_default() += 1;
                let number: usize = order.trim_start_matches("order-").parse().unwrap_or(0);
                if stall_from.is_some_and(|from| number >= from) {
                    tokio::time::sleep(Duration::from_secs(3600)).await;
                }
                Ok(format!("invoice for {order}"))
            }
        })
        .expect("pool invoices");
    node
}

fn open(path: &Path) -> DurablePromises {
    let store = SqliteStore::open(path)
        .unwrap_or_else(|e| panic!("cannot open the promise store {}: {e}", path.display()));
    DurablePromises::new(store)
}

/// How many of `ids` are in each state in the store.
fn states(promises: &DurablePromises, ids: &[String]) -> String {
    let mut count: BTreeMap<&'static str, usize> = BTreeMap::new();
    for id in ids {
        let state = promises
            .get(id)
            .expect("every asked id has a promise")
            .state;
        *count.entry(state_name(state)).or_default() += 1;
    }
    let parts: Vec<String> = count.iter().map(|(s, n)| format!("{n} {s}")).collect();
    parts.join(", ")
}

fn state_name(state: State) -> &'static str {
    match state {
        State::Pending => "pending",
        State::Resolved => "resolved",
        State::Rejected => "rejected",
        State::Canceled => "canceled",
        State::TimedOut => "timed out",
    }
}

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("tokio runtime")
}

fn main() {
    let path = PathBuf::from(
        std::env::args()
            .nth(1)
            .unwrap_or_else(|| "promises-demo.db".into()),
    );
    for suffix in ["", "-wal", "-shm"] {
        let mut file = path.clone().into_os_string();
        file.push(suffix);
        let _ = std::fs::remove_file(file);
    }
    if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
        std::fs::create_dir_all(dir).expect("the store's folder");
    }
    println!("durable asks on a SQLite file: {}", path.display());
    let runs: Runs = Arc::default();

    // The first caller. Its runtime is dropped with asks still running:
    // their tasks end where they are, recording nothing, as in a crash.
    let first = runtime();
    let ids: Vec<String> = first.block_on(async {
        let node = invoices_node(&runs, Some(ANSWERED_BEFORE_STOP));
        let promises = open(&path);
        let mut handles = Vec::new();
        for n in 0..ASKS {
            let ask = node
                .ask_durable(&promises, "invoices", format!("order-{n}"))
                .expect("durable ask");
            handles.push(ask);
        }
        let ids: Vec<String> = handles.iter().map(|h| h.id().to_owned()).collect();
        for handle in handles.drain(..ANSWERED_BEFORE_STOP) {
            handle.await.expect("answered before the stop");
        }
        // The stalled ones are running: wait until each handler started.
        while runs.lock().unwrap().len() < ASKS {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        ids
    });
    drop(first);
    println!(
        "first caller: {ASKS} durable asks to pool invoices, {ANSWERED_BEFORE_STOP} answered; \
         then its process stopped with {} still running",
        ASKS - ANSWERED_BEFORE_STOP
    );
    let promises = open(&path);
    println!("  in the file: {}", states(&promises, &ids));
    let runs_before: BTreeMap<String, u32> = runs.lock().unwrap().clone();

    // The restarted caller: a new node and runtime on the same file.
    let second = runtime();
    let outcomes = second.block_on(async {
        let node = invoices_node(&runs, None);
        let mut outcomes = Vec::new();
        for id in &ids {
            let handle = node.await_durable(&promises, id).expect("a durable ask id");
            outcomes.push(handle.await);
        }
        outcomes
    });
    drop(second);
    let runs = runs.lock().unwrap();
    let rerun = |id: &String| runs.get(id) != runs_before.get(id);
    let from_file = ids.iter().filter(|id| !rerun(id)).count();
    let answered = outcomes.iter().filter(|o| o.is_ok()).count();
    println!("restarted caller: await_durable of the {} ids", ids.len());
    println!("  {from_file} answered from the file (their handler did not run again)");
    println!(
        "  {} asked again under the same ids; {answered} of {} awaits answered",
        ids.len() - from_file,
        ids.len()
    );
    println!("  in the file: {}", states(&promises, &ids));
    let once = ids.iter().filter(|id| runs.get(*id) == Some(&1)).count();
    let twice = ids.iter().filter(|id| runs.get(*id) == Some(&2)).count();
    println!(
        "handler runs: {} ({once} ids once; {twice} twice: their first run was cut off by the \
         stop before an outcome was recorded)",
        runs.values().sum::<u32>()
    );
    let expected_twice = ASKS - ANSWERED_BEFORE_STOP;
    if answered != ids.len() || once + twice != ids.len() || twice != expected_twice {
        eprintln!("unexpected outcome of the durable demo");
        std::process::exit(1);
    }
}
