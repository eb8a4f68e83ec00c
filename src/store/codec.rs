//! How records are laid out in the store: keys as length-prefixed parts (so any id,
//! whatever bytes it holds, sorts and splits exactly); the rows written on every task
//! event (record, event, turn) in the compact form of codec/binary.rs, the others as JSON
//! of the record types below (which also read the JSON rows of schema 2). The layout is
//! the store's schema: it changes only with [`SCHEMA_VERSION`] (docs/ARCHITECTURE.md,
//! "The store"), never with the model.

use std::sync::Arc;

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use serde_json::value::RawValue;

use super::TurnId;
use super::seal::{Sealer, Unsealed};
use crate::model::{
    AgentId, Artifact, ArtifactUpdate, ContextId, DataPart, Extensions, FileContent, FileUrl,
    Message, Part, Principal, RawJson, Role, TaskError, TaskEvent, TaskId, TaskKey, TaskSnapshot,
    TaskState, TaskStatus,
};
use crate::push::{
    Events, Namespace, PushAuth, PushConfig, PushScope, RetryPolicy, StoredPushConfig, WebhookEvent,
};

/// The version of the file layout this build reads and writes: 3 writes the hot rows in
/// the compact form of codec/binary.rs (2's JSON rows still read); 4 lets a task's record
/// carry its conversation turn and leaves tombstones of forgotten conversations; 5 writes
/// compact rows of tag 2, with the content model's extensions and part metadata (rows of
/// tag 1 still read).
pub(crate) const SCHEMA_VERSION: u32 = 5;

mod binary;
mod keys;

pub(crate) use keys::*;

fn micros(t: &DateTime<Utc>) -> i64 {
    t.timestamp_micros()
}

/// Collects into a vector of exactly this many elements. `collect` would reuse the
/// decoded records' buffer in place: a larger element type, and serde's growth from
/// capacity 4, so a restored task held about twice the memory of a live one.
fn exact<T>(items: impl ExactSizeIterator<Item = T>) -> Vec<T> {
    let mut out = Vec::with_capacity(items.len());
    out.extend(items);
    out
}

/// The message of `shared` equal to `m` (a reply is one allocation in the task's history
/// and its events), or `m`.
fn share(m: Message, shared: &[Arc<Message>]) -> Arc<Message> {
    shared
        .iter()
        .rev()
        .find(|h| h.message_id == m.message_id && ***h == m)
        .cloned()
        .unwrap_or_else(|| Arc::new(m))
}

fn time(us: i64) -> DateTime<Utc> {
    DateTime::from_timestamp_micros(us).unwrap_or_default()
}

#[derive(Serialize, Deserialize)]
struct MessageRec {
    #[serde(rename = "r")]
    role: char,
    #[serde(rename = "i")]
    id: String,
    #[serde(rename = "p")]
    parts: Vec<PartRec>,
}

/// Externally tagged (`{"t": …}`): raw JSON data cannot go through serde's buffering of
/// internally tagged enums.
#[derive(Serialize, Deserialize)]
enum PartRec {
    #[serde(rename = "t")]
    Text(String),
    #[serde(rename = "f")]
    File {
        n: String,
        m: String,
        b: String,
        s: usize,
    },
    #[serde(rename = "u")]
    Url {
        u: String,
        n: Option<String>,
        m: Option<String>,
    },
    #[serde(rename = "d")]
    Data(Box<RawValue>),
}

impl MessageRec {
    #[cfg(test)]
    fn of(m: &Message) -> Self {
        Self {
            role: match m.role {
                Role::User => 'u',
                Role::Agent => 'a',
            },
            id: m.message_id.clone(),
            parts: m.parts.iter().map(PartRec::of).collect(),
        }
    }

    fn into_message(self) -> Message {
        Message {
            role: if self.role == 'u' {
                Role::User
            } else {
                Role::Agent
            },
            message_id: self.id,
            parts: exact(self.parts.into_iter().map(PartRec::into_part)),
            extensions: Extensions::default(),
        }
    }
}

impl PartRec {
    #[cfg(test)]
    fn of(p: &Part) -> Self {
        match p {
            Part::Text(t) => Self::Text(t.clone()),
            Part::File(f) => Self::File {
                n: f.name.clone(),
                m: f.mime_type.clone(),
                b: f.bytes.clone(),
                s: f.size,
            },
            Part::Url(u) => Self::Url {
                u: u.url.clone(),
                n: u.name.clone(),
                m: u.mime_type.clone(),
            },
            Part::Data(d) => Self::Data((*d.data.0).to_owned()),
        }
    }

    fn into_part(self) -> Part {
        match self {
            Self::Text(t) => Part::Text(t),
            Self::File { n, m, b, s } => Part::File(Box::new(FileContent {
                name: n,
                mime_type: m,
                bytes: b,
                size: s,
                metadata: None,
            })),
            Self::Url { u, n, m } => Part::Url(Box::new(FileUrl {
                url: u,
                name: n,
                mime_type: m,
                metadata: None,
            })),
            Self::Data(d) => Part::Data(Box::new(DataPart::new(RawJson::from_raw(d)))),
        }
    }
}

#[derive(Serialize, Deserialize)]
struct StatusRec {
    s: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    m: Option<MessageRec>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    r: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    e: Option<(i64, String)>,
    at: i64,
}

fn state_of(name: &str) -> TaskState {
    match name {
        "submitted" => TaskState::Submitted,
        "working" => TaskState::Working,
        "completed" => TaskState::Completed,
        "canceled" => TaskState::Canceled,
        "input-required" => TaskState::InputRequired,
        "auth-required" => TaskState::AuthRequired,
        "rejected" => TaskState::Rejected,
        _ => TaskState::Failed,
    }
}

impl StatusRec {
    #[cfg(test)]
    fn of(s: &TaskStatus) -> Self {
        Self {
            s: s.state.as_str().to_string(),
            m: s.message.as_deref().map(MessageRec::of),
            r: s.reason.as_deref().map(str::to_string),
            e: s.error.as_deref().map(|e| (e.code, e.message.clone())),
            at: micros(&s.timestamp),
        }
    }

    /// The status; `shared` lends the task's history so a reply stays one allocation.
    fn into_status(self, shared: &[Arc<Message>]) -> TaskStatus {
        let message = self.m.map(|m| share(m.into_message(), shared));
        TaskStatus {
            state: state_of(&self.s),
            message,
            reason: self.r.map(Arc::from),
            error: self
                .e
                .map(|(code, message)| Arc::new(TaskError { code, message })),
            timestamp: time(self.at),
        }
    }
}

#[derive(Serialize, Deserialize)]
struct ArtifactRec {
    i: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    n: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    d: Option<String>,
    p: Vec<PartRec>,
}

impl ArtifactRec {
    #[cfg(test)]
    fn of(a: &Artifact) -> Self {
        Self {
            i: a.artifact_id.clone(),
            n: a.name.clone(),
            d: a.description.clone(),
            p: a.parts.iter().map(PartRec::of).collect(),
        }
    }

    fn into_artifact(self) -> Artifact {
        Artifact {
            artifact_id: self.i,
            name: self.n,
            description: self.d,
            parts: exact(self.p.into_iter().map(PartRec::into_part)),
            extensions: Extensions::default(),
        }
    }
}

/// A task's record as stored.
#[derive(Serialize, Deserialize)]
struct TaskRec {
    c: String,
    st: StatusRec,
    seq: u64,
    ca: i64,
    ua: i64,
    h: Vec<MessageRec>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    a: Vec<ArtifactRec>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    md: Option<Box<RawValue>>,
    turn: u32,
    /// When the conversation began (schema 1 had no such field: 0).
    #[serde(default)]
    cs: i64,
}

/// Encodes a task's record (the compact form).
pub(crate) fn encode_task(task: &TaskSnapshot, turn: TurnId) -> Vec<u8> {
    binary::encode_task(task, turn, false)
}

/// Encodes a task's record that carries its conversation turn, or not: the embedded
/// store writes no row of its own for the turn of a task that finished in the batch
/// ([`crate::store::Write::carries_turn`]).
pub(crate) fn encode_record(task: &TaskSnapshot, turn: TurnId, carries_turn: bool) -> Vec<u8> {
    binary::encode_task(task, turn, carries_turn)
}

/// [`encode_record`], appended to `buf`.
pub(crate) fn encode_record_into(
    buf: &mut Vec<u8>,
    task: &TaskSnapshot,
    turn: TurnId,
    carries_turn: bool,
) {
    binary::encode_task_into(buf, task, turn, carries_turn);
}

/// Decodes a task's record: the task and its conversation turn.
pub(crate) fn decode_task(key: &TaskKey, bytes: &[u8]) -> Option<(TaskSnapshot, TurnId)> {
    decode_record(key, bytes).map(|(task, turn, _)| (task, turn))
}

/// Decodes a task's record: the task, its conversation turn, and whether the record
/// carries the turn ([`encode_record`]).
pub(crate) fn decode_record(key: &TaskKey, bytes: &[u8]) -> Option<(TaskSnapshot, TurnId, bool)> {
    if binary::is_compact(bytes) {
        return binary::decode_task(key, bytes);
    }
    let rec: TaskRec = serde_json::from_slice(bytes).ok()?;
    let history = exact(rec.h.into_iter().map(|m| Arc::new(m.into_message())));
    let status = rec.st.into_status(&history);
    Some((
        TaskSnapshot {
            id: key.task.clone(),
            context_id: ContextId::new(rec.c),
            status,
            seq: rec.seq,
            created_at: time(rec.ca),
            updated_at: time(rec.ua),
            history,
            artifacts: exact(rec.a.into_iter().map(|a| Arc::new(a.into_artifact()))),
            metadata: rec.md.map(Arc::from),
            extensions: Extensions::default(),
            note: None,
        },
        TurnId {
            number: rec.turn,
            since: rec.cs,
        },
        false,
    ))
}

#[derive(Serialize, Deserialize)]
struct EventRec {
    st: StatusRec,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    a: Option<(ArtifactRec, bool, bool)>,
}

/// Encodes an event (the compact form).
pub(crate) fn encode_event(event: &TaskEvent) -> Vec<u8> {
    binary::encode_event(event)
}

/// [`encode_event`], appended to `buf`.
pub(crate) fn encode_event_into(buf: &mut Vec<u8>, event: &TaskEvent) {
    binary::encode_event_into(buf, event);
}

/// Whether an event row reads back: its key is a task's key and a number, its value an
/// event record (checked at open, so a damaged row refuses the start instead of vanishing
/// from a later replay).
pub(crate) fn event_row_is_valid(key: &[u8], value: &[u8]) -> bool {
    keys::is_event_key(key) && event_is_valid(value)
}

/// Whether [`decode_event`] reads an event's value.
pub(crate) fn event_is_valid(value: &[u8]) -> bool {
    if binary::is_compact(value) {
        binary::check_event(value)
    } else {
        serde_json::from_slice::<EventRec>(value).is_ok()
    }
}

/// Decodes event `seq`; `history` lends messages the event shares with its task.
pub(crate) fn decode_event(seq: u64, bytes: &[u8], history: &[Arc<Message>]) -> Option<TaskEvent> {
    if binary::is_compact(bytes) {
        return binary::decode_event(seq, bytes, history);
    }
    let rec: EventRec = serde_json::from_slice(bytes).ok()?;
    Some(TaskEvent {
        seq,
        status: rec.st.into_status(history),
        artifact: rec.a.map(|(a, append, last_chunk)| ArtifactUpdate {
            artifact: Arc::new(a.into_artifact()),
            append,
            last_chunk,
        }),
    })
}

#[derive(Serialize, Deserialize)]
struct PushRec {
    id: String,
    p: String,
    a: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    t: Option<String>,
    named: bool,
    f: String,
    /// The URL; masked when `us` holds it sealed.
    url: String,
    /// The whole URL sealed, when it carries credentials (userinfo, a query) and a key is
    /// configured.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    us: Option<String>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    h: Vec<(String, String)>,
    /// `None`: every event.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    ev: Option<Vec<String>>,
    rt: (u32, f64, f64),
    #[serde(default, skip_serializing_if = "Option::is_none")]
    sec: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    tok: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    auth: Option<(String, Option<String>)>,
    ca: i64,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    lu: Option<i64>,
    on: bool,
    fails: u32,
}

/// Encodes a push configuration with its delivery bookkeeping; its secret, token,
/// credentials and header values sealed (`store/seal.rs`).
pub(crate) fn encode_push(c: &StoredPushConfig, sealer: &Sealer) -> Vec<u8> {
    use std::sync::atomic::Ordering::Relaxed;
    let cfg = &c.config;
    // Credentials in the URL (`https://user:pass@host/…`, `?token=…`) are secrets too.
    let url_sealed = (sealer.seals() && crate::push::url_has_credentials(&cfg.url))
        .then(|| sealer.seal("url", &cfg.url));
    let rec = PushRec {
        id: c.id.clone(),
        p: c.scope.principal.to_string(),
        a: c.scope.agent.to_string(),
        t: c.scope.task.as_ref().map(TaskId::to_string),
        named: c.namespace == Namespace::Named,
        f: c.format.to_string(),
        url: if url_sealed.is_some() {
            masked_url(&cfg.url)
        } else {
            cfg.url.clone()
        },
        us: url_sealed,
        h: cfg
            .headers
            .iter()
            .map(|(name, value)| (name.clone(), sealer.seal(&format!("h:{name}"), value)))
            .collect(),
        ev: match &cfg.events {
            Events::All => None,
            Events::StateChanges(names) => {
                Some(names.iter().map(|e| e.as_str().to_string()).collect())
            }
        },
        rt: (
            cfg.retry.max_retries,
            cfg.retry.backoff_multiplier,
            cfg.retry.initial_delay,
        ),
        sec: cfg.secret.as_deref().map(|v| sealer.seal("sec", v)),
        tok: cfg.token.as_deref().map(|v| sealer.seal("tok", v)),
        auth: cfg.authorization.as_ref().map(|a| {
            (
                a.scheme.clone(),
                a.credentials.as_deref().map(|v| sealer.seal("auth", v)),
            )
        }),
        ca: micros(&c.created_at),
        lu: c.last_used().as_ref().map(micros),
        on: c.is_active(),
        fails: c.consecutive_failures.load(Relaxed),
    };
    serde_json::to_vec(&rec).unwrap_or_default()
}

/// The URL kept in clear beside its sealed whole: its userinfo (user and password: either
/// may be a token) and query values masked.
fn masked_url(raw: &str) -> String {
    let mut shown = crate::push::redact_url(raw);
    if let Ok(mut url) = url::Url::parse(&shown)
        && !url.username().is_empty()
    {
        let _ = url.set_username("***");
        shown = url.to_string();
    }
    shown
}

/// Decodes a push configuration (`None`: not one, or sealed with a key not configured).
pub(crate) fn decode_push(bytes: &[u8], sealer: &Sealer) -> Option<Arc<StoredPushConfig>> {
    decode_push_checked(bytes, sealer).ok().flatten()
}

/// Decodes a push configuration: `Ok(None)` when the bytes are not one, an error when its
/// secrets are sealed with a key that is not configured.
pub(crate) fn decode_push_checked(
    bytes: &[u8],
    sealer: &Sealer,
) -> Result<Option<Arc<StoredPushConfig>>, Unsealed> {
    let Ok(rec) = serde_json::from_slice::<PushRec>(bytes) else {
        return Ok(None);
    };
    let open = |field: &str, v: Option<String>| v.map(|v| sealer.open(field, &v)).transpose();
    let headers = rec
        .h
        .into_iter()
        .map(|(name, value)| {
            let value = sealer.open(&format!("h:{name}"), &value)?;
            Ok((name, value))
        })
        .collect::<Result<Vec<_>, Unsealed>>()?;
    let secret = open("sec", rec.sec)?;
    let token = open("tok", rec.tok)?;
    let authorization = match rec.auth {
        None => None,
        Some((scheme, credentials)) => Some(PushAuth {
            scheme,
            credentials: open("auth", credentials)?,
        }),
    };
    let url = match rec.us {
        Some(sealed) => sealer.open("url", &sealed)?,
        None => rec.url,
    };
    let config = PushConfig {
        url,
        headers,
        events: match rec.ev {
            None => Events::All,
            Some(names) => Events::StateChanges(
                names
                    .iter()
                    .filter_map(|n| WebhookEvent::parse(n))
                    .collect(),
            ),
        },
        retry: RetryPolicy {
            max_retries: rec.rt.0,
            backoff_multiplier: rec.rt.1,
            initial_delay: rec.rt.2,
        },
        secret,
        token,
        authorization,
    };
    let scope = PushScope {
        principal: Principal::new(rec.p),
        agent: AgentId::new(rec.a),
        task: rec.t.map(TaskId::new),
    };
    let namespace = if rec.named {
        Namespace::Named
    } else {
        Namespace::Scoped
    };
    Ok(Some(StoredPushConfig::restore(
        rec.id,
        scope,
        namespace,
        &rec.f,
        config,
        time(rec.ca),
        rec.lu.map(time),
        rec.on,
        rec.fails,
    )))
}

#[derive(Serialize, Deserialize)]
struct OutboxRec {
    n: u32,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    due: Option<i64>,
}

/// Encodes an outbox entry: the next attempt's number and when it is due.
pub(crate) fn encode_outbox(attempt: u32, due: Option<DateTime<Utc>>) -> Vec<u8> {
    serde_json::to_vec(&OutboxRec {
        n: attempt,
        due: due.as_ref().map(micros),
    })
    .unwrap_or_default()
}

/// Decodes an outbox entry.
pub(crate) fn decode_outbox(bytes: &[u8]) -> Option<(u32, Option<DateTime<Utc>>)> {
    let rec: OutboxRec = serde_json::from_slice(bytes).ok()?;
    Some((rec.n.max(1), rec.due.map(time)))
}

#[derive(Serialize, Deserialize)]
struct TurnRec {
    u: MessageRec,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    r: Option<MessageRec>,
}

/// Encodes a conversation turn (the compact form).
pub(crate) fn encode_turn(user: &Message, reply: Option<&Message>) -> Vec<u8> {
    binary::encode_turn(user, reply)
}

/// Decodes a conversation turn.
pub(crate) fn decode_turn(bytes: &[u8]) -> Option<(Arc<Message>, Option<Arc<Message>>)> {
    if binary::is_compact(bytes) {
        return binary::decode_turn(bytes);
    }
    let rec: TurnRec = serde_json::from_slice(bytes).ok()?;
    Some((
        Arc::new(rec.u.into_message()),
        rec.r.map(|r| Arc::new(r.into_message())),
    ))
}

/// The key of a forgotten conversation's tombstone: turn number 0 of the conversation
/// (turns are numbered from 1), so that it sorts before the turns and goes with them.
pub(crate) fn tombstone_key(principal: &Principal, context: &ContextId, since: i64) -> Vec<u8> {
    turn_key(principal, context, TurnId { number: 0, since })
}

/// A tombstone's value: a tag no turn begins with, then when it was written (µs since the
/// epoch, big-endian).
pub(crate) fn encode_tombstone(at: i64) -> Vec<u8> {
    let mut out = Vec::with_capacity(9);
    out.push(TOMBSTONE);
    out.extend_from_slice(&at.to_be_bytes());
    out
}

/// When a tombstone was written.
pub(crate) fn decode_tombstone(bytes: &[u8]) -> Option<i64> {
    match bytes {
        [TOMBSTONE, at @ ..] => Some(i64::from_be_bytes(at.try_into().ok()?)),
        _ => None,
    }
}

/// A tombstone's tag (a compact row begins with [`binary::TAG`], a JSON row with `{`).
const TOMBSTONE: u8 = 0xd7;

/// The JSON rows of schema 2, as that schema wrote them: the tests check they still read.
#[cfg(test)]
pub(crate) mod json {
    use super::*;

    pub(crate) fn task(task: &TaskSnapshot, turn: TurnId) -> Vec<u8> {
        serde_json::to_vec(&TaskRec {
            c: task.context_id.to_string(),
            st: StatusRec::of(&task.status),
            seq: task.seq,
            ca: micros(&task.created_at),
            ua: micros(&task.updated_at),
            h: task.history.iter().map(|m| MessageRec::of(m)).collect(),
            a: task.artifacts.iter().map(|a| ArtifactRec::of(a)).collect(),
            md: task.metadata.as_ref().map(|m| (**m).to_owned()),
            turn: turn.number,
            cs: turn.since,
        })
        .unwrap_or_default()
    }

    pub(crate) fn event(event: &TaskEvent) -> Vec<u8> {
        serde_json::to_vec(&EventRec {
            st: StatusRec::of(&event.status),
            a: event
                .artifact
                .as_ref()
                .map(|u| (ArtifactRec::of(&u.artifact), u.append, u.last_chunk)),
        })
        .unwrap_or_default()
    }

    pub(crate) fn turn(user: &Message, reply: Option<&Message>) -> Vec<u8> {
        serde_json::to_vec(&TurnRec {
            u: MessageRec::of(user),
            r: reply.map(MessageRec::of),
        })
        .unwrap_or_default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key() -> TaskKey {
        TaskKey {
            principal: "p\u{0}1".into(),
            agent: "a".into(),
            task: TaskId::new("t:ü"),
        }
    }

    #[test]
    fn keys_split_back_into_their_parts_whatever_bytes_ids_hold() {
        let k = key();
        for created in [i64::MIN, -1, 0, 1_700_000_000_000_000, i64::MAX] {
            assert_eq!(
                parse_task_key(&task_key(&k, created)),
                Some((created, k.clone()))
            );
        }
        let o = super::super::OutboxKey {
            task: k.clone(),
            created: 5,
            seq: 7,
            config: "c\u{0}".into(),
        };
        assert_eq!(parse_outbox_key(&outbox_key(&o)), Some(o));
        let t = TurnId {
            number: 3,
            since: -7,
        };
        let turn = turn_key(&"p".into(), &ContextId::new("c"), t);
        assert_eq!(
            parse_turn_key(&turn),
            Some(("p".into(), ContextId::new("c"), t))
        );
        // A task's events sort in number order under its prefix, and only its own.
        let prefix = task_key(&k, 9);
        let (a, b) = (event_key(&k, 9, 2), event_key(&k, 9, 10));
        assert!(a < b && a.starts_with(&prefix) && b < prefix_end(&prefix));
        // An event's key is a task's key and a number: nothing short of it or past it.
        assert!(keys::is_event_key(&a));
        assert!(!keys::is_event_key(&a[..a.len() - 1]));
        assert!(!keys::is_event_key(&prefix));
        assert!(!keys::is_event_key(&[a.as_slice(), &[0]].concat()));
        let mut not_utf8 = a.clone();
        not_utf8[prefix.len() - 1] = 0xff;
        assert!(!keys::is_event_key(&not_utf8));
    }

    #[test]
    fn task_rows_sort_by_creation_time_first() {
        let (early, late) = (
            key(),
            TaskKey {
                task: TaskId::new("a"),
                ..key()
            },
        );
        assert!(task_key(&early, -5) < task_key(&late, 3));
        assert!(task_key(&late, 3) < task_key(&early, 4));
        assert!(event_key(&early, 4, u64::MAX) < task_key(&late, 5));
    }

    #[test]
    fn the_check_at_open_answers_as_the_event_decoder_does_whatever_the_bytes() {
        let data = RawValue::from_string(r#"{"k":[1,2]}"#.into()).expect("json");
        let mut status = TaskStatus::new(TaskState::Failed);
        status.message = Some(Arc::new(Message::agent_text(["ü"])));
        status.reason = Some(Arc::from("because"));
        status.error = Some(Arc::new(TaskError {
            code: -1,
            message: "e".into(),
        }));
        let parts = vec![
            Part::Text("t".into()),
            Part::File(Box::new(FileContent {
                name: "n".into(),
                mime_type: "m".into(),
                bytes: "aGk=".into(),
                size: 2,
                metadata: None,
            })),
            Part::Url(Box::new(FileUrl {
                url: "u".into(),
                name: Some("n".into()),
                mime_type: None,
                metadata: None,
            })),
            Part::Data(Box::new(DataPart::new(RawJson(Arc::from(data))))),
        ];
        let event = TaskEvent {
            seq: 1,
            status,
            artifact: Some(ArtifactUpdate {
                artifact: Arc::new(Artifact::new(Some("a"), parts)),
                append: false,
                last_chunk: true,
            }),
        };
        let agree = |bytes: &[u8]| {
            assert_eq!(
                event_is_valid(bytes),
                decode_event(1, bytes, &[]).is_some(),
                "{bytes:?}"
            );
        };
        let mut accepted = 0;
        for row in [
            encode_event(&event),
            encode_event(&TaskEvent::status(2, TaskStatus::new(TaskState::Working))),
        ] {
            for end in 0..=row.len() {
                agree(&row[..end]);
            }
            for at in 0..row.len() {
                for b in [0, 1, 2, 3, 4, 7, 8, b'{', 0x80, 0xff] {
                    let mut changed = row.clone();
                    changed[at] = b;
                    agree(&changed);
                    accepted += usize::from(event_is_valid(&changed));
                }
            }
            assert!(event_is_valid(&row));
        }
        assert!(
            accepted > 0,
            "some changed bytes still read: both answers were met"
        );
    }

    #[test]
    fn a_task_record_and_its_events_round_trip() {
        let reply = Arc::new(Message::agent_text(["echo: hi"]));
        let user = Arc::new(Message {
            role: Role::User,
            parts: vec![
                Part::Text("hi".into()),
                Part::File(Box::new(FileContent {
                    name: "a.txt".into(),
                    mime_type: "text/plain".into(),
                    bytes: "aGk=".into(),
                    size: 2,
                    metadata: None,
                })),
            ],
            message_id: "m1".into(),
            extensions: Default::default(),
        });
        let mut status = TaskStatus::new(TaskState::Completed);
        status.message = Some(reply.clone());
        let data = RawValue::from_string(r#"{"k":[1,2]}"#.into()).expect("json");
        let task = TaskSnapshot {
            id: key().task,
            context_id: ContextId::new("ctx"),
            status: status.clone(),
            seq: 3,
            created_at: Utc::now(),
            updated_at: status.timestamp,
            history: vec![user.clone(), reply.clone()],
            artifacts: vec![Arc::new(Artifact::new(
                Some("reply"),
                vec![Part::Data(Box::new(DataPart::new(RawJson(Arc::from(
                    data,
                )))))],
            ))],
            metadata: Some(Arc::from(
                RawValue::from_string(r#"{"trace":"x"}"#.into()).expect("json"),
            )),
            extensions: Default::default(),
            note: None,
        };
        let t = TurnId {
            number: 4,
            since: 12,
        };
        let mut failed = TaskStatus::new(TaskState::Failed);
        failed.reason = Some(Arc::from("because"));
        failed.error = Some(Arc::new(TaskError {
            code: -32603,
            message: "upstream".into(),
        }));
        let chunk = TaskEvent {
            seq: 4,
            status: failed.clone(),
            artifact: Some(ArtifactUpdate {
                artifact: Arc::new(Artifact::new(
                    None,
                    vec![Part::Url(Box::new(FileUrl {
                        url: "https://x/y".into(),
                        name: None,
                        mime_type: Some("image/png".into()),
                        metadata: None,
                    }))],
                )),
                append: true,
                last_chunk: false,
            }),
        };
        // Schema 3's compact rows, and schema 2's JSON rows, which still read.
        let forms = [
            (
                encode_task(&task, t),
                encode_event(&TaskEvent::status(3, status.clone())),
                encode_event(&chunk),
                encode_turn(&user, Some(&reply)),
            ),
            (
                json::task(&task, t),
                json::event(&TaskEvent::status(3, status.clone())),
                json::event(&chunk),
                json::turn(&user, Some(&reply)),
            ),
        ];
        assert_eq!(forms[0].0.first(), Some(&2), "the compact form's tag");
        assert_eq!(forms[1].0.first(), Some(&b'{'));
        for (record, event, chunk_row, turn_row) in &forms {
            let (back, turn) = decode_task(&key(), record).expect("decodes");
            assert_eq!(turn, t);
            assert_eq!(back.history.len(), 2);
            assert_eq!(*back.history[0], *user);
            assert!(
                Arc::ptr_eq(
                    back.status.message.as_ref().expect("reply"),
                    &back.history[1]
                ),
                "the reply is shared with the history, as in memory"
            );
            assert_eq!(back.status.state, TaskState::Completed);
            assert_eq!(
                back.status.timestamp.timestamp_micros(),
                status.timestamp.timestamp_micros()
            );
            assert_eq!(back.artifacts[0].parts, task.artifacts[0].parts);
            assert_eq!(
                back.metadata.as_ref().map(|m| m.get()),
                Some(r#"{"trace":"x"}"#)
            );
            let e = decode_event(3, event, &back.history).expect("event");
            assert_eq!(e.seq, 3);
            assert!(event_row_is_valid(&event_key(&key(), 1, 3), event));
            assert_eq!(e.status.state, TaskState::Completed);
            let c = decode_event(4, chunk_row, &back.history).expect("chunk");
            assert_eq!(c.status.reason.as_deref(), Some("because"));
            assert_eq!(c.status.error.as_deref().map(|e| e.code), Some(-32603));
            let a = c.artifact.expect("artifact");
            assert_eq!((a.append, a.last_chunk), (true, false));
            assert_eq!(
                a.artifact.parts,
                chunk.artifact.as_ref().expect("a").artifact.parts
            );
            let (u, r) = decode_turn(turn_row).expect("turn");
            assert_eq!((&*u, r.as_deref()), (&*user, Some(&*reply)));
        }
        // A compact row cut short, or with bytes after it, is no row.
        let record = &forms[0].0;
        assert!(decode_task(&key(), &record[..record.len() - 1]).is_none());
        let mut longer = record.clone();
        longer.push(0);
        assert!(decode_task(&key(), &longer).is_none());
        // A backend's note rides in the trailing flags, with or without the turn.
        let noted = TaskSnapshot {
            note: Some(Arc::from("{\"task\":\"up-1\"}")),
            ..task.clone()
        };
        for carries in [false, true] {
            let row = encode_record(&noted, t, carries);
            let (back, turn, carried) = binary::decode_task(&key(), &row).expect("noted");
            assert_eq!(
                (back.note.as_deref(), turn, carried),
                (noted.note.as_deref(), t, carries)
            );
            assert!(binary::decode_task(&key(), &row[..row.len() - 1]).is_none());
        }
        let (plain, _, carried) =
            binary::decode_task(&key(), &encode_record(&task, t, true)).expect("turn only");
        assert_eq!((plain.note, carried), (None, true));
    }

    fn raw(text: &str) -> RawJson {
        RawJson::from_raw(RawValue::from_string(text.into()).expect("json"))
    }

    #[test]
    fn compact_rows_keep_extensions_and_part_metadata() {
        let ext = Extensions::new(vec!["https://ext.example/a".into(), "urn:b".into()]);
        let parts = vec![
            Part::Data(Box::new(DataPart {
                data: raw(r#"[1,{"k":null}]"#),
                media_type: Some("application/vnd.x+json".into()),
                metadata: Some(raw(r#"{"m":1}"#)),
            })),
            Part::Url(Box::new(FileUrl {
                url: "https://files.example/a.pdf".into(),
                name: Some("a.pdf".into()),
                mime_type: None,
                metadata: Some(raw(r#"{"n":"x"}"#)),
            })),
            Part::File(Box::new(FileContent {
                name: "a.txt".into(),
                mime_type: "text/plain".into(),
                bytes: "aGk=".into(),
                size: 2,
                metadata: Some(raw(r#"{"f":[1]}"#)),
            })),
        ];
        let user = Arc::new(Message {
            role: Role::User,
            parts: parts.clone(),
            message_id: "m".into(),
            extensions: ext.clone(),
        });
        let mut artifact = Artifact::new(Some("a"), parts);
        artifact.extensions = ext.clone();
        let task = TaskSnapshot {
            id: key().task,
            context_id: ContextId::new("ctx"),
            status: TaskStatus::new(TaskState::Working),
            seq: 2,
            created_at: Utc::now(),
            updated_at: Utc::now(),
            history: vec![user.clone()],
            artifacts: vec![Arc::new(artifact.clone())],
            metadata: None,
            extensions: ext.clone(),
            note: None,
        };
        let t = TurnId {
            number: 1,
            since: 1,
        };
        let (back, _) = decode_task(&key(), &encode_task(&task, t)).expect("record");
        assert_eq!(*back.history[0], *user);
        assert_eq!(*back.artifacts[0], artifact);
        assert_eq!(back.extensions, ext);
        let event = TaskEvent {
            seq: 3,
            status: TaskStatus::new(TaskState::Working),
            artifact: Some(ArtifactUpdate {
                artifact: Arc::new(artifact.clone()),
                append: false,
                last_chunk: true,
            }),
        };
        let row = encode_event(&event);
        assert!(event_is_valid(&row));
        let e = decode_event(3, &row, &[]).expect("event");
        assert_eq!(*e.artifact.expect("artifact").artifact, artifact);
        let (u, _) = decode_turn(&encode_turn(&user, None)).expect("turn");
        assert_eq!(*u, *user);
    }

    /// Rows of tag 1 (schemas 3 and 4), written byte by byte as that build wrote them.
    #[test]
    fn compact_rows_of_tag_1_still_read() {
        fn s(out: &mut Vec<u8>, t: &str) {
            out.extend_from_slice(&(t.len() as u32).to_le_bytes());
            out.extend_from_slice(t.as_bytes());
        }
        // A turn: the user message `m1` of a text part and a data part, no reply.
        let mut turn = vec![1u8, 0];
        s(&mut turn, "m1");
        turn.extend_from_slice(&2u32.to_le_bytes());
        turn.push(0);
        s(&mut turn, "hi");
        turn.push(3);
        s(&mut turn, r#"{"a":1}"#);
        turn.push(0);
        let (u, r) = decode_turn(&turn).expect("a tag-1 turn reads");
        assert!(r.is_none());
        assert_eq!(u.message_id, "m1");
        assert!(u.extensions.is_empty());
        assert_eq!(
            u.parts,
            vec![
                Part::Text("hi".into()),
                Part::Data(Box::new(DataPart::new(raw(r#"{"a":1}"#))))
            ]
        );
        // An event: `working`, no message, then an artifact of one URL part.
        let mut event = vec![1u8, 1, 0, 0, 0];
        event.extend_from_slice(&7i64.to_le_bytes());
        event.push(1);
        s(&mut event, "art");
        event.extend_from_slice(&[0, 0]);
        event.extend_from_slice(&1u32.to_le_bytes());
        event.push(2);
        s(&mut event, "https://x/y");
        event.extend_from_slice(&[0, 0]);
        event.extend_from_slice(&[0, 1]);
        assert!(event_is_valid(&event));
        let e = decode_event(9, &event, &[]).expect("a tag-1 event reads");
        let a = e.artifact.expect("artifact");
        assert_eq!(a.artifact.artifact_id, "art");
        assert!(
            matches!(&a.artifact.parts[0], Part::Url(u) if u.url == "https://x/y" && u.metadata.is_none())
        );
        assert!(a.last_chunk && !a.append);
    }
}
