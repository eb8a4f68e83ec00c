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

impl StreamItem {
    /// The task as this event left it, for a stream whose first frame is the task: a
    /// replayed event's item holds the task as it stands now, so its status (and number)
    /// are taken from the event (docs/PROTOCOL.md §12: a resumed stream's first frame shows
    /// the state of the first event it resumes with).
    pub fn task_at_event(&self) -> std::borrow::Cow<'_, TaskSnapshot> {
        task_at(&self.event, &self.task)
    }
}

/// `task` as `event` left it: itself when it is that event's (or a live artifact event's,
/// which changes no status), else a copy with the event's status and number.
pub(crate) fn task_at<'a>(
    event: &TaskEvent,
    task: &'a TaskSnapshot,
) -> std::borrow::Cow<'a, TaskSnapshot> {
    if task.seq == event.seq || (event.artifact.is_some() && task.seq < event.seq) {
        return std::borrow::Cow::Borrowed(task);
    }
    let mut t = task.clone();
    t.status = event.status.clone();
    t.seq = event.seq;
    t.updated_at = event.status.timestamp;
    std::borrow::Cow::Owned(t)
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
    /// What [`TaskStream::poll_ready`] took from `rx` (`Some(None)`: its end).
    peeked: Option<Option<StreamItem>>,
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
            peeked: None,
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
            None => match (self.peeked.take(), self.rx.as_mut()) {
                (Some(item), _) => (item, false),
                (None, None) => (None, false),
                (None, Some(rx)) => match rx.poll_recv(cx) {
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

    /// Ready once [`TaskStream::poll_next`] would answer at once; takes nothing.
    pub fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<()> {
        if self.done || !self.pending.is_empty() || self.peeked.is_some() {
            return Poll::Ready(());
        }
        match self.rx.as_mut() {
            None => Poll::Ready(()),
            Some(rx) => rx.poll_recv(cx).map(|item| self.peeked = Some(item)),
        }
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

#[cfg(test)]
mod tests {
    use std::task::Waker;

    use super::*;
    use crate::model::{TaskState, TaskStatus};

    fn item(seq: u64, state: TaskState) -> StreamItem {
        let status = TaskStatus::new(state);
        StreamItem {
            event: Arc::new(TaskEvent::status(seq, status.clone())),
            task: Arc::new(TaskSnapshot {
                id: TaskId::new("t"),
                context_id: ContextId::new("c"),
                seq,
                created_at: status.timestamp,
                updated_at: status.timestamp,
                status,
                history: Vec::new(),
                artifacts: Vec::new(),
                metadata: None,
                extensions: Default::default(),
                note: None,
            }),
        }
    }

    fn stream(pending: Vec<StreamItem>) -> (TaskStream, mpsc::Sender<StreamItem>) {
        let (tx, rx) = mpsc::channel(8);
        let s = TaskStream::new(
            TaskId::new("t"),
            ContextId::new("c"),
            pending.into(),
            Some(rx),
            Box::new(|| {}),
        );
        (s, tx)
    }

    fn seqs(s: &mut TaskStream) -> Vec<u64> {
        let mut cx = Context::from_waker(Waker::noop());
        let mut out = Vec::new();
        while let Poll::Ready(Some(i)) = s.poll_next(&mut cx) {
            out.push(i.seq);
        }
        out
    }

    #[test]
    fn readiness_takes_nothing_and_keeps_the_order_and_the_end() {
        let mut cx = Context::from_waker(Waker::noop());
        let (mut s, tx) = stream(Vec::new());
        assert!(s.poll_ready(&mut cx).is_pending(), "nothing yet");
        tx.try_send(item(1, TaskState::Submitted)).expect("send");
        tx.try_send(item(2, TaskState::Completed)).expect("send");
        tx.try_send(item(3, TaskState::Working)).expect("send");
        assert!(s.poll_ready(&mut cx).is_ready());
        assert!(s.poll_ready(&mut cx).is_ready(), "twice takes no more");
        assert_eq!(
            seqs(&mut s),
            vec![1, 2],
            "in order, ending at the final event"
        );

        // Replayed events come before what readiness took.
        let (mut s, tx) = stream(vec![item(1, TaskState::Submitted)]);
        tx.try_send(item(2, TaskState::Working)).expect("send");
        assert!(s.poll_ready(&mut cx).is_ready());
        drop(tx);
        assert_eq!(seqs(&mut s), vec![1, 2]);
        assert!(matches!(s.poll_next(&mut cx), Poll::Ready(None)));

        // A channel that closed before any event: ready, and the stream ends.
        let (mut s, tx) = stream(Vec::new());
        drop(tx);
        assert!(s.poll_ready(&mut cx).is_ready());
        assert!(matches!(s.poll_next(&mut cx), Poll::Ready(None)));
    }
}
