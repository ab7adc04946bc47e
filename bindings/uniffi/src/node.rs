//! `NativeNode`: one askpool node whose messages are host handles or bytes.
//! Asks complete through the node's [`AskListener`]; Kotlin builds its
//! suspend API, handles and flows on top.

use std::panic::AssertUnwindSafe;
use std::sync::atomic::{AtomicI64, Ordering};
use std::sync::{Arc, LazyLock};
use std::time::Duration;

use arc_swap::ArcSwap;
use askpool::{
    AskError, AskHandle, DedupConfig, Node, NodeConfig, PoolConfig, PoolName, RequestId,
    RetryPolicy, WorkerId, WorkerPool,
};
use futures::FutureExt;
use parking_lot::{Mutex, MutexGuard};
use rustc_hash::FxHashMap;
use tokio::sync::oneshot;

use crate::error::{Failure, NativeError};
use crate::events;
use crate::host::{AskListener, HostHandler};
use crate::payload::{released_len, Msg, Payload};
use crate::runtime::runtime;
use askpool::shard::ShardedMap;

#[derive(Clone, Debug, uniffi::Record)]
pub struct NodeOptions {
    pub default_timeout_ms: u64,
    /// Total sends of an ask, the first included.
    pub max_attempts: u32,
    pub track_stages: bool,
    pub dlq_capacity: u64,
    /// A circuit breaker per target pool (the runtime's default settings).
    pub circuit_breaker: bool,
    /// The largest byte payload an ask or tell may carry
    /// (`NodeConfig::max_payload_bytes`); `None` lifts the bound.
    pub max_payload_bytes: Option<u64>,
}

#[derive(Clone, Debug, uniffi::Record)]
pub struct PoolOptions {
    pub concurrency: u32,
    pub max_in_flight: u64,
    pub dedup_capacity: u64,
    pub dedup_ttl_ms: u64,
    pub processing_timeout_ms: Option<u64>,
}

#[derive(Clone, Debug, Default, uniffi::Record)]
pub struct AskArgs {
    pub timeout_ms: Option<u64>,
    pub preferred_worker: Option<String>,
    pub request_id: Option<String>,
    pub correlation_id: Option<String>,
    pub causation_id: Option<String>,
    /// Bytes that stand for the payload, hashed into the ask's
    /// `PayloadFingerprint`: a reused request id with another fingerprint
    /// fails with `PayloadMismatch`. Without it, a `Bytes` payload under a
    /// given request id is fingerprinted by its own bytes.
    pub fingerprint: Option<Vec<u8>>,
    pub max_attempts: Option<u32>,
    /// Keep the ask's stage record for [`crate::open_stages`] (an ask only).
    pub stages: bool,
    /// A tell: done when the pool accepts it.
    pub one_way: bool,
}

/// What the host learns when an ask, a tell or a replay starts.
#[derive(Clone, Debug, uniffi::Record)]
pub struct AskStart {
    pub request_id: String,
    pub correlation_id: String,
    /// Whether its stage record is kept under its token
    /// ([`crate::open_stages`]); never for a tell, nor on a node that does
    /// not track stages.
    pub stages_kept: bool,
}

impl AskStart {
    fn of(ids: askpool::AskIds, stages_kept: bool) -> Self {
        Self {
            request_id: ids.request_id.to_string(),
            correlation_id: ids.correlation_id.to_string(),
            stages_kept,
        }
    }
}

#[derive(Clone, Debug, uniffi::Record)]
pub struct DeadLetterInfo {
    pub request_id: String,
    pub correlation_id: String,
    pub pool: String,
    pub payload: Payload,
    pub failure: Failure,
    pub attempts: u32,
    /// `RETRIES_EXHAUSTED` or `POISON`.
    pub reason: String,
    /// `ASK` or `TELL`: what was sent, and what its replay sends.
    pub kind: String,
}

/// Counts that must return to zero when traffic stops, and the node's
/// counters.
#[derive(Clone, Debug, uniffi::Record)]
pub struct NativeStats {
    pub pending: u64,
    pub armed_timers: u64,
    pub asks_in_flight: u64,
    pub retries: u64,
    pub late_outcomes: u64,
    pub dlq_depth: u64,
    pub dlq_dropped: u64,
    pub timed_out_records: u64,
    pub pools: Vec<NativePoolStats>,
}

/// One hosted pool's counters (the core's `PoolStats`).
#[derive(Clone, Debug, uniffi::Record)]
pub struct NativePoolStats {
    pub name: String,
    pub in_flight: u64,
    pub queued: u64,
    pub admitted: u64,
    pub handler_runs: u64,
    pub duplicate_acks: u64,
    pub replays: u64,
    pub suppressed_replies: u64,
    pub rejected_full: u64,
    pub cancels: u64,
    pub expired: u64,
    pub dedup_in_progress: u64,
    pub dedup_terminal: u64,
}

#[derive(uniffi::Object)]
pub struct NativeNode {
    node: Node<Msg, Msg>,
    listener: Arc<dyn AskListener>,
    id: i64,
    /// The node's `track_stages`: without it a stage record is empty, so
    /// none is kept.
    pub(crate) track_stages: bool,
    /// Cancel switches of running asks, by the caller's token.
    asks: AskSwitches,
    /// Pool names interned for the primitive-only ask path: ids by name
    /// (taken when a pool id is made), and names by id, which every ask
    /// reads (a snapshot: a lock here was a line both asking threads wrote).
    pool_ids: Mutex<FxHashMap<String, i64>>,
    pool_names: ArcSwap<Vec<PoolName>>,
    pools: Mutex<FxHashMap<String, WorkerPool<Msg, Msg>>>,
}

/// The cancel switches of a node's running asks, in shards picked by the
/// token's low bits. The Kotlin side's tokens carry the asking thread's
/// stripe there (`Slots`), so an ask's switch is entered and removed in a
/// shard that thread mostly has to itself; one map's shard locks were lines
/// every asking thread wrote. Any token works: others just spread.
#[derive(Default)]
struct AskSwitches(ShardedMap<i64, oneshot::Sender<()>>);

impl AskSwitches {
    fn shard(&self, token: i64) -> MutexGuard<'_, FxHashMap<i64, oneshot::Sender<()>>> {
        self.0.lock((token as usize) & (self.0.shards() - 1))
    }

    fn insert(&self, token: i64, switch: oneshot::Sender<()>) {
        self.shard(token).insert(token, switch);
    }

    fn remove(&self, token: i64) -> Option<oneshot::Sender<()>> {
        self.shard(token).remove(&token)
    }

    fn len(&self) -> usize {
        self.0.len()
    }
}

enum Started {
    Ask(AskHandle<Msg, Msg>),
    Tell(askpool::TellHandle<Msg, Msg>),
}

impl Started {
    fn ids(&self) -> &askpool::AskIds {
        match self {
            Started::Ask(h) => h.ids(),
            Started::Tell(h) => h.ids(),
        }
    }
}

fn millis(ms: u64) -> Duration {
    Duration::from_millis(ms)
}

/// Parses an id given as text; an error shows at most the first 64 chars
/// of it (an id of megabytes must not make an error of megabytes).
pub(crate) fn parse_id<T: std::str::FromStr>(what: &str, text: &str) -> Result<T, NativeError> {
    text.parse().map_err(|_| {
        let message = match text.char_indices().nth(64) {
            Some((cut, _)) => format!(
                "{what} {:?}... ({} bytes) is not 32 hex digits",
                &text[..cut],
                text.len()
            ),
            None => format!("{what} {text:?} is not 32 hex digits"),
        };
        NativeError::from(AskError::InvalidArgument { message })
    })
}

#[uniffi::export]
impl NativeNode {
    #[uniffi::constructor]
    pub fn new(options: NodeOptions, listener: Arc<dyn AskListener>) -> Arc<Self> {
        let config = NodeConfig {
            default_timeout: millis(options.default_timeout_ms),
            retry: RetryPolicy {
                max_attempts: options.max_attempts.max(1),
                ..RetryPolicy::default()
            },
            track_stages: options.track_stages,
            dlq_capacity: usize::try_from(options.dlq_capacity).unwrap_or(usize::MAX),
            breaker: options
                .circuit_breaker
                .then(askpool::BreakerConfig::default),
            max_payload_bytes: options
                .max_payload_bytes
                .map(|n| usize::try_from(n).unwrap_or(usize::MAX)),
            ..NodeConfig::default()
        };
        let _rt = runtime().enter();
        let node = Arc::new(Self {
            node: Node::with_config(config),
            listener,
            id: NEXT_NODE.fetch_add(1, Ordering::Relaxed),
            track_stages: options.track_stages,
            asks: AskSwitches::default(),
            pool_ids: Mutex::default(),
            pool_names: ArcSwap::default(),
            pools: Mutex::default(),
        });
        NODES.rcu(|nodes| {
            let mut nodes = FxHashMap::clone(nodes);
            nodes.insert(node.id, Arc::clone(&node));
            nodes
        });
        node
    }

    /// The node's id for [`node_ask`]; valid until `shutdown`.
    pub fn id(&self) -> i64 {
        self.id
    }

    /// A pool run by a Kotlin handler (`concurrency` requests at a time).
    pub fn create_pool(
        &self,
        name: String,
        options: PoolOptions,
        handler: Arc<dyn HostHandler>,
        host_id: i64,
    ) -> Result<(), NativeError> {
        let config = PoolConfig {
            concurrency: options.concurrency as usize,
            max_in_flight: usize::try_from(options.max_in_flight).unwrap_or(usize::MAX),
            dedup: DedupConfig {
                max_terminal: usize::try_from(options.dedup_capacity).unwrap_or(usize::MAX),
                terminal_ttl: millis(options.dedup_ttl_ms),
            },
            processing_timeout: options.processing_timeout_ms.map(millis),
            ..PoolConfig::default()
        };
        let concurrency = config.concurrency;
        let pool = self.node.pool(name.as_str()).config(config).build()?;
        if let Err(e) = crate::handler::serve(&pool, concurrency, handler, host_id) {
            pool.close();
            return Err(e.into());
        }
        self.pools.lock().insert(name, pool);
        Ok(())
    }

    pub fn close_pool(&self, name: String) {
        if let Some(pool) = self.pools.lock().remove(&name) {
            pool.close();
        }
    }

    /// A small id for `pool`, for [`ask`](Self::ask); -1 when the name gets
    /// none (ask it by name with [`ask_with`](Self::ask_with)): names are
    /// kept for the node's life, so a program asking ever new names (most
    /// of them no pool's) would grow the table without bound.
    pub fn pool_id(&self, pool: String) -> i64 {
        let mut ids = self.pool_ids.lock();
        if let Some(&id) = ids.get(&pool) {
            return id;
        }
        if ids.len() >= MAX_POOL_IDS || PoolName::from(pool.as_str()).validate().is_err() {
            return -1;
        }
        let mut names = Vec::clone(&self.pool_names.load());
        let id = names.len() as i64;
        names.push(PoolName::from(pool.as_str()));
        self.pool_names.store(Arc::new(names));
        ids.insert(pool, id);
        id
    }

    /// An ask (or a tell) with every option.
    pub fn ask_with(
        self: Arc<Self>,
        pool: String,
        payload: Payload,
        args: AskArgs,
        token: i64,
    ) -> Result<AskStart, NativeError> {
        // Only a given request id can be reused: a generated one needs no digest.
        let fingerprint = match (&args.fingerprint, &payload) {
            (Some(bytes), _) => Some(askpool_dedup::fingerprint(bytes)),
            (None, Payload::Bytes { data }) if args.request_id.is_some() => {
                Some(askpool_dedup::fingerprint(data))
            }
            _ => None,
        };
        // Bytes have a size the runtime checks against the node's bound; a
        // host object has none (it passes by reference).
        let payload_size = match &payload {
            Payload::Bytes { data } => Some(data.len()),
            Payload::Host { .. } => None,
        };
        // Adopted first: the handle is released even if the options are bad.
        let msg = Msg::from(payload);
        let options = askpool::AskOptions {
            timeout: args.timeout_ms.map(millis),
            preferred_worker: args.preferred_worker.map(WorkerId::from),
            request_id: args
                .request_id
                .as_deref()
                .map(|text| parse_id("request id", text))
                .transpose()?,
            correlation_id: args
                .correlation_id
                .as_deref()
                .map(|text| parse_id("correlation id", text))
                .transpose()?,
            causation_id: args
                .causation_id
                .as_deref()
                .map(|text| parse_id("causation id", text))
                .transpose()?,
            retry: args.max_attempts.map(|n| RetryPolicy {
                max_attempts: n.max(1),
                ..RetryPolicy::default()
            }),
            fingerprint,
            payload_size,
        };
        let _rt = runtime().enter();
        let started = if args.one_way {
            Started::Tell(self.node.tell(pool.as_str(), msg).options(options).send())
        } else {
            Started::Ask(self.node.ask(pool.as_str(), msg).options(options).send())
        };
        let ids = *started.ids();
        let stages_kept = self.start(started, token, args.stages);
        Ok(AskStart::of(ids, stages_kept))
    }

    /// Cancels the ask started under `token`; its outcome (`AskCancelled`,
    /// or whatever came first) still goes to the listener.
    pub fn cancel(&self, token: i64) {
        if let Some(tx) = self.asks.remove(token) {
            let _ = tx.send(());
        }
    }

    pub fn dead_letters(&self) -> Vec<DeadLetterInfo> {
        self.node
            .dead_letters()
            .iter()
            .map(|d| DeadLetterInfo {
                request_id: d.request_id().to_string(),
                correlation_id: d.ids.correlation_id.to_string(),
                pool: d.pool.to_string(),
                payload: Payload::from(&d.payload),
                failure: Failure::from(&d.error),
                attempts: d.attempts,
                reason: d.reason.as_str().to_owned(),
                kind: d.kind.as_str().to_owned(),
            })
            .collect()
    }

    /// Sends a dead letter again (same ids) as what it was: an ask's
    /// outcome goes to the listener under `token` and its stage record is
    /// kept; a tell's is a reply of nothing once its pool accepted it.
    pub fn replay_dead_letter(
        self: Arc<Self>,
        request_id: String,
        token: i64,
    ) -> Result<AskStart, NativeError> {
        let id: RequestId = parse_id("request id", &request_id)?;
        let _rt = runtime().enter();
        let started = match self.node.replay_dead_letter_as_sent(id)? {
            askpool::Replay::Ask(h) => Started::Ask(h),
            askpool::Replay::Tell(h) => Started::Tell(h),
        };
        let ids = *started.ids();
        let stages_kept = self.start(started, token, true);
        Ok(AskStart::of(ids, stages_kept))
    }

    pub fn purge_dead_letters(&self) -> u64 {
        self.node.purge_dead_letters() as u64
    }

    pub fn stats(&self) -> NativeStats {
        let s = self.node.stats();
        NativeStats {
            pending: s.pending as u64,
            armed_timers: s.armed_timers as u64,
            asks_in_flight: self.asks.len() as u64,
            retries: s.retries,
            late_outcomes: s.late_outcomes,
            dlq_depth: s.dlq_depth as u64,
            dlq_dropped: s.dlq_dropped,
            timed_out_records: s.timed_out_records as u64,
            pools: s
                .pools
                .into_iter()
                .map(|p| NativePoolStats {
                    in_flight: p.in_flight as u64,
                    queued: p.queued as u64,
                    admitted: p.admitted,
                    handler_runs: p.handler_runs,
                    duplicate_acks: p.duplicate_acks,
                    replays: p.replays,
                    suppressed_replies: p.suppressed_replies,
                    rejected_full: p.rejected_full,
                    cancels: p.cancels,
                    expired: p.expired,
                    dedup_in_progress: p.dedup.in_progress as u64,
                    dedup_terminal: p.dedup.terminal as u64,
                    name: p.name,
                })
                .collect(),
        }
    }

    /// The node's caller id (requests are deduplicated per caller id and
    /// request id), in hex.
    pub fn caller_id(&self) -> String {
        self.node.caller_id().to_string()
    }

    /// Fails pending asks (`Unavailable`), stops the pools. Idempotent.
    pub fn shutdown(&self) {
        NODES.rcu(|nodes| {
            let mut nodes = FxHashMap::clone(nodes);
            nodes.remove(&self.id);
            nodes
        });
        let pools: Vec<_> = self.pools.lock().drain().map(|(_, p)| p).collect();
        drop(pools);
        self.node.shutdown();
    }
}

/// Nodes by id, for the hot path: a top-level call with primitives costs
/// one crossing, a method call two (the generated code clones the object
/// handle first). A snapshot replaced when a node starts or shuts down:
/// looking a node up writes no line the asking threads share (a map
/// lock's or the node's reference count).
static NODES: LazyLock<ArcSwap<FxHashMap<i64, Arc<NativeNode>>>> = LazyLock::new(ArcSwap::default);
static NEXT_NODE: AtomicI64 = AtomicI64::new(1);

/// Native nodes not shut down yet, in the process: for leak tests and
/// diagnostics (a node dropped without `close` is shut down by the
/// collector, through the Kotlin node's cleaner).
#[uniffi::export]
pub fn live_native_nodes() -> u64 {
    NODES.load().len() as u64
}

/// The runtime's default of [`NodeOptions::max_payload_bytes`] (16 MiB), so
/// that the Kotlin default is the runtime's.
#[uniffi::export]
pub fn default_max_payload_bytes() -> u64 {
    askpool::DEFAULT_MAX_PAYLOAD_BYTES as u64
}

/// The hot path: an ask of a host object with a timeout (0: the node's
/// default), all primitives. A host object has no size: bytes never take
/// this path (they cross as `Payload::Bytes` through `ask_with`, which
/// gives the runtime their size). The outcome goes to the node's listener under
/// `token`. Returns how many released handles wait in `take_released`, or
/// `u64::MAX` if the node is shut down (nothing will be reported).
#[uniffi::export]
pub fn node_ask(node: i64, pool: i64, handle: i64, timeout_ms: u64, token: i64) -> u64 {
    let _rt = runtime().enter();
    ask_in_runtime(node, pool, handle, timeout_ms, token, 0).map_or(u64::MAX, |s| s.released)
}

/// `flags` of [`ask_in_runtime`]: a tell (done when its pool accepts it).
pub(crate) const ONE_WAY: i64 = 1;
/// `flags` of [`ask_in_runtime`]: keep the ask's stage record.
pub(crate) const KEEP_STAGES: i64 = 2;

/// What [`ask_in_runtime`] started.
pub(crate) struct HotStart {
    /// Released handles waiting in `take_released`.
    pub released: u64,
    pub request_id: RequestId,
    pub stages_kept: bool,
}

/// [`node_ask`] on a thread already in the runtime's context (a hot call
/// enters it once for everything it runs), an ask or a tell (`flags`).
/// `None` if the node is shut down.
pub(crate) fn ask_in_runtime(
    node: i64,
    pool: i64,
    handle: i64,
    timeout_ms: u64,
    token: i64,
    flags: i64,
) -> Option<HotStart> {
    let msg = Msg::host(handle);
    let nodes = NODES.load();
    let node = nodes.get(&node)?;
    let (request_id, stages_kept) = node.ask(pool, msg, timeout_ms, token, flags);
    drop(nodes);
    Some(HotStart {
        released: released_len() as u64,
        request_id,
        stages_kept,
    })
}

/// Most pool names a node gives ids to (see [`NativeNode::pool_id`]).
pub(crate) const MAX_POOL_IDS: usize = 1_024;

impl NativeNode {
    pub(crate) fn node(&self) -> &Node<Msg, Msg> {
        &self.node
    }

    pub(crate) fn listener(&self) -> Arc<dyn AskListener> {
        Arc::clone(&self.listener)
    }

    /// An ask or a tell (`flags`) by pool id; its request id, and whether
    /// its stage record was kept.
    fn ask(
        self: &Arc<Self>,
        pool: i64,
        msg: Msg,
        timeout_ms: u64,
        token: i64,
        flags: i64,
    ) -> (RequestId, bool) {
        let name = usize::try_from(pool)
            .ok()
            .and_then(|i| self.pool_names.load().get(i).cloned());
        let Some(name) = name else {
            let error = AskError::InvalidArgument {
                message: format!("unknown pool id {pool}"),
            };
            // Callbacks come from runtime threads only (they stay attached).
            let listener = Arc::clone(&self.listener);
            runtime().spawn(async move { listener.on_failure(token, Failure::from(&error)) });
            return (RequestId::from_u128(0), false);
        };
        let timeout = (timeout_ms > 0).then(|| millis(timeout_ms));
        let started = if flags & ONE_WAY != 0 {
            let mut tell = self.node.tell(name, msg);
            if let Some(timeout) = timeout {
                tell = tell.timeout(timeout);
            }
            Started::Tell(tell.send())
        } else {
            let mut ask = self.node.ask(name, msg);
            if let Some(timeout) = timeout {
                ask = ask.timeout(timeout);
            }
            Started::Ask(ask.send())
        };
        let request_id = started.ids().request_id;
        let stages_kept = self.start(started, token, flags & KEEP_STAGES != 0);
        (request_id, stages_kept)
    }

    /// Keeps the stage record of an ask if asked to (see `crate::stages`),
    /// then drives it; returns whether the record was kept.
    fn start(self: &Arc<Self>, started: Started, token: i64, keep_stages: bool) -> bool {
        let stages_kept = match &started {
            Started::Ask(h) if keep_stages && self.track_stages => {
                crate::stages::keep(token, h.stage_source(), Arc::clone(&self.listener));
                true
            }
            _ => false,
        };
        self.drive(started, token, stages_kept);
        stages_kept
    }

    /// The switch [`cancel`](Self::cancel) pulls for what runs under
    /// `token`, until [`forget_cancel`](Self::forget_cancel).
    pub(crate) fn register_cancel(&self, token: i64) -> oneshot::Receiver<()> {
        let (cancel_tx, cancel_rx) = oneshot::channel();
        self.asks.insert(token, cancel_tx);
        cancel_rx
    }

    pub(crate) fn forget_cancel(&self, token: i64) {
        self.asks.remove(token);
    }

    /// Runs an ask to its end on the runtime and reports the outcome.
    fn drive(self: &Arc<Self>, started: Started, token: i64, stages_kept: bool) {
        let cancel_rx = self.register_cancel(token);
        // One count on the node, not one each on its map and listener: every
        // asking thread writes these counts.
        let node = Arc::clone(self);
        crate::exec::spawn(async move {
            let outcome = AssertUnwindSafe(finish(started, cancel_rx))
                .catch_unwind()
                .await
                .unwrap_or_else(|panic| Err(AskError::internal(panic_message(panic.as_ref()))));
            node.forget_cancel(token);
            match outcome {
                Ok(Some(Msg::Host(r))) => events::push(events::REPLY, token, 0, r),
                Ok(Some(Msg::Bytes(b))) => node.listener.on_reply_bytes(token, b.to_vec()),
                // A reply of nothing, not `on_told`: a uniffi callback cost
                // a tell more than the rest of it.
                Ok(None) => events::push_unheld(events::REPLY, token, 0, events::NO_OBJECT),
                Err(e) => node.listener.on_failure(token, Failure::from(&e)),
            }
            // After the outcome, which nothing here may keep from its caller.
            if stages_kept {
                crate::stages::ended(token);
            }
        });
    }
}

/// The outcome of an ask (`Some(reply)`) or tell (`None`), cancelling it
/// when the caller asks to.
async fn finish(started: Started, cancel: oneshot::Receiver<()>) -> Result<Option<Msg>, AskError> {
    match started {
        Started::Ask(mut h) => tokio::select! {
            biased;
            r = &mut h => r.map(Some),
            c = cancel => {
                if c.is_ok() {
                    h.cancel();
                }
                h.await.map(Some)
            }
        },
        Started::Tell(mut h) => tokio::select! {
            biased;
            r = &mut h => r.map(|_| None),
            c = cancel => {
                // As for an ask: an acceptance that already arrived stands.
                if c.is_ok() {
                    h.cancel();
                }
                h.await.map(|_| None)
            }
        },
    }
}

pub(crate) fn panic_message(panic: &(dyn std::any::Any + Send)) -> String {
    let text = panic
        .downcast_ref::<&str>()
        .map(|s| s.to_string())
        .or_else(|| panic.downcast_ref::<String>().cloned())
        .unwrap_or_else(|| "unknown panic".to_owned());
    format!("panic in askpool: {text}")
}
