//! The SSE response body: `id: <n>` + `data: <JSON-RPC response>` per task event (the
//! dialect renders the response), `: ping` when idle, and the end of the body after the
//! event that ends the stream.
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

use crate::rpc::{FrameFn, sse_frame};
use crate::runtime::TaskStream;

/// An SSE body over one task's events.
pub(crate) struct SseBody {
    id: Box<RawValue>,
    stream: TaskStream,
    frames: FrameFn,
    /// Whether the next event is the first of the stream.
    first: bool,
    ping_every: Duration,
    ping: Pin<Box<Sleep>>,
    done: bool,
}

impl SseBody {
    /// A body answering request `id` with the events of `stream`, rendered by `frames`.
    pub(crate) fn new(
        id: Box<RawValue>,
        stream: TaskStream,
        frames: FrameFn,
        ping_every: Duration,
    ) -> Self {
        Self {
            id,
            stream,
            frames,
            first: true,
            ping_every,
            ping: Box::pin(tokio::time::sleep(ping_every)),
            done: false,
        }
    }

    /// Polls the next chunk.
    pub(crate) fn poll_chunk(&mut self, cx: &mut Context<'_>) -> Poll<Option<Frame<Bytes>>> {
        if self.done {
            return Poll::Ready(None);
        }
        match self.stream.poll_next(cx) {
            Poll::Ready(Some(item)) => {
                let at = Instant::now() + self.ping_every;
                self.ping.as_mut().reset(at);
                let json = (self.frames)(&self.id, &item, self.first);
                self.first = false;
                Poll::Ready(Some(Frame::data(sse_frame(item.seq, &json))))
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

    /// True once the last event went out.
    pub(crate) fn is_done(&self) -> bool {
        self.done
    }
}
