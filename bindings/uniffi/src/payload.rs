//! Payloads crossing the boundary. A JVM object never crosses: the Kotlin
//! side keeps it in its handle table and Rust carries its handle. Rust owns
//! the handle's lifetime (retries, the reply cache and the DLQ clone it), so
//! the last drop queues the handle for release; Kotlin drains that queue in
//! batches, which keeps per-ask FFI crossings down.

use std::sync::atomic::{AtomicI64, Ordering};
use std::sync::Arc;

use parking_lot::Mutex;

static RELEASED: Mutex<Vec<i64>> = Mutex::new(Vec::new());
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
        RELEASED.lock().push(self.0);
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
    std::mem::take(&mut *RELEASED.lock())
}

pub fn released_len() -> usize {
    RELEASED.lock().len()
}

/// Host handles Rust holds right now (a leak check: 0 once everything ended).
#[uniffi::export]
pub fn live_host_refs() -> i64 {
    LIVE.load(Ordering::Relaxed)
}
