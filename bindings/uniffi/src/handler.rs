//! A pool whose handler is Kotlin: the core's handler loop runs the request
//! future below, which calls the host once and waits for its reply call.

use std::future::Future;
use std::sync::Arc;

use askpool::{AskError, Outcome, RequestContext};
use tokio::sync::oneshot;

use crate::host::HostHandler;
use crate::inflight::{Inflight, RequestGuard, Running};
use crate::payload::Msg;

pub fn bridge(
    inflight: Arc<Inflight>,
    host: Arc<dyn HostHandler>,
) -> impl Fn(Msg, RequestContext) -> std::pin::Pin<Box<dyn Future<Output = Outcome<Msg>> + Send>>
       + Send
       + Sync
       + 'static {
    move |msg, context| {
        let inflight = Arc::clone(&inflight);
        let host = Arc::clone(&host);
        Box::pin(async move { run(&inflight, host.as_ref(), msg, context).await })
    }
}

async fn run(
    inflight: &Inflight,
    host: &dyn HostHandler,
    msg: Msg,
    context: RequestContext,
) -> Outcome<Msg> {
    let token = inflight.request_token();
    let (tx, mut rx) = oneshot::channel();
    let _guard = RequestGuard { inflight, token };
    inflight.requests.insert(
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
