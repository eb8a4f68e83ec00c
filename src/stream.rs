//! Following a task: [`TaskStream`] yields a task's events until the end of its run; each
//! [`StreamItem`] carries the event and the task as that event left it.

use std::collections::VecDeque;
use std::ops::Deref;
use std::sync::Arc;
use std::task::{Context, Poll};

use tokio::sync::mpsc;

use crate::model::{ContextId, TaskEvent, TaskId, TaskSnapshot};

/// Which earlier events a new stream replays before live ones.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Replay {
    /// Every event from 1.
    All,
    /// Events numbered above this (`Last-Event-ID`).
    After(u64),
    /// Only the event that produced the current state.
    Current,
}

/// One event of a stream, with the task as it stood when the event was produced (for a
/// replayed event: as it stands now). Dereferences to the event.
#[derive(Clone, Debug)]
pub struct StreamItem {
    /// The event.
    pub event: Arc<TaskEvent>,
    /// The task.
    pub task: Arc<TaskSnapshot>,
}

impl Deref for StreamItem {
    type Target = TaskEvent;

    fn deref(&self) -> &TaskEvent {
        &self.event
    }
}

/// A stream of one task's events, ending after the event that ends its run (terminal or
/// interrupted).
pub struct TaskStream {
    /// The task.
    pub task_id: TaskId,
    /// Its conversation.
    pub context_id: ContextId,
    pending: VecDeque<StreamItem>,
    rx: Option<mpsc::Receiver<StreamItem>>,
    /// Runs when the stream is dropped (the runtime's: unsubscribe, count the stream gone).
    _guard: StreamGuard,
    done: bool,
    /// The replayed (pending) events never end the stream: it follows the next run.
    next_run: bool,
}

/// What a stream's owner does when the stream goes.
pub(crate) type OnDrop = Box<dyn FnOnce() + Send + Sync>;

struct StreamGuard(Option<OnDrop>);

/// What `resubscribe` found.
pub enum Resubscribed {
    /// The task is running: follow it.
    Live(TaskStream),
    /// The task is terminal: its final state.
    Finished(Arc<TaskSnapshot>),
}

// === impl TaskStream ===

impl TaskStream {
    pub(crate) fn new(
        task_id: TaskId,
        context_id: ContextId,
        pending: VecDeque<StreamItem>,
        rx: Option<mpsc::Receiver<StreamItem>>,
        on_drop: OnDrop,
    ) -> Self {
        Self {
            task_id,
            context_id,
            pending,
            rx,
            _guard: StreamGuard(Some(on_drop)),
            done: false,
            next_run: false,
        }
    }

    /// Makes the replayed events (a waiting task's current state) not end the stream.
    pub(crate) fn through_next_run(&mut self) {
        self.next_run = true;
    }

    /// The next event; `None` after the last one (or if the task vanished on shutdown).
    pub fn poll_next(&mut self, cx: &mut Context<'_>) -> Poll<Option<StreamItem>> {
        if self.done {
            return Poll::Ready(None);
        }
        let (next, replayed) = match self.pending.pop_front() {
            Some(item) => (Some(item), true),
            None => match self.rx.as_mut() {
                None => (None, false),
                Some(rx) => match rx.poll_recv(cx) {
                    Poll::Pending => return Poll::Pending,
                    Poll::Ready(item) => (item, false),
                },
            },
        };
        match &next {
            Some(item) if !item.is_final() || (replayed && self.next_run) => {}
            _ => {
                self.done = true;
                self.rx = None;
            }
        }
        Poll::Ready(next)
    }

    /// The next event; `None` after the last one.
    pub async fn next(&mut self) -> Option<StreamItem> {
        std::future::poll_fn(|cx| self.poll_next(cx)).await
    }
}

impl Drop for StreamGuard {
    fn drop(&mut self) {
        if let Some(on_drop) = self.0.take() {
            on_drop();
        }
    }
}
