//! The checker is only worth its green if it turns red: protocol breakage
//! switched on deliberately is reported, with a reproduction command.

use std::sync::Arc;

use askpool_sim::{check_seed, run_blocking, Live, Sabotage, SimConfig};

fn broken(seed: u64, sabotage: Sabotage) -> SimConfig {
    SimConfig {
        sabotage: Some(sabotage),
        ..SimConfig::test_tier(seed, 2_000)
    }
}

#[test]
fn a_forged_replay_is_reported() {
    let report = run_blocking(broken(7, Sabotage::ForgeReplay), Arc::new(Live::default()));
    assert!(
        report
            .violations
            .iter()
            .any(|v| v.invariant == "replays equal the original"),
        "{:?}",
        report.violations
    );
}

#[test]
fn a_pool_that_forgets_without_restarting_is_reported() {
    let report = run_blocking(broken(7, Sabotage::ForgetDedup), Arc::new(Live::default()));
    assert!(
        report
            .violations
            .iter()
            .any(|v| v.invariant == "at most one execution per cached key"),
        "{:?}",
        report.violations
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
        faults: askpool_sim::FaultConfig::none(),
        cancel: 0.0,
        ..SimConfig::test_tier(3, 2_000)
    };
    let report = run_blocking(cfg, Arc::new(Live::default()));
    assert!(report.passed(), "{:?}", report.violations);
    let s = &report.summary;
    assert_eq!(s.timed_out, 0, "{s:?}");
    assert_eq!(s.frames_dropped, 0);
    assert_eq!(s.asks, s.fulfilled + s.failed + s.cancelled + s.timed_out);
    assert!(s.fulfilled > s.asks / 2, "{s:?}");
}
