//! Starting the actor system (the store, the actors, a cluster's signals) and taking up
//! the tasks a restart or another node left.

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::Relaxed};

use dashmap::DashMap;
use ractor::Actor;

use super::{Runtime, spawn_failed, this_signals};
use crate::actors::context::{ContextActor, ContextArgs, ContextMsg};
use crate::actors::supervisor::TaskSupervisor;
use crate::actors::task::{Follow, TaskActor, TaskArgs, TaskMsg};
use crate::actors::webhook::WebhookPool;
use crate::actors::{AgentEntry, AgentMap, Agents, ContextKey, LiveTask, Shared};
use crate::agent::{self, Agent};
use crate::config::Config;
use crate::error::Result;
use crate::limits::Scheduler;
use crate::metrics::Metrics;
use crate::model::{AgentId, TaskKey};
use crate::store::cluster::{Cluster, Signal};
use crate::store::pg::PgStore;
use crate::store::{LocalStore, Orphan, RecoveredTask, Store};
use crate::webhook::PayloadRenderer;

/// The agents of `config`, indexed in its order. Against `current` (a reload): an agent
/// whose entry is unchanged keeps it whole; a changed one keeps its counters, its backend
/// while the backend's settings are the same (`backend`, `echo`, `openai`, `tck`, `a2a`,
/// and an `a2a` agent's limits), and its scheduler while `concurrent_tasks` and
/// `max_queued_tasks` are. A new backend is `backends`' (an embedder's, or an `a2a` one),
/// else the configured one.
pub(crate) fn agent_entries(
    config: &Config,
    backends: &mut HashMap<AgentId, Arc<dyn Agent>>,
    current: &AgentMap,
) -> AgentMap {
    config
        .agents
        .iter()
        .enumerate()
        .map(|(index, c)| {
            let id = AgentId::new(c.id.as_str());
            let old = current.get(&id);
            if let Some(o) = old
                && o.config == *c
                && o.index == index
            {
                return (id, o.clone());
            }
            let same_backend = |o: &AgentEntry| {
                let a = &o.config;
                a.backend == c.backend
                    && a.echo == c.echo
                    && a.openai == c.openai
                    && a.tck == c.tck
                    && a.a2a == c.a2a
                    && (c.backend != "a2a" || a.limits == c.limits)
            };
            let backend = match old {
                Some(o) if same_backend(o) => o.backend.clone(),
                _ => backends
                    .remove(&id)
                    .unwrap_or_else(|| agent::from_config(c)),
            };
            let scheduler = match old {
                Some(o)
                    if o.config.limits.concurrent_tasks == c.limits.concurrent_tasks
                        && o.config.limits.max_queued() == c.limits.max_queued() =>
                {
                    o.scheduler.clone()
                }
                _ => Scheduler::new(c.limits.concurrent_tasks, c.limits.max_queued()),
            };
            let entry = AgentEntry {
                config: c.clone(),
                index,
                backend,
                scheduler,
                metrics: old.map(|o| o.metrics.clone()).unwrap_or_default(),
            };
            (id, Arc::new(entry))
        })
        .collect()
}

/// Builds a [`Runtime`]: see [`Runtime::builder`].
pub struct RuntimeBuilder {
    config: Arc<Config>,
    backends: HashMap<AgentId, Arc<dyn Agent>>,
    renderers: HashMap<String, Arc<dyn PayloadRenderer>>,
}

impl RuntimeBuilder {
    /// Serves the agent `id` (one of the configuration's agents) with this backend instead
    /// of the one its configuration names: how an embedder plugs its own [`Agent`] in.
    #[must_use]
    pub fn agent(mut self, id: &str, backend: impl Agent) -> Self {
        self.backends.insert(AgentId::new(id), Arc::new(backend));
        self
    }

    /// As [`RuntimeBuilder::agent`], with a backend already shared.
    pub(crate) fn agent_arc(mut self, id: AgentId, backend: Arc<dyn Agent>) -> Self {
        self.backends.insert(id, backend);
        self
    }

    /// The configuration the runtime will start with.
    pub(crate) fn config(&self) -> &Arc<Config> {
        &self.config
    }

    /// A builder whose webhook pool renders deliveries with `renderers` (by format name):
    /// [`Runtime::builder`] gives it every built-in format, so that a runtime embedded
    /// without the HTTP server delivers webhooks as the server does.
    pub(crate) fn with_renderers(
        config: Arc<Config>,
        renderers: HashMap<String, Arc<dyn PayloadRenderer>>,
    ) -> Self {
        Self {
            config,
            backends: HashMap::new(),
            renderers,
        }
    }

    /// Opens the store, spawns the actors, and takes up the tasks a restart or another
    /// node left.
    ///
    /// # Errors
    /// A store that cannot open; [`crate::Error::Internal`] if an actor cannot be spawned.
    pub async fn start(self) -> Result<Runtime> {
        Runtime::start_full(self.config, self.backends, self.renderers).await
    }
}

impl Runtime {
    /// `Runtime::builder(config).start()`: the actor system with the configured backends.
    ///
    /// # Errors
    /// As [`RuntimeBuilder::start`].
    pub async fn start(config: Arc<Config>) -> Result<Self> {
        Self::builder(config).start().await
    }

    async fn start_full(
        config: Arc<Config>,
        mut backends: HashMap<AgentId, Arc<dyn Agent>>,
        renderers: HashMap<String, Arc<dyn PayloadRenderer>>,
    ) -> Result<Self> {
        let server = &config.server;
        let retention = server.task_retention();
        let agents = Arc::new(Agents::new(agent_entries(
            &config,
            &mut backends,
            &AgentMap::default(),
        )));
        let (store, cluster): (Arc<dyn Store>, Option<Arc<dyn Cluster>>) = match &config.cluster {
            None => (Arc::new(LocalStore::open(&config)?), None),
            Some(c) => {
                let rerun = agents
                    .now()
                    .iter()
                    .filter(|(_, a)| a.backend.resumable())
                    .map(|(id, _)| id.as_str().to_string())
                    .collect();
                let pg = Arc::new(PgStore::open(&config, c, rerun).await?);
                (pg.clone(), Some(pg))
            }
        };
        let signals = cluster.as_ref().and_then(|c| c.signals());
        let recovered = store.recovered();
        let webhooks = Arc::new(
            WebhookPool::start(&config.webhooks, store.clone(), agents.clone(), renderers).await?,
        );
        let metrics = Metrics::default();
        let (contexts, _) = Actor::spawn(
            None,
            ContextActor,
            ContextArgs {
                retention,
                max_turns: server.max_context_turns,
                max_contexts: server.max_contexts,
                max_bytes: server.max_context_bytes,
                store: store.clone(),
                gauges: metrics.conversations.clone(),
                restored: recovered.contexts,
            },
        )
        .await
        .map_err(spawn_failed)?;
        let shared = Arc::new(Shared {
            live: DashMap::default(),
            store,
            cluster,
            metrics,
            contexts,
            webhooks: webhooks.clone(),
            next_subscriber: AtomicU64::new(1),
            shutting_down: AtomicBool::new(false),
            call_timeout: server.actor_call_timeout(),
            settled: tokio::sync::Notify::new(),
            config: config.clone(),
            in_force: crate::swap::Swap::from_arc(config.clone()),
        });
        let (supervisor, _) = Actor::spawn(None, TaskSupervisor, shared.clone())
            .await
            .map_err(spawn_failed)?;
        let runtime = Self {
            shared,
            agents,
            supervisor,
            webhooks,
            signals: Arc::default(),
        };
        for task in recovered.tasks {
            runtime.resume(task).await;
        }
        if let Some(mut rx) = signals {
            let this = runtime.clone();
            let handle = tokio::spawn(async move {
                while let Some(signal) = rx.recv().await {
                    this.on_signal(signal).await;
                }
            });
            *this_signals(&runtime) = Some(handle);
        }
        if !recovered.deliveries.is_empty() {
            runtime.webhooks.deliver(recovered.deliveries);
        }
        Ok(runtime)
    }

    /// Acts on what the cluster asks of this node.
    async fn on_signal(&self, signal: Signal) {
        match signal {
            Signal::Fenced(key) => {
                let live = self.shared.live.get(&key).map(|l| l.actor.clone());
                if let Some(actor) = live {
                    let _ = actor.cast(TaskMsg::Fenced);
                }
            }
            Signal::Adopted(task) => {
                self.resume(task).await;
            }
            Signal::Deliver(deliveries) => self.webhooks.deliver(deliveries),
            Signal::SelfFenced => {
                self.tell_live(|| TaskMsg::Fenced);
            }
        }
    }

    /// Takes up a task the store held unfinished (after a restart, or taken over from
    /// another node): queued tasks are queued again, a task that was working fails (its
    /// agent's work is lost with the process), runs again (`on_node_loss = "resume"`) or
    /// is taken up where its work goes on (a backend that [`Agent::takes_up`] and left a note),
    /// an interrupted one waits for its continuing message again. A task taken to be
    /// canceled or continued here ([`Orphan::Held`]) waits for that.
    async fn resume(&self, r: RecoveredTask) -> Option<LiveTask> {
        let Some(agent) = self.agent(&r.key.agent) else {
            tracing::warn!(task = %r.key.task, agent = %r.key.agent, "a stored task's agent is no longer configured; left as it was");
            return None;
        };
        let message = r.task.history.first().cloned()?;
        let runs = match r.task.status.state {
            crate::model::TaskState::Submitted => r.why != Orphan::Held,
            // Run again from its first message, or taken up where its work goes on
            // (a backend's note says where: the `a2a` backend's upstream task).
            crate::model::TaskState::Working => {
                r.why == Orphan::NodeLost { rerun: true }
                    || (agent.backend.takes_up() && r.task.note.is_some() && r.why != Orphan::Held)
            }
            _ => false,
        };
        let admission = if runs {
            agent.scheduler.admit().ok()
        } else {
            None
        };
        let context_id = r.task.context_id.clone();
        let _ = self.shared.contexts.cast(ContextMsg::Resume {
            key: ContextKey {
                principal: r.key.principal.clone(),
                context: context_id.clone(),
            },
            turn: r.turn,
        });
        let args = Box::new(TaskArgs {
            shared: self.shared.clone(),
            agent,
            key: r.key.clone(),
            context_id: context_id.clone(),
            message: message.clone(),
            metadata: r.task.metadata.clone(),
            extensions: r.task.extensions.clone(),
            history: Vec::new(),
            turn: r.turn,
            // Its record's own times replace it (`restore`).
            submitted: chrono::Utc::now(),
            admission,
            follow: Follow::Nobody,
            restored: Some((r.task.clone(), r.events)),
            why: r.why,
            span: None,
            starts_itself: false,
        });
        match Actor::spawn_linked(None, TaskActor, args, self.supervisor.get_cell()).await {
            Ok((actor, _)) => {
                self.shared.metrics.live_tasks.fetch_add(1, Relaxed);
                let live = LiveTask::new(actor.clone(), &message, &context_id);
                self.shared.live.insert(r.key, live.clone());
                if r.why != Orphan::Held {
                    let _ = actor.cast(TaskMsg::Start);
                }
                Some(live)
            }
            Err(e) => {
                tracing::error!(error = %e, task = %r.key.task, "a stored task could not be resumed");
                None
            }
        }
    }

    /// Takes a task that runs on another node to this one (to cancel or continue it
    /// here). `None` when it finished meanwhile.
    pub(super) async fn take(&self, key: &TaskKey) -> Result<Option<LiveTask>> {
        let Some(cluster) = &self.shared.cluster else {
            return Ok(None);
        };
        match cluster.adopt(key).await? {
            Some(task) => Ok(self.resume(task).await),
            None => Ok(None),
        }
    }
}
