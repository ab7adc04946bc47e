//! The caller's side: asks, tells, cancellation, stage streams, the DLQ.

use std::future::Future;
use std::pin::Pin;
use std::str::FromStr;
use std::task::{Context, Poll, Waker};

use askpool::{
    AskError, CancelReason, PayloadFingerprint, Replay, RequestId, RetryPolicy, WorkerId,
};
use napi::bindgen_prelude::*;
use napi_derive::napi;

use crate::core::{byte_count, opt_timeout, whole, Core, Task};
use crate::errors;
use crate::info::{AskOptions, DeadLetterInfo};

fn parse_id<T: FromStr>(what: &str, text: &str) -> Result<T> {
    text.parse()
        .map_err(|_| errors::invalid(format!("{what} must be 32 hex digits, got {text:?}")))
}

fn opt_id<T: FromStr>(what: &str, text: Option<&str>) -> Result<Option<T>> {
    text.map(|t| parse_id(what, t)).transpose()
}

/// The core's fingerprint of the bytes (a string's UTF-8) the caller gave.
fn fingerprint(given: &Either<String, Uint8Array>) -> PayloadFingerprint {
    match given {
        Either::A(text) => askpool_dedup::fingerprint(text.as_bytes()),
        Either::B(bytes) => askpool_dedup::fingerprint(bytes),
    }
}

/// The byte length of a byte payload, as the wrapper measured it.
fn payload_size(size: Option<f64>) -> Result<Option<usize>> {
    size.map(|n| byte_count("payloadSize", n)).transpose()
}

fn retry(max_attempts: Option<f64>) -> Result<Option<RetryPolicy>> {
    max_attempts
        .map(|n| {
            Ok(RetryPolicy {
                max_attempts: whole("maxAttempts", n, 1, u32::MAX)?,
                ..RetryPolicy::default()
            })
        })
        .transpose()
}

#[napi]
impl Core {
    /// Asks `pool` with the object in table slot `msg`; returns the task id
    /// its outcome is reported under. `timeout_ms` 0 means the node's default.
    #[napi(catch_unwind)]
    pub fn ask(&mut self, pool: u32, msg: u32, timeout_ms: f64) -> Result<u32> {
        let msg = self.tok(msg);
        let pool = self.pool_name(pool)?;
        let timeout = opt_timeout("timeoutMs", Some(timeout_ms).filter(|&t| t != 0.0))?;
        let handle = {
            let _enter = self.rt.enter();
            let mut ask = self.node.ask(pool, msg);
            if let Some(t) = timeout {
                ask = ask.timeout(t);
            }
            ask.send()
        };
        Ok(self.spawn(Task::Ask(handle)))
    }

    /// An ask with every option.
    #[napi(catch_unwind)]
    pub fn ask_with(&mut self, pool: u32, msg: u32, options: AskOptions) -> Result<u32> {
        let msg = self.tok(msg);
        let pool = self.pool_name(pool)?;
        let options = parse_options(options)?;
        let handle = {
            let _enter = self.rt.enter();
            self.node.ask(pool, msg).options(options).send()
        };
        Ok(self.spawn(Task::Ask(handle)))
    }

    /// A one-way message; its task reports `TELL_OK` once the pool took it.
    #[napi(catch_unwind)]
    pub fn tell(&mut self, pool: u32, msg: u32, options: Option<AskOptions>) -> Result<u32> {
        let msg = self.tok(msg);
        let pool = self.pool_name(pool)?;
        let options = options.map(parse_options).transpose()?.unwrap_or_default();
        let handle = {
            let _enter = self.rt.enter();
            self.node.tell(pool, msg).options(options).send()
        };
        Ok(self.spawn(Task::Tell(handle)))
    }

    /// The request id of a running ask or tell.
    #[napi(catch_unwind)]
    pub fn request_id(&mut self, task: u32) -> Result<String> {
        match self.task_mut(task) {
            Some(Task::Ask(h)) => Ok(h.request_id().to_string()),
            Some(Task::Tell(h)) => Ok(h.request_id().to_string()),
            Some(Task::Durable(h)) => Ok(h.id().to_owned()),
            _ => Err(errors::invalid(format!("task {task} is not a running ask"))),
        }
    }

    /// The correlation id of a running ask or tell.
    #[napi(catch_unwind)]
    pub fn correlation_id(&mut self, task: u32) -> Result<String> {
        match self.task_mut(task) {
            Some(Task::Ask(h)) => Ok(h.ids().correlation_id.to_string()),
            Some(Task::Tell(h)) => Ok(h.ids().correlation_id.to_string()),
            _ => Err(errors::invalid(format!("task {task} is not a running ask"))),
        }
    }

    /// Cancels a running ask or tell (a protocol cancel goes to the pool);
    /// it ends with `ASK_CANCELLED` at the next drain, or with its outcome
    /// if that had arrived (a reply, a tell's acceptance). Nothing if it
    /// already ended.
    #[napi(catch_unwind)]
    pub fn cancel(&mut self, task: u32) {
        let _enter = self.rt.enter();
        let Some(slot) = self.task_mut(task) else {
            return;
        };
        match slot {
            Task::Ask(h) => h.cancel(),
            Task::Tell(h) => {
                // A tell the pool took (its Ack arrived, not drained yet)
                // still resolves, as an ask whose reply arrived does; else
                // it ends cancelled. `cancel` runs no re-send that came due
                // (a poll would, and could have the tell accepted now).
                h.cancel();
                let polled = Pin::new(h).poll(&mut Context::from_waker(Waker::noop()));
                let outcome = match polled {
                    Poll::Ready(result) => result.map(drop),
                    Poll::Pending => Err(AskError::AskCancelled {
                        reason: CancelReason::Caller,
                    }),
                };
                *slot = Task::TellEnded(outcome);
            }
            _ => return,
        }
        self.wake_task(task);
    }

    /// Opens the stage stream of a running ask (or durable ask); returns
    /// its stream id, or null for a running tell (a dead tell's replay),
    /// which has none: its stages end at the pool's acceptance, with no
    /// terminal one.
    #[napi(catch_unwind)]
    pub fn open_stages(&mut self, task: u32) -> Result<Option<u32>> {
        let stream = match self.task_mut(task) {
            Some(Task::Ask(h)) => h.stages(),
            Some(Task::Durable(h)) => h.stages(),
            Some(Task::Tell(_)) => return Ok(None),
            _ => return Err(errors::invalid(format!("task {task} is not a running ask"))),
        };
        Ok(Some(self.streams.insert(stream)))
    }

    /// Reads the next stage event of `stream` (reported as `STAGE` or
    /// `STAGE_END`, after which the stream is gone). One read at a time.
    #[napi(catch_unwind)]
    pub fn next_stage(&mut self, stream: u32) {
        let task = self.spawn(Task::Stage { stream });
        if let Some(s) = self.streams.get_mut(stream) {
            s.reader = Some(task);
        }
    }

    /// Closes a stream nobody will read to its end. A read of it still
    /// pending ends (`STAGE_END`) at the next drain.
    #[napi(catch_unwind)]
    pub fn drop_stream(&mut self, stream: u32) {
        if let Some(reader) = self.streams.remove(stream).and_then(|s| s.reader) {
            self.wake_task(reader);
        }
    }

    /// The dead letters, oldest first.
    #[napi(catch_unwind)]
    pub fn dead_letters(&self) -> Vec<DeadLetterInfo> {
        self.node
            .dead_letters()
            .iter()
            .map(DeadLetterInfo::from)
            .collect()
    }

    /// Sends a dead letter again with its ids, as what it was (an ask's
    /// task reports its reply, a tell's `TELL_OK`); returns the new task
    /// id. The replay of a durable ask's letter records its outcome in the
    /// ask's promise (the core's replay hook).
    #[napi(catch_unwind)]
    pub fn replay_dead_letter(&mut self, request_id: String) -> Result<u32> {
        // The core would look for the letter and answer FAILED_PRECONDITION
        // (or send the replay nowhere); a closed node asks nothing.
        self.refuse_when_closed()?;
        let id: RequestId = parse_id("requestId", &request_id)?;
        let handle = {
            let _enter = self.rt.enter();
            self.node
                .replay_dead_letter_as_sent(id)
                .map_err(errors::throw)?
        };
        Ok(self.spawn(match handle {
            Replay::Ask(h) => Task::Ask(h),
            Replay::Tell(h) => Task::Tell(h),
        }))
    }

    #[napi(catch_unwind)]
    pub fn purge_dead_letters(&self) -> u32 {
        self.node.purge_dead_letters() as u32
    }
}

/// The options of an ask or tell, checked and converted (one place for both).
fn parse_options(options: AskOptions) -> Result<askpool::AskOptions> {
    Ok(askpool::AskOptions {
        timeout: opt_timeout("timeoutMs", options.timeout_ms)?,
        preferred_worker: options.preferred_worker.map(WorkerId::from),
        request_id: opt_id("requestId", options.request_id.as_deref())?,
        correlation_id: opt_id("correlationId", options.correlation_id.as_deref())?,
        causation_id: opt_id("causationId", options.causation_id.as_deref())?,
        retry: retry(options.max_attempts)?,
        fingerprint: options.fingerprint.as_ref().map(fingerprint),
        payload_size: payload_size(options.payload_size)?,
    })
}
