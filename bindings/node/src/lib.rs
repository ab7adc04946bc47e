//! askpool's Node addon (`askpool.node`). Thin by design: the `node/` package
//! wraps it in the public API. Every future (asks, workers' pulls, stage
//! streams) is polled on the JS thread by [`Core::drain`], so a reply handed
//! over on the JS thread resolves its ask in the same turn, and the only
//! thread hops are tokio timers.

#![deny(clippy::all)]
// Plain `#[napi]` functions are reached only through the registration napi-rs
// generates, which a `cargo test` build leaves out: unused there, not here.
#![cfg_attr(test, allow(dead_code))]

mod caller;
mod core;
mod durable;
mod errors;
mod fast;
mod info;
mod slots;
mod tok;
mod wake;
mod worker;

pub use crate::core::Core;

#[global_allocator]
static ALLOC: mimalloc::MiMalloc = mimalloc::MiMalloc;
