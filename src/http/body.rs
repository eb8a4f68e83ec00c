//! The response body: a whole buffer, an SSE stream or a gRPC response (the server keeps
//! its connection busy until the body is done: `server::conn::Guarded`).

use std::convert::Infallible;
use std::pin::Pin;
use std::task::{Context, Poll};

use bytes::Bytes;
use http_body::Frame;

use super::sse::SseBody;
use crate::rpc::Frames;

/// A response body: a whole buffer, an SSE stream, or a gRPC response.
pub(crate) struct Body {
    inner: Inner,
}

enum Inner {
    Full(Option<Bytes>),
    Sse(Box<SseBody>),
    /// A gRPC response's one message, then the trailers of success.
    GrpcOne(Option<Bytes>),
    /// A gRPC response's messages as they come, then the trailers of success.
    GrpcStream(Frames),
    /// The trailers of success are sent: the gRPC response is done.
    GrpcDone,
}

/// The trailers ending a gRPC response that succeeded (its errors are trailers-only
/// responses, made whole elsewhere).
fn grpc_ok() -> Frame<Bytes> {
    let mut trailers = hyper::HeaderMap::with_capacity(1);
    trailers.insert("grpc-status", hyper::header::HeaderValue::from_static("0"));
    Frame::trailers(trailers)
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

    /// A gRPC response of one (framed) message.
    pub(crate) fn grpc_one(message: Bytes) -> Self {
        Self::from_inner(Inner::GrpcOne(Some(message)))
    }

    /// A gRPC response of a stream of (framed) messages.
    pub(crate) fn grpc_stream(messages: Frames) -> Self {
        Self::from_inner(Inner::GrpcStream(messages))
    }

    fn from_inner(inner: Inner) -> Self {
        Self { inner }
    }
}

/// No body (a gRPC status alone is such a response).
impl Default for Body {
    fn default() -> Self {
        Self::empty()
    }
}

impl http_body::Body for Body {
    type Data = Bytes;
    type Error = Infallible;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Infallible>>> {
        let inner = &mut self.get_mut().inner;
        let frame = match inner {
            Inner::Full(bytes) => return Poll::Ready(bytes.take().map(|b| Ok(Frame::data(b)))),
            Inner::Sse(s) => return s.poll_chunk(cx).map(|f| f.map(Ok)),
            Inner::GrpcOne(message) => message.take().map_or_else(grpc_ok, Frame::data),
            Inner::GrpcStream(messages) => match messages.as_mut().poll_next(cx) {
                Poll::Ready(Some(message)) => Frame::data(message),
                Poll::Ready(None) => grpc_ok(),
                Poll::Pending => return Poll::Pending,
            },
            Inner::GrpcDone => return Poll::Ready(None),
        };
        if frame.is_trailers() {
            *inner = Inner::GrpcDone;
        }
        Poll::Ready(Some(Ok(frame)))
    }

    fn is_end_stream(&self) -> bool {
        match &self.inner {
            Inner::Full(b) => b.is_none(),
            Inner::Sse(s) => s.is_done(),
            Inner::GrpcOne(_) | Inner::GrpcStream(_) => false,
            Inner::GrpcDone => true,
        }
    }

    fn size_hint(&self) -> http_body::SizeHint {
        match &self.inner {
            Inner::Full(Some(b)) => http_body::SizeHint::with_exact(b.len() as u64),
            Inner::Full(None) => http_body::SizeHint::with_exact(0),
            Inner::Sse(_) | Inner::GrpcOne(_) | Inner::GrpcStream(_) => {
                http_body::SizeHint::default()
            }
            Inner::GrpcDone => http_body::SizeHint::with_exact(0),
        }
    }
}
