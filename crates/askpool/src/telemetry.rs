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
//! | `askpool_timeouts_total` | counter | `code` (`ASK_TIMEOUT`, `DEADLINE_EXCEEDED`) |
//! | `askpool_dedup_hits_total` | counter | `kind` (`ack`, `replay`) |
//! | `askpool_dedup_evictions_total` | counter | `reason` (`capacity`, `ttl`), published by `Node::stats` |
//! | `askpool_dlq_depth` | gauge | — |
//! | `askpool_breaker_state` | gauge | `pool` (0 closed, 1 open, 2 half-open) |
//! | `askpool_late_outcomes_total` | counter | — |

use std::sync::Once;
use std::time::Duration;

use askpool_proto::{AckStage, AskError, BreakerState};
use metrics::{
    counter, describe_counter, describe_gauge, describe_histogram, gauge, histogram, Unit,
};

pub(crate) fn describe() {
    static ONCE: Once = Once::new();
    ONCE.call_once(|| {
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
    });
}

pub(crate) fn ack_sent(stage: AckStage, code: &'static str) {
    counter!("askpool_acks_sent_total", "stage" => stage.as_str(), "code" => code).increment(1);
}

pub(crate) fn stage_duration(stage: AckStage, since_previous: Duration) {
    histogram!("askpool_ack_stage_duration_seconds", "stage" => stage.as_str())
        .record(since_previous.as_secs_f64());
}

pub(crate) fn end_to_end(error: Option<&AskError>, latency: Duration) {
    let outcome = error.map_or("ok", |e| e.code().as_str());
    histogram!("askpool_end_to_end_latency_seconds", "outcome" => outcome)
        .record(latency.as_secs_f64());
    if let Some(e @ (AskError::AskTimeout { .. } | AskError::DeadlineExceeded)) = error {
        counter!("askpool_timeouts_total", "code" => e.code().as_str()).increment(1);
    }
}

pub(crate) fn pending(delta: f64) {
    gauge!("askpool_pending_acks").increment(delta);
}

pub(crate) fn retry() {
    counter!("askpool_retries_total").increment(1);
}

pub(crate) fn dedup_hit(kind: &'static str) {
    counter!("askpool_dedup_hits_total", "kind" => kind).increment(1);
}

pub(crate) fn dedup_evictions(capacity: u64, ttl: u64) {
    counter!("askpool_dedup_evictions_total", "reason" => "capacity").absolute(capacity);
    counter!("askpool_dedup_evictions_total", "reason" => "ttl").absolute(ttl);
}

pub(crate) fn dlq_depth(depth: usize) {
    gauge!("askpool_dlq_depth").set(depth as f64);
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
    describe();
    metrics_exporter_prometheus::PrometheusBuilder::new()
        .with_http_listener(addr)
        .install()
        .map_err(|e| AskError::FailedPrecondition {
            message: format!("cannot serve metrics on {addr}: {e}"),
        })
}
