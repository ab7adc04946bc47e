//! Where a node keeps its state, and how a lookup copies a terminal state
//! out with no lock and no epoch pin.
//!
//! Why: an epoch pin is a locked compare-and-swap, about a third of a hit's
//! time. A lookup of a state with no drop glue therefore reads the node it
//! reached without a pin (`DedupTable::get`): slots are never freed
//! (`slab`), so the memory stays a node, but the slot may be reused by
//! another entry while the lookup reads it. The node's version (a seqlock
//! on the slot's reuse) tells the lookup to throw such a read away. A read
//! that is thrown away may still race with the writes of the slot's next
//! owner, and a race between a plain write and any read is undefined
//! behaviour even when its result is never used. So the state of such a
//! table is always written with atomic stores, word by word, and copied
//! out with atomic loads.
//!
//! The words go through `atomic-maybe-uninit`: a state's padding is
//! uninitialised, and std's atomics would turn it into integers (undefined
//! behaviour); its inline assembly copies such words as they are, pointers
//! included. Miri does not run inline assembly, so under Miri the words go
//! through std's `AtomicU64`: the tests that Miri runs on this path use
//! states with no padding.
//!
//! States with drop glue are written with plain stores and read only under
//! their entry's lock and a pin; their tables use slabs of their own, so a
//! lock-free lookup never meets a slot one of them writes (`Slab::of`).

use std::cell::UnsafeCell;
use std::mem::{ManuallyDrop, MaybeUninit};
use std::sync::atomic::Ordering::Relaxed;

/// One word of a state, as it sits in memory (maybe padding).
type Word = MaybeUninit<u64>;

/// A node's state, in whole words (its size is a multiple of 8). The
/// padding after the state is inside the `UnsafeCell` too: the word
/// stores write it.
#[cfg(not(loom))]
#[repr(transparent)]
pub(crate) struct StateCell<S>(UnsafeCell<Words<S>>);

/// Under loom the words a lookup copies lock-free are also kept in loom's
/// atomics, so that the model sees those loads and stores (and the
/// ordering they give the version's reads); std's atomics and inline
/// assembly are invisible to it.
#[cfg(loom)]
pub(crate) struct StateCell<S>(UnsafeCell<Words<S>>, Box<[loom::sync::atomic::AtomicU64]>);

/// A state outside a node, laid out as in a [`StateCell`] (whole words).
#[repr(C, align(8))]
struct Words<S>(MaybeUninit<S>);

/// Whether tables of `S` read terminal states lock-free: states with no
/// drop glue (plain data). A state that owns resources is dropped when its
/// entry is removed, under the lock, so it is read under the lock.
pub(crate) const fn read_lock_free<S>() -> bool {
    !std::mem::needs_drop::<S>()
}

impl<S> StateCell<S> {
    const WORDS: usize = std::mem::size_of::<Words<S>>() / 8;

    /// A state's memory, uninitialised.
    #[cfg(all(test, not(loom)))]
    pub(crate) const fn uninit() -> Self {
        Self(UnsafeCell::new(Words(MaybeUninit::uninit())))
    }

    /// A state's memory, uninitialised.
    #[cfg(loom)]
    pub(crate) fn uninit() -> Self {
        Self(
            UnsafeCell::new(Words(MaybeUninit::uninit())),
            (0..Self::WORDS)
                .map(|_| loom::sync::atomic::AtomicU64::new(0))
                .collect(),
        )
    }

    /// The state.
    #[inline(always)]
    pub(crate) fn get(&self) -> *mut S {
        self.0.get().cast()
    }

    /// Writes `value` over memory that holds no state (never initialised,
    /// or moved out).
    ///
    /// # Safety
    /// The caller is the only writer of this cell (the entry's lock, or a
    /// reserved node of its own), and no one reads it except lock-free
    /// lookups (which validate what they read).
    #[inline(always)]
    pub(crate) unsafe fn write(&self, value: S) {
        if read_lock_free::<S>() {
            // Under Miri the words go through integers: no uninitialised
            // bytes past the state (the state itself has no padding there).
            let mut src = MaybeUninit::<Words<S>>::uninit();
            // In place: a move of the buffer would drop its padding again.
            // SAFETY: one `Words` of bytes.
            #[cfg(any(miri, loom))]
            unsafe {
                src.as_mut_ptr().write_bytes(0, 1)
            };
            // SAFETY: `Words` starts with the state.
            unsafe { src.as_mut_ptr().cast::<S>().write(value) };
            let src = src.as_ptr().cast::<Word>();
            let dst = self.0.get().cast::<Word>();
            for i in 0..Self::WORDS {
                // SAFETY: both are `WORDS` whole words long, 8-aligned; a
                // `MaybeUninit` word may hold any bytes.
                unsafe { self.store_word(i, dst.add(i), src.add(i).read()) };
            }
        } else {
            // SAFETY: as the caller promised; plain stores, as nobody reads
            // this cell without the lock.
            unsafe { self.get().write(value) };
        }
    }

    /// Moves the state out and writes `value` in its place.
    ///
    /// # Safety
    /// Initialised; otherwise as for [`Self::write`].
    #[inline(always)]
    pub(crate) unsafe fn replace(&self, value: S) -> S {
        // SAFETY: initialised; the only writer reads it (lock-free lookups
        // only read, so this plain read races nothing).
        let old = unsafe { self.get().read() };
        // SAFETY: as the caller promised; the old state was moved out.
        unsafe { self.write(value) };
        old
    }

    /// The state, as code outside the table may see it ([`StateView`]).
    ///
    /// # Safety
    /// Initialised, and not written while the view lives (the entry's lock
    /// is held).
    #[inline(always)]
    pub(crate) unsafe fn view(&self) -> StateView<'_, S> {
        if read_lock_free::<S>() {
            // SAFETY: initialised, and nobody writes it meanwhile: a whole
            // state. A copy of a type with no drop glue, never dropped.
            StateView::Copy(ManuallyDrop::new(unsafe {
                self.copy_lock_free().assume_init()
            }))
        } else {
            // SAFETY: initialised; not written while the view lives.
            StateView::Cell(unsafe { &*self.get() })
        }
    }

    /// A copy of the cell's bytes, read with atomic loads and no lock.
    /// Meaningful only once validated: the cell may be rewritten meanwhile,
    /// and the copy then mixes two states.
    #[inline(always)]
    pub(crate) fn copy_lock_free(&self) -> MaybeUninit<S> {
        debug_assert!(read_lock_free::<S>());
        let mut out = MaybeUninit::<Words<S>>::uninit();
        let dst = out.as_mut_ptr().cast::<Word>();
        let src = self.0.get().cast::<Word>();
        for i in 0..Self::WORDS {
            // SAFETY: both are `WORDS` whole words long, 8-aligned; the
            // cell's words are only ever written atomically (`write`).
            unsafe { dst.add(i).write(self.load_word(i, src.add(i))) };
        }
        // SAFETY: `Words` starts with the state; a `MaybeUninit` holds any
        // bytes.
        unsafe { out.as_ptr().cast::<MaybeUninit<S>>().read() }
    }
}

/// A stored state as code outside the table sees it (a transition
/// closure, a `Clone`): the state itself, or, for a state that lookups
/// copy lock-free, a copy of it. Such code may write through the state's
/// interior mutability (a `Cell`, an atomic); in the cell that would be a
/// plain write, or an atomic one of another size, racing the atomic loads
/// of a lookup that holds no lock. So it writes to the copy.
pub(crate) enum StateView<'a, S> {
    Cell(&'a S),
    Copy(ManuallyDrop<S>),
}

impl<S> std::ops::Deref for StateView<'_, S> {
    type Target = S;

    #[inline(always)]
    fn deref(&self) -> &S {
        match self {
            Self::Cell(state) => state,
            Self::Copy(state) => state,
        }
    }
}

impl<S> StateCell<S> {
    /// Stores word `i` of the state, at `dst`.
    #[cfg(not(any(miri, loom)))]
    #[inline(always)]
    unsafe fn store_word(&self, _i: usize, dst: *mut Word, word: Word) {
        // SAFETY: aligned; only ever accessed atomically by others.
        unsafe { atomic_maybe_uninit::AtomicMaybeUninit::<u64>::from_ptr(dst) }
            .store(word, Relaxed);
    }

    /// Loads word `i` of the state, at `src`.
    #[cfg(not(any(miri, loom)))]
    #[inline(always)]
    unsafe fn load_word(&self, _i: usize, src: *mut Word) -> Word {
        // SAFETY: as for `store_word`.
        unsafe { atomic_maybe_uninit::AtomicMaybeUninit::<u64>::from_ptr(src) }.load(Relaxed)
    }

    #[cfg(miri)]
    unsafe fn store_word(&self, _i: usize, dst: *mut Word, word: Word) {
        // SAFETY: aligned; Miri's states here have no padding (module docs).
        unsafe {
            std::sync::atomic::AtomicU64::from_ptr(dst.cast()).store(word.assume_init(), Relaxed)
        };
    }

    #[cfg(miri)]
    unsafe fn load_word(&self, _i: usize, src: *mut Word) -> Word {
        // SAFETY: as for `store_word`.
        MaybeUninit::new(
            unsafe { std::sync::atomic::AtomicU64::from_ptr(src.cast()) }.load(Relaxed),
        )
    }

    /// Under loom: the word goes to the cell (read under the lock) and to
    /// loom's atomic (read lock-free); the loom models' states have no
    /// padding the buffer's zeroes do not fill.
    #[cfg(loom)]
    unsafe fn store_word(&self, i: usize, dst: *mut Word, word: Word) {
        // SAFETY: the only writer; lock-free readers read the atomics.
        unsafe { dst.write(word) };
        self.1[i].store(unsafe { word.assume_init() }, Relaxed);
    }

    #[cfg(loom)]
    unsafe fn load_word(&self, i: usize, _src: *mut Word) -> Word {
        MaybeUninit::new(self.1[i].load(Relaxed))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_state_written_word_by_word_is_read_back_whole() {
        // Sizes that are not whole words, and alignments below a word.
        let cell = StateCell::<[u8; 13]>::uninit();
        let value = *b"thirteen byte";
        unsafe { cell.write(value) };
        assert_eq!(unsafe { cell.copy_lock_free().assume_init() }, value);
        assert_eq!(unsafe { cell.replace(*b"another value") }, value);
        assert_eq!(unsafe { *cell.get() }, *b"another value");
    }

    /// Padding inside the state (Miri's std-atomics path needs none).
    #[test]
    #[cfg(not(miri))]
    fn a_state_with_padding_is_copied_with_it() {
        let cell = StateCell::<(u64, u32)>::uninit();
        unsafe { cell.write((7, 9)) };
        assert_eq!(unsafe { cell.copy_lock_free().assume_init() }, (7, 9));
        assert_eq!(std::mem::size_of::<StateCell<(u64, u32)>>() % 8, 0);
    }

    #[test]
    fn a_state_with_drop_glue_is_written_plainly_and_moved_out_once() {
        let cell = StateCell::<String>::uninit();
        unsafe { cell.write("first".to_owned()) };
        assert_eq!(unsafe { cell.replace("second".to_owned()) }, "first");
        assert_eq!(unsafe { cell.get().read() }, "second");
    }
}
