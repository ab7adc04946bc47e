//! A row holding a value the store never writes (the file altered by hand,
//! by another program, or damaged where SQLite cannot see it) reads as
//! `Corrupt`, naming the promise and the column, from every read: never a
//! panic, a silent default or a misleading answer.

use askpool_promises::{
    CallbackRequest, CompleteRequest, Completion, CreateRequest, PromiseError, SearchQuery,
    SqliteStore, Store, Target,
};
use rusqlite::Connection;

const T: u64 = 1_000_000;

/// A store file with a pending promise "pending", a resolved one
/// "resolved" and a timed-out one "timedout", each tagged and well formed.
fn store_file(dir: &tempfile::TempDir) -> std::path::PathBuf {
    let path = dir.path().join("p.db");
    let s = SqliteStore::open(&path).unwrap();
    for id in ["pending", "resolved", "timedout"] {
        let timeout = if id == "timedout" { T + 1 } else { T + 1000 };
        s.create(
            &CreateRequest::new(id, timeout)
                .param("x")
                .tag("k", "v")
                .strict(true),
            T,
        )
        .unwrap();
    }
    s.complete(
        &CompleteRequest::new("resolved", Completion::Resolve).value("v"),
        T,
    )
    .unwrap();
    s.sweep(T + 1, 10).unwrap();
    path
}

/// (promise, SET clause, column the error must name)
const ODD_VALUES: &[(&str, &str, &str)] = &[
    ("pending", "state = 9", "state"),
    ("pending", "state = -1", "state"),
    ("pending", "state = 'resolved'", "state"),
    ("pending", "state = 1.5", "state"),
    ("pending", "timeout_at = -5", "timeout_at"),
    ("pending", "timeout_at = 'soon'", "timeout_at"),
    ("pending", "timeout_at = 1e300", "timeout_at"),
    ("pending", "created_at = -1", "created_at"),
    ("pending", "resume_epoch = -3", "resume_epoch"),
    ("pending", "strict = 2", "strict"),
    ("pending", "strict = 'yes'", "strict"),
    ("pending", "param = 'text, not bytes'", "param"),
    ("pending", "create_key = x'6b'", "create_key"),
    ("pending", "tags = 'not json'", "tags"),
    ("pending", "tags = '[1, 2]'", "tags"),
    ("pending", "tags = '{\"k\": 1}'", "tags"),
    ("pending", "tags = x'7b7d'", "tags"),
    // Settled without a settled time, pending with one.
    ("resolved", "settled_at = NULL", "settled_at"),
    ("timedout", "settled_at = NULL", "settled_at"),
    ("pending", "settled_at = 5", "settled_at"),
    ("resolved", "settled_at = -1", "settled_at"),
    // What only a settlement writes, on a pending promise.
    ("pending", "value = x'01'", "value"),
    ("pending", "complete_key = 'k'", "complete_key"),
    ("resolved", "value = 7", "value"),
];

#[test]
fn a_value_the_store_never_writes_reads_as_corrupt_naming_promise_and_column() {
    let mut wrong = Vec::new();
    for &(id, set, column) in ODD_VALUES {
        let dir = tempfile::tempdir().unwrap();
        let path = store_file(&dir);
        let changed = Connection::open(&path)
            .unwrap()
            .execute(&format!("UPDATE promises SET {set} WHERE id = ?1"), [id])
            .unwrap();
        assert_eq!(changed, 1, "{set}");
        let s = SqliteStore::open(&path).unwrap();
        let reads: [(&str, Result<(), PromiseError>); 3] = [
            ("get", s.get(id, T).map(drop)),
            (
                "search",
                s.search(&SearchQuery::new("*").limit(10), T).map(drop),
            ),
            ("snapshot", s.snapshot().map(drop)),
        ];
        for (read, outcome) in reads {
            match outcome {
                Err(PromiseError::Corrupt { message, .. })
                    if message.contains(&format!("{id:?}")) && message.contains(column) => {}
                other => wrong.push(format!("{set} on {id:?}, {read}: {other:?}")),
            }
        }
    }
    assert!(
        wrong.is_empty(),
        "not Corrupt naming promise and column:\n{}",
        wrong.join("\n")
    );
}

/// A promise id that is not text (a blob: SQLite stores a number given to
/// a text column as text) cannot be named by its id: the error says what
/// the column holds instead.
#[test]
fn an_id_that_is_not_text_reads_as_corrupt() {
    let dir = tempfile::tempdir().unwrap();
    let path = store_file(&dir);
    Connection::open(&path)
        .unwrap()
        .execute("UPDATE promises SET id = x'ff00' WHERE id = 'pending'", [])
        .unwrap();
    let s = SqliteStore::open(&path).unwrap();
    for outcome in [
        s.search(&SearchQuery::new("*").limit(10), T).map(drop),
        s.snapshot().map(drop),
    ] {
        match outcome {
            Err(PromiseError::Corrupt { message, .. })
                if message.contains("column id holds a 2-byte blob") => {}
            other => panic!("{other:?}"),
        }
    }
}

/// The bounds of what the store writes read back as written: the latest
/// time it keeps, an empty tag map, a pending promise without a key.
#[test]
fn the_bounds_of_well_formed_rows_still_read() {
    let dir = tempfile::tempdir().unwrap();
    let path = store_file(&dir);
    let s = SqliteStore::open(&path).unwrap();
    let never = s.create(&CreateRequest::new("never", u64::MAX), T).unwrap();
    assert_eq!(s.get("never", T).unwrap(), never.promise);
    assert!(never.promise.tags.is_empty());
    let all = s.snapshot().unwrap();
    assert_eq!(all.promises.len(), 4);
    assert!(askpool_promises::violations(&all).is_empty());
}

/// Tasks and callbacks are read by the same decoder: an odd value in one
/// names its row and column too.
#[test]
fn odd_task_and_callback_values_read_as_corrupt() {
    let cases = [
        ("tasks", "state = 7", "task 1: column state holds integer 7"),
        (
            "tasks",
            "kind = 'x'",
            "task 1: column kind holds text \"x\"",
        ),
        (
            "tasks",
            "epoch = -1",
            "task 1: column epoch holds integer -1",
        ),
        (
            "tasks",
            "claims = 5000000000",
            "task 1: column claims holds integer 5000000000",
        ),
        (
            "tasks",
            "lease_expires_at = -2",
            "task 1: column lease_expires_at holds integer -2",
        ),
        (
            "callbacks",
            "created_at = -9",
            "callback 1: column created_at holds integer -9",
        ),
    ];
    for (table, set, expected) in cases {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("p.db");
        {
            let s = SqliteStore::open(&path).unwrap();
            for id in ["a", "b"] {
                let req = CreateRequest::new(id, T + 1000).target(Target::pool("workers"));
                s.create(&req, T).unwrap();
            }
            let awaits = CallbackRequest {
                awaited: "a".into(),
                awaiter: "b".into(),
                pool: "workers".into(),
                preferred_worker: None,
            };
            s.register_callback(&awaits, T).unwrap();
        }
        Connection::open(&path)
            .unwrap()
            .execute(&format!("UPDATE {table} SET {set} WHERE id = 1"), [])
            .unwrap();
        match SqliteStore::open(&path).unwrap().snapshot() {
            Err(PromiseError::Corrupt { message, .. }) if message.contains(expected) => {}
            other => panic!("{set} in {table}: {other:?}"),
        }
    }
}
