//! JSON-RPC error objects, their codes, and the one mapping from the library's [`Error`]
//! to the seed dialect's codes and HTTP statuses. Other dialects add their own mapping
//! beside this one.

use std::borrow::Cow;

use hyper::StatusCode;
use serde::Serialize;
use serde_json::{Value, json};

use crate::error::Error;
use crate::model::TaskId;

/// -32700: the body is not valid JSON.
pub const PARSE_ERROR: i64 = -32700;
/// -32600: not a valid request object.
pub const INVALID_REQUEST: i64 = -32600;
/// -32601: unknown method.
pub const METHOD_NOT_FOUND: i64 = -32601;
/// -32602: missing, ill-typed or invalid params.
pub const INVALID_PARAMS: i64 = -32602;
/// -32603: a fault inside the server.
pub const INTERNAL_ERROR: i64 = -32603;
/// -32000: no such task.
pub const TASK_NOT_FOUND: i64 = -32000;
/// -32001: the task already completed (or failed).
pub const TASK_ALREADY_COMPLETED: i64 = -32001;
/// -32002: the task was already canceled.
pub const TASK_ALREADY_CANCELED: i64 = -32002;
/// -32003: the task ended while the cancellation was in flight.
pub const CANCELLATION_FAILED: i64 = -32003;
/// -32004: a stream cannot be opened.
pub const SUBSCRIPTION_FAILED: i64 = -32004;
/// -32005: missing or unknown credentials.
pub const UNAUTHORIZED: i64 = -32005;
/// -32006: the key may not use this agent.
pub const FORBIDDEN: i64 = -32006;
/// -32007: no such agent.
pub const AGENT_NOT_FOUND: i64 = -32007;
/// -32008: too many requests.
pub const RATE_LIMITED: i64 = -32008;
/// -32009: the agent's task queue is full.
pub const TOO_MANY_TASKS: i64 = -32009;
/// -32010: the agent takes no push configurations.
pub const PUSH_NOT_SUPPORTED: i64 = -32010;

/// A JSON-RPC error object, plus how it travels when it is the whole response.
#[derive(Clone, Debug, Serialize)]
pub struct RpcError {
    /// The code.
    pub code: i64,
    /// A short message.
    pub message: Cow<'static, str>,
    /// Details (`taskId`, `field`, `reason`, `suggestion`, `retryAfter`, `limit`, ...).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub data: Option<Value>,
    /// HTTP status when this error is the whole response (batches are always 200).
    #[serde(skip)]
    pub status: StatusCode,
    /// `Retry-After` seconds, for 429.
    #[serde(skip)]
    pub retry_after: Option<u64>,
}

impl RpcError {
    /// An error with code and message, HTTP 200, no data.
    pub fn new(code: i64, message: impl Into<Cow<'static, str>>) -> Self {
        Self {
            code,
            message: message.into(),
            data: None,
            status: StatusCode::OK,
            retry_after: None,
        }
    }

    /// Adds `data`.
    pub fn with_data(mut self, data: Value) -> Self {
        self.data = Some(data);
        self
    }

    /// Sets the HTTP status.
    pub fn with_status(mut self, status: StatusCode) -> Self {
        self.status = status;
        self
    }

    /// -32700 with a detail.
    pub fn parse_error(detail: String) -> Self {
        Self::new(PARSE_ERROR, "Parse error").with_data(json!({ "reason": detail }))
    }

    /// -32600 with a reason.
    pub fn invalid_request(reason: &str) -> Self {
        Self::new(INVALID_REQUEST, "Invalid Request").with_data(json!({ "reason": reason }))
    }

    /// -32601 naming the method.
    pub fn method_not_found(method: &str) -> Self {
        Self::new(METHOD_NOT_FOUND, "Method not found").with_data(json!({ "method": method }))
    }

    /// -32602 with `data: {field, reason}`.
    pub fn invalid_params(field: &str, reason: &str) -> Self {
        Self::new(INVALID_PARAMS, "Invalid params")
            .with_data(json!({ "field": field, "reason": reason }))
    }

    /// -32603 without internals.
    pub fn internal() -> Self {
        Self::new(INTERNAL_ERROR, "Internal error")
    }

    /// -32008 with `Retry-After`.
    pub fn rate_limited(retry_after: u64) -> Self {
        let mut e = Self::new(RATE_LIMITED, "Rate limit exceeded")
            .with_data(json!({
                "retryAfter": retry_after,
                "suggestion": "retry after the given number of seconds, with exponential backoff",
            }))
            .with_status(StatusCode::TOO_MANY_REQUESTS);
        e.retry_after = Some(retry_after);
        e
    }
}

/// A task-related error: `data.taskId` (null when no task exists yet) plus `extra`.
fn task_error(code: i64, message: &'static str, task: Option<&str>, extra: Value) -> RpcError {
    let mut data = json!({ "taskId": task });
    if let (Some(d), Value::Object(extra)) = (data.as_object_mut(), extra) {
        d.extend(extra);
    }
    RpcError::new(code, message).with_data(data)
}

impl From<&Error> for RpcError {
    fn from(e: &Error) -> Self {
        match e {
            Error::InvalidParams { field, reason } => Self::invalid_params(field, reason),
            Error::TaskNotFound { task } => task_error(
                TASK_NOT_FOUND,
                "Task not found",
                Some(task.as_str()),
                json!({ "suggestion": "check the task id; finished tasks are kept for the server's retention period" }),
            ),
            Error::TaskFinished { task, state } => task_error(
                TASK_ALREADY_COMPLETED,
                "Task already completed",
                Some(task.as_str()),
                json!({ "state": state.as_str(), "suggestion": "the task is final; send a new message to start a new task" }),
            ),
            Error::TaskCanceled { task } => task_error(
                TASK_ALREADY_CANCELED,
                "Task already canceled",
                Some(task.as_str()),
                json!({ "state": "canceled", "suggestion": "the task is final; send a new message to start a new task" }),
            ),
            Error::CancelFailed { task, state } => task_error(
                CANCELLATION_FAILED,
                "Cancellation failed",
                Some(task.as_str()),
                json!({ "state": state.as_str(), "suggestion": "the task reached a final state before it could be canceled; read it with tasks/get" }),
            ),
            Error::SubscriptionFailed { task, reason } => task_error(
                SUBSCRIPTION_FAILED,
                "Subscription failed",
                task.as_ref().map(TaskId::as_str),
                json!({ "reason": reason, "suggestion": "poll with tasks/get instead" }),
            ),
            Error::TaskInProgress { task } => Self::new(INVALID_PARAMS, "Invalid params").with_data(json!({
                "field": "id",
                "reason": "task is still in progress",
                "taskId": task.as_str(),
                "suggestion": "reuse the task id only with the same messageId, or choose a new id",
            })),
            Error::TooManyTasks => Self::new(TOO_MANY_TASKS, "Too many tasks")
                .with_data(json!({ "suggestion": "the agent's queue is full; retry later" }))
                .with_status(StatusCode::TOO_MANY_REQUESTS),
            Error::PushNotSupported => Self::new(PUSH_NOT_SUPPORTED, "Push notifications not supported"),
            Error::AgentNotFound => Self::new(AGENT_NOT_FOUND, "Agent not found")
                .with_status(StatusCode::NOT_FOUND),
            Error::Busy => Self::new(INTERNAL_ERROR, "Server busy")
                .with_data(json!({ "suggestion": "retry later" })),
            Error::ShuttingDown => Self::new(INTERNAL_ERROR, "Server is shutting down")
                .with_data(json!({ "suggestion": "retry against another instance or later" })),
            Error::Internal | Error::Config(_) | Error::Io(_) => Self::internal(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::TaskState;

    #[test]
    fn every_error_maps_to_its_code_and_status() {
        let t = || TaskId::new("t1");
        let cases: Vec<(Error, i64, u16)> = vec![
            (
                Error::invalid("message", "is required"),
                INVALID_PARAMS,
                200,
            ),
            (Error::TaskNotFound { task: t() }, TASK_NOT_FOUND, 200),
            (
                Error::TaskFinished {
                    task: t(),
                    state: TaskState::Failed,
                },
                TASK_ALREADY_COMPLETED,
                200,
            ),
            (
                Error::TaskCanceled { task: t() },
                TASK_ALREADY_CANCELED,
                200,
            ),
            (
                Error::CancelFailed {
                    task: t(),
                    state: TaskState::Completed,
                },
                CANCELLATION_FAILED,
                200,
            ),
            (
                Error::SubscriptionFailed {
                    task: Some(t()),
                    reason: "limit".into(),
                },
                SUBSCRIPTION_FAILED,
                200,
            ),
            (Error::TaskInProgress { task: t() }, INVALID_PARAMS, 200),
            (Error::TooManyTasks, TOO_MANY_TASKS, 429),
            (Error::PushNotSupported, PUSH_NOT_SUPPORTED, 200),
            (Error::AgentNotFound, AGENT_NOT_FOUND, 404),
            (Error::Busy, INTERNAL_ERROR, 200),
            (Error::ShuttingDown, INTERNAL_ERROR, 200),
            (Error::Internal, INTERNAL_ERROR, 200),
        ];
        for (e, code, status) in cases {
            let r = RpcError::from(&e);
            assert_eq!((r.code, r.status.as_u16()), (code, status), "{e}");
            if (TASK_ALREADY_COMPLETED..=TASK_NOT_FOUND).contains(&code) {
                assert_eq!(
                    r.data.as_ref().map(|d| d["taskId"].clone()),
                    Some("t1".into()),
                    "{e}"
                );
            }
        }
        let r = RpcError::from(&Error::CancelFailed {
            task: t(),
            state: TaskState::Completed,
        });
        assert_eq!(r.data.expect("data")["state"], "completed");
        let internal = RpcError::from(&Error::Internal);
        assert!(internal.data.is_none(), "no internals leaked");
        let limited = RpcError::rate_limited(7);
        assert_eq!(
            (limited.code, limited.status.as_u16(), limited.retry_after),
            (RATE_LIMITED, 429, Some(7))
        );
        assert_eq!(limited.data.expect("data")["retryAfter"], 7);
    }
}
