//! A task's runs: the request its agent gets, the driver that runs the agent outside the
//! actor (a slot, the deadline, the cancel token), the link its updates come back through,
//! and what the run's end (or a takeover, or a restart) makes of the task.

use std::panic::AssertUnwindSafe;
use std::sync::Arc;
use std::time::Instant;

use futures_util::FutureExt as _;
use ractor::ActorRef;
use tokio_util::sync::CancellationToken;

use super::{Follow, TaskActorState, TaskMsg};
use crate::actors::AgentEntry;
use crate::actors::remote;
use crate::agent::{AgentError, AgentRequest, Flow, Outcome, Update, UpdateSink, Updates};
use crate::error::Error;
use crate::limits::Admission;
use crate::model::{
    AGENT_ERROR_CODE, ArtifactUpdate, Message, TaskError, TaskEvent, TaskSnapshot, TaskState,
    TaskStatus,
};

impl TaskActorState {
    /// What a run's first poll ended with, handled in the turn that started it: its
    /// answer, or the deadline. A `Finished` follows updates the agent sent during that
    /// poll as messages: it goes through the mailbox, after them.
    pub(super) fn first_poll_said(&mut self, myself: &ActorRef<TaskMsg>, said: TaskMsg) {
        match said {
            TaskMsg::Ran(result) => self.ran(myself, result),
            TaskMsg::TimedOut(generation) => self.timed_out(myself, generation),
            other => {
                let _ = myself.cast(other);
            }
        }
    }

    /// The agent answered without telling its start first: exactly what `Started` then
    /// `Finished` would do.
    pub(super) fn ran(&mut self, myself: &ActorRef<TaskMsg>, result: Result<Outcome, AgentError>) {
        self.transition(myself, TaskStatus::new(TaskState::Working));
        if self.status.state == TaskState::Working {
            self.agent_finished(myself, result);
        }
    }

    /// A run's deadline passed (one of an earlier run, or of a task already ended, is
    /// ignored).
    pub(super) fn timed_out(&mut self, myself: &ActorRef<TaskMsg>, generation: u64) {
        if generation == self.generation && !self.status.state.is_terminal() {
            self.cancel_elsewhere();
            self.transition(myself, super::canceled("timeout".into()));
        }
    }

    /// The agent's run ended: its outcome becomes the task's next state.
    pub(super) fn agent_finished(
        &mut self,
        myself: &ActorRef<TaskMsg>,
        result: Result<Outcome, AgentError>,
    ) {
        let status = match result {
            Ok(outcome) => {
                let (to, reply) = match outcome {
                    Outcome::Completed(m) => (TaskState::Completed, m),
                    Outcome::InputRequired(m) => (TaskState::InputRequired, m),
                    Outcome::AuthRequired(m) => (TaskState::AuthRequired, m),
                    Outcome::Rejected(m) => (TaskState::Rejected, m),
                    Outcome::Canceled(reason) => {
                        self.transition(myself, super::canceled(reason.into()));
                        return;
                    }
                };
                let mut s = TaskStatus::new(to);
                if let Some(reply) = reply {
                    let reply = Arc::new(self.stamped(reply));
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

    pub(super) fn request(
        &mut self,
        message: Arc<Message>,
        task_history: Vec<Arc<Message>>,
    ) -> AgentRequest {
        AgentRequest {
            note: self.note.clone(),
            taken_up: std::mem::take(&mut self.taking_up),
            artifacts: self.artifacts.clone(),
            task_id: self.key.task.clone(),
            context_id: self.context_id.clone(),
            principal: self.key.principal.clone(),
            message,
            history: self.context_history.clone(),
            task_history,
            turn: self.turn.number,
            extensions: self.extensions.clone(),
            cancel: self.cancel.clone(),
        }
    }

    /// The task is about to end canceled (by a client, its time-out, a shutdown that
    /// keeps nothing) while its backend may have work running elsewhere: the backend stops
    /// it ([`crate::Agent::canceled`]). Told before the run's token fires, so a run that
    /// has not named its work yet hears of the cancel before it is dropped.
    pub(super) fn cancel_elsewhere(&self) {
        if !self.status.state.is_terminal() {
            self.agent
                .backend
                .canceled(&self.key.task, self.note.as_deref());
        }
    }

    /// An agent message listing the extensions the request activated (docs/PROTOCOL.md
    /// §12), before its own.
    pub(super) fn stamped(&self, mut message: Message) -> Message {
        if !self.extensions.is_empty() {
            message.extensions = self.extensions.with(&message.extensions);
        }
        message
    }

    /// An artifact update whose artifact lists the activated extensions, as
    /// [`Self::stamped`].
    pub(super) fn stamped_artifact(&self, mut update: ArtifactUpdate) -> ArtifactUpdate {
        if !self.extensions.is_empty() {
            let merged = self.extensions.with(&update.artifact.extensions);
            if merged != update.artifact.extensions {
                Arc::make_mut(&mut update.artifact).extensions = merged;
            }
        }
        update
    }

    /// Starts a run of the agent: its driver, under a fresh generation and deadline. The
    /// deadline (`task_timeout_seconds`) counts from the submission for the first run and
    /// from the continuing message for later ones. When the driver ends at its first poll,
    /// what it had to say (its answer, or the deadline) is returned for the caller to
    /// handle in this turn — no message, no mailbox round trip.
    pub(super) fn run(&mut self, admission: Admission, request: AgentRequest) -> Option<TaskMsg> {
        self.generation += 1;
        let timeout = self.agent.config.limits.task_timeout();
        let from = if self.generation == 1 {
            self.started
        } else {
            Instant::now()
        };
        let deadline = tokio::time::Instant::from_std(from) + timeout;
        let (link, agent, generation) = (self.link.clone(), self.agent.clone(), self.generation);
        let driver = move || drive(link, agent, admission, request, deadline, generation);
        // Traced: the run in a span of its own, so the backend's upstream calls carry it.
        // Made in its box, not moved into it (crate::boxed).
        let mut driver: std::pin::Pin<
            Box<dyn std::future::Future<Output = Option<TaskMsg>> + Send>,
        > = match &self.span {
            Some(task) => {
                use tracing::Instrument as _;
                let run = tracing::trace_span!(target: crate::telemetry::TARGET, parent: task, "a2a.agent.run", a2a.agent.id = self.agent.config.id.as_str());
                crate::boxed::made_in_place(move || driver().instrument(run))
            }
            None => crate::boxed::made_in_place(driver),
        };
        // The driver's first poll runs here, in this turn of the actor: an agent that
        // answers at once has its `Ran` handled in this turn, with no task spawned, no
        // message and no wake-up. One that does not is handed to tokio, whose first poll
        // registers the real waker (this poll's waker does nothing: the driver is polled
        // again at once, so nothing it waits for can be missed); what it ends with comes
        // back as a message. A poll never waits on the outside world, so the mailbox is
        // not held up by it.
        let mut cx = std::task::Context::from_waker(std::task::Waker::noop());
        match driver.as_mut().poll(&mut cx) {
            std::task::Poll::Ready(said) => said,
            std::task::Poll::Pending => {
                let actor = self.link.actor.clone();
                tokio::spawn(async move {
                    if let Some(said) = driver.await {
                        let _ = actor.cast(said);
                    }
                });
                None
            }
        }
    }

    /// Continues an interrupted task with a new message. The interruption must be
    /// published: a task nobody can have been told is waiting is still in progress.
    pub(super) fn resume(
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
        if let Some(said) = self.run(admission, request) {
            // Handled as the next message, after this one's reply.
            let _ = self.link.actor.cast(said);
        }
        Ok(found)
    }

    /// Takes up a task read back from the store: its record and its durable events.
    pub(super) fn restore(&mut self, task: &Arc<TaskSnapshot>, events: Vec<Arc<TaskEvent>>) {
        self.created_at = task.created_at;
        self.status = task.status.clone();
        self.history = task.history.clone();
        self.artifacts = task.artifacts.clone();
        self.note = task.note.clone();
        self.published = events.last().map_or(task.seq, |e| e.seq);
        self.events = events;
        self.snapshot = task.clone();
        self.durable = task.clone();
    }

    pub(super) fn follow(&mut self, follow: Follow) {
        match follow {
            Follow::Nobody => {}
            Follow::Final(tx) => self.waiters.push(tx),
            Follow::Stream(sub) => self.subscribers.push(sub),
        }
    }

    /// The task is another node's now: stop the agent and hand this node's followers to
    /// the shared store, from the last event they were sent.
    pub(super) fn fenced(&mut self, myself: &ActorRef<TaskMsg>) {
        tracing::info!(task = %self.key.task, "taken by another node; stopped here");
        let me = myself.get_id();
        self.shared
            .live
            .remove_if(&self.key, |_, live| live.actor.get_id() == me);
        self.cancel.cancel();
        self.start = None;
        // Nothing more is written here: what this turn emitted is dropped unwritten.
        self.pending.clear();
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
}

/// Runs the agent for one run of a task, outside the actor: waits for a slot, runs the
/// backend, and ends with what the actor is to hear (the outcome, or the deadline).
/// Ends early, with nothing to say, when the run is canceled (the actor cancels the token);
/// dropping the agent's future aborts its I/O, and dropping the permit hands the slot to
/// the next queued task (none once the runtime is shutting down: the task stays queued,
/// and in a cluster another node takes it).
pub(super) async fn drive(
    link: Arc<TaskLink>,
    agent: Arc<AgentEntry>,
    admission: Admission,
    request: AgentRequest,
    deadline: tokio::time::Instant,
    generation: u64,
) -> Option<TaskMsg> {
    // The run's token: the actor cancels it to stop the run.
    let cancel = request.cancel.clone();
    let work = async {
        let Some(_permit) = admission.ready().await else {
            // The scheduler closed: the shutdown's own message ends the task.
            return None;
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
        Some(if updates.take_start() {
            TaskMsg::Ran(result)
        } else {
            TaskMsg::Finished(result)
        })
    };
    let mut work = std::pin::pin!(work);
    // Nothing can have cancelled the run or passed its deadline before its first poll
    // (`TaskActorState::run` makes both and polls it in the same turn of the actor): an
    // agent that answers at once never registers the token's waiter or the deadline's
    // timer, whose registration and removal cost more than the rest of the driver.
    if let Some(said) = futures_util::future::poll_immediate(work.as_mut()).await {
        return said;
    }
    tokio::select! {
        biased;
        () = cancel.cancelled() => None,
        () = tokio::time::sleep_until(deadline) => Some(TaskMsg::TimedOut(generation)),
        said = work => said,
    }
}

/// What an agent's [`Updates`] hold: its task's actor, and the flow of the updates it
/// sent there. One per task.
pub(crate) struct TaskLink {
    pub(super) actor: ActorRef<TaskMsg>,
    pub(super) flow: Flow,
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
                Update::Note(note) => TaskMsg::Note(note),
            })
            .is_ok()
    }
}
