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
//! A request for the pool's shared queue that finds it empty and a wait
//! enlisted is handed to that wait instead ([`offer`]): put in the wait's
//! own slot, under the idle list's lock, as the wait leaves the list. The
//! channel's lock, its buffer and the count are lines both threads write on
//! every request; the slot is the waiter's, and the waiter of the latest
//! push is usually polled on the pushing thread next. Work still queued is
//! never overtaken: a hand-off needs the count at 0. The slot is filled
//! only while its wait is listed, and a wait with a full slot does not
//! enlist again, so it holds one item at most; the wait looks at it after
//! its inbox (a worker takes its own work first) and before the shared
//! queue, and a wait that ends without taking it gets it back from
//! [`finish_wait`] to queue it again (a pull dropped, or one that took its
//! inbox's work).
//!
//! [`finish_wait`]: QueueSignal::finish_wait
//! [`offer`]: QueueSignal::offer

use std::cell::UnsafeCell;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::task::Waker;

use futures::task::AtomicWaker;
use parking_lot::Mutex;

/// Which idle list a [`WorkerWake`] is in: the pool's shared queue's, its
/// worker's inbox's.
const SHARED: usize = 0;
const INBOX: usize = 1;

/// How a waiting pull is woken, and where work handed to it waits.
pub(crate) struct WorkerWake<T> {
    waker: AtomicWaker,
    /// In the idle list of the shared queue, of the inbox (each changed
    /// under its list's lock).
    listed: [AtomicBool; 2],
    /// A pull is waiting with this wake-up.
    claimed: AtomicBool,
    /// Work handed to the wait by [`QueueSignal::offer`]. Written by the
    /// one push that took this wake-up off the shared idle list, under that
    /// list's lock, while `has_handed` is unset (a wake-up with work is
    /// never listed); read and emptied by the wait once `has_handed` is set,
    /// before it can be listed again (see `take_handed`). A lock here cost
    /// two more locked instructions per request than the flume channel.
    handed: UnsafeCell<Option<T>>,
    /// `handed` holds work (set after writing it, with Release).
    has_handed: AtomicBool,
}

// SAFETY: `handed` is reached by one thread at a time, each access ordered
// after the one before: a push writes it before setting `has_handed`
// (Release); the wait reads it after seeing that flag (Acquire) and
// empties it before it enlists again, under the idle list's lock, which
// the next push that writes it takes after. The rest is atomic.
unsafe impl<T: Send> Sync for WorkerWake<T> {}

impl<T> Default for WorkerWake<T> {
    fn default() -> Self {
        Self {
            waker: AtomicWaker::new(),
            listed: Default::default(),
            claimed: AtomicBool::new(false),
            handed: UnsafeCell::new(None),
            has_handed: AtomicBool::new(false),
        }
    }
}

impl<T> WorkerWake<T> {
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

    /// Gives the wait `item`; called by the one push that took this
    /// wake-up off the shared idle list, under that list's lock.
    fn hand(&self, item: T) {
        debug_assert!(!self.has_handed.load(Ordering::Relaxed));
        // SAFETY: see `handed`: this push took the wake-up off the list,
        // and the wait emptied the slot before it was listed.
        unsafe { *self.handed.get() = Some(item) };
        self.has_handed.store(true, Ordering::Release);
    }

    /// The work handed to this wait, if any. Only the wait itself calls
    /// this (its looks, and its end).
    #[inline]
    pub(crate) fn take_handed(&self) -> Option<T> {
        if !self.has_handed.load(Ordering::Acquire) {
            return None;
        }
        // SAFETY: see `handed`: the flag is set, so the push that wrote it
        // is done, and no other writes it until this wait is listed again.
        let item = unsafe { (*self.handed.get()).take() };
        self.has_handed.store(false, Ordering::Relaxed);
        item
    }
}

pub(crate) struct QueueSignal<T> {
    /// Items pushed and not yet taken (wrapping: see the module docs).
    len: AtomicUsize,
    /// Waits enlisted for this queue's next push, the latest last.
    idle: Mutex<Vec<Arc<WorkerWake<T>>>>,
    /// `idle.len()`, readable without the lock.
    waiting: AtomicUsize,
    /// [`SHARED`] or [`INBOX`].
    list: usize,
    /// An inbox's worker: its wake-up waits here, outside the list (the
    /// list holds only other pulls of the same worker, which are rare).
    owner: Option<Arc<WorkerWake<T>>>,
    owner_waiting: AtomicBool,
    /// Items of every inbox of the pool (an inbox's only): each inbox is
    /// kept within a bound of its own, and this keeps them all together
    /// within one (`PoolShared::enqueue`).
    group: Option<Arc<AtomicUsize>>,
}

impl<T> QueueSignal<T> {
    fn new(
        list: usize,
        owner: Option<Arc<WorkerWake<T>>>,
        group: Option<Arc<AtomicUsize>>,
    ) -> Self {
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
    pub(crate) fn inbox(owner: Arc<WorkerWake<T>>, group: Arc<AtomicUsize>) -> Self {
        Self::new(INBOX, Some(owner), Some(group))
    }

    /// The inbox's worker's wake-up (none for a shared queue).
    pub(crate) fn owner(&self) -> Option<&Arc<WorkerWake<T>>> {
        self.owner.as_ref()
    }

    fn is_owner(&self, me: &Arc<WorkerWake<T>>) -> bool {
        self.owner
            .as_ref()
            .is_some_and(|owner| Arc::ptr_eq(owner, me))
    }

    /// Sends `item` on `tx` and wakes one waiting pull; gives the item back
    /// if the receiving end is gone.
    pub(crate) fn push(&self, tx: &flume::Sender<T>, item: T) -> Result<(), T> {
        tx.send(item).map_err(|flume::SendError(back)| back)?;
        self.len.fetch_add(1, Ordering::SeqCst);
        if let Some(group) = &self.group {
            group.fetch_add(1, Ordering::Relaxed);
        }
        self.wake_one();
        Ok(())
    }

    /// Hands `item` to the wait enlisted last when the queue is empty (see
    /// the module docs), else [`push`](Self::push)es it. For the pool's
    /// shared queue only: an inbox's worker waits outside its list.
    pub(crate) fn offer(&self, tx: &flume::Sender<T>, item: T) -> Result<(), T> {
        debug_assert_eq!(self.list, SHARED);
        if self.waiting.load(Ordering::SeqCst) == 0 || self.len.load(Ordering::SeqCst) != 0 {
            return self.push(tx, item);
        }
        let mut idle = self.idle.lock();
        let Some(w) = idle.pop() else {
            drop(idle);
            return self.push(tx, item);
        };
        // Filled before the flag that says it left the list: a wait that
        // reads the flag unset sees the work (see `finish_wait`).
        w.hand(item);
        w.listed[self.list].store(false, Ordering::Release);
        self.waiting.store(idle.len(), Ordering::SeqCst);
        drop(idle);
        w.wake();
        Ok(())
    }

    /// The next item on `rx`, skipping the channel when the count says it
    /// is empty.
    pub(crate) fn take(&self, rx: &flume::Receiver<T>) -> Option<T> {
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
    pub(crate) fn enlist(&self, me: &Arc<WorkerWake<T>>) {
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
        // Handed work since its last look (hands happen under this lock):
        // listed again, a second push could hand it more. Its next look
        // takes what it has.
        if me.has_handed.load(Ordering::Relaxed) {
            return;
        }
        me.listed[self.list].store(true, Ordering::Relaxed);
        idle.push(Arc::clone(me));
        self.waiting.store(idle.len(), Ordering::SeqCst);
    }

    /// Takes `me` off the idle list; false if it was not on it (never
    /// enlisted in this wait, or picked by a push).
    fn delist(&self, me: &Arc<WorkerWake<T>>) -> bool {
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
    ///
    /// Returns the work handed to the wait and not taken: off the list, it
    /// is handed nothing more (a hand-off takes it off under the lock that
    /// `delist` takes, before its `listed` flag says so).
    #[inline]
    #[must_use = "work handed to the wait must be queued again"]
    pub(crate) fn finish_wait(&self, me: &Arc<WorkerWake<T>>) -> Option<T> {
        if self.is_owner(me) {
            self.owner_waiting.store(false, Ordering::SeqCst);
        } else {
            self.delist(me);
        }
        if self.len.load(Ordering::SeqCst) > 0 {
            self.wake_one();
        }
        if self.list == SHARED {
            me.take_handed()
        } else {
            None
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
        let listed = |w: &WorkerWake<u32>| w.listed[SHARED].load(Ordering::Relaxed);
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
        assert_eq!(signal.finish_wait(&picked), None, "pushed, not handed");
        assert_eq!(signal.idle(), 0, "the other waiter was woken in its place");
        assert_eq!(signal.take(&rx), Some(1));
        signal.enlist(&other);
        assert_eq!(signal.finish_wait(&other), None);
        assert_eq!(
            signal.idle(),
            0,
            "a wait that was not picked leaves the list"
        );
    }

    /// A push that finds the queue empty and a wait enlisted hands the
    /// item to the wait enlisted last, which is delisted and woken; with
    /// work queued it pushes behind it (no overtaking).
    #[test]
    fn an_offer_hands_to_the_last_idle_wait_only_when_nothing_is_queued() {
        let signal = QueueSignal::shared();
        let (tx, rx) = flume::unbounded();
        let (first, last) = (
            Arc::new(WorkerWake::default()),
            Arc::new(WorkerWake::default()),
        );
        assert_eq!(signal.offer(&tx, 1), Ok(()), "nobody waits: queued");
        signal.enlist(&first);
        signal.enlist(&last);
        assert_eq!(signal.offer(&tx, 2), Ok(()));
        assert_eq!(first.take_handed(), None, "1 is queued: 2 goes behind it");
        assert_eq!(signal.take(&rx), Some(1));
        assert_eq!(signal.take(&rx), Some(2));
        assert_eq!(signal.idle(), 1, "the push woke one wait");
        signal.enlist(&last);
        assert_eq!(signal.idle(), 2);
        assert_eq!(signal.offer(&tx, 3), Ok(()));
        assert_eq!(signal.len(), 0, "handed, not queued");
        assert_eq!(signal.idle(), 1);
        assert!(!last.listed[SHARED].load(Ordering::SeqCst));
        // Its next enlisting (a re-poll before its look) lists it not:
        // listed, it could be handed a second item.
        signal.enlist(&last);
        assert_eq!(signal.idle(), 1);
        assert_eq!(last.take_handed(), Some(3));
        assert_eq!(last.take_handed(), None);
        assert_eq!(signal.finish_wait(&last), None);
    }

    /// A wait that ends holding handed work gets it back to queue again,
    /// and is handed nothing more.
    #[test]
    fn a_wait_that_ends_gives_back_what_it_was_handed() {
        let signal = QueueSignal::shared();
        let (tx, rx) = flume::unbounded();
        let me = Arc::new(WorkerWake::default());
        signal.enlist(&me);
        signal.offer(&tx, 1).unwrap();
        assert_eq!(signal.finish_wait(&me), Some(1));
        signal.offer(&tx, 2).unwrap();
        assert_eq!(me.take_handed(), None);
        assert_eq!(signal.take(&rx), Some(2));
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
        assert_eq!(shared.finish_wait(&w2), None);
        assert_eq!(inbox.finish_wait(&w2), None);
        assert_eq!(shared.len.load(Ordering::SeqCst), 1, "item 1 is queued");
        assert!(woke1.0.load(Ordering::SeqCst), "w1 is woken for item 1");
    }

    /// Items pushed by other threads are never missed: takers that see
    /// nothing and then wait (enlisted before a second look) get every item,
    /// with fewer takers than pushes in flight and takers that stop waiting
    /// early.
    #[test]
    fn no_push_is_missed_across_threads() {
        no_push_is_missed(false);
    }

    /// The same with every push offered (handed to an idle wait when the
    /// queue is empty): no item is lost in a slot, none taken twice.
    #[test]
    fn no_offer_is_missed_across_threads() {
        no_push_is_missed(true);
    }

    fn no_push_is_missed(offer: bool) {
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
                            let take = || me.take_handed().or_else(|| signal.take(&rx));
                            let got = poll_fn(|cx| {
                                if take().is_some() {
                                    return Poll::Ready(true);
                                }
                                if taken.load(Ordering::SeqCst) >= N as usize {
                                    return Poll::Ready(false);
                                }
                                me.register(cx.waker());
                                signal.enlist(&me);
                                if take().is_some() {
                                    return Poll::Ready(true);
                                }
                                if taken.load(Ordering::SeqCst) >= N as usize {
                                    return Poll::Ready(false);
                                }
                                Poll::Pending
                            })
                            .await;
                            // Handed after its last look: it counts here.
                            let late = signal.finish_wait(&me).is_some();
                            for _ in 0..usize::from(got) + usize::from(late) {
                                if taken.fetch_add(1, Ordering::SeqCst) + 1 == N as usize {
                                    // Wake the others so they see the end.
                                    signal.wake_all();
                                }
                            }
                        }
                    })
                })
                .collect();
            let pusher = tokio::task::spawn_blocking(move || {
                for i in 0..N {
                    if offer {
                        signal.offer(&tx, i).unwrap();
                    } else {
                        signal.push(&tx, i).unwrap();
                    }
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
