//! The public API of the actor system, [`Runtime`]: submit a message, follow a task, get
//! it, cancel it, list tasks, manage push configurations, read an agent's card. Usable
//! without HTTP (see `examples/embed.rs`). Every dialect goes through it; it speaks none.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use ractor::ActorRef;
use ractor::rpc::CallResult;
use tokio::sync::oneshot;

mod follow;
mod push;
mod request;
mod shutdown;
mod start;
mod submit;

pub use crate::actors::AgentEntry;
pub use crate::store::{ListPage, ListQuery, PageToken};
pub use crate::stream::{Replay, Resubscribed, StreamItem, TaskStream};
pub use request::{
    AgentCard, NewPushConfig, SendRequest, Sent, Streamed, SubmitOptions, TaskIdUse,
};
pub use start::RuntimeBuilder;

use crate::actors::remote;
use crate::actors::supervisor::SupervisorMsg;
use crate::actors::task::{Follow, TaskMsg};
use crate::actors::webhook::WebhookPool;
use crate::actors::{Agents, LiveTask, Shared};
use crate::config::Config;
use crate::error::{Error, Result};
use crate::metrics::{Metrics, WebhookMetrics};
use crate::model::{AgentId, Message, Principal, TaskId, TaskKey, TaskSnapshot};
use crate::store::cluster::ClusterStats;
use crate::store::{Durable, StoreStats, Write};

/// The running actor system. Cheap to clone; every clone drives the same system.
#[derive(Clone)]
pub struct Runtime {
    pub(crate) shared: Arc<Shared>,
    pub(crate) agents: Arc<Agents>,
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
    /// This node may take traffic: in a cluster, it holds its lease (always true alone).
    pub(crate) fn serving(&self) -> bool {
        self.shared.cluster.as_ref().is_none_or(|c| c.serving())
    }

    /// Part of a cluster.
    pub(crate) fn is_clustered(&self) -> bool {
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
    pub fn config(&self) -> Arc<Config> {
        self.shared.in_force.now()
    }

    /// Puts the reloadable sections of `config` in force (docs/CONFIG.md, "Reloading the
    /// configuration"): `[[agents]]` — added, removed, changed; a task under way keeps the
    /// agent it started with, an unchanged agent keeps everything, a changed one its
    /// counters and, where their settings are the same, its backend and task slots —
    /// with `backends` for the new or changed agents that bring their own; `[webhooks]`
    /// (`allow_private_networks`, `max_pending_deliveries`, `max_configs_per_task`;
    /// `workers` keeps its running value); and `[[api_keys]]`/`[auth]` as the
    /// configuration in force says (the server swaps its callers itself). Every other
    /// setting keeps the value the runtime started with. `config` is a checked one
    /// ([`Config::validated`]).
    pub fn reload(&self, config: &Config, mut backends: HashMap<AgentId, Arc<dyn crate::Agent>>) {
        let current = self.agents.now();
        let agents = start::agent_entries(config, &mut backends, &current);
        let mut now = (*self.shared.config).clone();
        now.agents.clone_from(&config.agents);
        now.api_keys.clone_from(&config.api_keys);
        now.auth = config.auth.clone();
        let workers = now.webhooks.workers;
        now.webhooks = config.webhooks.clone();
        now.webhooks.workers = workers;
        self.shared.webhooks.reconfigure(&now.webhooks);
        // The configuration first: a request that finds a new agent finds its settings.
        self.shared.in_force.set(now);
        self.agents.set(agents);
    }

    /// An agent by id.
    pub fn agent(&self, id: &AgentId) -> Option<Arc<AgentEntry>> {
        self.agents.now().get(id).cloned()
    }

    /// A configured agent by its name, with its id as the runtime holds it (a clone of
    /// that id shares its text).
    pub(crate) fn agent_named(&self, id: &str) -> Option<(AgentId, Arc<AgentEntry>)> {
        self.agents
            .now()
            .get_key_value(id)
            .map(|(id, agent)| (id.clone(), Arc::clone(agent)))
    }

    /// Server-wide gauges.
    pub fn metrics(&self) -> &Metrics {
        &self.shared.metrics
    }

    /// Webhook delivery counters.
    pub fn webhook_metrics(&self) -> &WebhookMetrics {
        self.webhooks.metrics()
    }

    /// `principal`'s latest webhook attempts on `agent` (of `task` when given), newest
    /// first, at most `limit`: this node's, since it started.
    pub(crate) fn recent_deliveries(
        &self,
        principal: &Principal,
        agent: &AgentId,
        task: Option<&str>,
        limit: usize,
    ) -> Vec<Arc<crate::webhook::AttemptRecord>> {
        self.webhooks
            .recent()
            .of(&(principal.clone(), agent.clone()), task, limit)
    }

    /// The store's commits are failing: nothing new is acknowledged until they succeed.
    pub(crate) fn store_failing(&self) -> bool {
        self.shared.store.failing()
    }

    /// Store counters (retained tasks, writes in flight, commits).
    pub(crate) fn store_stats(&self) -> StoreStats {
        self.shared.store.stats()
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
        self.agents.now().get(agent).map(|a| {
            let mut config = a.config.clone();
            let upstream = a.backend.upstream().and_then(|u| u.card);
            if let Some(u) = &upstream {
                // The entry's own settings win over the upstream's card.
                config.name = config.name.or_else(|| u.name.clone());
                config.description = config.description.or_else(|| u.description.clone());
                config.streaming = config.streaming.or(Some(u.streaming));
            }
            AgentCard {
                config,
                kind: a.backend.kind().to_string(),
                metrics: a.metrics.snapshot(),
                upstream,
            }
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
    ///
    /// Not an `async fn`, so that its future holds the request and options once
    /// (docs/decisions/the-floor-of-the-design.md).
    #[expect(
        clippy::manual_async_fn,
        reason = "an async fn keeps its arguments twice"
    )]
    pub fn send_with(
        &self,
        principal: &Principal,
        agent: &AgentId,
        request: SendRequest,
        wait: Option<Duration>,
        options: SubmitOptions,
    ) -> impl Future<Output = Result<Sent>> + Send {
        async move {
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
        let entry = self.agent(agent).ok_or(Error::AgentNotFound)?;
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
                .ended_record(key, &live)
                .await?
                .map(|f| (*f).clone())
                .ok_or_else(|| Error::TaskNotFound {
                    task: key.task.clone(),
                }),
        }
    }

    /// The durable record of a task whose actor a call found gone. An actor leaves the
    /// live index before it stops, except one whose end is its commit's
    /// (`actors::task::finale`): it stops before its last events are durable and leaves
    /// once they are. So this first waits, within the actor call time-out, until `live`'s
    /// actor no longer holds `key` there; then the store has the record.
    ///
    /// # Errors
    /// [`Error::Busy`] past the time-out (the store has not committed); the store's.
    pub(crate) async fn ended_record(
        &self,
        key: &TaskKey,
        live: &LiveTask,
    ) -> Result<Option<Arc<TaskSnapshot>>> {
        let actor = live.actor.get_id();
        let held = || {
            self.shared
                .live
                .get(key)
                .is_some_and(|l| l.actor.get_id() == actor)
        };
        let wait = async {
            loop {
                let told = self.shared.settled.notified();
                tokio::pin!(told);
                // Registered before the look, so a removal after it is not missed.
                told.as_mut().enable();
                if !held() {
                    return;
                }
                told.await;
            }
        };
        tokio::time::timeout(self.shared.call_timeout, wait)
            .await
            .map_err(|_| Error::Busy)?;
        self.shared.store.task(key).await
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
                    _ => match self.ended_record(&key, &live).await? {
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
}

impl Runtime {
    /// Casts a message to every live task (collected first: no shard of the live index is
    /// held while casting).
    fn tell_live(&self, message: impl Fn() -> TaskMsg) {
        let actors: Vec<_> = self
            .shared
            .live
            .iter()
            .map(|e| e.value().actor.clone())
            .collect();
        for actor in actors {
            let _ = actor.cast(message());
        }
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
