#![allow(dead_code)]

use askpool_promises::{MemoryStore, SqliteStore, Store};

/// Runs `f` against a fresh in-memory store and a fresh SQLite store.
pub fn each_store(f: impl Fn(&dyn Store)) {
    f(&MemoryStore::new());
    let dir = tempfile::tempdir().unwrap();
    let sqlite = SqliteStore::open(dir.path().join("p.db")).unwrap();
    f(&sqlite);
    let violations = askpool_promises::violations(&sqlite.snapshot().unwrap());
    assert!(violations.is_empty(), "{violations:?}");
}
