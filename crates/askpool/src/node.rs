//! [`Node`]: one per process (or per test). It is a caller (asks go out
//! through its transport) and hosts [`WorkerPool`]s (asks come in).

use std::future::Future;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Weak};

use askpool_dedup::DedupConfig;
use askpool_proto::{
    AskError, BreakerConfig, CallerId, Outcome, PoolName, RequestId, RetryPolicy, WorkerId,
};
use parking_lot::Mutex;
use rustc_hash::FxHashMap;

use crate::ask::{AskBuilder, AskHandle, AskOptions, ReplayHook, TellBuilder, TellHandle};
use crate::breakers::Breakers;
use crate::clock::{IdSource, NodeClock};
use crate::config::{NodeConfig, PoolConfig, TimeoutConfig};
use crate::dlq::{DeadLetter, DeadLetterKind, Filed};
use crate::pending::{CallerSide, LateOutcome};
use crate::pool::{PoolControl, PoolShared};
use crate::stats::{NodeStats, PoolStats};
use crate::telemetry;
use crate::transport::{InProcessTransport, WorkerTransport};
use crate::worker::{next_request, run_handler_loop, Request, RequestContext, Worker};

pub(crate) struct NodeShared<M, R> {
    pub(crate) config: NodeConfig,
    pub(crate) caller_id: CallerId,
    pub(crate) transport: Arc<dyn WorkerTransport<M, R>>,
    pub(crate) caller: Arc<CallerSide<M, R>>,
    pub(crate) clock: Arc<NodeClock>,
    pub(crate) ids: IdSource,
    pub(crate) breakers: Breakers,
    pools: Mutex<FxHashMap<PoolName, Arc<dyn PoolControl>>>,
    closed: AtomicBool,
}

impl<M, R> NodeShared<M, R> {
    pub(crate) fn is_closed(&self) -> bool {
        self.closed.load(Ordering::Acquire)
    }

    /// The node's retry policy for asks to `pool`.
    pub(crate) fn retry_policy(&self, pool: &PoolName) -> RetryPolicy {
        if self.config.pool_retry.is_empty() {
            return self.config.retry;
        }
        self.config
            .pool_retry
            .get(pool)
            .copied()
            .unwrap_or(self.config.retry)
    }
}

impl<M, R> NodeShared<M, R> {
    fn shutdown(&self) {
        if self.closed.swap(true, Ordering::AcqRel) {
            return;
        }
        self.caller.close();
        self.transport.deregister_caller(self.caller_id);
        self.caller.deadlines.close();
        let pools: Vec<_> = self.pools.lock().drain().map(|(_, p)| p).collect();
        for pool in pools {
            pool.close();
        }
        self.caller.abort_all(&AskError::node_closed());
    }
}

impl<M, R> Drop for NodeShared<M, R> {
    /// The last handle is gone: pools close (their queued requests are
    /// cancelled, their workers stop) and leave the transport, which breaks
    /// the pool <-> transport reference cycle. No ask can be pending here:
    /// a pending ask holds its node.
    fn drop(&mut self) {
        self.shutdown();
        // A pool may outlive its node (a worker kept by a binding) and
        // keeps the caller side it answers directly: not what it held.
        self.caller.forget();
    }
}

/// A caller of asks and a host of worker pools. Cheap to clone; the last
/// clone (and the last ask it started) dropping shuts it down.
pub struct Node<M, R> {
    pub(crate) shared: Arc<NodeShared<M, R>>,
}

impl<M, R> Clone for Node<M, R> {
    fn clone(&self) -> Self {
        Self {
            shared: Arc::clone(&self.shared),
        }
    }
}

impl<M, R> Default for Node<M, R>
where
    M: Clone + Send + 'static,
    R: Clone + Send + 'static,
{
    fn default() -> Self {
        Self::new()
    }
}

impl<M, R> Node<M, R>
where
    M: Clone + Send + 'static,
    R: Clone + Send + 'static,
{
    /// A node on its own in-process transport, with default settings.
    pub fn new() -> Self {
        Self::with_config(NodeConfig::default())
    }

    pub fn with_config(config: NodeConfig) -> Self {
        Self::with_transport(Arc::new(InProcessTransport::new()), config)
    }

    /// A node on a shared transport: nodes on one transport ask each other's
    /// pools.
    ///
    /// An invalid breaker configuration, retry policy or timeout (a zero
    /// `default_timeout`) is replaced by the default one (an invalid
    /// per-pool retry policy is dropped), and a `seed` whose caller id another
    /// live node already has on `transport` is dropped (the node gets a
    /// random seed), each reported with `tracing::warn!`; use
    /// [`try_with_transport`] to get the error instead.
    ///
    /// # Panics
    ///
    /// If `transport` refuses to register the node or its pools (a
    /// cross-process transport that is closed or unreachable): there is no
    /// node to fall back on. [`try_with_transport`] returns that error.
    ///
    /// [`try_with_transport`]: Self::try_with_transport
    pub fn with_transport(transport: Arc<dyn WorkerTransport<M, R>>, config: NodeConfig) -> Self {
        match Self::try_with_transport(Arc::clone(&transport), config.clone()) {
            Ok(node) => node,
            Err(error) => {
                tracing::warn!(%error, "invalid node config; using the defaults in its place");
                let defaults = NodeConfig::default();
                let default_timeout = if config.default_timeout.is_zero() {
                    defaults.default_timeout
                } else {
                    config.default_timeout
                };
                let fixed = NodeConfig {
                    breaker: config.breaker.map(|b| {
                        if b.validate().is_ok() {
                            b
                        } else {
                            BreakerConfig::default()
                        }
                    }),
                    default_timeout,
                    timeouts: if config.timeouts.validate().is_ok() {
                        config.timeouts
                    } else {
                        TimeoutConfig::default()
                    },
                    retry: if config.retry.validate().is_ok() {
                        config.retry
                    } else {
                        defaults.retry
                    },
                    pool_retry: config
                        .pool_retry
                        .into_iter()
                        .filter(|(_, policy)| policy.validate().is_ok())
                        .collect(),
                    ..config
                };
                match Self::try_with_transport(Arc::clone(&transport), fixed.clone()) {
                    Ok(node) => node,
                    // The seed's caller id is taken on this transport.
                    Err(_) => Self::try_with_transport(
                        transport,
                        NodeConfig {
                            seed: None,
                            ..fixed
                        },
                    )
                    .unwrap_or_else(|error| {
                        panic!("the transport refused the node: {error} (try_with_transport returns it)")
                    }),
                }
            }
        }
    }

    /// A node on a shared transport, or the error in `config`
    /// (`InvalidArgument` also when another live node on `transport` has
    /// the caller id of `config.seed`).
    pub fn try_with_transport(
        transport: Arc<dyn WorkerTransport<M, R>>,
        config: NodeConfig,
    ) -> Result<Self, AskError> {
        if config.default_timeout.is_zero() {
            return Err(AskError::InvalidArgument {
                message: "default_timeout must be positive".into(),
            });
        }
        config.timeouts.validate()?;
        // Here, not at each ask: a bad policy failed every ask otherwise.
        config.retry.validate()?;
        for policy in config.pool_retry.values() {
            policy.validate()?;
        }
        let breakers = Breakers::new(config.breaker)?;
        telemetry::describe();
        let seed = config.seed.unwrap_or_else(rand::random);
        let ids = IdSource::new(seed, config.seed.is_some());
        let caller_id = CallerId::from_u64(ids.next_u64());
        let clock = Arc::new(NodeClock::new(config.seed.is_some()));
        let caller = CallerSide::new(
            Arc::clone(&clock),
            config.dlq_capacity,
            config.reconcile_capacity,
            config.reconcile_window,
        );
        transport.register_caller(caller_id, caller.clone())?;
        Ok(Self {
            shared: Arc::new(NodeShared {
                clock,
                breakers,
                config,
                caller_id,
                transport,
                caller,
                ids,
                pools: Mutex::default(),
                closed: AtomicBool::new(false),
            }),
        })
    }

    pub fn caller_id(&self) -> CallerId {
        self.shared.caller_id
    }

    /// The node's bound on payloads of known size
    /// ([`NodeConfig::max_payload_bytes`]).
    pub fn max_payload_bytes(&self) -> Option<usize> {
        self.shared.config.max_payload_bytes
    }

    pub fn transport(&self) -> Arc<dyn WorkerTransport<M, R>> {
        Arc::clone(&self.shared.transport)
    }

    /// Starts an ask of `msg` to `pool`; `.await` it or call `.send()`.
    pub fn ask(&self, pool: impl Into<PoolName>, msg: M) -> AskBuilder<'_, M, R> {
        AskBuilder::new(self, pool.into(), msg)
    }

    /// A one-way message, deduplicated like an ask: a duplicate tell (same
    /// request id) is not run again. Resolves when the pool accepted it (or
    /// refused it); nothing comes back afterwards.
    pub fn tell(&self, pool: impl Into<PoolName>, msg: M) -> TellBuilder<'_, M, R> {
        TellBuilder::new(self, pool.into(), msg)
    }

    /// Starts declaring a pool named `name` hosted by this node.
    pub fn pool(&self, name: impl Into<PoolName>) -> PoolBuilder<'_, M, R> {
        PoolBuilder {
            node: self,
            name: name.into(),
            config: PoolConfig::default(),
        }
    }

    pub fn stats(&self) -> NodeStats {
        let caller = &self.shared.caller;
        let (mut capacity, mut ttl) = (0, 0);
        let mut pools: Vec<PoolStats> = self
            .shared
            .pools
            .lock()
            .values()
            .map(|p| {
                let stats = p.stats();
                let (c, t) = p.unpublished_evictions(&stats.dedup);
                (capacity, ttl) = (capacity + c, ttl + t);
                stats
            })
            .collect();
        pools.sort_by(|a, b| a.name.cmp(&b.name));
        telemetry::dedup_evictions(capacity, ttl);
        let (dlq_depth, dlq_dropped) = {
            let dlq = caller.dlq.lock();
            (dlq.len(), dlq.dropped())
        };
        NodeStats {
            pending: caller.pending.len(),
            armed_timers: caller.armed_timers.load(Ordering::Relaxed) + caller.deadlines.live(),
            queued_deadlines: caller.deadlines.len(),
            retries: caller.retries.load(Ordering::Relaxed),
            ignored_frames: caller.ignored_frames.load(Ordering::Relaxed),
            late_outcomes: caller.late_outcomes.load(Ordering::Relaxed),
            timed_out_records: caller.timed_out_len(),
            dlq_depth,
            dlq_dropped,
            breakers: self.shared.breakers.stats(self.shared.clock.now()),
            pools,
        }
    }

    /// Whether an ask with this request id is in flight on this node (a
    /// second one with the same id is refused until it ends).
    pub fn is_pending(&self, id: RequestId) -> bool {
        self.shared.caller.pending.get(id).is_some()
    }

    /// The dead letters, oldest first.
    pub fn dead_letters(&self) -> Vec<DeadLetter<M>> {
        self.shared.caller.dlq.lock().iter().cloned().collect()
    }

    pub fn dead_letter(&self, id: RequestId) -> Option<DeadLetter<M>> {
        self.shared.caller.dlq.lock().get(id).cloned()
    }

    /// Takes an ask's dead letter out of the queue and asks it again, with
    /// its request id, ids and pool (a pool that finished it answers from
    /// its cache). If the replay fails, however it fails (its pool is gone:
    /// `NoRoute`), the letter goes back to the queue with the new error;
    /// a replay cancelled by its caller does not. `FailedPrecondition` if
    /// there is no such letter, or if it is a tell's (it stays queued:
    /// [`replay_dead_tell`](Self::replay_dead_tell) replays it).
    pub fn replay_dead_letter(&self, id: RequestId) -> Result<AskHandle<M, R>, AskError> {
        let (letter, hook) = self.take_dead_letter(id, Some(DeadLetterKind::Ask))?;
        Ok(self.replay_ask(letter, hook))
    }

    /// Takes a tell's dead letter out of the queue and tells it again, as
    /// [`replay_dead_letter`](Self::replay_dead_letter) asks an ask's: the
    /// handle resolves when the pool accepts it, as a tell's does, and a
    /// pool that ran it already acknowledges it without running it again.
    /// `FailedPrecondition` if there is no such letter, or if it is an
    /// ask's (it stays queued).
    pub fn replay_dead_tell(&self, id: RequestId) -> Result<TellHandle<M, R>, AskError> {
        let (letter, hook) = self.take_dead_letter(id, Some(DeadLetterKind::Tell))?;
        Ok(self.replay_tell(letter, hook))
    }

    /// Replays a dead letter of either kind as what it was sent as: for
    /// code that handles every letter alike (a binding, a tool).
    /// `FailedPrecondition` if there is no such letter.
    pub fn replay_dead_letter_as_sent(&self, id: RequestId) -> Result<Replay<M, R>, AskError> {
        let (letter, hook) = self.take_dead_letter(id, None)?;
        Ok(match letter.kind {
            DeadLetterKind::Ask => Replay::Ask(self.replay_ask(letter, hook)),
            DeadLetterKind::Tell => Replay::Tell(self.replay_tell(letter, hook)),
        })
    }

    fn replay_ask(&self, letter: DeadLetter<M>, hook: Option<ReplayHook<R>>) -> AskHandle<M, R> {
        let options = replay_options(&letter);
        self.ask(letter.pool, letter.payload)
            .options(options)
            .refile_on_failure(letter.reason)
            .replay_hook(hook)
            .send()
    }

    fn replay_tell(&self, letter: DeadLetter<M>, hook: Option<ReplayHook<R>>) -> TellHandle<M, R> {
        let options = replay_options(&letter);
        self.tell(letter.pool, letter.payload)
            .options(options)
            .refile_on_failure(letter.reason)
            .replay_hook(hook)
            .send()
    }

    /// The letter `id` taken out if it is of `kind` (`None`: any).
    fn take_dead_letter(
        &self,
        id: RequestId,
        kind: Option<DeadLetterKind>,
    ) -> Result<(DeadLetter<M>, Option<ReplayHook<R>>), AskError> {
        let taken = self.shared.caller.dlq.lock().take_kind(id, kind);
        let Filed {
            letter,
            replay_hook,
        } = taken.map_err(|found| {
            let message = match found {
                None => format!("no dead letter with request id {id}"),
                // A tell replayed as an ask would wait for a reply that is
                // never sent (or get its handler's answer from a pool's
                // cache); an ask replayed as a tell would lose its reply.
                Some(DeadLetterKind::Tell) => format!(
                    "the dead letter with request id {id} is a tell's: replay it with replay_dead_tell"
                ),
                Some(DeadLetterKind::Ask) => format!(
                    "the dead letter with request id {id} is an ask's: replay it with replay_dead_letter"
                ),
            };
            AskError::FailedPrecondition { message }
        })?;
        Ok((letter, replay_hook))
    }

    /// Empties the dead-letter queue; returns how many letters it held.
    pub fn purge_dead_letters(&self) -> usize {
        self.shared.caller.dlq.lock().purge()
    }

    /// Called with every late outcome: the worker finished an ask after this
    /// node had timed it out. Runs on the thread that delivered the frame; it
    /// must not block.
    pub fn on_late_outcome(&self, hook: impl Fn(LateOutcome<R>) + Send + Sync + 'static) {
        self.shared.caller.set_late_hook(Some(Arc::new(hook)));
    }

    /// Drops terminal dedup entries whose TTL has passed, in every pool,
    /// now (each pool also does so by itself: on its own traffic, and by a
    /// sweep while it has none).
    pub fn evict_expired(&self) {
        for pool in self.shared.pools.lock().values() {
            pool.evict_expired();
        }
    }

    /// Shuts the node down: every pending ask fails with `Unavailable`
    /// ("node closed"), pools stop admitting and cancel what is queued, and
    /// new asks fail at once. Idempotent.
    pub fn shutdown(&self) {
        self.shared.shutdown();
    }

    pub fn is_closed(&self) -> bool {
        self.shared.is_closed()
    }

    fn add_pool(
        &self,
        name: PoolName,
        config: PoolConfig,
    ) -> Result<Arc<PoolShared<M, R>>, AskError> {
        name.validate()?;
        config.validate()?;
        if self.shared.is_closed() {
            return Err(AskError::node_closed());
        }
        let config = PoolConfig {
            processing_timeout: config.processing_timeout.or(self
                .shared
                .config
                .timeouts
                .processing),
            ..config
        };
        let pool = PoolShared::new(
            name.clone(),
            config,
            Arc::clone(&self.shared.transport),
            Arc::clone(&self.shared.clock),
            self.shared
                .transport
                .hands_over_directly()
                .then(|| (self.shared.caller_id, Arc::clone(&self.shared.caller))),
        );
        let mut pools = self.shared.pools.lock();
        if pools.contains_key(&name) {
            return Err(AskError::InvalidArgument {
                message: format!("pool {name:?} already exists on this node"),
            });
        }
        self.shared
            .transport
            .register_pool(name.clone(), pool.clone())?;
        pools.insert(name, pool.clone() as Arc<dyn PoolControl>);
        Ok(pool)
    }

    /// Closes `pool` and takes it out of the node's map, if the map still
    /// holds it: a pool of the same name declared since is another pool,
    /// which a stale handle must not close.
    fn remove_pool(&self, pool: &Arc<PoolShared<M, R>>) {
        let mut pools = self.shared.pools.lock();
        let same = pools
            .get(&pool.name)
            .is_some_and(|held| std::ptr::addr_eq(Arc::as_ptr(held), Arc::as_ptr(pool)));
        if same {
            pools.remove(&pool.name);
        }
        drop(pools);
        pool.close();
    }
}

/// A dead letter's replay, as [`Node::replay_dead_letter_as_sent`] sends
/// it: an ask's awaits the reply, a tell's the pool's acceptance.
#[derive(Debug)]
pub enum Replay<M: Clone + Send + 'static, R: Clone + Send + 'static> {
    Ask(AskHandle<M, R>),
    Tell(TellHandle<M, R>),
}

impl<M: Clone + Send + 'static, R: Clone + Send + 'static> Replay<M, R> {
    pub fn ids(&self) -> &askpool_proto::AskIds {
        match self {
            Replay::Ask(h) => h.ids(),
            Replay::Tell(h) => h.ids(),
        }
    }
}

/// A replay is sent with its letter's ids and fingerprint; its timeout and
/// retry policy are the node's.
fn replay_options<M>(letter: &DeadLetter<M>) -> AskOptions {
    AskOptions {
        request_id: Some(letter.ids.request_id),
        correlation_id: Some(letter.ids.correlation_id),
        causation_id: letter.ids.causation_id,
        fingerprint: letter.fingerprint,
        ..AskOptions::default()
    }
}

/// Options of a pool; finish with [`handler`](Self::handler) (workers run an
/// async closure) or [`build`](Self::build) (pull requests yourself).
#[must_use = "a pool is created by .handler() or .build()"]
pub struct PoolBuilder<'a, M, R> {
    node: &'a Node<M, R>,
    name: PoolName,
    config: PoolConfig,
}

impl<'a, M, R> PoolBuilder<'a, M, R>
where
    M: Clone + Send + 'static,
    R: Clone + Send + 'static,
{
    /// Worker tasks of a handler pool.
    pub fn concurrency(mut self, n: usize) -> Self {
        self.config.concurrency = n;
        self
    }
    /// Admitted, unfinished requests allowed before `BufferFull`.
    pub fn max_in_flight(mut self, n: usize) -> Self {
        self.config.max_in_flight = n;
        self
    }
    /// Bounds of the pool's reply cache.
    pub fn dedup(mut self, dedup: DedupConfig) -> Self {
        self.config.dedup = dedup;
        self
    }
    pub fn config(mut self, config: PoolConfig) -> Self {
        self.config = config;
        self
    }

    /// A pool whose requests you pull with `next_request` / `worker(..)`.
    pub fn build(self) -> Result<WorkerPool<M, R>, AskError> {
        let shared = self.node.add_pool(self.name, self.config)?;
        Ok(WorkerPool {
            node: self.node.clone(),
            shared,
        })
    }

    /// A pool of `concurrency` workers (named `w0`, `w1`, ...) that run
    /// `handler`. Needs a tokio runtime. The handler's error reaches the
    /// caller as [`AskError::from_handler_error`] maps it (an inner ask's
    /// timeout passed on with `?` is `HandlerFailed`, not the caller's own
    /// timeout); a panic is `HandlerFailed` with type `panic`. A request
    /// pulled with `next_request` is answered with exactly what
    /// `Responder::fail` is given. The workers are tasks of the current
    /// runtime: if it shuts down while the node lives on, the pool closes
    /// (later asks get `NoRoute`), and the panic of a handler is logged.
    pub fn handler<F, Fut>(self, handler: F) -> Result<WorkerPool<M, R>, AskError>
    where
        F: Fn(M, RequestContext) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = Outcome<R>> + Send + 'static,
    {
        let runtime =
            tokio::runtime::Handle::try_current().map_err(|_| AskError::FailedPrecondition {
                message: "a handler pool must be created inside a tokio runtime".into(),
            })?;
        let pool = self.build()?;
        let handler = Arc::new(handler);
        let alive = Arc::new(HandlerLoops {
            node: Arc::downgrade(&pool.node.shared),
            pool: Arc::clone(&pool.shared),
        });
        for i in 0..pool.shared.config.concurrency {
            let worker = pool.worker(format!("w{i}"))?;
            let alive = Arc::clone(&alive);
            let run = run_handler_loop(worker, Arc::clone(&handler));
            runtime.spawn(async move {
                run.await;
                drop(alive);
            });
        }
        Ok(pool)
    }
}

/// Held by each worker task of a handler pool. The tasks end when the pool
/// closes, or when the runtime they were spawned on shuts down (their
/// futures are dropped) while the node lives on. In that second case
/// nothing would take the pool's requests any more, so it is closed: new
/// asks get `NoRoute` at once instead of each waiting out its timeout in a
/// queue no one drains.
struct HandlerLoops<M: Clone + Send + 'static, R: Clone + Send + 'static> {
    node: Weak<NodeShared<M, R>>,
    pool: Arc<PoolShared<M, R>>,
}

impl<M: Clone + Send + 'static, R: Clone + Send + 'static> Drop for HandlerLoops<M, R> {
    fn drop(&mut self) {
        if self.pool.is_closed() {
            return;
        }
        tracing::error!(
            pool = %self.pool.name,
            "the runtime running this pool's handlers shut down; the pool is closed"
        );
        match self.node.upgrade() {
            Some(shared) => Node { shared }.remove_pool(&self.pool),
            None => self.pool.close(),
        }
    }
}

/// A pool hosted by a node.
pub struct WorkerPool<M, R> {
    node: Node<M, R>,
    shared: Arc<PoolShared<M, R>>,
}

impl<M, R> WorkerPool<M, R>
where
    M: Clone + Send + 'static,
    R: Clone + Send + 'static,
{
    pub fn name(&self) -> &PoolName {
        &self.shared.name
    }

    /// The next request from the pool's shared queue; `None` once closed.
    pub async fn next_request(&self) -> Option<Request<M, R>> {
        next_request(&self.shared, None).await
    }

    /// Registers a named worker: asks that prefer it go to it while it lives.
    pub fn worker(&self, id: impl Into<WorkerId>) -> Result<Worker<M, R>, AskError> {
        Worker::register(&self.shared, id.into())
    }

    pub fn stats(&self) -> PoolStats {
        self.shared.stats()
    }

    #[cfg(test)]
    pub(crate) fn shared(&self) -> &Arc<PoolShared<M, R>> {
        &self.shared
    }

    /// Closes the pool: it leaves the transport (new asks get `NoRoute`),
    /// its queued requests are cancelled, its workers stop. Handlers still
    /// running are not interrupted but see their context cancelled
    /// (`RequestContext::is_cancelled`); a reply they still give reaches
    /// its caller. Its dedup state is gone with it, as after a
    /// worker-process restart.
    pub fn close(&self) {
        self.node.remove_pool(&self.shared);
    }
}
