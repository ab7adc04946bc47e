//! Durable promises (`askpool-promises`) for Python: a store (SQLite file or
//! memory) with create / get / resolve / reject / cancel / wait, and the
//! payload encoding of durable asks.
//!
//! A durable ask's message and reply outlive the process, so unlike an
//! in-process ask they are serialized: with `pickle`, Python's own idiom.

use std::collections::BTreeMap;
use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use askpool::AskError;
use askpool_promises::{
    now_millis, Completion, CreateRequest, Durable, DurablePromises, MemoryStore, Promise,
    PromiseError, SqliteStore,
};
use pyo3::intern;
use pyo3::prelude::*;
use pyo3::types::{PyBytes, PyTuple};

use crate::driver::LoopDriver;
use crate::errors::to_py;
use crate::node::seconds;
use crate::obj::Obj;
use crate::task::FutureTask;

fn pickle<'py>(py: Python<'py>) -> PyResult<Bound<'py, PyModule>> {
    py.import(intern!(py, "pickle"))
}

/// `pickle.dumps(object)`.
pub(crate) fn dumps(py: Python<'_>, object: &Bound<'_, PyAny>) -> PyResult<Vec<u8>> {
    pickle(py)?
        .call_method1(intern!(py, "dumps"), (object,))?
        .extract::<Vec<u8>>()
}

impl Durable for Obj {
    /// Pickled; an object that cannot be is not durable (`ask_durable`
    /// refuses such a message up front; such a reply rejects the promise
    /// with `DecodeFailure`).
    fn to_bytes(&self) -> Result<Vec<u8>, String> {
        Python::attach(|py| {
            dumps(py, self.get(py).bind(py)).map_err(|e| format!("cannot pickle it: {e}"))
        })
    }

    fn from_bytes(bytes: &[u8]) -> Result<Self, String> {
        Python::attach(|py| {
            loads(py, bytes)
                .map(|o| Obj::new(o.unbind()))
                .map_err(|e| format!("cannot unpickle a durable value: {e}"))
        })
    }

    /// Pickle is not canonical: equal sets pickle in hash order, which
    /// `PYTHONHASHSEED` changes between processes. Bytes that differ are
    /// the same message if they unpickle to one of the same types and
    /// values (`askpool._promises._same_message`: `1 == True` is not).
    fn same_as(&self, encoded: &[u8], stored: &[u8]) -> bool {
        encoded == stored
            || Python::attach(|py| {
                let old = loads(py, stored)?;
                py.import(intern!(py, "askpool._promises"))?
                    .call_method1(intern!(py, "_same_message"), (old, self.get(py).bind(py)))?
                    .is_truthy()
            })
            .unwrap_or(false)
    }
}

/// `pickle.loads(bytes)`.
fn loads<'py>(py: Python<'py>, bytes: &[u8]) -> PyResult<Bound<'py, PyAny>> {
    pickle(py)?.call_method1(intern!(py, "loads"), (PyBytes::new(py, bytes),))
}

/// A promise as `(id, state, param, value, timeout_at, tags, created_at,
/// settled_at)`; times are Unix milliseconds.
fn promise_tuple<'py>(py: Python<'py>, p: Promise) -> PyResult<Bound<'py, PyTuple>> {
    (
        p.id,
        p.state.as_str(),
        PyBytes::new(py, &p.param),
        p.value.map(|v| PyBytes::new(py, &v)),
        p.timeout_at,
        p.tags,
        p.created_at,
        p.settled_at,
    )
        .into_pyobject(py)
}

fn millis(what: &str, value: f64) -> Result<u64, AskError> {
    seconds(what, value).map(|d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
}

/// A promise store. Every call that touches it releases the GIL: SQLite may
/// wait for another process's lock.
#[pyclass(frozen, module = "askpool._native")]
pub(crate) struct NativePromises {
    pub(crate) durable: DurablePromises,
    /// Waits in flight on the runtime (for tests: 0 once none is left).
    waits: Arc<AtomicUsize>,
}

impl NativePromises {
    fn of(durable: DurablePromises) -> Self {
        Self {
            durable,
            waits: Arc::default(),
        }
    }
}

/// What a wait gives: the settled promise, the store's error, or `None` once
/// the caller's timeout passed.
type Waited = Option<Result<Promise, PromiseError>>;

/// A task on the runtime, aborted when dropped: a wait whose asyncio future
/// is abandoned stops looking at the store.
struct AbortOnDrop<T>(tokio::task::JoinHandle<T>);

impl<T> Drop for AbortOnDrop<T> {
    fn drop(&mut self) {
        self.0.abort();
    }
}

impl<T> Future for AbortOnDrop<T> {
    type Output = Result<T, tokio::task::JoinError>;
    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        Pin::new(&mut self.0).poll(cx)
    }
}

/// Counts a wait in [`NativePromises::waits`] while it lives.
struct WaitCount(Arc<AtomicUsize>);

impl WaitCount {
    fn enter(waits: &Arc<AtomicUsize>) -> Self {
        waits.fetch_add(1, Ordering::Relaxed);
        Self(Arc::clone(waits))
    }
}

impl Drop for WaitCount {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::Relaxed);
    }
}

fn waited(
    py: Python<'_>,
    out: Result<Waited, tokio::task::JoinError>,
) -> Result<Py<PyAny>, AskError> {
    let waited = out.map_err(|e| AskError::internal(format!("a promise wait failed: {e}")))?;
    match waited {
        None => Ok(py.None()),
        Some(promise) => promise_tuple(py, promise.map_err(AskError::from)?)
            .map(|t| t.into_any().unbind())
            .map_err(|e| AskError::internal(e.to_string())),
    }
}

/// A promise wait in flight (see [`NativePromises::wait`]).
#[pyclass(frozen, module = "askpool._native")]
pub(crate) struct NativeWait {
    task: Arc<FutureTask<AbortOnDrop<Waited>>>,
}

#[pymethods]
impl NativeWait {
    /// Ends the wait: it stops looking at the store, and the driver lets go
    /// of it and of its asyncio future (which is left as it is). Nothing
    /// once the wait is over.
    fn cancel(&self) {
        drop(self.task.abandon());
    }
}

#[pymethods]
impl NativePromises {
    /// Opens (or creates) the SQLite store at `path`.
    #[staticmethod]
    #[pyo3(signature = (path, durable_timeout=3600.0))]
    fn sqlite(py: Python<'_>, path: std::path::PathBuf, durable_timeout: f64) -> PyResult<Self> {
        let store = to_py(
            py.detach(|| SqliteStore::open(&path))
                .map_err(AskError::from),
        )?;
        let mut durable = DurablePromises::new(store);
        let timeout = to_py(seconds("durable_timeout", durable_timeout))?;
        if timeout < DurablePromises::MIN_TIMEOUT {
            return to_py(Err(AskError::InvalidArgument {
                message: format!(
                    "durable_timeout must be at least 0.001 seconds, not {durable_timeout}"
                ),
            }));
        }
        durable.timeout = timeout;
        Ok(Self::of(durable))
    }

    /// A store in memory (for tests: it dies with the process).
    #[staticmethod]
    fn memory() -> Self {
        Self::of(DurablePromises::new(MemoryStore::new()))
    }

    /// Creates a promise pending for `timeout` seconds. With `key`, a repeat
    /// of the same create returns the existing promise.
    #[pyo3(signature = (id, timeout, param=Vec::new(), key=None, strict=false, tags=None))]
    #[allow(clippy::too_many_arguments)]
    fn create<'py>(
        &self,
        py: Python<'py>,
        id: String,
        timeout: f64,
        param: Vec<u8>,
        key: Option<String>,
        strict: bool,
        tags: Option<BTreeMap<String, String>>,
    ) -> PyResult<Bound<'py, PyTuple>> {
        let now = now_millis();
        let mut req =
            CreateRequest::new(id, now.saturating_add(to_py(millis("timeout", timeout))?))
                .param(param)
                .strict(strict);
        if let Some(key) = key {
            req = req.key(key);
        }
        req.tags = tags.unwrap_or_default();
        let store = self.durable.store();
        let created = py.detach(|| store.create(&req, now));
        promise_tuple(py, to_py(created.map_err(AskError::from))?.promise)
    }

    fn get<'py>(&self, py: Python<'py>, id: &str) -> PyResult<Bound<'py, PyTuple>> {
        let store = self.durable.store();
        let promise = py.detach(|| store.get(id, now_millis()));
        promise_tuple(py, to_py(promise.map_err(AskError::from))?)
    }

    /// Settles a pending promise: `how` is "resolve", "reject" or "cancel".
    /// With the key of an earlier completion, a repeat replays it.
    #[pyo3(signature = (id, how, value=Vec::new(), key=None))]
    fn complete<'py>(
        &self,
        py: Python<'py>,
        id: String,
        how: &str,
        value: Vec<u8>,
        key: Option<String>,
    ) -> PyResult<Bound<'py, PyTuple>> {
        let completion = match how {
            "resolve" => Completion::Resolve,
            "reject" => Completion::Reject,
            "cancel" => Completion::Cancel,
            other => {
                return to_py(Err(AskError::InvalidArgument {
                    message: format!("completion must be resolve, reject or cancel, not {other:?}"),
                }))
            }
        };
        // Through the facade, which wakes this process's waits at once.
        let completed = py.detach(|| self.durable.complete(&id, completion, value, key));
        promise_tuple(py, to_py(completed.map_err(AskError::from))?.promise)
    }

    /// Completes `target` (an asyncio future of `driver`'s loop) with the
    /// promise once it is settled, or with `None` after `timeout` seconds.
    /// The wait runs on the runtime, off the loop: a completion through this
    /// store (or a durable ask on it) wakes it at once, and it looks at the
    /// store every `poll` seconds for completions made elsewhere.
    #[pyo3(signature = (driver, target, id, timeout=None, poll=0.01))]
    fn wait(
        &self,
        py: Python<'_>,
        driver: &LoopDriver,
        target: Py<PyAny>,
        id: String,
        timeout: Option<f64>,
        poll: f64,
    ) -> PyResult<NativeWait> {
        let timeout = to_py(timeout.map(|t| seconds("timeout", t)).transpose())?;
        let mut durable = self.durable.clone();
        durable.poll = to_py(seconds("poll", poll))?.max(Duration::from_millis(1));
        let counted = WaitCount::enter(&self.waits);
        let wait = async move {
            let _counted = counted;
            let settled = durable.wait(&id);
            match timeout {
                None => Some(settled.await),
                Some(timeout) => tokio::time::timeout(timeout, settled).await.ok(),
            }
        };
        let wait = AbortOnDrop(crate::runtime().spawn(wait));
        let task = driver.eager(py, || {
            FutureTask::spawn(&driver.shared, wait, target, waited)
        });
        Ok(NativeWait { task })
    }

    /// Waits in flight (for tests).
    fn _waits(&self) -> usize {
        self.waits.load(Ordering::Relaxed)
    }

    /// Deletes the promises settled more than `older_than` seconds ago,
    /// after timing out the expired pending ones; returns how many.
    fn prune(&self, py: Python<'_>, older_than: f64) -> PyResult<usize> {
        let older_than = to_py(seconds("older_than", older_than))?;
        let pruned = py.detach(|| self.durable.prune(older_than));
        to_py(pruned.map_err(AskError::from))
    }
}
