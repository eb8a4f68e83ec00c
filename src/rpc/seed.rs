//! The seed dialect (`000_…txt` + DECISIONS.md): params in, results out.
//!
//! Parsing turns loosely typed JSON into the neutral model with field-level errors;
//! rendering writes the model in this dialect's shapes (`type` discriminators, `final`,
//! `createdAt`, ...). The official dialects will sit beside this file.

use std::sync::Arc;

use serde::Serialize;
use serde::ser::{SerializeMap, SerializeSeq, Serializer};
use serde_json::value::RawValue;
use serde_json::{Map, Value, json};

use crate::actors::{AgentCard, SendRequest};
use crate::config::AgentLimits;
use crate::error::Error;
use crate::model::{
    ContextId, Message, Part, Role, TaskEvent, TaskId, TaskSnapshot, TaskStatus, iso8601,
};
use crate::push::{PushConfig, RetryPolicy, StoredPushConfig, WebhookEvent};
use crate::validate;

/// The eight methods of the spec, in its order.
pub const METHODS: [&str; 8] = [
    "message/send",
    "message/stream",
    "tasks/get",
    "tasks/cancel",
    "tasks/resubscribe",
    "tasks/pushNotificationConfig/set",
    "tasks/pushNotificationConfig/get",
    "agent/authenticatedExtendedCard",
];

/// Longest accepted client-chosen task or context id.
pub const MAX_ID_LEN: usize = 256;

/// Params as an object: absent means `{}` (the caller decides whether that is allowed).
///
/// # Errors
/// -32602 when params is present and not an object.
pub fn params_object(raw: Option<&RawValue>) -> Result<Map<String, Value>, Error> {
    let Some(raw) = raw else {
        return Ok(Map::new());
    };
    match serde_json::from_str::<Value>(raw.get()) {
        Ok(Value::Object(m)) => Ok(m),
        Ok(Value::Null) => Ok(Map::new()),
        _ => Err(Error::invalid("params", "must be an object")),
    }
}

/// Parsed `message/send` / `message/stream` params.
pub struct SendParams {
    /// What to submit.
    pub request: SendRequest,
    /// `configuration.blocking` (default true).
    pub blocking: bool,
    /// `configuration.historyLength`.
    pub history_length: Option<usize>,
}

/// Parses `message/send` and `message/stream` params.
///
/// # Errors
/// -32602 naming the field.
pub fn send_params(mut p: Map<String, Value>, limits: &AgentLimits) -> Result<SendParams, Error> {
    let message = match p.remove("message") {
        None | Some(Value::Null) => return Err(Error::invalid("message", "is required")),
        Some(v) => parse_message(v, limits)?,
    };
    let context = opt_id(&p, "contextId")?;
    let session = opt_id(&p, "sessionId")?;
    let context_id = match (context, session) {
        (Some(c), Some(s)) if c != s => {
            return Err(Error::invalid(
                "contextId",
                "contextId and sessionId differ; send one of them",
            ));
        }
        (Some(c), _) | (None, Some(c)) => Some(ContextId::new(c)),
        (None, None) => None,
    };
    let task_id = task_id_param(&p, false)?;
    let (blocking, history_length) = match p.get("configuration") {
        None | Some(Value::Null) => (true, None),
        Some(Value::Object(c)) => (
            opt_bool(c, "blocking", "configuration.blocking")?.unwrap_or(true),
            opt_len(c, "historyLength", "configuration.historyLength")?,
        ),
        Some(_) => return Err(Error::invalid("configuration", "must be an object")),
    };
    let metadata = match p.remove("metadata") {
        None | Some(Value::Null) => None,
        Some(Value::Object(m)) => Some(m),
        Some(_) => return Err(Error::invalid("metadata", "must be an object")),
    };
    Ok(SendParams {
        request: SendRequest {
            message,
            context_id,
            task_id: task_id.map(TaskId::new),
            metadata,
        },
        blocking,
        history_length,
    })
}

/// The task id of a method: `taskId` or its alias `id` (both present and different is an
/// error). Required unless `optional`.
///
/// # Errors
/// -32602 naming `taskId`.
pub fn task_id_param(p: &Map<String, Value>, required: bool) -> Result<Option<String>, Error> {
    let task_id = opt_id(p, "taskId")?;
    let id = opt_id(p, "id")?;
    match (task_id, id) {
        (Some(a), Some(b)) if a != b => Err(Error::invalid(
            "taskId",
            "taskId and id differ; send one of them",
        )),
        (Some(a), _) | (None, Some(a)) => Ok(Some(a)),
        (None, None) if required => Err(Error::invalid("taskId", "is required")),
        (None, None) => Ok(None),
    }
}

/// An optional non-negative integer such as `historyLength`.
///
/// # Errors
/// -32602 naming `field`.
pub fn opt_len(p: &Map<String, Value>, key: &str, field: &str) -> Result<Option<usize>, Error> {
    match p.get(key) {
        None | Some(Value::Null) => Ok(None),
        Some(v) => v
            .as_u64()
            .map(|n| Some(usize::try_from(n).unwrap_or(usize::MAX)))
            .ok_or_else(|| Error::invalid(field, "must be a non-negative integer")),
    }
}

/// An optional boolean.
///
/// # Errors
/// -32602 naming `field`.
pub fn opt_bool(p: &Map<String, Value>, key: &str, field: &str) -> Result<Option<bool>, Error> {
    match p.get(key) {
        None | Some(Value::Null) => Ok(None),
        Some(Value::Bool(b)) => Ok(Some(*b)),
        Some(_) => Err(Error::invalid(field, "must be a boolean")),
    }
}

/// An optional string.
///
/// # Errors
/// -32602 naming `key`.
pub fn opt_str<'a>(p: &'a Map<String, Value>, key: &str) -> Result<Option<&'a str>, Error> {
    match p.get(key) {
        None | Some(Value::Null) => Ok(None),
        Some(Value::String(s)) => Ok(Some(s)),
        Some(_) => Err(Error::invalid(key, "must be a string")),
    }
}

fn opt_id(p: &Map<String, Value>, key: &str) -> Result<Option<String>, Error> {
    match opt_str(p, key)? {
        None => Ok(None),
        Some("") => Err(Error::invalid(key, "must not be empty")),
        Some(s) if s.chars().count() > MAX_ID_LEN => Err(Error::invalid(
            key,
            format!("must be at most {MAX_ID_LEN} characters"),
        )),
        Some(s) => Ok(Some(s.to_string())),
    }
}

fn parse_message(v: Value, limits: &AgentLimits) -> Result<Message, Error> {
    let Value::Object(mut m) = v else {
        return Err(Error::invalid("message", "must be an object"));
    };
    match m.get("role") {
        Some(Value::String(r)) if r == "user" => {}
        None | Some(Value::Null) => return Err(Error::invalid("message.role", "is required")),
        Some(_) => return Err(Error::invalid("message.role", "must be \"user\"")),
    }
    let message_id = match m.remove("messageId") {
        Some(Value::String(s)) if validate::is_uuid_v4(&s) => s,
        None | Some(Value::Null) => {
            return Err(Error::invalid("message.messageId", "is required"));
        }
        Some(_) => {
            return Err(Error::invalid(
                "message.messageId",
                "must be a UUID v4 (e.g. 6f1c2a1e-3b4d-4c5e-8f70-1a2b3c4d5e6f)",
            ));
        }
    };
    let parts = match m.remove("parts") {
        Some(Value::Array(parts)) if !parts.is_empty() => parts,
        Some(Value::Array(_)) => {
            return Err(Error::invalid("message.parts", "must not be empty"));
        }
        None | Some(Value::Null) => return Err(Error::invalid("message.parts", "is required")),
        Some(_) => return Err(Error::invalid("message.parts", "must be an array")),
    };
    let parts = parts
        .into_iter()
        .enumerate()
        .map(|(i, p)| parse_part(i, p, limits))
        .collect::<Result<Vec<_>, _>>()?;
    let message = Message {
        role: Role::User,
        parts,
        message_id,
    };
    validate::message_length(&message, limits)?;
    Ok(message)
}

fn parse_part(i: usize, v: Value, limits: &AgentLimits) -> Result<Part, Error> {
    let at = |k: &str| format!("message.parts[{i}]{k}");
    let Value::Object(mut p) = v else {
        return Err(Error::invalid(at(""), "must be an object"));
    };
    let kind = match (opt_str(&p, "type"), opt_str(&p, "kind")) {
        (Err(_), _) => return Err(Error::invalid(at(".type"), "must be a string")),
        (_, Err(_)) => return Err(Error::invalid(at(".kind"), "must be a string")),
        (Ok(Some(t)), Ok(Some(k))) if t != k => {
            return Err(Error::invalid(at(".type"), "type and kind differ"));
        }
        (Ok(Some(t)), _) | (Ok(None), Ok(Some(t))) => t.to_string(),
        (Ok(None), Ok(None)) => {
            return Err(Error::invalid(
                at(".type"),
                "is required (\"text\" or \"file\")",
            ));
        }
    };
    match kind.as_str() {
        "text" => match p.remove("text") {
            Some(Value::String(t)) => Ok(Part::Text(t)),
            None | Some(Value::Null) => Err(Error::invalid(at(".text"), "is required")),
            Some(_) => Err(Error::invalid(at(".text"), "must be a string")),
        },
        "file" => {
            let Some(Value::Object(mut f)) = p.remove("file") else {
                return Err(Error::invalid(
                    at(".file"),
                    "must be an object with name, mimeType and bytes",
                ));
            };
            let mut take = |k: &str| match f.remove(k) {
                Some(Value::String(s)) => Ok(s),
                None | Some(Value::Null) => {
                    Err(Error::invalid(at(&format!(".file.{k}")), "is required"))
                }
                Some(_) => Err(Error::invalid(
                    at(&format!(".file.{k}")),
                    "must be a string",
                )),
            };
            let name = take("name")?;
            let mime = take("mimeType")?;
            let bytes = take("bytes")?;
            validate::file_part(&at(".file"), name, mime, bytes, limits)
                .map(|f| Part::File(Box::new(f)))
        }
        other => Err(Error::invalid(
            at(".type"),
            format!("unknown part type {other:?}; expected \"text\" or \"file\""),
        )),
    }
}

/// Parses `tasks/pushNotificationConfig/set`'s `config`.
///
/// # Errors
/// -32602 naming the field.
pub fn push_config(p: &Map<String, Value>, allow_private: bool) -> Result<PushConfig, Error> {
    let c = match p.get("config") {
        Some(Value::Object(c)) => c,
        None | Some(Value::Null) => return Err(Error::invalid("config", "is required")),
        Some(_) => return Err(Error::invalid("config", "must be an object")),
    };
    let url = match c.get("url") {
        Some(Value::String(u)) => u.clone(),
        None | Some(Value::Null) => return Err(Error::invalid("config.url", "is required")),
        Some(_) => return Err(Error::invalid("config.url", "must be a string")),
    };
    crate::push::check_url(&url, allow_private)?;
    let headers = match c.get("headers") {
        None | Some(Value::Null) => Vec::new(),
        Some(Value::Object(h)) => h
            .iter()
            .map(|(k, v)| {
                let field = || format!("config.headers.{k}");
                let v = v
                    .as_str()
                    .ok_or_else(|| Error::invalid(field(), "must be a string"))?;
                if hyper::header::HeaderName::from_bytes(k.as_bytes()).is_err() {
                    return Err(Error::invalid(field(), "is not a valid header name"));
                }
                if hyper::header::HeaderValue::from_str(v).is_err() {
                    return Err(Error::invalid(field(), "is not a valid header value"));
                }
                Ok((k.clone(), v.to_string()))
            })
            .collect::<Result<_, _>>()?,
        Some(_) => {
            return Err(Error::invalid(
                "config.headers",
                "must be an object of strings",
            ));
        }
    };
    let events = match c.get("events") {
        None | Some(Value::Null) => WebhookEvent::ALL.to_vec(),
        Some(Value::Array(names)) => {
            let mut events = Vec::new();
            for (i, n) in names.iter().enumerate() {
                let field = format!("config.events[{i}]");
                let name = n
                    .as_str()
                    .ok_or_else(|| Error::invalid(&field, "must be a string"))?;
                let e = WebhookEvent::parse(name).ok_or_else(|| {
                    Error::invalid(
                        &field,
                        format!(
                            "unknown event {name:?}; known: {}",
                            WebhookEvent::ALL.map(WebhookEvent::as_str).join(", ")
                        ),
                    )
                })?;
                if !events.contains(&e) {
                    events.push(e);
                }
            }
            if events.is_empty() {
                return Err(Error::invalid(
                    "config.events",
                    "must name at least one event",
                ));
            }
            events
        }
        Some(_) => {
            return Err(Error::invalid(
                "config.events",
                "must be an array of event names",
            ));
        }
    };
    let retry = match c.get("retryPolicy") {
        None | Some(Value::Null) => RetryPolicy::default(),
        Some(Value::Object(r)) => retry_policy(r)?,
        Some(_) => return Err(Error::invalid("config.retryPolicy", "must be an object")),
    };
    let secret = match c.get("secret") {
        None | Some(Value::Null) => None,
        Some(Value::String(s)) if s.chars().count() >= 16 => Some(s.clone()),
        Some(Value::String(_)) => {
            return Err(Error::invalid(
                "config.secret",
                "must be at least 16 characters",
            ));
        }
        Some(_) => return Err(Error::invalid("config.secret", "must be a string")),
    };
    Ok(PushConfig {
        url,
        headers,
        events,
        retry,
        secret,
    })
}

fn retry_policy(r: &Map<String, Value>) -> Result<RetryPolicy, Error> {
    let d = RetryPolicy::default();
    let number = |k: &str, (lo, hi): (f64, f64), default: f64| -> Result<f64, Error> {
        let field = format!("config.retryPolicy.{k}");
        match r.get(k) {
            None | Some(Value::Null) => Ok(default),
            Some(v) => match v.as_f64() {
                Some(x) if x >= lo && x <= hi => Ok(x),
                _ => Err(Error::invalid(
                    field,
                    format!("must be a number from {lo} to {hi}"),
                )),
            },
        }
    };
    let max_retries = match r.get("maxRetries") {
        None | Some(Value::Null) => d.max_retries,
        Some(v) => match v.as_u64() {
            Some(n) if n <= u64::from(RetryPolicy::MAX_RETRIES.1) => n as u32,
            _ => {
                return Err(Error::invalid(
                    "config.retryPolicy.maxRetries",
                    format!(
                        "must be an integer from 0 to {}",
                        RetryPolicy::MAX_RETRIES.1
                    ),
                ));
            }
        },
    };
    Ok(RetryPolicy {
        max_retries,
        backoff_multiplier: number(
            "backoffMultiplier",
            RetryPolicy::BACKOFF_MULTIPLIER,
            d.backoff_multiplier,
        )?,
        initial_delay: number("initialDelay", RetryPolicy::INITIAL_DELAY, d.initial_delay)?,
    })
}

// === rendering ===

/// A message in this dialect's shape, as a JSON value (for webhook payloads).
pub fn message_value(m: &Message) -> Value {
    serde_json::to_value(MessageOut(m)).unwrap_or(Value::Null)
}

struct MessageOut<'a>(&'a Message);

impl Serialize for MessageOut<'_> {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        let m = self.0;
        let mut map = s.serialize_map(Some(3))?;
        let role = match m.role {
            Role::User => "user",
            Role::Agent => "agent",
        };
        map.serialize_entry("role", role)?;
        map.serialize_entry("parts", &PartsOut(&m.parts))?;
        map.serialize_entry("messageId", &m.message_id)?;
        map.end()
    }
}

struct PartsOut<'a>(&'a [Part]);

impl Serialize for PartsOut<'_> {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        let mut seq = s.serialize_seq(Some(self.0.len()))?;
        for part in self.0 {
            match part {
                Part::Text(text) => seq.serialize_element(&json_text(text))?,
                Part::File(f) => seq.serialize_element(&FileOut {
                    kind: "file",
                    file: FileInner {
                        name: &f.name,
                        mime_type: &f.mime_type,
                        bytes: &f.bytes,
                    },
                })?,
            }
        }
        seq.end()
    }
}

#[derive(Serialize)]
struct TextOut<'a> {
    #[serde(rename = "type")]
    kind: &'static str,
    text: &'a str,
}

fn json_text(text: &str) -> TextOut<'_> {
    TextOut { kind: "text", text }
}

#[derive(Serialize)]
struct FileOut<'a> {
    #[serde(rename = "type")]
    kind: &'static str,
    file: FileInner<'a>,
}

#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct FileInner<'a> {
    name: &'a str,
    mime_type: &'a str,
    bytes: &'a str,
}

struct StatusOut<'a>(&'a TaskStatus);

impl Serialize for StatusOut<'_> {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        let st = self.0;
        let mut map = s.serialize_map(None)?;
        map.serialize_entry("state", st.state.as_str())?;
        if let Some(m) = &st.message {
            map.serialize_entry("message", &MessageOut(m))?;
        }
        if let Some(r) = &st.reason {
            map.serialize_entry("reason", &**r)?;
        }
        if let Some(e) = &st.error {
            map.serialize_entry("error", &json!({ "code": e.code, "message": e.message }))?;
        }
        map.serialize_entry("timestamp", &iso8601(&st.timestamp))?;
        map.end()
    }
}

/// A task as `message/send` and `tasks/get` return it.
pub struct TaskOut<'a> {
    /// The task.
    pub task: &'a TaskSnapshot,
    /// Keep only the last N history entries.
    pub history_length: Option<usize>,
}

impl Serialize for TaskOut<'_> {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        let t = self.task;
        let history = match self.history_length {
            Some(n) => &t.history[t.history.len().saturating_sub(n)..],
            None => &t.history[..],
        };
        let mut map = s.serialize_map(Some(8))?;
        map.serialize_entry("id", t.id.as_str())?;
        map.serialize_entry("contextId", t.context_id.as_str())?;
        map.serialize_entry("status", &StatusOut(&t.status))?;
        map.serialize_entry("final", &t.status.state.is_terminal())?;
        map.serialize_entry("createdAt", &iso8601(&t.created_at))?;
        map.serialize_entry("updatedAt", &iso8601(&t.updated_at))?;
        map.serialize_entry("history", &HistoryOut(history))?;
        match &t.metadata {
            Some(m) => map.serialize_entry("metadata", &**m)?,
            None => map.serialize_entry("metadata", &Map::new())?,
        }
        map.end()
    }
}

struct HistoryOut<'a>(&'a [Arc<Message>]);

impl Serialize for HistoryOut<'_> {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_seq(self.0.iter().map(|m| MessageOut(m)))
    }
}

/// One stream event: `{id, contextId, status, final}`.
pub struct EventOut<'a> {
    /// The task id.
    pub task_id: &'a TaskId,
    /// The context id.
    pub context_id: &'a ContextId,
    /// The event.
    pub event: &'a TaskEvent,
}

impl Serialize for EventOut<'_> {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        let mut map = s.serialize_map(Some(4))?;
        map.serialize_entry("id", self.task_id.as_str())?;
        map.serialize_entry("contextId", self.context_id.as_str())?;
        map.serialize_entry("status", &StatusOut(&self.event.status))?;
        map.serialize_entry("final", &self.event.is_final())?;
        map.end()
    }
}

/// The cancellation result (spec 2.5.1).
pub fn cancel_result(t: &TaskSnapshot) -> Value {
    json!({
        "id": t.id.as_str(),
        "contextId": t.context_id.as_str(),
        "status": {
            "state": t.status.state.as_str(),
            "reason": t.status.reason.as_deref().unwrap_or("Canceled by user"),
            "timestamp": iso8601(&t.status.timestamp),
        },
        "canceled": true,
        "final": true,
    })
}

/// A stored push configuration as `get` returns it (secret never, header values masked).
pub fn push_config_out(c: Option<&StoredPushConfig>) -> Value {
    let Some(c) = c else {
        return json!({ "config": null, "configId": null, "active": false });
    };
    let headers: Map<String, Value> = c
        .config
        .headers
        .iter()
        .map(|(k, _)| (k.clone(), Value::from("***")))
        .collect();
    json!({
        "config": {
            "url": c.config.url,
            "events": c.config.events.iter().map(|e| e.as_str()).collect::<Vec<_>>(),
            "retryPolicy": {
                "maxRetries": c.config.retry.max_retries,
                "backoffMultiplier": c.config.retry.backoff_multiplier,
                "initialDelay": c.config.retry.initial_delay,
            },
            "headers": headers,
            "createdAt": iso8601(&c.created_at),
            "lastUsed": c.last_used().map(|t| iso8601(&t)),
            "taskId": c.scope.task.as_ref().map(TaskId::as_str),
        },
        "configId": c.id,
        "active": c.is_active(),
    })
}

/// The agent card (spec 2.7), with optional sections.
pub fn card_out(card: &AgentCard, capabilities: bool, metrics: bool) -> Value {
    let c = &card.config;
    let mut out = json!({
        "agent": {
            "id": c.id,
            "name": c.display_name(),
            "description": c.description,
            "version": c.version,
            "type": card.kind,
            "status": "active",
        },
        "limits": {
            "requestsPerMinute": c.limits.requests_per_minute,
            "concurrentTasks": c.limits.concurrent_tasks,
            "maxMessageLength": c.limits.max_message_length,
        },
    });
    if capabilities {
        out["capabilities"] = json!({
            "supportedMethods": METHODS,
            "fileUpload": {
                "supported": !c.limits.supported_types.is_empty() && c.limits.max_file_size > 0,
                "maxFileSize": c.limits.max_file_size,
                "supportedTypes": c.limits.supported_types,
            },
            "streaming": c.streaming,
            "multiTurn": true,
            "webhooks": c.webhooks,
        });
    }
    if metrics {
        out["metrics"] = json!({
            "totalRequests": card.metrics.total_requests,
            "averageResponseTime": card.metrics.average_response_time,
            "successRate": card.metrics.success_rate,
        });
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn params(v: Value) -> Map<String, Value> {
        match v {
            Value::Object(m) => m,
            _ => panic!("object"),
        }
    }

    fn field_of(r: Result<SendParams, Error>) -> String {
        match r {
            Err(Error::InvalidParams { field, .. }) => field,
            Err(e) => panic!("unexpected {e}"),
            Ok(_) => panic!("expected an error"),
        }
    }

    const MID: &str = "6f1c2a1e-3b4d-4c5e-8f70-1a2b3c4d5e6f";

    #[test]
    fn a_typical_send_parses_with_aliases() {
        let p = params(json!({
            "message": {"role": "user", "messageId": MID, "parts": [{"kind": "text", "text": "hi"}]},
            "sessionId": "ctx-1",
            "taskId": "t-1",
            "configuration": {"blocking": false},
        }));
        let s = send_params(p, &AgentLimits::default()).expect("valid");
        assert_eq!(s.request.context_id, Some(ContextId::new("ctx-1")));
        assert_eq!(s.request.task_id, Some(TaskId::new("t-1")));
        assert!(!s.blocking);
        assert_eq!(s.request.message.parts, vec![Part::Text("hi".into())]);
    }

    #[test]
    fn each_bad_field_is_named() {
        let l = AgentLimits::default();
        let msg = |m: Value| params(json!({ "message": m }));
        let cases = [
            (params(json!({})), "message"),
            (msg(json!("x")), "message"),
            (
                msg(
                    json!({"role": "agent", "messageId": MID, "parts": [{"type":"text","text":"a"}]}),
                ),
                "message.role",
            ),
            (
                msg(
                    json!({"role": "user", "messageId": "nope", "parts": [{"type":"text","text":"a"}]}),
                ),
                "message.messageId",
            ),
            (
                msg(json!({"role": "user", "messageId": MID, "parts": []})),
                "message.parts",
            ),
            (
                msg(json!({"role": "user", "messageId": MID, "parts": [{"type":"video"}]})),
                "message.parts[0].type",
            ),
            (
                msg(json!({"role": "user", "messageId": MID, "parts": [{"type":"text","text":5}]})),
                "message.parts[0].text",
            ),
            (
                msg(
                    json!({"role": "user", "messageId": MID, "parts": [{"type":"text","kind":"file","text":"a"}]}),
                ),
                "message.parts[0].type",
            ),
            (
                msg(
                    json!({"role": "user", "messageId": MID, "parts": [{"type":"file","file":{"name":"a","mimeType":"text/plain"}}]}),
                ),
                "message.parts[0].file.bytes",
            ),
        ];
        for (p, field) in cases {
            assert_eq!(field_of(send_params(p, &l)), field);
        }
        let both = params(json!({
            "message": {"role": "user", "messageId": MID, "parts": [{"type":"text","text":"a"}]},
            "contextId": "a", "sessionId": "b",
        }));
        assert_eq!(field_of(send_params(both, &l)), "contextId");
    }

    #[test]
    fn push_config_defaults_and_bounds() {
        let c = push_config(
            &params(json!({"config": {"url": "http://127.0.0.1:1/h"}})),
            true,
        )
        .expect("ok");
        assert_eq!(c.events.len(), 5);
        assert_eq!(c.retry, RetryPolicy::default());
        for bad in [
            json!({"config": {"url": "http://x/", "retryPolicy": {"maxRetries": 11}}}),
            json!({"config": {"url": "http://x/", "retryPolicy": {"backoffMultiplier": 0.5}}}),
            json!({"config": {"url": "http://x/", "retryPolicy": {"initialDelay": 0.01}}}),
            json!({"config": {"url": "http://x/", "secret": "short"}}),
            json!({"config": {"url": "http://x/", "events": ["task.done"]}}),
            json!({"config": {"url": "ftp://x/"}}),
            json!({"config": {}}),
        ] {
            assert!(push_config(&params(bad.clone()), true).is_err(), "{bad}");
        }
    }
}
