//! Test support shared by the workspace-level scenarios and the demo: a
//! transport wrapper that records every frame and decides each one's fate
//! (deliver, drop, duplicate, delay).

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use askpool::{
    AskError, AskIds, CallerEndpoint, CallerId, PoolEndpoint, PoolName, ToCaller, ToWorker,
    WorkerTransport,
};
use parking_lot::Mutex;

/// The kind of a frame, without its payload.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum FrameKind {
    Request,
    Cancel,
    Ack,
    AckBatch,
    Read,
    Reply,
    /// A pool's refusal of an attempt (full, closed, payload mismatch).
    Refused,
    Cancelled,
    Progress,
}

/// What the tap saw of one frame.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FrameInfo {
    pub kind: FrameKind,
    pub ids: AskIds,
    /// The attempt number of a request frame.
    pub attempt: Option<u32>,
    /// For replies: whether the outcome is an error, and its code.
    pub error: Option<askpool::ErrorCode>,
    /// How many asks the frame is about (more than one for a batch).
    pub batch_len: usize,
}

/// What happens to a frame.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Fate {
    Deliver,
    Drop,
    Duplicate,
    Delay(Duration),
}

type Rule = dyn Fn(&FrameInfo) -> Fate + Send + Sync;

/// A frame's record: what it was and what was done with it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Record {
    pub frame: FrameInfo,
    pub fate: Fate,
}

/// Wraps a transport; records every frame and applies a rule to it.
pub struct Tap<M, R> {
    inner: Arc<dyn WorkerTransport<M, R>>,
    rule: Mutex<Arc<Rule>>,
    log: Mutex<Vec<Record>>,
    /// What `hands_over_directly` answers (see `claim_direct`).
    direct: AtomicBool,
}

impl<M, R> Tap<M, R>
where
    M: Clone + Send + 'static,
    R: Clone + Send + 'static,
{
    pub fn new(inner: Arc<dyn WorkerTransport<M, R>>) -> Arc<Self> {
        Arc::new(Self {
            inner,
            rule: Mutex::new(Arc::new(|_: &FrameInfo| Fate::Deliver)),
            log: Mutex::new(Vec::new()),
            direct: AtomicBool::new(false),
        })
    }

    /// Makes the tap say it hands frames over directly, as the in-process
    /// transport it wraps does: a node made on it then answers its own
    /// asks without routing the frames back through the tap, which sees
    /// only requests and cancels: a rule can still drop or delay those,
    /// but has no say over the frames back. Set it before the node's
    /// pools are made (they read it then).
    pub fn claim_direct(&self) {
        self.direct.store(true, Ordering::Relaxed);
    }

    /// A tap over a fresh in-process transport.
    pub fn in_process() -> Arc<Self> {
        Self::new(Arc::new(askpool::InProcessTransport::new()))
    }

    pub fn set_rule(&self, rule: impl Fn(&FrameInfo) -> Fate + Send + Sync + 'static) {
        *self.rule.lock() = Arc::new(rule);
    }

    pub fn records(&self) -> Vec<Record> {
        self.log.lock().clone()
    }

    /// Frames of `kind` that were delivered (duplicates count twice).
    pub fn delivered(&self, kind: FrameKind) -> Vec<FrameInfo> {
        let mut out = Vec::new();
        for r in self.log.lock().iter().filter(|r| r.frame.kind == kind) {
            match r.fate {
                Fate::Deliver | Fate::Delay(_) => out.push(r.frame.clone()),
                Fate::Duplicate => {
                    out.push(r.frame.clone());
                    out.push(r.frame.clone());
                }
                Fate::Drop => {}
            }
        }
        out
    }

    /// Frames of `kind` that were sent, whatever their fate.
    pub fn sent(&self, kind: FrameKind) -> Vec<FrameInfo> {
        self.log
            .lock()
            .iter()
            .filter(|r| r.frame.kind == kind)
            .map(|r| r.frame.clone())
            .collect()
    }

    pub fn clear(&self) {
        self.log.lock().clear();
    }

    /// Does to `frame` what its fate says, sending it on with `send`.
    fn carry<F: Clone + Send + 'static>(
        &self,
        fate: Fate,
        frame: F,
        send: fn(&dyn WorkerTransport<M, R>, F) -> Result<(), AskError>,
    ) -> Result<(), AskError> {
        match fate {
            Fate::Deliver => send(&*self.inner, frame),
            // A dropped frame looks sent to its sender: that is the fault.
            Fate::Drop => Ok(()),
            Fate::Duplicate => {
                send(&*self.inner, frame.clone())?;
                send(&*self.inner, frame)
            }
            Fate::Delay(d) => {
                let inner = Arc::clone(&self.inner);
                tokio::spawn(async move {
                    tokio::time::sleep(d).await;
                    let _ = send(&*inner, frame);
                });
                Ok(())
            }
        }
    }

    fn decide(&self, info: FrameInfo) -> Fate {
        let rule = Arc::clone(&self.rule.lock());
        let fate = rule(&info);
        self.log.lock().push(Record { frame: info, fate });
        fate
    }
}

fn worker_info<M>(frame: &ToWorker<M>) -> FrameInfo {
    match frame {
        ToWorker::Request(env) => FrameInfo {
            kind: FrameKind::Request,
            ids: env.meta.ids,
            attempt: Some(env.meta.attempt),
            error: None,
            batch_len: 1,
        },
        ToWorker::Cancel { ids, .. } => FrameInfo {
            kind: FrameKind::Cancel,
            ids: *ids,
            attempt: None,
            error: None,
            batch_len: 1,
        },
    }
}

fn caller_info<R>(frame: &ToCaller<R>) -> FrameInfo {
    let (kind, error) = match frame {
        ToCaller::Ack { .. } => (FrameKind::Ack, None),
        ToCaller::Read { .. } => (FrameKind::Read, None),
        ToCaller::Reply { outcome, .. } => {
            (FrameKind::Reply, outcome.as_ref().err().map(|e| e.code()))
        }
        ToCaller::Refused { error, .. } => (FrameKind::Refused, Some(error.code())),
        ToCaller::Cancelled { .. } => (FrameKind::Cancelled, None),
        ToCaller::Progress { .. } => (FrameKind::Progress, None),
        ToCaller::AckBatch { .. } => (FrameKind::AckBatch, None),
    };
    FrameInfo {
        kind,
        // A batch is recorded under its first ask; `batch_len` has the rest.
        ids: match frame {
            ToCaller::AckBatch { acks, .. } => acks[0],
            frame => *frame.ids().expect("not a batch"),
        },
        batch_len: match frame {
            ToCaller::AckBatch { acks, .. } => acks.len(),
            _ => 1,
        },
        attempt: None,
        error,
    }
}

impl<M, R> WorkerTransport<M, R> for Tap<M, R>
where
    M: Clone + Send + 'static,
    R: Clone + Send + 'static,
{
    fn register_pool(
        &self,
        pool: PoolName,
        endpoint: Arc<dyn PoolEndpoint<M>>,
    ) -> Result<(), AskError> {
        self.inner.register_pool(pool, endpoint)
    }
    fn deregister_pool(&self, pool: &PoolName) {
        self.inner.deregister_pool(pool)
    }
    fn register_caller(
        &self,
        caller: CallerId,
        endpoint: Arc<dyn CallerEndpoint<R>>,
    ) -> Result<(), AskError> {
        self.inner.register_caller(caller, endpoint)
    }
    fn deregister_caller(&self, caller: CallerId) {
        self.inner.deregister_caller(caller)
    }

    fn send_to_pool(&self, frame: ToWorker<M>) -> Result<(), AskError> {
        let fate = self.decide(worker_info(&frame));
        self.carry(fate, frame, |t, f| t.send_to_pool(f))
    }

    fn send_to_caller(&self, frame: ToCaller<R>) -> Result<(), AskError> {
        let fate = self.decide(caller_info(&frame));
        self.carry(fate, frame, |t, f| t.send_to_caller(f))
    }

    fn hands_over_directly(&self) -> bool {
        self.direct.load(Ordering::Relaxed)
    }
}

/// A current-thread runtime on a paused clock (as `#[tokio::test(start_paused
/// = true)]` makes), for tests that run it inside something else (a local
/// metrics recorder).
pub fn paused_runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .start_paused(true)
        .build()
        .unwrap()
}
