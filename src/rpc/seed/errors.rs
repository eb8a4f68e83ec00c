//! The seed dialect's error codes (docs/PROTOCOL.md §1) and its mapping of the library's
//! errors and of the HTTP-level refusals onto them.

use hyper::StatusCode;
use serde_json::{Value, json};

use crate::error::Error;
use crate::model::TaskId;
use crate::rpc::Refusal;
use crate::rpc::error::{INTERNAL_ERROR, INVALID_PARAMS, RpcError};

/// -32000: no such task.
pub(crate) const TASK_NOT_FOUND: i64 = -32000;
/// -32001: the task already completed (or failed).
pub(crate) const TASK_ALREADY_COMPLETED: i64 = -32001;
/// -32002: the task was already canceled.
pub(crate) const TASK_ALREADY_CANCELED: i64 = -32002;
/// -32003: the task ended while the cancellation was in flight.
pub(crate) const CANCELLATION_FAILED: i64 = -32003;
/// -32004: a stream cannot be opened.
pub(crate) const SUBSCRIPTION_FAILED: i64 = -32004;
/// -32005: missing or unknown credentials.
pub(crate) const UNAUTHORIZED: i64 = -32005;
/// -32006: the key may not use this agent.
pub(crate) const FORBIDDEN: i64 = -32006;
/// -32007: no such agent.
pub(crate) const AGENT_NOT_FOUND: i64 = -32007;
/// -32008: too many requests.
pub(crate) const RATE_LIMITED: i64 = -32008;
/// -32009: the agent's task queue is full.
pub(crate) const TOO_MANY_TASKS: i64 = -32009;
/// -32010: the agent takes no push configurations.
pub(crate) const PUSH_NOT_SUPPORTED: i64 = -32010;

/// The codes this dialect answers with, for the request metrics.
pub(crate) const CODES: [i64; 11] = [
    TASK_NOT_FOUND,
    TASK_ALREADY_COMPLETED,
    TASK_ALREADY_CANCELED,
    CANCELLATION_FAILED,
    SUBSCRIPTION_FAILED,
    UNAUTHORIZED,
    FORBIDDEN,
    AGENT_NOT_FOUND,
    RATE_LIMITED,
    TOO_MANY_TASKS,
    PUSH_NOT_SUPPORTED,
];

/// A task-related error: `data.taskId` (null when no task exists yet) plus `extra`.
fn task_error(code: i64, message: &'static str, task: Option<&str>, extra: Value) -> RpcError {
    let mut data = json!({ "taskId": task });
    if let (Some(d), Value::Object(extra)) = (data.as_object_mut(), extra) {
        d.extend(extra);
    }
    RpcError::new(code, message).with_data(data)
}

/// The seed error for a library error.
pub(crate) fn rpc_error(e: &Error) -> RpcError {
    match e {
        Error::InvalidParams { field, reason }
        | Error::UnsupportedContentType { field, reason } => {
            RpcError::invalid_params(field, reason)
        }
        Error::ExtensionRequired { uri } => RpcError::new(INVALID_PARAMS, "Invalid params")
            .with_data(json!({
                "field": "A2A-Extensions",
                "reason": format!("this agent requires the extension {uri}; activate it with the A2A-Extensions header"),
                "extension": uri,
            })),
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
        Error::TaskInProgress { task } => RpcError::new(INVALID_PARAMS, "Invalid params")
            .with_data(json!({
                "field": "id",
                "reason": "task is still in progress",
                "taskId": task.as_str(),
                "suggestion": "reuse the task id only with the same messageId, or choose a new id",
            })),
        // The seed path never continues tasks; kept total.
        Error::TaskNotContinuable { task, .. } => RpcError::new(INVALID_PARAMS, "Invalid params")
            .with_data(json!({
                "field": "id",
                "reason": "task is still in progress",
                "taskId": task.as_str(),
            })),
        Error::ContextMismatch { task } => RpcError::invalid_params(
            "contextId",
            &format!("task {task} belongs to another context"),
        ),
        Error::TooManyTasks => RpcError::new(TOO_MANY_TASKS, "Too many tasks")
            .with_data(json!({ "suggestion": "the agent's queue is full; retry later" }))
            .with_status(StatusCode::TOO_MANY_REQUESTS),
        Error::PushNotSupported => {
            RpcError::new(PUSH_NOT_SUPPORTED, "Push notifications not supported")
        }
        Error::AgentNotFound => {
            RpcError::new(AGENT_NOT_FOUND, "Agent not found").with_status(StatusCode::NOT_FOUND)
        }
        Error::Busy => RpcError::new(INTERNAL_ERROR, "Server busy")
            .with_data(json!({ "suggestion": "retry later" })),
        Error::ShuttingDown => RpcError::new(INTERNAL_ERROR, "Server is shutting down")
            .with_data(json!({ "suggestion": "retry against another instance or later" })),
        Error::Internal | Error::Config(_) | Error::Store { .. } | Error::Io(_) => {
            RpcError::internal()
        }
    }
}

/// The seed body of a request refused before JSON-RPC (docs/PROTOCOL.md §1).
pub(crate) fn refusal(r: &Refusal) -> RpcError {
    match r {
        Refusal::Unauthorized(reason) => RpcError::new(UNAUTHORIZED, "Unauthorized")
            .with_data(json!({ "reason": reason }))
            .with_status(StatusCode::UNAUTHORIZED),
        Refusal::AgentNotFound(agent) => RpcError::new(AGENT_NOT_FOUND, "Agent not found")
            .with_data(json!({ "agentId": agent.as_str() }))
            .with_status(StatusCode::NOT_FOUND),
        Refusal::Forbidden(agent) => RpcError::new(FORBIDDEN, "Forbidden")
            .with_data(
                json!({ "agentId": agent.as_str(), "reason": "this key may not use this agent" }),
            )
            .with_status(StatusCode::FORBIDDEN),
        Refusal::RateLimited(retry_after) => RpcError::rate_limited(RATE_LIMITED, *retry_after),
        other => other.generic(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::TaskState;
    use crate::rpc::error::INTERNAL_ERROR;

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
            let r = rpc_error(&e);
            assert_eq!((r.code, r.status.as_u16()), (code, status), "{e}");
            if (TASK_ALREADY_COMPLETED..=TASK_NOT_FOUND).contains(&code) {
                assert_eq!(
                    r.data.as_ref().map(|d| d["taskId"].clone()),
                    Some("t1".into()),
                    "{e}"
                );
            }
        }
        let r = rpc_error(&Error::CancelFailed {
            task: t(),
            state: TaskState::Completed,
        });
        assert_eq!(r.data.expect("data")["state"], "completed");
        let internal = rpc_error(&Error::Internal);
        assert!(internal.data.is_none(), "no internals leaked");
        let limited = refusal(&Refusal::RateLimited(7));
        assert_eq!(
            (limited.code, limited.status.as_u16(), limited.retry_after),
            (RATE_LIMITED, 429, Some(7))
        );
        assert_eq!(limited.data.expect("data")["retryAfter"], 7);
    }
}
