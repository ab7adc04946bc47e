//! The in-memory store: the reference model of the differential test, and
//! a store for tests. Plain ordered maps behind one mutex; the mutex is the
//! transaction.

use std::collections::BTreeMap;

use parking_lot::Mutex;

use crate::model::{
    Callback, CallbackOutcome, CallbackRequest, ClaimRequest, Claimed, CompleteRequest, Completed,
    CreateRequest, Created, Lease, Millis, Promise, SearchQuery, Snapshot, Task, TaskKind,
};
use crate::ops::{self, Listed, NewCallback, NewTask, Tx};
use crate::pattern;
use crate::rules;
use crate::store::Result;

#[derive(Default)]
struct State {
    promises: BTreeMap<String, Promise>,
    tasks: BTreeMap<u64, Task>,
    callbacks: BTreeMap<u64, Callback>,
    last_task: u64,
    last_callback: u64,
}

#[derive(Default)]
pub struct MemoryStore {
    state: Mutex<State>,
}

impl MemoryStore {
    pub fn new() -> Self {
        Self::default()
    }

    fn run<T>(&self, op: impl FnOnce(&mut State) -> Result<T>) -> Result<T> {
        op(&mut self.state.lock())
    }

    /// The mutex serves reads as it serves writes.
    fn read<T>(&self, op: impl FnOnce(&mut State) -> Result<T>) -> Result<T> {
        self.run(op)
    }
}

fn listed(id: &str) -> Listed<String> {
    Listed {
        id: Ok(id.to_owned()),
        mark: id.to_owned(),
    }
}

impl Tx for State {
    fn promise(&mut self, id: &str) -> Result<Option<Promise>> {
        Ok(self.promises.get(id).cloned())
    }
    fn insert_promise(&mut self, p: &Promise) -> Result<bool> {
        if self.promises.contains_key(&p.id) {
            return Ok(false);
        }
        self.promises.insert(p.id.clone(), p.clone());
        Ok(true)
    }
    fn update_promise(&mut self, p: &Promise) -> Result<()> {
        self.promises.insert(p.id.clone(), p.clone());
        Ok(())
    }
    /// A promise's id: its place in a listing.
    type Mark = String;
    fn expired(
        &mut self,
        now: Millis,
        pat: Option<&str>,
        after: Option<&String>,
        limit: usize,
    ) -> Result<Vec<Listed<String>>> {
        let after = match after {
            None => None,
            Some(id) => match self.promises.get(id) {
                Some(p) => Some((p.timeout_at, id)),
                None => return Ok(Vec::new()),
            },
        };
        let mut hits: Vec<(Millis, &String)> = self
            .promises
            .values()
            .filter(|p| rules::is_expired(p, now))
            .filter(|p| pat.is_none_or(|pat| pattern::matches(pat, &p.id)))
            .map(|p| (p.timeout_at, &p.id))
            .filter(|&hit| after.is_none_or(|after| hit > after))
            .collect();
        hits.sort();
        Ok(hits
            .into_iter()
            .take(limit)
            .map(|(_, id)| listed(id))
            .collect())
    }
    fn prunable(
        &mut self,
        before: Millis,
        after: Option<&String>,
        limit: usize,
    ) -> Result<Vec<Listed<String>>> {
        use std::ops::Bound;
        let start = match after {
            Some(id) if !self.promises.contains_key(id) => return Ok(Vec::new()),
            Some(id) => Bound::Excluded(id.clone()),
            None => Bound::Unbounded,
        };
        let named = |id: &str| {
            self.tasks
                .values()
                .any(|t| t.promise_id == id || t.awaiter.as_deref() == Some(id))
        };
        Ok(self
            .promises
            .range((start, Bound::Unbounded))
            .map(|(_, p)| p)
            .filter(|p| p.settled_at.is_some_and(|at| at < before) && !named(&p.id))
            .take(limit)
            .map(|p| listed(&p.id))
            .collect())
    }
    /// The primitives here never fail: an op of them has no writes to undo.
    fn isolated<R>(&mut self, op: impl FnOnce(&mut Self) -> Result<R>) -> Result<R> {
        op(self)
    }
    fn delete_promise(&mut self, id: &str) -> Result<()> {
        self.promises.remove(id);
        self.callbacks.retain(|_, c| c.awaiter != id);
        Ok(())
    }
    fn search(&mut self, q: &SearchQuery) -> Result<Vec<Promise>> {
        use std::ops::Bound;
        let start = match &q.after {
            Some(after) => Bound::Excluded(after.clone()),
            None => Bound::Unbounded,
        };
        Ok(self
            .promises
            .range((start, Bound::Unbounded))
            .map(|(_, p)| p)
            .filter(|p| q.state.is_none_or(|s| p.state == s))
            .filter(|p| pattern::matches(&q.pattern, &p.id))
            .take(q.limit)
            .cloned()
            .collect())
    }
    fn insert_task(&mut self, t: NewTask) -> Result<Task> {
        self.last_task += 1;
        let task = t.with_id(self.last_task);
        self.tasks.insert(task.id, task.clone());
        Ok(task)
    }
    fn task(&mut self, id: u64) -> Result<Option<Task>> {
        Ok(self.tasks.get(&id).cloned())
    }
    fn update_task(&mut self, t: &Task) -> Result<()> {
        self.tasks.insert(t.id, t.clone());
        Ok(())
    }
    fn delete_task(&mut self, id: u64) -> Result<()> {
        self.tasks.remove(&id);
        Ok(())
    }
    fn delete_invoke_task_of(&mut self, promise_id: &str) -> Result<bool> {
        let found = self
            .tasks
            .values()
            .find(|t| t.kind == TaskKind::Invoke && t.promise_id == promise_id)
            .map(|t| t.id);
        Ok(found.is_some_and(|id| self.tasks.remove(&id).is_some()))
    }
    fn resume_task(&mut self, awaiter: &str, epoch: u64) -> Result<Option<Task>> {
        Ok(self
            .tasks
            .values()
            .find(|t| {
                t.kind == TaskKind::Resume
                    && t.awaiter.as_deref() == Some(awaiter)
                    && t.epoch == epoch
            })
            .cloned())
    }
    fn next_claimable(&mut self, pool: &str, worker: &str, now: Millis) -> Result<Option<Task>> {
        let mut candidates = self
            .tasks
            .values()
            .filter(|t| t.pool == pool && rules::claimable(t, worker, now));
        let first = candidates.clone().next().cloned();
        let preferred = candidates.find(|t| t.preferred_worker.as_deref() == Some(worker));
        Ok(preferred.cloned().or(first))
    }
    fn callbacks_on(&mut self, awaited: &str) -> Result<Vec<Callback>> {
        Ok(self
            .callbacks
            .values()
            .filter(|c| c.awaited == awaited)
            .cloned()
            .collect())
    }
    fn find_callback(
        &mut self,
        awaited: &str,
        awaiter: &str,
        epoch: u64,
    ) -> Result<Option<Callback>> {
        Ok(self
            .callbacks
            .values()
            .find(|c| c.awaited == awaited && c.awaiter == awaiter && c.epoch == epoch)
            .cloned())
    }
    fn insert_callback(&mut self, c: NewCallback) -> Result<Callback> {
        self.last_callback += 1;
        let cb = c.with_id(self.last_callback);
        self.callbacks.insert(cb.id, cb.clone());
        Ok(cb)
    }
    fn delete_callbacks_on(&mut self, awaited: &str) -> Result<()> {
        self.callbacks.retain(|_, c| c.awaited != awaited);
        Ok(())
    }
    fn delete_callbacks_of(&mut self, awaiter: &str, epoch: u64) -> Result<()> {
        self.callbacks
            .retain(|_, c| c.awaiter != awaiter || c.epoch >= epoch);
        Ok(())
    }
}

impl MemoryStore {
    fn read_snapshot(&self) -> Result<Snapshot> {
        let s = self.state.lock();
        Ok(Snapshot {
            promises: s.promises.values().cloned().collect(),
            tasks: s.tasks.values().cloned().collect(),
            callbacks: s.callbacks.values().cloned().collect(),
        })
    }
}

ops::store_via_ops!(MemoryStore);
