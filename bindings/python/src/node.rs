//! `NativeNode`: a core [`Node`] of Python objects.

use std::sync::Arc;
use std::time::Duration;

use askpool::{
    AskError, AskHandle, AskIds, CausationId, CorrelationId, Node, NodeConfig, PayloadFingerprint,
    PoolName, Replay, RequestId, TellHandle, WorkerId,
};
use parking_lot::Mutex;
use pyo3::intern;
use pyo3::prelude::*;
use pyo3::types::{PyByteArray, PyBytes, PyMemoryView, PyString, PyTuple};

use crate::driver::LoopDriver;
use crate::errors::{self, to_py};
use crate::obj::Obj;
use crate::pool::NativePool;
use crate::promises::NativePromises;
use crate::stages::StageReader;
use crate::task::FutureTask;
use askpool_promises::{DurableAsk, DurableHandle};

/// How often a blocked `ask_sync` looks at the thread's signals.
const SIGNAL_CHECK: Duration = Duration::from_millis(50);

type Handle = AskHandle<Obj, Obj>;

/// `value` seconds as a duration: negative, NaN, infinite and too large
/// (past `Duration::MAX`, about 5.8e11 years) are `InvalidArgument`.
pub(crate) fn seconds(what: &str, value: f64) -> Result<Duration, AskError> {
    Duration::try_from_secs_f64(value).map_err(|_| AskError::InvalidArgument {
        message: if value.is_finite() && value >= 0.0 {
            format!(
                "{what} of {value} seconds is too long (at most {} seconds)",
                Duration::MAX.as_secs()
            )
        } else {
            format!("{what} must be a finite number of seconds >= 0, not {value}")
        },
    })
}

fn parse<T: std::str::FromStr>(what: &str, text: &str) -> Result<T, AskError> {
    text.parse().map_err(|_| AskError::InvalidArgument {
        message: format!("{what} must be 32 hex digits, not {text:?}"),
    })
}

/// The rarely given options of an ask, as the wrapper's `_ask_args` passes
/// them: `(preferred_worker, request_id, correlation_id, causation_id,
/// fingerprint)`, or `None` for none at all.
type AskOptions = (
    Option<String>,
    Option<String>,
    Option<String>,
    Option<String>,
    Option<u128>,
);

#[pyclass(frozen, module = "askpool._native")]
pub(crate) struct NativeNode {
    node: Node<Obj, Obj>,
    /// The pool name of the last ask, keyed by the very `str` object: a
    /// caller asking one pool again and again passes the same object, and
    /// reusing its name saves a UTF-8 copy and an allocation per ask. Holding
    /// the object keeps its address from being reused by another.
    last_pool: Mutex<Option<(Py<PyString>, PoolName)>>,
    /// `crate::forks()` when it was made.
    forks: u64,
}

impl NativeNode {
    /// Refuses work in a child process of a fork made after this node: its
    /// timers ran on the parent's runtime, whose threads the child lacks,
    /// so an ask would never time out there.
    fn check_process(&self, py: Python<'_>) -> PyResult<()> {
        if self.forks == crate::forks() {
            return Ok(());
        }
        Err(errors::exception(
            py,
            &AskError::FailedPrecondition {
                message:
                    "this Node was made before os.fork(); make a new Node in the child process"
                        .into(),
            },
        ))
    }

    fn pool_name(&self, pool: &Bound<'_, PyString>) -> PyResult<PoolName> {
        let mut last = self.last_pool.lock();
        if let Some((object, name)) = last.as_ref() {
            if object.as_ptr() == pool.as_ptr() {
                return Ok(name.clone());
            }
        }
        let Ok(text) = pool.to_cow() else {
            // A surrogate, which UTF-8 cannot carry: refused as every
            // binding refuses it, not as the conversion's UnicodeEncodeError.
            // The exception is made (Python code) with the lock released: a
            // thread switch meanwhile to another ask would wait for it
            // holding the GIL.
            drop(last);
            return Err(errors::exception(
                pool.py(),
                &AskError::InvalidArgument {
                    message: "a pool name is not valid Unicode (a lone surrogate)".into(),
                },
            ));
        };
        let name = PoolName::new(text);
        *last = Some((pool.clone().unbind(), name.clone()));
        Ok(name)
    }

    fn start(
        &self,
        pool: &Bound<'_, PyString>,
        msg: Py<PyAny>,
        timeout: Option<f64>,
        options: Option<AskOptions>,
    ) -> PyResult<Handle> {
        self.check_process(pool.py())?;
        let (preferred_worker, request_id, correlation_id, causation_id, fingerprint) =
            options.unwrap_or_default();
        let mut options = shared_options(
            pool.py(),
            &msg,
            timeout,
            request_id.as_deref(),
            correlation_id.as_deref(),
            causation_id.as_deref(),
        )?;
        options.preferred_worker = preferred_worker.map(WorkerId::from);
        if let Some(given) = fingerprint {
            options.fingerprint = Some(PayloadFingerprint::from_u128(given));
        }
        let ask = self.node.ask(self.pool_name(pool)?, Obj::new(msg));
        Ok(ask.options(options).send())
    }
}

/// The options an ask and a tell share, checked and converted. A byte
/// payload sent under a given request id is fingerprinted by its bytes (as
/// in every binding): reusing the id for other bytes is `PayloadMismatch`,
/// not the other payload's reply. A generated id cannot be reused: no digest.
fn shared_options(
    py: Python<'_>,
    msg: &Py<PyAny>,
    timeout: Option<f64>,
    request_id: Option<&str>,
    correlation_id: Option<&str>,
    causation_id: Option<&str>,
) -> PyResult<askpool::AskOptions> {
    let request_id = request_id
        .map(|id| to_py(parse::<RequestId>("request_id", id)))
        .transpose()?;
    let fingerprint = match request_id {
        Some(_) => payload_fingerprint(py, msg)?,
        None => None,
    };
    Ok(askpool::AskOptions {
        payload_size: payload_size(py, msg)?,
        fingerprint,
        timeout: timeout.map(|t| to_py(seconds("timeout", t))).transpose()?,
        request_id,
        correlation_id: correlation_id
            .map(|id| to_py(parse::<CorrelationId>("correlation_id", id)))
            .transpose()?,
        causation_id: causation_id
            .map(|id| to_py(parse::<CausationId>("causation_id", id)))
            .transpose()?,
        ..askpool::AskOptions::default()
    })
}

/// The size in bytes of a byte payload (`bytes`, `bytearray`,
/// `memoryview`): the payloads the node's `max_payload_bytes` applies to.
/// Other objects pass by reference and have no size.
fn payload_size(py: Python<'_>, msg: &Py<PyAny>) -> PyResult<Option<usize>> {
    let msg = msg.bind(py);
    if let Ok(bytes) = msg.cast::<PyBytes>() {
        return Ok(Some(bytes.as_bytes().len()));
    }
    if let Ok(array) = msg.cast::<PyByteArray>() {
        return Ok(Some(array.len()));
    }
    if msg.is_instance_of::<PyMemoryView>() {
        let size = msg
            .getattr(intern!(py, "nbytes"))
            .and_then(|n| n.extract())
            .map_err(|e| unreadable_view(py, &e))?;
        return Ok(Some(size));
    }
    Ok(None)
}

/// A `memoryview` payload that cannot be read (released): refused as bad
/// input, whether or not the ask names its request id.
fn unreadable_view(py: Python<'_>, error: &PyErr) -> PyErr {
    errors::exception(
        py,
        &AskError::InvalidArgument {
            message: format!("the payload memoryview cannot be read: {error}"),
        },
    )
}

/// The fingerprint of a byte payload's bytes; `None` for other objects.
fn payload_fingerprint(py: Python<'_>, msg: &Py<PyAny>) -> PyResult<Option<PayloadFingerprint>> {
    let msg = msg.bind(py);
    if let Ok(bytes) = msg.cast::<PyBytes>() {
        return Ok(Some(askpool_dedup::fingerprint(bytes.as_bytes())));
    }
    if let Ok(array) = msg.cast::<PyByteArray>() {
        return Ok(Some(askpool_dedup::fingerprint(&array.to_vec())));
    }
    if msg.is_instance_of::<PyMemoryView>() {
        // No buffer protocol in the stable ABI of 3.9: a copy, only for asks
        // that name their request id.
        let bytes = msg
            .call_method0(intern!(py, "tobytes"))
            .map_err(|e| unreadable_view(py, &e))?;
        let bytes = bytes.cast::<PyBytes>()?;
        return Ok(Some(askpool_dedup::fingerprint(bytes.as_bytes())));
    }
    Ok(None)
}

fn request_id_str(
    py: Python<'_>,
    result: Result<RequestId, AskError>,
) -> Result<Py<PyAny>, AskError> {
    let id = result?.to_string();
    Ok(id
        .into_pyobject(py)
        .map_err(|e| AskError::internal(e.to_string()))?
        .into_any()
        .unbind())
}

fn reply(py: Python<'_>, result: Result<Obj, AskError>) -> Result<Py<PyAny>, AskError> {
    result.map(|obj| obj.get(py))
}

fn spawn_ask(driver: &LoopDriver, handle: Handle, target: Py<PyAny>) -> NativeAsk {
    let ids = *handle.ids();
    let stages = StageReader::new(handle.stage_source());
    let task = FutureTask::spawn(&driver.shared, handle, target, reply);
    NativeAsk {
        task: Running::Ask(task),
        ids,
        stages,
    }
}

#[pymethods]
impl NativeNode {
    #[new]
    #[pyo3(signature = (default_timeout=None, dlq_capacity=None, track_stages=true,
        circuit_breaker=true, max_payload_bytes=Some(askpool::DEFAULT_MAX_PAYLOAD_BYTES)))]
    fn new(
        default_timeout: Option<f64>,
        dlq_capacity: Option<usize>,
        track_stages: bool,
        circuit_breaker: bool,
        max_payload_bytes: Option<usize>,
    ) -> PyResult<Self> {
        let mut config = NodeConfig {
            track_stages,
            max_payload_bytes,
            ..NodeConfig::default()
        };
        if !circuit_breaker {
            config.breaker = None;
        }
        if let Some(t) = default_timeout {
            config.default_timeout = to_py(seconds("default_timeout", t))?;
        }
        if let Some(n) = dlq_capacity {
            config.dlq_capacity = n;
        }
        Ok(Self {
            node: Node::with_config(config),
            last_pool: Mutex::new(None),
            forks: crate::forks(),
        })
    }

    #[getter]
    fn caller_id(&self) -> String {
        self.node.caller_id().to_string()
    }

    /// Starts an ask; `target` (an asyncio future of `driver`'s loop) gets
    /// the reply or the error.
    #[pyo3(signature = (driver, target, pool, msg, timeout=None, options=None))]
    #[allow(clippy::too_many_arguments)]
    fn ask(
        &self,
        py: Python<'_>,
        driver: &LoopDriver,
        target: Py<PyAny>,
        pool: &Bound<'_, PyString>,
        msg: Py<PyAny>,
        timeout: Option<f64>,
        options: Option<AskOptions>,
    ) -> PyResult<NativeAsk> {
        driver.eager(py, || {
            let handle = self.start(pool, msg, timeout, options)?;
            Ok(spawn_ask(driver, handle, target))
        })
    }

    /// Asks and blocks this thread (the GIL released) until the outcome.
    #[pyo3(signature = (pool, msg, timeout=None, options=None))]
    fn ask_sync(
        &self,
        py: Python<'_>,
        pool: &Bound<'_, PyString>,
        msg: Py<PyAny>,
        timeout: Option<f64>,
        options: Option<AskOptions>,
    ) -> PyResult<Py<PyAny>> {
        let mut handle = self.start(pool, msg, timeout, options)?;
        // Waits in slices, looking at the thread's signals between them: a
        // Ctrl-C (or any signal handler that raises) ends the wait with its
        // exception, and dropping the handle then cancels the ask (the pool
        // is told). One block_on for the whole wait would see no signal
        // before the ask's timeout.
        let result = loop {
            let slice = py.detach(|| {
                let slice = crate::runtime()
                    .block_on(async { tokio::time::timeout(SIGNAL_CHECK, &mut handle).await });
                if crate::must_not_return_to_python() {
                    // Taking the GIL back now could abort the process (see
                    // `_interpreter_exiting`): this thread waits for the
                    // process to end instead.
                    loop {
                        std::thread::park();
                    }
                }
                slice
            });
            match slice {
                Ok(result) => break result,
                Err(_) => py.check_signals()?,
            }
        };
        crate::obj::release_dropped(py);
        result
            .map(|obj| obj.get(py))
            .map_err(|e| errors::exception(py, &e))
    }

    /// A one-way message; `target` gets its request id once the pool
    /// accepted it.
    #[pyo3(signature = (driver, target, pool, msg, timeout=None, request_id=None,
        correlation_id=None, causation_id=None))]
    #[allow(clippy::too_many_arguments)]
    fn tell(
        &self,
        py: Python<'_>,
        driver: &LoopDriver,
        target: Py<PyAny>,
        pool: &str,
        msg: Py<PyAny>,
        timeout: Option<f64>,
        request_id: Option<&str>,
        correlation_id: Option<&str>,
        causation_id: Option<&str>,
    ) -> PyResult<()> {
        self.check_process(py)?;
        let options = shared_options(py, &msg, timeout, request_id, correlation_id, causation_id)?;
        let tell = self.node.tell(pool, Obj::new(msg)).options(options);
        let done = target.clone_ref(py);
        let task = driver.eager(py, || {
            FutureTask::spawn(&driver.shared, tell.send(), target, request_id_str)
        });
        // Cancelling the future (or the task awaiting it) before the pool
        // accepted the tell cancels the tell, as for an ask.
        task.abandon_when_done(done.bind(py))
    }

    /// Hosts a pool whose `concurrency` worker slots run on `driver`'s loop,
    /// each a `Slot` made by `new_slot()` (`_dispatch.new_slot(handler)`)
    /// that runs the handler for each request.
    #[pyo3(signature = (driver, name, new_slot, concurrency, max_in_flight=None,
        reply_cache=None, reply_ttl=None))]
    #[allow(clippy::too_many_arguments)]
    fn pool(
        &self,
        py: Python<'_>,
        driver: &LoopDriver,
        name: &str,
        new_slot: Py<PyAny>,
        concurrency: usize,
        max_in_flight: Option<usize>,
        reply_cache: Option<usize>,
        reply_ttl: Option<f64>,
    ) -> PyResult<NativePool> {
        self.check_process(py)?;
        let mut builder = self.node.pool(name).concurrency(concurrency);
        if let Some(n) = max_in_flight {
            builder = builder.max_in_flight(n);
        }
        let mut dedup = askpool::DedupConfig::default();
        if let Some(n) = reply_cache {
            dedup.max_terminal = n;
        }
        if let Some(t) = reply_ttl {
            dedup.terminal_ttl = to_py(seconds("reply_ttl", t))?;
        }
        builder = builder.dedup(dedup);
        let pool = to_py(builder.build())?;
        NativePool::start(pool, driver, concurrency, new_slot.bind(py))
    }

    /// A durable ask: a promise in `promises` (its id is the request id)
    /// records the outcome, so after a restart `await_durable(id)` gets it
    /// without running the handler again.
    #[pyo3(signature = (driver, target, promises, pool, msg, request_id=None))]
    #[allow(clippy::too_many_arguments)]
    fn ask_durable(
        &self,
        py: Python<'_>,
        driver: &LoopDriver,
        target: Py<PyAny>,
        promises: &NativePromises,
        pool: &str,
        msg: Py<PyAny>,
        request_id: Option<&str>,
    ) -> PyResult<NativeDurable> {
        self.check_process(py)?;
        let id = request_id
            .map(|id| to_py(parse::<RequestId>("request_id", id)))
            .transpose()?;
        let msg = Obj::new(msg);
        driver.eager(py, || {
            // The store may wait for another process's lock: without the GIL.
            // In the runtime, so that the ask runs there to its end even if
            // the awaiting task is cancelled (see `DurableHandle`).
            let handle = py.detach(|| {
                let _runtime = crate::runtime().enter();
                match id {
                    Some(id) => self
                        .node
                        .ask_durable_with_id(&promises.durable, id, pool, msg),
                    None => self.node.ask_durable(&promises.durable, pool, msg),
                }
            });
            spawn_durable(py, driver, to_py(handle)?, target)
        })
    }

    /// The outcome of durable ask `id`: at once if its promise settled, else
    /// asked again under the same id.
    fn await_durable(
        &self,
        py: Python<'_>,
        driver: &LoopDriver,
        target: Py<PyAny>,
        promises: &NativePromises,
        id: &str,
    ) -> PyResult<NativeDurable> {
        self.check_process(py)?;
        driver.eager(py, || {
            let handle = py.detach(|| {
                let _runtime = crate::runtime().enter();
                self.node.await_durable(&promises.durable, id)
            });
            spawn_durable(py, driver, to_py(handle)?, target)
        })
    }

    fn stats<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, pyo3::types::PyDict>> {
        crate::stats::node_dict(py, &self.node.stats())
    }

    /// `(request_id, correlation_id, pool, payload, error, attempts, reason,
    /// kind)` for every dead letter, oldest first.
    fn dead_letters<'py>(&self, py: Python<'py>) -> PyResult<Vec<Bound<'py, PyTuple>>> {
        self.node
            .dead_letters()
            .into_iter()
            .map(|l| {
                let reason = l.reason.as_str();
                PyTuple::new(
                    py,
                    [
                        l.ids.request_id.to_string().into_pyobject(py)?.into_any(),
                        l.ids
                            .correlation_id
                            .to_string()
                            .into_pyobject(py)?
                            .into_any(),
                        l.pool.to_string().into_pyobject(py)?.into_any(),
                        l.payload.get(py).into_bound(py),
                        errors::exception(py, &l.error)
                            .into_value(py)
                            .into_bound(py)
                            .into_any(),
                        l.attempts.into_pyobject(py)?.into_any(),
                        reason.into_pyobject(py)?.into_any(),
                        l.kind.as_str().into_pyobject(py)?.into_any(),
                    ],
                )
            })
            .collect()
    }

    /// Takes a dead letter out and sends it again with its request id, as
    /// what it was: an ask's `target` gets the reply, a tell's its request
    /// id once its pool accepted it (and it has no stages).
    fn replay_dead_letter(
        &self,
        py: Python<'_>,
        driver: &LoopDriver,
        target: Py<PyAny>,
        request_id: &str,
    ) -> PyResult<NativeAsk> {
        self.check_process(py)?;
        let id = to_py(parse::<RequestId>("request_id", request_id))?;
        driver.eager(py, || {
            match to_py(self.node.replay_dead_letter_as_sent(id))? {
                Replay::Ask(handle) => Ok(spawn_ask(driver, handle, target)),
                Replay::Tell(handle) => Ok(NativeAsk {
                    ids: *handle.ids(),
                    task: Running::Tell(FutureTask::spawn(
                        &driver.shared,
                        handle,
                        target,
                        request_id_str,
                    )),
                    stages: StageReader::empty(),
                }),
            }
        })
    }

    fn purge_dead_letters(&self) -> usize {
        self.node.purge_dead_letters()
    }

    /// Pending asks fail with `UnavailableError`, pools stop. Idempotent.
    fn shutdown(&self, py: Python<'_>) {
        self.node.shutdown();
        // What the close let go of (payloads of the asks and requests it
        // cancelled) goes now: no loop may run a driver again.
        crate::obj::release_dropped(py);
    }

    #[getter]
    fn closed(&self) -> bool {
        self.node.is_closed()
    }
}

/// What a [`NativeAsk`] drives: an ask, or the replay of a dead tell.
enum Running {
    Ask(Arc<FutureTask<Handle>>),
    Tell(Arc<FutureTask<TellHandle<Obj, Obj>>>),
}

/// An ask in flight.
#[pyclass(frozen, module = "askpool._native")]
pub(crate) struct NativeAsk {
    task: Running,
    ids: AskIds,
    /// Empty for a dead tell's replay: a tell's stages end at its
    /// acceptance, with no terminal one, so a stream of them never ends.
    stages: StageReader,
}

/// A durable ask in flight: its promise id and its asks' stages (the
/// outcome goes to the asyncio future it was started with).
#[pyclass(frozen, module = "askpool._native")]
pub(crate) struct NativeDurable {
    #[pyo3(get)]
    id: String,
    stages: StageReader,
}

fn spawn_durable(
    py: Python<'_>,
    driver: &LoopDriver,
    handle: DurableHandle<Obj>,
    target: Py<PyAny>,
) -> PyResult<NativeDurable> {
    let id = handle.id().to_owned();
    let stages = StageReader::new(handle.stage_source());
    let done = target.clone_ref(py);
    let task = FutureTask::spawn(&driver.shared, handle, target, reply);
    // A caller that stops waiting (a cancelled task, a timeout around the
    // handle) drops the handle: the ask itself goes on, detached in the
    // core; an await of an id being asked elsewhere stops polling the store.
    task.abandon_when_done(done.bind(py))?;
    Ok(NativeDurable { id, stages })
}

#[pymethods]
impl NativeDurable {
    /// As `NativeAsk.next_stage`, for the asks the durable ask makes.
    fn next_stage(&self, py: Python<'_>, driver: &LoopDriver, target: Py<PyAny>) {
        self.stages.next(py, driver, target);
    }
}

#[pymethods]
impl NativeAsk {
    #[getter]
    fn request_id(&self) -> String {
        self.ids.request_id.to_string()
    }
    #[getter]
    fn correlation_id(&self) -> String {
        self.ids.correlation_id.to_string()
    }
    /// Cancels the ask: a protocol cancel goes to the pool. The asyncio
    /// future is left to the caller (it is being cancelled).
    fn cancel(&self) {
        match &self.task {
            Running::Ask(task) => task.abandon().map(|mut h| h.cancel()),
            Running::Tell(task) => task.abandon().map(|mut h| h.cancel()),
        };
    }
    /// Completes `target` with the next stage event as
    /// `(stage, since_sent, since_previous, fraction, note)`, or `None` after
    /// the terminal one.
    fn next_stage(&self, py: Python<'_>, driver: &LoopDriver, target: Py<PyAny>) {
        self.stages.next(py, driver, target);
    }
}
