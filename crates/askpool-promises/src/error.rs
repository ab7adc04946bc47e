//! Typed errors of the promise store. The first group is the protocol's
//! answers (identical from every store); the second is what a database
//! file can do to you.

use std::path::PathBuf;

use askpool::AskError;

use crate::model::State;

#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum PromiseError {
    #[error("no promise with id {id:?}")]
    NotFound { id: String },
    #[error("promise {id:?} already exists (create key does not match)")]
    AlreadyExists { id: String },
    #[error("promise {id:?} is already {state}")]
    AlreadySettled { id: String, state: State },
    #[error("no task with id {id}")]
    TaskNotFound { id: u64 },
    #[error("the lease on task {id} is lost (expired, or claimed again)")]
    LeaseLost { id: u64 },
    #[error("invalid argument: {message}")]
    InvalidArgument { message: String },

    #[error("database file {path:?} is corrupt: {message}")]
    Corrupt { path: PathBuf, message: String },
    #[error("database file {path:?} is not an askpool promise store: {message}")]
    Foreign { path: PathBuf, message: String },
    #[error(
        "database file {path:?} has schema version {found}; this build supports up to {supported}"
    )]
    NewerVersion {
        path: PathBuf,
        found: i64,
        supported: i64,
    },
    #[error("database file {path:?} is locked by another connection")]
    Locked { path: PathBuf },
    #[error("storage error: {message}")]
    Storage { message: String },
    /// The test crash hook fired in the middle of a transaction.
    #[error("crash hook fired mid-transaction")]
    Crashed,
}

impl PromiseError {
    pub(crate) fn invalid(message: impl Into<String>) -> Self {
        PromiseError::InvalidArgument {
            message: message.into(),
        }
    }

    /// An answer of the protocol (the request was wrong for the state), as
    /// opposed to a failure of the storage. An operation that answers with
    /// one still commits the timeouts it applied on the way.
    pub fn is_protocol(&self) -> bool {
        matches!(
            self,
            PromiseError::NotFound { .. }
                | PromiseError::AlreadyExists { .. }
                | PromiseError::AlreadySettled { .. }
                | PromiseError::TaskNotFound { .. }
                | PromiseError::LeaseLost { .. }
                | PromiseError::InvalidArgument { .. }
        )
    }

    /// A short stable name, for bindings and the CLI's JSON.
    pub fn code(&self) -> &'static str {
        match self {
            PromiseError::NotFound { .. } => "NotFound",
            PromiseError::AlreadyExists { .. } => "AlreadyExists",
            PromiseError::AlreadySettled { .. } => "AlreadySettled",
            PromiseError::TaskNotFound { .. } => "TaskNotFound",
            PromiseError::LeaseLost { .. } => "LeaseLost",
            PromiseError::InvalidArgument { .. } => "InvalidArgument",
            PromiseError::Corrupt { .. } => "Corrupt",
            PromiseError::Foreign { .. } => "Foreign",
            PromiseError::NewerVersion { .. } => "NewerVersion",
            PromiseError::Locked { .. } => "Locked",
            PromiseError::Storage { .. } => "Storage",
            PromiseError::Crashed => "Crashed",
        }
    }
}

/// The askpool taxonomy (DESIGN section 6): a locked file is worth retrying,
/// a bad request or a bad file is not.
impl From<PromiseError> for AskError {
    fn from(e: PromiseError) -> Self {
        let message = e.to_string();
        match e {
            // Its text without the "invalid argument: " the AskError adds.
            PromiseError::InvalidArgument { message } => AskError::InvalidArgument { message },
            PromiseError::NotFound { .. } | PromiseError::TaskNotFound { .. } => {
                AskError::InvalidArgument { message }
            }
            PromiseError::AlreadyExists { .. }
            | PromiseError::AlreadySettled { .. }
            | PromiseError::LeaseLost { .. }
            | PromiseError::Foreign { .. }
            | PromiseError::NewerVersion { .. } => AskError::FailedPrecondition { message },
            PromiseError::Locked { .. } => AskError::Unavailable { reason: message },
            PromiseError::Corrupt { .. } | PromiseError::Storage { .. } | PromiseError::Crashed => {
                AskError::Internal { message }
            }
        }
    }
}
