//! A small per-thread cache of freed node blocks, with a small shared
//! overflow.
//!
//! An insert at capacity allocates one node and, through the epoch
//! collector, frees one. The collector frees in bursts (up to 8 bags of 64
//! nodes every 128 pins), which overflow the system allocator's per-thread
//! cache and send it down its slow paths: profiled, malloc and free were 40%
//! of an insert's instructions. Blocks the collector frees go here instead,
//! up to [`KEEP`] per thread and node layout, and the next node this thread
//! allocates takes one back.
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
//! blocks per thread plus `SHARED_BATCHES * BATCH` in all to the memory
//! bound, per node layout.
//!
//! Blocks come from and go back to the global allocator with the node's own
//! layout, so a node from the cache may be freed like any `Box`, and a block
//! the cache cannot take (full, or its thread is exiting) is simply freed.

use std::alloc::Layout;
use std::cell::RefCell;
use std::ptr::NonNull;
use std::sync::atomic::{AtomicUsize, Ordering::Relaxed};
use std::sync::Mutex;

/// Most blocks a thread keeps per layout (128 nodes of 72 bytes: 9 KiB).
pub(crate) const KEEP: usize = 128;

/// Blocks moved between a thread's cache and the shared list at a time.
pub(crate) const BATCH: usize = KEEP / 2;

/// Most batches the shared list holds per layout (1,024 nodes of 72 bytes:
/// 72 KiB).
pub(crate) const SHARED_BATCHES: usize = 16;

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

struct Cache {
    /// One free list per node layout (one per state type in use).
    lists: Vec<(Layout, Vec<NonNull<u8>>)>,
}

impl Cache {
    /// The free list of `layout`, made on first use. The first list is
    /// checked inline (most programs have one state type); the rest out of
    /// line, so the common path stays a few instructions.
    #[inline]
    fn list(&mut self, layout: Layout) -> &mut Vec<NonNull<u8>> {
        match self.lists.first() {
            Some((first, _)) if *first == layout => &mut self.lists[0].1,
            _ => self.list_slow(layout),
        }
    }

    #[cold]
    #[inline(never)]
    fn list_slow(&mut self, layout: Layout) -> &mut Vec<NonNull<u8>> {
        let index = match self.lists.iter().position(|(l, _)| *l == layout) {
            Some(i) => i,
            None => {
                self.lists.push((layout, Vec::with_capacity(KEEP)));
                self.lists.len() - 1
            }
        };
        &mut self.lists[index].1
    }
}

impl Drop for Cache {
    fn drop(&mut self) {
        for (layout, list) in self.lists.drain(..) {
            for block in list {
                // SAFETY: allocated by the global allocator with `layout`,
                // owned by this cache alone.
                unsafe { std::alloc::dealloc(block.as_ptr(), layout) };
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
            let list = cache.list(layout);
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
            let list = cache.list(layout);
            if list.len() >= KEEP && !spill(list, layout) {
                return false;
            }
            list.push(block);
            true
        })
        .unwrap_or(false);
    if !kept {
        free(block, layout);
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
}
