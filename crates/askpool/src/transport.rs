//! How frames travel between callers and pools.
//!
//! A [`WorkerTransport`] routes [`ToWorker`] frames to the pool they name and
//! [`ToCaller`] frames to the caller they name. The in-process transport hands
//! the frame objects straight to the registered endpoint: no serializer, no
//! copy. A cross-process transport implements the same trait with a codec;
//! wrappers (fault injection in tests and the demo) intercept `send_*`.

use std::sync::Arc;

use std::hash::Hash;

use arc_swap::{ArcSwap, Guard};
use askpool_proto::{AskError, CallerId, PoolName, ToCaller, ToWorker};
use parking_lot::Mutex;
use rustc_hash::FxHashMap;

/// The receiving side of a pool: admits requests and cancels.
pub trait PoolEndpoint<M>: Send + Sync {
    fn deliver(&self, frame: ToWorker<M>);
}

/// The receiving side of a caller: completes its pending asks.
pub trait CallerEndpoint<R>: Send + Sync {
    fn deliver(&self, frame: ToCaller<R>);
}

/// Moves protocol frames between callers and worker pools.
///
/// `send_*` must not block: they are called from async code. A delivery that
/// cannot be made now returns an error the caller's state machine classifies
/// (`NoRoute` is permanent, `Unavailable` is retried).
pub trait WorkerTransport<M, R>: Send + Sync {
    fn register_pool(
        &self,
        pool: PoolName,
        endpoint: Arc<dyn PoolEndpoint<M>>,
    ) -> Result<(), AskError>;
    fn deregister_pool(&self, pool: &PoolName);
    /// Registers a caller; `InvalidArgument` if `caller` is already
    /// registered (two live nodes with one caller id would receive each
    /// other's replies, and the first to close would unregister both).
    fn register_caller(
        &self,
        caller: CallerId,
        endpoint: Arc<dyn CallerEndpoint<R>>,
    ) -> Result<(), AskError>;
    fn deregister_caller(&self, caller: CallerId);
    fn send_to_pool(&self, frame: ToWorker<M>) -> Result<(), AskError>;
    fn send_to_caller(&self, frame: ToCaller<R>) -> Result<(), AskError>;

    /// Whether every frame between a node and its own pools would pass
    /// unchanged, at once and in order (the in-process transport): such a
    /// node's pools then answer its asks straight into their pending
    /// slots, instead of routing each frame back by caller and request id.
    /// A transport that may drop, delay, reorder, copy or encode a frame
    /// (a fault injector, a tap, a codec) must answer `false`, the default,
    /// so that every frame goes through it.
    fn hands_over_directly(&self) -> bool {
        false
    }
}

/// Frames pass as objects to endpoints registered in this process. Several
/// nodes may share one (callers on one node, pools on another).
pub struct InProcessTransport<M, R> {
    pools: Registry<PoolName, Arc<dyn PoolEndpoint<M>>>,
    callers: Registry<CallerId, Arc<dyn CallerEndpoint<R>>>,
}

impl<M, R> Default for InProcessTransport<M, R> {
    fn default() -> Self {
        Self {
            pools: Registry::default(),
            callers: Registry::default(),
        }
    }
}

impl<M, R> InProcessTransport<M, R> {
    pub fn new() -> Self {
        Self::default()
    }
}

impl<M: Send + 'static, R: Send + 'static> WorkerTransport<M, R> for InProcessTransport<M, R> {
    fn register_pool(
        &self,
        pool: PoolName,
        endpoint: Arc<dyn PoolEndpoint<M>>,
    ) -> Result<(), AskError> {
        self.pools.change(|pools| {
            if pools.contains_key(&pool) {
                return Err(AskError::InvalidArgument {
                    message: format!("a pool named {pool:?} is already registered"),
                });
            }
            pools.insert(pool, endpoint);
            Ok(())
        })
    }

    fn deregister_pool(&self, pool: &PoolName) {
        self.pools.change(|pools| pools.remove(pool));
    }

    fn register_caller(
        &self,
        caller: CallerId,
        endpoint: Arc<dyn CallerEndpoint<R>>,
    ) -> Result<(), AskError> {
        self.callers.change(|callers| {
            if callers.contains_key(&caller) {
                return Err(AskError::InvalidArgument {
                    message: format!(
                        "caller id {caller} is already registered on this transport \
                         (two live nodes with the same NodeConfig::seed?)"
                    ),
                });
            }
            callers.insert(caller, endpoint);
            Ok(())
        })
    }

    fn deregister_caller(&self, caller: CallerId) {
        self.callers.change(|callers| callers.remove(&caller));
    }

    fn send_to_pool(&self, frame: ToWorker<M>) -> Result<(), AskError> {
        let pools = self.pools.snapshot();
        match pools.get(frame.pool()) {
            Some(endpoint) => {
                endpoint.deliver(frame);
                Ok(())
            }
            None => Err(AskError::NoRoute {
                pool: frame.pool().for_error(),
            }),
        }
    }

    fn hands_over_directly(&self) -> bool {
        true
    }

    fn send_to_caller(&self, frame: ToCaller<R>) -> Result<(), AskError> {
        let callers = self.callers.snapshot();
        match callers.get(&frame.caller()) {
            Some(endpoint) => {
                endpoint.deliver(frame);
                Ok(())
            }
            None => Err(AskError::unavailable("caller is gone")),
        }
    }
}

/// A map read on every frame and changed only when a pool or caller comes
/// or goes. Readers load a snapshot without a lock or a reference count (a
/// `RwLock` read and an `Arc` clone per frame are shared-cache-line writes
/// that two threads passing frames fight over); writers copy the map.
struct Registry<K, V> {
    map: ArcSwap<FxHashMap<K, V>>,
    /// Serializes writers, so a check-then-insert sees the latest map.
    writer: Mutex<()>,
}

impl<K, V> Default for Registry<K, V> {
    fn default() -> Self {
        Self {
            map: ArcSwap::from_pointee(FxHashMap::default()),
            writer: Mutex::new(()),
        }
    }
}

impl<K: Clone + Eq + Hash, V: Clone> Registry<K, V> {
    /// The current map. A frame is delivered while its snapshot is held;
    /// a registration made meanwhile applies from the next frame on.
    fn snapshot(&self) -> Guard<Arc<FxHashMap<K, V>>> {
        self.map.load()
    }

    fn change<T>(&self, edit: impl FnOnce(&mut FxHashMap<K, V>) -> T) -> T {
        let _writer = self.writer.lock();
        let mut map = FxHashMap::clone(&self.map.load());
        let out = edit(&mut map);
        self.map.store(Arc::new(map));
        out
    }
}
