//! What a database file can be: new, reopened, corrupt, someone else's,
//! from a newer build, or locked by another writer. Each gets a typed error
//! and nothing is changed in a file that is not ours.

use std::time::Duration;

use askpool_promises::{
    CreateRequest, PromiseError, SearchQuery, SqliteOptions, SqliteStore, State, Store,
    APPLICATION_ID, SCHEMA_VERSION,
};
use rusqlite::Connection;

const T: u64 = 1_000_000;

fn pragma(path: &std::path::Path, name: &str) -> i64 {
    Connection::open(path)
        .unwrap()
        .pragma_query_value(None, name, |r| r.get(0))
        .unwrap()
}

#[test]
fn a_new_file_is_migrated_and_reopens_with_its_data() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("p.db");
    {
        let s = SqliteStore::open(&path).unwrap();
        s.create(&CreateRequest::new("kept", T + 100).param("x"), T)
            .unwrap();
    }
    assert_eq!(pragma(&path, "user_version"), SCHEMA_VERSION);
    assert_eq!(pragma(&path, "application_id"), APPLICATION_ID);
    let journal: String = Connection::open(&path)
        .unwrap()
        .pragma_query_value(None, "journal_mode", |r| r.get(0))
        .unwrap();
    assert_eq!(journal, "wal");
    let s = SqliteStore::open(&path).unwrap();
    assert_eq!(s.get("kept", T).unwrap().param, b"x");
}

#[test]
fn no_file_path_is_an_invalid_argument() {
    // SQLite would open these as stores that vanish with the connection.
    for path in ["", ":memory:"] {
        assert!(
            matches!(
                SqliteStore::open(path),
                Err(PromiseError::InvalidArgument { .. })
            ),
            "{path:?}"
        );
    }
    assert!(!std::path::Path::new(":memory:").exists());
    // A directory, or a file in a folder that does not exist: a bad path,
    // not a storage failure.
    let dir = tempfile::tempdir().unwrap();
    for path in [dir.path().to_owned(), dir.path().join("missing/p.db")] {
        match SqliteStore::open(&path) {
            Err(PromiseError::InvalidArgument { message }) => {
                assert!(message.contains(&*path.to_string_lossy()), "{message}")
            }
            other => panic!("{path:?}: {:?}", other.err()),
        }
    }
}

#[test]
fn a_file_that_is_not_a_database_is_corrupt() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("junk.db");
    std::fs::write(&path, "this is not a database\n".repeat(400)).unwrap();
    let before = std::fs::read(&path).unwrap();
    assert!(matches!(
        SqliteStore::open(&path),
        Err(PromiseError::Corrupt { .. })
    ));
    assert_eq!(std::fs::read(&path).unwrap(), before, "left untouched");
}

#[test]
fn damaged_pages_read_as_corrupt() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("p.db");
    {
        let s = SqliteStore::open(&path).unwrap();
        for i in 0..300 {
            s.create(
                &CreateRequest::new(format!("p{i:04}"), T + 100).param(vec![7; 500]),
                T,
            )
            .unwrap();
        }
    }
    let mut bytes = std::fs::read(&path).unwrap();
    assert!(bytes.len() > 16 * 4096, "{} bytes", bytes.len());
    for b in &mut bytes[4096..12 * 4096] {
        *b = 0xA5;
    }
    std::fs::write(&path, bytes).unwrap();
    let outcome =
        SqliteStore::open(&path).and_then(|s| s.search(&SearchQuery::new("*").limit(1000), T));
    assert!(
        matches!(outcome, Err(PromiseError::Corrupt { .. })),
        "{outcome:?}"
    );
}

#[test]
fn another_programs_database_is_foreign() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("theirs.db");
    Connection::open(&path)
        .unwrap()
        .execute_batch(
            "CREATE TABLE invoices (id INTEGER PRIMARY KEY); INSERT INTO invoices VALUES (1);",
        )
        .unwrap();
    assert!(matches!(
        SqliteStore::open(&path),
        Err(PromiseError::Foreign { .. })
    ));
    assert_eq!(pragma(&path, "user_version"), 0, "not migrated");
    let journal: String = Connection::open(&path)
        .unwrap()
        .pragma_query_value(None, "journal_mode", |r| r.get(0))
        .unwrap();
    assert_eq!(journal, "delete", "journal mode left alone");
}

/// Ours by its application id, but not what its version says: a negative
/// version (which skipped every migration and opened a store with no
/// tables), or a version whose tables are missing. Corrupt at open, not a
/// "no such table" storage error at every later call.
#[test]
fn our_file_without_its_schema_is_corrupt() {
    for version in [-1, SCHEMA_VERSION, 1] {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("p.db");
        {
            let c = Connection::open(&path).unwrap();
            c.pragma_update(None, "application_id", APPLICATION_ID)
                .unwrap();
            c.pragma_update(None, "user_version", version).unwrap();
        }
        match SqliteStore::open(&path) {
            Err(PromiseError::Corrupt { message, .. }) => {
                assert!(message.contains(&format!("version {version}")), "{message}")
            }
            other => panic!(
                "version {version}: expected Corrupt, got {:?}",
                other.map(|_| ())
            ),
        }
        // Nothing changed in it.
        assert_eq!(pragma(&path, "user_version"), version);
    }
    // A store with one of its tables dropped.
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("p.db");
    drop(SqliteStore::open(&path).unwrap());
    Connection::open(&path)
        .unwrap()
        .execute_batch("DROP TABLE callbacks")
        .unwrap();
    assert!(matches!(
        SqliteStore::open(&path),
        Err(PromiseError::Corrupt { .. })
    ));
}

#[test]
fn a_newer_schema_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("p.db");
    drop(SqliteStore::open(&path).unwrap());
    Connection::open(&path)
        .unwrap()
        .pragma_update(None, "user_version", SCHEMA_VERSION + 1)
        .unwrap();
    match SqliteStore::open(&path) {
        Err(PromiseError::NewerVersion {
            found, supported, ..
        }) => {
            assert_eq!((found, supported), (SCHEMA_VERSION + 1, SCHEMA_VERSION));
        }
        other => panic!("expected NewerVersion, got {:?}", other.map(|_| ())),
    }
}

#[test]
fn a_write_locked_by_another_connection_is_locked_then_succeeds() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("p.db");
    let s = SqliteStore::open_with(
        &path,
        SqliteOptions {
            busy_timeout: Duration::from_millis(50),
        },
    )
    .unwrap();
    s.create(&CreateRequest::new("a", T + 100), T).unwrap();
    let other = Connection::open(&path).unwrap();
    other.execute_batch("BEGIN IMMEDIATE").unwrap();
    assert!(matches!(
        s.create(&CreateRequest::new("b", T + 100), T),
        Err(PromiseError::Locked { .. })
    ));
    // Reads of the snapshot still work under WAL.
    assert_eq!(s.snapshot().unwrap().promises.len(), 1);
    other.execute_batch("COMMIT").unwrap();
    s.create(&CreateRequest::new("b", T + 100), T).unwrap();
    assert_eq!(s.get("b", T).unwrap().state, State::Pending);
}

#[test]
fn two_stores_on_one_file_see_each_others_writes() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("p.db");
    let a = SqliteStore::open(&path).unwrap();
    let b = SqliteStore::open(&path).unwrap();
    a.create(&CreateRequest::new("x", T + 100).key("k"), T)
        .unwrap();
    assert!(
        b.create(&CreateRequest::new("x", T + 100).key("k"), T)
            .unwrap()
            .deduplicated
    );
    assert_eq!(a.snapshot().unwrap(), b.snapshot().unwrap());
}

/// Processes starting together on a new file: each open either migrates it
/// or finds it migrated, never a half-made file taken for someone else's.
#[test]
fn stores_opened_at_once_on_a_new_file_all_succeed() {
    for round in 0..60 {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("p.db");
        let barrier = std::sync::Arc::new(std::sync::Barrier::new(6));
        let opens: Vec<_> = (0..6)
            .map(|_| {
                let (path, barrier) = (path.clone(), barrier.clone());
                std::thread::spawn(move || {
                    barrier.wait();
                    SqliteStore::open(&path).map(|_| ())
                })
            })
            .collect();
        for open in opens {
            if let Err(e) = open.join().unwrap() {
                panic!("round {round}: an open failed: {e:?}");
            }
        }
        assert_eq!(pragma(&path, "user_version"), SCHEMA_VERSION);
    }
}

/// For inspection (the `askpool promises` command): only a store that is
/// already this build's is opened. An empty file is not made a store, and
/// an older one is not migrated (that would lock out the older services
/// still using it, which refuse a newer schema); both are left unchanged.
#[test]
fn open_existing_opens_only_a_current_store_and_changes_no_other_file() {
    let dir = tempfile::tempdir().unwrap();
    let missing = dir.path().join("missing.db");
    assert!(matches!(
        SqliteStore::open_existing(&missing),
        Err(PromiseError::InvalidArgument { .. })
    ));
    assert!(!missing.exists());

    let empty = dir.path().join("empty.db");
    std::fs::write(&empty, b"").unwrap();
    assert!(matches!(
        SqliteStore::open_existing(&empty),
        Err(PromiseError::InvalidArgument { .. })
    ));
    assert_eq!(std::fs::metadata(&empty).unwrap().len(), 0);

    let old = dir.path().join("old.db");
    {
        let s = SqliteStore::open(&old).unwrap();
        s.create(&CreateRequest::new("kept", T + 100), T).unwrap();
    }
    Connection::open(&old)
        .unwrap()
        .pragma_update(None, "user_version", SCHEMA_VERSION - 1)
        .unwrap();
    match SqliteStore::open_existing(&old) {
        Err(PromiseError::InvalidArgument { message }) => {
            assert!(message.contains("older"), "{message}")
        }
        other => panic!("{:?}", other.map(|_| ())),
    }
    assert_eq!(pragma(&old, "user_version"), SCHEMA_VERSION - 1);

    let current = dir.path().join("current.db");
    SqliteStore::open(&current)
        .unwrap()
        .create(&CreateRequest::new("kept", T + 100), T)
        .unwrap();
    let s = SqliteStore::open_existing(&current).unwrap();
    assert_eq!(s.get("kept", T).unwrap().state, State::Pending);
}
