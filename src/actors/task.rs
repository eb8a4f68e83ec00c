//! `TaskActor`: one per task. Owns the task's state machine, its numbered events, its
//! stream subscribers and the callers waiting for its end.
//!
//! It never awaits the agent, the network or a subscriber: the agent runs on a driver
//! task that casts its results back, and subscribers are fed with `try_send`. On a
//! terminal state it persists its record, leaves the live index, tells its followers and
//! stops (see docs/ARCHITECTURE.md, "Task lifecycle", for why in that order).

use std::panic::AssertUnwindSafe;
use std::sync::Arc;
use std::time::{Duration, Instant};

use chrono::{DateTime, Utc};
use futures_util::FutureExt as _;
use ractor::{Actor, ActorProcessingErr, ActorRef, RpcReplyPort};
use tokio::sync::{mpsc, oneshot};
use tokio_util::sync::CancellationToken;

use super::{AgentEntry, ContextKey, Replay, Shared, context::ContextMsg};
use crate::agent::{AgentError, AgentRequest, Updates};
use crate::error::Error;
use crate::limits::Admission;
use crate::model::{
    AGENT_ERROR_CODE, ContextId, Message, TaskError, TaskEvent, TaskKey, TaskSnapshot, TaskState,
    TaskStatus,
};
use crate::store::FinishedTask;

/// Messages of a [`TaskActor`].
pub(crate) enum TaskMsg {
    /// The driver got a slot and the agent starts: `submitted` → `working`.
    Started,
    /// An intermediate agent update; `keep` records it in the history.
    Progress {
        /// The update.
        message: Message,
        /// Kept in `history` (a progress message) or transient (a streamed chunk).
        keep: bool,
    },
    /// The agent ended.
    Finished(Result<Message, AgentError>),
    /// The task's time-out elapsed.
    TimedOut,
    /// Cancel the task; `reply` is `None` for shutdown.
    Cancel {
        /// The reason recorded in `status.reason`.
        reason: Arc<str>,
        /// Where the outcome goes.
        reply: Option<RpcReplyPort<Result<TaskSnapshot, Error>>>,
    },
    /// The task as it stands.
    Get(RpcReplyPort<TaskSnapshot>),
    /// Tell `0` when the task is terminal.
    WaitFinal(oneshot::Sender<TaskSnapshot>),
    /// Add a stream subscriber; replies with the events to replay first.
    Subscribe {
        /// The subscriber.
        subscriber: Subscriber,
        /// Which earlier events to replay.
        replay: Replay,
        /// The replay, or why the subscription is refused.
        reply: RpcReplyPort<Result<Vec<Arc<TaskEvent>>, Error>>,
    },
    /// A stream's client went away.
    Unsubscribe(u64),
    /// The task is in the live index: start the driver. Sent once, by `Runtime::submit`.
    Start,
}

/// A stream subscriber: a bounded channel fed with `try_send`.
pub(crate) struct Subscriber {
    /// Unique per runtime, for [`TaskMsg::Unsubscribe`].
    pub(crate) id: u64,
    /// Dropped by the actor when the task ends, which ends the stream.
    pub(crate) tx: mpsc::Sender<Arc<TaskEvent>>,
}

/// Who follows a new task from its first event.
pub(crate) enum Follow {
    /// Nobody (non-blocking send).
    Nobody,
    /// A caller waiting for the terminal state.
    Final(oneshot::Sender<TaskSnapshot>),
    /// A stream; receives event 1 and everything after.
    Stream(Subscriber),
}

/// The task actor.
pub(crate) struct TaskActor;

/// What a task actor starts with.
pub(crate) struct TaskArgs {
    pub(crate) shared: Arc<Shared>,
    pub(crate) agent: Arc<AgentEntry>,
    pub(crate) key: TaskKey,
    pub(crate) context_id: ContextId,
    pub(crate) message: Arc<Message>,
    pub(crate) metadata: Option<Arc<serde_json::value::RawValue>>,
    pub(crate) history: Vec<Arc<Message>>,
    pub(crate) turn: u32,
    pub(crate) admission: Admission,
    pub(crate) follow: Follow,
}

/// A task actor's state.
pub(crate) struct TaskActorState {
    shared: Arc<Shared>,
    agent: Arc<AgentEntry>,
    key: TaskKey,
    context_id: ContextId,
    message: Arc<Message>,
    metadata: Option<Arc<serde_json::value::RawValue>>,
    created_at: DateTime<Utc>,
    started: Instant,
    status: TaskStatus,
    events: Vec<Arc<TaskEvent>>,
    /// The user message, then the agent messages.
    history: Vec<Arc<Message>>,
    subscribers: Vec<Subscriber>,
    waiters: Vec<oneshot::Sender<TaskSnapshot>>,
    /// Cancelled when the task ends: stops the driver (and with it the agent).
    cancel: CancellationToken,
    /// Taken by `post_start` to start the driver.
    start: Option<(Admission, AgentRequest)>,
}

// === impl TaskActor ===

impl Actor for TaskActor {
    type Msg = TaskMsg;
    type State = TaskActorState;
    type Arguments = TaskArgs;

    async fn pre_start(
        &self,
        _myself: ActorRef<TaskMsg>,
        args: TaskArgs,
    ) -> Result<TaskActorState, ActorProcessingErr> {
        let cancel = CancellationToken::new();
        let request = AgentRequest {
            task_id: args.key.task.clone(),
            context_id: args.context_id.clone(),
            message: args.message.clone(),
            history: args.history,
            turn: args.turn,
            cancel: cancel.clone(),
        };
        let status = TaskStatus::new(TaskState::Submitted);
        let mut state = TaskActorState {
            created_at: status.timestamp,
            started: Instant::now(),
            shared: args.shared,
            agent: args.agent,
            key: args.key,
            context_id: args.context_id,
            history: vec![args.message.clone()],
            message: args.message,
            metadata: args.metadata,
            status: status.clone(),
            events: Vec::with_capacity(4),
            subscribers: Vec::new(),
            waiters: Vec::new(),
            cancel,
            start: Some((args.admission, request)),
        };
        match args.follow {
            Follow::Nobody => {}
            Follow::Final(tx) => state.waiters.push(tx),
            Follow::Stream(sub) => state.subscribers.push(sub),
        }
        state
            .shared
            .metrics
            .tasks_submitted
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let first = state.record(status);
        state.fan_out(&first);
        state
            .shared
            .observer
            .task_event(&state.key, &state.context_id, &first, state.created_at);
        Ok(state)
    }

    async fn handle(
        &self,
        myself: ActorRef<TaskMsg>,
        msg: TaskMsg,
        state: &mut TaskActorState,
    ) -> Result<(), ActorProcessingErr> {
        let terminal = state.status.state.is_terminal();
        match msg {
            TaskMsg::Started => {
                state.transition(&myself, TaskStatus::new(TaskState::Working));
            }
            TaskMsg::Progress { message, keep } if state.status.state == TaskState::Working => {
                let message = Arc::new(message);
                if keep {
                    state.history.push(message.clone());
                }
                let mut status = TaskStatus::new(TaskState::Working);
                status.message = Some(message);
                state.transition(&myself, status);
            }
            TaskMsg::Finished(result) if !terminal => {
                let status = match result {
                    Ok(reply) => {
                        let reply = Arc::new(reply);
                        state.history.push(reply.clone());
                        let mut s = TaskStatus::new(TaskState::Completed);
                        s.message = Some(reply);
                        s
                    }
                    Err(e) => {
                        let mut s = TaskStatus::new(TaskState::Failed);
                        s.error = Some(Arc::new(TaskError {
                            code: AGENT_ERROR_CODE,
                            message: e.message,
                        }));
                        s
                    }
                };
                state.transition(&myself, status);
            }
            TaskMsg::TimedOut => {
                state.transition(&myself, canceled("timeout".into()));
            }
            TaskMsg::Cancel { reason, reply } => {
                let outcome = if terminal {
                    // It became terminal after the caller found it running.
                    Err(Error::CancelFailed {
                        task: state.key.task.clone(),
                        state: state.status.state,
                    })
                } else {
                    state.transition(&myself, canceled(reason));
                    Ok(state.snapshot())
                };
                if let Some(reply) = reply {
                    let _ = reply.send(outcome);
                }
            }
            TaskMsg::Get(reply) => {
                let _ = reply.send(state.snapshot());
            }
            TaskMsg::WaitFinal(tx) => {
                if terminal {
                    let _ = tx.send(state.snapshot());
                } else {
                    state.waiters.push(tx);
                }
            }
            TaskMsg::Subscribe {
                subscriber,
                replay,
                reply,
            } => {
                let _ = reply.send(state.subscribe(subscriber, replay));
            }
            TaskMsg::Unsubscribe(id) => state.subscribers.retain(|s| s.id != id),
            TaskMsg::Start => state.start_driver(&myself),
            // Late messages for a task that already moved on: nothing to do.
            TaskMsg::Progress { .. } | TaskMsg::Finished(_) => {}
        }
        Ok(())
    }

    async fn post_stop(
        &self,
        _myself: ActorRef<TaskMsg>,
        state: &mut TaskActorState,
    ) -> Result<(), ActorProcessingErr> {
        state.cancel.cancel();
        Ok(())
    }
}

fn canceled(reason: Arc<str>) -> TaskStatus {
    let mut s = TaskStatus::new(TaskState::Canceled);
    s.reason = Some(reason);
    s
}

/// Runs the agent for one task, outside the actor: waits for a slot, runs the backend,
/// casts the outcome back. Ends early when the task is canceled (the actor cancels the
/// token) or its deadline passes; dropping the agent's future aborts its I/O, and
/// dropping the permit hands the slot to the next queued task.
async fn drive(
    task: ActorRef<TaskMsg>,
    agent: Arc<AgentEntry>,
    admission: Admission,
    request: AgentRequest,
    cancel: CancellationToken,
    deadline: tokio::time::Instant,
) {
    let work = async {
        let Some(_permit) = admission.ready().await else {
            return;
        };
        if task.cast(TaskMsg::Started).is_err() {
            return;
        }
        let run = agent.backend.run(request, Updates::new(task.clone()));
        let result = AssertUnwindSafe(run)
            .catch_unwind()
            .await
            .unwrap_or_else(|_| Err(AgentError::new("the agent failed unexpectedly")));
        let _ = task.cast(TaskMsg::Finished(result));
    };
    tokio::select! {
        biased;
        () = cancel.cancelled() => {}
        () = tokio::time::sleep_until(deadline) => {
            let _ = task.cast(TaskMsg::TimedOut);
        }
        () = work => {}
    }
}

// === impl TaskActorState ===

impl TaskActorState {
    /// Starts the driver (once). It is started by a message, not in `post_start`, so that
    /// the task is in the live index before it can possibly end.
    fn start_driver(&mut self, myself: &ActorRef<TaskMsg>) {
        if let Some((admission, request)) = self.start.take() {
            let timeout = Duration::from_secs_f64(self.agent.config.limits.task_timeout_seconds);
            let deadline = tokio::time::Instant::from_std(self.started) + timeout;
            tokio::spawn(drive(
                myself.clone(),
                self.agent.clone(),
                admission,
                request,
                self.cancel.clone(),
                deadline,
            ));
        }
    }

    /// Appends an event for `status` and feeds it to the subscribers.
    fn record(&mut self, status: TaskStatus) -> Arc<TaskEvent> {
        let event = Arc::new(TaskEvent {
            seq: self.events.len() as u64 + 1,
            status: status.clone(),
        });
        self.status = status;
        self.events.push(event.clone());
        event
    }

    /// Keeps the `tasks by state` gauges of /metrics.
    fn count_states(&self, from: TaskState, to: TaskState) {
        use std::sync::atomic::Ordering::Relaxed;
        let m = &self.shared.metrics;
        match from {
            TaskState::Submitted => m.tasks_submitted.fetch_sub(1, Relaxed),
            TaskState::Working => m.tasks_working.fetch_sub(1, Relaxed),
            _ => 0,
        };
        if to == TaskState::Working {
            m.tasks_working.fetch_add(1, Relaxed);
        }
    }

    fn fan_out(&mut self, event: &Arc<TaskEvent>) {
        let metrics = &self.shared.metrics;
        self.subscribers
            .retain(|s| match s.tx.try_send(event.clone()) {
                Ok(()) => true,
                Err(mpsc::error::TrySendError::Full(_)) => {
                    metrics
                        .dropped_subscribers
                        .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                    tracing::debug!(subscriber = s.id, "stream client too slow; dropped");
                    false
                }
                Err(mpsc::error::TrySendError::Closed(_)) => false,
            });
    }

    fn transition(&mut self, myself: &ActorRef<TaskMsg>, status: TaskStatus) {
        let previous = self.status.state;
        if !previous.can_become(status.state) {
            tracing::debug!(task = %self.key.task, from = %previous, to = %status.state, "transition ignored");
            return;
        }
        let event = self.record(status);
        let state = event.status.state;
        if state != previous {
            self.count_states(previous, state);
        }
        let finished = state.is_terminal().then(|| self.persist(myself));
        self.fan_out(&event);
        if state != previous {
            self.shared
                .observer
                .task_event(&self.key, &self.context_id, &event, self.created_at);
        }
        if let Some(snapshot) = finished {
            self.finish(myself, &snapshot);
        }
    }

    /// Stores the finished record and leaves the live index, before anyone hears of the
    /// terminal state: whoever saw it will find the record.
    fn persist(&mut self, myself: &ActorRef<TaskMsg>) -> Arc<TaskSnapshot> {
        let snapshot = Arc::new(self.snapshot());
        let record = FinishedTask {
            snapshot: snapshot.clone(),
        };
        self.shared.store.insert(self.key.clone(), record);
        let me = myself.get_id();
        self.shared
            .live
            .remove_if(&self.key, |_, live| live.actor.get_id() == me);
        snapshot
    }

    fn finish(&mut self, myself: &ActorRef<TaskMsg>, snapshot: &TaskSnapshot) {
        for waiter in self.waiters.drain(..) {
            let _ = waiter.send(snapshot.clone());
        }
        // Dropping the senders ends every stream after its final event.
        self.subscribers.clear();
        self.agent
            .metrics
            .finished(snapshot.status.state, self.started.elapsed());
        let reply = (snapshot.status.state == TaskState::Completed)
            .then(|| snapshot.status.message.clone())
            .flatten();
        let _ = self.shared.contexts.cast(ContextMsg::Record {
            key: ContextKey {
                principal: self.key.principal.clone(),
                context: self.context_id.clone(),
            },
            user: self.message.clone(),
            reply,
        });
        self.cancel.cancel();
        myself.stop(None);
    }

    fn subscribe(
        &mut self,
        subscriber: Subscriber,
        replay: Replay,
    ) -> Result<Vec<Arc<TaskEvent>>, Error> {
        if self.status.state.is_terminal() {
            // Cannot happen for a stopped actor; a queued message may still arrive.
            return Ok(self.events.last().cloned().into_iter().collect());
        }
        if self.subscribers.len() >= self.shared.config.server.max_subscribers_per_task {
            return Err(Error::SubscriptionFailed {
                task: Some(self.key.task.clone()),
                reason: "the task's subscriber limit is reached".into(),
            });
        }
        let events = match replay {
            Replay::All => self.events.clone(),
            Replay::After(n) => self.events.iter().filter(|e| e.seq > n).cloned().collect(),
            Replay::Current => self.events.last().cloned().into_iter().collect(),
        };
        self.subscribers.push(subscriber);
        Ok(events)
    }

    fn snapshot(&self) -> TaskSnapshot {
        TaskSnapshot {
            id: self.key.task.clone(),
            context_id: self.context_id.clone(),
            status: self.status.clone(),
            seq: self.events.len() as u64,
            created_at: self.created_at,
            updated_at: self.status.timestamp,
            history: self.history.clone(),
            metadata: self.metadata.clone(),
        }
    }
}
