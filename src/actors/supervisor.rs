//! `TaskSupervisor`: the parent of every task actor.
//!
//! Task actors are spawned linked to it straight from the request path (it never sees
//! new tasks in its mailbox), so it only hears lifecycle events: a task actor that ends
//! is counted, one that fails is logged and turned into a `failed` record. It never
//! stops because a child ended. It also runs the retention sweep of finished tasks.

use std::sync::Arc;
use std::sync::atomic::Ordering::Relaxed;
use std::time::{Duration, Instant};

use ractor::{Actor, ActorProcessingErr, ActorRef, SupervisionEvent};

use super::context::ContextMsg;
use super::{ContextKey, Shared};
use crate::model::{AGENT_ERROR_CODE, TaskError, TaskEvent, TaskSnapshot, TaskState, TaskStatus};
use crate::store::Write;

/// Messages of the [`TaskSupervisor`].
pub(crate) enum SupervisorMsg {
    /// Evict expired finished tasks.
    Sweep,
}

/// The supervisor actor.
pub(crate) struct TaskSupervisor;

/// State of the supervisor.
pub(crate) struct SupervisorState {
    shared: Arc<Shared>,
    /// Aborted in `post_stop`.
    sweeper: Option<tokio::task::JoinHandle<()>>,
}

impl Actor for TaskSupervisor {
    type Msg = SupervisorMsg;
    type State = SupervisorState;
    type Arguments = Arc<Shared>;

    async fn pre_start(
        &self,
        myself: ActorRef<SupervisorMsg>,
        shared: Arc<Shared>,
    ) -> Result<SupervisorState, ActorProcessingErr> {
        let retention = shared.config.server.task_retention();
        let period = (retention / 4).clamp(Duration::from_millis(50), Duration::from_secs(10));
        let sweeper = myself.send_interval(period, || SupervisorMsg::Sweep);
        Ok(SupervisorState {
            shared,
            sweeper: Some(sweeper),
        })
    }

    async fn handle(
        &self,
        _myself: ActorRef<SupervisorMsg>,
        msg: SupervisorMsg,
        state: &mut SupervisorState,
    ) -> Result<(), ActorProcessingErr> {
        match msg {
            SupervisorMsg::Sweep => state.shared.store.sweep(Instant::now()),
        }
        Ok(())
    }

    async fn handle_supervisor_evt(
        &self,
        _myself: ActorRef<SupervisorMsg>,
        event: SupervisionEvent,
        state: &mut SupervisorState,
    ) -> Result<(), ActorProcessingErr> {
        let metrics = &state.shared.metrics;
        match event {
            SupervisionEvent::ActorTerminated(..) => {
                metrics.live_tasks.fetch_sub(1, Relaxed);
            }
            SupervisionEvent::ActorFailed(cell, error) => {
                metrics.live_tasks.fetch_sub(1, Relaxed);
                metrics.failed_actors.fetch_add(1, Relaxed);
                tracing::error!(actor = %cell.get_id(), %error, "task actor failed");
                // Rare by construction, so a scan is fine: find the task it owned and
                // record it as failed, so its owner sees an answer instead of a vanished task.
                let id = cell.get_id();
                let key = state
                    .shared
                    .live
                    .iter()
                    .find(|e| e.value().actor.get_id() == id)
                    .map(|e| e.key().clone());
                if let Some(key) = key
                    && let Some((key, live)) = state.shared.live.remove(&key)
                {
                    // A caller that found the actor gone waits for the entry to go.
                    state.shared.settled.notify_waiters();
                    // The last durable record, if the store has one, now failed.
                    let last = state.shared.store.task_now(&key);
                    let now = chrono::Utc::now();
                    let mut status = TaskStatus::new(TaskState::Failed);
                    status.error = Some(Arc::new(TaskError {
                        code: AGENT_ERROR_CODE,
                        message: "internal error".into(),
                    }));
                    let seq = last.as_ref().map_or(0, |t| t.seq) + 1;
                    let snapshot = TaskSnapshot {
                        id: key.task.clone(),
                        context_id: live.context_id.clone(),
                        status: status.clone(),
                        seq,
                        created_at: last.as_ref().map_or(now, |t| t.created_at),
                        updated_at: now,
                        history: last.as_ref().map(|t| t.history.clone()).unwrap_or_default(),
                        artifacts: last
                            .as_ref()
                            .map(|t| t.artifacts.clone())
                            .unwrap_or_default(),
                        metadata: last.as_ref().and_then(|t| t.metadata.clone()),
                        extensions: last
                            .as_ref()
                            .map(|t| t.extensions.clone())
                            .unwrap_or_default(),
                        note: None,
                    };
                    // Its turn will never be recorded: release the conversation.
                    let _ = state.shared.contexts.cast(ContextMsg::Abandon {
                        key: ContextKey {
                            principal: key.principal.clone(),
                            context: live.context_id.clone(),
                        },
                    });
                    let write = Write::Task {
                        key,
                        task: Arc::new(snapshot),
                        event: Arc::new(TaskEvent::status(seq, status)),
                        changed: true,
                        turn: crate::store::TurnId::default(),
                    };
                    let _ = state.shared.store.append(vec![write], None);
                }
            }
            SupervisionEvent::ActorStarted(_) | SupervisionEvent::ProcessGroupChanged(_) => {}
        }
        Ok(())
    }

    async fn post_stop(
        &self,
        _myself: ActorRef<SupervisorMsg>,
        state: &mut SupervisorState,
    ) -> Result<(), ActorProcessingErr> {
        if let Some(s) = state.sweeper.take() {
            s.abort();
        }
        Ok(())
    }
}
