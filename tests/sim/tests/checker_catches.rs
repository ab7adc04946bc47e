//! The checker is only worth its green if it turns red: protocol breakage
//! switched on deliberately is reported, with a reproduction command.

use std::sync::Arc;

use askpool_sim::{
    check_seed, run_blocking, unfired_faults, FaultConfig, Live, Sabotage, SimConfig, Violation,
};

fn broken(seed: u64, sabotage: Sabotage) -> SimConfig {
    SimConfig {
        sabotage: Some(sabotage),
        ..SimConfig::test_tier(seed, 2_000)
    }
}

/// Runs seed 7 with `sabotage` on; the violations reported as `invariant`
/// (there must be some).
fn caught(sabotage: Sabotage, invariant: &str) -> Vec<Violation> {
    let report = run_blocking(broken(7, sabotage), Arc::new(Live::default()));
    let found: Vec<Violation> = (report.violations.iter())
        .filter(|v| v.invariant == invariant)
        .cloned()
        .collect();
    assert!(
        !found.is_empty(),
        "{sabotage:?} not reported as {invariant:?}: {:?}",
        report.violations
    );
    found
}

#[test]
fn a_forged_replay_is_reported() {
    caught(Sabotage::ForgeReplay, "replays equal the original");
}

#[test]
fn a_pool_that_forgets_without_restarting_is_reported() {
    caught(
        Sabotage::ForgetDedup,
        "at most one execution per cached key",
    );
}

#[test]
fn a_reply_with_changed_ids_is_reported() {
    let found = caught(Sabotage::ForgeIds, "ids propagate unchanged");
    assert!(
        found.iter().all(|v| v.detail.starts_with("reply:")),
        "{found:?}"
    );
}

#[test]
fn a_request_run_after_its_cancel_is_reported() {
    caught(
        Sabotage::SkipTombstones,
        "a request after its cancel never runs",
    );
}

#[test]
fn a_fault_that_never_acts_is_reported() {
    let tier = SimConfig::test_tier(3, 1_000);
    // Switched off in the run, but expected by the tier: reported.
    let cfg = SimConfig {
        faults: FaultConfig {
            reorder: 0.0,
            restart_weight: 0,
            ..tier.faults.clone()
        },
        ..tier.clone()
    };
    let report = run_blocking(cfg, Arc::new(Live::default()));
    assert!(report.passed(), "{:?}", report.violations);
    assert_eq!(
        unfired_faults(&tier.faults, &report.summary),
        vec!["reorder", "restart"],
        "{:?}",
        report.summary
    );
    let none = SimConfig {
        faults: FaultConfig::none(),
        ..tier.clone()
    };
    let report = run_blocking(none, Arc::new(Live::default()));
    assert_eq!(
        unfired_faults(&tier.faults, &report.summary),
        vec![
            "drop",
            "duplicate",
            "reorder",
            "delay",
            "lose-reply",
            "clog",
            "partition",
            "restart"
        ]
    );
}

#[test]
fn a_failing_seed_is_shrunk_to_a_reproduction_command() {
    let result = check_seed(&broken(11, Sabotage::ForgetDedup));
    assert!(!result.passed());
    let repro = result.repro.expect("a failing seed has a repro command");
    assert!(repro.starts_with("cargo xtask sim --first-seed 11 --seeds 1 --asks "));
    let asks: u64 = repro
        .split("--asks ")
        .nth(1)
        .and_then(|s| s.split_whitespace().next())
        .and_then(|s| s.parse().ok())
        .expect("the command names an ask count");
    assert!(asks <= 2_000, "{repro}");
    assert!(repro.ends_with("--sabotage ForgetDedup"), "{repro}");
}

#[test]
fn without_faults_every_ask_is_fulfilled_or_refused_for_a_reason() {
    let cfg = SimConfig {
        faults: FaultConfig::none(),
        cancel: 0.0,
        ..SimConfig::test_tier(3, 2_000)
    };
    let report = run_blocking(cfg, Arc::new(Live::default()));
    assert!(report.passed(), "{:?}", report.violations);
    let s = &report.summary;
    // At this load a pool refuses (BufferFull) and an unlucky ask can be
    // refused until its deadline: a timeout for a reason, and the asks of
    // its id after it are answered AskCancelled. Nothing else times out or
    // is cancelled.
    assert_eq!(s.timed_out_unrefused, 0, "{s:?}");
    assert_eq!(s.cancelled_unexplained, 0, "{s:?}");
    assert_eq!(s.frames_dropped, 0);
    assert_eq!(s.asks, s.fulfilled + s.failed + s.cancelled + s.timed_out);
    assert!(s.fulfilled > s.asks / 2, "{s:?}");
}
