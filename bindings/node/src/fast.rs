//! The hot path as plain N-API functions. The three calls every ask makes
//! (`fastAsk`, `fastDrain`, `fastReplyDrain`) name their core by a number
//! registered in a thread-local table, and are registered as raw N-API
//! callbacks rather than `#[napi]` functions: napi-rs wraps each call of one
//! of those in a borrow scope (allocated, locked and released per call), a
//! reentrancy barrier and its argument conversions, about 150 ns of a
//! 190 ns call here, where the same call through N-API alone costs about
//! 40 ns. A class method costs more still (unwrapping its instance, checking
//! its type tag). Their TypeScript declarations are `node/native-header.d.ts`,
//! the header of the generated `native.d.ts`.

use std::cell::RefCell;
use std::ffi::{c_char, CString};
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::ptr::{self, NonNull};
use std::sync::atomic::{AtomicBool, Ordering};

use askpool::AskError;
use napi::bindgen_prelude::*;
use napi::sys;
use napi_derive::napi;

use crate::core::{panic_error, Core};
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

/// The most arguments a hot function takes.
const MAX_ARGS: usize = 4;

/// One call's arguments, read from N-API.
struct Args {
    env: sys::napi_env,
    argv: [sys::napi_value; MAX_ARGS],
    argc: usize,
}

impl Args {
    /// # Safety
    /// `env` and `info` are the ones N-API passed to the running callback.
    unsafe fn read(env: sys::napi_env, info: sys::napi_callback_info) -> Result<Self> {
        let mut argv = [ptr::null_mut(); MAX_ARGS];
        let mut argc = MAX_ARGS;
        let status = sys::napi_get_cb_info(
            env,
            info,
            &mut argc,
            argv.as_mut_ptr(),
            ptr::null_mut(),
            ptr::null_mut(),
        );
        if status != sys::Status::napi_ok {
            return Err(errors::invalid("cannot read the call's arguments"));
        }
        Ok(Self { env, argv, argc })
    }

    /// Argument `i`; N-API gives `undefined` for one not passed, which
    /// every reader below refuses.
    fn get(&self, i: usize) -> sys::napi_value {
        if i < self.argc {
            self.argv[i]
        } else {
            ptr::null_mut()
        }
    }

    fn u32(&self, i: usize, what: &str) -> Result<u32> {
        self.number(i, what, sys::napi_get_value_uint32)
    }

    fn f64(&self, i: usize, what: &str) -> Result<f64> {
        self.number(i, what, sys::napi_get_value_double)
    }

    fn number<T: Default>(
        &self,
        i: usize,
        what: &str,
        read: unsafe extern "C" fn(sys::napi_env, sys::napi_value, *mut T) -> sys::napi_status,
    ) -> Result<T> {
        let mut value = T::default();
        // SAFETY: `env` is live for this call; a null value fails the call.
        if unsafe { read(self.env, self.get(i), &mut value) } != sys::Status::napi_ok {
            return Err(errors::invalid(format!("{what} must be a number")));
        }
        Ok(value)
    }

    /// A `Uint32Array` argument, as the slice of memory it views.
    ///
    /// # Safety
    /// The slice is valid only during this call, and only while JS code
    /// cannot run (JS waits for this call, and nothing in it calls JS), and
    /// no other slice of the same memory may be alive.
    unsafe fn u32_array<'a>(&self, i: usize, what: &str) -> Result<&'a mut [u32]> {
        let mut kind = 0;
        let mut len = 0;
        let mut data = ptr::null_mut();
        let status = sys::napi_get_typedarray_info(
            self.env,
            self.get(i),
            &mut kind,
            &mut len,
            &mut data,
            ptr::null_mut(),
            ptr::null_mut(),
        );
        if status != sys::Status::napi_ok || kind != sys::TypedarrayType::uint32_array {
            return Err(errors::invalid(format!("{what} must be a Uint32Array")));
        }
        if len == 0 || data.is_null() {
            return Ok(&mut []);
        }
        // A Uint32Array's data is aligned to 4 bytes and `len` elements long.
        Ok(std::slice::from_raw_parts_mut(data.cast::<u32>(), len))
    }
}

/// Runs one hot call: its result as a JS number, or a thrown JS error (a
/// panic too, as an `INTERNAL` error: never an unwind into V8).
///
/// # Safety
/// `env` and `info` are the ones N-API passed to the running callback.
unsafe fn hot_call(
    env: sys::napi_env,
    info: sys::napi_callback_info,
    body: impl FnOnce(&Args) -> Result<u32>,
) -> sys::napi_value {
    let outcome = catch_unwind(AssertUnwindSafe(|| {
        if PANIC_NEXT_HOT_CALL.load(Ordering::Relaxed)
            && PANIC_NEXT_HOT_CALL.swap(false, Ordering::Relaxed)
        {
            panic!("debug_panic_next_hot_call: a test of the hot calls' panic boundary");
        }
        body(&Args::read(env, info)?)
    }))
    .unwrap_or_else(|panic| Err(errors::throw(panic_error(panic.as_ref()))));
    match outcome {
        Ok(n) => {
            let mut value = ptr::null_mut();
            if sys::napi_create_uint32(env, n, &mut value) == sys::Status::napi_ok {
                return value;
            }
            throw(
                env,
                &errors::throw(AskError::internal("cannot return a number")),
            );
        }
        Err(error) => throw(env, &error),
    }
    ptr::null_mut()
}

static PANIC_NEXT_HOT_CALL: AtomicBool = AtomicBool::new(false);

/// For tests: the next `fast*` call panics inside the addon.
#[napi(catch_unwind)]
pub fn debug_panic_next_hot_call() {
    PANIC_NEXT_HOT_CALL.store(true, Ordering::Relaxed);
}

/// Throws `error` as a JS `Error` with its message (the wrapper reads the
/// taxonomy code from it, see `errors`).
unsafe fn throw(env: sys::napi_env, error: &Error) {
    let message = CString::new(error.reason.replace('\0', " ")).unwrap_or_default();
    sys::napi_throw_error(env, ptr::null(), message.as_ptr());
}

/// `fastAsk(core, pool, msg, timeoutMs)`: `Core.ask`.
unsafe extern "C" fn fast_ask(
    env: sys::napi_env,
    info: sys::napi_callback_info,
) -> sys::napi_value {
    hot_call(env, info, |args| {
        let core = args.u32(0, "core")?;
        let (pool, msg) = (args.u32(1, "pool")?, args.u32(2, "msg")?);
        let timeout_ms = args.f64(3, "timeoutMs")?;
        with_core(core, |c| c.ask(pool, msg, timeout_ms))
    })
}

/// `fastDrain(core, buf)`: `Core.drain`.
unsafe extern "C" fn fast_drain(
    env: sys::napi_env,
    info: sys::napi_callback_info,
) -> sys::napi_value {
    hot_call(env, info, |args| {
        let core = args.u32(0, "core")?;
        // SAFETY: as `u32_array` requires: JS waits for this call.
        let buf = unsafe { args.u32_array(1, "buf")? };
        with_core(core, |c| Ok(c.drain_into(buf)))
    })
}

/// `fastReplyDrain(core, request, reply, buf)`: `Core.replyDrain`.
unsafe extern "C" fn fast_reply_drain(
    env: sys::napi_env,
    info: sys::napi_callback_info,
) -> sys::napi_value {
    hot_call(env, info, |args| {
        let core = args.u32(0, "core")?;
        let (request, reply) = (args.u32(1, "request")?, args.u32(2, "reply")?);
        // SAFETY: as in `fast_drain`.
        let buf = unsafe { args.u32_array(3, "buf")? };
        with_core(core, |c| {
            c.reply(request, reply)?;
            Ok(c.drain_into(buf))
        })
    })
}

/// Puts the hot functions on the addon's exports.
#[napi(module_exports)]
pub fn register_fast(exports: Object, env: Env) -> Result<()> {
    type Callback = unsafe extern "C" fn(sys::napi_env, sys::napi_callback_info) -> sys::napi_value;
    let functions: [(&std::ffi::CStr, Callback); 3] = [
        (c"fastAsk", fast_ask),
        (c"fastDrain", fast_drain),
        (c"fastReplyDrain", fast_reply_drain),
    ];
    for (name, callback) in functions {
        let name: *const c_char = name.as_ptr();
        let mut function = ptr::null_mut();
        // SAFETY: `env` and `exports` are the live ones of this module's
        // registration; `name` is a NUL-terminated string.
        unsafe {
            check_status!(sys::napi_create_function(
                env.raw(),
                name,
                -1, // NAPI_AUTO_LENGTH: the name is NUL-terminated
                Some(callback),
                ptr::null_mut(),
                &mut function,
            ))?;
            check_status!(sys::napi_set_named_property(
                env.raw(),
                exports.raw(),
                name,
                function
            ))?;
        }
    }
    Ok(())
}
