//! The SSE response body: `id: <n>` + `data: <JSON-RPC response>` per task event,
//! `: ping` when idle, and the end of the body after the final event.
//!
//! The body polls the task's stream directly (no forwarder task): when hyper drops it
//! because the client went away, the stream's guard unsubscribes from the task at once.

use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use http_body::Frame;
use serde_json::value::RawValue;
use tokio::time::{Instant, Sleep};

use crate::actors::TaskStream;
use crate::model::{ContextId, TaskEvent, TaskId};
use crate::rpc::{seed, success};

/// An SSE body over one task's events.
pub struct SseBody {
    id: Box<RawValue>,
    stream: TaskStream,
    ping_every: Duration,
    ping: Pin<Box<Sleep>>,
    done: bool,
}

/// One SSE frame: `id: <seq>`, `data: <JSON-RPC response for request id>`, blank line.
pub fn encode_event(
    id: &RawValue,
    task_id: &TaskId,
    context_id: &ContextId,
    event: &TaskEvent,
) -> Bytes {
    let result = seed::EventOut {
        task_id,
        context_id,
        event,
    };
    let json = success(id, &result);
    let mut out = Vec::with_capacity(json.len() + 32);
    out.extend_from_slice(b"id: ");
    out.extend_from_slice(event.seq.to_string().as_bytes());
    out.extend_from_slice(b"\ndata: ");
    out.extend_from_slice(&json);
    out.extend_from_slice(b"\n\n");
    Bytes::from(out)
}

impl SseBody {
    /// A body answering request `id` with the events of `stream`.
    pub fn new(id: Box<RawValue>, stream: TaskStream, ping_every: Duration) -> Self {
        Self {
            id,
            stream,
            ping_every,
            ping: Box::pin(tokio::time::sleep(ping_every)),
            done: false,
        }
    }

    fn frame(&self, event: &TaskEvent) -> Bytes {
        encode_event(
            &self.id,
            &self.stream.task_id,
            &self.stream.context_id,
            event,
        )
    }

    /// Polls the next chunk.
    pub fn poll_chunk(&mut self, cx: &mut Context<'_>) -> Poll<Option<Frame<Bytes>>> {
        if self.done {
            return Poll::Ready(None);
        }
        match self.stream.poll_next(cx) {
            Poll::Ready(Some(event)) => {
                let at = Instant::now() + self.ping_every;
                self.ping.as_mut().reset(at);
                Poll::Ready(Some(Frame::data(self.frame(&event))))
            }
            Poll::Ready(None) => {
                self.done = true;
                Poll::Ready(None)
            }
            Poll::Pending => match self.ping.as_mut().poll(cx) {
                Poll::Ready(()) => {
                    let at = Instant::now() + self.ping_every;
                    self.ping.as_mut().reset(at);
                    Poll::Ready(Some(Frame::data(Bytes::from_static(b": ping\n\n"))))
                }
                Poll::Pending => Poll::Pending,
            },
        }
    }

    /// True once the final event went out.
    pub fn is_done(&self) -> bool {
        self.done
    }
}
