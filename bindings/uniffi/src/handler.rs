//! A pool whose handler is Kotlin: the core's handler loop runs the request
//! future below, which calls the host once and waits for its reply call.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;

use askpool::{AskError, Outcome, RequestContext};
use tokio::sync::oneshot;

use crate::error::Fault;
use crate::host::HostHandler;
use crate::inflight::{request_token, requests, RequestGuard, Running};
use crate::payload::Msg;

type RequestFuture = Pin<Box<dyn Future<Output = Outcome<Msg>> + Send>>;

pub fn bridge(
    host: Arc<dyn HostHandler>,
) -> impl Fn(Msg, RequestContext) -> RequestFuture + Send + Sync + 'static {
    move |msg, context| {
        let host = Arc::clone(&host);
        Box::pin(async move { run(host.as_ref(), msg, context).await })
    }
}

async fn run(host: &dyn HostHandler, msg: Msg, context: RequestContext) -> Outcome<Msg> {
    let token = request_token();
    let (tx, mut rx) = oneshot::channel();
    let _guard = RequestGuard(token);
    requests().insert(
        token,
        Running {
            reply: tx,
            context: context.clone(),
        },
    );
    // The host looks the object up during the call, so the message may go
    // (and its handle be released) right after it.
    match msg {
        Msg::Host(r) => host.handle(token, r.handle()),
        Msg::Bytes(b) => host.handle_bytes(token, b.to_vec()),
    }
    let outcome = tokio::select! {
        biased;
        outcome = &mut rx => outcome,
        () = context.cancelled() => {
            host.cancelled(token);
            rx.await
        }
    };
    outcome.unwrap_or_else(|_| Err(AskError::internal("the host handler ended without a reply")))
}

fn complete(request: i64, outcome: Outcome<Msg>) {
    if let Some((_, running)) = requests().remove(&request) {
        let _ = running.reply.send(outcome);
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

#[uniffi::export]
pub fn request_progress(request: i64, fraction: f32, note: String) {
    if let Some(running) = requests().get(&request) {
        running.context.progress(fraction, note);
    }
}

#[derive(Clone, Debug, uniffi::Record)]
pub struct RequestInfo {
    pub request_id: String,
    pub correlation_id: String,
    pub pool: String,
    pub attempt: u32,
    pub cancelled: bool,
}

#[uniffi::export]
pub fn request_info(request: i64) -> Option<RequestInfo> {
    requests().get(&request).map(|r| {
        let c = &r.context;
        RequestInfo {
            request_id: c.request_id().to_string(),
            correlation_id: c.correlation_id().to_string(),
            pool: c.pool().to_string(),
            attempt: c.attempt(),
            cancelled: c.is_cancelled(),
        }
    })
}

/// Requests handed to host handlers and not answered yet, in every node.
#[uniffi::export]
pub fn requests_in_flight() -> u64 {
    requests().len() as u64
}
