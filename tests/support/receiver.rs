//! A real webhook receiver: a small hyper server on 127.0.0.1:0 that records every request
//! (headers and exact body bytes) and answers according to a script.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::service::service_fn;
use hyper::{HeaderMap, Request, Response};
use hyper_util::rt::{TokioExecutor, TokioIo};
use tokio::net::TcpListener;

/// One received request.
#[derive(Clone, Debug)]
pub struct Hit {
    /// The request's path and query.
    pub uri: String,
    pub headers: HeaderMap,
    pub body: Bytes,
    pub at: Instant,
}

impl Hit {
    pub fn header(&self, name: &str) -> &str {
        self.headers
            .get(name)
            .and_then(|v| v.to_str().ok())
            .unwrap_or_else(|| panic!("no header {name}: {:?}", self.headers))
    }

    pub fn json(&self) -> serde_json::Value {
        serde_json::from_slice(&self.body).expect("webhook body is JSON")
    }
}

/// How to answer request number `n` (0-based).
#[derive(Clone, Copy, Debug)]
pub struct Answer {
    /// The status; [`Answer::RESET`] closes the connection without answering.
    pub status: u16,
    pub retry_after: Option<u64>,
    pub delay: Duration,
}

impl Answer {
    /// Not a status: drop the connection without a response (after `delay`).
    pub const RESET: u16 = 0;

    pub fn status(status: u16) -> Self {
        Self {
            status,
            retry_after: None,
            delay: Duration::ZERO,
        }
    }

    /// Drops the connection without a response.
    pub fn reset() -> Self {
        Self::status(Self::RESET)
    }

    /// Answers `status` after `delay`.
    pub fn after(status: u16, delay: Duration) -> Self {
        Self {
            delay,
            ..Self::status(status)
        }
    }
}

pub type Script = Arc<dyn Fn(usize) -> Answer + Send + Sync>;

/// A script that sees every request so far, this one last.
pub type Watcher = Arc<dyn Fn(&[Hit]) -> Answer + Send + Sync>;

pub struct Receiver {
    pub url: String,
    pub port: u16,
    hits: Arc<Mutex<Vec<Hit>>>,
    task: tokio::task::JoinHandle<()>,
}

impl Receiver {
    /// A receiver that answers 200 to everything.
    pub async fn ok() -> Self {
        Self::start(Arc::new(|_| Answer::status(200))).await
    }

    pub async fn start(script: Script) -> Self {
        Self::watching(Arc::new(move |hits: &[Hit]| script(hits.len() - 1))).await
    }

    /// A receiver whose answers depend on what it received (e.g. the first try of each
    /// delivery fails).
    pub async fn watching(script: Watcher) -> Self {
        let listener = TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind receiver");
        let port = listener.local_addr().expect("addr").port();
        let hits: Arc<Mutex<Vec<Hit>>> = Arc::default();
        let h = hits.clone();
        let task = tokio::spawn(async move {
            loop {
                let Ok((tcp, _)) = listener.accept().await else {
                    return;
                };
                let hits = h.clone();
                let script = script.clone();
                tokio::spawn(async move {
                    let svc = service_fn(move |req: Request<hyper::body::Incoming>| {
                        let hits = hits.clone();
                        let script = script.clone();
                        async move {
                            let (parts, body) = req.into_parts();
                            let body = body
                                .collect()
                                .await
                                .map(|b| b.to_bytes())
                                .unwrap_or_default();
                            let answer = {
                                let mut hits = hits.lock().expect("lock");
                                hits.push(Hit {
                                    uri: parts.uri.to_string(),
                                    headers: parts.headers,
                                    body,
                                    at: Instant::now(),
                                });
                                script(&hits)
                            };
                            if !answer.delay.is_zero() {
                                tokio::time::sleep(answer.delay).await;
                            }
                            if answer.status == Answer::RESET {
                                return Err::<Response<Full<Bytes>>, _>(std::io::Error::other(
                                    "scripted reset",
                                ));
                            }
                            let mut resp = Response::new(Full::new(Bytes::from_static(b"ok")));
                            *resp.status_mut() =
                                hyper::StatusCode::from_u16(answer.status).expect("status");
                            if let Some(s) = answer.retry_after {
                                resp.headers_mut().insert("retry-after", s.into());
                            }
                            if (300..400).contains(&answer.status) {
                                resp.headers_mut().insert(
                                    "location",
                                    "http://127.0.0.1:9/elsewhere".parse().expect("value"),
                                );
                            }
                            Ok::<_, std::io::Error>(resp)
                        }
                    });
                    let _ = hyper_util::server::conn::auto::Builder::new(TokioExecutor::new())
                        .serve_connection(TokioIo::new(tcp), svc)
                        .await;
                });
            }
        });
        Self {
            url: format!("http://127.0.0.1:{port}/hook"),
            port,
            hits,
            task,
        }
    }

    pub fn hits(&self) -> Vec<Hit> {
        self.hits.lock().expect("lock").clone()
    }

    /// Waits until at least `n` requests arrived (up to 30 s) and returns them all.
    pub async fn wait_for(&self, n: usize) -> Vec<Hit> {
        let end = Instant::now() + Duration::from_secs(30);
        loop {
            let hits = self.hits();
            if hits.len() >= n {
                return hits;
            }
            assert!(
                Instant::now() < end,
                "receiver got {} of {n} requests in 30s",
                hits.len()
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
}

impl Drop for Receiver {
    fn drop(&mut self) {
        self.task.abort();
    }
}
