//! The floor: a minimal hyper server that reads the POST body, parses the JSON and answers
//! a fixed JSON-RPC result — nothing else. a2ad's figures are reported as a ratio of it.

use std::convert::Infallible;

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::service::service_fn;
use hyper::{Request, Response};
use hyper_util::rt::{TokioExecutor, TokioIo};
use tokio::net::TcpListener;

const RESULT: &[u8] = br#"{"jsonrpc":"2.0","id":1,"result":{"id":"floor","contextId":"floor","status":{"state":"completed"},"final":true}}"#;

pub async fn serve(listen: &str) -> std::io::Result<()> {
    let listener = TcpListener::bind(listen).await?;
    println!("listening on http://{}", listener.local_addr()?);
    loop {
        let (tcp, _) = listener.accept().await?;
        let _ = tcp.set_nodelay(true);
        tokio::spawn(async move {
            let svc = service_fn(|req: Request<hyper::body::Incoming>| async move {
                let body = req
                    .into_body()
                    .collect()
                    .await
                    .map(|b| b.to_bytes())
                    .unwrap_or_default();
                let parsed = serde_json::from_slice::<serde_json::Value>(&body).is_ok();
                let mut resp = Response::new(Full::new(Bytes::from_static(RESULT)));
                if !parsed {
                    *resp.status_mut() = hyper::StatusCode::BAD_REQUEST;
                }
                resp.headers_mut().insert(
                    "content-type",
                    hyper::header::HeaderValue::from_static("application/json"),
                );
                Ok::<_, Infallible>(resp)
            });
            let _ = hyper_util::server::conn::auto::Builder::new(TokioExecutor::new())
                .serve_connection(TokioIo::new(tcp), svc)
                .await;
        });
    }
}
