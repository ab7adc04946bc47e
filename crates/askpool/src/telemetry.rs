//! Metrics (through the `metrics` facade) and tracing, with the names of
//! DESIGN section 4. With no recorder installed every call is a no-op load;
//! `install_prometheus` (feature `prometheus`) serves them at `/metrics`.
//!
//! | metric | kind | labels |
//! |---|---|---|
//! | `askpool_acks_sent_total` | counter | `stage`, `code` (frames a pool sent back) |
//! | `askpool_ack_stage_duration_seconds` | histogram | `stage` (time since the previous stage) |
//! | `askpool_end_to_end_latency_seconds` | histogram | `outcome` (`ok` or an error code) |
//! | `askpool_pending_acks` | gauge | — (asks in the pending map) |
//! | `askpool_retries_total` | counter | — |
//! | `askpool_timeouts_total` | counter | `code` (`ASK_TIMEOUT`, `DEADLINE_EXCEEDED`: a deadline, or a pool's processing timeout) |
//! | `askpool_dedup_hits_total` | counter | `kind` (`ack`, `replay`) |
//! | `askpool_dedup_evictions_total` | counter | `reason` (`capacity`, `ttl`), published by `Node::stats` |
//! | `askpool_dlq_depth` | gauge | — (dead letters held by every node of the process) |
//! | `askpool_breaker_state` | gauge | `pool` (0 closed, 1 open, 2 half-open) |
//! | `askpool_late_outcomes_total` | counter | — |

use std::sync::{Mutex, OnceLock};
use std::time::Duration;

use askpool_proto::breaker::breaker_code;
use askpool_proto::{AckStage, AskError, BreakerState, ErrorCode};
use metrics::{
    counter, describe_counter, describe_gauge, describe_histogram, gauge, Key, Label, Level,
    Metadata, Unit,
};

/// The labelled keys of the hot path, built once: the `metrics` macros
/// build a label vector on every call, even with no recorder installed.
struct Keys {
    /// `askpool_acks_sent_total`, by stage then by outcome (codes, then OK).
    acks_sent: Vec<Key>,
    /// `askpool_ack_stage_duration_seconds`, by stage.
    stage_duration: Vec<Key>,
    /// `askpool_end_to_end_latency_seconds`, by outcome.
    end_to_end: Vec<Key>,
    /// `askpool_timeouts_total`, by outcome.
    timeouts: Vec<Key>,
    dedup_ack: Key,
    dedup_replay: Key,
}

const OUTCOMES: usize = ErrorCode::ALL.len() + 1;

fn outcome_index(code: Option<ErrorCode>) -> usize {
    code.map_or(ErrorCode::ALL.len(), |c| c as usize)
}

/// A stage's place in `AckStage::ALL`, which lists them in declaration
/// order (see the test below).
fn stage_index(stage: AckStage) -> usize {
    stage as usize
}

fn keys() -> &'static Keys {
    static KEYS: OnceLock<Keys> = OnceLock::new();
    KEYS.get_or_init(|| {
        // Outcome `i`: an error code's name, or `ok` past the last code.
        let outcome = |i: usize, ok: &'static str| ErrorCode::ALL.get(i).map_or(ok, |c| c.as_str());
        let by_outcome = |name: &'static str, label: &'static str, ok: &'static str| {
            (0..OUTCOMES)
                .map(|i| Key::from_parts(name, vec![Label::new(label, outcome(i, ok))]))
                .collect::<Vec<_>>()
        };
        let by_stage = |name: &'static str| {
            AckStage::ALL
                .iter()
                .map(|s| Key::from_parts(name, vec![Label::new("stage", s.as_str())]))
                .collect::<Vec<_>>()
        };
        Keys {
            acks_sent: AckStage::ALL
                .iter()
                .flat_map(|stage| {
                    (0..OUTCOMES).map(move |i| {
                        Key::from_parts(
                            "askpool_acks_sent_total",
                            vec![
                                Label::new("stage", stage.as_str()),
                                Label::new("code", outcome(i, "OK")),
                            ],
                        )
                    })
                })
                .collect(),
            stage_duration: by_stage("askpool_ack_stage_duration_seconds"),
            end_to_end: by_outcome("askpool_end_to_end_latency_seconds", "outcome", "ok"),
            timeouts: by_outcome("askpool_timeouts_total", "code", "OK"),
            dedup_ack: Key::from_parts("askpool_dedup_hits_total", vec![Label::new("kind", "ack")]),
            dedup_replay: Key::from_parts(
                "askpool_dedup_hits_total",
                vec![Label::new("kind", "replay")],
            ),
        }
    })
}

static METADATA: Metadata<'static> =
    Metadata::new(module_path!(), Level::INFO, Some(module_path!()));

fn increment(key: &Key) {
    metrics::with_recorder(|r| r.register_counter(key, &METADATA).increment(1));
}

fn record(key: &Key, value: f64) {
    metrics::with_recorder(|r| r.register_histogram(key, &METADATA).record(value));
}

/// Describes every metric to the recorder installed now (a recorder
/// installed later is described by the next node made, or by
/// `install_prometheus`); describing again is harmless.
pub(crate) fn describe() {
    {
        describe_counter!(
            "askpool_acks_sent_total",
            "Ack-lifecycle frames sent by pools"
        );
        describe_histogram!(
            "askpool_ack_stage_duration_seconds",
            Unit::Seconds,
            "Time from one ack stage to the next, at the caller"
        );
        describe_histogram!(
            "askpool_end_to_end_latency_seconds",
            Unit::Seconds,
            "Time from sending an ask to its outcome"
        );
        describe_gauge!("askpool_pending_acks", "Asks waiting for their outcome");
        describe_counter!("askpool_retries_total", "Request frames re-sent");
        describe_counter!("askpool_timeouts_total", "Asks that ran out of time");
        describe_counter!(
            "askpool_dedup_hits_total",
            "Duplicate requests answered without running"
        );
        describe_counter!(
            "askpool_dedup_evictions_total",
            "Terminal dedup entries evicted"
        );
        describe_gauge!("askpool_dlq_depth", "Dead letters held");
        describe_gauge!(
            "askpool_breaker_state",
            "Circuit breaker state: 0 closed, 1 open, 2 half-open"
        );
        describe_counter!(
            "askpool_late_outcomes_total",
            "Outcomes that arrived after their ask timed out"
        );
    }
}

/// A frame a pool sent back; `code` is the error code of an error reply.
#[inline]
pub(crate) fn ack_sent(stage: AckStage, code: Option<ErrorCode>) {
    increment(&keys().acks_sent[stage_index(stage) * OUTCOMES + outcome_index(code)]);
}

#[inline]
pub(crate) fn stage_duration(stage: AckStage, since_previous: Duration) {
    record(
        &keys().stage_duration[stage_index(stage)],
        since_previous.as_secs_f64(),
    );
}

#[inline]
pub(crate) fn end_to_end(error: Option<&AskError>, latency: Duration) {
    let index = outcome_index(error.map(AskError::code));
    record(&keys().end_to_end[index], latency.as_secs_f64());
    // A pool's processing timeout is a timeout too (its stage is TIMED_OUT,
    // its breaker counts it as DEADLINE_EXCEEDED), under that code.
    if let Some(error) = error {
        let code = breaker_code(error);
        if matches!(code, ErrorCode::AskTimeout | ErrorCode::DeadlineExceeded) {
            increment(&keys().timeouts[outcome_index(Some(code))]);
        }
    }
}

#[inline]
pub(crate) fn pending(delta: f64) {
    gauge!("askpool_pending_acks").increment(delta);
}

pub(crate) fn retry() {
    counter!("askpool_retries_total").increment(1);
}

/// A duplicate answered without running: an Ack, or a replay.
pub(crate) fn dedup_hit(replay: bool) {
    let keys = keys();
    increment(if replay {
        &keys.dedup_replay
    } else {
        &keys.dedup_ack
    });
}

/// Evictions since the last publication (a counter is the sum over every
/// pool of every node: each publishes what it added).
pub(crate) fn dedup_evictions(capacity: u64, ttl: u64) {
    if capacity > 0 {
        counter!("askpool_dedup_evictions_total", "reason" => "capacity").increment(capacity);
    }
    if ttl > 0 {
        counter!("askpool_dedup_evictions_total", "reason" => "ttl").increment(ttl);
    }
}

/// Dead letters held by every node of the process. Changed and published
/// under one lock: two nodes' changes published out of order would leave
/// the gauge at a stale total (letters change rarely; the lock is cheap).
static DLQ_LETTERS: Mutex<i64> = Mutex::new(0);

/// Dead letters added (or, negative, removed) by one node. The gauge is set
/// to the process's total, not moved by the delta: a recorder installed
/// after letters were filed reads the true total from the next change on.
pub(crate) fn dlq_depth_changed(delta: isize) {
    if delta != 0 {
        let mut total = DLQ_LETTERS.lock().unwrap_or_else(|e| e.into_inner());
        *total += delta as i64;
        gauge!("askpool_dlq_depth").set(*total as f64);
    }
}

pub(crate) fn breaker_state(pool: &str, state: BreakerState) {
    gauge!("askpool_breaker_state", "pool" => pool.to_owned()).set(f64::from(state.as_gauge()));
}

pub(crate) fn late_outcome() {
    counter!("askpool_late_outcomes_total").increment(1);
}

/// Serves every askpool metric at `http://ADDR/metrics` (Prometheus text
/// format) and installs the exporter as the process's metrics recorder.
/// Call it inside a tokio runtime, once per process.
#[cfg(feature = "prometheus")]
pub fn install_prometheus(addr: std::net::SocketAddr) -> Result<(), AskError> {
    metrics_exporter_prometheus::PrometheusBuilder::new()
        .with_http_listener(addr)
        .install()
        .map_err(|e| AskError::FailedPrecondition {
            message: format!("cannot serve metrics on {addr}: {e}"),
        })?;
    // Described to the exporter, now that it is the recorder.
    describe();
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_stages_index_is_its_place_in_all() {
        for (i, stage) in AckStage::ALL.into_iter().enumerate() {
            assert_eq!(stage_index(stage), i, "{stage:?}");
        }
    }
}
