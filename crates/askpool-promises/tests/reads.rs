//! A read takes SQLite's write lock only to time a promise out: a `get` or
//! a `search` reads past another connection's write (it waited behind it,
//! and failed `Locked` past the busy timeout).

use std::time::Duration;

use askpool_promises::{
    CompleteRequest, Completion, CreateRequest, PromiseError, SearchQuery, SqliteOptions,
    SqliteStore, State, Store,
};
use rusqlite::Connection;

const T: u64 = 1_000_000;

fn store(path: &std::path::Path) -> SqliteStore {
    SqliteStore::open_with(
        path,
        SqliteOptions {
            busy_timeout: Duration::from_millis(50),
        },
    )
    .unwrap()
}

#[test]
fn reads_wait_for_no_writer_until_a_timeout_is_due() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("p.db");
    let s = store(&path);
    s.create(&CreateRequest::new("open", T + 100), T).unwrap();
    s.create(&CreateRequest::new("done", T + 100), T).unwrap();
    s.complete(&CompleteRequest::new("done", Completion::Resolve), T)
        .unwrap();

    let writer = Connection::open(&path).unwrap();
    writer.execute_batch("BEGIN IMMEDIATE").unwrap();
    assert_eq!(s.get("open", T + 99).unwrap().state, State::Pending);
    assert_eq!(s.get("done", T + 500).unwrap().state, State::Resolved);
    assert!(matches!(
        s.get("missing", T),
        Err(PromiseError::NotFound { .. })
    ));
    let all = s.search(&SearchQuery::new("*"), T + 99).unwrap();
    assert_eq!(all.len(), 2);
    // Due now: timing it out is a write, which waits for the writer.
    assert!(matches!(
        s.get("open", T + 100),
        Err(PromiseError::Locked { .. })
    ));
    assert!(matches!(
        s.search(&SearchQuery::new("op*"), T + 100),
        Err(PromiseError::Locked { .. })
    ));
    writer.execute_batch("COMMIT").unwrap();

    assert_eq!(s.get("open", T + 100).unwrap().state, State::TimedOut);
    let stored = s.snapshot().unwrap();
    assert_eq!(stored.promises[1].id, "open");
    assert_eq!(
        stored.promises[1].state,
        State::TimedOut,
        "the timeout was written"
    );
}

/// A search whose page holds no due promise still times out the due ones
/// its pattern matches, as before (one write for them all).
#[test]
fn a_search_times_out_every_due_match_not_only_its_page() {
    let dir = tempfile::tempdir().unwrap();
    let s = store(&dir.path().join("p.db"));
    s.create(&CreateRequest::new("a", T + 500), T).unwrap();
    s.create(&CreateRequest::new("b", T + 100), T).unwrap();
    let page = s.search(&SearchQuery::new("*").limit(1), T + 100).unwrap();
    assert_eq!((page[0].id.as_str(), page[0].state), ("a", State::Pending));
    assert_eq!(s.snapshot().unwrap().promises[1].state, State::TimedOut);
}
