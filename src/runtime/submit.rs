//! Submitting a message: admission, the conversation, idempotent replays of client-chosen
//! ids, continuing an interrupted task, and spawning the task actor.

use std::sync::Arc;
use std::sync::atomic::Ordering::Relaxed;

use dashmap::mapref::entry::Entry;
use ractor::rpc::CallResult;
use ractor::{Actor, ActorRef};

use super::{
    NewPushConfig, Runtime, SendRequest, SubmitOptions, TaskIdUse, spawn_failed, task_key,
};
use crate::actors::context::ContextMsg;
use crate::actors::task::{Follow, TaskActor, TaskArgs, TaskMsg};
use crate::actors::{AgentEntry, ContextKey, LiveTask};
use crate::error::{Error, Result};
use crate::limits::Admission;
use crate::model::{
    AgentId, ContextId, Message, Principal, TaskId, TaskKey, TaskSnapshot, TaskState,
};
use crate::push::{PushScope, StoredPushConfig};
use crate::store::{Store, TurnId, Write};

/// What `submit` did.
pub(crate) enum Submitted {
    /// Created the task.
    Fresh {
        key: TaskKey,
        context_id: ContextId,
        actor: ActorRef<TaskMsg>,
    },
    /// Continued an interrupted task.
    Continued {
        key: TaskKey,
        context_id: ContextId,
        actor: ActorRef<TaskMsg>,
    },
    /// Found the task a client-chosen id names (an idempotent replay).
    Existing(TaskKey, Existing),
}

/// A task that already exists under a key.
pub(crate) enum Existing {
    /// Its actor runs here.
    Live(LiveTask),
    /// Finished: its record.
    Finished(Arc<TaskSnapshot>),
    /// Not finished, and run by another node (cluster): its record as it stands.
    Remote(Arc<TaskSnapshot>),
}

impl Runtime {
    /// Creates the task, finds the existing one with the same client-chosen id, or
    /// continues the interrupted task the request names.
    ///
    /// Not an `async fn`: an `async fn` keeps its arguments twice in its future (as
    /// arguments and as the locals they are moved into), and this future is part of
    /// every new task's request future, moved at each level.
    #[expect(
        clippy::manual_async_fn,
        reason = "an async fn keeps its arguments twice"
    )]
    pub(crate) fn submit(
        &self,
        principal: &Principal,
        agent_id: &AgentId,
        request: SendRequest,
        follow: Follow,
        options: SubmitOptions,
    ) -> impl Future<Output = Result<Submitted>> + Send {
        async move {
            if self.shared.shutting_down.load(Relaxed) {
                return Err(Error::ShuttingDown);
            }
            let agent = self.agent(agent_id).ok_or(Error::AgentNotFound)?;
            if let Some(uri) = agent.config.missing_required(request.extensions.as_slice()) {
                return Err(Error::ExtensionRequired {
                    uri: uri.to_string(),
                });
            }
            if options.task_id == TaskIdUse::Continue
                && let Some(task) = request.task_id.clone()
            {
                // Boxed: continuing a task (1.9 KB of future, restoring it from the store)
                // would otherwise size every new task's request future, moved at each level.
                return Box::pin(self.continue_task(principal, agent_id, &task, request, follow))
                    .await;
            }
            let task = request.task_id.clone().unwrap_or_else(TaskId::generate);
            let key = task_key(principal, agent_id, &task);
            if request.task_id.is_some()
                && let Some(existing) = self.find(&key).await?
            {
                return replay_or_conflict(existing, &request.message, &task)
                    .map(|e| Submitted::Existing(key, e));
            }
            let admission = self.admit(&agent)?;
            let submitted = chrono::Utc::now();
            let (context_id, turn, history) = self
                .open_context(principal, request.context_id, submitted)
                .await?;

            let message = Arc::new(request.message);
            let args = Box::new(TaskArgs {
                shared: self.shared.clone(),
                agent: agent.clone(),
                key: key.clone(),
                context_id: context_id.clone(),
                message: message.clone(),
                metadata: request.metadata.map(Arc::from),
                extensions: request.extensions,
                history,
                turn,
                admission: Some(admission),
                follow,
                restored: None,
                why: crate::store::Orphan::Restart,
                span: crate::telemetry::on()
                    .then(|| crate::telemetry::task_span(&key, context_id.as_str())),
                starts_itself: request.task_id.is_none(),
                submitted,
            });
            let mut push = InlinePush::checked(
                &self.shared.store,
                &key,
                options.push,
                self.shared.in_force.now().webhooks.max_configs_per_task,
            )
            .await?;
            let existing = if request.task_id.is_none() {
                // A server-generated id cannot collide: spawn awaiting `pre_start` here (no
                // wrapper task), where the actor enters the live index; it starts its first run
                // as it begins (`TaskArgs::starts_itself`).
                push.store()?;
                let (actor, _) =
                    Actor::spawn_linked(None, TaskActor, args, self.supervisor.get_cell())
                        .await
                        .map_err(|e| {
                            // Indexed by `pre_start`, then not started (the supervisor stops).
                            if self.shared.live.remove(&key).is_some() {
                                self.shared.metrics.live_tasks.fetch_sub(1, Relaxed);
                            }
                            push.undo();
                            spawn_failed(e)
                        })?;
                Ok(actor)
            } else {
                // A client-chosen id: spawn under the index entry's guard (no await inside), so
                // two requests with the same id cannot both create the task. The store is read
                // under the guard too: a finished task writes its record before leaving the index.
                let existing = match self.shared.live.entry(key.clone()) {
                    Entry::Occupied(o) => Err(Existing::Live(o.get().clone())),
                    Entry::Vacant(v) => match self.shared.store.task_now(&key) {
                        Some(f) => Err(Existing::Finished(f)),
                        None => {
                            push.store()?;
                            let (actor, _) =
                                ractor::ActorRuntime::<TaskActor>::spawn_linked_instant(
                                    None,
                                    TaskActor,
                                    args,
                                    self.supervisor.get_cell(),
                                )
                                .map_err(|e| {
                                    push.undo();
                                    spawn_failed(e)
                                })?;
                            self.shared.metrics.live_tasks.fetch_add(1, Relaxed);
                            v.insert(LiveTask::new(actor.clone(), &message, &context_id));
                            Ok(actor)
                        }
                    },
                };
                if let Ok(actor) = &existing {
                    // Queued behind nothing the actor could do first: it starts the driver.
                    let _ = actor.cast(TaskMsg::Start);
                }
                existing
            };
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
                    replay_or_conflict(existing, &message, &task)
                        .map(|e| Submitted::Existing(key, e))
                }
            }
        }
    }

    /// A slot for a new task: the server-wide cap (or a disk that has fallen behind)
    /// answers like a full queue — the client should retry later — and then the agent's
    /// own slots and queue.
    fn admit(&self, agent: &AgentEntry) -> Result<Admission> {
        let live_now = self.shared.metrics.live_tasks.load(Relaxed);
        if live_now >= self.shared.config.server.max_live_tasks as i64
            || self.shared.store.backlog() >= self.shared.config.store.max_pending_writes
        {
            return Err(Error::TooManyTasks);
        }
        agent.scheduler.admit()
    }

    /// The conversation a new task joins: a new one (starting `now`), or the named one
    /// with its history (a shared store may know turns other nodes recorded).
    async fn open_context(
        &self,
        principal: &Principal,
        context: Option<ContextId>,
        now: chrono::DateTime<chrono::Utc>,
    ) -> Result<(ContextId, TurnId, Vec<Arc<Message>>)> {
        Ok(match context {
            None => {
                let context = ContextId::generate();
                let ck = ContextKey {
                    principal: principal.clone(),
                    context: context.clone(),
                };
                let since = now.timestamp_micros();
                let _ = self
                    .shared
                    .contexts
                    .cast(ContextMsg::Create { key: ck, since });
                (context, TurnId { number: 1, since }, Vec::new())
            }
            Some(context) => {
                let ck = ContextKey {
                    principal: principal.clone(),
                    context: context.clone(),
                };
                // A shared store may know turns other nodes recorded.
                let stored = self.shared.store.conversation(principal, &context).await?;
                let call = self.shared.contexts.call(
                    |reply| ContextMsg::Open {
                        key: ck,
                        stored,
                        reply,
                    },
                    Some(self.shared.call_timeout),
                );
                match call.await {
                    Ok(CallResult::Success(turn)) => (context, turn.id, turn.history),
                    Ok(CallResult::Timeout) => return Err(Error::Busy),
                    Err(_) | Ok(CallResult::SenderError) => return Err(Error::Internal),
                }
            }
        })
    }

    /// Delivers a message to the interrupted task it names.
    async fn continue_task(
        &self,
        principal: &Principal,
        agent_id: &AgentId,
        task: &TaskId,
        request: SendRequest,
        follow: Follow,
    ) -> Result<Submitted> {
        let key = task_key(principal, agent_id, task);
        let (context_id, live) = match self.find(&key).await? {
            None => return Err(Error::TaskNotFound { task: task.clone() }),
            Some(Existing::Finished(f)) => (f.context_id.clone(), None),
            Some(Existing::Live(live)) => (live.context_id.clone(), Some(live)),
            // Another node runs it: take it here, where the message continues it.
            Some(Existing::Remote(r)) if r.status.state.is_interrupted() => {
                (r.context_id.clone(), self.take(&key).await?)
            }
            Some(Existing::Remote(r)) => {
                return Err(Error::TaskNotContinuable {
                    task: task.clone(),
                    state: r.status.state,
                });
            }
        };
        if request
            .context_id
            .as_ref()
            .is_some_and(|c| *c != context_id)
        {
            return Err(Error::ContextMismatch { task: task.clone() });
        }
        let Some(live) = live else {
            let state = match self.shared.store.task_now(&key) {
                Some(f) => f.status.state,
                None => self
                    .shared
                    .store
                    .task(&key)
                    .await?
                    .map_or(TaskState::Completed, |f| f.status.state),
            };
            return Err(Error::TaskNotContinuable {
                task: task.clone(),
                state,
            });
        };
        let message = Arc::new(request.message);
        let call = live.actor.call(
            |reply| TaskMsg::Continue {
                message,
                follow,
                reply,
            },
            Some(self.shared.call_timeout),
        );
        match call.await {
            Ok(CallResult::Success(Ok(_))) => Ok(Submitted::Continued {
                key,
                context_id,
                actor: live.actor,
            }),
            Ok(CallResult::Success(Err(e))) => Err(e),
            Ok(CallResult::Timeout) => Err(Error::Busy),
            // It ended between the lookup and the call.
            _ => Err(Error::TaskNotContinuable {
                task: task.clone(),
                state: self
                    .ended_record(&key, &live)
                    .await?
                    .map_or(TaskState::Completed, |f| f.status.state),
            }),
        }
    }
}

/// The error for modifying a finished task.
pub(crate) fn finished_error(snapshot: &TaskSnapshot) -> Error {
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

/// The `messageId` that created a task (for idempotent replays).
fn first_message_id(task: &TaskSnapshot) -> &str {
    task.history.first().map_or("", |m| m.message_id.as_str())
}

/// Same `messageId`: an idempotent replay of the existing task. Otherwise a conflict.
fn replay_or_conflict(existing: Existing, message: &Message, task: &TaskId) -> Result<Existing> {
    let same = match &existing {
        Existing::Live(l) => *l.message_id == *message.message_id,
        Existing::Finished(f) | Existing::Remote(f) => first_message_id(f) == message.message_id,
    };
    if same {
        return Ok(existing);
    }
    Err(match existing {
        Existing::Finished(f) => finished_error(&f),
        Existing::Live(_) | Existing::Remote(_) => Error::TaskInProgress { task: task.clone() },
    })
}

/// A new task's inline push configuration: checked before the task exists, stored just
/// before its actor starts (so it hears event 1: it is durable no later than the task's
/// first event, appended after it), undone if the task is not created after all.
struct InlinePush<'a> {
    store: &'a Arc<dyn Store>,
    key: &'a TaskKey,
    config: Option<Arc<StoredPushConfig>>,
    max: usize,
    /// The id of the configuration stored.
    stored: Option<String>,
}

impl<'a> InlinePush<'a> {
    async fn checked(
        store: &'a Arc<dyn Store>,
        key: &'a TaskKey,
        new: Option<NewPushConfig>,
        max: usize,
    ) -> Result<Self> {
        let config = new.map(|new| match new.named {
            None => StoredPushConfig::scoped(scope_of(key), new.config, &new.format),
            Some(id) => StoredPushConfig::named(key, id, new.config, &new.format),
        });
        if let Some(stored) = &config {
            store.push_check(stored, max).await?;
        }
        Ok(Self {
            store,
            key,
            config,
            max,
            stored: None,
        })
    }

    fn store(&mut self) -> Result<()> {
        let Some(config) = self.config.take() else {
            return Ok(());
        };
        let id = config.id.clone();
        self.store.push_reserve(&config, self.max)?;
        let _ = self.store.append(vec![Write::PushSet(config)], None);
        self.stored = Some(id);
        Ok(())
    }

    fn undo(&self) {
        if let Some(id) = &self.stored {
            let _ = self.store.append(
                vec![
                    Write::PushRemove(scope_of(self.key)),
                    Write::PushRemoveNamed {
                        task: self.key.clone(),
                        id: id.clone(),
                    },
                ],
                None,
            );
        }
    }
}

/// The scope of one task's own push configurations.
fn scope_of(key: &TaskKey) -> PushScope {
    PushScope {
        principal: key.principal.clone(),
        agent: key.agent.clone(),
        task: Some(key.task.clone()),
    }
}
