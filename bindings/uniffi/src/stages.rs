//! Stage records kept for the host's ask handles, opened when a handle's
//! stages are first collected. Most handles never read their stages: a
//! stream opened at the start of every ask called back into the JVM for
//! each stage (a uniffi callback, tens of microseconds in JNA), about as
//! much as the rest of the ask. A record opened late starts from the ask's
//! history (`StageSource`), so nothing is lost by waiting.
//!
//! A record kept for an ask that has ended is a copy of its events: the
//! ask's own record kept what it held (a reply that arrived after a cancel)
//! until the JVM collected the handle.
//!
//! A record is kept under the token of the ask that made it: the Kotlin
//! side's tokens are unique in the process (a slot's generation changes
//! when it is freed) and carry the asking thread's stripe in their low
//! bits, so each thread mostly keeps to its own shard.

use std::panic::catch_unwind;
use std::sync::{Arc, LazyLock};

use askpool::shard::ShardedMap;
use askpool::{StageEvent, StageSource};
use futures::stream::BoxStream;
use futures::{FutureExt, StreamExt};
use parking_lot::MutexGuard;
use rustc_hash::FxHashMap;

use crate::host::{AskListener, Stage};
use crate::payload::Msg;
use crate::runtime::runtime;

enum Record {
    /// The ask runs.
    Live(StageSource<Msg>),
    /// The ask ended with these stages.
    Ended(Vec<StageEvent>),
}

struct Kept {
    record: Record,
    /// The listener of the node that started the ask: the stream reports
    /// there even after the node is shut down.
    listener: Arc<dyn AskListener>,
}

static KEPT: LazyLock<ShardedMap<i64, Kept>> = LazyLock::new(ShardedMap::default);

fn shard(token: i64) -> MutexGuard<'static, FxHashMap<i64, Kept>> {
    KEPT.lock((token as usize) & (KEPT.shards() - 1))
}

/// Keeps `source` under `token` until [`open_stages`] or
/// [`askpool_hot_stages_free`].
pub(crate) fn keep(token: i64, source: StageSource<Msg>, listener: Arc<dyn AskListener>) {
    let record = Record::Live(source);
    shard(token).insert(token, Kept { record, listener });
}

/// The ask under `token` ended: its record, if still kept and complete,
/// becomes a copy of its stages.
pub(crate) fn ended(token: i64) {
    let mut shard = shard(token);
    let Some(kept) = shard.get_mut(&token) else {
        return;
    };
    let Record::Live(source) = &kept.record else {
        return;
    };
    let mut stream = source.open();
    let mut events = Vec::new();
    loop {
        match stream.next().now_or_never() {
            Some(Some(event)) => events.push(event),
            Some(None) => break,
            // No terminal stage yet: the record stays live (the stream's
            // drop lets the next one start from the record again).
            None => return,
        }
    }
    drop(stream);
    let live = std::mem::replace(&mut kept.record, Record::Ended(events));
    // Let go of once the shard is unlocked: what the ask's record held
    // (a reply's host object) is released through a lock of its own.
    drop(shard);
    drop(live);
}

/// Streams the stages kept under `token` to its node's listener
/// (`on_stage`, then `on_stages_end`, under `token`), and lets the record
/// go. False if nothing is kept under `token` (never kept, opened or freed).
#[uniffi::export]
pub fn open_stages(token: i64) -> bool {
    let Some(Kept { record, listener }) = shard(token).remove(&token) else {
        return false;
    };
    let mut stream: BoxStream<'static, StageEvent> = match record {
        Record::Live(source) => source.open().boxed(),
        Record::Ended(events) => futures::stream::iter(events).boxed(),
    };
    runtime().spawn(async move {
        while let Some(event) = stream.next().await {
            listener.on_stage(token, stage_of(&event));
        }
        listener.on_stages_end(token);
    });
    true
}

/// Lets go of the record kept under `token` (its handle was collected
/// before its stages were read). Returns 0, or -2 if it panicked.
#[no_mangle]
pub extern "C" fn askpool_hot_stages_free(token: i64) -> i32 {
    catch_unwind(|| {
        // Dropped once the shard is unlocked: the last hold of a listener
        // calls into the JVM.
        let kept = shard(token).remove(&token);
        drop(kept);
    })
    .map(|()| 0)
    .unwrap_or(-2)
}

/// Stage records kept and not yet opened or freed, in the process (leak
/// tests).
#[uniffi::export]
pub fn kept_stage_records() -> u64 {
    KEPT.len() as u64
}

fn stage_of(e: &StageEvent) -> Stage {
    Stage {
        stage: e.stage.as_str().to_owned(),
        since_previous_micros: e.since_previous.as_micros() as u64,
        since_sent_micros: e.since_sent.as_micros() as u64,
        progress: e.progress.as_ref().map(|p| p.fraction),
        note: e.progress.as_ref().map(|p| p.note.clone()),
    }
}
