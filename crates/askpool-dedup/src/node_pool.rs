//! A small per-thread cache of freed node blocks.
//!
//! An insert at capacity allocates one node and, through the epoch
//! collector, frees one. The collector frees in bursts (up to 8 bags of 64
//! nodes every 128 pins), which overflow the system allocator's per-thread
//! cache and send it down its slow paths: profiled, malloc and free were 40%
//! of an insert's instructions. Blocks the collector frees go here instead,
//! up to [`KEEP`] per thread and node layout, and the next node this thread
//! allocates takes one back. What a thread keeps is freed when it exits;
//! beyond `KEEP` a block goes back to the allocator at once, so the cache
//! adds at most `KEEP` blocks per thread to the memory bound.
//!
//! Blocks come from and go back to the global allocator with the node's own
//! layout, so a node from the cache may be freed like any `Box`, and a block
//! the cache cannot take (full, or its thread is exiting) is simply freed.

use std::alloc::Layout;
use std::cell::RefCell;
use std::ptr::NonNull;

/// Most blocks a thread keeps per layout (128 nodes of 72 bytes: 9 KiB).
pub(crate) const KEEP: usize = 128;

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

/// A block of `layout` this thread kept, if any.
#[inline]
pub(crate) fn take(layout: Layout) -> Option<NonNull<u8>> {
    CACHE
        .try_with(|cache| {
            let mut cache = cache.try_borrow_mut().ok()?;
            cache.list(layout).pop()
        })
        .ok()
        .flatten()
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
            if list.len() < KEEP {
                list.push(block);
                true
            } else {
                false
            }
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

    #[test]
    fn a_thread_keeps_at_most_keep_blocks_per_layout() {
        // A fresh thread: its cache starts empty.
        std::thread::spawn(|| {
            let layout = Layout::from_size_align(48, 8).unwrap();
            let other = Layout::from_size_align(48, 16).unwrap();
            assert!(take(layout).is_none());
            let blocks: Vec<_> = (0..KEEP + 10)
                // SAFETY: a non-zero size.
                .map(|_| NonNull::new(unsafe { std::alloc::alloc(layout) }).unwrap())
                .collect();
            for &b in &blocks {
                // SAFETY: allocated above with `layout`, given once.
                unsafe { give(b, layout) };
            }
            assert!(take(other).is_none(), "layouts are kept apart");
            let mut back = Vec::new();
            while let Some(b) = take(layout) {
                back.push(b);
            }
            assert_eq!(back.len(), KEEP, "the rest went back to the allocator");
            assert!(back.iter().all(|b| blocks.contains(b)));
            for b in back {
                // SAFETY: as above; the cache no longer holds it.
                unsafe { std::alloc::dealloc(b.as_ptr(), layout) };
            }
        })
        .join()
        .unwrap();
    }
}
