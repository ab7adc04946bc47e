//! Durable promises (`askpool-promises`) for Python: a store (SQLite file or
//! memory) with create / get / resolve / reject / cancel, and the payload
//! encoding of durable asks.
//!
//! A durable ask's message and reply outlive the process, so unlike an
//! in-process ask they are serialized: with `pickle`, Python's own idiom.

use std::collections::BTreeMap;
use std::time::Duration;

use askpool::AskError;
use askpool_promises::{
    now_millis, CompleteRequest, Completion, CreateRequest, Durable, DurablePromises, MemoryStore,
    Promise, SqliteStore,
};
use pyo3::intern;
use pyo3::prelude::*;
use pyo3::types::{PyBytes, PyTuple};

use crate::errors::to_py;
use crate::obj::Obj;

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
            pickle(py)
                .and_then(|p| p.call_method1(intern!(py, "loads"), (PyBytes::new(py, bytes),)))
                .map(|o| Obj::new(o.unbind()))
                .map_err(|e| format!("cannot unpickle a durable value: {e}"))
        })
    }
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

/// `seconds` as a duration: negative, NaN and infinite are `InvalidArgument`.
fn duration(what: &str, seconds: f64) -> Result<Duration, AskError> {
    Duration::try_from_secs_f64(seconds).map_err(|_| AskError::InvalidArgument {
        message: format!("{what} must be a finite number of seconds >= 0, not {seconds}"),
    })
}

fn millis(what: &str, seconds: f64) -> Result<u64, AskError> {
    duration(what, seconds).map(|d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
}

/// A promise store. Every call that touches it releases the GIL: SQLite may
/// wait for another process's lock.
#[pyclass(frozen, module = "askpool._native")]
pub(crate) struct NativePromises {
    pub(crate) durable: DurablePromises,
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
        durable.timeout = Duration::from_millis(to_py(millis("durable_timeout", durable_timeout))?);
        Ok(Self { durable })
    }

    /// A store in memory (for tests: it dies with the process).
    #[staticmethod]
    fn memory() -> Self {
        Self {
            durable: DurablePromises::new(MemoryStore::new()),
        }
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
        let mut req = CompleteRequest::new(id, completion).value(value);
        if let Some(key) = key {
            req = req.key(key);
        }
        let store = self.durable.store();
        let completed = py.detach(|| store.complete(&req, now_millis()));
        promise_tuple(py, to_py(completed.map_err(AskError::from))?.promise)
    }

    /// Deletes the promises settled more than `older_than` seconds ago,
    /// after timing out the expired pending ones; returns how many.
    fn prune(&self, py: Python<'_>, older_than: f64) -> PyResult<usize> {
        let older_than = to_py(duration("older_than", older_than))?;
        let pruned = py.detach(|| self.durable.prune(older_than));
        to_py(pruned.map_err(AskError::from))
    }
}
