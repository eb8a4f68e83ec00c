//! The official error table (docs/PROTOCOL.md §10.8): codes shared by 0.3 and 1.0; 0.3 `data` is
//! an object (as the seed's), 1.0 `data` an array of `google.rpc.ErrorInfo` (plus a
//! `BadRequest` with field violations for -32602).

use hyper::StatusCode;
use serde_json::{Map, Value, json};
use tonic::Code;

use super::Version;
use crate::error::Error;
use crate::rpc::Refusal;
use crate::rpc::error::{
    INTERNAL_ERROR, INVALID_PARAMS, INVALID_REQUEST, METHOD_NOT_FOUND, PARSE_ERROR, RpcError,
};

/// -32001: no such task (or not the caller's).
pub(crate) const TASK_NOT_FOUND: i64 = -32001;
/// -32002: the task cannot be canceled.
pub(crate) const TASK_NOT_CANCELABLE: i64 = -32002;
/// -32003: the agent takes no push configurations.
pub(crate) const PUSH_NOT_SUPPORTED: i64 = -32003;
/// -32004: the operation is not supported (here, now, for this task).
pub(crate) const UNSUPPORTED_OPERATION: i64 = -32004;
/// -32005: a content type is not supported.
pub(crate) const CONTENT_TYPE_NOT_SUPPORTED: i64 = -32005;
/// -32008: the agent requires an extension the request did not activate.
pub(crate) const EXTENSION_SUPPORT_REQUIRED: i64 = -32008;
/// -32009: the A2A version is not served at this URL.
pub(crate) const VERSION_NOT_SUPPORTED: i64 = -32009;
/// -31401: no or unknown credentials (a2a-go's code, outside the reserved range).
pub(crate) const UNAUTHENTICATED: i64 = -31401;
/// -31403: the key may not use this agent.
pub(crate) const UNAUTHORIZED: i64 = -31403;
/// -31404: no such agent.
pub(crate) const AGENT_NOT_FOUND: i64 = -31404;
/// -31429: rate limit or full queue.
pub(crate) const RATE_LIMITED: i64 = -31429;

/// The codes the official dialects answer with, for the request metrics.
pub(crate) const CODES: [i64; 11] = [
    TASK_NOT_FOUND,
    TASK_NOT_CANCELABLE,
    PUSH_NOT_SUPPORTED,
    UNSUPPORTED_OPERATION,
    CONTENT_TYPE_NOT_SUPPORTED,
    EXTENSION_SUPPORT_REQUIRED,
    VERSION_NOT_SUPPORTED,
    UNAUTHENTICATED,
    UNAUTHORIZED,
    AGENT_NOT_FOUND,
    RATE_LIMITED,
];

/// One official error as every binding carries it (DIALECTS §8, S10 §5.4): its JSON-RPC
/// code, its `ErrorInfo.reason`, and — when the error carries no HTTP status of its own —
/// the HTTP status of the HTTP+JSON binding and the `google.rpc.Code` of gRPC (whose name is
/// also the HTTP+JSON body's `status`).
pub(crate) struct ErrorRow {
    pub(crate) code: i64,
    pub(crate) reason: &'static str,
    pub(crate) http: StatusCode,
    pub(crate) grpc: Code,
}

const fn row(code: i64, reason: &'static str, http: StatusCode, grpc: Code) -> ErrorRow {
    ErrorRow {
        code,
        reason,
        http,
        grpc,
    }
}

/// The error table: each official error once. JSON-RPC answers its code (HTTP 200 unless
/// the error carries a status), HTTP+JSON its `http` status with a `google.rpc.Status` named
/// after `grpc`, gRPC its `grpc` status; all three carry `reason` in their `ErrorInfo`.
#[rustfmt::skip]
pub(crate) const TABLE: [ErrorRow; 16] = {
    use StatusCode as H;
    [
        row(PARSE_ERROR, "PARSE_ERROR", H::BAD_REQUEST, Code::InvalidArgument),
        row(INVALID_REQUEST, "INVALID_REQUEST", H::BAD_REQUEST, Code::InvalidArgument),
        row(METHOD_NOT_FOUND, "METHOD_NOT_FOUND", H::NOT_FOUND, Code::Unimplemented),
        row(INVALID_PARAMS, "INVALID_PARAMS", H::BAD_REQUEST, Code::InvalidArgument),
        row(INTERNAL_ERROR, "INTERNAL_ERROR", H::INTERNAL_SERVER_ERROR, Code::Internal),
        row(TASK_NOT_FOUND, "TASK_NOT_FOUND", H::NOT_FOUND, Code::NotFound),
        row(TASK_NOT_CANCELABLE, "TASK_NOT_CANCELABLE", H::BAD_REQUEST, Code::FailedPrecondition),
        row(PUSH_NOT_SUPPORTED, "PUSH_NOTIFICATION_NOT_SUPPORTED", H::BAD_REQUEST, Code::FailedPrecondition),
        row(UNSUPPORTED_OPERATION, "UNSUPPORTED_OPERATION", H::BAD_REQUEST, Code::FailedPrecondition),
        row(CONTENT_TYPE_NOT_SUPPORTED, "CONTENT_TYPE_NOT_SUPPORTED", H::BAD_REQUEST, Code::InvalidArgument),
        row(EXTENSION_SUPPORT_REQUIRED, "EXTENSION_SUPPORT_REQUIRED", H::BAD_REQUEST, Code::FailedPrecondition),
        row(VERSION_NOT_SUPPORTED, "VERSION_NOT_SUPPORTED", H::BAD_REQUEST, Code::FailedPrecondition),
        row(UNAUTHENTICATED, "UNAUTHENTICATED", H::UNAUTHORIZED, Code::Unauthenticated),
        row(UNAUTHORIZED, "UNAUTHORIZED", H::FORBIDDEN, Code::PermissionDenied),
        row(AGENT_NOT_FOUND, "AGENT_NOT_FOUND", H::NOT_FOUND, Code::NotFound),
        row(RATE_LIMITED, "RATE_LIMITED", H::TOO_MANY_REQUESTS, Code::ResourceExhausted),
    ]
};

/// A code the table does not know: an internal error to the client.
const UNKNOWN: ErrorRow = row(
    0,
    "INTERNAL_ERROR",
    StatusCode::INTERNAL_SERVER_ERROR,
    Code::Unknown,
);

/// The row of a code.
pub(crate) fn row_of(code: i64) -> &'static ErrorRow {
    TABLE.iter().find(|r| r.code == code).unwrap_or(&UNKNOWN)
}

/// The `google.rpc.Code` of an HTTP status an error carries itself (401, 403, 404 agent,
/// 405, 408, 413, 415, 429): it wins over its code's row, on HTTP+JSON and gRPC alike.
fn carried(status: StatusCode) -> Option<Code> {
    Some(match status.as_u16() {
        401 => Code::Unauthenticated,
        403 => Code::PermissionDenied,
        404 => Code::NotFound,
        405 => Code::Unimplemented,
        408 => Code::DeadlineExceeded,
        413 | 429 => Code::ResourceExhausted,
        415 => Code::InvalidArgument,
        _ => return None,
    })
}

/// An error's HTTP status (HTTP+JSON) and `google.rpc.Code` (gRPC, and the HTTP+JSON
/// body's `status`): the status it carries, else its row's.
pub(crate) fn statuses(e: &RpcError) -> (StatusCode, Code) {
    let row = row_of(e.code);
    if e.status == StatusCode::OK {
        return (row.http, row.grpc);
    }
    (e.status, carried(e.status).unwrap_or(row.grpc))
}

/// The name of a `google.rpc.Code` (the HTTP+JSON body's `status`).
pub(crate) fn code_name(code: Code) -> &'static str {
    match code {
        Code::Ok => "OK",
        Code::Cancelled => "CANCELLED",
        Code::Unknown => "UNKNOWN",
        Code::InvalidArgument => "INVALID_ARGUMENT",
        Code::DeadlineExceeded => "DEADLINE_EXCEEDED",
        Code::NotFound => "NOT_FOUND",
        Code::AlreadyExists => "ALREADY_EXISTS",
        Code::PermissionDenied => "PERMISSION_DENIED",
        Code::ResourceExhausted => "RESOURCE_EXHAUSTED",
        Code::FailedPrecondition => "FAILED_PRECONDITION",
        Code::Aborted => "ABORTED",
        Code::OutOfRange => "OUT_OF_RANGE",
        Code::Unimplemented => "UNIMPLEMENTED",
        Code::Internal => "INTERNAL",
        Code::Unavailable => "UNAVAILABLE",
        Code::DataLoss => "DATA_LOSS",
        Code::Unauthenticated => "UNAUTHENTICATED",
    }
}

fn reason_of(code: i64) -> &'static str {
    row_of(code).reason
}

/// Puts an error's details in the version's shape: 1.0 an `ErrorInfo` array (string
/// metadata values) with a `BadRequest` for `field`/`reason`; 0.3 the object as it is.
pub(crate) fn dress(v: Version, mut e: RpcError) -> RpcError {
    if v == Version::V03 {
        return e;
    }
    let details = match e.data.take() {
        Some(Value::Object(m)) => m,
        Some(Value::Array(a)) => {
            e.data = Some(Value::Array(a));
            return e;
        }
        _ => Map::new(),
    };
    let mut reason = reason_of(e.code);
    if e.code == RATE_LIMITED && !details.contains_key("retryAfter") {
        reason = "TOO_MANY_TASKS";
    }
    let metadata: Map<String, Value> = details
        .iter()
        .filter(|(_, v)| !v.is_null())
        .map(|(k, v)| {
            let text = match v {
                Value::String(s) => s.clone(),
                other => other.to_string(),
            };
            (k.clone(), Value::String(text))
        })
        .collect();
    let mut data = vec![json!({
        "@type": "type.googleapis.com/google.rpc.ErrorInfo",
        "reason": reason,
        "domain": "a2a-protocol.org",
        "metadata": metadata,
    })];
    if e.code == INVALID_PARAMS
        && let (Some(Value::String(field)), Some(Value::String(desc))) =
            (details.get("field"), details.get("reason"))
    {
        data.push(json!({
            "@type": "type.googleapis.com/google.rpc.BadRequest",
            "fieldViolations": [{"field": field, "description": desc}],
        }));
    }
    e.data = Some(Value::Array(data));
    e
}

fn with(code: i64, message: &'static str, data: Value) -> RpcError {
    RpcError::new(code, message).with_data(data)
}

/// The official error for a library error.
pub(crate) fn rpc_error(v: Version, e: &Error) -> RpcError {
    let task = |t: &dyn std::fmt::Display| json!({ "taskId": t.to_string() });
    let out = match e {
        Error::InvalidParams { field, reason } => RpcError::invalid_params(field, reason),
        Error::UnsupportedContentType { field, reason } => with(
            CONTENT_TYPE_NOT_SUPPORTED,
            "Content type not supported",
            json!({ "field": field, "reason": reason }),
        ),
        Error::ExtensionRequired { uri } => RpcError::new(
            EXTENSION_SUPPORT_REQUIRED,
            "Extension support required",
        )
        .with_data(json!({
            "extension": uri,
            "reason": format!("this agent requires the extension {uri}; activate it with the A2A-Extensions header (0.3: X-A2A-Extensions; gRPC: a2a-extensions)"),
        })),
        Error::TaskNotFound { task: t } => with(TASK_NOT_FOUND, "Task not found", task(t)),
        Error::TaskFinished { task: t, state } | Error::CancelFailed { task: t, state } => {
            let mut d = task(t);
            d["state"] = json!(state.as_str());
            with(TASK_NOT_CANCELABLE, "Task cannot be canceled", d)
        }
        Error::TaskCanceled { task: t } => {
            let mut d = task(t);
            d["state"] = json!("canceled");
            with(TASK_NOT_CANCELABLE, "Task cannot be canceled", d)
        }
        Error::TaskNotContinuable { task: t, state } => {
            let mut d = task(t);
            d["state"] = json!(state.as_str());
            let why = if state.is_terminal() {
                "the task is in a terminal state and accepts no more messages"
            } else {
                "task is still in progress"
            };
            d["reason"] = json!(why);
            with(UNSUPPORTED_OPERATION, "Unsupported operation", d)
        }
        Error::TaskInProgress { task: t } => {
            let mut d = task(t);
            d["reason"] = json!("task is still in progress");
            with(UNSUPPORTED_OPERATION, "Unsupported operation", d)
        }
        Error::SubscriptionFailed { task: t, reason } => {
            let mut d = json!({ "reason": reason });
            if let Some(t) = t {
                d["taskId"] = json!(t.as_str());
            }
            with(UNSUPPORTED_OPERATION, "Unsupported operation", d)
        }
        Error::ContextMismatch { task: t } => RpcError::invalid_params(
            "message.contextId",
            &format!("task {t} belongs to another context"),
        ),
        Error::PushNotSupported => with(
            PUSH_NOT_SUPPORTED,
            "Push notifications not supported",
            json!({}),
        ),
        Error::TooManyTasks => with(
            RATE_LIMITED,
            "Too many tasks",
            json!({ "suggestion": "the agent's queue is full; retry later" }),
        )
        .with_status(StatusCode::TOO_MANY_REQUESTS),
        Error::AgentNotFound => {
            with(AGENT_NOT_FOUND, "Agent not found", json!({})).with_status(StatusCode::NOT_FOUND)
        }
        Error::Busy => RpcError::new(INTERNAL_ERROR, "Server busy")
            .with_data(json!({ "suggestion": "retry later" })),
        Error::ShuttingDown => RpcError::new(INTERNAL_ERROR, "Server is shutting down")
            .with_data(json!({ "suggestion": "retry against another instance or later" })),
        Error::Internal | Error::Config(_) | Error::Store { .. } | Error::Io(_) => {
            RpcError::internal()
        }
    };
    dress(v, without_empty(out))
}

/// 0.3 omits an empty `data`.
fn without_empty(mut e: RpcError) -> RpcError {
    if matches!(&e.data, Some(Value::Object(m)) if m.is_empty()) {
        e.data = None;
    }
    e
}

/// The official body of a request refused before JSON-RPC.
pub(crate) fn refusal(v: Version, r: &Refusal) -> RpcError {
    let e = match r {
        Refusal::Unauthorized(reason) => with(
            UNAUTHENTICATED,
            "Unauthenticated",
            json!({ "reason": reason }),
        )
        .with_status(StatusCode::UNAUTHORIZED),
        Refusal::AgentNotFound(agent) => with(
            AGENT_NOT_FOUND,
            "Agent not found",
            json!({ "agentId": agent.as_str() }),
        )
        .with_status(StatusCode::NOT_FOUND),
        Refusal::Forbidden(agent) => with(
            UNAUTHORIZED,
            "Unauthorized",
            json!({ "agentId": agent.as_str(), "reason": "this key may not use this agent" }),
        )
        .with_status(StatusCode::FORBIDDEN),
        Refusal::RateLimited(secs) => RpcError::rate_limited(RATE_LIMITED, *secs),
        Refusal::UnsupportedMediaType => with(
            CONTENT_TYPE_NOT_SUPPORTED,
            "Content type not supported",
            json!({ "reason": "Content-Type must be application/json or application/a2a+json" }),
        )
        .with_status(StatusCode::UNSUPPORTED_MEDIA_TYPE),
        Refusal::VersionNotSupported {
            served,
            requested,
            agent_url,
        } => version_not_supported(*served, requested.as_deref(), agent_url),
        other => other.generic(),
    };
    dress(v, e)
}

/// -32009, naming what was asked, what this URL serves, and the URL of the version asked
/// for when this server speaks it.
fn version_not_supported(served: Version, requested: Option<&str>, agent_url: &str) -> RpcError {
    let named = Version::of_header(requested);
    let requested = requested.map(str::trim).unwrap_or("");
    let mut data = json!({
        "requested": if requested.is_empty() { "0.3 (no A2A-Version)" } else { requested },
        "supportedVersions": served.number(),
        "reason": format!(
            "this URL serves A2A {0}; send the header A2A-Version: {0}",
            served.number()
        ),
    });
    if let Some(other) = named {
        data["url"] = json!(format!("{agent_url}/{}", other.path()));
    }
    RpcError::new(VERSION_NOT_SUPPORTED, "Version not supported").with_data(data)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::{TaskId, TaskState};

    #[test]
    fn errors_carry_the_official_codes_and_1_0_error_info() {
        let t = || TaskId::new("t1");
        for (e, code) in [
            (Error::TaskNotFound { task: t() }, TASK_NOT_FOUND),
            (Error::TaskCanceled { task: t() }, TASK_NOT_CANCELABLE),
            (
                Error::TaskNotContinuable {
                    task: t(),
                    state: TaskState::Completed,
                },
                UNSUPPORTED_OPERATION,
            ),
            (Error::PushNotSupported, PUSH_NOT_SUPPORTED),
            (Error::TooManyTasks, RATE_LIMITED),
        ] {
            assert_eq!(rpc_error(Version::V03, &e).code, code, "{e}");
            let r = rpc_error(Version::V10, &e);
            assert_eq!(r.code, code);
            let info = &r.data.expect("data")[0];
            assert_eq!(info["@type"], "type.googleapis.com/google.rpc.ErrorInfo");
            assert_eq!(info["domain"], "a2a-protocol.org");
            assert!(info["reason"].is_string());
        }
        let bad = rpc_error(Version::V10, &Error::invalid("message.role", "is required"));
        let data = bad.data.expect("data");
        assert_eq!(data[0]["reason"], "INVALID_PARAMS");
        assert_eq!(data[1]["fieldViolations"][0]["field"], "message.role");
        let queue = rpc_error(Version::V10, &Error::TooManyTasks);
        assert_eq!(queue.data.expect("data")[0]["reason"], "TOO_MANY_TASKS");
        let push = rpc_error(Version::V03, &Error::PushNotSupported);
        assert!(push.data.is_none(), "0.3 omits empty data");
    }
}
