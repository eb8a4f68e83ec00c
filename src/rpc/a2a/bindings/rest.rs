//! The HTTP+JSON binding of A2A 1.0 (docs/PROTOCOL.md §10.11; S10 §11): the same operations
//! as `/jsonrpc/v1` ([`ops::TABLE`]), framed as REST. The path and HTTP method name the
//! operation; path segments, query parameters and the body become the operation's params in
//! the shape the JSON-RPC binding reads, so both bindings decode, run and render through the
//! same code and differ only in the envelope: the result object itself on success, a
//! `google.rpc.Status` with the HTTP status of S10 §5.4 on failure.
//!
//! Auth, agent lookup, body framing and the version check happened before (in `http`).

use std::convert::Infallible;

use hyper::{Method, StatusCode};
use serde_json::value::RawValue;
use serde_json::{Map, Value, json};

use super::jsonrpc::{self, Framing, PageAsk};
use crate::error::Error;
use crate::rpc::a2a::Version;
use crate::rpc::a2a::errors;
use crate::rpc::a2a::ops::{self, Op, OpRequest, OpResponse, TABLE};
use crate::rpc::error::METHOD_NOT_FOUND;
use crate::rpc::json;
use crate::rpc::{CallContext, Reply, RpcError};
use crate::runtime::Runtime;

/// One operation named by a path and an HTTP method, with the fields its path carries.
#[derive(Debug, PartialEq, Eq)]
pub(crate) struct RestCall {
    pub(crate) op: Op,
    /// The `{field}` segments of its route, by the name the params give them.
    fields: Vec<(&'static str, String)>,
}

impl RestCall {
    /// Its operation's 1.0 method name (its metric label).
    pub(crate) fn method(&self) -> &'static str {
        self.op.name()
    }
}

/// What a path under `{agent}/rest` names.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum RestRoute {
    /// An operation.
    Call(RestCall),
    /// A resource of the binding, asked with another HTTP method: the methods it takes.
    WrongMethod(&'static str),
    /// A resource under a `{tenant}` prefix that is not this agent's id.
    WrongTenant(String),
    /// Nothing of the binding.
    NotFound,
}

/// One segment of a route's pattern.
enum Seg {
    /// Itself.
    Literal(&'static str),
    /// A field of the request: a non-empty value, then `suffix` (`{id}:cancel`).
    Field {
        name: &'static str,
        suffix: &'static str,
    },
}

/// A route's pattern, split into its segments once.
struct Pattern {
    text: &'static str,
    segs: Vec<Seg>,
}

impl Pattern {
    fn new(text: &'static str) -> Self {
        let segs = text
            .split('/')
            .map(|part| match part.strip_prefix('{') {
                None => Seg::Literal(part),
                Some(field) => {
                    let (name, suffix) = field.split_once('}').unwrap_or((field, ""));
                    Seg::Field { name, suffix }
                }
            })
            .collect();
        Self { text, segs }
    }

    /// The characters it writes itself: of two patterns a path has, the one that says more
    /// names it (`tasks/{id}:cancel` before `tasks/{id}`).
    fn literal_len(&self) -> usize {
        self.segs
            .iter()
            .map(|s| match s {
                Seg::Literal(l) => l.len(),
                Seg::Field { suffix, .. } => suffix.len(),
            })
            .sum()
    }

    /// Whether `segments` have this shape: `None` if not; `Some(false)` if a field's suffix
    /// is there with nothing before it (no route matches such a path); `Some(true)` if so.
    fn matches(&self, segments: &[String]) -> Option<bool> {
        if self.segs.len() != segments.len() {
            return None;
        }
        for (seg, value) in self.segs.iter().zip(segments) {
            match seg {
                Seg::Literal(l) if l == value => {}
                Seg::Literal(_) => return None,
                Seg::Field { suffix, .. } => match value.strip_suffix(suffix) {
                    None => return None,
                    Some("") => return Some(false),
                    Some(_) => {}
                },
            }
        }
        Some(true)
    }

    /// The fields of `segments`, which have this shape.
    fn fields(&self, segments: &[String]) -> Vec<(&'static str, String)> {
        self.segs
            .iter()
            .zip(segments)
            .filter_map(|(seg, value)| match seg {
                Seg::Literal(_) => None,
                Seg::Field { name, suffix } => {
                    let v = value.strip_suffix(suffix).unwrap_or(value);
                    Some((*name, v.to_string()))
                }
            })
            .collect()
    }
}

/// The route `segments` have (the most literal pattern of the operation table that they
/// match) and its fields.
fn shape(segments: &[String]) -> Option<(&'static str, Vec<(&'static str, String)>)> {
    static PATTERNS: std::sync::LazyLock<Vec<Pattern>> = std::sync::LazyLock::new(|| {
        let mut texts: Vec<&'static str> = TABLE.iter().map(|n| n.rest.1).collect();
        texts.dedup();
        let mut patterns: Vec<Pattern> = texts.into_iter().map(Pattern::new).collect();
        patterns.sort_by_key(|p| std::cmp::Reverse(p.literal_len()));
        patterns.dedup_by(|a, b| a.text == b.text);
        patterns
    });
    for p in PATTERNS.iter() {
        match p.matches(segments) {
            None => continue,
            Some(false) => return None,
            Some(true) => return Some((p.text, p.fields(segments))),
        }
    }
    None
}

/// The `Allow` value of a route: the HTTP methods of the operations on its pattern.
fn allow(pattern: &str) -> &'static str {
    let on = |m: Method| {
        TABLE
            .iter()
            .any(|n| n.rest.1 == pattern && n.rest.0.contains(&m))
    };
    match (on(Method::GET), on(Method::POST), on(Method::DELETE)) {
        (true, true, _) => "GET, POST, OPTIONS",
        (true, false, true) => "GET, DELETE, OPTIONS",
        (true, false, false) => "GET, OPTIONS",
        (false, true, _) => "POST, OPTIONS",
        (false, false, _) => "DELETE, OPTIONS",
    }
}

/// The route of `sub` (the path after `{agent}/rest`, a trailing `/` already removed) for
/// an HTTP method, on the agent `agent`, from the operation table's HTTP+JSON routes. Each
/// path is served bare and under a `/{tenant}` prefix equal to the agent's id (the proto's
/// `additional_bindings`).
pub(crate) fn route(method: &Method, sub: &str, agent: &str) -> RestRoute {
    let segments: Vec<String> = sub
        .trim_start_matches('/')
        .split('/')
        .map(|s| {
            percent_encoding::percent_decode_str(s)
                .decode_utf8_lossy()
                .into_owned()
        })
        .collect();
    let (pattern, fields) = match shape(&segments) {
        Some(s) => s,
        None => match segments.split_first() {
            Some((tenant, rest)) if !rest.is_empty() => match shape(rest) {
                Some(s) if tenant == agent => s,
                Some(_) => return RestRoute::WrongTenant(tenant.clone()),
                None => return RestRoute::NotFound,
            },
            _ => return RestRoute::NotFound,
        },
    };
    match TABLE
        .iter()
        .find(|n| n.rest.1 == pattern && n.rest.0.contains(method))
    {
        Some(n) => RestRoute::Call(RestCall { op: n.op, fields }),
        None => RestRoute::WrongMethod(allow(pattern)),
    }
}

/// The params of a call in the shape the JSON-RPC binding reads: the body (an object, or
/// nothing), the query parameters of a GET (strings, `true`/`false` as booleans), and the
/// ids of the path over both.
fn params<'a>(
    call: &RestCall,
    query: Option<&str>,
    body: &'a [u8],
) -> Result<Params<'a>, RpcError> {
    let body_text = std::str::from_utf8(body)
        .map_err(|_| RpcError::parse_error("the body is not UTF-8".into()))?;
    let sends = matches!(call.op, Op::SendMessage | Op::SendStreamingMessage);
    if sends && !body_text.trim().is_empty() {
        // The body is the whole request: read in place.
        return serde_json::from_str::<&RawValue>(body_text)
            .map(Params::Body)
            .map_err(|e| RpcError::parse_error(e.to_string()));
    }
    let mut p: Map<String, Value> = if body_text.trim().is_empty() {
        Map::new()
    } else {
        match serde_json::from_str::<Value>(body_text) {
            Ok(Value::Object(m)) => m,
            Ok(_) => return Err(RpcError::invalid_request("the body must be a JSON object")),
            Err(e) => return Err(RpcError::parse_error(e.to_string())),
        }
    };
    if let Some(q) = query {
        for (k, v) in url::form_urlencoded::parse(q.as_bytes()) {
            if k.eq_ignore_ascii_case("a2a-version") {
                continue;
            }
            let value = match v.as_ref() {
                "true" => Value::Bool(true),
                "false" => Value::Bool(false),
                _ => Value::String(v.into_owned()),
            };
            // A repeated parameter keeps its first value.
            p.entry(k.into_owned()).or_insert(value);
        }
    }
    for (name, value) in &call.fields {
        p.insert((*name).into(), Value::String(value.clone()));
    }
    serde_json::value::to_raw_value(&p)
        .map(Params::Built)
        .map_err(|_| RpcError::internal())
}

/// A call's params: its body as it came, or built from the path, query and body.
enum Params<'a> {
    Body(&'a RawValue),
    Built(Box<RawValue>),
}

impl Params<'_> {
    fn raw(&self) -> &RawValue {
        match self {
            Self::Body(raw) => raw,
            Self::Built(raw) => raw,
        }
    }
}

/// Runs one call: its params decoded as the JSON-RPC binding decodes them, the operation,
/// its result rendered bare, every failure a `google.rpc.Status`.
pub(crate) async fn dispatch(
    runtime: &Runtime,
    cx: &CallContext,
    call: &RestCall,
    query: Option<&str>,
    body: &[u8],
) -> Reply {
    let raw = match params(call, query, body) {
        Ok(raw) => raw,
        Err(e) => return status_reply(&errors::dress(Version::V10, e)),
    };
    match execute_json(runtime, cx, call.op, raw.raw()).await {
        Ok(reply) => reply,
        Err(e) => status_reply(&e),
    }
}

/// Runs an operation on params in the JSON-RPC binding's shape, its result framed bare
/// (the result object; stream events as `StreamResponse`s); a failure is the 1.0 error
/// (`data` its `ErrorInfo` array) for the binding to frame.
pub(crate) async fn execute_json(
    runtime: &Runtime,
    cx: &CallContext,
    op: Op,
    raw: &RawValue,
) -> Result<Reply, RpcError> {
    match execute_with(runtime, cx, op, raw, Err::<Infallible, _>).await? {
        Ok(never) => match never {},
        Err(reply) => Ok(reply),
    }
}

/// [`execute_json`] for a binding that encodes some results itself: `direct` takes the
/// operation's result and gives the binding's form (`Ok`) or gives the result back, to be
/// framed bare (`Err`). The gRPC binding builds its messages for sends and streams this way.
pub(crate) async fn execute_with<T>(
    runtime: &Runtime,
    cx: &CallContext,
    op: Op,
    raw: &RawValue,
    direct: impl FnOnce(OpResponse) -> Result<T, OpResponse>,
) -> Result<Result<T, Reply>, RpcError> {
    let run = async {
        let p = json::params(Some(raw.into()))?;
        op.admit(cx)?;
        let request = jsonrpc::decode(op, Version::V10, cx, &p)?;
        finish(runtime, cx, op, request, PageAsk::Params(&p), direct).await
    };
    run.await
        .map_err(|e: Error| errors::rpc_error(Version::V10, &e))
}

/// The rest of a 1.0 call once its request is decoded, on any binding: the operation runs,
/// and its result is given to `direct` or else framed bare.
pub(crate) async fn finish<T>(
    runtime: &Runtime,
    cx: &CallContext,
    op: Op,
    request: OpRequest,
    page: PageAsk<'_>,
    direct: impl FnOnce(OpResponse) -> Result<T, OpResponse>,
) -> Result<Result<T, Reply>, Error> {
    match direct(ops::execute(runtime, cx, Version::V10, request).await?) {
        Ok(done) => Ok(Ok(done)),
        Err(response) => {
            jsonrpc::encode(op, Version::V10, runtime, cx, Framing::Bare, page, response).map(Err)
        }
    }
}

/// The `google.rpc.Status` body (S10 §11.6) and HTTP status of a 1.0 error (`e.data` the
/// `ErrorInfo` array [`errors::dress`] made); its JSON-RPC code stays the metrics' outcome.
pub(crate) fn status_reply(e: &RpcError) -> Reply {
    let (status, code) = errors::statuses(e);
    let name = errors::code_name(code);
    let mut details = match &e.data {
        Some(Value::Array(a)) => a.clone(),
        _ => Vec::new(),
    };
    if let Some(secs) = e.retry_after {
        details.push(json!({
            "@type": "type.googleapis.com/google.rpc.RetryInfo",
            "retryDelay": format!("{secs}s"),
        }));
    }
    let body = json!({
        "error": {
            "code": status.as_u16(),
            "status": name,
            "message": e.message,
            "details": details,
        }
    });
    Reply::Json {
        body: crate::rpc::out::to_vec(&body).unwrap_or_default(),
        code: Some(e.code),
        status,
        retry_after: e.retry_after,
    }
}

/// 404 for a path under `{agent}/rest` that names nothing of the binding, listing what does.
pub(crate) fn not_found(path: &str) -> Reply {
    let e = RpcError::new(METHOD_NOT_FOUND, "Not found")
        .with_data(json!({
            "path": path,
            "reason": "not a path of the HTTP+JSON binding: message:send, message:stream, \
                       tasks, tasks/{id}, tasks/{id}:cancel, tasks/{id}:subscribe, \
                       tasks/{id}/pushNotificationConfigs[/{configId}], extendedAgentCard",
        }))
        .with_status(StatusCode::NOT_FOUND);
    status_reply(&errors::dress(Version::V10, e))
}

/// 400 for a `{tenant}` prefix that is not the agent's id.
pub(crate) fn wrong_tenant(tenant: &str) -> Reply {
    status_reply(&errors::rpc_error(
        Version::V10,
        &Error::invalid(
            "tenant",
            format!("{tenant} is not this agent; the tenant of a path is the agent's id"),
        ),
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn call(op: Op, task: Option<&str>, config: Option<&str>) -> RestRoute {
        let task_field = match op {
            Op::GetTask | Op::CancelTask | Op::SubscribeToTask => "id",
            _ => "taskId",
        };
        let mut fields = Vec::new();
        fields.extend(task.map(|t| (task_field, t.to_string())));
        fields.extend(config.map(|c| ("id", c.to_string())));
        RestRoute::Call(RestCall { op, fields })
    }

    #[test]
    fn paths_and_methods_name_the_operations_bare_and_under_the_agents_tenant() {
        let r = |m: Method, p: &str| route(&m, p, "echo");
        assert_eq!(
            r(Method::POST, "/message:send"),
            call(Op::SendMessage, None, None)
        );
        assert_eq!(
            r(Method::POST, "/echo/message:stream"),
            call(Op::SendStreamingMessage, None, None)
        );
        assert_eq!(r(Method::GET, "/tasks"), call(Op::ListTasks, None, None));
        assert_eq!(
            r(Method::GET, "/tasks/t1"),
            call(Op::GetTask, Some("t1"), None)
        );
        assert_eq!(
            r(Method::POST, "/tasks/t1:cancel"),
            call(Op::CancelTask, Some("t1"), None)
        );
        for m in [Method::GET, Method::POST] {
            assert_eq!(
                r(m, "/tasks/t%201:subscribe"),
                call(Op::SubscribeToTask, Some("t 1"), None),
                "percent-decoded"
            );
        }
        assert_eq!(
            r(Method::POST, "/tasks/t1/pushNotificationConfigs"),
            call(Op::CreatePushConfig, Some("t1"), None)
        );
        assert_eq!(
            r(Method::GET, "/echo/tasks/t1/pushNotificationConfigs"),
            call(Op::ListPushConfigs, Some("t1"), None)
        );
        assert_eq!(
            r(Method::DELETE, "/tasks/t1/pushNotificationConfigs/c1"),
            call(Op::DeletePushConfig, Some("t1"), Some("c1"))
        );
        assert_eq!(
            r(Method::GET, "/extendedAgentCard"),
            call(Op::GetExtendedCard, None, None)
        );
        assert_eq!(
            r(Method::GET, "/message:send"),
            RestRoute::WrongMethod("POST, OPTIONS")
        );
        assert_eq!(
            r(Method::PUT, "/tasks/t1/pushNotificationConfigs/c1"),
            RestRoute::WrongMethod("GET, DELETE, OPTIONS")
        );
        assert_eq!(
            r(Method::GET, "/other/tasks"),
            RestRoute::WrongTenant("other".into())
        );
        for p in [
            "",
            "/",
            "/tasks/:cancel",
            "/nothing",
            "/a/b/c",
            "/tasks/t1/x",
        ] {
            assert_eq!(r(Method::GET, p), RestRoute::NotFound, "{p}");
        }
    }

    #[test]
    fn path_ids_override_the_body_and_queries_become_params() {
        let c = RestCall {
            op: Op::CancelTask,
            fields: vec![("id", "t1".into())],
        };
        let p = params(&c, None, br#"{"id":"other","metadata":{"reason":"r"}}"#).expect("ok");
        let v: Value = serde_json::from_str(p.raw().get()).expect("json");
        assert_eq!(v, json!({"id": "t1", "metadata": {"reason": "r"}}));
        let list = RestCall {
            op: Op::ListTasks,
            fields: Vec::new(),
        };
        let p = params(
            &list,
            Some("pageSize=2&includeArtifacts=true&A2A-Version=1.0"),
            b"",
        )
        .expect("ok");
        let v: Value = serde_json::from_str(p.raw().get()).expect("json");
        assert_eq!(v, json!({"pageSize": "2", "includeArtifacts": true}));
        assert!(params(&c, None, b"[1]").is_err(), "not an object");
        assert!(params(&c, None, b"{").is_err(), "not JSON");
    }

    #[test]
    fn errors_are_google_rpc_statuses_with_the_http_status_of_the_specification() {
        for (e, status, name, reason) in [
            (
                Error::TaskNotFound {
                    task: crate::model::TaskId::new("t"),
                },
                404,
                "NOT_FOUND",
                "TASK_NOT_FOUND",
            ),
            (
                Error::TaskCanceled {
                    task: crate::model::TaskId::new("t"),
                },
                400,
                "FAILED_PRECONDITION",
                "TASK_NOT_CANCELABLE",
            ),
            (
                Error::PushNotSupported,
                400,
                "FAILED_PRECONDITION",
                "PUSH_NOTIFICATION_NOT_SUPPORTED",
            ),
            (
                Error::invalid("message", "is required"),
                400,
                "INVALID_ARGUMENT",
                "INVALID_PARAMS",
            ),
            (
                Error::TooManyTasks,
                429,
                "RESOURCE_EXHAUSTED",
                "TOO_MANY_TASKS",
            ),
            (Error::Internal, 500, "INTERNAL", "INTERNAL_ERROR"),
        ] {
            let Reply::Json {
                body, status: s, ..
            } = status_reply(&errors::rpc_error(Version::V10, &e))
            else {
                panic!("json");
            };
            let v: Value = serde_json::from_slice(&body).expect("json");
            assert_eq!(s.as_u16(), status, "{e}");
            assert_eq!(v["error"]["code"], status);
            assert_eq!(v["error"]["status"], name);
            assert_eq!(v["error"]["details"][0]["reason"], reason);
            assert_eq!(v["error"]["details"][0]["domain"], "a2a-protocol.org");
        }
    }
}
