//! Official results out (docs/PROTOCOL.md §10.4): tasks, messages, parts, statuses, artifacts and
//! stream events in the 0.3 (JSON schema) and 1.0 (ProtoJSON) shapes. 1.0 omits unset
//! optional fields and never a required one.

use std::borrow::Cow;
use std::sync::Arc;

use serde::Serialize;
use serde::ser::{SerializeSeq, SerializeStruct, Serializer};
use serde_json::value::RawValue;
use serde_json::{Value, json};

use super::Version;
use crate::model::{
    Artifact, ContextId, Iso8601, Message, Part, Role, TaskEvent, TaskId, TaskSnapshot, TaskState,
    TaskStatus,
};
use crate::push::StoredPushConfig;
use crate::rpc::out::{self, OBJECT, Verbatim};
use crate::rpc::success;
use crate::runtime::StreamItem;
use crate::store::{ListPage, PageToken};

/// A state's wire name.
pub(crate) fn state_name(v: Version, s: TaskState) -> &'static str {
    match v {
        Version::V03 => match s {
            TaskState::Submitted => "submitted",
            TaskState::Working => "working",
            TaskState::Completed => "completed",
            TaskState::Failed => "failed",
            TaskState::Canceled => "canceled",
            TaskState::InputRequired => "input-required",
            TaskState::AuthRequired => "auth-required",
            TaskState::Rejected => "rejected",
        },
        Version::V10 => match s {
            TaskState::Submitted => "TASK_STATE_SUBMITTED",
            TaskState::Working => "TASK_STATE_WORKING",
            TaskState::Completed => "TASK_STATE_COMPLETED",
            TaskState::Failed => "TASK_STATE_FAILED",
            TaskState::Canceled => "TASK_STATE_CANCELED",
            TaskState::InputRequired => "TASK_STATE_INPUT_REQUIRED",
            TaskState::AuthRequired => "TASK_STATE_AUTH_REQUIRED",
            TaskState::Rejected => "TASK_STATE_REJECTED",
        },
    }
}

/// A task: 1.0 `Task`, 0.3 `{"kind": "task", ...}`.
pub(crate) struct TaskOut<'a> {
    pub(crate) v: Version,
    pub(crate) task: &'a TaskSnapshot,
    /// Keep the last N history entries (0: no `history`); `None`: all.
    pub(crate) history_length: Option<usize>,
    /// Whether `artifacts` are shown.
    pub(crate) artifacts: bool,
}

impl<'a> TaskOut<'a> {
    pub(crate) fn full(v: Version, task: &'a TaskSnapshot) -> Self {
        Self {
            v,
            task,
            history_length: None,
            artifacts: true,
        }
    }
}

impl Serialize for TaskOut<'_> {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        let (v, t) = (self.v, self.task);
        let history = match self.history_length {
            Some(n) => &t.history[t.history.len().saturating_sub(n)..],
            None => &t.history[..],
        };
        // A completed task's reply is its status message and the last of its history:
        // written once, copied the second time.
        let written =
            out::reply_written_once(t.status.message.as_ref(), history, |message| MessageOut {
                v,
                message,
                task_id: Some(&t.id),
                context_id: Some(&t.context_id),
                metadata: None,
            });
        let written = written.as_deref();
        let mut map = s.serialize_struct(OBJECT, 7)?;
        if v == Version::V03 {
            map.serialize_field("kind", "task")?;
        }
        map.serialize_field("id", t.id.as_str())?;
        map.serialize_field("contextId", t.context_id.as_str())?;
        map.serialize_field(
            "status",
            &StatusOut {
                v,
                status: &t.status,
                task_id: &t.id,
                context_id: &t.context_id,
                written,
            },
        )?;
        if self.artifacts && !t.artifacts.is_empty() {
            map.serialize_field("artifacts", &ArtifactsOut(v, &t.artifacts))?;
        }
        if !history.is_empty() {
            map.serialize_field(
                "history",
                &HistoryOut {
                    v,
                    history,
                    task_id: &t.id,
                    context_id: &t.context_id,
                    written,
                },
            )?;
        }
        // The request's metadata; omitted when there is none (or it is `{}`).
        if let Some(m) = t.metadata.as_deref().filter(|m| !is_empty_object(m)) {
            map.serialize_field("metadata", m)?;
        }
        map.end()
    }
}

pub(crate) fn is_empty_object(raw: &RawValue) -> bool {
    let mut chars = raw.get().chars().filter(|c| !c.is_ascii_whitespace());
    chars.next() == Some('{') && chars.next() == Some('}') && chars.next().is_none()
}

struct HistoryOut<'a> {
    v: Version,
    history: &'a [Arc<Message>],
    task_id: &'a TaskId,
    context_id: &'a ContextId,
    /// The last message as already written, when given.
    written: Option<&'a str>,
}

impl Serialize for HistoryOut<'_> {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        let (earlier, last) = match (self.written, self.history.split_last()) {
            (Some(written), Some((_, earlier))) => (earlier, Some(written)),
            _ => (self.history, None),
        };
        let mut seq = s.serialize_seq(Some(self.history.len()))?;
        for m in earlier {
            seq.serialize_element(&MessageOut {
                v: self.v,
                message: m,
                task_id: Some(self.task_id),
                context_id: Some(self.context_id),
                metadata: None,
            })?;
        }
        if let Some(written) = last {
            seq.serialize_element(&Verbatim(written))?;
        }
        seq.end()
    }
}

/// A message: 1.0 `Message`, 0.3 `{"kind": "message", ...}`.
pub(crate) struct MessageOut<'a> {
    pub(crate) v: Version,
    pub(crate) message: &'a Message,
    pub(crate) task_id: Option<&'a TaskId>,
    pub(crate) context_id: Option<&'a ContextId>,
    pub(crate) metadata: Option<Value>,
}

impl Serialize for MessageOut<'_> {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        let (v, m) = (self.v, self.message);
        let role = match (v, m.role) {
            (Version::V10, Role::User) => "ROLE_USER",
            (Version::V10, Role::Agent) => "ROLE_AGENT",
            (Version::V03, Role::User) => "user",
            (Version::V03, Role::Agent) => "agent",
        };
        let mut map = s.serialize_struct(OBJECT, 8)?;
        if v == Version::V03 {
            map.serialize_field("kind", "message")?;
        }
        map.serialize_field("messageId", &m.message_id)?;
        if let Some(c) = self.context_id {
            map.serialize_field("contextId", c.as_str())?;
        }
        if let Some(t) = self.task_id {
            map.serialize_field("taskId", t.as_str())?;
        }
        map.serialize_field("role", role)?;
        map.serialize_field("parts", &PartsOut(v, &m.parts))?;
        if let Some(meta) = &self.metadata {
            map.serialize_field("metadata", meta)?;
        }
        if !m.extensions.is_empty() {
            map.serialize_field("extensions", m.extensions.as_slice())?;
        }
        map.end()
    }
}

struct PartsOut<'a>(Version, &'a [Part]);

impl Serialize for PartsOut<'_> {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        let mut seq = s.serialize_seq(Some(self.1.len()))?;
        for part in self.1 {
            seq.serialize_element(&PartOut(self.0, part))?;
        }
        seq.end()
    }
}

struct PartOut<'a>(Version, &'a Part);

impl Serialize for PartOut<'_> {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        let mut map = s.serialize_struct(OBJECT, 4)?;
        match (self.0, self.1) {
            (Version::V10, Part::Text(t)) => map.serialize_field("text", t)?,
            (Version::V10, Part::File(f)) => {
                map.serialize_field("raw", &f.bytes)?;
                map.serialize_field("filename", &f.name)?;
                map.serialize_field("mediaType", &f.mime_type)?;
                if let Some(m) = &f.metadata {
                    map.serialize_field("metadata", &*m.0)?;
                }
            }
            (Version::V10, Part::Url(u)) => {
                map.serialize_field("url", &u.url)?;
                if let Some(n) = &u.name {
                    map.serialize_field("filename", n)?;
                }
                if let Some(m) = &u.mime_type {
                    map.serialize_field("mediaType", m)?;
                }
                if let Some(m) = &u.metadata {
                    map.serialize_field("metadata", &*m.0)?;
                }
            }
            (Version::V10, Part::Data(d)) => {
                map.serialize_field("data", &*d.data.0)?;
                if let Some(m) = &d.media_type {
                    map.serialize_field("mediaType", m)?;
                }
                if let Some(m) = &d.metadata {
                    map.serialize_field("metadata", &*m.0)?;
                }
            }
            (Version::V03, Part::Text(t)) => {
                map.serialize_field("kind", "text")?;
                map.serialize_field("text", t)?;
            }
            (Version::V03, Part::File(f)) => {
                map.serialize_field("kind", "file")?;
                map.serialize_field(
                    "file",
                    &json!({"bytes": f.bytes, "name": f.name, "mimeType": f.mime_type}),
                )?;
                if let Some(m) = &f.metadata {
                    map.serialize_field("metadata", &*m.0)?;
                }
            }
            (Version::V03, Part::Url(u)) => {
                map.serialize_field("kind", "file")?;
                let mut file = json!({"uri": u.url});
                if let Some(n) = &u.name {
                    file["name"] = json!(n);
                }
                if let Some(m) = &u.mime_type {
                    file["mimeType"] = json!(m);
                }
                map.serialize_field("file", &file)?;
                if let Some(m) = &u.metadata {
                    map.serialize_field("metadata", &*m.0)?;
                }
            }
            (Version::V03, Part::Data(d)) => {
                map.serialize_field("kind", "data")?;
                // 0.3's data is an object: another value is shown as `{"value": …}`.
                if d.data.get().starts_with('{') {
                    map.serialize_field("data", &*d.data.0)?;
                } else {
                    map.serialize_field("data", &ValueObject(&d.data.0))?;
                }
                if let Some(m) = &d.metadata {
                    map.serialize_field("metadata", &*m.0)?;
                }
            }
        }
        map.end()
    }
}

/// A status: `{state, message?, timestamp}`. A canceled task's message says the reason; a
/// failed one's says the error, with it in the message's `metadata.error`.
pub(crate) struct StatusOut<'a> {
    pub(crate) v: Version,
    pub(crate) status: &'a TaskStatus,
    pub(crate) task_id: &'a TaskId,
    pub(crate) context_id: &'a ContextId,
    /// The status's own message as already written, when given.
    pub(crate) written: Option<&'a str>,
}

impl Serialize for StatusOut<'_> {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        let st = self.status;
        let mut map = s.serialize_struct(OBJECT, 4)?;
        map.serialize_field("state", state_name(self.v, st.state))?;
        let (message, metadata) = match self.written {
            Some(written) => {
                map.serialize_field("message", &Verbatim(written))?;
                (None, None)
            }
            None => status_message(st, self.task_id),
        };
        if let Some(message) = &message {
            map.serialize_field(
                "message",
                &MessageOut {
                    v: self.v,
                    message,
                    task_id: Some(self.task_id),
                    context_id: Some(self.context_id),
                    metadata,
                },
            )?;
        }
        map.serialize_field("timestamp", &Iso8601::of(&st.timestamp))?;
        map.end()
    }
}

/// The message a status shows: its own, or — a canceled or failed task's status without
/// one — an agent message the server makes up saying the reason or the error (the error
/// also in the message's `metadata.error`), with an id derived from the task and time.
pub(crate) fn status_message<'a>(
    st: &'a TaskStatus,
    task_id: &TaskId,
) -> (Option<Cow<'a, Message>>, Option<Value>) {
    if let Some(m) = &st.message {
        return (Some(Cow::Borrowed(&**m)), None);
    }
    let made_up = |text: String| {
        let mut m = Message::agent_text([text]);
        m.message_id = derived_id(&format!("{task_id}:{}", st.timestamp));
        Some(Cow::Owned(m))
    };
    match (&st.reason, &st.error) {
        (Some(reason), _) => (made_up(reason.to_string()), None),
        (None, Some(e)) => (
            made_up(e.message.clone()),
            Some(json!({"error": {"code": e.code, "message": e.message}})),
        ),
        (None, None) => (None, None),
    }
}

/// A stable UUID for a message the server makes up (so every view shows the same id).
fn derived_id(seed: &str) -> String {
    const NAMESPACE: uuid::Uuid = uuid::Uuid::from_u128(0x5b1e_2a2d_9c1e_4e0b_8a6f_a2ad_0000_0002);
    uuid::Uuid::new_v5(&NAMESPACE, seed.as_bytes()).to_string()
}

struct ArtifactsOut<'a>(Version, &'a [Arc<Artifact>]);

impl Serialize for ArtifactsOut<'_> {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_seq(self.1.iter().map(|a| ArtifactOut(self.0, a)))
    }
}

struct ArtifactOut<'a>(Version, &'a Artifact);

impl Serialize for ArtifactOut<'_> {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        let a = self.1;
        let mut map = s.serialize_struct(OBJECT, 5)?;
        map.serialize_field("artifactId", &a.artifact_id)?;
        if let Some(n) = &a.name {
            map.serialize_field("name", n)?;
        }
        if let Some(d) = &a.description {
            map.serialize_field("description", d)?;
        }
        map.serialize_field("parts", &PartsOut(self.0, &a.parts))?;
        if !a.extensions.is_empty() {
            map.serialize_field("extensions", a.extensions.as_slice())?;
        }
        map.end()
    }
}

/// `{"value": <v>}`: how 0.3 shows a data part whose value is not an object.
struct ValueObject<'a>(&'a RawValue);

impl Serialize for ValueObject<'_> {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        let mut map = s.serialize_struct(OBJECT, 1)?;
        map.serialize_field("value", self.0)?;
        map.end()
    }
}

/// One stream item as the `result` of its `data:` line. The first item of a stream is
/// the task; later ones are status or artifact updates.
pub(crate) struct EventOut<'a> {
    pub(crate) v: Version,
    pub(crate) event: &'a TaskEvent,
    pub(crate) task: &'a TaskSnapshot,
    pub(crate) first: bool,
}

impl Serialize for EventOut<'_> {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        let (v, event, t) = (self.v, self.event, self.task);
        if self.first {
            let t = crate::stream::task_at(event, t);
            return SendResultOut(TaskOut::full(v, &t)).serialize(s);
        }
        let mut map = s.serialize_struct(OBJECT, 6)?;
        let status = StatusOut {
            v,
            status: &event.status,
            task_id: &t.id,
            context_id: &t.context_id,
            written: None,
        };
        match (&event.artifact, v) {
            (Some(update), Version::V10) => {
                let mut inner = json!({
                    "taskId": t.id.as_str(),
                    "contextId": t.context_id.as_str(),
                    "artifact": ArtifactOut(v, &update.artifact),
                });
                if update.append {
                    inner["append"] = json!(true);
                }
                if update.last_chunk {
                    inner["lastChunk"] = json!(true);
                }
                map.serialize_field("artifactUpdate", &inner)?;
            }
            (Some(update), Version::V03) => {
                map.serialize_field("kind", "artifact-update")?;
                map.serialize_field("taskId", t.id.as_str())?;
                map.serialize_field("contextId", t.context_id.as_str())?;
                map.serialize_field("artifact", &ArtifactOut(v, &update.artifact))?;
                map.serialize_field("append", &update.append)?;
                map.serialize_field("lastChunk", &update.last_chunk)?;
            }
            (None, Version::V10) => {
                map.serialize_field(
                    "statusUpdate",
                    &json!({
                        "taskId": t.id.as_str(),
                        "contextId": t.context_id.as_str(),
                        "status": status,
                    }),
                )?;
            }
            (None, Version::V03) => {
                map.serialize_field("kind", "status-update")?;
                map.serialize_field("taskId", t.id.as_str())?;
                map.serialize_field("contextId", t.context_id.as_str())?;
                map.serialize_field("status", &status)?;
                map.serialize_field("final", &event.is_final())?;
            }
        }
        map.end()
    }
}

/// The `data:` of one stream item on the 1.0 path.
pub(crate) fn sse_data_10(id: &RawValue, item: &StreamItem, first: bool) -> Vec<u8> {
    success(
        id,
        &EventOut {
            v: Version::V10,
            event: &item.event,
            task: &item.task,
            first,
        },
    )
}

/// The `data:` of one stream item of the 1.0 HTTP+JSON binding: the `StreamResponse`
/// itself (no JSON-RPC envelope; the request id is not used).
pub(crate) fn sse_data_bare(_id: &RawValue, item: &StreamItem, first: bool) -> Vec<u8> {
    crate::rpc::out::to_vec(&EventOut {
        v: Version::V10,
        event: &item.event,
        task: &item.task,
        first,
    })
    .unwrap_or_default()
}

/// The `data:` of one stream item on the 0.3 path.
pub(crate) fn sse_data_03(id: &RawValue, item: &StreamItem, first: bool) -> Vec<u8> {
    success(
        id,
        &EventOut {
            v: Version::V03,
            event: &item.event,
            task: &item.task,
            first,
        },
    )
}

/// The result of a send: 1.0 `{"task": ...}`, 0.3 the task.
pub(crate) struct SendResultOut<'a>(pub(crate) TaskOut<'a>);

impl Serialize for SendResultOut<'_> {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        match self.0.v {
            Version::V10 => {
                let mut map = s.serialize_struct(OBJECT, 1)?;
                map.serialize_field("task", &self.0)?;
                map.end()
            }
            Version::V03 => self.0.serialize(s),
        }
    }
}

/// A bare agent message as a send result: 1.0 `{"message": ...}`, 0.3 the message.
pub(crate) fn message_result(v: Version, message: &Message, context: Option<&ContextId>) -> Value {
    let out = MessageOut {
        v,
        message,
        task_id: None,
        context_id: context,
        metadata: None,
    };
    match v {
        Version::V10 => json!({ "message": out }),
        Version::V03 => json!(out),
    }
}

/// A ListTasks result. The page stops early — its `nextPageToken` then names the last task
/// it holds — once its tasks would pass `max_bytes` (`server.max_list_page_bytes`); it
/// always holds at least one task, so paging always advances.
pub(crate) fn list_result(
    page: &ListPage,
    page_size: usize,
    history_length: Option<usize>,
    artifacts: bool,
    max_bytes: usize,
) -> ListOut {
    let mut tasks = Vec::with_capacity(page.tasks.len());
    let mut bytes = 0usize;
    let mut next = page.next.clone();
    for (i, t) in page.tasks.iter().enumerate() {
        let view = TaskOut {
            v: Version::V10,
            task: t,
            history_length,
            artifacts,
        };
        let Ok(raw) = serde_json::value::to_raw_value(&view) else {
            continue;
        };
        bytes = bytes.saturating_add(raw.get().len());
        if i > 0 && bytes > max_bytes {
            next = page.tasks.get(i - 1).map(|t| PageToken::of(t));
            break;
        }
        tasks.push(raw);
    }
    ListOut {
        tasks,
        next_page_token: next.as_ref().map(super::token::encode).unwrap_or_default(),
        page_size,
        total_size: page.total,
    }
}

/// The body of a ListTasks result.
#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
pub(crate) struct ListOut {
    tasks: Vec<Box<RawValue>>,
    next_page_token: String,
    page_size: usize,
    total_size: usize,
}

/// The authentication of a stored configuration, as it was set.
fn authentication(c: &StoredPushConfig) -> Option<(String, Option<String>)> {
    match (&c.config.authorization, &c.config.secret) {
        (Some(a), _) => Some((a.scheme.clone(), a.credentials.clone())),
        // The signing secret never travels back.
        (None, Some(_)) => Some(("HMAC-SHA256".into(), None)),
        (None, None) => None,
    }
}

/// A stored configuration: 1.0 `TaskPushNotificationConfig`, 0.3
/// `{taskId, pushNotificationConfig}`.
pub(crate) fn push_config(v: Version, c: &StoredPushConfig) -> Value {
    let task = c.scope.task.as_ref().map(TaskId::as_str).unwrap_or("");
    let url = crate::push::redact_url(&c.config.url);
    match v {
        Version::V10 => {
            let mut out = json!({"taskId": task, "id": c.id, "url": url});
            if let Some(t) = &c.config.token {
                out["token"] = json!(t);
            }
            if let Some((scheme, credentials)) = authentication(c) {
                let mut a = json!({"scheme": scheme});
                if let Some(cr) = credentials {
                    a["credentials"] = json!(cr);
                }
                out["authentication"] = a;
            }
            out
        }
        Version::V03 => {
            let mut inner = json!({"id": c.id, "url": url});
            if let Some(t) = &c.config.token {
                inner["token"] = json!(t);
            }
            if let Some((scheme, credentials)) = authentication(c) {
                let mut a = json!({"schemes": [scheme]});
                if let Some(cr) = credentials {
                    a["credentials"] = json!(cr);
                }
                inner["authentication"] = a;
            }
            json!({"taskId": task, "pushNotificationConfig": inner})
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_reply_written_once_and_copied_reads_as_one_written_twice() {
        for v in [Version::V10, Version::V03] {
            let (shared, copies) = crate::model::completed_sharing_its_reply();
            let once = out::to_vec(&TaskOut::full(v, &shared)).expect("rendered");
            let twice = out::to_vec(&TaskOut::full(v, &copies)).expect("rendered");
            assert_eq!(
                String::from_utf8_lossy(&once),
                String::from_utf8_lossy(&twice)
            );
            // `serde_json`'s writer copies the written reply verbatim too.
            let by_serde_json = serde_json::to_vec(&TaskOut::full(v, &shared)).expect("json");
            assert_eq!(by_serde_json, once);
            // A history cut before the reply shows the status's own.
            let mut cut = TaskOut::full(v, &shared);
            cut.history_length = Some(0);
            let cut = out::to_vec(&cut).expect("rendered");
            assert!(String::from_utf8_lossy(&cut).contains("second"));
        }
    }
}
