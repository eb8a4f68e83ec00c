//! Keys of the store file: length-prefixed parts, so any id, whatever bytes it holds,
//! sorts and splits exactly.

use super::super::{OutboxKey, TurnId};
use crate::model::{AgentId, ContextId, Principal, TaskId, TaskKey, TaskSnapshot};
use crate::push::{Namespace, PushScope, StoredPushConfig};

fn put_part(out: &mut Vec<u8>, part: &str) {
    out.extend_from_slice(&(part.len() as u32).to_be_bytes());
    out.extend_from_slice(part.as_bytes());
}

/// Reads the parts of a key written by [`put_part`], and what follows them.
struct KeyReader<'a>(&'a [u8]);

impl<'a> KeyReader<'a> {
    fn part(&mut self) -> Option<&'a str> {
        let (len, rest) = self.0.split_first_chunk::<4>()?;
        let len = u32::from_be_bytes(*len) as usize;
        let (part, rest) = (rest.get(..len)?, rest.get(len..)?);
        self.0 = rest;
        std::str::from_utf8(part).ok()
    }

    fn u64(&mut self) -> Option<u64> {
        let (n, rest) = self.0.split_first_chunk::<8>()?;
        self.0 = rest;
        Some(u64::from_be_bytes(*n))
    }

    fn u32(&mut self) -> Option<u32> {
        let (n, rest) = self.0.split_first_chunk::<4>()?;
        self.0 = rest;
        Some(u32::from_be_bytes(*n))
    }

    fn done(&self) -> bool {
        self.0.is_empty()
    }
}

/// Where a task's rows sit: its creation time first, so that the rows of new tasks are
/// appended at the end of each table's B-tree (a commit then touches a few pages, not one
/// per task), then the task's key. The embedded store reads this from the task's record.
pub(crate) type Created = i64;

/// A task's creation time as the first part of its row keys.
pub(crate) fn created(task: &TaskSnapshot) -> Created {
    task.created_at.timestamp_micros()
}

/// The key of a task (and the prefix of its events and outbox entries): creation time
/// (µs, sign bit flipped so that it sorts as unsigned big-endian), then the task's key.
pub(crate) fn task_key(key: &TaskKey, created: Created) -> Vec<u8> {
    let mut out = Vec::with_capacity(72);
    out.extend_from_slice(&((created as u64) ^ (1 << 63)).to_be_bytes());
    put_part(&mut out, key.principal.as_str());
    put_part(&mut out, key.agent.as_str());
    put_part(&mut out, key.task.as_str());
    out
}

fn read_task_key(r: &mut KeyReader<'_>) -> Option<(Created, TaskKey)> {
    let created = (r.u64()? ^ (1 << 63)) as i64;
    Some((created, v1::read_task_key(r)?))
}

/// Parses a task key.
pub(crate) fn parse_task_key(bytes: &[u8]) -> Option<(Created, TaskKey)> {
    let (created, principal, agent, task) = task_key_parts(bytes)?;
    Some((
        created,
        TaskKey {
            principal: Principal::new(principal),
            agent: AgentId::new(agent),
            task: TaskId::new(task),
        },
    ))
}

/// A task key's parts as they are written (creation time, principal, agent, task id),
/// for a reader that builds the key itself (a restart shares one copy of each name).
pub(crate) fn task_key_parts(bytes: &[u8]) -> Option<(Created, &str, &str, &str)> {
    let mut r = KeyReader(bytes);
    let created = (r.u64()? ^ (1 << 63)) as i64;
    let parts = (created, r.part()?, r.part()?, r.part()?);
    r.done().then_some(parts)
}

/// The key of a task's event.
pub(crate) fn event_key(key: &TaskKey, created: Created, seq: u64) -> Vec<u8> {
    let mut out = task_key(key, created);
    out.extend_from_slice(&seq.to_be_bytes());
    out
}

/// The key of an outbox entry: the task, the event, the configuration.
pub(crate) fn outbox_key(key: &OutboxKey) -> Vec<u8> {
    let mut out = event_key(&key.task, key.created, key.seq);
    put_part(&mut out, &key.config);
    out
}

/// Parses an outbox key.
pub(crate) fn parse_outbox_key(bytes: &[u8]) -> Option<OutboxKey> {
    let mut r = KeyReader(bytes);
    let (created, task) = read_task_key(&mut r)?;
    let seq = r.u64()?;
    let config = r.part()?.to_string();
    r.done().then_some(OutboxKey {
        task,
        created,
        seq,
        config,
    })
}

/// The key layout of schema 1 (task rows keyed by the task's key alone), read only to
/// migrate a file of that schema.
pub(crate) mod v1 {
    use super::{AgentId, KeyReader, Principal, TaskId, TaskKey};

    pub(super) fn read_task_key(r: &mut KeyReader<'_>) -> Option<TaskKey> {
        Some(TaskKey {
            principal: Principal::new(r.part()?),
            agent: AgentId::new(r.part()?),
            task: TaskId::new(r.part()?),
        })
    }

    /// A task key of schema 1.
    pub(crate) fn parse_task_key(bytes: &[u8]) -> Option<TaskKey> {
        let mut r = KeyReader(bytes);
        let key = read_task_key(&mut r)?;
        r.done().then_some(key)
    }

    /// An event or outbox key of schema 1: the task, and the rest of the key after it.
    pub(crate) fn split_task_key(bytes: &[u8]) -> Option<(TaskKey, &[u8])> {
        let mut r = KeyReader(bytes);
        let key = read_task_key(&mut r)?;
        Some((key, r.0))
    }
}

/// The key of a push configuration.
pub(crate) fn push_key(config: &StoredPushConfig) -> Vec<u8> {
    match config.namespace {
        Namespace::Scoped => scoped_key(&config.scope),
        Namespace::Named => {
            let mut out = vec![b'N'];
            put_part(&mut out, config.scope.principal.as_str());
            put_part(&mut out, config.scope.agent.as_str());
            put_part(
                &mut out,
                config.scope.task.as_ref().map_or("", TaskId::as_str),
            );
            put_part(&mut out, &config.id);
            out
        }
    }
}

/// The key of the scoped configuration of a scope.
pub(crate) fn scoped_key(scope: &PushScope) -> Vec<u8> {
    let mut out = vec![b'S'];
    put_part(&mut out, scope.principal.as_str());
    put_part(&mut out, scope.agent.as_str());
    match &scope.task {
        Some(t) => {
            out.push(1);
            put_part(&mut out, t.as_str());
        }
        None => out.push(0),
    }
    out
}

/// The key of a named configuration.
pub(crate) fn named_key(task: &TaskKey, id: &str) -> Vec<u8> {
    let mut out = vec![b'N'];
    put_part(&mut out, task.principal.as_str());
    put_part(&mut out, task.agent.as_str());
    put_part(&mut out, task.task.as_str());
    put_part(&mut out, id);
    out
}

/// The keys of the configurations that belong to one task (its scoped one and the prefix
/// of its named ones).
pub(crate) fn task_push_keys(task: &TaskKey) -> (Vec<u8>, Vec<u8>) {
    let scoped = scoped_key(&PushScope {
        principal: task.principal.clone(),
        agent: task.agent.clone(),
        task: Some(task.task.clone()),
    });
    let mut named = vec![b'N'];
    put_part(&mut named, task.principal.as_str());
    put_part(&mut named, task.agent.as_str());
    put_part(&mut named, task.task.as_str());
    (scoped, named)
}

/// The key of a conversation turn.
pub(crate) fn turn_key(principal: &Principal, context: &ContextId, turn: TurnId) -> Vec<u8> {
    let mut out = context_prefix(principal, context, turn.since);
    out.extend_from_slice(&turn.number.to_be_bytes());
    out
}

/// The prefix of a conversation's turns: when it began first (as for tasks, so that new
/// conversations append at the end of the table), then the owner and the conversation.
pub(crate) fn context_prefix(principal: &Principal, context: &ContextId, since: i64) -> Vec<u8> {
    let mut out = Vec::with_capacity(72);
    out.extend_from_slice(&((since as u64) ^ (1 << 63)).to_be_bytes());
    put_part(&mut out, principal.as_str());
    put_part(&mut out, context.as_str());
    out
}

/// Parses a turn key.
pub(crate) fn parse_turn_key(bytes: &[u8]) -> Option<(Principal, ContextId, TurnId)> {
    let mut r = KeyReader(bytes);
    let since = (r.u64()? ^ (1 << 63)) as i64;
    let principal = Principal::new(r.part()?);
    let context = ContextId::new(r.part()?);
    let number = r.u32()?;
    r.done()
        .then_some((principal, context, TurnId { number, since }))
}

/// Whether `key` is an event's key: a task's key and a number (read in place: an open
/// checks millions).
pub(super) fn is_event_key(key: &[u8]) -> bool {
    key.split_last_chunk::<8>()
        .is_some_and(|(task, _)| task_key_parts(task).is_some())
}

/// The first key after every key that starts with `prefix` (the end of a prefix range).
pub(crate) fn prefix_end(prefix: &[u8]) -> Vec<u8> {
    let mut end = prefix.to_vec();
    end.push(0xff);
    end
}
