//! The official error table (docs/PROTOCOL.md §10.8): codes shared by 0.3 and 1.0; 0.3 `data` is
//! an object (as the seed's), 1.0 `data` an array of `google.rpc.ErrorInfo` (plus a
//! `BadRequest` with field violations for -32602).

use hyper::StatusCode;
use serde_json::{Map, Value, json};

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
pub(crate) const CODES: [i64; 10] = [
    TASK_NOT_FOUND,
    TASK_NOT_CANCELABLE,
    PUSH_NOT_SUPPORTED,
    UNSUPPORTED_OPERATION,
    CONTENT_TYPE_NOT_SUPPORTED,
    VERSION_NOT_SUPPORTED,
    UNAUTHENTICATED,
    UNAUTHORIZED,
    AGENT_NOT_FOUND,
    RATE_LIMITED,
];

fn reason_of(code: i64) -> &'static str {
    match code {
        PARSE_ERROR => "PARSE_ERROR",
        INVALID_REQUEST => "INVALID_REQUEST",
        METHOD_NOT_FOUND => "METHOD_NOT_FOUND",
        INVALID_PARAMS => "INVALID_PARAMS",
        TASK_NOT_FOUND => "TASK_NOT_FOUND",
        TASK_NOT_CANCELABLE => "TASK_NOT_CANCELABLE",
        PUSH_NOT_SUPPORTED => "PUSH_NOTIFICATION_NOT_SUPPORTED",
        UNSUPPORTED_OPERATION => "UNSUPPORTED_OPERATION",
        CONTENT_TYPE_NOT_SUPPORTED => "CONTENT_TYPE_NOT_SUPPORTED",
        VERSION_NOT_SUPPORTED => "VERSION_NOT_SUPPORTED",
        UNAUTHENTICATED => "UNAUTHENTICATED",
        UNAUTHORIZED => "UNAUTHORIZED",
        AGENT_NOT_FOUND => "AGENT_NOT_FOUND",
        RATE_LIMITED => "RATE_LIMITED",
        _ => "INTERNAL_ERROR",
    }
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
        other => other.generic(),
    };
    dress(v, e)
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
