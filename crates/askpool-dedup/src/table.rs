//! The lock-free table and its intrusive eviction queue. All of the crate's
//! `unsafe` lives here; see the crate docs for the design.

use std::alloc::Layout;
use std::cell::Cell;
use std::hash::BuildHasher;

use askpool_proto::{CallerId, DedupKey, RequestId, Timestamp};
use crossbeam_epoch::Guard;
use crossbeam_utils::CachePadded;
use rustc_hash::FxBuildHasher;

use crate::node_pool;
use crate::slab::Slab;
use crate::state_cell::{read_lock_free, StateCell, StateView};
use crate::sync::Ordering::{self, AcqRel, Acquire, Relaxed, Release};
use crate::sync::{
    fence, AtomicIsize, AtomicU32, AtomicU64, AtomicU8, AtomicUsize, Epoch, LockGuard, NodeLock,
};
use crate::{DedupConfig, DedupState, DedupStats};

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
#[repr(u8)]
enum Phase {
    /// Just inserted; its creator holds the lock and runs the transition.
    /// Nobody else can ever see this phase (they wait on the lock).
    Reserved,
    /// In progress: never evicted.
    Live,
    /// Terminal: immutable, in the eviction queue.
    Terminal,
    /// Removed: the state is dropped; the node waits to be unlinked.
    Removed,
}

/// A node's phase. Written only under the node's lock; read under it, and
/// also without it by a lookup (`get`), which may read a `Terminal` entry's
/// state lock-free: `Terminal` is stored with release ordering after the
/// state and the expiry are written, and a terminal state is never written
/// again while its slot holds the node.
struct PhaseCell(AtomicU8);

impl PhaseCell {
    #[cfg(loom)]
    fn new(phase: Phase) -> Self {
        Self(AtomicU8::new(phase as u8))
    }

    #[inline(always)]
    fn get(&self, order: Ordering) -> Phase {
        match self.0.load(order) {
            0 => Phase::Reserved,
            1 => Phase::Live,
            2 => Phase::Terminal,
            _ => Phase::Removed,
        }
    }

    #[inline(always)]
    fn set(&self, phase: Phase) {
        self.0.store(phase as u8, Release);
    }
}

/// Everything of a node that is written only under its lock: its phase and
/// its state (initialised in `Live` and `Terminal` only).
///
/// The state is reached through its cell, never as a `&mut` that would
/// assert it is unshared: a lock-free lookup may be reading a terminal one.
struct Body<'a, S> {
    phase: &'a PhaseCell,
    state: &'a StateCell<S>,
}

impl<S> Body<'_, S> {
    /// The phase, read under the lock.
    #[inline(always)]
    fn phase(&self) -> Phase {
        self.phase.get(Relaxed)
    }

    /// The state, as code outside the table may see it (a copy, if
    /// lookups read it lock-free: see `StateView`).
    ///
    /// # Safety
    /// Initialised (phase `Live` or `Terminal`).
    #[inline(always)]
    unsafe fn current(&self) -> StateView<'_, S> {
        self.state.view()
    }

    /// Replaces an in-progress state (which no lock-free reader reads).
    ///
    /// # Safety
    /// Phase `Live`.
    #[inline(always)]
    unsafe fn replace(&self, next: S) -> S {
        self.state.replace(next)
    }

    /// Stores the first state of a reserved node.
    #[inline(always)]
    fn fill(&self, next: S) {
        // SAFETY: under the lock, in phase `Reserved`: nobody else reads
        // the state but lock-free lookups (which validate what they read).
        unsafe { self.state.write(next) };
    }

    /// Moves the state out; the caller marks the node removed. A lock-free
    /// lookup may still be cloning a terminal state: this only reads it.
    ///
    /// # Safety
    /// Initialised, and not moved out before.
    #[inline(always)]
    unsafe fn take(&self) -> S {
        self.state.get().read()
    }
}

/// A `DedupKey` without its alignment padding (24 bytes instead of 32).
#[derive(Clone, Copy, Eq)]
struct PackedKey([u64; 3]);

impl PartialEq for PackedKey {
    /// Without branches: a chain step compares a key it just loaded.
    #[inline(always)]
    fn eq(&self, other: &Self) -> bool {
        let (a, b) = (self.0, other.0);
        (a[0] ^ b[0]) | (a[1] ^ b[1]) | (a[2] ^ b[2]) == 0
    }
}

impl PackedKey {
    #[inline]
    fn new(key: &DedupKey) -> Self {
        let r = key.request.as_u128();
        Self([key.caller.as_u64(), (r >> 64) as u64, r as u64])
    }

    #[cfg(test)]
    fn unpack(self) -> DedupKey {
        DedupKey {
            caller: CallerId::from_u64(self.0[0]),
            request: RequestId::from_u128(u128::from(self.0[1]) << 64 | u128::from(self.0[2])),
        }
    }
}

/// A node's key, in atomics: a lookup with no pin may read it while the
/// slot's next node is written (see `Node::init`).
struct AtomicKey([AtomicU64; 3]);

impl AtomicKey {
    #[cfg(loom)]
    fn new(key: PackedKey) -> Self {
        Self(key.0.map(AtomicU64::new))
    }

    #[inline(always)]
    fn load(&self) -> PackedKey {
        let [a, b, c] = &self.0;
        PackedKey([a.load(Relaxed), b.load(Relaxed), c.load(Relaxed)])
    }

    #[inline(always)]
    fn store(&self, key: PackedKey) {
        for (word, value) in self.0.iter().zip(key.0) {
            word.store(value, Relaxed);
        }
    }
}

/// A link to a node: 0 is no node, else the node's slot (in the table's
/// slab) plus one, shifted past bit 0. Bit 0 of a chain link marks the node
/// that holds it as logically removed (Harris–Michael); buckets and queue
/// links are never marked.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
struct Link(u32);

impl Link {
    const NULL: Self = Self(0);

    #[inline(always)]
    fn to(slot: u32) -> Self {
        debug_assert!(slot < crate::slab::MAX_SLOTS);
        Self((slot + 1) << 1)
    }

    #[inline(always)]
    fn is_null(self) -> bool {
        self.0 < 2
    }

    #[inline(always)]
    fn marked(self) -> bool {
        self.0 & 1 == 1
    }

    #[inline(always)]
    fn unmarked(self) -> Self {
        Self(self.0 & !1)
    }

    #[inline(always)]
    fn slot(self) -> u32 {
        debug_assert!(!self.is_null());
        (self.0 >> 1) - 1
    }
}

/// An atomic [`Link`].
struct AtomicLink(AtomicU32);

impl AtomicLink {
    fn null() -> Self {
        Self(AtomicU32::new(Link::NULL.0))
    }

    #[inline(always)]
    fn load(&self, order: Ordering) -> Link {
        Link(self.0.load(order))
    }

    #[inline(always)]
    fn store(&self, link: Link, order: Ordering) {
        self.0.store(link.0, order);
    }

    #[inline(always)]
    fn compare_exchange(
        &self,
        current: Link,
        new: Link,
        success: Ordering,
        failure: Ordering,
    ) -> Result<Link, Link> {
        self.0
            .compare_exchange(current.0, new.0, success, failure)
            .map(Link)
            .map_err(Link)
    }

    /// Sets the mark bit (the holder is logically removed).
    #[inline(always)]
    fn mark(&self, order: Ordering) {
        self.0.fetch_or(1, order);
    }
}

/// One entry. It lives in its bucket's chain and, once terminal, also in
/// the eviction queue (intrusively: no second allocation); `refs` counts
/// those two memberships and the last one to let go retires the node.
///
/// `repr(C)`: links are 32-bit slot numbers, so with the key, expiry,
/// version, membership count, lock and phase the header is 48 bytes and a
/// node with a 16-byte state fills one 64-byte slot, which the slab starts
/// on a cache line: a hit reads one line.
///
/// Every field is an atomic or the state cell, and every write to a node is
/// atomic (the state's too, when lookups read it lock-free): a lookup with
/// no pin may be reading a slot while its next node is written there.
#[repr(C)]
struct Node<S> {
    /// The next node of the bucket's chain. The mark marks this node as
    /// logically removed (Harris–Michael list); it is then unlinked by
    /// whoever meets it first, and the thread whose unlink succeeds drops
    /// the chain's membership.
    next: AtomicLink,
    /// Chain + queue memberships (at most 2).
    refs: AtomicU8,
    lock: NodeLock,
    /// Written under `lock`.
    phase: PhaseCell,
    key: AtomicKey,
    /// When a terminal entry's TTL runs out (nanoseconds); written before
    /// the node is queued, then never again: the queue reads it lock-free.
    expires: AtomicU64,
    /// The next node of the eviction queue (Michael–Scott).
    fifo_next: AtomicLink,
    /// How many times the slot's node was rewritten, twice per node (a
    /// seqlock on the slot's reuse): odd while a new node is being written
    /// (`Node::init`). A lookup with no pin keeps what it read of a node
    /// only if the version was even before and unchanged after. It wraps
    /// after 2^31 reuses of one slot, which one lookup would have to
    /// overlap for a wrong read to pass.
    version: AtomicU32,
    /// Under `lock`; initialised in `Live` and `Terminal` only.
    state: StateCell<S>,
    /// Under loom, whether the slot's atomics were made (loom's atomics are
    /// objects of the model, not bytes: a zeroed slot holds none).
    #[cfg(loom)]
    born: std::sync::atomic::AtomicBool,
}

/// A node reached under a guard, with its (unmarked) link: compared in the
/// compare-and-swaps that unlink or dequeue it.
struct NodeRef<'g, S> {
    link: Link,
    node: &'g Node<S>,
}

impl<S> Clone for NodeRef<'_, S> {
    fn clone(&self) -> Self {
        *self
    }
}

impl<S> Copy for NodeRef<'_, S> {}

impl<S> std::ops::Deref for NodeRef<'_, S> {
    type Target = Node<S>;

    #[inline(always)]
    fn deref(&self) -> &Node<S> {
        self.node
    }
}

/// The node a non-null link names.
///
/// # Safety
/// `link` was read, under `guard`, from a bucket, the queue or a node of a
/// table whose nodes live in `slab`: the epoch keeps its slot from being
/// reused while `guard` lives.
#[inline(always)]
unsafe fn resolve<'g, S>(slab: &'static Slab, link: Link, _guard: &'g Guard) -> NodeRef<'g, S> {
    // Every walk strips the mark before it follows a link.
    debug_assert!(!link.marked());
    NodeRef {
        link,
        node: &*slab.get::<Node<S>>(link.slot()),
    }
}

/// [`resolve`], or `None` for a null link.
///
/// # Safety
/// As for [`resolve`].
#[inline(always)]
unsafe fn resolve_opt<'g, S>(
    slab: &'static Slab,
    link: Link,
    guard: &'g Guard,
) -> Option<NodeRef<'g, S>> {
    if link.is_null() {
        None
    } else {
        Some(resolve(slab, link, guard))
    }
}

impl<S> Node<S> {
    /// The node's phase and state.
    ///
    /// # Safety
    /// The caller holds the node's lock (or owns the table exclusively), and
    /// no other `Body` of this node is alive.
    #[inline]
    #[allow(clippy::mut_from_ref)]
    unsafe fn body(&self) -> Body<'_, S> {
        Body {
            phase: &self.phase,
            state: &self.state,
        }
    }

    /// Makes the node in a free slot a new reserved node of `key`, its lock
    /// held by the caller.
    ///
    /// Lookups with no pin may still be reading the slot's previous node,
    /// so every field is stored atomically, between the version's odd store
    /// and its next even one (release): a lookup that read any of these
    /// stores sees the version moved, and throws its read away. The state
    /// is not touched (uninitialised until the first transition).
    ///
    /// # Safety
    /// A free slot of `Node<S>`s owned by this thread alone: zeroed (never
    /// used) or holding a node no table links to any more.
    #[inline(always)]
    unsafe fn init(p: *mut Self, key: PackedKey) {
        #[cfg(loom)]
        {
            // SAFETY: the flag is std's: zeroed, it reads false.
            let born = unsafe { &*std::ptr::addr_of!((*p).born) };
            if !born.load(Relaxed) {
                // A slot never used (each loom table has a slab of its own):
                // nobody can be reading it.
                // SAFETY: the slot is ours.
                unsafe {
                    p.write(Self {
                        key: AtomicKey::new(key),
                        next: AtomicLink::null(),
                        fifo_next: AtomicLink::null(),
                        expires: AtomicU64::new(u64::MAX),
                        refs: AtomicU8::new(1),
                        lock: NodeLock::new_locked(),
                        phase: PhaseCell::new(Phase::Reserved),
                        version: AtomicU32::new(2),
                        state: StateCell::uninit(),
                        born: std::sync::atomic::AtomicBool::new(true),
                    })
                };
                return;
            }
        }
        // SAFETY: every field of a zeroed or used slot is an atomic that
        // holds a value, or the state cell (which may hold anything).
        let node = unsafe { &*p };
        let version = node.version.load(Relaxed);
        node.version.store(version.wrapping_add(1), Relaxed);
        fence(Release);
        node.next.store(Link::NULL, Relaxed);
        node.refs.store(1, Relaxed);
        node.lock.init_locked();
        node.phase.0.store(Phase::Reserved as u8, Relaxed);
        node.key.store(key);
        node.expires.store(u64::MAX, Relaxed);
        node.fifo_next.store(Link::NULL, Relaxed);
        node.version.store(version.wrapping_add(2), Release);
    }
}

/// Starts loading `p`'s cache line, so that misses that do not depend on
/// each other overlap instead of queuing (a hint: no effect on what runs).
#[inline(always)]
fn prefetch<T>(p: *const T) {
    #[cfg(all(target_arch = "x86_64", not(miri), not(loom)))]
    // SAFETY: a prefetch never faults and reads nothing the program sees.
    unsafe {
        use std::arch::x86_64::{_mm_prefetch, _MM_HINT_T0};
        _mm_prefetch::<_MM_HINT_T0>(p.cast::<i8>());
    }
    #[cfg(not(all(target_arch = "x86_64", not(miri), not(loom))))]
    let _ = p;
}

/// Drops one membership of a node; the last one retires it.
///
/// # Safety
/// The caller must own one of the node's memberships and have made the node
/// unreachable through it (unlinked it from its chain, or moved the queue's
/// head and tail past it).
#[inline(always)]
unsafe fn release<S>(slab: &'static Slab, node: NodeRef<'_, S>, guard: &Guard) {
    let refs = &node.refs;
    // A count of 1 is the caller's own membership, and no membership is
    // added to a node that lost one: the last holder skips the shared write.
    // Acquire pairs with the other holder's release below.
    if refs.load(Acquire) == 1 || refs.fetch_sub(1, AcqRel) == 1 {
        // A node holds no state by now (dropped when it was removed) and
        // its other fields need no drop: its slot is all that is left, and
        // it is reused once no pinned thread can reach it.
        node_pool::retire(slab, node.link.slot(), guard);
    }
}

/// A new reserved node in a free slot of `slab` (one this thread's cache
/// kept, if it has one); its slot.
#[inline]
fn alloc_node<S>(slab: &'static Slab, key: PackedKey) -> u32 {
    let slot = node_pool::take(slab);
    // SAFETY: a free slot of this layout, owned by this thread alone (no
    // table links to it, and no pinned thread can still reach it).
    unsafe { Node::init(slab.get::<Node<S>>(slot), key) };
    slot
}

/// A node made for an insert that lost its race (another thread inserted
/// the key first): kept for the next attempt, and, if the call ends
/// without publishing it, its slot goes back to this thread's cache (a
/// two-thread duplicate storm loses the race on most ids).
struct Spare {
    slab: &'static Slab,
    slot: Option<u32>,
}

impl Drop for Spare {
    #[inline]
    fn drop(&mut self) {
        if let Some(slot) = self.slot.take() {
            Self::recycle(self.slab, slot);
        }
    }
}

impl Spare {
    #[cold]
    #[inline(never)]
    fn recycle(slab: &'static Slab, slot: u32) {
        // SAFETY: never published, so owned by this thread alone; it holds
        // no state (a reserved node's is uninitialised) and its other
        // fields need no drop.
        unsafe { node_pool::give(slab, slot) };
    }
}

/// The eviction queue: a Michael–Scott FIFO threaded through the nodes, in
/// the order they became terminal. `head` is a sentinel (the last node
/// popped, or the initial one).
struct Fifo<S> {
    head: CachePadded<AtomicLink>,
    tail: CachePadded<AtomicLink>,
    slab: &'static Slab,
    _nodes: std::marker::PhantomData<fn() -> S>,
}

impl<S> Fifo<S> {
    fn new(slab: &'static Slab) -> Self {
        let sentinel = Link::to(alloc_node::<S>(slab, PackedKey([0; 3])));
        Self {
            head: CachePadded::new(AtomicLink(AtomicU32::new(sentinel.0))),
            tail: CachePadded::new(AtomicLink(AtomicU32::new(sentinel.0))),
            slab,
            _nodes: std::marker::PhantomData,
        }
    }

    /// Queues a node that became terminal (`make_terminal` counted the
    /// queue's membership already).
    fn push(&self, new: NodeRef<'_, S>, guard: &Guard) {
        loop {
            let tail = self.tail.load(Acquire);
            // SAFETY: the tail is never null and is protected by `guard`.
            let t = unsafe { resolve::<S>(self.slab, tail, guard) };
            let next = t.fifo_next.load(Acquire);
            if !next.is_null() {
                // The tail lags: help it forward.
                let _ = self.tail.compare_exchange(tail, next, Release, Relaxed);
                continue;
            }
            if t.fifo_next
                .compare_exchange(Link::NULL, new.link, AcqRel, Relaxed)
                .is_ok()
            {
                let _ = self.tail.compare_exchange(tail, new.link, Release, Relaxed);
                return;
            }
        }
    }

    /// Takes the oldest node if `take` says so; `None` when the queue is
    /// empty or the oldest node was refused. The node's slot is not reused
    /// while `guard` lives (it is the new sentinel, and pinned).
    fn pop_if<'g>(
        &self,
        take: impl Fn(&Node<S>) -> bool,
        guard: &'g Guard,
    ) -> Option<NodeRef<'g, S>> {
        loop {
            let head = self.head.load(Acquire);
            // SAFETY: the head is never null and is protected by `guard`.
            let h = unsafe { resolve::<S>(self.slab, head, guard) };
            let next = h.fifo_next.load(Acquire);
            // SAFETY: protected by `guard`.
            let n = unsafe { resolve_opt::<S>(self.slab, next, guard) }?;
            if !take(&n) {
                return None;
            }
            if self
                .head
                .compare_exchange(head, next, AcqRel, Acquire)
                .is_ok()
            {
                self.note_pop(head, next);
                // Keep the tail from pointing at the node let go below.
                let tail = self.tail.load(Acquire);
                if tail == head {
                    let _ = self.tail.compare_exchange(tail, next, Release, Relaxed);
                }
                // SAFETY: the queue's head moved past the old sentinel, and
                // so did its tail: the queue's membership of it ends here.
                unsafe { release(self.slab, h, guard) };
                return Some(n);
            }
        }
    }

    /// Remembers, for this thread, the head this pop left, and extends its
    /// run if the head it found was the one its previous pop of this queue
    /// had left (nobody else popped in between), else starts it again.
    #[inline]
    fn note_pop(&self, found: Link, left: Link) {
        // Only `prefetch_eviction` asks, and never under loom or Miri.
        if cfg!(any(loom, miri)) {
            return;
        }
        let queue = self as *const Self as usize;
        let _ = LAST_POP.try_with(|last| {
            let (q, prev, run) = last.get();
            let run = if q == queue && prev == found.0 {
                run.saturating_add(1)
            } else {
                0
            };
            last.set((queue, left.0, run));
        });
    }

    /// Whether this thread's last `POPS_ALONE` pops of this queue each found
    /// the head its pop before had left: no other thread popped between
    /// them (see `prefetch_eviction`). It cannot tell whether another
    /// thread has popped since; this thread's next pop will.
    ///
    /// A hint, and wrong at times, which only costs or spares a prefetch: a
    /// thread that stops evicting while another goes on keeps its run until
    /// its own next pop; a thread that pops from two tables in turn never
    /// builds one; a reused slot can bring back a head link this thread
    /// left, and a new queue at a freed one's address can inherit its run.
    #[inline]
    fn popping_alone(&self) -> bool {
        let queue = self as *const Self as usize;
        LAST_POP
            .try_with(|last| {
                let (q, _, run) = last.get();
                q == queue && run >= POPS_ALONE
            })
            .unwrap_or(false)
    }

    /// Frees the queue's memberships (the table is being dropped).
    ///
    /// # Safety
    /// No other thread may reach the table.
    unsafe fn drop_all(&mut self, guard: &Guard) {
        let mut cur = self.head.load(Relaxed);
        while let Some(node) = resolve_opt::<S>(self.slab, cur, guard) {
            let next = node.fifo_next.load(Relaxed);
            if node.refs.fetch_sub(1, Relaxed) == 1 {
                node_pool::give(self.slab, node.link.slot());
            }
            cur = next;
        }
    }
}

/// How many of a thread's pops in a row must each find the head its pop
/// before left (after a first pop to compare with) for the thread to count
/// as the queue's only evictor. Two threads taking turns at random rarely
/// get there (one chance in 256).
const POPS_ALONE: u8 = 8;

thread_local! {
    /// This thread's last pop: the queue (its address), the head the pop
    /// left, and how many of this thread's pops in a row, up to that one,
    /// found the head its pop before had left (see `Fifo::popping_alone`).
    static LAST_POP: Cell<(usize, u32, u8)> = const { Cell::new((0, 0, 0)) };
}

enum Found<'g, S> {
    Node(NodeRef<'g, S>),
    /// Not there; the bucket's head at the time it was not there.
    Absent(Link),
}

#[derive(Clone, Copy)]
enum Cause {
    Capacity,
    /// Capacity, in place of an entry that became terminal and is not
    /// counted yet: the terminal count stays as it is.
    Replaced,
    Ttl,
    Clear,
}

/// A slab for the nodes of a table of `S` (tests: for a state read with
/// no pin, a slab of its own, until released).
#[cfg(test)]
pub(crate) fn slab_of<S>() -> &'static Slab {
    Slab::of(Layout::new::<Node<S>>(), read_lock_free::<S>())
}

#[cfg(test)]
impl<S> DedupTable<S> {
    /// The slab of this table's nodes.
    pub(crate) fn slab(&self) -> &'static Slab {
        self.slab
    }
}

#[cfg(test)]
impl<S: DedupState + Clone> DedupTable<S> {
    /// The slot that holds `key`'s node, if any.
    pub(crate) fn slot_of(&self, key: &DedupKey) -> Option<u32> {
        let guard = self.epoch.pin();
        match self.find(self.bucket(key), key, &guard) {
            Found::Node(node) => Some(node.link.slot()),
            Found::Absent(_) => None,
        }
    }

    /// Writes a terminal node of `key` into `slot`, as a reuse of the slot
    /// by another entry writes it (`Node::init`, the first transition).
    ///
    /// # Safety
    /// `slot` is a slot of this table's slab that no table links to and
    /// that is not free yet (retired, waiting for the epoch in this
    /// thread's batch): nothing else writes it meanwhile.
    pub(crate) unsafe fn rewrite_retired_slot(&self, slot: u32, key: &DedupKey, state: S) {
        let p = self.slab.get::<Node<S>>(slot);
        unsafe { Node::init(p, PackedKey::new(key)) };
        let node = unsafe { &*p };
        // SAFETY: born locked by `init`, for this thread.
        let lock = unsafe { node.lock.adopt() };
        let body = unsafe { node.body() };
        body.fill(state);
        node.expires.store(u64::MAX, Relaxed);
        body.phase.set(Phase::Terminal);
        drop(lock);
    }

    /// The link `key`'s bucket holds now (raw).
    pub(crate) fn bucket_link(&self, key: &DedupKey) -> u32 {
        self.bucket(key).load(Acquire).0
    }

    /// A lookup with no pin that starts from `link` instead of `key`'s
    /// bucket (a link read long ago).
    pub(crate) fn get_unpinned_from(&self, link: u32, key: &DedupKey, now: Timestamp) -> Option<S> {
        self.read_unpinned(&AtomicLink(AtomicU32::new(link)), key, now)
    }

    /// A lookup with no pin that lets `meanwhile` run once it found the
    /// key's node.
    pub(crate) fn get_unpinned_with(
        &self,
        key: &DedupKey,
        now: Timestamp,
        meanwhile: impl FnOnce(),
    ) -> Option<S> {
        self.read_unpinned_with(self.bucket(key), key, now, meanwhile)
    }
}

/// The per-entry memory is reported by `size_of::<Node<S>>()`; this is how
/// the docs and the allocator test name it.
pub(crate) const fn node_size<S>() -> usize {
    std::mem::size_of::<Node<S>>()
}

/// A bounded, lock-free table of per-key protocol states.
///
/// See the crate documentation for the design and its guarantees.
pub struct DedupTable<S> {
    config: DedupConfig,
    buckets: Box<[AtomicLink]>,
    mask: usize,
    /// Where this table's nodes live: shared by every table whose nodes
    /// have the same layout, or, for plain-data states (read with no pin),
    /// this table's own while it lives (`Slab::of`).
    slab: &'static Slab,
    fifo: Fifo<S>,
    in_progress: CachePadded<AtomicUsize>,
    /// Terminal entries counted (see `count_terminal`): signed, as it may
    /// dip below zero for a moment.
    terminal: CachePadded<AtomicIsize>,
    /// `config.max_terminal`, signed like the count.
    max_terminal: isize,
    /// `config.terminal_ttl` in nanoseconds (saturated, as `Timestamp + Duration`).
    ttl_nanos: u64,
    /// The expiry (nanos) of an entry `expire` found at the queue's head
    /// and not due; an operation whose clock is before it skips the queue
    /// with one load. Stamps never go down along the queue, so the entries
    /// behind it are due no earlier, except two stamped at nearly the same
    /// time and queued in the other order: the one behind then waits for the
    /// one ahead, as it does for the head check itself (the clock-skew slack
    /// of the crate docs). Only a lower bound is ever needed: a stale, lower
    /// value just sends an operation down the full check.
    next_due: CachePadded<AtomicU64>,
    /// The latest expiry stamped on a queued entry (nanos), on a line of
    /// its own: a terminal transition reads it while it holds the entry's
    /// lock, so it must not sit on a line other threads write all the time
    /// (the queue's tail), and when the clock moves it is written on most
    /// terminal transitions, so it must not sit beside what every operation
    /// reads (buckets, mask, bounds).
    latest_expiry: CachePadded<AtomicU64>,
    /// Terminal entries removed because of `max_terminal`, and because
    /// their TTL passed (`DedupStats`), in stripes of a line each, a thread
    /// adding to its own: each eviction writes one, and beside the fields
    /// every operation reads (buckets, mask, bounds) or the queue's head
    /// (which every insert at capacity reads) it made the other core miss
    /// on them, and one line for all threads moved between the cores on
    /// every eviction (both profiled in the two-thread duplicate storm).
    evicted: [CachePadded<Evicted>; EVICTED_STRIPES],
    epoch: Epoch,
}

/// See `DedupTable::evicted`.
#[derive(Default)]
struct Evicted {
    capacity: AtomicU64,
    ttl: AtomicU64,
}

/// Stripes of `DedupTable::evicted`: threads take them in turn, so up to
/// this many threads each count on a line of their own.
const EVICTED_STRIPES: usize = 8;

/// This thread's stripe of `DedupTable::evicted`.
fn evicted_stripe() -> usize {
    static NEXT: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
    thread_local! {
        static STRIPE: usize = NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed) % EVICTED_STRIPES;
    }
    // A thread being torn down (a thread-local destructor that uses a
    // table) counts on the first stripe.
    STRIPE.try_with(|s| *s).unwrap_or(0)
}

// SAFETY: a state is only ever touched under its entry's lock, by one thread
// at a time, like `Mutex<S>`, except a plain-data state, which lookups copy
// with atomic loads and no lock while code outside the table only ever sees
// copies of it (`StateView`): so no `S` is ever shared between threads, and
// a copy made on one thread and used on another is a move (`S: Send`). A
// state may be dropped on any thread. Nodes freed by the epoch collector no
// longer hold a state (it is dropped when the entry is removed), so garbage
// never outlives the table with an `S` inside.
unsafe impl<S: Send> Send for DedupTable<S> {}
// SAFETY: as above.
unsafe impl<S: Send> Sync for DedupTable<S> {}

/// Buckets for a table: two per terminal entry allowed, rounded up to a power
/// of two, at least 64, at most 2^23 (chains then grow past 1). Two, not one:
/// every node a chain holds before the one looked for is a cache miss, and a
/// load factor under 0.5 keeps chains at about one node (4 more bytes per
/// entry).
fn bucket_count(max_terminal: usize) -> usize {
    max_terminal.clamp(32, 1 << 22).next_power_of_two() * 2
}

/// The bytes of a table's buckets, allocated when it is made.
pub(crate) fn bucket_bytes(max_terminal: usize) -> usize {
    bucket_count(max_terminal) * std::mem::size_of::<AtomicLink>()
}

impl<S: DedupState> DedupTable<S> {
    pub fn new(config: DedupConfig) -> Self {
        let n = bucket_count(config.max_terminal);
        let slab = Slab::of(Layout::new::<Node<S>>(), read_lock_free::<S>());
        Self {
            config,
            buckets: (0..n).map(|_| AtomicLink::null()).collect(),
            mask: n - 1,
            slab,
            fifo: Fifo::new(slab),
            in_progress: CachePadded::new(AtomicUsize::new(0)),
            terminal: CachePadded::new(AtomicIsize::new(0)),
            max_terminal: isize::try_from(config.max_terminal).unwrap_or(isize::MAX),
            ttl_nanos: u64::try_from(config.terminal_ttl.as_nanos()).unwrap_or(u64::MAX),
            next_due: CachePadded::new(AtomicU64::new(0)),
            latest_expiry: CachePadded::new(AtomicU64::new(0)),
            evicted: Default::default(),
            epoch: Epoch::new(),
        }
    }

    pub fn config(&self) -> DedupConfig {
        self.config
    }

    /// Applies one transition to `key` atomically: `transition` sees the
    /// current state (`None` when absent or expired) and returns the state to
    /// store (`None` leaves it unchanged) and a value handed back to the
    /// caller. A terminal state is never replaced; only eviction removes it.
    ///
    /// `transition` runs exactly once, holding the lock of `key`'s entry
    /// only: other keys go on undisturbed, a concurrent `apply` on the same
    /// key waits for it. It must not block or call back into the table. If
    /// it panics, nothing is stored.
    ///
    /// For a state with no drop glue (read by lookups with no lock: see
    /// [`Self::get`]), `transition` sees a copy of the stored state: what it
    /// writes through the state's interior mutability (a `Cell`, an
    /// atomic) is not stored; only a state it returns is.
    pub fn apply<O>(
        &self,
        key: DedupKey,
        now: Timestamp,
        transition: impl FnOnce(Option<&S>) -> (Option<S>, O),
    ) -> O {
        self.apply_within(key, now, None, |current, _| transition(current))
    }

    /// [`apply`](Self::apply) with a bound on in-progress entries: for an
    /// absent key, `transition` learns whether a new in-progress entry fits
    /// under `max_in_progress` (the `bool`), and the room it is told about
    /// is taken before it runs, so concurrent inserts of different keys
    /// cannot all see the last place free. It should store no in-progress
    /// state when told there is no room (one it stores anyway is counted).
    /// For a key already present the `bool` is `true`: a duplicate adds no
    /// entry.
    pub fn apply_bounded<O>(
        &self,
        key: DedupKey,
        now: Timestamp,
        max_in_progress: usize,
        transition: impl FnOnce(Option<&S>, bool) -> (Option<S>, O),
    ) -> O {
        self.apply_within(key, now, Some(max_in_progress), transition)
    }

    fn apply_within<O>(
        &self,
        key: DedupKey,
        now: Timestamp,
        bound: Option<usize>,
        transition: impl FnOnce(Option<&S>, bool) -> (Option<S>, O),
    ) -> O {
        let guard = self.epoch.pin();
        let bucket = self.bucket(&key);
        // The bucket, the oldest terminal node (read by `expire`) and, at
        // capacity, that node's bucket (read to unlink it when this insert
        // evicts it, if this thread is the one evicting lately) do not
        // depend on each other: start them loading together rather than one
        // miss after another.
        prefetch(bucket);
        self.expire(now, &guard);
        self.prefetch_eviction(&guard);
        let mut spare = Spare {
            slab: self.slab,
            slot: None,
        };
        loop {
            match self.find(bucket, &key, &guard) {
                Found::Node(node) => {
                    let lock = node.lock.lock();
                    // SAFETY: we hold the node's lock.
                    let body = unsafe { node.body() };
                    match body.phase() {
                        Phase::Removed | Phase::Reserved => {
                            debug_assert_ne!(body.phase(), Phase::Reserved);
                            drop(lock);
                            continue;
                        }
                        Phase::Terminal if Self::expired(&node, now) => {
                            self.remove_expired(&node, body, lock, bucket, &guard);
                            continue;
                        }
                        Phase::Terminal => {
                            // SAFETY: initialised in this phase.
                            let current = unsafe { body.current() };
                            let (next, out) = transition(Some(&current), true);
                            drop(lock);
                            debug_assert!(next.is_none(), "a terminal state was asked to change");
                            drop(next);
                            return out;
                        }
                        Phase::Live => {
                            // SAFETY: initialised in this phase.
                            let current = unsafe { body.current() };
                            let (next, out) = transition(Some(&current), true);
                            let Some(next) = next else {
                                return out;
                            };
                            let terminal = next.is_terminal();
                            // SAFETY: initialised; replaced by an initialised
                            // value.
                            let old = unsafe { body.replace(next) };
                            if terminal {
                                self.in_progress.fetch_sub(1, Relaxed);
                                self.make_terminal(&node, body, now);
                            }
                            drop(lock);
                            if terminal {
                                // Before the old state's drop, which may
                                // panic: a terminal node is always queued
                                // and counted.
                                self.fifo.push(node, &guard);
                                self.count_terminal(&guard);
                            }
                            drop(old);
                            return out;
                        }
                    }
                }
                Found::Absent(head) => {
                    let slot = spare
                        .slot
                        .take()
                        .unwrap_or_else(|| alloc_node::<S>(self.slab, PackedKey::new(&key)));
                    let new = Link::to(slot);
                    // SAFETY: this thread's own node, not published yet.
                    let node = unsafe { resolve::<S>(self.slab, new, &guard) };
                    // Release: a lookup with no pin may read this link
                    // through a stale one to this slot, then follow it.
                    node.next.store(head, Release);
                    if bucket.compare_exchange(head, new, AcqRel, Acquire).is_err() {
                        spare.slot = Some(slot);
                        continue;
                    }
                    return self.fill_reserved(bucket, node, now, bound, transition, &guard);
                }
            }
        }
    }

    /// Runs the first transition of a node this thread just inserted, with
    /// its lock born held: the insert itself waited for nobody.
    fn fill_reserved<O>(
        &self,
        bucket: &AtomicLink,
        node: NodeRef<'_, S>,
        now: Timestamp,
        bound: Option<usize>,
        transition: impl FnOnce(Option<&S>, bool) -> (Option<S>, O),
        guard: &Guard,
    ) -> O {
        /// Undoes the reservation if the transition panics or stores nothing,
        /// and gives back the in-progress place taken for it (unless an
        /// in-progress state was stored in it).
        struct Reservation<'a, S: DedupState> {
            node: &'a Node<S>,
            bucket: &'a AtomicLink,
            table: &'a DedupTable<S>,
            guard: &'a Guard,
            filled: bool,
            room_taken: bool,
        }
        impl<S: DedupState> Drop for Reservation<'_, S> {
            fn drop(&mut self) {
                if self.room_taken {
                    self.table.in_progress.fetch_sub(1, Relaxed);
                }
                // SAFETY: this thread holds the born-locked node's lock.
                let lock = unsafe { self.node.lock.adopt() };
                if !self.filled {
                    // SAFETY: we hold the lock.
                    let body = unsafe { self.node.body() };
                    body.phase.set(Phase::Removed);
                    self.node.next.mark(AcqRel);
                }
                drop(lock);
                if !self.filled {
                    self.table.unlink(self.bucket, self.guard);
                }
            }
        }
        let room_taken = bound.is_some_and(|max| self.take_room(max));
        let mut reservation = Reservation {
            node: node.node,
            bucket,
            table: self,
            guard,
            filled: false,
            room_taken,
        };
        let (next, out) = transition(None, bound.is_none() || room_taken);
        let mut terminal = false;
        if let Some(next) = next {
            terminal = next.is_terminal();
            // SAFETY: we hold the lock (born held, released by `reservation`).
            let body = unsafe { node.body() };
            body.fill(next);
            if terminal {
                self.make_terminal(&node, body, now);
            } else {
                body.phase.set(Phase::Live);
                if room_taken {
                    // The place taken above is this entry's.
                    reservation.room_taken = false;
                } else {
                    self.in_progress.fetch_add(1, Relaxed);
                }
            }
            reservation.filled = true;
        }
        drop(reservation);
        if terminal {
            self.fifo.push(node, guard);
            self.count_terminal(guard);
        }
        out
    }

    /// Marks a node (lock held, state written) terminal, ready to be queued.
    ///
    /// The caller queues it after releasing the lock, so that a duplicate
    /// waiting on that lock does not also wait for the queue's two
    /// compare-and-swaps on lines every inserting thread writes. Until
    /// then the node is terminal but not queued: whoever removes it early
    /// (expired on access, cleared) leaves it to be queued dead, and the
    /// queue skips dead nodes.
    fn make_terminal(&self, node: &Node<S>, body: Body<'_, S>, now: Timestamp) {
        // Expiry stamps never go down along the queue: an entry made
        // terminal with an earlier clock than one queued before it (callers
        // on other threads) is stamped like that one. Expiry then only ever
        // has to look at the head, and entries removed early on access
        // cannot pile up behind a head that is not yet due. The price: under
        // clock skew an entry may outlive its TTL by that skew.
        let mine = now.as_nanos().saturating_add(self.ttl_nanos);
        // Read first: with a coarse clock most stamps equal the latest, and
        // a plain load spares the shared line a write.
        let latest = self.latest_expiry.load(Relaxed);
        let expires = if mine > latest {
            mine.max(self.latest_expiry.fetch_max(mine, Relaxed))
        } else {
            latest
        };
        node.expires.store(expires, Relaxed);
        // The queue's membership, counted now: the chain's is the only one
        // yet, and nobody can end it while the node's lock is held and the
        // node unmarked (only the lock holder marks it), so a plain store
        // does. The queue's publishing CAS orders both stores before any
        // reader that finds the node through the queue.
        node.refs.store(2, Relaxed);
        // Last: a lock-free lookup that reads `Terminal` (acquire) sees the
        // state and the expiry written before it.
        body.phase.set(Phase::Terminal);
    }

    /// Whether a terminal node's TTL ran out by `now`.
    #[inline]
    fn expired(node: &Node<S>, now: Timestamp) -> bool {
        node.expires.load(Relaxed) <= now.as_nanos()
    }

    /// The current state of `key`, if any.
    ///
    /// A terminal entry whose state type has no drop glue (plain data:
    /// `!std::mem::needs_drop::<S>()`) is read with no lock and no epoch
    /// pin: the lookup follows the chain's links as they are, copies the
    /// entry's state with atomic loads, and keeps the copy only if the
    /// node's version shows that its slot was not reused meanwhile
    /// (`state_cell` and `Node::version` say why this is sound). The state
    /// returned is a clone of that copy: a `Clone` that writes to the state
    /// it clones writes to the copy. A plain-data state must therefore be
    /// fine to duplicate bit for bit (no `&'static mut` inside). Anything
    /// else (an absent, in-progress or expired entry, a state with drop
    /// glue, a read overtaken by a reuse) is looked up again under a pin,
    /// and read under the entry's lock.
    #[inline]
    pub fn get(&self, key: &DedupKey, now: Timestamp) -> Option<S>
    where
        S: Clone,
    {
        if read_lock_free::<S>() && now.as_nanos() < self.next_due.load(Relaxed) {
            if let Some(state) = self.read_unpinned(self.bucket(key), key, now) {
                return Some(state);
            }
        }
        self.get_pinned(key, now)
    }

    /// Loom models: `get`'s read with no pin alone (`None` where `get`
    /// would go on under a pin).
    #[cfg(loom)]
    #[doc(hidden)]
    pub fn get_unpinned_only(&self, key: &DedupKey, now: Timestamp) -> Option<S>
    where
        S: Clone,
    {
        self.read_unpinned(self.bucket(key), key, now)
    }

    /// `get` under a pin (kept out of line: the lock-free path stays
    /// small).
    #[inline(never)]
    fn get_pinned(&self, key: &DedupKey, now: Timestamp) -> Option<S>
    where
        S: Clone,
    {
        let bucket = self.bucket(key);
        let guard = self.epoch.pin();
        self.expire(now, &guard);
        self.get_locked(bucket, key, now, &guard)
    }

    /// A terminal entry's state, read with no pin and no lock; `None` sends
    /// the lookup to the pinned path (not found, not terminal, expired, or
    /// the slot reused while it was read).
    ///
    /// Slots are never freed, so every link, even one read long ago, names
    /// the memory of a node of this layout; its node may be another entry's
    /// by now. Links are read with acquire: the node a link named when it
    /// was read was written before it was published, so a node read through
    /// it is that one or a later one of the slot. A chain walked this way
    /// may wander into another chain, after a reuse, but what is returned
    /// is checked on its own: the node holds `key`, is terminal and
    /// unexpired, and its version was even before the key was read and
    /// unchanged after the state was copied, so all of it is one node's, as
    /// it was at one moment (terminal states are never written again).
    #[inline(always)]
    fn read_unpinned(&self, bucket: &AtomicLink, key: &DedupKey, now: Timestamp) -> Option<S>
    where
        S: Clone,
    {
        self.read_unpinned_with(bucket, key, now, || ())
    }

    /// [`Self::read_unpinned`], running `meanwhile` once it has found the
    /// key's node, before it reads the rest: the tests reuse the slot there.
    #[inline(always)]
    fn read_unpinned_with(
        &self,
        bucket: &AtomicLink,
        key: &DedupKey,
        now: Timestamp,
        meanwhile: impl FnOnce(),
    ) -> Option<S>
    where
        S: Clone,
    {
        // A chain holds about one node (`bucket_count`); a walk past a few
        // has met reuses or a crowded bucket: the pinned path will do.
        const MOST_STEPS: usize = 8;
        let key = PackedKey::new(key);
        let mut cur = bucket.load(Acquire);
        for _ in 0..MOST_STEPS {
            if cur.is_null() {
                return None;
            }
            // SAFETY: a slot this table handed out (a link named it), in a
            // slab whose memory is never freed and whose nodes are only ever
            // written atomically (`read_lock_free`).
            let node = unsafe { &*self.slab.get::<Node<S>>(cur.unmarked().slot()) };
            let version = node.version.load(Acquire);
            let next = node.next.load(Acquire);
            if node.key.load() == key {
                meanwhile();
                // Every check is made, without branches between them, after
                // every read: a hit takes one branch, well predicted.
                let terminal = node.phase.get(Acquire) == Phase::Terminal;
                let expires = node.expires.load(Relaxed);
                let copy = node.state.copy_lock_free();
                // Orders the reads above before the version's second read:
                // if any of them saw a store of the slot's next node, this
                // read sees that node's odd version or a later one.
                fence(Acquire);
                let unchanged = node.version.load(Relaxed) == version;
                let valid = terminal & unchanged & (version & 1 == 0) & (expires > now.as_nanos());
                if !valid {
                    return None;
                }
                // SAFETY: one terminal node's state, whole (see above).
                return Some(unsafe { copy.assume_init_ref() }.clone());
            }
            cur = next.unmarked();
        }
        None
    }

    /// `get` under the entry's lock (`get_pinned`'s walk).
    #[inline]
    fn get_locked(
        &self,
        bucket: &AtomicLink,
        key: &DedupKey,
        now: Timestamp,
        guard: &Guard,
    ) -> Option<S>
    where
        S: Clone,
    {
        loop {
            let Found::Node(node) = self.find(bucket, key, guard) else {
                return None;
            };
            let lock = node.lock.lock();
            // SAFETY: we hold the node's lock.
            let body = unsafe { node.body() };
            match body.phase() {
                Phase::Removed | Phase::Reserved => continue,
                Phase::Terminal if Self::expired(&node, now) => {
                    self.remove_expired(&node, body, lock, bucket, guard);
                    return None;
                }
                // SAFETY: initialised in these phases.
                Phase::Live | Phase::Terminal => {
                    return Some(S::clone(&*unsafe { body.current() }))
                }
            }
        }
    }

    /// Starts loading `key`'s bucket, for a caller that will `apply` to
    /// the key after some work of its own: a new key's bucket is a cache
    /// miss, and `apply` alone has little to overlap it with. A hint only
    /// (nothing under loom or Miri: see the `prefetch` it calls).
    #[inline]
    pub fn prefetch(&self, key: &DedupKey) {
        prefetch(self.bucket(key));
    }

    /// Removes every terminal entry, whatever its TTL, and leaves entries
    /// in progress alone (their outcome is still to be recorded). Counted
    /// as neither kind of eviction: for an owner that closes, whose cached
    /// outcomes (payloads a host may hold large) no one can ask for again.
    pub fn clear_terminal(&self) {
        let guard = self.epoch.pin();
        while let Some(node) = self.fifo.pop_if(|_| true, &guard) {
            self.evict(node, Cause::Clear, &guard);
        }
    }

    /// Removes terminal entries whose TTL passed by `now`.
    pub fn evict_expired(&self, now: Timestamp) {
        let guard = self.epoch.pin();
        self.expire(now, &guard);
    }

    /// Removes terminal entries whose TTL passed by `now`, and tells when
    /// the oldest one left expires (`None` when none is queued): what a
    /// sweeper that runs while the table gets no traffic sleeps until
    /// (TTL is otherwise applied only by the table's own operations).
    pub fn sweep_expired(&self, now: Timestamp) -> Option<Timestamp> {
        let guard = self.epoch.pin();
        self.expire_slow(now.as_nanos(), &guard)
            .map(Timestamp::from_nanos)
    }

    pub fn stats(&self) -> DedupStats {
        DedupStats {
            in_progress: self.in_progress.load(Relaxed),
            terminal: self.terminal_count(),
            evicted_capacity: self.evicted.iter().map(|e| e.capacity.load(Relaxed)).sum(),
            evicted_ttl: self.evicted.iter().map(|e| e.ttl.load(Relaxed)).sum(),
        }
    }

    /// In-progress entries (one load: what an admission check reads).
    pub fn in_progress(&self) -> usize {
        self.in_progress.load(Relaxed)
    }

    /// Counts one more in-progress entry if that keeps the count at or under
    /// `max`.
    fn take_room(&self, max: usize) -> bool {
        self.in_progress
            .fetch_update(Relaxed, Relaxed, |n| (n < max).then_some(n + 1))
            .is_ok()
    }

    /// All entries, in-progress and terminal.
    pub fn len(&self) -> usize {
        self.in_progress.load(Relaxed) + self.terminal_count()
    }

    fn terminal_count(&self) -> usize {
        usize::try_from(self.terminal.load(Relaxed)).unwrap_or(0)
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Removes every entry (a worker restart loses its in-memory state).
    /// Entries inserted while it runs may survive it.
    pub fn clear(&self) {
        let guard = self.epoch.pin();
        for bucket in self.buckets.iter() {
            let mut cur = bucket.load(Acquire);
            // SAFETY: protected by `guard`.
            while let Some(node) = unsafe { resolve_opt::<S>(self.slab, cur, &guard) } {
                let lock = node.lock.lock();
                // SAFETY: we hold the node's lock.
                let body = unsafe { node.body() };
                let gone = match body.phase() {
                    Phase::Live | Phase::Terminal => self.remove_locked(&node, body, Cause::Clear),
                    Phase::Removed | Phase::Reserved => None,
                };
                drop(lock);
                drop(gone);
                cur = node.next.load(Acquire).unmarked();
            }
            self.unlink(bucket, &guard);
        }
        while let Some(node) = self.fifo.pop_if(|_| true, &guard) {
            self.evict(node, Cause::Clear, &guard);
        }
    }

    /// Removes a terminal entry found expired on access, before the queue
    /// reached it (kept out of line: the lookup's fast path stays small).
    #[cold]
    #[inline(never)]
    fn remove_expired(
        &self,
        node: &Node<S>,
        body: Body<'_, S>,
        lock: LockGuard<'_>,
        bucket: &AtomicLink,
        guard: &Guard,
    ) {
        let gone = self.remove_locked(node, body, Cause::Ttl);
        drop(lock);
        drop(gone);
        self.unlink(bucket, guard);
    }

    /// Removes a live or terminal node whose lock the caller holds: drops
    /// nothing itself, hands the state back to be dropped after unlocking.
    /// A terminal state with no drop glue stays where it is (`None`):
    /// there is nothing to drop, and lock-free lookups may be copying it.
    fn remove_locked(&self, node: &Node<S>, body: Body<'_, S>, cause: Cause) -> Option<S> {
        let was_terminal = match body.phase() {
            Phase::Terminal => true,
            Phase::Live => false,
            Phase::Reserved | Phase::Removed => unreachable!("only live entries are removed"),
        };
        body.phase.set(Phase::Removed);
        // SAFETY: initialised in `Live` / `Terminal`; `Removed` marks it
        // moved out (or, left in place, gone: it needs no drop). A live
        // state is never read lock-free.
        let state = (!was_terminal || std::mem::needs_drop::<S>()).then(|| unsafe { body.take() });
        node.next.mark(AcqRel);
        if !was_terminal {
            self.in_progress.fetch_sub(1, Relaxed);
        } else if !matches!(cause, Cause::Replaced) {
            self.terminal.fetch_sub(1, Relaxed);
        }
        match cause {
            Cause::Capacity | Cause::Replaced => {
                self.evicted[evicted_stripe()]
                    .capacity
                    .fetch_add(1, Relaxed);
            }
            Cause::Ttl => {
                self.evicted[evicted_stripe()].ttl.fetch_add(1, Relaxed);
            }
            Cause::Clear => {}
        }
        state
    }

    /// Pops and evicts the entries whose TTL passed.
    #[inline]
    fn expire(&self, now: Timestamp, guard: &Guard) {
        let now = now.as_nanos();
        if now < self.next_due.load(Relaxed) {
            return;
        }
        self.expire_slow(now, guard);
    }

    /// Pops and evicts the entries whose TTL passed, then notes when the
    /// oldest one left is due.
    #[cold]
    fn expire_slow(&self, now: u64, guard: &Guard) -> Option<u64> {
        let due = Cell::new(None);
        let take = |n: &Node<S>| {
            let expires = n.expires.load(Relaxed);
            if expires <= now {
                return true;
            }
            due.set(Some(expires));
            false
        };
        while let Some(node) = self.fifo.pop_if(take, guard) {
            self.evict(node, Cause::Ttl, guard);
        }
        if let Some(due) = due.get() {
            self.next_due.store(due, Relaxed);
        }
        due.get()
    }

    /// Counts a node that became terminal and was queued since (the count
    /// comes after the push, so every counted entry is queued), then keeps
    /// the bound. At capacity, the oldest terminal entry is evicted in its
    /// place and the count is left as it is: no write to that shared line
    /// for either. A removal that meets the node before it is counted (TTL,
    /// clear) takes it off the count early, so the count may dip below the
    /// truth for that moment (it is signed); it is exact once both are done.
    fn count_terminal(&self, guard: &Guard) {
        if self.terminal.load(Relaxed) >= self.max_terminal {
            while let Some(node) = self.fifo.pop_if(|_| true, guard) {
                if self.evict(node, Cause::Replaced, guard) {
                    return;
                }
            }
        }
        self.terminal.fetch_add(1, Relaxed);
        self.enforce_capacity(guard);
    }

    /// Evicts the oldest terminal entries while there are too many.
    fn enforce_capacity(&self, guard: &Guard) {
        while self.terminal.load(Relaxed) > self.max_terminal {
            let Some(node) = self.fifo.pop_if(|_| true, guard) else {
                break;
            };
            self.evict(node, Cause::Capacity, guard);
        }
    }

    /// Evicts a node just popped from the queue, unless it went already
    /// (expired when touched, or cleared); whether it did.
    fn evict(&self, node: NodeRef<'_, S>, cause: Cause, guard: &Guard) -> bool {
        let lock = node.lock.lock();
        // SAFETY: we hold the node's lock.
        let body = unsafe { node.body() };
        if body.phase() != Phase::Terminal {
            return false;
        }
        let gone = self.remove_locked(&node, body, cause);
        drop(lock);
        drop(gone);
        self.unlink(self.bucket_of(&node.key.load()), guard);
        // The node is the queue's sentinel now, and what follows it is the
        // next entry to evict: start loading it, so the next insert at
        // capacity (`prefetch_eviction` reads its key) does not wait for it.
        // A hint only: loom and Miri would just explore or check one more load.
        if !cfg!(any(loom, miri)) {
            // Acquire: the next node may sit in a segment this thread has
            // not seen made yet (the slab's lookup checks it in debug).
            let next = node.fifo_next.load(Acquire);
            if !next.is_null() {
                prefetch(self.slab.get::<Node<S>>(next.slot()));
            }
        }
        true
    }

    /// At capacity, starts loading what evicting the oldest terminal entry
    /// will read: the rest of its node and its bucket.
    ///
    /// Only while this thread is the one evicting. Reading the queue's head,
    /// its sentinel and the oldest node takes those lines out of the core
    /// of a thread that is evicting at that moment, which then waits to win
    /// them back for its compare-and-swaps: with two threads inserting at
    /// capacity (distinct ids, or a duplicate storm where they take turns
    /// winning each id) the prefetch made every insert slower (two threads'
    /// distinct inserts: about 200 ns per op with it, 150 without). Alone,
    /// it overlaps the victim's bucket miss with the new key's (insert at
    /// capacity about 10% faster).
    #[inline]
    fn prefetch_eviction(&self, guard: &Guard) {
        // Hints only: loom and Miri would just explore or check more loads.
        if cfg!(any(loom, miri))
            || self.terminal.load(Relaxed) < self.max_terminal
            || !self.fifo.popping_alone()
        {
            return;
        }
        let head = self.fifo.head.load(Acquire);
        // SAFETY: the head is never null; it and its successor are protected
        // by `guard`.
        let next = unsafe { resolve::<S>(self.slab, head, guard) }
            .fifo_next
            .load(Acquire);
        // SAFETY: as above.
        if let Some(oldest) = unsafe { resolve_opt::<S>(self.slab, next, guard) } {
            prefetch(&oldest.fifo_next);
            prefetch(self.bucket_of(&oldest.key.load()));
        }
    }

    #[inline]
    fn bucket(&self, key: &DedupKey) -> &AtomicLink {
        &self.buckets[hash(key) as usize & self.mask]
    }

    /// The bucket of a stored key.
    #[inline]
    fn bucket_of(&self, key: &PackedKey) -> &AtomicLink {
        &self.buckets[hash_packed(key) as usize & self.mask]
    }

    /// Unlinks every removed node of a bucket.
    fn unlink(&self, bucket: &AtomicLink, guard: &Guard) {
        // No key to look for: walk the whole chain, unlinking as we go.
        let _ = self.walk(bucket, None, guard);
    }

    /// Looks `key` up in a chain. The common case, a chain without removed
    /// nodes, takes a loop with nothing to unlink; the first removed node
    /// met hands over to the full walk, which unlinks it.
    #[inline]
    fn find<'g>(&self, bucket: &AtomicLink, key: &DedupKey, guard: &'g Guard) -> Found<'g, S> {
        let key = PackedKey::new(key);
        let head = bucket.load(Acquire);
        let mut cur = head;
        // SAFETY: every node reached from the bucket under `guard` keeps its
        // slot until the guard is dropped.
        while let Some(node) = unsafe { resolve_opt::<S>(self.slab, cur, guard) } {
            let next = node.next.load(Acquire);
            if next.marked() {
                return self.walk(bucket, Some(&key), guard);
            }
            if node.key.load() == key {
                return Found::Node(node);
            }
            cur = next;
        }
        Found::Absent(head)
    }

    /// Walks a chain looking for `key`, unlinking removed nodes it meets
    /// (Harris–Michael). Takes no lock.
    #[inline(never)]
    fn walk<'g>(
        &self,
        bucket: &AtomicLink,
        key: Option<&PackedKey>,
        guard: &'g Guard,
    ) -> Found<'g, S> {
        'retry: loop {
            let head = bucket.load(Acquire);
            let mut prev = bucket;
            let mut cur = head;
            // SAFETY: every node reached from the bucket under `guard` keeps
            // its slot until the guard is dropped.
            while let Some(node) = unsafe { resolve_opt::<S>(self.slab, cur, guard) } {
                let next = node.next.load(Acquire);
                if next.marked() {
                    let next = next.unmarked();
                    match prev.compare_exchange(cur, next, AcqRel, Acquire) {
                        Ok(_) => {
                            // SAFETY: unlinked by us, exactly once (a CAS
                            // only succeeds from an unmarked predecessor that
                            // still points at it); readers are pinned.
                            unsafe { release(self.slab, node, guard) };
                            if key.is_some() && std::ptr::eq(prev, bucket) {
                                // The head changed: start over so that
                                // `Absent` carries the current head (an
                                // unlink-only walk has no use for it).
                                continue 'retry;
                            }
                            cur = next;
                            continue;
                        }
                        Err(_) => continue 'retry,
                    }
                }
                if key.is_some_and(|k| *k == node.key.load()) {
                    return Found::Node(node);
                }
                prev = &node.node.next;
                cur = next;
            }
            return Found::Absent(head);
        }
    }

    /// The bucket `key` lands in (tests build colliding keys with it).
    #[doc(hidden)]
    pub fn bucket_index(&self, key: &DedupKey) -> usize {
        hash(key) as usize & self.mask
    }

    /// Queued nodes (tests).
    #[cfg(test)]
    pub(crate) fn queue_len(&self) -> usize {
        let guard = self.epoch.pin();
        let mut n = 0;
        let head = self.fifo.head.load(Acquire);
        // SAFETY: protected by `guard`.
        let mut cur = unsafe { resolve::<S>(self.slab, head, &guard) }
            .fifo_next
            .load(Acquire);
        // SAFETY: protected by `guard`.
        while let Some(node) = unsafe { resolve_opt::<S>(self.slab, cur, &guard) } {
            n += 1;
            cur = node.fifo_next.load(Acquire);
        }
        n
    }

    /// Removes `key`'s entry if it is in progress and `pred` accepts it
    /// (an exactly-once computation that panicked gives its key back).
    pub(crate) fn remove_in_progress(
        &self,
        key: &DedupKey,
        pred: impl FnOnce(&S) -> bool,
    ) -> Option<S> {
        let guard = self.epoch.pin();
        let bucket = self.bucket(key);
        loop {
            let Found::Node(node) = self.find(bucket, key, &guard) else {
                return None;
            };
            let lock = node.lock.lock();
            // SAFETY: we hold the node's lock.
            let body = unsafe { node.body() };
            match body.phase() {
                Phase::Removed | Phase::Reserved => continue,
                Phase::Terminal => return None,
                Phase::Live => {
                    // SAFETY: initialised in this phase.
                    if !pred(&*unsafe { body.current() }) {
                        return None;
                    }
                    let gone = self.remove_locked(&node, body, Cause::Clear);
                    drop(lock);
                    self.unlink(bucket, &guard);
                    return gone;
                }
            }
        }
    }
}

impl<S> DedupTable<S> {
    /// Drops every state still stored (the table is being dropped). Each
    /// node is marked removed before its state is dropped, so if a drop
    /// panics the states after it are leaked, never dropped twice.
    ///
    /// # Safety
    /// No other thread may reach the table.
    unsafe fn drop_states(&mut self) {
        self.each_chained(|node| {
            let body = node.body();
            if matches!(body.phase(), Phase::Live | Phase::Terminal) {
                body.phase.set(Phase::Removed);
                std::ptr::drop_in_place(body.state.get());
            }
        });
    }

    /// Calls `f` on every node of every chain, each node's successor read
    /// before `f` runs (`f` may give the node's slot back).
    ///
    /// # Safety
    /// No other thread may reach the table.
    unsafe fn each_chained(&mut self, mut f: impl FnMut(NodeRef<'_, S>)) {
        let guard = crossbeam_epoch::unprotected();
        for bucket in self.buckets.iter() {
            let mut cur = bucket.load(Relaxed);
            while let Some(node) = resolve_opt::<S>(self.slab, cur, guard) {
                cur = node.next.load(Relaxed).unmarked();
                f(node);
            }
        }
    }

    /// Ends every membership nobody released (the chains' and the
    /// queue's); a node's slot goes back when its last one goes.
    ///
    /// # Safety
    /// No other thread may reach the table, and no node holds a state.
    unsafe fn release_all(&mut self) {
        let slab = self.slab;
        self.each_chained(|node| {
            if node.refs.fetch_sub(1, Relaxed) == 1 {
                node_pool::give(slab, node.link.slot());
            }
        });
        self.fifo.drop_all(crossbeam_epoch::unprotected());
    }
}

impl<S> Drop for DedupTable<S> {
    fn drop(&mut self) {
        /// Gives the slots back even if a state's drop panics: the slab
        /// never shrinks, so a slot lost here would be lost for good.
        struct Slots<'a, S>(&'a mut DedupTable<S>);
        impl<S> Drop for Slots<'_, S> {
            fn drop(&mut self) {
                // SAFETY: `&mut` of the table being dropped; its states are
                // dropped (or leaked by a panicking drop).
                unsafe { self.0.release_all() }
            }
        }
        let slots = Slots(self);
        // SAFETY: `&mut self`: no other thread can reach the table.
        unsafe { slots.0.drop_states() };
        drop(slots);
        // No lookup of this table runs any more: its slab may serve another.
        self.slab.release();
    }
}

#[inline]
pub(crate) fn hash(key: &DedupKey) -> u64 {
    FxBuildHasher.hash_one(key)
}

/// [`hash`] of a stored key, without rebuilding the `DedupKey` (hashes the
/// same fields in the same order: checked by a test).
#[inline]
fn hash_packed(key: &PackedKey) -> u64 {
    let [caller, high, low] = key.0;
    hash(&DedupKey {
        caller: CallerId::from_u64(caller),
        request: RequestId::from_u128(u128::from(high) << 64 | u128::from(low)),
    })
}

#[cfg(test)]
mod packed_key_tests {
    use super::*;

    #[test]
    fn a_stored_key_hashes_and_unpacks_as_the_key_it_was() {
        for n in [0u64, 1, 0xdead_beef, u64::MAX] {
            let key = DedupKey {
                caller: CallerId::from_u64(n.rotate_left(7)),
                request: RequestId::from_u128(u128::from(n) << 64 | u128::from(!n)),
            };
            let packed = PackedKey::new(&key);
            assert!(packed.unpack() == key);
            assert_eq!(hash_packed(&packed), hash(&key));
        }
    }

    #[test]
    fn links_name_their_slot_and_keep_the_mark_apart() {
        for slot in [0, 1, 12_345, crate::slab::MAX_SLOTS - 1] {
            let link = Link::to(slot);
            assert!(!link.is_null() && !link.marked());
            assert_eq!(link.slot(), slot);
            let marked = Link(link.0 | 1);
            assert!(marked.marked() && !marked.is_null());
            assert_eq!(marked.unmarked(), link);
        }
        assert!(Link::NULL.is_null() && Link(1).is_null());
    }
}

#[cfg(test)]
mod eviction_hint_tests {
    use super::*;
    use std::time::Duration;

    #[derive(Clone, Copy)]
    struct Done;

    impl DedupState for Done {
        fn is_terminal(&self) -> bool {
            true
        }
    }

    fn insert(t: &DedupTable<Done>, n: u64) {
        let key = DedupKey {
            caller: CallerId::from_u64(3),
            request: RequestId::from_parts(0, n),
        };
        t.apply(key, Timestamp::ZERO, |_| (Some(Done), ()));
    }

    #[test]
    #[cfg_attr(miri, ignore = "the hint is not kept under Miri")]
    fn a_thread_prefetches_evictions_only_after_evicting_alone_for_a_while() {
        let t = DedupTable::new(DedupConfig {
            max_terminal: 4,
            terminal_ttl: Duration::from_secs(3600),
        });
        (0..4).for_each(|n| insert(&t, n));
        // The first pop has no previous one to compare with; each later one
        // finds the head the one before it left.
        (4..4 + u64::from(POPS_ALONE)).for_each(|n| insert(&t, n));
        assert!(!t.fifo.popping_alone());
        insert(&t, 100);
        assert!(t.fifo.popping_alone());
        // Another thread's pop in between: this thread is no longer alone,
        // and has to make as many pops again.
        std::thread::scope(|s| {
            s.spawn(|| insert(&t, 200));
        });
        insert(&t, 300);
        assert!(!t.fifo.popping_alone());
        (400..400 + u64::from(POPS_ALONE) - 1).for_each(|n| insert(&t, n));
        assert!(!t.fifo.popping_alone());
        insert(&t, 500);
        assert!(t.fifo.popping_alone());
        // Another table's pops are not this table's.
        let other = DedupTable::new(DedupConfig {
            max_terminal: 1,
            terminal_ttl: Duration::from_secs(3600),
        });
        (0..2).for_each(|n| insert(&other, n));
        assert!(!t.fifo.popping_alone());
    }
}
