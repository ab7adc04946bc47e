//! The hot path as plain functions. A class method pays for unwrapping its
//! instance and checking its type tag on every call (about three times the
//! cost of a plain call here); the three calls every ask makes (`ask`,
//! `drain`, `replyDrain`) instead name their core by a number registered in
//! a thread-local table.

use std::cell::RefCell;
use std::ptr::NonNull;

use napi::bindgen_prelude::*;
use napi_derive::napi;

use crate::core::Core;
use crate::errors;
use crate::slots::Slots;

thread_local! {
    static CORES: RefCell<Slots<NonNull<Core>>> = RefCell::default();
}

#[napi]
impl Core {
    /// Registers this core for the `fast*` functions; returns its number.
    #[napi(catch_unwind)]
    pub fn fast_path(&mut self) -> u32 {
        if let Some(id) = self.fast_id {
            return id;
        }
        // napi-rs keeps a class instance in one heap allocation from its
        // construction to its finalization, so this address stays valid
        // until `Drop` below removes it.
        let ptr = NonNull::from(&mut *self);
        let id = CORES.with(|cores| cores.borrow_mut().insert_with(|_| ptr));
        self.fast_id = Some(id);
        id
    }
}

impl Drop for Core {
    fn drop(&mut self) {
        if let Some(id) = self.fast_id.take() {
            CORES.with(|cores| cores.borrow_mut().remove(id));
        }
    }
}

fn with_core<T>(id: u32, f: impl FnOnce(&mut Core) -> Result<T>) -> Result<T> {
    let ptr = CORES
        .with(|cores| cores.borrow().get(id).copied())
        .ok_or_else(|| errors::invalid(format!("no core registered as {id}")))?;
    // SAFETY: the pointer is live (removed when the core drops) and only
    // this thread uses it: the table is thread-local, cores are created and
    // called on their JS thread, and no call into a core calls back into JS,
    // so no other reference to the core exists during `f`.
    f(unsafe { &mut *ptr.as_ptr() })
}

/// `Core.ask`.
#[napi(catch_unwind)]
pub fn fast_ask(core: u32, pool: u32, msg: u32, timeout_ms: f64) -> Result<u32> {
    with_core(core, |c| c.ask(pool, msg, timeout_ms))
}

/// `Core.drain`.
#[napi(catch_unwind)]
pub fn fast_drain(core: u32, mut buf: Uint32ArraySlice) -> Result<u32> {
    // SAFETY: as in `Core.drain`: JS waits for this call.
    let buf = unsafe { buf.as_mut() };
    with_core(core, |c| Ok(c.drain_into(buf)))
}

/// `Core.replyDrain`.
#[napi(catch_unwind)]
pub fn fast_reply_drain(
    core: u32,
    request: u32,
    reply: u32,
    mut buf: Uint32ArraySlice,
) -> Result<u32> {
    // SAFETY: as in `Core.drain`.
    let buf = unsafe { buf.as_mut() };
    with_core(core, |c| {
        c.reply(request, reply)?;
        Ok(c.drain_into(buf))
    })
}
