//! Durable promises and durable asks (askpool-promises) on a SQLite file.
//! Payloads are bytes here; the wrapper encodes them (JSON).

use askpool::{AskError, RequestId};
use askpool_promises::{
    now_millis, CompleteRequest, Completion, CreateRequest, DurableAsk, DurablePromises, Promise,
    SqliteStore, State,
};
use napi::bindgen_prelude::*;
use napi_derive::napi;

use crate::core::{Core, Task};
use crate::errors;
use crate::tok::Tok;

#[napi(object)]
pub struct PromiseInfo {
    pub id: String,
    /// `PENDING`, `RESOLVED`, `REJECTED`, `CANCELED` or `TIMED_OUT`.
    pub state: String,
    pub param: Buffer,
    pub value: Option<Buffer>,
    pub timeout_at: f64,
    pub created_at: f64,
    pub settled_at: Option<f64>,
}

impl From<Promise> for PromiseInfo {
    fn from(p: Promise) -> Self {
        Self {
            state: match p.state {
                State::TimedOut => "TIMED_OUT".to_owned(),
                state => state.as_str().to_uppercase(),
            },
            param: p.param.into(),
            value: p.value.map(Buffer::from),
            timeout_at: p.timeout_at as f64,
            created_at: p.created_at as f64,
            settled_at: p.settled_at.map(|t| t as f64),
            id: p.id,
        }
    }
}

fn promise_error(e: askpool_promises::PromiseError) -> napi::Error {
    errors::throw(AskError::from(e))
}

impl Core {
    /// The store: `UNAVAILABLE` once the node is closed, for promises as for
    /// durable asks (a closed node's `promises` must not go on writing a
    /// file another node may have opened since).
    fn promises(&self) -> Result<&DurablePromises> {
        self.refuse_when_closed()?;
        self.promises.as_ref().ok_or_else(|| {
            errors::throw(AskError::FailedPrecondition {
                message: "no promise store: call openPromises(path) first".into(),
            })
        })
    }
}

#[napi]
impl Core {
    /// Opens (or creates) the SQLite promise store at `path`;
    /// `UNAVAILABLE` (and no file made) once the node is closed.
    #[napi(catch_unwind)]
    pub fn open_promises(&mut self, path: String, timeout_ms: Option<f64>) -> Result<()> {
        self.refuse_when_closed()?;
        let timeout = crate::core::opt_millis("timeoutMs", timeout_ms)?;
        if let (Some(t), Some(ms)) = (timeout, timeout_ms) {
            if t < DurablePromises::MIN_TIMEOUT {
                return Err(errors::invalid(format!(
                    "timeoutMs must be at least 1 millisecond, got {}",
                    crate::core::js_number(ms)
                )));
            }
        }
        let store = SqliteStore::open(&path).map_err(promise_error)?;
        let mut promises = DurablePromises::new(store);
        if let Some(t) = timeout {
            promises.timeout = t;
        }
        self.promises = Some(promises);
        Ok(())
    }

    /// A durable ask of the object in slot `msg`, stored as `bytes`, under
    /// promise id `id` (32 hex digits) or a fresh one; returns the task.
    #[napi(catch_unwind)]
    pub fn ask_durable(
        &mut self,
        pool: String,
        msg: u32,
        bytes: Buffer,
        id: Option<String>,
    ) -> Result<u32> {
        let msg = Tok::with_bytes(msg, &self.freed, bytes.to_vec());
        self.refuse_when_closed()?;
        let handle = {
            let _enter = self.rt.enter();
            let promises = self.promises()?;
            match id {
                Some(id) => {
                    let id: RequestId = id.parse().map_err(|_| {
                        errors::invalid(format!("a durable ask id is 32 hex digits, got {id:?}"))
                    })?;
                    self.node.ask_durable_with_id(promises, id, &pool, msg)
                }
                None => self.node.ask_durable(promises, &pool, msg),
            }
            .map_err(errors::throw)?
        };
        Ok(self.spawn(Task::Durable(handle)))
    }

    /// The outcome of durable ask `id`: stored if it settled, else asked again.
    #[napi(catch_unwind)]
    pub fn await_durable(&mut self, id: String) -> Result<u32> {
        self.refuse_when_closed()?;
        let handle = {
            let _enter = self.rt.enter();
            let promises = self.promises()?;
            DurableAsk::<Tok, Tok>::await_durable(&self.node, promises, &id)
                .map_err(errors::throw)?
        };
        Ok(self.spawn(Task::Durable(handle)))
    }

    /// Creates a promise (idempotent under `key`).
    #[napi(catch_unwind)]
    pub fn promise_create(
        &self,
        id: String,
        timeout_ms: f64,
        param: Buffer,
        key: Option<String>,
    ) -> Result<PromiseInfo> {
        let now = now_millis();
        let timeout = crate::core::opt_millis("timeoutMs", Some(timeout_ms))?.unwrap_or_default();
        let mut req = CreateRequest::new(id, now.saturating_add(timeout.as_millis() as u64))
            .param(param.to_vec());
        if let Some(key) = key {
            req = req.key(key);
        }
        let created = self
            .promises()?
            .store()
            .create(&req, now)
            .map_err(promise_error)?;
        Ok(created.promise.into())
    }

    #[napi(catch_unwind)]
    pub fn promise_get(&self, id: String) -> Result<PromiseInfo> {
        let promise = self
            .promises()?
            .store()
            .get(&id, now_millis())
            .map_err(promise_error)?;
        Ok(promise.into())
    }

    /// Settles a promise: `how` is `resolve`, `reject` or `cancel`.
    #[napi(catch_unwind)]
    pub fn promise_complete(
        &self,
        id: String,
        how: String,
        value: Option<Buffer>,
        key: Option<String>,
    ) -> Result<PromiseInfo> {
        let completion = match how.as_str() {
            "resolve" => Completion::Resolve,
            "reject" => Completion::Reject,
            "cancel" => Completion::Cancel,
            other => return Err(errors::invalid(format!("unknown completion {other:?}"))),
        };
        let mut req = CompleteRequest::new(id, completion);
        if let Some(value) = value {
            req = req.value(value.to_vec());
        }
        if let Some(key) = key {
            req = req.key(key);
        }
        let completed = self
            .promises()?
            .store()
            .complete(&req, now_millis())
            .map_err(promise_error)?;
        Ok(completed.promise.into())
    }

    /// Deletes the promises settled more than `older_than_ms` ago, after
    /// timing out the expired pending ones; returns how many.
    #[napi(catch_unwind)]
    pub fn promise_prune(&self, older_than_ms: f64) -> Result<f64> {
        let older_than =
            crate::core::opt_millis("olderThanMs", Some(older_than_ms))?.unwrap_or_default();
        let pruned = self.promises()?.prune(older_than).map_err(promise_error)?;
        Ok(pruned as f64)
    }
}
