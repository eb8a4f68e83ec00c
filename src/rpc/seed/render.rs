//! Seed results out: the neutral model in this dialect's shapes (`type` discriminators,
//! `final`, `createdAt`, the reply as an artifact, ...).

use std::sync::Arc;

use serde::Serialize;
use serde::ser::{SerializeSeq, SerializeStruct, Serializer};
use serde_json::value::RawValue;
use serde_json::{Map, Value, json};

use super::METHODS;
use crate::model::{
    Artifact, Iso8601, Message, Part, Role, TaskId, TaskSnapshot, TaskState, TaskStatus, iso8601,
};
use crate::push::{Events, StoredPushConfig, WebhookEvent};
use crate::rpc::out::{self, OBJECT, Verbatim};
use crate::rpc::success;
use crate::runtime::{AgentCard, StreamItem};

/// A message in this dialect's shape.
pub(super) struct MessageOut<'a>(pub(super) &'a Message);

impl Serialize for MessageOut<'_> {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        let m = self.0;
        let mut map = s.serialize_struct(OBJECT, 3)?;
        let role = match m.role {
            Role::User => "user",
            Role::Agent => "agent",
        };
        map.serialize_field("role", role)?;
        map.serialize_field("parts", &PartsOut(&m.parts))?;
        map.serialize_field("messageId", &m.message_id)?;
        if !m.extensions.is_empty() {
            map.serialize_field("extensions", m.extensions.as_slice())?;
        }
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
                    metadata: f.metadata.as_ref().map(|m| &*m.0),
                })?,
                // docs/PROTOCOL.md §12: the shapes of the official 0.3 dialect, with `type`.
                Part::Data(d) => {
                    let mut out = json!({"type": "data", "data": &*d.data.0});
                    if let Some(m) = &d.media_type {
                        out["mediaType"] = json!(m);
                    }
                    if let Some(m) = &d.metadata {
                        out["metadata"] = json!(&*m.0);
                    }
                    seq.serialize_element(&out)?
                }
                Part::Url(u) => {
                    let mut file = json!({"uri": u.url});
                    if let Some(n) = &u.name {
                        file["name"] = json!(n);
                    }
                    if let Some(m) = &u.mime_type {
                        file["mimeType"] = json!(m);
                    }
                    let mut out = json!({"type": "file", "file": file});
                    if let Some(m) = &u.metadata {
                        out["metadata"] = json!(&*m.0);
                    }
                    seq.serialize_element(&out)?
                }
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
    #[serde(skip_serializing_if = "Option::is_none")]
    metadata: Option<&'a RawValue>,
}

#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct FileInner<'a> {
    name: &'a str,
    mime_type: &'a str,
    bytes: &'a str,
}

/// A status; its message as already written (`.1`) when the reply holds it twice, and its
/// timestamp as already formatted (`.2`) when the task's `updatedAt` is the same instant.
struct StatusOut<'a>(&'a TaskStatus, Option<&'a str>, Option<&'a Iso8601>);

impl Serialize for StatusOut<'_> {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        let st = self.0;
        let mut map = s.serialize_struct(OBJECT, 5)?;
        map.serialize_field("state", st.state.as_str())?;
        match (self.1, &st.message) {
            (Some(written), Some(_)) => map.serialize_field("message", &Verbatim(written))?,
            (None, Some(m)) => map.serialize_field("message", &MessageOut(m))?,
            (_, None) => {}
        }
        if let Some(r) = &st.reason {
            map.serialize_field("reason", &**r)?;
        }
        if let Some(e) = &st.error {
            map.serialize_field("error", &json!({ "code": e.code, "message": e.message }))?;
        }
        match self.2 {
            Some(formatted) => map.serialize_field("timestamp", formatted)?,
            None => map.serialize_field("timestamp", &Iso8601::of(&st.timestamp))?,
        }
        map.end()
    }
}

/// A task as `message/send` and `tasks/get` return it.
pub(crate) struct TaskOut<'a> {
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
        // A completed task's reply is its status message and the last of its history:
        // written once, copied the second time.
        let written = out::reply_written_once(t.status.message.as_ref(), history, MessageOut);
        let written = written.as_deref();
        let mut map = s.serialize_struct(OBJECT, 10)?;
        map.serialize_field("id", t.id.as_str())?;
        map.serialize_field("contextId", t.context_id.as_str())?;
        // The status's time is the task's `updatedAt` (its last change): formatted once.
        let updated = Iso8601::of(&t.updated_at);
        let same = (t.status.timestamp == t.updated_at).then_some(&updated);
        map.serialize_field("status", &StatusOut(&t.status, written, same))?;
        map.serialize_field("final", &t.status.state.is_terminal())?;
        map.serialize_field("createdAt", &Iso8601::of(&t.created_at))?;
        map.serialize_field("updatedAt", &updated)?;
        map.serialize_field("history", &HistoryOut(history, written))?;
        if t.status.state == TaskState::Completed {
            map.serialize_field("artifacts", &ArtifactsOut(&t.status, &t.artifacts))?;
        }
        match &t.metadata {
            Some(m) => map.serialize_field("metadata", &**m)?,
            None => map.serialize_field("metadata", &Map::new())?,
        }
        if !t.extensions.is_empty() {
            map.serialize_field("extensions", t.extensions.as_slice())?;
        }
        map.end()
    }
}

/// A history; its last message as already written (`.1`), when given.
struct HistoryOut<'a>(&'a [Arc<Message>], Option<&'a str>);

impl Serialize for HistoryOut<'_> {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        let (earlier, last) = match (self.1, self.0.split_last()) {
            (Some(written), Some((_, earlier))) => (earlier, Some(written)),
            _ => (self.0, None),
        };
        let mut seq = s.serialize_seq(Some(self.0.len()))?;
        for m in earlier {
            seq.serialize_element(&MessageOut(m))?;
        }
        if let Some(written) = last {
            seq.serialize_element(&Verbatim(written))?;
        }
        seq.end()
    }
}

/// The `data:` of one stream event: a response whose result is
/// `{id, contextId, status, final}` (+ `artifact` on an artifact event; never
/// `artifacts`, docs/PROTOCOL.md §5).
pub(crate) fn sse_data(id: &RawValue, item: &StreamItem, _first: bool) -> Vec<u8> {
    success(id, &EventOut(item))
}

struct EventOut<'a>(&'a StreamItem);

impl Serialize for EventOut<'_> {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        let (event, task) = (&self.0.event, &self.0.task);
        let mut map = s.serialize_struct(OBJECT, 5)?;
        map.serialize_field("id", task.id.as_str())?;
        map.serialize_field("contextId", task.context_id.as_str())?;
        map.serialize_field("status", &StatusOut(&event.status, None, None))?;
        map.serialize_field("final", &event.is_final())?;
        // Never `artifacts` (docs/PROTOCOL.md §5): Evo AI's stream client shows every text an
        // event holds, and the reply is in `status.message` already.
        if let Some(update) = &event.artifact {
            map.serialize_field(
                "artifact",
                &json!({
                    "artifactId": update.artifact.artifact_id,
                    "name": update.artifact.name,
                    "parts": PartsOut(&update.artifact.parts),
                    "append": update.append,
                    "lastChunk": update.last_chunk,
                }),
            )?;
        }
        map.end()
    }
}

/// A completed task's artifacts: its reply first (as [`ReplyArtifact`]), then what the
/// agent made.
struct ArtifactsOut<'a>(&'a TaskStatus, &'a [Arc<Artifact>]);

impl Serialize for ArtifactsOut<'_> {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        let mut seq = s.serialize_seq(None)?;
        if let Some(reply) = ReplyArtifact::of(self.0) {
            seq.serialize_element(&reply)?;
        }
        for a in self.1 {
            seq.serialize_element(&json!({
                "artifactId": a.artifact_id,
                "name": a.name,
                "parts": PartsOut(&a.parts),
            }))?;
        }
        seq.end()
    }
}

/// A completed task's reply as Evo AI's clients read it (`result.artifacts[0].parts`):
/// `{"artifactId", "name": "reply", "parts"}`. The same reply is `status.message`; the
/// artifact id is derived from the reply's message id, so it is the same in every view.
struct ReplyArtifact<'a>(&'a Message);

impl<'a> ReplyArtifact<'a> {
    /// Namespace of the derived artifact ids (a UUID v5 of the reply's message id).
    const NAMESPACE: uuid::Uuid = uuid::Uuid::from_u128(0x5b1e_2a2d_9c1e_4e0b_8a6f_a2ad_0000_0001);

    fn of(status: &'a TaskStatus) -> Option<Self> {
        match (&status.state, &status.message) {
            (TaskState::Completed, Some(m)) => Some(Self(m)),
            _ => None,
        }
    }
}

impl Serialize for ReplyArtifact<'_> {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        let id = uuid::Uuid::new_v5(&Self::NAMESPACE, self.0.message_id.as_bytes());
        let mut map = s.serialize_struct(OBJECT, 3)?;
        map.serialize_field(
            "artifactId",
            id.hyphenated()
                .encode_lower(&mut uuid::Uuid::encode_buffer()),
        )?;
        map.serialize_field("name", "reply")?;
        map.serialize_field("parts", &PartsOut(&self.0.parts))?;
        map.end()
    }
}

/// The cancellation result (spec 2.5.1).
pub(crate) fn cancel_result(t: &TaskSnapshot) -> Value {
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
pub(crate) fn push_config_out(c: Option<&StoredPushConfig>) -> Value {
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
            "url": crate::push::redact_url(&c.config.url),
            "events": event_names(&c.config.events),
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

/// The seed names of the events a configuration selects.
pub(super) fn event_names(events: &Events) -> Vec<&'static str> {
    match events {
        Events::All => WebhookEvent::ALL.map(WebhookEvent::as_str).to_vec(),
        Events::StateChanges(names) => names.iter().map(|e| e.as_str()).collect(),
    }
}

/// The agent card (spec 2.7), with optional sections.
pub(crate) fn card_out(card: &AgentCard, capabilities: bool, metrics: bool) -> Value {
    let c = &card.config;
    let mut out = json!({
        "agent": {
            "id": c.id,
            "name": c.display_name(),
            "description": c.description(),
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
            "streaming": c.streaming(),
            "multiTurn": true,
            "webhooks": c.webhooks,
        });
        if !c.extensions.is_empty() {
            out["capabilities"]["extensions"] = c.extensions_json();
        }
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

    #[test]
    fn a_reply_written_once_and_copied_reads_as_one_written_twice() {
        let (shared, copies) = crate::model::completed_sharing_its_reply();
        let out = |t| TaskOut {
            task: t,
            history_length: None,
        };
        let once = out::to_vec(&out(&shared)).expect("rendered");
        let twice = out::to_vec(&out(&copies)).expect("rendered");
        assert_eq!(
            String::from_utf8_lossy(&once),
            String::from_utf8_lossy(&twice)
        );
        assert_eq!(serde_json::to_vec(&out(&shared)).expect("json"), once);
        let cut = out::to_vec(&TaskOut {
            task: &shared,
            history_length: Some(1),
        })
        .expect("rendered");
        assert_eq!(
            serde_json::from_slice::<Value>(&cut).expect("json")["history"][0]["messageId"],
            serde_json::from_slice::<Value>(&once).expect("json")["status"]["message"]["messageId"]
        );
    }
}
