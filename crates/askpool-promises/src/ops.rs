//! The operations, written once over [`Tx`]: the storage primitives of one
//! open transaction. Each store runs an operation inside its own
//! transaction (a `BEGIN IMMEDIATE` for SQLite, a mutex for memory), so an
//! operation and all its side effects commit together or not at all.
//!
//! Every domain check happens before the first write, so an operation that
//! answers with a protocol error has written nothing.

use crate::error::PromiseError;
use crate::model::{
    Callback, CallbackOutcome, CallbackRequest, ClaimRequest, Claimed, CompleteRequest, Completed,
    CreateRequest, Created, Lease, Millis, Promise, SearchQuery, State, Task, TaskKind, TaskState,
};
use crate::rules::{self, CompleteDecision};
use crate::store::{Pruned, Result, Status, Swept, MAX_REPORTED_CORRUPT};

/// A task before the store gave it an id.
pub(crate) struct NewTask {
    pub kind: TaskKind,
    pub promise_id: String,
    pub awaiter: Option<String>,
    pub epoch: u64,
    pub pool: String,
    pub preferred_worker: Option<String>,
    pub state: TaskState,
    pub created_at: Millis,
}

impl NewTask {
    pub(crate) fn with_id(self, id: u64) -> Task {
        Task {
            id,
            kind: self.kind,
            promise_id: self.promise_id,
            awaiter: self.awaiter,
            epoch: self.epoch,
            pool: self.pool,
            preferred_worker: self.preferred_worker,
            state: self.state,
            claims: 0,
            lease_owner: None,
            lease_expires_at: None,
            created_at: self.created_at,
        }
    }
}

/// A callback before the store gave it an id.
pub(crate) struct NewCallback {
    pub awaited: String,
    pub awaiter: String,
    pub epoch: u64,
    pub pool: String,
    pub preferred_worker: Option<String>,
    pub created_at: Millis,
}

impl NewCallback {
    pub(crate) fn with_id(self, id: u64) -> Callback {
        Callback {
            id,
            awaited: self.awaited,
            awaiter: self.awaiter,
            epoch: self.epoch,
            pool: self.pool,
            preferred_worker: self.preferred_worker,
            created_at: self.created_at,
        }
    }
}

/// A row of a listing of promise ids.
pub(crate) struct Listed<M> {
    /// Its id, or `Corrupt` if the row's id cannot be read.
    pub id: Result<String>,
    /// The row, for the listing to go on after it.
    pub mark: M,
}

/// The ids of a listing, or the first it cannot read.
fn ids<M>(listed: Vec<Listed<M>>) -> Result<Vec<String>> {
    listed.into_iter().map(|row| row.id).collect()
}

/// Storage primitives inside one transaction. Ids of tasks and callbacks
/// count up from 1 and are never reused.
pub(crate) trait Tx {
    fn promise(&mut self, id: &str) -> Result<Option<Promise>>;
    /// A promise's state and timeout, without its param and value (what a
    /// waiter looks at on every poll).
    fn promise_state(&mut self, id: &str) -> Result<Option<(State, Millis)>> {
        Ok(self.promise(id)?.map(|p| (p.state, p.timeout_at)))
    }
    /// Inserts `p` unless its id exists; whether it did.
    fn insert_promise(&mut self, p: &Promise) -> Result<bool>;
    /// Stores what settling and resuming change: state, value, complete
    /// key, `settled_at`, `resume_epoch`.
    fn update_promise(&mut self, p: &Promise) -> Result<()>;
    /// A row of the promises table as a listing of ids ([`Tx::expired`],
    /// [`Tx::prunable`]) names it, for the listing to go on after it.
    type Mark;
    /// Ids of pending promises with `timeout_at <= now` (matching `pattern`
    /// if given), by `(timeout_at, id)`, at most `limit`; only those after
    /// the row `after` if given (none if that row is gone).
    fn expired(
        &mut self,
        now: Millis,
        pattern: Option<&str>,
        after: Option<&Self::Mark>,
        limit: usize,
    ) -> Result<Vec<Listed<Self::Mark>>>;
    /// Ids of settled promises with `settled_at < before` that no task
    /// names (as its promise or awaiter), by id, at most `limit`; only
    /// those after the row `after` if given (none if that row is gone). (No
    /// index on `settled_at`: it would tax every settlement for the sake of
    /// a maintenance scan.)
    fn prunable(
        &mut self,
        before: Millis,
        after: Option<&Self::Mark>,
        limit: usize,
    ) -> Result<Vec<Listed<Self::Mark>>>;
    /// Runs `op`; if it fails, none of its writes stay, and the rest of the
    /// transaction can go on (a sweep skipping a corrupt promise). A
    /// failure to undo them is never `Corrupt`: it fails the transaction.
    fn isolated<R>(&mut self, op: impl FnOnce(&mut Self) -> Result<R>) -> Result<R>;
    /// Deletes the promise and the callbacks it registered as an awaiter.
    fn delete_promise(&mut self, id: &str) -> Result<()>;
    /// The search itself (timeouts already applied).
    fn search(&mut self, q: &SearchQuery) -> Result<Vec<Promise>>;

    fn insert_task(&mut self, t: NewTask) -> Result<Task>;
    fn task(&mut self, id: u64) -> Result<Option<Task>>;
    fn update_task(&mut self, t: &Task) -> Result<()>;
    fn delete_task(&mut self, id: u64) -> Result<()>;
    /// Deletes the promise's invoke task, if it has one.
    fn delete_invoke_task_of(&mut self, promise_id: &str) -> Result<bool>;
    /// The resume task of `awaiter`'s suspension `epoch`, if there is one.
    fn resume_task(&mut self, awaiter: &str, epoch: u64) -> Result<Option<Task>>;
    /// The task `worker` claims per [`rules::claimable`]: preferring it
    /// first, then by id.
    fn next_claimable(&mut self, pool: &str, worker: &str, now: Millis) -> Result<Option<Task>>;

    /// Callbacks on `awaited`, by id.
    fn callbacks_on(&mut self, awaited: &str) -> Result<Vec<Callback>>;
    fn find_callback(
        &mut self,
        awaited: &str,
        awaiter: &str,
        epoch: u64,
    ) -> Result<Option<Callback>>;
    fn insert_callback(&mut self, c: NewCallback) -> Result<Callback>;
    fn delete_callbacks_on(&mut self, awaited: &str) -> Result<()>;
    /// Deletes the callbacks `awaiter` registered for its suspensions
    /// before `epoch`.
    fn delete_callbacks_of(&mut self, awaiter: &str, epoch: u64) -> Result<()>;

    /// Where the crash hook may fire: between two writes of one operation.
    fn crash_point(&mut self) -> Result<()> {
        Ok(())
    }
}

/// Loads a promise, timing it out first if its time has come.
fn touch(tx: &mut impl Tx, id: &str, now: Millis) -> Result<Option<Promise>> {
    let Some(mut p) = tx.promise(id)? else {
        return Ok(None);
    };
    if rules::is_expired(&p, now) {
        let timeout = Settlement::timeout(&p);
        settle(tx, &mut p, timeout, now)?;
    }
    Ok(Some(p))
}

fn touch_existing(tx: &mut impl Tx, id: &str, now: Millis) -> Result<Promise> {
    touch(tx, id, now)?.ok_or_else(|| PromiseError::NotFound { id: id.to_owned() })
}

/// What a promise settles with.
struct Settlement {
    state: State,
    value: Option<Vec<u8>>,
    key: Option<String>,
    at: Millis,
}

impl Settlement {
    fn timeout(p: &Promise) -> Self {
        Self {
            state: State::TimedOut,
            value: None,
            key: None,
            at: p.timeout_at,
        }
    }
}

/// Settles `p` with every side effect (see `rules`, "Settlement"),
/// including the timeouts of awaiters past theirs. Those cascade (an
/// awaiter's own awaiters may be past theirs too) through a worklist, not
/// recursion: a chain of any length costs no stack.
fn settle(tx: &mut impl Tx, p: &mut Promise, how: Settlement, now: Millis) -> Result<()> {
    let mut expired = Vec::new();
    settle_one(tx, p, how, now, &mut expired)?;
    while let Some(id) = expired.pop() {
        // Listed once per callback: an awaiter already timed out is skipped.
        if let Some(mut awaiter) = tx.promise(&id)?.filter(|a| rules::is_expired(a, now)) {
            let timeout = Settlement::timeout(&awaiter);
            settle_one(tx, &mut awaiter, timeout, now, &mut expired)?;
        }
    }
    Ok(())
}

/// Settles `p` alone; the awaiters it would resume that are past their
/// timeouts go to `expired` instead (they time out, not resume).
fn settle_one(
    tx: &mut impl Tx,
    p: &mut Promise,
    how: Settlement,
    now: Millis,
    expired: &mut Vec<String>,
) -> Result<()> {
    p.state = how.state;
    p.value = how.value;
    p.complete_key = how.key;
    p.settled_at = Some(how.at);
    tx.update_promise(p)?;
    tx.crash_point()?;
    if tx.delete_invoke_task_of(&p.id)? {
        tx.crash_point()?;
    }
    // As an awaiter, `p` has ended: nothing is left to resume but the
    // suspension a worker may be resuming right now (its claimed task,
    // which that worker completes).
    for epoch in [p.resume_epoch, p.resume_epoch + 1] {
        let unclaimed = tx
            .resume_task(&p.id, epoch)?
            .filter(|t| t.state != TaskState::Claimed);
        if let Some(task) = unclaimed {
            tx.delete_task(task.id)?;
            tx.crash_point()?;
        }
    }
    // What it awaited wakes nothing now, but would stay stored for as long
    // as that stays pending.
    tx.delete_callbacks_of(&p.id, u64::MAX)?;
    let callbacks = tx.callbacks_on(&p.id)?;
    if callbacks.is_empty() {
        return Ok(());
    }
    for cb in callbacks {
        let Some(awaiter) = tx.promise(&cb.awaiter)? else {
            continue;
        };
        if rules::is_expired(&awaiter, now) {
            expired.push(awaiter.id);
            continue;
        }
        if awaiter.state != State::Pending {
            continue;
        }
        // The current suspension is woken now; the next one (registered
        // while the awaiter runs from its current resume task) once that
        // task completes.
        let state = if cb.epoch == awaiter.resume_epoch {
            TaskState::Ready
        } else if cb.epoch == awaiter.resume_epoch + 1 {
            TaskState::Waiting
        } else {
            continue;
        };
        if tx.resume_task(&cb.awaiter, cb.epoch)?.is_none() {
            tx.insert_task(NewTask {
                kind: TaskKind::Resume,
                promise_id: p.id.clone(),
                awaiter: Some(cb.awaiter),
                epoch: cb.epoch,
                pool: cb.pool,
                preferred_worker: cb.preferred_worker,
                state,
                created_at: now,
            })?;
            tx.crash_point()?;
        }
    }
    tx.delete_callbacks_on(&p.id)
}

pub(crate) fn create(tx: &mut impl Tx, req: &CreateRequest, now: Millis) -> Result<Created> {
    rules::check_name("promise id", &req.id)?;
    rules::check_opt_name("create key", req.key.as_deref())?;
    rules::check_value("param", &req.param)?;
    rules::check_tags(&req.tags)?;
    if let Some(t) = &req.target {
        rules::check_name("pool", &t.pool)?;
        rules::check_opt_name("preferred worker", t.preferred_worker.as_deref())?;
    }
    let now = rules::clamp(now);
    let timeout_at = rules::clamp(req.timeout_at);
    let expired = now >= timeout_at;
    let p = Promise {
        id: req.id.clone(),
        state: if expired {
            State::TimedOut
        } else {
            State::Pending
        },
        param: req.param.clone(),
        value: None,
        timeout_at,
        create_key: req.key.clone(),
        complete_key: None,
        strict: req.strict,
        tags: req.tags.clone(),
        created_at: now,
        settled_at: expired.then_some(timeout_at),
        resume_epoch: 0,
    };
    // Insert first: a new id (the common case) costs one statement.
    if !tx.insert_promise(&p)? {
        let existing = touch_existing(tx, &req.id, now)?;
        rules::create_existing(&existing, req.key.as_deref())?;
        return Ok(Created {
            promise: existing,
            deduplicated: true,
        });
    }
    if let (Some(target), false) = (&req.target, expired) {
        tx.crash_point()?;
        tx.insert_task(NewTask {
            kind: TaskKind::Invoke,
            promise_id: p.id.clone(),
            awaiter: None,
            epoch: 0,
            pool: target.pool.clone(),
            preferred_worker: target.preferred_worker.clone(),
            state: TaskState::Ready,
            created_at: now,
        })?;
    }
    Ok(Created {
        promise: p,
        deduplicated: false,
    })
}

pub(crate) fn get(tx: &mut impl Tx, id: &str, now: Millis) -> Result<Promise> {
    touch_existing(tx, id, rules::clamp(now))
}

/// Whether the promise has settled, or its timeout is due (it settles as
/// it is read, by `get`), and its timeout: read without its param and value.
pub(crate) fn status(tx: &mut impl Tx, id: &str, now: Millis) -> Result<Status> {
    let (state, timeout_at) = tx
        .promise_state(id)?
        .ok_or_else(|| PromiseError::NotFound { id: id.to_owned() })?;
    let now = rules::clamp(now);
    Ok(Status {
        settled: state.is_settled() || (state == State::Pending && now >= timeout_at),
        timeout_at,
    })
}

/// `get` for a read transaction: `None` if the promise's timeout is due,
/// which takes a write (`get`, in a write transaction, looks again: another
/// writer may have settled it meanwhile).
pub(crate) fn get_if_current(tx: &mut impl Tx, id: &str, now: Millis) -> Result<Option<Promise>> {
    let p = tx
        .promise(id)?
        .ok_or_else(|| PromiseError::NotFound { id: id.to_owned() })?;
    Ok((!rules::is_expired(&p, rules::clamp(now))).then_some(p))
}

pub(crate) fn complete(tx: &mut impl Tx, req: &CompleteRequest, now: Millis) -> Result<Completed> {
    rules::check_opt_name("complete key", req.key.as_deref())?;
    rules::check_value("value", &req.value)?;
    let now = rules::clamp(now);
    let mut p = touch_existing(tx, &req.id, now)?;
    match rules::complete(&p, req.completion, req.key.as_deref())? {
        CompleteDecision::Replay => Ok(Completed {
            promise: p,
            replayed: true,
        }),
        CompleteDecision::Settle => {
            let how = Settlement {
                state: req.completion.state(),
                value: Some(req.value.clone()),
                key: req.key.clone(),
                at: now,
            };
            settle(tx, &mut p, how, now)?;
            Ok(Completed {
                promise: p,
                replayed: false,
            })
        }
    }
}

fn check_search(q: &SearchQuery) -> Result<()> {
    rules::check_name("pattern", &q.pattern)?;
    if q.limit == 0 || q.limit > SearchQuery::MAX_LIMIT {
        return Err(PromiseError::invalid(format!(
            "limit must be 1..={}",
            SearchQuery::MAX_LIMIT
        )));
    }
    Ok(())
}

/// How many due promises one write of a search times out: a search that
/// finds many takes several writes, so the store's write lock (which other
/// processes wait for, up to their busy timeout) is never held for all.
pub const SEARCH_TIME_OUT_BATCH: usize = 1_000;

/// Times out up to `limit` of the promises `q`'s pattern matches that are
/// due, oldest deadline first (for `search`, between its reads).
pub(crate) fn time_out_matches(
    tx: &mut impl Tx,
    q: &SearchQuery,
    now: Millis,
    limit: usize,
) -> Result<()> {
    check_search(q)?;
    let now = rules::clamp(now);
    for id in ids(tx.expired(now, Some(&q.pattern), None, limit)?)? {
        touch(tx, &id, now)?;
    }
    Ok(())
}

/// `search` for a read transaction: `None` if a promise the pattern matches
/// is due to time out (on the page or not, as `search` times them all out).
pub(crate) fn search_if_current(
    tx: &mut impl Tx,
    q: &SearchQuery,
    now: Millis,
) -> Result<Option<Vec<Promise>>> {
    check_search(q)?;
    let due = ids(tx.expired(rules::clamp(now), Some(&q.pattern), None, 1)?)?;
    if !due.is_empty() {
        return Ok(None);
    }
    tx.search(q).map(Some)
}

pub(crate) fn prune<T: Tx>(tx: &mut T, before: Millis, limit: usize) -> Result<Pruned> {
    let before = rules::clamp(before);
    let (pruned, Skipped { count, corrupt }) = each_listed(
        tx,
        limit,
        |tx, after, n| tx.prunable(before, after, n),
        |tx, id| tx.delete_promise(id),
    )?;
    Ok(Pruned {
        pruned,
        skipped: count,
        corrupt,
    })
}

pub(crate) fn sweep<T: Tx>(tx: &mut T, now: Millis, limit: usize) -> Result<Swept> {
    let now = rules::clamp(now);
    let (timed_out, Skipped { count, corrupt }) = each_listed(
        tx,
        limit,
        |tx, after, n| tx.expired(now, None, after, n),
        |tx, id| touch(tx, id, now).map(drop),
    )?;
    Ok(Swept {
        timed_out,
        skipped: count,
        corrupt,
    })
}

/// Does `act` to each promise `list` lists (in pages of `limit`, each
/// after the row given) until it has done so `limit` times or the listing
/// ends; returns how many times, and the promises it skipped (the first
/// [`MAX_REPORTED_CORRUPT`] with their errors).
///
/// A promise is skipped (and reported, not logged: see `skipped_log`) when
/// its id cannot be read or
/// `act` meets a corrupt row (its own, or one it reads on the way): that
/// act's writes are undone, the rest goes on. The skipped rows stay listed,
/// so the listing goes on after the last one skipped (those done since left
/// it): however many corrupt rows come first, the well-formed ones after
/// them are reached in the same call. Any other failure fails the call.
fn each_listed<T: Tx>(
    tx: &mut T,
    limit: usize,
    mut list: impl FnMut(&mut T, Option<&T::Mark>, usize) -> Result<Vec<Listed<T::Mark>>>,
    mut act: impl FnMut(&mut T, &str) -> Result<()>,
) -> Result<(usize, Skipped)> {
    let mut done = 0;
    let mut skipped = Skipped::default();
    let mut after = None;
    while done < limit {
        let page = list(tx, after.as_ref(), limit)?;
        let more = page.len() == limit;
        let mut skipped_here = false;
        for Listed { id, mark } in page {
            if done == limit {
                break;
            }
            // (The error of a corrupt row names its promise, or the rowid
            // of an id that cannot be read.)
            let outcome = match id {
                Ok(id) => tx.isolated(|tx| act(tx, &id)),
                Err(e) => Err(e),
            };
            match outcome {
                Ok(()) => done += 1,
                Err(error @ PromiseError::Corrupt { .. }) => {
                    skipped.count += 1;
                    if skipped.corrupt.len() < MAX_REPORTED_CORRUPT {
                        skipped.corrupt.push(error);
                    }
                    after = Some(mark);
                    skipped_here = true;
                }
                Err(e) => return Err(e),
            }
        }
        if !more || !skipped_here {
            break;
        }
    }
    Ok((done, skipped))
}

/// The promises [`each_listed`] skipped.
#[derive(Default)]
struct Skipped {
    count: usize,
    corrupt: Vec<PromiseError>,
}

pub(crate) fn register_callback(
    tx: &mut impl Tx,
    req: &CallbackRequest,
    now: Millis,
) -> Result<CallbackOutcome> {
    rules::check_name("awaited id", &req.awaited)?;
    rules::check_name("awaiter id", &req.awaiter)?;
    rules::check_name("pool", &req.pool)?;
    rules::check_opt_name("preferred worker", req.preferred_worker.as_deref())?;
    let now = rules::clamp(now);
    let awaited = touch_existing(tx, &req.awaited, now)?;
    let awaiter = touch_existing(tx, &req.awaiter, now)?;
    if awaited.state.is_settled() {
        return Ok(CallbackOutcome::AlreadyCompleted(awaited));
    }
    if awaiter.state.is_settled() {
        return Err(PromiseError::AlreadySettled {
            id: awaiter.id,
            state: awaiter.state,
        });
    }
    // While a resume task of the current suspension exists, the awaiter
    // runs (or is about to run) from it: what it awaits now is for its next
    // suspension, which that task's completion begins (see `rules`).
    let epoch = match tx.resume_task(&req.awaiter, awaiter.resume_epoch)? {
        Some(_) => awaiter.resume_epoch + 1,
        None => awaiter.resume_epoch,
    };
    if let Some(cb) = tx.find_callback(&req.awaited, &req.awaiter, epoch)? {
        return Ok(CallbackOutcome::Registered(cb));
    }
    let cb = tx.insert_callback(NewCallback {
        awaited: req.awaited.clone(),
        awaiter: req.awaiter.clone(),
        epoch,
        pool: req.pool.clone(),
        preferred_worker: req.preferred_worker.clone(),
        created_at: now,
    })?;
    Ok(CallbackOutcome::Registered(cb))
}

pub(crate) fn claim_task(
    tx: &mut impl Tx,
    req: &ClaimRequest,
    now: Millis,
) -> Result<Option<Claimed>> {
    rules::check_name("pool", &req.pool)?;
    rules::check_name("worker", &req.worker)?;
    if req.lease_ms == 0 {
        return Err(PromiseError::invalid("lease_ms must be positive"));
    }
    let now = rules::clamp(now);
    // A claimable task whose execution has timed out (an invoke task's
    // promise, a resume task's awaiter) ends with the touch; look again
    // until a live task (or none) turns up.
    loop {
        let Some(mut task) = tx.next_claimable(&req.pool, &req.worker, now)? else {
            return Ok(None);
        };
        let promise = touch_existing(tx, &task.promise_id, now)?;
        let ended = match task.kind {
            TaskKind::Invoke => promise.state.is_settled(),
            TaskKind::Resume => {
                let awaiter = task.awaiter.as_deref().unwrap_or_default();
                touch(tx, awaiter, now)?.is_none_or(|a| a.state.is_settled())
            }
        };
        if ended {
            // Normally gone with the settlement; one left over (a resume
            // task whose lease expired after its awaiter settled, or an
            // edited file) must neither run nor make this loop forever.
            tx.delete_task(task.id)?;
            continue;
        }
        task.state = TaskState::Claimed;
        task.claims = task.claims.saturating_add(1);
        task.lease_owner = Some(req.worker.clone());
        task.lease_expires_at = Some(rules::clamp(now.saturating_add(req.lease_ms)));
        tx.update_task(&task)?;
        return Ok(Some(Claimed { task, promise }));
    }
}

/// The task of a lease, after the timeout of its promise (which ends an
/// invoke task) and of a resume task's awaiter.
fn held_task(tx: &mut impl Tx, lease: &Lease, now: Millis) -> Result<Task> {
    let not_found = PromiseError::TaskNotFound { id: lease.task_id };
    let task = tx.task(lease.task_id)?.ok_or(not_found.clone())?;
    touch(tx, &task.promise_id, now)?;
    if let Some(awaiter) = &task.awaiter {
        touch(tx, awaiter, now)?;
    }
    let task = tx.task(lease.task_id)?.ok_or(not_found)?;
    if !rules::holds_lease(&task, &lease.worker, lease.claim, now) {
        return Err(PromiseError::LeaseLost { id: task.id });
    }
    Ok(task)
}

pub(crate) fn heartbeat(
    tx: &mut impl Tx,
    lease: &Lease,
    lease_ms: Millis,
    now: Millis,
) -> Result<Task> {
    if lease_ms == 0 {
        return Err(PromiseError::invalid("lease_ms must be positive"));
    }
    let now = rules::clamp(now);
    let mut task = held_task(tx, lease, now)?;
    task.lease_expires_at = Some(rules::clamp(now.saturating_add(lease_ms)));
    tx.update_task(&task)?;
    Ok(task)
}

pub(crate) fn complete_task(tx: &mut impl Tx, lease: &Lease, now: Millis) -> Result<()> {
    let now = rules::clamp(now);
    let task = held_task(tx, lease, now)?;
    if task.kind == TaskKind::Invoke {
        return Err(PromiseError::invalid(
            "an invoke task completes with its promise (resolve or reject it)",
        ));
    }
    let awaiter_id = task.awaiter.clone().unwrap_or_default();
    let awaiter = tx.promise(&awaiter_id)?;
    tx.delete_task(task.id)?;
    if let Some(mut awaiter) = awaiter.filter(|a| a.resume_epoch == task.epoch) {
        tx.crash_point()?;
        awaiter.resume_epoch += 1;
        tx.update_promise(&awaiter)?;
        // The ended suspension's callbacks wake nothing (see `settle_one`);
        // an execution awaiting one long-pending promise in every
        // suspension would otherwise pile them up on it.
        tx.delete_callbacks_of(&awaiter.id, awaiter.resume_epoch)?;
        // Something the awaiter awaited for its next suspension settled
        // while it ran: that suspension is woken now.
        if let Some(mut next) = tx.resume_task(&awaiter.id, awaiter.resume_epoch)? {
            if next.state == TaskState::Waiting {
                tx.crash_point()?;
                next.state = TaskState::Ready;
                next.created_at = now;
                tx.update_task(&next)?;
            }
        }
    }
    Ok(())
}

/// `impl Store for $ty` by running each operation of this module through
/// `$ty::run` (its write transaction) or `$ty::read` (a read transaction),
/// and reading `$ty::read_snapshot`. A read takes the write lock only when
/// a timeout is due: it would otherwise wait behind every other writer.
macro_rules! store_via_ops {
    ($ty:ty) => {
        impl $crate::store::Store for $ty {
            fn create(&self, req: &CreateRequest, now: Millis) -> Result<Created> {
                self.run(|t| $crate::ops::create(t, req, now))
            }
            fn get(&self, id: &str, now: Millis) -> Result<Promise> {
                self.read(|t| $crate::ops::get_if_current(t, id, now))?
                    .map_or_else(|| self.run(|t| $crate::ops::get(t, id, now)), Ok)
            }
            fn status(&self, id: &str, now: Millis) -> Result<$crate::store::Status> {
                self.read(|t| $crate::ops::status(t, id, now))
            }
            fn complete(&self, req: &CompleteRequest, now: Millis) -> Result<Completed> {
                self.run(|t| $crate::ops::complete(t, req, now))
            }
            fn search(&self, query: &SearchQuery, now: Millis) -> Result<Vec<Promise>> {
                // Each batch of due matches timed out in a write of its
                // own, then read again (every due match is timed out
                // before the page is read).
                loop {
                    if let Some(found) =
                        self.read(|t| $crate::ops::search_if_current(t, query, now))?
                    {
                        return Ok(found);
                    }
                    self.run(|t| {
                        $crate::ops::time_out_matches(
                            t,
                            query,
                            now,
                            $crate::ops::SEARCH_TIME_OUT_BATCH,
                        )
                    })?;
                }
            }
            fn register_callback(
                &self,
                req: &CallbackRequest,
                now: Millis,
            ) -> Result<CallbackOutcome> {
                self.run(|t| $crate::ops::register_callback(t, req, now))
            }
            fn claim_task(&self, req: &ClaimRequest, now: Millis) -> Result<Option<Claimed>> {
                self.run(|t| $crate::ops::claim_task(t, req, now))
            }
            fn heartbeat(&self, lease: &Lease, lease_ms: Millis, now: Millis) -> Result<Task> {
                self.run(|t| $crate::ops::heartbeat(t, lease, lease_ms, now))
            }
            fn complete_task(&self, lease: &Lease, now: Millis) -> Result<()> {
                self.run(|t| $crate::ops::complete_task(t, lease, now))
            }
            fn sweep(&self, now: Millis, limit: usize) -> Result<$crate::store::Swept> {
                self.run(|t| $crate::ops::sweep(t, now, limit))
            }
            fn prune(&self, settled_before: Millis, limit: usize) -> Result<$crate::store::Pruned> {
                self.run(|t| $crate::ops::prune(t, settled_before, limit))
            }
            fn snapshot(&self) -> Result<Snapshot> {
                self.read_snapshot()
            }
        }
    };
}
pub(crate) use store_via_ops;
