//! Process-wide slabs of node slots, one per node layout, addressed by
//! 32-bit slot numbers.
//!
//! Why: a hit's first miss is the bucket array, and a bucket that holds a
//! 4-byte slot number instead of an 8-byte pointer halves that array (1 MiB
//! for 100,000 entries), so more of it stays in cache; the chain and queue
//! links shrink the same way, so a node with a 16-byte state fits one
//! 64-byte line.
//!
//! A slab grows in segments that double (64 slots, then 128, 256, ...), so
//! a slot number maps to its memory with one leading-zero count, a load
//! from a table of 32 biased segment bases (in L1) and a multiply-add.
//! Segments are never freed: a slot
//! freed by one table is reused by the next node of the same layout, in any
//! table whose states own resources (one slab per layout for those), as the
//! system allocator would reuse a block. A table of plain-data states, read
//! with no pin, has a slab of its own while it lives, which the next such
//! table of its layout takes over once it is dropped (`Slab::of`). A slab's
//! memory is its peak of nodes in use at once, which the tables bound
//! (entries, in-flight epoch garbage and the per-thread caches of
//! `node_pool`).
//!
//! The segment table is written once per segment, under a mutex, before the
//! first slot of the segment is handed out; a slot number reaches another
//! thread through the table's links (release/acquire), the slab's shared
//! list (its mutex) or the epoch collector's reclamation, each of which
//! orders the segment's pointer before it. Loom models the links; the
//! slab's own atomics are std's, as they are not part of any race the table
//! has (so the slab and the per-thread caches are checked by the unit tests
//! and Miri, not loom).

use std::alloc::Layout;
use std::sync::atomic::{AtomicPtr, AtomicU32, AtomicUsize, Ordering};
use std::sync::Mutex;

/// Slots in the first segment (a power of two); segment `k` holds
/// `FIRST << k`.
const FIRST: u32 = 64;
const FIRST_SHIFT: u32 = FIRST.trailing_zeros();
/// Segments: enough for every slot number below [`MAX_SLOTS`].
const SEGMENTS: usize = 26;
/// Slot numbers stay below 2^31 - 64, so that a link (slot + 1, shifted
/// past a mark bit) fits a `u32`.
pub(crate) const MAX_SLOTS: u32 = (1 << 31) - FIRST;

/// Alignment of a segment: a node whose size is a multiple of 64 starts on
/// a cache line.
const SEGMENT_ALIGN: usize = 64;

pub(crate) struct Slab {
    /// Of one slot.
    layout: Layout,
    /// Whether its slots hold nodes that lookups read with no pin (see
    /// `state_cell`): such nodes are only ever written with atomic stores,
    /// and such a slab belongs to one table at a time. A lookup with no pin
    /// may follow a stale link to a slot reused since; within its own
    /// table that is caught (the key, the version), but a node of another
    /// table could hold the same key. So a slot never passes to another
    /// table while its table lives, nor to a table that writes plainly.
    #[cfg_attr(loom, allow(dead_code))]
    lock_free_reads: bool,
    /// For a slab of `lock_free_reads`: a table uses it.
    #[cfg_attr(loom, allow(dead_code))]
    taken: std::sync::atomic::AtomicBool,
    segments: [AtomicPtr<u8>; SEGMENTS],
    /// For each bit length `b` of `slot + FIRST` (6 to 30), the base of the
    /// segment whose slots have it, less the bytes of the slots numbered
    /// below it (a wrapping pointer of the segment's allocation): the slot's
    /// memory is then `biased[b] + (slot + FIRST) * size`, one load and a
    /// multiply-add.
    biased: [AtomicPtr<u8>; 32],
    /// Slots below this were handed out at least once.
    fresh: AtomicU32,
    grow: Mutex<()>,
    /// Free slots handed back in batches: by thread caches that overflowed
    /// or whose thread exited, and by tables that were dropped.
    shared: Mutex<Vec<Vec<u32>>>,
    /// Batches in `shared`: an empty cache looks here before it locks.
    shared_len: AtomicUsize,
}

/// The slabs made so far, never freed: one per node layout for tables
/// read under a pin, and one per table read with no pin (reused by a later
/// table once its table is dropped).
static SLABS: Mutex<Vec<&'static Slab>> = Mutex::new(Vec::new());

impl Slab {
    /// A slab of slots of `layout` for a new table: the one every table of
    /// that layout shares, or, for a table whose nodes are read with no pin,
    /// one of its own until it is dropped ([`Slab::release`]). Made on
    /// first use.
    pub(crate) fn of(layout: Layout, lock_free_reads: bool) -> &'static Slab {
        // Slots sit back to back: each one's size is a multiple of its
        // alignment.
        let layout = layout.pad_to_align();
        let mut slabs = SLABS.lock().unwrap_or_else(|e| e.into_inner());
        // Under loom every table has a slab of its own (leaked, as all
        // slabs are): a node's atomics are objects of one model run, which
        // a slot shared with the next run would outlive (see `Node::init`).
        #[cfg(not(loom))]
        if let Some(slab) = slabs.iter().find(|s| {
            s.layout == layout
                && s.lock_free_reads == lock_free_reads
                && !(lock_free_reads && s.taken.swap(true, Ordering::Relaxed))
        }) {
            return slab;
        }
        let slab: &'static Slab = Box::leak(Box::new(Slab {
            layout,
            lock_free_reads,
            taken: std::sync::atomic::AtomicBool::new(lock_free_reads),
            segments: std::array::from_fn(|_| AtomicPtr::new(std::ptr::null_mut())),
            biased: std::array::from_fn(|_| AtomicPtr::new(std::ptr::null_mut())),
            fresh: AtomicU32::new(0),
            grow: Mutex::new(()),
            shared: Mutex::new(Vec::new()),
            shared_len: AtomicUsize::new(0),
        }));
        slabs.push(slab);
        slab
    }

    /// Hands the slab of a table that is being dropped to the next table
    /// of its layout (no-op for a shared slab). The table gave its slots
    /// back; those still in the epoch collector come back to this slab
    /// later, unreachable from any table.
    pub(crate) fn release(&self) {
        if self.lock_free_reads {
            // The registry's lock orders this after the table's last use.
            let _slabs = SLABS.lock().unwrap_or_else(|e| e.into_inner());
            self.taken.store(false, Ordering::Relaxed);
        }
    }

    /// The memory of a slot handed out by this slab, whose slots hold `T`s.
    #[inline(always)]
    pub(crate) fn get<T>(&self, slot: u32) -> *mut T {
        debug_assert_eq!(self.layout, Layout::new::<T>().pad_to_align());
        let v = slot + FIRST;
        let bits = v.ilog2() as usize;
        // SAFETY: `bits` is below 32.
        let biased = unsafe { self.biased.get_unchecked(bits) }.load(Ordering::Acquire);
        debug_assert!(
            !self.segments[locate(slot).0]
                .load(Ordering::Relaxed)
                .is_null(),
            "slot {slot} of a segment never made"
        );
        biased
            .wrapping_add(v as usize * std::mem::size_of::<T>())
            .cast()
    }

    /// A slot never handed out before (the segment it falls in is made
    /// first).
    #[cold]
    pub(crate) fn fresh(&self) -> u32 {
        // Counted only below the limit: a call refused here must not move
        // the count on (past u32::MAX it would wrap and hand out slot 0
        // again).
        let slot = self
            .fresh
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |n| {
                (n < MAX_SLOTS).then_some(n + 1)
            })
            .unwrap_or_else(|_| {
                panic!("askpool-dedup: more than {MAX_SLOTS} nodes of one layout at once")
            });
        let (segment, _) = locate(slot);
        if self.segments[segment].load(Ordering::Acquire).is_null() {
            self.grow(segment);
        }
        slot
    }

    #[cold]
    #[inline(never)]
    fn grow(&self, segment: usize) {
        let _grow = self.grow.lock().unwrap_or_else(|e| e.into_inner());
        if !self.segments[segment].load(Ordering::Acquire).is_null() {
            return;
        }
        let layout = self.segment_layout(segment);
        // Zeroed: a slot's first node is written field by field with
        // atomic stores, over atomics that must already hold a value (a
        // node's version starts at 0). Asked for with the allocator's
        // least alignment and aligned here: the system allocator zeroes an
        // over-aligned block with a memset of all of it, where a plainly
        // aligned one is `calloc`'s, which gets a large segment as fresh
        // pages the kernel zeroed already. A segment is never freed, so
        // its start before the rounding need not be kept.
        let padded =
            Layout::from_size_align(layout.size() + layout.align(), 1).expect("a segment's layout");
        // SAFETY: a non-zero size (a node is never zero-sized).
        let block = unsafe { std::alloc::alloc_zeroed(padded) };
        if block.is_null() {
            std::alloc::handle_alloc_error(padded);
        }
        let base = block.wrapping_add(block.addr().wrapping_neg() & (layout.align() - 1));
        let first = (FIRST as usize) << segment;
        let bits = first.trailing_zeros() as usize;
        self.biased[bits].store(
            base.wrapping_sub(first * self.layout.size()),
            Ordering::Release,
        );
        self.segments[segment].store(base, Ordering::Release);
    }

    fn segment_layout(&self, segment: usize) -> Layout {
        let slots = (FIRST as usize) << segment;
        let size = self
            .layout
            .size()
            .checked_mul(slots)
            .expect("a segment's size fits usize");
        Layout::from_size_align(size, self.layout.align().max(SEGMENT_ALIGN))
            .expect("a segment's layout")
    }

    /// A batch of free slots handed back, if any.
    #[cfg_attr(loom, allow(dead_code))]
    pub(crate) fn take_batch(&self) -> Option<Vec<u32>> {
        if self.shared_len.load(Ordering::Relaxed) == 0 {
            return None;
        }
        let mut shared = self.shared.lock().unwrap_or_else(|e| e.into_inner());
        let batch = shared.pop()?;
        self.shared_len.fetch_sub(1, Ordering::Relaxed);
        Some(batch)
    }

    /// Hands back free slots (nobody can reach them any more).
    #[cfg_attr(loom, allow(dead_code))]
    pub(crate) fn give_batch(&self, batch: Vec<u32>) {
        if batch.is_empty() {
            return;
        }
        let mut shared = self.shared.lock().unwrap_or_else(|e| e.into_inner());
        shared.push(batch);
        self.shared_len.fetch_add(1, Ordering::Relaxed);
    }

    /// Hands back one free slot, into the newest batch while it is
    /// smaller than `batch`: where there is no per-thread cache (loom, a
    /// thread being torn down), one `Vec` per slot would be wasteful.
    pub(crate) fn give_one(&self, slot: u32, batch: usize) {
        let mut shared = self.shared.lock().unwrap_or_else(|e| e.into_inner());
        match shared.last_mut() {
            Some(last) if last.len() < batch => last.push(slot),
            _ => {
                let mut new = Vec::with_capacity(batch);
                new.push(slot);
                shared.push(new);
                self.shared_len.fetch_add(1, Ordering::Relaxed);
            }
        }
    }

    /// A free slot: a handed-back one, else a fresh one. Used where there
    /// is no per-thread cache (loom models, which need the same operations
    /// on every run, and a thread being torn down).
    pub(crate) fn take_one(&self) -> u32 {
        if self.shared_len.load(Ordering::Relaxed) == 0 {
            return self.fresh();
        }
        let mut shared = self.shared.lock().unwrap_or_else(|e| e.into_inner());
        while let Some(batch) = shared.last_mut() {
            let slot = batch.pop();
            if batch.is_empty() {
                shared.pop();
                self.shared_len.fetch_sub(1, Ordering::Relaxed);
            }
            if let Some(slot) = slot {
                return slot;
            }
        }
        drop(shared);
        self.fresh()
    }

    /// Slots ever handed out fresh (tests).
    #[cfg(test)]
    pub(crate) fn made(&self) -> u32 {
        self.fresh.load(Ordering::Relaxed)
    }

    /// Bytes of segments made so far (tests).
    #[cfg(test)]
    pub(crate) fn reserved_bytes(&self) -> usize {
        (0..SEGMENTS)
            .filter(|&k| !self.segments[k].load(Ordering::Acquire).is_null())
            .map(|k| self.segment_layout(k).size())
            .sum()
    }
}

/// The segment of a slot and its offset in it.
#[inline(always)]
fn locate(slot: u32) -> (usize, usize) {
    let v = slot + FIRST;
    let segment = 31 - v.leading_zeros() - FIRST_SHIFT;
    (segment as usize, (v - (FIRST << segment)) as usize)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn slots_map_to_consecutive_offsets_of_doubling_segments() {
        assert_eq!(locate(0), (0, 0));
        assert_eq!(locate(63), (0, 63));
        assert_eq!(locate(64), (1, 0));
        assert_eq!(locate(191), (1, 127));
        assert_eq!(locate(192), (2, 0));
        assert_eq!(locate(MAX_SLOTS - 1).0, SEGMENTS - 2);
        // Every slot below a bound maps to a distinct place.
        let mut seen = std::collections::HashSet::new();
        for slot in 0..5_000 {
            let (segment, offset) = locate(slot);
            assert!(offset < (FIRST as usize) << segment);
            assert!(seen.insert((segment, offset)));
        }
    }

    #[test]
    fn fresh_slots_are_distinct_aligned_memory() {
        // A layout no node and no other test has.
        #[repr(align(32))]
        struct Slot32(#[allow(dead_code)] [u8; 32]);
        let layout = Layout::new::<Slot32>();
        let slab = Slab::of(layout, false);
        assert!(std::ptr::eq(slab, Slab::of(layout, false)));
        let n = if cfg!(miri) { 200 } else { 10_000 };
        let slots: Vec<u32> = (0..n).map(|_| slab.fresh()).collect();
        for &slot in &slots {
            let p = slab.get::<Slot32>(slot).cast::<u8>();
            assert_eq!(p as usize % 32, 0);
            // SAFETY: a slot of 32 bytes owned by this test.
            unsafe { p.write_bytes(0xa5, 32) };
        }
        let mut ptrs: Vec<usize> = slots
            .iter()
            .map(|&s| slab.get::<Slot32>(s) as usize)
            .collect();
        ptrs.sort_unstable();
        assert!(
            ptrs.windows(2).all(|w| w[1] - w[0] >= 32),
            "overlapping slots"
        );
        assert!(slab.reserved_bytes() >= n * 32);
        assert!(slab.reserved_bytes() <= 2 * n * 32 + 32 * FIRST as usize);
        slab.give_batch(slots);
        let back = slab.take_batch().unwrap();
        assert_eq!(back.len(), n);
    }
}
