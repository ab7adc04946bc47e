//! Payloads crossing the boundary. A JVM object never crosses: the Kotlin
//! side keeps it in its handle table and Rust carries its handle. Rust owns
//! the handle's lifetime (retries, the reply cache and the DLQ clone it), so
//! the last drop queues the handle for release; Kotlin drains that queue in
//! batches, which keeps per-ask FFI crossings down.
//!
//! Every ask adopts and releases two handles (its message and its reply),
//! on whichever threads ask and reply: the release queue and the live count
//! are per thread (`askpool::shard`), so that those four steps write lines
//! of the thread's own and not one set that every asking thread writes.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, LazyLock};

use askpool::shard::{Sharded, StripedCounter};
use parking_lot::Mutex;

/// Released handles, per thread, with each queue's length readable
/// without its lock (every ask reports it).
#[derive(Default)]
struct ReleaseQueue {
    handles: Mutex<Vec<i64>>,
    len: AtomicUsize,
}

static RELEASED: LazyLock<Sharded<ReleaseQueue>> = LazyLock::new(Sharded::default);
static LIVE: LazyLock<StripedCounter> = LazyLock::new(StripedCounter::default);

/// A handle of the Kotlin handle table, owned by Rust.
#[derive(Debug)]
pub struct HostRef(i64);

impl HostRef {
    pub fn adopt(handle: i64) -> Self {
        LIVE.add(1);
        Self(handle)
    }
    pub fn handle(&self) -> i64 {
        self.0
    }
}

impl Drop for HostRef {
    fn drop(&mut self) {
        let queue = RELEASED.mine();
        let mut handles = queue.handles.lock();
        handles.push(self.0);
        queue.len.store(handles.len(), Ordering::Relaxed);
        drop(handles);
        LIVE.add(-1);
    }
}

/// The runtime's message type (`Node<Msg, Msg>`): cheap to clone.
#[derive(Clone, Debug)]
pub enum Msg {
    Host(Arc<HostRef>),
    Bytes(Arc<[u8]>),
}

impl Msg {
    pub fn host(handle: i64) -> Self {
        Msg::Host(Arc::new(HostRef::adopt(handle)))
    }
}

/// A payload as the generated code sees it.
#[derive(Clone, Debug, uniffi::Enum)]
pub enum Payload {
    /// A JVM object, by its handle-table handle.
    Host { handle: i64 },
    /// Bytes, copied across.
    Bytes { data: Vec<u8> },
}

impl From<Payload> for Msg {
    fn from(p: Payload) -> Self {
        match p {
            Payload::Host { handle } => Msg::host(handle),
            Payload::Bytes { data } => Msg::Bytes(data.into()),
        }
    }
}

impl From<&Msg> for Payload {
    fn from(m: &Msg) -> Self {
        match m {
            Msg::Host(r) => Payload::Host { handle: r.handle() },
            Msg::Bytes(b) => Payload::Bytes { data: b.to_vec() },
        }
    }
}

/// Handles whose last Rust owner is gone; the Kotlin side drops them from
/// its table.
#[uniffi::export]
pub fn take_released() -> Vec<i64> {
    let mut all = Vec::new();
    for queue in RELEASED.iter() {
        let mut handles = queue.handles.lock();
        queue.len.store(0, Ordering::Relaxed);
        all.append(&mut handles);
    }
    all
}

/// [`take_released`] for the hot path: moves up to `cap` released handles
/// to `buf` and returns how many (fewer than `cap`: none are left), from
/// the calling thread's queue first; -2 if it panicked.
///
/// # Safety
/// `buf` must point to `cap` writable `i64`s.
#[no_mangle]
pub unsafe extern "C" fn askpool_hot_take_released(buf: *mut i64, cap: i32) -> i32 {
    // SAFETY: the caller's guarantee, passed on.
    std::panic::catch_unwind(|| unsafe { take_released_into(buf, cap) }).unwrap_or(-2)
}

/// [`askpool_hot_take_released`] without the panic guard.
///
/// # Safety
/// `buf` must point to `cap` writable `i64`s.
unsafe fn take_released_into(buf: *mut i64, cap: i32) -> i32 {
    let cap = usize::try_from(cap).unwrap_or(0);
    if buf.is_null() {
        return 0;
    }
    let mine = RELEASED.my_index();
    let shards = RELEASED.len();
    let mut taken = 0;
    for queue in (0..shards).map(|i| RELEASED.get((mine + i) % shards)) {
        if taken == cap {
            break;
        }
        if queue.len.load(Ordering::Relaxed) == 0 {
            continue;
        }
        let mut handles = queue.handles.lock();
        let n = handles.len().min(cap - taken);
        let from = handles.len() - n;
        // SAFETY: the caller provides `cap` words and taken + n <= cap.
        unsafe { std::ptr::copy_nonoverlapping(handles.as_ptr().add(from), buf.add(taken), n) };
        handles.truncate(from);
        queue.len.store(handles.len(), Ordering::Relaxed);
        taken += n;
    }
    // taken <= cap, which came from an i32.
    taken as i32
}

/// How many released handles wait for [`take_released`] (a hint, no lock):
/// in the calling thread's queue, and on every 64th call in all queues, so
/// that handles released on other threads (a timeout fires on a runtime
/// thread) are drained too while anybody asks.
pub fn released_len() -> usize {
    thread_local! {
        static CALLS: std::cell::Cell<u32> = const { std::cell::Cell::new(0) };
    }
    let calls = CALLS.with(|c| {
        c.set(c.get().wrapping_add(1));
        c.get()
    });
    if calls % 64 == 0 {
        RELEASED.iter().map(|q| q.len.load(Ordering::Relaxed)).sum()
    } else {
        RELEASED.mine().len.load(Ordering::Relaxed)
    }
}

/// Host handles Rust holds right now (a leak check: 0 once everything ended).
#[uniffi::export]
pub fn live_host_refs() -> i64 {
    LIVE.get()
}
