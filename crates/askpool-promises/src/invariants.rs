//! What must hold of a store's contents between operations, whatever
//! crashed when: the checks of the differential and kill-during-write tests.

use std::collections::{BTreeMap, BTreeSet};

use crate::model::{Snapshot, State, TaskKind, TaskState};

/// Every broken invariant of `s`, as text; empty when all hold.
pub fn violations(s: &Snapshot) -> Vec<String> {
    let mut out = Vec::new();
    let promises: BTreeMap<&str, _> = s.promises.iter().map(|p| (p.id.as_str(), p)).collect();
    for p in &s.promises {
        let settled = p.state.is_settled();
        if settled != p.settled_at.is_some() {
            out.push(format!(
                "promise {:?}: state {} but settled_at {:?}",
                p.id, p.state, p.settled_at
            ));
        }
        if p.state == State::Pending && (p.value.is_some() || p.complete_key.is_some()) {
            out.push(format!(
                "promise {:?}: pending with a value or complete key",
                p.id
            ));
        }
    }
    let mut invoked = BTreeSet::new();
    let mut resumes = BTreeSet::new();
    for t in &s.tasks {
        let Some(p) = promises.get(t.promise_id.as_str()) else {
            out.push(format!("task {}: unknown promise {:?}", t.id, t.promise_id));
            continue;
        };
        match t.kind {
            TaskKind::Invoke => {
                if p.state.is_settled() {
                    out.push(format!(
                        "task {}: invoke task of settled promise {:?}",
                        t.id, p.id
                    ));
                }
                if !invoked.insert(&t.promise_id) {
                    out.push(format!("promise {:?}: two invoke tasks", p.id));
                }
            }
            TaskKind::Resume => {
                if !p.state.is_settled() {
                    out.push(format!(
                        "task {}: resume task for pending promise {:?}",
                        t.id, p.id
                    ));
                }
                let awaiter = t.awaiter.as_deref().unwrap_or_default();
                match promises.get(awaiter) {
                    None => out.push(format!("task {}: unknown awaiter {awaiter:?}", t.id)),
                    Some(a) if t.state == TaskState::Waiting => {
                        if a.state.is_settled() || t.epoch != a.resume_epoch + 1 {
                            out.push(format!(
                                "task {}: waiting for epoch {} of {awaiter:?} ({}, epoch {})",
                                t.id, t.epoch, a.state, a.resume_epoch
                            ));
                        }
                    }
                    Some(a) if a.state.is_settled() && t.state != TaskState::Claimed => {
                        out.push(format!(
                            "task {}: unclaimed resume of settled awaiter {awaiter:?}",
                            t.id
                        ));
                    }
                    Some(_) => {}
                }
                if !resumes.insert((awaiter, t.epoch)) {
                    out.push(format!(
                        "awaiter {awaiter:?}: two resume tasks for epoch {}",
                        t.epoch
                    ));
                }
            }
        }
        if (t.state == TaskState::Claimed) != t.lease_owner.is_some() {
            out.push(format!(
                "task {}: {:?} with lease owner {:?}",
                t.id, t.state, t.lease_owner
            ));
        }
    }
    for c in &s.callbacks {
        match promises.get(c.awaited.as_str()) {
            Some(p) if p.state.is_settled() => {
                out.push(format!("callback {}: on settled promise {:?}", c.id, p.id))
            }
            None => out.push(format!(
                "callback {}: unknown promise {:?}",
                c.id, c.awaited
            )),
            Some(_) => {}
        }
        match promises.get(c.awaiter.as_str()) {
            None => out.push(format!(
                "callback {}: unknown awaiter {:?}",
                c.id, c.awaiter
            )),
            Some(a) if a.state.is_settled() || c.epoch < a.resume_epoch => out.push(format!(
                "callback {}: of an ended suspension of {:?} (epoch {} of {}, {})",
                c.id, c.awaiter, c.epoch, a.resume_epoch, a.state
            )),
            Some(_) => {}
        }
    }
    out
}
