//! A small per-thread cache of freed node blocks, with a small shared
//! overflow, and the hand-off of retired nodes to the epoch collector in
//! batches.
//!
//! An insert at capacity allocates one node and, through the epoch
//! collector, frees one. A node retired (unlinked, no longer reachable
//! from the table) waits in a per-thread batch; every [`RETIRE_BATCH`]
//! retired nodes go to the collector as one deferred function, in a bag of
//! their own (profiled: a deferred function per node, with the collector's
//! bags of 64 of them, cost about 120 instructions of a 490-instruction
//! insert). A thread's partial batch goes to the collector when the thread
//! exits.
//!
//! The collector frees in bursts, which overflow the system allocator's
//! per-thread cache and send it down its slow paths: profiled, malloc and
//! free were 40% of an insert's instructions. Blocks the collector frees go
//! here instead, up to [`KEEP`] per thread and node layout, and the next
//! node this thread allocates takes one back.
//!
//! The thread that frees a node is not always one that allocates: the
//! collector runs on whichever thread pins, so when one thread inserts and
//! another mostly finds (a duplicate storm: the loser of each insert race
//! allocates nothing), one thread's cache fills while the other's is empty,
//! and every node went through the allocator again, freed on one thread and
//! allocated on another (profiled: a fifth of the two-thread storm's time in
//! malloc and free). So a full cache hands half of itself, one batch of
//! [`BATCH`] blocks, to a shared list, and an empty one takes a batch from
//! there: one lock per batch, not per node. The shared list holds at most
//! [`SHARED_BATCHES`] batches per layout; beyond that blocks go back to the
//! allocator at once.
//!
//! What a thread keeps is freed when it exits. The pool adds at most `KEEP`
//! free blocks and `RETIRE_BATCH - 1` retired ones per thread, plus
//! `SHARED_BATCHES * BATCH` in all, to the memory bound, per node layout.
//!
//! Blocks come from and go back to the global allocator with the node's own
//! layout, so a node from the cache may be freed like any `Box`, and a block
//! the cache cannot take (full, or its thread is exiting) is simply freed.

use std::alloc::Layout;
use std::cell::RefCell;
use std::ptr::NonNull;
use std::sync::atomic::{AtomicUsize, Ordering::Relaxed};
use std::sync::Mutex;

use crossbeam_epoch::Guard;

/// Most blocks a thread keeps per layout (512 nodes of 72 bytes: 36 KiB):
/// twice a batch of retired nodes, which the collector frees at once.
pub(crate) const KEEP: usize = 2 * RETIRE_BATCH;

/// Blocks moved between a thread's cache and the shared list at a time.
pub(crate) const BATCH: usize = KEEP / 2;

/// Nodes a thread retires before it hands them to the epoch collector, as
/// one deferred function.
pub(crate) const RETIRE_BATCH: usize = 256;

/// Most batches the shared list holds per layout (1,024 nodes of 72 bytes:
/// 72 KiB).
pub(crate) const SHARED_BATCHES: usize = 4;

/// A batch of free blocks of one layout, owned by the shared list.
struct Batch(Vec<NonNull<u8>>);

// SAFETY: the blocks are free memory owned by the batch alone; any thread
// may reuse or free them.
unsafe impl Send for Batch {}

/// The shared list: per layout, the batches full caches handed over.
static SHARED: Mutex<Vec<(Layout, Vec<Batch>)>> = Mutex::new(Vec::new());

/// Batches in the shared list, all layouts: an empty cache looks here
/// before it takes the lock (while a table grows, every cache is empty).
static SHARED_LEN: AtomicUsize = AtomicUsize::new(0);

/// Moves the newest `BATCH` blocks of a full cache to the shared list, if
/// it has room for them; whether it had (the blocks move only then: a
/// refusal costs the lock and nothing else).
#[cold]
#[inline(never)]
fn spill(list: &mut Vec<NonNull<u8>>, layout: Layout) -> bool {
    let Ok(mut shared) = SHARED.lock() else {
        return false;
    };
    let index = match shared.iter().position(|(l, _)| *l == layout) {
        Some(i) => i,
        None => {
            shared.push((layout, Vec::with_capacity(SHARED_BATCHES)));
            shared.len() - 1
        }
    };
    let batches = &mut shared[index].1;
    if batches.len() >= SHARED_BATCHES {
        return false;
    }
    batches.push(Batch(list.split_off(list.len() - BATCH)));
    SHARED_LEN.fetch_add(1, Relaxed);
    true
}

/// A batch from the shared list, if it has one of `layout`.
fn unshare(layout: Layout) -> Option<Batch> {
    let mut shared = SHARED.lock().ok()?;
    let (_, batches) = shared.iter_mut().find(|(l, _)| *l == layout)?;
    let batch = batches.pop()?;
    SHARED_LEN.fetch_sub(1, Relaxed);
    Some(batch)
}

/// Nodes of one layout that this thread retired (unreachable from every
/// table, but maybe still read by pinned threads) and has not yet handed to
/// the epoch collector: they go to it [`RETIRE_BATCH`] at a time, as one
/// deferred function, instead of one deferred function each.
struct Retired {
    layout: Layout,
    blocks: Vec<NonNull<u8>>,
}

impl Retired {
    fn new(layout: Layout) -> Box<Self> {
        Box::new(Self {
            layout,
            blocks: Vec::with_capacity(RETIRE_BATCH),
        })
    }
}

/// One node layout's blocks in a thread's cache.
struct List {
    /// Free blocks, ready to be reused.
    free: Vec<NonNull<u8>>,
    /// Retired blocks, not yet handed to the collector.
    retired: Box<Retired>,
    /// An emptied batch of retired blocks, kept to be the next `retired`
    /// (spares an allocation per batch).
    spare: Option<Box<Retired>>,
}

struct Cache {
    /// One list per node layout (one per state type in use).
    lists: Vec<(Layout, List)>,
}

impl Cache {
    /// The free list of `layout`, made on first use. The first list is
    /// checked inline (most programs have one state type); the rest out of
    /// line, so the common path stays a few instructions.
    #[inline]
    fn list(&mut self, layout: Layout) -> &mut List {
        match self.lists.first() {
            Some((first, _)) if *first == layout => &mut self.lists[0].1,
            _ => self.list_slow(layout),
        }
    }

    #[cold]
    #[inline(never)]
    fn list_slow(&mut self, layout: Layout) -> &mut List {
        let index = match self.lists.iter().position(|(l, _)| *l == layout) {
            Some(i) => i,
            None => {
                let list = List {
                    free: Vec::with_capacity(KEEP),
                    retired: Retired::new(layout),
                    spare: None,
                };
                self.lists.push((layout, list));
                self.lists.len() - 1
            }
        };
        &mut self.lists[index].1
    }
}

impl Drop for Cache {
    fn drop(&mut self) {
        for (layout, list) in self.lists.drain(..) {
            for block in list.free {
                // SAFETY: allocated by the global allocator with `layout`,
                // owned by this cache alone.
                unsafe { std::alloc::dealloc(block.as_ptr(), layout) };
            }
            if !list.retired.blocks.is_empty() {
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

thread_local! {
    static CACHE: RefCell<Cache> = const { RefCell::new(Cache { lists: Vec::new() }) };
}

/// A block of `layout` this thread kept, or else one from the shared list,
/// if any.
#[inline]
pub(crate) fn take(layout: Layout) -> Option<NonNull<u8>> {
    CACHE
        .try_with(|cache| {
            let mut cache = cache.try_borrow_mut().ok()?;
            let list = &mut cache.list(layout).free;
            match list.pop() {
                Some(block) => Some(block),
                None => refill(list, layout),
            }
        })
        .ok()
        .flatten()
}

/// Moves a batch from the shared list into an empty cache and takes one
/// block of it.
#[cold]
#[inline(never)]
fn refill(list: &mut Vec<NonNull<u8>>, layout: Layout) -> Option<NonNull<u8>> {
    if SHARED_LEN.load(Relaxed) == 0 {
        return None;
    }
    let batch = unshare(layout)?;
    list.extend_from_slice(&batch.0);
    list.pop()
}

/// Keeps a freed block for this thread, or frees it.
///
/// # Safety
/// `block` was allocated by the global allocator with `layout`, holds no
/// live value, and nobody else can reach it.
#[inline]
pub(crate) unsafe fn give(block: NonNull<u8>, layout: Layout) {
    let kept = CACHE
        .try_with(|cache| {
            let Ok(mut cache) = cache.try_borrow_mut() else {
                return false;
            };
            keep(&mut cache.list(layout).free, block, layout)
        })
        .unwrap_or(false);
    if !kept {
        free(block, layout);
    }
}

/// Keeps a free block in `list`, if it (or the shared list) has room.
#[inline]
fn keep(list: &mut Vec<NonNull<u8>>, block: NonNull<u8>, layout: Layout) -> bool {
    if list.len() >= KEEP && !spill(list, layout) {
        return false;
    }
    list.push(block);
    true
}

/// Retires a node's block: it is freed into a thread's cache once no
/// thread pinned now can still read it. Blocks are handed to the epoch
/// collector [`RETIRE_BATCH`] at a time, under one deferred function:
/// a deferred function per node (building it, the collector's bag, calling
/// it) cost more than the rest of the node's reclamation.
///
/// Handing a block over later than it was retired is as safe as at once:
/// a thread that could reach the node was pinned when it was retired, so
/// it is either still pinned when the batch is deferred (and the collector
/// waits for it) or has unpinned since, and can no longer reach it.
///
/// # Safety
/// `block` was allocated by the global allocator with `layout`, holds no
/// value that needs dropping, and no thread that pins from now on can reach
/// it; `guard` pins this thread to crossbeam's default collector (the
/// tables' own: a partial batch goes to that collector when the thread
/// exits).
#[inline]
pub(crate) unsafe fn retire(block: NonNull<u8>, layout: Layout, guard: &Guard) {
    let full = CACHE.try_with(|cache| {
        let mut cache = cache.try_borrow_mut().ok()?;
        let list = cache.list(layout);
        list.retired.blocks.push(block);
        if list.retired.blocks.len() < RETIRE_BATCH {
            return Some(None);
        }
        let next = list.spare.take().unwrap_or_else(|| Retired::new(layout));
        Some(Some(std::mem::replace(&mut list.retired, next)))
    });
    match full {
        Ok(Some(None)) => {}
        // Deferred outside the cache's borrow: the collector may run
        // deferred functions here, which give blocks back to this cache.
        Ok(Some(Some(batch))) => defer(batch, guard),
        // No cache (the thread is exiting, or in a re-entrant call): this
        // block alone.
        _ => guard.defer_unchecked(move || give(block, layout)),
    }
}

/// Hands a full batch of retired blocks to the epoch collector, and has
/// the collector take it at once (a batch is a bag's worth of nodes: left
/// in this thread's bag, 64 batches would go to the collector together and
/// come back in a burst no cache holds).
///
/// # Safety
/// As for [`retire`], for every block of the batch.
#[cold]
#[inline(never)]
unsafe fn defer(batch: Box<Retired>, guard: &Guard) {
    guard.defer_unchecked(move || reclaim(batch));
    guard.flush();
}

/// Frees a batch of retired blocks that no thread can reach any more into
/// this thread's cache (what it cannot hold goes to the shared list or the
/// allocator), and keeps the emptied batch for reuse.
fn reclaim(batch: Box<Retired>) {
    let layout = batch.layout;
    let mut batch = Some(batch);
    let _ = CACHE.try_with(|cache| {
        let Ok(mut cache) = cache.try_borrow_mut() else {
            return;
        };
        let list = cache.list(layout);
        if let Some(retired) = batch.as_mut() {
            if list.free.len() + retired.blocks.len() <= KEEP {
                list.free.append(&mut retired.blocks);
            } else {
                for block in retired.blocks.drain(..) {
                    if !keep(&mut list.free, block, layout) {
                        // SAFETY: retired, and no thread can reach it now.
                        unsafe { free(block, layout) };
                    }
                }
            }
        }
        if list.spare.is_none() {
            list.spare = batch.take();
        }
    });
    // No cache (the thread is exiting): freed (if not drained above).
    if let Some(retired) = batch {
        for &block in &retired.blocks {
            // SAFETY: as above.
            unsafe { free(block, layout) };
        }
    }
}

/// # Safety
/// As for [`give`].
#[cold]
#[inline(never)]
unsafe fn free(block: NonNull<u8>, layout: Layout) {
    std::alloc::dealloc(block.as_ptr(), layout);
}

#[cfg(test)]
mod tests {
    use super::*;

    fn alloc(layout: Layout) -> NonNull<u8> {
        // SAFETY: a non-zero size.
        NonNull::new(unsafe { std::alloc::alloc(layout) }).unwrap()
    }

    /// Takes every block this thread can get of `layout` (its own, then
    /// the shared list's).
    fn take_all(layout: Layout) -> Batch {
        Batch(std::iter::from_fn(|| take(layout)).collect())
    }

    #[test]
    fn the_pool_keeps_at_most_keep_per_thread_plus_the_shared_batches() {
        // Fresh threads: their caches start empty. No other test uses
        // these layouts (a node is at least 56 bytes), so the shared list
        // holds none of them.
        std::thread::spawn(|| {
            let layout = Layout::from_size_align(48, 8).unwrap();
            let other = Layout::from_size_align(48, 16).unwrap();
            assert!(take(layout).is_none());
            let shared = SHARED_BATCHES * BATCH;
            let blocks: Vec<_> = (0..KEEP + shared + 10).map(|_| alloc(layout)).collect();
            for &b in &blocks {
                // SAFETY: allocated above with `layout`, given once.
                unsafe { give(b, layout) };
            }
            assert!(take(other).is_none(), "layouts are kept apart");
            // Another thread, whose cache is empty, gets the shared batches.
            let theirs = std::thread::spawn(move || take_all(layout)).join().unwrap();
            let mine = take_all(layout);
            assert_eq!(theirs.0.len(), shared, "the shared list holds {shared}");
            assert_eq!(
                mine.0.len(),
                KEEP,
                "a thread keeps {KEEP}; the rest was freed"
            );
            let mut back: Vec<NonNull<u8>> = mine.0.into_iter().chain(theirs.0).collect();
            back.sort_unstable();
            back.dedup();
            assert_eq!(back.len(), KEEP + shared, "no block handed out twice");
            for b in back {
                assert!(blocks.contains(&b));
                // SAFETY: as above; the pool no longer holds it.
                unsafe { std::alloc::dealloc(b.as_ptr(), layout) };
            }
        })
        .join()
        .unwrap();
    }

    #[test]
    fn retired_blocks_come_back_only_after_the_epoch_passes() {
        // A fresh thread: its cache starts empty. No other test uses this
        // layout (a node is at least 56 bytes).
        std::thread::spawn(|| {
            let layout = Layout::from_size_align(40, 8).unwrap();
            let blocks: Vec<_> = (0..RETIRE_BATCH + 3).map(|_| alloc(layout)).collect();
            {
                let guard = crossbeam_epoch::pin();
                for &b in &blocks {
                    // SAFETY: allocated above with `layout`, never reachable
                    // by anyone else, retired once.
                    unsafe { retire(b, layout, &guard) };
                }
                // The full batch went to the collector, which cannot free
                // it while this thread is pinned.
                assert!(take(layout).is_none(), "reclaimed while pinned");
            }
            // The collector runs the batch on whichever thread pins: here,
            // unless another test's thread got to it first.
            let mut back = Vec::new();
            for _ in 0..1_000 {
                crossbeam_epoch::pin().flush();
                back.extend(std::iter::from_fn(|| take(layout)));
                if back.len() == RETIRE_BATCH {
                    break;
                }
            }
            assert!(back.len() <= RETIRE_BATCH, "only the full batch");
            back.sort_unstable();
            back.dedup();
            for b in back {
                assert!(blocks[..RETIRE_BATCH].contains(&b), "a retired block");
                // SAFETY: as above; the pool no longer holds it.
                unsafe { std::alloc::dealloc(b.as_ptr(), layout) };
            }
            // The last 3 stay retired until this thread exits, and then
            // go to the collector.
        })
        .join()
        .unwrap();
    }

    /// Retires `n` fresh blocks of `layout` under one pin; returns them.
    fn retire_fresh(layout: Layout, n: usize) -> Vec<NonNull<u8>> {
        let blocks: Vec<_> = (0..n).map(|_| alloc(layout)).collect();
        let guard = crossbeam_epoch::pin();
        for &b in &blocks {
            // SAFETY: allocated here with `layout`, never reachable by
            // anyone else, retired once.
            unsafe { retire(b, layout, &guard) };
        }
        blocks
    }

    #[test]
    fn a_batch_deferred_after_its_retirer_repinned_waits_for_a_reader_pinned_before() {
        // The reader pins, then the block it reads is retired; the
        // retiring thread unpins and pins again (many times) before the
        // batch fills and goes to the collector. The collector must still
        // wait for the reader: under Miri a read of a freed block fails.
        let layout = Layout::from_size_align(40, 16).unwrap();
        let block = alloc(layout);
        // SAFETY: fresh, 40 bytes.
        unsafe { block.as_ptr().write_bytes(0x5a, layout.size()) };
        let (for_reader, for_retirer) = (Batch(vec![block]), Batch(vec![block]));
        let (pinned_tx, pinned_rx) = std::sync::mpsc::channel();
        let (done_tx, done_rx) = std::sync::mpsc::channel::<()>();
        let reader = std::thread::spawn(move || {
            let for_reader = for_reader; // the whole `Send` batch
            let guard = crossbeam_epoch::pin();
            pinned_tx.send(()).unwrap();
            done_rx.recv().unwrap();
            // SAFETY: retired while this thread was pinned, so still
            // allocated and untouched.
            let byte = unsafe { for_reader.0[0].as_ptr().add(39).read_volatile() };
            assert_eq!(byte, 0x5a, "freed under a pinned reader");
            drop(guard);
        });
        pinned_rx.recv().unwrap();
        std::thread::spawn(move || {
            let for_retirer = for_retirer;
            let block = for_retirer.0[0];
            {
                let guard = crossbeam_epoch::pin();
                // SAFETY: the reader reached it before; nobody pinning from
                // now on can.
                unsafe { retire(block, layout, &guard) };
            }
            for _ in 0..RETIRE_BATCH {
                crossbeam_epoch::pin().flush();
            }
            let rest = retire_fresh(layout, RETIRE_BATCH - 1);
            for _ in 0..RETIRE_BATCH {
                crossbeam_epoch::pin().flush();
                assert!(take(layout).is_none(), "reclaimed under a pinned reader");
            }
            done_tx.send(()).unwrap();
            reader.join().unwrap();
            // Now the batch may be freed; whatever comes back here is one
            // of its blocks.
            for _ in 0..100 {
                crossbeam_epoch::pin().flush();
                while let Some(b) = take(layout) {
                    assert!(b == block || rest.contains(&b));
                    // SAFETY: the pool no longer holds it.
                    unsafe { std::alloc::dealloc(b.as_ptr(), layout) };
                }
            }
        })
        .join()
        .unwrap();
    }

    #[test]
    fn partial_batches_of_two_layouts_go_to_the_collector_at_thread_exit() {
        // Either order of the thread-local destructors: the cache made
        // after crossbeam's handle (dropped first, pins with the handle)
        // or before it (dropped last, pins with a fresh handle), and the
        // blocks a late collection hands to a cache being destroyed.
        let a = Layout::from_size_align(24, 8).unwrap();
        let b = Layout::from_size_align(24, 16).unwrap();
        let threads = if cfg!(miri) { 4 } else { 64 };
        for i in 0..threads {
            std::thread::spawn(move || {
                if i % 2 == 0 {
                    // The cache first, then crossbeam's handle.
                    CACHE.with(|_| ());
                }
                let n = if i % 3 == 0 { RETIRE_BATCH + 5 } else { 7 };
                retire_fresh(a, n);
                retire_fresh(b, 3);
                // SAFETY: allocated here with `a`, given once.
                unsafe { give(alloc(a), a) };
            })
            .join()
            .unwrap();
        }
        // Whatever of those blocks a collection hands to this thread is
        // free to reuse (and freed when this thread exits).
        for _ in 0..300 {
            crossbeam_epoch::pin().flush();
        }
        let _ = (take(a), take(b));
    }
}
