//! What a run reports: a summary of counts and latencies, the invariants it
//! broke, and a table or JSON of both.

use serde::Serialize;

use crate::checker::Violation;
use crate::config::SimConfig;

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
    pub frames: u64,
    /// Lost for any reason: dropped, partitioned, replies lost after
    /// execution, sent by a crashed process.
    pub frames_dropped: u64,
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
    pub dlq_size: u64,
    pub breaker_trips: u64,
    /// Latency of fulfilled asks, in microseconds (virtual time when paused).
    pub latency_us: Percentiles,
    pub peak_rss_bytes: Option<u64>,
    pub elapsed_ms: u64,
    pub trace_hash: u64,
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
            ("DLQ size", s.dlq_size.to_string()),
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
