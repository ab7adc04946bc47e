//! A sweep for what is bounded by age but trimmed only by its own traffic:
//! a pool's reply cache past its TTL, a node's records of timed-out asks
//! past their reconciliation window. Each is trimmed as a side effect of
//! the next request (or record), so when traffic stops, what it held stayed
//! held, replies of any size included, until the next request came.
//!
//! One tokio task per owner while it holds something that will come due:
//! started by [`IdleSweep::arm`] (on the hot path a flag load), it sleeps
//! until the earliest due time, trims, and ends when nothing is left (the
//! next `arm` starts another), or at once when its owner stops it (a pool
//! that closes, a node that is dropped). It holds its owner weakly, so an
//! owner that is dropped ends it at its next wake-up.

use std::sync::atomic::{fence, AtomicBool, Ordering};
use std::sync::{Arc, Weak};
use std::time::Duration;

use tokio::sync::Notify;

/// Longest single sleep: a due time further out (a TTL of a year) is
/// reached in steps, never by an `Instant` that overflows.
const MAX_SLEEP: Duration = Duration::from_secs(24 * 3600);

/// What an [`IdleSweep`] trims.
pub(crate) trait IdleSweepOwner: Send + Sync + 'static {
    fn idle_sweep(&self) -> &IdleSweep;
    /// Drops what is due now; how long until the next thing left is due
    /// (`None`: nothing is left, or the owner closed).
    fn sweep_idle(&self) -> Option<Duration>;
}

/// Whether an owner's sweep task is running (or about to).
pub(crate) struct IdleSweep {
    /// The runtime current when the owner was made, for an `arm` where
    /// none is current: a binding answers requests from host threads
    /// (an event loop, the JVM's) that enter its runtime only around some
    /// calls.
    runtime: Option<tokio::runtime::Handle>,
    armed: AtomicBool,
    /// Set by `stop`: no sweep starts again.
    stopped: AtomicBool,
    /// Wakes a sleeping sweep to end it (held by the task, not the owner).
    stop: Arc<Notify>,
}

impl IdleSweep {
    /// A sweep for an owner made now (see `runtime`).
    pub(crate) fn new() -> Self {
        Self {
            runtime: tokio::runtime::Handle::try_current().ok(),
            armed: AtomicBool::new(false),
            stopped: AtomicBool::new(false),
            stop: Arc::default(),
        }
    }

    /// Something of `owner` comes due `after` from now: starts the sweep
    /// unless one runs, on the current runtime, else on the one current
    /// when the owner was made. With neither nothing starts, and the
    /// owner's own traffic trims it as before.
    pub(crate) fn arm<O: IdleSweepOwner>(&self, owner: &Weak<O>, after: Duration) {
        // A flag that is set is the common case (one load, on a line only
        // written when a sweep starts or ends).
        if self.armed.load(Ordering::SeqCst) || self.armed.swap(true, Ordering::SeqCst) {
            return;
        }
        let runtime = tokio::runtime::Handle::try_current()
            .ok()
            .or_else(|| self.runtime.clone());
        match runtime {
            Some(runtime) if !self.stopped.load(Ordering::SeqCst) => {
                let armed = Armed {
                    owner: owner.clone(),
                    holds_flag: true,
                };
                runtime.spawn(sweep(armed, Arc::clone(&self.stop), after));
            }
            _ => self.armed.store(false, Ordering::SeqCst),
        }
    }

    /// Ends the sweep now, for good: its owner holds nothing to trim any
    /// more (a closed pool dropped its cache).
    pub(crate) fn stop(&self) {
        self.stopped.store(true, Ordering::SeqCst);
        // A permit if the task is not waiting yet: its wait ends at once.
        self.stop.notify_one();
    }

    #[cfg(test)]
    pub(crate) fn is_armed(&self) -> bool {
        self.armed.load(Ordering::SeqCst)
    }
}

/// The task's claim on its owner's flag, given back when the task ends
/// while it holds it, however it ends (also dropped unpolled with its
/// runtime): the next `arm` then starts another.
struct Armed<O: IdleSweepOwner> {
    owner: Weak<O>,
    /// Whether the flag is this task's to clear (a sweep that found
    /// nothing left cleared it already, and another may have set it since).
    holds_flag: bool,
}

impl<O: IdleSweepOwner> Drop for Armed<O> {
    fn drop(&mut self) {
        if !self.holds_flag {
            return;
        }
        if let Some(owner) = self.owner.upgrade() {
            owner.idle_sweep().armed.store(false, Ordering::SeqCst);
        }
    }
}

async fn sweep<O: IdleSweepOwner>(mut armed: Armed<O>, stop: Arc<Notify>, mut wait: Duration) {
    loop {
        tokio::select! {
            () = tokio::time::sleep(wait.min(MAX_SLEEP)) => {}
            () = stop.notified() => {}
        }
        let Some(owner) = armed.owner.upgrade() else {
            return;
        };
        if owner.idle_sweep().stopped.load(Ordering::SeqCst) {
            return;
        }
        let flag = &owner.idle_sweep().armed;
        // Cleared before the trim looks: what becomes due after the look
        // finds the flag clear and arms again (its `arm` starts a new task),
        // so nothing is left with no sweep coming. The owner sets its entry
        // and then reads the flag; this clears the flag and then reads the
        // entries.
        flag.store(false, Ordering::SeqCst);
        armed.holds_flag = false;
        fence(Ordering::SeqCst);
        let Some(next) = owner.sweep_idle() else {
            return;
        };
        if flag.swap(true, Ordering::SeqCst) {
            // Another sweep was started meanwhile: it goes on.
            return;
        }
        armed.holds_flag = true;
        wait = next;
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::sync::Arc;
    use std::time::{Duration, Instant};

    use askpool_dedup::DedupConfig;

    use crate::{AskError, Node, NodeConfig};

    /// A reply that counts its live copies (the caller's and the cache's).
    #[derive(Debug)]
    struct Counted(Arc<AtomicUsize>);

    impl Counted {
        fn new(live: &Arc<AtomicUsize>) -> Self {
            live.fetch_add(1, Ordering::SeqCst);
            Self(Arc::clone(live))
        }
    }

    impl Clone for Counted {
        fn clone(&self) -> Self {
            Self::new(&self.0)
        }
    }

    impl Drop for Counted {
        fn drop(&mut self) {
            self.0.fetch_sub(1, Ordering::SeqCst);
        }
    }

    /// Waits (on the real clock, generously) until `done` holds.
    async fn eventually(what: &str, done: impl Fn() -> bool) {
        let started = Instant::now();
        while !done() {
            assert!(
                started.elapsed() < Duration::from_secs(20),
                "still not so after 20 s: {what}"
            );
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn cached_replies_go_at_their_ttl_with_no_request_after_them() {
        let live = Arc::new(AtomicUsize::new(0));
        let node: Node<u64, Counted> = Node::new();
        let made = Arc::clone(&live);
        let pool = node
            .pool("p")
            .dedup(DedupConfig {
                terminal_ttl: Duration::from_millis(100),
                ..DedupConfig::default()
            })
            .handler(move |_: u64, _| {
                let made = Arc::clone(&made);
                async move { Ok(Counted::new(&made)) }
            })
            .unwrap();
        for i in 0..50 {
            drop(node.ask("p", i).await.unwrap());
        }
        // The replies the callers got are gone; the cache's copies stay
        // until their TTL, which no request comes to apply.
        assert!(live.load(Ordering::SeqCst) > 0, "the cache holds replies");
        eventually("every cached reply dropped", || {
            live.load(Ordering::SeqCst) == 0 && pool.stats().dedup.terminal == 0
        })
        .await;
        // Nothing left: the sweep ended, and the next reply starts another.
        eventually("the sweep ended", || !pool.shared().ttl_sweep_armed()).await;
        drop(node.ask("p", 99).await.unwrap());
        assert!(pool.shared().ttl_sweep_armed(), "a new entry arms it again");
        eventually("the new reply dropped too", || {
            live.load(Ordering::SeqCst) == 0
        })
        .await;
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_pool_that_closes_ends_its_sweep_at_once() {
        let node: Node<u64, u64> = Node::new();
        let pool = node
            .pool("p")
            .dedup(DedupConfig {
                terminal_ttl: Duration::from_secs(3600),
                ..DedupConfig::default()
            })
            .handler(|m: u64, _| async move { Ok(m) })
            .unwrap();
        node.ask("p", 1).await.unwrap();
        assert!(pool.shared().ttl_sweep_armed());
        pool.close();
        eventually("the sweep of a closed pool ended", || {
            !pool.shared().ttl_sweep_armed()
        })
        .await;
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn timed_out_records_go_at_their_window_with_no_ask_after_them() {
        let node: Node<u64, u64> = Node::with_config(NodeConfig {
            reconcile_window: Duration::from_millis(100),
            ..NodeConfig::default()
        });
        node.pool("stuck")
            .handler(|_: u64, _| std::future::pending::<Result<u64, AskError>>())
            .unwrap();
        for i in 0..20 {
            let timed_out = node.ask("stuck", i).timeout(Duration::from_millis(5)).await;
            assert!(matches!(timed_out, Err(AskError::AskTimeout { .. })));
        }
        let caller = &node.shared.caller;
        assert!(caller.timed_out_held() > 0, "timed-out asks are on record");
        eventually("every timed-out record dropped", || {
            caller.timed_out_held() == 0
        })
        .await;
    }
}
