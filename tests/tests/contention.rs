//! The wake-up protocol of worker queues under contention on several
//! threads: pulls given up right after a push picked them, asks cancelled
//! while queued, asks preferring a worker, and a close racing it all. Every
//! ask ends once, with its own reply or an error that is not a timeout (a
//! request stranded in a queue, or with a wait nobody polls, would time
//! out), every worker stops at the close, and the pool's counts return to 0.

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use askpool::{AskError, Node, Worker, WorkerPool};

const WORKERS: usize = 4;

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(4)
        .enable_all()
        .build()
        .unwrap()
}

/// One pull, given up after its first poll every `give_up_every`-th time
/// (a `select!` sibling won): a wait picked by a push, then dropped.
async fn pull(
    next: impl std::future::Future<Output = Option<askpool::Request<u64, u64>>>,
    give_up: bool,
) -> Option<Option<askpool::Request<u64, u64>>> {
    if !give_up {
        return Some(next.await);
    }
    tokio::select! {
        biased;
        request = next => Some(request),
        () = tokio::task::yield_now() => None,
    }
}

/// Answers every request with twice its message until the pool closes;
/// how many it answered.
async fn serve(worker: Option<Worker<u64, u64>>, pool: Arc<WorkerPool<u64, u64>>) -> usize {
    let mut answered = 0;
    for n in 0usize.. {
        let give_up = n % 3 == 0;
        let got = match &worker {
            Some(worker) => pull(worker.next_request(), give_up).await,
            None => pull(pool.next_request(), give_up).await,
        };
        match got {
            None => continue,
            Some(None) => break,
            Some(Some(request)) => {
                let m = request.message;
                request.reply(m * 2);
                answered += 1;
            }
        }
    }
    answered
}

/// Named workers (each with an inbox) and one pull of the pool itself
/// (its waits use wake-ups of their own).
fn start_workers(pool: &Arc<WorkerPool<u64, u64>>) -> Vec<tokio::task::JoinHandle<usize>> {
    let mut workers: Vec<_> = (0..WORKERS)
        .map(|i| {
            let worker = pool.worker(format!("w{i}")).unwrap();
            tokio::spawn(serve(Some(worker), Arc::clone(pool)))
        })
        .collect();
    workers.push(tokio::spawn(serve(None, Arc::clone(pool))));
    workers
}

/// The pool's counts once its cancels and replies have landed.
async fn settled(pool: &WorkerPool<u64, u64>) {
    for _ in 0..500 {
        let stats = pool.stats();
        if stats.in_flight == 0 && stats.queued == 0 {
            return;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    panic!("the pool's counts did not return to 0: {:?}", pool.stats());
}

#[test]
fn every_ask_ends_once_while_waits_are_dropped_and_asks_cancelled() {
    runtime().block_on(async {
        let node: Node<u64, u64> = Node::new();
        let pool = Arc::new(node.pool("p").build().unwrap());
        let workers = start_workers(&pool);
        let (replied, cancelled) = (Arc::new(AtomicUsize::new(0)), Arc::new(AtomicUsize::new(0)));
        let callers: Vec<_> = (0..32u64)
            .map(|c| {
                let (node, replied, cancelled) =
                    (node.clone(), Arc::clone(&replied), Arc::clone(&cancelled));
                tokio::spawn(async move {
                    for i in 0..400u64 {
                        let m = c * 1_000 + i;
                        let mut ask = node.ask("p", m).timeout(Duration::from_secs(20));
                        if i % 7 == 0 {
                            ask = ask.preferred_worker(format!("w{}", i as usize % WORKERS));
                        }
                        let mut handle = ask.send();
                        if i % 5 == 0 {
                            tokio::task::yield_now().await;
                            handle.cancel();
                        }
                        match handle.await {
                            Ok(r) => {
                                assert_eq!(r, m * 2, "each ask gets its own reply");
                                replied.fetch_add(1, Ordering::Relaxed);
                            }
                            Err(AskError::AskCancelled { .. }) if i % 5 == 0 => {
                                cancelled.fetch_add(1, Ordering::Relaxed);
                            }
                            Err(e) => panic!("ask {m}: {e:?}"),
                        }
                    }
                })
            })
            .collect();
        tokio::time::timeout(Duration::from_secs(60), async {
            for caller in callers {
                caller.await.unwrap();
            }
        })
        .await
        .expect("every ask ended");
        assert_eq!(
            replied.load(Ordering::Relaxed) + cancelled.load(Ordering::Relaxed),
            32 * 400
        );
        settled(&pool).await;
        pool.close();
        let answered = tokio::time::timeout(Duration::from_secs(10), async {
            let mut answered = 0;
            for worker in workers {
                answered += worker.await.unwrap();
            }
            answered
        })
        .await
        .expect("every worker stopped at the close");
        assert!(answered >= replied.load(Ordering::Relaxed));
        assert_eq!(pool.stats().in_flight, 0);
    });
}

#[test]
fn a_close_racing_asks_and_pulls_ends_every_ask_and_stops_every_worker() {
    let rt = runtime();
    for round in 0..30u64 {
        rt.block_on(async {
            let node: Node<u64, u64> = Node::new();
            let pool = Arc::new(node.pool("p").build().unwrap());
            let workers = start_workers(&pool);
            let stop = Arc::new(AtomicBool::new(false));
            let callers: Vec<_> = (0..16u64)
                .map(|c| {
                    let (node, stop) = (node.clone(), Arc::clone(&stop));
                    tokio::spawn(async move {
                        for i in 0u64.. {
                            let m = c * 1_000_000 + i;
                            let mut ask = node.ask("p", m).timeout(Duration::from_secs(10));
                            if i % 7 == 0 {
                                ask = ask.preferred_worker(format!("w{}", i as usize % WORKERS));
                            }
                            match ask.send().await {
                                Ok(r) => assert_eq!(r, m * 2),
                                Err(AskError::AskTimeout { .. }) => {
                                    panic!("ask {m} was lost at the close")
                                }
                                // Cancelled at the close, or refused after it.
                                Err(_) => return,
                            }
                            if stop.load(Ordering::Relaxed) && i > 10_000 {
                                return;
                            }
                        }
                    })
                })
                .collect();
            // Vary where in the stream of asks the close lands.
            tokio::time::sleep(Duration::from_micros(200 + round * 150)).await;
            pool.close();
            stop.store(true, Ordering::Relaxed);
            tokio::time::timeout(Duration::from_secs(30), async {
                for caller in callers {
                    caller.await.unwrap();
                }
                for worker in workers {
                    worker.await.unwrap();
                }
            })
            .await
            .expect("every ask ended and every worker stopped");
            settled(&pool).await;
        });
    }
}
