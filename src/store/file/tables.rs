//! The tables of the embedded store, as both of its files hold them (redb's B-trees, or the
//! log's keys over framed records): what a batch of [`Write`]s does to them, and how a task
//! is deleted. One description of the rows, so the two files cannot drift apart.

use std::collections::HashSet;

use super::super::codec;
use super::super::index::{Evicted, Indexes};
use super::super::{Delivery, StatsOnce, Write};
use crate::model::{ContextId, Principal, TaskKey};

/// A table of the store.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub(crate) enum Table {
    /// A record per task, keyed by creation time then the task's key.
    Tasks,
    /// A task's events: the task's key, then the event's number.
    Events,
    /// Pending webhook deliveries: the task's key, the event, the configuration.
    Outbox,
    /// Push configurations with their bookkeeping.
    Push,
    /// Conversation turns: owner, conversation (with when it began), turn — those that no
    /// task's record carries — and, as turn 0, the tombstones of forgotten conversations.
    Turns,
}

impl Table {
    /// Every table, in the order of their codes.
    pub(crate) const ALL: [Table; 5] = [
        Table::Tasks,
        Table::Events,
        Table::Outbox,
        Table::Push,
        Table::Turns,
    ];

    /// The table's name (redb's table, the set-aside file's `table`).
    pub(crate) fn name(self) -> &'static str {
        match self {
            Table::Tasks => "tasks",
            Table::Events => "events",
            Table::Outbox => "outbox",
            Table::Push => "push",
            Table::Turns => "turns",
        }
    }

    /// Its code in the log.
    pub(crate) fn code(self) -> u8 {
        self as u8
    }

    /// The table of a code.
    pub(crate) fn from_code(code: u8) -> Option<Self> {
        Self::ALL.get(usize::from(code)).copied()
    }

    /// The table of a name.
    pub(crate) fn named(name: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|t| t.name() == name)
    }
}

/// What went wrong reading or writing a store file.
#[derive(Debug)]
pub(crate) enum DiskError {
    /// Part of the file cannot be read as what it should be.
    Damaged(String),
    /// Secrets in the file are sealed with a key that is not configured.
    Key(String),
    /// The operating system refused (a full disk, an I/O error).
    Io(String),
}

impl std::fmt::Display for DiskError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            DiskError::Damaged(why) | DiskError::Key(why) | DiskError::Io(why) => f.write_str(why),
        }
    }
}

impl From<std::io::Error> for DiskError {
    fn from(e: std::io::Error) -> Self {
        DiskError::Io(e.to_string())
    }
}

/// The writes of one batch, applied in order.
pub(crate) trait TableWrite {
    /// Sets a row.
    fn put(&mut self, table: Table, key: &[u8], value: &[u8]) -> Result<(), DiskError>;
    /// Sets a row whose value `encode` appends to the buffer it is given (empty here; the
    /// log's frame, where the value goes without a copy of its own).
    fn put_with(
        &mut self,
        table: Table,
        key: &[u8],
        encode: &mut dyn FnMut(&mut Vec<u8>),
    ) -> Result<(), DiskError> {
        let mut value = Vec::with_capacity(256);
        encode(&mut value);
        self.put(table, key, &value)
    }
    /// Removes a row, if it is there.
    fn remove(&mut self, table: Table, key: &[u8]) -> Result<(), DiskError>;
    /// Removes the rows with keys in `start..end`.
    fn remove_range(&mut self, table: Table, start: &[u8], end: &[u8]) -> Result<(), DiskError>;
    /// The row is there (with this batch's writes so far).
    fn contains(&mut self, table: Table, key: &[u8]) -> Result<bool, DiskError>;
}

/// Reading rows.
pub(crate) trait TableRead {
    /// Calls `f` with each row whose key is in `start..end` (`end: None`: to the end), in
    /// key order, while it answers true.
    fn scan(
        &self,
        table: Table,
        start: &[u8],
        end: Option<&[u8]>,
        f: &mut dyn FnMut(&[u8], &[u8]) -> bool,
    ) -> Result<(), DiskError>;

    /// One row's value.
    fn get(&self, table: Table, key: &[u8]) -> Result<Option<Vec<u8>>, DiskError>;

    /// The events' rows were checked as they were read (the log checks each as it replays
    /// its segments), so loading need not read them again.
    fn events_checked(&self) -> bool {
        false
    }

    /// About how many task records there are, to size what a load fills (0: not known).
    fn tasks_hint(&self) -> usize {
        0
    }

    /// Every row of a table, in key order.
    fn each(&self, table: Table, f: &mut dyn FnMut(&[u8], &[u8]) -> bool) -> Result<(), DiskError> {
        self.scan(table, &[], None, f)
    }
}

/// What applying a batch decided.
#[derive(Default)]
pub(crate) struct Applied {
    /// The planned deliveries, each with the index of the write that planned it.
    pub(crate) planned: Vec<(usize, Delivery)>,
    /// Per write: it is its task's last in the batch (the record it leaves is the task's),
    /// or its configuration's last bookkeeping ([`StatsOnce`]).
    pub(crate) last: Vec<bool>,
    /// Per write: it is a task's last, and its record carries the conversation turn the
    /// next write records ([`Write::carries_turn`]; the turn has no row of its own).
    pub(crate) carries: Vec<bool>,
    /// The keys of the tombstones written (conversations forgotten), to drop in time.
    pub(crate) tombstones: Vec<Vec<u8>>,
}

/// Applies one batch to the tables. A task's record is written once per batch (its last),
/// and so is a push configuration's bookkeeping. A task's conversation turn that comes
/// with its end is carried by its record ([`Write::carries_turn`]) instead of a row.
/// Forgetting a conversation removes its turns' rows and writes its tombstone, which
/// tells the eviction of a task that carries one of its turns not to write that turn —
/// if such a task may be left: `carried` says whether a record carrying a turn of the
/// conversation (owner, id, start) may still be in the file from earlier batches, and
/// this batch's own records are looked at here. With none, the eviction that wrote its
/// turn as a row has come and gone, and the removal of the turns' rows took that too.
pub(crate) fn apply(
    writes: &[Write],
    indexes: &Indexes,
    carried: &dyn Fn(&Principal, &ContextId, i64) -> bool,
    t: &mut (impl TableWrite + ?Sized),
) -> Result<Applied, DiskError> {
    let mut planned = Vec::new();
    // Whether each write is its task's last in the batch (earlier records are superseded):
    // the first seen walking back.
    let mut seen: HashSet<&TaskKey, foldhash::fast::RandomState> =
        HashSet::with_capacity_and_hasher(writes.len(), Default::default());
    let mut stats = StatsOnce::default();
    let mut last = vec![false; writes.len()];
    // The key of the task write after this one: an append's writes are one task's, so
    // most keys are this one's, equal without hashing (ids compare by pointer first).
    let mut after: Option<&TaskKey> = None;
    for (i, write) in writes.iter().enumerate().rev() {
        last[i] = match write {
            Write::Task { key, .. } if after == Some(key) => false,
            Write::Task { key, .. } => {
                after = Some(key);
                seen.insert(key)
            }
            w => !stats.superseded(w),
        };
    }
    // A task's row key, made once for its consecutive writes (an echo task's three); the
    // event's key is the row key and its number.
    let mut rows: Option<(&TaskKey, Vec<u8>)> = None;
    let mut event_row = Vec::with_capacity(128);
    let mut tombstones = Vec::new();
    let carries: Vec<bool> = (0..writes.len())
        .map(|i| last[i] && Write::carries_turn(writes, i))
        .collect();
    // The conversations this batch's records carry turns of, once a conversation is
    // forgotten in it.
    let mut carried_here = None;
    for (i, write) in writes.iter().enumerate() {
        match write {
            Write::Task {
                key,
                task,
                event,
                changed,
                turn,
            } => {
                let created = codec::created(task);
                let row = match &mut rows {
                    Some((k, row)) if *k == key => row,
                    other => &mut other.insert((key, codec::task_key(key, created))).1,
                };
                event_row.clear();
                event_row.extend_from_slice(row);
                event_row.extend_from_slice(&event.seq.to_be_bytes());
                t.put_with(Table::Events, &event_row, &mut |buf| {
                    codec::encode_event_into(buf, event);
                })?;
                for d in indexes.plan(key, task, event, *changed) {
                    t.put(
                        Table::Outbox,
                        &codec::outbox_key(&d.key),
                        &codec::encode_outbox(1, None),
                    )?;
                    planned.push((i, d));
                }
                if last[i] {
                    t.put_with(Table::Tasks, row, &mut |buf| {
                        codec::encode_record_into(buf, task, *turn, carries[i]);
                    })?;
                }
            }
            // The record before it carries it.
            Write::Turn { .. } if i > 0 && carries[i - 1] => {}
            Write::Turn {
                principal,
                context,
                turn,
                user,
                reply,
            } => t.put(
                Table::Turns,
                &codec::turn_key(principal, context, *turn),
                &codec::encode_turn(user, reply.as_deref()),
            )?,
            Write::ForgetContext {
                principal,
                context,
                since,
            } => {
                let prefix = codec::context_prefix(principal, context, *since);
                t.remove_range(Table::Turns, &prefix, &codec::prefix_end(&prefix))?;
                let here = carried_here.get_or_insert_with(|| carried_in(writes, &carries));
                if !carried(principal, context, *since)
                    && !here.contains(&(principal, context, *since))
                {
                    continue;
                }
                let tombstone = codec::tombstone_key(principal, context, *since);
                let at = chrono::Utc::now().timestamp_micros();
                t.put(Table::Turns, &tombstone, &codec::encode_tombstone(at))?;
                tombstones.push(tombstone);
            }
            Write::PushStats(_) if !last[i] => {}
            Write::PushSet(c) | Write::PushStats(c) => {
                let body = codec::encode_push(c, &indexes.sealer);
                t.put(Table::Push, &codec::push_key(c), &body)?;
            }
            Write::PushRemove(scope) => t.remove(Table::Push, &codec::scoped_key(scope))?,
            Write::PushRemoveNamed { task, id } => {
                t.remove(Table::Push, &codec::named_key(task, id))?;
            }
            // An evicted task's entries went with it: its delivery's removal finds nothing,
            // and its retry is not written (the key holds the task's creation time, so a
            // later task of the same id is another key).
            Write::OutboxDone(key) => t.remove(Table::Outbox, &codec::outbox_key(key))?,
            Write::OutboxRetry { key, attempt, due } => {
                let k = codec::outbox_key(key);
                if t.contains(Table::Outbox, &k)? {
                    t.put(
                        Table::Outbox,
                        &k,
                        &codec::encode_outbox(*attempt, Some(*due)),
                    )?;
                }
            }
        }
    }
    Ok(Applied {
        planned,
        last,
        carries,
        tombstones,
    })
}

/// The conversations (owner, id, start) whose turns the records of `writes` carry.
fn carried_in<'a>(
    writes: &'a [Write],
    carries: &[bool],
) -> HashSet<(&'a Principal, &'a ContextId, i64), foldhash::fast::RandomState> {
    writes
        .iter()
        .zip(carries)
        .filter_map(|(w, carries)| match w {
            Write::Task {
                key, task, turn, ..
            } if *carries => Some((&key.principal, &task.context_id, turn.since)),
            _ => None,
        })
        .collect()
}

/// Deletes evicted tasks: the turn each record carries becomes a row of its own, unless
/// its conversation was forgotten (its tombstone is there); then each task's rows go
/// ([`delete_task`]). The tombstones are looked at before anything is deleted, so that
/// the log's look-up of this batch's own operations meets no ranges (it would scan them
/// all for each look-up).
pub(crate) fn forget(
    t: &mut (impl TableWrite + ?Sized),
    evicted: &[Evicted],
) -> Result<(), DiskError> {
    let mut turns = Vec::new();
    for e in evicted {
        let Some(c) = &e.turn else {
            continue;
        };
        let tombstone = codec::tombstone_key(&e.key.principal, &c.context, c.turn.since);
        if !t.contains(Table::Turns, &tombstone)? {
            turns.push((
                codec::turn_key(&e.key.principal, &c.context, c.turn),
                codec::encode_turn(&c.user, c.reply.as_deref()),
            ));
        }
    }
    for (key, value) in turns {
        t.put(Table::Turns, &key, &value)?;
    }
    for e in evicted {
        delete_task(t, &e.key, e.created)?;
    }
    Ok(())
}

/// Deletes a task's record, events, outbox entries and push configurations.
pub(crate) fn delete_task(
    t: &mut (impl TableWrite + ?Sized),
    key: &TaskKey,
    created: codec::Created,
) -> Result<(), DiskError> {
    let prefix = codec::task_key(key, created);
    let end = codec::prefix_end(&prefix);
    t.remove(Table::Tasks, &prefix)?;
    t.remove_range(Table::Events, &prefix, &end)?;
    t.remove_range(Table::Outbox, &prefix, &end)?;
    let (scoped, named) = codec::task_push_keys(key);
    t.remove(Table::Push, &scoped)?;
    t.remove_range(Table::Push, &named, &codec::prefix_end(&named))?;
    Ok(())
}
