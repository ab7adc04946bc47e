//! The sweeper: times out expired pending promises nobody touches, so
//! their resume tasks go out and their invoke tasks end on time.

use std::sync::Arc;
use std::time::Duration;

use tokio::task::JoinHandle;

use crate::durable::now_millis;
use crate::store::{off_runtime, Store};

/// Every `every` (at least a millisecond: tokio's timer has no finer
/// tick, and a zero period would panic the task), sweeps in batches of
/// `batch` (at least 1) until a batch comes back short. Needs a tokio
/// runtime; abort the handle to stop it. A storage error is logged and
/// retried at the next tick. Each sweep runs on tokio's blocking threads:
/// a store shared with other processes waits for their writes (up to its
/// busy timeout, 5 s by default), which must not stall the runtime. A
/// corrupt row is skipped and logged by each sweep that meets it (see
/// [`Store::sweep`]): it holds up no other promise.
pub fn spawn_sweeper(store: Arc<dyn Store>, every: Duration, batch: usize) -> JoinHandle<()> {
    let batch = batch.max(1);
    let every = every.max(Duration::from_millis(1));
    tokio::spawn(async move {
        let mut tick = tokio::time::interval(every);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tick.tick().await;
            loop {
                let store = Arc::clone(&store);
                match off_runtime(move || store.sweep(now_millis(), batch)).await {
                    // Corrupt rows it skipped were logged as it met them.
                    Ok(swept) if swept.timed_out == batch => tokio::task::yield_now().await,
                    Ok(_) => break,
                    Err(error) => {
                        tracing::warn!(%error, "promise sweep failed");
                        break;
                    }
                }
            }
        }
    })
}
