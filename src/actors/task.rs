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
use std::sync::Arc;
use std::sync::atomic::Ordering::Relaxed;
use std::time::Instant;

use chrono::{DateTime, Utc};
use ractor::{Actor, ActorProcessingErr, ActorRef, RpcReplyPort};
use tokio::sync::{mpsc, oneshot};
use tokio_util::sync::CancellationToken;

mod events;
mod finale;
mod run;

use super::{AgentEntry, LiveTask, Shared};
use crate::agent::{AgentError, Flow, MAX_UPDATES_IN_FLIGHT, Outcome};
use crate::error::Error;
use crate::limits::Admission;
use crate::model::{
    AGENT_ERROR_CODE, Artifact, ArtifactUpdate, ContextId, Extensions, Message, TaskError,
    TaskEvent, TaskKey, TaskSnapshot, TaskState, TaskStatus,
};
use crate::store::{Committed, Orphan, TurnId, Write};
use crate::stream::{Replay, StreamItem};
use run::TaskLink;

/// The error of a task that was running when the server stopped without finishing it.
pub(crate) const RESTART_ERROR: &str = "interrupted by a server restart";

/// The error of a task whose node died while it was working (cluster).
pub(crate) const NODE_LOST_ERROR: &str = "node lost";

/// Messages of a [`TaskActor`].
pub(crate) enum TaskMsg {
    /// The task is in the live index: start the driver. Sent once, by `Runtime::submit`
    /// for a client-chosen id and by a restart's take-up (a task with a server-generated
    /// id starts itself: [`TaskArgs::starts_itself`]).
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
    /// The backend's durable note on the task ([`crate::agent::Updates::note`]).
    Note(Arc<str>),
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
    /// The extensions the creating request activated.
    pub(crate) extensions: Extensions,
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
    /// The task's trace span (`crate::telemetry`), when traces are exported.
    pub(crate) span: Option<tracing::Span>,
    /// The actor enters the live index in `pre_start` and starts its first run in
    /// `post_start`, with no [`TaskMsg::Start`]: a new task whose id the server generated,
    /// which nothing can collide with. The spawner enters it otherwise, then sends `Start`.
    pub(crate) starts_itself: bool,
    /// When the request submitted it: its `submitted` status's time (a conversation it
    /// opens starts at the same instant).
    pub(crate) submitted: DateTime<Utc>,
}

/// A reply that waits until every event emitted before it is durable.
enum Deferred {
    Cancel(
        RpcReplyPort<Result<TaskSnapshot, Error>>,
        Box<Result<TaskSnapshot, Error>>,
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
    /// The extensions the creating request activated: listed on the agent's messages and
    /// artifacts.
    extensions: Extensions,
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
    /// The record as the last event left it — as the last turn left it when this turn's
    /// events have none of their own (`unshared`).
    snapshot: Arc<TaskSnapshot>,
    /// This turn's last events that carry no copy of the task of their own yet: nobody
    /// followed the task and the store could plan no webhook when they were emitted, so
    /// they get the task as the turn leaves it (`flush`), which is all a reader or the
    /// store's record ever sees of them.
    unshared: usize,
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
    /// The backend's durable note ([`crate::agent::Updates::note`]).
    note: Option<Arc<str>>,
    /// Restored while working, and its backend takes it up again: the first run at
    /// `Start` is a take-up ([`crate::AgentRequest::taken_up`]).
    taking_up: bool,
    /// Where the agent's updates come from, and how many are not durable yet (shared
    /// with its [`Updates`]).
    link: Arc<TaskLink>,
    /// The numbers of the events those updates became, oldest first.
    flow_events: VecDeque<u64>,
    /// The writes of the events emitted in this turn, appended at its end.
    pending: Vec<Write>,
    /// The task's trace span, from submit to the end of the actor (`crate::telemetry`).
    span: Option<tracing::Span>,
    /// Its first run starts in `post_start` ([`TaskArgs::starts_itself`]).
    starts_itself: bool,
}

// === impl TaskActor ===

impl Actor for TaskActor {
    type Msg = TaskMsg;
    // Boxed: ractor moves an actor's state through its start-up futures several times.
    type State = Box<TaskActorState>;
    // Boxed too: the arguments ride in the spawning request's future until `pre_start`.
    type Arguments = Box<TaskArgs>;

    async fn pre_start(
        &self,
        myself: ActorRef<TaskMsg>,
        args: Box<TaskArgs>,
    ) -> Result<Box<TaskActorState>, ActorProcessingErr> {
        let args = *args;
        let status = TaskStatus::at(TaskState::Submitted, args.submitted);
        let placeholder = Arc::new(placeholder(&args.key, &args.context_id, &status));
        let mut state = Box::new(TaskActorState {
            created_at: status.timestamp,
            started: Instant::now(),
            history: {
                // With room for the agent's answer.
                let mut history = Vec::with_capacity(2);
                history.push(args.message.clone());
                history
            },
            artifacts: Vec::new(),
            snapshot: placeholder.clone(),
            unshared: 0,
            // Room for a run's events (growing from nothing costs more than this).
            unpublished: VecDeque::with_capacity(4),
            published: 0,
            durable: placeholder,
            deferred: Vec::new(),
            shared: args.shared,
            agent: args.agent,
            key: args.key,
            context_id: args.context_id,
            message: args.message,
            metadata: args.metadata,
            extensions: args.extensions,
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
            note: None,
            taking_up: false,
            link: Arc::new(TaskLink {
                actor: myself.clone(),
                flow: Flow::default(),
            }),
            flow_events: VecDeque::with_capacity(4),
            pending: Vec::with_capacity(4),
            span: args.span,
            starts_itself: args.starts_itself,
        });
        if state.starts_itself {
            // Indexed before the actor runs: its first run may end it at once, and an
            // ended task leaves the index.
            state.shared.metrics.live_tasks.fetch_add(1, Relaxed);
            let live = LiveTask::new(myself.clone(), &state.message, &state.context_id);
            state.shared.live.insert(state.key.clone(), live);
        }
        state.follow(args.follow);
        match args.restored {
            None => {
                state.shared.metrics.tasks_submitted.fetch_add(1, Relaxed);
                state.emit(status, None, true);
            }
            Some((task, events)) => {
                state.restore(&task, events);
                let m = &state.shared.metrics;
                match task.status.state {
                    TaskState::Submitted => {
                        m.tasks_submitted.fetch_add(1, Relaxed);
                    }
                    TaskState::Working => {
                        m.tasks_working.fetch_add(1, Relaxed);
                        let takes_up = state.agent.backend.takes_up()
                            && task.note.is_some()
                            && args.why != Orphan::Held;
                        state.taking_up = takes_up && state.start.is_some();
                        state.orphaned = match args.why {
                            // Its work goes on elsewhere (an upstream task): taken up.
                            _ if state.taking_up => None,
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

    async fn post_start(
        &self,
        myself: ActorRef<TaskMsg>,
        state: &mut Box<TaskActorState>,
    ) -> Result<(), ActorProcessingErr> {
        if state.starts_itself {
            state.start(&myself);
            state.flush(&myself);
        }
        Ok(())
    }

    async fn handle(
        &self,
        myself: ActorRef<TaskMsg>,
        msg: TaskMsg,
        state: &mut Box<TaskActorState>,
    ) -> Result<(), ActorProcessingErr> {
        let terminal = state.status.state.is_terminal();
        match msg {
            TaskMsg::Start => state.start(&myself),
            TaskMsg::Started => state.transition(&myself, TaskStatus::new(TaskState::Working)),
            TaskMsg::Progress { message, keep } if state.status.state == TaskState::Working => {
                let message = Arc::new(state.stamped(message));
                // A bounded history: past the cap, updates are streamed but not kept.
                if keep && state.history.len() < state.shared.config.server.max_task_history {
                    state.history.push(message.clone());
                }
                let mut status = TaskStatus::new(TaskState::Working);
                status.message = Some(message);
                state.update(&myself, |state, myself| state.transition(myself, status));
            }
            TaskMsg::Artifact(update) if state.status.state == TaskState::Working => {
                let update = state.stamped_artifact(update);
                state.update(&myself, |state, _| state.artifact(update));
            }
            TaskMsg::Note(note) if state.status.state == TaskState::Working => {
                // Stored with an event of its own, so it is durable before whatever the
                // backend does next is.
                state.note = Some(note);
                state.update(&myself, |state, myself| {
                    state.transition(myself, TaskStatus::new(TaskState::Working));
                });
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
            TaskMsg::Ran(result) => state.ran(&myself, result),
            TaskMsg::TimedOut(generation) => state.timed_out(&myself, generation),
            TaskMsg::Cancel { reason, reply } => {
                let outcome = if terminal {
                    // It became terminal after the caller found it running.
                    Err(Error::CancelFailed {
                        task: state.key.task.clone(),
                        state: state.status.state,
                    })
                } else {
                    state.cancel_elsewhere();
                    state.transition(&myself, canceled(reason));
                    Ok(state.build_snapshot())
                };
                if let Some(reply) = reply {
                    // Told only once what it reports is durable.
                    state.defer(Deferred::Cancel(reply, Box::new(outcome)));
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
                // Its work goes on elsewhere, and the store knows where (the note's write
                // is durable, or queued: a graceful stop drains the queue): taken up after
                // the restart.
                let elsewhere = state.status.state == TaskState::Working
                    && state.note.is_some()
                    && state.agent.backend.takes_up();
                if ((waiting || elsewhere) && keep_waiting) || (queued && keep_queued) {
                    let me = myself.get_id();
                    state
                        .shared
                        .live
                        .remove_if(&state.key, |_, live| live.actor.get_id() == me);
                    state.subscribers.clear();
                    state.cancel.cancel();
                    myself.stop(None);
                } else if !terminal {
                    state.cancel_elsewhere();
                    state.transition(&myself, canceled("shutdown".into()));
                }
            }
            // Late messages for a task that already moved on: nothing to do.
            TaskMsg::Note(note) => {
                // The backend named its work elsewhere only after the task was canceled:
                // it is stopped there too.
                state.link.flow.release(1);
                if state.status.state == TaskState::Canceled {
                    state.agent.backend.canceled(&state.key.task, Some(&note));
                }
            }
            TaskMsg::Progress { .. } | TaskMsg::Artifact(_) => state.link.flow.release(1),
            TaskMsg::Finished(_) | TaskMsg::Overrun => {}
        }
        state.flush(&myself);
        Ok(())
    }

    async fn post_stop(
        &self,
        _myself: ActorRef<TaskMsg>,
        state: &mut Box<TaskActorState>,
    ) -> Result<(), ActorProcessingErr> {
        state.cancel.cancel();
        state.link.flow.close();
        if let Some(span) = state.span.take() {
            span.record("a2a.task.state", state.status.state.as_str());
        }
        Ok(())
    }
}

impl TaskActorState {
    /// The task's first run: its agent's driver starts, or (restored) it fails or waits.
    fn start(&mut self, myself: &ActorRef<TaskMsg>) {
        if let Some(error) = self.orphaned.take() {
            // It was running when the server (or its node) stopped: its agent's work
            // is lost.
            let mut s = TaskStatus::new(TaskState::Failed);
            s.error = Some(Arc::new(TaskError {
                code: AGENT_ERROR_CODE,
                message: error.into(),
            }));
            self.transition(myself, s);
        } else if let Some(admission) = self.start.take() {
            let history = self.history[1..].to_vec();
            let request = self.request(self.message.clone(), history);
            if let Some(said) = self.run(admission, request) {
                // Its first poll ended the run: handled in this turn, so
                // `submitted` and the answer go to the store in one batch.
                self.first_poll_said(myself, said);
            }
        } else if self.status.state == TaskState::Submitted {
            // Restored, and its agent's queue had no room.
            let mut s = TaskStatus::new(TaskState::Failed);
            s.error = Some(Arc::new(TaskError {
                code: AGENT_ERROR_CODE,
                message:
                    "could not be queued again after a server restart (the agent's queue is full)"
                        .into(),
            }));
            self.transition(myself, s);
        }
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
        extensions: Extensions::default(),
        note: None,
    }
}
