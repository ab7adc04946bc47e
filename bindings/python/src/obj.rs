//! A Python object as an askpool payload: cloning it (for re-sends and the
//! reply cache) is a reference-count bump that needs no GIL, and the very
//! same object comes out the other side (`is`).

use std::sync::Arc;

use pyo3::prelude::*;

#[derive(Clone)]
pub(crate) struct Obj(Arc<Py<PyAny>>);

impl Obj {
    pub(crate) fn new(object: Py<PyAny>) -> Self {
        Self(Arc::new(object))
    }

    pub(crate) fn get(&self, py: Python<'_>) -> Py<PyAny> {
        self.0.clone_ref(py)
    }
}
