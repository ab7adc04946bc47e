//! The sweeper: times out expired pending promises nobody touches, so
//! their resume tasks go out and their invoke tasks end on time.

use std::sync::Arc;
use std::time::Duration;

use tokio::task::JoinHandle;

use crate::durable::now_millis;
use crate::skipped_log::{SkippedRows, SweeperLog};
use crate::store::{off_runtime, Store};

/// Every `every` (at least a millisecond: tokio's timer has no finer
/// tick, and a zero period would panic the task), sweeps in batches of
/// `batch` (at least 1) until a batch comes back short. Needs a tokio
/// runtime; abort the handle to stop it. A storage error is logged and
/// retried at the next tick. Each sweep runs on tokio's blocking threads:
/// a store shared with other processes waits for their writes (up to its
/// busy timeout, 5 s by default), which must not stall the runtime. A
/// corrupt row is skipped (see [`Store::sweep`]): it holds up no other
/// promise. It stays in the file, met by every tick, and is logged as a
/// warning when the sweeper first meets it (a warning names what the ticks
/// skip each time that changes, not at every tick); a tick that timed out
/// or skipped anything says so at debug level.
pub fn spawn_sweeper(store: Arc<dyn Store>, every: Duration, batch: usize) -> JoinHandle<()> {
    let batch = batch.max(1);
    let every = every.max(Duration::from_millis(1));
    tokio::spawn(async move {
        let mut tick = tokio::time::interval(every);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let mut log = SweeperLog::default();
        loop {
            tick.tick().await;
            let mut timed_out = 0;
            let mut skipped = SkippedRows::default();
            let finished = loop {
                let store = Arc::clone(&store);
                match off_runtime(move || store.sweep(now_millis(), batch)).await {
                    Ok(swept) => {
                        timed_out += swept.timed_out;
                        skipped.add(swept.skipped, &swept.corrupt);
                        if swept.timed_out < batch {
                            break true;
                        }
                        tokio::task::yield_now().await;
                    }
                    Err(error) => {
                        tracing::warn!(%error, "promise sweep failed");
                        break false;
                    }
                }
            };
            if timed_out > 0 || skipped.count() > 0 {
                tracing::debug!(timed_out, skipped = skipped.count(), "promise sweep");
            }
            // A failed tick may have met only some of the rows: it changes
            // nothing of what was said.
            if finished {
                log.tick(skipped);
            }
        }
    })
}
