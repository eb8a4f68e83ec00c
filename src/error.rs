//! The library's one public error type. Protocol codes are assigned elsewhere
//! (`rpc::error`), per dialect, so this enum says what went wrong, never how to encode it.

use crate::config::ConfigError;
use crate::model::{TaskId, TaskState};

/// What went wrong, for embedders and for the wire layer alike.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// A parameter is missing, ill-typed or fails validation.
    #[error("invalid params: {field}: {reason}")]
    InvalidParams {
        /// The offending field, relative to `params` (e.g. `message.messageId`).
        field: String,
        /// What is wrong with it.
        reason: String,
    },
    /// A part's MIME type is not among the agent's supported types.
    #[error("content type not supported: {field}: {reason}")]
    UnsupportedContentType {
        /// The offending field, relative to `params`.
        field: String,
        /// What is wrong with it.
        reason: String,
    },
    /// The agent declares an extension as required and the request did not activate it.
    #[error("extension support required: {uri}")]
    ExtensionRequired {
        /// The extension's URI.
        uri: String,
    },
    /// No such task for this caller (or it was evicted).
    #[error("task not found")]
    TaskNotFound {
        /// The task id asked for.
        task: TaskId,
    },
    /// The task already completed or failed, so it cannot be modified.
    #[error("task already {state}")]
    TaskFinished {
        /// The task.
        task: TaskId,
        /// `completed` or `failed`.
        state: TaskState,
    },
    /// The task was already canceled.
    #[error("task already canceled")]
    TaskCanceled {
        /// The task.
        task: TaskId,
    },
    /// The task reached a terminal state while the cancellation was in flight.
    #[error("cancellation failed: the task became {state}")]
    CancelFailed {
        /// The task.
        task: TaskId,
        /// The state it reached.
        state: TaskState,
    },
    /// A stream could not be opened on the task.
    #[error("subscription failed: {reason}")]
    SubscriptionFailed {
        /// The task, when one exists (a refused `message/stream` has none yet).
        task: Option<TaskId>,
        /// Why.
        reason: String,
    },
    /// A client-chosen task id is taken by a running task with another message.
    #[error("task is still in progress")]
    TaskInProgress {
        /// The task.
        task: TaskId,
    },
    /// A message names a task that cannot take one: it is not waiting for input (still
    /// running, or finished).
    #[error("task cannot be continued: it is {state}")]
    TaskNotContinuable {
        /// The task.
        task: TaskId,
        /// Its state.
        state: TaskState,
    },
    /// A message names a task of another conversation than the one it gives.
    #[error("the task belongs to another context")]
    ContextMismatch {
        /// The task.
        task: TaskId,
    },
    /// The agent's task queue is full.
    #[error("too many tasks: the agent's queue is full")]
    TooManyTasks,
    /// The agent does not accept push notification configurations.
    #[error("push notifications are not supported by this agent")]
    PushNotSupported,
    /// No agent with that id.
    #[error("agent not found")]
    AgentNotFound,
    /// The server is at an internal capacity bound; try again later.
    #[error("server busy")]
    Busy,
    /// The server is shutting down and takes no new work.
    #[error("server is shutting down")]
    ShuttingDown,
    /// A fault inside the server; details are logged, not returned.
    #[error("internal error")]
    Internal,
    /// The configuration is invalid.
    #[error(transparent)]
    Config(#[from] ConfigError),
    /// The store file cannot be used (locked, unreadable, foreign, another schema). The
    /// server does not start: it never starts fresh over a file it cannot read.
    #[error("store {path}: {message}")]
    Store {
        /// The file.
        path: String,
        /// What is wrong, and what to do.
        message: String,
    },
    /// Binding or serving failed.
    #[error("i/o error: {0}")]
    Io(#[from] std::io::Error),
}

impl Error {
    /// Shorthand for [`Error::InvalidParams`].
    pub fn invalid(field: impl Into<String>, reason: impl Into<String>) -> Self {
        Self::InvalidParams {
            field: field.into(),
            reason: reason.into(),
        }
    }
}

/// `Result` with the library's [`Error`].
pub type Result<T, E = Error> = std::result::Result<T, E>;
