//! Seed webhook payloads (docs/PROTOCOL.md §7): `{event, timestamp, agentId, taskId, data,
//! delivery}` with `data` per event.

use serde_json::{Value, json};

use super::render::MessageOut;
use crate::model::{TaskState, iso8601};
use crate::push::WebhookEvent;
use crate::webhook::{Payload, PayloadInput, PayloadRenderer};

/// The payload format name seed configurations carry.
pub(crate) const FORMAT: &str = crate::push::format::SEED;

/// Renders seed deliveries.
pub(crate) struct SeedPayload;

impl PayloadRenderer for SeedPayload {
    fn render(&self, input: &PayloadInput<'_>) -> Payload {
        let event = input.event;
        let name = WebhookEvent::for_state(event.status.state)
            .map_or_else(|| event.name(), |e| e.as_str().to_string());
        let body = json!({
            "event": name,
            "timestamp": iso8601(&event.status.timestamp),
            "agentId": input.agent_id.as_str(),
            "taskId": input.task.id.as_str(),
            "data": data(input),
            "delivery": {"attempt": input.attempt, "maxAttempts": input.max_attempts},
        });
        Payload {
            content_type: "application/json",
            event: name,
            body: crate::rpc::out::to_vec(&body).unwrap_or_default(),
        }
    }
}

/// The `data` of an event's payload.
fn data(input: &PayloadInput<'_>) -> Value {
    let (task, status) = (input.task, &input.event.status);
    let at = iso8601(&status.timestamp);
    let duration = (status.timestamp - task.created_at)
        .num_milliseconds()
        .max(0);
    let task_id = task.id.as_str();
    match status.state {
        TaskState::Submitted => json!({
            "taskId": task_id,
            "submittedAt": at,
            "estimatedDuration": input.estimated_ms,
        }),
        TaskState::Working => json!({
            "taskId": task_id,
            "startedAt": at,
            "progress": 0,
        }),
        TaskState::Completed => json!({
            "taskId": task_id,
            "status": {
                "state": "completed",
                "message": status.message.as_deref().map(MessageOut),
            },
            "contextId": task.context_id.as_str(),
            "duration": duration,
            "completedAt": at,
        }),
        TaskState::Failed | TaskState::Rejected => json!({
            "taskId": task_id,
            "status": {
                "state": "failed",
                "error": status.error.as_ref().map(|e| json!({"code": e.code, "message": e.message})),
            },
            "duration": duration,
            "failedAt": at,
        }),
        TaskState::Canceled => json!({
            "taskId": task_id,
            "reason": status.reason.as_deref().unwrap_or("Canceled by user"),
            "canceledAt": at,
        }),
        TaskState::InputRequired | TaskState::AuthRequired => json!({
            "taskId": task_id,
            "status": {"state": status.state.as_str()},
        }),
    }
}
