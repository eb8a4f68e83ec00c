//! The actors and the state they share with the runtime: a [`supervisor::TaskSupervisor`]
//! parents one [`task::TaskActor`] per task; a [`context::ContextActor`] keeps
//! conversations; a pool of [`webhook::WebhookActor`]s delivers webhooks. Invariants
//! (ordering, who calls whom, retention) are in docs/ARCHITECTURE.md; the public API is
//! [`crate::Runtime`].

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64};
use std::time::Duration;

use dashmap::DashMap;
use foldhash::fast::RandomState;
use ractor::ActorRef;

pub(crate) mod context;
pub(crate) mod supervisor;
pub(crate) mod task;
pub(crate) mod webhook;

use crate::agent::Agent;
use crate::config::{AgentConfig, Config};
use crate::limits::Scheduler;
use crate::metrics::{AgentMetrics, Metrics};
use crate::model::{ContextId, Principal, TaskEvent, TaskKey, TaskSnapshot};
use crate::store::{PushStore, TaskStore};
use context::ContextMsg;
use task::TaskMsg;

/// A conversation is owned by one principal.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub(crate) struct ContextKey {
    /// The owner.
    pub principal: Principal,
    /// The conversation.
    pub context: ContextId,
}

/// Hears every event of every task, after its record is stored. The webhook pool plugs in
/// here. It is called inside a task actor's handler, so it must only hand the event on.
pub trait TaskObserver: Send + Sync + 'static {
    /// A task produced `event` (`changed`: its state changed); `task` is the task as the
    /// event left it.
    fn task_event(
        &self,
        key: &TaskKey,
        event: &Arc<TaskEvent>,
        task: &Arc<TaskSnapshot>,
        changed: bool,
    );
}

/// An agent as the runtime runs it.
pub struct AgentEntry {
    /// Its configuration.
    pub config: AgentConfig,
    /// Dense index (for per-agent tables).
    pub index: usize,
    /// Its backend.
    pub backend: Arc<dyn Agent>,
    /// Its task slots and queue.
    pub scheduler: Arc<Scheduler>,
    /// Its live counters.
    pub metrics: AgentMetrics,
}

/// A live task in the index. Cloning it is cheap.
#[derive(Clone)]
pub(crate) struct LiveTask {
    pub(crate) actor: ActorRef<TaskMsg>,
    pub(crate) message_id: Arc<str>,
    pub(crate) context_id: ContextId,
}

/// State shared by the runtime, the actors and the request path.
pub(crate) struct Shared {
    pub(crate) config: Arc<Config>,
    /// Live tasks. Guards are never held across an await (STYLE pitfall 10). Hashed with
    /// seeded foldhash: fast, and ids chosen by clients cannot be aimed at one shard.
    pub(crate) live: DashMap<TaskKey, LiveTask, RandomState>,
    pub(crate) store: Arc<dyn TaskStore>,
    pub(crate) push: Arc<dyn PushStore>,
    pub(crate) metrics: Metrics,
    pub(crate) contexts: ActorRef<ContextMsg>,
    pub(crate) observer: Arc<dyn TaskObserver>,
    pub(crate) next_subscriber: AtomicU64,
    pub(crate) shutting_down: AtomicBool,
    pub(crate) call_timeout: Duration,
}

impl Shared {
    /// Stores a task's record; the push configurations of tasks evicted to make room go
    /// with them.
    pub(crate) fn put_task(&self, key: &TaskKey, task: Arc<TaskSnapshot>) {
        for gone in self.store.put(key, task) {
            self.push.remove_task(&gone);
        }
    }
}
