//! Payloads crossing the boundary. A JVM object never crosses: the Kotlin
//! side keeps it in its handle table and Rust carries its handle. Rust owns
//! the handle's lifetime (retries, the reply cache and the DLQ clone it), so
//! the last drop queues the handle for release; Kotlin drains that queue in
//! batches, which keeps per-ask FFI crossings down.

use std::sync::atomic::{AtomicI64, AtomicUsize, Ordering};
use std::sync::Arc;

use parking_lot::Mutex;

static RELEASED: Mutex<Vec<i64>> = Mutex::new(Vec::new());
/// `RELEASED.len()`, readable without the lock (every ask reports it).
static RELEASED_LEN: AtomicUsize = AtomicUsize::new(0);
static LIVE: AtomicI64 = AtomicI64::new(0);

/// A handle of the Kotlin handle table, owned by Rust.
#[derive(Debug)]
pub struct HostRef(i64);

impl HostRef {
    pub fn adopt(handle: i64) -> Self {
        LIVE.fetch_add(1, Ordering::Relaxed);
        Self(handle)
    }
    pub fn handle(&self) -> i64 {
        self.0
    }
}

impl Drop for HostRef {
    fn drop(&mut self) {
        let mut released = RELEASED.lock();
        released.push(self.0);
        RELEASED_LEN.store(released.len(), Ordering::Relaxed);
        drop(released);
        LIVE.fetch_sub(1, Ordering::Relaxed);
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
    let mut released = RELEASED.lock();
    RELEASED_LEN.store(0, Ordering::Relaxed);
    std::mem::take(&mut *released)
}

/// [`take_released`] for the hot path: moves up to `cap` released handles
/// to `buf` and returns how many (fewer than `cap`: none are left).
///
/// # Safety
/// `buf` must point to `cap` writable `i64`s.
#[no_mangle]
pub unsafe extern "C" fn askpool_hot_take_released(buf: *mut i64, cap: i32) -> i32 {
    let cap = usize::try_from(cap).unwrap_or(0);
    if buf.is_null() {
        return 0;
    }
    let mut released = RELEASED.lock();
    let n = released.len().min(cap);
    let from = released.len() - n;
    // SAFETY: the caller provides `cap` words and n <= cap.
    unsafe { std::ptr::copy_nonoverlapping(released.as_ptr().add(from), buf, n) };
    released.truncate(from);
    RELEASED_LEN.store(released.len(), Ordering::Relaxed);
    // n <= cap, which came from an i32.
    n as i32
}

/// How many released handles wait for [`take_released`] (a hint, no lock).
pub fn released_len() -> usize {
    RELEASED_LEN.load(Ordering::Relaxed)
}

/// Host handles Rust holds right now (a leak check: 0 once everything ended).
#[uniffi::export]
pub fn live_host_refs() -> i64 {
    LIVE.load(Ordering::Relaxed)
}
