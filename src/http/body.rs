//! The response body: a whole buffer or an SSE stream, holding the connection busy until done.

use std::convert::Infallible;
use std::pin::Pin;
use std::task::{Context, Poll};

use bytes::Bytes;
use http_body::Frame;

use super::sse::SseBody;
use crate::server::conn::InFlight;

/// A response body: a whole buffer, or an SSE stream. It may carry the connection's
/// in-flight guard, so the connection counts as busy until the body is written or dropped.
pub(crate) struct Body {
    inner: Inner,
    _in_flight: Option<InFlight>,
}

enum Inner {
    Full(Option<Bytes>),
    Sse(Box<SseBody>),
    /// A gRPC response (its messages, then its trailers). Boxed: tonic's body is large, and
    /// every response (moved several times on its way out) would be as large.
    Grpc(Pin<Box<tonic::body::Body>>),
}

impl Body {
    /// A complete body.
    pub(crate) fn full(bytes: impl Into<Bytes>) -> Self {
        Self::from_inner(Inner::Full(Some(bytes.into())))
    }

    /// No body.
    pub(crate) fn empty() -> Self {
        Self::from_inner(Inner::Full(None))
    }

    /// A stream of task events.
    pub(crate) fn sse(body: SseBody) -> Self {
        Self::from_inner(Inner::Sse(Box::new(body)))
    }

    /// A gRPC response body.
    pub(crate) fn grpc(body: tonic::body::Body) -> Self {
        Self::from_inner(Inner::Grpc(Box::pin(body)))
    }

    fn from_inner(inner: Inner) -> Self {
        Self {
            inner,
            _in_flight: None,
        }
    }

    /// Keeps `guard` until the body is done.
    pub(crate) fn guarded(mut self, guard: InFlight) -> Self {
        self._in_flight = Some(guard);
        self
    }
}

impl http_body::Body for Body {
    type Data = Bytes;
    type Error = Infallible;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Infallible>>> {
        match &mut self.get_mut().inner {
            Inner::Full(bytes) => Poll::Ready(bytes.take().map(|b| Ok(Frame::data(b)))),
            Inner::Sse(s) => s.poll_chunk(cx).map(|f| f.map(Ok)),
            // tonic puts a call's errors in its trailers; an error of the body itself (none
            // is expected) ends it.
            Inner::Grpc(b) => match b.as_mut().poll_frame(cx) {
                Poll::Ready(Some(Ok(frame))) => Poll::Ready(Some(Ok(frame))),
                Poll::Ready(Some(Err(_)) | None) => Poll::Ready(None),
                Poll::Pending => Poll::Pending,
            },
        }
    }

    fn is_end_stream(&self) -> bool {
        match &self.inner {
            Inner::Full(b) => b.is_none(),
            Inner::Sse(s) => s.is_done(),
            Inner::Grpc(b) => http_body::Body::is_end_stream(b.as_ref().get_ref()),
        }
    }

    fn size_hint(&self) -> http_body::SizeHint {
        match &self.inner {
            Inner::Full(Some(b)) => http_body::SizeHint::with_exact(b.len() as u64),
            Inner::Full(None) => http_body::SizeHint::with_exact(0),
            Inner::Sse(_) => http_body::SizeHint::default(),
            Inner::Grpc(b) => http_body::Body::size_hint(b.as_ref().get_ref()),
        }
    }
}
