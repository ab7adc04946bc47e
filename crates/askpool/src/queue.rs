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
//! A waiting pull enlists a [`WorkerWake`] (its worker's, or one of its own
//! when another pull of the same worker already waits) in the idle list of
//! each queue it reads: the pool's shared queue and its worker's inbox. A
//! push wakes the one that enlisted last, whose state is likely still in the
//! cache of the thread that pushes (the longest idle one's is not). An
//! inbox keeps its worker's own wake-up beside the list, behind one flag:
//! the list is for a second pull of the same worker, which is rare. A
//! `Notify` per queue did the same with waiter registrations linked and
//! unlinked under the `Notify`'s lock: about a twentieth of an ask.
//!
//! No push is missed: a waiter registers its waker, enlists, and then looks
//! at the count again; a pusher raises the count and then reads how many
//! are enlisted (all four steps `SeqCst`). Either the pusher sees the
//! waiter enlisted and wakes one, or the waiter's second look sees the item.
//! A wait that ends while a queue it read still holds work wakes another
//! idle waiter ([`finish_wait`]): the wait may have been picked for that
//! work and not taken it.
//!
//! [`finish_wait`]: QueueSignal::finish_wait

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::task::Waker;

use futures::task::AtomicWaker;
use parking_lot::Mutex;

/// Which idle list a [`WorkerWake`] is in: the pool's shared queue's, its
/// worker's inbox's.
const SHARED: usize = 0;
const INBOX: usize = 1;

/// How a waiting pull is woken.
#[derive(Default)]
pub(crate) struct WorkerWake {
    waker: AtomicWaker,
    /// In the idle list of the shared queue, of the inbox (each changed
    /// under its list's lock).
    listed: [AtomicBool; 2],
    /// A pull is waiting with this wake-up.
    claimed: AtomicBool,
}

impl WorkerWake {
    #[inline]
    pub(crate) fn register(&self, waker: &Waker) {
        self.waker.register(waker);
    }

    /// Takes this wake-up for one wait; false if another wait has it.
    #[inline]
    pub(crate) fn claim(&self) -> bool {
        !self.claimed.swap(true, Ordering::Acquire)
    }

    #[inline]
    pub(crate) fn release(&self) {
        self.claimed.store(false, Ordering::Release);
    }

    fn wake(&self) {
        self.waker.wake();
    }
}

pub(crate) struct QueueSignal {
    /// Items pushed and not yet taken (wrapping: see the module docs).
    len: AtomicUsize,
    /// Waits enlisted for this queue's next push, the latest last.
    idle: Mutex<Vec<Arc<WorkerWake>>>,
    /// `idle.len()`, readable without the lock.
    waiting: AtomicUsize,
    /// [`SHARED`] or [`INBOX`].
    list: usize,
    /// An inbox's worker: its wake-up waits here, outside the list (the
    /// list holds only other pulls of the same worker, which are rare).
    owner: Option<Arc<WorkerWake>>,
    owner_waiting: AtomicBool,
    /// Items of every inbox of the pool (an inbox's only): each inbox is
    /// kept within a bound of its own, and this keeps them all together
    /// within one (`PoolShared::enqueue`).
    group: Option<Arc<AtomicUsize>>,
}

impl QueueSignal {
    fn new(list: usize, owner: Option<Arc<WorkerWake>>, group: Option<Arc<AtomicUsize>>) -> Self {
        Self {
            group,
            len: AtomicUsize::new(0),
            idle: Mutex::default(),
            waiting: AtomicUsize::new(0),
            list,
            owner,
            owner_waiting: AtomicBool::new(false),
        }
    }

    /// The signal of a pool's shared queue.
    pub(crate) fn shared() -> Self {
        Self::new(SHARED, None, None)
    }

    /// The signal of the inbox of the worker that `owner` wakes, counted
    /// in `group` with the other inboxes of its pool.
    pub(crate) fn inbox(owner: Arc<WorkerWake>, group: Arc<AtomicUsize>) -> Self {
        Self::new(INBOX, Some(owner), Some(group))
    }

    /// The inbox's worker's wake-up (none for a shared queue).
    pub(crate) fn owner(&self) -> Option<&Arc<WorkerWake>> {
        self.owner.as_ref()
    }

    fn is_owner(&self, me: &Arc<WorkerWake>) -> bool {
        self.owner
            .as_ref()
            .is_some_and(|owner| Arc::ptr_eq(owner, me))
    }

    /// Sends `item` on `tx` and wakes one waiting pull; gives the item back
    /// if the receiving end is gone.
    pub(crate) fn push<T>(&self, tx: &flume::Sender<T>, item: T) -> Result<(), T> {
        tx.send(item).map_err(|flume::SendError(back)| back)?;
        self.len.fetch_add(1, Ordering::SeqCst);
        if let Some(group) = &self.group {
            group.fetch_add(1, Ordering::Relaxed);
        }
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
        self.taken();
        Some(item)
    }

    /// Counts an item taken off this queue's channel.
    pub(crate) fn taken(&self) {
        self.len.fetch_sub(1, Ordering::AcqRel);
        if let Some(group) = &self.group {
            group.fetch_sub(1, Ordering::Relaxed);
        }
    }

    /// Items pushed and not yet taken (a hint: see the module docs).
    pub(crate) fn len(&self) -> usize {
        self.len.load(Ordering::Relaxed)
    }

    /// Wakes the inbox's worker if it waits; whether it did.
    fn wake_owner(&self) -> bool {
        match &self.owner {
            Some(owner) if self.owner_waiting.swap(false, Ordering::SeqCst) => {
                owner.wake();
                true
            }
            _ => false,
        }
    }

    fn wake_one(&self) {
        if self.wake_owner() {
            return;
        }
        if self.waiting.load(Ordering::SeqCst) == 0 {
            return;
        }
        let woken = {
            let mut idle = self.idle.lock();
            let woken = idle.pop();
            if let Some(w) = &woken {
                w.listed[self.list].store(false, Ordering::Release);
            }
            self.waiting.store(idle.len(), Ordering::SeqCst);
            woken
        };
        if let Some(w) = woken {
            w.wake();
        }
    }

    /// Wakes every waiting pull (the pool is closing).
    pub(crate) fn wake_all(&self) {
        self.wake_owner();
        let woken = {
            let mut idle = self.idle.lock();
            for w in idle.iter() {
                w.listed[self.list].store(false, Ordering::Release);
            }
            self.waiting.store(0, Ordering::SeqCst);
            std::mem::take(&mut *idle)
        };
        for w in woken {
            w.wake();
        }
    }

    /// Enlists `me` (its waker registered) for this queue's next push. The
    /// caller looks at the queue once more afterwards.
    #[inline]
    pub(crate) fn enlist(&self, me: &Arc<WorkerWake>) {
        if self.is_owner(me) {
            self.owner_waiting.store(true, Ordering::SeqCst);
            return;
        }
        if me.listed[self.list].load(Ordering::Acquire) {
            // Still listed (woken by its other queue): the count is not 0,
            // so a push wakes someone.
            return;
        }
        let mut idle = self.idle.lock();
        me.listed[self.list].store(true, Ordering::Relaxed);
        idle.push(Arc::clone(me));
        self.waiting.store(idle.len(), Ordering::SeqCst);
    }

    /// Takes `me` off the idle list; false if it was not on it (never
    /// enlisted in this wait, or picked by a push).
    fn delist(&self, me: &Arc<WorkerWake>) -> bool {
        if !me.listed[self.list].load(Ordering::Acquire) {
            return false;
        }
        let mut idle = self.idle.lock();
        let Some(at) = idle.iter().rposition(|w| Arc::ptr_eq(w, me)) else {
            return false;
        };
        idle.remove(at);
        me.listed[self.list].store(false, Ordering::Release);
        self.waiting.store(idle.len(), Ordering::SeqCst);
        true
    }

    /// Ends a wait of `me`, however it ends: off the idle list, and while
    /// this queue still holds work, another idle waiter is woken. A push may
    /// have picked this wait and the wait not used it: it took work from its
    /// other queue, its future was dropped, or it enlisted again after the
    /// pick (a re-poll between its two looks) and so hid it. Whether a pick
    /// happened cannot be told reliably from here, so any work left wakes
    /// someone: at worst a spare wake-up while the queue is busy.
    #[inline]
    pub(crate) fn finish_wait(&self, me: &Arc<WorkerWake>) {
        if self.is_owner(me) {
            self.owner_waiting.store(false, Ordering::SeqCst);
        } else {
            self.delist(me);
        }
        if self.len.load(Ordering::SeqCst) > 0 {
            self.wake_one();
        }
    }

    /// Waits enlisted now.
    #[cfg(test)]
    fn idle(&self) -> usize {
        self.waiting.load(Ordering::SeqCst)
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
        let listed = |w: &WorkerWake| w.listed[SHARED].load(Ordering::Relaxed);
        assert!(!listed(&last), "the latest went first");
        assert!(listed(&first));
        assert!(signal.delist(&first));
        assert!(!signal.delist(&first), "gone already");
        assert_eq!(signal.idle(), 0);
        signal.enlist(&first);
        signal.wake_all();
        assert_eq!(signal.idle(), 0);
        assert!(!listed(&first));
    }

    /// A wait picked by a push that ends without taking the work passes the
    /// pick on; one that was not picked just leaves the list.
    #[test]
    fn an_unused_pick_is_passed_on_while_work_is_queued() {
        let signal = QueueSignal::shared();
        let (tx, rx) = flume::unbounded();
        let (other, picked) = (
            Arc::new(WorkerWake::default()),
            Arc::new(WorkerWake::default()),
        );
        signal.enlist(&other);
        signal.enlist(&picked);
        signal.push(&tx, 1).unwrap();
        signal.finish_wait(&picked);
        assert_eq!(signal.idle(), 0, "the other waiter was woken in its place");
        assert_eq!(signal.take(&rx), Some(1));
        signal.enlist(&other);
        signal.finish_wait(&other);
        assert_eq!(
            signal.idle(),
            0,
            "a wait that was not picked leaves the list"
        );
    }

    /// A wait re-polled (a select! sibling woke its task) is picked by a
    /// shared push between its first look and its enlisting again, which
    /// hides the pick; it then takes an inbox item. The shared item must
    /// still wake the other idle waiter.
    #[test]
    fn a_pick_hidden_by_enlisting_again_is_passed_on() {
        struct Flag(std::sync::atomic::AtomicBool);
        impl futures::task::ArcWake for Flag {
            fn wake_by_ref(me: &Arc<Self>) {
                me.0.store(true, Ordering::SeqCst);
            }
        }
        let shared = QueueSignal::shared();
        let (stx, srx) = flume::unbounded::<u32>();
        let w2 = Arc::new(WorkerWake::default());
        let inbox = QueueSignal::inbox(Arc::clone(&w2), Arc::default());
        let (itx, irx) = flume::unbounded::<u32>();
        let w1 = Arc::new(WorkerWake::default());
        let woke1 = Arc::new(Flag(AtomicBool::new(false)));
        w1.register(&futures::task::waker(Arc::clone(&woke1)));
        shared.enlist(&w1);
        // w2's wait, first poll: enlisted in both, nothing queued.
        shared.enlist(&w2);
        inbox.enlist(&w2);
        // Polled again: the first look finds nothing ...
        assert_eq!(inbox.take(&irx), None);
        assert_eq!(shared.take(&srx), None);
        shared.push(&stx, 1).unwrap(); // picks w2, enlisted last
                                       // ... it enlists again (listed anew: the pick is hidden) ...
        shared.enlist(&w2);
        inbox.enlist(&w2);
        inbox.push(&itx, 10).unwrap();
        // ... and its second look takes the inbox first.
        assert_eq!(inbox.take(&irx), Some(10));
        shared.finish_wait(&w2);
        inbox.finish_wait(&w2);
        assert_eq!(shared.len.load(Ordering::SeqCst), 1, "item 1 is queued");
        assert!(woke1.0.load(Ordering::SeqCst), "w1 is woken for item 1");
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
                                    return Poll::Ready(true);
                                }
                                if taken.load(Ordering::SeqCst) >= N as usize {
                                    return Poll::Ready(false);
                                }
                                me.register(cx.waker());
                                signal.enlist(&me);
                                if signal.take(&rx).is_some() {
                                    return Poll::Ready(true);
                                }
                                // The last item taken, and the others woken,
                                // between the check above and enlisting.
                                if taken.load(Ordering::SeqCst) >= N as usize {
                                    return Poll::Ready(false);
                                }
                                Poll::Pending
                            })
                            .await;
                            signal.finish_wait(&me);
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
