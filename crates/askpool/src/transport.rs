//! How frames travel between callers and pools.
//!
//! A [`WorkerTransport`] routes [`ToWorker`] frames to the pool they name and
//! [`ToCaller`] frames to the caller they name. The in-process transport hands
//! the frame objects straight to the registered endpoint: no serializer, no
//! copy. A cross-process transport implements the same trait with a codec;
//! wrappers (fault injection in tests and the demo) intercept `send_*`.

use std::sync::Arc;

use askpool_proto::{AskError, CallerId, PoolName, ToCaller, ToWorker};
use parking_lot::RwLock;
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
    fn register_caller(&self, caller: CallerId, endpoint: Arc<dyn CallerEndpoint<R>>);
    fn deregister_caller(&self, caller: CallerId);
    fn send_to_pool(&self, frame: ToWorker<M>) -> Result<(), AskError>;
    fn send_to_caller(&self, frame: ToCaller<R>) -> Result<(), AskError>;
}

/// Frames pass as objects to endpoints registered in this process. Several
/// nodes may share one (callers on one node, pools on another).
pub struct InProcessTransport<M, R> {
    pools: RwLock<FxHashMap<PoolName, Arc<dyn PoolEndpoint<M>>>>,
    callers: RwLock<FxHashMap<CallerId, Arc<dyn CallerEndpoint<R>>>>,
}

impl<M, R> Default for InProcessTransport<M, R> {
    fn default() -> Self {
        Self {
            pools: RwLock::default(),
            callers: RwLock::default(),
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
        let mut pools = self.pools.write();
        if pools.contains_key(&pool) {
            return Err(AskError::InvalidArgument {
                message: format!("a pool named {pool:?} is already registered"),
            });
        }
        pools.insert(pool, endpoint);
        Ok(())
    }

    fn deregister_pool(&self, pool: &PoolName) {
        self.pools.write().remove(pool);
    }

    fn register_caller(&self, caller: CallerId, endpoint: Arc<dyn CallerEndpoint<R>>) {
        self.callers.write().insert(caller, endpoint);
    }

    fn deregister_caller(&self, caller: CallerId) {
        self.callers.write().remove(&caller);
    }

    fn send_to_pool(&self, frame: ToWorker<M>) -> Result<(), AskError> {
        // Clone the endpoint out so delivery runs without the registry lock.
        let endpoint = self.pools.read().get(frame.pool()).cloned();
        match endpoint {
            Some(endpoint) => {
                endpoint.deliver(frame);
                Ok(())
            }
            None => Err(AskError::NoRoute {
                pool: frame.pool().to_string(),
            }),
        }
    }

    fn send_to_caller(&self, frame: ToCaller<R>) -> Result<(), AskError> {
        let endpoint = self.callers.read().get(&frame.caller()).cloned();
        match endpoint {
            Some(endpoint) => {
                endpoint.deliver(frame);
                Ok(())
            }
            None => Err(AskError::unavailable("caller is gone")),
        }
    }
}
