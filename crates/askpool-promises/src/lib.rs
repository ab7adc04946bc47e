//! Durable promises after the Resonate coordination protocol (DESIGN
//! section 5): promises that outlive processes, invoke tasks that pools
//! claim with leases, callbacks that resume an awaiting execution, and a
//! durable ask whose outcome survives a caller restart.
//!
//! ```
//! use askpool_promises::{CompleteRequest, Completion, CreateRequest, MemoryStore, State, Store};
//!
//! let store = MemoryStore::new();
//! let now = 1_000;
//! store.create(&CreateRequest::new("order-1", now + 60_000).key("k1"), now)?;
//! let done = store.complete(&CompleteRequest::new("order-1", Completion::Resolve).value("ok"), now)?;
//! assert_eq!(done.promise.state, State::Resolved);
//! // Later than its timeout, a pending promise reads as timed out.
//! store.create(&CreateRequest::new("order-2", now + 10), now)?;
//! assert_eq!(store.get("order-2", now + 10)?.state, State::TimedOut);
//! # Ok::<(), askpool_promises::PromiseError>(())
//! ```
//!
//! The protocol's rules are in [`rules`]; the store API is synchronous (see
//! [`Store`] for how async code calls it).

mod durable;
mod error;
mod facade;
mod invariants;
mod memory;
mod model;
mod ops;
mod outcome;
mod pattern;
pub mod rules;
mod skipped_log;
mod sqlite;
mod store;
mod sweeper;

pub use durable::{now_millis, Durable, DurableAsk, DurableHandle};
pub use error::PromiseError;
pub use facade::DurablePromises;
pub use invariants::violations;
pub use memory::MemoryStore;
pub use model::{
    Callback, CallbackOutcome, CallbackRequest, ClaimRequest, Claimed, CompleteRequest, Completed,
    Completion, CreateRequest, Created, Lease, Millis, Promise, SearchQuery, Snapshot, State,
    Target, Task, TaskKind, TaskState, MAX_TIME,
};
pub use ops::SEARCH_TIME_OUT_BATCH;
pub use pattern::matches as pattern_matches;
pub use sqlite::{CrashHook, SqliteOptions, SqliteStore, APPLICATION_ID, SCHEMA_VERSION};
pub use store::{Pruned, Result, Status, Store, Swept, MAX_REPORTED_CORRUPT};
pub use sweeper::spawn_sweeper;
