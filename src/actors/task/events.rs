//! A task's events: each new state or artifact becomes a numbered event, appended to the
//! store and published once durable — to subscribers, waiters, deferred replies, webhooks
//! and the conversation.

use std::sync::Arc;

use ractor::ActorRef;
use tokio::sync::mpsc;

use super::{Deferred, Subscriber, TaskActorState, TaskMsg};
use crate::actors::{ContextKey, context::ContextMsg};
use crate::error::Error;
use crate::model::{ArtifactUpdate, Message, TaskEvent, TaskSnapshot, TaskState, TaskStatus};
use crate::store::{Committed, Durable, Write};
use crate::stream::{Replay, StreamItem};

impl TaskActorState {
    /// Records an event: it joins the writes of this turn of the actor, which go to the
    /// store together at its end ([`Self::flush`]), and is published once durable.
    pub(super) fn emit(
        &mut self,
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
        // Once an event of this turn goes without a copy, so do the rest of the turn's: the
        // unshared are always its last ones.
        let shared =
            self.unshared == 0 && (!self.subscribers.is_empty() || self.shared.store.may_deliver());
        if shared {
            self.snapshot = Arc::new(self.build_snapshot());
        } else {
            // Given the task as this turn leaves it, in `flush`.
            self.unshared += 1;
        }
        self.unpublished.push_back(StreamItem {
            event: event.clone(),
            task: self.snapshot.clone(),
        });
        self.pending.push(Write::Task {
            key: self.key.clone(),
            task: self.snapshot.clone(),
            event,
            changed,
            turn: self.turn,
        });
        if self.status.state.is_terminal() {
            // The conversation's turn is durable with the end of the task.
            self.pending.push(Write::Turn {
                principal: self.key.principal.clone(),
                context: self.context_id.clone(),
                turn: self.turn,
                user: self.message.clone(),
                reply: self.reply(),
            });
        }
    }

    /// Hands the events of this turn to the store in one append — one batch, so a task
    /// that is submitted and finished in one turn costs one commit — and publishes them
    /// once durable (at once for a store that is durable on append).
    pub(super) fn flush(&mut self, myself: &ActorRef<TaskMsg>) {
        if self.unshared > 0 {
            // Nobody follows the task and no webhook is planned: this turn's last events
            // carry one copy of the task, as the turn leaves it (the store keeps the last).
            let task = Arc::new(self.build_snapshot());
            let items = self.unpublished.iter_mut().rev().map(|item| &mut item.task);
            let writes = self.pending.iter_mut().rev().filter_map(|w| match w {
                Write::Task { task, .. } => Some(task),
                _ => None,
            });
            for t in items.take(self.unshared).chain(writes.take(self.unshared)) {
                *t = task.clone();
            }
            self.snapshot = task;
            self.unshared = 0;
        }
        if self.pending.is_empty() {
            return;
        }
        if self.ends_in_commit() {
            // The last turn, and only waiters follow: the commit's continuation ends the
            // task (`finale`), and the actor stops now.
            let finale = self.finale(myself);
            let writes = std::mem::take(&mut self.pending);
            let then = Box::new(move |committed: Committed| finale.publish(committed));
            if let Durable::Now(committed) = self.shared.store.append(writes, Some(then)) {
                // Not by `commits_later`'s word; the record is durable all the same, and
                // the waiters (dropped with `then`) read it from the store.
                if !committed.deliveries.is_empty() {
                    self.shared.webhooks.deliver(committed.deliveries);
                }
            }
            return;
        }
        let writes = std::mem::take(&mut self.pending);
        let seq = self.events.len() as u64;
        let me = myself.clone();
        // Traced: a span from the append to durability, ended as the continuation runs.
        let commit = self.span.as_ref().map(|task| {
            tracing::trace_span!(target: crate::telemetry::TARGET, parent: task, "a2a.store.commit", a2a.store.writes = writes.len())
        });
        let then = Box::new(move |committed: Committed| {
            drop(commit);
            let _ = me.cast(TaskMsg::Durable(seq, committed));
        });
        if let Durable::Now(committed) = self.shared.store.append(writes, Some(then)) {
            self.publish(myself, seq, committed);
        }
    }

    /// The agent's reply of a completed task, for the conversation.
    pub(super) fn reply(&self) -> Option<Arc<Message>> {
        (self.status.state == TaskState::Completed)
            .then(|| self.status.message.clone())
            .flatten()
    }

    /// Publishes every event up to `seq` (now durable), in order: subscribers, waiters at
    /// the end of a run, the task's end; then the webhook deliveries the store planned and
    /// the replies that waited for these events.
    pub(super) fn publish(&mut self, myself: &ActorRef<TaskMsg>, seq: u64, committed: Committed) {
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
            let ends = item.is_final() && item.status.state.is_terminal();
            if ends {
                super::finale::count_and_record(
                    &self.agent,
                    &self.shared,
                    item.status.state,
                    self.started,
                    self.turn_record(),
                );
            }
            self.fan_out(&item);
            if item.is_final() {
                self.end_run();
                if ends {
                    // Subscribers and waiters heard of the end just now (`fan_out`); the
                    // store indexed the record before it said durable, so whoever heard
                    // finds it ended: through this actor while the entry below is still
                    // there, else (or once the actor has stopped) through the store.
                    let me = myself.get_id();
                    self.shared
                        .live
                        .remove_if(&self.key, |_, live| live.actor.get_id() == me);
                    self.cancel.cancel();
                    myself.stop(None);
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
    pub(super) fn defer(&mut self, reply: Deferred) {
        let upto = self.events.len() as u64;
        if upto <= self.published {
            self.answer(reply);
        } else {
            self.deferred.push((upto, reply));
        }
    }

    pub(super) fn answer(&self, reply: Deferred) {
        match reply {
            Deferred::Cancel(port, outcome) => {
                let _ = port.send(*outcome);
            }
            Deferred::Get(port) => {
                let _ = port.send((*self.durable).clone());
            }
        }
    }

    /// Keeps the `tasks by state` gauges of /metrics.
    pub(super) fn count_states(&self, from: TaskState, to: TaskState) {
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

    pub(super) fn fan_out(&mut self, item: &StreamItem) {
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
    pub(super) fn update(
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

    pub(super) fn artifact(&mut self, update: ArtifactUpdate) {
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
        self.emit(status, Some(update), false);
    }

    pub(super) fn transition(&mut self, myself: &ActorRef<TaskMsg>, status: TaskStatus) {
        let previous = self.status.state;
        if !previous.can_become(status.state) {
            tracing::debug!(task = %self.key.task, from = %previous, to = %status.state, "transition ignored");
            return;
        }
        let to = status.state;
        if to != previous {
            self.count_states(previous, to);
        }
        self.emit(status, None, to != previous);
        if to.is_terminal() {
            // The agent's run (if any) stops now; the actor stops once the end is published.
            self.cancel.cancel();
        } else if to.is_interrupted() {
            self.interrupted(myself);
        }
    }

    /// The run ended (terminal or interrupted) and that is published: waiters get the
    /// task, streams end after the event they just received.
    pub(super) fn end_run(&mut self) {
        // One copy per waiter, none when nobody waits.
        for waiter in self.waiters.drain(..) {
            let _ = waiter.send((*self.durable).clone());
        }
        self.subscribers.clear();
    }

    /// An interrupted task waits for its continuing message at most `task_timeout_seconds`.
    pub(super) fn interrupted(&mut self, myself: &ActorRef<TaskMsg>) {
        self.cancel.cancel();
        self.generation += 1;
        let generation = self.generation;
        let timeout = self.agent.config.limits.task_timeout();
        myself.send_after(timeout, move || TaskMsg::TimedOut(generation));
    }

    /// The conversation's turn this task ends, for the context actor.
    pub(super) fn turn_record(&self) -> ContextMsg {
        ContextMsg::Record {
            key: ContextKey {
                principal: self.key.principal.clone(),
                context: self.context_id.clone(),
            },
            user: self.message.clone(),
            reply: self.reply(),
        }
    }

    /// Adds a stream subscriber; returns the published events to replay first. A task
    /// waiting for input keeps a `next_run` subscriber through its next run.
    pub(super) fn subscribe(
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
    pub(super) fn current(&self) -> Option<&Arc<TaskEvent>> {
        self.events.iter().rev().find(|e| e.artifact.is_none())
    }

    pub(super) fn build_snapshot(&self) -> TaskSnapshot {
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
            extensions: self.extensions.clone(),
            note: self.note.clone(),
        }
    }
}
