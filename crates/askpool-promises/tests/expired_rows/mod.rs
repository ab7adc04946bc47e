//! Stores with corrupt rows in them (the file altered by hand, by another
//! program), for the tests of sweeps and prunes that meet them.

// Each test binary uses some of these.
#![allow(dead_code)]

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use askpool_promises::{CreateRequest, SqliteStore, Store};
use rusqlite::Connection;

pub const T: u64 = 1_000_000;
/// State codes as the file stores them.
pub const PENDING: i64 = 0;
pub const TIMED_OUT: i64 = 4;

/// What a corrupt row holds, by its number: values the store never writes,
/// in the promise's columns and in its id (a blob; text that is not UTF-8).
pub const ODD: &[&str] = &[
    "tags = 'not json'",
    "id = CAST(id AS BLOB)",
    "param = 'text, not bytes'",
    "id = CAST(CAST(id AS BLOB) || x'ff' AS TEXT)",
    "strict = 2",
    "resume_epoch = -3",
];

pub fn corrupt(path: &Path, id: &str, set: &str) {
    let changed = Connection::open(path)
        .unwrap()
        .execute(&format!("UPDATE promises SET {set} WHERE id = ?1"), [id])
        .unwrap();
    assert_eq!(changed, 1, "{set} on {id}");
}

/// Every promise's state as stored, by id (an id that is not text read as
/// its bytes), without the store: only a sweep can have changed them.
pub fn raw_states(path: &Path) -> BTreeMap<String, i64> {
    let conn = Connection::open(path).unwrap();
    let mut stmt = conn
        .prepare("SELECT CAST(id AS BLOB), state FROM promises")
        .unwrap();
    let rows = stmt
        .query_map([], |r| {
            let id: Vec<u8> = r.get(0)?;
            Ok((String::from_utf8_lossy(&id).into_owned(), r.get(1)?))
        })
        .unwrap();
    rows.collect::<rusqlite::Result<_>>().unwrap()
}

/// A store of `good` well-formed pending promises `good-i` and `bad`
/// corrupt ones `bad-i`, all past their timeouts at `T + 200`, the corrupt
/// ones first (oldest deadline), and three pending ones not yet due.
pub fn expired_store(dir: &tempfile::TempDir, good: usize, bad: usize) -> PathBuf {
    let path = dir.path().join("p.db");
    {
        let s = SqliteStore::open(&path).unwrap();
        for i in 0..bad {
            s.create(&CreateRequest::new(format!("bad-{i}"), T + 10), T)
                .unwrap();
        }
        for i in 0..good {
            s.create(&CreateRequest::new(format!("good-{i}"), T + 100), T)
                .unwrap();
        }
        for i in 0..3 {
            s.create(&CreateRequest::new(format!("later-{i}"), T + 1_000), T)
                .unwrap();
        }
    }
    for i in 0..bad {
        corrupt(&path, &format!("bad-{i}"), ODD[i % ODD.len()]);
    }
    path
}
