//! Reading the file at start: every unfinished task, its events, conversations, push
//! configurations and pending deliveries, with damaged records set aside or refused.

use std::collections::HashMap;
use std::path::Path;
use std::sync::Arc;

use redb::{Database, ReadableDatabase, ReadableTable, TableHandle, WriteTransaction};

use super::{EVENTS, OUTBOX, PUSH, TASKS, TURNS, open_error};
use crate::config::Config;
use crate::error::{Error, Result};
use crate::model::{ContextId, Message, Principal, TaskEvent, TaskKey, TaskSnapshot};
use crate::store::codec::{self, Created};
use crate::store::damage::{self, Damaged};
use crate::store::index::{Evicted, Indexes};
use crate::store::{Delivery, Recovered, RecoveredContext, RecoveredTask, delivery_id};

pub(super) fn read_events(
    read: &redb::ReadTransaction,
    key: &TaskKey,
    created: Created,
    after: u64,
    history: &[Arc<Message>],
) -> std::result::Result<Vec<TaskEvent>, redb::Error> {
    let events = read.open_table(EVENTS)?;
    let from = codec::event_key(key, created, after.saturating_add(1));
    let end = codec::prefix_end(&codec::task_key(key, created));
    let mut out = Vec::new();
    for entry in events.range(from.as_slice()..end.as_slice())? {
        let (k, v) = entry?;
        let seq = k
            .value()
            .split_last_chunk::<8>()
            .map(|(_, n)| u64::from_be_bytes(*n))
            .unwrap_or(0);
        match codec::decode_event(seq, v.value(), history) {
            Some(e) => out.push(e),
            // Checked at open; a row damaged since is logged, not replayed as something else.
            None => tracing::error!(task = %key.task, seq, "a stored event could not be decoded"),
        }
    }
    Ok(out)
}

/// What [`load`] read: the work a restart resumes, and what the file should lose.
pub(super) struct Loaded {
    pub(super) recovered: Recovered,
    /// Tasks past their retention (or over the caps): deleted once the file is writable.
    pub(super) expired: Vec<Evicted>,
    /// Outbox entries whose task, configuration or event is gone.
    pub(super) stale: Vec<(crate::store::OutboxKey, Created)>,
    /// Rows that cannot be read.
    pub(super) damaged: Vec<Damaged>,
}

impl Loaded {
    /// Deletes the expired tasks and stale outbox entries.
    pub(super) fn tidy(&self, db: &Database) -> std::result::Result<(), redb::Error> {
        if self.expired.is_empty() && self.stale.is_empty() {
            return Ok(());
        }
        let w = db.begin_write()?;
        for (key, created) in &self.expired {
            delete_task(&w, key, *created)?;
        }
        {
            let mut outbox = w.open_table(OUTBOX)?;
            for (key, created) in &self.stale {
                outbox.remove(codec::outbox_key(key, *created).as_slice())?;
            }
        }
        w.commit()?;
        Ok(())
    }
}

/// The refusal of a file part of which cannot be read.
pub(super) fn damaged(path: &Path, why: &dyn std::fmt::Display) -> Error {
    open_error(
        path,
        format!(
            "is damaged: part of it cannot be read ({why}); restore it from a backup, or move it aside to start with an empty store"
        ),
    )
}

/// Runs `load`, saying what a storage error means.
pub(super) fn guarded_load(
    path: &Path,
    load: impl FnOnce() -> std::result::Result<Loaded, redb::Error>,
) -> Result<Loaded> {
    match load() {
        Ok(loaded) => Ok(loaded),
        Err(redb::Error::Corrupted(why)) => Err(damaged(path, &why)),
        Err(e) => Err(open_error(path, format!("could not be read: {e}"))),
    }
}

/// Damaged records refuse the start unless the operator said to set them aside.
pub(super) fn refuse_damage(path: &Path, damaged: &[Damaged], set_aside: bool) -> Result<()> {
    if damaged.is_empty() || set_aside {
        return Ok(());
    }
    Err(open_error(
        path,
        format!(
            "has {} damaged record(s) ({}) that cannot be read; restore the file from a backup, or start once with --set-aside-damaged to copy them to a file beside the store and serve the rest",
            damaged.len(),
            damage::summary(damaged)
        ),
    ))
}

/// Reads the file: push configurations and finished tasks into the indexes, unfinished
/// tasks, conversations and the outbox into [`Recovered`]; every row is checked, and
/// those that cannot be read are listed, never skipped silently. Writes nothing.
pub(super) fn load(
    db: &impl ReadableDatabase,
    indexes: &Indexes,
    config: &Config,
) -> std::result::Result<Loaded, redb::Error> {
    let read = db.begin_read()?;
    let mut damaged = Vec::new();
    let mut bad = |table: &str, k: &[u8], v: &[u8]| {
        damaged.push(Damaged::new(table, k, v));
    };
    for entry in read.open_table(PUSH)?.iter()? {
        let (k, v) = entry?;
        match codec::decode_push(v.value()) {
            Some(c) => {
                let _ = indexes.push.set(c, usize::MAX);
            }
            None => bad(PUSH.name(), k.value(), v.value()),
        }
    }
    for entry in read.open_table(EVENTS)?.iter()? {
        let (k, v) = entry?;
        if !codec::event_row_is_valid(k.value(), v.value()) {
            bad(EVENTS.name(), k.value(), v.value());
        }
    }
    let retention = config.server.task_retention();
    let now = chrono::Utc::now();
    let mut finished: Vec<(TaskKey, Arc<TaskSnapshot>)> = Vec::new();
    let mut expired: Vec<Evicted> = Vec::new();
    let mut live: Vec<RecoveredTask> = Vec::new();
    for entry in read.open_table(TASKS)?.iter()? {
        let (k, v) = entry?;
        let decoded = codec::parse_task_key(k.value())
            .and_then(|(created, key)| Some((created, codec::decode_task(&key, v.value())?, key)));
        let Some((created, (task, turn), key)) = decoded else {
            bad(TASKS.name(), k.value(), v.value());
            continue;
        };
        let task = Arc::new(task);
        if task.status.state.is_terminal() {
            let age = (now - task.updated_at).to_std().unwrap_or_default();
            if age >= retention {
                expired.push((key, created));
            } else {
                finished.push((key, task));
            }
        } else {
            let events = read_events(&read, &key, created, 0, &task.history)?
                .into_iter()
                .map(Arc::new)
                .collect();
            live.push(RecoveredTask {
                key,
                task,
                events,
                turn,
                why: crate::store::Orphan::Restart,
            });
        }
    }
    // Oldest first, so eviction order stays finish order.
    finished.sort_by_key(|(_, t)| t.updated_at);
    let mut evicted = Vec::new();
    for (key, task) in finished {
        let age = (now - task.updated_at).to_std().unwrap_or_default();
        evicted.extend(indexes.tasks.put_restored(&key, task, age));
    }
    for (key, _) in &evicted {
        indexes.push.remove_task(key);
    }
    expired.extend(evicted);
    for t in &live {
        indexes.tasks.put(&t.key, t.task.clone());
    }
    live.sort_by_key(|t| t.task.created_at);

    let mut contexts: HashMap<(Principal, ContextId), RecoveredContext> = HashMap::new();
    for entry in read.open_table(TURNS)?.iter()? {
        let (k, v) = entry?;
        let (Some((principal, context, turn)), Some((user, reply))) = (
            codec::parse_turn_key(k.value()),
            codec::decode_turn(v.value()),
        ) else {
            bad(TURNS.name(), k.value(), v.value());
            continue;
        };
        contexts
            .entry((principal.clone(), context.clone()))
            .or_insert_with(|| RecoveredContext {
                principal,
                context,
                since: turn.since,
                turns: Vec::new(),
            })
            .turns
            .push((turn.number, user, reply));
    }

    let mut deliveries = Vec::new();
    let mut stale = Vec::new();
    let events = read.open_table(EVENTS)?;
    for entry in read.open_table(OUTBOX)?.iter()? {
        let (k, v) = entry?;
        let (Some((created, key)), Some((attempt, due))) = (
            codec::parse_outbox_key(k.value()),
            codec::decode_outbox(v.value()),
        ) else {
            bad(OUTBOX.name(), k.value(), v.value());
            continue;
        };
        let task = indexes.tasks.get(&key.task);
        let config = indexes
            .push
            .for_task(&key.task)
            .into_iter()
            .find(|c| c.id == key.config);
        let event = match &task {
            Some(t) => events
                .get(codec::event_key(&key.task, created, key.seq).as_slice())?
                .and_then(|e| codec::decode_event(key.seq, e.value(), &t.history)),
            None => None,
        };
        match (task, config, event) {
            (Some(task), Some(config), Some(event)) => deliveries.push(Delivery {
                id: delivery_id(&key),
                key,
                config,
                event: Arc::new(event),
                task,
                attempt,
                due,
            }),
            _ => stale.push((key, created)),
        }
    }
    Ok(Loaded {
        recovered: Recovered {
            tasks: live,
            contexts: contexts.into_values().collect(),
            deliveries,
        },
        expired,
        stale,
        damaged,
    })
}

/// Deletes a task's record, events, outbox entries and push configurations.
pub(super) fn delete_task(
    w: &WriteTransaction,
    key: &TaskKey,
    created: Created,
) -> std::result::Result<(), redb::Error> {
    let prefix = codec::task_key(key, created);
    let end = codec::prefix_end(&prefix);
    w.open_table(TASKS)?.remove(prefix.as_slice())?;
    w.open_table(EVENTS)?
        .retain_in(prefix.as_slice()..end.as_slice(), |_, _| false)?;
    w.open_table(OUTBOX)?
        .retain_in(prefix.as_slice()..end.as_slice(), |_, _| false)?;
    let (scoped, named) = codec::task_push_keys(key);
    let named_end = codec::prefix_end(&named);
    let mut push = w.open_table(PUSH)?;
    push.remove(scoped.as_slice())?;
    push.retain_in(named.as_slice()..named_end.as_slice(), |_, _| false)?;
    Ok(())
}
