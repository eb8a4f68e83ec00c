//! The hyper service: routes and the endpoint's checks in their documented order (the
//! response helpers are in `respond`, the body type in `body`).
//!
//! Order on the endpoints: OPTIONS (no key) → credentials (401) → agent (404) → key may use
//! agent (403) → HTTP method (405) → content type (415) → body cap (413; the body budgets
//! of `budget`; 64 KiB, else 429 unread, for a caller whose rate bucket is empty) → the A2A
//! version (official paths, -32009) → JSON-RPC (each call's rate, 429 with its id). The
//! path picks the dialect (docs/PROTOCOL.md §10.1).

use std::convert::Infallible;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use futures_util::future::join_all;
use http_body_util::BodyExt;
use hyper::body::Incoming;
use hyper::header::{self, HeaderValue};
use hyper::{Method, Request, Response, StatusCode};
use tracing::Instrument as _;

mod body;
pub(crate) mod budget;
mod card;
mod ext;
mod grpc;
mod metrics;
pub(crate) mod prometheus;
mod respond;
pub(crate) mod sse;
mod ui;

pub(crate) use body::Body;
pub(crate) use grpc::fuzz_decode as grpc_fuzz_decode;
pub(crate) use metrics::{LATENCY_BUCKETS, RequestMetrics};
pub(crate) use respond::{cors, error_response, json, method_not_allowed, preflight_official};
use respond::{not_found_path, preflight, unauthorized};
pub(crate) use ui::BUILT as UI_BUILT;

use crate::auth::{KeyStore, PeerCertificate};
use crate::limits::RateLimiter;
use crate::model::AgentId;
use crate::rpc::a2a::Version;
use crate::rpc::a2a::errors as a2a_errors;
use crate::rpc::a2a::rest::{self, RestRoute};
use crate::rpc::error::{INVALID_PARAMS, INVALID_REQUEST, METHOD_NOT_FOUND};
use crate::rpc::{self, Binding, CallContext, Dialect, Refusal, Reply, RpcError};
use crate::runtime::Runtime;
use sse::SseBody;

/// The path prefix of the per-agent endpoint.
pub(crate) const ENDPOINT_PREFIX: &str = "/api/v1/a2a/";

/// What every request handler shares.
pub(crate) struct App {
    /// The actor system.
    pub runtime: Runtime,
    /// API keys.
    pub keys: KeyStore,
    /// Request rate per principal per agent.
    pub rate: RateLimiter,
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
    pub(crate) card_signer: Option<Arc<crate::rpc::a2a::card::CardSigner>>,
    /// When the server started (the cards' `Last-Modified`).
    pub(crate) started: chrono::DateTime<chrono::Utc>,
    /// Serve the inspector at `/ui` (`[ui] enabled`).
    pub(crate) ui: bool,
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
            Route::Rpc(agent, dialect) => endpoint(&app, AgentId::new(agent), dialect, req).await,
            Route::Rest(agent, sub) => {
                let (agent, sub) = (AgentId::new(agent), sub.to_string());
                Box::pin(rest_endpoint(&app, agent, &sub, req)).await
            }
            Route::Card(agent) => card::response(&app, Some(AgentId::new(agent)), &req),
            Route::Elsewhere(agent) => not_served(&app, agent, &req),
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
    match sub {
        "" => Route::Rpc(agent, Dialect::Seed),
        "jsonrpc/v1" => Route::Rpc(agent, Dialect::A2a(Version::V10)),
        "jsonrpc/v0.3" => Route::Rpc(agent, Dialect::A2a(Version::V03)),
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
    if let Some(url) = &app.runtime.config().server.public_url {
        return url.clone();
    }
    let scheme = if app.https { "https://" } else { "http://" };
    match request_host(headers) {
        // Pushed, not formatted: this runs for every request (formatting cost ~400
        // instructions more).
        Some(h) => {
            let mut url = String::with_capacity(scheme.len() + h.len());
            url.push_str(scheme);
            url.push_str(h);
            url
        }
        None => format!("{scheme}{}", app.local_addr),
    }
}

/// The request's `Host`, when it looks like a host.
fn request_host(headers: &hyper::HeaderMap) -> Option<&str> {
    headers.get(header::HOST).and_then(rpc::plausible_host)
}

/// The address of the gRPC interface the cards announce ([`rpc::grpc_address`]).
pub(crate) fn grpc_url(app: &App, headers: &hyper::HeaderMap) -> String {
    rpc::grpc_address(
        app.runtime.config().server.public_grpc_url.as_deref(),
        headers.get(header::HOST),
        app.local_addr,
    )
}

/// What a call takes from its request's headers: `Last-Event-ID`, the public base URL, the
/// `Host` (for the gRPC interface's address, made only for a card) and the `A2A-Version`.
fn request_facts(
    app: &App,
    req: &Request<Incoming>,
) -> (Option<String>, String, Option<HeaderValue>, Option<String>) {
    let last_event_id = req
        .headers()
        .get("last-event-id")
        .map(|v| String::from_utf8_lossy(v.as_bytes()).into_owned());
    (
        last_event_id,
        base_url(app, req.headers()),
        // A copy: a clone would be a slice of the connection's read buffer, and keep it
        // (8 KiB) alive for as long as the call runs ([`read_limited`]).
        req.headers()
            .get(header::HOST)
            .and_then(|v| HeaderValue::from_bytes(v.as_bytes()).ok()),
        requested_version(req),
    )
}

/// The `A2A-Version` a request names: the header, else the query parameter.
pub(crate) fn requested_version(req: &Request<Incoming>) -> Option<String> {
    if let Some(v) = req.headers().get("a2a-version") {
        return Some(String::from_utf8_lossy(v.as_bytes()).into_owned());
    }
    req.uri().query().and_then(|q| {
        url::form_urlencoded::parse(q.as_bytes())
            .find(|(k, _)| k.eq_ignore_ascii_case("a2a-version"))
            .map(|(_, v)| v.into_owned())
    })
}

/// 404 for a path under an agent that no dialect serves, in the official format, naming
/// the JSON-RPC URLs that serve the agent.
fn not_served(app: &App, agent: &str, req: &Request<Incoming>) -> Response<Body> {
    let base = base_url(app, req.headers());
    let url = format!("{base}{ENDPOINT_PREFIX}{agent}/{}", Version::V10.path());
    let e = RpcError::new(METHOD_NOT_FOUND, "Not found")
        .with_data(serde_json::json!({
            "url": url,
            "reason": format!(
                "only JSON-RPC is served: POST to {url} (A2A 1.0), \
                 {base}{ENDPOINT_PREFIX}{agent}/{} (A2A 0.3) or {base}{ENDPOINT_PREFIX}{agent} (seed)",
                Version::V03.path()
            ),
        }))
        .with_status(StatusCode::NOT_FOUND);
    error_response(&Dialect::A2a(Version::V10).dress(e))
}

async fn endpoint(
    app: &App,
    agent_id: AgentId,
    dialect: Dialect,
    req: Request<Incoming>,
) -> Response<Body> {
    if req.method() == Method::OPTIONS {
        return match dialect {
            Dialect::Seed => preflight(),
            Dialect::A2a(_) => preflight_official("POST, OPTIONS"),
        };
    }
    let caller = match app
        .keys
        .authenticate(req.headers(), PeerCertificate::of(req.extensions()))
        .await
    {
        Ok(c) => c,
        Err(e) => return unauthorized(dialect, e),
    };
    let Some(agent) = app.runtime.agent(&agent_id).cloned() else {
        return error_response(&dialect.refusal(&Refusal::AgentNotFound(agent_id)));
    };
    if !caller.may_use(&agent_id) {
        return error_response(&dialect.refusal(&Refusal::Forbidden(agent_id)));
    }
    if req.method() != Method::POST {
        refused(app, dialect, &agent, INVALID_REQUEST);
        let mut r = error_response(&dialect.refusal(&Refusal::MethodNotAllowed));
        r.headers_mut()
            .insert(header::ALLOW, HeaderValue::from_static("POST, OPTIONS"));
        return r;
    }
    if !is_json(req.headers().get(header::CONTENT_TYPE), dialect) {
        let e = dialect.refusal(&Refusal::UnsupportedMediaType);
        refused(app, dialect, &agent, e.code);
        return error_response(&e);
    }
    let accepts_sse = req
        .headers()
        .get_all(header::ACCEPT)
        .iter()
        .any(|v| v.to_str().is_ok_and(|s| s.contains("text/event-stream")));
    // A caller over its rate gets its body read only as far as naming the requests takes
    // (`RATE_LIMITED_READ`), so that each is answered 429 with its id; a larger body is
    // refused 429 unread, `id: null`.
    let over_rate = app.rate.check(&caller, agent.index).err();
    let limit = match over_rate {
        Some(_) => RATE_LIMITED_READ.min(app.max_body),
        None => app.max_body,
    };
    let (last_event_id, base_url, host, version) = request_facts(app, &req);
    // `_held`: the body's bytes count against the budgets until the call is answered.
    let (parts, body) = req.into_parts();
    let (body, _held) = match read_limited(app, &parts, body, limit).await {
        Ok(b) => b,
        Err(refusal) => {
            let refusal = match (refusal, over_rate) {
                (Refusal::TooLarge(_), Some(retry_after)) => Refusal::RateLimited(retry_after),
                (refusal, _) => refusal,
            };
            let e = dialect.refusal(&refusal);
            refused(app, dialect, &agent, e.code);
            return error_response(&e);
        }
    };

    if let Dialect::A2a(served) = dialect
        && let Some(e) = version_refusal(served, version.as_deref(), &base_url, &agent_id)
    {
        refused(app, dialect, &agent, e.code);
        return error_response(&e);
    }
    let max_batch = app.runtime.config().server.max_batch_size;
    let decoded = match rpc::decode_as(&body, max_batch, dialect.answers_null_ids()) {
        Ok(d) => d,
        Err(e) => {
            refused(app, dialect, &agent, e.code);
            return error_response(&dialect.dress(e));
        }
    };
    let cx = CallContext {
        caller,
        agent,
        agent_id,
        accepts_sse,
        last_event_id,
        in_batch: matches!(decoded, rpc::Body::Batch(_)),
        base_url,
        host,
        local_addr: app.local_addr,
        card_signer: app.card_signer.clone(),
    };
    match decoded {
        rpc::Body::Single(call) => reply_response(app, one(app, dialect, &cx, call).await).await,
        rpc::Body::Batch(calls) => {
            // The items run concurrently, but each answer is weighed as soon as it is
            // rendered (one poll at a time): what the batch holds stays within the budget
            // plus one item's answer.
            let budget = Budget::new(app.runtime.config().server.max_batch_response_bytes);
            let replies =
                join_all(
                    calls.into_iter().map(|c| {
                        let id = match &c {
                            Ok(call) => Some(call.id.clone()),
                            Err(r) => r.id.clone(),
                        };
                        let (budget, cx) = (&budget, &cx);
                        async move {
                            budget.weigh(one(app, dialect, cx, c).await, id.as_deref(), dialect)
                        }
                    }),
                )
                .await;
            let mut out = Vec::with_capacity(replies.len() * 128 + 2);
            out.push(b'[');
            for (i, reply) in replies.into_iter().enumerate() {
                if i > 0 {
                    out.push(b',');
                }
                match reply {
                    Reply::Json { body, .. } => out.extend_from_slice(&body),
                    // Refused by dispatch inside a batch; kept total for safety.
                    Reply::Stream { id, .. } => out.extend_from_slice(&rpc::failure(
                        Some(&id),
                        &dialect.dress(RpcError::invalid_request(
                            "streaming methods cannot be used inside a batch",
                        )),
                    )),
                    Reply::Events { .. } => out.extend_from_slice(&rpc::failure(
                        None,
                        &dialect.dress(RpcError::invalid_request(
                            "streaming methods cannot be used inside a batch",
                        )),
                    )),
                }
            }
            out.push(b']');
            json(StatusCode::OK, out)
        }
    }
}

/// The HTTP+JSON binding of A2A 1.0 (docs/PROTOCOL.md §10.11): the JSON-RPC paths' checks
/// in the same order — credentials (401), agent (404), key may use agent (403), then the
/// path and HTTP method (404, 405), content type (415), body cap (413) and version — and
/// the same operations, answered bare or as a `google.rpc.Status`.
async fn rest_endpoint(
    app: &App,
    agent_id: AgentId,
    sub: &str,
    req: Request<Incoming>,
) -> Response<Body> {
    const DIALECT: Dialect = Dialect::A2a(Version::V10);
    if req.method() == Method::OPTIONS {
        return preflight_official("GET, POST, DELETE, OPTIONS");
    }
    let status = rest_error;
    let refusal = |r: &Refusal| status(&a2a_errors::refusal(Version::V10, r));
    let caller = match app
        .keys
        .authenticate(req.headers(), PeerCertificate::of(req.extensions()))
        .await
    {
        Ok(c) => c,
        Err(e) => return rest_unauthorized(e),
    };
    let Some(agent) = app.runtime.agent(&agent_id).cloned() else {
        return refusal(&Refusal::AgentNotFound(agent_id));
    };
    if !caller.may_use(&agent_id) {
        return refusal(&Refusal::Forbidden(agent_id));
    }
    if sub == ext::DELIVERIES_PATH {
        // a2ad's own read (docs/PROTOCOL.md §11.2).
        let (method, query) = (req.method(), req.uri().query());
        return ext::deliveries(app, &caller, (&agent_id, agent.index), method, query);
    }
    let call = match rest::route(req.method(), sub, agent_id.as_str()) {
        RestRoute::Call(call) => call,
        RestRoute::WrongMethod(allow) => {
            refused_by(app, DIALECT, Binding::Rest, &agent, INVALID_REQUEST);
            return rest_wrong_method(allow);
        }
        RestRoute::WrongTenant(tenant) => {
            refused_by(app, DIALECT, Binding::Rest, &agent, INVALID_PARAMS);
            crate::telemetry::refused(INVALID_PARAMS);
            return rest_response(json_reply(rest::wrong_tenant(&tenant)));
        }
        RestRoute::NotFound => {
            refused_by(app, DIALECT, Binding::Rest, &agent, METHOD_NOT_FOUND);
            crate::telemetry::refused(METHOD_NOT_FOUND);
            return rest_response(json_reply(rest::not_found(req.uri().path())));
        }
    };
    // Only POST carries a body; one that declares a type must declare JSON.
    let posts = req.method() == Method::POST;
    // Only whether it is there is kept: a copy of the value would be a slice of the
    // connection's read buffer, kept for as long as the call runs ([`unpinned`]).
    let content_type = req.headers().get(header::CONTENT_TYPE);
    let typed = content_type.is_some();
    let unsupported = |app: &App| {
        let e = a2a_errors::refusal(Version::V10, &Refusal::UnsupportedMediaType);
        refused_by(app, DIALECT, Binding::Rest, &agent, e.code);
        status(&e)
    };
    if posts && typed && !is_json(content_type, DIALECT) {
        return unsupported(app);
    }
    // Over its rate, the caller is refused before its body is read.
    if let Err(retry_after) = app.rate.check(&caller, agent.index) {
        let e = a2a_errors::refusal(Version::V10, &Refusal::RateLimited(retry_after));
        refused_by(app, DIALECT, Binding::Rest, &agent, e.code);
        return status(&e);
    }
    let accepts_sse = true;
    let (last_event_id, base_url, host, version) = request_facts(app, &req);
    let query = req.uri().query().map(str::to_owned);
    let (body, _held) = if posts {
        match read_body(app, req).await {
            Ok(b) => b,
            Err(r) => {
                let e = a2a_errors::refusal(Version::V10, &r);
                refused_by(app, DIALECT, Binding::Rest, &agent, e.code);
                return status(&e);
            }
        }
    } else {
        (Bytes::new(), budget::Held::default())
    };
    if !typed && !body.is_empty() {
        return unsupported(app);
    }
    if let Some(e) = version_refusal(Version::V10, version.as_deref(), &base_url, &agent_id) {
        refused_by(app, DIALECT, Binding::Rest, &agent, e.code);
        return status(&e);
    }
    let cx = CallContext {
        caller,
        agent,
        agent_id,
        accepts_sse,
        last_event_id,
        in_batch: false,
        base_url,
        host,
        local_addr: app.local_addr,
        card_signer: app.card_signer.clone(),
    };
    let work = async {
        match app.rate.try_acquire(&cx.caller, cx.agent.index) {
            Err(retry_after) => rest::status_reply(&a2a_errors::refusal(
                Version::V10,
                &Refusal::RateLimited(retry_after),
            )),
            Ok(()) => {
                Box::pin(rest::dispatch(
                    &app.runtime,
                    &cx,
                    &call,
                    query.as_deref(),
                    &body,
                ))
                .await
            }
        }
    };
    let reply = observed(app, DIALECT, Binding::Rest, &cx, Some(call.method()), work).await;
    rest_response(reply_response(app, reply).await)
}

/// A response of the HTTP+JSON binding: JSON as `application/a2a+json` (S10 §11.1).
fn rest_response(mut r: Response<Body>) -> Response<Body> {
    if r.headers()
        .get(header::CONTENT_TYPE)
        .is_some_and(|v| v == "application/json")
    {
        r.headers_mut().insert(
            header::CONTENT_TYPE,
            HeaderValue::from_static("application/a2a+json"),
        );
    }
    r
}

/// An error of the HTTP+JSON binding: its `google.rpc.Status` response.
fn rest_error(e: &RpcError) -> Response<Body> {
    crate::telemetry::refused(e.code);
    rest_response(json_reply(rest::status_reply(e)))
}

/// The HTTP+JSON binding's 401, with the challenge.
fn rest_unauthorized(e: crate::auth::AuthError) -> Response<Body> {
    let mut r = rest_error(&a2a_errors::refusal(
        Version::V10,
        &Refusal::Unauthorized(e.message()),
    ));
    r.headers_mut().insert(
        header::WWW_AUTHENTICATE,
        HeaderValue::from_static(respond::WWW_AUTHENTICATE),
    );
    r
}

/// The HTTP+JSON binding's 405, naming what is allowed.
fn rest_wrong_method(allow: &'static str) -> Response<Body> {
    let e = RpcError::invalid_request(&format!("HTTP method not allowed here; use {allow}"))
        .with_status(StatusCode::METHOD_NOT_ALLOWED);
    let mut r = rest_error(&a2a_errors::dress(Version::V10, e));
    r.headers_mut()
        .insert(header::ALLOW, HeaderValue::from_static(allow));
    r
}

/// The bytes a batch's answer may still take (`server.max_batch_response_bytes`).
struct Budget {
    limit: usize,
    used: std::sync::atomic::AtomicUsize,
}

impl Budget {
    fn new(limit: usize) -> Self {
        Self {
            limit,
            used: std::sync::atomic::AtomicUsize::new(0),
        }
    }

    /// Lets an item's answer through while the batch stays within its budget; past it, the
    /// item is answered -32600 with `data.limit` (its answer is dropped at once), telling
    /// the client to ask for it on its own.
    fn weigh(
        &self,
        reply: Reply,
        id: Option<&serde_json::value::RawValue>,
        dialect: Dialect,
    ) -> Reply {
        use std::sync::atomic::Ordering::Relaxed;
        let Reply::Json { body, .. } = &reply else {
            return reply;
        };
        let size = body.len();
        let fits = self
            .used
            .fetch_update(Relaxed, Relaxed, |used| {
                used.checked_add(size).filter(|total| *total <= self.limit)
            })
            .is_ok();
        if fits {
            return reply;
        }
        drop(reply);
        Reply::error(
            id,
            &dialect.dress(RpcError::new(INVALID_REQUEST, "Invalid Request").with_data(
                serde_json::json!({
                    "reason": "the batch's answer would be too large; send this request on its own",
                    "limit": self.limit,
                }),
            )),
        )
    }
}

/// Counts, rate-limits and dispatches one call.
async fn one(
    app: &App,
    dialect: Dialect,
    cx: &CallContext,
    call: Result<rpc::Call, rpc::Rejected>,
) -> Reply {
    let method = call.as_ref().ok().map(|c| c.method.as_str());
    let work = async {
        match &call {
            Err(r) => Reply::error(r.id.as_deref(), &dialect.dress(r.error.clone())),
            Ok(call) => match app.rate.try_acquire(&cx.caller, cx.agent.index) {
                Err(retry_after) => Reply::error(
                    Some(&call.id),
                    &dialect.refusal(&Refusal::RateLimited(retry_after)),
                ),
                // Boxed: the operations' futures are large (~12 KB); inline they would make
                // every request's future that large, copied each time it moves.
                Ok(()) => Box::pin(dialect.dispatch(&app.runtime, cx, call)).await,
            },
        }
    };
    observed(app, dialect, Binding::JsonRpc, cx, method, work).await
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
    );
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

/// Counts a request refused before JSON-RPC decoding (405, 413, 415, parse error).
fn refused(app: &App, dialect: Dialect, agent: &crate::actors::AgentEntry, code: i64) {
    refused_by(app, dialect, Binding::JsonRpc, agent, code);
}

fn refused_by(
    app: &App,
    dialect: Dialect,
    binding: Binding,
    agent: &crate::actors::AgentEntry,
    code: i64,
) {
    agent.metrics.requests(1);
    app.requests.record(
        app.requests.slot(dialect, binding, None),
        Some(code),
        Duration::ZERO,
    );
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

/// -32009 when the request names a version this URL does not serve (docs/PROTOCOL.md §10.1): on
/// the 1.0 path an absent or empty value means 0.3 and is refused too.
fn version_refusal(
    served: Version,
    requested: Option<&str>,
    base_url: &str,
    agent: &AgentId,
) -> Option<RpcError> {
    let named = Version::of_header(requested);
    if named == Some(served) {
        return None;
    }
    let requested = requested.map(str::trim).unwrap_or("");
    let mut data = serde_json::json!({
        "requested": if requested.is_empty() { "0.3 (no A2A-Version)" } else { requested },
        "supportedVersions": served.number(),
        "reason": format!(
            "this URL serves A2A {0}; send the header A2A-Version: {0}",
            served.number()
        ),
    });
    if let Some(other) = named {
        data["url"] = serde_json::json!(format!(
            "{base_url}{ENDPOINT_PREFIX}{agent}/{}",
            other.path()
        ));
    }
    let e =
        RpcError::new(a2a_errors::VERSION_NOT_SUPPORTED, "Version not supported").with_data(data);
    Some(Dialect::A2a(served).dress(e))
}

/// How much of a body is read from a caller whose rate bucket is empty: enough to name the
/// requests of any ordinary call or batch, so that each gets its 429 with its id.
const RATE_LIMITED_READ: u64 = 64 * 1024;

async fn read_body(app: &App, req: Request<Incoming>) -> Result<(Bytes, budget::Held), Refusal> {
    let (parts, body) = req.into_parts();
    read_limited(app, &parts, body, app.max_body).await
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
/// connection while it waited (docs/PERFORMANCE.md, sixteenth slice). A copy of a small
/// body costs less than that; a large one fills most of the buffer it shares anyway, and
/// one that shares nothing (a body collected from several pieces) is its own already.
fn unpinned(body: Bytes) -> Bytes {
    if body.len() <= UNPIN_BELOW && !body.is_unique() {
        Bytes::copy_from_slice(&body)
    } else {
        body
    }
}

/// Whether a `Content-Type` is JSON: `application/json`, and on the official paths also
/// `application/a2a+json` (S10 §4.3.3).
fn is_json(value: Option<&HeaderValue>, dialect: Dialect) -> bool {
    let Some(v) = value.and_then(|v| v.to_str().ok()) else {
        return false;
    };
    let essence = v.split(';').next().unwrap_or("").trim();
    essence.eq_ignore_ascii_case("application/json")
        || (matches!(dialect, Dialect::A2a(_))
            && essence.eq_ignore_ascii_case("application/a2a+json"))
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
