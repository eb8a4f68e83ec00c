//! The compact form of the rows written on every task event — the task's record, the
//! event, the conversation turn — from store schema 3 on: a tag byte ([`TAG`]), then the
//! fields in a fixed order, integers little-endian, strings as a u32 length and UTF-8
//! bytes, optional fields after a 0/1 byte. Raw JSON (data parts, metadata) is kept as its
//! text. Rows of schema 2 are JSON objects (their first byte is `{`) and still read.
//!
//! Tag 2 (schema 5) adds the content model of docs/PROTOCOL.md §12: a message's and an
//! artifact's extensions, a task's activated extensions, a data part's media type and
//! metadata, a file's metadata (inline or by URL). Rows of tag 1 ([`TAG_1`]) still read, without them.
//!
//! Encoding borrows from the model (nothing is cloned on the way to the bytes): about a
//! third of the instructions of serde_json over owned record types, and half the bytes.

use std::sync::Arc;

use serde_json::value::RawValue;

use super::super::TurnId;
use super::{share, time};
use crate::model::{
    Artifact, ArtifactUpdate, ContextId, DataPart, Extensions, FileContent, FileUrl, Message, Part,
    RawJson, Role, TaskError, TaskEvent, TaskKey, TaskSnapshot, TaskState, TaskStatus,
};

/// The first byte of a compact row written now (a JSON row starts with `{`).
pub(crate) const TAG: u8 = 2;

/// The first byte of a compact row of schemas 3 and 4.
pub(crate) const TAG_1: u8 = 1;

/// Whether `bytes` is a compact row (of either tag).
pub(crate) fn is_compact(bytes: &[u8]) -> bool {
    matches!(bytes.first(), Some(&TAG | &TAG_1))
}

const STATES: [TaskState; 8] = [
    TaskState::Submitted,
    TaskState::Working,
    TaskState::Completed,
    TaskState::Canceled,
    TaskState::InputRequired,
    TaskState::AuthRequired,
    TaskState::Rejected,
    TaskState::Failed,
];

/// A row's writer: appends to a buffer (a vector of its own, or the frame the row goes in).
struct W<'a>(&'a mut Vec<u8>);

impl<'a> W<'a> {
    /// A row that starts at the end of `buf`.
    fn new(buf: &'a mut Vec<u8>) -> Self {
        buf.push(TAG);
        Self(buf)
    }

    fn u8(&mut self, v: u8) {
        self.0.push(v);
    }

    fn u32(&mut self, v: u32) {
        self.0.extend_from_slice(&v.to_le_bytes());
    }

    fn u64(&mut self, v: u64) {
        self.0.extend_from_slice(&v.to_le_bytes());
    }

    fn i64(&mut self, v: i64) {
        self.0.extend_from_slice(&v.to_le_bytes());
    }

    fn len(&mut self, n: usize) {
        self.u32(u32::try_from(n).unwrap_or(u32::MAX));
    }

    fn str(&mut self, s: &str) {
        self.len(s.len());
        self.0.extend_from_slice(s.as_bytes());
    }

    fn opt_str(&mut self, s: Option<&str>) {
        match s {
            None => self.u8(0),
            Some(s) => {
                self.u8(1);
                self.str(s);
            }
        }
    }

    fn opt_raw(&mut self, r: Option<&RawJson>) {
        self.opt_str(r.map(RawJson::get));
    }

    fn extensions(&mut self, e: &Extensions) {
        self.len(e.as_slice().len());
        for uri in e.as_slice() {
            self.str(uri);
        }
    }

    fn message(&mut self, m: &Message) {
        self.u8(match m.role {
            Role::User => 0,
            Role::Agent => 1,
        });
        self.str(&m.message_id);
        self.parts(&m.parts);
        self.extensions(&m.extensions);
    }

    fn parts(&mut self, parts: &[Part]) {
        self.len(parts.len());
        for p in parts {
            match p {
                Part::Text(t) => {
                    self.u8(0);
                    self.str(t);
                }
                Part::File(f) => {
                    self.u8(1);
                    self.str(&f.name);
                    self.str(&f.mime_type);
                    self.str(&f.bytes);
                    self.u64(f.size as u64);
                    self.opt_raw(f.metadata.as_ref());
                }
                Part::Url(u) => {
                    self.u8(2);
                    self.str(&u.url);
                    self.opt_str(u.name.as_deref());
                    self.opt_str(u.mime_type.as_deref());
                    self.opt_raw(u.metadata.as_ref());
                }
                Part::Data(d) => {
                    self.u8(3);
                    self.str(d.data.get());
                    self.opt_str(d.media_type.as_deref());
                    self.opt_raw(d.metadata.as_ref());
                }
            }
        }
    }

    fn status(&mut self, s: &TaskStatus) {
        let state = STATES.iter().position(|x| *x == s.state).unwrap_or(7);
        self.u8(state as u8);
        match s.message.as_deref() {
            None => self.u8(0),
            Some(m) => {
                self.u8(1);
                self.message(m);
            }
        }
        self.opt_str(s.reason.as_deref());
        match s.error.as_deref() {
            None => self.u8(0),
            Some(e) => {
                self.u8(1);
                self.i64(e.code);
                self.str(&e.message);
            }
        }
        self.i64(s.timestamp.timestamp_micros());
    }

    fn artifact(&mut self, a: &Artifact) {
        self.str(&a.artifact_id);
        self.opt_str(a.name.as_deref());
        self.opt_str(a.description.as_deref());
        self.parts(&a.parts);
        self.extensions(&a.extensions);
    }
}

/// A row's reader: its bytes, and whether it is of tag 2 (with the fields of schema 5).
struct R<'a>(&'a [u8], bool);

impl<'a> R<'a> {
    fn open(bytes: &'a [u8]) -> Option<Self> {
        match bytes.split_first()? {
            (&TAG, rest) => Some(Self(rest, true)),
            (&TAG_1, rest) => Some(Self(rest, false)),
            _ => None,
        }
    }

    fn u8(&mut self) -> Option<u8> {
        let (&v, rest) = self.0.split_first()?;
        self.0 = rest;
        Some(v)
    }

    /// A tag-2 row's optional raw JSON (a tag-1 row has none).
    fn opt_raw(&mut self) -> Option<Option<RawJson>> {
        if !self.1 || !self.bool()? {
            return Some(None);
        }
        Some(Some(RawJson::from_raw(self.raw()?)))
    }

    /// A tag-2 row's optional string (a tag-1 row has none).
    fn opt_string_2(&mut self) -> Option<Option<String>> {
        if !self.1 {
            return Some(None);
        }
        self.opt_string()
    }

    /// A tag-2 row's extension list (a tag-1 row has none).
    fn extensions(&mut self) -> Option<Extensions> {
        if !self.1 {
            return Some(Extensions::default());
        }
        let n = self.count()?;
        let mut uris = Vec::with_capacity(n);
        for _ in 0..n {
            uris.push(self.string()?);
        }
        Some(Extensions::new(uris))
    }

    fn skip_extensions(&mut self) -> Option<()> {
        if self.1 {
            for _ in 0..self.count()? {
                self.str()?;
            }
        }
        Some(())
    }

    fn skip_opt_raw(&mut self) -> Option<()> {
        if self.1 && self.bool()? {
            serde_json::from_str::<&RawValue>(self.str()?).ok()?;
        }
        Some(())
    }

    fn bool(&mut self) -> Option<bool> {
        match self.u8()? {
            0 => Some(false),
            1 => Some(true),
            _ => None,
        }
    }

    fn u32(&mut self) -> Option<u32> {
        let (v, rest) = self.0.split_first_chunk::<4>()?;
        self.0 = rest;
        Some(u32::from_le_bytes(*v))
    }

    fn u64(&mut self) -> Option<u64> {
        let (v, rest) = self.0.split_first_chunk::<8>()?;
        self.0 = rest;
        Some(u64::from_le_bytes(*v))
    }

    fn i64(&mut self) -> Option<i64> {
        self.u64().map(|v| v as i64)
    }

    /// A count of items that each take at least one byte: never more than the bytes left
    /// (a damaged count cannot make the decoder reserve gigabytes).
    fn count(&mut self) -> Option<usize> {
        let n = self.u32()? as usize;
        (n <= self.0.len()).then_some(n)
    }

    fn str(&mut self) -> Option<&'a str> {
        let n = self.u32()? as usize;
        let bytes = self.0.get(..n)?;
        self.0 = self.0.get(n..)?;
        std::str::from_utf8(bytes).ok()
    }

    fn string(&mut self) -> Option<String> {
        self.str().map(str::to_string)
    }

    fn opt_string(&mut self) -> Option<Option<String>> {
        if self.bool()? {
            self.string().map(Some)
        } else {
            Some(None)
        }
    }

    fn raw(&mut self) -> Option<Box<RawValue>> {
        serde_json::from_str::<Box<RawValue>>(self.str()?).ok()
    }

    fn done(&self) -> bool {
        self.0.is_empty()
    }

    fn message(&mut self) -> Option<Message> {
        let role = match self.u8()? {
            0 => Role::User,
            1 => Role::Agent,
            _ => return None,
        };
        Some(Message {
            role,
            message_id: self.string()?,
            parts: self.parts()?,
            extensions: self.extensions()?,
        })
    }

    fn parts(&mut self) -> Option<Vec<Part>> {
        let n = self.count()?;
        let mut parts = Vec::with_capacity(n);
        for _ in 0..n {
            parts.push(match self.u8()? {
                0 => Part::Text(self.string()?),
                1 => Part::File(Box::new(FileContent {
                    name: self.string()?,
                    mime_type: self.string()?,
                    bytes: self.string()?,
                    size: usize::try_from(self.u64()?).ok()?,
                    metadata: self.opt_raw()?,
                })),
                2 => Part::Url(Box::new(FileUrl {
                    url: self.string()?,
                    name: self.opt_string()?,
                    mime_type: self.opt_string()?,
                    metadata: self.opt_raw()?,
                })),
                3 => Part::Data(Box::new(DataPart {
                    data: RawJson::from_raw(self.raw()?),
                    media_type: self.opt_string_2()?,
                    metadata: self.opt_raw()?,
                })),
                _ => return None,
            });
        }
        Some(parts)
    }

    fn status(&mut self, shared: &[Arc<Message>]) -> Option<TaskStatus> {
        let state = *STATES.get(usize::from(self.u8()?))?;
        let message = if self.bool()? {
            Some(share(self.message()?, shared))
        } else {
            None
        };
        let reason = self.opt_string()?.map(Arc::from);
        let error = if self.bool()? {
            Some(Arc::new(TaskError {
                code: self.i64()?,
                message: self.string()?,
            }))
        } else {
            None
        };
        Some(TaskStatus {
            state,
            message,
            reason,
            error,
            timestamp: time(self.i64()?),
        })
    }

    /// The skipping twins of the readers above: each reads exactly what its twin reads
    /// and refuses exactly what it refuses (strings' UTF-8, data parts' JSON), building
    /// nothing. [`check_event`] is made of them; the `store_record` fuzz target holds
    /// the two to the same answers.
    fn skip_message(&mut self) -> Option<()> {
        (self.u8()? <= 1).then_some(())?;
        self.str()?;
        self.skip_parts()?;
        self.skip_extensions()
    }

    fn skip_opt_str(&mut self) -> Option<()> {
        if self.bool()? {
            self.str()?;
        }
        Some(())
    }

    fn skip_parts(&mut self) -> Option<()> {
        for _ in 0..self.count()? {
            match self.u8()? {
                0 => {
                    self.str()?;
                }
                1 => {
                    self.str()?;
                    self.str()?;
                    self.str()?;
                    usize::try_from(self.u64()?).ok()?;
                    self.skip_opt_raw()?;
                }
                2 => {
                    self.str()?;
                    self.skip_opt_str()?;
                    self.skip_opt_str()?;
                    self.skip_opt_raw()?;
                }
                3 => {
                    serde_json::from_str::<&RawValue>(self.str()?).ok()?;
                    if self.1 {
                        self.skip_opt_str()?;
                    }
                    self.skip_opt_raw()?;
                }
                _ => return None,
            }
        }
        Some(())
    }

    fn skip_status(&mut self) -> Option<()> {
        STATES.get(usize::from(self.u8()?))?;
        if self.bool()? {
            self.skip_message()?;
        }
        self.skip_opt_str()?;
        if self.bool()? {
            self.i64()?;
            self.str()?;
        }
        self.i64().map(drop)
    }

    fn skip_artifact(&mut self) -> Option<()> {
        self.str()?;
        self.skip_opt_str()?;
        self.skip_opt_str()?;
        self.skip_parts()?;
        self.skip_extensions()
    }

    fn artifact(&mut self) -> Option<Artifact> {
        Some(Artifact {
            artifact_id: self.string()?,
            name: self.opt_string()?,
            description: self.opt_string()?,
            parts: self.parts()?,
            extensions: self.extensions()?,
        })
    }
}

/// A task's record; `carries_turn`: its conversation turn has no row of its own. Both it
/// and the backend's note go in a trailing flags byte (bit 0, bit 1: the note follows);
/// a record with neither ends after the turn's id, as records always did.
pub(crate) fn encode_task(task: &TaskSnapshot, turn: TurnId, carries_turn: bool) -> Vec<u8> {
    let mut buf = Vec::with_capacity(256);
    encode_task_into(&mut buf, task, turn, carries_turn);
    buf
}

/// [`encode_task`], appended to `buf`.
pub(crate) fn encode_task_into(
    buf: &mut Vec<u8>,
    task: &TaskSnapshot,
    turn: TurnId,
    carries_turn: bool,
) {
    let mut w = W::new(buf);
    w.str(task.context_id.as_str());
    w.u64(task.seq);
    w.i64(task.created_at.timestamp_micros());
    w.i64(task.updated_at.timestamp_micros());
    w.len(task.history.len());
    for m in &task.history {
        w.message(m);
    }
    w.status(&task.status);
    w.len(task.artifacts.len());
    for a in &task.artifacts {
        w.artifact(a);
    }
    w.opt_str(task.metadata.as_deref().map(RawValue::get));
    w.extensions(&task.extensions);
    w.u32(turn.number);
    w.i64(turn.since);
    // Trailing flags, written only when one is set (records without them end here, as
    // they always did): bit 0 the record carries its turn, bit 1 a note follows.
    let flags = u8::from(carries_turn) | (u8::from(task.note.is_some()) << 1);
    if flags != 0 {
        w.u8(flags);
    }
    if let Some(note) = &task.note {
        w.str(note);
    }
}

/// Reads a task's record written by [`encode_task`]: the task, its turn, and whether the
/// record carries the turn.
pub(crate) fn decode_task(key: &TaskKey, bytes: &[u8]) -> Option<(TaskSnapshot, TurnId, bool)> {
    let mut r = R::open(bytes)?;
    let context_id = ContextId::new(r.str()?);
    let seq = r.u64()?;
    let created_at = time(r.i64()?);
    let updated_at = time(r.i64()?);
    let n = r.count()?;
    let mut history = Vec::with_capacity(n);
    for _ in 0..n {
        history.push(Arc::new(r.message()?));
    }
    let status = r.status(&history)?;
    let n = r.count()?;
    let mut artifacts = Vec::with_capacity(n);
    for _ in 0..n {
        artifacts.push(Arc::new(r.artifact()?));
    }
    let metadata = if r.bool()? {
        Some(Arc::from(r.raw()?))
    } else {
        None
    };
    let extensions = r.extensions()?;
    let turn = TurnId {
        number: r.u32()?,
        since: r.i64()?,
    };
    let flags = if r.done() {
        0
    } else {
        match r.u8()? {
            f @ 1..=3 => f,
            _ => return None,
        }
    };
    let carries_turn = flags & 1 != 0;
    let note = if flags & 2 != 0 {
        Some(Arc::from(r.str()?))
    } else {
        None
    };
    r.done().then_some((
        TaskSnapshot {
            id: key.task.clone(),
            context_id,
            status,
            seq,
            created_at,
            updated_at,
            history,
            artifacts,
            metadata,
            extensions,
            note,
        },
        turn,
        carries_turn,
    ))
}

/// An event.
pub(crate) fn encode_event(event: &TaskEvent) -> Vec<u8> {
    let mut buf = Vec::with_capacity(128);
    encode_event_into(&mut buf, event);
    buf
}

/// [`encode_event`], appended to `buf`.
pub(crate) fn encode_event_into(buf: &mut Vec<u8>, event: &TaskEvent) {
    let mut w = W::new(buf);
    w.status(&event.status);
    match &event.artifact {
        None => w.u8(0),
        Some(u) => {
            w.u8(1);
            w.artifact(&u.artifact);
            w.u8(u8::from(u.append));
            w.u8(u8::from(u.last_chunk));
        }
    }
}

/// Reads event `seq` written by [`encode_event`]; `history` lends the messages it shares
/// with its task.
pub(crate) fn decode_event(seq: u64, bytes: &[u8], history: &[Arc<Message>]) -> Option<TaskEvent> {
    let mut r = R::open(bytes)?;
    let status = r.status(history)?;
    let artifact = if r.bool()? {
        Some(ArtifactUpdate {
            artifact: Arc::new(r.artifact()?),
            append: r.bool()?,
            last_chunk: r.bool()?,
        })
    } else {
        None
    };
    r.done().then_some(TaskEvent {
        seq,
        status,
        artifact,
    })
}

/// Whether [`decode_event`] reads the bytes, answered without building the event (an
/// open checks every event of the log: millions of them).
pub(crate) fn check_event(bytes: &[u8]) -> bool {
    let walk = |r: &mut R<'_>| {
        r.skip_status()?;
        if r.bool()? {
            r.skip_artifact()?;
            r.bool()?;
            r.bool()?;
        }
        r.done().then_some(())
    };
    R::open(bytes).and_then(|mut r| walk(&mut r)).is_some()
}

/// A conversation turn.
pub(crate) fn encode_turn(user: &Message, reply: Option<&Message>) -> Vec<u8> {
    let mut buf = Vec::with_capacity(256);
    let mut w = W::new(&mut buf);
    w.message(user);
    match reply {
        None => w.u8(0),
        Some(m) => {
            w.u8(1);
            w.message(m);
        }
    }
    buf
}

/// Reads a turn written by [`encode_turn`].
pub(crate) fn decode_turn(bytes: &[u8]) -> Option<(Arc<Message>, Option<Arc<Message>>)> {
    let mut r = R::open(bytes)?;
    let user = Arc::new(r.message()?);
    let reply = if r.bool()? {
        Some(Arc::new(r.message()?))
    } else {
        None
    };
    r.done().then_some((user, reply))
}
