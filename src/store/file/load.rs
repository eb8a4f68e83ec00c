//! Reading the file at start: every unfinished task, its events, conversations, push
//! configurations and pending deliveries, with damaged records set aside or refused.

use std::collections::HashSet;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use hashbrown::HashTable;

use super::carriers::{Carriers, Conversations, Counts};
use super::committer::Tombstones;
use super::open_error;
use super::tables::{self, DiskError, Table, TableRead, TableWrite};
use crate::config::Config;
use crate::error::Error;
use crate::model::{
    AgentId, ContextId, Message, Principal, TaskEvent, TaskId, TaskKey, TaskSnapshot,
};
use crate::store::codec::{self, Created};
use crate::store::damage::{self, Damaged};
use crate::store::index::{Evicted, Indexes, RestoreClock, RestoredRecord, Restoring, TaskIndex};
use crate::store::{
    CarriedTurn, Delivery, Recovered, RecoveredContext, RecoveredTask, TurnId, TurnMessages,
    delivery_id,
};

pub(super) fn read_events(
    read: &impl TableRead,
    key: &TaskKey,
    created: Created,
    after: u64,
    history: &[Arc<Message>],
) -> Result<Vec<TaskEvent>, DiskError> {
    let from = codec::event_key(key, created, after.saturating_add(1));
    let end = codec::prefix_end(&codec::task_key(key, created));
    let mut out = Vec::new();
    read.scan(Table::Events, &from, Some(&end), &mut |k, v| {
        let seq = k
            .split_last_chunk::<8>()
            .map(|(_, n)| u64::from_be_bytes(*n))
            .unwrap_or(0);
        match codec::decode_event(seq, v, history) {
            Some(e) => out.push(e),
            // Checked at open; a row damaged since is logged, not replayed as something else.
            None => tracing::error!(task = %key.task, seq, "a stored event could not be decoded"),
        }
        true
    })?;
    Ok(out)
}

/// What [`load`] read: the work a restart resumes, and what the file should lose.
pub(super) struct Loaded {
    pub(super) recovered: Recovered,
    /// Tasks past their retention (or over the caps): deleted once the file is writable.
    pub(super) expired: Vec<Evicted>,
    /// Outbox entries whose task, configuration or event is gone.
    pub(super) stale: Vec<crate::store::OutboxKey>,
    /// Rows that cannot be read.
    pub(super) damaged: Vec<Damaged>,
    /// Tombstones of forgotten conversations still wanted: key, and how long ago each was
    /// written (the committer drops them in time).
    pub(super) tombstones: Vec<(Vec<u8>, Duration)>,
    /// Tombstones past their time: deleted once the file is writable.
    dead_tombstones: Vec<Vec<u8>>,
    /// The records left in the file that carry a turn, by conversation.
    pub(super) carriers: Carriers,
}

/// A conversation turn a task's record carries, and its owner.
struct Carried {
    principal: Principal,
    turn: CarriedTurn,
    /// Its conversation's hash ([`Conversations::hash`]), made where the record was read.
    hash: u64,
}

impl Carried {
    /// A turn carried by a record of `principal`'s, hashed as `conversations` hashes.
    fn new(principal: Principal, turn: CarriedTurn, conversations: &Conversations) -> Self {
        Self {
            hash: conversations.hash(&principal, &turn.context, turn.turn.since),
            principal,
            turn,
        }
    }
}

/// The conversations: their turns' rows and the turns records carry; the rows that cannot
/// be read; the tombstones still wanted (how long ago each was written) and those past
/// their time.
struct Turns {
    contexts: Vec<RecoveredContext>,
    damaged: Vec<Damaged>,
    tombstones: Vec<(Vec<u8>, Duration)>,
    dead_tombstones: Vec<Vec<u8>>,
    /// Every record read that carries a turn, by conversation ([`Carriers`]).
    carried: Counts,
}

struct Tombstone {
    key: Vec<u8>,
    principal: Principal,
    context: ContextId,
    since: i64,
    /// When it was written, µs since the epoch.
    at: i64,
}

impl Loaded {
    /// Deletes the expired tasks (writing the turns their records carry), stale outbox
    /// entries and tombstones past their time.
    pub(super) fn tidy(&self, t: &mut (impl TableWrite + ?Sized)) -> Result<(), DiskError> {
        tables::forget(t, &self.expired)?;
        for key in &self.stale {
            t.remove(Table::Outbox, &codec::outbox_key(key))?;
        }
        for key in &self.dead_tombstones {
            t.remove(Table::Turns, key)?;
        }
        Ok(())
    }

    /// Takes the conversations `hasher` hashed; the records carrying turns that stay are
    /// those read less those [`Loaded::tidy`] deletes.
    fn add_turns(&mut self, turns: Turns, hasher: Conversations) {
        self.recovered.contexts = turns.contexts;
        self.damaged.extend(turns.damaged);
        self.tombstones = turns.tombstones;
        self.dead_tombstones = turns.dead_tombstones;
        self.carriers = Carriers::new(hasher, turns.carried);
        self.carriers.deleted(&self.expired);
    }

    /// Nothing to tidy.
    pub(super) fn tidy_nothing(&self) -> bool {
        self.expired.is_empty() && self.stale.is_empty() && self.dead_tombstones.is_empty()
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
    load: impl FnOnce() -> Result<Loaded, DiskError>,
) -> crate::error::Result<Loaded> {
    match load() {
        Ok(loaded) => Ok(loaded),
        Err(DiskError::Damaged(why)) => Err(damaged(path, &why)),
        Err(DiskError::Key(why)) => Err(open_error(path, why)),
        Err(DiskError::Io(e)) => Err(open_error(path, format!("could not be read: {e}"))),
    }
}

/// Damaged records refuse the start unless the operator said to set them aside.
pub(super) fn refuse_damage(
    path: &Path,
    damaged: &[Damaged],
    set_aside: bool,
) -> crate::error::Result<()> {
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
    read: &impl TableRead,
    indexes: &Indexes,
    config: &Config,
) -> Result<Loaded, DiskError> {
    let mut carried = Vec::new();
    let hasher = Conversations::default();
    let mut loaded = load_tasks(read, indexes, config, &hasher, &mut |c| carried.push(c))?;
    let turns = load_turns(read, [carried], &hasher, config.server.task_retention())?;
    loaded.add_turns(turns, hasher);
    Ok(loaded)
}

/// [`load`], reading the conversations with `turns` on a thread of their own beside
/// the rest (they are independent of it; a million of them take a second).
pub(super) fn load_beside<T: TableRead + Send>(
    read: &impl TableRead,
    turns: T,
    indexes: &Indexes,
    config: &Config,
) -> Result<Loaded, DiskError> {
    let retention = config.server.task_retention();
    let hasher = Conversations::default();
    std::thread::scope(|s| {
        // The turns records carry go to the conversations' thread in chunks as the
        // records are read, and are put together there, beside the rest of the load.
        let (tx, rx) = std::sync::mpsc::sync_channel::<Vec<Carried>>(16);
        let shared = &hasher;
        let thread = std::thread::Builder::new()
            .name("a2ad-load".into())
            .spawn_scoped(s, move || load_turns(&turns, rx, shared, retention));
        let (loaded, turns) = match thread {
            Ok(thread) => {
                const CHUNK: usize = 4096;
                let loaded = {
                    let mut chunk = Vec::with_capacity(CHUNK);
                    let loaded = load_tasks(read, indexes, config, &hasher, &mut |c| {
                        chunk.push(c);
                        if chunk.len() == CHUNK {
                            // A thread that failed has stopped listening: its error tells.
                            let _ =
                                tx.send(std::mem::replace(&mut chunk, Vec::with_capacity(CHUNK)));
                        }
                    });
                    let _ = tx.send(chunk);
                    drop(tx);
                    loaded
                };
                let turns = thread
                    .join()
                    .unwrap_or_else(|panic| std::panic::resume_unwind(panic));
                (loaded, turns)
            }
            // No thread to be had: one after the other.
            Err(_) => {
                let mut carried = Vec::new();
                let loaded = load_tasks(read, indexes, config, &hasher, &mut |c| carried.push(c));
                (loaded, load_turns(read, [carried], &hasher, retention))
            }
        };
        let mut loaded = loaded?;
        loaded.add_turns(turns?, hasher.clone());
        Ok(loaded)
    })
}

/// The conversations, from their turns' rows and the turns records carry (`carried`, in
/// chunks as the records are read); the rows that cannot be read; the tombstones.
fn load_turns(
    read: &impl TableRead,
    carried: impl IntoIterator<Item = Vec<Carried>>,
    hasher: &Conversations,
    retention: Duration,
) -> Result<Turns, DiskError> {
    let mut damaged = Vec::new();
    let mut tombstones = Vec::new();
    // Turns come in key order: a conversation's turns one after the other.
    let mut contexts: Vec<RecoveredContext> = Vec::new();
    let mut names = Names::default();
    read.each(Table::Turns, &mut |k, v| {
        let parsed = codec::parse_turn_key(k);
        if let Some((principal, context, TurnId { number: 0, since })) = parsed {
            match codec::decode_tombstone(v) {
                Some(at) => tombstones.push(Tombstone {
                    key: k.to_vec(),
                    principal: names.principal(principal.as_str()),
                    context,
                    since,
                    at,
                }),
                None => damaged.push(Damaged::new(Table::Turns.name(), k, v)),
            }
            return true;
        }
        // Checked here; kept as written, decoded when the conversation goes on.
        let (Some((principal, context, turn)), Some(_)) = (parsed, codec::decode_turn(v)) else {
            damaged.push(Damaged::new(Table::Turns.name(), k, v));
            return true;
        };
        match contexts.last_mut() {
            Some(c) if c.principal == principal && c.context == context => {}
            _ => contexts.push(RecoveredContext {
                principal: names.principal(principal.as_str()),
                context,
                since: turn.since,
                turns: Vec::new(),
            }),
        }
        if let Some(c) = contexts.last_mut() {
            c.turns.push((turn.number, TurnMessages::Stored(v.into())));
        }
        true
    })?;
    let expected = read.tasks_hint();
    let turns = merge(
        contexts, damaged, tombstones, carried, hasher, expected, retention,
    );
    tracing::debug!(
        contexts = turns.contexts.len(),
        "conversations put together"
    );
    Ok(turns)
}

/// Puts the conversations together: their rows' turns and the turns records carry (in
/// chunks, as the records are read: each chunk is put in as it comes; about `expected` of
/// them), but none of a forgotten conversation (its tombstone is there). Conversations
/// with rows come first, in key order, then the others in the order their first turn was
/// met.
fn merge(
    mut contexts: Vec<RecoveredContext>,
    damaged: Vec<Damaged>,
    tombstones: Vec<Tombstone>,
    carried: impl IntoIterator<Item = Vec<Carried>>,
    hasher: &Conversations,
    expected: usize,
    retention: Duration,
) -> Turns {
    let life = Tombstones::life(retention);
    let now = chrono::Utc::now().timestamp_micros();
    let mut forgotten = HashSet::with_capacity(tombstones.len());
    let (mut wanted, mut dead) = (Vec::new(), Vec::new());
    for t in tombstones {
        let age = Duration::from_micros(now.saturating_sub(t.at).max(0) as u64);
        forgotten.insert((t.principal, t.context, t.since));
        if age >= life {
            dead.push(t.key);
        } else {
            wanted.push((t.key, age));
        }
    }
    // Oldest first, as the committer drops them.
    wanted.sort_by_key(|(_, age)| std::cmp::Reverse(*age));
    // The conversations by their place in `contexts`, hashed as `hashes` says: a carried
    // turn's hash was made on the thread that read it, so finding its conversation reads
    // no bytes of its key unless a conversation's hash matches.
    // Sized for a conversation per record: nothing grows as they come.
    let room = contexts.len() + expected;
    contexts.reserve(expected);
    let mut hashes: Vec<u64> = Vec::with_capacity(room);
    hashes.extend(
        contexts
            .iter()
            .map(|c| hasher.hash(&c.principal, &c.context, c.since)),
    );
    let mut at: HashTable<usize> = HashTable::with_capacity(room);
    for (i, &hash) in hashes.iter().enumerate() {
        at.insert_unique(hash, i, |&j| hashes[j]);
    }
    let rows = contexts.len();
    let mut counts = Counts::default();
    // A conversation's turns mostly come one after the other: those take no lookup.
    let mut current: Option<usize> = None;
    for Carried {
        principal,
        turn: c,
        hash,
    } in carried.into_iter().flatten()
    {
        *counts.entry(hash).or_default() += 1;
        let turn = (c.turn.number, TurnMessages::Shared(c.user, c.reply));
        let is = |k: &RecoveredContext| {
            k.since == c.turn.since && k.principal == principal && k.context == c.context
        };
        let i = match current.filter(|&i| is(&contexts[i])) {
            Some(i) => i,
            None => {
                if !forgotten.is_empty()
                    && forgotten.contains(&(principal.clone(), c.context.clone(), c.turn.since))
                {
                    continue;
                }
                let i = match at.find(hash, |&i| is(&contexts[i])) {
                    Some(&i) => i,
                    None => {
                        contexts.push(RecoveredContext {
                            principal,
                            context: c.context,
                            since: c.turn.since,
                            turns: Vec::new(),
                        });
                        hashes.push(hash);
                        let i = contexts.len() - 1;
                        at.insert_unique(hash, i, |&j| hashes[j]);
                        i
                    }
                };
                current = Some(i);
                i
            }
        };
        contexts[i].turns.push(turn);
    }
    drop((at, hashes));
    // Fewer conversations than records (several turns each) leave room unused.
    if contexts.capacity() / 2 > contexts.len() {
        contexts.shrink_to_fit();
    }
    // Each conversation's turns in order, each once (a row's before a record's).
    for (i, c) in contexts.iter_mut().enumerate() {
        if c.turns.len() > 1 && (i < rows || !c.turns.is_sorted_by_key(|(n, _)| *n)) {
            c.turns.sort_by_key(|(n, _)| *n);
            c.turns.dedup_by_key(|(n, _)| *n);
        }
    }
    Turns {
        contexts,
        damaged,
        tombstones: wanted,
        dead_tombstones: dead,
        carried: counts,
    }
}

/// The principals and agents a load meets, each kept once: the running server's keys share
/// a few names, and a million restored tasks holding a million copies of them would take
/// ~100 MB more than the server that ran them (docs/decisions/restored-turns-stay-encoded.md).
#[derive(Default)]
struct Names {
    principals: HashSet<Principal, foldhash::fast::RandomState>,
    agents: HashSet<AgentId, foldhash::fast::RandomState>,
}

impl Names {
    fn principal(&mut self, p: &str) -> Principal {
        Self::one(&mut self.principals, p)
    }

    fn agent(&mut self, a: &str) -> AgentId {
        Self::one(&mut self.agents, a)
    }

    fn one<T>(seen: &mut HashSet<T, foldhash::fast::RandomState>, name: &str) -> T
    where
        T: Clone + Eq + std::hash::Hash + std::borrow::Borrow<str> + for<'a> From<&'a str>,
    {
        match seen.get(name) {
            Some(kept) => kept.clone(),
            None => {
                let name = T::from(name);
                seen.insert(name.clone());
                name
            }
        }
    }
}

/// Where a load hands each retained finished record.
type Restore<'a> = dyn FnMut(RestoredRecord) + 'a;

/// Runs `read`, which hands each retained finished record it reads (about `expected` of
/// them) to the function it is given; the records go into `index` on a thread of its own
/// beside the reading, in chunks as they are read (a million records take about as long
/// to index as to decode). With no thread to be had, they go in here, chunk by chunk.
fn restore_beside<R>(
    index: &TaskIndex,
    expected: usize,
    read: &mut dyn FnMut(&mut Restore<'_>) -> R,
) -> (R, Restoring) {
    const CHUNK: usize = 4096;
    std::thread::scope(|s| {
        let (tx, rx) = std::sync::mpsc::sync_channel::<Vec<RestoredRecord>>(16);
        let thread = std::thread::Builder::new()
            .name("a2ad-index".into())
            .spawn_scoped(s, move || {
                let mut restoring = index.restoring(expected);
                for chunk in rx {
                    index.restore(chunk, &mut restoring);
                }
                restoring
            });
        let Ok(thread) = thread else {
            let mut restoring = index.restoring(expected);
            let mut chunk = Vec::with_capacity(CHUNK);
            let r = read(&mut |record| {
                chunk.push(record);
                if chunk.len() == CHUNK {
                    index.restore(chunk.drain(..), &mut restoring);
                }
            });
            index.restore(chunk, &mut restoring);
            return (r, restoring);
        };
        let reading = std::time::Instant::now();
        let mut chunk = Vec::with_capacity(CHUNK);
        let r = read(&mut |record| {
            chunk.push(record);
            if chunk.len() == CHUNK {
                // The thread only stops when the channel closes (or it panicked, which
                // the join below carries on).
                let _ = tx.send(std::mem::replace(&mut chunk, Vec::with_capacity(CHUNK)));
            }
        });
        let _ = tx.send(chunk);
        drop(tx);
        tracing::debug!(
            elapsed_ms = reading.elapsed().as_millis() as u64,
            "task records read"
        );
        let restoring = thread
            .join()
            .unwrap_or_else(|panic| std::panic::resume_unwind(panic));
        (r, restoring)
    })
}

/// All but the conversations: push configurations, tasks, the outbox.
fn load_tasks(
    read: &impl TableRead,
    indexes: &Indexes,
    config: &Config,
    conversations: &Conversations,
    carry: &mut dyn FnMut(Carried),
) -> Result<Loaded, DiskError> {
    let mut damaged = Vec::new();
    let mut bad = |table: Table, k: &[u8], v: &[u8]| {
        damaged.push(Damaged::new(table.name(), k, v));
    };
    let mut unsealed = None;
    read.each(Table::Push, &mut |k, v| {
        match codec::decode_push_checked(v, &indexes.sealer) {
            Ok(Some(c)) => {
                let _ = indexes.push.set(c, usize::MAX);
            }
            Ok(None) => bad(Table::Push, k, v),
            // Not damage: the key is wrong. Nothing is set aside; the start is refused.
            Err(e) => {
                unsealed = Some(e.to_string());
                return false;
            }
        }
        true
    })?;
    if let Some(why) = unsealed {
        return Err(DiskError::Key(why));
    }
    if !read.events_checked() {
        read.each(Table::Events, &mut |k, v| {
            if !codec::event_row_is_valid(k, v) {
                bad(Table::Events, k, v);
            }
            true
        })?;
    }
    let retention = config.server.task_retention();
    let clock = RestoreClock::now();
    let now = clock.wall();
    let mut expired: Vec<Evicted> = Vec::new();
    let mut unfinished: Vec<(TaskKey, Created, Arc<TaskSnapshot>, TurnId)> = Vec::new();
    let mut names = Names::default();
    let reading = std::time::Instant::now();
    let expected = read.tasks_hint();
    let (read_tasks, restoring) = restore_beside(&indexes.tasks, expected, &mut |restore| {
        read.each(Table::Tasks, &mut |k, v| {
            let decoded = codec::task_key_parts(k).and_then(|(created, principal, agent, task)| {
                let key = TaskKey {
                    principal: names.principal(principal),
                    agent: names.agent(agent),
                    task: TaskId::new(task),
                };
                Some((created, codec::decode_record(&key, v)?, key))
            });
            let Some((created, (task, turn, carries), key)) = decoded else {
                bad(Table::Tasks, k, v);
                return true;
            };
            let task = Arc::new(task);
            if task.status.state.is_terminal() {
                // The turn the record carries: its conversation's, whether the record
                // stays or goes (its eviction writes the turn as a row).
                let carried = carries.then(|| CarriedTurn::of(turn, &task)).flatten();
                let turn = match &carried {
                    Some(c) => c.turn,
                    None => TurnId::default(),
                };
                let age = (now - task.updated_at).to_std().unwrap_or_default();
                let gone = age >= retention;
                // The conversations' thread takes the turn; an expired record's eviction
                // needs its own copy (a retained one's is rebuilt from the index later).
                let evicted_turn = carried.map(|c| {
                    let mine = gone.then(|| c.clone());
                    carry(Carried::new(key.principal.clone(), c, conversations));
                    mine
                });
                if gone {
                    expired.push(Evicted {
                        key,
                        created,
                        turn: evicted_turn.flatten(),
                    });
                } else {
                    // Measured here, while the record is in the cache.
                    let size = task.approx_bytes() as u64;
                    restore(indexes.tasks.restored(key, task, turn, size, clock));
                }
            } else {
                unfinished.push((key, created, task, turn));
            }
            true
        })
    });
    read_tasks?;
    tracing::debug!(
        elapsed_ms = reading.elapsed().as_millis() as u64,
        "task records read and indexed"
    );
    let mut live: Vec<RecoveredTask> = Vec::with_capacity(unfinished.len());
    for (key, created, task, turn) in unfinished {
        let events = read_events(read, &key, created, 0, &task.history)?
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
    // Queued oldest first, so eviction order stays finish order.
    let evicted = restoring.finish(&indexes.tasks);
    tracing::debug!(
        elapsed_ms = reading.elapsed().as_millis() as u64,
        "finished tasks queued for expiry"
    );
    for e in &evicted {
        indexes.push.remove_task(&e.key);
    }
    expired.extend(evicted);
    for t in &live {
        indexes.tasks.put(&t.key, t.task.clone(), TurnId::default());
    }
    live.sort_by_key(|t| t.task.created_at);

    let mut entries = Vec::new();
    read.each(Table::Outbox, &mut |k, v| {
        match (codec::parse_outbox_key(k), codec::decode_outbox(v)) {
            (Some(key), Some((attempt, due))) => {
                entries.push((key, attempt, due));
            }
            _ => bad(Table::Outbox, k, v),
        }
        true
    })?;
    let mut deliveries = Vec::new();
    let mut stale = Vec::new();
    for (key, attempt, due) in entries {
        let task = indexes.tasks.get(&key.task);
        let config = indexes
            .push
            .for_task(&key.task)
            .into_iter()
            .find(|c| c.id == key.config);
        let event = match &task {
            Some(t) => read
                .get(
                    Table::Events,
                    &codec::event_key(&key.task, key.created, key.seq),
                )?
                .and_then(|e| codec::decode_event(key.seq, &e, &t.history)),
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
            _ => stale.push(key),
        }
    }
    Ok(Loaded {
        recovered: Recovered {
            tasks: live,
            contexts: Vec::new(),
            deliveries,
        },
        expired,
        stale,
        damaged,
        tombstones: Vec::new(),
        dead_tombstones: Vec::new(),
        carriers: Carriers::default(),
    })
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;
    use std::time::Duration;

    use super::{Carried, Conversations, Names, merge};
    use crate::model::{ContextId, Message, Principal};
    use crate::store::{CarriedTurn, RecoveredContext, TurnId, TurnMessages};

    #[test]
    fn carried_turns_join_their_conversations_wherever_they_come_from() {
        let hasher = Conversations::default();
        let p = Principal::new("p");
        let turn = |context: &str, since: i64, number: u32| {
            let turn = CarriedTurn {
                turn: TurnId { number, since },
                context: ContextId::new(context),
                user: Arc::new(Message::user_text([format!("{context} {number}")])),
                reply: None,
            };
            Carried::new(p.clone(), turn, &hasher)
        };
        // "a" began at 1 and has a row of its own; "b" and "c" live only in records, their
        // turns mingled; "a" at 2 is another conversation of the same id.
        let rows = vec![RecoveredContext {
            principal: p.clone(),
            context: ContextId::new("a"),
            since: 1,
            turns: vec![(1, TurnMessages::Stored(Box::new([1])))],
        }];
        let chunks = vec![
            vec![turn("b", 5, 1), turn("a", 1, 2), turn("c", 6, 1)],
            vec![
                turn("b", 5, 2),
                turn("a", 2, 1),
                turn("a", 1, 3),
                turn("c", 6, 2),
            ],
        ];
        let turns = merge(
            rows,
            Vec::new(),
            Vec::new(),
            chunks,
            &hasher,
            7,
            Duration::from_secs(60),
        );
        let got: Vec<(String, i64, Vec<u32>)> = turns
            .contexts
            .iter()
            .map(|c| {
                let numbers = c.turns.iter().map(|(n, _)| *n).collect();
                (c.context.to_string(), c.since, numbers)
            })
            .collect();
        let want = [
            ("a", 1, vec![1, 2, 3]),
            ("b", 5, vec![1, 2]),
            ("c", 6, vec![1, 2]),
            ("a", 2, vec![1]),
        ];
        assert_eq!(
            got,
            want.map(|(c, since, n)| (c.to_string(), since, n)),
            "rows' conversations first, then the others as first met"
        );
        // The records carrying turns, by conversation (a row is no record).
        let count = |c: &str, since| {
            let hash = hasher.hash(&p, &ContextId::new(c), since);
            turns.carried.get(&hash).copied()
        };
        assert_eq!(
            [count("a", 1), count("b", 5), count("c", 6), count("a", 2)],
            [Some(2), Some(2), Some(2), Some(1)]
        );
        assert_eq!(turns.carried.len(), 4);
    }

    #[test]
    fn a_load_keeps_each_name_once() {
        let mut names = Names::default();
        let first = names.principal("alice");
        let again = names.principal("alice");
        let other = names.principal("bob");
        assert_eq!(first, again);
        assert_eq!(first.as_str().as_ptr(), again.as_str().as_ptr(), "one copy");
        assert_ne!(first, other);
        let agent = names.agent("echo");
        let agent_again = names.agent("echo");
        assert_eq!(agent.as_str().as_ptr(), agent_again.as_str().as_ptr());
    }
}
