//! The two calls every ask makes from the JVM, as plain C functions with
//! integer arguments (bound with JNA direct mapping, no `Structure`): a
//! generated uniffi call costs tens of microseconds in JNA, these well
//! under one. Same semantics as `node_ask` and `request_reply`; a panic
//! is caught and reported as -2. Tells and asks behind a handle (Kotlin's
//! `tell` and `send`) start through the same call: through the generated
//! `ask_with` they cost some thirty asks each.
//!
//! Both are hot calls (`exec::hot`): what they wake runs before they
//! return, and the events that produces (a request for a handler of this
//! JVM, a reply to one of its callers, a tell accepted: a reply of nothing)
//! come back in `buf`, 4 words each (kind, a, b, handle) after `HEADER`
//! words. The JVM looks their objects up, then calls `askpool_hot_release`
//! if an event's kind carries `events::HELD_FLAG` (a reply; a request's
//! message is kept by its running request instead).

use std::panic::catch_unwind;
use std::sync::atomic::{AtomicBool, Ordering};

use crate::events::hand_over;
use crate::exec;

/// Words before the events (`askpool_hot_ask`): the released-handle count,
/// the request id (high, then low 64 bits), 1 if the stage record was kept.
const HEADER: usize = 4;

/// [`crate::node_ask`] for the hot path, an ask or a tell: `flags` or'ed
/// from 1 (a tell: done when the pool accepts it, reported as a reply of
/// nothing) and 2 (keep the ask's stage record under `token`, for
/// `open_stages`). Returns how many events it wrote, -1 if the node is shut
/// down, -2 if it panicked. The `HEADER` words are written before the
/// events. After -2 the ask may have started: the caller fails its waiter,
/// then cancels the ask under `token` (`NativeNode::cancel`), so the ask's
/// own outcome finds no waiter.
///
/// # Safety
/// `buf` must point to `HEADER + 4 * cap` writable `i64`s.
#[no_mangle]
#[allow(clippy::too_many_arguments)] // one crossing with integers only
pub unsafe extern "C" fn askpool_hot_ask(
    node: i64,
    pool: i64,
    handle: i64,
    timeout_ms: i64,
    token: i64,
    flags: i64,
    buf: *mut i64,
    cap: i32,
) -> i64 {
    catch_unwind(|| {
        let (started, events) = exec::hot(|| {
            let started = crate::node::ask_in_runtime(
                node,
                pool,
                handle,
                u64::try_from(timeout_ms).unwrap_or(0),
                token,
                flags,
            );
            test_panic_point();
            started
        });
        let Some(started) = started else {
            return -1;
        };
        let cap = usize::try_from(cap).unwrap_or(0);
        let id = started.request_id.as_u128();
        let header = [
            i64::try_from(started.released).unwrap_or(i64::MAX),
            (id >> 64) as i64,
            id as i64,
            i64::from(started.stages_kept),
        ];
        // SAFETY: the caller provides HEADER + 4 * cap words.
        unsafe {
            if !buf.is_null() {
                std::ptr::copy_nonoverlapping(header.as_ptr(), buf, HEADER);
            }
            hand_over(events, buf, HEADER, cap) as i64
        }
    })
    .unwrap_or(-2)
}

/// [`crate::handler::request_reply`] for the hot path. Returns how many
/// events it wrote (after `HEADER` words, left as they were), -2 if it
/// panicked.
///
/// # Safety
/// `buf` must point to `HEADER + 4 * cap` writable `i64`s.
#[no_mangle]
pub unsafe extern "C" fn askpool_hot_reply(
    request: i64,
    handle: i64,
    buf: *mut i64,
    cap: i32,
) -> i32 {
    catch_unwind(|| {
        let ((), events) = exec::hot(|| crate::handler::request_reply(request, handle));
        let cap = usize::try_from(cap).unwrap_or(0);
        // SAFETY: the caller provides HEADER + 4 * cap words.
        unsafe { hand_over(events, buf, HEADER, cap) as i32 }
    })
    .unwrap_or(-2)
}

/// Returns its argument: the cost of one hot-path crossing (bench floor).
/// Guarded like every export (nothing here can panic: the guard is free).
#[no_mangle]
pub extern "C" fn askpool_hot_probe(x: i64) -> i64 {
    catch_unwind(|| x).unwrap_or(i64::MIN)
}

/// Set by [`panic_in_next_hot_ask_for_test`]: the next `askpool_hot_ask`
/// panics once its ask has started.
static PANIC_NEXT_ASK: AtomicBool = AtomicBool::new(false);

/// Test only: makes the next `askpool_hot_ask` (any thread) panic after it
/// started its ask, so the host's tests can check that the panic becomes
/// one `Internal` error and that nothing of the ask stays behind.
#[uniffi::export]
pub fn panic_in_next_hot_ask_for_test() {
    PANIC_NEXT_ASK.store(true, Ordering::Relaxed);
}

/// Panics if a test asked for it (one relaxed load otherwise).
pub(crate) fn test_panic_point() {
    if PANIC_NEXT_ASK.load(Ordering::Relaxed) && PANIC_NEXT_ASK.swap(false, Ordering::Relaxed) {
        panic!("deliberate panic in askpool_hot_ask (test)");
    }
}
