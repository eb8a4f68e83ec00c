//! The dialect-neutral task model: ids, states, messages, parts, statuses and events.
//!
//! Nothing here knows about JSON-RPC or any wire dialect; `rpc::seed` (and later the
//! official A2A dialects) parse into and render from these types. Keep it that way:
//! a wire detail that leaks in here would have to be special-cased for every dialect.

use std::fmt;
use std::sync::Arc;

use chrono::{DateTime, SecondsFormat, Utc};

macro_rules! string_id {
    ($(#[$doc:meta])* $name:ident) => {
        $(#[$doc])*
        #[derive(Clone, Debug, Eq, PartialOrd, Ord)]
        pub struct $name(Arc<str>);

        // As the strings compare; a clone of the same id (a task's key, written with
        // each of its events) is equal without reading them.
        impl PartialEq for $name {
            fn eq(&self, other: &Self) -> bool {
                Arc::ptr_eq(&self.0, &other.0) || self.0 == other.0
            }
        }

        // As the string hashes (`Borrow<str>` below relies on it).
        impl std::hash::Hash for $name {
            fn hash<H: std::hash::Hasher>(&self, state: &mut H) {
                self.as_str().hash(state);
            }
        }

        impl $name {
            /// Wraps an identifier.
            pub fn new(id: impl Into<Arc<str>>) -> Self {
                Self(id.into())
            }

            /// The identifier as a string slice.
            pub fn as_str(&self) -> &str {
                &self.0
            }
        }

        impl fmt::Display for $name {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str(&self.0)
            }
        }

        impl From<&str> for $name {
            fn from(s: &str) -> Self {
                Self(s.into())
            }
        }

        // Hashes and compares as the string itself does (the derives go through it).
        impl std::borrow::Borrow<str> for $name {
            fn borrow(&self) -> &str {
                &self.0
            }
        }
    };
}

string_id!(
    /// A task identifier, unique per principal and agent.
    TaskId
);
string_id!(
    /// A conversation (multi-turn context) identifier, unique per principal.
    ContextId
);
string_id!(
    /// The configured identifier of an agent: the `{agent_id}` of the URL.
    AgentId
);
string_id!(
    /// The name of an API key's owner; everything a caller creates belongs to it.
    Principal
);

impl TaskId {
    /// A fresh server-generated task id (UUID v4).
    pub fn generate() -> Self {
        Self::new(new_v4_text(&mut uuid::Uuid::encode_buffer()))
    }
}

impl ContextId {
    /// A fresh server-generated context id (UUID v4).
    pub fn generate() -> Self {
        Self::new(new_v4_text(&mut uuid::Uuid::encode_buffer()))
    }
}

/// A fresh UUID v4's hyphenated lower-case text, written into `buf` (at least 36 bytes;
/// `uuid::Uuid::encode_buffer()`) without a formatter.
pub(crate) fn new_v4_text(buf: &mut [u8]) -> &str {
    uuid::Uuid::new_v4().hyphenated().encode_lower(buf)
}

/// Where a task lives: task ids are scoped per principal and per agent.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct TaskKey {
    /// The owner.
    pub principal: Principal,
    /// The agent that runs it.
    pub agent: AgentId,
    /// The task id as the owner knows it.
    pub task: TaskId,
}

/// The state of a task. The built-in backends produce the first five; the others are for
/// backends that need them (the official dialects show them; docs/PROTOCOL.md §10.4).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum TaskState {
    /// Received and queued.
    Submitted,
    /// Being processed by the agent.
    Working,
    /// Finished successfully (terminal).
    Completed,
    /// Failed (terminal).
    Failed,
    /// Cancelled by a user, a time-out or shutdown (terminal).
    Canceled,
    /// The agent waits for more input (interrupted; official dialects only).
    InputRequired,
    /// The agent waits for authentication (interrupted; official dialects only).
    AuthRequired,
    /// The agent refused the task (terminal; official dialects only).
    Rejected,
}

impl TaskState {
    /// Terminal states have no further transitions.
    pub fn is_terminal(self) -> bool {
        matches!(
            self,
            Self::Completed | Self::Failed | Self::Canceled | Self::Rejected
        )
    }

    /// Interrupted states wait for the client (more input, or authentication): they end
    /// a stream or a blocking send like a terminal state, but a later message continues
    /// the task.
    pub fn is_interrupted(self) -> bool {
        matches!(self, Self::InputRequired | Self::AuthRequired)
    }

    /// A stream or a blocking send ends at this state (terminal or interrupted).
    pub fn ends_stream(self) -> bool {
        self.is_terminal() || self.is_interrupted()
    }

    /// Whether the state machine allows `self` → `next` (spec §3, extended by the official
    /// states). `working` → `working` is an intermediate update; terminal states have no
    /// further transitions; an interrupted task works again when it is continued.
    pub fn can_become(self, next: TaskState) -> bool {
        use TaskState::*;
        matches!(
            (self, next),
            (Submitted, Working | Canceled | Failed)
                | (
                    Working,
                    Working
                        | Completed
                        | Failed
                        | Canceled
                        | InputRequired
                        | AuthRequired
                        | Rejected
                )
                | (InputRequired | AuthRequired, Working | Canceled | Failed)
        )
    }

    /// a2ad's own name for the state (kebab case), used in logs and metric labels. Each
    /// dialect renders states in its own way.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Submitted => "submitted",
            Self::Working => "working",
            Self::Completed => "completed",
            Self::Failed => "failed",
            Self::Canceled => "canceled",
            Self::InputRequired => "input-required",
            Self::AuthRequired => "auth-required",
            Self::Rejected => "rejected",
        }
    }
}

impl fmt::Display for TaskState {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Who wrote a message.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Role {
    /// The client.
    User,
    /// The agent.
    Agent,
}

/// One message: a user request or an agent reply.
#[derive(Clone, Debug, PartialEq)]
pub struct Message {
    /// Who wrote it.
    pub role: Role,
    /// Ordered content.
    pub parts: Vec<Part>,
    /// The message id (UUID v4 for user messages on the seed path; generated for agent messages).
    pub message_id: String,
    /// The extensions this message says it uses (A2A `Message.extensions`); an agent's
    /// messages in a task also list the extensions the request activated.
    pub extensions: Extensions,
}

/// A list of extension URIs: those a request activated, or those a message or artifact
/// names. Empty costs no allocation.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Extensions(Option<Arc<[String]>>);

impl Extensions {
    /// These URIs, in this order.
    pub fn new(uris: Vec<String>) -> Self {
        if uris.is_empty() {
            Self(None)
        } else {
            Self(Some(uris.into()))
        }
    }

    /// The URIs.
    pub fn as_slice(&self) -> &[String] {
        self.0.as_deref().unwrap_or(&[])
    }

    /// No URI.
    pub fn is_empty(&self) -> bool {
        self.0.is_none()
    }

    /// Whether `uri` is one of them.
    pub fn contains(&self, uri: &str) -> bool {
        self.as_slice().iter().any(|u| u == uri)
    }

    /// These URIs, then those of `more` not among them (the activated set first, then a
    /// message's own).
    pub fn with(&self, more: &Extensions) -> Extensions {
        if more.is_empty() {
            return self.clone();
        }
        if self.is_empty() {
            return more.clone();
        }
        let mut all = self.as_slice().to_vec();
        for uri in more.as_slice() {
            if !all.contains(uri) {
                all.push(uri.clone());
            }
        }
        Extensions::new(all)
    }
}

impl Message {
    /// A user message made of text parts, with a fresh message id.
    ///
    /// ```
    /// let m = a2ad::Message::user_text(["hello", "world"]);
    /// assert_eq!(m.role, a2ad::Role::User);
    /// assert_eq!(m.joined_text(), "hello\nworld");
    /// ```
    pub fn user_text<I, S>(texts: I) -> Self
    where
        I: IntoIterator<Item = S>,
        S: Into<String>,
    {
        Self {
            role: Role::User,
            ..Self::agent_text(texts)
        }
    }

    /// An agent message made of text parts, with a fresh message id.
    pub fn agent_text<I, S>(texts: I) -> Self
    where
        I: IntoIterator<Item = S>,
        S: Into<String>,
    {
        Self {
            role: Role::Agent,
            parts: texts.into_iter().map(|t| Part::Text(t.into())).collect(),
            message_id: new_v4_text(&mut uuid::Uuid::encode_buffer()).to_owned(),
            extensions: Extensions::default(),
        }
    }

    /// About how many bytes the message holds in memory (for retention budgets).
    pub fn approx_bytes(&self) -> usize {
        content_bytes(&self.parts, &self.extensions)
            + self.message_id.len()
            + std::mem::size_of::<Self>()
    }

    /// The text parts joined by a newline.
    pub fn joined_text(&self) -> String {
        let mut out = String::new();
        self.push_joined_text(&mut out);
        out
    }

    /// Appends [`Message::joined_text`] to `out`.
    pub fn push_joined_text(&self, out: &mut String) {
        let start = out.len();
        for text in self.parts.iter().filter_map(Part::as_text) {
            if out.len() > start {
                out.push('\n');
            }
            out.push_str(text);
        }
    }
}

/// About how many bytes parts and the extensions beside them hold in memory (a message's
/// or an artifact's content, for retention budgets).
fn content_bytes(parts: &[Part], extensions: &Extensions) -> usize {
    let parts: usize = parts
        .iter()
        .map(|p| match p {
            Part::Text(t) => t.len(),
            Part::File(f) => {
                f.name.len()
                    + f.mime_type.len()
                    + f.bytes.len()
                    + f.metadata.as_ref().map_or(0, |m| m.get().len())
                    + 48
            }
            Part::Data(d) => d.approx_bytes(),
            Part::Url(u) => u.approx_bytes(),
        } + std::mem::size_of::<Part>())
        .sum();
    parts + extension_bytes(extensions)
}

/// About how many bytes a list of extension URIs holds in memory.
fn extension_bytes(extensions: &Extensions) -> usize {
    extensions.as_slice().iter().map(|u| u.len() + 24).sum()
}

/// One piece of a message or an artifact.
#[derive(Clone, Debug, PartialEq)]
pub enum Part {
    /// Plain text.
    Text(String),
    /// A file carried inline (boxed: text parts, the common case, stay small).
    File(Box<FileContent>),
    /// Structured data: any JSON value (docs/PROTOCOL.md §12).
    Data(Box<DataPart>),
    /// A file by reference: a2ad never fetches it; the agent sees the URL.
    Url(Box<FileUrl>),
}

/// A data part: a JSON value, with the media type and metadata it came with.
#[derive(Clone, Debug, PartialEq)]
pub struct DataPart {
    /// The value, kept as its compact JSON text.
    pub data: RawJson,
    /// The media type, when one was given (a data part is `application/json` otherwise).
    pub media_type: Option<String>,
    /// The part's `metadata` object, if any.
    pub metadata: Option<RawJson>,
}

impl DataPart {
    /// A data part of this value.
    pub fn new(data: RawJson) -> Self {
        Self {
            data,
            media_type: None,
            metadata: None,
        }
    }

    fn approx_bytes(&self) -> usize {
        self.data.get().len()
            + self.media_type.as_ref().map_or(0, String::len)
            + self.metadata.as_ref().map_or(0, |m| m.get().len())
            + 64
    }
}

/// A file part that points at its content instead of carrying it.
#[derive(Clone, Debug, PartialEq)]
pub struct FileUrl {
    /// The URL (`http` or `https` when a client sent it).
    pub url: String,
    /// The file name, if known.
    pub name: Option<String>,
    /// The MIME type, if known.
    pub mime_type: Option<String>,
    /// The part's `metadata` object, if any.
    pub metadata: Option<RawJson>,
}

impl FileUrl {
    fn approx_bytes(&self) -> usize {
        self.url.len()
            + self.name.as_ref().map_or(0, String::len)
            + self.mime_type.as_ref().map_or(0, String::len)
            + self.metadata.as_ref().map_or(0, |m| m.get().len())
            + 96
    }
}

/// A JSON value kept as its text (compact, never a tree; compared by its text).
#[derive(Clone, Debug)]
pub struct RawJson(pub Arc<serde_json::value::RawValue>);

impl RawJson {
    /// The JSON text.
    pub fn get(&self) -> &str {
        self.0.get()
    }

    /// Keeps this JSON text.
    pub fn from_raw(raw: Box<serde_json::value::RawValue>) -> Self {
        Self(Arc::from(raw))
    }

    /// The JSON text of `value`.
    pub fn of(value: &serde_json::Value) -> Self {
        // A `Value` always serializes.
        Self::from_raw(
            serde_json::value::to_raw_value(value)
                .unwrap_or_else(|_| serde_json::value::RawValue::NULL.to_owned()),
        )
    }
}

impl PartialEq for RawJson {
    fn eq(&self, other: &Self) -> bool {
        self.get() == other.get()
    }
}

impl Part {
    /// The text, for text parts.
    pub fn as_text(&self) -> Option<&str> {
        match self {
            Self::Text(t) => Some(t),
            Self::File(_) | Self::Data(_) | Self::Url(_) => None,
        }
    }
}

/// An output of a task, apart from its messages: a document, a file, data.
#[derive(Clone, Debug, PartialEq)]
pub struct Artifact {
    /// Unique within its task; chunks of one artifact share it.
    pub artifact_id: String,
    /// A name, if the agent gave one.
    pub name: Option<String>,
    /// A description, if the agent gave one.
    pub description: Option<String>,
    /// The content.
    pub parts: Vec<Part>,
    /// The extensions it uses (those the request activated, at least).
    pub extensions: Extensions,
}

impl Artifact {
    /// An artifact with a fresh id.
    pub fn new(name: Option<&str>, parts: Vec<Part>) -> Self {
        Self {
            artifact_id: new_v4_text(&mut uuid::Uuid::encode_buffer()).to_owned(),
            name: name.map(str::to_string),
            description: None,
            parts,
            extensions: Extensions::default(),
        }
    }
}

/// One artifact event: a whole artifact, or a chunk of one.
#[derive(Clone, Debug)]
pub struct ArtifactUpdate {
    /// The artifact (the chunk's parts only, when `append`).
    pub artifact: Arc<Artifact>,
    /// The parts add to the artifact of the same id sent before.
    pub append: bool,
    /// The artifact is complete with this chunk.
    pub last_chunk: bool,
}

/// A file part's content, already validated.
#[derive(Clone, Debug, PartialEq)]
pub struct FileContent {
    /// The file name given by the client.
    pub name: String,
    /// The declared (and checked) MIME type.
    pub mime_type: String,
    /// Standard Base64 of the content, exactly as received.
    pub bytes: String,
    /// Decoded size in bytes.
    pub size: usize,
    /// The part's `metadata` object, if any (docs/PROTOCOL.md §12).
    pub metadata: Option<RawJson>,
}

/// Why a task failed, carried in `status.error`.
#[derive(Clone, Debug, PartialEq)]
pub struct TaskError {
    /// A numeric code (JSON-RPC style).
    pub code: i64,
    /// A human-readable message that leaks no internals or secrets.
    pub message: String,
}

/// Error code of a task failed by its agent.
pub const AGENT_ERROR_CODE: i64 = -32603;

/// A task's status at one point in time.
#[derive(Clone, Debug)]
pub struct TaskStatus {
    /// The state.
    pub state: TaskState,
    /// An agent message (progress text, or the reply on completion).
    pub message: Option<Arc<Message>>,
    /// The cancellation reason (canceled tasks only).
    pub reason: Option<Arc<str>>,
    /// The failure (failed tasks only).
    pub error: Option<Arc<TaskError>>,
    /// When the task entered this status.
    pub timestamp: DateTime<Utc>,
}

impl TaskStatus {
    /// A bare status in `state`, stamped now.
    pub fn new(state: TaskState) -> Self {
        Self::at(state, Utc::now())
    }

    /// A bare status in `state`, stamped `timestamp`.
    pub fn at(state: TaskState, timestamp: DateTime<Utc>) -> Self {
        Self {
            state,
            message: None,
            reason: None,
            error: None,
            timestamp,
        }
    }
}

/// One numbered event of a task: a state change, an intermediate agent update, or an
/// artifact.
///
/// Events are numbered from 1 per task and never renumbered; event 1 is `submitted`.
#[derive(Clone, Debug)]
pub struct TaskEvent {
    /// The event number (the SSE `id:`).
    pub seq: u64,
    /// The task's status after this event.
    pub status: TaskStatus,
    /// For an artifact event: the artifact (the status is then unchanged).
    pub artifact: Option<ArtifactUpdate>,
}

impl TaskEvent {
    /// A status event.
    pub fn status(seq: u64, status: TaskStatus) -> Self {
        Self {
            seq,
            status,
            artifact: None,
        }
    }

    /// The last event of a stream: a status event whose state is terminal or interrupted.
    pub fn is_final(&self) -> bool {
        self.artifact.is_none() && self.status.state.ends_stream()
    }

    /// The name of the event for webhooks and logs: `task.<state>` for a status event
    /// (progress updates too), `task.artifact` for an artifact event.
    pub fn name(&self) -> String {
        self.static_name().to_string()
    }

    /// [`TaskEvent::name`] without an allocation.
    pub fn static_name(&self) -> &'static str {
        if self.artifact.is_some() {
            return "task.artifact";
        }
        match self.status.state {
            TaskState::Submitted => "task.submitted",
            TaskState::Working => "task.working",
            TaskState::Completed => "task.completed",
            TaskState::Failed => "task.failed",
            TaskState::Canceled => "task.canceled",
            TaskState::InputRequired => "task.input-required",
            TaskState::AuthRequired => "task.auth-required",
            TaskState::Rejected => "task.rejected",
        }
    }
}

/// A read-only copy of a task as it stands.
#[derive(Clone, Debug)]
pub struct TaskSnapshot {
    /// The task id.
    pub id: TaskId,
    /// Its conversation.
    pub context_id: ContextId,
    /// The current status.
    pub status: TaskStatus,
    /// The number of the event that produced the current status.
    pub seq: u64,
    /// When it was submitted.
    pub created_at: DateTime<Utc>,
    /// When its status last changed.
    pub updated_at: DateTime<Utc>,
    /// The user message, then the agent messages, oldest first.
    pub history: Vec<Arc<Message>>,
    /// The task's artifacts, chunks merged, in the order they first appeared.
    pub artifacts: Vec<Arc<Artifact>>,
    /// The request's `metadata` (a JSON object, kept as its text), if any.
    pub metadata: Option<Arc<serde_json::value::RawValue>>,
    /// The extensions the creating request activated, in the agent's declared order.
    pub extensions: Extensions,
    /// The backend's own durable note on the task (the `a2a` backend: the upstream task
    /// it is carried by), kept with the record and given back to the backend when the
    /// task is continued or taken up again ([`crate::AgentRequest::note`]). Never shown
    /// to clients.
    pub note: Option<Arc<str>>,
}

impl TaskSnapshot {
    /// About how many bytes the record holds in memory (for retention budgets). Shared
    /// messages are counted in full: the budget errs on the safe side.
    pub fn approx_bytes(&self) -> usize {
        const FIXED: usize = 256;
        let history: usize = self.history.iter().map(|m| m.approx_bytes() + 16).sum();
        // A completed task's reply is also the last history entry: count it once.
        let reply_in_history = match (&self.status.message, self.history.last()) {
            (Some(m), Some(last)) => Arc::ptr_eq(m, last),
            _ => false,
        };
        let status = self
            .status
            .message
            .as_ref()
            .filter(|_| !reply_in_history)
            .map_or(0, |m| m.approx_bytes())
            + self.status.reason.as_ref().map_or(0, |r| r.len())
            + self.status.error.as_ref().map_or(0, |e| e.message.len());
        let artifacts: usize = self
            .artifacts
            .iter()
            // Counted as a message of the same content would be.
            .map(|a| {
                content_bytes(&a.parts, &a.extensions)
                    + std::mem::size_of::<Message>()
                    + a.artifact_id.len()
                    + 64
            })
            .sum();
        FIXED
            + artifacts
            + self.id.as_str().len()
            + self.context_id.as_str().len()
            + history
            + status
            + self.metadata.as_ref().map_or(0, |m| m.get().len())
            + extension_bytes(&self.extensions)
    }

    /// The event that produced the current status.
    pub fn current_event(&self) -> TaskEvent {
        TaskEvent::status(self.seq, self.status.clone())
    }
}

/// ISO 8601 UTC with milliseconds, as every timestamp on the wire.
pub fn iso8601(t: &DateTime<Utc>) -> String {
    Iso8601::of(t).as_str().to_owned()
}

/// A time as ISO 8601 UTC with milliseconds (`2026-12-03T14:33:49.123Z`, chrono's
/// `to_rfc3339_opts(Millis, true)`), written on the stack: a reply holds several, and
/// chrono's general formatter cost ~700 instructions each.
#[derive(Clone, Copy)]
pub struct Iso8601 {
    text: [u8; 32],
    len: u8,
}

impl Iso8601 {
    /// `t`, formatted.
    pub fn of(t: &DateTime<Utc>) -> Self {
        use chrono::{Datelike, Timelike};
        let mut text = [0u8; 32];
        let (year, nanos) = (t.year(), t.nanosecond());
        if !(0..=9999).contains(&year) || nanos >= 1_000_000_000 {
            // Years of other than four digits, a leap second: chrono's own.
            let long = t.to_rfc3339_opts(SecondsFormat::Millis, true);
            let len = long.len().min(text.len());
            text[..len].copy_from_slice(&long.as_bytes()[..len]);
            return Self {
                text,
                len: len as u8,
            };
        }
        let two = |out: &mut [u8], v: u32| {
            out[0] = b'0' + (v / 10 % 10) as u8;
            out[1] = b'0' + (v % 10) as u8;
        };
        let year = year as u32;
        two(&mut text[0..2], year / 100);
        two(&mut text[2..4], year % 100);
        text[4] = b'-';
        two(&mut text[5..7], t.month());
        text[7] = b'-';
        two(&mut text[8..10], t.day());
        text[10] = b'T';
        two(&mut text[11..13], t.hour());
        text[13] = b':';
        two(&mut text[14..16], t.minute());
        text[16] = b':';
        two(&mut text[17..19], t.second());
        text[19] = b'.';
        let millis = nanos / 1_000_000;
        text[20] = b'0' + (millis / 100) as u8;
        two(&mut text[21..23], millis % 100);
        text[23] = b'Z';
        Self { text, len: 24 }
    }

    /// The text.
    pub fn as_str(&self) -> &str {
        // ASCII digits and separators, or chrono's text cut at a char boundary it has
        // (chrono writes ASCII).
        std::str::from_utf8(&self.text[..usize::from(self.len)]).unwrap_or_default()
    }
}

impl fmt::Display for Iso8601 {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl serde::Serialize for Iso8601 {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(self.as_str())
    }
}

/// A completed task whose reply is its `status.message` and the last of its `history` as
/// the same `Arc` (as the task actor leaves it), and the same task holding an equal copy:
/// for the renders that write such a reply once.
#[cfg(test)]
pub(crate) fn completed_sharing_its_reply() -> (TaskSnapshot, TaskSnapshot) {
    let mut status = TaskStatus::new(TaskState::Completed);
    let reply = Arc::new(Message::agent_text(["a \"quoted\"\nreply", "second"]));
    status.message = Some(reply.clone());
    let shared = TaskSnapshot {
        id: TaskId::new("t-1"),
        context_id: ContextId::new("c-1"),
        seq: 3,
        created_at: status.timestamp,
        updated_at: status.timestamp,
        status,
        history: vec![Arc::new(Message::user_text(["hello"])), reply.clone()],
        artifacts: Vec::new(),
        metadata: None,
        extensions: Default::default(),
        note: None,
    };
    let mut copies = shared.clone();
    copies.status.message = Some(Arc::new((*reply).clone()));
    (shared, copies)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_artifact_counts_as_a_message_of_its_content_with_its_id() {
        let (mut task, _) = completed_sharing_its_reply();
        let without = task.approx_bytes();
        let mut artifact = Artifact::new(Some("reply"), vec![Part::Text("echo: hello".into())]);
        artifact.extensions = Extensions::new(vec!["https://example.com/ext".into()]);
        let same_content = Message {
            role: Role::Agent,
            parts: artifact.parts.clone(),
            message_id: String::new(),
            extensions: artifact.extensions.clone(),
        };
        let expected = same_content.approx_bytes() + artifact.artifact_id.len() + 64;
        task.artifacts.push(Arc::new(artifact));
        assert_eq!(task.approx_bytes() - without, expected);
    }

    #[test]
    fn timestamps_are_written_as_chrono_writes_them() {
        use chrono::TimeZone;
        let chrono_text = |t: &DateTime<Utc>| t.to_rfc3339_opts(SecondsFormat::Millis, true);
        let mut times = vec![
            Utc::now(),
            DateTime::<Utc>::UNIX_EPOCH,
            Utc.with_ymd_and_hms(2026, 12, 3, 14, 33, 9)
                .single()
                .expect("valid"),
            Utc.with_ymd_and_hms(9999, 12, 31, 23, 59, 59)
                .single()
                .expect("valid"),
            Utc.with_ymd_and_hms(0, 1, 1, 0, 0, 0)
                .single()
                .expect("valid"),
            Utc.with_ymd_and_hms(10000, 1, 1, 0, 0, 0)
                .single()
                .expect("valid"),
            Utc.with_ymd_and_hms(-1, 6, 30, 12, 0, 0)
                .single()
                .expect("valid"),
            Utc.with_ymd_and_hms(2016, 12, 31, 23, 59, 59)
                .single()
                .expect("valid")
                + chrono::Duration::nanoseconds(999_999_999),
        ];
        let leap = chrono::NaiveDate::from_ymd_opt(2016, 12, 31)
            .and_then(|d| d.and_hms_nano_opt(23, 59, 59, 1_500_000_000))
            .expect("a leap second");
        times.push(leap.and_utc());
        for ms in [0, 1, 9, 10, 99, 100, 999] {
            times.push(
                DateTime::<Utc>::UNIX_EPOCH + chrono::Duration::milliseconds(86_399_000 + ms),
            );
        }
        for t in &times {
            assert_eq!(Iso8601::of(t).as_str(), chrono_text(t), "{t:?}");
            assert_eq!(iso8601(t), chrono_text(t));
        }
    }

    /// Every state.
    const ALL: [TaskState; 8] = [
        TaskState::Submitted,
        TaskState::Working,
        TaskState::Completed,
        TaskState::Failed,
        TaskState::Canceled,
        TaskState::InputRequired,
        TaskState::AuthRequired,
        TaskState::Rejected,
    ];

    #[test]
    fn an_events_name_is_task_and_its_state() {
        for state in ALL {
            let e = TaskEvent::status(1, TaskStatus::new(state));
            assert_eq!(e.name(), format!("task.{}", state.as_str()));
        }
    }

    #[test]
    fn only_completed_failed_canceled_and_rejected_are_terminal() {
        let terminal: Vec<_> = ALL.into_iter().filter(|s| s.is_terminal()).collect();
        assert_eq!(
            terminal,
            vec![
                TaskState::Completed,
                TaskState::Failed,
                TaskState::Canceled,
                TaskState::Rejected
            ]
        );
    }

    #[test]
    fn interrupted_and_terminal_states_end_a_stream_and_no_other() {
        use TaskState::*;
        let interrupted: Vec<_> = ALL.into_iter().filter(|s| s.is_interrupted()).collect();
        assert_eq!(interrupted, vec![InputRequired, AuthRequired]);
        let ending: Vec<_> = ALL.into_iter().filter(|s| s.ends_stream()).collect();
        assert_eq!(
            ending,
            vec![
                Completed,
                Failed,
                Canceled,
                InputRequired,
                AuthRequired,
                Rejected
            ]
        );
        // An event is final when it ends a stream and carries no artifact.
        for state in ALL {
            let mut event = TaskEvent::status(1, TaskStatus::new(state));
            assert_eq!(event.is_final(), state.ends_stream(), "{state}");
            event.artifact = Some(ArtifactUpdate {
                artifact: Arc::new(Artifact::new(None, vec![Part::Text("a".into())])),
                append: false,
                last_chunk: true,
            });
            assert!(
                !event.is_final(),
                "{state}: an artifact event is never final"
            );
        }
    }

    #[test]
    fn the_transition_table_is_the_specs() {
        use TaskState::*;
        let all = [
            Submitted,
            Working,
            Completed,
            Failed,
            Canceled,
            InputRequired,
            AuthRequired,
            Rejected,
        ];
        let allowed: Vec<(TaskState, TaskState)> = all
            .iter()
            .flat_map(|&a| all.iter().map(move |&b| (a, b)))
            .filter(|(a, b)| a.can_become(*b))
            .filter(|(a, b)| {
                let spec = |s: &TaskState| {
                    matches!(s, Submitted | Working | Completed | Failed | Canceled)
                };
                spec(a) && spec(b)
            })
            .collect();
        assert_eq!(
            allowed,
            vec![
                (Submitted, Working),
                // A queued task whose runner is gone (restart, node loss) fails.
                (Submitted, Failed),
                (Submitted, Canceled),
                (Working, Working),
                (Working, Completed),
                (Working, Failed),
                (Working, Canceled),
            ]
        );
        for terminal in [Completed, Failed, Canceled, Rejected] {
            assert!(all.iter().all(|&n| !terminal.can_become(n)), "{terminal}");
        }
        for interrupted in [InputRequired, AuthRequired] {
            assert!(Working.can_become(interrupted) && interrupted.can_become(Working));
            assert!(interrupted.ends_stream() && !interrupted.is_terminal());
        }
    }

    #[test]
    fn user_and_agent_text_messages_carry_their_roles_and_fresh_ids() {
        let user = Message::user_text(["a", "b"]);
        let agent = Message::agent_text(["a", "b"]);
        assert_eq!((user.role, agent.role), (Role::User, Role::Agent));
        assert_eq!(user.parts, agent.parts);
        assert_ne!(user.message_id, agent.message_id);
    }

    #[test]
    fn joined_text_skips_files_and_joins_with_newline() {
        let m = Message {
            role: Role::User,
            parts: vec![
                Part::Text("a".into()),
                Part::File(Box::new(FileContent {
                    name: "f".into(),
                    mime_type: "text/plain".into(),
                    bytes: "YQ==".into(),
                    size: 1,
                    metadata: None,
                })),
                Part::Text("b".into()),
            ],
            message_id: "x".into(),
            extensions: Extensions::default(),
        };
        assert_eq!(m.joined_text(), "a\nb");
    }
}
