//! What a worker sees: [`Request`]s pulled from a pool, their
//! [`RequestContext`], and the [`Responder`] that completes them.
//!
//! The pull API (`next_request` / `reply` / `fail`) is what bindings build on;
//! handler pools run the same loop on tokio tasks.

use std::future::{poll_fn, Future};
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::Arc;
use std::task::Poll;

use askpool_proto::{
    AskError, AskIds, CancelReason, CorrelationId, Outcome, PoolName, Progress, RequestId, WorkerId,
};
use futures::FutureExt;
use tracing::Instrument;

use crate::cancel::CancelSignal;
use crate::pool::{Admitted, PoolShared, Work, WorkItem, WorkerQueue};
use crate::queue::{QueueSignal, WorkerWake};

/// The receiving end of a worker's own queue, and its signal (which holds
/// the worker's wake-up).
pub(crate) struct WorkerInbox<M> {
    rx: flume::Receiver<Work<M>>,
    signal: Arc<QueueSignal>,
}

/// What a handler knows about the request it runs.
#[derive(Clone)]
pub struct RequestContext {
    request: Arc<Admitted>,
    pool: Arc<dyn PoolLink>,
}

/// What a running request reaches of its pool: where its progress reports
/// go, and the signal of the pool's close.
pub(crate) trait PoolLink: Send + Sync {
    fn progress(&self, request: &Admitted, progress: Progress);
    fn closing(&self) -> &CancelSignal;
}

impl<M: Send + 'static, R: Clone + Send + 'static> PoolLink for PoolShared<M, R> {
    fn progress(&self, request: &Admitted, progress: Progress) {
        PoolShared::progress(self, request, progress);
    }
    fn closing(&self) -> &CancelSignal {
        PoolShared::closing(self)
    }
}

impl RequestContext {
    pub fn request_id(&self) -> RequestId {
        self.request.meta.ids.request_id
    }
    pub fn correlation_id(&self) -> CorrelationId {
        self.request.meta.ids.correlation_id
    }
    pub fn ids(&self) -> &AskIds {
        &self.request.meta.ids
    }
    pub fn pool(&self) -> &PoolName {
        &self.request.meta.pool
    }
    /// The attempt whose delivery admitted this request.
    pub fn attempt(&self) -> u32 {
        self.request.meta.attempt
    }
    /// Whether the request was cancelled (by its caller, a timeout, or the
    /// pool), or its pool closed (the node shut down) while it runs. Cancel
    /// does not interrupt a handler; it may check and stop early (a reply
    /// it still gives goes to its caller).
    pub fn is_cancelled(&self) -> bool {
        self.request.cancel.is_cancelled() || self.pool.closing().is_cancelled()
    }
    /// Completes when [`is_cancelled`](Self::is_cancelled) becomes true.
    pub async fn cancelled(&self) {
        tokio::select! {
            () = self.request.cancel.cancelled() => {}
            () = self.pool.closing().cancelled() => {}
        }
    }
    /// Completes when the request itself is cancelled (by its caller, a
    /// timeout, or the pool), not at its pool's close. For a binding that
    /// interrupts its handler on a cancel (Kotlin cancels its coroutine): a
    /// close does not interrupt a handler, whose reply still reaches its
    /// caller.
    pub async fn request_cancelled(&self) {
        self.request.cancel.cancelled().await
    }
    /// Reports partial progress to the caller (an `AskProgress` frame).
    /// See [`report`](Self::report) for what is refused.
    pub fn progress(&self, fraction: f32, note: impl Into<String>) -> Result<(), AskError> {
        self.report(Progress::new(fraction, note))
    }

    /// Reports progress with metadata:
    /// `ctx.report(Progress::new(0.45, "2300/5000").with("shard", "7"))?`.
    /// The fraction is clamped to 0..1. Refused with `InvalidArgument`, and
    /// not reported: a NaN fraction (it says nothing), and a report past
    /// [`Progress::MAX_BYTES`] of note and metadata or
    /// [`Progress::MAX_METADATA`] entries (the caller keeps the newest
    /// reports of every ask it waits on).
    pub fn report(&self, mut progress: Progress) -> Result<(), AskError> {
        if progress.fraction.is_nan() {
            return Err(AskError::InvalidArgument {
                message: "progress must be a fraction from 0 to 1, not NaN".into(),
            });
        }
        progress.check_bounds()?;
        progress.fraction = progress.fraction.clamp(0.0, 1.0);
        self.pool.progress(&self.request, progress);
        Ok(())
    }
}

impl std::fmt::Debug for RequestContext {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RequestContext")
            .field("meta", &self.request.meta)
            .field("cancelled", &self.is_cancelled())
            .finish()
    }
}

/// Completes one admitted request exactly once. Dropping it unanswered fails
/// the request (`Internal`), or cancels it if the pool is shutting down, so
/// nothing stays in flight.
pub struct Responder<M: Send + 'static, R: Clone + Send + 'static> {
    pool: Arc<PoolShared<M, R>>,
    request: Arc<Admitted>,
    done: bool,
}

impl<M: Send + 'static, R: Clone + Send + 'static> Responder<M, R> {
    /// Sends the reply (and caches it for duplicates).
    pub fn reply(self, reply: R) {
        self.complete(Ok(reply));
    }
    /// Fails the request; the error is cached and replayed like a reply.
    pub fn fail(self, error: AskError) {
        self.complete(Err(error));
    }
    /// Cancels the request from the worker side: the caller gets `AskCancelled`.
    pub fn cancel(mut self) {
        self.done = true;
        self.pool
            .cancel_running(&self.request, CancelReason::Worker);
    }
    pub fn complete(mut self, outcome: Outcome<R>) {
        self.done = true;
        self.pool.finish(&self.request, outcome);
    }
}

impl<M: Send + 'static, R: Clone + Send + 'static> Drop for Responder<M, R> {
    fn drop(&mut self) {
        if self.done {
            return;
        }
        if self.pool.is_closed() {
            self.pool
                .cancel_running(&self.request, CancelReason::Shutdown);
        } else {
            self.pool.finish(
                &self.request,
                Err(AskError::internal("request dropped without a reply")),
            );
        }
    }
}

/// One admitted request, pulled by a worker.
pub struct Request<M: Send + 'static, R: Clone + Send + 'static> {
    pub message: M,
    pub context: RequestContext,
    pub responder: Responder<M, R>,
}

impl<M: Send + 'static, R: Clone + Send + 'static> Request<M, R> {
    fn new(pool: &Arc<PoolShared<M, R>>, item: WorkItem<M>) -> Self {
        pool.counters.handler_runs.add(1);
        // READ is a stage report, best effort: a transport (or telemetry)
        // that panics sending it must not lose the request it reports.
        let request = &item.request;
        if catch_unwind(AssertUnwindSafe(|| pool.read(request))).is_err() {
            tracing::error!(request_id = %request.meta.ids.request_id, "sending READ panicked");
        }
        Self {
            message: item.payload,
            context: RequestContext {
                request: Arc::clone(&item.request),
                pool: Arc::clone(pool) as Arc<dyn PoolLink>,
            },
            responder: Responder {
                pool: Arc::clone(pool),
                request: item.request,
                done: false,
            },
        }
    }

    pub fn reply(self, reply: R) {
        self.responder.reply(reply);
    }
    pub fn fail(self, error: AskError) {
        self.responder.fail(error);
    }
}

/// Takes the next request from `own` (this worker's queue) first, then from
/// the pool's shared queue. Requests cancelled while queued are skipped: their
/// entry is already terminal, so the handler never starts. `None` once the
/// pool is closed.
pub(crate) async fn next_request<M: Send + 'static, R: Clone + Send + 'static>(
    pool: &Arc<PoolShared<M, R>>,
    own: Option<&WorkerInbox<M>>,
) -> Option<Request<M, R>> {
    loop {
        if pool.is_closed() {
            return None;
        }
        // Poll without waiting first: building the wait costs more than the
        // common case where a request is already queued.
        let work = match try_take(pool, own) {
            Some(work) => work,
            None => match wait_for_work(pool, own).await {
                Some(work) => work,
                None => continue,
            },
        };
        let item = match work {
            Work::Item(item) => item,
            Work::Closed => {
                // Pass the sentinel on to the next waiter of the shared queue.
                let _ = pool.work.push(&pool.queue_tx, Work::Closed);
                return None;
            }
        };
        if pool.is_closed() {
            pool.cancel_item(item, CancelReason::Shutdown);
            return None;
        }
        if item.request.cancel.is_cancelled() {
            continue;
        }
        return Some(Request::new(pool, item));
    }
}

/// This worker's own queue first, then the pool's.
#[inline]
fn try_take<M: Send + 'static, R: Clone + Send + 'static>(
    pool: &PoolShared<M, R>,
    own: Option<&WorkerInbox<M>>,
) -> Option<Work<M>> {
    own.and_then(|inbox| inbox.signal.take(&inbox.rx))
        .or_else(|| pool.work.take(&pool.queue_rx))
}

/// Sleeps until a queue this worker reads may have work (or the pool
/// closed), then takes it; `None` for a wake-up that found nothing.
async fn wait_for_work<M: Send + 'static, R: Clone + Send + 'static>(
    pool: &PoolShared<M, R>,
    own: Option<&WorkerInbox<M>>,
) -> Option<Work<M>> {
    // The worker's wake-up, unless another pull of the same worker waits
    // with it (or there is no worker): then one of this wait's own.
    let wake = match own.and_then(|inbox| inbox.signal.owner()) {
        Some(owner) if owner.claim() => Wake::Claimed(owner),
        _ => Wake::Own(Arc::default()),
    };
    let me = wake.get();
    // However the wait ends (also dropped), `me` leaves the idle lists.
    let _waiting = Waiting { pool, own, me };
    poll_fn(|cx| {
        if let Some(work) = try_take(pool, own) {
            return Poll::Ready(Some(work));
        }
        if pool.is_closed() {
            return Poll::Ready(None);
        }
        // Enlisted before the second look, so work queued (or a close)
        // after it wakes this wait instead of being missed.
        me.register(cx.waker());
        pool.work.enlist(me);
        if let Some(inbox) = own {
            inbox.signal.enlist(me);
        }
        if let Some(work) = try_take(pool, own) {
            return Poll::Ready(Some(work));
        }
        if pool.is_closed() {
            return Poll::Ready(None);
        }
        Poll::Pending
    })
    .await
}

/// The wake-up one wait uses.
enum Wake<'a> {
    /// Its worker's (released when the wait ends).
    Claimed(&'a Arc<WorkerWake>),
    Own(Arc<WorkerWake>),
}

impl Wake<'_> {
    fn get(&self) -> &Arc<WorkerWake> {
        match self {
            Wake::Claimed(wake) => wake,
            Wake::Own(wake) => wake,
        }
    }
}

impl Drop for Wake<'_> {
    fn drop(&mut self) {
        if let Wake::Claimed(wake) = self {
            wake.release();
        }
    }
}

/// Ends a wait on the queues it enlisted in (see `QueueSignal::finish_wait`).
struct Waiting<'a, M: Send + 'static, R: Clone + Send + 'static> {
    pool: &'a PoolShared<M, R>,
    own: Option<&'a WorkerInbox<M>>,
    me: &'a Arc<WorkerWake>,
}

impl<M: Send + 'static, R: Clone + Send + 'static> Drop for Waiting<'_, M, R> {
    fn drop(&mut self) {
        self.pool.work.finish_wait(self.me);
        if let Some(inbox) = self.own {
            inbox.signal.finish_wait(self.me);
        }
    }
}

/// A named worker of a pool: asks that prefer it are routed to it while it
/// is alive. Dropping it hands its queued requests back to the pool.
pub struct Worker<M: Send + 'static, R: Clone + Send + 'static> {
    pool: Arc<PoolShared<M, R>>,
    id: WorkerId,
    inbox: WorkerInbox<M>,
}

impl<M: Send + 'static, R: Clone + Send + 'static> Worker<M, R> {
    pub(crate) fn register(pool: &Arc<PoolShared<M, R>>, id: WorkerId) -> Result<Self, AskError> {
        id.validate()?;
        let (tx, rx) = flume::unbounded();
        let signal = Arc::new(QueueSignal::inbox(
            Arc::default(),
            Arc::clone(&pool.inbox_items),
        ));
        let mut workers = pool.workers.write();
        if workers.contains_key(&id) {
            return Err(AskError::InvalidArgument {
                message: format!("worker {id:?} already exists in pool {}", pool.name),
            });
        }
        workers.insert(
            id.clone(),
            WorkerQueue {
                tx,
                rx: rx.clone(),
                signal: Arc::clone(&signal),
            },
        );
        Ok(Self {
            pool: Arc::clone(pool),
            id,
            inbox: WorkerInbox { rx, signal },
        })
    }

    pub fn id(&self) -> &WorkerId {
        &self.id
    }

    /// The next request for this worker; `None` once the pool is closed.
    pub async fn next_request(&self) -> Option<Request<M, R>> {
        next_request(&self.pool, Some(&self.inbox)).await
    }
}

impl<M: Send + 'static, R: Clone + Send + 'static> Drop for Worker<M, R> {
    fn drop(&mut self) {
        // Out of the registry first: the requests that preferred this
        // worker then go to the pool's shared queue.
        self.pool.workers.write().remove(&self.id);
        // All of it: a request pushed after the pool's sentinel (a close
        // racing a preferring ask) is cancelled by `enqueue`, not dropped.
        while let Ok(work) = self.inbox.rx.try_recv() {
            self.inbox.signal.taken();
            if let Work::Item(item) = work {
                self.pool.enqueue(item);
            }
        }
    }
}

/// Runs one worker's loop: pull, run the handler, complete. A panicking
/// handler fails its request with `HandlerFailed { type_name: "panic" }`.
pub(crate) async fn run_handler_loop<M, R, F, Fut>(worker: Worker<M, R>, handler: Arc<F>)
where
    M: Send + 'static,
    R: Clone + Send + 'static,
    F: Fn(M, RequestContext) -> Fut + Send + Sync + 'static,
    Fut: Future<Output = Outcome<R>> + Send + 'static,
{
    while let Some(request) = worker.next_request().await {
        let Request {
            message,
            context,
            responder,
        } = request;
        let span = tracing::debug_span!(
            "handle",
            request_id = %context.request_id(),
            correlation_id = %context.correlation_id(),
            pool = %context.pool(),
        );
        let request_id = context.request_id();
        // A handler may panic before its future exists, or while it runs.
        let panicked = match catch_unwind(AssertUnwindSafe(|| handler(message, context))) {
            Ok(future) => {
                AssertUnwindSafe(future)
                    .catch_unwind()
                    .instrument(span)
                    .await
            }
            Err(panic) => Err(panic),
        };
        let outcome = panicked
            .unwrap_or_else(|panic| {
                let error = panic_error(panic.as_ref());
                // The caller gets the message, but a panic is a bug in the
                // handler: the operator's log must say so too (a custom
                // panic hook, or none, may print nothing).
                tracing::error!(%request_id, pool = %worker.pool.name, %error, "handler panicked");
                Err(error)
            })
            .map_err(AskError::from_handler_error);
        // The outcome is on record before the reply goes out (the panic
        // gap): a transport that panics sending it loses that frame only,
        // and the worker goes on (a duplicate is answered from the cache).
        if catch_unwind(AssertUnwindSafe(|| responder.complete(outcome))).is_err() {
            tracing::error!(%request_id, "sending a reply panicked");
        }
    }
}

pub(crate) fn panic_error(panic: &(dyn std::any::Any + Send)) -> AskError {
    let message = panic
        .downcast_ref::<&str>()
        .map(|s| s.to_string())
        .or_else(|| panic.downcast_ref::<String>().cloned())
        .unwrap_or_else(|| "handler panicked".to_owned());
    AskError::handler_failed("panic", message)
}
