//! Opening a database file: telling an askpool store from a foreign or
//! newer one, and the versioned migrations (`PRAGMA user_version`).

use std::path::Path;
use std::time::{Duration, Instant};

use rusqlite::{Connection, ErrorCode, TransactionBehavior};

use super::map_err;
use crate::error::PromiseError;
use crate::store::Result;

/// `PRAGMA application_id` of an askpool promise store ("ASKP").
pub const APPLICATION_ID: i64 = 0x4153_4B50;

/// Migration `i` takes the schema from version `i` to `i + 1`.
const MIGRATIONS: &[&str] = &[
    // 1: promises, tasks, callbacks.
    "CREATE TABLE promises (
        id TEXT PRIMARY KEY NOT NULL,
        state INTEGER NOT NULL,
        param BLOB NOT NULL,
        value BLOB,
        timeout_at INTEGER NOT NULL,
        create_key TEXT,
        complete_key TEXT,
        strict INTEGER NOT NULL,
        tags TEXT NOT NULL,
        created_at INTEGER NOT NULL,
        settled_at INTEGER,
        resume_epoch INTEGER NOT NULL
    );
    CREATE INDEX promises_pending_timeout ON promises(timeout_at, id) WHERE state = 0;
    CREATE TABLE tasks (
        id INTEGER PRIMARY KEY AUTOINCREMENT,
        kind INTEGER NOT NULL,
        promise_id TEXT NOT NULL,
        awaiter TEXT,
        epoch INTEGER NOT NULL,
        pool TEXT NOT NULL,
        preferred_worker TEXT,
        state INTEGER NOT NULL,
        claims INTEGER NOT NULL,
        lease_owner TEXT,
        lease_expires_at INTEGER,
        created_at INTEGER NOT NULL
    );
    CREATE INDEX tasks_pool ON tasks(pool, id);
    CREATE INDEX tasks_promise ON tasks(promise_id) WHERE kind = 0;
    CREATE INDEX tasks_awaiter ON tasks(awaiter, epoch) WHERE kind = 1;
    CREATE TABLE callbacks (
        id INTEGER PRIMARY KEY AUTOINCREMENT,
        awaited TEXT NOT NULL,
        awaiter TEXT NOT NULL,
        epoch INTEGER NOT NULL,
        pool TEXT NOT NULL,
        preferred_worker TEXT,
        created_at INTEGER NOT NULL
    );
    CREATE INDEX callbacks_awaited ON callbacks(awaited, id);
    CREATE INDEX callbacks_awaiter ON callbacks(awaiter);",
    // 2: a task may be in state 2 (Waiting, a resume task of an awaiter's
    // next suspension): no table changes, but a build that does not know
    // the state must refuse the file as newer rather than misread it.
    "-- tasks.state 2: Waiting",
];

/// The schema version this build writes.
pub const SCHEMA_VERSION: i64 = MIGRATIONS.len() as i64;

/// How many tables every schema version from 1 on has (`identity` counts
/// them by name).
const TABLES: usize = 3;

/// What a file says it is: its application id, schema version, number of
/// schema objects and how many of [`TABLES`] it has, read in one
/// transaction (one snapshot: read one by one, they could straddle another
/// process's migration of a new file).
fn identity(conn: &Connection, path: &Path) -> Result<(i64, i64, i64, usize)> {
    let err = |e| map_err(path, e);
    let read = |conn: &Connection| -> rusqlite::Result<(i64, i64, i64, usize)> {
        let tables = conn.query_row(
            "SELECT count(*) FROM sqlite_master WHERE type = 'table' \
             AND name IN ('promises', 'tasks', 'callbacks')",
            [],
            |r| r.get::<_, i64>(0),
        )? as usize;
        Ok((
            conn.pragma_query_value(None, "application_id", |r| r.get(0))?,
            conn.pragma_query_value(None, "user_version", |r| r.get(0))?,
            conn.query_row("SELECT count(*) FROM sqlite_master", [], |r| r.get(0))?,
            tables,
        ))
    };
    if !conn.is_autocommit() {
        // Inside the caller's (write) transaction: already one snapshot.
        return read(conn).map_err(err);
    }
    conn.execute_batch("BEGIN DEFERRED").map_err(err)?;
    let found = read(conn);
    let end = conn.execute_batch("COMMIT");
    let found = found.map_err(err)?;
    end.map_err(err)?;
    Ok(found)
}

/// Refuses a file that is not ours, is of a newer schema, or is ours but
/// not what its version says (a negative version, or tables missing);
/// returns its schema version.
fn check(conn: &Connection, path: &Path) -> Result<i64> {
    let (app_id, version, objects, tables) = identity(conn, path)?;
    if app_id != APPLICATION_ID && (app_id != 0 || objects > 0 || version != 0) {
        return Err(PromiseError::Foreign {
            path: path.to_owned(),
            message: format!(
                "application_id {app_id:#x}, user_version {version}, {objects} schema objects"
            ),
        });
    }
    if version > SCHEMA_VERSION {
        return Err(PromiseError::NewerVersion {
            path: path.to_owned(),
            found: version,
            supported: SCHEMA_VERSION,
        });
    }
    // (A negative version would skip every migration: no tables, and every
    // call on the store failing with "no such table".)
    if version < 0 || (version >= 1 && tables != TABLES) {
        return Err(PromiseError::Corrupt {
            path: path.to_owned(),
            message: format!("schema version {version} with {tables} of its {TABLES} tables"),
        });
    }
    Ok(version)
}

/// Sets the WAL journal mode; returns the mode the file is in. SQLite
/// answers "busy" at once, without its busy handler, when another
/// connection holds a lock (processes opening a new file together): this
/// retries for up to `busy_timeout`, as a write would wait.
fn switch_to_wal(conn: &Connection, path: &Path, busy_timeout: Duration) -> Result<String> {
    let started = Instant::now();
    let mut pause = Duration::from_millis(1);
    loop {
        match conn.pragma_update_and_check(None, "journal_mode", "WAL", |r| r.get(0)) {
            Ok(mode) => return Ok(mode),
            Err(rusqlite::Error::SqliteFailure(f, _))
                if f.code == ErrorCode::DatabaseBusy && started.elapsed() < busy_timeout =>
            {
                std::thread::sleep(pause);
                pause = (pause * 2).min(Duration::from_millis(50));
            }
            Err(e) => return Err(map_err(path, e)),
        }
    }
}

/// Checks that the file is a store of this build's schema, changing
/// nothing: for tools that inspect a store some service owns (an empty file
/// made a store, or an older one migrated, would be a side effect; the
/// latter locks out older services, which refuse a newer schema).
pub(super) fn check_current(conn: &Connection, path: &Path) -> Result<()> {
    let version = check(conn, path)?;
    if version == 0 {
        return Err(PromiseError::invalid(format!(
            "{} is not an askpool promise store (no schema)",
            path.display()
        )));
    }
    if version < SCHEMA_VERSION {
        return Err(PromiseError::invalid(format!(
            "{} is a store of an older schema (version {version}; this build writes \
             {SCHEMA_VERSION}): open it from the services that use it to migrate it first",
            path.display()
        )));
    }
    Ok(())
}

/// Checks what the file is, then brings its schema up to date.
pub(super) fn prepare(conn: &mut Connection, path: &Path, busy_timeout: Duration) -> Result<()> {
    let err = |e| map_err(path, e);
    let version = check(conn, path)?;
    let mode = switch_to_wal(conn, path, busy_timeout)?;
    if !mode.eq_ignore_ascii_case("wal") {
        return Err(PromiseError::Storage {
            message: format!("cannot switch {path:?} to WAL (journal mode {mode})"),
        });
    }
    // WAL + NORMAL: a commit survives a process crash; the last commits
    // before a power loss may be lost, never half of one.
    conn.pragma_update(None, "synchronous", "NORMAL")
        .map_err(err)?;
    if version == SCHEMA_VERSION {
        return Ok(());
    }
    let tx = conn
        .transaction_with_behavior(TransactionBehavior::Immediate)
        .map_err(err)?;
    // Another process may have migrated (or made the file something else)
    // while we waited for the lock.
    let version = check(&tx, path)?;
    for (i, sql) in MIGRATIONS.iter().enumerate().skip(version as usize) {
        tx.execute_batch(sql).map_err(err)?;
        tx.pragma_update(None, "user_version", i as i64 + 1)
            .map_err(err)?;
    }
    tx.pragma_update(None, "application_id", APPLICATION_ID)
        .map_err(err)?;
    tx.commit().map_err(err)
}
