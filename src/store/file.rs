//! The redb file behind [`super::LocalStore`]: a group-commit journal.
//!
//! One committer thread owns the write side. It takes whatever is queued (at most
//! `store.max_batch` task events per transaction, no linger timer: the batch that forms
//! while a commit runs is the next batch), writes it in one transaction, commits it with
//! `Durability::Immediate` (one fdatasync; quick-repair if configured), then — only then — puts the
//! task records into the index readers use and runs each append's continuation. Retention
//! deletes run on the same thread, in chunks between batches. A commit that fails is
//! retried (with the same writes, after a pause) and nothing is acknowledged meanwhile: the
//! server stalls rather than tells anyone something it could lose.
//!
//! Tables: `meta` (schema version), `tasks` (record per task), `events` (task, number),
//! `outbox` (task, event, configuration → next attempt), `push` (configurations with
//! their bookkeeping), `turns` (principal, conversation, turn).

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::Relaxed};
use std::sync::mpsc::{Receiver, RecvTimeoutError, Sender, TryRecvError};
use std::sync::{Arc, Mutex, RwLock};
use std::time::{Duration, Instant};

use redb::{
    Database, DatabaseError, Durability, ReadableDatabase, ReadableTable, StorageError,
    TableDefinition, TableHandle, WriteTransaction,
};

use super::codec::{self, Created, SCHEMA_VERSION};
use super::damage::{self, Damaged};
use super::index::Evicted;
use super::index::Indexes;
use super::{
    Committed, Delivery, Recovered, RecoveredContext, RecoveredTask, StoreStats, Then, Write,
    delivery_id,
};
use crate::config::Config;
use crate::error::{Error, Result};
use crate::model::{ContextId, Message, Principal, TaskEvent, TaskKey, TaskSnapshot};

type Table = TableDefinition<'static, &'static [u8], &'static [u8]>;

const META: Table = TableDefinition::new("meta");
const TASKS: Table = TableDefinition::new("tasks");
const EVENTS: Table = TableDefinition::new("events");
const OUTBOX: Table = TableDefinition::new("outbox");
const PUSH: Table = TableDefinition::new("push");
const TURNS: Table = TableDefinition::new("turns");

const APP: &[u8] = b"a2ad";

/// Tasks deleted per retention transaction (between write batches).
const FORGET_CHUNK: usize = 1024;

enum Job {
    Append(Vec<Write>, Option<Then>),
    Forget(Vec<Evicted>),
}

/// The open file, shared by the committer (which replaces it when it must reopen the
/// file) and readers (which hold the read side for the length of one read). `None` only
/// while a reopen has not succeeded yet.
type Handle = Arc<RwLock<Option<Database>>>;

/// The journal: a handle to the committer thread and the file.
pub(crate) struct Journal {
    tx: Mutex<Option<Sender<Job>>>,
    db: Handle,
    path: PathBuf,
    thread: Mutex<Option<std::thread::JoinHandle<()>>>,
    counters: Arc<Counters>,
    indexes: Arc<Indexes>,
}

#[derive(Default)]
struct Counters {
    pending: AtomicU64,
    commits: AtomicU64,
    committed: AtomicU64,
    failing: AtomicBool,
    /// Set when shutdown gave up waiting: the committer stops retrying and exits.
    abandon: AtomicBool,
}

fn open_error(path: &Path, message: impl Into<String>) -> Error {
    Error::Store {
        path: path.display().to_string(),
        message: message.into(),
    }
}

impl Journal {
    /// Opens (or creates) the file, checks it is an a2ad store of a schema this build
    /// reads, loads it into `indexes`, and starts the committer.
    ///
    /// # Errors
    /// [`Error::Store`] naming the file: locked by another process, unreadable, not an
    /// a2ad store, or of another schema. The file is left as it was.
    pub(crate) fn open(config: &Config, indexes: Arc<Indexes>) -> Result<(Self, Recovered)> {
        // redb trusts the pages of a file that opened cleanly: on a damaged one it may
        // panic anywhere from its first read. That refuses the start like any other
        // damage, with one line naming the file.
        damage::catch_quietly(|| Self::open_checked(config, indexes))
            .unwrap_or_else(|panic| Err(damaged(Path::new(&config.store.path), &panic)))
    }

    fn open_checked(config: &Config, indexes: Arc<Indexes>) -> Result<(Self, Recovered)> {
        let store = &config.store;
        let path = PathBuf::from(&store.path);
        if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty())
            && !dir.exists()
        {
            std::fs::create_dir_all(dir).map_err(|e| {
                open_error(
                    &path,
                    format!("cannot create the directory {}: {e}", dir.display()),
                )
            })?;
            restrict(dir, 0o700);
        }
        let fresh = !path.exists();
        if !fresh && std::fs::metadata(&path).is_ok_and(|m| m.len() == 0) {
            // An a2ad store is never empty (redb writes its header when it creates the
            // file): this is an operator's `> a2ad.redb` or a truncation, not a new store.
            return Err(open_error(
                &path,
                "is empty (0 bytes), so it is not a store a2ad wrote: if it held tasks, restore it from a backup; to start with a new, empty store, delete the file",
            ));
        }
        let started = Instant::now();
        let mut loaded = None;
        if !fresh {
            // Look before writing: a file that is not ours, or a damaged one, is left
            // exactly as it was. A clean file is loaded through this read-only handle.
            match redb::Builder::new().open_read_only(&path) {
                Ok(read) => {
                    if check_existing(&read, &path)? == SCHEMA_VERSION {
                        let l = guarded_load(&path, || load(&read, &indexes, config))?;
                        refuse_damage(&path, &l.damaged, store.set_aside_damaged)?;
                        loaded = Some(l);
                    }
                }
                // Not closed cleanly (a crash): only a writer may repair it; checked below.
                Err(DatabaseError::RepairAborted) => {}
                Err(e) => return Err(refused(&path, e)),
            }
        }
        let db = redb::Builder::new()
            .set_cache_size(store.cache_mib.saturating_mul(1 << 20))
            .create(&path)
            .map_err(|e| refused(&path, e))?;
        if fresh {
            restrict(&path, 0o600);
        }
        check_schema(&db, &path)?;
        let loaded = match loaded {
            Some(l) => l,
            None => {
                let l = guarded_load(&path, || load(&db, &indexes, config))?;
                refuse_damage(&path, &l.damaged, store.set_aside_damaged)?;
                l
            }
        };
        if !loaded.damaged.is_empty() {
            damage::set_aside(&db, &path, &loaded.damaged)?;
        }
        loaded
            .tidy(&db)
            .map_err(|e| open_error(&path, format!("could not be tidied: {e}")))?;
        let recovered = loaded.recovered;
        tracing::info!(
            path = %path.display(),
            tasks = indexes.tasks.len(),
            resumed = recovered.tasks.len(),
            deliveries = recovered.deliveries.len(),
            elapsed_ms = started.elapsed().as_millis() as u64,
            "store opened"
        );
        let (tx, rx) = std::sync::mpsc::channel();
        let counters = Arc::new(Counters::default());
        let db: Handle = Arc::new(RwLock::new(Some(db)));
        let committer = Committer {
            db: db.clone(),
            path: path.clone(),
            cache_bytes: store.cache_mib.saturating_mul(1 << 20),
            indexes: indexes.clone(),
            rx,
            counters: counters.clone(),
            max_batch: store.max_batch,
            quick_repair: store.quick_repair,
            forget: Vec::new(),
        };
        let thread = std::thread::Builder::new()
            .name("a2ad-store".into())
            .spawn(move || committer.run())
            .map_err(|e| open_error(&path, format!("cannot start the committer: {e}")))?;
        Ok((
            Self {
                tx: Mutex::new(Some(tx)),
                db,
                path,
                thread: Mutex::new(Some(thread)),
                counters,
                indexes,
            },
            recovered,
        ))
    }

    fn send(&self, job: Job) -> bool {
        let guard = self.tx.lock().unwrap_or_else(|e| e.into_inner());
        match guard.as_ref() {
            Some(tx) => tx.send(job).is_ok(),
            None => false,
        }
    }

    /// Queues writes; `then` runs once they are durable.
    pub(crate) fn append(&self, writes: Vec<Write>, then: Option<Then>) {
        let n = writes.len() as u64;
        self.counters.pending.fetch_add(n, Relaxed);
        if !self.send(Job::Append(writes, then)) {
            self.counters.pending.fetch_sub(n, Relaxed);
            tracing::warn!("store closed; writes after shutdown are dropped");
        }
    }

    /// Queues the deletion of evicted tasks (records, events, outbox entries, push
    /// configurations).
    pub(crate) fn forget(&self, keys: Vec<Evicted>) {
        self.send(Job::Forget(keys));
    }

    /// A task's events numbered above `after`.
    pub(crate) fn events(&self, key: &TaskKey, after: u64) -> Result<Vec<TaskEvent>> {
        let Some(task) = self.indexes.tasks.get(key) else {
            return Ok(Vec::new());
        };
        let db = self.db.read().unwrap_or_else(|e| e.into_inner());
        let Some(db) = db.as_ref() else {
            return Err(super::failed("the store file is being reopened"));
        };
        let read = db.begin_read().map_err(super::failed)?;
        read_events(&read, key, codec::created(&task), after, &task.history).map_err(super::failed)
    }

    /// Commits are failing (and being retried).
    pub(crate) fn failing(&self) -> bool {
        self.counters.failing.load(Relaxed)
    }

    /// Writes queued and not yet durable.
    pub(crate) fn backlog(&self) -> u64 {
        self.counters.pending.load(Relaxed)
    }

    /// Counters.
    pub(crate) fn stats(&self) -> StoreStats {
        StoreStats {
            pending_writes: self.counters.pending.load(Relaxed),
            commits: self.counters.commits.load(Relaxed),
            committed_writes: self.counters.committed.load(Relaxed),
            file_bytes: std::fs::metadata(&self.path).map(|m| m.len()).unwrap_or(0),
            failing: self.counters.failing.load(Relaxed),
            ..StoreStats::default()
        }
    }

    /// Commits what is queued and stops the committer, waiting at most `within` (a disk
    /// that stays full must not hold a shutdown forever). Returns the writes that never
    /// became durable (0 when all did).
    pub(crate) fn close(&self, within: Duration) -> u64 {
        drop(self.tx.lock().unwrap_or_else(|e| e.into_inner()).take());
        let deadline = Instant::now() + within;
        if let Some(thread) = self.thread.lock().unwrap_or_else(|e| e.into_inner()).take() {
            while !thread.is_finished() && Instant::now() < deadline {
                std::thread::sleep(Duration::from_millis(5));
            }
            if thread.is_finished() {
                let _ = thread.join();
            } else {
                // Still retrying a commit the file refuses: tell it to stop, and go.
                self.counters.abandon.store(true, Relaxed);
            }
        }
        self.counters.pending.load(Relaxed)
    }
}

impl Drop for Journal {
    fn drop(&mut self) {
        self.close(Duration::from_secs(10));
    }
}

/// Why a file cannot be opened, said so an operator knows what to do.
fn refused(path: &Path, e: DatabaseError) -> Error {
    match e {
        DatabaseError::DatabaseAlreadyOpen => open_error(
            path,
            "is in use by another a2ad (the file is locked); stop it or point store.path elsewhere",
        ),
        DatabaseError::Storage(StorageError::Io(io))
            if io.kind() == std::io::ErrorKind::InvalidData =>
        {
            open_error(
                path,
                format!("is not an a2ad store ({io}); point store.path elsewhere"),
            )
        }
        DatabaseError::Storage(StorageError::Io(io)) => {
            open_error(path, format!("cannot be read or written: {io}"))
        }
        DatabaseError::UpgradeRequired(v) => open_error(
            path,
            format!("was written in redb file format {v}, which this build cannot open"),
        ),
        other => open_error(
            path,
            format!("is not an a2ad store (or is damaged beyond repair): {other}"),
        ),
    }
}

#[cfg(unix)]
fn restrict(path: &Path, mode: u32) {
    use std::os::unix::fs::PermissionsExt as _;
    let _ = std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode));
}

#[cfg(not(unix))]
fn restrict(_path: &Path, _mode: u32) {}

/// A fresh file gets the schema; an existing one must carry a2ad's, at this version.
fn check_schema(db: &Database, path: &Path) -> Result<()> {
    let io = |e: &dyn std::fmt::Display| open_error(path, format!("cannot be read: {e}"));
    let read = db.begin_read().map_err(|e| io(&e))?;
    let empty = read.list_tables().map_err(|e| io(&e))?.next().is_none();
    drop(read);
    if !empty {
        return match check_existing(db, path)? {
            1 => migrate_v1(db, path),
            _ => Ok(()),
        };
    }
    let w = db.begin_write().map_err(|e| io(&e))?;
    {
        let mut meta = w.open_table(META).map_err(|e| io(&e))?;
        meta.insert(b"app".as_slice(), APP).map_err(|e| io(&e))?;
        meta.insert(
            b"schema".as_slice(),
            SCHEMA_VERSION.to_be_bytes().as_slice(),
        )
        .map_err(|e| io(&e))?;
        for t in [TASKS, EVENTS, OUTBOX, PUSH, TURNS] {
            w.open_table(t).map_err(|e| io(&e))?;
        }
    }
    w.commit().map_err(|e| io(&e))
}

/// An existing file must be an a2ad store of the schema this build reads, or of one it
/// migrates (an empty redb file — a first start that stopped early — is initialized by the
/// writer). Returns the schema found.
fn check_existing(db: &impl ReadableDatabase, path: &Path) -> Result<u32> {
    let io = |e: &dyn std::fmt::Display| open_error(path, format!("cannot be read: {e}"));
    let read = db.begin_read().map_err(|e| io(&e))?;
    let tables: Vec<String> = read
        .list_tables()
        .map_err(|e| io(&e))?
        .map(|t| t.name().to_string())
        .collect();
    if tables.is_empty() {
        return Ok(SCHEMA_VERSION);
    }
    if !tables.iter().any(|t| t == "meta") {
        return Err(open_error(
            path,
            "is a redb file of another program, not an a2ad store",
        ));
    }
    let meta = read.open_table(META).map_err(|e| io(&e))?;
    let app = meta
        .get(b"app".as_slice())
        .map_err(|e| io(&e))?
        .map(|v| v.value().to_vec());
    if app.as_deref() != Some(APP) {
        return Err(open_error(
            path,
            "is a redb file of another program, not an a2ad store",
        ));
    }
    let schema = meta
        .get(b"schema".as_slice())
        .map_err(|e| io(&e))?
        .and_then(|v| <[u8; 4]>::try_from(v.value()).ok())
        .map(u32::from_be_bytes);
    match schema {
        Some(v @ (1 | SCHEMA_VERSION)) => Ok(v),
        Some(v) if v > SCHEMA_VERSION => Err(open_error(
            path,
            format!(
                "was written by a newer a2ad (store schema {v}; this build reads {SCHEMA_VERSION}); run that version, or point store.path elsewhere"
            ),
        )),
        Some(v) => Err(open_error(
            path,
            format!(
                "has store schema {v}, which this build ({SCHEMA_VERSION}) cannot migrate; see docs/ARCHITECTURE.md"
            ),
        )),
        None => Err(open_error(path, "has no readable schema version")),
    }
}

/// Migrates a file of schema 1 (task and turn rows keyed by their ids) to schema 2 (keyed
/// by the task's creation time, or the conversation's, first), in one write transaction: a crash in the middle leaves schema 1
/// as it was, and the next start migrates again.
fn migrate_v1(db: &Database, path: &Path) -> Result<()> {
    let fail = |e: &dyn std::fmt::Display| {
        open_error(
            path,
            format!("could not be migrated from store schema 1: {e}"),
        )
    };
    let started = Instant::now();
    let migrate = || -> std::result::Result<usize, redb::Error> {
        let w = db.begin_write()?;
        let mut created: HashMap<TaskKey, Created> = HashMap::new();
        for table in [TASKS, EVENTS, OUTBOX, TURNS] {
            let old: Vec<(Vec<u8>, Vec<u8>)> = w
                .open_table(table)?
                .iter()?
                .map(|e| e.map(|(k, v)| (k.value().to_vec(), v.value().to_vec())))
                .collect::<std::result::Result<_, _>>()?;
            w.delete_table(table)?;
            let mut new = w.open_table(table)?;
            for (k, v) in old {
                let row = if table.name() == TURNS.name() {
                    // Schema 1 did not know when a conversation began: 0 for all of them
                    // (their tasks' records carry no such time either, so they agree).
                    let mut row =
                        codec::context_prefix(&Principal::new(""), &ContextId::new(""), 0);
                    row.truncate(8);
                    row.extend_from_slice(&k);
                    row
                } else if table.name() == TASKS.name() {
                    let Some(key) = codec::v1::parse_task_key(&k) else {
                        continue;
                    };
                    let Some((task, _)) = codec::decode_task(&key, &v) else {
                        continue;
                    };
                    let at = codec::created(&task);
                    let row = codec::task_key(&key, at);
                    created.insert(key, at);
                    row
                } else {
                    // Events and outbox entries: the task's key, then the rest as it was.
                    let Some((key, rest)) = codec::v1::split_task_key(&k) else {
                        continue;
                    };
                    let Some(at) = created.get(&key) else {
                        continue;
                    };
                    let mut row = codec::task_key(&key, *at);
                    row.extend_from_slice(rest);
                    row
                };
                new.insert(row.as_slice(), v.as_slice())?;
            }
        }
        w.open_table(META)?.insert(
            b"schema".as_slice(),
            SCHEMA_VERSION.to_be_bytes().as_slice(),
        )?;
        w.commit()?;
        Ok(created.len())
    };
    let tasks = migrate().map_err(|e| fail(&e))?;
    tracing::info!(
        path = %path.display(),
        tasks,
        elapsed_ms = started.elapsed().as_millis() as u64,
        "store migrated from schema 1 to {SCHEMA_VERSION}"
    );
    Ok(())
}

fn read_events(
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
struct Loaded {
    recovered: Recovered,
    /// Tasks past their retention (or over the caps): deleted once the file is writable.
    expired: Vec<Evicted>,
    /// Outbox entries whose task, configuration or event is gone.
    stale: Vec<(super::OutboxKey, Created)>,
    /// Rows that cannot be read.
    damaged: Vec<Damaged>,
}

impl Loaded {
    /// Deletes the expired tasks and stale outbox entries.
    fn tidy(&self, db: &Database) -> std::result::Result<(), redb::Error> {
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
fn damaged(path: &Path, why: &dyn std::fmt::Display) -> Error {
    open_error(
        path,
        format!(
            "is damaged: part of it cannot be read ({why}); restore it from a backup, or move it aside to start with an empty store"
        ),
    )
}

/// Runs `load`, saying what a storage error means.
fn guarded_load(
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
fn refuse_damage(path: &Path, damaged: &[Damaged], set_aside: bool) -> Result<()> {
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
fn load(
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
    let retention = Duration::from_secs_f64(config.server.task_retention_seconds);
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
                why: super::Orphan::Restart,
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
fn delete_task(
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

struct Committer {
    db: Handle,
    path: PathBuf,
    cache_bytes: usize,
    indexes: Arc<Indexes>,
    rx: Receiver<Job>,
    counters: Arc<Counters>,
    max_batch: usize,
    quick_repair: bool,
    /// Evicted tasks whose rows are still to delete, in chunks between batches.
    forget: Vec<Evicted>,
}

/// What one batch writes, collected before the transaction so repeated records of one
/// task are written once.
#[derive(Default)]
struct Batch {
    appends: Vec<(usize, Option<Then>)>,
    writes: Vec<Write>,
    writes_count: u64,
}

impl Committer {
    fn run(mut self) {
        loop {
            if self.counters.abandon.load(Relaxed) {
                return;
            }
            let first = if self.forget.is_empty() {
                match self.rx.recv() {
                    Ok(job) => job,
                    Err(_) => break,
                }
            } else {
                match self.rx.recv_timeout(Duration::from_millis(1)) {
                    Ok(job) => job,
                    Err(RecvTimeoutError::Timeout) => {
                        self.forget_chunk();
                        continue;
                    }
                    Err(RecvTimeoutError::Disconnected) => break,
                }
            };
            let mut batch = Batch::default();
            let mut tasks = 0usize;
            let mut next = Some(first);
            while let Some(job) = next.take() {
                match job {
                    Job::Append(writes, then) => {
                        tasks += writes
                            .iter()
                            .filter(|w| matches!(w, Write::Task { .. }))
                            .count();
                        batch.writes_count += writes.len() as u64;
                        batch.appends.push((writes.len(), then));
                        batch.writes.extend(writes);
                    }
                    Job::Forget(keys) => self.forget.extend(keys),
                }
                if tasks < self.max_batch {
                    match self.rx.try_recv() {
                        Ok(job) => next = Some(job),
                        Err(TryRecvError::Empty | TryRecvError::Disconnected) => {}
                    }
                }
            }
            if !batch.appends.is_empty() && !self.commit(batch) {
                return;
            }
            if !self.forget.is_empty() {
                self.forget_chunk();
            }
        }
        // Disconnected: everything queued has been committed above.
        while !self.forget.is_empty() && !self.counters.abandon.load(Relaxed) {
            self.forget_chunk();
        }
    }

    /// Writes one batch, retrying until the file takes it; then publishes it. A failed
    /// commit leaves redb's handle unusable (it latches the I/O error), so each retry
    /// reopens the file first: once the disk has room again, the same writes go in.
    /// Returns false when shutdown gave up on it (nothing of the batch was acknowledged).
    fn commit(&mut self, batch: Batch) -> bool {
        let mut pause = Duration::from_millis(100);
        let mut failure: Option<Failure> = None;
        let deliveries = loop {
            match self.write(&batch.writes) {
                Ok(d) => break d,
                Err(e) => {
                    self.counters.failing.store(true, Relaxed);
                    Failure::note(
                        &mut failure,
                        &e.to_string(),
                        self.counters.pending.load(Relaxed),
                    );
                    if !self.pause(pause) {
                        return false;
                    }
                    pause = (pause * 2).min(Duration::from_secs(5));
                    if let Err(e) = self.reopen() {
                        Failure::note(
                            &mut failure,
                            &format!("reopening the file: {e}"),
                            self.counters.pending.load(Relaxed),
                        );
                    }
                }
            }
        };
        if let Some(f) = failure {
            tracing::warn!(
                failing_for_s = f.since.elapsed().as_secs(),
                "store commits succeed again"
            );
        }
        self.counters.failing.store(false, Relaxed);
        self.counters.commits.fetch_add(1, Relaxed);
        self.counters
            .committed
            .fetch_add(batch.writes_count, Relaxed);
        self.counters.pending.fetch_sub(batch.writes_count, Relaxed);
        // Visible to readers only now that it is durable.
        for w in &batch.writes {
            if let Write::Task { key, task, .. } = w {
                let evicted = self.indexes.put_task(key, task.clone());
                self.forget.extend(evicted);
            }
        }
        let mut deliveries = deliveries.into_iter().peekable();
        let mut end = 0;
        for (count, then) in batch.appends {
            end += count;
            let mut mine = Vec::new();
            while let Some((_, d)) = deliveries.next_if(|(i, _)| *i < end) {
                mine.push(d);
            }
            if let Some(then) = then {
                then(Committed { deliveries: mine });
            }
        }
        true
    }

    /// Sleeps `d`, waking early (false) when shutdown gives up on the committer.
    fn pause(&self, d: Duration) -> bool {
        let until = Instant::now() + d;
        while Instant::now() < until {
            if self.counters.abandon.load(Relaxed) {
                return false;
            }
            std::thread::sleep(Duration::from_millis(20).min(until - Instant::now()));
        }
        !self.counters.abandon.load(Relaxed)
    }

    /// Closes the file and opens it again (redb repairs what the failed commit left).
    fn reopen(&self) -> std::result::Result<(), DatabaseError> {
        let mut slot = self.db.write().unwrap_or_else(|e| e.into_inner());
        // One handle per file: the failed one goes first.
        drop(slot.take());
        let db = redb::Builder::new()
            .set_cache_size(self.cache_bytes)
            .create(&self.path)?;
        *slot = Some(db);
        Ok(())
    }

    /// One transaction with every write of the batch. Returns the planned deliveries, each
    /// with the index of the write that planned it.
    fn write(&self, writes: &[Write]) -> std::result::Result<Vec<(usize, Delivery)>, redb::Error> {
        let mut w = begin_write(&self.db)?;
        w.set_durability(Durability::Immediate).map_err(|e| {
            redb::Error::from(redb::StorageError::Io(std::io::Error::other(e.to_string())))
        })?;
        w.set_quick_repair(self.quick_repair);
        let mut planned = Vec::new();
        {
            let mut tasks = w.open_table(TASKS)?;
            let mut events = w.open_table(EVENTS)?;
            let mut outbox = w.open_table(OUTBOX)?;
            let mut push = w.open_table(PUSH)?;
            let mut turns = w.open_table(TURNS)?;
            // The last record of each task in the batch (earlier ones are superseded).
            let mut last: HashMap<&TaskKey, usize> = HashMap::new();
            for (i, write) in writes.iter().enumerate() {
                if let Write::Task { key, .. } = write {
                    last.insert(key, i);
                }
            }
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
                        events.insert(
                            codec::event_key(key, created, event.seq).as_slice(),
                            codec::encode_event(event).as_slice(),
                        )?;
                        for d in self.indexes.plan(key, task, event, *changed) {
                            outbox.insert(
                                codec::outbox_key(&d.key, created).as_slice(),
                                codec::encode_outbox(1, None).as_slice(),
                            )?;
                            planned.push((i, d));
                        }
                        if last.get(key) == Some(&i) {
                            tasks.insert(
                                codec::task_key(key, created).as_slice(),
                                codec::encode_task(task, *turn).as_slice(),
                            )?;
                        }
                    }
                    Write::Turn {
                        principal,
                        context,
                        turn,
                        user,
                        reply,
                    } => {
                        turns.insert(
                            codec::turn_key(principal, context, *turn).as_slice(),
                            codec::encode_turn(user, reply.as_deref()).as_slice(),
                        )?;
                    }
                    Write::ForgetContext {
                        principal,
                        context,
                        since,
                    } => {
                        let prefix = codec::context_prefix(principal, context, *since);
                        let end = codec::prefix_end(&prefix);
                        turns.retain_in(prefix.as_slice()..end.as_slice(), |_, _| false)?;
                    }
                    Write::PushSet(c) | Write::PushStats(c) => {
                        push.insert(
                            codec::push_key(c).as_slice(),
                            codec::encode_push(c).as_slice(),
                        )?;
                    }
                    Write::PushRemove(scope) => {
                        push.remove(codec::scoped_key(scope).as_slice())?;
                    }
                    Write::PushRemoveNamed { task, id } => {
                        push.remove(codec::named_key(task, id).as_slice())?;
                    }
                    // A delivery's task is in the index (its event is durable); one that
                    // is not was evicted, and its outbox entries with it.
                    Write::OutboxDone(key) => {
                        if let Some(task) = self.indexes.tasks.get(&key.task) {
                            let k = codec::outbox_key(key, codec::created(&task));
                            outbox.remove(k.as_slice())?;
                        }
                    }
                    Write::OutboxRetry { key, attempt, due } => {
                        let Some(task) = self.indexes.tasks.get(&key.task) else {
                            continue;
                        };
                        let k = codec::outbox_key(key, codec::created(&task));
                        // Only while the entry exists: an evicted task's deliveries are gone.
                        if outbox.get(k.as_slice())?.is_some() {
                            outbox.insert(
                                k.as_slice(),
                                codec::encode_outbox(*attempt, Some(*due)).as_slice(),
                            )?;
                        }
                    }
                }
            }
        }
        w.commit()?;
        Ok(planned)
    }

    /// Deletes one chunk of evicted tasks.
    fn forget_chunk(&mut self) {
        let n = self.forget.len().min(FORGET_CHUNK);
        let chunk: Vec<Evicted> = self.forget.drain(..n).collect();
        let result = (|| -> std::result::Result<(), redb::Error> {
            let mut w = begin_write(&self.db)?;
            w.set_quick_repair(self.quick_repair);
            for (key, created) in &chunk {
                delete_task(&w, key, *created)?;
            }
            w.commit()?;
            Ok(())
        })();
        if let Err(e) = result {
            tracing::error!(error = %e, tasks = chunk.len(), "store: deleting expired tasks failed; retried later");
            self.forget.extend(chunk);
        }
    }
}

/// A write transaction on the open file (the committer's: only it reopens the file, so
/// the handle may be let go of while the transaction runs).
fn begin_write(db: &Handle) -> std::result::Result<WriteTransaction, redb::Error> {
    let db = db.read().unwrap_or_else(|e| e.into_inner());
    let Some(db) = db.as_ref() else {
        return Err(redb::Error::Io(std::io::Error::other(
            "the store file is not open",
        )));
    };
    Ok(db.begin_write()?)
}

/// A streak of failed commits, for the log: an error is logged when it first appears, when
/// it changes, and every [`Failure::EVERY`] while it lasts.
struct Failure {
    since: Instant,
    logged: Instant,
    last: String,
}

impl Failure {
    const EVERY: Duration = Duration::from_secs(30);

    fn note(streak: &mut Option<Self>, error: &str, waiting: u64) {
        let now = Instant::now();
        match streak {
            None => {
                tracing::error!(
                    error,
                    waiting_writes = waiting,
                    "store commit failed; retrying (nothing is acknowledged until it succeeds)"
                );
                *streak = Some(Self {
                    since: now,
                    logged: now,
                    last: error.to_string(),
                });
            }
            Some(f) if f.last != error || now.duration_since(f.logged) >= Self::EVERY => {
                tracing::error!(
                    error,
                    waiting_writes = waiting,
                    failing_for_s = f.since.elapsed().as_secs(),
                    "store commits still failing; retrying"
                );
                f.logged = now;
                error.clone_into(&mut f.last);
            }
            Some(_) => {}
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::StoreConfig;
    use crate::model::{Role, TaskId, TaskState, TaskStatus};
    use crate::store::index::{PushIndex, TaskIndex};

    /// A key part as schema 1 wrote it.
    fn part(out: &mut Vec<u8>, s: &str) {
        out.extend_from_slice(&(s.len() as u32).to_be_bytes());
        out.extend_from_slice(s.as_bytes());
    }

    fn v1_task_key(key: &TaskKey) -> Vec<u8> {
        let mut out = Vec::new();
        part(&mut out, key.principal.as_str());
        part(&mut out, key.agent.as_str());
        part(&mut out, key.task.as_str());
        out
    }

    #[test]
    fn a_schema_1_file_is_migrated_once_and_keeps_its_tasks_and_events() {
        let dir = std::env::temp_dir().join(format!("a2ad-migrate-{}", uuid::Uuid::new_v4()));
        std::fs::create_dir_all(&dir).expect("dir");
        let path = dir.join("a2ad.redb");
        let key = TaskKey {
            principal: "alice".into(),
            agent: "echo".into(),
            task: TaskId::new("t-1"),
        };
        let user = Arc::new(Message {
            role: Role::User,
            parts: vec![crate::model::Part::Text("hi".into())],
            message_id: "m1".into(),
        });
        let reply = Arc::new(Message::agent_text(["echo: hi"]));
        let mut status = TaskStatus::new(TaskState::Completed);
        status.message = Some(reply.clone());
        let task = TaskSnapshot {
            id: key.task.clone(),
            context_id: ContextId::new("ctx"),
            status: status.clone(),
            seq: 2,
            created_at: chrono::Utc::now(),
            updated_at: status.timestamp,
            history: vec![user, reply],
            artifacts: Vec::new(),
            metadata: None,
        };
        {
            // A file as schema 1 left it: a finished task with two events.
            let db = Database::create(&path).expect("create");
            let w = db.begin_write().expect("write");
            {
                let mut meta = w.open_table(META).expect("meta");
                meta.insert(b"app".as_slice(), APP).expect("app");
                meta.insert(b"schema".as_slice(), 1u32.to_be_bytes().as_slice())
                    .expect("schema");
                w.open_table(TASKS)
                    .expect("tasks")
                    .insert(
                        v1_task_key(&key).as_slice(),
                        codec::encode_task(
                            &task,
                            crate::store::TurnId {
                                number: 1,
                                since: 0,
                            },
                        )
                        .as_slice(),
                    )
                    .expect("task");
                let mut events = w.open_table(EVENTS).expect("events");
                for (seq, state) in [(1u64, TaskState::Submitted), (2, TaskState::Completed)] {
                    let mut k = v1_task_key(&key);
                    k.extend_from_slice(&seq.to_be_bytes());
                    let event = TaskEvent {
                        seq,
                        status: TaskStatus::new(state),
                        artifact: None,
                    };
                    events
                        .insert(k.as_slice(), codec::encode_event(&event).as_slice())
                        .expect("event");
                }
                let mut turn = Vec::new();
                part(&mut turn, "alice");
                part(&mut turn, "ctx");
                turn.extend_from_slice(&1u32.to_be_bytes());
                w.open_table(TURNS)
                    .expect("turns")
                    .insert(
                        turn.as_slice(),
                        codec::encode_turn(&task.history[0], Some(&task.history[1])).as_slice(),
                    )
                    .expect("turn");
                for t in [OUTBOX, PUSH] {
                    w.open_table(t).expect("table");
                }
            }
            w.commit().expect("commit");
        }
        let config = Config {
            store: StoreConfig::redb(path.display().to_string()),
            ..Config::default()
        };
        let indexes = || {
            Arc::new(Indexes {
                tasks: TaskIndex::new(Duration::from_secs(3600), 1000, 1 << 30),
                push: PushIndex::default(),
            })
        };
        for round in 0..2 {
            // The first open migrates; the second finds schema 2 and reads it as it is.
            let (journal, recovered) = Journal::open(&config, indexes()).expect("opens");
            assert_eq!(recovered.contexts.len(), 1, "round {round}");
            let c = &recovered.contexts[0];
            assert_eq!((c.context.as_str(), c.since, c.turns.len()), ("ctx", 0, 1));
            let back = journal.indexes.tasks.get(&key).expect("the task came back");
            assert_eq!(back.status.state, TaskState::Completed, "round {round}");
            let events = journal.events(&key, 0).expect("events");
            assert_eq!(
                events.iter().map(|e| e.seq).collect::<Vec<_>>(),
                vec![1, 2],
                "round {round}"
            );
            assert_eq!(journal.events(&key, 1).expect("events").len(), 1);
            journal.close(Duration::from_secs(30));
            drop(journal);
            let db = Database::open(&path).expect("reopen");
            let read = db.begin_read().expect("read");
            let meta = read.open_table(META).expect("meta");
            let schema = meta
                .get(b"schema".as_slice())
                .expect("get")
                .expect("schema");
            assert_eq!(schema.value(), SCHEMA_VERSION.to_be_bytes().as_slice());
        }
        let _ = std::fs::remove_dir_all(&dir);
    }
}
