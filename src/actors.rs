//! The actors and the state they share with the runtime: a [`supervisor::TaskSupervisor`]
//! parents one [`task::TaskActor`] per task; a [`context::ContextActor`] keeps
//! conversations; a pool of [`webhook::WebhookActor`]s delivers webhooks. Invariants
//! (ordering, who calls whom, retention) are in docs/ARCHITECTURE.md; the public API is
//! [`crate::Runtime`].

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64};
use std::time::Duration;

use dashmap::DashMap;
use foldhash::fast::RandomState;
use ractor::ActorRef;

pub(crate) mod context;
pub(crate) mod remote;
pub(crate) mod supervisor;
pub(crate) mod task;
pub(crate) mod webhook;

use crate::agent::Agent;
use crate::config::{AgentConfig, Config};
use crate::limits::Scheduler;
use crate::metrics::{AgentMetrics, Metrics};
use crate::model::{AgentId, ContextId, Message, Principal, TaskKey};
use crate::store::Store;
use crate::store::cluster::Cluster;
use crate::swap::Swap;
use context::ContextMsg;
use task::TaskMsg;
use webhook::WebhookPool;

/// A conversation is owned by one principal.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub(crate) struct ContextKey {
    /// The owner.
    pub principal: Principal,
    /// The conversation.
    pub context: ContextId,
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
    /// Its live counters (kept by a reload that changes the agent).
    pub metrics: Arc<AgentMetrics>,
}

/// The agents by id.
pub(crate) type AgentMap = HashMap<AgentId, Arc<AgentEntry>, foldhash::fast::RandomState>;

/// The agents in force, swapped whole by a configuration reload: a request looks its
/// agent up once, and a task keeps the entry it started with.
pub(crate) type Agents = Swap<AgentMap>;

/// A live task in the index. Cloning it is cheap.
#[derive(Clone)]
pub(crate) struct LiveTask {
    pub(crate) actor: ActorRef<TaskMsg>,
    pub(crate) message_id: Arc<str>,
    pub(crate) context_id: ContextId,
}

impl LiveTask {
    /// The entry of `actor`'s task, created by `message` in `context`.
    pub(crate) fn new(actor: ActorRef<TaskMsg>, message: &Message, context: &ContextId) -> Self {
        Self {
            actor,
            message_id: message.message_id.as_str().into(),
            context_id: context.clone(),
        }
    }
}

/// State shared by the runtime, the actors and the request path.
pub(crate) struct Shared {
    /// The configuration the runtime started with: the settings that need a restart.
    pub(crate) config: Arc<Config>,
    /// The configuration in force: `config` with the sections a reload replaced
    /// (`[[api_keys]]`, `[auth]`, `[[agents]]`, `[webhooks]`).
    pub(crate) in_force: Swap<Config>,
    /// Live tasks. Guards are never held across an await (STYLE pitfall 10). Hashed with
    /// seeded foldhash: fast, and ids chosen by clients cannot be aimed at one shard.
    pub(crate) live: DashMap<TaskKey, LiveTask, RandomState>,
    /// Everything kept: tasks, events, conversations, push configurations, the outbox.
    pub(crate) store: Arc<dyn Store>,
    /// The other nodes, when this one is part of a cluster.
    pub(crate) cluster: Option<Arc<dyn Cluster>>,
    pub(crate) metrics: Metrics,
    pub(crate) contexts: ActorRef<ContextMsg>,
    /// Delivers the webhooks the store planned for published events.
    pub(crate) webhooks: Arc<WebhookPool>,
    pub(crate) next_subscriber: AtomicU64,
    pub(crate) shutting_down: AtomicBool,
    pub(crate) call_timeout: Duration,
    /// Told whenever a task in its finale (`task::finale`: its actor stopped before its
    /// last events were durable) leaves the live index: a caller that found such a task's
    /// actor gone waits for that before it reads the store (`Runtime::ended_record`).
    pub(crate) settled: tokio::sync::Notify,
}
