//! `askpool._native`: the Python binding of askpool. Thin glue: conversion,
//! future bridging onto the asyncio loop's thread, error mapping. The
//! ergonomic API is the `askpool` package around it.

use std::sync::atomic::{AtomicBool, AtomicPtr, AtomicU64, Ordering};

use pyo3::prelude::*;

mod driver;
mod errors;
mod node;
mod obj;
mod pool;
mod promises;
mod send;
mod soon;
mod stages;
mod stats;
mod task;

/// The runtime of this process (see [`runtime`]); null until first used,
/// and again in a child process after `os.fork()`.
static RUNTIME: AtomicPtr<tokio::runtime::Runtime> = AtomicPtr::new(std::ptr::null_mut());
/// How many times this process is a fork's child (see [`forks`]).
static FORKS: AtomicU64 = AtomicU64::new(0);
/// Set by the wrapper's `atexit` hook: the interpreter is shutting down.
static EXITING: AtomicBool = AtomicBool::new(false);

thread_local! {
    /// This thread ran the `atexit` hooks (the main thread): it finalizes
    /// the interpreter itself, so it may always take the GIL back.
    static RUNS_THE_EXIT: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
}

thread_local! {
    /// Set on the runtime's own threads (its worker, its blocking pool).
    static ON_RUNTIME_THREAD: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
}

/// Whether this is one of the runtime's threads, which never run Python.
pub(crate) fn on_runtime_thread() -> bool {
    ON_RUNTIME_THREAD.get()
}

/// The runtime behind timers and `ask_sync`; its one worker thread never
/// runs Python.
pub(crate) fn runtime() -> &'static tokio::runtime::Runtime {
    let current = RUNTIME.load(Ordering::Acquire);
    if current.is_null() {
        return start_runtime();
    }
    // SAFETY: a runtime, once stored, is leaked: never freed.
    unsafe { &*current }
}

#[cold]
fn start_runtime() -> &'static tokio::runtime::Runtime {
    static STARTING: parking_lot::Mutex<()> = parking_lot::Mutex::new(());
    let _one = STARTING.lock();
    let current = RUNTIME.load(Ordering::Acquire);
    if !current.is_null() {
        // SAFETY: as in `runtime`.
        return unsafe { &*current };
    }
    let started = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .thread_name("askpool-runtime")
        .on_thread_start(|| ON_RUNTIME_THREAD.set(true))
        .enable_time()
        .build()
        .expect("a tokio runtime can start");
    let leaked: &'static tokio::runtime::Runtime = Box::leak(Box::new(started));
    RUNTIME.store(std::ptr::from_ref(leaked).cast_mut(), Ordering::Release);
    leaked
}

/// How many forks made this process (0 in the process that imported the
/// module): a `Node` made before a fork belongs to its parent.
pub(crate) fn forks() -> u64 {
    FORKS.load(Ordering::Acquire)
}

/// Whether a thread blocked without the GIL must not take it back: the
/// interpreter is shutting down (see [`_interpreter_exiting`]) and this is
/// not the thread that shuts it down. By then every thread but the main
/// one is a daemon thread (`threading` joined the others before the
/// `atexit` hooks ran), which CPython ends if it takes the GIL back once
/// finalization starts. The main thread, still running `atexit` hooks
/// (one may call `ask_sync`), goes on as usual.
pub(crate) fn must_not_return_to_python() -> bool {
    EXITING.load(Ordering::Acquire) && !RUNS_THE_EXIT.with(std::cell::Cell::get)
}

/// `os.register_at_fork(after_in_child=...)`: the child has only the thread
/// that forked, so the runtime's worker and timer threads are gone and no
/// timer of it would ever fire. The child starts a runtime of its own on
/// first use; the parent's is left as it is (dropping it would wait for
/// threads that do not exist here), and the parent's `Node`s refuse work.
#[pyfunction]
fn _after_fork_in_child() {
    FORKS.fetch_add(1, Ordering::AcqRel);
    RUNTIME.store(std::ptr::null_mut(), Ordering::Release);
}

/// The wrapper's `atexit` hook. Once the interpreter finalizes, a thread
/// that takes the GIL back is ended by CPython (`pthread_exit`), and that
/// unwinding through this extension's frames aborts the process: a daemon
/// thread still blocked in `ask_sync` then never takes it back (it waits
/// on, as CPython 3.14 lets such threads wait, until the process exits).
#[pyfunction]
fn _interpreter_exiting() {
    RUNS_THE_EXIT.with(|runs| runs.set(true));
    EXITING.store(true, Ordering::Release);
}

/// Panics inside the extension (for the test that a panic surfaces as an
/// exception and the process lives on).
#[pyfunction]
fn _panic(message: &str) {
    panic!("{message}");
}

/// Pools alive in the process (`askpool::live_pools`), for leak tests.
#[pyfunction]
fn _live_pools() -> usize {
    askpool::live_pools()
}

/// Has the allocator give back what it keeps of freed memory (mimalloc
/// keeps freed blocks for reuse, and a block freed on another thread waits
/// for its owner's next allocation): for tests that bound resident memory.
#[pyfunction]
fn _release_freed_memory() {
    // SAFETY: takes no pointer; safe on any thread at any time.
    unsafe { libmimalloc_sys::mi_collect(true) };
}

/// Makes the next request a pool worker takes panic before its handler
/// starts (for the test that a worker's panic fails that request only).
#[pyfunction]
fn _panic_in_next_dispatch(message: String) {
    *pool::PANIC_IN_NEXT_DISPATCH.lock() = Some(message);
}

#[pymodule]
fn _native(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add(
        "DEFAULT_MAX_PAYLOAD_BYTES",
        askpool::DEFAULT_MAX_PAYLOAD_BYTES,
    )?;
    m.add_class::<driver::LoopDriver>()?;
    m.add_class::<node::NativeNode>()?;
    m.add_class::<node::NativeAsk>()?;
    m.add_class::<node::NativeDurable>()?;
    m.add_class::<pool::NativePool>()?;
    m.add_class::<pool::Ctx>()?;
    m.add_class::<pool::Reply>()?;
    m.add_class::<promises::NativePromises>()?;
    m.add_class::<promises::NativeWait>()?;
    m.add_function(wrap_pyfunction!(errors::register_error_factory, m)?)?;
    m.add_function(wrap_pyfunction!(pool::register_dispatch, m)?)?;
    m.add_function(wrap_pyfunction!(send::_send_through_method, m)?)?;
    m.add_function(wrap_pyfunction!(send::_send_in, m)?)?;
    m.add_function(wrap_pyfunction!(send::_step_as, m)?)?;
    m.add_function(wrap_pyfunction!(soon::_soon, m)?)?;
    m.add_class::<soon::Soon>()?;
    m.add_function(wrap_pyfunction!(pool::cancel_standing, m)?)?;
    m.add_function(wrap_pyfunction!(_panic, m)?)?;
    m.add_function(wrap_pyfunction!(_live_pools, m)?)?;
    m.add_function(wrap_pyfunction!(_release_freed_memory, m)?)?;
    m.add_function(wrap_pyfunction!(_panic_in_next_dispatch, m)?)?;
    m.add_function(wrap_pyfunction!(_after_fork_in_child, m)?)?;
    m.add_function(wrap_pyfunction!(_interpreter_exiting, m)?)?;
    Ok(())
}

#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;
