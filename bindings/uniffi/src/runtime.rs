//! The one tokio runtime of the library, started on first use.

use std::sync::OnceLock;

use tokio::runtime::Runtime;

static RUNTIME: OnceLock<Runtime> = OnceLock::new();

pub fn runtime() -> &'static Runtime {
    RUNTIME.get_or_init(|| {
        tokio::runtime::Builder::new_multi_thread()
            .worker_threads(worker_threads())
            .thread_name("askpool-tokio")
            .enable_time()
            .build()
            .expect("cannot start the askpool tokio runtime")
    })
}

fn worker_threads() -> usize {
    std::thread::available_parallelism()
        .map(|n| n.get())
        .unwrap_or(2)
        .clamp(2, 4)
}

/// Worker threads of the runtime: the most threads that ever call into the
/// JVM (they stay attached, so this bounds the JVM threads they create).
#[uniffi::export]
pub fn runtime_worker_threads() -> u32 {
    runtime().metrics().num_workers() as u32
}
