//! [`Core`]: one askpool node, the futures it drives on the JS thread, and
//! [`Core::drain`], which polls the woken ones and reports what finished.

use std::collections::HashMap;
use std::future::Future;
use std::panic::AssertUnwindSafe;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll, Waker};
use std::time::Duration;

use askpool::{
    AskError, AskHandle, BreakerConfig, Node, NodeConfig, PoolName, Request, RequestContext,
    Responder, StageEvent, StageStream, TellHandle, Worker, WorkerPool,
};
use futures::Stream;
use napi::bindgen_prelude::*;
use napi_derive::napi;
use tokio::runtime::{Handle, Runtime};

use askpool_promises::{DurableHandle, DurablePromises};

use crate::errors::{self, ErrorInfo};
use crate::info::{self, NodeOptions, StageInfo, StatsInfo};
use crate::slots::Slots;
use crate::tok::{FreeList, Tok};
use crate::wake::{Shared, TaskWaker, WakeFn};

/// Most pool names a node gives references to (see `Core::pool_ref`).
const MAX_POOL_REFS: usize = 1_024;
/// The reference of a name that got none of its own, valid until the next
/// `pool_ref` call (the wrapper asks right after it).
const SCRATCH_REF: u32 = u32::MAX;

/// Event kinds written by `drain`, four words each: `[kind, a, b, c]`.
pub mod event {
    /// `a` = object slot no longer referenced by Rust.
    pub const FREE: u32 = 0;
    /// `a` = task, `b` = reply slot.
    pub const ASK_OK: u32 = 1;
    /// `a` = task, `b` = index for `Core.error`.
    pub const ASK_ERR: u32 = 2;
    /// `a` = task.
    pub const TELL_OK: u32 = 3;
    /// `a` = request, `b` = message slot, `c` = pool.
    pub const REQUEST: u32 = 4;
    /// `a` = stream, `b` = index for `Core.stage`.
    pub const STAGE: u32 = 5;
    /// `a` = stream.
    pub const STAGE_END: u32 = 6;
    /// `a` = request whose cancellation was watched.
    pub const CANCELLED: u32 = 7;
    /// A request whose message exists only as bytes (a durable ask resumed
    /// from its store): `a` = request, `b` = index for `Core.bytes`,
    /// `c` = pool | `DURABLE`.
    pub const REQUEST_BYTES: u32 = 8;
    /// `a` = task, `b` = index for `Core.bytes`: a reply read from a store.
    pub const ASK_OK_BYTES: u32 = 9;
    /// Set in a request's `c` when its reply must carry bytes (`replyBytes`).
    pub const DURABLE: u32 = 1 << 31;
}

pub(crate) type JsNode = Node<Tok, Tok>;
type PullFuture = Pin<Box<dyn Future<Output = (Worker<Tok, Tok>, Option<Request<Tok, Tok>>)>>>;

pub(crate) enum Task {
    Ask(AskHandle<Tok, Tok>),
    Tell(TellHandle<Tok, Tok>),
    /// A tell its caller cancelled: its outcome, reported at the next drain.
    TellEnded(std::result::Result<(), AskError>),
    Durable(DurableHandle<Tok>),
    /// A worker waiting for its next request.
    Pull {
        pool: u32,
        fut: PullFuture,
    },
    /// One read of a stage stream.
    Stage {
        stream: u32,
    },
    /// Fires when a request being handled is cancelled.
    CancelWatch {
        request: u32,
        fut: Pin<Box<dyn Future<Output = ()>>>,
    },
}

struct TaskSlot {
    task: Task,
    state: Arc<TaskWaker>,
    waker: Waker,
}

/// A request a JS handler is working on.
pub(crate) struct Handling {
    pub responder: Responder<Tok, Tok>,
    pub context: RequestContext,
    pub worker: Worker<Tok, Tok>,
    pub pool: u32,
    pub watch: Option<u32>,
}

pub(crate) struct HostedPool {
    pub pool: WorkerPool<Tok, Tok>,
    pub concurrency: u32,
    pub handled: bool,
}

/// An open stage stream, and the task reading its next stage, if any.
pub(crate) struct OpenStream {
    pub stream: StageStream<Tok>,
    pub reader: Option<u32>,
}

/// Stage streams under ids that are not reused: an id names one stream for
/// the node's life (until 2^32 streams wrap it around, skipping the open
/// ones). The wrapper may still hear of a stream it dropped (the end of a
/// read that was pending); a reused id would hand that end, or the stages
/// of the stream now under the id, to the wrong reader.
#[derive(Default)]
pub(crate) struct Streams {
    open: HashMap<u32, OpenStream>,
    next: u32,
}

impl Streams {
    pub fn insert(&mut self, stream: StageStream<Tok>) -> u32 {
        while self.open.contains_key(&self.next) {
            self.next = self.next.wrapping_add(1);
        }
        let id = self.next;
        self.next = id.wrapping_add(1);
        self.open.insert(
            id,
            OpenStream {
                stream,
                reader: None,
            },
        );
        id
    }

    pub fn get_mut(&mut self, id: u32) -> Option<&mut OpenStream> {
        self.open.get_mut(&id)
    }

    pub fn remove(&mut self, id: u32) -> Option<OpenStream> {
        self.open.remove(&id)
    }

    pub fn len(&self) -> usize {
        self.open.len()
    }
}

/// The tokio runtime of every node in the process: it runs their timers
/// (timeouts, retries, processing deadlines, the deadline sweepers) and the
/// few tasks the core spawns (ack flushes, durable asks recording their
/// outcome); asks, pulls and stage streams are polled on the JS thread.
///
/// Shared rather than one per node: a runtime per node kept an OS thread
/// per node until the node was collected, closed or not (3,000 closed nodes
/// still referenced held 3,000 threads, a container's limit), and made
/// every `new Node()` start a thread (110 to 160 µs a node, measured
/// creating 1,000; 15 to 30 µs on the shared one).
/// Shutting a node's own runtime down at `close()` was the other way out,
/// but its timers and tasks may still be touched after the close (an ask
/// polled once more, a durable ask recording its outcome, a timer dropped
/// later), and a tokio timer polled after its runtime shut down panics.
/// A runtime that lives as long as the process has no such edge: nothing a
/// node made on it outlives it. Its threads are a fixed number whatever
/// the number of nodes (or of worker_threads loading the addon), and they
/// never keep the process alive: Node exits without joining them.
/// Two workers, not one: a durable ask writes its SQLite store on this
/// runtime, and a write waiting on another process's lock (up to the busy
/// timeout) must not hold every node's timers; with two, the other worker
/// keeps driving them.
static RUNTIME: std::sync::OnceLock<std::result::Result<Runtime, String>> =
    std::sync::OnceLock::new();

/// The shared runtime's handle (built on first use).
fn runtime() -> Result<Handle> {
    RUNTIME
        .get_or_init(|| {
            tokio::runtime::Builder::new_multi_thread()
                .worker_threads(2)
                .thread_name("askpool-node")
                .enable_time()
                .build()
                .map_err(|e| e.to_string())
        })
        .as_ref()
        .map(|rt| rt.handle().clone())
        .map_err(|e| errors::throw(AskError::internal(format!("tokio runtime: {e}"))))
}

/// One askpool node with objects passed by reference to the JS table.
#[napi(custom_finalize)]
pub struct Core {
    /// The shared [`RUNTIME`], entered around every call into the core.
    pub(crate) rt: Handle,
    pub(crate) node: JsNode,
    pub(crate) shared: Arc<Shared>,
    pub(crate) freed: Arc<FreeList>,
    tasks: Slots<TaskSlot>,
    pub(crate) requests: Slots<Handling>,
    pub(crate) streams: Streams,
    pub(crate) pools: Slots<HostedPool>,
    pool_names: Vec<PoolName>,
    pool_refs: HashMap<String, u32>,
    /// The name [`SCRATCH_REF`] stands for (see `pool_ref`).
    scratch_name: Option<PoolName>,
    /// Objects referenced by the last drain's events, kept until the next.
    held: Vec<Tok>,
    errors: Vec<AskError>,
    stages: Vec<StageEvent>,
    bytes: Vec<Vec<u8>>,
    /// The store of durable asks and promises, once opened.
    pub(crate) promises: Option<DurablePromises>,
    batch: Vec<u32>,
    freed_scratch: Vec<u32>,
    /// This core's entry in the fast-path registry (see `fast`).
    pub(crate) fast_id: Option<u32>,
    /// Closed with tasks still running (durable asks finish on the runtime's
    /// threads): the threadsafe function stays until they are drained, or
    /// their last wake-ups would be lost and their promises never settle.
    release_when_idle: bool,
    /// Native bytes reported to V8 as held by this object (its pools' reply
    /// caches, allocated up front): a node dropped without `close()` is
    /// otherwise collected only once the JS heap grows, and thousands of
    /// them, a megabyte each that V8 cannot see, came first.
    pub(crate) external_bytes: i64,
}

impl ObjectFinalize for Core {
    fn finalize(self, env: Env) -> Result<()> {
        if self.external_bytes > 0 {
            env.adjust_external_memory(-self.external_bytes)?;
        }
        Ok(())
    }
}

/// The longest duration accepted, in ms: `Number.MAX_SAFE_INTEGER`.
const MAX_MILLIS: f64 = 9_007_199_254_740_991.0;

/// A number as JS prints it (`NaN`, `Infinity`, `-1`, `1.5`).
pub(crate) fn js_number(value: f64) -> String {
    match value {
        v if v.is_nan() => "NaN".to_owned(),
        // -0 too, as JS prints it.
        0.0 => "0".to_owned(),
        f64::INFINITY => "Infinity".to_owned(),
        f64::NEG_INFINITY => "-Infinity".to_owned(),
        // Where JS switches to exponent notation, with its `e+` for a
        // positive exponent (Rust's Display would print every digit).
        v if v.abs() >= 1e21 || v.abs() < 1e-6 => {
            let text = format!("{v:e}");
            match text.split_once('e') {
                Some((mantissa, exp)) if !exp.starts_with('-') => format!("{mantissa}e+{exp}"),
                _ => text,
            }
        }
        v => v.to_string(),
    }
}

fn millis(what: &str, ms: f64) -> Result<Duration> {
    if (0.0..=MAX_MILLIS).contains(&ms) {
        Ok(Duration::from_secs_f64(ms / 1e3))
    } else {
        Err(errors::invalid(format!(
            "{what} must be a number of milliseconds from 0 to 2^53 - 1, got {}",
            js_number(ms)
        )))
    }
}

/// A count from JS (a pool's concurrency, a capacity, ...): an integer in
/// `min..=max`, checked before any conversion could wrap it around.
pub(crate) fn whole(what: &str, value: f64, min: u32, max: u32) -> Result<u32> {
    if value.fract() == 0.0 && (f64::from(min)..=f64::from(max)).contains(&value) {
        Ok(value as u32)
    } else {
        Err(errors::invalid(format!(
            "{what} must be an integer from {min} to {max}, got {}",
            js_number(value)
        )))
    }
}

/// A number of bytes from JS: an integer from 0 to 2^53 - 1 (the largest
/// whole number a JS number holds exactly), checked before any conversion.
pub(crate) fn byte_count(what: &str, value: f64) -> Result<usize> {
    if value.fract() == 0.0 && (0.0..=MAX_MILLIS).contains(&value) {
        usize::try_from(value as u64).map_err(|_| {
            errors::invalid(format!(
                "{what} must be at most {} bytes on this platform, got {}",
                usize::MAX,
                js_number(value)
            ))
        })
    } else {
        Err(errors::invalid(format!(
            "{what} must be an integer number of bytes from 0 to 2^53 - 1, got {}",
            js_number(value)
        )))
    }
}

pub(crate) fn opt_millis(what: &str, ms: Option<f64>) -> Result<Option<Duration>> {
    ms.map(|ms| millis(what, ms)).transpose()
}

/// A timeout an ask must be able to run in (`timeoutMs`,
/// `defaultTimeoutMs`, `processingTimeoutMs`): above 0, which the core refuses (it could not make
/// one attempt). Checked here so that the message names the JS option and
/// says what is accepted, as for the other durations, not the core's
/// "must be positive" under its Rust field name.
pub(crate) fn opt_timeout(what: &str, ms: Option<f64>) -> Result<Option<Duration>> {
    ms.map(|ms| {
        if ms > 0.0 && ms <= MAX_MILLIS {
            // Under a nanosecond: one, not the zero the core would refuse.
            Ok(Duration::from_secs_f64(ms / 1e3).max(Duration::from_nanos(1)))
        } else {
            Err(errors::invalid(format!(
                "{what} must be a number of milliseconds above 0 and at most 2^53 - 1, got {}",
                js_number(ms)
            )))
        }
    })
    .transpose()
}

struct Out<'a> {
    buf: &'a mut [u32],
    n: usize,
}

impl Out<'_> {
    fn full(&self) -> bool {
        (self.n + 1) * 4 > self.buf.len()
    }
    fn push(&mut self, kind: u32, a: u32, b: u32, c: u32) {
        self.buf[self.n * 4..self.n * 4 + 4].copy_from_slice(&[kind, a, b, c]);
        self.n += 1;
    }
}

#[napi]
impl Core {
    /// `wake` is called (from any thread) when a future woke off the JS
    /// thread; the wrapper then calls `drain`.
    #[napi(constructor, catch_unwind)]
    pub fn new(wake: WakeFn, options: Option<NodeOptions>) -> Result<Self> {
        let o = options.unwrap_or(NodeOptions {
            default_timeout_ms: None,
            dlq_capacity: None,
            track_stages: None,
            breaker: None,
            reconcile_capacity: None,
            processing_timeout_ms: None,
            max_payload_bytes: None,
        });
        let mut config = NodeConfig::default();
        if let Some(t) = opt_timeout("defaultTimeoutMs", o.default_timeout_ms)? {
            config.default_timeout = t;
        }
        if let Some(n) = o.dlq_capacity {
            config.dlq_capacity = whole("dlqCapacity", n, 0, u32::MAX)? as usize;
        }
        if let Some(track) = o.track_stages {
            config.track_stages = track;
        }
        if o.breaker == Some(false) {
            config.breaker = None;
        } else {
            config.breaker = Some(BreakerConfig::default());
        }
        if let Some(n) = o.reconcile_capacity {
            config.reconcile_capacity = whole("reconcileCapacity", n, 0, u32::MAX)? as usize;
        }
        if let Some(t) = opt_timeout("processingTimeoutMs", o.processing_timeout_ms)? {
            config.timeouts.processing = Some(t);
        }
        match o.max_payload_bytes {
            None => {}
            Some(Either::A(n)) => {
                config.max_payload_bytes = Some(byte_count("maxPayloadBytes", n)?)
            }
            Some(Either::B(Null)) => config.max_payload_bytes = None,
        }
        let rt = runtime()?;
        let node = {
            let _enter = rt.enter();
            Node::try_with_transport(Arc::new(askpool::InProcessTransport::new()), config)
                .map_err(errors::throw)?
        };
        let shared = Arc::new(Shared::new(wake));
        Ok(Self {
            rt,
            node,
            freed: Arc::new(FreeList::new(Arc::clone(&shared))),
            shared,
            tasks: Slots::default(),
            requests: Slots::default(),
            streams: Streams::default(),
            pools: Slots::default(),
            pool_names: Vec::new(),
            pool_refs: HashMap::new(),
            scratch_name: None,
            held: Vec::new(),
            errors: Vec::new(),
            stages: Vec::new(),
            bytes: Vec::new(),
            promises: None,
            batch: Vec::new(),
            freed_scratch: Vec::new(),
            fast_id: None,
            release_when_idle: false,
            external_bytes: 0,
        })
    }

    /// A small number standing for a pool name, so asks pass no string.
    /// Names are kept for the node's life, so past [`MAX_POOL_REFS`] names
    /// (or for a name no pool can have) the name gets [`SCRATCH_REF`]: it
    /// stands for this name until the next call, and the wrapper, which
    /// asks right after, does not keep it.
    #[napi(catch_unwind)]
    pub fn pool_ref(&mut self, name: String) -> u32 {
        if let Some(&r) = self.pool_refs.get(&name) {
            return r;
        }
        let pool = PoolName::new(&name);
        if self.pool_names.len() >= MAX_POOL_REFS || pool.validate().is_err() {
            self.scratch_name = Some(pool);
            return SCRATCH_REF;
        }
        let r = self.pool_names.len() as u32;
        self.pool_names.push(pool);
        self.pool_refs.insert(name, r);
        r
    }

    /// Polls the woken futures and writes what happened into `buf` (four
    /// words per event, see `event`); returns the number of events. The
    /// wrapper calls it until it returns 0.
    #[napi(catch_unwind)]
    pub fn drain(&mut self, mut buf: Uint32ArraySlice) -> u32 {
        // SAFETY: the JS thread is inside this call, so nothing else touches
        // the array while the slice lives.
        self.drain_into(unsafe { buf.as_mut() })
    }

    /// The error of an `ASK_ERR` event of the last drain.
    #[napi(catch_unwind)]
    pub fn error(&self, index: u32) -> Result<ErrorInfo> {
        self.errors
            .get(index as usize)
            .map(ErrorInfo::from)
            .ok_or_else(|| errors::invalid("no such error in the last drain"))
    }

    /// The bytes of a `REQUEST_BYTES` or `ASK_OK_BYTES` event of the last drain.
    #[napi(catch_unwind)]
    pub fn bytes(&self, index: u32) -> Result<Buffer> {
        self.bytes
            .get(index as usize)
            .map(|b| Buffer::from(b.clone()))
            .ok_or_else(|| errors::invalid("no such bytes in the last drain"))
    }

    /// The stage of a `STAGE` event of the last drain.
    #[napi(catch_unwind)]
    pub fn stage(&self, index: u32) -> Result<StageInfo> {
        self.stages
            .get(index as usize)
            .map(StageInfo::from)
            .ok_or_else(|| errors::invalid("no such stage in the last drain"))
    }

    /// This node's caller id (requests are deduplicated per caller id and
    /// request id).
    #[napi(catch_unwind)]
    pub fn caller_id(&self) -> String {
        self.node.caller_id().to_string()
    }

    #[napi(catch_unwind)]
    pub fn stats(&self) -> StatsInfo {
        info::stats(
            self.node.stats(),
            self.tasks.len(),
            self.requests.len(),
            self.streams.len(),
            self.shared.thread_wakes.load(Ordering::Relaxed),
        )
    }

    /// Drops reply-cache entries whose TTL passed, in every pool.
    #[napi(catch_unwind)]
    pub fn evict_expired(&self) {
        self.node.evict_expired();
    }

    /// Shuts the node down: pending asks fail with `UNAVAILABLE`, pools
    /// close, and the threadsafe function is released. The wrapper drains
    /// once more afterwards to settle everything.
    #[napi(catch_unwind)]
    pub fn close(&mut self) {
        let _enter = self.rt.enter();
        self.node.shutdown();
        self.pools.clear();
        // Every call on the store is refused from now on: its file is let
        // go now, not when this object is collected (a closed node kept
        // the file and its -wal and -shm open for as long as it was held).
        self.promises = None;
        // Requests still with a handler: their answers will not be sent (the
        // wrapper drops them once closed); dropping the responders cancels
        // them now.
        self.requests.clear();
        if self.tasks.len() == 0 {
            self.shared.release();
        } else {
            self.release_when_idle = true;
        }
    }

    /// Panics, so tests can show a panic reaches JS as an error.
    #[napi(catch_unwind)]
    pub fn debug_panic(&self) {
        panic!("debug_panic called: a test of the panic boundary");
    }

    #[napi(catch_unwind)]
    pub fn is_closed(&self) -> bool {
        self.node.is_closed()
    }
}

/// Test hook: the next ask task polled (by any core) panics.
static PANIC_NEXT_ASK: AtomicBool = AtomicBool::new(false);

/// Makes the next poll of an ask panic, so tests can show that a panic
/// fails that ask alone (with `INTERNAL`) and the node carries on.
#[napi(catch_unwind)]
pub fn debug_panic_next_ask() {
    PANIC_NEXT_ASK.store(true, Ordering::Relaxed);
}

/// A panic caught while polling a task, as the taxonomy's `Internal`.
pub(crate) fn panic_error(panic: &(dyn std::any::Any + Send)) -> AskError {
    let message = panic
        .downcast_ref::<&str>()
        .map(|s| (*s).to_owned())
        .or_else(|| panic.downcast_ref::<String>().cloned())
        .unwrap_or_else(|| "unknown panic".to_owned());
    AskError::internal(format!("panic in askpool: {message}"))
}

impl Core {
    pub(crate) fn drain_into(&mut self, buf: &mut [u32]) -> u32 {
        let _enter = self.rt.enter();
        self.held.clear();
        self.errors.clear();
        self.stages.clear();
        self.bytes.clear();
        let mut out = Out { buf, n: 0 };
        self.shared.rearm();
        self.report_freed(&mut out);
        let mut batch = std::mem::take(&mut self.batch);
        while !out.full() {
            self.shared.take_ready(&mut batch);
            if batch.is_empty() {
                break;
            }
            let mut polled = 0;
            for &id in &batch {
                if out.full() {
                    break;
                }
                self.poll_guarded(id, &mut out);
                polled += 1;
            }
            if polled < batch.len() {
                self.shared.requeue(&batch[polled..]);
            }
            batch.clear();
        }
        self.batch = batch;
        if self.node.is_closed() {
            // No drain may follow a closed node's (nothing calls into it, and
            // no wake comes once its tasks are done): the objects let go of
            // while polling (the messages of the asks the close ended) and
            // those of this drain's events are reported now, after the
            // events that read them, not at a next drain that never comes.
            self.held.clear();
            self.report_freed(&mut out);
        }
        if self.release_when_idle && self.tasks.len() == 0 {
            self.release_when_idle = false;
            self.shared.release();
        }
        out.n as u32
    }

    /// Reports the objects let go of so far as FREE events, as many as
    /// `out` has room for (the rest at the next drain).
    fn report_freed(&mut self, out: &mut Out<'_>) {
        let mut freed = std::mem::take(&mut self.freed_scratch);
        self.freed.take_into(&mut freed, out.buf.len() / 4 - out.n);
        for id in freed.drain(..) {
            out.push(event::FREE, id, 0, 0);
        }
        self.freed_scratch = freed;
    }

    pub(crate) fn pool_name(&self, pool_ref: u32) -> Result<PoolName> {
        let name = if pool_ref == SCRATCH_REF {
            self.scratch_name.as_ref()
        } else {
            self.pool_names.get(pool_ref as usize)
        };
        name.cloned()
            .ok_or_else(|| errors::invalid(format!("unknown pool reference {pool_ref}")))
    }

    pub(crate) fn tok(&self, slot: u32) -> Tok {
        Tok::new(slot, &self.freed)
    }

    /// `UNAVAILABLE` once the node is closed: work started now would run on
    /// a runtime task whose outcome nothing could deliver any more.
    pub(crate) fn refuse_when_closed(&self) -> Result<()> {
        if self.node.is_closed() {
            return Err(errors::throw(AskError::node_closed()));
        }
        Ok(())
    }

    /// Starts driving `task`; it is polled at the next drain.
    pub(crate) fn spawn(&mut self, task: Task) -> u32 {
        let shared = &self.shared;
        let id = self.tasks.insert_with(|id| {
            let state = Arc::new(TaskWaker {
                id,
                queued: AtomicBool::new(false),
                shared: Arc::clone(shared),
            });
            TaskSlot {
                task,
                waker: Waker::from(Arc::clone(&state)),
                state,
            }
        });
        self.wake_task(id);
        id
    }

    pub(crate) fn wake_task(&self, id: u32) {
        if let Some(slot) = self.tasks.get(id) {
            slot.waker.wake_by_ref();
        }
    }

    pub(crate) fn task_mut(&mut self, id: u32) -> Option<&mut Task> {
        self.tasks.get_mut(id).map(|slot| &mut slot.task)
    }

    pub(crate) fn remove_task(&mut self, id: u32) {
        self.tasks.remove(id);
    }

    pub(crate) fn pull(&mut self, pool: u32, worker: Worker<Tok, Tok>) {
        let fut: PullFuture = Box::pin(async move {
            let request = worker.next_request().await;
            (worker, request)
        });
        self.spawn(Task::Pull { pool, fut });
    }

    /// Reports an ask (plain or durable) that finished.
    fn ask_polled(
        &mut self,
        out: &mut Out<'_>,
        task: u32,
        polled: Poll<std::result::Result<Tok, AskError>>,
    ) {
        let Poll::Ready(result) = polled else {
            return;
        };
        self.tasks.remove(task);
        match result {
            Ok(reply) => self.push_reply(out, task, reply),
            Err(error) => self.push_error(out, task, error),
        }
    }

    /// A reply by its slot, or by its bytes when it was read from a store.
    fn push_reply(&mut self, out: &mut Out<'_>, task: u32, reply: Tok) {
        match reply.slot() {
            Some(slot) => out.push(event::ASK_OK, task, slot, 0),
            None => {
                let index = self.bytes.len() as u32;
                self.bytes.push(reply.bytes().unwrap_or_default().to_vec());
                out.push(event::ASK_OK_BYTES, task, index, 0);
            }
        }
        self.held.push(reply);
    }

    fn push_error(&mut self, out: &mut Out<'_>, task: u32, error: AskError) {
        out.push(event::ASK_ERR, task, self.errors.len() as u32, 0);
        self.errors.push(error);
    }

    /// Polls one task; a panic ends that task alone: an ask (or tell) fails
    /// with `INTERNAL`, a stage stream ends, and the rest of the drain (the
    /// events already written, the other woken tasks) goes on.
    fn poll_guarded(&mut self, id: u32, out: &mut Out<'_>) {
        let polled = std::panic::catch_unwind(AssertUnwindSafe(|| self.poll_task(id, out)));
        let Err(panic) = polled else {
            return;
        };
        // A task still in its slot wrote no event (each writes its one event
        // after leaving its slot), so `out` has room for this one.
        let Some(slot) = self.tasks.remove(id) else {
            return;
        };
        let error = panic_error(panic.as_ref());
        let task = slot.task;
        match &task {
            Task::Ask(_) | Task::Tell(_) | Task::TellEnded(_) | Task::Durable(_) => {
                self.push_error(out, id, error);
            }
            Task::Stage { stream } => {
                self.streams.remove(*stream);
                out.push(event::STAGE_END, *stream, 0, 0);
            }
            Task::CancelWatch { request, .. } => {
                if let Some(h) = self.requests.get_mut(*request) {
                    h.watch = None;
                }
            }
            // The worker was inside the future: it leaves, and its pool goes
            // on with the others.
            Task::Pull { .. } => {}
        }
        // Dropping a future that panicked may panic again: keep that here too.
        let _ = std::panic::catch_unwind(AssertUnwindSafe(move || drop(task)));
    }

    fn poll_task(&mut self, id: u32, out: &mut Out<'_>) {
        let Some(slot) = self.tasks.get_mut(id) else {
            return;
        };
        slot.state.queued.store(false, Ordering::Release);
        let mut cx = Context::from_waker(&slot.waker);
        match &mut slot.task {
            Task::Ask(handle) => {
                if PANIC_NEXT_ASK.load(Ordering::Relaxed)
                    && PANIC_NEXT_ASK.swap(false, Ordering::Relaxed)
                {
                    panic!("debug_panic_next_ask: a test of the per-task panic boundary");
                }
                let polled = Pin::new(handle).poll(&mut cx);
                self.ask_polled(out, id, polled);
            }
            Task::Durable(handle) => {
                let polled = Pin::new(handle).poll(&mut cx);
                self.ask_polled(out, id, polled);
            }
            Task::Tell(handle) => {
                let Poll::Ready(result) = Pin::new(handle).poll(&mut cx) else {
                    return;
                };
                self.tasks.remove(id);
                match result {
                    Ok(_) => out.push(event::TELL_OK, id, 0, 0),
                    Err(error) => self.push_error(out, id, error),
                }
            }
            Task::TellEnded(outcome) => {
                let outcome = std::mem::replace(outcome, Ok(()));
                self.tasks.remove(id);
                match outcome {
                    Ok(()) => out.push(event::TELL_OK, id, 0, 0),
                    Err(error) => self.push_error(out, id, error),
                }
            }
            Task::Pull { pool, fut } => {
                let pool = *pool;
                let Poll::Ready((worker, request)) = fut.as_mut().poll(&mut cx) else {
                    return;
                };
                self.tasks.remove(id);
                // `None`: the pool closed; the worker leaves with it.
                if let Some(Request {
                    message,
                    context,
                    responder,
                }) = request
                {
                    let request = self.requests.insert_with(|_| Handling {
                        responder,
                        context,
                        worker,
                        pool,
                        watch: None,
                    });
                    let durable = if message.bytes().is_some() {
                        event::DURABLE
                    } else {
                        0
                    };
                    match message.slot() {
                        Some(slot) => out.push(event::REQUEST, request, slot, pool | durable),
                        None => {
                            let index = self.bytes.len() as u32;
                            self.bytes
                                .push(message.bytes().unwrap_or_default().to_vec());
                            out.push(event::REQUEST_BYTES, request, index, pool | durable);
                        }
                    }
                    self.held.push(message);
                }
            }
            Task::Stage { stream } => {
                let stream = *stream;
                let polled = match self.streams.get_mut(stream) {
                    Some(s) => Pin::new(&mut s.stream).poll_next(&mut cx),
                    None => Poll::Ready(None),
                };
                match polled {
                    Poll::Pending => {}
                    Poll::Ready(Some(stage)) => {
                        self.tasks.remove(id);
                        if let Some(s) = self.streams.get_mut(stream) {
                            s.reader = None;
                        }
                        out.push(event::STAGE, stream, self.stages.len() as u32, 0);
                        self.stages.push(stage);
                    }
                    Poll::Ready(None) => {
                        self.tasks.remove(id);
                        self.streams.remove(stream);
                        out.push(event::STAGE_END, stream, 0, 0);
                    }
                }
            }
            Task::CancelWatch { request, fut } => {
                let request = *request;
                if fut.as_mut().poll(&mut cx).is_pending() {
                    return;
                }
                self.tasks.remove(id);
                if let Some(h) = self.requests.get_mut(request) {
                    h.watch = None;
                }
                out.push(event::CANCELLED, request, 0, 0);
            }
        }
    }
}
