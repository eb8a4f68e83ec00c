//! `TaskActor`: one per task. Owns the task's state machine, its numbered events, its
//! stream subscribers and the callers waiting for its end.
//!
//! It never awaits the agent, the network, the disk or a subscriber: the agent runs on a
//! driver task that casts its results back, events are handed to the store's committer,
//! and subscribers are fed with `try_send`. An event is *published* — to subscribers,
//! waiters, webhooks and readers — only once the store says it is durable
//! ([`TaskMsg::Durable`]), in event order; until then the actor answers with the last
//! durable state. On a published terminal state it leaves the live index, tells its
//! followers and stops; on an interrupted state (`input-required`, `auth-required`) it
//! tells its followers and waits for a message that continues the task (see
//! docs/ARCHITECTURE.md, "Task lifecycle").

use std::collections::VecDeque;
use std::panic::AssertUnwindSafe;
use std::sync::Arc;
use std::time::{Duration, Instant};

use chrono::{DateTime, Utc};
use futures_util::FutureExt as _;
use ractor::{Actor, ActorProcessingErr, ActorRef, RpcReplyPort};
use tokio::sync::{mpsc, oneshot};
use tokio_util::sync::CancellationToken;

use super::remote;
use super::{AgentEntry, ContextKey, Shared, context::ContextMsg};
use crate::agent::{
    AgentError, AgentRequest, Flow, MAX_UPDATES_IN_FLIGHT, Outcome, Update, UpdateSink, Updates,
};
use crate::error::Error;
use crate::limits::Admission;
use crate::model::{
    AGENT_ERROR_CODE, Artifact, ArtifactUpdate, ContextId, Message, TaskError, TaskEvent, TaskKey,
    TaskSnapshot, TaskState, TaskStatus,
};
use crate::store::{Committed, Durable, Orphan, TurnId, Write};
use crate::stream::{Replay, StreamItem};

/// The error of a task that was running when the server stopped without finishing it.
pub(crate) const RESTART_ERROR: &str = "interrupted by a server restart";

/// The error of a task whose node died while it was working (cluster).
pub(crate) const NODE_LOST_ERROR: &str = "node lost";

/// Messages of a [`TaskActor`].
pub(crate) enum TaskMsg {
    /// The task is in the live index: start the driver. Sent once, by `Runtime::submit`.
    Start,
    /// The driver got a slot and the agent starts: `submitted` → `working`.
    Started,
    /// An intermediate agent update; `keep` records it in the history.
    Progress {
        /// The update.
        message: Message,
        /// Kept in `history` (a progress message) or transient (a streamed chunk).
        keep: bool,
    },
    /// An artifact, or a chunk of one.
    Artifact(ArtifactUpdate),
    /// The agent's run ended.
    Finished(Result<Outcome, AgentError>),
    /// The agent answered at its first poll: `Started` and `Finished` in one message.
    Ran(Result<Outcome, AgentError>),
    /// The deadline of run `0` (a generation) passed.
    TimedOut(u64),
    /// Cancel the task; `reply` is `None` for shutdown.
    Cancel {
        /// The reason recorded in `status.reason`.
        reason: Arc<str>,
        /// Where the outcome goes.
        reply: Option<RpcReplyPort<Result<TaskSnapshot, Error>>>,
    },
    /// A message continues an interrupted task.
    Continue {
        /// The message.
        message: Arc<Message>,
        /// Who follows the task from here.
        follow: Follow,
        /// The task as the message found it, or why it cannot be continued.
        reply: RpcReplyPort<Result<Arc<TaskSnapshot>, Error>>,
    },
    /// The task as it stands.
    Get(RpcReplyPort<TaskSnapshot>),
    /// Tell `0` when the task ends its run (terminal or interrupted).
    WaitFinal(oneshot::Sender<TaskSnapshot>),
    /// Add a stream subscriber; replies with the items to replay first.
    Subscribe {
        /// The subscriber.
        subscriber: Subscriber,
        /// Which earlier events to replay.
        replay: Replay,
        /// When the task waits for input: stay subscribed through its next run.
        next_run: bool,
        /// The replay, or why the subscription is refused.
        reply: RpcReplyPort<Result<Vec<StreamItem>, Error>>,
    },
    /// A stream's client went away.
    Unsubscribe(u64),
    /// The store made every event up to this number durable: publish them.
    Durable(u64, Committed),
    /// The server stops: cancel the task (reason `shutdown`), or — a task waiting for input
    /// when the store keeps it (`keep_waiting`) — just stop; it waits again after a
    /// restart. In a cluster a queued task (`keep_queued`) also just stops: another node
    /// takes it over and runs it.
    Shutdown {
        /// The store is durable.
        keep_waiting: bool,
        /// Another node will run queued tasks.
        keep_queued: bool,
    },
    /// The agent sent more updates than may wait for the store
    /// ([`MAX_UPDATES_IN_FLIGHT`]): the task fails.
    Overrun,
    /// Another node took the task (a cancel or a continuing message arrived there, or this
    /// node lost its lease): stop the agent without writing anything; followers here
    /// follow the task from the shared store.
    Fenced,
}

/// A stream subscriber: a bounded channel fed with `try_send`.
pub(crate) struct Subscriber {
    /// Unique per runtime, for [`TaskMsg::Unsubscribe`].
    pub(crate) id: u64,
    /// Dropped by the actor when the task's run ends, which ends the stream.
    pub(crate) tx: mpsc::Sender<StreamItem>,
}

/// Who follows a task from its next event.
pub(crate) enum Follow {
    /// Nobody (non-blocking send).
    Nobody,
    /// A caller waiting for the end of the run.
    Final(oneshot::Sender<TaskSnapshot>),
    /// A stream.
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
    pub(crate) turn: TurnId,
    /// A slot in the agent's queue; `None` for a task that cannot run (restored from a
    /// store: it fails at once, or waits in an interrupted state).
    pub(crate) admission: Option<Admission>,
    pub(crate) follow: Follow,
    /// A task read back from the store at start-up, with its durable events.
    pub(crate) restored: Option<(Arc<TaskSnapshot>, Vec<Arc<TaskEvent>>)>,
    /// Why it was read back (what a restored working task becomes).
    pub(crate) why: Orphan,
}

/// A reply that waits until every event emitted before it is durable.
enum Deferred {
    Cancel(
        RpcReplyPort<Result<TaskSnapshot, Error>>,
        Result<TaskSnapshot, Error>,
    ),
    /// A read of a task none of whose events is durable yet: it answers with the first.
    Get(RpcReplyPort<TaskSnapshot>),
}

/// A task actor's state.
pub(crate) struct TaskActorState {
    shared: Arc<Shared>,
    agent: Arc<AgentEntry>,
    key: TaskKey,
    context_id: ContextId,
    message: Arc<Message>,
    metadata: Option<Arc<serde_json::value::RawValue>>,
    /// The conversation's earlier turns, as the agent saw them.
    context_history: Vec<Arc<Message>>,
    turn: TurnId,
    created_at: DateTime<Utc>,
    started: Instant,
    status: TaskStatus,
    events: Vec<Arc<TaskEvent>>,
    /// The user message, then the agent messages (and continuing user messages).
    history: Vec<Arc<Message>>,
    artifacts: Vec<Arc<Artifact>>,
    /// The record as the last event left it.
    snapshot: Arc<TaskSnapshot>,
    /// Events emitted and not yet durable, oldest first.
    unpublished: VecDeque<StreamItem>,
    /// The number of the last published (durable) event.
    published: u64,
    /// The task as its last published event left it: what readers are told.
    durable: Arc<TaskSnapshot>,
    /// Replies waiting for an event to be published: (its number, the reply).
    deferred: Vec<(u64, Deferred)>,
    subscribers: Vec<Subscriber>,
    waiters: Vec<oneshot::Sender<TaskSnapshot>>,
    /// Cancelled when the task ends: stops the current driver (and with it the agent).
    cancel: CancellationToken,
    /// The current run; a time-out of an earlier run is ignored.
    generation: u64,
    /// Taken to start the first run.
    start: Option<Admission>,
    /// Restored from the store while it was running: fails at `Start`, with this error.
    orphaned: Option<&'static str>,
    /// Where the agent's updates come from, and how many are not durable yet (shared
    /// with its [`Updates`]).
    link: Arc<TaskLink>,
    /// The numbers of the events those updates became, oldest first.
    flow_events: VecDeque<u64>,
}

// === impl TaskActor ===

impl Actor for TaskActor {
    type Msg = TaskMsg;
    type State = TaskActorState;
    type Arguments = TaskArgs;

    async fn pre_start(
        &self,
        myself: ActorRef<TaskMsg>,
        args: TaskArgs,
    ) -> Result<TaskActorState, ActorProcessingErr> {
        let status = TaskStatus::new(TaskState::Submitted);
        let placeholder = Arc::new(placeholder(&args.key, &args.context_id, &status));
        let mut state = TaskActorState {
            created_at: status.timestamp,
            started: Instant::now(),
            history: vec![args.message.clone()],
            artifacts: Vec::new(),
            snapshot: placeholder.clone(),
            unpublished: VecDeque::new(),
            published: 0,
            durable: placeholder,
            deferred: Vec::new(),
            shared: args.shared,
            agent: args.agent,
            key: args.key,
            context_id: args.context_id,
            message: args.message,
            metadata: args.metadata,
            context_history: args.history,
            turn: args.turn,
            status: status.clone(),
            events: Vec::with_capacity(4),
            subscribers: Vec::new(),
            waiters: Vec::new(),
            cancel: CancellationToken::new(),
            generation: 0,
            start: args.admission,
            orphaned: None,
            link: Arc::new(TaskLink {
                actor: myself.clone(),
                flow: Flow::default(),
            }),
            flow_events: VecDeque::new(),
        };
        state.follow(args.follow);
        let submitted = || std::sync::atomic::Ordering::Relaxed;
        match args.restored {
            None => {
                state
                    .shared
                    .metrics
                    .tasks_submitted
                    .fetch_add(1, submitted());
                state.emit(&myself, status, None, true);
            }
            Some((task, events)) => {
                state.restore(&task, events);
                let m = &state.shared.metrics;
                match task.status.state {
                    TaskState::Submitted => {
                        m.tasks_submitted.fetch_add(1, submitted());
                    }
                    TaskState::Working => {
                        m.tasks_working.fetch_add(1, submitted());
                        state.orphaned = match args.why {
                            // Run again from its first message (`on_node_loss = "resume"`).
                            Orphan::NodeLost { rerun: true } if state.start.is_some() => None,
                            Orphan::NodeLost { .. } => Some(NODE_LOST_ERROR),
                            Orphan::Restart | Orphan::Held => Some(RESTART_ERROR),
                        };
                    }
                    _ => state.interrupted(&myself),
                }
            }
        }
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
            TaskMsg::Start => {
                if let Some(error) = state.orphaned.take() {
                    // It was running when the server (or its node) stopped: its agent's work
                    // is lost.
                    let mut s = TaskStatus::new(TaskState::Failed);
                    s.error = Some(Arc::new(TaskError {
                        code: AGENT_ERROR_CODE,
                        message: error.into(),
                    }));
                    state.transition(&myself, s);
                } else if let Some(admission) = state.start.take() {
                    let history = state.history[1..].to_vec();
                    let request = state.request(state.message.clone(), history);
                    state.run(admission, request);
                } else if state.status.state == TaskState::Submitted {
                    // Restored, and its agent's queue had no room.
                    let mut s = TaskStatus::new(TaskState::Failed);
                    s.error = Some(Arc::new(TaskError {
                        code: AGENT_ERROR_CODE,
                        message: "could not be queued again after a server restart (the agent's queue is full)".into(),
                    }));
                    state.transition(&myself, s);
                }
            }
            TaskMsg::Started => state.transition(&myself, TaskStatus::new(TaskState::Working)),
            TaskMsg::Progress { message, keep } if state.status.state == TaskState::Working => {
                let message = Arc::new(message);
                // A bounded history: past the cap, updates are streamed but not kept.
                if keep && state.history.len() < state.shared.config.server.max_task_history {
                    state.history.push(message.clone());
                }
                let mut status = TaskStatus::new(TaskState::Working);
                status.message = Some(message);
                state.update(&myself, |state, myself| state.transition(myself, status));
            }
            TaskMsg::Artifact(update) if state.status.state == TaskState::Working => {
                state.update(&myself, |state, myself| state.artifact(myself, update));
            }
            TaskMsg::Overrun if state.status.state == TaskState::Working => {
                tracing::warn!(task = %state.key.task, "the agent's updates outpace the store; the task fails");
                let mut s = TaskStatus::new(TaskState::Failed);
                s.error = Some(Arc::new(TaskError {
                    code: AGENT_ERROR_CODE,
                    message: format!(
                        "the agent's updates outpace the store ({MAX_UPDATES_IN_FLIGHT} not yet durable)"
                    ),
                }));
                state.transition(&myself, s);
            }
            TaskMsg::Finished(result) if state.status.state == TaskState::Working => {
                state.agent_finished(&myself, result);
            }
            // Exactly what `Started` then `Finished` would do.
            TaskMsg::Ran(result) => {
                state.transition(&myself, TaskStatus::new(TaskState::Working));
                if state.status.state == TaskState::Working {
                    state.agent_finished(&myself, result);
                }
            }
            TaskMsg::TimedOut(generation) if generation == state.generation && !terminal => {
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
                    Ok((*state.snapshot).clone())
                };
                if let Some(reply) = reply {
                    // Told only once what it reports is durable.
                    state.defer(Deferred::Cancel(reply, outcome));
                }
            }
            TaskMsg::Continue {
                message,
                follow,
                reply,
            } => {
                let _ = reply.send(state.resume(message, follow));
            }
            TaskMsg::Get(reply) => {
                if state.published == 0 {
                    // Nobody may hear of the task before its first event is durable.
                    state.deferred.push((1, Deferred::Get(reply)));
                } else if state.shared.cluster.is_some() {
                    // On a shared store, followers read committed events straight from the
                    // database, possibly before this actor hears that they are durable: a
                    // read waits for what is in flight, so it never shows an older state
                    // than a follower on this node already did.
                    state.defer(Deferred::Get(reply));
                } else {
                    let _ = reply.send((*state.durable).clone());
                }
            }
            TaskMsg::WaitFinal(tx) => {
                if state.durable.status.state.ends_stream() {
                    let _ = tx.send((*state.durable).clone());
                } else {
                    state.waiters.push(tx);
                }
            }
            TaskMsg::Subscribe {
                subscriber,
                replay,
                next_run,
                reply,
            } => {
                let _ = reply.send(state.subscribe(subscriber, replay, next_run));
            }
            TaskMsg::Unsubscribe(id) => state.subscribers.retain(|s| s.id != id),
            TaskMsg::Durable(seq, committed) => state.publish(&myself, seq, committed),
            TaskMsg::Fenced => state.fenced(&myself),
            TaskMsg::Shutdown {
                keep_waiting,
                keep_queued,
            } => {
                let waiting = state.status.state.is_interrupted()
                    && state.durable.status.state == state.status.state;
                let queued = state.status.state == TaskState::Submitted
                    && state.durable.status.state == TaskState::Submitted;
                if (waiting && keep_waiting) || (queued && keep_queued) {
                    let me = myself.get_id();
                    state
                        .shared
                        .live
                        .remove_if(&state.key, |_, live| live.actor.get_id() == me);
                    state.subscribers.clear();
                    state.cancel.cancel();
                    myself.stop(None);
                } else if !terminal {
                    state.transition(&myself, canceled("shutdown".into()));
                }
            }
            // Late messages for a task that already moved on: nothing to do.
            TaskMsg::Progress { .. } | TaskMsg::Artifact(_) => state.link.flow.release(1),
            TaskMsg::Finished(_) | TaskMsg::TimedOut(_) | TaskMsg::Overrun => {}
        }
        Ok(())
    }

    async fn post_stop(
        &self,
        _myself: ActorRef<TaskMsg>,
        state: &mut TaskActorState,
    ) -> Result<(), ActorProcessingErr> {
        state.cancel.cancel();
        state.link.flow.close();
        Ok(())
    }
}

fn canceled(reason: Arc<str>) -> TaskStatus {
    let mut s = TaskStatus::new(TaskState::Canceled);
    s.reason = Some(reason);
    s
}

/// The record before the first event is built (replaced at once).
fn placeholder(key: &TaskKey, context: &ContextId, status: &TaskStatus) -> TaskSnapshot {
    TaskSnapshot {
        id: key.task.clone(),
        context_id: context.clone(),
        status: status.clone(),
        seq: 0,
        created_at: status.timestamp,
        updated_at: status.timestamp,
        history: Vec::new(),
        artifacts: Vec::new(),
        metadata: None,
    }
}

/// Runs the agent for one run of a task, outside the actor: waits for a slot, runs the
/// backend, casts the outcome back. Ends early when the run is canceled (the actor cancels
/// the token) or its deadline passes; dropping the agent's future aborts its I/O, and
/// dropping the permit hands the slot to the next queued task (none once the runtime is
/// shutting down: the task stays queued, and in a cluster another node takes it).
async fn drive(
    link: Arc<TaskLink>,
    agent: Arc<AgentEntry>,
    admission: Admission,
    request: AgentRequest,
    deadline: tokio::time::Instant,
    generation: u64,
) {
    let task = &link.actor;
    // The run's token: the actor cancels it to stop the run.
    let cancel = request.cancel.clone();
    let work = async {
        let Some(_permit) = admission.ready().await else {
            // The scheduler closed: the shutdown's own message ends the task.
            return;
        };
        let updates = Updates::new(link.clone());
        let run = agent.backend.run_task(request, updates.clone());
        let mut run = std::pin::pin!(AssertUnwindSafe(run).catch_unwind());
        // The first poll decides: an agent that answers at once costs the task one
        // message (`Ran`), one that does not is told `working` now (or was, by its first
        // update) and `Finished` later.
        let result = match futures_util::future::poll_immediate(run.as_mut()).await {
            Some(result) => result,
            None => {
                updates.start();
                run.await
            }
        };
        let result =
            result.unwrap_or_else(|_| Err(AgentError::new("the agent failed unexpectedly")));
        let _ = task.cast(if updates.take_start() {
            TaskMsg::Ran(result)
        } else {
            TaskMsg::Finished(result)
        });
    };
    tokio::select! {
        biased;
        () = cancel.cancelled() => {}
        () = tokio::time::sleep_until(deadline) => {
            let _ = task.cast(TaskMsg::TimedOut(generation));
        }
        () = work => {}
    }
}

/// What an agent's [`Updates`] hold: its task's actor, and the flow of the updates it
/// sent there. One per task.
pub(crate) struct TaskLink {
    actor: ActorRef<TaskMsg>,
    flow: Flow,
}

/// An agent's updates reach its task as messages.
impl UpdateSink for TaskLink {
    fn flow(&self) -> &Flow {
        &self.flow
    }

    fn send(&self, update: Update) -> bool {
        self.actor
            .cast(match update {
                Update::Started => TaskMsg::Started,
                Update::Progress { message, keep } => TaskMsg::Progress { message, keep },
                Update::Artifact(a) => TaskMsg::Artifact(a),
                Update::Overrun => TaskMsg::Overrun,
            })
            .is_ok()
    }
}

// === impl TaskActorState ===

impl TaskActorState {
    /// The agent's run ended: its outcome becomes the task's next state.
    fn agent_finished(&mut self, myself: &ActorRef<TaskMsg>, result: Result<Outcome, AgentError>) {
        let status = match result {
            Ok(outcome) => {
                let (to, reply) = match outcome {
                    Outcome::Completed(m) => (TaskState::Completed, m),
                    Outcome::InputRequired(m) => (TaskState::InputRequired, m),
                    Outcome::AuthRequired(m) => (TaskState::AuthRequired, m),
                    Outcome::Rejected(m) => (TaskState::Rejected, m),
                };
                let mut s = TaskStatus::new(to);
                if let Some(reply) = reply {
                    let reply = Arc::new(reply);
                    self.history.push(reply.clone());
                    s.message = Some(reply);
                }
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
        self.transition(myself, status);
    }

    fn follow(&mut self, follow: Follow) {
        match follow {
            Follow::Nobody => {}
            Follow::Final(tx) => self.waiters.push(tx),
            Follow::Stream(sub) => self.subscribers.push(sub),
        }
    }

    fn request(&self, message: Arc<Message>, task_history: Vec<Arc<Message>>) -> AgentRequest {
        AgentRequest {
            task_id: self.key.task.clone(),
            context_id: self.context_id.clone(),
            message,
            history: self.context_history.clone(),
            task_history,
            turn: self.turn.number,
            cancel: self.cancel.clone(),
        }
    }

    /// Starts a run of the agent: its driver, under a fresh generation and deadline. The
    /// deadline (`task_timeout_seconds`) counts from the submission for the first run and
    /// from the continuing message for later ones.
    fn run(&mut self, admission: Admission, request: AgentRequest) {
        self.generation += 1;
        let timeout = Duration::from_secs_f64(self.agent.config.limits.task_timeout_seconds);
        let from = if self.generation == 1 {
            self.started
        } else {
            Instant::now()
        };
        let deadline = tokio::time::Instant::from_std(from) + timeout;
        let mut driver = Box::pin(drive(
            self.link.clone(),
            self.agent.clone(),
            admission,
            request,
            deadline,
            self.generation,
        ));
        // The driver's first poll runs here, in this turn of the actor: an agent that
        // answers at once has its `Ran` in the mailbox before this turn ends, with no task
        // spawned and no wake-up. One that does not is handed to tokio, whose first poll
        // registers the real waker (this poll's waker does nothing: the driver is polled
        // again at once, so nothing it waits for can be missed). A poll never waits on
        // the outside world, so the mailbox is not held up by it.
        let mut cx = std::task::Context::from_waker(std::task::Waker::noop());
        if driver.as_mut().poll(&mut cx).is_pending() {
            tokio::spawn(driver);
        }
    }

    /// The task is another node's now: stop the agent and hand this node's followers to
    /// the shared store, from the last event they were sent.
    fn fenced(&mut self, myself: &ActorRef<TaskMsg>) {
        tracing::info!(task = %self.key.task, "taken by another node; stopped here");
        let me = myself.get_id();
        self.shared
            .live
            .remove_if(&self.key, |_, live| live.actor.get_id() == me);
        self.cancel.cancel();
        self.start = None;
        self.count_states(self.status.state, TaskState::Canceled);
        let cursor = self.published;
        for sub in self.subscribers.drain(..) {
            remote::spawn(
                self.shared.clone(),
                self.key.clone(),
                cursor,
                remote::Sink::Stream(sub.tx),
            );
        }
        for waiter in self.waiters.drain(..) {
            remote::spawn(
                self.shared.clone(),
                self.key.clone(),
                cursor,
                remote::Sink::Final(waiter),
            );
        }
        // Deferred replies are dropped: their callers read the task from the store.
        self.deferred.clear();
        myself.stop(None);
    }

    /// Continues an interrupted task with a new message. The interruption must be
    /// published: a task nobody can have been told is waiting is still in progress.
    fn resume(
        &mut self,
        message: Arc<Message>,
        follow: Follow,
    ) -> Result<Arc<TaskSnapshot>, Error> {
        let state = self.durable.status.state;
        if !state.is_interrupted() || self.status.state != state {
            return Err(Error::TaskNotContinuable {
                task: self.key.task.clone(),
                state: if self.status.state.is_terminal() {
                    self.status.state
                } else {
                    state
                },
            });
        }
        let admission = self.agent.scheduler.admit()?;
        let before = self.history.clone();
        self.history.push(message.clone());
        let found = self.durable.clone();
        self.follow(follow);
        // The run ended with the interruption; its token went with it. The new run gets
        // a fresh one (before the request that hands it to the agent is built).
        self.cancel = CancellationToken::new();
        let request = self.request(message, before);
        self.run(admission, request);
        Ok(found)
    }

    /// Takes up a task read back from the store: its record and its durable events.
    fn restore(&mut self, task: &Arc<TaskSnapshot>, events: Vec<Arc<TaskEvent>>) {
        self.created_at = task.created_at;
        self.status = task.status.clone();
        self.history = task.history.clone();
        self.artifacts = task.artifacts.clone();
        self.published = events.last().map_or(task.seq, |e| e.seq);
        self.events = events;
        self.snapshot = task.clone();
        self.durable = task.clone();
    }

    /// Records an event: hands it (and the task as it left it) to the store, and publishes
    /// it once it is durable — at once for a store that is durable on append.
    fn emit(
        &mut self,
        myself: &ActorRef<TaskMsg>,
        status: TaskStatus,
        artifact: Option<ArtifactUpdate>,
        changed: bool,
    ) {
        let event = Arc::new(TaskEvent {
            seq: self.events.len() as u64 + 1,
            status: status.clone(),
            artifact,
        });
        self.status = status;
        self.events.push(event.clone());
        self.snapshot = Arc::new(self.build_snapshot());
        self.unpublished.push_back(StreamItem {
            event: event.clone(),
            task: self.snapshot.clone(),
        });
        let seq = event.seq;
        let mut writes = vec![Write::Task {
            key: self.key.clone(),
            task: self.snapshot.clone(),
            event,
            changed,
            turn: self.turn,
        }];
        if self.status.state.is_terminal() {
            // The conversation's turn is durable with the end of the task.
            writes.push(Write::Turn {
                principal: self.key.principal.clone(),
                context: self.context_id.clone(),
                turn: self.turn,
                user: self.message.clone(),
                reply: self.reply(),
            });
        }
        let me = myself.clone();
        let then = Box::new(move |committed: Committed| {
            let _ = me.cast(TaskMsg::Durable(seq, committed));
        });
        if let Durable::Now(committed) = self.shared.store.append(writes, Some(then)) {
            self.publish(myself, seq, committed);
        }
    }

    /// The agent's reply of a completed task, for the conversation.
    fn reply(&self) -> Option<Arc<Message>> {
        (self.status.state == TaskState::Completed)
            .then(|| self.status.message.clone())
            .flatten()
    }

    /// Publishes every event up to `seq` (now durable), in order: subscribers, waiters at
    /// the end of a run, the task's end; then the webhook deliveries the store planned and
    /// the replies that waited for these events.
    fn publish(&mut self, myself: &ActorRef<TaskMsg>, seq: u64, committed: Committed) {
        let mut released = 0;
        while self.flow_events.front().is_some_and(|&n| n <= seq) {
            self.flow_events.pop_front();
            released += 1;
        }
        self.link.flow.release(released);
        while self.unpublished.front().is_some_and(|item| item.seq <= seq) {
            let Some(item) = self.unpublished.pop_front() else {
                break;
            };
            self.published = item.seq;
            self.durable = item.task.clone();
            self.fan_out(&item);
            if item.is_final() {
                self.end_run();
                if item.status.state.is_terminal() {
                    // Out of the live index before anyone hears of the end: whoever saw it
                    // finds the record (the store indexed it before it said durable).
                    let me = myself.get_id();
                    self.shared
                        .live
                        .remove_if(&self.key, |_, live| live.actor.get_id() == me);
                    self.finish(myself);
                }
            }
        }
        if !committed.deliveries.is_empty() {
            self.shared.webhooks.deliver(committed.deliveries);
        }
        let published = self.published;
        let mut i = 0;
        while i < self.deferred.len() {
            if self.deferred[i].0 <= published {
                let (_, reply) = self.deferred.swap_remove(i);
                self.answer(reply);
            } else {
                i += 1;
            }
        }
    }

    /// Sends `reply` once every event emitted so far is published.
    fn defer(&mut self, reply: Deferred) {
        let upto = self.events.len() as u64;
        if upto <= self.published {
            self.answer(reply);
        } else {
            self.deferred.push((upto, reply));
        }
    }

    fn answer(&self, reply: Deferred) {
        match reply {
            Deferred::Cancel(port, outcome) => {
                let _ = port.send(outcome);
            }
            Deferred::Get(port) => {
                let _ = port.send((*self.durable).clone());
            }
        }
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

    fn fan_out(&mut self, item: &StreamItem) {
        let metrics = &self.shared.metrics;
        self.subscribers
            .retain(|s| match s.tx.try_send(item.clone()) {
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

    /// Applies one of the agent's updates, counted in its flow until the event it becomes
    /// is durable (released at once if it becomes none).
    fn update(
        &mut self,
        myself: &ActorRef<TaskMsg>,
        apply: impl FnOnce(&mut Self, &ActorRef<TaskMsg>),
    ) {
        let seq = self.events.len() as u64 + 1;
        // Noted before it is applied: a store durable on append publishes it at once.
        self.flow_events.push_back(seq);
        apply(self, myself);
        if self.events.len() as u64 + 1 == seq {
            // It changed nothing: no event.
            self.flow_events.pop_back();
            self.link.flow.release(1);
        }
    }

    fn artifact(&mut self, myself: &ActorRef<TaskMsg>, update: ArtifactUpdate) {
        let incoming = &update.artifact;
        match self
            .artifacts
            .iter_mut()
            .find(|a| a.artifact_id == incoming.artifact_id)
        {
            Some(existing) if update.append => {
                let mut merged = (**existing).clone();
                merged.parts.extend(incoming.parts.iter().cloned());
                *existing = Arc::new(merged);
            }
            Some(existing) => *existing = incoming.clone(),
            None => self.artifacts.push(incoming.clone()),
        }
        let status = self.status.clone();
        self.emit(myself, status, Some(update), false);
    }

    fn transition(&mut self, myself: &ActorRef<TaskMsg>, status: TaskStatus) {
        let previous = self.status.state;
        if !previous.can_become(status.state) {
            tracing::debug!(task = %self.key.task, from = %previous, to = %status.state, "transition ignored");
            return;
        }
        let to = status.state;
        if to != previous {
            self.count_states(previous, to);
        }
        self.emit(myself, status, None, to != previous);
        if to.is_terminal() {
            // The agent's run (if any) stops now; the actor stops once the end is published.
            self.cancel.cancel();
        } else if to.is_interrupted() {
            self.interrupted(myself);
        }
    }

    /// The run ended (terminal or interrupted) and that is published: waiters get the
    /// task, streams end after the event they just received.
    fn end_run(&mut self) {
        let snapshot = (*self.durable).clone();
        for waiter in self.waiters.drain(..) {
            let _ = waiter.send(snapshot.clone());
        }
        self.subscribers.clear();
    }

    /// An interrupted task waits for its continuing message at most `task_timeout_seconds`.
    fn interrupted(&mut self, myself: &ActorRef<TaskMsg>) {
        self.cancel.cancel();
        self.generation += 1;
        let generation = self.generation;
        let timeout = Duration::from_secs_f64(self.agent.config.limits.task_timeout_seconds);
        myself.send_after(timeout, move || TaskMsg::TimedOut(generation));
    }

    fn finish(&mut self, myself: &ActorRef<TaskMsg>) {
        let state = self.status.state;
        self.agent.metrics.finished(state, self.started.elapsed());
        let _ = self.shared.contexts.cast(ContextMsg::Record {
            key: ContextKey {
                principal: self.key.principal.clone(),
                context: self.context_id.clone(),
            },
            user: self.message.clone(),
            reply: self.reply(),
        });
        self.cancel.cancel();
        myself.stop(None);
    }

    /// Adds a stream subscriber; returns the published events to replay first. A task
    /// waiting for input keeps a `next_run` subscriber through its next run.
    fn subscribe(
        &mut self,
        subscriber: Subscriber,
        replay: Replay,
        next_run: bool,
    ) -> Result<Vec<StreamItem>, Error> {
        let published = &self.events[..(self.published as usize).min(self.events.len())];
        let durable = self.durable.clone();
        let item = |event: &Arc<TaskEvent>| StreamItem {
            event: event.clone(),
            task: durable.clone(),
        };
        let state = durable.status.state;
        if state.is_terminal() {
            // Its end is published and the actor is stopping: a queued message may arrive.
            return Ok(published.last().map(item).into_iter().collect());
        }
        if self.subscribers.len() >= self.shared.config.server.max_subscribers_per_task {
            return Err(Error::SubscriptionFailed {
                task: Some(self.key.task.clone()),
                reason: "the task's subscriber limit is reached".into(),
            });
        }
        let events: Vec<StreamItem> = match replay {
            Replay::All => published.iter().map(item).collect(),
            Replay::After(n) => published.iter().filter(|e| e.seq > n).map(item).collect(),
            Replay::Current => published
                .iter()
                .rev()
                .find(|e| e.artifact.is_none())
                .map(item)
                .into_iter()
                .collect(),
        };
        // An interrupted task's stream is over once the client has the current state,
        // unless it follows the run the continuing message starts.
        if !state.ends_stream() || (next_run && state.is_interrupted()) {
            self.subscribers.push(subscriber);
        }
        Ok(events)
    }

    /// The event that produced the current status (the last status event: an artifact
    /// event does not change the status).
    fn current(&self) -> Option<&Arc<TaskEvent>> {
        self.events.iter().rev().find(|e| e.artifact.is_none())
    }

    fn build_snapshot(&self) -> TaskSnapshot {
        let seq = self.current().map_or(0, |e| e.seq);
        TaskSnapshot {
            id: self.key.task.clone(),
            context_id: self.context_id.clone(),
            status: self.status.clone(),
            seq,
            created_at: self.created_at,
            updated_at: self.status.timestamp,
            history: self.history.clone(),
            artifacts: self.artifacts.clone(),
            metadata: self.metadata.clone(),
        }
    }
}
