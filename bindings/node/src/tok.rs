//! Host objects cross Rust as [`Tok`]s: the JS wrapper keeps the object in a
//! table and Rust carries its slot number. The runtime clones and drops
//! payloads freely (resends, the reply cache, the DLQ); the slot is freed when
//! the last clone drops, so the JS table holds exactly what Rust still holds.
//!
//! A durable ask's message and reply also carry their serialized bytes (the
//! wrapper's JSON), which the promise store keeps; one read back from the
//! store after a restart has bytes and no slot.

use std::sync::Arc;

use askpool_promises::Durable;
use parking_lot::Mutex;

use crate::wake::Shared;

/// Slots whose last `Tok` dropped, waiting for the JS thread to clear them.
pub struct FreeList {
    slots: Mutex<Vec<u32>>,
    /// Told when a slot is freed on another thread: the JS thread then
    /// drains soon. A slot freed while the node is idle (a
    /// reply the cache let go at its TTL) would otherwise keep its object
    /// until the next call into the addon.
    js: Arc<Shared>,
}

impl FreeList {
    pub fn new(js: Arc<Shared>) -> Self {
        Self {
            slots: Mutex::default(),
            js,
        }
    }

    fn push(&self, id: u32) {
        self.slots.lock().push(id);
        // Once per drain (a slot freed on the JS thread may be waiting
        // already, for the drain after the call that freed it).
        self.js.poke();
    }

    /// Moves up to `max` freed slots into `out`.
    pub fn take_into(&self, out: &mut Vec<u32>, max: usize) {
        let mut freed = self.slots.lock();
        let n = freed.len().min(max);
        let start = freed.len() - n;
        out.extend(freed.drain(start..));
    }
}

struct Slot {
    /// The slot in the JS table and where to report it free, if any.
    slot: Option<(u32, Arc<FreeList>)>,
    bytes: Option<Box<[u8]>>,
}

impl Drop for Slot {
    fn drop(&mut self) {
        if let Some((id, freed)) = &self.slot {
            freed.push(*id);
        }
    }
}

/// A reference to one entry of the JS object table. Cloning shares it.
#[derive(Clone)]
pub struct Tok(Arc<Slot>);

impl Tok {
    pub fn new(id: u32, freed: &Arc<FreeList>) -> Self {
        Tok(Arc::new(Slot {
            slot: Some((id, Arc::clone(freed))),
            bytes: None,
        }))
    }

    /// An object that also travels as `bytes` (a durable ask's payload).
    pub fn with_bytes(id: u32, freed: &Arc<FreeList>, bytes: Vec<u8>) -> Self {
        Tok(Arc::new(Slot {
            slot: Some((id, Arc::clone(freed))),
            bytes: Some(bytes.into_boxed_slice()),
        }))
    }

    /// The table slot; `None` for a payload read back from a store.
    pub fn slot(&self) -> Option<u32> {
        self.0.slot.as_ref().map(|(id, _)| *id)
    }

    /// The slot, or `u32::MAX` where there is none.
    pub fn id(&self) -> u32 {
        self.slot().unwrap_or(u32::MAX)
    }

    pub fn bytes(&self) -> Option<&[u8]> {
        self.0.bytes.as_deref()
    }
}

impl Durable for Tok {
    /// The JSON the host encoded beside the object (lib/node.js fails a
    /// durable request whose reply is not JSON before it gets here).
    fn to_bytes(&self) -> Result<Vec<u8>, String> {
        self.bytes()
            .map(<[u8]>::to_vec)
            .ok_or_else(|| "a value with no JSON encoding".into())
    }

    fn from_bytes(bytes: &[u8]) -> Result<Self, String> {
        Ok(Tok(Arc::new(Slot {
            slot: None,
            bytes: Some(bytes.into()),
        })))
    }

    /// JSON.stringify writes an object's keys in the order they were set:
    /// `{a, b}` and `{b, a}` are one message asked twice.
    fn same_as(&self, encoded: &[u8], stored: &[u8]) -> bool {
        use serde_json::Value;
        encoded == stored
            || matches!(
                (serde_json::from_slice::<Value>(encoded), serde_json::from_slice::<Value>(stored)),
                (Ok(a), Ok(b)) if a == b
            )
    }
}
