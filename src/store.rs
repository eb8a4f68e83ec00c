//! Storage behind small interfaces: every task's record, and push configurations.
//!
//! A task actor writes its task's record at every event, so the store always holds the
//! task as its last event left it: running tasks too, which is what lets any request
//! list tasks without asking actors. Finished records stay for the retention, within a
//! count cap and a byte budget. Implementations must never block for long: they are
//! called from request handlers and actors (and [`TaskStore::get`] under a live-index
//! guard, see `runtime::submit`).

use std::sync::Arc;
use std::time::Instant;

use chrono::{DateTime, Utc};

use crate::error::Error;
use crate::model::{AgentId, ContextId, Principal, TaskId, TaskKey, TaskSnapshot, TaskState};
use crate::push::{PushScope, StoredPushConfig};

mod memory;

pub(crate) use memory::{MemoryPushStore, MemoryTaskStore};

/// Where task records are kept.
pub trait TaskStore: Send + Sync + 'static {
    /// Stores the task as it stands (replacing its earlier record). Returns the tasks
    /// evicted to make room (their push configurations go with them).
    fn put(&self, key: &TaskKey, task: Arc<TaskSnapshot>) -> Vec<TaskKey>;
    /// A task's record.
    fn get(&self, key: &TaskKey) -> Option<Arc<TaskSnapshot>>;
    /// One page of an owner's tasks (DIALECTS.md §6).
    fn list(&self, query: &ListQuery) -> ListPage;
    /// Evicts finished tasks older than the retention or over the caps; returns them.
    fn evict(&self, now: Instant) -> Vec<TaskKey>;
    /// Finished records held.
    fn len(&self) -> usize;
    /// True when no finished record is held.
    fn is_empty(&self) -> bool {
        self.len() == 0
    }
    /// About how many bytes the finished records hold.
    fn bytes(&self) -> u64;
}

/// A ListTasks query: one owner's tasks on one agent, newest status first.
#[derive(Clone, Debug)]
pub struct ListQuery {
    /// The owner.
    pub principal: Principal,
    /// The agent.
    pub agent: AgentId,
    /// Only tasks of this conversation.
    pub context: Option<ContextId>,
    /// Only tasks in this state.
    pub state: Option<TaskState>,
    /// Only tasks whose status changed at or after this time.
    pub status_after: Option<DateTime<Utc>>,
    /// Tasks per page (at least 1).
    pub page_size: usize,
    /// Continue after this task (the last one of the previous page).
    pub after: Option<PageToken>,
}

/// A position in the order of ListTasks: status time descending, then task id descending.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct PageToken {
    /// The status time in microseconds since the epoch.
    pub timestamp_micros: i64,
    /// The task id.
    pub task: TaskId,
}

impl PageToken {
    /// The position of a task.
    pub fn of(task: &TaskSnapshot) -> Self {
        Self {
            timestamp_micros: task.status.timestamp.timestamp_micros(),
            task: task.id.clone(),
        }
    }
}

/// One page of tasks.
#[derive(Clone, Debug, Default)]
pub struct ListPage {
    /// The tasks, in order.
    pub tasks: Vec<Arc<TaskSnapshot>>,
    /// Where the next page starts, when there is one.
    pub next: Option<PageToken>,
    /// How many tasks match the query, over all pages.
    pub total: usize,
}

/// Where push configurations are kept: one per scope ([`crate::push::Namespace::Scoped`])
/// or several per task by id ([`crate::push::Namespace::Named`]); the two never replace
/// each other.
pub trait PushStore: Send + Sync + 'static {
    /// Stores a configuration, replacing the one of the same scope (scoped) or of the same
    /// task and id (named).
    ///
    /// # Errors
    /// [`Error::InvalidParams`] when a task would hold more than `max_per_task` named
    /// configurations.
    fn set(&self, config: Arc<StoredPushConfig>, max_per_task: usize) -> Result<(), Error>;
    /// Removes the scoped configuration of exactly this scope.
    fn remove(&self, scope: &PushScope);
    /// Removes a named configuration of a task; true if there was one.
    fn remove_named(&self, task: &TaskKey, id: &str) -> bool;
    /// The scoped configuration of exactly this scope.
    fn get_scope(&self, scope: &PushScope) -> Option<Arc<StoredPushConfig>>;
    /// A scoped configuration of this principal and agent by id.
    fn get_id(
        &self,
        principal: &Principal,
        agent: &AgentId,
        id: &str,
    ) -> Option<Arc<StoredPushConfig>>;
    /// A named configuration of a task.
    fn get_named(&self, task: &TaskKey, id: &str) -> Option<Arc<StoredPushConfig>>;
    /// A task's named configurations, oldest first.
    fn list_named(&self, task: &TaskKey) -> Vec<Arc<StoredPushConfig>>;
    /// Every configuration that applies to a task: its own (scoped and named) and its
    /// owner's agent-wide one.
    fn for_task(&self, key: &TaskKey) -> Vec<Arc<StoredPushConfig>>;
    /// Forgets a task's configurations (the task was evicted).
    fn remove_task(&self, key: &TaskKey);
    /// True when no configuration is stored at all (the hot path skips webhooks then).
    fn is_empty(&self) -> bool;
}
