//! A Python object as an askpool payload: cloning it (for re-sends and the
//! reply cache) is a reference-count bump that needs no GIL, and the very
//! same object comes out the other side (`is`).
//!
//! The last clone can be dropped deep inside the core, under one of its
//! locks (a dead letter pushed out of a full queue, a cache eviction).
//! Decrementing there could run the object's `__del__`, that is Python code
//! under a core lock; so a dropped object goes to a graveyard that
//! [`release_dropped`] empties where no core lock is held: each run of a
//! loop's driver, and the close of a node, a pool or a loop. One dropped on
//! the runtime's thread (a reply the cache lets go at its TTL while nothing
//! else happens) also wakes a loop's driver to empty it.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use parking_lot::Mutex;
use pyo3::prelude::*;

#[derive(Clone)]
pub(crate) struct Obj(Arc<Holder>);

struct Holder(Option<Py<PyAny>>);

static GRAVEYARD: Mutex<Vec<Py<PyAny>>> = Mutex::new(Vec::new());

/// A driver was woken to empty the graveyard and has not yet: one wake per
/// batch. (Not "the first into an empty graveyard": one dropped on a Python
/// thread outside any drain may already wait there, with no wake coming.)
static RELEASE_ASKED: AtomicBool = AtomicBool::new(false);

impl Drop for Holder {
    fn drop(&mut self) {
        if let Some(object) = self.0.take() {
            GRAVEYARD.lock().push(object);
            if crate::on_runtime_thread()
                && !RELEASE_ASKED.swap(true, Ordering::AcqRel)
                && !crate::driver::wake_a_driver()
            {
                // No loop runs: the next drain or close empties it.
                RELEASE_ASKED.store(false, Ordering::Release);
            }
        }
    }
}

impl Obj {
    pub(crate) fn new(object: Py<PyAny>) -> Self {
        Self(Arc::new(Holder(Some(object))))
    }

    pub(crate) fn get(&self, py: Python<'_>) -> Py<PyAny> {
        self.0
             .0
            .as_ref()
            .expect("held until dropped")
            .clone_ref(py)
    }
}

/// Drops the objects the core let go of. Call with no core lock held.
pub(crate) fn release_dropped(_py: Python<'_>) {
    // Before the take: an object pushed after it asks for a wake again.
    RELEASE_ASKED.store(false, Ordering::Release);
    let dropped = std::mem::take(&mut *GRAVEYARD.lock());
    // The graveyard's lock is released: a `__del__` that drops more objects
    // pushes them for the next call.
    drop(dropped);
}
