//! A fake OpenAI-compatible Chat Completions server on 127.0.0.1:0: answers streaming and
//! non-streaming completions, records what it was sent, can fail in each documented way,
//! and notices when a client closes a streamed answer early.

use std::convert::Infallible;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use http_body_util::{BodyExt, Full, StreamBody, combinators::BoxBody};
use hyper::body::Frame;
use hyper::service::service_fn;
use hyper::{HeaderMap, Request, Response};
use hyper_util::rt::{TokioExecutor, TokioIo};
use tokio::net::TcpListener;

/// How the fake upstream answers.
#[derive(Clone, Debug)]
pub enum Mode {
    /// SSE chunks, one per word, `gap` apart, then `[DONE]`.
    Stream { words: Vec<String>, gap: Duration },
    /// One JSON completion (as servers that ignore `stream: true` do).
    Json(String),
    /// This HTTP status with an error body that names the (fake) key.
    Status(u16),
    /// A stream whose second chunk is not JSON.
    Malformed,
    /// Accept, then never answer.
    Hang,
    /// Hostile: `delta.content` chunks of `chunk` characters as fast as the client reads,
    /// never a `[DONE]`.
    Flood { chunk: usize },
    /// Hostile: `Content-Type: application/json` and a body that never ends.
    EndlessJson,
    /// Hostile: `data: ` and then 1 MiB chunks with no newline, forever.
    EndlessLine,
}

pub struct Upstream {
    pub base_url: String,
    pub requests: Arc<Mutex<Vec<(HeaderMap, serde_json::Value)>>>,
    /// Set when a client dropped a streamed answer before its end.
    pub closed_early: Arc<AtomicBool>,
    task: tokio::task::JoinHandle<()>,
}

pub type Body = BoxBody<Bytes, Infallible>;

fn chunk(word: &str) -> Bytes {
    let v = serde_json::json!({"id": "c1", "object": "chat.completion.chunk",
        "choices": [{"index": 0, "delta": {"content": word}, "finish_reason": null}]});
    Bytes::from(format!("data: {v}\n\n"))
}

impl Upstream {
    pub async fn start(mode: Mode) -> Self {
        let listener = TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind upstream");
        let port = listener.local_addr().expect("addr").port();
        let requests: Arc<Mutex<Vec<(HeaderMap, serde_json::Value)>>> = Arc::default();
        let closed_early = Arc::new(AtomicBool::new(false));
        let (reqs, closed) = (requests.clone(), closed_early.clone());
        let task = tokio::spawn(async move {
            loop {
                let Ok((tcp, _)) = listener.accept().await else {
                    return;
                };
                let (reqs, closed, mode) = (reqs.clone(), closed.clone(), mode.clone());
                tokio::spawn(async move {
                    let svc = service_fn(move |req: Request<hyper::body::Incoming>| {
                        let (reqs, closed, mode) = (reqs.clone(), closed.clone(), mode.clone());
                        async move {
                            let (parts, body) = req.into_parts();
                            let bytes = body
                                .collect()
                                .await
                                .map(|b| b.to_bytes())
                                .unwrap_or_default();
                            let json =
                                serde_json::from_slice(&bytes).unwrap_or(serde_json::Value::Null);
                            reqs.lock().expect("lock").push((parts.headers, json));
                            Ok::<_, Infallible>(answer(mode, closed).await)
                        }
                    });
                    let _ = hyper_util::server::conn::auto::Builder::new(TokioExecutor::new())
                        .serve_connection(TokioIo::new(tcp), svc)
                        .await;
                });
            }
        });
        Self {
            base_url: format!("http://127.0.0.1:{port}/v1"),
            requests,
            closed_early,
            task,
        }
    }

    pub fn requests(&self) -> Vec<(HeaderMap, serde_json::Value)> {
        self.requests.lock().expect("lock").clone()
    }
}

async fn answer(mode: Mode, closed: Arc<AtomicBool>) -> Response<Body> {
    let full = |status: u16, ct: &str, body: String| {
        let mut r = Response::new(Full::new(Bytes::from(body)).boxed());
        *r.status_mut() = hyper::StatusCode::from_u16(status).expect("status");
        r.headers_mut()
            .insert("content-type", ct.parse().expect("ct"));
        r
    };
    match mode {
        Mode::Json(text) => full(200, "application/json", serde_json::json!({
            "choices": [{"index": 0, "message": {"role": "assistant", "content": text}, "finish_reason": "stop"}]
        }).to_string()),
        Mode::Status(s) => full(s, "application/json",
            r#"{"error":{"message":"Incorrect API key provided: sk-fake-secret-key"}}"#.to_string()),
        Mode::Hang => {
            tokio::time::sleep(Duration::from_secs(3600)).await;
            full(200, "application/json", String::new())
        }
        Mode::Malformed => full(200, "text/event-stream",
            format!("{}data: {{not json\n\n", String::from_utf8_lossy(&chunk("a")))),
        Mode::Flood { chunk: size } => endless(
            "text/event-stream",
            Bytes::new(),
            chunk(&"x".repeat(size)),
        ),
        Mode::EndlessJson => endless(
            "application/json",
            Bytes::from_static(b"{\"choices\": [{\"message\": {\"content\": \""),
            Bytes::from(vec![b'a'; 64 << 10]),
        ),
        Mode::EndlessLine => endless(
            "text/event-stream",
            Bytes::from_static(b"data: "),
            Bytes::from(vec![b'a'; 1 << 20]),
        ),
        Mode::Stream { words, gap } => {
            let (tx, rx) = tokio::sync::mpsc::channel::<Result<Frame<Bytes>, Infallible>>(1);
            tokio::spawn(async move {
                let n = words.len();
                for (i, w) in words.iter().enumerate() {
                    if tx.send(Ok(Frame::data(chunk(w)))).await.is_err() {
                        closed.store(true, Ordering::SeqCst);
                        return;
                    }
                    if i + 1 < n {
                        tokio::time::sleep(gap).await;
                    }
                }
                let end = serde_json::json!({"choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}]});
                let _ = tx.send(Ok(Frame::data(Bytes::from(format!("data: {end}\n\ndata: [DONE]\n\n"))))).await;
            });
            let stream = futures_util::stream::unfold(rx, |mut rx| async move { rx.recv().await.map(|f| (f, rx)) });
            let mut r = Response::new(BodyExt::boxed(StreamBody::new(stream)));
            r.headers_mut().insert("content-type", "text/event-stream".parse().expect("ct"));
            r
        }
    }
}

/// A body of `first` and then `repeat` for as long as the client reads (ends when the
/// client goes away).
pub fn endless(content_type: &str, first: Bytes, repeat: Bytes) -> Response<Body> {
    let stream = futures_util::stream::unfold(Some(first), move |next| {
        let repeat = repeat.clone();
        async move {
            let frame = next.filter(|b| !b.is_empty()).unwrap_or(repeat);
            Some((Ok::<_, Infallible>(Frame::data(frame)), None))
        }
    });
    let mut r = Response::new(BodyExt::boxed(StreamBody::new(stream)));
    r.headers_mut()
        .insert("content-type", content_type.parse().expect("ct"));
    r
}

impl Drop for Upstream {
    fn drop(&mut self) {
        self.task.abort();
    }
}
