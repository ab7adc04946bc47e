//! The SQLite store: one file, WAL, one `BEGIN IMMEDIATE` transaction per
//! operation (a read's is `BEGIN DEFERRED`, unless it times a promise out).
//! Several processes may open the same file; SQLite's lock serialises their
//! writes (a writer waits up to `busy_timeout`, then gets
//! [`PromiseError::Locked`]); readers do not wait for it.

mod schema;
mod tx;

use std::path::{Path, PathBuf};
use std::time::Duration;

use parking_lot::Mutex;
use rusqlite::{ffi, Connection, ErrorCode, OpenFlags, TransactionBehavior, MAIN_DB};

pub use schema::{APPLICATION_ID, SCHEMA_VERSION};

use crate::error::PromiseError;
use crate::model::{
    CallbackOutcome, CallbackRequest, ClaimRequest, Claimed, CompleteRequest, Completed,
    CreateRequest, Created, Lease, Millis, Promise, SearchQuery, Snapshot, Task,
};
use crate::ops;
use crate::store::Result;
use tx::SqlTx;

#[derive(Clone, Debug)]
pub struct SqliteOptions {
    /// How long a write waits for another connection's lock before
    /// [`PromiseError::Locked`].
    pub busy_timeout: Duration,
}

impl Default for SqliteOptions {
    fn default() -> Self {
        Self {
            busy_timeout: Duration::from_secs(5),
        }
    }
}

/// A test hook that interrupts an operation between two of its writes.
pub enum CrashHook {
    /// The operation fails with [`PromiseError::Crashed`] at its `n`th
    /// crash point (0 = the first); its transaction is dropped unfinished.
    FailAt(usize),
    /// Calls the function at the `n`th crash point, inside the open
    /// transaction (a child process signals its parent and waits there to
    /// be killed).
    CallAt(usize, Box<dyn FnMut() + Send>),
}

pub(crate) struct Hook {
    hook: Option<CrashHook>,
    passed: usize,
}

impl Hook {
    pub(crate) fn point(&mut self) -> Result<()> {
        let n = self.passed;
        self.passed += 1;
        match &mut self.hook {
            Some(CrashHook::FailAt(at)) if *at == n => {
                self.hook = None;
                Err(PromiseError::Crashed)
            }
            Some(CrashHook::CallAt(at, f)) if *at == n => {
                f();
                Ok(())
            }
            _ => Ok(()),
        }
    }
}

struct Inner {
    conn: Connection,
    hook: Hook,
}

pub struct SqliteStore {
    path: PathBuf,
    inner: Mutex<Inner>,
}

/// `path` as SQLite must be given it to open that very file. The bundled
/// SQLite reads a name starting with `file:` as a URI whatever the open
/// flags say (it is built with `SQLITE_USE_URI`): `file:u.db` would open
/// `u.db`. A relative path is made to start with `./`, which no URI does.
fn literal(path: &Path) -> PathBuf {
    if path.is_relative() && path.as_os_str().as_encoded_bytes().starts_with(b"file:") {
        Path::new(".").join(path)
    } else {
        path.to_owned()
    }
}

/// A directory named as a store is a bad path, not a storage failure.
fn refuse_directory(path: &Path) -> Result<()> {
    if path.is_dir() {
        return Err(PromiseError::invalid(format!(
            "a SQLite store needs a file path, and {} is a directory",
            path.display()
        )));
    }
    Ok(())
}

/// Refuses, as a bad path, a store this process may not write: SQLite
/// opens such a file read-only without a word, and the first write fails.
/// A store must be writable: even a read may time a promise out.
fn refuse_read_only(conn: &Connection, path: &Path) -> Result<()> {
    if conn.is_readonly(MAIN_DB).map_err(|e| map_err(path, e))? {
        return Err(PromiseError::invalid(format!(
            "the SQLite store {} is read-only to this process (it may not write the file); \
             a store must be writable, as even a read may time a promise out",
            path.display()
        )));
    }
    Ok(())
}

/// The refusal, as a bad path, of a store in a folder this process may not
/// write (`cause`: what SQLite said).
fn unwritable_folder(path: &Path, cause: &rusqlite::Error) -> PromiseError {
    let folder = path
        .parent()
        .filter(|p| !p.as_os_str().is_empty())
        .unwrap_or(Path::new("."));
    PromiseError::invalid(format!(
        "the SQLite store {} cannot be used: this process may not create files in its \
         folder {}, where a store (in WAL mode) keeps its -wal and -shm files ({cause})",
        path.display(),
        folder.display()
    ))
}

impl SqliteStore {
    /// Opens (creating if needed) the store in the file at `path`. A path
    /// this process cannot use as a store (a directory, a folder that does
    /// not exist, a file or folder it may not write) is refused as
    /// `InvalidArgument`, naming what and why.
    pub fn open(path: impl AsRef<Path>) -> Result<Self> {
        Self::open_with(path, SqliteOptions::default())
    }

    pub fn open_with(path: impl AsRef<Path>, options: SqliteOptions) -> Result<Self> {
        let path = path.as_ref().to_owned();
        // SQLite would take "" (and ":memory:") as a store that vanishes
        // with its connection: not the durable file the caller asked for.
        if path.as_os_str().is_empty() || path.as_os_str() == ":memory:" {
            return Err(PromiseError::invalid(format!(
                "a SQLite store needs a file path, not {:?}",
                path.as_os_str()
            )));
        }
        // SQLite reports both as "unable to open database file", which
        // would reach the caller as a storage failure: they are a bad path.
        refuse_directory(&path)?;
        if let Some(parent) = path.parent().filter(|p| !p.as_os_str().is_empty()) {
            if !parent.is_dir() {
                return Err(PromiseError::invalid(format!(
                    "the folder of the SQLite store {} does not exist",
                    path.display()
                )));
            }
        }
        let mut conn = Connection::open(literal(&path)).map_err(|e| match &e {
            // A new file its folder does not let it create.
            rusqlite::Error::SqliteFailure(f, _)
                if f.code == ErrorCode::CannotOpen && !path.exists() =>
            {
                unwritable_folder(&path, &e)
            }
            _ => map_err(&path, e),
        })?;
        refuse_read_only(&conn, &path)?;
        conn.busy_timeout(options.busy_timeout)
            .map_err(|e| map_err(&path, e))?;
        schema::prepare(&mut conn, &path, options.busy_timeout)?;
        Ok(Self::with_connection(path, conn))
    }

    /// Opens the store in an existing file for inspection: refused
    /// (`InvalidArgument`) unless the file is already a store of this
    /// build's schema (and writable, as `open` refuses); nothing in a file
    /// it refuses is changed. Reads still apply timeouts (the protocol's
    /// lazy rule) and writes still write.
    pub fn open_existing(path: impl AsRef<Path>) -> Result<Self> {
        Self::open_existing_with(path, SqliteOptions::default())
    }

    pub fn open_existing_with(path: impl AsRef<Path>, options: SqliteOptions) -> Result<Self> {
        let path = path.as_ref().to_owned();
        refuse_directory(&path)?;
        if !path.is_file() {
            return Err(PromiseError::invalid(format!(
                "no database file at {}",
                path.display()
            )));
        }
        let conn = Connection::open_with_flags(
            literal(&path),
            OpenFlags::SQLITE_OPEN_READ_WRITE | OpenFlags::SQLITE_OPEN_NO_MUTEX,
        )
        .map_err(|e| map_err(&path, e))?;
        refuse_read_only(&conn, &path)?;
        conn.busy_timeout(options.busy_timeout)
            .map_err(|e| map_err(&path, e))?;
        schema::check_current(&conn, &path)?;
        Ok(Self::with_connection(path, conn))
    }

    fn with_connection(path: PathBuf, conn: Connection) -> Self {
        Self {
            path,
            inner: Mutex::new(Inner {
                conn,
                hook: Hook {
                    hook: None,
                    passed: 0,
                },
            }),
        }
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Installs (or removes) the crash hook; it counts crash points from
    /// the next operation on.
    pub fn set_crash_hook(&self, hook: Option<CrashHook>) {
        let mut inner = self.inner.lock();
        inner.hook = Hook { hook, passed: 0 };
    }

    /// Runs `op` in one `BEGIN IMMEDIATE` transaction. A protocol answer
    /// commits (the timeouts applied on the way are real); a storage
    /// failure or the crash hook drops the transaction, which rolls it back.
    fn run<T>(&self, op: impl FnOnce(&mut SqlTx<'_>) -> Result<T>) -> Result<T> {
        self.in_transaction(TransactionBehavior::Immediate, op)
    }

    /// Runs `op`, which only reads, in one `BEGIN DEFERRED` transaction:
    /// under WAL it reads a snapshot without waiting for another writer.
    fn read<T>(&self, op: impl FnOnce(&mut SqlTx<'_>) -> Result<T>) -> Result<T> {
        self.in_transaction(TransactionBehavior::Deferred, op)
    }

    fn in_transaction<T>(
        &self,
        behavior: TransactionBehavior,
        op: impl FnOnce(&mut SqlTx<'_>) -> Result<T>,
    ) -> Result<T> {
        let mut guard = self.inner.lock();
        let Inner { conn, hook } = &mut *guard;
        let path = &self.path;
        let tx = conn
            .transaction_with_behavior(behavior)
            .map_err(|e| map_err(path, e))?;
        let result = op(&mut SqlTx::new(&tx, path, hook));
        match &result {
            Err(e) if !e.is_protocol() => return result,
            _ => {}
        }
        tx.commit().map_err(|e| map_err(path, e))?;
        result
    }
}

/// Maps SQLite's failures onto the typed errors of a database file.
pub(crate) fn map_err(path: &Path, e: rusqlite::Error) -> PromiseError {
    if let rusqlite::Error::SqliteFailure(f, _) = &e {
        match f.code {
            ErrorCode::DatabaseCorrupt | ErrorCode::NotADatabase => {
                return PromiseError::Corrupt {
                    path: path.to_owned(),
                    message: e.to_string(),
                }
            }
            ErrorCode::DatabaseBusy | ErrorCode::DatabaseLocked => {
                return PromiseError::Locked {
                    path: path.to_owned(),
                }
            }
            // "attempt to write a readonly database", as SQLite words it.
            ErrorCode::ReadOnly if f.extended_code == ffi::SQLITE_READONLY_DIRECTORY => {
                return unwritable_folder(path, &e)
            }
            _ => {}
        }
    }
    PromiseError::Storage {
        message: format!("{}: {e}", path.display()),
    }
}

impl SqliteStore {
    fn read_snapshot(&self) -> Result<Snapshot> {
        let guard = self.inner.lock();
        tx::snapshot(&guard.conn, &self.path)
    }
}

ops::store_via_ops!(SqliteStore);
