//! Reading a stage stream (an ask's, or a durable ask's relay) from Python,
//! one event per awaited future.

use std::sync::{Arc, OnceLock};

use askpool::{AskError, StageEvent, StageSource, StageStream};
use futures::StreamExt;
use parking_lot::Mutex;
use pyo3::prelude::*;

use crate::driver::LoopDriver;
use crate::obj::Obj;
use crate::task::FutureTask;

/// A stage source, opened by the first read: most asks never read their
/// stages, and an open stream queues every event.
pub(crate) struct StageReader {
    /// `None`: no stages to read.
    source: Option<StageSource<Obj>>,
    stream: OnceLock<Arc<Mutex<StageStream<Obj>>>>,
}

impl StageReader {
    pub(crate) fn new(source: StageSource<Obj>) -> Self {
        Self {
            source: Some(source),
            stream: OnceLock::new(),
        }
    }

    /// A reader whose stages end at once.
    pub(crate) fn empty() -> Self {
        Self {
            source: None,
            stream: OnceLock::new(),
        }
    }

    /// Completes `target` with the next stage event as
    /// `(stage, since_sent, since_previous, fraction, note)`, or `None` after
    /// the last one.
    pub(crate) fn next(&self, py: Python<'_>, driver: &LoopDriver, target: Py<PyAny>) {
        let Some(source) = &self.source else {
            let none = futures::future::ready(None);
            driver.eager(py, || {
                FutureTask::spawn(&driver.shared, none, target, stage_or_end);
            });
            return;
        };
        let stream = self
            .stream
            .get_or_init(|| Arc::new(Mutex::new(source.open())));
        let stream = Arc::clone(stream);
        let next = futures::future::poll_fn(move |cx| stream.lock().poll_next_unpin(cx));
        driver.eager(py, || {
            FutureTask::spawn(&driver.shared, next, target, stage_or_end);
        });
    }
}

/// The next stage event as Python gets it (`None` once they ended).
fn stage_or_end(py: Python<'_>, event: Option<StageEvent>) -> Result<Py<PyAny>, AskError> {
    match event {
        Some(e) => stage_tuple(py, e),
        None => Ok(py.None()),
    }
}

fn stage_tuple(py: Python<'_>, e: StageEvent) -> Result<Py<PyAny>, AskError> {
    let (fraction, note) = match e.progress {
        Some(p) => (Some(p.fraction_f64()), Some(p.note)),
        None => (None, None),
    };
    let tuple = (
        e.stage.as_str(),
        e.since_sent.as_secs_f64(),
        e.since_previous.as_secs_f64(),
        fraction,
        note,
    );
    tuple
        .into_pyobject(py)
        .map(|t| t.into_any().unbind())
        .map_err(|e| AskError::internal(e.to_string()))
}
