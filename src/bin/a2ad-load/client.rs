//! The load client: keep-alive HTTP/1.1 connections (hyper's client), one task each, that
//! issue requests back to back until a deadline and record every latency and error.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::time::{Duration, Instant};

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::Request;
use hyper::client::conn::http1::SendRequest;
use hyper_util::rt::TokioIo;
use tokio::net::TcpStream;

/// Where requests go.
#[derive(Clone, Debug)]
pub struct Target {
    pub addr: SocketAddr,
    pub path: String,
    pub key: String,
    pub dialect: Dialect,
    /// gRPC: how many HTTP/2 connections the workers share (0: one each).
    pub grpc_channels: usize,
    /// `send`/`stream`/`mixed` over cleartext HTTP/2 (prior knowledge), a connection each.
    pub h2: bool,
}

/// The JSON-RPC dialect `send` and `stream` speak.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum Dialect {
    /// The seed dialect: `message/send` on `/api/v1/a2a/{agent}`.
    Seed,
    /// Official A2A 1.0: `SendMessage` on `…/jsonrpc/v1` with `A2A-Version: 1.0`.
    V1,
    /// Official A2A 0.3: `message/send` on `…/jsonrpc/v0.3`.
    V03,
    /// Official A2A 1.0 over HTTP+JSON: `POST …/rest/message:send` (and `message:stream`).
    Rest,
    /// Official A2A 1.0 over gRPC: `lf.a2a.v1.A2AService/SendMessage` (and
    /// `SendStreamingMessage`), HTTP/2 on the same port.
    Grpc,
}

impl Dialect {
    /// The agent's JSON-RPC path in this dialect.
    pub fn path(self, agent: &str) -> String {
        match self {
            Dialect::Seed => format!("/api/v1/a2a/{agent}"),
            Dialect::V1 => format!("/api/v1/a2a/{agent}/jsonrpc/v1"),
            Dialect::V03 => format!("/api/v1/a2a/{agent}/jsonrpc/v0.3"),
            Dialect::Rest => format!("/api/v1/a2a/{agent}/rest"),
            Dialect::Grpc => agent.to_string(),
        }
    }

    /// Whether requests carry `A2A-Version: 1.0`.
    fn is_1_0(self) -> bool {
        matches!(self, Dialect::V1 | Dialect::Rest | Dialect::Grpc)
    }

    /// A blocking send (`stream == false`) or a stream of one fresh message.
    pub fn body(self, stream: bool, text: &str) -> String {
        let id = uuid::Uuid::new_v4();
        match (self, stream) {
            (Dialect::V1, _) => format!(
                r#"{{"jsonrpc":"2.0","id":1,"method":"{}","params":{{"message":{{"role":"ROLE_USER","messageId":"{id}","parts":[{{"text":"{text}"}}]}}}}}}"#,
                if stream {
                    "SendStreamingMessage"
                } else {
                    "SendMessage"
                }
            ),
            (Dialect::Rest | Dialect::Grpc, _) => format!(
                r#"{{"message":{{"role":"ROLE_USER","messageId":"{id}","parts":[{{"text":"{text}"}}]}}}}"#
            ),
            (Dialect::V03, _) => format!(
                r#"{{"jsonrpc":"2.0","id":1,"method":"{}","params":{{"message":{{"kind":"message","role":"user","messageId":"{id}","parts":[{{"kind":"text","text":"{text}"}}]}}}}}}"#,
                if stream {
                    "message/stream"
                } else {
                    "message/send"
                }
            ),
            (Dialect::Seed, _) => send_body(
                if stream {
                    "message/stream"
                } else {
                    "message/send"
                },
                text,
                "",
            ),
        }
    }

    /// Whether a stream's body ended with its final event.
    pub fn stream_finished(self, body: &[u8]) -> bool {
        match self {
            Dialect::V1 | Dialect::Rest | Dialect::Grpc => contains(body, b"TASK_STATE_COMPLETED"),
            Dialect::Seed | Dialect::V03 => contains(body, b"\"final\":true"),
        }
    }
}

/// What one worker saw.
#[derive(Default, Debug)]
pub struct Stats {
    /// Latency of each successful request, in microseconds.
    pub latencies: Vec<u32>,
    pub errors: BTreeMap<String, u64>,
}

impl Stats {
    pub fn error(&mut self, kind: impl Into<String>) {
        *self.errors.entry(kind.into()).or_default() += 1;
    }

    pub fn merge(&mut self, other: Stats) {
        self.latencies.extend(other.latencies);
        for (k, v) in other.errors {
            *self.errors.entry(k).or_default() += v;
        }
    }
}

/// Requests completed so far, for the progress line.
pub static DONE: AtomicU64 = AtomicU64::new(0);

/// A keep-alive connection.
pub struct Conn {
    sender: Sender,
    target: Arc<Target>,
}

/// How a connection sends: HTTP/1.1, or a stream of an HTTP/2 connection (cleartext, prior
/// knowledge) that other `Conn`s may share.
enum Sender {
    H1(SendRequest<Full<Bytes>>),
    H2(hyper::client::conn::http2::SendRequest<Full<Bytes>>),
}

impl Conn {
    pub async fn open(target: Arc<Target>) -> Result<Self, String> {
        let tcp = connect(&target).await?;
        let (sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(tcp))
            .await
            .map_err(|_| "handshake".to_string())?;
        tokio::spawn(conn);
        Ok(Self {
            sender: Sender::H1(sender),
            target,
        })
    }

    /// An HTTP/2 connection whose streams [`Conn::stream`] hands out.
    pub async fn open_h2(target: Arc<Target>) -> Result<Self, String> {
        let tcp = connect(&target).await?;
        let (sender, conn) = hyper::client::conn::http2::handshake(
            hyper_util::rt::TokioExecutor::new(),
            TokioIo::new(tcp),
        )
        .await
        .map_err(|_| "handshake".to_string())?;
        tokio::spawn(conn);
        Ok(Self {
            sender: Sender::H2(sender),
            target,
        })
    }

    /// Another stream on this HTTP/2 connection (`None` on HTTP/1.1).
    pub fn stream(&self) -> Option<Self> {
        match &self.sender {
            Sender::H1(_) => None,
            Sender::H2(s) => Some(Self {
                sender: Sender::H2(s.clone()),
                target: self.target.clone(),
            }),
        }
    }

    /// GETs a path; returns the status and the whole response body.
    pub async fn get(&mut self, path: &str) -> Result<(u16, Bytes), String> {
        let req = Request::get(path)
            .header("host", "a2ad")
            .body(Full::new(Bytes::new()))
            .map_err(|_| "request".to_string())?;
        self.send(req).await
    }

    /// POSTs a request body (JSON-RPC, or on REST the operation's); returns the status and
    /// the whole response body.
    pub async fn post(&mut self, body: String, sse: bool) -> Result<(u16, Bytes), String> {
        let req = post_request(&self.target, body, sse)?;
        self.send(req).await
    }

    async fn send(&mut self, req: Request<Full<Bytes>>) -> Result<(u16, Bytes), String> {
        let closed = |_| "closed".to_string();
        let sent = match &mut self.sender {
            Sender::H1(s) => {
                s.ready().await.map_err(closed)?;
                s.send_request(req).await
            }
            Sender::H2(s) => {
                s.ready().await.map_err(closed)?;
                s.send_request(req).await
            }
        };
        whole(sent.map_err(|_| "io".to_string())?).await
    }
}

/// A TCP connection to the target, within ten seconds.
async fn connect(target: &Target) -> Result<TcpStream, String> {
    let tcp = tokio::time::timeout(Duration::from_secs(10), TcpStream::connect(target.addr))
        .await
        .map_err(|_| "connect-timeout".to_string())?
        .map_err(|_| "connect".to_string())?;
    let _ = tcp.set_nodelay(true);
    Ok(tcp)
}

/// A POST of `body` to the target's path (on REST, the operation's).
fn post_request(target: &Target, body: String, sse: bool) -> Result<Request<Full<Bytes>>, String> {
    let uri = match (target.dialect, sse) {
        (Dialect::Rest, false) => format!("{}/message:send", target.path),
        (Dialect::Rest, true) => format!("{}/message:stream", target.path),
        _ => target.path.clone(),
    };
    let mut req = Request::post(uri)
        .header("host", "a2ad")
        .header("content-type", "application/json")
        .header("x-api-key", &target.key);
    if target.dialect.is_1_0() {
        req = req.header("a2a-version", "1.0");
    }
    if sse {
        req = req.header("accept", "text/event-stream");
    }
    req.body(Full::new(Bytes::from(body)))
        .map_err(|_| "request".to_string())
}

/// The status and the whole body of a response.
async fn whole(resp: hyper::Response<hyper::body::Incoming>) -> Result<(u16, Bytes), String> {
    let status = resp.status().as_u16();
    let body = resp
        .into_body()
        .collect()
        .await
        .map_err(|_| "io-body".to_string())?
        .to_bytes();
    Ok((status, body))
}

/// A `message/send` or `message/stream` body with a fresh messageId.
pub fn send_body(method: &str, text: &str, extra: &str) -> String {
    format!(
        r#"{{"jsonrpc":"2.0","id":1,"method":"{method}","params":{{"message":{{"role":"user","messageId":"{}","parts":[{{"type":"text","text":"{text}"}}]}}{extra}}}}}"#,
        uuid::Uuid::new_v4()
    )
}

/// Classifies a JSON-RPC response: `None` when it is a success.
pub fn rpc_error(status: u16, body: &[u8]) -> Option<String> {
    if status != 200 {
        return Some(format!("http-{status}"));
    }
    let text = std::str::from_utf8(body).ok()?;
    let at = text.find("\"error\":{\"code\":")?;
    let code: String = text[at + 16..]
        .chars()
        .take_while(|c| *c == '-' || c.is_ascii_digit())
        .collect();
    Some(format!("rpc{code}"))
}

/// A task id out of a send result.
pub fn task_id(body: &[u8]) -> Option<String> {
    let v: serde_json::Value = serde_json::from_slice(body).ok()?;
    v["result"]["id"].as_str().map(str::to_string)
}

/// What a request loop does each round.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    Send,
    Stream,
    Mixed,
}

/// One connection issuing requests back to back until `deadline` (or until `budget` runs
/// out, when given).
pub async fn run_loop(
    target: Arc<Target>,
    kind: Kind,
    deadline: Instant,
    budget: Option<Arc<AtomicU64>>,
) -> Stats {
    let mut stats = Stats::default();
    let mut conn: Option<Conn> = None;
    let mut recent: Vec<String> = Vec::new();
    let mut round: u64 = 0;
    while Instant::now() < deadline {
        if let Some(b) = &budget
            && b.fetch_update(Relaxed, Relaxed, |n| n.checked_sub(1))
                .is_err()
        {
            break;
        }
        if conn.is_none() {
            let opened = if target.h2 {
                Conn::open_h2(target.clone()).await
            } else {
                Conn::open(target.clone()).await
            };
            match opened {
                Ok(c) => conn = Some(c),
                Err(kind) => {
                    stats.error(kind);
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                }
            }
        }
        let Some(c) = conn.as_mut() else { continue };
        round += 1;
        let (body, sse, is_cancel) = match kind {
            Kind::Send => (target.dialect.body(false, "load"), false, false),
            Kind::Stream => (target.dialect.body(true, "load"), true, false),
            Kind::Mixed => mixed_body(round, &recent),
        };
        let t0 = Instant::now();
        match c.post(body, sse).await {
            Ok((status, bytes)) => {
                let micros = u32::try_from(t0.elapsed().as_micros()).unwrap_or(u32::MAX);
                let error = if sse {
                    (!target.dialect.stream_finished(&bytes)).then(|| "no-final-event".to_string())
                } else {
                    rpc_error(status, &bytes)
                };
                match error {
                    // Canceling a task that already finished is a normal outcome here.
                    Some(e)
                        if is_cancel
                            && matches!(&e[..], "rpc-32001" | "rpc-32002" | "rpc-32003") =>
                    {
                        stats.latencies.push(micros);
                    }
                    Some(e) => stats.error(e),
                    None => {
                        stats.latencies.push(micros);
                        if kind == Kind::Mixed
                            && let Some(id) = task_id(&bytes)
                        {
                            if recent.len() >= 16 {
                                recent.remove(0);
                            }
                            recent.push(id);
                        }
                    }
                }
                DONE.fetch_add(1, Relaxed);
            }
            Err(e) => {
                stats.error(e);
                conn = None;
            }
        }
    }
    stats
}

/// The mixed ratio per 20 requests: 12 send, 5 get, 1 cancel, 2 card.
fn mixed_body(round: u64, recent: &[String]) -> (String, bool, bool) {
    let pick = recent.get((round as usize) % recent.len().max(1)).cloned();
    match (round % 20, pick) {
        (12..=16, Some(id)) => (
            format!(
                r#"{{"jsonrpc":"2.0","id":2,"method":"tasks/get","params":{{"taskId":"{id}"}}}}"#
            ),
            false,
            false,
        ),
        (17, Some(id)) => (
            format!(
                r#"{{"jsonrpc":"2.0","id":3,"method":"tasks/cancel","params":{{"taskId":"{id}"}}}}"#
            ),
            false,
            true,
        ),
        (18 | 19, _) => (
            r#"{"jsonrpc":"2.0","id":4,"method":"agent/authenticatedExtendedCard"}"#.to_string(),
            false,
            false,
        ),
        _ => (send_body("message/send", "mixed", ""), false, false),
    }
}

pub fn contains(hay: &[u8], needle: &[u8]) -> bool {
    hay.windows(needle.len()).any(|w| w == needle)
}

/// Percentile of sorted microsecond latencies, in milliseconds.
pub fn percentile(sorted: &[u32], p: f64) -> f64 {
    if sorted.is_empty() {
        return 0.0;
    }
    let i = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    f64::from(sorted[i.min(sorted.len() - 1)]) / 1000.0
}

/// One worker over gRPC (its share of `channel`): `send` or `stream` back to back until
/// `deadline` (or until `budget` runs out). `target.path` is the agent (the tenant).
pub async fn run_grpc_loop(
    target: Arc<Target>,
    channel: tonic::transport::Channel,
    kind: Kind,
    deadline: Instant,
    budget: Option<Arc<AtomicU64>>,
) -> Stats {
    use a2ad::proto as pb;
    let mut stats = Stats::default();
    let mut client =
        pb::a2a_service_client::A2aServiceClient::new(channel).max_decoding_message_size(64 << 20);
    while Instant::now() < deadline {
        if let Some(b) = &budget
            && b.fetch_update(Relaxed, Relaxed, |n| n.checked_sub(1))
                .is_err()
        {
            break;
        }
        let message = pb::SendMessageRequest {
            tenant: target.path.clone(),
            message: Some(pb::Message {
                message_id: uuid::Uuid::new_v4().to_string(),
                role: pb::Role::User.into(),
                parts: vec![pb::Part {
                    content: Some(pb::part::Content::Text("load".into())),
                    ..Default::default()
                }],
                ..Default::default()
            }),
            ..Default::default()
        };
        let mut req = tonic::Request::new(message);
        let md = req.metadata_mut();
        if let Ok(key) = target.key.parse() {
            md.insert("x-api-key", key);
        }
        md.insert(
            "a2a-version",
            tonic::metadata::MetadataValue::from_static("1.0"),
        );
        let t0 = Instant::now();
        let outcome = match kind {
            Kind::Stream => match client.send_streaming_message(req).await {
                Ok(resp) => {
                    let mut stream = resp.into_inner();
                    let mut last_state = None;
                    loop {
                        match stream.message().await {
                            Ok(Some(e)) => {
                                if let Some(pb::stream_response::Payload::StatusUpdate(u)) =
                                    e.payload
                                {
                                    last_state = u.status.map(|s| s.state);
                                }
                            }
                            Ok(None) => break,
                            Err(st) => {
                                last_state = None;
                                stats.error(format!("grpc-{:?}", st.code()));
                                break;
                            }
                        }
                    }
                    if last_state == Some(pb::TaskState::Completed.into()) {
                        Ok(())
                    } else {
                        Err("no-final-event".to_string())
                    }
                }
                Err(st) => Err(format!("grpc-{:?}", st.code())),
            },
            _ => match client.send_message(req).await {
                Ok(_) => Ok(()),
                Err(st) => Err(format!("grpc-{:?}", st.code())),
            },
        };
        match outcome {
            Ok(()) => stats
                .latencies
                .push(u32::try_from(t0.elapsed().as_micros()).unwrap_or(u32::MAX)),
            Err(e) => stats.error(e),
        }
        DONE.fetch_add(1, Relaxed);
    }
    stats
}
