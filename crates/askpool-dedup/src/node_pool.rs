//! Per-thread caches of free node slots (of the process-wide slabs, see
//! `slab`), and the hand-off of retired slots to the epoch collector in
//! batches.
//!
//! An insert at capacity takes one slot and, through the epoch collector,
//! frees one. A slot retired (its node unlinked, no longer reachable from
//! the table) waits in a per-thread batch; every [`RETIRE_BATCH`] retired
//! slots go to the collector as one deferred function, in a bag of their
//! own (profiled: a deferred function per node, with the collector's bags
//! of 64 of them, cost about 120 instructions of a 490-instruction insert).
//! A thread's partial batch goes to the collector when the thread exits.
//!
//! Slots the collector frees go to the freeing thread's cache, up to
//! [`KEEP`] per slab, and the next node this thread makes takes one back:
//! no lock, no shared line. The thread that frees a node is not always one
//! that inserts: the collector runs on whichever thread pins, so when one
//! thread inserts and another mostly finds (a duplicate storm: the loser of
//! each insert race takes nothing), one thread's cache fills while the
//! other's is empty. So a full cache hands one batch of [`BATCH`] slots to
//! its slab's shared list, and an empty one takes a batch from there (one
//! lock per batch, not per node) before it takes a fresh slot.
//!
//! What a thread keeps goes back to the slab when it exits. Per slab, a
//! thread holds at most `KEEP` free slots and `RETIRE_BATCH - 1` retired
//! ones: that, and the slab's shared list, is the slack the memory bound
//! allows beside the tables' own nodes.
//!
//! Under loom there are no caches (a model must run the same operations
//! every time): slots come from and go back to the slab's shared list, and
//! each retired slot is its own deferred function.

#[cfg(not(loom))]
use std::cell::RefCell;

use crossbeam_epoch::Guard;

use crate::slab::Slab;

/// Most free slots a thread keeps per slab (512 nodes of 64 bytes: 32 KiB):
/// twice a batch of retired slots, which the collector frees at once.
#[cfg_attr(loom, allow(dead_code))]
pub(crate) const KEEP: usize = 2 * RETIRE_BATCH;

/// Slots moved between a thread's cache and the shared list at a time.
#[cfg_attr(loom, allow(dead_code))]
pub(crate) const BATCH: usize = KEEP / 2;

/// Slots a thread retires before it hands them to the epoch collector, as
/// one deferred function.
#[cfg_attr(loom, allow(dead_code))]
pub(crate) const RETIRE_BATCH: usize = 256;

/// Slots of one slab that this thread retired (unreachable from every
/// table, but maybe still read by pinned threads) and has not yet handed to
/// the epoch collector.
#[cfg(not(loom))]
struct Retired {
    slab: &'static Slab,
    slots: Vec<u32>,
}

#[cfg(not(loom))]
impl Retired {
    fn new(slab: &'static Slab) -> Box<Self> {
        Box::new(Self {
            slab,
            slots: Vec::with_capacity(RETIRE_BATCH),
        })
    }
}

/// One slab's slots in a thread's cache.
#[cfg(not(loom))]
struct List {
    /// Free slots, ready to be reused.
    free: Vec<u32>,
    /// Retired slots, not yet handed to the collector.
    retired: Box<Retired>,
    /// An emptied batch of retired slots, kept to be the next `retired`
    /// (spares an allocation per batch).
    spare: Option<Box<Retired>>,
}

#[cfg(not(loom))]
struct Cache {
    /// One list per slab (one per node layout in use).
    lists: Vec<(&'static Slab, List)>,
}

#[cfg(not(loom))]
impl Cache {
    /// The list of `slab`, made on first use. The first list is checked
    /// inline (most programs have one state type); the rest out of line, so
    /// the common path stays a few instructions.
    #[inline]
    fn list(&mut self, slab: &'static Slab) -> &mut List {
        match self.lists.first() {
            Some((first, _)) if std::ptr::eq(*first, slab) => &mut self.lists[0].1,
            _ => self.list_slow(slab),
        }
    }

    #[cold]
    #[inline(never)]
    fn list_slow(&mut self, slab: &'static Slab) -> &mut List {
        let index = match self.lists.iter().position(|(s, _)| std::ptr::eq(*s, slab)) {
            Some(i) => i,
            None => {
                let list = List {
                    free: Vec::with_capacity(KEEP),
                    retired: Retired::new(slab),
                    spare: None,
                };
                self.lists.push((slab, list));
                self.lists.len() - 1
            }
        };
        &mut self.lists[index].1
    }
}

#[cfg(not(loom))]
impl Drop for Cache {
    fn drop(&mut self) {
        for (slab, list) in self.lists.drain(..) {
            slab.give_batch(list.free);
            if !list.retired.slots.is_empty() {
                // Pinned threads may still read these: they go to the
                // collector like any batch (crossbeam pins with a fresh
                // handle if this thread's own is gone already).
                let guard = crossbeam_epoch::pin();
                // SAFETY: as for `retire`.
                unsafe { defer(list.retired, &guard) };
            }
        }
    }
}

#[cfg(not(loom))]
thread_local! {
    static CACHE: RefCell<Cache> = const { RefCell::new(Cache { lists: Vec::new() }) };
}

/// A free slot of `slab`: one this thread kept, else one of the slab's
/// shared list, else a fresh one.
#[inline]
pub(crate) fn take(slab: &'static Slab) -> u32 {
    #[cfg(not(loom))]
    match take_kept(slab) {
        Some(slot) => slot,
        // No cache (a thread-local destructor inserting after this
        // thread's cache is gone) or nothing in it or the slab's list.
        None => slab.take_one(),
    }
    #[cfg(loom)]
    slab.take_one()
}

/// A slot this thread kept, or else one from the slab's shared list, if
/// any.
#[cfg(not(loom))]
#[inline]
pub(crate) fn take_kept(slab: &'static Slab) -> Option<u32> {
    CACHE
        .try_with(|cache| {
            let mut cache = cache.try_borrow_mut().ok()?;
            let list = &mut cache.list(slab).free;
            match list.pop() {
                Some(slot) => Some(slot),
                None => refill(list, slab),
            }
        })
        .ok()
        .flatten()
}

/// Moves a batch from the slab's shared list into an empty cache and takes
/// one slot of it.
#[cfg(not(loom))]
#[cold]
#[inline(never)]
fn refill(list: &mut Vec<u32>, slab: &'static Slab) -> Option<u32> {
    let batch = slab.take_batch()?;
    list.extend_from_slice(&batch);
    list.pop()
}

/// Keeps a free slot for this thread, or hands it back to its slab.
///
/// # Safety
/// `slot` is a slot of `slab` that holds no live value and that nobody
/// else can reach.
#[cfg(not(loom))]
#[inline]
pub(crate) unsafe fn give(slab: &'static Slab, slot: u32) {
    let kept = CACHE
        .try_with(|cache| {
            let Ok(mut cache) = cache.try_borrow_mut() else {
                return false;
            };
            keep(&mut cache.list(slab).free, slot, slab);
            true
        })
        .unwrap_or(false);
    if !kept {
        slab.give_one(slot, BATCH);
    }
}

/// Keeps a free slot in `list`; a full list hands a batch to its slab
/// first.
#[cfg(not(loom))]
#[inline]
fn keep(list: &mut Vec<u32>, slot: u32, slab: &'static Slab) {
    if list.len() >= KEEP {
        spill(list, slab);
    }
    list.push(slot);
}

/// Moves the newest `BATCH` slots of a full cache to the slab's shared
/// list.
#[cfg(not(loom))]
#[cold]
#[inline(never)]
fn spill(list: &mut Vec<u32>, slab: &'static Slab) {
    slab.give_batch(list.split_off(list.len() - BATCH));
}

/// Retires a slot: it is freed into a thread's cache once no thread pinned
/// now can still read it. Slots are handed to the epoch collector
/// [`RETIRE_BATCH`] at a time, under one deferred function: a deferred
/// function per node (building it, the collector's bag, calling it) cost
/// more than the rest of the node's reclamation.
///
/// Handing a slot over later than it was retired is as safe as at once:
/// a thread that could reach the node was pinned when it was retired, so
/// it is either still pinned when the batch is deferred (and the collector
/// waits for it) or has unpinned since, and can no longer reach it.
///
/// # Safety
/// `slot` is a slot of `slab` whose node holds no value that needs
/// dropping, and no thread that pins from now on can reach it; `guard` pins
/// this thread to crossbeam's default collector (the tables' own: a partial
/// batch goes to that collector when the thread exits).
#[cfg(not(loom))]
#[inline]
pub(crate) unsafe fn retire(slab: &'static Slab, slot: u32, guard: &Guard) {
    let full = CACHE.try_with(|cache| {
        let mut cache = cache.try_borrow_mut().ok()?;
        let list = cache.list(slab);
        list.retired.slots.push(slot);
        if list.retired.slots.len() < RETIRE_BATCH {
            return Some(None);
        }
        let next = list.spare.take().unwrap_or_else(|| Retired::new(slab));
        Some(Some(std::mem::replace(&mut list.retired, next)))
    });
    match full {
        Ok(Some(None)) => {}
        // Deferred outside the cache's borrow: the collector may run
        // deferred functions here, which give slots back to this cache.
        Ok(Some(Some(batch))) => defer(batch, guard),
        // No cache (the thread is exiting, or in a re-entrant call): this
        // slot alone.
        _ => guard.defer_unchecked(move || give(slab, slot)),
    }
}

/// Hands a full batch of retired slots to the epoch collector, and has the
/// collector take it at once (a batch is a bag's worth of nodes: left in
/// this thread's bag, 64 batches would go to the collector together and
/// come back in a burst no cache holds).
///
/// # Safety
/// As for [`retire`], for every slot of the batch.
#[cfg(not(loom))]
#[cold]
#[inline(never)]
unsafe fn defer(batch: Box<Retired>, guard: &Guard) {
    guard.defer_unchecked(move || reclaim(batch));
    guard.flush();
}

/// Frees a batch of retired slots that no thread can reach any more into
/// this thread's cache (what it cannot hold goes to the slab's shared
/// list), and keeps the emptied batch for reuse.
#[cfg(not(loom))]
fn reclaim(batch: Box<Retired>) {
    let slab = batch.slab;
    let mut batch = Some(batch);
    let _ = CACHE.try_with(|cache| {
        let Ok(mut cache) = cache.try_borrow_mut() else {
            return;
        };
        let Some(mut retired) = batch.take() else {
            return;
        };
        let list = cache.list(slab);
        if list.free.len() + retired.slots.len() <= KEEP {
            list.free.append(&mut retired.slots);
        } else {
            for slot in retired.slots.drain(..) {
                keep(&mut list.free, slot, slab);
            }
        }
        if list.spare.is_none() {
            list.spare = Some(retired);
        }
    });
    // No cache (the thread is exiting): back to the slab.
    if let Some(retired) = batch {
        slab.give_batch(retired.slots);
    }
}

/// Under loom: straight back to the slab's shared list.
///
/// # Safety
/// As in production.
#[cfg(loom)]
pub(crate) unsafe fn give(slab: &'static Slab, slot: u32) {
    slab.give_one(slot, RETIRE_BATCH);
}

/// Under loom: one deferred function per slot.
///
/// # Safety
/// As in production.
#[cfg(loom)]
pub(crate) unsafe fn retire(slab: &'static Slab, slot: u32, guard: &Guard) {
    guard.defer_unchecked(move || give(slab, slot));
}

#[cfg(all(test, not(loom)))]
mod tests {
    use std::alloc::Layout;

    use super::*;

    /// A slab of its own for each test: no node and no other test uses a
    /// layout of this alignment.
    fn slab(size: usize) -> &'static Slab {
        Slab::of(Layout::from_size_align(size, 128).unwrap(), false)
    }

    /// Takes every slot this thread can get of `slab` without a fresh one
    /// (its own, then the shared list's).
    fn take_all(slab: &'static Slab) -> Vec<u32> {
        std::iter::from_fn(|| take_kept(slab)).collect()
    }

    #[test]
    fn a_thread_keeps_at_most_keep_and_hands_the_rest_to_its_slab() {
        // Fresh threads: their caches start empty.
        std::thread::spawn(|| {
            let slab = slab(128);
            let other = slab_of_other();
            assert!(take_kept(slab).is_none());
            let n = KEEP + 2 * BATCH + 10;
            let slots: Vec<u32> = (0..n).map(|_| slab.fresh()).collect();
            for &s in &slots {
                // SAFETY: fresh slots of `slab`, given once.
                unsafe { give(slab, s) };
            }
            assert!(take_kept(other).is_none(), "slabs are kept apart");
            // Another thread, whose cache is empty, gets the batches this
            // one handed to the slab, and nothing of its cache.
            let theirs = std::thread::spawn(move || take_all(slab)).join().unwrap();
            let mine = take_all(slab);
            assert!(theirs.len() >= n - KEEP, "{} handed over", theirs.len());
            assert_eq!(theirs.len() % BATCH, 0, "whole batches");
            assert_eq!(mine.len() + theirs.len(), n, "every slot is somewhere");
            let mut back: Vec<u32> = mine.into_iter().chain(theirs).collect();
            back.sort_unstable();
            back.dedup();
            assert_eq!(back.len(), n, "no slot handed out twice");
            assert!(back.iter().all(|s| slots.contains(s)));
        })
        .join()
        .unwrap();
    }

    fn slab_of_other() -> &'static Slab {
        slab(256)
    }

    #[test]
    fn retired_slots_come_back_only_after_the_epoch_passes() {
        std::thread::spawn(|| {
            let slab = slab(384);
            let slots: Vec<u32> = (0..RETIRE_BATCH + 3).map(|_| slab.fresh()).collect();
            {
                let guard = crossbeam_epoch::pin();
                for &s in &slots {
                    // SAFETY: fresh, never reachable by anyone else,
                    // retired once.
                    unsafe { retire(slab, s, &guard) };
                }
                // The full batch went to the collector, which cannot free
                // it while this thread is pinned.
                assert!(take_kept(slab).is_none(), "reclaimed while pinned");
            }
            // The collector runs the batch on whichever thread pins: here,
            // unless another test's thread got to it first (then it sits in
            // that thread's cache).
            let mut back = Vec::new();
            for _ in 0..1_000 {
                crossbeam_epoch::pin().flush();
                back.extend(std::iter::from_fn(|| take_kept(slab)));
                if back.len() == RETIRE_BATCH {
                    break;
                }
            }
            assert!(back.len() <= RETIRE_BATCH, "only the full batch");
            back.sort_unstable();
            back.dedup();
            assert_eq!(
                back.len(),
                back.iter()
                    .filter(|s| slots[..RETIRE_BATCH].contains(s))
                    .count()
            );
            // The last 3 stay retired until this thread exits, and then
            // go to the collector.
        })
        .join()
        .unwrap();
    }

    #[test]
    fn a_batch_deferred_after_its_retirer_repinned_waits_for_a_reader_pinned_before() {
        // The reader pins, then the slot it reads is retired; the retiring
        // thread unpins and pins again (many times) before the batch fills
        // and goes to the collector. The collector must still wait for the
        // reader: the slot must not come back for reuse while it is pinned.
        let slab = slab(512);
        let slot = slab.fresh();
        let (pinned_tx, pinned_rx) = std::sync::mpsc::channel();
        let (done_tx, done_rx) = std::sync::mpsc::channel::<()>();
        let reader = std::thread::spawn(move || {
            let guard = crossbeam_epoch::pin();
            pinned_tx.send(()).unwrap();
            done_rx.recv().unwrap();
            drop(guard);
        });
        pinned_rx.recv().unwrap();
        std::thread::spawn(move || {
            {
                let guard = crossbeam_epoch::pin();
                // SAFETY: the reader may still reach it; nobody pinning
                // from now on can.
                unsafe { retire(slab, slot, &guard) };
            }
            for _ in 0..RETIRE_BATCH {
                crossbeam_epoch::pin().flush();
            }
            let rest: Vec<u32> = (1..RETIRE_BATCH).map(|_| slab.fresh()).collect();
            {
                let guard = crossbeam_epoch::pin();
                for &s in &rest {
                    // SAFETY: fresh, retired once.
                    unsafe { retire(slab, s, &guard) };
                }
            }
            for _ in 0..RETIRE_BATCH {
                crossbeam_epoch::pin().flush();
                assert!(take_kept(slab).is_none(), "reclaimed under a pinned reader");
            }
            done_tx.send(()).unwrap();
            reader.join().unwrap();
            // Now the batch may be freed; whatever comes back is one of
            // its slots.
            let mut back = Vec::new();
            for _ in 0..1_000 {
                crossbeam_epoch::pin().flush();
                back.extend(std::iter::from_fn(|| take_kept(slab)));
                if back.len() == RETIRE_BATCH {
                    break;
                }
            }
            assert!(back.len() <= RETIRE_BATCH);
            assert!(back.iter().all(|&b| b == slot || rest.contains(&b)));
        })
        .join()
        .unwrap();
    }

    #[test]
    fn partial_batches_of_two_slabs_go_to_the_collector_at_thread_exit() {
        // Either order of the thread-local destructors: the cache made
        // after crossbeam's handle (dropped first, pins with the handle)
        // or before it (dropped last, pins with a fresh handle), and the
        // slots a late collection hands to a cache being destroyed.
        let (a, b) = (slab(640), slab(768));
        let threads: u32 = if cfg!(miri) { 4 } else { 64 };
        let mut made = 0;
        for i in 0..threads {
            let n = if i % 3 == 0 { RETIRE_BATCH + 5 } else { 7 };
            made += n + 1;
            std::thread::spawn(move || {
                if i % 2 == 0 {
                    // The cache first, then crossbeam's handle.
                    CACHE.with(|_| ());
                }
                let retire_fresh = |slab: &'static Slab, n: usize| {
                    let guard = crossbeam_epoch::pin();
                    for _ in 0..n {
                        // SAFETY: fresh, retired once.
                        unsafe { retire(slab, slab.fresh(), &guard) };
                    }
                };
                retire_fresh(a, n);
                retire_fresh(b, 3);
                // SAFETY: fresh, given once.
                unsafe { give(a, a.fresh()) };
            })
            .join()
            .unwrap();
        }
        // The slots of `a` come back (to whichever thread collects the
        // exited threads' garbage: this one, or another test's), each once.
        let mut back = Vec::new();
        for _ in 0..1_000 {
            crossbeam_epoch::pin().flush();
            back.extend(std::iter::from_fn(|| take_kept(a)));
            if back.len() == made {
                break;
            }
        }
        let taken = back.len();
        back.sort_unstable();
        back.dedup();
        assert_eq!(back.len(), taken, "a slot handed out twice");
        assert!(taken <= made);
        // A thread's free slots go to the slab as it exits, whoever
        // collects its garbage.
        assert!(
            taken >= threads as usize,
            "free slots of exited threads lost"
        );
    }
}
