//! The protocol's rules and the seed's two resumption flows, on both stores.

mod common;

use askpool_promises::rules::PREFERENCE_GRACE_MS;
use askpool_promises::violations;
use askpool_promises::{
    CallbackOutcome, CallbackRequest, ClaimRequest, CompleteRequest, Completion, CreateRequest,
    Lease, PromiseError, SearchQuery, State, Store, Target, TaskKind,
};
use common::each_store;

const T: u64 = 1_000_000;

fn claim(s: &dyn Store, pool: &str, worker: &str, now: u64) -> Option<askpool_promises::Claimed> {
    s.claim_task(
        &ClaimRequest {
            pool: pool.into(),
            worker: worker.into(),
            lease_ms: 1_000,
        },
        now,
    )
    .unwrap()
}

fn cb(awaited: &str, awaiter: &str, pool: &str, worker: &str) -> CallbackRequest {
    CallbackRequest {
        awaited: awaited.into(),
        awaiter: awaiter.into(),
        pool: pool.into(),
        preferred_worker: Some(worker.into()),
    }
}

fn resolve(id: &str) -> CompleteRequest {
    CompleteRequest::new(id, Completion::Resolve).value("v")
}

#[test]
fn create_is_idempotent_by_key() {
    each_store(|s| {
        let first = s
            .create(&CreateRequest::new("p", T + 100).param("x").key("k"), T)
            .unwrap();
        assert!(!first.deduplicated);
        let again = s
            .create(&CreateRequest::new("p", T + 999).key("k"), T + 1)
            .unwrap();
        assert!(again.deduplicated);
        assert_eq!(again.promise, first.promise);
        for req in [
            CreateRequest::new("p", T + 100).key("other"),
            CreateRequest::new("p", T + 100),
        ] {
            assert_eq!(
                s.create(&req, T + 2),
                Err(PromiseError::AlreadyExists { id: "p".into() })
            );
        }
    });
}

#[test]
fn strict_create_deduplicates_only_while_pending() {
    each_store(|s| {
        s.create(&CreateRequest::new("lax", T + 100).key("k"), T)
            .unwrap();
        s.create(
            &CreateRequest::new("strict", T + 100).key("k").strict(true),
            T,
        )
        .unwrap();
        s.complete(&resolve("lax"), T).unwrap();
        s.complete(&resolve("strict"), T).unwrap();
        assert!(
            s.create(&CreateRequest::new("lax", T + 100).key("k"), T)
                .unwrap()
                .deduplicated
        );
        assert_eq!(
            s.create(&CreateRequest::new("strict", T + 100).key("k"), T),
            Err(PromiseError::AlreadyExists {
                id: "strict".into()
            })
        );
    });
}

#[test]
fn completion_happens_once_and_replays_on_its_key() {
    each_store(|s| {
        s.create(&CreateRequest::new("p", T + 100), T).unwrap();
        let done = s.complete(&resolve("p").key("c1"), T + 5).unwrap();
        assert!(!done.replayed);
        assert_eq!(done.promise.state, State::Resolved);
        assert_eq!(done.promise.value.as_deref(), Some(&b"v"[..]));
        assert_eq!(done.promise.settled_at, Some(T + 5));
        // Same key: replay, even as a reject (non-strict promise).
        let replay = s
            .complete(
                &CompleteRequest::new("p", Completion::Reject).key("c1"),
                T + 6,
            )
            .unwrap();
        assert!(replay.replayed);
        assert_eq!(replay.promise, done.promise);
        let refused = PromiseError::AlreadySettled {
            id: "p".into(),
            state: State::Resolved,
        };
        assert_eq!(
            s.complete(&resolve("p").key("c2"), T + 7),
            Err(refused.clone())
        );
        assert_eq!(s.complete(&resolve("p"), T + 7), Err(refused));
        assert_eq!(
            s.complete(&resolve("nope"), T),
            Err(PromiseError::NotFound { id: "nope".into() })
        );
    });
}

#[test]
fn strict_replay_needs_the_same_state_and_timeouts_are_not_replayed() {
    each_store(|s| {
        s.create(&CreateRequest::new("p", T + 100).strict(true), T)
            .unwrap();
        s.complete(&resolve("p").key("c"), T).unwrap();
        assert!(s.complete(&resolve("p").key("c"), T).unwrap().replayed);
        assert!(matches!(
            s.complete(&CompleteRequest::new("p", Completion::Cancel).key("c"), T),
            Err(PromiseError::AlreadySettled { .. })
        ));
        s.create(&CreateRequest::new("lax", T + 10), T).unwrap();
        s.create(&CreateRequest::new("strict", T + 10).strict(true), T)
            .unwrap();
        let late = s.complete(&resolve("lax").key("x"), T + 10).unwrap();
        assert!(late.replayed);
        assert_eq!(late.promise.state, State::TimedOut);
        assert_eq!(
            s.complete(&resolve("strict").key("x"), T + 10),
            Err(PromiseError::AlreadySettled {
                id: "strict".into(),
                state: State::TimedOut
            })
        );
    });
}

#[test]
fn timeouts_apply_on_every_touch_and_by_the_sweeper() {
    each_store(|s| {
        for (id, timeout) in [("a", 10), ("b", 20), ("c", 30)] {
            s.create(&CreateRequest::new(id, T + timeout), T).unwrap();
        }
        assert_eq!(s.get("a", T + 9).unwrap().state, State::Pending);
        let a = s.get("a", T + 10).unwrap();
        assert_eq!(
            (a.state, a.settled_at, a.value),
            (State::TimedOut, Some(T + 10), None)
        );
        // Raw contents: b has expired but nobody touched it yet.
        let raw = s.snapshot().unwrap();
        assert_eq!(raw.promises[1].state, State::Pending);
        assert_eq!(s.sweep(T + 25, 10).unwrap().timed_out, 1);
        assert_eq!(s.snapshot().unwrap().promises[1].state, State::TimedOut);
        let hits = s
            .search(&SearchQuery::new("*").state(State::Pending), T + 30)
            .unwrap();
        assert!(hits.is_empty(), "search timed c out first: {hits:?}");
        assert_eq!(s.sweep(T + 99, 10).unwrap().timed_out, 0);
        let created_late = s.create(&CreateRequest::new("d", T), T + 1).unwrap();
        assert_eq!(created_late.promise.state, State::TimedOut);
    });
}

#[test]
fn search_by_pattern_state_and_cursor() {
    each_store(|s| {
        for id in ["job-1", "job-2", "job-3", "jab", "x?[y]"] {
            s.create(&CreateRequest::new(id, T + 100), T).unwrap();
        }
        s.complete(&resolve("job-2"), T).unwrap();
        let ids = |q: SearchQuery| -> Vec<String> {
            s.search(&q, T).unwrap().into_iter().map(|p| p.id).collect()
        };
        assert_eq!(ids(SearchQuery::new("job-*")), ["job-1", "job-2", "job-3"]);
        assert_eq!(
            ids(SearchQuery::new("j*b*").state(State::Pending)),
            ["jab", "job-1", "job-3"]
        );
        assert_eq!(
            ids(SearchQuery::new("*").after("job-1").limit(2)),
            ["job-2", "job-3"]
        );
        assert_eq!(ids(SearchQuery::new("x?[y]")), ["x?[y]"]);
        assert!(ids(SearchQuery::new("x?")).is_empty());
        assert!(matches!(
            s.search(&SearchQuery::new("*").limit(0), T),
            Err(PromiseError::InvalidArgument { .. })
        ));
    });
}

#[test]
fn invoke_tasks_are_claimed_with_leases_and_complete_with_their_promise() {
    each_store(|s| {
        let target = Target::pool("gb").prefer("w2");
        s.create(
            &CreateRequest::new("p2", T + 60_000)
                .param("arg")
                .target(target),
            T,
        )
        .unwrap();
        // Reserved for w2 during the grace period.
        assert_eq!(claim(s, "gb", "w3", T), None);
        assert_eq!(claim(s, "other", "w2", T), None);
        let first = claim(s, "gb", "w2", T).unwrap();
        assert_eq!((first.task.kind, first.task.claims), (TaskKind::Invoke, 1));
        assert_eq!(first.promise.param, b"arg");
        assert_eq!(claim(s, "gb", "w2", T + 1), None, "held by a live lease");
        let lease = Lease::of(&first.task);
        let expiry = T + PREFERENCE_GRACE_MS + 1_000;
        let beat = s.heartbeat(&lease, expiry - (T + 900), T + 900).unwrap();
        assert_eq!(beat.lease_expires_at, Some(expiry));
        assert_eq!(
            claim(s, "gb", "w3", expiry - 1),
            None,
            "the heartbeat extended it"
        );
        // The lease runs out: anyone may claim it now, the old holder is fenced.
        let second = claim(s, "gb", "w3", expiry).unwrap();
        assert_eq!(second.task.claims, 2);
        assert_eq!(
            s.heartbeat(&lease, 1_000, expiry + 1),
            Err(PromiseError::LeaseLost { id: first.task.id })
        );
        assert!(matches!(
            s.complete_task(&Lease::of(&second.task), expiry + 1),
            Err(PromiseError::InvalidArgument { .. })
        ));
        s.complete(&resolve("p2"), expiry + 2).unwrap();
        assert!(s.snapshot().unwrap().tasks.is_empty());
        assert_eq!(
            s.heartbeat(&Lease::of(&second.task), 1, T),
            Err(PromiseError::TaskNotFound { id: second.task.id })
        );
    });
}

/// Seed 003, eventual resumption: E1 (P1 on W1 in GA) awaits P2 (run by
/// W2 in GB); P2 settles; Resume(P1, P2) goes to GA preferring W1.
#[test]
fn eventual_resumption() {
    each_store(|s| {
        s.create(
            &CreateRequest::new("p1", T + 60_000).target(Target::pool("ga").prefer("w1")),
            T,
        )
        .unwrap();
        let e1 = claim(s, "ga", "w1", T).unwrap();
        s.create(
            &CreateRequest::new("p2", T + 60_000).target(Target::pool("gb").prefer("w2")),
            T,
        )
        .unwrap();
        let e2 = claim(s, "gb", "w2", T).unwrap();
        assert_eq!(e2.promise.id, "p2");
        let CallbackOutcome::Registered(c1) =
            s.register_callback(&cb("p2", "p1", "ga", "w1"), T).unwrap()
        else {
            panic!("p2 is pending");
        };
        assert_eq!(
            (c1.awaited.as_str(), c1.awaiter.as_str(), c1.epoch),
            ("p2", "p1", 0)
        );
        assert_eq!(
            s.register_callback(&cb("p2", "p1", "ga", "w1"), T).unwrap(),
            CallbackOutcome::Registered(c1.clone()),
            "registering again returns the stored callback"
        );
        let done = s.complete(&resolve("p2"), T + 10).unwrap();
        assert_eq!(done.promise.state, State::Resolved);
        let snap = s.snapshot().unwrap();
        assert!(snap.callbacks.is_empty());
        let resume = snap
            .tasks
            .iter()
            .find(|t| t.kind == TaskKind::Resume)
            .unwrap();
        assert_eq!(
            (resume.pool.as_str(), resume.preferred_worker.as_deref()),
            ("ga", Some("w1"))
        );
        assert_eq!(
            (resume.promise_id.as_str(), resume.awaiter.as_deref()),
            ("p2", Some("p1"))
        );
        assert!(!snap
            .tasks
            .iter()
            .any(|t| t.promise_id == "p2" && t.kind == TaskKind::Invoke));
        let woken = claim(s, "ga", "w1", T + 11).unwrap();
        assert_eq!(woken.task.kind, TaskKind::Resume);
        assert_eq!(woken.promise.state, State::Resolved);
        s.complete_task(&Lease::of(&woken.task), T + 12).unwrap();
        assert_eq!(s.get("p1", T + 12).unwrap().resume_epoch, 1);
        // E1 itself is still running under its invoke task.
        assert_eq!(s.snapshot().unwrap().tasks, vec![e1.task]);
    });
}

/// Seed 003, immediate resumption: P2 settled before E1 awaits it.
#[test]
fn immediate_resumption_stores_nothing() {
    each_store(|s| {
        s.create(&CreateRequest::new("p1", T + 60_000), T).unwrap();
        s.create(&CreateRequest::new("p2", T + 60_000), T).unwrap();
        let p2 = s.complete(&resolve("p2"), T).unwrap().promise;
        let before = s.snapshot().unwrap();
        assert_eq!(
            s.register_callback(&cb("p2", "p1", "ga", "w1"), T + 1)
                .unwrap(),
            CallbackOutcome::AlreadyCompleted(p2)
        );
        assert_eq!(s.snapshot().unwrap(), before);
        assert_eq!(
            s.register_callback(&cb("p9", "p1", "ga", "w1"), T),
            Err(PromiseError::NotFound { id: "p9".into() })
        );
    });
}

/// A callback belongs to one suspension: after the awaiter resumed, a
/// callback from before wakes nothing; within one suspension, one wake.
#[test]
fn a_callback_wakes_only_its_own_suspension() {
    each_store(|s| {
        for id in ["p1", "p2", "p3", "p4", "p5"] {
            s.create(&CreateRequest::new(id, T + 60_000), T).unwrap();
        }
        for awaited in ["p2", "p3", "p4"] {
            s.register_callback(&cb(awaited, "p1", "ga", "w1"), T)
                .unwrap();
        }
        s.complete(&resolve("p2"), T).unwrap();
        s.complete(&resolve("p3"), T).unwrap();
        let resumes = |s: &dyn Store| {
            s.snapshot()
                .unwrap()
                .tasks
                .into_iter()
                .filter(|t| t.kind == TaskKind::Resume)
                .count()
        };
        assert_eq!(resumes(s), 1, "one wake per suspension");
        let woken = claim(s, "ga", "w1", T).unwrap();
        s.complete_task(&Lease::of(&woken.task), T).unwrap();
        // p4's callback is from the finished suspension.
        s.complete(&resolve("p4"), T).unwrap();
        assert_eq!(resumes(s), 0);
        // A new suspension (epoch 1) is woken again.
        s.register_callback(&cb("p5", "p1", "ga", "w1"), T).unwrap();
        s.complete(&resolve("p5"), T).unwrap();
        let woken = claim(s, "ga", "w1", T).unwrap();
        assert_eq!((woken.task.epoch, woken.promise.id.as_str()), (1, "p5"));
    });
}

/// Pending p1, p2 and p3; p1 awaited p2, which settled: the resume task
/// of p1's first suspension, claimed by w1.
fn resumed_once(s: &dyn Store) -> askpool_promises::Claimed {
    for id in ["p1", "p2", "p3"] {
        s.create(&CreateRequest::new(id, T + 60_000), T).unwrap();
    }
    s.register_callback(&cb("p2", "p1", "ga", "w1"), T).unwrap();
    s.complete(&resolve("p2"), T).unwrap();
    claim(s, "ga", "w1", T).unwrap()
}

/// Resonate's order: the resumed execution awaits another promise (its
/// callback registered while it holds the resume task), then suspends
/// (completes the task). Whether that promise settles after the suspension
/// or while the execution still runs, the awaiter is woken once more, and
/// never twice at once.
#[test]
fn what_a_resumed_execution_awaits_wakes_its_next_suspension() {
    for settles_while_running in [false, true] {
        each_store(|s| {
            let resumed = resumed_once(s);
            assert_eq!(resumed.task.epoch, 0);
            let CallbackOutcome::Registered(c3) = s
                .register_callback(&cb("p3", "p1", "ga", "w1"), T + 1)
                .unwrap()
            else {
                panic!("p3 is pending");
            };
            assert_eq!(
                c3.epoch, 1,
                "for the suspension the task's completion begins"
            );
            if settles_while_running {
                s.complete(&resolve("p3"), T + 2).unwrap();
                assert!(
                    claim(s, "ga", "w1", T + 2).is_none(),
                    "not while the current resume task runs"
                );
            }
            s.complete_task(&Lease::of(&resumed.task), T + 3).unwrap();
            if !settles_while_running {
                s.complete(&resolve("p3"), T + 4).unwrap();
            }
            let woken = claim(s, "ga", "w1", T + 5).expect("p1 is woken again");
            assert_eq!(
                (woken.task.epoch, woken.task.promise_id.as_str()),
                (1, "p3")
            );
            assert_eq!(s.get("p1", T + 5).unwrap().resume_epoch, 1);
            assert!(violations(&s.snapshot().unwrap()).is_empty());
        });
    }
}

/// An awaiter that settles while its next suspension's resume task waits
/// leaves nothing behind to resume.
#[test]
fn a_settled_awaiter_drops_its_waiting_resume_task() {
    each_store(|s| {
        let resumed = resumed_once(s);
        s.register_callback(&cb("p3", "p1", "ga", "w1"), T).unwrap();
        s.complete(&resolve("p3"), T).unwrap();
        s.complete(&resolve("p1"), T + 1).unwrap();
        let tasks = s.snapshot().unwrap().tasks;
        assert_eq!(tasks, vec![resumed.task.clone()], "only the running task");
        s.complete_task(&Lease::of(&resumed.task), T + 2).unwrap();
        assert!(s.snapshot().unwrap().tasks.is_empty());
        assert!(violations(&s.snapshot().unwrap()).is_empty());
    });
}

/// Timeouts apply on every read: an awaiter past its timeout when what it
/// awaited settles is timed out, not resumed.
#[test]
fn an_awaiter_past_its_timeout_is_not_resumed() {
    each_store(|s| {
        s.create(&CreateRequest::new("awaiter", T + 100), T)
            .unwrap();
        s.create(&CreateRequest::new("awaited", T + 60_000), T)
            .unwrap();
        s.register_callback(&cb("awaited", "awaiter", "ga", "w1"), T)
            .unwrap();
        s.complete(&resolve("awaited"), T + 200).unwrap();
        assert!(claim(s, "ga", "w1", T + 200).is_none());
        assert_eq!(s.get("awaiter", T + 200).unwrap().state, State::TimedOut);
        assert!(s.snapshot().unwrap().tasks.is_empty());
    });
}

/// Over the bound both stores keep (SQLite's own is about 1 GB, and failed
/// as a storage error): a typed refusal, nothing written.
#[test]
fn an_oversize_param_or_value_is_an_invalid_argument() {
    each_store(|s| {
        let big = vec![7u8; askpool_promises::rules::MAX_VALUE_BYTES + 1];
        assert!(matches!(
            s.create(&CreateRequest::new("big", T + 1_000).param(big.clone()), T),
            Err(PromiseError::InvalidArgument { .. })
        ));
        assert!(s.snapshot().unwrap().promises.is_empty());
        s.create(&CreateRequest::new("small", T + 1_000), T)
            .unwrap();
        assert!(matches!(
            s.complete(&resolve("small").value(big), T),
            Err(PromiseError::InvalidArgument { .. })
        ));
        assert_eq!(s.get("small", T).unwrap().state, State::Pending);
    });
}

/// Tags are labels, bounded like the rest of a promise: a megabyte of
/// them is refused in both stores (the in-memory one took anything), and
/// nothing is written.
#[test]
fn oversize_tags_are_an_invalid_argument() {
    each_store(|s| {
        let big = "t".repeat(askpool_promises::rules::MAX_TAGS_BYTES + 1);
        assert!(matches!(
            s.create(&CreateRequest::new("tagged", T + 1_000).tag("k", big), T),
            Err(PromiseError::InvalidArgument { .. })
        ));
        assert!(s.snapshot().unwrap().promises.is_empty());
        let fits = "t".repeat(askpool_promises::rules::MAX_TAGS_BYTES - 1);
        s.create(&CreateRequest::new("tagged", T + 1_000).tag("k", fits), T)
            .unwrap();
    });
}

#[test]
fn bad_input_gets_typed_errors() {
    each_store(|s| {
        assert!(matches!(
            s.create(&CreateRequest::new("", T), T),
            Err(PromiseError::InvalidArgument { .. })
        ));
        let long = "x".repeat(2_000);
        assert!(matches!(
            s.create(&CreateRequest::new(long, T), T),
            Err(PromiseError::InvalidArgument { .. })
        ));
        assert!(matches!(
            s.create(&CreateRequest::new("p", T).target(Target::pool("")), T),
            Err(PromiseError::InvalidArgument { .. })
        ));
        assert_eq!(
            s.get("missing", T),
            Err(PromiseError::NotFound {
                id: "missing".into()
            })
        );
        let lease = Lease {
            task_id: 42,
            worker: "w".into(),
            claim: 1,
        };
        assert_eq!(
            s.complete_task(&lease, T),
            Err(PromiseError::TaskNotFound { id: 42 })
        );
        assert!(matches!(
            s.claim_task(
                &ClaimRequest {
                    pool: "p".into(),
                    worker: "w".into(),
                    lease_ms: 0
                },
                T
            ),
            Err(PromiseError::InvalidArgument { .. })
        ));
        assert!(s.snapshot().unwrap().promises.is_empty(), "nothing written");
        // Far-future timeouts are clamped, not wrapped.
        let p = s
            .create(&CreateRequest::new("never", u64::MAX), T)
            .unwrap()
            .promise;
        assert_eq!(p.timeout_at, askpool_promises::MAX_TIME);
        assert_eq!(s.get("never", u64::MAX).unwrap().state, State::TimedOut);
    });
}

/// Tasks and callbacks live only while their promises are pending: after
/// many full invoke / await / resume cycles nothing is left but promises.
#[test]
fn tasks_and_callbacks_do_not_accumulate() {
    each_store(|s| {
        for round in 0..100 {
            let (parent, child) = (format!("parent-{round}"), format!("child-{round}"));
            s.create(
                &CreateRequest::new(&parent, T + 60_000).target(Target::pool("ga")),
                T,
            )
            .unwrap();
            claim(s, "ga", "w1", T).unwrap();
            s.create(
                &CreateRequest::new(&child, T + 60_000).target(Target::pool("gb")),
                T,
            )
            .unwrap();
            s.register_callback(&cb(&child, &parent, "ga", "w1"), T)
                .unwrap();
            assert_eq!(claim(s, "gb", "w2", T).unwrap().promise.id, child);
            s.complete(&resolve(&child), T).unwrap();
            let resume = claim(s, "ga", "w1", T).unwrap();
            s.complete_task(&Lease::of(&resume.task), T).unwrap();
            s.complete(&resolve(&parent), T).unwrap();
        }
        let snap = s.snapshot().unwrap();
        assert_eq!(
            (snap.tasks.len(), snap.callbacks.len(), snap.promises.len()),
            (0, 0, 200)
        );
    });
}

/// A lease touches its promise too: once the promise has timed out, its
/// invoke task is gone and the worker hears so at its next heartbeat.
#[test]
fn a_timed_out_promise_ends_its_task_at_the_next_heartbeat() {
    each_store(|s| {
        s.create(
            &CreateRequest::new("p", T + 500).target(Target::pool("gb")),
            T,
        )
        .unwrap();
        let claimed = claim(s, "gb", "w1", T).unwrap();
        let lease = Lease::of(&claimed.task);
        s.heartbeat(&lease, 10_000, T + 499).unwrap();
        assert_eq!(
            s.heartbeat(&lease, 10_000, T + 500),
            Err(PromiseError::TaskNotFound {
                id: claimed.task.id
            })
        );
        assert_eq!(s.snapshot().unwrap().promises[0].state, State::TimedOut);
        assert!(s.snapshot().unwrap().tasks.is_empty());
    });
}

#[test]
fn prune_deletes_old_settled_promises_no_task_needs() {
    each_store(|s| {
        for id in ["old", "recent", "pending", "awaited", "awaiter", "other"] {
            s.create(&CreateRequest::new(id, T + 60_000), T).unwrap();
        }
        s.complete(&resolve("old"), T).unwrap();
        s.complete(&resolve("recent"), T + 100).unwrap();
        // "awaiter" waits on "awaited" and on "other"; "awaited" settles and
        // leaves a resume task naming both; "awaiter", resumed from it,
        // settles too (its running task stays until its worker completes it).
        s.register_callback(&cb("awaited", "awaiter", "ga", "w1"), T)
            .unwrap();
        s.register_callback(&cb("other", "awaiter", "ga", "w1"), T)
            .unwrap();
        s.complete(&resolve("awaited"), T).unwrap();
        let resume = claim(s, "ga", "w1", T).unwrap();
        s.complete(&resolve("awaiter"), T).unwrap();
        assert_eq!(
            s.prune(T + 50, 10).unwrap().pruned,
            1,
            "only old: the rest is recent, pending or named by a task"
        );
        let ids = |s: &dyn Store| -> Vec<String> {
            s.snapshot()
                .unwrap()
                .promises
                .into_iter()
                .map(|p| p.id)
                .collect()
        };
        assert_eq!(ids(s), ["awaited", "awaiter", "other", "pending", "recent"]);
        s.complete_task(&Lease::of(&resume.task), T).unwrap();
        assert_eq!(s.prune(T + 50, 1).unwrap().pruned, 1, "the limit holds");
        assert_eq!(s.prune(T + 50, 10).unwrap().pruned, 1);
        assert_eq!(ids(s), ["other", "pending", "recent"]);
        assert!(
            s.snapshot().unwrap().callbacks.is_empty(),
            "the pruned awaiter's callback went too"
        );
    });
}
