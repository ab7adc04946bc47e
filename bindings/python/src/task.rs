//! A Rust future whose output completes an asyncio future, polled on the
//! loop thread by the [`LoopDriver`](crate::driver::LoopDriver).

use std::future::Future;
use std::panic::AssertUnwindSafe;
use std::pin::Pin;
use std::sync::atomic::AtomicBool;
use std::sync::Arc;
use std::task::{Context, Poll, Wake, Waker};

use askpool::AskError;
use parking_lot::Mutex;
use pyo3::intern;
use pyo3::prelude::*;

use crate::driver::{DriverShared, LoopTask};
use crate::errors;

/// Turns a future's output into the asyncio future's result.
pub(crate) type Convert<T> = fn(Python<'_>, T) -> Result<Py<PyAny>, AskError>;

pub(crate) struct FutureTask<F: Future> {
    queued: AtomicBool,
    driver: Arc<DriverShared>,
    pub(crate) future: Mutex<Option<F>>,
    /// Released once completed or abandoned: the asyncio future usually
    /// holds this task, and Python's GC cannot see the cycle through Rust.
    target: Mutex<Option<Py<PyAny>>>,
    convert: Convert<F::Output>,
}

impl<F> FutureTask<F>
where
    F: Future + Unpin + Send + 'static,
    F::Output: 'static,
{
    /// Starts polling `future` on `driver`'s loop; `target` gets its output.
    pub(crate) fn spawn(
        driver: &Arc<DriverShared>,
        future: F,
        target: Py<PyAny>,
        convert: Convert<F::Output>,
    ) -> Arc<Self> {
        let task = Arc::new(Self {
            queued: AtomicBool::new(false),
            driver: Arc::clone(driver),
            future: Mutex::new(Some(future)),
            target: Mutex::new(Some(target)),
            convert,
        });
        driver.schedule(task.clone());
        task
    }

    /// Drops the future (cancelling what it drives); `target` is left alone.
    pub(crate) fn abandon(&self) -> Option<F> {
        let target = self.target.lock().take();
        drop(target);
        self.future.lock().take()
    }
}

impl<F> Wake for FutureTask<F>
where
    F: Future + Unpin + Send + 'static,
    F::Output: 'static,
{
    fn wake(self: Arc<Self>) {
        let driver = Arc::clone(&self.driver);
        driver.schedule(self);
    }
    fn wake_by_ref(self: &Arc<Self>) {
        self.driver.schedule(self.clone());
    }
}

impl<F> LoopTask for FutureTask<F>
where
    F: Future + Unpin + Send + 'static,
    F::Output: 'static,
{
    fn queued(&self) -> &AtomicBool {
        &self.queued
    }

    fn run(self: Arc<Self>, py: Python<'_>) {
        let waker = Waker::from(Arc::clone(&self));
        let mut cx = Context::from_waker(&waker);
        let output = {
            let mut slot = self.future.lock();
            let Some(future) = slot.as_mut() else {
                return;
            };
            let polled =
                std::panic::catch_unwind(AssertUnwindSafe(|| Pin::new(future).poll(&mut cx)));
            match polled {
                Ok(Poll::Pending) => return,
                Ok(Poll::Ready(output)) => {
                    *slot = None;
                    Ok(output)
                }
                Err(panic) => {
                    *slot = None;
                    Err(errors::panic_error(panic.as_ref()))
                }
            }
        };
        let Some(target) = self.target.lock().take() else {
            return;
        };
        let result = output.and_then(|output| (self.convert)(py, output));
        complete(py, target.bind(py), result);
    }
}

/// Sets `target`'s result or exception. One already done (cancelled by
/// other means than `AskHandle.cancel`) keeps its state; any other failure
/// to set it is reported as unraisable, not lost.
pub(crate) fn complete(
    py: Python<'_>,
    target: &Bound<'_, PyAny>,
    result: Result<Py<PyAny>, AskError>,
) {
    let outcome = (|| -> PyResult<()> {
        match result {
            Ok(value) => target.call_method1(intern!(py, "set_result"), (value,))?,
            Err(error) => {
                let exc = errors::exception(py, &error);
                target.call_method1(intern!(py, "set_exception"), (exc.into_value(py),))?
            }
        };
        Ok(())
    })();
    if let Err(e) = outcome {
        let done = target
            .call_method0(intern!(py, "done"))
            .and_then(|d| d.is_truthy())
            .unwrap_or(false);
        if !done {
            e.write_unraisable(py, Some(target));
        }
    }
}
