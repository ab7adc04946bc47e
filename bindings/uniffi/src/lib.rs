//! uniffi bindings of the askpool runtime, for Kotlin on the JVM.
//!
//! Thin by design: argument conversion, completion of host futures through
//! foreign traits, error mapping. The hot path (`NativeNode::ask`, the
//! handler call, `reply`, the completion) takes primitives only, so each is
//! one cheap FFI crossing; see `bindings/kotlin` for the idiomatic API.

mod error;
mod events;
mod exec;
mod handler;
mod host;
mod hot;
mod inflight;
mod node;
mod payload;
mod promises;
mod runtime;
mod stages;

pub use error::{CancelCause, Failure, Fault, NativeError};
pub use handler::RequestInfo;
pub use host::{AskListener, HostHandler, Stage};
pub use node::{
    default_max_payload_bytes, node_ask, AskArgs, AskStart, DeadLetterInfo, NativeNode,
    NativeStats, NodeOptions, PoolOptions,
};
pub use payload::{live_host_refs, take_released, Payload};
pub use promises::{promise_waits_in_flight, NativePromises, PromiseFault, PromiseRecord};
pub use runtime::runtime_worker_threads;
pub use stages::{kept_stage_records, open_stages};

uniffi::setup_scaffolding!();

#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

/// Panics with `message`: lets the host's tests check that a panic inside
/// the library becomes an exception instead of aborting the process.
#[uniffi::export]
pub fn panic_for_test(message: String) {
    panic!("{message}");
}

/// Returns its argument: the cost of one generated call with primitives,
/// the floor under every crossing of the hot path (the Kotlin bench).
#[uniffi::export]
pub fn ffi_probe(x: i64) -> i64 {
    x
}

/// Calls `listener.on_told(i)` `n` times on this thread: the cost of one
/// callback into the host (the Kotlin bench's floor).
#[uniffi::export]
pub fn ffi_probe_callbacks(listener: std::sync::Arc<dyn AskListener>, n: u32) {
    for i in 0..n {
        listener.on_told(i64::from(i));
    }
}
