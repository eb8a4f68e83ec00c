//! Following tasks: a new task's stream, resubscribing, and the streams of tasks that
//! run here, ran here or run on another node.

use std::collections::VecDeque;
use std::sync::Arc;
use std::sync::atomic::Ordering::Relaxed;

use ractor::ActorRef;
use ractor::rpc::CallResult;
use tokio::sync::mpsc;

use super::{
    Replay, Resubscribed, Runtime, SendRequest, StreamItem, Streamed, SubmitOptions, TaskStream,
    submit, task_key,
};
use crate::actors::LiveTask;
use crate::actors::remote;
use crate::actors::task::{Follow, Subscriber, TaskMsg};
use crate::error::{Error, Result};
use crate::model::{AgentId, ContextId, Principal, TaskEvent, TaskId, TaskKey, TaskSnapshot};

impl Runtime {
    /// Submits a message and follows the task as a stream from its first event.
    ///
    /// ```
    /// # async fn run() -> a2ad::Result<()> {
    /// use std::sync::Arc;
    ///
    /// use a2ad::{AgentId, Message, Principal, Runtime, SendRequest, TaskState};
    ///
    /// let mut config = a2ad::Config::default(); // one `echo` agent
    /// config.store = a2ad::config::StoreConfig::memory();
    /// let runtime = Runtime::start(Arc::new(config.validated()?)).await?;
    /// let hello = SendRequest::new(Message::user_text(["hello"]));
    /// let mut stream = runtime.stream(&Principal::new("me"), &AgentId::new("echo"), hello).await?;
    /// let mut last = None;
    /// while let Some(event) = stream.next().await {
    ///     last = Some(event.status.state); // submitted, working, ..., completed
    /// }
    /// assert_eq!(last, Some(TaskState::Completed));
    /// # Ok(())
    /// # }
    /// # tokio::runtime::Runtime::new().expect("runtime").block_on(run()).expect("runs");
    /// ```
    ///
    /// # Errors
    /// As [`Runtime::send`], plus [`Error::SubscriptionFailed`].
    pub async fn stream(
        &self,
        principal: &Principal,
        agent: &AgentId,
        request: SendRequest,
    ) -> Result<TaskStream> {
        match self
            .stream_with(principal, agent, request, SubmitOptions::default())
            .await?
        {
            Streamed::Task(s) => Ok(s),
            Streamed::Message(_) => Err(Error::Internal),
        }
    }

    /// [`Runtime::stream`] with the options a dialect found in the request.
    ///
    /// # Errors
    /// As [`Runtime::send_with`], plus [`Error::SubscriptionFailed`].
    pub async fn stream_with(
        &self,
        principal: &Principal,
        agent: &AgentId,
        request: SendRequest,
        options: SubmitOptions,
    ) -> Result<Streamed> {
        if let Some(reply) = self.direct_reply(agent, &request, &options)? {
            return Ok(Streamed::Message(reply));
        }
        let (subscriber, rx) = self.subscriber();
        let id = subscriber.id;
        let stream = match self
            .submit(
                principal,
                agent,
                request,
                Follow::Stream(subscriber),
                options,
            )
            .await?
        {
            submit::Submitted::Fresh {
                key,
                context_id,
                actor,
            } => {
                // Let the new task's first turns run before the response head goes out:
                // an agent that answers at once then has every event of its stream in the
                // first write (one `writev` instead of two).
                tokio::task::yield_now().await;
                self.task_stream(
                    key.task,
                    context_id,
                    VecDeque::new(),
                    Some(rx),
                    Some((actor, id)),
                )
            }
            // A continued task's stream starts with the `working` event its new run makes
            // (the task as it stands then, the new message in its history).
            submit::Submitted::Continued {
                key,
                context_id,
                actor,
            } => self.task_stream(
                key.task,
                context_id,
                VecDeque::new(),
                Some(rx),
                Some((actor, id)),
            ),
            submit::Submitted::Existing(_, submit::Existing::Finished(f)) => {
                self.finished_stream(&f)
            }
            submit::Submitted::Existing(key, submit::Existing::Live(live)) => {
                match self.subscribe_live(&key, live, Replay::All, false).await? {
                    Resubscribed::Live(s) => s,
                    Resubscribed::Finished(f) => self.finished_stream(&f),
                }
            }
            submit::Submitted::Existing(key, submit::Existing::Remote(r)) => {
                self.remote_stream(&key, &r, Replay::All)?
            }
        };
        Ok(Streamed::Task(stream))
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
        self.subscribe(principal, agent, task, replay, false).await
    }

    /// Follows a task from where it stands (the official subscribe): the current state
    /// first, then live events to the end of the run — or, when the task waits for input
    /// (interrupted), through the run its continuing message starts.
    ///
    /// # Errors
    /// [`Error::TaskNotFound`], or [`Error::SubscriptionFailed`] at the subscriber limit.
    pub async fn follow(
        &self,
        principal: &Principal,
        agent: &AgentId,
        task: &TaskId,
    ) -> Result<Resubscribed> {
        self.subscribe(principal, agent, task, Replay::Current, true)
            .await
    }

    /// Follows a task as [`follow`](Self::follow) does, but from after event `after` (a
    /// client resuming a broken stream: `Last-Event-ID`): every event numbered above it,
    /// then live ones — also when the task finished meanwhile, as long as it has events
    /// the client has not seen.
    ///
    /// # Errors
    /// [`Error::TaskNotFound`]; [`Error::SubscriptionFailed`] at the subscriber limit, or
    /// when the task is terminal and the client has its last event.
    pub async fn follow_from(
        &self,
        principal: &Principal,
        agent: &AgentId,
        task: &TaskId,
        after: u64,
    ) -> Result<Resubscribed> {
        match self
            .subscribe(principal, agent, task, Replay::After(after), true)
            .await?
        {
            Resubscribed::Finished(t) if after < t.seq => Ok(Resubscribed::Live(
                self.finished_stream_after(principal, agent, &t, after)
                    .await,
            )),
            other => Ok(other),
        }
    }

    async fn subscribe(
        &self,
        principal: &Principal,
        agent: &AgentId,
        task: &TaskId,
        replay: Replay,
        next_run: bool,
    ) -> Result<Resubscribed> {
        let key = task_key(principal, agent, task);
        match self.find(&key).await? {
            None => Err(Error::TaskNotFound { task: task.clone() }),
            Some(submit::Existing::Finished(f)) => Ok(Resubscribed::Finished(f)),
            Some(submit::Existing::Live(live)) => {
                self.subscribe_live(&key, live, replay, next_run).await
            }
            Some(submit::Existing::Remote(r)) if r.status.state.ends_stream() && !next_run => {
                Ok(Resubscribed::Finished(r))
            }
            Some(submit::Existing::Remote(r)) => {
                Ok(Resubscribed::Live(self.remote_stream(&key, &r, replay)?))
            }
        }
    }

    /// A stream of a task another node runs, read from the shared store: the events
    /// `replay` asks for, then each new one, to the end of the run.
    ///
    /// # Errors
    /// [`Error::Busy`] when this node holds `cluster.max_followers` followers.
    fn remote_stream(
        &self,
        key: &TaskKey,
        r: &Arc<TaskSnapshot>,
        replay: Replay,
    ) -> Result<TaskStream> {
        let (tx, rx) = mpsc::channel(self.shared.config.server.stream_buffer);
        let mut pending = VecDeque::new();
        let cursor = match replay {
            Replay::All => 0,
            Replay::After(n) => n,
            Replay::Current => {
                pending.push_back(StreamItem {
                    event: Arc::new(r.current_event()),
                    task: r.clone(),
                });
                r.seq
            }
        };
        remote::try_spawn(
            self.shared.clone(),
            key.clone(),
            cursor,
            remote::Sink::Stream(tx),
        )?;
        Ok(self.task_stream(
            key.task.clone(),
            r.context_id.clone(),
            pending,
            Some(rx),
            None,
        ))
    }

    /// A one-event stream carrying a finished task's final state.
    pub(crate) fn finished_stream(&self, snapshot: &Arc<TaskSnapshot>) -> TaskStream {
        let item = StreamItem {
            event: Arc::new(snapshot.current_event()),
            task: snapshot.clone(),
        };
        self.task_stream(
            snapshot.id.clone(),
            snapshot.context_id.clone(),
            VecDeque::from([item]),
            None,
            None,
        )
    }

    /// A finished task's events after `after`, as the store kept them, ending with its final
    /// state (a `Last-Event-ID` replay that picks up where a stream broke, a restart
    /// included). A store that keeps no events of finished tasks (memory) gives the
    /// one-event stream of [`Runtime::finished_stream`].
    pub(crate) async fn finished_stream_after(
        &self,
        principal: &Principal,
        agent: &AgentId,
        snapshot: &Arc<TaskSnapshot>,
        after: u64,
    ) -> TaskStream {
        let key = task_key(principal, agent, &snapshot.id);
        let events: Vec<TaskEvent> = self
            .shared
            .store
            .events(&key, after)
            .await
            .unwrap_or_default();
        let complete = events
            .last()
            .is_some_and(|e| e.seq == snapshot.seq && e.is_final());
        if !complete {
            return self.finished_stream(snapshot);
        }
        let items = events
            .into_iter()
            .map(|e| StreamItem {
                event: Arc::new(e),
                task: snapshot.clone(),
            })
            .collect();
        self.task_stream(
            snapshot.id.clone(),
            snapshot.context_id.clone(),
            items,
            None,
            None,
        )
    }

    async fn subscribe_live(
        &self,
        key: &TaskKey,
        live: LiveTask,
        replay: Replay,
        next_run: bool,
    ) -> Result<Resubscribed> {
        let (subscriber, rx) = self.subscriber();
        let id = subscriber.id;
        let call = live.actor.call(
            |reply| TaskMsg::Subscribe {
                subscriber,
                replay,
                next_run,
                reply,
            },
            Some(self.shared.call_timeout),
        );
        match call.await {
            Ok(CallResult::Success(Ok(items))) => {
                // A waiting task's current (interrupted) event does not end a stream that
                // follows its next run.
                let waits = next_run
                    && items
                        .last()
                        .is_some_and(|e| e.artifact.is_none() && e.status.state.is_interrupted());
                let finished = !waits && items.last().is_some_and(|e| e.is_final());
                let mut stream = self.task_stream(
                    key.task.clone(),
                    live.context_id,
                    items.into(),
                    (!finished).then_some(rx),
                    Some((live.actor, id)),
                );
                if waits {
                    stream.through_next_run();
                }
                Ok(Resubscribed::Live(stream))
            }
            Ok(CallResult::Success(Err(e))) => Err(e),
            Ok(CallResult::Timeout) => Err(Error::Busy),
            _ => match self.ended_record(key, &live).await? {
                Some(f) => Ok(Resubscribed::Finished(f)),
                None => Err(Error::TaskNotFound {
                    task: key.task.clone(),
                }),
            },
        }
    }

    fn subscriber(&self) -> (Subscriber, mpsc::Receiver<StreamItem>) {
        let (tx, rx) = mpsc::channel(self.shared.config.server.stream_buffer);
        let id = self.shared.next_subscriber.fetch_add(1, Relaxed);
        (Subscriber { id, tx }, rx)
    }

    fn task_stream(
        &self,
        task_id: TaskId,
        context_id: ContextId,
        pending: VecDeque<StreamItem>,
        rx: Option<mpsc::Receiver<StreamItem>>,
        task: Option<(ActorRef<TaskMsg>, u64)>,
    ) -> TaskStream {
        self.shared.metrics.open_streams.fetch_add(1, Relaxed);
        let shared = self.shared.clone();
        let on_drop = Box::new(move || {
            shared.metrics.open_streams.fetch_sub(1, Relaxed);
            if let Some((actor, id)) = task {
                let _ = actor.cast(TaskMsg::Unsubscribe(id));
            }
        });
        TaskStream::new(task_id, context_id, pending, rx, on_drop)
    }
}
