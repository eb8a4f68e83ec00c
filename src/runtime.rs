//! The public API of the actor system, [`Runtime`]: submit a message, follow a task, get
//! it, cancel it, list tasks, manage push configurations, read an agent's card. Usable
//! without HTTP (see `examples/embed.rs`). Every dialect goes through it; it speaks none.

use std::collections::{HashMap, VecDeque};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::Relaxed};
use std::time::Duration;

use dashmap::DashMap;
use ractor::rpc::CallResult;
use ractor::{Actor, ActorRef};
use tokio::sync::{mpsc, oneshot};

mod request;
mod submit;

pub use crate::stream::{Replay, Resubscribed, StreamItem, TaskStream};
pub use request::{
    AgentCard, NewPushConfig, SendRequest, Sent, Streamed, SubmitOptions, TaskIdUse,
};

use crate::actors::context::{ContextActor, ContextArgs, ContextMsg};
use crate::actors::remote;
use crate::actors::supervisor::{SupervisorMsg, TaskSupervisor};
use crate::actors::task::{Follow, Subscriber, TaskActor, TaskArgs, TaskMsg};
use crate::actors::webhook::{WebhookMetrics, WebhookPool};
use crate::actors::{AgentEntry, ContextKey, LiveTask, Shared};
use crate::agent::{self, Agent};
use crate::config::{Config, StoreBackend};
use crate::error::{Error, Result};
use crate::limits::Scheduler;
use crate::metrics::{AgentMetrics, Metrics};
use crate::model::{
    AgentId, ContextId, Message, Principal, TaskEvent, TaskId, TaskKey, TaskSnapshot,
};
use crate::push::{PushScope, StoredPushConfig};
use crate::store::cluster::{Cluster, ClusterStats, Signal};
use crate::store::pg::PgStore;
use crate::store::{
    Durable, ListPage, ListQuery, LocalStore, Orphan, RecoveredTask, Store, StoreStats, Write,
};
use crate::webhook::PayloadRenderer;

/// The running actor system. Cheap to clone; every clone drives the same system.
#[derive(Clone)]
pub struct Runtime {
    pub(crate) shared: Arc<Shared>,
    pub(crate) agents: Arc<HashMap<AgentId, Arc<AgentEntry>>>,
    pub(crate) supervisor: ActorRef<SupervisorMsg>,
    webhooks: Arc<WebhookPool>,
    /// The task that acts on the cluster's signals (stopped at shutdown).
    signals: Arc<std::sync::Mutex<Option<tokio::task::JoinHandle<()>>>>,
}

fn this_signals(
    runtime: &Runtime,
) -> std::sync::MutexGuard<'_, Option<tokio::task::JoinHandle<()>>> {
    runtime.signals.lock().unwrap_or_else(|e| e.into_inner())
}

// === impl Runtime ===

impl Runtime {
    /// Starts the actor system for a validated configuration, with the backends the
    /// configuration names.
    ///
    /// # Errors
    /// [`Error::Internal`] if an actor cannot be spawned.
    pub async fn start(config: Arc<Config>) -> Result<Self> {
        Self::start_with(config, HashMap::new()).await
    }

    /// Like [`Runtime::start`], with some agents served by the given backends instead of
    /// the configured ones (how an embedder plugs its own [`Agent`] in).
    ///
    /// # Errors
    /// [`Error::Internal`] if an actor cannot be spawned.
    pub async fn start_with(
        config: Arc<Config>,
        backends: HashMap<AgentId, Arc<dyn Agent>>,
    ) -> Result<Self> {
        Self::start_full(config, backends, HashMap::new()).await
    }

    /// Like [`Runtime::start_with`], with webhook payload renderers by format name (each
    /// dialect registers its own; see [`PayloadRenderer`]).
    ///
    /// # Errors
    /// [`Error::Internal`] if an actor cannot be spawned.
    pub async fn start_full(
        config: Arc<Config>,
        mut backends: HashMap<AgentId, Arc<dyn Agent>>,
        renderers: HashMap<String, Arc<dyn PayloadRenderer>>,
    ) -> Result<Self> {
        let server = &config.server;
        let retention = Duration::from_secs_f64(server.task_retention_seconds);
        let agents: Arc<HashMap<AgentId, Arc<AgentEntry>>> = Arc::new(
            config
                .agents
                .iter()
                .enumerate()
                .map(|(index, c)| {
                    let id = AgentId::new(c.id.as_str());
                    let backend = backends
                        .remove(&id)
                        .unwrap_or_else(|| agent::from_config(c));
                    let entry = AgentEntry {
                        config: c.clone(),
                        index,
                        backend,
                        scheduler: Scheduler::new(c.limits.concurrent_tasks, c.limits.max_queued()),
                        metrics: AgentMetrics::default(),
                    };
                    (id, Arc::new(entry))
                })
                .collect(),
        );
        let (store, cluster): (Arc<dyn Store>, Option<Arc<dyn Cluster>>) = match &config.cluster {
            None => (Arc::new(LocalStore::open(&config)?), None),
            Some(c) => {
                let rerun = agents
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
        let (contexts, _) = Actor::spawn(
            None,
            ContextActor,
            ContextArgs {
                retention,
                max_turns: server.max_context_turns,
                max_contexts: server.max_contexts,
                store: store.clone(),
                restored: recovered.contexts,
            },
        )
        .await
        .map_err(spawn_failed)?;
        let shared = Arc::new(Shared {
            live: DashMap::default(),
            store,
            cluster,
            metrics: Metrics::default(),
            contexts,
            webhooks: webhooks.clone(),
            next_subscriber: AtomicU64::new(1),
            shutting_down: AtomicBool::new(false),
            call_timeout: Duration::from_secs_f64(server.actor_call_timeout_seconds),
            config: config.clone(),
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
                let actors: Vec<_> = self
                    .shared
                    .live
                    .iter()
                    .map(|e| e.value().actor.clone())
                    .collect();
                for actor in actors {
                    let _ = actor.cast(TaskMsg::Fenced);
                }
            }
        }
    }

    /// Takes up a task the store held unfinished (after a restart, or taken over from
    /// another node): queued tasks are queued again, a task that was working fails (its
    /// agent's work is lost with the process) or runs again (`on_node_loss = "resume"`),
    /// an interrupted one waits for its continuing message again. A task taken to be
    /// canceled or continued here ([`Orphan::Held`]) waits for that.
    async fn resume(&self, r: RecoveredTask) -> Option<LiveTask> {
        let Some(agent) = self.agents.get(&r.key.agent).cloned() else {
            tracing::warn!(task = %r.key.task, agent = %r.key.agent, "a stored task's agent is no longer configured; left as it was");
            return None;
        };
        let message = r.task.history.first().cloned()?;
        let runs = match r.task.status.state {
            crate::model::TaskState::Submitted => r.why != Orphan::Held,
            crate::model::TaskState::Working => r.why == Orphan::NodeLost { rerun: true },
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
        let args = TaskArgs {
            shared: self.shared.clone(),
            agent,
            key: r.key.clone(),
            context_id: context_id.clone(),
            message: message.clone(),
            metadata: r.task.metadata.clone(),
            history: Vec::new(),
            turn: r.turn,
            admission,
            follow: Follow::Nobody,
            restored: Some((r.task.clone(), r.events)),
            why: r.why,
        };
        match Actor::spawn_linked(None, TaskActor, args, self.supervisor.get_cell()).await {
            Ok((actor, _)) => {
                self.shared.metrics.live_tasks.fetch_add(1, Relaxed);
                let live = LiveTask {
                    actor: actor.clone(),
                    message_id: message.message_id.as_str().into(),
                    context_id,
                };
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
    async fn take(&self, key: &TaskKey) -> Result<Option<LiveTask>> {
        let Some(cluster) = &self.shared.cluster else {
            return Ok(None);
        };
        match cluster.adopt(key).await? {
            Some(task) => Ok(self.resume(task).await),
            None => Ok(None),
        }
    }

    /// This node may take traffic: in a cluster, it holds its lease (always true alone).
    pub fn serving(&self) -> bool {
        self.shared.cluster.as_ref().is_none_or(|c| c.serving())
    }

    /// Part of a cluster.
    pub fn is_clustered(&self) -> bool {
        self.shared.cluster.is_some()
    }

    /// How often the cluster's nodes share counters (`None` alone).
    pub(crate) fn cluster_tick(&self) -> Option<Duration> {
        self.shared.cluster.as_ref().map(|c| c.tick())
    }

    /// Shares this node's cumulative counters; the sums of the other nodes'.
    pub(crate) async fn share(
        &self,
        mine: Vec<(String, i64)>,
    ) -> Result<std::collections::HashMap<String, i64>> {
        match &self.shared.cluster {
            Some(c) => c.share(mine).await,
            None => Ok(std::collections::HashMap::new()),
        }
    }

    /// Cluster counters (`None` for a node alone).
    pub(crate) fn cluster_stats(&self) -> Option<(String, ClusterStats)> {
        self.shared
            .cluster
            .as_ref()
            .map(|c| (c.node_id().to_string(), c.stats()))
    }

    /// The configuration this runtime runs.
    pub fn config(&self) -> &Arc<Config> {
        &self.shared.config
    }

    /// An agent by id.
    pub fn agent(&self, id: &AgentId) -> Option<&Arc<AgentEntry>> {
        self.agents.get(id)
    }

    /// Server-wide gauges.
    pub fn metrics(&self) -> &Metrics {
        &self.shared.metrics
    }

    /// Webhook delivery counters.
    pub fn webhook_metrics(&self) -> &WebhookMetrics {
        self.webhooks.metrics()
    }

    /// The store's commits are failing: nothing new is acknowledged until they succeed.
    pub fn store_failing(&self) -> bool {
        self.shared.store.failing()
    }

    /// Store counters (retained tasks, writes in flight, commits).
    pub fn store_stats(&self) -> StoreStats {
        self.shared.store.stats()
    }

    /// Finished tasks currently retained.
    pub fn finished_tasks(&self) -> usize {
        self.shared.store.stats().finished_tasks
    }

    /// About how many bytes the retained finished tasks hold.
    pub fn finished_bytes(&self) -> u64 {
        self.shared.store.stats().finished_bytes
    }

    /// Appends writes and waits (bounded by the actor call time-out) until they are
    /// durable.
    pub(crate) async fn durable(&self, writes: Vec<Write>) -> Result<()> {
        let (tx, rx) = oneshot::channel();
        let then = Box::new(move |_| {
            let _ = tx.send(());
        });
        match self.shared.store.append(writes, Some(then)) {
            Durable::Now(_) => Ok(()),
            Durable::Later => match tokio::time::timeout(self.shared.call_timeout, rx).await {
                Ok(Ok(())) => Ok(()),
                _ => Err(Error::Busy),
            },
        }
    }

    /// The agent's card with live metrics.
    pub fn card(&self, agent: &AgentId) -> Option<AgentCard> {
        self.agents.get(agent).map(|a| AgentCard {
            config: a.config.clone(),
            kind: a.backend.kind().to_string(),
            metrics: a.metrics.snapshot(),
        })
    }

    /// Submits a message and waits up to `wait` for the task's run to end; `None` returns
    /// at once with the task as created. Returns the task as it stands.
    ///
    /// # Errors
    /// Validation, ownership, idempotency and admission errors (see docs/PROTOCOL.md).
    pub async fn send(
        &self,
        principal: &Principal,
        agent: &AgentId,
        request: SendRequest,
        wait: Option<Duration>,
    ) -> Result<TaskSnapshot> {
        match self
            .send_with(principal, agent, request, wait, SubmitOptions::default())
            .await?
        {
            Sent::Task(t) => Ok(t),
            // Not allowed by the default options; kept total.
            Sent::Message(_) => Err(Error::Internal),
        }
    }

    /// [`Runtime::send`] with the options a dialect found in the request.
    ///
    /// # Errors
    /// As [`Runtime::send`], plus [`Error::TaskNotContinuable`] and
    /// [`Error::ContextMismatch`] when continuing a task.
    pub async fn send_with(
        &self,
        principal: &Principal,
        agent: &AgentId,
        request: SendRequest,
        wait: Option<Duration>,
        options: SubmitOptions,
    ) -> Result<Sent> {
        if let Some(reply) = self.direct_reply(agent, &request, &options)? {
            return Ok(Sent::Message(reply));
        }
        let (tx, rx) = oneshot::channel();
        let follow = match wait {
            Some(_) => Follow::Final(tx),
            None => Follow::Nobody,
        };
        match self
            .submit(principal, agent, request, follow, options)
            .await?
        {
            submit::Submitted::Fresh { key, .. } | submit::Submitted::Continued { key, .. } => {
                match wait {
                    Some(wait) => self.await_final(&key, rx, wait).await.map(Sent::Task),
                    None => self.get_key(&key).await.map(Sent::Task),
                }
            }
            submit::Submitted::Existing(_, submit::Existing::Finished(f)) => {
                Ok(Sent::Task((*f).clone()))
            }
            submit::Submitted::Existing(key, submit::Existing::Live(live)) => match wait {
                None => self.get_live(&key, live).await.map(Sent::Task),
                Some(wait) => {
                    let (tx, rx) = oneshot::channel();
                    let _ = live.actor.cast(TaskMsg::WaitFinal(tx));
                    self.await_final(&key, rx, wait).await.map(Sent::Task)
                }
            },
            submit::Submitted::Existing(key, submit::Existing::Remote(r)) => match wait {
                None => Ok(Sent::Task((*r).clone())),
                Some(wait) => {
                    let (tx, rx) = oneshot::channel();
                    remote::try_spawn(
                        self.shared.clone(),
                        key.clone(),
                        r.seq,
                        remote::Sink::Final(tx),
                    )?;
                    self.await_final(&key, rx, wait).await.map(Sent::Task)
                }
            },
        }
    }

    fn direct_reply(
        &self,
        agent: &AgentId,
        request: &SendRequest,
        options: &SubmitOptions,
    ) -> Result<Option<Message>> {
        if !options.allow_message || request.task_id.is_some() {
            return Ok(None);
        }
        let entry = self.agents.get(agent).ok_or(Error::AgentNotFound)?;
        Ok(entry.backend.direct_reply(&request.message))
    }

    /// Waits up to `wait` for the end of the run, else returns the task as it stands.
    async fn await_final(
        &self,
        key: &TaskKey,
        rx: oneshot::Receiver<TaskSnapshot>,
        wait: Duration,
    ) -> Result<TaskSnapshot> {
        match tokio::time::timeout(wait, rx).await {
            Ok(Ok(snapshot)) => Ok(snapshot),
            // Timed out, or the actor ended without answering: read it again.
            _ => self.get_key(key).await,
        }
    }

    /// Submits a message and follows the task as a stream from its first event.
    ///
    /// # Errors
    /// As [`Runtime::send`], plus [`Error::SubscriptionFailed`].
    pub async fn stream(
        &self,
        principal: &Principal,
        agent: &AgentId,
        request: SendRequest,
    ) -> Result<TaskStream> {
        match self
            .stream_with(principal, agent, request, SubmitOptions::default())
            .await?
        {
            Streamed::Task(s) => Ok(s),
            Streamed::Message(_) => Err(Error::Internal),
        }
    }

    /// [`Runtime::stream`] with the options a dialect found in the request.
    ///
    /// # Errors
    /// As [`Runtime::send_with`], plus [`Error::SubscriptionFailed`].
    pub async fn stream_with(
        &self,
        principal: &Principal,
        agent: &AgentId,
        request: SendRequest,
        options: SubmitOptions,
    ) -> Result<Streamed> {
        if let Some(reply) = self.direct_reply(agent, &request, &options)? {
            return Ok(Streamed::Message(reply));
        }
        let (subscriber, rx) = self.subscriber();
        let id = subscriber.id;
        let stream = match self
            .submit(
                principal,
                agent,
                request,
                Follow::Stream(subscriber),
                options,
            )
            .await?
        {
            submit::Submitted::Fresh {
                key,
                context_id,
                actor,
            } => {
                // Let the new task's first turns run before the response head goes out:
                // an agent that answers at once then has every event of its stream in the
                // first write (one `writev` instead of two; docs/PERFORMANCE.md).
                tokio::task::yield_now().await;
                self.task_stream(
                    key.task,
                    context_id,
                    VecDeque::new(),
                    Some(rx),
                    Some((actor, id)),
                )
            }
            // A continued task's stream starts with the `working` event its new run makes
            // (the task as it stands then, the new message in its history).
            submit::Submitted::Continued {
                key,
                context_id,
                actor,
            } => self.task_stream(
                key.task,
                context_id,
                VecDeque::new(),
                Some(rx),
                Some((actor, id)),
            ),
            submit::Submitted::Existing(_, submit::Existing::Finished(f)) => {
                self.finished_stream(&f)
            }
            submit::Submitted::Existing(key, submit::Existing::Live(live)) => {
                match self.subscribe_live(&key, live, Replay::All, false).await? {
                    Resubscribed::Live(s) => s,
                    Resubscribed::Finished(f) => self.finished_stream(&f),
                }
            }
            submit::Submitted::Existing(key, submit::Existing::Remote(r)) => {
                self.remote_stream(&key, &r, Replay::All)?
            }
        };
        Ok(Streamed::Task(stream))
    }

    /// The task as it stands.
    ///
    /// # Errors
    /// [`Error::TaskNotFound`] when this principal has no such task on this agent.
    pub async fn get(
        &self,
        principal: &Principal,
        agent: &AgentId,
        task: &TaskId,
    ) -> Result<TaskSnapshot> {
        self.get_key(&task_key(principal, agent, task)).await
    }

    pub(crate) async fn get_key(&self, key: &TaskKey) -> Result<TaskSnapshot> {
        match self.find(key).await? {
            Some(submit::Existing::Live(live)) => self.get_live(key, live).await,
            Some(submit::Existing::Finished(f) | submit::Existing::Remote(f)) => Ok((*f).clone()),
            None => Err(Error::TaskNotFound {
                task: key.task.clone(),
            }),
        }
    }

    async fn get_live(&self, key: &TaskKey, live: LiveTask) -> Result<TaskSnapshot> {
        match live
            .actor
            .call(TaskMsg::Get, Some(self.shared.call_timeout))
            .await
        {
            Ok(CallResult::Success(s)) => Ok(s),
            Ok(CallResult::Timeout) => Err(Error::Busy),
            // The actor ended between the lookup and the call: it left a record first.
            _ => self
                .shared
                .store
                .task(key)
                .await?
                .map(|f| (*f).clone())
                .ok_or_else(|| Error::TaskNotFound {
                    task: key.task.clone(),
                }),
        }
    }

    /// One page of this principal's tasks on this agent (docs/PROTOCOL.md §10.6).
    ///
    /// # Errors
    /// [`Error::Internal`] when the store cannot be read.
    pub async fn list(&self, query: &ListQuery) -> Result<ListPage> {
        self.shared.store.list(query).await
    }

    /// Cancels a submitted, working or interrupted task.
    ///
    /// # Errors
    /// [`Error::TaskNotFound`], [`Error::TaskFinished`] (completed, failed or rejected),
    /// [`Error::TaskCanceled`], or [`Error::CancelFailed`] when it ended meanwhile.
    pub async fn cancel(
        &self,
        principal: &Principal,
        agent: &AgentId,
        task: &TaskId,
        reason: Option<String>,
    ) -> Result<TaskSnapshot> {
        let key = task_key(principal, agent, task);
        let reason: Arc<str> = reason.as_deref().unwrap_or("Canceled by user").into();
        let live = match self.find(&key).await? {
            None => return Err(Error::TaskNotFound { task: task.clone() }),
            Some(submit::Existing::Finished(f)) => return Err(submit::finished_error(&f)),
            Some(submit::Existing::Live(live)) => live,
            // Another node runs it: take it here (its runner stops the agent when told, or
            // at its next append at the latest) and cancel it here.
            Some(submit::Existing::Remote(_)) => match self.take(&key).await? {
                Some(live) => live,
                None => {
                    return match self.shared.store.task(&key).await? {
                        Some(f) => Err(Error::CancelFailed {
                            task: task.clone(),
                            state: f.status.state,
                        }),
                        None => Err(Error::TaskNotFound { task: task.clone() }),
                    };
                }
            },
        };
        {
            {
                let call = live.actor.call(
                    |reply| TaskMsg::Cancel {
                        reason,
                        reply: Some(reply),
                    },
                    Some(self.shared.call_timeout),
                );
                match call.await {
                    Ok(CallResult::Success(outcome)) => outcome,
                    Ok(CallResult::Timeout) => Err(Error::Busy),
                    _ => match self.shared.store.task(&key).await? {
                        Some(f) => Err(Error::CancelFailed {
                            task: task.clone(),
                            state: f.status.state,
                        }),
                        None => Err(Error::TaskNotFound { task: task.clone() }),
                    },
                }
            }
        }
    }

    /// Follows an existing task: a stream when it is running, its final state when not.
    ///
    /// # Errors
    /// [`Error::TaskNotFound`], or [`Error::SubscriptionFailed`] at the subscriber limit.
    pub async fn resubscribe(
        &self,
        principal: &Principal,
        agent: &AgentId,
        task: &TaskId,
        replay: Replay,
    ) -> Result<Resubscribed> {
        self.subscribe(principal, agent, task, replay, false).await
    }

    /// Follows a task from where it stands (the official subscribe): the current state
    /// first, then live events to the end of the run — or, when the task waits for input
    /// (interrupted), through the run its continuing message starts.
    ///
    /// # Errors
    /// [`Error::TaskNotFound`], or [`Error::SubscriptionFailed`] at the subscriber limit.
    pub async fn follow(
        &self,
        principal: &Principal,
        agent: &AgentId,
        task: &TaskId,
    ) -> Result<Resubscribed> {
        self.subscribe(principal, agent, task, Replay::Current, true)
            .await
    }

    async fn subscribe(
        &self,
        principal: &Principal,
        agent: &AgentId,
        task: &TaskId,
        replay: Replay,
        next_run: bool,
    ) -> Result<Resubscribed> {
        let key = task_key(principal, agent, task);
        match self.find(&key).await? {
            None => Err(Error::TaskNotFound { task: task.clone() }),
            Some(submit::Existing::Finished(f)) => Ok(Resubscribed::Finished(f)),
            Some(submit::Existing::Live(live)) => {
                self.subscribe_live(&key, live, replay, next_run).await
            }
            Some(submit::Existing::Remote(r)) if r.status.state.ends_stream() && !next_run => {
                Ok(Resubscribed::Finished(r))
            }
            Some(submit::Existing::Remote(r)) => {
                Ok(Resubscribed::Live(self.remote_stream(&key, &r, replay)?))
            }
        }
    }

    /// A stream of a task another node runs, read from the shared store: the events
    /// `replay` asks for, then each new one, to the end of the run.
    ///
    /// # Errors
    /// [`Error::Busy`] when this node holds `cluster.max_followers` followers.
    fn remote_stream(
        &self,
        key: &TaskKey,
        r: &Arc<TaskSnapshot>,
        replay: Replay,
    ) -> Result<TaskStream> {
        let (tx, rx) = mpsc::channel(self.shared.config.server.stream_buffer);
        let mut pending = VecDeque::new();
        let cursor = match replay {
            Replay::All => 0,
            Replay::After(n) => n,
            Replay::Current => {
                pending.push_back(StreamItem {
                    event: Arc::new(r.current_event()),
                    task: r.clone(),
                });
                r.seq
            }
        };
        remote::try_spawn(
            self.shared.clone(),
            key.clone(),
            cursor,
            remote::Sink::Stream(tx),
        )?;
        Ok(self.task_stream(
            key.task.clone(),
            r.context_id.clone(),
            pending,
            Some(rx),
            None,
        ))
    }

    /// A one-event stream carrying a finished task's final state.
    pub fn finished_stream(&self, snapshot: &Arc<TaskSnapshot>) -> TaskStream {
        let item = StreamItem {
            event: Arc::new(snapshot.current_event()),
            task: snapshot.clone(),
        };
        self.task_stream(
            snapshot.id.clone(),
            snapshot.context_id.clone(),
            VecDeque::from([item]),
            None,
            None,
        )
    }

    /// A finished task's events after `after`, as the store kept them, ending with its final
    /// state (a `Last-Event-ID` replay that picks up where a stream broke, a restart
    /// included). A store that keeps no events of finished tasks (memory) gives the
    /// one-event stream of [`Runtime::finished_stream`].
    pub async fn finished_stream_after(
        &self,
        principal: &Principal,
        agent: &AgentId,
        snapshot: &Arc<TaskSnapshot>,
        after: u64,
    ) -> TaskStream {
        let key = task_key(principal, agent, &snapshot.id);
        let events: Vec<TaskEvent> = self
            .shared
            .store
            .events(&key, after)
            .await
            .unwrap_or_default();
        let complete = events
            .last()
            .is_some_and(|e| e.seq == snapshot.seq && e.is_final());
        if !complete {
            return self.finished_stream(snapshot);
        }
        let items = events
            .into_iter()
            .map(|e| StreamItem {
                event: Arc::new(e),
                task: snapshot.clone(),
            })
            .collect();
        self.task_stream(
            snapshot.id.clone(),
            snapshot.context_id.clone(),
            items,
            None,
            None,
        )
    }

    async fn subscribe_live(
        &self,
        key: &TaskKey,
        live: LiveTask,
        replay: Replay,
        next_run: bool,
    ) -> Result<Resubscribed> {
        let (subscriber, rx) = self.subscriber();
        let id = subscriber.id;
        let call = live.actor.call(
            |reply| TaskMsg::Subscribe {
                subscriber,
                replay,
                next_run,
                reply,
            },
            Some(self.shared.call_timeout),
        );
        match call.await {
            Ok(CallResult::Success(Ok(items))) => {
                // A waiting task's current (interrupted) event does not end a stream that
                // follows its next run.
                let waits = next_run
                    && items
                        .last()
                        .is_some_and(|e| e.artifact.is_none() && e.status.state.is_interrupted());
                let finished = !waits && items.last().is_some_and(|e| e.is_final());
                let mut stream = self.task_stream(
                    key.task.clone(),
                    live.context_id,
                    items.into(),
                    (!finished).then_some(rx),
                    Some((live.actor, id)),
                );
                if waits {
                    stream.through_next_run();
                }
                Ok(Resubscribed::Live(stream))
            }
            Ok(CallResult::Success(Err(e))) => Err(e),
            Ok(CallResult::Timeout) => Err(Error::Busy),
            _ => match self.shared.store.task(key).await? {
                Some(f) => Ok(Resubscribed::Finished(f)),
                None => Err(Error::TaskNotFound {
                    task: key.task.clone(),
                }),
            },
        }
    }

    fn subscriber(&self) -> (Subscriber, mpsc::Receiver<StreamItem>) {
        let (tx, rx) = mpsc::channel(self.shared.config.server.stream_buffer);
        let id = self.shared.next_subscriber.fetch_add(1, Relaxed);
        (Subscriber { id, tx }, rx)
    }

    fn task_stream(
        &self,
        task_id: TaskId,
        context_id: ContextId,
        pending: VecDeque<StreamItem>,
        rx: Option<mpsc::Receiver<StreamItem>>,
        task: Option<(ActorRef<TaskMsg>, u64)>,
    ) -> TaskStream {
        self.shared.metrics.open_streams.fetch_add(1, Relaxed);
        let shared = self.shared.clone();
        let on_drop = Box::new(move || {
            shared.metrics.open_streams.fetch_sub(1, Relaxed);
            if let Some((actor, id)) = task {
                let _ = actor.cast(TaskMsg::Unsubscribe(id));
            }
        });
        TaskStream::new(task_id, context_id, pending, rx, on_drop)
    }

    // --- push configurations ---

    /// Stores a push configuration (scoped: replaces its scope's; named: replaces the
    /// same task and id) and answers once it is durable. A task-scoped configuration needs
    /// the caller's task.
    ///
    /// # Errors
    /// [`Error::TaskNotFound`] when the task is not this caller's; over the per-task cap,
    /// [`Error::InvalidParams`].
    pub async fn set_push(&self, config: Arc<StoredPushConfig>) -> Result<()> {
        if let Some(task) = &config.scope.task {
            // Scoping to a task requires that this caller owns it.
            self.get(&config.scope.principal, &config.scope.agent, task)
                .await?;
        }
        let max = self.shared.config.webhooks.max_configs_per_task;
        self.shared.store.push_check(&config, max).await?;
        self.shared.store.push_reserve(&config, max)?;
        self.durable(vec![Write::PushSet(config)]).await
    }

    /// The named configurations of a task of this caller.
    ///
    /// # Errors
    /// [`Error::TaskNotFound`] when the task is not this caller's.
    pub async fn task_push_configs(
        &self,
        principal: &Principal,
        agent: &AgentId,
        task: &TaskId,
    ) -> Result<Vec<Arc<StoredPushConfig>>> {
        self.get(principal, agent, task).await?;
        self.shared
            .store
            .push_named(&task_key(principal, agent, task))
            .await
    }

    /// Removes a named configuration of a task of this caller (idempotent); answers once
    /// the removal is durable.
    ///
    /// # Errors
    /// [`Error::TaskNotFound`] when the task is not this caller's.
    pub async fn delete_push(
        &self,
        principal: &Principal,
        agent: &AgentId,
        task: &TaskId,
        id: &str,
    ) -> Result<()> {
        self.get(principal, agent, task).await?;
        self.durable(vec![Write::PushRemoveNamed {
            task: task_key(principal, agent, task),
            id: id.to_string(),
        }])
        .await
    }

    /// The scoped configuration of a scope.
    ///
    /// # Errors
    /// [`Error::Internal`] when the store cannot be read.
    pub async fn scoped_push(&self, scope: &PushScope) -> Result<Option<Arc<StoredPushConfig>>> {
        self.shared.store.push_scope(scope).await
    }

    /// A scoped configuration of this principal and agent by id.
    ///
    /// # Errors
    /// [`Error::Internal`] when the store cannot be read.
    pub async fn push_by_id(
        &self,
        principal: &Principal,
        agent: &AgentId,
        id: &str,
    ) -> Result<Option<Arc<StoredPushConfig>>> {
        self.shared.store.push_by_id(principal, agent, id).await
    }

    pub(crate) async fn find(&self, key: &TaskKey) -> Result<Option<submit::Existing>> {
        // Live first: an actor's record is durable (and indexed) before it leaves the live
        // index, so a task missed here because it just finished is found in the store.
        if let Some(live) = self.shared.live.get(key) {
            return Ok(Some(submit::Existing::Live(live.value().clone())));
        }
        let shared = self.shared.cluster.is_some();
        Ok(self.shared.store.task(key).await?.map(|t| {
            if shared && !t.status.state.is_terminal() {
                submit::Existing::Remote(t)
            } else {
                submit::Existing::Finished(t)
            }
        }))
    }

    /// Stops taking work, cancels running tasks with reason `shutdown` (so their streams
    /// end with a final `canceled` event), waits up to `grace` for them to end and for
    /// pending webhooks to go out (what is left is logged with its delivery id and
    /// dropped), then stops the actors and closes the store (within what is left of the
    /// grace, at least one second). Returns the writes that never became durable: 0 unless
    /// the store was failing (a full disk, a lost database) when the grace ran out.
    pub async fn shutdown(&self, grace: Duration) -> u64 {
        self.shared.shutting_down.store(true, Relaxed);
        // A durable store keeps tasks that wait for input across the restart.
        let keep_waiting = self.shared.config.store.backend != StoreBackend::Memory
            || self.shared.cluster.is_some();
        // In a cluster, queued tasks are handed to the other nodes.
        let keep_queued = self.shared.cluster.is_some();
        // First no slot goes to a queued task any more: a slot the shutdown frees (by
        // ending a task that works) must not start one while the tasks are being told.
        for agent in self.agents.values() {
            agent.scheduler.close();
        }
        let actors: Vec<_> = self
            .shared
            .live
            .iter()
            .map(|e| e.value().actor.clone())
            .collect();
        for actor in actors {
            let _ = actor.cast(TaskMsg::Shutdown {
                keep_waiting,
                keep_queued,
            });
        }
        let deadline = tokio::time::Instant::now() + grace;
        while self.shared.metrics.live_tasks.load(Relaxed) > 0
            && tokio::time::Instant::now() < deadline
        {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        self.webhooks
            .drain(deadline.saturating_duration_since(tokio::time::Instant::now()))
            .await;
        self.supervisor.stop(None);
        self.shared.contexts.stop(None);
        let store = self.shared.store.clone();
        let within = deadline
            .saturating_duration_since(tokio::time::Instant::now())
            .max(Duration::from_secs(1));
        // Commits what is queued on a blocking thread, within the grace.
        let unwritten = tokio::task::spawn_blocking(move || store.close(within))
            .await
            .unwrap_or(0);
        if let Some(handle) = this_signals(self).take() {
            handle.abort();
        }
        if let Some(cluster) = &self.shared.cluster {
            // The other nodes take this node's queued tasks and pending deliveries now.
            cluster.leave().await;
        }
        unwritten
    }

    /// True once [`Runtime::shutdown`] began.
    pub fn is_shutting_down(&self) -> bool {
        self.shared.shutting_down.load(Relaxed)
    }
}

pub(crate) fn task_key(principal: &Principal, agent: &AgentId, task: &TaskId) -> TaskKey {
    TaskKey {
        principal: principal.clone(),
        agent: agent.clone(),
        task: task.clone(),
    }
}

pub(crate) fn spawn_failed(e: impl std::fmt::Display) -> Error {
    tracing::error!(error = %e, "actor spawn failed");
    Error::Internal
}
