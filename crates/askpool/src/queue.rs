//! What a worker queue's ends share besides the flume channel: a count of
//! the work it holds, and the wake-ups of the workers waiting for it.
//!
//! A worker looks at its own inbox and at the pool's queue several times per
//! request (before it waits, once more after enlisting its wake-up, and
//! when woken), and most of those looks find nothing. flume's `try_recv`
//! takes the channel's lock even when it is empty; the count answers "empty"
//! with one atomic load. It is a hint, never the truth about an item: it is
//! raised after the item is in the channel and before the wake-up, so a
//! worker that saw zero and then waits is woken by the same push; a taker
//! may briefly lower it below an item not yet counted, which only costs a
//! `try_recv` that finds nothing.
//!
//! Each worker has one [`WorkerWake`]. A worker's own inbox wakes it
//! directly; the pool's shared queue keeps a list of the idle ones and wakes
//! the one that went idle last, whose state is likely still in the cache of
//! the thread that pushes (the longest idle one's is not). A `Notify` per
//! queue did the same with two waiter registrations per wait, each linked
//! and unlinked under the `Notify`'s lock: about a twentieth of an ask.
//!
//! No push is missed: a waiter registers its waker, enlists, and then looks
//! at the count again; a pusher raises the count and then reads how many
//! are enlisted (all four steps `SeqCst`). Either the pusher sees the
//! waiter enlisted and wakes one, or the waiter's second look sees the item.

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::task::Waker;

use futures::task::AtomicWaker;
use parking_lot::Mutex;

/// How a waiting worker is woken.
#[derive(Default)]
pub(crate) struct WorkerWake {
    waker: AtomicWaker,
    /// In the pool queue's idle list (changed under that list's lock).
    listed: AtomicBool,
}

impl WorkerWake {
    pub(crate) fn register(&self, waker: &Waker) {
        self.waker.register(waker);
    }

    fn wake(&self) {
        self.waker.wake();
    }
}

/// Who a queue wakes when it gets work.
enum Waiters {
    /// A worker's own inbox: that worker.
    Owner(Arc<WorkerWake>),
    /// A pool's shared queue: the workers enlisted as idle, the latest last.
    Idle {
        list: Mutex<Vec<Arc<WorkerWake>>>,
        /// `list.len()`, readable without the lock.
        count: AtomicUsize,
    },
}

pub(crate) struct QueueSignal {
    /// Items pushed and not yet taken (wrapping: see the module docs).
    len: AtomicUsize,
    waiters: Waiters,
}

impl QueueSignal {
    /// The signal of a pool's shared queue.
    pub(crate) fn shared() -> Self {
        Self {
            len: AtomicUsize::new(0),
            waiters: Waiters::Idle {
                list: Mutex::default(),
                count: AtomicUsize::new(0),
            },
        }
    }

    /// The signal of a worker's own inbox.
    pub(crate) fn owned_by(owner: Arc<WorkerWake>) -> Self {
        Self {
            len: AtomicUsize::new(0),
            waiters: Waiters::Owner(owner),
        }
    }

    /// Sends `item` on `tx` and wakes one waiting worker; gives the item
    /// back if the receiving end is gone.
    pub(crate) fn push<T>(&self, tx: &flume::Sender<T>, item: T) -> Result<(), T> {
        tx.send(item).map_err(|flume::SendError(back)| back)?;
        self.len.fetch_add(1, Ordering::SeqCst);
        self.wake_one();
        Ok(())
    }

    /// The next item on `rx`, skipping the channel when the count says it
    /// is empty.
    pub(crate) fn take<T>(&self, rx: &flume::Receiver<T>) -> Option<T> {
        if self.len.load(Ordering::SeqCst) == 0 {
            return None;
        }
        let item = rx.try_recv().ok()?;
        self.len.fetch_sub(1, Ordering::AcqRel);
        Some(item)
    }

    fn wake_one(&self) {
        match &self.waiters {
            Waiters::Owner(owner) => owner.wake(),
            Waiters::Idle { list, count } => {
                if count.load(Ordering::SeqCst) == 0 {
                    return;
                }
                let woken = {
                    let mut list = list.lock();
                    let woken = list.pop();
                    if let Some(w) = &woken {
                        w.listed.store(false, Ordering::Relaxed);
                    }
                    count.store(list.len(), Ordering::SeqCst);
                    woken
                };
                if let Some(w) = woken {
                    w.wake();
                }
            }
        }
    }

    /// Wakes every waiting worker (the pool is closing).
    pub(crate) fn wake_all(&self) {
        match &self.waiters {
            Waiters::Owner(owner) => owner.wake(),
            Waiters::Idle { list, count } => {
                let woken = {
                    let mut list = list.lock();
                    count.store(0, Ordering::SeqCst);
                    std::mem::take(&mut *list)
                };
                for w in woken {
                    w.listed.store(false, Ordering::Relaxed);
                    w.wake();
                }
            }
        }
    }

    /// Enlists `me` (its waker registered) as waiting for this queue's next
    /// push. The caller looks at the queue once more afterwards.
    pub(crate) fn enlist(&self, me: &Arc<WorkerWake>) {
        let Waiters::Idle { list, count } = &self.waiters else {
            return;
        };
        if me.listed.load(Ordering::Relaxed) {
            // Still listed (a wake-up from elsewhere): the count is not 0,
            // so a push wakes someone.
            return;
        }
        let mut list = list.lock();
        me.listed.store(true, Ordering::Relaxed);
        list.push(Arc::clone(me));
        count.store(list.len(), Ordering::SeqCst);
    }

    /// Takes `me` off the idle list if it is still there (it found work
    /// without being woken, or stops waiting): a stale entry would swallow
    /// the wake-up of a later push.
    pub(crate) fn delist(&self, me: &Arc<WorkerWake>) {
        let Waiters::Idle { list, count } = &self.waiters else {
            return;
        };
        if !me.listed.load(Ordering::Relaxed) {
            return;
        }
        let mut list = list.lock();
        if let Some(at) = list.iter().rposition(|w| Arc::ptr_eq(w, me)) {
            list.remove(at);
            me.listed.store(false, Ordering::Relaxed);
            count.store(list.len(), Ordering::SeqCst);
        }
    }

    /// Workers enlisted as idle (0 for an inbox).
    #[cfg(test)]
    fn idle(&self) -> usize {
        match &self.waiters {
            Waiters::Owner(_) => 0,
            Waiters::Idle { count, .. } => count.load(Ordering::SeqCst),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::future::poll_fn;
    use std::task::Poll;

    #[test]
    fn the_count_follows_pushes_and_takes() {
        let signal = QueueSignal::shared();
        let (tx, rx) = flume::unbounded();
        assert_eq!(signal.take(&rx), None::<u32>);
        signal.push(&tx, 1).unwrap();
        signal.push(&tx, 2).unwrap();
        assert_eq!(signal.take(&rx), Some(1));
        assert_eq!(signal.take(&rx), Some(2));
        assert_eq!(signal.take(&rx), None);
        assert_eq!(signal.len.load(Ordering::Relaxed), 0);
        drop(rx);
        assert_eq!(signal.push(&tx, 3), Err(3), "a closed queue gives it back");
        assert_eq!(signal.len.load(Ordering::Relaxed), 0);
    }

    #[test]
    fn a_push_wakes_the_worker_that_went_idle_last_and_delists_it() {
        let signal = QueueSignal::shared();
        let (tx, _rx) = flume::unbounded();
        let (first, last) = (
            Arc::new(WorkerWake::default()),
            Arc::new(WorkerWake::default()),
        );
        signal.enlist(&first);
        signal.enlist(&last);
        signal.enlist(&last);
        assert_eq!(signal.idle(), 2, "enlisting twice lists once");
        signal.push(&tx, 1).unwrap();
        assert!(
            !last.listed.load(Ordering::Relaxed),
            "the latest went first"
        );
        assert!(first.listed.load(Ordering::Relaxed));
        signal.delist(&first);
        assert_eq!(signal.idle(), 0);
        signal.enlist(&first);
        signal.wake_all();
        assert_eq!(signal.idle(), 0);
        assert!(!first.listed.load(Ordering::Relaxed));
    }

    /// Items pushed by other threads are never missed: takers that see
    /// nothing and then wait (enlisted before a second look) get every item,
    /// with fewer takers than pushes in flight and takers that stop waiting
    /// early.
    #[test]
    fn no_push_is_missed_across_threads() {
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_time()
            .build()
            .unwrap();
        rt.block_on(async {
            let signal = Arc::new(QueueSignal::shared());
            let (tx, rx) = flume::unbounded::<u32>();
            const N: u32 = 20_000;
            let taken = Arc::new(AtomicUsize::new(0));
            let takers: Vec<_> = (0..3)
                .map(|_| {
                    let (signal, rx, taken) = (Arc::clone(&signal), rx.clone(), Arc::clone(&taken));
                    tokio::spawn(async move {
                        let me = Arc::new(WorkerWake::default());
                        while taken.load(Ordering::SeqCst) < N as usize {
                            let got = poll_fn(|cx| {
                                if signal.take(&rx).is_some() {
                                    signal.delist(&me);
                                    return Poll::Ready(true);
                                }
                                if taken.load(Ordering::SeqCst) >= N as usize {
                                    signal.delist(&me);
                                    return Poll::Ready(false);
                                }
                                me.register(cx.waker());
                                signal.enlist(&me);
                                if signal.take(&rx).is_some() {
                                    signal.delist(&me);
                                    return Poll::Ready(true);
                                }
                                Poll::Pending
                            })
                            .await;
                            if got && taken.fetch_add(1, Ordering::SeqCst) + 1 == N as usize {
                                // Wake the others so they see the end.
                                signal.wake_all();
                            }
                        }
                    })
                })
                .collect();
            let pusher = tokio::task::spawn_blocking(move || {
                for i in 0..N {
                    signal.push(&tx, i).unwrap();
                }
            });
            pusher.await.unwrap();
            for taker in takers {
                tokio::time::timeout(std::time::Duration::from_secs(30), taker)
                    .await
                    .expect("the takers saw every push")
                    .unwrap();
            }
            assert_eq!(taken.load(Ordering::SeqCst), N as usize);
        });
    }
}
