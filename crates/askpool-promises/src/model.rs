//! The records a store keeps (promises, tasks, callbacks) and the requests
//! and responses of its operations. Ids are plain strings and payloads plain
//! bytes so that bindings wrap them without conversions of their own.

use std::collections::BTreeMap;
use std::fmt;
use std::str::FromStr;

use crate::error::PromiseError;

/// Milliseconds; production callers pass Unix-epoch milliseconds, tests
/// pass whatever their fake clock says. Every operation takes `now`.
pub type Millis = u64;

/// Largest time a store keeps (SQLite integers are signed); later times,
/// such as `u64::MAX` for "never", are clamped to it.
pub const MAX_TIME: Millis = i64::MAX as u64;

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum State {
    Pending,
    Resolved,
    Rejected,
    Canceled,
    TimedOut,
}

impl State {
    pub const ALL: [State; 5] = [
        State::Pending,
        State::Resolved,
        State::Rejected,
        State::Canceled,
        State::TimedOut,
    ];

    pub fn is_settled(self) -> bool {
        self != State::Pending
    }

    pub fn as_str(self) -> &'static str {
        match self {
            State::Pending => "pending",
            State::Resolved => "resolved",
            State::Rejected => "rejected",
            State::Canceled => "canceled",
            State::TimedOut => "timedout",
        }
    }

    pub(crate) fn code(self) -> i64 {
        self as i64
    }

    pub(crate) fn from_code(code: i64) -> Option<Self> {
        Self::ALL.get(usize::try_from(code).ok()?).copied()
    }
}

impl fmt::Display for State {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl FromStr for State {
    type Err = PromiseError;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Self::ALL
            .into_iter()
            .find(|st| st.as_str().eq_ignore_ascii_case(s) || (s == "timed_out" && *st == State::TimedOut))
            .ok_or_else(|| PromiseError::invalid(format!(
                "unknown promise state {s:?} (expected pending, resolved, rejected, canceled or timedout)"
            )))
    }
}

/// A durable promise.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Promise {
    pub id: String,
    pub state: State,
    pub param: Vec<u8>,
    /// The settlement's payload; `None` while pending and after a timeout.
    pub value: Option<Vec<u8>>,
    /// The promise times out when `now >= timeout_at`.
    pub timeout_at: Millis,
    pub create_key: Option<String>,
    pub complete_key: Option<String>,
    /// Whether duplicates must match the state too (see `rules`).
    pub strict: bool,
    pub tags: BTreeMap<String, String>,
    pub created_at: Millis,
    /// When it settled; a timed-out promise settled at its `timeout_at`.
    pub settled_at: Option<Millis>,
    /// Counts how often this promise, as an awaiter, has been resumed: the
    /// suspension a callback belongs to.
    pub resume_epoch: u64,
}

/// Where a new promise's invoke task goes: a pool (process group) and
/// optionally the worker it prefers.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Target {
    pub pool: String,
    pub preferred_worker: Option<String>,
}

impl Target {
    pub fn pool(pool: impl Into<String>) -> Self {
        Self {
            pool: pool.into(),
            preferred_worker: None,
        }
    }
    pub fn prefer(mut self, worker: impl Into<String>) -> Self {
        self.preferred_worker = Some(worker.into());
        self
    }
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CreateRequest {
    pub id: String,
    pub param: Vec<u8>,
    pub timeout_at: Millis,
    pub key: Option<String>,
    pub strict: bool,
    pub tags: BTreeMap<String, String>,
    /// Enqueue an invoke task to this pool.
    pub target: Option<Target>,
}

impl CreateRequest {
    pub fn new(id: impl Into<String>, timeout_at: Millis) -> Self {
        Self {
            id: id.into(),
            param: Vec::new(),
            timeout_at,
            key: None,
            strict: false,
            tags: BTreeMap::new(),
            target: None,
        }
    }
    pub fn param(mut self, param: impl Into<Vec<u8>>) -> Self {
        self.param = param.into();
        self
    }
    pub fn key(mut self, key: impl Into<String>) -> Self {
        self.key = Some(key.into());
        self
    }
    pub fn strict(mut self, strict: bool) -> Self {
        self.strict = strict;
        self
    }
    pub fn tag(mut self, k: impl Into<String>, v: impl Into<String>) -> Self {
        self.tags.insert(k.into(), v.into());
        self
    }
    pub fn target(mut self, target: Target) -> Self {
        self.target = Some(target);
        self
    }
}

/// How a promise is completed from outside (a timeout is the store's doing).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Completion {
    Resolve,
    Reject,
    Cancel,
}

impl Completion {
    pub const ALL: [Completion; 3] = [Completion::Resolve, Completion::Reject, Completion::Cancel];

    pub fn state(self) -> State {
        match self {
            Completion::Resolve => State::Resolved,
            Completion::Reject => State::Rejected,
            Completion::Cancel => State::Canceled,
        }
    }
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CompleteRequest {
    pub id: String,
    pub completion: Completion,
    pub value: Vec<u8>,
    pub key: Option<String>,
}

impl CompleteRequest {
    pub fn new(id: impl Into<String>, completion: Completion) -> Self {
        Self {
            id: id.into(),
            completion,
            value: Vec::new(),
            key: None,
        }
    }
    pub fn value(mut self, value: impl Into<Vec<u8>>) -> Self {
        self.value = value.into();
        self
    }
    pub fn key(mut self, key: impl Into<String>) -> Self {
        self.key = Some(key.into());
        self
    }
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Created {
    pub promise: Promise,
    /// The promise existed and the request was a duplicate of its create.
    pub deduplicated: bool,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Completed {
    pub promise: Promise,
    /// The promise was settled before; this is the replay of that outcome.
    pub replayed: bool,
}

/// Promises whose id matches `pattern` (`*` matches any run of characters,
/// everything else itself) and, if given, in `state`; ordered by id, after
/// `after` (a cursor: the last id of the previous page), at most `limit`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SearchQuery {
    pub pattern: String,
    pub state: Option<State>,
    pub after: Option<String>,
    pub limit: usize,
}

impl SearchQuery {
    pub const MAX_LIMIT: usize = 10_000;

    pub fn new(pattern: impl Into<String>) -> Self {
        Self {
            pattern: pattern.into(),
            state: None,
            after: None,
            limit: 100,
        }
    }
    pub fn state(mut self, state: State) -> Self {
        self.state = Some(state);
        self
    }
    pub fn after(mut self, id: impl Into<String>) -> Self {
        self.after = Some(id.into());
        self
    }
    pub fn limit(mut self, limit: usize) -> Self {
        self.limit = limit;
        self
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum TaskKind {
    /// Run the promise's function.
    Invoke,
    /// Resume the awaiter: a promise it awaited has settled.
    Resume,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum TaskState {
    Ready,
    Claimed,
    /// A resume task for the awaiter's next suspension, made while the
    /// current one's resume task still runs: claimable once that task
    /// completes (it becomes `Ready`), so one awaiter never runs twice at
    /// once.
    Waiting,
}

/// A unit of work for a pool. A completed task is deleted.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Task {
    pub id: u64,
    pub kind: TaskKind,
    /// Invoke: the promise to run. Resume: the promise that settled.
    pub promise_id: String,
    /// Resume: the promise to resume.
    pub awaiter: Option<String>,
    /// Resume: the awaiter's suspension this task ends.
    pub epoch: u64,
    pub pool: String,
    pub preferred_worker: Option<String>,
    pub state: TaskState,
    /// How many times it has been claimed; a claim's fencing token.
    pub claims: u32,
    pub lease_owner: Option<String>,
    pub lease_expires_at: Option<Millis>,
    pub created_at: Millis,
}

/// A claimed task with the promise it is about.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Claimed {
    pub task: Task,
    pub promise: Promise,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ClaimRequest {
    pub pool: String,
    pub worker: String,
    pub lease_ms: Millis,
}

/// Identifies one claim of a task: heartbeats and completion must show it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Lease {
    pub task_id: u64,
    pub worker: String,
    pub claim: u32,
}

impl Lease {
    pub fn of(task: &Task) -> Self {
        Self {
            task_id: task.id,
            worker: task.lease_owner.clone().unwrap_or_default(),
            claim: task.claims,
        }
    }
}

/// A stored `Resume(awaiter, awaited)` callback.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Callback {
    pub id: u64,
    pub awaited: String,
    pub awaiter: String,
    pub epoch: u64,
    pub pool: String,
    pub preferred_worker: Option<String>,
    pub created_at: Millis,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CallbackRequest {
    pub awaited: String,
    pub awaiter: String,
    pub pool: String,
    pub preferred_worker: Option<String>,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub enum CallbackOutcome {
    /// The awaited promise is pending: the callback is stored and a resume
    /// task will go to its pool when the promise settles.
    Registered(Callback),
    /// The awaited promise had settled: nothing was stored, resume now.
    AlreadyCompleted(Promise),
}

/// Everything a store holds, in a canonical order (by id), for tests and
/// inspection. Reading it applies no timeouts.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Snapshot {
    pub promises: Vec<Promise>,
    pub tasks: Vec<Task>,
    pub callbacks: Vec<Callback>,
}
