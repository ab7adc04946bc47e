//! Deterministic fault simulation of the askpool protocol.
//!
//! A [`FaultNet`] sits between caller nodes and pool nodes and, driven by a
//! seeded RNG, drops, duplicates, reorders, delays, clogs and partitions
//! frames, loses replies after their request ran, and restarts pools (their
//! dedup state lost). A workload issues asks with ids drawn from small pools
//! so they collide; the [`checker`] then holds the history against the
//! protocol's invariants. On a paused tokio clock a seed replays exactly.
//!
//! Crash model (what a restart may repeat): see [`checker`].

pub mod checker;
pub mod config;
pub mod history;
pub mod model;
pub mod net;
pub mod report;
pub mod sweep;
pub mod workload;

pub use checker::Violation;
pub use config::{FaultConfig, Sabotage, SimConfig};
pub use net::{FaultNet, Link, NetStats};
pub use report::{unfired_faults, RunReport, Summary};
pub use sweep::{check_seed, SeedResult};
pub use workload::{run, run_blocking, Live};
