//! Durable asks: an ask whose request id is a promise id (DESIGN section 5).
//!
//! `node.ask_durable(&promises, pool, msg)` creates a promise (param = the
//! encoded message, tag `askpool:pool` = the pool), sends an ordinary ask
//! with the promise's id as its request id, and settles the promise with
//! the reply. After a caller restart, `node.await_durable(&promises, id)`
//! on a node opened on the same store answers from the promise if it has
//! settled, and otherwise asks again with the same request id and the
//! stored message.
//!
//! What "the handler runs once" rests on: a settled promise is never asked
//! again, and a re-sent ask carries the same request id, so a pool that is
//! still running deduplicates it, joining a run in progress, provided the
//! restarted caller has the same caller id (dedup keys are per caller; today
//! a node's caller id follows from `NodeConfig::seed`). A caller with a new
//! caller id, or a pool that restarted meanwhile (its dedup cache is gone),
//! runs the handler again: handler-once across processes holds within one
//! worker process only. And only while the promise is kept: a durable ask
//! pruned from the store (`DurablePromises::prune`, by the retention its
//! user chose) is forgotten, and asked again under its id it is a new
//! request.
//!
//! Transient failures (timeouts, an unavailable pool, a cancelled ask) and
//! `NoRoute` (no pool of that name on this node, yet) leave the promise
//! pending for a later await, until its timeout; other permanent failures
//! reject it.
//!
//! The store is called on tokio's blocking threads, and a look that finds
//! it locked by another writer is made again at the next poll, as
//! `DurablePromises::wait` does. The exception is the `create` of
//! `ask_durable`, made where it is called: it answers at once whether the
//! id is taken by another request, and a handle it returns names a stored
//! promise.

use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use std::sync::Arc;

use askpool::{
    AskError, AskHandle, Node, PoolName, RequestId, StageRelay, StageSource, StageStream,
};
use tokio::runtime::Handle;

use crate::facade::{Claim, DurablePromises};
use crate::model::{CreateRequest, Millis, Promise};
use crate::outcome::{outcome_of, record, recorder};

const POOL_TAG: &str = "askpool:pool";

/// Unix-epoch milliseconds: the `now` of a production store.
pub fn now_millis() -> Millis {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
}

/// A message or reply type that a promise can hold. `to_bytes` fails for a
/// value that cannot outlive the process (an object of the host language
/// that does not encode): a durable ask of it is refused, and a reply of it
/// rejects the promise with `DecodeFailure` rather than store something
/// that reads back wrong.
pub trait Durable: Sized {
    fn to_bytes(&self) -> Result<Vec<u8>, String>;
    fn from_bytes(bytes: &[u8]) -> Result<Self, String>;

    /// Whether this message, encoded as `encoded`, is the one stored as
    /// `stored` under the same id (else the ask is `PayloadMismatch`).
    /// Equal bytes by default; an encoding that is not canonical (Python's
    /// pickle writes equal sets in hash order, which changes between
    /// processes) compares what the bytes stand for.
    fn same_as(&self, encoded: &[u8], stored: &[u8]) -> bool {
        encoded == stored
    }
}

impl Durable for Vec<u8> {
    fn to_bytes(&self) -> Result<Vec<u8>, String> {
        Ok(self.clone())
    }
    fn from_bytes(bytes: &[u8]) -> Result<Self, String> {
        Ok(bytes.to_vec())
    }
}

impl Durable for String {
    fn to_bytes(&self) -> Result<Vec<u8>, String> {
        Ok(self.as_bytes().to_vec())
    }
    fn from_bytes(bytes: &[u8]) -> Result<Self, String> {
        String::from_utf8(bytes.to_vec()).map_err(|e| e.to_string())
    }
}

/// A durable ask in flight: a future of its outcome, with its promise id.
/// Started inside a tokio runtime, the ask runs (and its outcome is
/// recorded) on that runtime even if this handle is dropped; outside one,
/// the handle drives it and dropping it cancels the ask. Either way it is
/// polled in a tokio runtime, as any ask.
pub struct DurableHandle<R> {
    id: String,
    inner: Outcome<R>,
    /// The stages of the asks made for this handle (see [`StageWriter`]).
    stages: Arc<StageRelay<R>>,
}

type Outcome<R> = Pin<Box<dyn Future<Output = Result<R, AskError>> + Send>>;

impl<R: Send + 'static> DurableHandle<R> {
    fn new(id: String, inner: Outcome<R>, stages: Arc<StageRelay<R>>) -> Self {
        Self { id, inner, stages }
    }
}

impl<R> DurableHandle<R> {
    /// The promise id (also the ask's request id): await it after a restart.
    pub fn id(&self) -> &str {
        &self.id
    }

    /// The stages of the asks this handle makes, one ask after another:
    /// SENT to a terminal stage for the first ask, then the same for each
    /// ask made again after a transient failure (a timeout, an unavailable
    /// or missing pool), and the end of the stream once no more asks can
    /// come: with the handle's outcome, or, for a handle dropped while its
    /// ask goes on (detached, see [`DurableHandle`]), with that ask's. None
    /// when the outcome was already in the store, nor while this handle
    /// only waits for an ask of the same id made through another handle.
    /// One stream at a time (see [`StageStream`]); empty when the node does
    /// not track stages.
    pub fn stages(&self) -> StageStream<R> {
        self.stages.open()
    }

    /// What opens [`stages`](Self::stages) later, even after this handle is
    /// gone (see [`StageRelay`] for what it keeps).
    pub fn stage_source(&self) -> StageSource<R> {
        self.stages.source()
    }
}

impl<R> Future for DurableHandle<R> {
    type Output = Result<R, AskError>;
    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        self.inner.as_mut().poll(cx)
    }
}

/// Relays a durable ask's asks to its handle's stream, and ends that
/// stream when the last clone is dropped: clones go wherever an ask may
/// still be made for the handle (its future, a detached task), so the
/// stream ends exactly when no ask can come, however the handle ended. A
/// handle dropped before its detached task had asked would otherwise end
/// its stream with nothing, the ask running on unseen.
struct StageWriter<R>(Arc<EndOnDrop<R>>);

struct EndOnDrop<R>(Arc<StageRelay<R>>);

impl<R> Drop for EndOnDrop<R> {
    fn drop(&mut self) {
        self.0.end();
    }
}

impl<R> StageWriter<R> {
    fn new(relay: &Arc<StageRelay<R>>) -> Self {
        Self(Arc::new(EndOnDrop(Arc::clone(relay))))
    }
}

impl<R: Clone + Send + 'static> StageWriter<R> {
    fn relay<M: Clone + Send + 'static>(&self, ask: &AskHandle<M, R>) {
        self.0 .0.relay(ask);
    }
}

impl<R> Clone for StageWriter<R> {
    fn clone(&self) -> Self {
        Self(Arc::clone(&self.0))
    }
}

/// Durable asks on an [`askpool::Node`].
pub trait DurableAsk<M, R> {
    /// Starts a durable ask of `msg` to `pool` under a fresh promise id.
    fn ask_durable(
        &self,
        promises: &DurablePromises,
        pool: &str,
        msg: M,
    ) -> Result<DurableHandle<R>, AskError>;

    /// The same under a given id. Idempotent while its promise is kept (see
    /// `DurablePromises::prune`): a promise with this id that has settled
    /// answers at once; one still pending is asked again.
    fn ask_durable_with_id(
        &self,
        promises: &DurablePromises,
        id: RequestId,
        pool: &str,
        msg: M,
    ) -> Result<DurableHandle<R>, AskError>;

    /// The outcome of the durable ask `id`, asking again if it is pending.
    /// The promise is read when the handle is first polled (an id that
    /// names no durable ask fails it then); a handle dropped before that
    /// asks nothing.
    fn await_durable(
        &self,
        promises: &DurablePromises,
        id: &str,
    ) -> Result<DurableHandle<R>, AskError>;
}

impl<M, R> DurableAsk<M, R> for Node<M, R>
where
    M: Durable + Clone + Send + 'static,
    R: Durable + Clone + Send + 'static,
{
    fn ask_durable(
        &self,
        promises: &DurablePromises,
        pool: &str,
        msg: M,
    ) -> Result<DurableHandle<R>, AskError> {
        let id = RequestId::generate(now_millis().saturating_mul(1000), &mut rand::rng());
        self.ask_durable_with_id(promises, id, pool, msg)
    }

    fn ask_durable_with_id(
        &self,
        promises: &DurablePromises,
        id: RequestId,
        pool: &str,
        msg: M,
    ) -> Result<DurableHandle<R>, AskError> {
        if promises.timeout < DurablePromises::MIN_TIMEOUT {
            return Err(AskError::InvalidArgument {
                message: format!(
                    "a durable ask's timeout must be at least {:?}, not {:?}",
                    DurablePromises::MIN_TIMEOUT,
                    promises.timeout
                ),
            });
        }
        // A name no pool can have would store a promise asked (and
        // answered NoRoute) after every restart until it timed out.
        PoolName::new(pool).validate()?;
        let timeout = u64::try_from(promises.timeout.as_millis()).unwrap_or(u64::MAX);
        let now = now_millis();
        let key = id.to_string();
        let param = msg
            .to_bytes()
            .map_err(|message| AskError::InvalidArgument {
                message: format!("a durable ask's message cannot be stored: {message}"),
            })?;
        // Refused before it is stored: an oversize message recorded in the
        // store would be asked again, and refused again, after every restart.
        if let Some(limit) = self
            .max_payload_bytes()
            .filter(|&limit| param.len() > limit)
        {
            return Err(AskError::OversizePayload {
                size: param.len(),
                limit,
            });
        }
        let created = promises.store().create(
            &CreateRequest::new(key.clone(), now.saturating_add(timeout))
                .param(param.clone())
                .key(key.clone())
                .tag(POOL_TAG, pool),
            now,
        )?;
        // The id names one request: its pool as much as its message (the
        // same message to another pool is another request).
        let asked_pool = created.promise.tags.get(POOL_TAG).map(String::as_str);
        if created.deduplicated
            && (!msg.same_as(&param, &created.promise.param) || asked_pool != Some(pool))
        {
            return Err(AskError::PayloadMismatch);
        }
        // The stored copy runs, not the object asked: a durable ask's
        // handler sees the same message on its first run as after a restart
        // (an object changed after the ask, or one the encoding does not
        // keep, a JS Date, would run otherwise as it was never stored).
        let runtime = Handle::try_current().ok();
        let (key, stages) = (id.to_string(), StageRelay::new());
        let writer = StageWriter::new(&stages);
        let inner = resume(self, promises, id, created.promise, runtime, writer);
        Ok(DurableHandle::new(key, inner, stages))
    }

    fn await_durable(
        &self,
        promises: &DurablePromises,
        id: &str,
    ) -> Result<DurableHandle<R>, AskError> {
        let request_id: RequestId = id.parse().map_err(|e| AskError::InvalidArgument {
            message: format!("not a durable ask id: {e}"),
        })?;
        // Stored under the id's canonical form (lowercase hex), whatever
        // case the caller writes it in.
        let id = request_id.to_string();
        // Where the ask would run is where this was called (see `resume`),
        // not where the handle is polled.
        let runtime = Handle::try_current().ok();
        let stages = StageRelay::new();
        let (node, promises, key, writer) = (
            self.clone(),
            promises.clone(),
            id.clone(),
            StageWriter::new(&stages),
        );
        // Dropped before it asks (an error, a handle dropped unpolled), the
        // writer ends the stream.
        let inner = async move {
            let promise = promises.current(&key).await?;
            // Someone else's promise would be read as an outcome, or asked
            // of a pool named "" and rejected with the failure.
            if !is_durable_ask(&promise) {
                return Err(AskError::InvalidArgument {
                    message: format!("promise {key} was not made by a durable ask"),
                });
            }
            resume(&node, &promises, request_id, promise, runtime, writer).await
        };
        Ok(DurableHandle::new(id, Box::pin(inner), stages))
    }
}

/// Whether a durable ask made `p`: keyed by its id, tagged with its pool.
fn is_durable_ask(p: &Promise) -> bool {
    p.create_key.as_deref() == Some(p.id.as_str()) && p.tags.contains_key(POOL_TAG)
}

/// Answers from a settled promise, or (re-)sends the ask and records it,
/// on `runtime` if there is one, relaying its asks' stages to `stages`.
fn resume<M, R>(
    node: &Node<M, R>,
    promises: &DurablePromises,
    id: RequestId,
    promise: Promise,
    runtime: Option<Handle>,
    stages: StageWriter<R>,
) -> Outcome<R>
where
    M: Durable + Clone + Send + 'static,
    R: Durable + Clone + Send + 'static,
{
    let key = id.to_string();
    if promise.state.is_settled() {
        let outcome = outcome_of(&promise);
        return Box::pin(async move { outcome });
    }
    let pool = promise.tags.get(POOL_TAG).cloned().unwrap_or_default();
    let msg = match M::from_bytes(&promise.param) {
        Ok(msg) => msg,
        Err(message) => return Box::pin(async move { Err(AskError::DecodeFailure { message }) }),
    };
    let size = promise.param.len();
    let ask = DurableAskOf {
        node: node.clone(),
        promises: promises.clone(),
        id,
        pool,
        msg,
        size,
        stages,
    };
    // The first await of an id (a new durable ask, a restarted caller's)
    // runs on the runtime whether or not its handle is still awaited: a
    // caller that stops waiting (a timeout around the handle, a cancelled
    // task), or never awaits, must not cancel the ask, or the pool would
    // drop the reply for a cancelled request and the promise would stay
    // pending, answered `AskCancelled` and later asked (and run) again.
    // An await of an id already being asked through these promises only
    // waits, in its handle: a caller retrying `await_durable` with short
    // timeouts left a task per call behind, polling the store until the
    // promise settled (an hour by default). If it gets to ask after all
    // (the other ask ended without an outcome), the ask itself is
    // detached as the first one is.
    match runtime {
        Some(runtime) if !promises.is_claimed(&key) => {
            let task = runtime.spawn(ask_and_record(ask, false));
            Box::pin(async move { joined(task.await) })
        }
        Some(_) => Box::pin(ask_and_record(ask, true)),
        // Outside a runtime the handle drives the ask, as any ask.
        None => Box::pin(ask_and_record(ask, false)),
    }
}

/// Everything a durable ask needs to ask (again).
#[derive(Clone)]
struct DurableAskOf<M, R> {
    node: Node<M, R>,
    promises: DurablePromises,
    id: RequestId,
    pool: String,
    msg: M,
    size: usize,
    /// Where its asks' stages go (its handle's stream).
    stages: StageWriter<R>,
}

fn joined<R>(joined: Result<Result<R, AskError>, tokio::task::JoinError>) -> Result<R, AskError> {
    joined.unwrap_or_else(|e| Err(AskError::internal(format!("durable ask task failed: {e}"))))
}

/// Asks `msg` under the durable ask's id and records the outcome. One ask
/// of an id at a time: while another is asking it through these promises
/// (its caller stopped waiting and asked for the outcome again), or this
/// node has it in flight, this one waits for that ask's outcome instead,
/// and asks itself only if that ended without one (a transient failure).
/// A second ask of the id would be refused as already pending, and that
/// refusal is no outcome to record. `detach_ask`: it runs in a handle that
/// may be dropped, so the ask itself goes to a task of its own (not when it
/// runs in a task already, or with no runtime, where the handle drives all).
async fn ask_and_record<M, R>(ask: DurableAskOf<M, R>, detach_ask: bool) -> Result<R, AskError>
where
    M: Durable + Clone + Send + 'static,
    R: Durable + Clone + Send + 'static,
{
    let key = ask.id.to_string();
    loop {
        // Held until the outcome is recorded: a waiter that sees it
        // released finds the promise settled (or asks, after a failure
        // that left it pending).
        if let Some(claim) = ask.promises.claim(&key) {
            // `None`: this node has the id in flight (its outcome is waited
            // for), or the store was locked (looked at again after the poll).
            let looked = if ask.node.is_pending(ask.id) {
                None
            } else {
                ask.promises.look(&key).await?
            };
            if let Some(p) = looked {
                if p.state.is_settled() {
                    return outcome_of(&p);
                }
                let once = ask_once(ask.clone(), key.clone(), p.timeout_at, claim);
                let asked = if detach_ask {
                    joined(tokio::spawn(once).await)
                } else {
                    once.await
                };
                // `None`: refused as pending after all (an ask of the id not
                // made through these promises started meanwhile): wait for it.
                if let Some(outcome) = asked.transpose() {
                    return outcome;
                }
            }
        }
        ask.promises.next_completion_or_poll().await;
        if let Some(p) = ask.promises.look_settled(&key).await? {
            return outcome_of(&p);
        }
    }
}

/// How many of the store's polls a durable ask in flight waits between
/// looks at its promise, for a settlement made in another process (one
/// made through the same promises wakes it at once): it is only cut short
/// by one, so it looks less often than a waiter, which waits for one.
const SETTLED_ELSEWHERE_POLLS: u32 = 10;

/// One ask of the id, recorded, while `_claim` is held; `Ok(None)` if the
/// node refused it as already pending (nothing to record).
async fn ask_once<M, R>(
    ask: DurableAskOf<M, R>,
    key: String,
    timeout_at: u64,
    _claim: Claim,
) -> Result<Option<R>, AskError>
where
    M: Durable + Clone + Send + 'static,
    R: Durable + Clone + Send + 'static,
{
    // The ask may take as long as its promise stays pending (see
    // `DurablePromises::ask_timeout`): a handler slower than the node's
    // default timeout would otherwise be cancelled and asked again, its
    // work lost.
    let pending_for = Duration::from_millis(timeout_at.saturating_sub(now_millis()));
    let wait = ask
        .promises
        .ask_timeout
        .map_or(pending_for, |bound| bound.min(pending_for))
        .max(Duration::from_millis(1));
    let mut asking = ask
        .node
        .ask(ask.pool.clone(), ask.msg)
        .request_id(ask.id)
        .timeout(wait)
        .payload_size(ask.size)
        .on_replay_outcome(recorder(&ask.promises, &key))
        .send();
    ask.stages.relay(&asking);
    let outcome = loop {
        tokio::select! {
            outcome = &mut asking => break outcome,
            // Settled meanwhile by someone else (by hand, through these
            // promises at once, or another process's, found at a poll):
            // that outcome stands, and the ask is cancelled at the pool
            // (dropped), instead of its caller waiting for the handler or
            // the promise's timeout (an hour by default).
            () = ask.promises.next_completion_or_polls(SETTLED_ELSEWHERE_POLLS) => {
                if let Some(p) = ask.promises.look_settled(&key).await? {
                    return outcome_of(&p).map(Some);
                }
            }
        }
    };
    if matches!(outcome, Err(AskError::InvalidArgument { .. })) && ask.node.is_pending(ask.id) {
        return Ok(None);
    }
    record(&ask.promises, &key, outcome).await.map(Some)
}
