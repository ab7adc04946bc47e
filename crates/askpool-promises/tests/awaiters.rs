//! What happens to an awaiter's resumption when the awaiter itself ends:
//! settled (or timed out) awaiters are not resumed, however the timeout
//! and the settlement interleave.

mod common;

use askpool_promises::{
    CallbackRequest, ClaimRequest, CompleteRequest, Completion, CreateRequest, State, Store,
};
use common::each_store;

const T: u64 = 1_000_000;

fn claim(s: &dyn Store, now: u64) -> Option<askpool_promises::Claimed> {
    let req = ClaimRequest {
        pool: "ga".into(),
        worker: "w1".into(),
        lease_ms: 1_000,
    };
    s.claim_task(&req, now).unwrap()
}

fn await_on(s: &dyn Store, awaited: &str, awaiter: &str, now: u64) {
    let req = CallbackRequest {
        awaited: awaited.into(),
        awaiter: awaiter.into(),
        pool: "ga".into(),
        preferred_worker: None,
    };
    s.register_callback(&req, now).unwrap();
}

/// The awaiter's timeout passes after its resume task was made but before
/// a worker claims it: the claim touches the awaiter too.
#[test]
fn an_awaiter_that_timed_out_before_the_claim_is_not_resumed() {
    each_store(|s| {
        s.create(&CreateRequest::new("awaiter", T + 100), T)
            .unwrap();
        s.create(&CreateRequest::new("awaited", T + 60_000), T)
            .unwrap();
        await_on(s, "awaited", "awaiter", T);
        s.complete(
            &CompleteRequest::new("awaited", Completion::Resolve),
            T + 10,
        )
        .unwrap();
        assert!(claim(s, T + 200).is_none(), "nothing left to resume");
        assert_eq!(s.get("awaiter", T + 200).unwrap().state, State::TimedOut);
        assert!(s.snapshot().unwrap().tasks.is_empty());
    });
}

/// Canceling an execution whose resume task has not been claimed yet ends
/// that task with it, as settling one ends its invoke task.
#[test]
fn a_canceled_awaiter_is_not_resumed() {
    each_store(|s| {
        for id in ["awaiter", "awaited"] {
            s.create(&CreateRequest::new(id, T + 60_000), T).unwrap();
        }
        await_on(s, "awaited", "awaiter", T);
        s.complete(&CompleteRequest::new("awaited", Completion::Resolve), T)
            .unwrap();
        s.complete(&CompleteRequest::new("awaiter", Completion::Cancel), T)
            .unwrap();
        assert!(s.snapshot().unwrap().tasks.is_empty());
        assert!(claim(s, T).is_none());
        assert_eq!(s.prune(T + 1, 10).unwrap().pruned, 2, "nothing holds them");
    });
}

/// Each of a long chain of awaiters awaits the next, and all are past their
/// timeouts when the last settles: the timeouts cascade down the chain in
/// one transaction, and must not cost one stack frame per link (a stack
/// overflow aborts the process).
#[test]
fn a_long_chain_of_timed_out_awaiters_settles_without_overflowing_the_stack() {
    const LINKS: usize = 5_000;
    let run = || {
        each_store(|s| {
            let id = |i: usize| format!("link-{i:05}");
            s.create(&CreateRequest::new(id(LINKS), T + 60_000), T)
                .unwrap();
            for i in (0..LINKS).rev() {
                s.create(&CreateRequest::new(id(i), T + 100), T).unwrap();
                await_on(s, &id(i + 1), &id(i), T);
            }
            s.complete(
                &CompleteRequest::new(id(LINKS), Completion::Resolve),
                T + 200,
            )
            .unwrap();
            let snap = s.snapshot().unwrap();
            assert!(snap.promises.iter().all(|p| p.state.is_settled()));
            assert!(snap.tasks.is_empty() && snap.callbacks.is_empty());
        })
    };
    // The default stack of a test thread, stated rather than inherited.
    std::thread::Builder::new()
        .stack_size(2 << 20)
        .spawn(run)
        .unwrap()
        .join()
        .unwrap();
}

/// A long-lived execution that awaits one long-pending promise in every
/// suspension, and is resumed each time by something else: the callbacks of
/// its finished suspensions wake nothing, and must not pile up on that
/// promise for as long as it stays pending. Nor may those of an awaiter
/// that has settled.
#[test]
fn callbacks_of_finished_suspensions_do_not_pile_up() {
    each_store(|s| {
        for id in ["awaiter", "long"] {
            s.create(&CreateRequest::new(id, T + 60_000), T).unwrap();
        }
        for round in 0..50 {
            let other = format!("other-{round}");
            s.create(&CreateRequest::new(&other, T + 60_000), T)
                .unwrap();
            await_on(s, "long", "awaiter", T);
            await_on(s, &other, "awaiter", T);
            s.complete(&CompleteRequest::new(&other, Completion::Resolve), T)
                .unwrap();
            let resumed = claim(s, T).unwrap();
            s.complete_task(&askpool_promises::Lease::of(&resumed.task), T)
                .unwrap();
        }
        assert_eq!(s.snapshot().unwrap().callbacks.len(), 0);
        await_on(s, "long", "awaiter", T);
        s.complete(&CompleteRequest::new("awaiter", Completion::Resolve), T)
            .unwrap();
        assert_eq!(s.snapshot().unwrap().callbacks.len(), 0);
    });
}
