//! The edge: the hyper service. A request is routed by its content type (gRPC) or its path
//! (docs/PROTOCOL.md §10.1) to a binding — JSON-RPC in every dialect (`jsonrpc`), HTTP+JSON
//! (`rest`), gRPC (`grpc`), a2ad's own reads (`ext`) — each of which admits it through the
//! one admission (`admit`) before it reads a byte of its body (within the body budgets of
//! `budget`), then decodes it with its dialect's codec (`rpc`), runs it in a span that
//! counts it ([`observed`]) and answers. The response helpers are in `respond`, the body
//! type in `body`.

use std::convert::Infallible;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http_body_util::BodyExt;
use hyper::body::Incoming;
use hyper::header::{self, HeaderValue};
use hyper::{Method, Request, Response, StatusCode};
use tracing::Instrument as _;

mod admit;
mod body;
pub(crate) mod budget;
mod card;
mod ext;
mod grpc;
mod jsonrpc;
mod metrics;
pub(crate) mod prometheus;
mod respond;
mod rest;
pub(crate) mod sse;
mod ui;

pub(crate) use body::Body;
pub(crate) use metrics::{LATENCY_BUCKETS, RequestMetrics};
pub(crate) use respond::{cors, error_response, json, method_not_allowed, preflight_official};
use respond::{not_found_path, preflight};
pub(crate) use ui::BUILT as UI_BUILT;

use crate::auth::KeyStore;
use crate::limits::RateLimiter;
use crate::model::AgentId;
use crate::rpc::{self, Binding, CallContext, Dialect, Refusal, Reply, RpcError};
use crate::runtime::Runtime;
use sse::SseBody;

/// The path prefix of the per-agent endpoint.
pub(crate) const ENDPOINT_PREFIX: &str = "/api/v1/a2a/";

/// What every request handler shares.
pub(crate) struct App {
    /// The actor system.
    pub runtime: Runtime,
    /// Who may call, and at what rate: swapped whole by a reload of `[[api_keys]]` and
    /// `[auth]` (a request keeps the ones it started with).
    pub(crate) access: crate::swap::Swap<Access>,
    /// Configuration reloads applied and refused (`a2ad_config_reloads_total`).
    pub(crate) reloads: [std::sync::atomic::AtomicU64; 2],
    /// JSON-RPC requests by dialect, method and outcome.
    pub(crate) requests: RequestMetrics,
    /// Request body cap in bytes.
    pub max_body: u64,
    /// Body bytes all requests may hold at once (`server.max_buffered_body_bytes`).
    pub(crate) bodies: budget::BodyBudget,
    /// Body bytes the requests of one HTTP/2 connection may hold at once
    /// (`server.max_buffered_body_bytes_per_connection`).
    pub(crate) connection_bodies: u64,
    /// Time allowed for the body to arrive.
    pub body_timeout: Duration,
    /// Idle time before `: ping` on streams.
    pub ping_every: Duration,
    /// The listening address (the base URL's host when a request names none).
    pub(crate) local_addr: std::net::SocketAddr,
    /// Whether the listener speaks TLS: the cards' URLs are then `https://`.
    pub(crate) https: bool,
    /// Signs the cards (`[cards.signing]`).
    pub(crate) card_signer: Option<Arc<crate::rpc::CardSigner>>,
    /// When the server started (the cards' `Last-Modified`).
    pub(crate) started: chrono::DateTime<chrono::Utc>,
    /// Serve the inspector at `/ui` (`[ui] enabled`).
    pub(crate) ui: bool,
}

/// The callers a server knows (API keys, client certificates, OIDC issuers) and their
/// rate buckets (per principal per agent), made together from one configuration.
pub(crate) struct Access {
    pub(crate) keys: KeyStore,
    pub(crate) rate: RateLimiter,
}

impl Access {
    /// The callers of `config`, with full rate buckets; when it configures none, the
    /// development key (`dev_key`, else a new one).
    pub(crate) fn from_config(
        config: &crate::Config,
        dev_key: Option<&str>,
    ) -> (Self, Option<String>) {
        let (keys, dev_key) = KeyStore::from_config(config, dev_key);
        let per_minute: Vec<u64> = config
            .agents
            .iter()
            .map(|a| a.limits.requests_per_minute)
            .collect();
        let rate = RateLimiter::new(keys.principals(), &per_minute);
        (Self { keys, rate }, dev_key)
    }
}

/// Handles one request. Never fails: every problem is an HTTP response.
pub(crate) async fn handle(
    app: Arc<App>,
    mut req: Request<Incoming>,
) -> Result<Response<Body>, Infallible> {
    // An HTTP/2 request names its host in `:authority`, which hyper puts in the URI: it
    // becomes `host`, which the cards' URLs are built from, as an HTTP/1.1 request's is.
    if !req.headers().contains_key(header::HOST)
        && let Some(authority) = req.uri().authority()
        && let Ok(v) = HeaderValue::from_str(authority.as_str())
    {
        req.headers_mut().insert(header::HOST, v);
    }
    if crate::telemetry::on() {
        // Traced: the whole request in a span whose parent is the caller's `traceparent`.
        let span = crate::telemetry::request_span(req.headers(), req.uri().path());
        return Ok(Box::pin(routed(app, req)).instrument(span).await);
    }
    Ok(routed(app, req).await)
}

/// Routes one request: gRPC by its content type, the rest by path.
async fn routed(app: Arc<App>, req: Request<Incoming>) -> Response<Body> {
    if grpc::is_grpc(&req) {
        // Boxed: a gRPC call's future is large, and an unboxed one would make every
        // request's future that large (moved several times per request).
        return Box::pin(grpc::serve(app, req)).await;
    }
    let path = req.uri().path();
    if path == "/metrics" {
        match *req.method() {
            Method::GET | Method::HEAD => prometheus::response(&app),
            _ => method_not_allowed("GET, HEAD"),
        }
    } else if path == "/healthz" {
        match *req.method() {
            // A node cut off from PostgreSQL fails its commits too: that it stopped serving
            // (fenced) is what a balancer should read.
            Method::GET | Method::HEAD if !app.runtime.serving() => json(
                StatusCode::SERVICE_UNAVAILABLE,
                br#"{"status":"not serving"}"#.to_vec(),
            ),
            Method::GET | Method::HEAD if app.runtime.store_failing() => json(
                StatusCode::SERVICE_UNAVAILABLE,
                br#"{"status":"store failing"}"#.to_vec(),
            ),
            Method::GET | Method::HEAD => json(StatusCode::OK, br#"{"status":"ok"}"#.to_vec()),
            Method::OPTIONS => preflight(),
            _ => method_not_allowed("GET, HEAD"),
        }
    } else if path == ext::AGENTS_PATH {
        ext::agents(&app, req).await
    } else if path == ui::PATH || path.starts_with(ui::PREFIX) {
        ui::response(&app, &req)
    } else if path == card::WELL_KNOWN || path == card::WELL_KNOWN_SLASH {
        card::response(&app, None, &req)
    } else if let Some(rest) = path.strip_prefix(ENDPOINT_PREFIX) {
        match route(rest) {
            Route::Rpc(agent, dialect) => {
                jsonrpc::endpoint(&app, admit::Target::named(&app, agent), dialect, req).await
            }
            Route::Rest(agent, sub) => {
                let (agent, sub) = (admit::Target::named(&app, agent), sub.to_string());
                Box::pin(rest::endpoint(&app, agent, &sub, req)).await
            }
            Route::Card(agent) => card::response(&app, Some(AgentId::new(agent)), &req),
            Route::Elsewhere(agent) => jsonrpc::not_served(&app, agent, &req),
            Route::None => not_found_path(),
        }
    } else {
        not_found_path()
    }
}

/// What a path under the endpoint prefix names.
#[derive(Debug, PartialEq, Eq)]
enum Route<'a> {
    /// An agent's JSON-RPC endpoint in a dialect.
    Rpc(&'a str, Dialect),
    /// An agent's HTTP+JSON binding (A2A 1.0): the path after `rest`.
    Rest(&'a str, &'a str),
    /// An agent's public card.
    Card(&'a str),
    /// Another path under an agent (REST-style, ...): not served.
    Elsewhere(&'a str),
    /// Nothing.
    None,
}

/// The route of a path under the endpoint prefix (a trailing `/` is the same resource).
fn route(rest: &str) -> Route<'_> {
    let rest = rest.strip_suffix('/').unwrap_or(rest);
    let (agent, sub) = rest.split_once('/').unwrap_or((rest, ""));
    if agent.is_empty() {
        return Route::None;
    }
    if let Some(dialect) = Dialect::ALL.into_iter().find(|d| d.path() == sub) {
        return Route::Rpc(agent, dialect);
    }
    match sub {
        ".well-known/agent-card.json" => Route::Card(agent),
        "rest" => Route::Rest(agent, ""),
        _ => match sub.strip_prefix("rest/") {
            Some(rest) => Route::Rest(agent, rest),
            None => Route::Elsewhere(agent),
        },
    }
}

/// The public base URL: `server.public_url`, else `http://` + the request's `Host` (when
/// it looks like a host), else the listening address.
pub(crate) fn base_url(app: &App, headers: &hyper::HeaderMap) -> String {
    rpc::base_url_of(
        app.runtime.config().server.public_url.as_deref(),
        app.https,
        headers.get(header::HOST),
        app.local_addr,
    )
}

/// The address of the gRPC interface the cards announce ([`rpc::grpc_address`]).
pub(crate) fn grpc_url(app: &App, headers: &hyper::HeaderMap) -> String {
    rpc::grpc_address(
        app.runtime.config().server.public_grpc_url.as_deref(),
        headers.get(header::HOST),
        app.local_addr,
    )
}

/// The `A2A-Version` a request names: the header, else the query parameter.
pub(crate) fn requested_version<B>(req: &Request<B>) -> Option<String> {
    if let Some(v) = req.headers().get(admit::A2A_VERSION) {
        return Some(String::from_utf8_lossy(v.as_bytes()).into_owned());
    }
    version_in_query(req.uri())
}

/// The `a2a-version` query parameter, when the request has one.
fn version_in_query(uri: &hyper::Uri) -> Option<String> {
    uri.query().and_then(|q| {
        url::form_urlencoded::parse(q.as_bytes())
            .find(|(k, _)| k.eq_ignore_ascii_case("a2a-version"))
            .map(|(_, v)| v.into_owned())
    })
}

/// Runs one call's `work` in a span that names its dialect, binding, method, agent, task
/// and outcome (`RUST_LOG=a2ad=debug` to follow requests), and counts it.
async fn observed<T: Outcome>(
    app: &App,
    dialect: Dialect,
    binding: Binding,
    cx: &CallContext,
    method: Option<&str>,
    work: impl Future<Output = T>,
) -> T {
    cx.agent.metrics.requests(1);
    let started = std::time::Instant::now();
    let slot = app.requests.slot(dialect, binding, method);
    // Traced: the request's span (made in `handle`) learns what the call was.
    let traced = crate::telemetry::on().then(|| {
        let request = tracing::Span::current();
        request.record("rpc.system", binding.name());
        request.record("rpc.method", method.unwrap_or("-"));
        request.record("a2a.protocol.dialect", dialect.name());
        request.record("a2a.agent.id", cx.agent_id.as_str());
        request
    });
    let span = tracing::debug_span!(
        "rpc",
        dialect = dialect.name(),
        binding = binding.name(),
        method = method.unwrap_or("-"),
        agent = %cx.agent_id,
        task = tracing::field::Empty,
        outcome = tracing::field::Empty,
        trace_id = tracing::field::Empty,
    );
    // The request's trace id on every event of the call (JSON logs show it).
    if let Some(id) = traced.as_ref().and_then(crate::telemetry::trace_id) {
        span.record("trace_id", id);
    }
    let reply = work.instrument(span.clone()).await;
    let code = reply.code();
    if let Some(request) = traced {
        match code {
            None => {
                request.record("rpc.response.status_code", "OK");
                request.record("otel.status_code", "OK")
            }
            Some(c) => {
                request.record("rpc.response.status_code", c.to_string());
                request.record("otel.status_code", "ERROR")
            }
        };
    }
    match code {
        None => span.record("outcome", "ok"),
        Some(c) => span.record("outcome", c),
    };
    tracing::debug!(parent: &span, elapsed_us = started.elapsed().as_micros() as u64, "request done");
    app.requests.record(slot, code, started.elapsed());
    reply
}

/// What a call came to, for its span and metrics: `None` for success, else the error code.
trait Outcome {
    fn code(&self) -> Option<i64>;
}

impl Outcome for Reply {
    fn code(&self) -> Option<i64> {
        match self {
            Reply::Json { code, .. } => *code,
            Reply::Stream { .. } | Reply::Events { .. } => None,
        }
    }
}

impl<T: Outcome> Outcome for Result<T, RpcError> {
    fn code(&self) -> Option<i64> {
        match self {
            Ok(done) => done.code(),
            Err(e) => Some(e.code),
        }
    }
}

/// A result a binding encoded itself (`Ok`: a success), or a reply.
impl<T> Outcome for Result<T, Reply> {
    fn code(&self) -> Option<i64> {
        match self {
            Ok(_) => None,
            Err(reply) => reply.code(),
        }
    }
}

/// How long a stream's answer waits for its first event, so that the head and the first
/// events leave in one write (a durable store publishes a task's first events together,
/// after their commit); a stream whose first event comes later gets its head when the wait
/// ends, then its events as they come.
const FIRST_EVENT_WAIT: Duration = Duration::from_millis(50);

/// The response of a whole (non-stream) reply: its JSON, status and `Retry-After`.
fn json_reply(reply: Reply) -> Response<Body> {
    match reply {
        Reply::Json {
            body,
            status,
            retry_after,
            ..
        } => {
            let mut r = json(status, body);
            if let Some(secs) = retry_after {
                r.headers_mut()
                    .insert(header::RETRY_AFTER, HeaderValue::from(secs));
            }
            r
        }
        // Only whole replies come here; a stream has its own response.
        Reply::Stream { .. } | Reply::Events { .. } => {
            json(StatusCode::INTERNAL_SERVER_ERROR, Vec::new())
        }
    }
}

async fn reply_response(app: &App, reply: Reply) -> Response<Body> {
    match reply {
        reply @ Reply::Json { .. } => json_reply(reply),
        Reply::Stream {
            id,
            mut stream,
            frames,
        } => {
            let first = std::future::poll_fn(|cx| stream.poll_ready(cx));
            let _ = tokio::time::timeout(FIRST_EVENT_WAIT, first).await;
            let body = SseBody::new(id, stream, frames, app.ping_every);
            sse_response(Body::sse(body))
        }
        Reply::Events { body } => sse_response(Body::full(body)),
    }
}

fn sse_response(body: Body) -> Response<Body> {
    let mut r = Response::new(body);
    let h = r.headers_mut();
    h.insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("text/event-stream"),
    );
    h.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-cache"));
    h.insert("x-accel-buffering", HeaderValue::from_static("no"));
    cors(h);
    r
}

/// A request body of at most `limit` bytes, within `server.body_timeout`, and the bytes
/// it holds of the body budgets ([`budget`]: keep it for as long as the body is used).
async fn read_limited(
    app: &App,
    parts: &hyper::http::request::Parts,
    body: Incoming,
    limit: u64,
) -> Result<(Bytes, budget::Held), Refusal> {
    let declared = parts
        .headers
        .get(header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<u64>().ok());
    if declared.is_some_and(|n| n > limit) {
        return Err(Refusal::TooLarge(app.max_body));
    }
    let limit = usize::try_from(limit).unwrap_or(usize::MAX);
    let connection = parts.extensions.get::<budget::BodyBudget>();
    let mut held = budget::Held::default();
    let collect = collect(body, limit, &mut held, &app.bodies, connection);
    match tokio::time::timeout(app.body_timeout, collect).await {
        Ok(Ok(collected)) => Ok((unpinned(collected), held)),
        Ok(Err(Refusal::TooLarge(_))) => Err(Refusal::TooLarge(app.max_body)),
        Ok(Err(refusal)) => Err(refusal),
        Err(_) => Err(Refusal::BodyTimeout),
    }
}

/// Reads a body of at most `limit` bytes, each piece taking its bytes from the budgets
/// before the next is read.
async fn collect(
    mut body: Incoming,
    limit: usize,
    held: &mut budget::Held,
    all: &budget::BodyBudget,
    connection: Option<&budget::BodyBudget>,
) -> Result<Bytes, Refusal> {
    let too_large = || Refusal::TooLarge(limit as u64);
    let mut first: Option<Bytes> = None;
    let mut more: Vec<u8> = Vec::new();
    let mut len = 0usize;
    while let Some(frame) = body.frame().await {
        let frame = frame.map_err(|_| Refusal::BodyUnreadable)?;
        let Ok(data) = frame.into_data() else {
            continue; // trailers
        };
        len = len.checked_add(data.len()).ok_or_else(too_large)?;
        if len > limit {
            return Err(too_large());
        }
        held.take(data.len(), all, connection)
            .await
            .ok_or_else(too_large)?;
        // One piece is kept as it came (no copy); a second starts a buffer of its own.
        match first.take() {
            None if more.is_empty() => first = Some(data),
            None => more.extend_from_slice(&data),
            Some(one) => {
                more.reserve(len);
                more.extend_from_slice(&one);
                more.extend_from_slice(&data);
            }
        }
    }
    Ok(first.unwrap_or_else(|| Bytes::from(more)))
}

/// A body of at most this many bytes is copied out of the connection's read buffer.
const UNPIN_BELOW: usize = 16 * 1024;

/// `body`, no longer sharing the connection's read buffer when it is small. hyper hands a
/// body over as slices of the buffer it read it into (8 KiB at least); kept, a slice keeps
/// the whole buffer alive until the call ends, and hyper takes a second one for its next
/// read (it reads on while the call runs, to notice the client leaving). For a call that
/// waits — a stream until its first event is durable — that was a second 8 KiB per
/// connection while it waited (docs/decisions/small-request-bodies-are-copied.md). A copy of a small
/// body costs less than that; a large one fills most of the buffer it shares anyway, and
/// one that shares nothing (a body collected from several pieces) is its own already.
fn unpinned(body: Bytes) -> Bytes {
    if body.len() <= UNPIN_BELOW && !body.is_unique() {
        Bytes::copy_from_slice(&body)
    } else {
        body
    }
}

#[cfg(test)]
mod tests {
    use super::{Bytes, UNPIN_BELOW, unpinned};

    #[test]
    fn a_small_body_lets_go_of_the_buffer_it_was_read_into() {
        // What hyper does: one read into an 8 KiB buffer, the body a slice of it.
        let mut read = bytes::BytesMut::with_capacity(8192);
        read.extend_from_slice(b"POST / HTTP/1.1\r\n\r\n{\"jsonrpc\":\"2.0\"}");
        let mut read = read.freeze();
        let body = read.split_off(19);
        assert!(!read.is_unique(), "the body shares the read buffer");
        let kept = unpinned(body);
        assert_eq!(&kept[..], b"{\"jsonrpc\":\"2.0\"}");
        assert!(kept.is_unique());
        assert!(
            read.is_unique(),
            "the read buffer is the connection's alone again"
        );
        // A body that shares nothing is not copied again.
        let ptr = kept.as_ptr();
        assert_eq!(unpinned(kept).as_ptr(), ptr);
    }

    #[test]
    fn a_large_body_is_not_copied() {
        let buffer = Bytes::from(vec![7u8; UNPIN_BELOW * 2]);
        let body = buffer.slice(1..);
        let kept = unpinned(body.clone());
        assert_eq!(kept.as_ptr(), body.as_ptr(), "the same bytes, not a copy");
        assert!(!buffer.is_unique());
    }
}
