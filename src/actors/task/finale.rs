//! A task whose last turn ends it, handed to the store's continuation whole: the actor
//! stops in that turn, and what it would have done on hearing the end was durable — leave
//! the live index, count the end, record the conversation's turn, tell the waiters — is
//! done by the continuation itself, with no message back to the actor and no second turn
//! of it (docs/decisions/a-task-ends-in-its-commits-continuation.md).
//!
//! Only where every earlier event is durable and nothing else follows the task: no
//! subscriber, no reply deferred to an event, no webhook the store could plan, no trace
//! span, one node (what a shared store's followers read needs the actor's word). Between
//! the stop and the continuation the task stays in the live index under its stopped
//! actor: a caller whose call finds that actor gone waits for the entry to go
//! (`Runtime::ended_record`) and then reads the store, where the record is durable and indexed
//! before the continuation runs.

use std::sync::Arc;
use std::time::Instant;

use ractor::{ActorId, ActorRef};
use tokio::sync::oneshot;

use super::{TaskActorState, TaskMsg};
use crate::actors::context::ContextMsg;
use crate::actors::{AgentEntry, Shared};
use crate::model::{TaskKey, TaskSnapshot, TaskState};
use crate::store::{Committed, Write};

/// A task's end, run by the store's continuation once its last events are durable (or,
/// dropped unrun — the store closed first —, only its live entry removed).
pub(super) struct Finale {
    shared: Arc<Shared>,
    agent: Arc<AgentEntry>,
    key: TaskKey,
    actor: ActorId,
    /// The task as its last event left it.
    task: Arc<TaskSnapshot>,
    waiters: Vec<oneshot::Sender<TaskSnapshot>>,
    /// The conversation's turn, for the context actor.
    turn: Option<ContextMsg>,
    started: Instant,
    /// Out of the live index.
    left: bool,
}

impl TaskActorState {
    /// This turn ends the task, every earlier event is durable, and nothing but its
    /// waiters follows it: its end may be left to the commit ([`Finale`]).
    pub(super) fn ends_in_commit(&self) -> bool {
        let mut events = self.pending.iter().filter_map(|w| match w {
            Write::Task { event, .. } => Some(event),
            _ => None,
        });
        let ends = events
            .next_back()
            .is_some_and(|e| e.status.state.is_terminal());
        // Each of this turn's events is one write and one unpublished item: no more
        // unpublished items than that, and no earlier append waits for its `Durable`.
        ends && self.unpublished.len() == events.count() + 1
            && self.subscribers.is_empty()
            && self.deferred.is_empty()
            && self.span.is_none()
            && self.shared.cluster.is_none()
            && self.shared.store.commits_later()
            && !self.shared.store.may_deliver()
    }

    /// Hands the task's end to a [`Finale`] and stops the actor (after this turn).
    pub(super) fn finale(&mut self, myself: &ActorRef<TaskMsg>) -> Finale {
        let turn = self.turn_record();
        self.cancel.cancel();
        myself.stop(None);
        Finale {
            shared: self.shared.clone(),
            agent: self.agent.clone(),
            key: self.key.clone(),
            actor: myself.get_id(),
            // The task as the last event left it: the last item's copy (`flush`, `emit`).
            task: self.snapshot.clone(),
            waiters: std::mem::take(&mut self.waiters),
            turn: Some(turn),
            started: self.started,
            left: false,
        }
    }
}

/// Counts a task's end and casts its conversation's turn to the context actor: done
/// before anyone hears of the end, by the actor or by its [`Finale`], since whoever heard
/// may send the conversation's next message at once, from another worker, and the
/// context actor must have the `Record` first.
pub(super) fn count_and_record(
    agent: &AgentEntry,
    shared: &Shared,
    state: TaskState,
    started: Instant,
    turn: ContextMsg,
) {
    agent.metrics.finished(state, started.elapsed());
    let _ = shared.contexts.cast(turn);
}

impl Finale {
    /// The task's events are durable: its end is published.
    ///
    /// The waiters hear last: this may run on another thread than theirs (a runtime's
    /// other worker, an embedder's store thread), and whoever heard of the end must find
    /// the task out of the live index, counted, and its turn in the conversation (the
    /// context actor has the `Record` before the caller's next message can ask it).
    pub(super) fn publish(mut self, committed: Committed) {
        self.leave();
        if let Some(turn) = self.turn.take() {
            count_and_record(
                &self.agent,
                &self.shared,
                self.task.status.state,
                self.started,
                turn,
            );
        }
        if !committed.deliveries.is_empty() {
            // A configuration set since `ends_in_commit` looked was planned for.
            self.shared.webhooks.deliver(committed.deliveries);
        }
        for waiter in self.waiters.drain(..) {
            let _ = waiter.send((*self.task).clone());
        }
    }

    /// Leaves the live index (once) and tells whoever waits for that.
    fn leave(&mut self) {
        if std::mem::replace(&mut self.left, true) {
            return;
        }
        let actor = self.actor;
        self.shared
            .live
            .remove_if(&self.key, |_, live| live.actor.get_id() == actor);
        self.shared.settled.notify_waiters();
    }
}

impl Drop for Finale {
    fn drop(&mut self) {
        // Unrun: the store never said durable (it closed). The waiters hear nothing and
        // read the store; the entry of a stopped actor does not stay behind.
        self.leave();
    }
}
