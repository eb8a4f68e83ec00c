//! JSON-RPC 2.0 framing — decoding single and batch requests (recovering the `id` of a
//! malformed request where it can be read), encoding responses — and the dialects.
//!
//! Each wire dialect is one folder (`rpc/seed/`, ...) owning its method table, params
//! parsing, rendering (results, SSE frames, webhook payloads) and error codes; [`Dialect`]
//! is the one place that picks among them. Params stay raw JSON until the method is
//! known; the dialect parses them. Nothing outside `http` and `rpc` imports a dialect.

use serde::Serialize;
use serde::ser::{SerializeMap, Serializer};
use serde_json::value::RawValue;

pub(crate) mod a2a;
pub(crate) mod error;
pub(crate) mod json;
pub(crate) mod seed;

use std::sync::Arc;

use bytes::Bytes;

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
        }
    }
}

/// The webhook payload renderers of every dialect, by format name.
pub(crate) fn payload_renderers()
-> std::collections::HashMap<String, Arc<dyn crate::webhook::PayloadRenderer>> {
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
    /// The public base URL (`server.public_url`, else `http://` + `Host`), no trailing `/`.
    pub(crate) base_url: String,
}

impl CallContext {
    /// The URL of this agent's endpoint in a dialect.
    pub(crate) fn url(&self, dialect: Dialect) -> String {
        match dialect.path() {
            "" => format!("{}/api/v1/a2a/{}", self.base_url, self.agent_id),
            path => format!("{}/api/v1/a2a/{}/{path}", self.base_url, self.agent_id),
        }
    }

    /// Names the call's task in the request's span (for following it through the logs).
    pub(crate) fn task(&self, task: &TaskId) {
        tracing::Span::current().record("task", task.as_str());
    }
}

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

/// One decoded request.
#[derive(Debug)]
pub(crate) struct Call {
    /// The request id, exactly as sent (a string or a number), echoed unchanged.
    pub id: Box<RawValue>,
    /// The method name.
    pub method: String,
    /// Raw params, if present.
    pub params: Option<Box<RawValue>>,
}

/// A request that could not be decoded, with the id when it could be read.
#[derive(Debug)]
pub(crate) struct Rejected {
    /// The id, when readable.
    pub id: Option<Box<RawValue>>,
    /// Why.
    pub error: RpcError,
}

/// A decoded body.
#[derive(Debug)]
pub(crate) enum Body {
    /// One request (or its rejection).
    Single(Result<Call, Rejected>),
    /// A batch, in order; never empty.
    Batch(Vec<Result<Call, Rejected>>),
}

#[derive(serde::Deserialize)]
struct Envelope<'a> {
    #[serde(borrow)]
    jsonrpc: Option<&'a RawValue>,
    #[serde(borrow)]
    id: Option<&'a RawValue>,
    #[serde(borrow)]
    method: Option<&'a RawValue>,
    #[serde(borrow)]
    params: Option<&'a RawValue>,
}

/// Decodes a request body in one pass over it, with the default batch cap.
///
/// # Errors
/// As [`decode_with`].
pub(crate) fn decode(body: &[u8]) -> Result<Body, RpcError> {
    decode_with(body, crate::config::ServerConfig::DEFAULT_MAX_BATCH_SIZE)
}

/// Decodes a request body in one pass over it. A batch of more than `max_batch` requests
/// is refused as soon as the parser reaches the one past the cap.
///
/// # Errors
/// -32700 when the body is not JSON; -32600 for an empty or oversized batch or a
/// non-object body.
pub(crate) fn decode_with(body: &[u8], max_batch: usize) -> Result<Body, RpcError> {
    decode_as(body, max_batch, false)
}

/// [`decode_with`], where `null_ids` says whether a request without an `id` (or with
/// `"id": null`) is a call answered with `"id": null` instead of a refusal.
///
/// # Errors
/// As [`decode_with`].
pub(crate) fn decode_as(body: &[u8], max_batch: usize, null_ids: bool) -> Result<Body, RpcError> {
    use serde_json::error::Category;
    let parse_error = |e: serde_json::Error| {
        RpcError::parse_error(format!(
            "invalid JSON at line {}, column {}",
            e.line(),
            e.column()
        ))
    };
    match body.iter().find(|b| !b.is_ascii_whitespace()) {
        Some(b'{') => match serde_json::from_slice::<Envelope<'_>>(body) {
            Ok(env) => Ok(Body::Single(decode_envelope(env, null_ids))),
            Err(e)
                if matches!(
                    e.classify(),
                    Category::Syntax | Category::Eof | Category::Io
                ) =>
            {
                Err(parse_error(e))
            }
            // Valid JSON of the wrong shape (e.g. a duplicate member).
            Err(_) => Ok(Body::Single(Err(Rejected {
                id: None,
                error: RpcError::invalid_request("malformed request object (duplicate member?)"),
            }))),
        },
        Some(b'[') => {
            let text = std::str::from_utf8(body).map_err(|e| {
                RpcError::parse_error(format!(
                    "the body is not UTF-8 (at byte {})",
                    e.valid_up_to()
                ))
            })?;
            let items = json::seq(text, max_batch).map_err(|e| match e {
                json::SeqError::TooMany => RpcError::invalid_request(&format!(
                    "a batch may hold at most {max_batch} requests"
                )),
                json::SeqError::Json(e) => parse_error(e),
            })?;
            if items.is_empty() {
                return Err(RpcError::invalid_request("empty batch"));
            }
            Ok(Body::Batch(
                items
                    .into_iter()
                    .map(|raw| decode_one(raw, null_ids))
                    .collect(),
            ))
        }
        _ => {
            serde_json::from_slice::<serde::de::IgnoredAny>(body).map_err(parse_error)?;
            Ok(Body::Single(Err(Rejected {
                id: None,
                error: RpcError::invalid_request("a request must be a JSON object"),
            })))
        }
    }
}

fn decode_one(raw: &RawValue, null_ids: bool) -> Result<Call, Rejected> {
    let reject = |id: Option<&RawValue>, reason: &str| Rejected {
        id: id.map(RawValue::to_owned),
        error: RpcError::invalid_request(reason),
    };
    if !raw.get().starts_with('{') {
        return Err(reject(None, "a request must be a JSON object"));
    }
    let env: Envelope<'_> = serde_json::from_str(raw.get())
        .map_err(|_| reject(None, "malformed request object (duplicate member?)"))?;
    decode_envelope(env, null_ids)
}

fn decode_envelope(env: Envelope<'_>, null_ids: bool) -> Result<Call, Rejected> {
    let reject = |id: Option<&RawValue>, reason: &str| Rejected {
        id: id.map(RawValue::to_owned),
        error: RpcError::invalid_request(reason),
    };
    let null = null_id();
    let id = match env.id {
        Some(id) if is_valid_id(id) => id,
        None if null_ids => &*null,
        Some(id) if null_ids && id.get() == "null" => &*null,
        Some(_) if null_ids => {
            return Err(reject(None, "`id` must be a string, a number or null"));
        }
        Some(_) => return Err(reject(None, "`id` must be a string or a number")),
        None => return Err(reject(None, "`id` is required")),
    };
    match env.jsonrpc.map(|v| serde_json::from_str::<&str>(v.get())) {
        Some(Ok("2.0")) => {}
        _ => return Err(reject(Some(id), "`jsonrpc` must be \"2.0\"")),
    }
    let method = match env.method.map(|m| serde_json::from_str::<String>(m.get())) {
        Some(Ok(m)) => m,
        Some(Err(_)) => return Err(reject(Some(id), "`method` must be a string")),
        None => return Err(reject(Some(id), "`method` is required")),
    };
    Ok(Call {
        id: id.to_owned(),
        method,
        params: env.params.map(RawValue::to_owned),
    })
}

fn is_valid_id(id: &RawValue) -> bool {
    matches!(id.get().as_bytes().first(), Some(b'"' | b'-' | b'0'..=b'9'))
}

/// The `null` id of responses to unreadable requests.
pub(crate) fn null_id() -> Box<RawValue> {
    RawValue::from_string("null".to_string()).expect("null is valid JSON")
}

/// Encodes a success response.
pub(crate) fn success<T: Serialize + ?Sized>(id: &RawValue, result: &T) -> Vec<u8> {
    let mut out = Vec::with_capacity(256);
    let mut ser = serde_json::Serializer::new(&mut out);
    let encoded = (|| {
        let mut map = ser.serialize_map(Some(3))?;
        map.serialize_entry("jsonrpc", "2.0")?;
        map.serialize_entry("id", id)?;
        map.serialize_entry("result", result)?;
        map.end()
    })();
    match encoded {
        Ok(()) => out,
        Err(e) => {
            tracing::error!(error = %e, "response serialization failed");
            failure(Some(id), &RpcError::internal())
        }
    }
}

/// Encodes an error response.
pub(crate) fn failure(id: Option<&RawValue>, error: &RpcError) -> Vec<u8> {
    let null = null_id();
    let id = id.unwrap_or(&null);
    let mut out = Vec::with_capacity(160);
    let mut ser = serde_json::Serializer::new(&mut out);
    let encoded = (|| {
        let mut map = ser.serialize_map(Some(3))?;
        map.serialize_entry("jsonrpc", "2.0")?;
        map.serialize_entry("id", id)?;
        map.serialize_entry("error", error)?;
        map.end()
    })();
    if encoded.is_err() {
        // Cannot happen for these types; never send a half-written body.
        return br#"{"jsonrpc":"2.0","id":null,"error":{"code":-32603,"message":"Internal error"}}"#
            .to_vec();
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn single(body: &str) -> Result<Call, Rejected> {
        match decode(body.as_bytes()).expect("decodes") {
            Body::Single(r) => r,
            Body::Batch(_) => panic!("not a batch"),
        }
    }

    #[test]
    fn a_valid_request_keeps_its_id_text_unchanged() {
        let c =
            single(r#"{"jsonrpc":"2.0","id":1.50,"method":"tasks/get","params":{"taskId":"x"}}"#)
                .expect("valid");
        assert_eq!(c.id.get(), "1.50");
        assert_eq!(c.method, "tasks/get");
        assert_eq!(c.params.expect("params").get(), r#"{"taskId":"x"}"#);
    }

    #[test]
    fn invalid_json_is_a_parse_error() {
        assert_eq!(decode(b"{nope").unwrap_err().code, error::PARSE_ERROR);
        assert_eq!(decode(b"").unwrap_err().code, error::PARSE_ERROR);
        assert_eq!(decode(b"\xff\xfe").unwrap_err().code, error::PARSE_ERROR);
    }

    #[test]
    fn invalid_requests_echo_the_id_when_readable() {
        let r = single(r#"{"jsonrpc":"1.0","id":"a","method":"m"}"#).unwrap_err();
        assert_eq!(r.error.code, error::INVALID_REQUEST);
        assert_eq!(r.id.expect("id").get(), r#""a""#);
        let r = single(r#"{"jsonrpc":"2.0","id":7,"method":5}"#).unwrap_err();
        assert_eq!(r.id.expect("id").get(), "7");
        let r = single(r#"{"jsonrpc":"2.0","method":"m"}"#).unwrap_err();
        assert!(r.id.is_none());
        let r = single(r#"{"jsonrpc":"2.0","id":null,"method":"m"}"#).unwrap_err();
        assert!(r.id.is_none());
        let r = single(r#"{"jsonrpc":"2.0","id":{"a":1},"method":"m"}"#).unwrap_err();
        assert!(r.id.is_none());
        let r = single("42").unwrap_err();
        assert_eq!(r.error.code, error::INVALID_REQUEST);
    }

    #[test]
    fn batches_keep_order_and_an_empty_batch_is_invalid() {
        match decode(br#"[{"jsonrpc":"2.0","id":1,"method":"a"}, 3]"#).expect("ok") {
            Body::Batch(items) => {
                assert_eq!(items.len(), 2);
                assert!(items[0].is_ok() && items[1].is_err());
            }
            Body::Single(_) => panic!("batch expected"),
        }
        assert_eq!(decode(b" [ ] ").unwrap_err().code, error::INVALID_REQUEST);
    }

    #[test]
    fn responses_are_full_envelopes() {
        let id = RawValue::from_string("\"x\"".into()).expect("json");
        let ok: serde_json::Value =
            serde_json::from_slice(&success(&id, &serde_json::json!({"a": 1}))).expect("json");
        assert_eq!(
            ok,
            serde_json::json!({"jsonrpc":"2.0","id":"x","result":{"a":1}})
        );
        let err: serde_json::Value =
            serde_json::from_slice(&failure(None, &RpcError::method_not_found("m"))).expect("json");
        assert_eq!(err["id"], serde_json::Value::Null);
        assert_eq!(err["error"]["code"], -32601);
    }
}
