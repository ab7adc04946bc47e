//! Lock-free bounded dedup table for the inbound side of askpool, and
//! kameo-style exactly-once helpers ([`ExactlyOnceDedup`]).
//!
//! The table stores one state per [`DedupKey`] and applies transitions that
//! the caller computes (askpool-proto's `inbound::step`) atomically per key.
//! It enforces the memory rules of DESIGN section 3:
//!
//! - Terminal entries are bounded by `max_terminal` (oldest terminal evicted
//!   first) and by `terminal_ttl`, counted from the moment the entry became
//!   terminal, not from arrival. A hit does not refresh either. Expiry stamps
//!   never go down along the eviction queue: an entry made terminal with an
//!   earlier `now` than one queued before it (threads whose clocks differ)
//!   takes that one's stamp, so under clock skew an entry can outlive its TTL
//!   by the skew, and memory stays bounded whatever clocks callers pass.
//! - In-progress entries are never evicted: the runtime bounds them with the
//!   pool's max in-flight through [`DedupTable::apply_bounded`], which takes
//!   a new entry's place in the count before its transition runs (so
//!   inserts racing on different keys cannot all take the last place), and
//!   reads [`DedupStats::in_progress`].
//!
//! # Design
//!
//! **Map.** A fixed array of buckets (two per allowed terminal entry, rounded
//! up to a power of two, 64 to 2^23), each the head of a Harris–Michael
//! lock-free linked list of nodes, on crossbeam-epoch. Nodes live in slots
//! of a process-wide slab per node layout (per table for plain-data
//! states: see *Lookup*) (`slab`), and every link (bucket,
//! chain, queue) is a 32-bit slot number, not a pointer: the bucket array
//! is half the size (1 MiB for 100,000 entries, so more of it stays in
//! cache), and a node with a 16-byte state fills exactly one 64-byte slot,
//! which starts on a cache line. A node holds the chain link (whose low bit
//! marks the node logically removed), a membership count, the key, its
//! expiry, the eviction-queue link, a one-byte spin lock and, under that
//! lock, its phase (reserved / in progress / terminal / removed, in the
//! byte after the lock) and the state inline.
//!
//! - *Lookup* of a terminal entry whose state has no drop glue (plain
//!   data) takes no lock and no epoch pin (a pin is a locked
//!   compare-and-swap, about a third of a hit's time). Slots are never
//!   freed, so any link, however stale, names the memory of a node; the
//!   lookup follows the chain as it finds it, and at the node holding its
//!   key copies the phase, expiry and state with atomic loads. Each slot
//!   has a version, a seqlock on its reuse: odd while a new node is written
//!   into the slot, and every write to such a node is atomic, the state's
//!   too (word by word, through `atomic-maybe-uninit`, which copies padding
//!   soundly; such tables use slabs of their own). The lookup keeps what it
//!   read only if the version was even before and unchanged after, and the
//!   entry was terminal and unexpired: then it is one node's, as it was at
//!   one moment (terminal states are never written again), and the lookup
//!   returns a clone of that copy (a `Clone` that writes to the state it
//!   clones writes to the copy). Anything else (absent, in progress,
//!   expired, a state with drop glue, a read overtaken by a reuse) is looked
//!   up again under a pin: that walk unlinks removed nodes it meets (as
//!   Harris–Michael lists do) and reads the entry under its lock, one
//!   compare-and-swap to take it and a plain store to release it. (A state
//!   that owns resources is dropped at once when its entry is removed,
//!   under the lock, so its readers must hold the lock.)
//! - *Insert-if-absent* publishes a new node with one CAS on the bucket head.
//!   The node is born with its lock held by its creator (a *reserved* entry),
//!   so the insert waits for nobody; the creator then runs the transition
//!   closure with `None` and fills the node, or, if the closure stores
//!   nothing or panics, marks it removed. A concurrent `apply` of the same
//!   key finds the reserved node and waits on its lock: the closure runs
//!   exactly once per key and every other caller sees its result.
//! - *Transitions* of an existing entry run the closure under that entry's
//!   lock only. There is no table-wide lock or channel anywhere: other keys
//!   go on undisturbed. The state itself is only touched under its entry's
//!   lock, which is why `DedupTable<S>` is `Sync` for any `S: Send` (like
//!   `Mutex<S>`), as the runtime needs.
//!
//! **Eviction.** Becoming terminal appends the node itself to a
//! Michael–Scott lock-free FIFO threaded through the nodes (no second
//! allocation), so the queue is in the order entries became terminal. A
//! terminal transition queues its node, then counts it; if `max_terminal`
//! entries were terminal already, the oldest node is popped and removed in
//! its place instead, and the count is not written at all. Every operation
//! first pops the nodes whose TTL passed: `pop_if` looks at the oldest
//! node's expiry without taking it until it is due, and the expiry it last
//! found not due is kept in one word (`next_due`), so an operation whose
//! clock is before it skips the queue with a single load.
//! A popped node that was already removed (expired when touched, cleared) is
//! skipped. In-progress entries are never queued, so never evicted. A
//! terminal entry found expired by `apply` or `get` before the queue reached
//! it (clocks of concurrent callers differ slightly) is treated as absent
//! and removed then. Under concurrency two evicting threads may each remove
//! one entry for the same excess, so the table can briefly hold a few fewer
//! terminal entries than `max_terminal`, never more once the inserting
//! calls return.
//!
//! **Reclamation.** A node belongs to its chain and, once terminal, to the
//! queue (as an element, then as the queue's sentinel once popped); a count
//! of those memberships decides who retires it: the thread that unlinks it
//! from the chain or the one that moves the queue past it, whichever is
//! last. Removing an entry drops its state at once, under its lock; only the
//! empty node shell waits for the epoch to pass before its slot is reused,
//! so the epoch garbage never holds an `S` (no `'static` bound, exact drop
//! counts), and a slot number read under a pin names the same node until
//! the pin ends (no ABA on the links). A thread hands the slots it retires
//! to crossbeam's collector 256 at a time, as one deferred function (later
//! than retired is as safe: a thread that could still reach a shell was
//! pinned when it was retired, so the collector waits for it); a deferred
//! function per shell cost more than the rest of its reclamation. Until its
//! thread's batch fills, a retired slot waits in it: a thread that stops
//! retiring keeps up to 255 (per slab, whichever tables they came
//! from, dropped ones included) until it exits, when they go to the
//! collector. A slot the collector frees goes to a small per-thread cache
//! (at most 512 per thread and slab) that the next insert on that
//! thread reuses. A full cache hands 256 slots at a time to its slab's
//! shared list, which an empty cache draws from before it takes a slot
//! never used: the collector runs on whichever thread pins, not always one
//! that inserts (in a duplicate storm the thread that finds the key takes
//! no slot). A thread's cache goes back to the shared list when it exits.
//! A spare node made for an insert that lost its race goes to the cache
//! too.
//!
//! **Slabs.** A slab grows in segments that double (64 slots, 128, ...), so
//! a slot number finds its memory with one leading-zero count and a table
//! of 32 biased segment bases. Segments are never freed: the slab is as large
//! as the most nodes of its layout that were ever in use at once (the
//! tables' entries, the epoch garbage and the caches above), and a slot one
//! table frees is reused by any table of that layout whose states own
//! resources, as an allocator would reuse a block. A table of plain-data
//! states has a slab of its own while it lives (a lookup with no pin may
//! follow a stale link into a reused slot: within one table the key and the
//! version catch it, but another table's node could hold the same key, or
//! another type's bytes); the next such table of its layout takes it over
//! once it is dropped. Its bounds are then per table: memory is the sum of
//! each such table's peak, and each thread may keep the slack above per
//! slab.
//!
//! **Epoch garbage.** Callers hold a pin only for the duration of one call
//! (never while a user closure of `ExactlyOnceDedup` runs), so crossbeam's
//! collector, which frees up to 8 bags every 128 pins (and a thread's
//! batch of 256 slots goes to it at once, with whatever else the thread's
//! bag holds), keeps up: each
//! evicting insert retires one node. The garbage is counted in the
//! memory bound, and so is what each thread keeps besides the table: up to
//! 255 retired slots and 512 free ones per slab (about 48 KiB of
//! 64-byte nodes).
//! Measured: `tests/alloc_bound.rs` streams 10 million unique terminal
//! entries through a table of 100,000 under a counting global allocator;
//! live bytes stay under the stated ceiling of 12 MiB the whole time
//! (measured peak 9.45 MB: 94.5 bytes per cached entry, flat from the first
//! 100,000 entries on; 1 MiB of it the buckets, 8.4 MB the slab's segments
//! of 131,008 slots, the last of which is only partly in use).
//!
//! # Memory per entry
//!
//! [`entry_size`] bytes plus what the state owns on the heap: one node of
//! 48 bytes plus the state (56 bytes for an 8-byte state, 64 for a 16-byte
//! one; the key is stored unpadded, 24 bytes), whether in progress or
//! terminal. The slab grows by doubling, so up to as much again may be
//! reserved and not yet used (and its first segment is 64 slots, however
//! few entries there are).
//! Buckets add 4 bytes per bucket, two buckets per allowed terminal entry
//! (1 MiB for the default `max_terminal` of 100,000: 262,144 buckets).
//! Measured with the counting allocator (`tests/alloc_bound.rs`), a full
//! table of 100,000 terminal entries of a 16-byte state (64-byte nodes)
//! costs 94.5 bytes per entry all included: node, bucket share, the epoch
//! garbage in flight, the caches of free slots and the slab's unused
//! tail.
//!
//! # Limits
//!
//! - The bucket array is sized once, from `max_terminal`: in-progress
//!   entries beyond that lengthen chains rather than grow the table.
//! - A `get` or `apply` of a key whose transition is running waits for it
//!   (the per-entry lock); a lookup of another key, or a `get` of a
//!   terminal plain-data entry, never waits.
//! - A slot's version (32 bits, as Linux's seqcounts) wraps after 2^31
//!   reuses of the slot. A lookup with no pin that stalls between its two
//!   reads of a version while that one slot is reused exactly a multiple of
//!   2^31 times would keep a read that mixes two states: a wrong value, and
//!   undefined behaviour for a state type with invalid bit patterns (an
//!   enum, a reference). A slot is reused at most once per batch of 256
//!   retired nodes and epoch advance, so this needs one lookup stalled for
//!   hours (about 15 at 10 million evictions a second) while its table is
//!   evicting as fast as it can.
//! - The transition closure must not call back into the table.
//!
//! # Verification
//!
//! - fast tier: `cargo test -p askpool-dedup` (unit tests with drop-counting
//!   states, the model-based proptest against a `HashMap` + TTL + FIFO model
//!   in `tests/model.rs`, duplicate-storm stress tests in `tests/stress.rs`,
//!   the exactly-once helpers in `tests/exactly_once.rs`, the allocator bound
//!   with 1 million entries in `tests/alloc_bound.rs`), and the loom models
//!   with small preemption bounds:
//!   `RUSTFLAGS="--cfg loom --cfg crossbeam_loom" CARGO_TARGET_DIR=target/loom
//!   cargo test -p askpool-dedup --test loom --release`;
//! - slow tier: the same loom command with `ASKPOOL_LOOM_SLOW=1`, the
//!   allocator bound with 10 million entries
//!   (`cargo test -p askpool-dedup --release --test alloc_bound -- --ignored`),
//!   and Miri on the unit tests, which cover all the unsafe code:
//!   `MIRIFLAGS="-Zmiri-tree-borrows -Zmiri-ignore-leaks" cargo +nightly miri
//!   test -p askpool-dedup --lib` (crossbeam-epoch needs Tree Borrows; the
//!   slabs are leaked on purpose and crossbeam's process-wide collector
//!   still holds deferred slots at exit, which Miri would report as leaks:
//!   the states' drops are checked exactly by the drop-counting tests
//!   instead);
//! - benchmarks: `cargo bench -p askpool-dedup --bench dedup` prints a ratio
//!   table against the baselines.

use std::time::Duration;

use askpool_proto::InboundState;

mod exactly_once;
mod node_pool;
mod slab;
mod state_cell;
mod sync;
mod table;

/// Re-exported so that users of the exactly-once helpers need not depend on
/// askpool-proto.
pub use askpool_proto::{DedupKey, PayloadFingerprint, Timestamp};
pub use exactly_once::{
    fingerprint, ExactlyOnce, ExactlyOnceBytesDedup, ExactlyOnceDedup, PayloadMismatch,
};
pub use table::DedupTable;

/// Bytes one entry costs in the table, not counting what its state owns on
/// the heap: its node (key, chain and queue links, expiry, lock, state
/// inline), one slot of its layout's slab. Buckets add 8 bytes per
/// `max_terminal` (two 4-byte buckets, rounded up to a power of two).
pub const fn entry_size<S>() -> usize {
    table::node_size::<S>()
}

/// A state the table can store: it must say whether it is terminal.
pub trait DedupState {
    fn is_terminal(&self) -> bool;
}

impl<R> DedupState for InboundState<R> {
    fn is_terminal(&self) -> bool {
        InboundState::is_terminal(self)
    }
}

/// Bounds of a [`DedupTable`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct DedupConfig {
    /// Most terminal entries kept; the oldest terminal is evicted first.
    pub max_terminal: usize,
    /// How long a terminal entry is kept after it became terminal. Zero
    /// keeps none: a duplicate that arrives after the reply runs the
    /// handler again (duplicates of a request still in progress are still
    /// acknowledged and answered once).
    pub terminal_ttl: Duration,
}

impl DedupConfig {
    /// The bytes a table of this config allocates when it is made (its
    /// buckets, 1 MiB for the default `max_terminal`), before any entry;
    /// each entry adds about [`entry_size`] more. For a host that accounts
    /// for native memory (V8's external memory), which a table it cannot
    /// see would otherwise outgrow before its collector runs.
    pub fn upfront_bytes(&self) -> usize {
        table::bucket_bytes(self.max_terminal)
    }
}

impl Default for DedupConfig {
    fn default() -> Self {
        Self {
            max_terminal: 100_000,
            terminal_ttl: Duration::from_secs(120),
        }
    }
}

/// Counts of the entries in a table.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct DedupStats {
    pub in_progress: usize,
    pub terminal: usize,
    /// Terminal entries removed because of `max_terminal`.
    pub evicted_capacity: u64,
    /// Terminal entries removed because their TTL passed.
    pub evicted_ttl: u64,
}

#[cfg(test)]
mod tests;
