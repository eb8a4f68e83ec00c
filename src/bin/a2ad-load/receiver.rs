//! A local webhook receiver for the `webhooks` scenario: verifies every signature over the
//! exact body bytes and counts unique deliveries.

use std::collections::HashSet;
use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Instant;

use bytes::Bytes;
use http_body_util::Full;
use hyper::service::service_fn;
use hyper::{Request, Response};
use hyper_util::rt::{TokioExecutor, TokioIo};
use tokio::net::TcpListener;

#[derive(Default)]
pub struct Tally {
    pub ids: HashSet<String>,
    pub received: u64,
    pub bad_signatures: u64,
    pub first: Option<Instant>,
    pub last: Option<Instant>,
}

pub async fn start(secret: &'static str) -> std::io::Result<(SocketAddr, Arc<Mutex<Tally>>)> {
    let listener = TcpListener::bind("127.0.0.1:0").await?;
    let addr = listener.local_addr()?;
    let tally: Arc<Mutex<Tally>> = Arc::default();
    let t = tally.clone();
    tokio::spawn(async move {
        while let Ok((tcp, _)) = listener.accept().await {
            let t = t.clone();
            tokio::spawn(async move {
                let svc = service_fn(move |req: Request<hyper::body::Incoming>| {
                    let t = t.clone();
                    async move {
                        let sig = req
                            .headers()
                            .get("x-webhook-signature")
                            .and_then(|v| v.to_str().ok())
                            .map(str::to_string);
                        let id = req
                            .headers()
                            .get("x-webhook-delivery")
                            .and_then(|v| v.to_str().ok())
                            .unwrap_or("")
                            .to_string();
                        let body = crate::floor::read_body(req).await;
                        let valid =
                            sig.as_deref() == Some(&a2ad::signature(secret.as_bytes(), &body)[..]);
                        let now = Instant::now();
                        let mut t = t.lock().unwrap_or_else(|e| e.into_inner());
                        t.received += 1;
                        if !valid {
                            t.bad_signatures += 1;
                        }
                        t.ids.insert(id);
                        t.first.get_or_insert(now);
                        t.last = Some(now);
                        Ok::<_, Infallible>(Response::new(Full::new(Bytes::new())))
                    }
                });
                let _ = hyper_util::server::conn::auto::Builder::new(TokioExecutor::new())
                    .serve_connection(TokioIo::new(tcp), svc)
                    .await;
            });
        }
    });
    Ok((addr, tally))
}
