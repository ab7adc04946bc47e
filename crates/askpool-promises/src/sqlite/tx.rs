//! The storage primitives of [`ops`](crate::ops) in SQL, on an open
//! transaction, with cached statements.

use std::collections::BTreeMap;
use std::path::Path;

use rusqlite::types::{Type, ValueRef};
use rusqlite::{params, Connection, OptionalExtension, Row, Transaction};

use super::{map_err, Hook};
use crate::error::PromiseError;
use crate::model::{
    Callback, Millis, Promise, SearchQuery, Snapshot, State, Task, TaskKind, TaskState,
};
use crate::ops::{Listed, NewCallback, NewTask, Tx};
use crate::pattern;
use crate::rules::PREFERENCE_GRACE_MS;
use crate::store::Result;

const PROMISE_COLS: &str = "id, state, param, value, timeout_at, create_key, complete_key, \
     strict, tags, created_at, settled_at, resume_epoch";
const TASK_COLS: &str = "id, kind, promise_id, awaiter, epoch, pool, preferred_worker, state, \
     claims, lease_owner, lease_expires_at, created_at";
const CALLBACK_COLS: &str = "id, awaited, awaiter, epoch, pool, preferred_worker, created_at";

pub(crate) struct SqlTx<'a> {
    tx: &'a Transaction<'a>,
    path: &'a Path,
    hook: &'a mut Hook,
}

impl<'a> SqlTx<'a> {
    pub(crate) fn new(tx: &'a Transaction<'a>, path: &'a Path, hook: &'a mut Hook) -> Self {
        Self { tx, path, hook }
    }
}

fn t(v: Millis) -> i64 {
    i64::try_from(v).unwrap_or(i64::MAX)
}

/// A value read back that this store never writes: the file was altered
/// (by hand, by another program) or damaged where SQLite cannot see it.
/// Carried through rusqlite as a conversion failure; reported as
/// `Corrupt` with this text, which names the record and the column.
#[derive(Debug)]
struct OddValue(String);

impl std::fmt::Display for OddValue {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for OddValue {}

/// The error of a read: `Corrupt` for a value the store never writes
/// (from the decoders below, or a column of the wrong type read by a
/// query of its own), else as [`map_err`] maps it.
fn read_err(path: &Path, e: rusqlite::Error) -> PromiseError {
    let corrupt = |message| PromiseError::Corrupt {
        path: path.to_owned(),
        message,
    };
    match e {
        rusqlite::Error::FromSqlConversionFailure(_, _, odd) if odd.is::<OddValue>() => {
            corrupt(odd.to_string())
        }
        rusqlite::Error::InvalidColumnType(..) => corrupt(e.to_string()),
        e => map_err(path, e),
    }
}

/// What an odd value is, for the error: its type and (shortened) value.
fn describe(v: ValueRef<'_>) -> String {
    match v {
        ValueRef::Null => "NULL".into(),
        ValueRef::Integer(i) => format!("integer {i}"),
        ValueRef::Real(r) => format!("real {r:?}"),
        ValueRef::Text(t) => {
            let text = String::from_utf8_lossy(t);
            match text.char_indices().nth(40) {
                Some((cut, _)) => format!("text {:?}...", &text[..cut]),
                None => format!("text {text:?}"),
            }
        }
        ValueRef::Blob(b) => format!("a {}-byte blob", b.len()),
    }
}

/// One row being decoded, every column checked against what the store
/// writes: the one place values read from the file are checked, so that
/// a file altered by hand reads as `Corrupt` naming the record (`promise
/// "p"`) and the column, never as a panic, a wrapped-around time or a
/// silent default.
struct Cells<'a, 'r> {
    row: &'a Row<'r>,
    /// The record, as the error names it.
    what: String,
}

impl<'a, 'r> Cells<'a, 'r> {
    fn new(row: &'a Row<'r>, what: String) -> Self {
        Self { row, what }
    }

    /// A row of `table` named by its text id in column `col`.
    fn named(row: &'a Row<'r>, table: &str, col: usize) -> rusqlite::Result<(Self, String)> {
        let mut cells = Self::new(row, format!("a {table}"));
        let id = cells.text(col)?;
        cells.what = format!("{table} {id:?}");
        Ok((cells, id))
    }

    /// A row of `table` named by its integer id in column `col`.
    fn numbered(row: &'a Row<'r>, table: &str, col: usize) -> rusqlite::Result<(Self, u64)> {
        let mut cells = Self::new(row, format!("a {table}"));
        let id = cells.count(col)?;
        cells.what = format!("{table} {id}");
        Ok((cells, id))
    }

    fn odd(&self, col: usize, why: &str) -> rusqlite::Error {
        let name = self.row.as_ref().column_name(col).unwrap_or("?");
        let (found, ty) = match self.row.get_ref(col) {
            Ok(v) => (describe(v), v.data_type()),
            Err(_) => ("nothing".into(), Type::Null),
        };
        let message = format!("{}: column {name} holds {found} ({why})", self.what);
        rusqlite::Error::FromSqlConversionFailure(col, ty, Box::new(OddValue(message)))
    }

    fn value(&self, col: usize) -> rusqlite::Result<ValueRef<'_>> {
        self.row.get_ref(col)
    }

    fn text(&self, col: usize) -> rusqlite::Result<String> {
        self.opt_text(col)?
            .ok_or_else(|| self.odd(col, "expected text"))
    }

    fn opt_text(&self, col: usize) -> rusqlite::Result<Option<String>> {
        match self.value(col)? {
            ValueRef::Null => Ok(None),
            ValueRef::Text(t) => match std::str::from_utf8(t) {
                Ok(t) => Ok(Some(t.to_owned())),
                Err(_) => Err(self.odd(col, "not UTF-8")),
            },
            _ => Err(self.odd(col, "expected text")),
        }
    }

    fn blob(&self, col: usize) -> rusqlite::Result<Vec<u8>> {
        self.opt_blob(col)?
            .ok_or_else(|| self.odd(col, "expected bytes"))
    }

    fn opt_blob(&self, col: usize) -> rusqlite::Result<Option<Vec<u8>>> {
        match self.value(col)? {
            ValueRef::Null => Ok(None),
            ValueRef::Blob(b) => Ok(Some(b.to_vec())),
            _ => Err(self.odd(col, "expected bytes")),
        }
    }

    fn opt_int(&self, col: usize) -> rusqlite::Result<Option<i64>> {
        match self.value(col)? {
            ValueRef::Null => Ok(None),
            ValueRef::Integer(i) => Ok(Some(i)),
            _ => Err(self.odd(col, "expected an integer")),
        }
    }

    fn int(&self, col: usize) -> rusqlite::Result<i64> {
        self.opt_int(col)?
            .ok_or_else(|| self.odd(col, "expected an integer"))
    }

    /// A count, id or epoch: never negative.
    fn count(&self, col: usize) -> rusqlite::Result<u64> {
        u64::try_from(self.int(col)?).map_err(|_| self.odd(col, "expected a count, not negative"))
    }

    /// A time the store wrote: milliseconds, never negative (times past
    /// [`MAX_TIME`](crate::model::MAX_TIME) are written as it, which an
    /// `i64` cannot exceed).
    fn time(&self, col: usize) -> rusqlite::Result<Millis> {
        self.opt_time(col)?
            .ok_or_else(|| self.odd(col, "expected a time"))
    }

    fn opt_time(&self, col: usize) -> rusqlite::Result<Option<Millis>> {
        match self.opt_int(col)? {
            None => Ok(None),
            Some(t) => u64::try_from(t)
                .map(Some)
                .map_err(|_| self.odd(col, "a time is never negative")),
        }
    }

    /// A boolean: written as 0 or 1.
    fn flag(&self, col: usize) -> rusqlite::Result<bool> {
        match self.int(col)? {
            0 => Ok(false),
            1 => Ok(true),
            _ => Err(self.odd(col, "expected 0 or 1")),
        }
    }

    fn promise_state(&self, col: usize) -> rusqlite::Result<State> {
        State::from_code(self.int(col)?).ok_or_else(|| self.odd(col, "no such promise state"))
    }

    fn tags(&self, col: usize) -> rusqlite::Result<BTreeMap<String, String>> {
        let json = self.text(col)?;
        serde_json::from_str(&json)
            .map_err(|e| self.odd(col, &format!("expected a JSON object of strings: {e}")))
    }
}

fn promise_row(r: &Row<'_>) -> rusqlite::Result<Promise> {
    let (c, id) = Cells::named(r, "promise", 0)?;
    let state = c.promise_state(1)?;
    let p = Promise {
        id,
        state,
        param: c.blob(2)?,
        value: c.opt_blob(3)?,
        timeout_at: c.time(4)?,
        create_key: c.opt_text(5)?,
        complete_key: c.opt_text(6)?,
        strict: c.flag(7)?,
        tags: c.tags(8)?,
        created_at: c.time(9)?,
        settled_at: c.opt_time(10)?,
        resume_epoch: c.count(11)?,
    };
    // What only a settlement writes, and what every settlement writes.
    if state.is_settled() != p.settled_at.is_some() {
        let why = if state.is_settled() {
            format!("expected the time it settled: its state is {state}")
        } else {
            "expected NULL: its state is pending".to_owned()
        };
        return Err(c.odd(10, &why));
    }
    let only_settled = [(3, p.value.is_some()), (6, p.complete_key.is_some())];
    if let Some((col, _)) = only_settled
        .into_iter()
        .find(|&(_, set)| set && !state.is_settled())
    {
        return Err(c.odd(col, "expected NULL: its state is pending"));
    }
    Ok(p)
}

fn task_row(r: &Row<'_>) -> rusqlite::Result<Task> {
    let (c, id) = Cells::numbered(r, "task", 0)?;
    let kind = match c.int(1)? {
        0 => TaskKind::Invoke,
        1 => TaskKind::Resume,
        _ => return Err(c.odd(1, "no such task kind")),
    };
    let state = match c.int(7)? {
        0 => TaskState::Ready,
        1 => TaskState::Claimed,
        2 => TaskState::Waiting,
        _ => return Err(c.odd(7, "no such task state")),
    };
    Ok(Task {
        id,
        kind,
        promise_id: c.text(2)?,
        awaiter: c.opt_text(3)?,
        epoch: c.count(4)?,
        pool: c.text(5)?,
        preferred_worker: c.opt_text(6)?,
        state,
        claims: u32::try_from(c.count(8)?).map_err(|_| c.odd(8, "expected a claim count"))?,
        lease_owner: c.opt_text(9)?,
        lease_expires_at: c.opt_time(10)?,
        created_at: c.time(11)?,
    })
}

fn callback_row(r: &Row<'_>) -> rusqlite::Result<Callback> {
    let (c, id) = Cells::numbered(r, "callback", 0)?;
    Ok(Callback {
        id,
        awaited: c.text(1)?,
        awaiter: c.text(2)?,
        epoch: c.count(3)?,
        pool: c.text(4)?,
        preferred_worker: c.opt_text(5)?,
        created_at: c.time(6)?,
    })
}

fn kind_code(k: TaskKind) -> i64 {
    match k {
        TaskKind::Invoke => 0,
        TaskKind::Resume => 1,
    }
}

fn state_code(s: TaskState) -> i64 {
    match s {
        TaskState::Ready => 0,
        TaskState::Claimed => 1,
        TaskState::Waiting => 2,
    }
}

fn tags_json(tags: &BTreeMap<String, String>) -> String {
    serde_json::to_string(tags).unwrap_or_else(|_| "{}".into())
}

fn limit(n: usize) -> i64 {
    i64::try_from(n).unwrap_or(-1)
}

impl SqlTx<'_> {
    fn err(&self, e: rusqlite::Error) -> PromiseError {
        read_err(self.path, e)
    }

    fn insert_promise_row(&mut self, sql: &str, p: &Promise) -> Result<usize> {
        let mut stmt = self.tx.prepare_cached(sql).map_err(|e| self.err(e))?;
        stmt.execute(params![
            p.id,
            p.state.code(),
            p.param,
            p.value,
            t(p.timeout_at),
            p.create_key,
            p.complete_key,
            p.strict,
            tags_json(&p.tags),
            t(p.created_at),
            p.settled_at.map(t),
            t(p.resume_epoch),
        ])
        .map_err(|e| self.err(e))
    }

    /// Runs one write; how many rows it changed.
    fn exec(&mut self, sql: &str, p: impl rusqlite::Params) -> Result<usize> {
        let mut stmt = self.tx.prepare_cached(sql).map_err(|e| self.err(e))?;
        stmt.execute(p).map_err(|e| self.err(e))
    }

    /// Promise ids (column 0) and rowids (column 1). An id that cannot be
    /// read is `Corrupt` for its row alone, named by its rowid (there is
    /// no id to name it by).
    fn listed(&mut self, sql: &str, p: impl rusqlite::Params) -> Result<Vec<Listed<i64>>> {
        let path = self.path;
        let mut stmt = self.tx.prepare_cached(sql).map_err(|e| self.err(e))?;
        let rows = stmt
            .query_map(p, |r| {
                let rowid = r.get(1)?;
                let c = Cells::new(
                    r,
                    format!("promise at rowid {rowid} (its id cannot be read)"),
                );
                Ok(Listed {
                    id: c.text(0).map_err(|e| read_err(path, e)),
                    mark: rowid,
                })
            })
            .map_err(|e| self.err(e))?;
        rows.collect::<rusqlite::Result<Vec<_>>>()
            .map_err(|e| self.err(e))
    }

    /// A savepoint statement of [`Tx::isolated`]. Its failure is never
    /// `Corrupt` (which a sweep would skip, its writes not undone): it
    /// fails the transaction.
    fn savepoint(&mut self, sql: &str) -> Result<()> {
        let run = |tx: &Transaction<'_>| tx.prepare_cached(sql)?.execute([]);
        run(self.tx)
            .map(drop)
            .map_err(|e| match map_err(self.path, e) {
                PromiseError::Corrupt { message, .. } => PromiseError::Storage {
                    message: format!("{}: {sql}: {message}", self.path.display()),
                },
                other => other,
            })
    }

    fn one_task(&mut self, sql: &str, p: impl rusqlite::Params) -> Result<Option<Task>> {
        let mut stmt = self.tx.prepare_cached(sql).map_err(|e| self.err(e))?;
        stmt.query_row(p, task_row)
            .optional()
            .map_err(|e| self.err(e))
    }
}

impl Tx for SqlTx<'_> {
    fn promise(&mut self, id: &str) -> Result<Option<Promise>> {
        let sql = format!("SELECT {PROMISE_COLS} FROM promises WHERE id = ?1");
        let mut stmt = self.tx.prepare_cached(&sql).map_err(|e| self.err(e))?;
        stmt.query_row([id], promise_row)
            .optional()
            .map_err(|e| self.err(e))
    }

    fn promise_state(&mut self, id: &str) -> Result<Option<(State, Millis)>> {
        let mut stmt = self
            .tx
            .prepare_cached("SELECT state, timeout_at FROM promises WHERE id = ?1")
            .map_err(|e| self.err(e))?;
        stmt.query_row([id], |r| {
            let c = Cells::new(r, format!("promise {id:?}"));
            Ok((c.promise_state(0)?, c.time(1)?))
        })
        .optional()
        .map_err(|e| self.err(e))
    }

    fn insert_promise(&mut self, p: &Promise) -> Result<bool> {
        let sql = format!(
            "INSERT INTO promises ({PROMISE_COLS}) VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12) \
             ON CONFLICT (id) DO NOTHING"
        );
        Ok(self.insert_promise_row(&sql, p)? == 1)
    }

    fn update_promise(&mut self, p: &Promise) -> Result<()> {
        self.exec(
            "UPDATE promises SET state = ?2, value = ?3, complete_key = ?4, settled_at = ?5, \
                 resume_epoch = ?6 WHERE id = ?1",
            params![
                p.id,
                p.state.code(),
                p.value,
                p.complete_key,
                p.settled_at.map(t),
                t(p.resume_epoch),
            ],
        )?;
        Ok(())
    }

    /// The row's rowid (the same while the transaction lasts).
    type Mark = i64;

    fn expired(
        &mut self,
        now: Millis,
        pat: Option<&str>,
        after: Option<&i64>,
        n: usize,
    ) -> Result<Vec<Listed<i64>>> {
        let glob = pat.map(pattern::to_glob);
        match after {
            None => self.listed(
                "SELECT id, rowid FROM promises WHERE state = 0 AND timeout_at <= ?1 \
                     AND (?2 IS NULL OR id GLOB ?2) ORDER BY timeout_at, id LIMIT ?3",
                params![t(now), glob, limit(n)],
            ),
            Some(after) => self.listed(
                "SELECT id, rowid FROM promises WHERE state = 0 AND timeout_at <= ?1 \
                     AND (?2 IS NULL OR id GLOB ?2) \
                     AND (timeout_at, id) > (SELECT timeout_at, id FROM promises WHERE rowid = ?4) \
                     ORDER BY timeout_at, id LIMIT ?3",
                params![t(now), glob, limit(n), after],
            ),
        }
    }

    fn prunable(
        &mut self,
        before: Millis,
        after: Option<&i64>,
        n: usize,
    ) -> Result<Vec<Listed<i64>>> {
        match after {
            None => self.listed(
                "SELECT id, rowid FROM promises p WHERE state != 0 AND settled_at < ?1 \
                     AND NOT EXISTS (SELECT 1 FROM tasks WHERE promise_id = p.id) \
                     AND NOT EXISTS (SELECT 1 FROM tasks WHERE kind = 1 AND awaiter = p.id) \
                     ORDER BY id LIMIT ?2",
                params![t(before), limit(n)],
            ),
            Some(after) => self.listed(
                "SELECT id, rowid FROM promises p WHERE state != 0 AND settled_at < ?1 \
                     AND id > (SELECT id FROM promises WHERE rowid = ?3) \
                     AND NOT EXISTS (SELECT 1 FROM tasks WHERE promise_id = p.id) \
                     AND NOT EXISTS (SELECT 1 FROM tasks WHERE kind = 1 AND awaiter = p.id) \
                     ORDER BY id LIMIT ?2",
                params![t(before), limit(n), after],
            ),
        }
    }

    fn isolated<R>(&mut self, op: impl FnOnce(&mut Self) -> Result<R>) -> Result<R> {
        self.savepoint("SAVEPOINT isolated")?;
        let result = op(self);
        let end = match result {
            Ok(_) => self.savepoint("RELEASE isolated"),
            Err(_) => self
                .savepoint("ROLLBACK TO isolated")
                .and_then(|()| self.savepoint("RELEASE isolated")),
        };
        match (result, end) {
            (result, Ok(())) => result,
            // The transaction fails anyway: with its own error.
            (Err(e), Err(_)) if !matches!(e, PromiseError::Corrupt { .. }) => Err(e),
            (_, Err(e)) => Err(e),
        }
    }

    fn delete_promise(&mut self, id: &str) -> Result<()> {
        for sql in [
            "DELETE FROM promises WHERE id = ?1",
            "DELETE FROM callbacks WHERE awaiter = ?1",
        ] {
            self.exec(sql, [id])?;
        }
        Ok(())
    }

    fn search(&mut self, q: &SearchQuery) -> Result<Vec<Promise>> {
        let sql = format!(
            "SELECT {PROMISE_COLS} FROM promises WHERE id GLOB ?1 AND (?2 IS NULL OR state = ?2) \
             AND (?3 IS NULL OR id > ?3) ORDER BY id LIMIT ?4"
        );
        let mut stmt = self.tx.prepare_cached(&sql).map_err(|e| self.err(e))?;
        let rows = stmt
            .query_map(
                params![
                    pattern::to_glob(&q.pattern),
                    q.state.map(State::code),
                    q.after,
                    limit(q.limit)
                ],
                promise_row,
            )
            .map_err(|e| self.err(e))?;
        rows.collect::<rusqlite::Result<Vec<_>>>()
            .map_err(|e| self.err(e))
    }

    fn insert_task(&mut self, n: NewTask) -> Result<Task> {
        self.exec(
            "INSERT INTO tasks (kind, promise_id, awaiter, epoch, pool, preferred_worker, \
                 state, claims, lease_owner, lease_expires_at, created_at) \
                 VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, 0, NULL, NULL, ?8)",
            params![
                kind_code(n.kind),
                n.promise_id,
                n.awaiter,
                t(n.epoch),
                n.pool,
                n.preferred_worker,
                state_code(n.state),
                t(n.created_at),
            ],
        )?;
        let id = self.tx.last_insert_rowid() as u64;
        Ok(n.with_id(id))
    }

    fn task(&mut self, id: u64) -> Result<Option<Task>> {
        let sql = format!("SELECT {TASK_COLS} FROM tasks WHERE id = ?1");
        self.one_task(&sql, [t(id)])
    }

    fn update_task(&mut self, k: &Task) -> Result<()> {
        self.exec(
            "UPDATE tasks SET state = ?2, claims = ?3, lease_owner = ?4, lease_expires_at = ?5, \
                 created_at = ?6 WHERE id = ?1",
            params![
                t(k.id),
                state_code(k.state),
                k.claims,
                k.lease_owner,
                k.lease_expires_at.map(t),
                t(k.created_at),
            ],
        )?;
        Ok(())
    }

    fn delete_task(&mut self, id: u64) -> Result<()> {
        self.exec("DELETE FROM tasks WHERE id = ?1", [t(id)])?;
        Ok(())
    }

    fn delete_invoke_task_of(&mut self, promise_id: &str) -> Result<bool> {
        let deleted = self.exec(
            "DELETE FROM tasks WHERE promise_id = ?1 AND kind = 0",
            [promise_id],
        )?;
        Ok(deleted > 0)
    }

    fn resume_task(&mut self, awaiter: &str, epoch: u64) -> Result<Option<Task>> {
        let sql = format!(
            "SELECT {TASK_COLS} FROM tasks WHERE awaiter = ?1 AND epoch = ?2 AND kind = 1 \
             ORDER BY id LIMIT 1"
        );
        self.one_task(&sql, params![awaiter, t(epoch)])
    }

    fn next_claimable(&mut self, pool: &str, worker: &str, now: Millis) -> Result<Option<Task>> {
        // `created_at <= now - grace` is rules::claimable's grace test.
        let others_from = if now >= PREFERENCE_GRACE_MS {
            t(now - PREFERENCE_GRACE_MS)
        } else {
            -1
        };
        let sql = format!(
            "SELECT {TASK_COLS} FROM tasks WHERE pool = ?1 \
             AND (state = 0 OR (state = 1 AND lease_expires_at <= ?3)) \
             AND (preferred_worker IS NULL OR preferred_worker = ?2 OR created_at <= ?4) \
             ORDER BY (preferred_worker IS ?2) DESC, id LIMIT 1"
        );
        self.one_task(&sql, params![pool, worker, t(now), others_from])
    }

    fn callbacks_on(&mut self, awaited: &str) -> Result<Vec<Callback>> {
        let sql = format!("SELECT {CALLBACK_COLS} FROM callbacks WHERE awaited = ?1 ORDER BY id");
        let mut stmt = self.tx.prepare_cached(&sql).map_err(|e| self.err(e))?;
        let rows = stmt
            .query_map([awaited], callback_row)
            .map_err(|e| self.err(e))?;
        rows.collect::<rusqlite::Result<Vec<_>>>()
            .map_err(|e| self.err(e))
    }

    fn find_callback(
        &mut self,
        awaited: &str,
        awaiter: &str,
        epoch: u64,
    ) -> Result<Option<Callback>> {
        let sql = format!(
            "SELECT {CALLBACK_COLS} FROM callbacks WHERE awaited = ?1 AND awaiter = ?2 AND epoch = ?3 \
             ORDER BY id LIMIT 1"
        );
        let mut stmt = self.tx.prepare_cached(&sql).map_err(|e| self.err(e))?;
        stmt.query_row(params![awaited, awaiter, t(epoch)], callback_row)
            .optional()
            .map_err(|e| self.err(e))
    }

    fn insert_callback(&mut self, n: NewCallback) -> Result<Callback> {
        self.exec(
            "INSERT INTO callbacks (awaited, awaiter, epoch, pool, preferred_worker, created_at) \
                 VALUES (?1, ?2, ?3, ?4, ?5, ?6)",
            params![
                n.awaited,
                n.awaiter,
                t(n.epoch),
                n.pool,
                n.preferred_worker,
                t(n.created_at),
            ],
        )?;
        let id = self.tx.last_insert_rowid() as u64;
        Ok(n.with_id(id))
    }

    fn delete_callbacks_on(&mut self, awaited: &str) -> Result<()> {
        self.exec("DELETE FROM callbacks WHERE awaited = ?1", [awaited])?;
        Ok(())
    }

    fn delete_callbacks_of(&mut self, awaiter: &str, epoch: u64) -> Result<()> {
        self.exec(
            "DELETE FROM callbacks WHERE awaiter = ?1 AND epoch < ?2",
            params![awaiter, t(epoch)],
        )?;
        Ok(())
    }

    fn crash_point(&mut self) -> Result<()> {
        self.hook.point()
    }
}

/// Everything in the file, by id.
pub(crate) fn snapshot(conn: &Connection, path: &Path) -> Result<Snapshot> {
    let err = |e| read_err(path, e);
    fn all<T>(
        conn: &Connection,
        sql: &str,
        f: fn(&Row<'_>) -> rusqlite::Result<T>,
    ) -> rusqlite::Result<Vec<T>> {
        let mut stmt = conn.prepare_cached(sql)?;
        let rows = stmt.query_map([], f)?;
        rows.collect()
    }
    // One read transaction: a consistent view even with other writers.
    let tx = conn.unchecked_transaction().map_err(err)?;
    let conn: &Connection = &tx;
    let snapshot = Snapshot {
        promises: all(
            conn,
            &format!("SELECT {PROMISE_COLS} FROM promises ORDER BY id"),
            promise_row,
        )
        .map_err(err)?,
        tasks: all(
            conn,
            &format!("SELECT {TASK_COLS} FROM tasks ORDER BY id"),
            task_row,
        )
        .map_err(err)?,
        callbacks: all(
            conn,
            &format!("SELECT {CALLBACK_COLS} FROM callbacks ORDER BY id"),
            callback_row,
        )
        .map_err(err)?,
    };
    tx.commit().map_err(err)?;
    Ok(snapshot)
}
