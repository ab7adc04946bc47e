//! What a run reports: a summary of counts and latencies, the invariants it
//! broke, and a table or JSON of both.

use serde::Serialize;

use crate::checker::Violation;
use crate::config::{FaultConfig, SimConfig};

#[derive(Clone, Debug, Default, Serialize)]
pub struct Percentiles {
    pub p50: u64,
    pub p99: u64,
    pub p999: u64,
    pub max: u64,
}

/// Nearest-rank percentiles of `samples`.
pub fn percentiles(mut samples: Vec<u64>) -> Percentiles {
    if samples.is_empty() {
        return Percentiles::default();
    }
    samples.sort_unstable();
    let at = |q: f64| {
        let rank = ((q * samples.len() as f64).ceil() as usize).clamp(1, samples.len());
        samples[rank - 1]
    };
    Percentiles {
        p50: at(0.50),
        p99: at(0.99),
        p999: at(0.999),
        max: *samples.last().expect("not empty"),
    }
}

/// The process's peak resident set (Linux `VmHWM`), if the OS tells.
pub fn peak_rss_bytes() -> Option<u64> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    let line = status.lines().find(|l| l.starts_with("VmHWM:"))?;
    let kb: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kb * 1024)
}

#[derive(Clone, Debug, Default, Serialize)]
pub struct Summary {
    pub asks: u64,
    pub fulfilled: u64,
    /// Ended with an error other than a timeout or a cancel (handler errors,
    /// payload mismatches, refusals, breaker fast-fails).
    pub failed: u64,
    pub timed_out: u64,
    /// Cancelled by the caller, or answered AskCancelled.
    pub cancelled: u64,
    /// Of the timed-out asks, those whose key no pool ever refused (full,
    /// closed): in a run without faults, none should be.
    pub timed_out_unrefused: u64,
    /// Asks answered AskCancelled whose key no ask timed out or gave up on:
    /// in a run without faults or cancels, none should be.
    pub cancelled_unexplained: u64,
    pub frames: u64,
    /// Lost for any reason: dropped, partitioned, replies lost after
    /// execution, sent by a crashed process.
    pub frames_dropped: u64,
    /// Of those, dropped by the `drop` fault and lost to partitions.
    pub frames_dropped_at_random: u64,
    pub frames_partitioned: u64,
    pub frames_duplicated: u64,
    pub frames_reordered: u64,
    pub frames_delayed: u64,
    pub frames_clogged: u64,
    pub replies_lost: u64,
    pub restarts: u64,
    pub retries: u64,
    /// Duplicate requests a pool answered without running the handler.
    pub duplicates_suppressed: u64,
    pub handler_executions: u64,
    /// Cancels a pool received before their request (tombstones kept).
    pub tombstones: u64,
    /// Outcomes reconciled after their ask timed out.
    pub late_outcomes: u64,
    /// Replies whose ids were held against their ask's.
    pub replies_ids_checked: u64,
    pub dlq_size: u64,
    /// Dead letters dropped because a caller's queue was full.
    pub dlq_dropped: u64,
    pub breaker_trips: u64,
    /// Latency of fulfilled asks the workload awaited as soon as it sent
    /// them, in microseconds (virtual time when paused).
    pub latency_us: Percentiles,
    pub peak_rss_bytes: Option<u64>,
    pub elapsed_ms: u64,
    pub trace_hash: u64,
}

impl Summary {
    /// Adds the counts of `other` (not its latencies, memory, time or hash):
    /// totals over seeds.
    pub fn add(&mut self, other: &Summary) {
        let Summary {
            asks,
            fulfilled,
            failed,
            timed_out,
            cancelled,
            timed_out_unrefused,
            cancelled_unexplained,
            frames,
            frames_dropped,
            frames_dropped_at_random,
            frames_partitioned,
            frames_duplicated,
            frames_reordered,
            frames_delayed,
            frames_clogged,
            replies_lost,
            restarts,
            retries,
            duplicates_suppressed,
            handler_executions,
            tombstones,
            late_outcomes,
            replies_ids_checked,
            dlq_size,
            dlq_dropped,
            breaker_trips,
            latency_us: _,
            peak_rss_bytes: _,
            elapsed_ms: _,
            trace_hash: _,
        } = other;
        self.asks += asks;
        self.fulfilled += fulfilled;
        self.failed += failed;
        self.timed_out += timed_out;
        self.cancelled += cancelled;
        self.timed_out_unrefused += timed_out_unrefused;
        self.cancelled_unexplained += cancelled_unexplained;
        self.frames += frames;
        self.frames_dropped += frames_dropped;
        self.frames_dropped_at_random += frames_dropped_at_random;
        self.frames_partitioned += frames_partitioned;
        self.frames_duplicated += frames_duplicated;
        self.frames_reordered += frames_reordered;
        self.frames_delayed += frames_delayed;
        self.frames_clogged += frames_clogged;
        self.replies_lost += replies_lost;
        self.restarts += restarts;
        self.retries += retries;
        self.duplicates_suppressed += duplicates_suppressed;
        self.handler_executions += handler_executions;
        self.tombstones += tombstones;
        self.late_outcomes += late_outcomes;
        self.replies_ids_checked += replies_ids_checked;
        self.dlq_size += dlq_size;
        self.dlq_dropped += dlq_dropped;
        self.breaker_trips += breaker_trips;
    }
}

/// The fault kinds `faults` switches on that never acted in the runs
/// `total` sums: a fault that is configured but never fires tests nothing.
pub fn unfired_faults(faults: &FaultConfig, total: &Summary) -> Vec<&'static str> {
    let events = faults.has_events();
    let kinds = [
        ("drop", faults.drop > 0.0, total.frames_dropped_at_random),
        ("duplicate", faults.duplicate > 0.0, total.frames_duplicated),
        ("reorder", faults.reorder > 0.0, total.frames_reordered),
        (
            "delay",
            faults.delay_ms.start.max(faults.delay_ms.end) > 0,
            total.frames_delayed,
        ),
        ("lose-reply", faults.lose_reply > 0.0, total.replies_lost),
        (
            "clog",
            events && faults.clog_weight > 0,
            total.frames_clogged,
        ),
        (
            "partition",
            events && faults.partition_weight > 0,
            total.frames_partitioned,
        ),
        (
            "restart",
            events && faults.restart_weight > 0,
            total.restarts,
        ),
    ];
    kinds
        .into_iter()
        .filter(|&(_, on, fired)| on && fired == 0)
        .map(|(name, _, _)| name)
        .collect()
}

#[derive(Clone, Debug, Serialize)]
pub struct RunReport {
    pub config: SimConfig,
    pub summary: Summary,
    pub violations: Vec<Violation>,
}

impl RunReport {
    pub fn passed(&self) -> bool {
        self.violations.is_empty()
    }

    /// The summary as an aligned two-column table.
    pub fn table(&self) -> String {
        let s = &self.summary;
        let pct = |n: u64| {
            if s.asks == 0 {
                String::new()
            } else {
                format!("  ({:.1}%)", 100.0 * n as f64 / s.asks as f64)
            }
        };
        let rows: Vec<(&str, String)> = vec![
            ("asks", s.asks.to_string()),
            ("fulfilled", format!("{}{}", s.fulfilled, pct(s.fulfilled))),
            (
                "rejected / failed",
                format!("{}{}", s.failed, pct(s.failed)),
            ),
            ("timed out", format!("{}{}", s.timed_out, pct(s.timed_out))),
            ("cancelled", format!("{}{}", s.cancelled, pct(s.cancelled))),
            ("frames", s.frames.to_string()),
            ("frames dropped", s.frames_dropped.to_string()),
            ("  at random", s.frames_dropped_at_random.to_string()),
            ("  to partitions", s.frames_partitioned.to_string()),
            ("frames duplicated", s.frames_duplicated.to_string()),
            ("frames reordered", s.frames_reordered.to_string()),
            ("frames delayed", s.frames_delayed.to_string()),
            ("frames held by clogs", s.frames_clogged.to_string()),
            ("replies lost after execution", s.replies_lost.to_string()),
            ("pool restarts", s.restarts.to_string()),
            ("retries", s.retries.to_string()),
            (
                "duplicate deliveries suppressed",
                s.duplicates_suppressed.to_string(),
            ),
            ("handler executions", s.handler_executions.to_string()),
            ("tombstones", s.tombstones.to_string()),
            ("late outcomes", s.late_outcomes.to_string()),
            (
                "replies with ids checked",
                s.replies_ids_checked.to_string(),
            ),
            ("DLQ size", s.dlq_size.to_string()),
            ("DLQ dropped (full)", s.dlq_dropped.to_string()),
            ("breaker trips", s.breaker_trips.to_string()),
            ("latency p50", format_us(s.latency_us.p50)),
            ("latency p99", format_us(s.latency_us.p99)),
            ("latency p999", format_us(s.latency_us.p999)),
            (
                "peak RSS",
                s.peak_rss_bytes
                    .map(|b| format!("{:.1} MiB", b as f64 / (1024.0 * 1024.0)))
                    .unwrap_or_else(|| "n/a".into()),
            ),
            ("elapsed", format!("{:.2} s", s.elapsed_ms as f64 / 1000.0)),
            ("trace hash", format!("{:016x}", s.trace_hash)),
            (
                "invariants",
                if self.violations.is_empty() {
                    "all held".to_string()
                } else {
                    format!("{} BROKEN", self.violations.len())
                },
            ),
        ];
        let width = rows.iter().map(|(k, _)| k.len()).max().unwrap_or(0);
        let mut out = String::new();
        for (k, v) in rows {
            out.push_str(&format!("{k:<width$}  {v}\n"));
        }
        for violation in self.violations.iter().take(20) {
            out.push_str(&format!("  ! {violation}\n"));
        }
        if self.violations.len() > 20 {
            out.push_str(&format!(
                "  ! ... and {} more\n",
                self.violations.len() - 20
            ));
        }
        out
    }
}

fn format_us(us: u64) -> String {
    if us >= 10_000 {
        format!("{:.1} ms", us as f64 / 1000.0)
    } else {
        format!("{us} µs")
    }
}
