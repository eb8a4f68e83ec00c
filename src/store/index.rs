//! The in-memory indexes every embedded store serves reads from: task records (with the
//! owner index ListTasks walks, and retention), and push configurations. The `memory`
//! backend is these alone; the redb backend fills them from its file at start and keeps
//! them in step with what it commits.

use std::collections::BTreeSet;
use std::sync::atomic::{AtomicUsize, Ordering::Relaxed};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use dashmap::{DashMap, SharedValue};
use foldhash::fast::RandomState;

use super::{CarriedTurn, Delivery, ListPage, ListQuery, PageToken, TurnId, Write, deliveries_for};
use crate::error::Error;
use crate::model::{AgentId, Principal, TaskEvent, TaskId, TaskKey, TaskSnapshot};
use crate::piecewise::ChunkedQueue;
use crate::push::{Namespace, PushScope, StoredPushConfig};

/// An evicted task: where the file keeps its rows, and the conversation turn its record
/// carries, which the file writes as a row of its own as it deletes the record.
#[derive(Debug)]
pub(crate) struct Evicted {
    /// The task.
    pub(crate) key: TaskKey,
    /// Its creation time (µs): its rows are filed under it.
    pub(crate) created: i64,
    /// The turn its record carries (its messages only: the rest of the record is let go).
    pub(crate) turn: Option<CarriedTurn>,
}

/// What the embedded stores serve reads from, shared with the file's committer.
pub(crate) struct Indexes {
    pub(crate) tasks: TaskIndex,
    pub(crate) push: PushIndex,
    /// Seals push configurations' secrets as they are written (`store/seal.rs`).
    pub(crate) sealer: super::seal::Sealer,
}

impl Indexes {
    /// Empty indexes bounded as the configuration says.
    pub(crate) fn for_config(config: &crate::config::Config) -> Self {
        let server = &config.server;
        Self {
            tasks: TaskIndex::new(
                server.task_retention(),
                server.max_finished_tasks,
                server.max_retained_bytes,
            ),
            push: PushIndex::default(),
            sealer: super::seal::Sealer::for_config(config),
        }
    }

    /// The deliveries of a task event: one per configuration of the task that selects it
    /// and is active. Costs one load when no configuration exists at all.
    pub(crate) fn plan(
        &self,
        key: &TaskKey,
        task: &Arc<TaskSnapshot>,
        event: &Arc<TaskEvent>,
        changed: bool,
    ) -> Vec<Delivery> {
        if self.push.is_empty() {
            return Vec::new();
        }
        deliveries_for(key, task, event, changed, &self.push.for_task(key))
    }

    /// Applies writes that change the indexes at once (push removals).
    pub(crate) fn apply_now(&self, writes: &[Write]) {
        for w in writes {
            match w {
                Write::PushRemove(scope) => self.push.remove(scope),
                Write::PushRemoveNamed { task, id } => {
                    self.push.remove_named(task, id);
                }
                _ => {}
            }
        }
    }

    /// Puts a durable task record (carrying conversation turn `turn`; number 0: none);
    /// returns the tasks evicted to make room (their push configurations go with them).
    pub(crate) fn put_task(
        &self,
        key: &TaskKey,
        task: Arc<TaskSnapshot>,
        turn: TurnId,
    ) -> Vec<Evicted> {
        let evicted = self.tasks.put(key, task, turn);
        for gone in &evicted {
            self.push.remove_task(&gone.key);
        }
        evicted
    }
}

/// Every task's record in memory. Finished records are evicted oldest first.
///
/// Retention is the same for every record, so the order in which tasks finish is the
/// order in which they expire: a FIFO of keys makes eviction cost what it evicts, never a
/// scan of the whole map. Besides the age, a count cap and a byte budget bound what is
/// kept; both are enforced as records arrive, so no burst can hold more than the budget
/// until the next sweep. Each owner's tasks are also indexed by status time for ListTasks.
pub(crate) struct TaskIndex {
    /// Each record keeps its key's hash, so a growing shard moves its records without
    /// hashing their keys again (which read each key's names: cold memory, a miss each).
    records: DashMap<TaskKey, Record, RandomState>,
    /// Per (principal, agent): (status time in µs, task id) of every task.
    owners: DashMap<(Principal, AgentId), BTreeSet<(i64, TaskId)>, RandomState>,
    /// Finished tasks in the order they finished, with their expiry; guarded by a std
    /// mutex: pushes and pops are short and never await.
    finished: Mutex<Finished>,
    retention: Duration,
    max_records: usize,
    max_bytes: u64,
}

/// A task's record in the map, with its key's hash.
struct Record {
    hash: u64,
    task: Arc<TaskSnapshot>,
}

/// What a growing shard needs of a record: the hash it keeps.
fn kept_hash((_, record): &(TaskKey, SharedValue<Record>)) -> u64 {
    record.get().hash
}

#[derive(Default)]
struct Finished {
    /// Expiry, task, the conversation turn its record carries. In chunks: a queue of a
    /// million doubling at once would hold this lock, and the worker, for milliseconds
    /// (`crate::piecewise`).
    queue: ChunkedQueue<(Instant, TaskKey, TurnId)>,
    count: usize,
    bytes: u64,
}

/// A finished record read back from a store file, for [`TaskIndex::restore`]: made by
/// [`TaskIndex::restored`] on the thread that decoded it, so that everything read from
/// the record and its key (its hash, its times, the copies of the key the index keeps) is
/// read there, while it is in that core's cache, and the thread that fills the index
/// touches neither the record nor the names every key shares (their counts would bounce
/// between the cores).
pub(crate) struct RestoredRecord {
    key: TaskKey,
    /// `key` as the map hashes it.
    hash: u64,
    /// Copies of the key for the expiry queue and of its id for the owner's set.
    queued: TaskKey,
    listed: TaskId,
    /// Its status time, µs.
    at: i64,
    expires: Instant,
    task: Arc<TaskSnapshot>,
    /// The conversation turn its record carries (number 0: none).
    turn: TurnId,
    /// Its [`TaskSnapshot::approx_bytes`].
    size: u64,
}

/// The moment a restart measures ages from, on both clocks.
#[derive(Clone, Copy)]
pub(crate) struct RestoreClock {
    instant: Instant,
    wall: chrono::DateTime<chrono::Utc>,
}

impl RestoreClock {
    /// Now.
    pub(crate) fn now() -> Self {
        Self {
            instant: Instant::now(),
            wall: chrono::Utc::now(),
        }
    }

    /// The wall-clock time of the moment.
    pub(crate) fn wall(&self) -> chrono::DateTime<chrono::Utc> {
        self.wall
    }
}

/// Finished records [`TaskIndex::restore`] has put, to be queued for expiry in the order
/// they finished ([`Restoring::finish`]).
pub(crate) struct Restoring {
    /// When each expires, the task, its turn; in order unless `unsorted`.
    queue: Vec<(Instant, TaskKey, TurnId)>,
    unsorted: bool,
    bytes: u64,
}

impl Restoring {
    /// Puts the records queued from `from` on among those before them, in expiry order.
    /// A file's records come in creation order, nearly their finish order: a batch goes
    /// after what is there or mingles with its last few (those created before it that
    /// finished after some of it: tasks that were running at once), which costs what the
    /// batch holds. One that would reach further back (more than 65,536 tasks running at
    /// once) leaves the order to one sort at the end.
    fn settle(&mut self, from: usize) {
        const REACH: usize = 1 << 16;
        if self.unsorted {
            return;
        }
        let queue = &mut self.queue;
        queue[from..].sort_by_key(|(expires, ..)| *expires);
        let Some(&(first, ..)) = queue.get(from) else {
            return;
        };
        let at = queue[..from].partition_point(|(expires, ..)| *expires <= first);
        if from - at > REACH {
            self.unsorted = true;
        } else if at < from {
            // Two runs in order: the sort merges them.
            queue[at..].sort_by_key(|(expires, ..)| *expires);
        }
    }

    /// Queues the records [`TaskIndex::restore`] put for expiry in the order they
    /// finished; returns those the caps do not hold (the oldest), as putting them one by
    /// one in that order would have.
    pub(crate) fn finish(self, index: &TaskIndex) -> Vec<Evicted> {
        let Self {
            mut queue,
            unsorted,
            bytes,
            ..
        } = self;
        // Expiry follows finish time (every record is kept as long).
        if unsorted {
            queue.sort_by_key(|(expires, ..)| *expires);
        }
        let over = {
            let mut f = index.lock();
            f.count += queue.len();
            f.bytes += bytes;
            f.queue.extend(queue);
            index.over(&f)
        };
        let evicted = index.evict_if(over);
        // Room was made for every task of the file; the caps may have kept far fewer.
        index.give_back_room();
        evicted
    }
}

/// The task map's shards: at least 128, so that its largest growth — each shard grows on
/// its own, moving what it holds — moves about a 128th of the tasks held
/// (docs/decisions/growing-without-a-stall.md); more on a machine where `dashmap`'s own
/// choice (four per core) is more.
fn shards() -> usize {
    let cores = std::thread::available_parallelism().map_or(1, std::num::NonZero::get);
    (cores * 4).max(128).next_power_of_two()
}

fn micros(task: &TaskSnapshot) -> i64 {
    task.status.timestamp.timestamp_micros()
}

impl TaskIndex {
    /// A store keeping finished records for `retention`, at most `max_records` of them and
    /// at most about `max_bytes` bytes of them.
    pub(crate) fn new(retention: Duration, max_records: usize, max_bytes: u64) -> Self {
        Self {
            records: DashMap::with_hasher_and_shard_amount(RandomState::default(), shards()),
            owners: DashMap::default(),
            finished: Mutex::new(Finished::default()),
            retention,
            max_records,
            max_bytes,
        }
    }

    fn lock(&self) -> MutexGuard<'_, Finished> {
        self.finished.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn owner(key: &TaskKey) -> (Principal, AgentId) {
        (key.principal.clone(), key.agent.clone())
    }

    /// Evicts from the front while `expired` says so or a cap is exceeded.
    fn evict_while(&self, expired: impl Fn(&Instant) -> bool) -> Vec<Evicted> {
        let mut evicted = Vec::new();
        loop {
            let next = {
                let mut f = self.lock();
                let over = self.over(&f);
                match f.queue.front() {
                    Some((expires, ..)) if over || expired(expires) => f.queue.pop_front(),
                    _ => None,
                }
            };
            let Some((_, key, turn)) = next else { break };
            let Some((_, gone)) = self
                .records
                .remove_if(&key, |_, r| r.task.status.state.is_terminal())
            else {
                continue;
            };
            let gone = gone.task;
            if let Some(mut set) = self.owners.get_mut(&Self::owner(&key)) {
                set.remove(&(micros(&gone), key.task.clone()));
            }
            self.owners
                .remove_if(&Self::owner(&key), |_, set| set.is_empty());
            let mut f = self.lock();
            f.count = f.count.saturating_sub(1);
            f.bytes = f.bytes.saturating_sub(gone.approx_bytes() as u64);
            drop(f);
            evicted.push(Evicted {
                created: gone.created_at.timestamp_micros(),
                turn: CarriedTurn::of(turn, &gone),
                key,
            });
        }
        evicted
    }
}

impl TaskIndex {
    /// Stores the task as it stands (replacing its earlier record), whose record carries
    /// conversation turn `turn` (number 0: none). Returns the tasks evicted to make room.
    pub(crate) fn put(&self, key: &TaskKey, task: Arc<TaskSnapshot>, turn: TurnId) -> Vec<Evicted> {
        let finished = task.status.state.is_terminal();
        let at = micros(&task);
        let size = if finished {
            task.approx_bytes() as u64
        } else {
            0
        };
        let previous = self.insert(key, task);
        let before = previous.as_ref().map(|p| micros(p));
        if before != Some(at) {
            let mut set = self.owners.entry(Self::owner(key)).or_default();
            if let Some(before) = before {
                set.remove(&(before, key.task.clone()));
            }
            set.insert((at, key.task.clone()));
        }
        if !finished {
            return Vec::new();
        }
        let over = {
            let mut f = self.lock();
            match previous.filter(|p| p.status.state.is_terminal()) {
                Some(p) => f.bytes = f.bytes.saturating_sub(p.approx_bytes() as u64),
                None => {
                    f.queue
                        .push_back((Instant::now() + self.retention, key.clone(), turn));
                    f.count += 1;
                }
            }
            f.bytes += size;
            self.over(&f)
        };
        self.evict_if(over)
    }

    /// Puts a record in the map; returns the one it replaces. The map's own `insert`
    /// would hash every key of a shard again as the shard grows (~3% of a `send`'s CPU
    /// with hundreds of thousands of tasks kept); this one uses the hashes the records keep.
    fn insert(&self, key: &TaskKey, task: Arc<TaskSnapshot>) -> Option<Arc<TaskSnapshot>> {
        let hash = self.records.hash_usize(key) as u64;
        // The map's own choice of shard: always one of them.
        let Some(shard) = self
            .records
            .shards()
            .get(self.records.determine_shard(hash as usize))
        else {
            let record = Record { hash, task };
            return self.records.insert(key.clone(), record).map(|r| r.task);
        };
        let mut table = shard.write();
        if let Some((_, record)) = table.get_mut(hash, |(k, _)| k == key) {
            return Some(std::mem::replace(&mut record.get_mut().task, task));
        }
        table.insert(
            hash,
            (key.clone(), SharedValue::new(Record { hash, task })),
            kept_hash,
        );
        None
    }

    /// Starts restoring about `n` records read back from a store file: room is made for
    /// them first, so that nothing grows as they come (the map's growing would hash every
    /// key in it again).
    pub(crate) fn restoring(&self, n: usize) -> Restoring {
        let shards = self.records.shards();
        // Keys spread over the shards about evenly; the margin covers the unevenness.
        let each = n.div_ceil(shards.len().max(1));
        for shard in shards {
            shard.write().reserve(each + each / 16, kept_hash);
        }
        Restoring {
            queue: Vec::with_capacity(n),
            unsorted: false,
            bytes: 0,
        }
    }

    /// A finished record read back from a store file, for [`TaskIndex::restore`]; its age
    /// is measured from `clock`.
    pub(crate) fn restored(
        &self,
        key: TaskKey,
        task: Arc<TaskSnapshot>,
        turn: TurnId,
        size: u64,
        clock: RestoreClock,
    ) -> RestoredRecord {
        let age = (clock.wall - task.updated_at).to_std().unwrap_or_default();
        RestoredRecord {
            hash: self.records.hash_usize(&key) as u64,
            queued: key.clone(),
            listed: key.task.clone(),
            at: micros(&task),
            expires: clock.instant + self.retention.saturating_sub(age),
            key,
            task,
            turn,
            size,
        }
    }

    /// Puts finished records read back from a store file ([`TaskIndex::restored`]), in
    /// any order: each expires when it would have had the server kept running, once
    /// [`Restoring::finish`] has queued them.
    pub(crate) fn restore(
        &self,
        records: impl IntoIterator<Item = RestoredRecord>,
        into: &mut Restoring,
    ) {
        // Records come grouped by owner (a restart's are mostly one or a few): each
        // group takes its owner's entry once.
        type Group = ((Principal, AgentId), Vec<(i64, TaskId)>);
        let mut owner: Option<Group> = None;
        let from = into.queue.len();
        let flush = |o: Option<Group>| {
            if let Some((who, ids)) = o {
                self.owners.entry(who).or_default().extend(ids);
            }
        };
        // The map's entries, with the hashes made where the keys were read.
        let mut entries = Vec::new();
        for r in records {
            match &mut owner {
                // Names compare by address first: a load keeps each name once.
                Some((who, ids)) if who.0 == r.key.principal && who.1 == r.key.agent => {
                    ids.push((r.at, r.listed));
                }
                _ => flush(owner.replace((Self::owner(&r.key), vec![(r.at, r.listed)]))),
            }
            entries.push((
                self.records.determine_shard(r.hash as usize),
                r.hash,
                r.key,
                r.task,
            ));
            into.queue.push((r.expires, r.queued, r.turn));
            into.bytes += r.size;
        }
        // Shard by shard, each locked once: with no lock taken between two inserts, the
        // processor waits for the memory of several at once (each is a miss in a table
        // of a million).
        entries.sort_unstable_by_key(|(shard, ..)| *shard);
        let shards = self.records.shards();
        let mut entries = entries.into_iter().peekable();
        while let Some(&(i, ..)) = entries.peek() {
            // The map's own choice of shard: always one of them.
            let Some(shard) = shards.get(i) else { break };
            let mut table = shard.write();
            while let Some((_, hash, key, task)) = entries.next_if(|e| e.0 == i) {
                match table.get_mut(hash, |(k, _)| *k == key) {
                    Some((_, was)) => was.get_mut().task = task,
                    None => {
                        let record = Record { hash, task };
                        table.insert(hash, (key, SharedValue::new(record)), kept_hash);
                    }
                }
            }
        }
        flush(owner);
        into.settle(from);
    }

    /// The finished records exceed a cap.
    fn over(&self, f: &Finished) -> bool {
        f.count > self.max_records || f.bytes > self.max_bytes
    }

    /// Evicts the oldest finished records until the caps hold, if they do not.
    fn evict_if(&self, over: bool) -> Vec<Evicted> {
        if over {
            self.evict_while(|_| false)
        } else {
            Vec::new()
        }
    }

    /// A task's record.
    pub(crate) fn get(&self, key: &TaskKey) -> Option<Arc<TaskSnapshot>> {
        self.records.get(key).map(|r| r.value().task.clone())
    }

    /// One page of an owner's tasks.
    pub(crate) fn list(&self, q: &ListQuery) -> ListPage {
        let mut page = ListPage::default();
        let Some(set) = self.owners.get(&(q.principal.clone(), q.agent.clone())) else {
            return page;
        };
        let after = q.status_after.map(|t| t.timestamp_micros());
        let size = q.page_size.max(1);
        for (at, id) in set.iter().rev() {
            if after.is_some_and(|a| *at < a) {
                continue;
            }
            let key = TaskKey {
                principal: q.principal.clone(),
                agent: q.agent.clone(),
                task: id.clone(),
            };
            let Some(task) = self.records.get(&key).map(|r| r.value().task.clone()) else {
                continue;
            };
            if q.context.as_ref().is_some_and(|c| *c != task.context_id)
                || q.state.is_some_and(|s| s != task.status.state)
            {
                continue;
            }
            page.total += 1;
            let position = PageToken {
                timestamp_micros: *at,
                task: id.clone(),
            };
            if q.after.as_ref().is_some_and(|token| position >= *token) {
                continue;
            }
            if page.tasks.len() < size {
                page.tasks.push(task);
            } else if page.next.is_none() {
                page.next = page.tasks.last().map(|t| PageToken::of(t));
            }
        }
        page
    }

    /// Evicts finished tasks older than the retention or over the caps; returns them.
    pub(crate) fn evict(&self, now: Instant) -> Vec<Evicted> {
        let evicted = self.evict_while(|expires| *expires <= now);
        if !evicted.is_empty() {
            self.give_back_room();
        }
        evicted
    }

    /// Shrinks the expiry queue and the map when they use under a quarter of their room.
    fn give_back_room(&self) {
        let mut f = self.lock();
        f.queue.shrink_sparse();
        drop(f);
        if self.records.capacity() > 1024 && self.records.len() < self.records.capacity() / 4 {
            for shard in self.records.shards() {
                let mut table = shard.write();
                let len = table.len();
                table.shrink_to(len, kept_hash);
            }
        }
    }

    /// Finished records held.
    pub(crate) fn len(&self) -> usize {
        self.lock().count
    }

    /// About how many bytes the finished records hold.
    pub(crate) fn bytes(&self) -> u64 {
        self.lock().bytes
    }
}

/// Push configurations in memory: one per scope ([`Namespace::Scoped`]) or several per
/// task by id ([`Namespace::Named`]); the two never replace each other.
#[derive(Default)]
pub(crate) struct PushIndex {
    scoped: DashMap<PushScope, Arc<StoredPushConfig>, RandomState>,
    named: DashMap<TaskKey, Vec<Arc<StoredPushConfig>>, RandomState>,
    /// Configurations held, so the hot path's emptiness check costs one load.
    count: AtomicUsize,
}

impl PushIndex {
    /// Stores a configuration, replacing the one of the same scope (scoped) or of the same
    /// task and id (named).
    ///
    /// # Errors
    /// [`Error::InvalidParams`] when a task would hold more than `max_per_task` named
    /// configurations.
    pub(crate) fn set(
        &self,
        config: Arc<StoredPushConfig>,
        max_per_task: usize,
    ) -> Result<(), Error> {
        match config.namespace {
            Namespace::Scoped => {
                if self.scoped.insert(config.scope.clone(), config).is_none() {
                    self.count.fetch_add(1, Relaxed);
                }
            }
            Namespace::Named => {
                let Some(task) = config.scope.task.clone() else {
                    return Err(Error::Internal);
                };
                let key = TaskKey {
                    principal: config.scope.principal.clone(),
                    agent: config.scope.agent.clone(),
                    task,
                };
                let mut list = self.named.entry(key).or_default();
                match list.iter().position(|c| c.id == config.id) {
                    Some(i) => list[i] = config,
                    None if list.len() >= max_per_task => {
                        return Err(Error::invalid(
                            "id",
                            format!(
                                "a task holds at most {max_per_task} push notification configurations"
                            ),
                        ));
                    }
                    None => {
                        list.push(config);
                        self.count.fetch_add(1, Relaxed);
                    }
                }
            }
        }
        Ok(())
    }

    /// Removes the scoped configuration of exactly this scope.
    pub(crate) fn remove(&self, scope: &PushScope) {
        if self.scoped.remove(scope).is_some() {
            self.count.fetch_sub(1, Relaxed);
        }
    }

    /// Removes a named configuration of a task; true if there was one.
    pub(crate) fn remove_named(&self, task: &TaskKey, id: &str) -> bool {
        let removed = match self.named.get_mut(task) {
            Some(mut list) => {
                let before = list.len();
                list.retain(|c| c.id != id);
                before != list.len()
            }
            None => false,
        };
        if removed {
            self.count.fetch_sub(1, Relaxed);
            self.named.remove_if(task, |_, list| list.is_empty());
        }
        removed
    }

    /// The scoped configuration of exactly this scope.
    pub(crate) fn get_scope(&self, scope: &PushScope) -> Option<Arc<StoredPushConfig>> {
        self.scoped.get(scope).map(|c| c.value().clone())
    }

    /// A scoped configuration of this principal and agent by id.
    pub(crate) fn get_id(
        &self,
        principal: &Principal,
        agent: &AgentId,
        id: &str,
    ) -> Option<Arc<StoredPushConfig>> {
        self.scoped
            .iter()
            .find(|c| c.id == id && &c.scope.principal == principal && &c.scope.agent == agent)
            .map(|c| c.value().clone())
    }

    /// A task's named configurations, oldest first.
    pub(crate) fn list_named(&self, task: &TaskKey) -> Vec<Arc<StoredPushConfig>> {
        self.named
            .get(task)
            .map(|list| list.clone())
            .unwrap_or_default()
    }

    /// Every configuration that applies to a task: its own (scoped and named) and its
    /// owner's agent-wide one.
    pub(crate) fn for_task(&self, key: &TaskKey) -> Vec<Arc<StoredPushConfig>> {
        let mut scope = PushScope {
            principal: key.principal.clone(),
            agent: key.agent.clone(),
            task: Some(key.task.clone()),
        };
        let own = self.get_scope(&scope);
        scope.task = None;
        let wide = self.get_scope(&scope);
        let mut all: Vec<_> = own.into_iter().chain(wide).collect();
        all.extend(self.list_named(key));
        all
    }

    /// Forgets a task's configurations (the task was evicted).
    pub(crate) fn remove_task(&self, key: &TaskKey) {
        let scope = PushScope {
            principal: key.principal.clone(),
            agent: key.agent.clone(),
            task: Some(key.task.clone()),
        };
        self.remove(&scope);
        if let Some((_, list)) = self.named.remove(key) {
            self.count.fetch_sub(list.len(), Relaxed);
        }
    }

    /// True when no configuration is stored at all (the hot path skips planning then).
    pub(crate) fn is_empty(&self) -> bool {
        self.count.load(Relaxed) == 0
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::{ContextId, TaskState, TaskStatus};
    use crate::push::PushConfig;

    fn key(n: usize) -> TaskKey {
        TaskKey {
            principal: "p".into(),
            agent: "a".into(),
            task: TaskId::new(format!("{n:04}")),
        }
    }

    fn task(n: usize, state: TaskState, context: &str) -> Arc<TaskSnapshot> {
        let now = chrono::Utc::now();
        let mut status = TaskStatus::new(state);
        status.timestamp =
            chrono::DateTime::from_timestamp_micros(1_000_000 + n as i64).expect("time");
        Arc::new(TaskSnapshot {
            id: key(n).task,
            context_id: ContextId::new(context),
            status,
            seq: 3,
            created_at: now,
            updated_at: now,
            history: vec![],
            artifacts: vec![],
            metadata: None,
            extensions: Default::default(),
            note: None,
        })
    }

    fn store(retention: u64, max: usize, bytes: u64) -> TaskIndex {
        TaskIndex::new(Duration::from_secs(retention), max, bytes)
    }

    #[test]
    fn finished_records_expire_after_retention_and_running_ones_never() {
        let s = store(10, 100, u64::MAX);
        let t0 = Instant::now();
        s.put(
            &key(1),
            task(1, TaskState::Completed, "c"),
            TurnId::default(),
        );
        s.put(&key(2), task(2, TaskState::Working, "c"), TurnId::default());
        assert!(s.evict(t0).is_empty());
        assert_eq!(s.len(), 1);
        let evicted = s.evict(t0 + Duration::from_secs(11));
        assert_eq!(
            evicted.into_iter().map(|e| e.key).collect::<Vec<_>>(),
            vec![key(1)]
        );
        assert!(s.get(&key(1)).is_none());
        assert!(s.get(&key(2)).is_some(), "a running task is never evicted");
    }

    #[test]
    fn records_are_found_after_the_map_grows_and_gives_room_back_by_their_kept_hashes() {
        let s = store(10, usize::MAX, u64::MAX);
        let t0 = Instant::now();
        let kept = |n: usize| n.is_multiple_of(4);
        // Every shard grows several times; three records in four are then replaced in
        // place by their finished selves.
        for n in 0..20_000 {
            s.put(&key(n), task(n, TaskState::Working, "c"), TurnId::default());
        }
        for n in (0..20_000).filter(|n| !kept(*n)) {
            s.put(
                &key(n),
                task(n, TaskState::Completed, "c"),
                TurnId::default(),
            );
        }
        assert_eq!(
            s.records.len(),
            20_000,
            "a replaced record is not a second one"
        );
        for n in 0..20_000 {
            let want = if kept(n) {
                TaskState::Working
            } else {
                TaskState::Completed
            };
            let got = s.get(&key(n)).map(|t| t.status.state);
            assert_eq!(got, Some(want), "record {n} after growing");
        }
        let grown = s.records.capacity();
        assert_eq!(s.evict(t0 + Duration::from_secs(11)).len(), 15_000);
        assert!(
            s.records.capacity() < grown / 2,
            "the room of the evicted is given back ({} of {grown})",
            s.records.capacity()
        );
        for n in 0..20_000 {
            assert_eq!(
                s.get(&key(n)).is_some(),
                kept(n),
                "record {n} after shrinking"
            );
        }
        // The shrunk map grows again from what its records keep.
        for n in 20_000..30_000 {
            s.put(&key(n), task(n, TaskState::Working, "c"), TurnId::default());
        }
        assert!((0..30_000).all(|n| s.get(&key(n)).is_some() == (kept(n) || n >= 20_000)));
    }

    #[test]
    fn the_count_cap_and_byte_budget_evict_the_oldest_as_records_arrive() {
        let s = store(1000, 2, u64::MAX);
        for n in 0..5 {
            s.put(
                &key(n),
                task(n, TaskState::Completed, "c"),
                TurnId::default(),
            );
        }
        assert_eq!(s.len(), 2);
        assert!(s.get(&key(2)).is_none() && s.get(&key(4)).is_some());
        let one = task(0, TaskState::Completed, "c").approx_bytes() as u64;
        let s = store(1000, 1000, one * 3);
        for n in 0..10 {
            s.put(
                &key(n),
                task(n, TaskState::Completed, "c"),
                TurnId::default(),
            );
        }
        assert_eq!(s.len(), 3);
        assert!(s.bytes() <= one * 3);
        assert!(s.get(&key(9)).is_some() && s.get(&key(6)).is_none());
    }

    #[test]
    fn restored_records_in_any_order_are_queued_in_finish_order_and_the_caps_keep_the_newest() {
        // Finished 60 - n seconds ago; read back out of that order (as a file's key
        // order, by creation, may have them), under two owners.
        let finished = |n: usize| {
            let mut t = (*task(n, TaskState::Completed, "c")).clone();
            t.updated_at = chrono::Utc::now() - chrono::Duration::seconds(60 - n as i64);
            Arc::new(t)
        };
        let owned = |n: usize| TaskKey {
            principal: if n.is_multiple_of(2) { "p" } else { "q" }.into(),
            ..key(n)
        };
        let s = store(100, 3, u64::MAX);
        // Room for a file of many tasks, of which the caps keep three.
        let mut restoring = s.restoring(100_000);
        let clock = RestoreClock::now();
        for n in [3, 0, 4, 1, 2] {
            let task = finished(n);
            let size = task.approx_bytes() as u64;
            s.restore(
                [s.restored(owned(n), task, TurnId::default(), size, clock)],
                &mut restoring,
            );
        }
        let evicted = restoring.finish(&s);
        assert_eq!(
            evicted.into_iter().map(|e| e.key).collect::<Vec<_>>(),
            vec![owned(0), owned(1)],
            "the caps evict the oldest, oldest first"
        );
        assert!(
            s.records.capacity() < 1024,
            "the room not needed is given back"
        );
        assert_eq!(s.len(), 3);
        assert_eq!(s.bytes(), 3 * finished(2).approx_bytes() as u64);
        let listed = |p: &str| {
            s.list(&ListQuery {
                principal: p.into(),
                agent: "a".into(),
                context: None,
                state: None,
                status_after: None,
                page_size: 10,
                after: None,
            })
            .tasks
            .iter()
            .map(|t| t.id.to_string())
            .collect::<Vec<_>>()
        };
        assert_eq!(listed("p"), ["0004", "0002"]);
        assert_eq!(listed("q"), ["0003"]);
        // Each expires when it would have had the server kept running, in finish order:
        // 2 at 100 - 58 = 42 s from now, 3 at 43 s, 4 at 44 s.
        let now = Instant::now();
        assert!(s.evict(now + Duration::from_secs(41)).is_empty());
        let expired = |secs| {
            s.evict(now + Duration::from_millis(secs))
                .into_iter()
                .map(|e| e.key)
                .collect::<Vec<_>>()
        };
        assert_eq!(expired(43_500), vec![owned(2), owned(3)]);
        assert_eq!(expired(45_000), vec![owned(4)]);
        assert_eq!(s.len(), 0);
    }

    #[test]
    fn restored_records_that_finished_before_many_read_before_them_are_queued_in_finish_order() {
        let s = store(100_000, usize::MAX, u64::MAX);
        let clock = RestoreClock::now();
        let record = |n: usize, ago_ms: i64| {
            let mut t = (*task(n, TaskState::Completed, "c")).clone();
            t.updated_at = clock.wall() - chrono::Duration::milliseconds(ago_ms);
            let size = t.approx_bytes() as u64;
            s.restored(key(n), Arc::new(t), TurnId::default(), size, clock)
        };
        let mut restoring = s.restoring(8);
        // 70,000 tasks read first (created first) that ran long, then a few created after
        // them that finished before any of them: further back than a batch's merge
        // reaches, so the order is left to one sort at the end.
        let long: Vec<usize> = (0..70_000).collect();
        for chunk in long.chunks(4096) {
            s.restore(
                chunk.iter().map(|&n| record(n, 70_000 - n as i64)),
                &mut restoring,
            );
        }
        s.restore((70_000..70_010).map(|n| record(n, 80_000)), &mut restoring);
        assert!(restoring.finish(&s).is_empty());
        let f = s.lock();
        assert_eq!(f.queue.len(), 70_010);
        assert!(f.queue.iter().is_sorted_by_key(|(expires, ..)| *expires));
        assert_eq!(
            f.queue.front().map(|(_, k, _)| k.clone()),
            Some(key(70_000))
        );
        assert_eq!(f.queue.back().map(|(_, k, _)| k.clone()), Some(key(69_999)));
        drop(f);
        // Put with the hash made on the reading thread: each is found as any lookup finds it.
        assert!((0..70_010).all(|n| s.get(&key(n)).is_some()));
    }

    #[test]
    fn lists_page_newest_first_with_filters_and_a_stable_token() {
        let s = store(1000, 1000, u64::MAX);
        for n in 0..7 {
            let state = if n % 2 == 0 {
                TaskState::Completed
            } else {
                TaskState::Working
            };
            s.put(
                &key(n),
                task(n, state, if n < 4 { "a" } else { "b" }),
                TurnId::default(),
            );
        }
        let q = ListQuery {
            principal: "p".into(),
            agent: "a".into(),
            context: None,
            state: None,
            status_after: None,
            page_size: 3,
            after: None,
        };
        let ids = |p: &ListPage| p.tasks.iter().map(|t| t.id.to_string()).collect::<Vec<_>>();
        let first = s.list(&q);
        assert_eq!(ids(&first), ["0006", "0005", "0004"]);
        assert_eq!(first.total, 7);
        let second = s.list(&ListQuery {
            after: first.next.clone(),
            ..q.clone()
        });
        assert_eq!(ids(&second), ["0003", "0002", "0001"]);
        let last = s.list(&ListQuery {
            after: second.next.clone(),
            ..q.clone()
        });
        assert_eq!(ids(&last), ["0000"]);
        assert!(last.next.is_none());
        let filtered = s.list(&ListQuery {
            context: Some(ContextId::new("a")),
            state: Some(TaskState::Completed),
            ..q.clone()
        });
        assert_eq!(ids(&filtered), ["0002", "0000"]);
        assert_eq!(filtered.total, 2);
        let other = s.list(&ListQuery {
            principal: "someone else".into(),
            ..q
        });
        assert_eq!(other.total, 0);
    }

    #[test]
    fn named_configurations_are_capped_per_task_and_replace_by_id() {
        let p = PushIndex::default();
        let c = |id: &str| {
            StoredPushConfig::named(&key(1), Some(id.into()), PushConfig::new("http://h/"), "f")
        };
        p.set(c("a"), 2).expect("first");
        p.set(c("b"), 2).expect("second");
        p.set(c("a"), 2).expect("replaces");
        assert!(p.set(c("c"), 2).is_err(), "over the cap");
        assert_eq!(p.list_named(&key(1)).len(), 2);
        assert!(p.remove_named(&key(1), "a"));
        assert!(!p.remove_named(&key(1), "a"), "idempotent");
        p.remove_task(&key(1));
        assert!(p.is_empty());
    }
}
