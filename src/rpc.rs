//! The dialects, and what every dialect's call shares (the JSON-RPC 2.0 framing is in
//! `envelope`).
//!
//! Each wire dialect is one folder (`rpc/seed/`, ...) owning its method table, params
//! parsing, rendering (results, SSE frames, webhook payloads) and error codes; [`Dialect`]
//! is the one place that picks among them. Params stay raw JSON until the method is
//! known; the dialect parses them. Nothing outside `http` and `rpc` imports a dialect.

use serde::Serialize;
use serde_json::value::RawValue;

pub(crate) mod a2a;
mod envelope;
pub(crate) mod error;
pub(crate) mod json;
pub(crate) mod out;
pub(crate) mod seed;
mod words;

use std::sync::Arc;

use bytes::Bytes;

pub(crate) use a2a::card::CardSigner;
pub(crate) use envelope::{
    Body, Call, Rejected, decode, decode_as, decode_with, failure, null_id, success,
};
pub(crate) use error::RpcError;

use crate::actors::AgentEntry;
use crate::auth::Caller;
use crate::model::{AgentId, TaskId};
use crate::runtime::{Runtime, StreamItem, TaskStream};

/// The wire dialects, each on its own URL (docs/PROTOCOL.md §10.1).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub(crate) enum Dialect {
    /// `POST /api/v1/a2a/{agent_id}`: the seed dialect.
    Seed,
    /// `POST /api/v1/a2a/{agent_id}/jsonrpc/v0.3` and `…/jsonrpc/v1`: official A2A.
    A2a(a2a::Version),
}

/// How a request is framed on the wire: the metrics' `binding` label.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub(crate) enum Binding {
    /// JSON-RPC 2.0 over HTTP (every dialect).
    JsonRpc,
    /// The HTTP+JSON binding of A2A 1.0 (`…/rest/…`).
    Rest,
    /// The gRPC binding of A2A 1.0 (`lf.a2a.v1.A2AService`).
    Grpc,
}

impl Binding {
    /// The `binding` label of metrics and spans.
    pub(crate) fn name(self) -> &'static str {
        match self {
            Self::JsonRpc => "jsonrpc",
            Self::Rest => "rest",
            Self::Grpc => "grpc",
        }
    }
}

/// Why a request was refused before its body was read as JSON-RPC.
#[derive(Clone, Debug)]
pub(crate) enum Refusal {
    /// 401: no usable credential (the reason says which).
    Unauthorized(&'static str),
    /// 404: no such agent.
    AgentNotFound(AgentId),
    /// 403: the key may not use this agent.
    Forbidden(AgentId),
    /// 429: the caller's rate is spent (seconds until a token).
    RateLimited(u64),
    /// 405: not POST.
    MethodNotAllowed,
    /// 415: not JSON.
    UnsupportedMediaType,
    /// 413: over the body cap.
    TooLarge(u64),
    /// 408: the body did not arrive in time.
    BodyTimeout,
    /// 400-ish: the body could not be read.
    BodyUnreadable,
    /// -32009 (official dialects): the request names an A2A version this URL does not
    /// serve; `agent_url` is the agent's endpoint without a dialect's path.
    VersionNotSupported {
        served: a2a::Version,
        requested: Option<String>,
        agent_url: String,
    },
}

impl Refusal {
    /// The JSON-RPC error of a refusal every dialect shares (-32600 with a reason).
    pub(crate) fn generic(&self) -> RpcError {
        use hyper::StatusCode;
        match self {
            Self::MethodNotAllowed => {
                RpcError::invalid_request("HTTP method not allowed; use POST")
                    .with_status(StatusCode::METHOD_NOT_ALLOWED)
            }
            Self::UnsupportedMediaType => {
                RpcError::invalid_request("Content-Type must be application/json")
                    .with_status(StatusCode::UNSUPPORTED_MEDIA_TYPE)
            }
            Self::TooLarge(limit) => {
                RpcError::new(error::INVALID_REQUEST, "Request body too large")
                    .with_data(serde_json::json!({ "limit": limit }))
                    .with_status(StatusCode::PAYLOAD_TOO_LARGE)
            }
            Self::BodyTimeout => {
                RpcError::invalid_request("the request body did not arrive in time")
                    .with_status(StatusCode::REQUEST_TIMEOUT)
            }
            Self::BodyUnreadable => RpcError::invalid_request("the request body could not be read"),
            Self::Unauthorized(reason) => RpcError::new(error::INVALID_REQUEST, "Unauthorized")
                .with_data(serde_json::json!({ "reason": reason }))
                .with_status(StatusCode::UNAUTHORIZED),
            Self::AgentNotFound(_) => RpcError::new(error::INVALID_REQUEST, "Agent not found")
                .with_status(StatusCode::NOT_FOUND),
            Self::Forbidden(_) => RpcError::new(error::INVALID_REQUEST, "Forbidden")
                .with_status(StatusCode::FORBIDDEN),
            Self::RateLimited(secs) => RpcError::rate_limited(error::INVALID_REQUEST, *secs),
            // The seed names no versions: only the official dialects refuse one.
            Self::VersionNotSupported { .. } => {
                RpcError::invalid_request("this URL serves no A2A version")
            }
        }
    }
}

impl crate::runtime::Runtime {
    /// The actor system for a validated configuration, with the backends the configuration
    /// names unless [`RuntimeBuilder::agent`](crate::runtime::RuntimeBuilder::agent) gives
    /// others, and every built-in webhook payload format (`seed`, `a2a/0.3`, `a2a/1.0`:
    /// [`StoredPushConfig::format`](crate::push::StoredPushConfig::format)), so that a
    /// runtime embedded without the HTTP server delivers signed webhooks as the server does.
    /// (Defined beside the dialects, which own the formats: the core names none of them.)
    ///
    /// ```
    /// # async fn run() -> a2ad::Result<()> {
    /// use std::sync::Arc;
    /// use std::time::Duration;
    ///
    /// use a2ad::{AgentId, Message, Principal, Runtime, SendRequest};
    ///
    /// let mut config = a2ad::Config::default(); // one `echo` agent
    /// config.store = a2ad::config::StoreConfig::memory();
    /// let runtime = Runtime::builder(Arc::new(config.validated()?)).start().await?;
    /// let (me, echo) = (Principal::new("alice"), AgentId::new("echo"));
    /// let hello = SendRequest::new(Message::user_text(["hello"]));
    /// let task = runtime.send(&me, &echo, hello, Some(Duration::from_secs(5))).await?;
    /// assert!(task.status.state.is_terminal());
    /// runtime.shutdown(Duration::from_secs(1)).await;
    /// # Ok(())
    /// # }
    /// # tokio::runtime::Runtime::new().expect("runtime").block_on(run()).expect("runs");
    /// ```
    pub fn builder(config: Arc<crate::Config>) -> crate::runtime::RuntimeBuilder {
        let backends = a2a_backends(&config, |_, _| true);
        let builder = crate::runtime::RuntimeBuilder::with_renderers(config, payload_renderers());
        backends
            .into_iter()
            .fold(builder, |b, (id, backend)| b.agent_arc(id, backend))
    }
}

/// The `a2a` backends of `config` (clients of the official dialects, built here beside
/// them) for the agents `wanted(id, agent)` says.
pub(crate) fn a2a_backends(
    config: &crate::Config,
    wanted: impl Fn(&str, &crate::config::AgentConfig) -> bool,
) -> std::collections::HashMap<crate::model::AgentId, Arc<dyn crate::Agent>> {
    config
        .agents
        .iter()
        .filter(|a| a.backend == "a2a" && wanted(&a.id, a))
        .filter_map(|a| {
            let u = a.a2a.as_ref()?;
            let backend: Arc<dyn crate::Agent> =
                Arc::new(a2a::upstream::A2aAgent::new(&a.id, u.clone(), &a.limits));
            Some((crate::model::AgentId::new(a.id.as_str()), backend))
        })
        .collect()
}

/// The webhook payload renderers of every dialect, by format name.
fn payload_renderers() -> std::collections::HashMap<String, Arc<dyn crate::webhook::PayloadRenderer>>
{
    let mut renderers: std::collections::HashMap<String, Arc<dyn crate::webhook::PayloadRenderer>> =
        std::collections::HashMap::new();
    renderers.insert(
        seed::webhook::FORMAT.into(),
        Arc::new(seed::webhook::SeedPayload),
    );
    for v in a2a::Version::ALL {
        renderers.insert(
            a2a::webhook::format(v).into(),
            Arc::new(a2a::webhook::A2aPayload(v)),
        );
    }
    renderers
}

impl Dialect {
    /// Every dialect, for metric tables.
    pub(crate) const ALL: [Dialect; 3] = [
        Dialect::Seed,
        Dialect::A2a(a2a::Version::V10),
        Dialect::A2a(a2a::Version::V03),
    ];

    /// The `dialect` label of metrics and spans.
    pub(crate) fn name(self) -> &'static str {
        match self {
            Self::Seed => "seed",
            Self::A2a(a2a::Version::V10) => "a2a-1.0",
            Self::A2a(a2a::Version::V03) => "a2a-0.3",
        }
    }

    /// The path under `/api/v1/a2a/{agent}` that serves it (`""`: the agent's own path).
    pub(crate) fn path(self) -> &'static str {
        match self {
            Self::Seed => "",
            Self::A2a(v) => v.path(),
        }
    }

    /// The methods it serves (one metric label each).
    pub(crate) fn methods(self) -> &'static [&'static str] {
        match self {
            Self::Seed => &seed::METHODS,
            Self::A2a(v) => v.methods(),
        }
    }

    /// The metric label of a method it serves (aliases folded in).
    pub(crate) fn method_label(self, method: &str) -> Option<&'static str> {
        match self {
            Self::Seed => seed::method_label(method),
            Self::A2a(v) => v.method_label(method),
        }
    }

    /// The error codes it answers with besides JSON-RPC's own (for metric outcomes).
    pub(crate) fn codes(self) -> &'static [i64] {
        match self {
            Self::Seed => &seed::errors::CODES,
            Self::A2a(_) => &a2a::errors::CODES,
        }
    }

    /// Whether a method answers with a stream (refused inside a batch).
    pub(crate) fn is_streaming(self, method: &str) -> bool {
        match self {
            Self::Seed => seed::is_streaming(method),
            Self::A2a(v) => v.is_streaming(method),
        }
    }

    /// Whether a request without an `id` (or with `"id": null`) is answered, with
    /// `"id": null` (the official dialects: docs/PROTOCOL.md §10.3), rather than refused.
    pub(crate) fn answers_null_ids(self) -> bool {
        matches!(self, Self::A2a(_))
    }

    /// The body of a refused request in this dialect.
    pub(crate) fn refusal(self, r: &Refusal) -> RpcError {
        match self {
            Self::Seed => seed::errors::refusal(r),
            Self::A2a(v) => a2a::errors::refusal(v, r),
        }
    }

    /// An error of JSON-RPC itself (framing, decoding) in this dialect's shape.
    pub(crate) fn dress(self, e: RpcError) -> RpcError {
        match self {
            Self::Seed => e,
            Self::A2a(v) => a2a::errors::dress(v, e),
        }
    }

    /// Runs one call.
    pub(crate) async fn dispatch(self, runtime: &Runtime, cx: &CallContext, call: &Call) -> Reply {
        if cx.in_batch && self.is_streaming(&call.method) {
            return Reply::error(
                Some(&call.id),
                &self.dress(RpcError::invalid_request(
                    "streaming methods cannot be used inside a batch",
                )),
            );
        }
        if self.method_label(&call.method).is_none()
            && let Some(other) = Self::serving(&call.method, self)
        {
            return Reply::error(
                Some(&call.id),
                &self.dress(elsewhere(cx, &call.method, other)),
            );
        }
        match self {
            Self::Seed => seed::dispatch(runtime, cx, call).await,
            Self::A2a(v) => a2a::dispatch(runtime, cx, call, v).await,
        }
    }

    /// Another dialect that serves a method, if one does.
    fn serving(method: &str, besides: Dialect) -> Option<Dialect> {
        Self::ALL
            .into_iter()
            .filter(|d| *d != besides)
            .find(|d| d.method_label(method).is_some())
    }
}

/// -32601 for a method of another dialect, naming the URL that serves it.
fn elsewhere(cx: &CallContext, method: &str, other: Dialect) -> RpcError {
    let url = cx.url(other);
    let version = match other {
        Dialect::Seed => "the seed dialect".to_string(),
        Dialect::A2a(v) => format!("A2A {}", v.number()),
    };
    RpcError::new(error::METHOD_NOT_FOUND, "Method not found").with_data(serde_json::json!({
        "method": method,
        "url": url,
        "reason": format!("{method} is a method of {version}, served at {url}"),
    }))
}

/// Everything a call needs to know about its request.
pub(crate) struct CallContext {
    /// Who calls.
    pub(crate) caller: Arc<Caller>,
    /// The agent.
    pub(crate) agent: Arc<AgentEntry>,
    /// Its id.
    pub(crate) agent_id: AgentId,
    /// The client accepts `text/event-stream`.
    pub(crate) accepts_sse: bool,
    /// `Last-Event-ID`, if sent.
    pub(crate) last_event_id: Option<String>,
    /// Inside a batch (streams are refused there).
    pub(crate) in_batch: bool,
    /// Where the request came in: its base URL and gRPC address are made from it.
    pub(crate) origin: Origin,
    /// Signs the cards a call returns (`[cards.signing]`).
    pub(crate) card_signer: Option<Arc<a2a::card::CardSigner>>,
    /// The extensions the request activated (docs/PROTOCOL.md §12).
    pub(crate) extensions: crate::model::Extensions,
}

impl CallContext {
    /// A context for decoding alone, outside any request (the fuzz targets and the tests
    /// that compare decoders): the caller `detached` on the default configuration's first
    /// agent, with `limits`.
    pub(crate) fn detached(limits: crate::config::AgentLimits) -> Self {
        let mut config = crate::config::AgentConfig::new(crate::Config::DEFAULT_AGENT_ID);
        config.limits = limits;
        let agent_id = AgentId::new(config.id.as_str());
        let agent = AgentEntry {
            backend: crate::agent::from_config(&config),
            scheduler: crate::limits::Scheduler::new(
                config.limits.concurrent_tasks,
                config.limits.max_queued(),
            ),
            metrics: Arc::default(),
            index: 0,
            config,
        };
        Self {
            caller: Arc::new(Caller {
                principal: crate::model::Principal::new("detached"),
                principal_index: None,
                agents: None,
            }),
            agent: Arc::new(agent),
            agent_id,
            accepts_sse: true,
            last_event_id: None,
            in_batch: false,
            origin: Origin {
                public_url: None,
                https: false,
                host: None,
                local_addr: std::net::SocketAddr::from(([127, 0, 0, 1], 0)),
            },
            card_signer: None,
            extensions: crate::model::Extensions::default(),
        }
    }

    /// The public base URL ([`Origin::base_url`]).
    pub(crate) fn base_url(&self) -> String {
        self.origin.base_url()
    }

    /// The URL of this agent's endpoint in a dialect.
    pub(crate) fn url(&self, dialect: Dialect) -> String {
        let base = self.base_url();
        match dialect.path() {
            "" => format!("{base}/api/v1/a2a/{}", self.agent_id),
            path => format!("{base}/api/v1/a2a/{}/{path}", self.agent_id),
        }
    }

    /// The gRPC interface's `host:port`: `public` (`server.public_grpc_url`), else from the
    /// request's `Host`.
    pub(crate) fn grpc_url(&self, public: Option<&str>) -> String {
        grpc_address(public, self.origin.host.as_ref(), self.origin.local_addr)
    }

    /// Names the call's task in the request's span (for following it through the logs).
    pub(crate) fn task(&self, task: &TaskId) {
        let span = tracing::Span::current();
        span.record("task", task.as_str());
        if crate::telemetry::on() {
            span.record("a2a.task.id", task.as_str());
            crate::telemetry::link_current_to_task(&crate::model::TaskKey {
                principal: self.caller.principal.clone(),
                agent: self.agent_id.clone(),
                task: task.clone(),
            });
        }
    }
}

/// A stream's framed messages (a gRPC response's, each a length-prefixed message).
pub(crate) type Frames = std::pin::Pin<Box<dyn futures_util::Stream<Item = Bytes> + Send>>;

/// Renders one stream item as the JSON-RPC response of a `data:` line: request id, the
/// item, and whether it is the first of the stream.
pub(crate) type FrameFn = fn(&RawValue, &StreamItem, bool) -> Vec<u8>;

/// The outcome of one call.
pub(crate) enum Reply {
    /// A complete JSON-RPC response (success or error).
    Json {
        /// The encoded envelope.
        body: Vec<u8>,
        /// The error code, for metrics (`None`: success).
        code: Option<i64>,
        /// HTTP status when this is the whole response.
        status: hyper::StatusCode,
        /// `Retry-After` seconds.
        retry_after: Option<u64>,
    },
    /// A complete SSE body (one agent message answering a streaming call).
    Events {
        /// The encoded frames.
        body: Bytes,
    },
    /// An SSE stream; each event is a response carrying `id`.
    Stream {
        /// The request id, echoed in every event.
        id: Box<RawValue>,
        /// The task's events.
        stream: TaskStream,
        /// The dialect's frame renderer.
        frames: FrameFn,
    },
}

impl Reply {
    /// An error reply.
    pub(crate) fn error(id: Option<&RawValue>, e: &RpcError) -> Self {
        Self::Json {
            body: failure(id, e),
            code: Some(e.code),
            status: e.status,
            retry_after: e.retry_after,
        }
    }

    /// A success reply.
    pub(crate) fn ok<T: Serialize + ?Sized>(id: &RawValue, result: &T) -> Self {
        Self::Json {
            body: success(id, result),
            code: None,
            status: hyper::StatusCode::OK,
            retry_after: None,
        }
    }

    /// A one-frame SSE reply carrying `result`.
    pub(crate) fn events<T: Serialize + ?Sized>(id: &RawValue, result: &T) -> Self {
        Self::Events {
            body: sse_frame(1, &success(id, result)),
        }
    }

    /// A stream reply.
    pub(crate) fn stream(id: &RawValue, stream: TaskStream, frames: FrameFn) -> Self {
        Self::Stream {
            id: id.to_owned(),
            stream,
            frames,
        }
    }
}

/// One SSE frame: `id: <seq>`, `data: <json>`, blank line.
pub(crate) fn sse_frame(seq: u64, json: &[u8]) -> Bytes {
    let mut out = Vec::with_capacity(json.len() + 32);
    out.extend_from_slice(b"id: ");
    out.extend_from_slice(seq.to_string().as_bytes());
    out.extend_from_slice(b"\ndata: ");
    out.extend_from_slice(json);
    out.extend_from_slice(b"\n\n");
    Bytes::from(out)
}

/// A `Host` value, when it looks like a host (letters, digits, `-._:[]`, at most 255).
pub(crate) fn plausible_host(v: &hyper::header::HeaderValue) -> Option<&str> {
    v.to_str().ok().filter(|h| {
        !h.is_empty()
            && h.len() <= 255
            && h.bytes()
                .all(|b| b.is_ascii_alphanumeric() || b"-._:[]".contains(&b))
    })
}

/// Where a request came in: what its public base URL and the gRPC interface's address
/// are made from, when a call shows them (a card, an error naming a URL).
pub(crate) struct Origin {
    /// `server.public_url`, when set.
    pub(crate) public_url: Option<String>,
    /// The connection is TLS.
    pub(crate) https: bool,
    /// The request's `Host` (a copy: a clone would be a slice of the connection's read
    /// buffer, and keep it alive for as long as the call runs).
    pub(crate) host: Option<hyper::header::HeaderValue>,
    /// The listening address.
    pub(crate) local_addr: std::net::SocketAddr,
}

impl Origin {
    /// The public base URL (`server.public_url`, else `http://` + `Host`, else the
    /// listening address), no trailing `/`.
    pub(crate) fn base_url(&self) -> String {
        base_url_of(
            self.public_url.as_deref(),
            self.https,
            self.host.as_ref(),
            self.local_addr,
        )
    }
}

/// The public base URL from its parts (`server.public_url`, else the scheme and the
/// request's `Host` when it looks like a host, else the listening address): made only
/// where a call shows it (a card, an error naming a URL), not for every request.
pub(crate) fn base_url_of(
    public: Option<&str>,
    https: bool,
    host: Option<&hyper::header::HeaderValue>,
    local: std::net::SocketAddr,
) -> String {
    if let Some(url) = public {
        return url.to_string();
    }
    let scheme = if https { "https://" } else { "http://" };
    match host.and_then(plausible_host) {
        Some(h) => {
            let mut url = String::with_capacity(scheme.len() + h.len());
            url.push_str(scheme);
            url.push_str(h);
            url
        }
        None => format!("{scheme}{local}"),
    }
}

/// The address of the gRPC interface the cards announce (a bare `host:port`, S10 §8.3.1):
/// `public`, else the request's `Host` (with the listening port when it names none), else
/// the listening address.
pub(crate) fn grpc_address(
    public: Option<&str>,
    host: Option<&hyper::header::HeaderValue>,
    local: std::net::SocketAddr,
) -> String {
    if let Some(url) = public {
        return url.to_string();
    }
    match host.and_then(plausible_host) {
        Some(h)
            if h.rsplit_once(':')
                .is_some_and(|(_, port)| port.parse::<u16>().is_ok()) =>
        {
            h.to_string()
        }
        Some(h) => format!("{h}:{}", local.port()),
        None => local.to_string(),
    }
}
