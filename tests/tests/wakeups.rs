//! Idle workers are woken for queued work whatever their other waits do: a
//! wake-up picked for a wait that then takes other work, or is dropped, is
//! passed on, and two pulls of one worker both get woken.

use std::future::Future;
use std::pin::{pin, Pin};
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use askpool::Node;

fn poll_once<F: Future>(f: Pin<&mut F>) -> Poll<F::Output> {
    let waker = futures::task::noop_waker();
    f.poll(&mut Context::from_waker(&waker))
}

async fn settle() {
    for _ in 0..10 {
        tokio::task::yield_now().await;
    }
}

type Pull = tokio::task::JoinHandle<Option<u64>>;

/// A node with pool `p` and its workers w1 (already waiting, in a task
/// whose result is the first message it gets) and w2.
async fn w1_waiting() -> (Node<u64, String>, askpool::WorkerPool<u64, String>, Pull) {
    let node: Node<u64, String> = Node::new();
    let pool = node.pool("p").build().unwrap();
    let w1 = pool.worker("w1").unwrap();
    let t1 = tokio::spawn(async move { w1.next_request().await.map(|r| r.message) });
    settle().await;
    (node, pool, t1)
}

/// What w1 got, failing when it was not woken.
async fn w1_got(t1: Pull) -> Option<u64> {
    tokio::time::timeout(Duration::from_secs(5), t1)
        .await
        .expect("w1 is woken for the shared request")
        .unwrap()
}

/// w2 is picked by a push to the shared queue but takes the request in its
/// own inbox: the shared request must still reach w1.
#[tokio::test]
async fn a_pick_unused_because_the_inbox_had_work_goes_to_the_next_idle_worker() {
    let (node, pool, t1) = w1_waiting().await;
    let w2 = pool.worker("w2").unwrap();
    let mut f2 = pin!(w2.next_request());
    assert!(poll_once(f2.as_mut()).is_pending());
    let _preferring = node.ask("p", 1).preferred_worker("w2").send();
    let _shared = node.ask("p", 2).send();
    settle().await;
    let Poll::Ready(Some(r)) = poll_once(f2.as_mut()) else {
        panic!("w2 got nothing");
    };
    assert_eq!(r.message, 1, "w2 takes its own inbox first");
    assert_eq!(w1_got(t1).await, Some(2));
}

/// A pull whose wait is dropped (a `select!` or `timeout` branch won) right
/// after a push picked it: the request must still reach another worker.
#[tokio::test]
async fn a_pick_of_a_dropped_wait_goes_to_the_next_idle_worker() {
    let (node, pool, t1) = w1_waiting().await;
    let w2 = pool.worker("w2").unwrap();
    let _ask = {
        let mut f2 = pin!(w2.next_request());
        assert!(poll_once(f2.as_mut()).is_pending());
        let ask = node.ask("p", 2).send();
        settle().await;
        ask
    };
    assert_eq!(w1_got(t1).await, Some(2));
}

/// Two pulls of one worker wait at once: each request wakes one of them.
#[tokio::test]
async fn two_pulls_of_one_worker_are_both_woken() {
    let node: Node<u64, String> = Node::new();
    let pool = node.pool("p").build().unwrap();
    let w = Arc::new(pool.worker("w").unwrap());
    let pull = |w: Arc<askpool::Worker<u64, String>>| {
        tokio::spawn(async move { w.next_request().await.map(|r| r.message) })
    };
    let mut a = pull(Arc::clone(&w));
    settle().await;
    let mut b = pull(Arc::clone(&w));
    settle().await;
    let _first = node.ask("p", 1).send();
    let (one, rest) = tokio::time::timeout(Duration::from_secs(5), async {
        tokio::select! {
            r = &mut a => (r.unwrap(), b),
            r = &mut b => (r.unwrap(), a),
        }
    })
    .await
    .expect("a pull is woken for the first request");
    let _second = node.ask("p", 2).preferred_worker("w").send();
    let two = tokio::time::timeout(Duration::from_secs(5), rest)
        .await
        .expect("the other pull is woken for the second request")
        .unwrap();
    let mut got = vec![one, two];
    got.sort();
    assert_eq!(got, vec![Some(1), Some(2)]);
}

/// w2's pull is polled again (a `select!` sibling woke its task). A shared
/// ask and an ask preferring w2 land while it registers its waker again
/// (the waker's clone sends them, standing in for another thread): w2 takes
/// its inbox's request, and the shared one must still reach w1.
#[tokio::test]
async fn a_pick_hidden_by_enlisting_again_goes_to_the_next_idle_worker() {
    use std::sync::Mutex;
    use std::task::{RawWaker, RawWakerVTable, Waker};
    type Hook = Box<dyn FnOnce() + Send>;
    static HOOK: Mutex<Option<Hook>> = Mutex::new(None);
    fn clone(_: *const ()) -> RawWaker {
        if let Some(hook) = HOOK.lock().unwrap().take() {
            hook();
        }
        RawWaker::new(std::ptr::null(), &VTABLE)
    }
    fn noop(_: *const ()) {}
    static VTABLE: RawWakerVTable = RawWakerVTable::new(clone, noop, noop, noop);

    let (node, pool, t1) = w1_waiting().await;
    let w2 = pool.worker("w2").unwrap();
    let mut f2 = pin!(w2.next_request());
    assert!(poll_once(f2.as_mut()).is_pending());
    let asks = Arc::new(Mutex::new(Vec::new()));
    {
        let (node, asks) = (node.clone(), Arc::clone(&asks));
        *HOOK.lock().unwrap() = Some(Box::new(move || {
            let mut asks = asks.lock().unwrap();
            asks.push(node.ask("p", 2).send());
            asks.push(node.ask("p", 1).preferred_worker("w2").send());
        }));
    }
    // SAFETY: the vtable's functions ignore the data pointer.
    let waker = unsafe { Waker::from_raw(RawWaker::new(std::ptr::null(), &VTABLE)) };
    let Poll::Ready(Some(r)) = f2.as_mut().poll(&mut Context::from_waker(&waker)) else {
        panic!("w2 got nothing");
    };
    assert_eq!(r.message, 1, "w2 takes its own inbox first");
    assert_eq!(w1_got(t1).await, Some(2));
}
