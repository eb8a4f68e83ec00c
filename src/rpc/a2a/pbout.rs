//! Official 1.0 results out as protobuf (the gRPC binding, docs/PROTOCOL.md §10.13): tasks,
//! messages, parts, statuses, artifacts and stream events written as wire bytes straight
//! from the model, in the shapes `render.rs` gives them in ProtoJSON — the test below holds
//! each to the message its ProtoJSON reads as. The results a send or a stream carries come
//! this way (no message structs in between, no second pass for nested lengths); the rarer
//! ones (lists, push configurations, the card) go through their ProtoJSON.

use base64::Engine as _;
use base64::engine::general_purpose::STANDARD;
use bytes::Bytes;
use serde_json::value::RawValue;

use super::pb;
use super::render::{is_empty_object, status_message};
use crate::model::{
    Artifact, ContextId, Message, Part, Role, TaskId, TaskSnapshot, TaskState, TaskStatus,
};
use crate::runtime::StreamItem;

/// A protobuf writer: fields appended in tag order, a nested message's length written in
/// front of it once it is known (its bytes moved up when the length takes more than one
/// byte — a few hundred bytes at most here).
struct Wire(Vec<u8>);

impl Wire {
    /// A gRPC frame being written: the flag byte and room for the length.
    fn framed() -> Self {
        let mut out = Vec::with_capacity(512);
        out.extend_from_slice(&[0; 5]);
        Self(out)
    }

    /// The frame, its length filled in.
    fn into_frame(mut self) -> Bytes {
        let len = u32::try_from(self.0.len() - 5).unwrap_or(u32::MAX);
        self.0[1..5].copy_from_slice(&len.to_be_bytes());
        Bytes::from(self.0)
    }

    fn varint(&mut self, mut v: u64) {
        while v >= 0x80 {
            self.0.push((v as u8) | 0x80);
            v >>= 7;
        }
        self.0.push(v as u8);
    }

    fn key(&mut self, tag: u32, wire_type: u8) {
        self.varint(u64::from(tag << 3 | u32::from(wire_type)));
    }

    /// A varint field (0, the default, is left out).
    fn uint(&mut self, tag: u32, v: u64) {
        if v != 0 {
            self.key(tag, 0);
            self.varint(v);
        }
    }

    /// A string or bytes field (empty, the default, is left out).
    fn bytes(&mut self, tag: u32, v: &[u8]) {
        if !v.is_empty() {
            self.one_of(tag, v);
        }
    }

    /// A string or bytes field of a `oneof`: written even when empty (it is the one set).
    fn one_of(&mut self, tag: u32, v: &[u8]) {
        self.key(tag, 2);
        self.varint(v.len() as u64);
        self.0.extend_from_slice(v);
    }

    /// A nested message (written even when empty: it is set).
    fn nested(&mut self, tag: u32, body: impl FnOnce(&mut Self)) {
        self.key(tag, 2);
        let at = self.0.len();
        self.0.push(0);
        body(self);
        let len = self.0.len() - at - 1;
        if len < 0x80 {
            self.0[at] = len as u8;
        } else {
            let mut prefix = Wire(Vec::with_capacity(5));
            prefix.varint(len as u64);
            self.0.splice(at..=at, prefix.0);
        }
    }

    /// A well-known message (a `Struct` or `Value`), through prost.
    fn message(&mut self, tag: u32, m: &impl prost::Message) {
        prost::encoding::message::encode(tag, m, &mut self.0);
    }
}

/// `SendMessageResponse { task }`, framed.
pub(crate) fn send_task(t: &TaskSnapshot, history_length: Option<usize>, artifacts: bool) -> Bytes {
    let mut w = Wire::framed();
    w.nested(1, |w| task(w, t, history_length, artifacts));
    w.into_frame()
}

/// `SendMessageResponse { message }` (a bare agent message answered a send), framed.
pub(crate) fn send_message(m: &Message, context: &ContextId) -> Bytes {
    let mut w = Wire::framed();
    w.nested(2, |w| message(w, m, None, Some(context), None));
    w.into_frame()
}

/// A `Task`, framed.
pub(crate) fn task_alone(
    t: &TaskSnapshot,
    history_length: Option<usize>,
    artifacts: bool,
) -> Bytes {
    let mut w = Wire::framed();
    task(&mut w, t, history_length, artifacts);
    w.into_frame()
}

/// `StreamResponse { message }` (a bare agent message answered a streaming send), framed.
pub(crate) fn stream_message(m: &Message, context: &ContextId) -> Bytes {
    // The same field number as in SendMessageResponse.
    send_message(m, context)
}

/// One stream item as a `StreamResponse`, framed: the first is the task; later ones are
/// status or artifact updates.
pub(crate) fn event(item: &StreamItem, first: bool) -> Bytes {
    let t = &item.task;
    let mut w = Wire::framed();
    if first {
        w.nested(1, |w| task(w, &item.task_at_event(), None, true));
    } else if let Some(update) = &item.event.artifact {
        w.nested(4, |w| {
            w.bytes(1, t.id.as_str().as_bytes());
            w.bytes(2, t.context_id.as_str().as_bytes());
            w.nested(3, |w| artifact(w, &update.artifact));
            w.uint(4, u64::from(update.append));
            w.uint(5, u64::from(update.last_chunk));
        });
    } else {
        w.nested(3, |w| {
            w.bytes(1, t.id.as_str().as_bytes());
            w.bytes(2, t.context_id.as_str().as_bytes());
            w.nested(3, |w| status(w, &item.event.status, &t.id, &t.context_id));
        });
    }
    w.into_frame()
}

/// A task's fields: its last `history_length` history entries (`None`: all), its
/// artifacts when `artifacts`.
fn task(w: &mut Wire, t: &TaskSnapshot, history_length: Option<usize>, artifacts: bool) {
    let history = match history_length {
        Some(n) => &t.history[t.history.len().saturating_sub(n)..],
        None => &t.history[..],
    };
    w.bytes(1, t.id.as_str().as_bytes());
    w.bytes(2, t.context_id.as_str().as_bytes());
    w.nested(3, |w| status(w, &t.status, &t.id, &t.context_id));
    if artifacts {
        for a in &t.artifacts {
            w.nested(4, |w| artifact(w, a));
        }
    }
    for m in history {
        w.nested(5, |w| message(w, m, Some(&t.id), Some(&t.context_id), None));
    }
    if let Some(meta) = t
        .metadata
        .as_deref()
        .filter(|m| !is_empty_object(m))
        .and_then(structure)
    {
        w.message(6, &meta);
    }
}

/// A message's fields, in its task and conversation when given.
fn message(
    w: &mut Wire,
    m: &Message,
    task_id: Option<&TaskId>,
    context_id: Option<&ContextId>,
    metadata: Option<pbjson_types::Struct>,
) {
    w.bytes(1, m.message_id.as_bytes());
    w.bytes(2, context_id.map_or("", ContextId::as_str).as_bytes());
    w.bytes(3, task_id.map_or("", TaskId::as_str).as_bytes());
    let role = match m.role {
        Role::User => pb::Role::User,
        Role::Agent => pb::Role::Agent,
    };
    w.uint(4, role as u64);
    for p in &m.parts {
        w.nested(5, |w| part(w, p));
    }
    if let Some(meta) = metadata {
        w.message(6, &meta);
    }
    for uri in m.extensions.as_slice() {
        w.one_of(7, uri.as_bytes());
    }
}

fn part(w: &mut Wire, p: &Part) {
    let (filename, media_type, metadata) = match p {
        Part::Text(t) => {
            w.one_of(1, t.as_bytes());
            (None, None, None)
        }
        // Checked Base64 when it came in; the bytes themselves on this wire.
        Part::File(f) => {
            w.one_of(2, &STANDARD.decode(&f.bytes).unwrap_or_default());
            (Some(&f.name), Some(&f.mime_type), f.metadata.as_ref())
        }
        Part::Url(u) => {
            w.one_of(3, u.url.as_bytes());
            (u.name.as_ref(), u.mime_type.as_ref(), u.metadata.as_ref())
        }
        Part::Data(d) => {
            w.message(4, &super::pbvalue::JsonValue::from_json(d.data.get()));
            (None, d.media_type.as_ref(), d.metadata.as_ref())
        }
    };
    if let Some(meta) = metadata.and_then(|m| structure(&m.0)) {
        w.message(5, &meta);
    }
    w.bytes(6, filename.map_or(&[][..], |f| f.as_bytes()));
    w.bytes(7, media_type.map_or(&[][..], |m| m.as_bytes()));
}

/// A status's fields; its message as `render::status_message` gives it.
fn status(w: &mut Wire, st: &TaskStatus, task_id: &TaskId, context_id: &ContextId) {
    let (shown, metadata) = status_message(st, task_id);
    w.uint(1, state(st.state) as u64);
    if let Some(m) = shown {
        let metadata = metadata.and_then(|v| serde_json::from_value(v).ok());
        w.nested(2, |w| {
            message(w, &m, Some(task_id), Some(context_id), metadata)
        });
    }
    // Milliseconds, as the JSON bindings' ISO 8601 times.
    w.nested(3, |w| {
        // A negative time (before 1970) is a two's-complement varint, as prost writes it.
        w.uint(1, st.timestamp.timestamp() as u64);
        w.uint(
            2,
            u64::from(st.timestamp.timestamp_subsec_millis() * 1_000_000),
        );
    });
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

fn artifact(w: &mut Wire, a: &Artifact) {
    w.bytes(1, a.artifact_id.as_bytes());
    w.bytes(2, a.name.as_deref().unwrap_or("").as_bytes());
    w.bytes(3, a.description.as_deref().unwrap_or("").as_bytes());
    for p in &a.parts {
        w.nested(4, |w| part(w, p));
    }
    for uri in a.extensions.as_slice() {
        w.one_of(6, uri.as_bytes());
    }
}

/// A JSON object as a `Struct` (`None`: not an object).
fn structure(raw: &RawValue) -> Option<pbjson_types::Struct> {
    serde_json::from_str(raw.get()).ok()
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use serde::de::DeserializeOwned;

    use super::*;
    use crate::model::{ArtifactUpdate, FileContent, FileUrl, RawJson, TaskError, TaskEvent};
    use crate::rpc::a2a::Version;
    use crate::rpc::a2a::render::{EventOut, SendResultOut, TaskOut, message_result};

    /// The message ProtoJSON `json` reads as (what the gRPC binding gave before this module).
    fn via_json<T: DeserializeOwned>(json: &impl serde::Serialize) -> T {
        serde_json::from_value(serde_json::to_value(json).expect("render")).expect("ProtoJSON")
    }

    /// The message a frame carries (its length prefix checked).
    fn read<T: prost::Message + Default>(frame: &Bytes) -> T {
        assert_eq!(frame[0], 0, "not compressed");
        let len = u32::from_be_bytes(frame[1..5].try_into().expect("length"));
        assert_eq!(len as usize, frame.len() - 5);
        T::decode(&frame[5..]).expect("protobuf")
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
            extensions: Default::default(),
            note: None,
        };
        // An empty text and an empty file are parts too (a `oneof` set to its default).
        let mut reply = Message::agent_text(["hi", &"long ".repeat(60), ""]);
        reply.parts.push(Part::File(Box::new(FileContent {
            name: "empty".into(),
            mime_type: "application/octet-stream".into(),
            bytes: String::new(),
            size: 0,
            metadata: None,
        })));
        reply.parts.push(Part::File(Box::new(FileContent {
            name: "a.txt".into(),
            mime_type: "text/plain".into(),
            bytes: "aGVsbG8=".into(),
            size: 5,
            metadata: None,
        })));
        reply.parts.push(Part::Url(Box::new(FileUrl {
            url: "https://example.com/f".into(),
            name: None,
            mime_type: Some("image/png".into()),
            metadata: None,
        })));
        reply
            .parts
            .push(Part::Data(Box::new(crate::model::DataPart::new(RawJson(
                RawValue::from_string(r#"{"n":[1,2.5,"x",null,true]}"#.into())
                    .expect("json")
                    .into(),
            )))));
        t.history.push(Arc::new(reply.clone()));
        t.artifacts.push(Arc::new(Artifact {
            artifact_id: "a-1".into(),
            name: Some("out".into()),
            description: None,
            parts: reply.parts.clone(),
            extensions: Default::default(),
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
            let expected: pb::Task = via_json(&out);
            assert_eq!(
                read::<pb::Task>(&task_alone(&t, history_length, artifacts)),
                expected
            );
            let expected: pb::SendMessageResponse = via_json(&SendResultOut(out));
            assert_eq!(
                read::<pb::SendMessageResponse>(&send_task(&t, history_length, artifacts)),
                expected
            );
        }
        // Made-up status messages: a cancel reason, an error (with its metadata).
        t.status = TaskStatus::new(TaskState::Canceled);
        t.status.reason = Some("stop".into());
        let expected: pb::Task = via_json(&TaskOut::full(Version::V10, &t));
        assert_eq!(read::<pb::Task>(&task_alone(&t, None, true)), expected);
        t.status = TaskStatus::new(TaskState::Failed);
        t.status.error = Some(Arc::new(TaskError {
            code: -32603,
            message: "upstream failed".into(),
        }));
        t.metadata = Some(RawValue::from_string("{}".into()).expect("json").into());
        let expected: pb::Task = via_json(&TaskOut::full(Version::V10, &t));
        assert_eq!(read::<pb::Task>(&task_alone(&t, None, true)), expected);

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
            assert_eq!(read::<pb::StreamResponse>(&event(&item, first)), expected);
        }

        let m = Message::agent_text(["bare"]);
        let c = ContextId::new("c-2");
        let expected: pb::SendMessageResponse =
            via_json(&message_result(Version::V10, &m, Some(&c)));
        assert_eq!(
            read::<pb::SendMessageResponse>(&send_message(&m, &c)),
            expected
        );
        let expected: pb::StreamResponse = via_json(&message_result(Version::V10, &m, Some(&c)));
        assert_eq!(
            read::<pb::StreamResponse>(&stream_message(&m, &c)),
            expected
        );
    }
}
