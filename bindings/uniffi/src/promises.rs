//! Durable promises (`askpool-promises`) for Kotlin: a store (SQLite file
//! or memory) with create / get / resolve / reject / cancel / prune / wait,
//! and durable asks on a [`NativeNode`]. Payloads are bytes: a durable value
//! outlives the process, so the Kotlin side encodes it with a codec.

use std::panic::AssertUnwindSafe;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use askpool::RequestId;
use askpool_promises::{
    Completed, Completion, Durable, DurableAsk, DurableHandle, DurablePromises, Promise,
    PromiseError,
};
use futures::FutureExt;
use tokio::sync::watch;

use crate::error::{Failure, NativeError};
use crate::node::NativeNode;
use crate::payload::Msg;
use crate::runtime::runtime;

/// A promise; times are Unix milliseconds.
#[derive(Clone, Debug, uniffi::Record)]
pub struct PromiseRecord {
    pub id: String,
    /// `PENDING`, `RESOLVED`, `REJECTED`, `CANCELED` or `TIMEDOUT`.
    pub state: String,
    pub param: Vec<u8>,
    pub value: Option<Vec<u8>>,
    pub timeout_at: u64,
    pub created_at: u64,
    pub settled_at: Option<u64>,
    /// Whether this call was answered from an earlier one with the same key.
    pub replayed: bool,
}

impl PromiseRecord {
    fn of(p: Promise, replayed: bool) -> Self {
        Self {
            id: p.id,
            state: p.state.as_str().to_uppercase(),
            param: p.param,
            value: p.value,
            timeout_at: p.timeout_at,
            created_at: p.created_at,
            settled_at: p.settled_at,
            replayed,
        }
    }
}

/// What a promise-store call fails with; `code` is
/// [`PromiseError::code`] (`NotFound`, `AlreadySettled`, `Corrupt`, ...).
#[derive(Debug, thiserror::Error, uniffi::Error)]
pub enum PromiseFault {
    #[error("{detail}")]
    Store { code: String, detail: String },
}

impl From<PromiseError> for PromiseFault {
    fn from(e: PromiseError) -> Self {
        PromiseFault::Store {
            code: e.code().to_owned(),
            detail: e.to_string(),
        }
    }
}

#[derive(uniffi::Object)]
pub struct NativePromises {
    durable: DurablePromises,
    /// Set by [`shutdown`](NativePromises::shutdown): running waits end
    /// with `Closed` (each holds the store, a SQLite connection with it).
    closed: watch::Sender<bool>,
}

impl NativePromises {
    fn new(durable: DurablePromises) -> Arc<Self> {
        Arc::new(Self {
            durable,
            closed: watch::Sender::new(false),
        })
    }
}

fn closed_fault() -> PromiseFault {
    PromiseFault::Store {
        code: "Closed".into(),
        detail: "promise store closed".into(),
    }
}

#[uniffi::export]
impl NativePromises {
    /// Opens (or creates) the SQLite store at `path`; durable asks stay
    /// pending at most `durable_timeout_ms`.
    #[uniffi::constructor]
    pub fn open(path: String, durable_timeout_ms: u64) -> Result<Arc<Self>, PromiseFault> {
        let mut durable = DurablePromises::open(path)?;
        durable.timeout = Duration::from_millis(durable_timeout_ms);
        Ok(Self::new(durable))
    }

    /// A store in memory, gone with the process.
    #[uniffi::constructor]
    pub fn memory(durable_timeout_ms: u64) -> Arc<Self> {
        let mut durable = DurablePromises::in_memory();
        durable.timeout = Duration::from_millis(durable_timeout_ms);
        Self::new(durable)
    }

    /// Creates a promise pending for `timeout_ms`; with `key`, a repeat of
    /// the same create returns the existing promise.
    pub fn create(
        &self,
        id: String,
        param: Vec<u8>,
        timeout_ms: u64,
        key: Option<String>,
    ) -> Result<PromiseRecord, PromiseFault> {
        let created = self.durable.create(&id, param, timeout_ms, key)?;
        Ok(PromiseRecord::of(created.promise, created.deduplicated))
    }

    pub fn get(&self, id: String) -> Result<PromiseRecord, PromiseFault> {
        Ok(PromiseRecord::of(self.durable.get(&id)?, false))
    }

    pub fn resolve(
        &self,
        id: String,
        value: Vec<u8>,
        key: Option<String>,
    ) -> Result<PromiseRecord, PromiseFault> {
        completed(self.durable.resolve(&id, value, key))
    }

    pub fn reject(
        &self,
        id: String,
        value: Vec<u8>,
        key: Option<String>,
    ) -> Result<PromiseRecord, PromiseFault> {
        completed(self.durable.reject(&id, value, key))
    }

    pub fn cancel(
        &self,
        id: String,
        value: Vec<u8>,
        key: Option<String>,
    ) -> Result<PromiseRecord, PromiseFault> {
        completed(self.durable.complete(&id, Completion::Cancel, value, key))
    }

    /// Deletes the promises settled more than `older_than_ms` ago, after
    /// timing out the expired pending ones; returns how many.
    pub fn prune(&self, older_than_ms: u64) -> Result<u64, PromiseFault> {
        let pruned = self.durable.prune(Duration::from_millis(older_than_ms))?;
        Ok(pruned as u64)
    }

    /// The promise once settled (or timed out), or `Closed` once the
    /// store is shut down. Runs on the library's runtime, so the host's
    /// executor needs no tokio; dropping this future (the awaiting
    /// coroutine cancelled) ends the wait there too, else it would poll
    /// the store until the promise's timeout.
    pub async fn wait(&self, id: String) -> Result<PromiseRecord, PromiseFault> {
        let durable = self.durable.clone();
        let mut closed = self.closed.subscribe();
        let task = AbortOnDrop(runtime().spawn(async move {
            let _counted = WaitCount::enter();
            tokio::select! {
                waited = durable.wait(&id) => Some(waited),
                _ = closed.wait_for(|closed| *closed) => None,
            }
        }));
        let waited = task.await.map_err(|e| PromiseFault::Store {
            code: "Internal".into(),
            detail: format!("promise wait failed: {e}"),
        })?;
        Ok(PromiseRecord::of(waited.ok_or_else(closed_fault)??, false))
    }

    /// Ends the running waits with `Closed` (the Kotlin `close`, before it
    /// frees the object); a wait started after ends at once. Idempotent.
    pub fn shutdown(&self) {
        self.closed.send_replace(true);
    }
}

/// A task aborted when its handle is dropped.
struct AbortOnDrop<T>(tokio::task::JoinHandle<T>);

impl<T> Drop for AbortOnDrop<T> {
    fn drop(&mut self) {
        self.0.abort();
    }
}

impl<T> std::future::Future for AbortOnDrop<T> {
    type Output = Result<T, tokio::task::JoinError>;
    fn poll(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Self::Output> {
        std::pin::Pin::new(&mut self.0).poll(cx)
    }
}

static WAITS: AtomicU64 = AtomicU64::new(0);

/// Counts a running [`NativePromises::wait`] while it lives.
struct WaitCount;

impl WaitCount {
    fn enter() -> Self {
        WAITS.fetch_add(1, Ordering::Relaxed);
        WaitCount
    }
}

impl Drop for WaitCount {
    fn drop(&mut self) {
        WAITS.fetch_sub(1, Ordering::Relaxed);
    }
}

/// Promise waits running in the library (a leak check: 0 once no await runs).
#[uniffi::export]
pub fn promise_waits_in_flight() -> u64 {
    WAITS.load(Ordering::Relaxed)
}

fn completed(done: askpool_promises::Result<Completed>) -> Result<PromiseRecord, PromiseFault> {
    let done = done?;
    Ok(PromiseRecord::of(done.promise, done.replayed))
}

/// Why a JVM object is not durable: it cannot outlive the process.
const HOST_OBJECT: &str = "a JVM object, not a ByteArray (an object cannot outlive the process)";

impl Durable for Msg {
    fn to_bytes(&self) -> Result<Vec<u8>, String> {
        match self {
            Msg::Bytes(b) => Ok(b.to_vec()),
            Msg::Host(_) => Err(HOST_OBJECT.into()),
        }
    }

    fn from_bytes(bytes: &[u8]) -> Result<Self, String> {
        Ok(Msg::Bytes(Arc::from(bytes)))
    }
}

#[uniffi::export]
impl NativeNode {
    /// Starts a durable ask of `payload` to `pool` (under `id`, or a fresh
    /// one); the outcome goes to the listener under `token`, and its asks'
    /// stage record is kept under `token` for `open_stages` (until freed)
    /// if the node tracks stages. Returns the id.
    pub fn ask_durable(
        self: Arc<Self>,
        promises: Arc<NativePromises>,
        pool: String,
        payload: Vec<u8>,
        id: Option<String>,
        token: i64,
    ) -> Result<String, NativeError> {
        let _rt = runtime().enter();
        let msg = Msg::Bytes(Arc::from(payload));
        let handle = match id {
            Some(text) => {
                let id: RequestId = crate::node::parse_id("durable ask id", &text)?;
                self.node()
                    .ask_durable_with_id(&promises.durable, id, &pool, msg)?
            }
            None => self.node().ask_durable(&promises.durable, &pool, msg)?,
        };
        let keep_stages = self.track_stages;
        Ok(self.drive_durable(handle, token, keep_stages))
    }

    /// The outcome of the durable ask `id` (asked again if still pending),
    /// to the listener under `token`; its asks' stage record is kept as
    /// `ask_durable` keeps it if `keep_stages` (a handle will read or free
    /// it). Returns the id in its canonical form.
    pub fn await_durable(
        self: Arc<Self>,
        promises: Arc<NativePromises>,
        id: String,
        token: i64,
        keep_stages: bool,
    ) -> Result<String, NativeError> {
        let _rt = runtime().enter();
        let handle = self.node().await_durable(&promises.durable, &id)?;
        let keep_stages = keep_stages && self.track_stages;
        Ok(self.drive_durable(handle, token, keep_stages))
    }
}

impl NativeNode {
    /// Reports the durable ask's outcome under `token`. A cancel of the
    /// token ([`NativeNode::cancel`]: the Kotlin waiter gave up) drops the
    /// handle and fails the waiter with `AskCancelled`: the ask itself runs
    /// on and is recorded (it was started in the runtime); this wait would
    /// otherwise hold a task and the waiter until the ask ends.
    fn drive_durable(
        self: &Arc<Self>,
        handle: DurableHandle<Msg>,
        token: i64,
        keep_stages: bool,
    ) -> String {
        let id = handle.id().to_owned();
        let listener = self.listener();
        if keep_stages {
            crate::stages::keep(token, handle.stage_source(), Arc::clone(&listener));
        }
        let cancel = self.register_cancel(token);
        let node = Arc::clone(self);
        runtime().spawn(async move {
            let outcome = tokio::select! {
                biased;
                outcome = AssertUnwindSafe(handle).catch_unwind() => outcome.unwrap_or_else(|panic| {
                    Err(askpool::AskError::internal(crate::node::panic_message(
                        panic.as_ref(),
                    )))
                }),
                Ok(()) = cancel => Err(askpool::AskError::AskCancelled {
                    reason: askpool::CancelReason::Caller,
                }),
            };
            node.forget_cancel(token);
            match outcome {
                Ok(Msg::Bytes(b)) => listener.on_reply_bytes(token, b.to_vec()),
                // A durable ask's outcome is bytes, stored or read back.
                Ok(Msg::Host(_)) => listener.on_failure(
                    token,
                    Failure::from(&askpool::AskError::DecodeFailure {
                        message: HOST_OBJECT.into(),
                    }),
                ),
                Err(e) => listener.on_failure(token, Failure::from(&e)),
            }
            // The handle is gone: its asks' record is complete.
            if keep_stages {
                crate::stages::ended(token);
            }
        });
        id
    }
}
