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

use super::Version;
use super::dispatch::{self, Framing};
use super::errors::{
    self, AGENT_NOT_FOUND, CONTENT_TYPE_NOT_SUPPORTED, PUSH_NOT_SUPPORTED, RATE_LIMITED,
    TASK_NOT_CANCELABLE, TASK_NOT_FOUND, UNAUTHENTICATED, UNAUTHORIZED, UNSUPPORTED_OPERATION,
    VERSION_NOT_SUPPORTED,
};
use super::ops::{self, Op, OpRequest, OpResponse};
use crate::error::Error;
use crate::rpc::error::{
    INTERNAL_ERROR, INVALID_PARAMS, INVALID_REQUEST, METHOD_NOT_FOUND, PARSE_ERROR,
};
use crate::rpc::json;
use crate::rpc::{CallContext, Reply, RpcError};
use crate::runtime::Runtime;

/// One operation named by a path and an HTTP method, with the ids its path carries.
#[derive(Debug, PartialEq, Eq)]
pub(crate) struct RestCall {
    pub(crate) op: Op,
    /// `{id}` or `{task_id}` of the path.
    task: Option<String>,
    /// `{id}` of a push configuration's path.
    config: Option<String>,
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

/// The operations a path's shape takes, by HTTP method, with its ids.
struct Shape {
    methods: &'static [(Method, Op)],
    allow: &'static str,
    task: Option<String>,
    config: Option<String>,
}

fn shape(segments: &[String]) -> Option<Shape> {
    const SEND: &[(Method, Op)] = &[(Method::POST, Op::SendMessage)];
    const STREAM: &[(Method, Op)] = &[(Method::POST, Op::SendStreamingMessage)];
    const LIST: &[(Method, Op)] = &[(Method::GET, Op::ListTasks)];
    const GET: &[(Method, Op)] = &[(Method::GET, Op::GetTask)];
    const CANCEL: &[(Method, Op)] = &[(Method::POST, Op::CancelTask)];
    // S10 §11.3 says POST, the proto's `google.api.http` says GET: both.
    const SUBSCRIBE: &[(Method, Op)] = &[
        (Method::GET, Op::SubscribeToTask),
        (Method::POST, Op::SubscribeToTask),
    ];
    const CONFIGS: &[(Method, Op)] = &[
        (Method::POST, Op::CreatePushConfig),
        (Method::GET, Op::ListPushConfigs),
    ];
    const CONFIG: &[(Method, Op)] = &[
        (Method::GET, Op::GetPushConfig),
        (Method::DELETE, Op::DeletePushConfig),
    ];
    const CARD: &[(Method, Op)] = &[(Method::GET, Op::GetExtendedCard)];
    let plain = |methods, allow| {
        Some(Shape {
            methods,
            allow,
            task: None,
            config: None,
        })
    };
    let segs: Vec<&str> = segments.iter().map(String::as_str).collect();
    match segs.as_slice() {
        ["message:send"] => plain(SEND, "POST, OPTIONS"),
        ["message:stream"] => plain(STREAM, "POST, OPTIONS"),
        ["tasks"] => plain(LIST, "GET, OPTIONS"),
        ["extendedAgentCard"] => plain(CARD, "GET, OPTIONS"),
        ["tasks", id] => {
            let (methods, allow, id) = if let Some(id) = id.strip_suffix(":cancel") {
                (CANCEL, "POST, OPTIONS", id)
            } else if let Some(id) = id.strip_suffix(":subscribe") {
                (SUBSCRIBE, "GET, POST, OPTIONS", id)
            } else {
                (GET, "GET, OPTIONS", *id)
            };
            (!id.is_empty()).then(|| Shape {
                methods,
                allow,
                task: Some(id.to_string()),
                config: None,
            })
        }
        ["tasks", id, "pushNotificationConfigs"] if !id.is_empty() => Some(Shape {
            methods: CONFIGS,
            allow: "GET, POST, OPTIONS",
            task: Some((*id).to_string()),
            config: None,
        }),
        ["tasks", id, "pushNotificationConfigs", config]
            if !id.is_empty() && !config.is_empty() =>
        {
            Some(Shape {
                methods: CONFIG,
                allow: "GET, DELETE, OPTIONS",
                task: Some((*id).to_string()),
                config: Some((*config).to_string()),
            })
        }
        _ => None,
    }
}

/// The route of `sub` (the path after `{agent}/rest`, a trailing `/` already removed) for
/// an HTTP method, on the agent `agent`. Each path is served bare and under a `/{tenant}`
/// prefix equal to the agent's id (the proto's `additional_bindings`).
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
    let found = match shape(&segments) {
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
    match found.methods.iter().find(|(m, _)| m == method) {
        Some((_, op)) => RestRoute::Call(RestCall {
            op: *op,
            task: found.task,
            config: found.config,
        }),
        None => RestRoute::WrongMethod(found.allow),
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
    let (task_field, config_field) = match call.op {
        Op::GetTask | Op::CancelTask | Op::SubscribeToTask => ("id", ""),
        _ => ("taskId", "id"),
    };
    if let Some(task) = &call.task {
        p.insert(task_field.into(), Value::String(task.clone()));
    }
    if let Some(config) = &call.config {
        p.insert(config_field.into(), Value::String(config.clone()));
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
        let p = json::params(Some(raw))?;
        op.admit(cx)?;
        let mut request = dispatch::decode(op, Version::V10, cx, &p)?;
        if let (OpRequest::SubscribeToTask { after, .. }, Some(last)) =
            (&mut request, &cx.last_event_id)
        {
            *after = Some(
                last.trim()
                    .parse()
                    .map_err(|_| Error::invalid("Last-Event-ID", "must be an event number"))?,
            );
        }
        match direct(ops::execute(runtime, cx, Version::V10, request).await?) {
            Ok(done) => Ok(Ok(done)),
            Err(response) => {
                dispatch::encode(op, Version::V10, runtime, cx, Framing::Bare, &p, response)
                    .map(Err)
            }
        }
    };
    run.await
        .map_err(|e: Error| errors::rpc_error(Version::V10, &e))
}

/// The HTTP status and `google.rpc.Code` name of an official error code (S10 §5.4 as of
/// v1.0.1), where the error does not carry an HTTP status of its own (401, 403, 404 agent,
/// 405, 413, 415, 429 do).
fn status_of(code: i64) -> (StatusCode, &'static str) {
    match code {
        TASK_NOT_FOUND | AGENT_NOT_FOUND => (StatusCode::NOT_FOUND, "NOT_FOUND"),
        METHOD_NOT_FOUND => (StatusCode::NOT_FOUND, "UNIMPLEMENTED"),
        TASK_NOT_CANCELABLE
        | PUSH_NOT_SUPPORTED
        | UNSUPPORTED_OPERATION
        | VERSION_NOT_SUPPORTED => (StatusCode::BAD_REQUEST, "FAILED_PRECONDITION"),
        CONTENT_TYPE_NOT_SUPPORTED | PARSE_ERROR | INVALID_REQUEST | INVALID_PARAMS => {
            (StatusCode::BAD_REQUEST, "INVALID_ARGUMENT")
        }
        UNAUTHENTICATED => (StatusCode::UNAUTHORIZED, "UNAUTHENTICATED"),
        UNAUTHORIZED => (StatusCode::FORBIDDEN, "PERMISSION_DENIED"),
        RATE_LIMITED => (StatusCode::TOO_MANY_REQUESTS, "RESOURCE_EXHAUSTED"),
        INTERNAL_ERROR => (StatusCode::INTERNAL_SERVER_ERROR, "INTERNAL"),
        _ => (StatusCode::INTERNAL_SERVER_ERROR, "UNKNOWN"),
    }
}

/// The `google.rpc.Code` name of an HTTP status an error carries itself.
fn code_name(status: StatusCode, fallback: &'static str) -> &'static str {
    match status.as_u16() {
        401 => "UNAUTHENTICATED",
        403 => "PERMISSION_DENIED",
        404 => "NOT_FOUND",
        405 => "UNIMPLEMENTED",
        408 => "DEADLINE_EXCEEDED",
        413 | 429 => "RESOURCE_EXHAUSTED",
        415 => "INVALID_ARGUMENT",
        _ => fallback,
    }
}

/// The `google.rpc.Status` body (S10 §11.6) and HTTP status of a 1.0 error (`e.data` the
/// `ErrorInfo` array [`errors::dress`] made); its JSON-RPC code stays the metrics' outcome.
pub(crate) fn status_reply(e: &RpcError) -> Reply {
    let (table_status, table_name) = status_of(e.code);
    let (status, name) = if e.status == StatusCode::OK {
        (table_status, table_name)
    } else {
        (e.status, code_name(e.status, table_name))
    };
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
        body: serde_json::to_vec(&body).unwrap_or_default(),
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
        RestRoute::Call(RestCall {
            op,
            task: task.map(String::from),
            config: config.map(String::from),
        })
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
            task: Some("t1".into()),
            config: None,
        };
        let p = params(&c, None, br#"{"id":"other","metadata":{"reason":"r"}}"#).expect("ok");
        let v: Value = serde_json::from_str(p.raw().get()).expect("json");
        assert_eq!(v, json!({"id": "t1", "metadata": {"reason": "r"}}));
        let list = RestCall {
            op: Op::ListTasks,
            task: None,
            config: None,
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
