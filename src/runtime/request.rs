//! What a dialect hands the runtime, and what it gets back.

use std::sync::Arc;

use crate::config::AgentConfig;
use crate::metrics::AgentMetricsSnapshot;
use crate::model::{ContextId, Extensions, Message, TaskId, TaskSnapshot};
use crate::push::PushConfig;
use crate::runtime::TaskStream;

/// A message to submit.
#[derive(Clone, Debug)]
pub struct SendRequest {
    /// The user message (already validated by the caller's dialect).
    pub message: Message,
    /// Continue this conversation, or start one under this name; `None` starts a new one.
    pub context_id: Option<ContextId>,
    /// The task id: a client-chosen id for a new task (idempotent replays), or the task to
    /// continue (see [`SubmitOptions::task_id`]); `None` generates one.
    pub task_id: Option<TaskId>,
    /// Free-form metadata kept with the task: a JSON object, kept as its text.
    pub metadata: Option<Box<serde_json::value::RawValue>>,
    /// The extensions the request activated (those the agent declares, in its order):
    /// kept with the task, shown to the agent, listed on its messages and artifacts.
    pub extensions: Extensions,
}

impl SendRequest {
    /// A message that starts a new task in a new conversation.
    pub fn new(message: Message) -> Self {
        Self {
            message,
            context_id: None,
            task_id: None,
            metadata: None,
            extensions: Extensions::default(),
        }
    }
}

/// What a request's task id means: its dialect's rule.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum TaskIdUse {
    /// The id of a new task; the same id with the same message id replays it (seed).
    #[default]
    NewOrReplay,
    /// The id of an interrupted task to continue; never creates a task (official).
    Continue,
}

/// What a request carries beside its message, as its dialect understood it.
#[derive(Debug, Default)]
#[non_exhaustive]
pub struct SubmitOptions {
    /// A push configuration for the new task. It is stored before the task's first
    /// event, so it receives every event it selects from `task.submitted` on. It is not
    /// applied to an idempotent replay (the task exists already).
    pub push: Option<NewPushConfig>,
    /// What [`SendRequest::task_id`] means.
    pub task_id: TaskIdUse,
    /// Whether the agent may answer with a bare message instead of a task.
    pub allow_message: bool,
}

/// A push configuration to store with a new task.
#[derive(Debug)]
pub struct NewPushConfig {
    /// The configuration.
    pub config: PushConfig,
    /// Its payload format (a registered renderer's name).
    pub format: Arc<str>,
    /// Scoped (one per task) or named (this id, or a generated one).
    pub named: Option<Option<String>>,
}

impl SubmitOptions {
    /// Options with a scoped push configuration for the new task.
    pub fn with_push(push: Option<PushConfig>, format: &str) -> Self {
        Self {
            push: push.map(|config| NewPushConfig {
                config,
                format: format.into(),
                named: None,
            }),
            ..Self::default()
        }
    }
}

/// What a send produced: a task, or (when allowed) the agent's direct reply.
#[derive(Debug)]
pub enum Sent {
    /// The task as it stands.
    Task(TaskSnapshot),
    /// A bare agent message; no task was created.
    Message(Message),
}

/// What a streaming send produced.
pub enum Streamed {
    /// The task's stream.
    Task(TaskStream),
    /// A bare agent message; no task was created.
    Message(Message),
}

/// An agent's card, dialect-neutral.
#[derive(Clone, Debug)]
pub struct AgentCard {
    /// Its configuration (identity, capabilities, limits).
    pub config: AgentConfig,
    /// `agent.type`: the backend kind.
    pub kind: String,
    /// Live metrics.
    pub metrics: AgentMetricsSnapshot,
    /// What the upstream's card says, for an agent that fronts one (its name,
    /// description and streaming are in `config` already, unless the entry set them).
    pub upstream: Option<crate::agent::UpstreamFacts>,
}
