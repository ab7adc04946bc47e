//! `askpool._native`: the Python binding of askpool. Thin glue: conversion,
//! future bridging onto the asyncio loop's thread, error mapping. The
//! ergonomic API is the `askpool` package around it.

use std::sync::OnceLock;

use pyo3::prelude::*;

mod driver;
mod errors;
mod node;
mod obj;
mod pool;
mod promises;
mod send;
mod stats;
mod task;

static RUNTIME: OnceLock<tokio::runtime::Runtime> = OnceLock::new();

/// The runtime behind timers and `ask_sync`; its one worker thread never
/// runs Python.
pub(crate) fn runtime() -> &'static tokio::runtime::Runtime {
    RUNTIME.get_or_init(|| {
        tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .thread_name("askpool-runtime")
            .enable_time()
            .build()
            .expect("a tokio runtime can start")
    })
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
    m.add_class::<pool::NativePool>()?;
    m.add_class::<pool::Ctx>()?;
    m.add_class::<pool::Reply>()?;
    m.add_class::<promises::NativePromises>()?;
    m.add_class::<promises::NativeWait>()?;
    m.add_function(wrap_pyfunction!(errors::register_error_factory, m)?)?;
    m.add_function(wrap_pyfunction!(pool::register_dispatch, m)?)?;
    m.add_function(wrap_pyfunction!(send::_send_through_method, m)?)?;
    m.add_function(wrap_pyfunction!(_panic, m)?)?;
    m.add_function(wrap_pyfunction!(_live_pools, m)?)?;
    m.add_function(wrap_pyfunction!(_panic_in_next_dispatch, m)?)?;
    Ok(())
}

#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;
