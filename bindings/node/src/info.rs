//! Plain objects handed to the wrapper.

use askpool::{AskIds, DeadLetter, NodeStats, Progress, StageEvent};
use napi::bindgen_prelude::{Buffer, Either, Null, Uint8Array};
use napi_derive::napi;

use crate::errors::ErrorInfo;
use crate::tok::Tok;

#[napi(object)]
pub struct NodeOptions {
    /// Timeout of an ask that sets none (default 30 s).
    pub default_timeout_ms: Option<f64>,
    /// Most dead letters kept (default 1,000).
    pub dlq_capacity: Option<f64>,
    /// Record each ask's ACK stages (default true).
    pub track_stages: Option<bool>,
    /// A circuit breaker per target pool (default true).
    pub breaker: Option<bool>,
    /// Timed-out asks remembered for late outcomes (default 10,000).
    pub reconcile_capacity: Option<f64>,
    /// Processing timeout of the node's pools (default 5 minutes).
    pub processing_timeout_ms: Option<f64>,
    /// Largest payload of a known size (bytes) an ask or tell may carry
    /// (default 16 MiB); `null` lifts the bound.
    pub max_payload_bytes: Option<Either<f64, Null>>,
}

#[napi(object)]
pub struct PoolOptions {
    /// Workers, 1 to 65,536 (default 1).
    pub concurrency: Option<f64>,
    pub max_in_flight: Option<f64>,
    /// Reply-cache entries kept (default 100,000).
    pub dedup_max: Option<f64>,
    /// How long a reply stays cached (default 120 s).
    pub dedup_ttl_ms: Option<f64>,
    pub processing_timeout_ms: Option<f64>,
}

#[napi(object)]
pub struct AskOptions {
    pub timeout_ms: Option<f64>,
    pub preferred_worker: Option<String>,
    /// 32 hex digits.
    pub request_id: Option<String>,
    /// 32 hex digits.
    pub correlation_id: Option<String>,
    /// 32 hex digits: the request that caused this one.
    pub causation_id: Option<String>,
    /// Total sends, the first included (default 4).
    pub max_attempts: Option<f64>,
    /// What guards a reused request id against another payload: the bytes
    /// (a string's UTF-8) are hashed into the core's payload fingerprint.
    pub fingerprint: Option<Either<String, Uint8Array>>,
    /// The payload's size in bytes, when the wrapper knows it (byte
    /// payloads): over the node's `maxPayloadBytes` the ask fails at once.
    pub payload_size: Option<f64>,
}

#[napi(object)]
pub struct StageInfo {
    /// `SENT`, `RECEIVED`, `READ`, `PARTIAL`, `FULFILLED`, `REJECTED`,
    /// `FAILED` or `TIMED_OUT`.
    pub stage: String,
    pub since_sent_ms: f64,
    pub since_previous_ms: f64,
    pub fraction: Option<f64>,
    pub note: Option<String>,
}

impl From<&StageEvent> for StageInfo {
    fn from(event: &StageEvent) -> Self {
        Self {
            stage: event.stage.as_str().to_owned(),
            since_sent_ms: event.since_sent.as_secs_f64() * 1e3,
            since_previous_ms: event.since_previous.as_secs_f64() * 1e3,
            fraction: event.progress.as_ref().map(Progress::fraction_f64),
            note: event.progress.as_ref().map(|p| p.note.clone()),
        }
    }
}

#[napi(object)]
pub struct RequestInfo {
    pub request_id: String,
    pub correlation_id: String,
    /// The request that caused this one, if the caller named it.
    pub causation_id: Option<String>,
    pub pool: String,
    pub attempt: u32,
    pub worker: String,
}

#[napi(object)]
pub struct DeadLetterInfo {
    pub request_id: String,
    pub correlation_id: String,
    pub pool: String,
    /// Slot of the payload in the wrapper's object table (`u32::MAX` for
    /// none: see `payload_json`).
    pub payload: u32,
    /// The payload's JSON when it has no slot: the message of a durable ask
    /// resumed from its store exists only as the bytes stored there.
    pub payload_json: Option<Buffer>,
    pub error: ErrorInfo,
    pub attempts: u32,
    /// `RETRIES_EXHAUSTED` or `POISON`.
    pub reason: String,
    /// `ASK` or `TELL`: what was sent, and what its replay sends.
    pub kind: String,
}

impl From<&DeadLetter<Tok>> for DeadLetterInfo {
    fn from(letter: &DeadLetter<Tok>) -> Self {
        Self {
            request_id: letter.ids.request_id.to_string(),
            correlation_id: letter.ids.correlation_id.to_string(),
            pool: letter.pool.to_string(),
            payload: letter.payload.id(),
            payload_json: match letter.payload.slot() {
                Some(_) => None,
                None => letter.payload.bytes().map(|b| Buffer::from(b.to_vec())),
            },
            error: ErrorInfo::from(&letter.error),
            attempts: letter.attempts,
            reason: letter.reason.as_str().to_owned(),
            kind: letter.kind.as_str().to_owned(),
        }
    }
}

#[napi(object)]
pub struct PoolStatsInfo {
    pub name: String,
    pub in_flight: u32,
    pub queued: u32,
    pub admitted: f64,
    pub handler_runs: f64,
    /// Duplicates of a running request, answered with an Ack.
    pub duplicate_acks: f64,
    /// Duplicates of a finished request, answered from the reply cache.
    pub replays: f64,
    /// Replies dropped because their request was cancelled first.
    pub suppressed_replies: f64,
    pub rejected_full: f64,
    pub cancels: f64,
    /// Running requests cancelled at their processing timeout.
    pub expired: f64,
    pub dedup_in_progress: u32,
    pub dedup_terminal: u32,
}

#[napi(object)]
pub struct StatsInfo {
    /// Asks in the node's pending map.
    pub pending: u32,
    pub armed_timers: u32,
    pub retries: f64,
    /// Outcomes that arrived after their ask timed out, reconciled once.
    pub late_outcomes: f64,
    pub timed_out_records: u32,
    pub dlq_depth: u32,
    /// Dead letters dropped because the queue was full.
    pub dlq_dropped: f64,
    /// Futures the binding is driving (asks, idle workers, stage reads).
    pub tasks: u32,
    /// Requests handed to JS handlers and not yet answered.
    pub requests: u32,
    /// Stage streams open.
    pub streams: u32,
    /// Times a future woke on another thread (a tokio timer) and the JS
    /// thread had to be called.
    pub thread_wakes: f64,
    pub pools: Vec<PoolStatsInfo>,
}

pub fn stats(
    node: NodeStats,
    tasks: usize,
    requests: usize,
    streams: usize,
    thread_wakes: u64,
) -> StatsInfo {
    let n = |v: usize| u32::try_from(v).unwrap_or(u32::MAX);
    StatsInfo {
        pending: n(node.pending),
        armed_timers: n(node.armed_timers),
        retries: node.retries as f64,
        late_outcomes: node.late_outcomes as f64,
        timed_out_records: n(node.timed_out_records),
        dlq_depth: n(node.dlq_depth),
        dlq_dropped: node.dlq_dropped as f64,
        tasks: n(tasks),
        requests: n(requests),
        streams: n(streams),
        thread_wakes: thread_wakes as f64,
        pools: node
            .pools
            .into_iter()
            .map(|p| PoolStatsInfo {
                in_flight: n(p.in_flight),
                queued: n(p.queued),
                admitted: p.admitted as f64,
                handler_runs: p.handler_runs as f64,
                duplicate_acks: p.duplicate_acks as f64,
                replays: p.replays as f64,
                suppressed_replies: p.suppressed_replies as f64,
                rejected_full: p.rejected_full as f64,
                cancels: p.cancels as f64,
                expired: p.expired as f64,
                dedup_in_progress: n(p.dedup.in_progress),
                dedup_terminal: n(p.dedup.terminal),
                name: p.name,
            })
            .collect(),
    }
}

pub fn request_info(ids: &AskIds, pool: &str, attempt: u32, worker: &str) -> RequestInfo {
    RequestInfo {
        request_id: ids.request_id.to_string(),
        correlation_id: ids.correlation_id.to_string(),
        causation_id: ids.causation_id.map(|c| c.to_string()),
        pool: pool.to_owned(),
        attempt,
        worker: worker.to_owned(),
    }
}
