//! The two calls every ask makes from the JVM, as plain C functions with
//! integer arguments (bound with JNA direct mapping, no `Structure`): a
//! generated uniffi call costs tens of microseconds in JNA, these well
//! under one. Same semantics as `node_ask` and `request_reply`; a panic
//! is caught and reported as -2.

use std::panic::catch_unwind;

/// [`crate::node_ask`] for the hot path; -2 if it panicked.
#[no_mangle]
pub extern "C" fn askpool_hot_ask(
    node: i64,
    pool: i64,
    handle: i64,
    timeout_ms: i64,
    token: i64,
) -> i64 {
    catch_unwind(|| {
        let released = crate::node::node_ask(
            node,
            pool,
            handle,
            u64::try_from(timeout_ms).unwrap_or(0),
            token,
        );
        i64::try_from(released).unwrap_or(-1)
    })
    .unwrap_or(-2)
}

/// [`crate::handler::request_reply`] for the hot path; -2 if it panicked.
#[no_mangle]
pub extern "C" fn askpool_hot_reply(request: i64, handle: i64) -> i32 {
    catch_unwind(|| {
        crate::handler::request_reply(request, handle);
        0
    })
    .unwrap_or(-2)
}

/// Returns its argument: the cost of one hot-path crossing (bench floor).
#[no_mangle]
pub extern "C" fn askpool_hot_probe(x: i64) -> i64 {
    x
}
