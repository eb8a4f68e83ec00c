//! The actor system and its public API, [`Runtime`]: submit a message, follow a task,
//! get it, cancel it, read an agent's card. Usable without HTTP (see `examples/embed.rs`).
//!
//! Shape: a [`supervisor::TaskSupervisor`] parents one [`task::TaskActor`] per task; a
//! [`context::ContextActor`] keeps conversations; finished tasks live in a
//! [`TaskStore`]. Invariants (ordering, who calls whom, retention) are in
//! docs/ARCHITECTURE.md.

use std::collections::{HashMap, VecDeque};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::Relaxed};
use std::task::{Context, Poll};
use std::time::Duration;

use dashmap::DashMap;
use dashmap::mapref::entry::Entry;
use foldhash::fast::RandomState;
use ractor::rpc::CallResult;
use ractor::{Actor, ActorRef};
use tokio::sync::{mpsc, oneshot};

pub(crate) mod context;
pub(crate) mod supervisor;
pub(crate) mod task;
pub(crate) mod webhook;

use crate::agent::{self, Agent};
use crate::config::{AgentConfig, Config};
use crate::error::{Error, Result};
use crate::limits::Scheduler;
use crate::metrics::{AgentMetrics, AgentMetricsSnapshot, Metrics};
use crate::model::{
    AgentId, ContextId, Message, Principal, TaskEvent, TaskId, TaskKey, TaskSnapshot, TaskState,
};
use crate::push::{PushConfig, PushScope, StoredPushConfig};
use crate::store::PushStore;
use crate::store::{FinishedTask, MemoryPushStore, MemoryTaskStore, TaskStore};
use context::{ContextActor, ContextArgs, ContextMsg};
use supervisor::{SupervisorMsg, TaskSupervisor};
use task::{Follow, Subscriber, TaskActor, TaskArgs, TaskMsg};
pub use webhook::WebhookMetrics;
use webhook::WebhookPool;

/// A conversation is owned by one principal.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct ContextKey {
    /// The owner.
    pub principal: Principal,
    /// The conversation.
    pub context: ContextId,
}

/// Which earlier events a new stream replays before live ones.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Replay {
    /// Every event from 1.
    All,
    /// Events numbered above this (`Last-Event-ID`).
    After(u64),
    /// Only the event that produced the current state.
    Current,
}

/// A message to submit.
#[derive(Clone, Debug)]
pub struct SendRequest {
    /// The user message (already validated by the caller's dialect).
    pub message: Message,
    /// Continue this conversation; `None` starts a new one.
    pub context_id: Option<ContextId>,
    /// A client-chosen task id (idempotent replays); `None` generates one.
    pub task_id: Option<TaskId>,
    /// Free-form metadata kept with the task: a JSON object, kept as its text.
    pub metadata: Option<Box<serde_json::value::RawValue>>,
}

/// What a request carries beside its message, as its dialect understood it.
#[derive(Debug, Default)]
#[non_exhaustive]
pub struct SubmitOptions {
    /// A push configuration for the new task. It is stored before the task's first
    /// event, so it receives every event it selects from `task.submitted` on. It is not
    /// applied to an idempotent replay (the task exists already).
    pub push: Option<PushConfig>,
}

impl SubmitOptions {
    /// Options with a push configuration for the new task.
    pub fn with_push(push: Option<PushConfig>) -> Self {
        Self { push }
    }
}

/// Hears every state change of every task. The webhook pool plugs in here.
pub trait TaskObserver: Send + Sync + 'static {
    /// A task changed state (`event` is the new state's event).
    fn task_event(
        &self,
        key: &TaskKey,
        context: &ContextId,
        event: &Arc<TaskEvent>,
        created_at: chrono::DateTime<chrono::Utc>,
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

/// An agent's card, dialect-neutral.
#[derive(Clone, Debug)]
pub struct AgentCard {
    /// Its configuration (identity, capabilities, limits).
    pub config: AgentConfig,
    /// `agent.type`: the backend kind.
    pub kind: String,
    /// Live metrics.
    pub metrics: AgentMetricsSnapshot,
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
    next_subscriber: AtomicU64,
    shutting_down: AtomicBool,
    call_timeout: Duration,
}

/// The running actor system. Cheap to clone; every clone drives the same system.
#[derive(Clone)]
pub struct Runtime {
    shared: Arc<Shared>,
    agents: Arc<HashMap<AgentId, Arc<AgentEntry>>>,
    supervisor: ActorRef<SupervisorMsg>,
    webhooks: Arc<WebhookPool>,
}

/// What `submit` did: created the task, or found one with the same client-chosen id.
enum Submitted {
    Fresh {
        key: TaskKey,
        context_id: ContextId,
        actor: ActorRef<TaskMsg>,
    },
    Existing(TaskKey, Existing),
}

/// A task that already exists under a key.
enum Existing {
    Live(LiveTask),
    Finished(FinishedTask),
}

/// A stream of one task's events, ending after the final one.
pub struct TaskStream {
    /// The task.
    pub task_id: TaskId,
    /// Its conversation.
    pub context_id: ContextId,
    pending: VecDeque<Arc<TaskEvent>>,
    rx: Option<mpsc::Receiver<Arc<TaskEvent>>>,
    /// Unsubscribes and updates the open-streams gauge when the stream is dropped.
    _guard: StreamGuard,
    done: bool,
}

struct StreamGuard {
    shared: Arc<Shared>,
    task: Option<(ActorRef<TaskMsg>, u64)>,
}

/// What `resubscribe` found.
pub enum Resubscribed {
    /// The task is running: follow it.
    Live(TaskStream),
    /// The task is terminal: its final state.
    Finished(Arc<TaskSnapshot>),
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
        mut backends: HashMap<AgentId, Arc<dyn Agent>>,
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
        let push: Arc<dyn PushStore> = Arc::new(MemoryPushStore::default());
        let hooks = &config.webhooks;
        let webhooks = Arc::new(
            WebhookPool::start(
                hooks.workers,
                hooks.allow_private_networks,
                hooks.max_pending_deliveries,
                push.clone(),
                agents.clone(),
            )
            .await?,
        );
        let (contexts, _) = Actor::spawn(
            None,
            ContextActor,
            ContextArgs {
                retention,
                max_turns: server.max_context_turns,
                max_contexts: server.max_contexts,
            },
        )
        .await
        .map_err(spawn_failed)?;
        let shared = Arc::new(Shared {
            live: DashMap::default(),
            store: Arc::new(MemoryTaskStore::new(
                retention,
                server.max_finished_tasks,
                server.max_retained_bytes,
            )),
            push,
            metrics: Metrics::default(),
            contexts,
            observer: webhooks.clone(),
            next_subscriber: AtomicU64::new(1),
            shutting_down: AtomicBool::new(false),
            call_timeout: Duration::from_secs_f64(server.actor_call_timeout_seconds),
            config: config.clone(),
        });
        let (supervisor, _) = Actor::spawn(None, TaskSupervisor, shared.clone())
            .await
            .map_err(spawn_failed)?;
        Ok(Self {
            shared,
            agents,
            supervisor,
            webhooks,
        })
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

    /// The push configuration store.
    pub fn push_store(&self) -> &Arc<dyn PushStore> {
        &self.shared.push
    }

    /// Finished tasks currently retained.
    pub fn finished_tasks(&self) -> usize {
        self.shared.store.len()
    }

    /// About how many bytes the retained finished tasks hold.
    pub fn finished_bytes(&self) -> u64 {
        self.shared.store.bytes()
    }

    /// The agent's card with live metrics.
    pub fn card(&self, agent: &AgentId) -> Option<AgentCard> {
        self.agents.get(agent).map(|a| AgentCard {
            config: a.config.clone(),
            kind: a.backend.kind().to_string(),
            metrics: a.metrics.snapshot(),
        })
    }

    /// Submits a message and waits up to `wait` for the task to end; `None` returns at
    /// once with the task as created. Returns the task as it stands.
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
        self.send_with(principal, agent, request, wait, SubmitOptions::default())
            .await
    }

    /// [`Runtime::send`] with the options a dialect found in the request.
    ///
    /// # Errors
    /// As [`Runtime::send`].
    pub async fn send_with(
        &self,
        principal: &Principal,
        agent: &AgentId,
        request: SendRequest,
        wait: Option<Duration>,
        options: SubmitOptions,
    ) -> Result<TaskSnapshot> {
        let (tx, rx) = oneshot::channel();
        let follow = match wait {
            Some(_) => Follow::Final(tx),
            None => Follow::Nobody,
        };
        match self
            .submit(principal, agent, request, follow, options)
            .await?
        {
            Submitted::Fresh { key, .. } => match wait {
                Some(wait) => self.await_final(&key, rx, wait).await,
                None => self.get_key(&key).await,
            },
            Submitted::Existing(_, Existing::Finished(f)) => Ok((*f.snapshot).clone()),
            Submitted::Existing(key, Existing::Live(live)) => match wait {
                None => self.get_live(&key, live).await,
                Some(wait) => {
                    let (tx, rx) = oneshot::channel();
                    let _ = live.actor.cast(TaskMsg::WaitFinal(tx));
                    self.await_final(&key, rx, wait).await
                }
            },
        }
    }

    /// Waits up to `wait` for the final state, else returns the task as it stands.
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
        self.stream_with(principal, agent, request, SubmitOptions::default())
            .await
    }

    /// [`Runtime::stream`] with the options a dialect found in the request.
    ///
    /// # Errors
    /// As [`Runtime::stream`].
    pub async fn stream_with(
        &self,
        principal: &Principal,
        agent: &AgentId,
        request: SendRequest,
        options: SubmitOptions,
    ) -> Result<TaskStream> {
        let (subscriber, rx) = self.subscriber();
        let id = subscriber.id;
        match self
            .submit(
                principal,
                agent,
                request,
                Follow::Stream(subscriber),
                options,
            )
            .await?
        {
            Submitted::Fresh {
                key,
                context_id,
                actor,
            } => Ok(self.task_stream(
                key.task,
                context_id,
                VecDeque::new(),
                Some(rx),
                Some((actor, id)),
            )),
            Submitted::Existing(_, Existing::Finished(f)) => Ok(self.finished_stream(&f.snapshot)),
            Submitted::Existing(key, Existing::Live(live)) => {
                match self.subscribe_live(&key, live, Replay::All).await? {
                    Resubscribed::Live(s) => Ok(s),
                    Resubscribed::Finished(f) => Ok(self.finished_stream(&f)),
                }
            }
        }
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

    async fn get_key(&self, key: &TaskKey) -> Result<TaskSnapshot> {
        match self.find(key) {
            Some(Existing::Live(live)) => self.get_live(key, live).await,
            Some(Existing::Finished(f)) => Ok((*f.snapshot).clone()),
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
                .get(key)
                .map(|f| (*f.snapshot).clone())
                .ok_or_else(|| Error::TaskNotFound {
                    task: key.task.clone(),
                }),
        }
    }

    /// Cancels a submitted or working task.
    ///
    /// # Errors
    /// [`Error::TaskNotFound`], [`Error::TaskFinished`] (completed or failed),
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
        match self.find(&key) {
            None => Err(Error::TaskNotFound { task: task.clone() }),
            Some(Existing::Finished(f)) => Err(finished_error(&f.snapshot)),
            Some(Existing::Live(live)) => {
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
                    _ => match self.shared.store.get(&key) {
                        Some(f) => Err(Error::CancelFailed {
                            task: task.clone(),
                            state: f.snapshot.status.state,
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
        let key = task_key(principal, agent, task);
        match self.find(&key) {
            None => Err(Error::TaskNotFound { task: task.clone() }),
            Some(Existing::Finished(f)) => Ok(Resubscribed::Finished(f.snapshot)),
            Some(Existing::Live(live)) => self.subscribe_live(&key, live, replay).await,
        }
    }

    /// A one-event stream carrying a finished task's final state.
    pub fn finished_stream(&self, snapshot: &TaskSnapshot) -> TaskStream {
        let pending = VecDeque::from([Arc::new(snapshot.current_event())]);
        self.task_stream(
            snapshot.id.clone(),
            snapshot.context_id.clone(),
            pending,
            None,
            None,
        )
    }

    async fn subscribe_live(
        &self,
        key: &TaskKey,
        live: LiveTask,
        replay: Replay,
    ) -> Result<Resubscribed> {
        let (subscriber, rx) = self.subscriber();
        let id = subscriber.id;
        let call = live.actor.call(
            |reply| TaskMsg::Subscribe {
                subscriber,
                replay,
                reply,
            },
            Some(self.shared.call_timeout),
        );
        match call.await {
            Ok(CallResult::Success(Ok(events))) => {
                let finished = events.last().is_some_and(|e| e.is_final());
                Ok(Resubscribed::Live(self.task_stream(
                    key.task.clone(),
                    live.context_id,
                    events.into(),
                    (!finished).then_some(rx),
                    Some((live.actor, id)),
                )))
            }
            Ok(CallResult::Success(Err(e))) => Err(e),
            Ok(CallResult::Timeout) => Err(Error::Busy),
            _ => match self.shared.store.get(key) {
                Some(f) => Ok(Resubscribed::Finished(f.snapshot)),
                None => Err(Error::TaskNotFound {
                    task: key.task.clone(),
                }),
            },
        }
    }

    fn subscriber(&self) -> (Subscriber, mpsc::Receiver<Arc<TaskEvent>>) {
        let (tx, rx) = mpsc::channel(self.shared.config.server.stream_buffer);
        let id = self.shared.next_subscriber.fetch_add(1, Relaxed);
        (Subscriber { id, tx }, rx)
    }

    fn task_stream(
        &self,
        task_id: TaskId,
        context_id: ContextId,
        pending: VecDeque<Arc<TaskEvent>>,
        rx: Option<mpsc::Receiver<Arc<TaskEvent>>>,
        task: Option<(ActorRef<TaskMsg>, u64)>,
    ) -> TaskStream {
        self.shared.metrics.open_streams.fetch_add(1, Relaxed);
        TaskStream {
            task_id,
            context_id,
            pending,
            rx,
            _guard: StreamGuard {
                shared: self.shared.clone(),
                task,
            },
            done: false,
        }
    }

    fn find(&self, key: &TaskKey) -> Option<Existing> {
        // Live first: an actor writes its record before leaving the live index, so a task
        // missed here because it just finished is found in the store.
        if let Some(live) = self.shared.live.get(key) {
            return Some(Existing::Live(live.value().clone()));
        }
        self.shared.store.get(key).map(Existing::Finished)
    }

    /// Creates the task, or finds the existing one with the same client-chosen id.
    async fn submit(
        &self,
        principal: &Principal,
        agent_id: &AgentId,
        request: SendRequest,
        follow: Follow,
        options: SubmitOptions,
    ) -> Result<Submitted> {
        if self.shared.shutting_down.load(Relaxed) {
            return Err(Error::ShuttingDown);
        }
        let agent = self.agents.get(agent_id).ok_or(Error::AgentNotFound)?;
        let task = request.task_id.clone().unwrap_or_else(TaskId::generate);
        let key = task_key(principal, agent_id, &task);
        if request.task_id.is_some()
            && let Some(existing) = self.find(&key)
        {
            return replay_or_conflict(existing, &request.message, &task)
                .map(|e| Submitted::Existing(key, e));
        }
        let live_now = self.shared.metrics.live_tasks.load(Relaxed);
        if live_now >= self.shared.config.server.max_live_tasks as i64 {
            // The server-wide cap answers like a full queue: the client should retry later.
            return Err(Error::TooManyTasks);
        }
        let admission = agent.scheduler.admit()?;

        let (context_id, turn, history) = match request.context_id {
            None => {
                let context = ContextId::generate();
                let ck = ContextKey {
                    principal: principal.clone(),
                    context: context.clone(),
                };
                let _ = self.shared.contexts.cast(ContextMsg::Create { key: ck });
                (context, 1, Vec::new())
            }
            Some(context) => {
                let ck = ContextKey {
                    principal: principal.clone(),
                    context: context.clone(),
                };
                let call = self.shared.contexts.call(
                    |reply| ContextMsg::Open { key: ck, reply },
                    Some(self.shared.call_timeout),
                );
                match call.await {
                    Ok(CallResult::Success(turn)) => (context, turn.number, turn.history),
                    Ok(CallResult::Timeout) => return Err(Error::Busy),
                    Err(_) | Ok(CallResult::SenderError) => return Err(Error::Internal),
                }
            }
        };

        let message = Arc::new(request.message);
        let args = TaskArgs {
            shared: self.shared.clone(),
            agent: agent.clone(),
            key: key.clone(),
            context_id: context_id.clone(),
            message: message.clone(),
            metadata: request.metadata.map(Arc::from),
            history,
            turn,
            admission,
            follow,
        };
        // An inline push configuration is in place before event 1 is recorded, so it
        // hears `task.submitted`; it is undone if the task is not created after all.
        let push_scope = PushScope {
            principal: principal.clone(),
            agent: agent_id.clone(),
            task: Some(task.clone()),
        };
        let mut push = options.push;
        let mut store_push = || match push.take() {
            Some(config) => {
                self.shared
                    .push
                    .set(StoredPushConfig::new(push_scope.clone(), config));
                true
            }
            None => false,
        };
        let undo_push = |stored: bool| {
            if stored {
                self.shared.push.remove(&push_scope);
            }
        };
        let existing = if request.task_id.is_none() {
            // A server-generated id cannot collide: spawn awaiting `pre_start` here (no
            // wrapper task), then index the task, then start its driver.
            let stored = store_push();
            let (actor, _) = Actor::spawn_linked(None, TaskActor, args, self.supervisor.get_cell())
                .await
                .map_err(|e| {
                    undo_push(stored);
                    spawn_failed(e)
                })?;
            self.shared.metrics.live_tasks.fetch_add(1, Relaxed);
            self.shared.live.insert(
                key.clone(),
                LiveTask {
                    actor: actor.clone(),
                    message_id: message.message_id.as_str().into(),
                    context_id: context_id.clone(),
                },
            );
            Ok(actor)
        } else {
            // A client-chosen id: spawn under the index entry's guard (no await inside), so
            // two requests with the same id cannot both create the task. The store is read
            // under the guard too: a finished task writes its record before leaving the index.
            match self.shared.live.entry(key.clone()) {
                Entry::Occupied(o) => Err(Existing::Live(o.get().clone())),
                Entry::Vacant(v) => match self.shared.store.get(&key) {
                    Some(f) => Err(Existing::Finished(f)),
                    None => {
                        let stored = store_push();
                        let (actor, _) = ractor::ActorRuntime::<TaskActor>::spawn_linked_instant(
                            None,
                            TaskActor,
                            args,
                            self.supervisor.get_cell(),
                        )
                        .map_err(|e| {
                            undo_push(stored);
                            spawn_failed(e)
                        })?;
                        self.shared.metrics.live_tasks.fetch_add(1, Relaxed);
                        v.insert(LiveTask {
                            actor: actor.clone(),
                            message_id: message.message_id.as_str().into(),
                            context_id: context_id.clone(),
                        });
                        Ok(actor)
                    }
                },
            }
        };
        if let Ok(actor) = &existing {
            // Queued behind nothing the actor could do first: it starts the driver.
            let _ = actor.cast(TaskMsg::Start);
        }
        match existing {
            Ok(actor) => Ok(Submitted::Fresh {
                key,
                context_id,
                actor,
            }),
            Err(existing) => {
                let _ = self.shared.contexts.cast(ContextMsg::Abandon {
                    key: ContextKey {
                        principal: principal.clone(),
                        context: context_id,
                    },
                });
                replay_or_conflict(existing, &message, &task).map(|e| Submitted::Existing(key, e))
            }
        }
    }

    /// Stops taking work, cancels running tasks with reason `shutdown` (so their streams
    /// end with a final `canceled` event), waits up to `grace` for them to end and for
    /// pending webhooks to go out (what is left is logged with its delivery id and
    /// dropped), then stops the actors.
    pub async fn shutdown(&self, grace: Duration) {
        self.shared.shutting_down.store(true, Relaxed);
        let actors: Vec<_> = self
            .shared
            .live
            .iter()
            .map(|e| e.value().actor.clone())
            .collect();
        for actor in actors {
            let _ = actor.cast(TaskMsg::Cancel {
                reason: "shutdown".into(),
                reply: None,
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
    }

    /// True once [`Runtime::shutdown`] began.
    pub fn is_shutting_down(&self) -> bool {
        self.shared.shutting_down.load(Relaxed)
    }
}

fn task_key(principal: &Principal, agent: &AgentId, task: &TaskId) -> TaskKey {
    TaskKey {
        principal: principal.clone(),
        agent: agent.clone(),
        task: task.clone(),
    }
}

fn spawn_failed(e: impl std::fmt::Display) -> Error {
    tracing::error!(error = %e, "actor spawn failed");
    Error::Internal
}

/// The error for modifying a finished task.
fn finished_error(snapshot: &TaskSnapshot) -> Error {
    match snapshot.status.state {
        TaskState::Canceled => Error::TaskCanceled {
            task: snapshot.id.clone(),
        },
        state => Error::TaskFinished {
            task: snapshot.id.clone(),
            state,
        },
    }
}

/// Same `messageId`: an idempotent replay of the existing task. Otherwise a conflict.
fn replay_or_conflict(existing: Existing, message: &Message, task: &TaskId) -> Result<Existing> {
    let same = match &existing {
        Existing::Live(l) => *l.message_id == *message.message_id,
        Existing::Finished(f) => f.message_id() == message.message_id,
    };
    if same {
        return Ok(existing);
    }
    Err(match existing {
        Existing::Finished(f) => finished_error(&f.snapshot),
        Existing::Live(_) => Error::TaskInProgress { task: task.clone() },
    })
}

// === impl TaskStream ===

impl TaskStream {
    /// The next event; `None` after the final one (or if the task vanished on shutdown).
    pub fn poll_next(&mut self, cx: &mut Context<'_>) -> Poll<Option<Arc<TaskEvent>>> {
        if self.done {
            return Poll::Ready(None);
        }
        let next = match self.pending.pop_front() {
            Some(event) => Some(event),
            None => match self.rx.as_mut() {
                None => None,
                Some(rx) => match rx.poll_recv(cx) {
                    Poll::Pending => return Poll::Pending,
                    Poll::Ready(event) => event,
                },
            },
        };
        match &next {
            Some(event) if !event.is_final() => {}
            _ => {
                self.done = true;
                self.rx = None;
            }
        }
        Poll::Ready(next)
    }

    /// The next event; `None` after the final one.
    pub async fn next(&mut self) -> Option<Arc<TaskEvent>> {
        std::future::poll_fn(|cx| self.poll_next(cx)).await
    }
}

impl Drop for StreamGuard {
    fn drop(&mut self) {
        self.shared.metrics.open_streams.fetch_sub(1, Relaxed);
        if let Some((actor, id)) = self.task.take() {
            let _ = actor.cast(TaskMsg::Unsubscribe(id));
        }
    }
}
