//! The worker's side: pools whose handler is a JS function.

use askpool::{AskError, DedupConfig, PoolConfig};
use napi::bindgen_prelude::*;
use napi_derive::napi;

use crate::core::{js_number, opt_millis, opt_timeout, whole, Core, HostedPool, Task};

/// Most workers a pool may have (the core's bound too).
const MAX_CONCURRENCY: u32 = 65_536;
use crate::errors;
use crate::info::{self, PoolOptions, RequestInfo};

#[napi]
impl Core {
    /// Declares a pool hosted by this node; returns its id. Requests queue
    /// (up to `maxInFlight`) until `handle` starts its workers.
    #[napi(catch_unwind)]
    pub fn create_pool(
        &mut self,
        env: Env,
        name: String,
        options: Option<PoolOptions>,
    ) -> Result<u32> {
        let mut config = PoolConfig::default();
        let mut dedup = DedupConfig::default();
        if let Some(o) = options {
            if let Some(n) = o.concurrency {
                config.concurrency = whole("concurrency", n, 1, MAX_CONCURRENCY)? as usize;
            }
            if let Some(n) = o.max_in_flight {
                config.max_in_flight = whole("maxInFlight", n, 1, u32::MAX)? as usize;
            }
            if let Some(n) = o.dedup_max {
                dedup.max_terminal = whole("dedupMax", n, 1, u32::MAX)? as usize;
            }
            if let Some(t) = opt_millis("dedupTtlMs", o.dedup_ttl_ms)? {
                dedup.terminal_ttl = t;
            }
            config.processing_timeout =
                opt_timeout("processingTimeoutMs", o.processing_timeout_ms)?;
        }
        config.dedup = dedup;
        let concurrency = u32::try_from(config.concurrency).unwrap_or(u32::MAX);
        let pool = {
            let _enter = self.rt.enter();
            self.node
                .pool(name)
                .config(config)
                .build()
                .map_err(errors::throw)?
        };
        // Told to V8 (given back when this object is finalized): see
        // `Core::external_bytes`.
        let bytes = i64::try_from(dedup.upfront_bytes()).unwrap_or(i64::MAX);
        if env.adjust_external_memory(bytes).is_ok() {
            self.external_bytes = self.external_bytes.saturating_add(bytes);
        }
        Ok(self.pools.insert_with(|_| HostedPool {
            pool,
            concurrency,
            handled: false,
        }))
    }

    /// Starts the pool's workers (`w0`, `w1`, ...): each takes one request
    /// at a time and reports it as a `REQUEST` event.
    #[napi(catch_unwind)]
    pub fn handle(&mut self, pool: u32) -> Result<()> {
        let hosted = self
            .pools
            .get_mut(pool)
            .ok_or_else(|| errors::invalid(format!("unknown pool {pool}")))?;
        if hosted.handled {
            // A state error, not a bad argument: the same handler is refused
            // by Python and Kotlin as FAILED_PRECONDITION.
            return Err(errors::throw(AskError::FailedPrecondition {
                message: format!("pool {} already has a handler", hosted.pool.name()),
            }));
        }
        hosted.handled = true;
        let workers = (0..hosted.concurrency)
            .map(|i| hosted.pool.worker(format!("w{i}")))
            .collect::<std::result::Result<Vec<_>, _>>()
            .map_err(errors::throw)?;
        for worker in workers {
            self.pull(pool, worker);
        }
        Ok(())
    }

    /// Closes a pool: new asks get `NO_ROUTE`, queued ones are cancelled.
    #[napi(catch_unwind)]
    pub fn close_pool(&mut self, pool: u32) {
        let _enter = self.rt.enter();
        if let Some(hosted) = self.pools.remove(pool) {
            hosted.pool.close();
        }
    }

    /// Answers a request with the object in table slot `reply`.
    #[napi(catch_unwind)]
    pub fn reply(&mut self, request: u32, reply: u32) -> Result<()> {
        let reply = self.tok(reply);
        let h = self.finish(request)?;
        h.responder.reply(reply);
        self.pull(h.pool, h.worker);
        Ok(())
    }

    /// Answers a durable request: the object in slot `reply`, stored as `bytes`.
    #[napi(catch_unwind)]
    pub fn reply_bytes(&mut self, request: u32, reply: u32, bytes: Buffer) -> Result<()> {
        let reply = crate::tok::Tok::with_bytes(reply, &self.freed, bytes.to_vec());
        let h = self.finish(request)?;
        h.responder.reply(reply);
        self.pull(h.pool, h.worker);
        Ok(())
    }

    /// `reply`, then `drain`: one call where a reply resolves an ask.
    #[napi(catch_unwind)]
    pub fn reply_drain(
        &mut self,
        request: u32,
        reply: u32,
        mut buf: Uint32ArraySlice,
    ) -> Result<u32> {
        self.reply(request, reply)?;
        // SAFETY: as in `drain`.
        Ok(self.drain_into(unsafe { buf.as_mut() }))
    }

    /// Fails a request with what the handler threw: `code` if it threw an
    /// `AskError`, else `HANDLER_FAILED` with the thrown value's name.
    #[napi(catch_unwind)]
    pub fn fail(
        &mut self,
        request: u32,
        code: Option<String>,
        name: String,
        message: String,
    ) -> Result<()> {
        let h = self.finish(request)?;
        h.responder
            .fail(errors::from_handler(code.as_deref(), name, message));
        self.pull(h.pool, h.worker);
        Ok(())
    }

    /// The handler gave up on its request's cancel (it threw what its
    /// `ctx.signal` carried): the caller gets `ASK_CANCELLED` (the worker's
    /// cancel), as a Python handler's `CancelledError` and a Kotlin
    /// handler's `CancellationException` give.
    #[napi(catch_unwind)]
    pub fn give_up(&mut self, request: u32) -> Result<()> {
        let h = self.finish(request)?;
        h.responder.cancel();
        self.pull(h.pool, h.worker);
        Ok(())
    }

    #[napi(catch_unwind)]
    pub fn request_info(&self, request: u32) -> Result<RequestInfo> {
        let h = self.handling(request)?;
        let ids = h.context.ids();
        Ok(info::request_info(
            ids,
            h.context.pool().as_str(),
            h.context.attempt(),
            h.worker.id().as_str(),
        ))
    }

    /// Whether the request was cancelled (by its caller, a timeout, the pool).
    #[napi(catch_unwind)]
    pub fn is_cancelled(&self, request: u32) -> Result<bool> {
        Ok(self.handling(request)?.context.is_cancelled())
    }

    /// Reports progress to the caller (its `PARTIAL` stage).
    #[napi(catch_unwind)]
    pub fn progress(&self, request: u32, fraction: f64, note: String) -> Result<()> {
        // NaN and the infinities say nothing and are refused, as in Python
        // and Kotlin; the core clamps the rest to 0..1 (a done/total a
        // rounding past 1).
        if !fraction.is_finite() {
            return Err(errors::invalid(format!(
                "progress must be a fraction from 0 to 1, got {}",
                js_number(fraction)
            )));
        }
        self.handling(request)?
            .context
            .progress(fraction as f32, note)
            .map_err(errors::throw)
    }

    /// Reports a `CANCELLED` event if the request is cancelled while handled.
    #[napi(catch_unwind)]
    pub fn watch_cancel(&mut self, request: u32) -> Result<()> {
        let h = self.handling(request)?;
        if h.watch.is_some() {
            return Ok(());
        }
        let context = h.context.clone();
        let fut = Box::pin(async move { context.cancelled().await });
        let task = self.spawn(Task::CancelWatch { request, fut });
        if let Some(h) = self.requests.get_mut(request) {
            h.watch = Some(task);
        }
        Ok(())
    }
}

impl Core {
    fn handling(&self, request: u32) -> Result<&crate::core::Handling> {
        self.requests
            .get(request)
            .ok_or_else(|| errors::invalid(format!("request {request} was already answered")))
    }

    /// Takes a handled request out, with its cancel watch.
    fn finish(&mut self, request: u32) -> Result<crate::core::Handling> {
        let h = self
            .requests
            .remove(request)
            .ok_or_else(|| errors::invalid(format!("request {request} was already answered")))?;
        if let Some(task) = h.watch {
            self.remove_task(task);
        }
        Ok(h)
    }
}
