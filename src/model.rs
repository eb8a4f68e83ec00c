//! The dialect-neutral task model: ids, states, messages, parts, statuses and events.
//!
//! Nothing here knows about JSON-RPC or any wire dialect; `rpc::seed` (and later the
//! official A2A dialects) parse into and render from these types. Keep it that way:
//! a wire detail that leaks in here would have to be special-cased for every dialect.

use std::fmt;
use std::sync::Arc;

use chrono::{DateTime, SecondsFormat, Utc};

macro_rules! string_id {
    ($(#[$doc:meta])* $name:ident) => {
        $(#[$doc])*
        #[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
        pub struct $name(Arc<str>);

        impl $name {
            /// Wraps an identifier.
            pub fn new(id: impl Into<Arc<str>>) -> Self {
                Self(id.into())
            }

            /// The identifier as a string slice.
            pub fn as_str(&self) -> &str {
                &self.0
            }
        }

        impl fmt::Display for $name {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str(&self.0)
            }
        }

        impl From<&str> for $name {
            fn from(s: &str) -> Self {
                Self(s.into())
            }
        }
    };
}

string_id!(
    /// A task identifier, unique per principal and agent.
    TaskId
);
string_id!(
    /// A conversation (multi-turn context) identifier, unique per principal.
    ContextId
);
string_id!(
    /// The configured identifier of an agent: the `{agent_id}` of the URL.
    AgentId
);
string_id!(
    /// The name of an API key's owner; everything a caller creates belongs to it.
    Principal
);

impl TaskId {
    /// A fresh server-generated task id (UUID v4).
    pub fn generate() -> Self {
        Self::new(uuid::Uuid::new_v4().to_string())
    }
}

impl ContextId {
    /// A fresh server-generated context id (UUID v4).
    pub fn generate() -> Self {
        Self::new(uuid::Uuid::new_v4().to_string())
    }
}

/// Where a task lives: task ids are scoped per principal and per agent.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct TaskKey {
    /// The owner.
    pub principal: Principal,
    /// The agent that runs it.
    pub agent: AgentId,
    /// The task id as the owner knows it.
    pub task: TaskId,
}

/// The state of a task. The seed dialect only ever produces the first five; the others
/// exist so that backends and dialects that need them fit without changing the model.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum TaskState {
    /// Received and queued.
    Submitted,
    /// Being processed by the agent.
    Working,
    /// Finished successfully (terminal).
    Completed,
    /// Failed (terminal).
    Failed,
    /// Cancelled by a user, a time-out or shutdown (terminal).
    Canceled,
    /// The agent waits for more input (interrupted; official dialects only).
    InputRequired,
    /// The agent waits for authentication (interrupted; official dialects only).
    AuthRequired,
    /// The agent refused the task (terminal; official dialects only).
    Rejected,
}

impl TaskState {
    /// Terminal states have no further transitions.
    pub fn is_terminal(self) -> bool {
        matches!(
            self,
            Self::Completed | Self::Failed | Self::Canceled | Self::Rejected
        )
    }

    /// Whether the state machine allows `self` → `next` (spec §3). `working` → `working` is
    /// an intermediate update; terminal states have no further transitions.
    pub fn can_become(self, next: TaskState) -> bool {
        use TaskState::*;
        matches!(
            (self, next),
            (Submitted, Working | Canceled)
                | (Working, Working | Completed | Failed | Canceled)
                | (InputRequired | AuthRequired, Working | Canceled | Failed)
        )
    }

    /// The seed dialect's name for the state.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Submitted => "submitted",
            Self::Working => "working",
            Self::Completed => "completed",
            Self::Failed => "failed",
            Self::Canceled => "canceled",
            Self::InputRequired => "input-required",
            Self::AuthRequired => "auth-required",
            Self::Rejected => "rejected",
        }
    }
}

impl fmt::Display for TaskState {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Who wrote a message.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Role {
    /// The client.
    User,
    /// The agent.
    Agent,
}

/// One message: a user request or an agent reply.
#[derive(Clone, Debug, PartialEq)]
pub struct Message {
    /// Who wrote it.
    pub role: Role,
    /// Ordered content.
    pub parts: Vec<Part>,
    /// The message id (UUID v4 for user messages on the seed path; generated for agent messages).
    pub message_id: String,
}

impl Message {
    /// An agent message made of text parts, with a fresh message id.
    pub fn agent_text<I, S>(texts: I) -> Self
    where
        I: IntoIterator<Item = S>,
        S: Into<String>,
    {
        Self {
            role: Role::Agent,
            parts: texts.into_iter().map(|t| Part::Text(t.into())).collect(),
            message_id: uuid::Uuid::new_v4().to_string(),
        }
    }

    /// About how many bytes the message holds in memory (for retention budgets).
    pub fn approx_bytes(&self) -> usize {
        let parts: usize = self
            .parts
            .iter()
            .map(|p| match p {
                Part::Text(t) => t.len(),
                Part::File(f) => f.name.len() + f.mime_type.len() + f.bytes.len() + 48,
            } + std::mem::size_of::<Part>())
            .sum();
        parts + self.message_id.len() + std::mem::size_of::<Self>()
    }

    /// The text parts joined by a newline.
    pub fn joined_text(&self) -> String {
        let mut out = String::new();
        for text in self.parts.iter().filter_map(Part::as_text) {
            if !out.is_empty() {
                out.push('\n');
            }
            out.push_str(text);
        }
        out
    }
}

/// One piece of a message.
#[derive(Clone, Debug, PartialEq)]
pub enum Part {
    /// Plain text.
    Text(String),
    /// A file carried inline (boxed: text parts, the common case, stay small).
    File(Box<FileContent>),
}

impl Part {
    /// The text, for text parts.
    pub fn as_text(&self) -> Option<&str> {
        match self {
            Self::Text(t) => Some(t),
            Self::File(_) => None,
        }
    }
}

/// A file part's content, already validated.
#[derive(Clone, Debug, PartialEq)]
pub struct FileContent {
    /// The file name given by the client.
    pub name: String,
    /// The declared (and checked) MIME type.
    pub mime_type: String,
    /// Standard Base64 of the content, exactly as received.
    pub bytes: String,
    /// Decoded size in bytes.
    pub size: usize,
}

/// Why a task failed, carried in `status.error`.
#[derive(Clone, Debug, PartialEq)]
pub struct TaskError {
    /// A numeric code (JSON-RPC style).
    pub code: i64,
    /// A human-readable message that leaks no internals or secrets.
    pub message: String,
}

/// Error code of a task failed by its agent.
pub const AGENT_ERROR_CODE: i64 = -32603;

/// A task's status at one point in time.
#[derive(Clone, Debug)]
pub struct TaskStatus {
    /// The state.
    pub state: TaskState,
    /// An agent message (progress text, or the reply on completion).
    pub message: Option<Arc<Message>>,
    /// The cancellation reason (canceled tasks only).
    pub reason: Option<Arc<str>>,
    /// The failure (failed tasks only).
    pub error: Option<Arc<TaskError>>,
    /// When the task entered this status.
    pub timestamp: DateTime<Utc>,
}

impl TaskStatus {
    /// A bare status in `state`, stamped now.
    pub fn new(state: TaskState) -> Self {
        Self {
            state,
            message: None,
            reason: None,
            error: None,
            timestamp: Utc::now(),
        }
    }
}

/// One numbered event of a task: a state change or an intermediate agent update.
///
/// Events are numbered from 1 per task and never renumbered; event 1 is `submitted`.
#[derive(Clone, Debug)]
pub struct TaskEvent {
    /// The event number (the SSE `id:`).
    pub seq: u64,
    /// The task's status after this event.
    pub status: TaskStatus,
}

impl TaskEvent {
    /// The last event of a task: its state is terminal.
    pub fn is_final(&self) -> bool {
        self.status.state.is_terminal()
    }
}

/// A read-only copy of a task as it stands.
#[derive(Clone, Debug)]
pub struct TaskSnapshot {
    /// The task id.
    pub id: TaskId,
    /// Its conversation.
    pub context_id: ContextId,
    /// The current status.
    pub status: TaskStatus,
    /// The number of the event that produced the current status.
    pub seq: u64,
    /// When it was submitted.
    pub created_at: DateTime<Utc>,
    /// When its status last changed.
    pub updated_at: DateTime<Utc>,
    /// The user message, then the agent messages, oldest first.
    pub history: Vec<Arc<Message>>,
    /// The request's `metadata` (a JSON object, kept as its text), if any.
    pub metadata: Option<Arc<serde_json::value::RawValue>>,
}

impl TaskSnapshot {
    /// About how many bytes the record holds in memory (for retention budgets). Shared
    /// messages are counted in full: the budget errs on the safe side.
    pub fn approx_bytes(&self) -> usize {
        const FIXED: usize = 256;
        let history: usize = self.history.iter().map(|m| m.approx_bytes() + 16).sum();
        // A completed task's reply is also the last history entry: count it once.
        let reply_in_history = match (&self.status.message, self.history.last()) {
            (Some(m), Some(last)) => Arc::ptr_eq(m, last),
            _ => false,
        };
        let status = self
            .status
            .message
            .as_ref()
            .filter(|_| !reply_in_history)
            .map_or(0, |m| m.approx_bytes())
            + self.status.reason.as_ref().map_or(0, |r| r.len())
            + self.status.error.as_ref().map_or(0, |e| e.message.len());
        FIXED
            + self.id.as_str().len()
            + self.context_id.as_str().len()
            + history
            + status
            + self.metadata.as_ref().map_or(0, |m| m.get().len())
    }

    /// The event that produced the current status.
    pub fn current_event(&self) -> TaskEvent {
        TaskEvent {
            seq: self.seq,
            status: self.status.clone(),
        }
    }
}

/// ISO 8601 UTC with milliseconds, as every timestamp on the wire.
pub fn iso8601(t: &DateTime<Utc>) -> String {
    t.to_rfc3339_opts(SecondsFormat::Millis, true)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_completed_failed_canceled_and_rejected_are_terminal() {
        let terminal: Vec<_> = [
            TaskState::Submitted,
            TaskState::Working,
            TaskState::Completed,
            TaskState::Failed,
            TaskState::Canceled,
            TaskState::InputRequired,
            TaskState::AuthRequired,
            TaskState::Rejected,
        ]
        .into_iter()
        .filter(|s| s.is_terminal())
        .collect();
        assert_eq!(
            terminal,
            vec![
                TaskState::Completed,
                TaskState::Failed,
                TaskState::Canceled,
                TaskState::Rejected
            ]
        );
    }

    #[test]
    fn the_transition_table_is_the_specs() {
        use TaskState::*;
        let all = [
            Submitted,
            Working,
            Completed,
            Failed,
            Canceled,
            InputRequired,
            AuthRequired,
            Rejected,
        ];
        let allowed: Vec<(TaskState, TaskState)> = all
            .iter()
            .flat_map(|&a| all.iter().map(move |&b| (a, b)))
            .filter(|(a, b)| a.can_become(*b))
            .filter(|(a, _)| matches!(a, Submitted | Working | Completed | Failed | Canceled))
            .collect();
        assert_eq!(
            allowed,
            vec![
                (Submitted, Working),
                (Submitted, Canceled),
                (Working, Working),
                (Working, Completed),
                (Working, Failed),
                (Working, Canceled),
            ]
        );
        for terminal in [Completed, Failed, Canceled, Rejected] {
            assert!(all.iter().all(|&n| !terminal.can_become(n)), "{terminal}");
        }
    }

    #[test]
    fn joined_text_skips_files_and_joins_with_newline() {
        let m = Message {
            role: Role::User,
            parts: vec![
                Part::Text("a".into()),
                Part::File(Box::new(FileContent {
                    name: "f".into(),
                    mime_type: "text/plain".into(),
                    bytes: "YQ==".into(),
                    size: 1,
                })),
                Part::Text("b".into()),
            ],
            message_id: "x".into(),
        };
        assert_eq!(m.joined_text(), "a\nb");
    }
}
