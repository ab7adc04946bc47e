//! Host objects cross Rust as [`Tok`]s: the JS wrapper keeps the object in a
//! table and Rust carries its slot number. The runtime clones and drops
//! payloads freely (resends, the reply cache, the DLQ); the slot is freed when
//! the last clone drops, so the JS table holds exactly what Rust still holds.

use std::sync::Arc;

use parking_lot::Mutex;

/// Slots whose last `Tok` dropped, waiting for the JS thread to clear them.
#[derive(Default)]
pub struct FreeList(Mutex<Vec<u32>>);

impl FreeList {
    /// Moves up to `max` freed slots into `out`.
    pub fn take_into(&self, out: &mut Vec<u32>, max: usize) {
        let mut freed = self.0.lock();
        let n = freed.len().min(max);
        let start = freed.len() - n;
        out.extend(freed.drain(start..));
    }

    pub fn len(&self) -> usize {
        self.0.lock().len()
    }
}

struct Slot {
    id: u32,
    freed: Arc<FreeList>,
}

impl Drop for Slot {
    fn drop(&mut self) {
        self.freed.0.lock().push(self.id);
    }
}

/// A reference to one entry of the JS object table. Cloning shares it.
#[derive(Clone)]
pub struct Tok(Arc<Slot>);

impl Tok {
    pub fn new(id: u32, freed: &Arc<FreeList>) -> Self {
        Tok(Arc::new(Slot {
            id,
            freed: Arc::clone(freed),
        }))
    }

    pub fn id(&self) -> u32 {
        self.0.id
    }
}
