//! A run's own machinery must not show up as a protocol failure, nor stretch
//! the run: what the workload and the network do around the asks (an ask
//! first awaited a while after it was sent, a frame still on its way, the
//! wait for the next fault event) stays inside what the checks allow.

use std::sync::Arc;
use std::time::Duration;

use askpool_sim::{run, run_blocking, FaultConfig, Live, SimConfig};

/// Slow frames only: every frame takes `delay` ms, nothing else goes wrong.
fn slow_network(delay: u64, timeout_ms: std::ops::Range<u64>) -> SimConfig {
    SimConfig {
        faults: FaultConfig {
            delay_ms: delay..delay,
            ..FaultConfig::none()
        },
        timeout_ms,
        cancel: 0.0,
        ..SimConfig::test_tier(5, 300)
    }
}

#[test]
fn an_ask_awaited_later_is_not_held_past_its_deadline_by_the_workload() {
    // The workload pauses before awaiting an await-later ask for longer than
    // a frame's delay; with frames slower than the asks' timeouts, that pause
    // alone would outlast the deadline, and the checker would blame the
    // runtime for the workload's own sleep.
    let cfg = SimConfig {
        await_later: 1.0,
        ..slow_network(1_000, 300..400)
    };
    let report = run_blocking(cfg, Arc::new(Live::default()));
    assert!(
        report.passed(),
        "{:?}",
        &report.violations[..report.violations.len().min(3)]
    );
    assert!(report.summary.timed_out > 0, "{:?}", report.summary);
}

#[test]
fn frames_still_on_their_way_after_the_asks_are_not_a_leak() {
    // A frame sent as the last asks end arrives a delay later; the bounds
    // are checked only once it has.
    let cfg = SimConfig {
        await_later: 0.0,
        ..slow_network(1_500, 300..400)
    };
    let report = run_blocking(cfg, Arc::new(Live::default()));
    assert!(
        report.passed(),
        "{:?}",
        &report.violations[..report.violations.len().min(3)]
    );
}

#[test]
fn the_run_does_not_wait_for_a_fault_event_after_the_last_ask() {
    // Fault events an hour apart on average: once the driver has issued its
    // asks, the scheduler must stop at once rather than sleep out its gap
    // before the faults heal (on the real clock, minutes of an idle run).
    let cfg = SimConfig {
        faults: FaultConfig {
            event_every_ms: 3_600_000,
            ..SimConfig::test_tier(2, 0).faults
        },
        ..SimConfig::test_tier(2, 200)
    };
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .start_paused(true)
        .build()
        .unwrap();
    let (report, took) = runtime.block_on(async move {
        let start = tokio::time::Instant::now();
        let report = run(cfg, Arc::new(Live::default())).await;
        (report, start.elapsed())
    });
    assert!(
        report.passed(),
        "{:?}",
        &report.violations[..report.violations.len().min(3)]
    );
    // On the paused clock the run sleeps past the dedup TTL (an hour) to see
    // the caches empty; the asks themselves take seconds.
    assert!(
        took < Duration::from_secs(3_600 + 60),
        "the run took {took:?} of virtual time"
    );
}

#[test]
fn the_latency_report_leaves_out_the_workloads_own_pauses() {
    // No faults, no work, one ask at a time: every ask is answered at once
    // in virtual time.
    // An ask awaited later ends when the workload looks (a pause of more
    // than a frame's delay), which is no latency of the runtime's.
    let cfg = SimConfig {
        faults: FaultConfig::none(),
        work_ms: 0..0,
        cancel: 0.0,
        mismatch: 0.0,
        handler_error: 0.0,
        await_later: 0.5,
        window: 1,
        ..SimConfig::test_tier(3, 400)
    };
    let report = run_blocking(cfg, Arc::new(Live::default()));
    assert!(
        report.passed(),
        "{:?}",
        &report.violations[..report.violations.len().min(3)]
    );
    assert_eq!(
        report.summary.latency_us.max, 0,
        "{:?}",
        report.summary.latency_us
    );
}
