//! Official 1.0 results out as protobuf messages (the gRPC binding, docs/PROTOCOL.md
//! §10.13): tasks, messages, parts, statuses, artifacts and stream events built straight
//! from the model, in the shapes `render.rs` gives them in ProtoJSON — the test below holds
//! the two to the same message. The results a send or a stream carries come this way; the
//! rarer ones (lists, push configurations, the card) go through their ProtoJSON.

use base64::Engine as _;
use base64::engine::general_purpose::STANDARD;
use serde_json::value::RawValue;

use super::pb;
use super::render::{is_empty_object, status_message};
use crate::model::{
    Artifact, ContextId, Message, Part, Role, TaskId, TaskSnapshot, TaskState, TaskStatus,
};
use crate::runtime::StreamItem;

/// A task, its last `history_length` history entries (`None`: all), its artifacts when
/// `artifacts`.
pub(crate) fn task(t: &TaskSnapshot, history_length: Option<usize>, artifacts: bool) -> pb::Task {
    let history = match history_length {
        Some(n) => &t.history[t.history.len().saturating_sub(n)..],
        None => &t.history[..],
    };
    pb::Task {
        id: t.id.as_str().to_owned(),
        context_id: t.context_id.as_str().to_owned(),
        status: Some(status(&t.status, &t.id, &t.context_id)),
        artifacts: if artifacts {
            t.artifacts.iter().map(|a| artifact(a)).collect()
        } else {
            Vec::new()
        },
        history: history
            .iter()
            .map(|m| message(m, Some(&t.id), Some(&t.context_id), None))
            .collect(),
        metadata: t
            .metadata
            .as_deref()
            .filter(|m| !is_empty_object(m))
            .and_then(structure),
    }
}

/// A message, in its task and conversation when given.
pub(crate) fn message(
    m: &Message,
    task_id: Option<&TaskId>,
    context_id: Option<&ContextId>,
    metadata: Option<pbjson_types::Struct>,
) -> pb::Message {
    pb::Message {
        message_id: m.message_id.clone(),
        context_id: context_id
            .map(|c| c.as_str().to_owned())
            .unwrap_or_default(),
        task_id: task_id.map(|t| t.as_str().to_owned()).unwrap_or_default(),
        role: match m.role {
            Role::User => pb::Role::User,
            Role::Agent => pb::Role::Agent,
        } as i32,
        parts: m.parts.iter().map(part).collect(),
        metadata,
        extensions: Vec::new(),
        reference_task_ids: Vec::new(),
    }
}

fn part(p: &Part) -> pb::Part {
    use pb::part::Content;
    let (content, filename, media_type) = match p {
        Part::Text(t) => (Content::Text(t.clone()), None, None),
        // Checked Base64 when it came in; the bytes themselves on this wire.
        Part::File(f) => (
            Content::Raw(STANDARD.decode(&f.bytes).unwrap_or_default()),
            Some(&f.name),
            Some(&f.mime_type),
        ),
        Part::Url(u) => (
            Content::Url(u.url.clone()),
            u.name.as_ref(),
            u.mime_type.as_ref(),
        ),
        Part::Data(d) => (
            Content::Data(serde_json::from_str(d.get()).unwrap_or_default()),
            None,
            None,
        ),
    };
    pb::Part {
        metadata: None,
        filename: filename.cloned().unwrap_or_default(),
        media_type: media_type.cloned().unwrap_or_default(),
        content: Some(content),
    }
}

/// A status; its message as `render::status_message` gives it.
fn status(st: &TaskStatus, task_id: &TaskId, context_id: &ContextId) -> pb::TaskStatus {
    let (shown, metadata) = status_message(st, task_id);
    pb::TaskStatus {
        state: state(st.state) as i32,
        message: shown.map(|m| {
            message(
                &m,
                Some(task_id),
                Some(context_id),
                metadata.and_then(|v| serde_json::from_value(v).ok()),
            )
        }),
        // Milliseconds, as the JSON bindings' ISO 8601 times.
        timestamp: Some(pbjson_types::Timestamp {
            seconds: st.timestamp.timestamp(),
            nanos: i32::try_from(st.timestamp.timestamp_subsec_millis() * 1_000_000).unwrap_or(0),
        }),
    }
}

fn state(s: TaskState) -> pb::TaskState {
    match s {
        TaskState::Submitted => pb::TaskState::Submitted,
        TaskState::Working => pb::TaskState::Working,
        TaskState::Completed => pb::TaskState::Completed,
        TaskState::Failed => pb::TaskState::Failed,
        TaskState::Canceled => pb::TaskState::Canceled,
        TaskState::InputRequired => pb::TaskState::InputRequired,
        TaskState::AuthRequired => pb::TaskState::AuthRequired,
        TaskState::Rejected => pb::TaskState::Rejected,
    }
}

fn artifact(a: &Artifact) -> pb::Artifact {
    pb::Artifact {
        artifact_id: a.artifact_id.clone(),
        name: a.name.clone().unwrap_or_default(),
        description: a.description.clone().unwrap_or_default(),
        parts: a.parts.iter().map(part).collect(),
        metadata: None,
        extensions: Vec::new(),
    }
}

/// A JSON object as a `Struct` (`None`: not an object).
fn structure(raw: &RawValue) -> Option<pbjson_types::Struct> {
    serde_json::from_str(raw.get()).ok()
}

/// One stream item: the first is the task; later ones are status or artifact updates.
pub(crate) fn event(item: &StreamItem, first: bool) -> pb::StreamResponse {
    use pb::stream_response::Payload;
    let t = &item.task;
    let payload = if first {
        Payload::Task(task(t, None, true))
    } else if let Some(update) = &item.event.artifact {
        Payload::ArtifactUpdate(pb::TaskArtifactUpdateEvent {
            task_id: t.id.as_str().to_owned(),
            context_id: t.context_id.as_str().to_owned(),
            artifact: Some(artifact(&update.artifact)),
            append: update.append,
            last_chunk: update.last_chunk,
            metadata: None,
        })
    } else {
        Payload::StatusUpdate(pb::TaskStatusUpdateEvent {
            task_id: t.id.as_str().to_owned(),
            context_id: t.context_id.as_str().to_owned(),
            status: Some(status(&item.event.status, &t.id, &t.context_id)),
            metadata: None,
        })
    };
    pb::StreamResponse {
        payload: Some(payload),
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use serde::de::DeserializeOwned;

    use super::*;
    use crate::model::{
        ArtifactUpdate, FileContent, FileUrl, RawJson, TaskError, TaskEvent, iso8601,
    };
    use crate::rpc::a2a::Version;
    use crate::rpc::a2a::render::{EventOut, SendResultOut, TaskOut, message_result};

    /// The message ProtoJSON `json` reads as (what the gRPC binding gave before this module).
    fn via_json<T: DeserializeOwned>(json: &impl serde::Serialize) -> T {
        serde_json::from_value(serde_json::to_value(json).expect("render")).expect("ProtoJSON")
    }

    fn snapshot() -> TaskSnapshot {
        let status = TaskStatus::new(TaskState::Completed);
        let mut t = TaskSnapshot {
            id: TaskId::new("t-1"),
            context_id: ContextId::new("c-1"),
            seq: 3,
            created_at: status.timestamp,
            updated_at: status.timestamp,
            status,
            history: vec![Arc::new(Message::user_text(["hello"]))],
            artifacts: Vec::new(),
            metadata: None,
        };
        let mut reply = Message::agent_text(["hi"]);
        reply.parts.push(Part::File(Box::new(FileContent {
            name: "a.txt".into(),
            mime_type: "text/plain".into(),
            bytes: "aGVsbG8=".into(),
            size: 5,
        })));
        reply.parts.push(Part::Url(Box::new(FileUrl {
            url: "https://example.com/f".into(),
            name: None,
            mime_type: Some("image/png".into()),
        })));
        reply.parts.push(Part::Data(RawJson(
            RawValue::from_string(r#"{"n":[1,2.5,"x",null,true]}"#.into())
                .expect("json")
                .into(),
        )));
        t.history.push(Arc::new(reply.clone()));
        t.artifacts.push(Arc::new(Artifact {
            artifact_id: "a-1".into(),
            name: Some("out".into()),
            description: None,
            parts: reply.parts.clone(),
        }));
        t.status.message = Some(Arc::new(reply));
        t.metadata = Some(
            RawValue::from_string(r#"{"k":{"v":1}}"#.into())
                .expect("json")
                .into(),
        );
        t
    }

    #[test]
    fn tasks_and_events_are_the_messages_their_protojson_reads_as() {
        let mut t = snapshot();
        for (history_length, artifacts) in [(None, true), (Some(1), false), (Some(0), true)] {
            let out = TaskOut {
                v: Version::V10,
                task: &t,
                history_length,
                artifacts,
            };
            assert_eq!(task(&t, history_length, artifacts), via_json(&out));
        }
        let send: pb::SendMessageResponse =
            via_json(&SendResultOut(TaskOut::full(Version::V10, &t)));
        assert_eq!(
            send.payload,
            Some(pb::send_message_response::Payload::Task(task(
                &t, None, true
            )))
        );
        // Made-up status messages: a cancel reason, an error (with its metadata).
        t.status = TaskStatus::new(TaskState::Canceled);
        t.status.reason = Some("stop".into());
        assert_eq!(
            task(&t, None, true),
            via_json(&TaskOut::full(Version::V10, &t))
        );
        t.status = TaskStatus::new(TaskState::Failed);
        t.status.error = Some(Arc::new(TaskError {
            code: -32603,
            message: "upstream failed".into(),
        }));
        t.metadata = Some(RawValue::from_string("{}".into()).expect("json").into());
        assert_eq!(
            task(&t, None, true),
            via_json(&TaskOut::full(Version::V10, &t))
        );

        let t = Arc::new(snapshot());
        let artifact = t.artifacts[0].clone();
        for (ev, first) in [
            (TaskEvent::status(1, t.status.clone()), true),
            (TaskEvent::status(2, t.status.clone()), false),
            (
                TaskEvent {
                    seq: 3,
                    status: t.status.clone(),
                    artifact: Some(ArtifactUpdate {
                        artifact,
                        append: true,
                        last_chunk: false,
                    }),
                },
                false,
            ),
        ] {
            let out = EventOut {
                v: Version::V10,
                event: &ev,
                task: &t,
                first,
            };
            let expected: pb::StreamResponse = via_json(&out);
            let item = StreamItem {
                event: Arc::new(ev.clone()),
                task: t.clone(),
            };
            assert_eq!(
                event(&item, first),
                expected,
                "{}",
                iso8601(&ev.status.timestamp)
            );
        }

        let m = Message::agent_text(["bare"]);
        let c = ContextId::new("c-2");
        let expected: pb::SendMessageResponse =
            via_json(&message_result(Version::V10, &m, Some(&c)));
        assert_eq!(
            expected.payload,
            Some(pb::send_message_response::Payload::Message(message(
                &m,
                None,
                Some(&c),
                None
            )))
        );
    }
}
