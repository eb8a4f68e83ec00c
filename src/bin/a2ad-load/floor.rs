//! The floors: minimal hyper servers that read the POST body, parse the JSON and answer a
//! fixed JSON-RPC result. a2ad's figures are reported as a ratio of them.
//!
//! - the floor: hyper and `serde_json`, nothing else;
//! - the actor floor (`--floor-actor`): the same, and what the design card adds to every
//!   call before a2ad does any work of its own — a ractor actor spawned per request,
//!   linked to a supervisor, which answers the waiting request through a one-shot channel
//!   and stops. The gap between the two is the design's own price; the gap between the
//!   actor floor and a2ad is a2ad's work (docs/decisions/the-floor-of-the-design.md).

use std::convert::Infallible;

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::service::service_fn;
use hyper::{Request, Response};
use hyper_util::rt::{TokioExecutor, TokioIo};
use ractor::{Actor, ActorCell, ActorProcessingErr, ActorRef, SupervisionEvent};
use tokio::net::TcpListener;
use tokio::sync::oneshot;

const RESULT: &[u8] = br#"{"jsonrpc":"2.0","id":1,"result":{"id":"floor","contextId":"floor","status":{"state":"completed"},"final":true}}"#;

pub async fn serve(listen: &str, actor: bool) -> std::io::Result<()> {
    let supervisor = if actor {
        let (s, _) = Actor::spawn(None, Parent, ())
            .await
            .map_err(|e| std::io::Error::other(e.to_string()))?;
        Some(s.get_cell())
    } else {
        None
    };
    let listener = TcpListener::bind(listen).await?;
    println!("listening on http://{}", listener.local_addr()?);
    loop {
        let (tcp, _) = listener.accept().await?;
        let _ = tcp.set_nodelay(true);
        let supervisor = supervisor.clone();
        tokio::spawn(async move {
            let svc = service_fn(move |req: Request<hyper::body::Incoming>| {
                let supervisor = supervisor.clone();
                async move {
                    let body = read_body(req).await;
                    let parsed = serde_json::from_slice::<serde_json::Value>(&body).is_ok();
                    let answer = match supervisor {
                        Some(parent) => turn(parent).await,
                        None => Some(Bytes::from_static(RESULT)),
                    };
                    let failed = !parsed || answer.is_none();
                    let mut resp = Response::new(Full::new(answer.unwrap_or_default()));
                    if failed {
                        *resp.status_mut() = hyper::StatusCode::BAD_REQUEST;
                    }
                    resp.headers_mut().insert(
                        "content-type",
                        hyper::header::HeaderValue::from_static("application/json"),
                    );
                    Ok::<_, Infallible>(resp)
                }
            });
            let _ = hyper_util::server::conn::auto::Builder::new(TokioExecutor::new())
                .serve_connection(TokioIo::new(tcp), svc)
                .await;
        });
    }
}

/// A request's whole body (empty if it could not be read): the floors' and the webhook
/// receiver's.
pub async fn read_body(req: Request<hyper::body::Incoming>) -> Bytes {
    req.into_body()
        .collect()
        .await
        .map(|b| b.to_bytes())
        .unwrap_or_default()
}

/// One call's actor: spawned linked to the supervisor, it answers as it starts and stops
/// (as a2ad's task actor starts its own run and, on memory, ends in that turn).
async fn turn(parent: ActorCell) -> Option<Bytes> {
    let (tx, rx) = oneshot::channel();
    Actor::spawn_linked(None, Turn, tx, parent).await.ok()?;
    rx.await.ok()
}

struct Turn;

impl Actor for Turn {
    type Msg = ();
    type State = Option<oneshot::Sender<Bytes>>;
    type Arguments = oneshot::Sender<Bytes>;

    async fn pre_start(
        &self,
        _: ActorRef<()>,
        reply: oneshot::Sender<Bytes>,
    ) -> Result<Self::State, ActorProcessingErr> {
        Ok(Some(reply))
    }

    async fn post_start(
        &self,
        myself: ActorRef<()>,
        reply: &mut Self::State,
    ) -> Result<(), ActorProcessingErr> {
        if let Some(tx) = reply.take() {
            let _ = tx.send(Bytes::from_static(RESULT));
        }
        myself.stop(None);
        Ok(())
    }
}

/// The supervisor of the actor floor: it hears each actor's end and does nothing with it.
struct Parent;

impl Actor for Parent {
    type Msg = ();
    type State = ();
    type Arguments = ();

    async fn pre_start(&self, _: ActorRef<()>, _: ()) -> Result<(), ActorProcessingErr> {
        Ok(())
    }

    async fn handle_supervisor_evt(
        &self,
        _: ActorRef<()>,
        _: SupervisionEvent,
        _: &mut (),
    ) -> Result<(), ActorProcessingErr> {
        Ok(())
    }
}
