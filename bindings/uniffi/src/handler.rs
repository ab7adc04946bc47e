//! A pool whose handler is Kotlin, on the runtime's pull API: each of the
//! pool's workers takes a request, hands it to the host (an event, or a
//! callback for bytes) and waits until the host has answered before taking
//! the next. The host's reply completes the request's responder on the
//! host's own thread, so the reply goes to the caller without waiting for a
//! runtime thread to wake up.

use std::panic::AssertUnwindSafe;
use std::sync::Arc;

use askpool::{AskError, Outcome, Request, Worker, WorkerPool};
use futures::FutureExt;
use tokio::sync::oneshot;

use crate::error::{Failure, Fault};
use crate::events;
use crate::host::HostHandler;
use crate::inflight::{
    enter_request, read_request, requests_len, take_request, RequestGuard, Running,
};
use crate::payload::Msg;

/// Starts `concurrency` workers (`w0`, `w1`, ...) on `pool`. `host_id`
/// names the pool on the JVM side, for requests sent as events.
pub fn serve(
    pool: &WorkerPool<Msg, Msg>,
    concurrency: usize,
    host: Arc<dyn HostHandler>,
    host_id: i64,
) -> Result<(), AskError> {
    for i in 0..concurrency {
        let worker = pool.worker(format!("w{i}"))?;
        crate::exec::spawn(work(worker, Arc::clone(&host), host_id));
    }
    Ok(())
}

async fn work(worker: Worker<Msg, Msg>, host: Arc<dyn HostHandler>, host_id: i64) {
    while let Some(request) = worker.next_request().await {
        // A panic (a host callback that threw) fails this request only:
        // its responder, dropped unanswered, reports `Internal`.
        let one = AssertUnwindSafe(run(host.as_ref(), host_id, request));
        let _ = one.catch_unwind().await;
    }
}

async fn run(host: &dyn HostHandler, host_id: i64, request: Request<Msg, Msg>) {
    let Request {
        message,
        context,
        responder,
    } = request;
    let (done_tx, mut done_rx) = oneshot::channel();
    let token = enter_request(Running {
        responder,
        done: done_tx,
        context: context.clone(),
        _message: message.clone(),
    });
    let _guard = RequestGuard(token);
    match message {
        Msg::Host(r) => events::push_unheld(events::HANDLE, host_id, token, r.handle()),
        Msg::Bytes(b) => host.handle_bytes(token, b.to_vec()),
    }
    tokio::select! {
        biased;
        _ = &mut done_rx => {}
        // The request's own cancel only: the host interrupts its handler
        // (Kotlin cancels the coroutine), and a pool's close must not, as
        // the reply of a handler still running then reaches its caller.
        () = context.request_cancelled() => {
            host.cancelled(token);
            let _ = done_rx.await;
        }
    }
}

fn complete(request: i64, outcome: Outcome<Msg>) {
    if let Some(running) = take_request(request) {
        running.responder.complete(outcome);
        let _ = running.done.send(());
    }
}

/// Replies to a running request with a host object.
#[uniffi::export]
pub fn request_reply(request: i64, handle: i64) {
    complete(request, Ok(Msg::host(handle)));
}

#[uniffi::export]
pub fn request_reply_bytes(request: i64, data: Vec<u8>) {
    complete(request, Ok(Msg::Bytes(data.into())));
}

/// Fails a running request; `HandlerFailed` carries the exception's class.
#[uniffi::export]
pub fn request_fail(request: i64, fault: Fault) {
    complete(request, Err(AskError::from(fault)));
}

/// What a handler's `AskException` (class `type_name`, saying `message`)
/// becomes for its caller: the mapping every binding shares
/// (`AskError::from_handler`). An error that is just a message keeps its
/// code and fields; any other is `HandlerFailed` with the class and message.
#[uniffi::export]
pub fn handler_fault(fault: Fault, type_name: String, message: String) -> Fault {
    let error = AskError::from(fault.clone());
    if error.code().kept_from_handler() {
        fault
    } else {
        Fault::HandlerFailed { type_name, message }
    }
}

/// Reports progress; the refusal (`InvalidArgument`: NaN, or past the
/// bounds of a report) if any. Nothing for a request no longer handled.
#[uniffi::export]
pub fn request_progress(request: i64, fraction: f32, note: String) -> Option<Failure> {
    // Reported outside the shard's lock.
    let context = read_request(request, |r| r.context.clone())?;
    context
        .progress(fraction, note)
        .err()
        .map(|e| Failure::from(&e))
}

#[derive(Clone, Debug, uniffi::Record)]
pub struct RequestInfo {
    pub request_id: String,
    pub correlation_id: String,
    /// Empty when the ask carried none.
    pub causation_id: String,
    pub pool: String,
    pub attempt: u32,
    pub cancelled: bool,
}

#[uniffi::export]
pub fn request_info(request: i64) -> Option<RequestInfo> {
    read_request(request, |r| {
        let c = &r.context;
        RequestInfo {
            request_id: c.request_id().to_string(),
            correlation_id: c.correlation_id().to_string(),
            causation_id: c
                .ids()
                .causation_id
                .map(|id| id.to_string())
                .unwrap_or_default(),
            pool: c.pool().to_string(),
            attempt: c.attempt(),
            cancelled: c.is_cancelled(),
        }
    })
}

/// Requests handed to host handlers and not answered yet, in every node.
#[uniffi::export]
pub fn requests_in_flight() -> u64 {
    requests_len() as u64
}
