//! Delivery and read deadlines of the caller machine (SW4RM TimeoutConfig).

use std::time::Duration;

use askpool_proto::{
    AskError, CallerAsk, CallerSend, CancelReason, Resolution, RetryPolicy, StageTimeouts,
    Timestamp,
};
use rand::rngs::SmallRng;
use rand::SeedableRng;

fn at(ms: u64) -> Timestamp {
    Timestamp::ZERO + Duration::from_millis(ms)
}

fn ask(delivery: Option<u64>, read: Option<u64>) -> CallerAsk {
    let policy = RetryPolicy {
        max_attempts: 10,
        initial_delay: Duration::from_millis(300),
        multiplier: 1.0,
        max_delay: Duration::from_millis(300),
        jitter: 0.0,
        ..RetryPolicy::default()
    };
    CallerAsk::new(policy, at(0), Duration::from_secs(10)).with_stage_timeouts(StageTimeouts {
        delivery: delivery.map(Duration::from_millis),
        read: read.map(Duration::from_millis),
    })
}

fn missed() -> Option<Resolution> {
    Some(Resolution::Failed(AskError::DeadlineExceeded))
}

#[test]
fn no_ack_by_the_delivery_deadline_fails_with_deadline_exceeded() {
    let mut rng = SmallRng::seed_from_u64(1);
    let mut a = ask(Some(1000), None);
    a.start(at(0), &mut rng);
    // Re-sends at 300, 600, 900; the delivery deadline at 1000 comes first
    // after that.
    let mut wakeups = Vec::new();
    loop {
        let t = a.next_wakeup().unwrap();
        wakeups.push(t);
        let step = a.on_timer(t, &mut rng);
        if step.resolution.is_some() {
            assert_eq!(step.resolution, missed());
            assert_eq!(
                step.send,
                Some(CallerSend::Cancel {
                    reason: CancelReason::CallerTimeout
                })
            );
            break;
        }
    }
    assert_eq!(wakeups, vec![at(300), at(600), at(900), at(1000)]);
    assert_eq!(a.next_wakeup(), None);
}

#[test]
fn an_ack_in_time_disarms_the_delivery_deadline() {
    let mut rng = SmallRng::seed_from_u64(1);
    let mut a = ask(Some(1000), None);
    a.start(at(0), &mut rng);
    a.on_ack();
    assert_eq!(
        a.next_wakeup(),
        Some(at(10_000)),
        "only the total deadline is left"
    );
    assert!(a.on_timer(at(1000), &mut rng).resolution.is_none());
}

#[test]
fn no_read_by_the_read_deadline_fails_even_after_the_ack() {
    let mut rng = SmallRng::seed_from_u64(1);
    let mut a = ask(None, Some(2000));
    a.start(at(0), &mut rng);
    a.on_ack();
    assert_eq!(a.next_wakeup(), Some(at(2000)));
    assert_eq!(a.on_timer(at(2000), &mut rng).resolution, missed());
}

#[test]
fn read_implies_the_ack_and_disarms_both() {
    let mut rng = SmallRng::seed_from_u64(1);
    let mut a = ask(Some(1000), Some(2000));
    a.start(at(0), &mut rng);
    a.on_read();
    assert_eq!(a.next_wakeup(), Some(at(10_000)));
    assert!(a.on_timer(at(2000), &mut rng).resolution.is_none());
}

#[test]
fn a_stage_deadline_past_the_total_one_is_ignored() {
    let mut rng = SmallRng::seed_from_u64(1);
    let mut a = ask(Some(60_000), None);
    a.start(at(0), &mut rng);
    a.on_ack();
    let step = a.on_timer(at(10_000), &mut rng);
    assert!(matches!(
        step.resolution,
        Some(Resolution::Failed(AskError::AskTimeout { .. }))
    ));
}
