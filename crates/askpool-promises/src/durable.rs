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
//! worker process only.
//!
//! Transient failures (timeouts, an unavailable pool, a cancelled ask) and
//! `NoRoute` (no pool of that name on this node, yet) leave the promise
//! pending for a later await, until its timeout; other permanent failures
//! reject it.
//! The store is called inline from the async code (see [`Store`]).

use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use askpool::{AskError, ErrorClass, ErrorCode, Node, PoolName, RequestId};

use crate::error::PromiseError;
use crate::facade::{Claim, DurablePromises};
use crate::model::{Completion, CreateRequest, Millis, Promise, State};
use crate::rules::MAX_VALUE_BYTES;
use crate::store::Store;

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
    inner: Pin<Box<dyn Future<Output = Result<R, AskError>> + Send>>,
}

impl<R: Send + 'static> DurableHandle<R> {
    fn ready(id: String, outcome: Result<R, AskError>) -> Self {
        Self {
            id,
            inner: Box::pin(async move { outcome }),
        }
    }
}

impl<R> DurableHandle<R> {
    /// The promise id (also the ask's request id): await it after a restart.
    pub fn id(&self) -> &str {
        &self.id
    }
}

impl<R> Future for DurableHandle<R> {
    type Output = Result<R, AskError>;
    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        self.inner.as_mut().poll(cx)
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

    /// The same under a given id. Idempotent: a promise with this id that
    /// has settled answers at once; one still pending is asked again.
    fn ask_durable_with_id(
        &self,
        promises: &DurablePromises,
        id: RequestId,
        pool: &str,
        msg: M,
    ) -> Result<DurableHandle<R>, AskError>;

    /// The outcome of the durable ask `id`, asking again if it is pending.
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
        Ok(resume(self, promises, id, created.promise))
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
        let id = &request_id.to_string();
        let promise = promises.store().get(id, now_millis())?;
        // Someone else's promise would be read as an outcome, or asked of
        // a pool named "" and rejected with the failure.
        if !is_durable_ask(&promise) {
            return Err(AskError::InvalidArgument {
                message: format!("promise {id} was not made by a durable ask"),
            });
        }
        Ok(resume(self, promises, request_id, promise))
    }
}

/// Whether a durable ask made `p`: keyed by its id, tagged with its pool.
fn is_durable_ask(p: &Promise) -> bool {
    p.create_key.as_deref() == Some(p.id.as_str()) && p.tags.contains_key(POOL_TAG)
}

/// Answers from a settled promise, or (re-)sends the ask and records it.
fn resume<M, R>(
    node: &Node<M, R>,
    promises: &DurablePromises,
    id: RequestId,
    promise: Promise,
) -> DurableHandle<R>
where
    M: Durable + Clone + Send + 'static,
    R: Durable + Clone + Send + 'static,
{
    let key = id.to_string();
    if promise.state.is_settled() {
        return DurableHandle::ready(key, outcome_of(&promise));
    }
    let pool = promise.tags.get(POOL_TAG).cloned().unwrap_or_default();
    let msg = match M::from_bytes(&promise.param) {
        Ok(msg) => msg,
        Err(message) => return DurableHandle::ready(key, Err(AskError::DecodeFailure { message })),
    };
    let size = promise.param.len();
    let ask = DurableAskOf {
        node: node.clone(),
        promises: promises.clone(),
        id,
        pool,
        msg,
        size,
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
    let runtime = tokio::runtime::Handle::try_current().ok();
    let inner: Pin<Box<dyn Future<Output = Result<R, AskError>> + Send>> = match runtime {
        Some(runtime) if !promises.is_claimed(&key) => {
            let task = runtime.spawn(ask_and_record(ask, false));
            Box::pin(async move { joined(task.await) })
        }
        Some(_) => Box::pin(ask_and_record(ask, true)),
        // Outside a runtime the handle drives the ask, as any ask.
        None => Box::pin(ask_and_record(ask, false)),
    };
    DurableHandle { id: key, inner }
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
            if !ask.node.is_pending(ask.id) {
                let p = ask.promises.store().get(&key, now_millis())?;
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
        let p = ask.promises.store().get(&key, now_millis())?;
        if p.state.is_settled() {
            return outcome_of(&p);
        }
    }
}

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
    let outcome = ask
        .node
        .ask(ask.pool.clone(), ask.msg)
        .request_id(ask.id)
        .timeout(wait)
        .payload_size(ask.size)
        .on_replay_outcome(recorder(&ask.promises, &key))
        .await;
    if matches!(outcome, Err(AskError::InvalidArgument { .. })) && ask.node.is_pending(ask.id) {
        return Ok(None);
    }
    record(&ask.promises, &key, outcome).map(Some)
}

/// What a replay of the ask's dead letter got (whoever replays it: the
/// node's `replay_dead_letter`, in any binding) is recorded as the ask's
/// own outcome would have been, so that a pending promise is not asked,
/// and its handler run, again later. A store that fails here leaves the
/// promise pending, as a transient failure does.
fn recorder<R: Durable + Send + 'static>(
    promises: &DurablePromises,
    key: &str,
) -> impl Fn(Result<R, AskError>) + Send + Sync + 'static {
    let promises = promises.clone();
    let key = key.to_owned();
    move |outcome| {
        let _ = record(&promises, &key, outcome);
    }
}

/// Settles the promise with the ask's outcome, unless the failure is worth
/// asking again; a promise someone else settled first wins.
fn record<R: Durable>(
    promises: &DurablePromises,
    id: &str,
    outcome: Result<R, AskError>,
) -> Result<R, AskError> {
    let (outcome, completion, value) = match outcome {
        Ok(reply) => match reply.to_bytes().and_then(storable) {
            Ok(bytes) => (Ok(reply), Completion::Resolve, bytes),
            // Recorded as what a later await would meet: not the reply.
            Err(message) => {
                let error = AskError::DecodeFailure {
                    message: format!("the reply of durable ask {id} cannot be stored: {message}"),
                };
                let value = encode_error(&error);
                (Err(error), Completion::Reject, value)
            }
        },
        // Not outcomes of the request: a transient failure, a cancel, and
        // `NoRoute` (no pool of that name on this node yet: a restarted
        // caller may await before it registers its pools again; recorded,
        // it would refuse the request for good without any worker seeing it).
        Err(e)
            if e.class() == ErrorClass::Transient
                || matches!(e.code(), ErrorCode::AskCancelled | ErrorCode::NoRoute) =>
        {
            // Unless the promise was settled meanwhile another way: that
            // is the ask's outcome, as every later await reads it.
            return match promises.store().get(id, now_millis()) {
                Ok(p) if p.state.is_settled() => outcome_of(&p),
                _ => Err(e),
            };
        }
        Err(e) => {
            let value = encode_error(&e);
            (Err(e), Completion::Reject, value)
        }
    };
    let completed = match promises.complete(id, completion, value, Some(id.to_owned())) {
        Ok(completed) => completed,
        // Settled meanwhile another way (by hand, by another process's
        // ask): that outcome is the ask's, as every later await reads it.
        Err(PromiseError::AlreadySettled { .. }) => {
            return outcome_of(&promises.store().get(id, now_millis())?)
        }
        Err(e) => return Err(e.into()),
    };
    if completed.replayed {
        return outcome_of(&completed.promise);
    }
    outcome
}

/// `bytes`, if a promise can hold them.
fn storable(bytes: Vec<u8>) -> Result<Vec<u8>, String> {
    if bytes.len() > MAX_VALUE_BYTES {
        return Err(format!(
            "it is {} bytes; a promise holds at most {MAX_VALUE_BYTES}",
            bytes.len()
        ));
    }
    Ok(bytes)
}

fn outcome_of<R: Durable>(p: &Promise) -> Result<R, AskError> {
    let value = p.value.as_deref().unwrap_or_default();
    match p.state {
        State::Resolved => {
            R::from_bytes(value).map_err(|message| AskError::DecodeFailure { message })
        }
        State::Rejected => Err(decode_error(value)),
        State::Canceled => Err(AskError::FailedPrecondition {
            message: format!(
                "durable ask {} was canceled{}",
                p.id,
                settled_by_hand(value)
            ),
        }),
        State::TimedOut => Err(AskError::DeadlineExceeded),
        State::Pending => Err(AskError::internal("outcome of a pending promise")),
    }
}

/// The value a promise was settled with by hand, for an error's message:
/// `": TEXT"` for printable UTF-8, its size for other bytes, nothing if empty.
fn settled_by_hand(value: &[u8]) -> String {
    match std::str::from_utf8(value) {
        _ if value.is_empty() => String::new(),
        Ok(text) if !text.chars().any(char::is_control) => format!(": {text}"),
        _ => format!(" (a value of {} bytes)", value.len()),
    }
}

fn encode_error(e: &AskError) -> Vec<u8> {
    // The bare message of a code `decode_error` rebuilds, so that the
    // error reads back as it was first raised.
    let (type_name, message) = match e {
        AskError::HandlerFailed { type_name, message } => (type_name.clone(), message.clone()),
        AskError::DecodeFailure { message }
        | AskError::InvalidArgument { message }
        | AskError::ValidationError { message }
        | AskError::PermissionDenied { message }
        | AskError::FailedPrecondition { message }
        | AskError::Internal { message } => (String::new(), message.clone()),
        e => (String::new(), e.to_string()),
    };
    serde_json::json!({ "code": e.code().as_str(), "type": type_name, "message": message })
        .to_string()
        .into_bytes()
}

/// A stored rejection as an error: a handler's failure, a taxonomy error a
/// handler may raise (`ValidationError`, `PermissionDenied`, ...: the same
/// exception class in every binding as when first raised), or a value that
/// cannot be stored or read, comes back as it was; any other code as
/// `FailedPrecondition` naming it. A value that is no stored error (a
/// promise rejected by hand: `askpool promises reject ID --value TEXT`, a
/// store's `reject`) is `FailedPrecondition` carrying its text.
fn decode_error(bytes: &[u8]) -> AskError {
    let v: serde_json::Value = serde_json::from_slice(bytes).unwrap_or_default();
    if !v.get("code").is_some_and(serde_json::Value::is_string) {
        return AskError::FailedPrecondition {
            message: format!("durable ask rejected{}", settled_by_hand(bytes)),
        };
    }
    let s = |k: &str| {
        v.get(k)
            .and_then(|x| x.as_str())
            .unwrap_or_default()
            .to_owned()
    };
    let code = ErrorCode::from_name(&s("code"));
    if code == Some(ErrorCode::HandlerFailed) {
        AskError::handler_failed(s("type"), s("message"))
    } else if let Some(error) = code.and_then(|code| AskError::of_message(code, s("message"))) {
        // Rebuilt as stored (`DecodeFailure` is about the value itself: the
        // same answer every time it is read).
        error
    } else {
        AskError::FailedPrecondition {
            message: format!("durable ask rejected with {}: {}", s("code"), s("message")),
        }
    }
}
