//! The file behind [`super::LocalStore`]: a group-commit journal over one of two disks —
//! the log (`backend = "log"`, the default: framed records appended to segment files, read
//! back from memory) or redb (`backend = "redb"`: B-trees in one file).
//!
//! One committer thread owns the write side. It takes whatever is queued (at most
//! `store.max_batch` task events per batch, no linger timer: the batch that forms while a
//! commit runs is the next batch), makes it durable with one fdatasync, then — only then —
//! puts the task records into the index readers use and runs each append's continuation.
//! Retention deletes and the log's compaction run on the same thread, in chunks between
//! batches. A commit that fails is retried (with the same writes, after a pause) and
//! nothing is acknowledged meanwhile: the server stalls rather than tells anyone something
//! it could lose.
//!
//! Tables (file/tables.rs): `tasks` (record per task), `events` (task, number), `outbox`
//! (task, event, configuration → next attempt), `push` (configurations with their
//! bookkeeping), `turns` (principal, conversation, turn); redb adds `meta` (schema version).

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::Relaxed};
use std::sync::mpsc::Sender;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

mod carriers;
mod committer;
mod load;
pub(crate) mod log;
mod policy;
mod redb_file;
mod schema;
mod spin;
pub(crate) mod tables;

use super::codec::{self, Created};
use super::damage;
use super::index::Evicted;
use super::index::Indexes;
use super::{Recovered, StoreStats, Then, Write};
use crate::config::{Config, StoreBackend};
use crate::error::{Error, Result};
use crate::model::{ContextId, Message, Principal, TaskEvent, TaskKey};
use committer::Committer;
use load::damaged;
use tables::{DiskError, TableWrite};

/// Tasks deleted per retention batch (between write batches).
const FORGET_CHUNK: usize = 1024;

/// What the committer does with a store file: one durable batch at a time.
trait Disk: Send + Sync + 'static {
    /// Makes the table writes `f` makes one durable batch.
    fn write(
        &self,
        f: &mut dyn FnMut(&mut dyn TableWrite) -> std::result::Result<(), DiskError>,
    ) -> std::result::Result<(), DiskError>;

    /// Makes one batch of writes durable. Returns the planned deliveries and which write
    /// is each task's last. `carried`: whether a record carrying a turn of a conversation
    /// may still be in the file ([`tables::apply`]).
    fn commit(
        &self,
        writes: &[Write],
        indexes: &Indexes,
        carried: &dyn Fn(&Principal, &ContextId, i64) -> bool,
    ) -> std::result::Result<tables::Applied, DiskError> {
        let mut applied = tables::Applied::default();
        self.write(&mut |t| {
            applied = tables::apply(writes, indexes, carried, t)?;
            Ok(())
        })?;
        Ok(applied)
    }

    /// Deletes evicted tasks (their records, events, outbox entries, configurations).
    fn forget(&self, chunk: &[Evicted]) -> std::result::Result<(), DiskError> {
        self.write(&mut |t| tables::forget(t, chunk))
    }

    /// Gets ready to retry after a failed commit.
    fn reopen(&self) -> std::result::Result<(), DiskError>;

    /// A task's durable events numbered above `after`.
    fn events(
        &self,
        key: &TaskKey,
        created: Created,
        after: u64,
        history: &[Arc<Message>],
    ) -> std::result::Result<Vec<TaskEvent>, DiskError>;

    /// The bytes the store takes on disk.
    fn bytes(&self) -> u64;

    /// Work between batches (the log's compaction): one bounded step. Returns true when
    /// there is more to do.
    fn maintain(&self) -> std::result::Result<bool, DiskError> {
        Ok(false)
    }
}

enum Job {
    Append(Vec<Write>, Option<Then>),
    Forget(Vec<Evicted>),
}

/// The journal: a handle to the committer thread and the file.
pub(crate) struct Journal {
    tx: Mutex<Option<Sender<Job>>>,
    disk: Arc<dyn Disk>,
    thread: Mutex<Option<std::thread::JoinHandle<()>>>,
    counters: Arc<Counters>,
    indexes: Arc<Indexes>,
}

struct Counters {
    pending: AtomicU64,
    /// Appends sent and not yet taken by the committer.
    queued: AtomicU64,
    /// An append that finds this many queued yields the core to the committer.
    yield_at: AtomicU64,
    commits: AtomicU64,
    /// Time spent committing, microseconds.
    commit_micros: AtomicU64,
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

/// After loading: damaged rows set aside (when the operator said so: the load refused
/// them otherwise), expired tasks and stale outbox entries deleted.
fn settle(disk: &dyn Disk, path: &Path, loaded: &load::Loaded) -> Result<()> {
    if !loaded.damaged.is_empty() {
        damage::set_aside(path, &loaded.damaged, || {
            disk.write(&mut |t| {
                for d in &loaded.damaged {
                    if let Some(table) = tables::Table::named(&d.table) {
                        t.remove(table, &d.key)?;
                    }
                }
                Ok(())
            })
            .map_err(|e| e.to_string())
        })?;
    }
    if !loaded.tidy_nothing() {
        disk.write(&mut |t| loaded.tidy(t))
            .map_err(|e| open_error(path, format!("could not be tidied: {e}")))?;
    }
    Ok(())
}

/// Creates the store's directory when it is missing (every directory made, mode 0700).
fn create_parent(path: &Path) -> Result<()> {
    if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty())
        && !dir.exists()
    {
        super::private::create_dir(dir).map_err(|e| {
            open_error(
                path,
                format!("cannot create the directory {}: {e}", dir.display()),
            )
        })?;
    }
    Ok(())
}

impl Journal {
    /// Opens (or creates) the store file, checks it is an a2ad store this build reads,
    /// loads it into `indexes`, and starts the committer.
    ///
    /// # Errors
    /// [`Error::Store`] naming the file: locked by another process, unreadable, not an
    /// a2ad store, of another schema, or damaged. The file is left as it was.
    pub(crate) fn open(config: &Config, indexes: Arc<Indexes>) -> Result<(Self, Recovered)> {
        let path = PathBuf::from(config.store.path());
        let started = Instant::now();
        // redb trusts the pages of a file that opened cleanly: on a damaged one it may
        // panic anywhere from its first read. That refuses the start like any other
        // damage, with one line naming the file.
        let (disk, loaded): (Arc<dyn Disk>, load::Loaded) =
            damage::catch_quietly(|| -> Result<(Arc<dyn Disk>, load::Loaded)> {
                Ok(match config.store.backend {
                    StoreBackend::Redb => {
                        let (disk, loaded) = redb_file::RedbDisk::open(config, &indexes)?;
                        (Arc::new(disk), loaded)
                    }
                    StoreBackend::Log | StoreBackend::Memory => {
                        let (disk, loaded) = log::LogDisk::open(config, &indexes)?;
                        (Arc::new(disk), loaded)
                    }
                })
            })
            .unwrap_or_else(|panic| Err(damaged(&path, &panic)))?;
        let recovered = loaded.recovered;
        let mut tombstones = committer::Tombstones::new(
            config.server.task_retention(),
            config.server.max_finished_tasks,
            loaded.carriers,
        );
        for (key, age) in loaded.tombstones {
            tombstones.add(key, age);
        }
        tracing::info!(
            path = %path.display(),
            tasks = indexes.tasks.len(),
            resumed = recovered.tasks.len(),
            deliveries = recovered.deliveries.len(),
            elapsed_ms = started.elapsed().as_millis() as u64,
            "store opened"
        );
        let (tx, rx) = std::sync::mpsc::channel();
        let counters = Arc::new(Counters {
            pending: AtomicU64::new(0),
            queued: AtomicU64::new(0),
            yield_at: AtomicU64::new(u64::MAX),
            commits: AtomicU64::new(0),
            commit_micros: AtomicU64::new(0),
            committed: AtomicU64::new(0),
            failing: AtomicBool::new(false),
            abandon: AtomicBool::new(false),
        });
        let committer = Committer {
            disk: disk.clone(),
            indexes: indexes.clone(),
            rx,
            counters: counters.clone(),
            max_batch: config.store.max_batch,
            forget: std::collections::VecDeque::new(),
            more: false,
            tombstones,
            handoff: committer::Handoff::current(),
            spinner: spin::Spinner::start(spin::per_commit(config.store.sync_spin_us)),
            spare: committer::Batch::default(),
        };
        let thread = std::thread::Builder::new()
            .name("a2ad-store".into())
            .spawn(move || committer.run())
            .map_err(|e| open_error(&path, format!("cannot start the committer: {e}")))?;
        Ok((
            Self {
                tx: Mutex::new(Some(tx)),
                disk,
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
        let queued = self.counters.queued.fetch_add(1, Relaxed) + 1;
        if !self.send(Job::Append(writes, then)) {
            self.counters.pending.fetch_sub(n, Relaxed);
            tracing::warn!("store closed; writes after shutdown are dropped");
            return;
        }
        // The committer paces this (committer.rs, `next_yield_at`): a hint to the
        // scheduler, never a wait — at the threshold and each multiple of it, not at every
        // append past it (those find the committer on the disk and nothing else to run).
        if committer::yields(queued, self.counters.yield_at.load(Relaxed)) {
            std::thread::yield_now();
        }
    }

    /// Queues the deletion of evicted tasks (records, events, outbox entries, push
    /// configurations).
    pub(crate) fn forget(&self, keys: Vec<Evicted>) {
        self.counters.queued.fetch_add(1, Relaxed);
        self.send(Job::Forget(keys));
    }

    /// A task's events numbered above `after`.
    pub(crate) fn events(&self, key: &TaskKey, after: u64) -> Result<Vec<TaskEvent>> {
        let Some(task) = self.indexes.tasks.get(key) else {
            return Ok(Vec::new());
        };
        self.disk
            .events(key, codec::created(&task), after, &task.history)
            .map_err(super::failed)
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
            commit_micros: self.counters.commit_micros.load(Relaxed),
            committed_writes: self.counters.committed.load(Relaxed),
            file_bytes: self.disk.bytes(),
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

/// How many times the request runtime's threads went idle (see [`runtime_parked`]).
pub(crate) static PARKS: AtomicU64 = AtomicU64::new(0);

/// Tells the embedded store's committer that a thread of the runtime serving requests is
/// about to park (idle): pass it to tokio's `Builder::on_thread_park`, as the `a2ad`
/// binary does. The committer compares the count before and after each commit: a commit
/// during which the request path ran out of work should have started earlier, and the
/// next one does (committer.rs, `next_yield_at`). Without it the committer starts a batch
/// only when the request path pauses, as before (docs/decisions/the-committer-paces-the-request-path.md).
/// One atomic increment; harmless with any store.
pub fn runtime_parked() {
    PARKS.fetch_add(1, Relaxed);
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::StoreConfig;
    use crate::model::{ContextId, Message, Role, TaskId, TaskSnapshot, TaskState, TaskStatus};
    use crate::store::codec::SCHEMA_VERSION;
    use crate::store::index::{PushIndex, TaskIndex};
    use redb::{Database, ReadableDatabase as _};
    use schema::{APP, EVENTS, META, OUTBOX, PUSH, TASKS, TURNS};

    /// A task finished with one turn ("hi", "echo: hi"), and a fresh directory for a file.
    struct Finished {
        dir: std::path::PathBuf,
        path: std::path::PathBuf,
        key: TaskKey,
        status: TaskStatus,
        task: TaskSnapshot,
    }

    fn finished(id: &str) -> Finished {
        let dir = std::env::temp_dir().join(format!("a2ad-schema-{}", uuid::Uuid::new_v4()));
        std::fs::create_dir_all(&dir).expect("dir");
        let key = TaskKey {
            principal: "alice".into(),
            agent: "echo".into(),
            task: TaskId::new(id),
        };
        let user = Arc::new(Message {
            role: Role::User,
            parts: vec![crate::model::Part::Text("hi".into())],
            message_id: "m1".into(),
            extensions: Default::default(),
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
            extensions: Default::default(),
            note: None,
        };
        Finished {
            path: dir.join("a2ad.redb"),
            dir,
            key,
            status,
            task,
        }
    }

    /// The META rows of a file written by an earlier schema.
    fn mark(w: &redb::WriteTransaction, schema: u32) {
        let mut meta = w.open_table(META).expect("meta");
        meta.insert(b"app".as_slice(), APP).expect("app");
        meta.insert(b"schema".as_slice(), schema.to_be_bytes().as_slice())
            .expect("schema");
    }

    /// The schema version a closed redb file carries.
    fn schema_of(path: &std::path::Path) -> u32 {
        let db = Database::open(path).expect("reopen");
        let read = db.begin_read().expect("read");
        let meta = read.open_table(META).expect("meta");
        let schema = meta
            .get(b"schema".as_slice())
            .expect("get")
            .expect("schema");
        u32::from_be_bytes(<[u8; 4]>::try_from(schema.value()).expect("4 bytes"))
    }

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
        let Finished {
            dir,
            path,
            key,
            status: _,
            task,
        } = finished("t-1");
        {
            // A file as schema 1 left it: a finished task with two events.
            let db = Database::create(&path).expect("create");
            let w = db.begin_write().expect("write");
            {
                mark(&w, 1);
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
                sealer: Default::default(),
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
            assert_eq!(schema_of(&path), SCHEMA_VERSION, "round {round}");
        }
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn a_schema_2_file_of_json_rows_reads_and_becomes_the_current_schema() {
        let Finished {
            dir,
            path,
            key,
            status,
            task,
        } = finished("t-2");
        let (user, reply) = (task.history[0].clone(), task.history[1].clone());
        let created = codec::created(&task);
        let turn = crate::store::TurnId {
            number: 1,
            since: 5,
        };
        {
            // A file as schema 2 left it: JSON rows.
            let db = Database::create(&path).expect("create");
            let w = db.begin_write().expect("write");
            {
                mark(&w, 2);
                w.open_table(TASKS)
                    .expect("tasks")
                    .insert(
                        codec::task_key(&key, created).as_slice(),
                        codec::json::task(&task, turn).as_slice(),
                    )
                    .expect("task");
                let mut events = w.open_table(EVENTS).expect("events");
                for (seq, state) in [(1u64, TaskState::Submitted), (2, TaskState::Completed)] {
                    let mut st = TaskStatus::new(state);
                    if state == TaskState::Completed {
                        st = status.clone();
                    }
                    events
                        .insert(
                            codec::event_key(&key, created, seq).as_slice(),
                            codec::json::event(&TaskEvent::status(seq, st)).as_slice(),
                        )
                        .expect("event");
                }
                w.open_table(TURNS)
                    .expect("turns")
                    .insert(
                        codec::turn_key(&"alice".into(), &ContextId::new("ctx"), turn).as_slice(),
                        codec::json::turn(&user, Some(&reply)).as_slice(),
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
        let (journal, recovered) =
            Journal::open(&config, Arc::new(Indexes::for_config(&config))).expect("opens");
        let mut recovered = recovered;
        assert_eq!(recovered.contexts.len(), 1);
        let (_, reply_back) = recovered.contexts[0].turns[0]
            .1
            .messages()
            .expect("the turn decodes");
        assert_eq!(reply_back.map(|r| &**r), Some(&*reply));
        let back = journal.indexes.tasks.get(&key).expect("the task came back");
        assert_eq!(back.status.state, TaskState::Completed);
        let events = journal.events(&key, 0).expect("events");
        assert_eq!(events.len(), 2);
        assert_eq!(events[1].status.message.as_deref(), Some(&*reply));
        journal.close(Duration::from_secs(30));
        drop(journal);
        assert_eq!(schema_of(&path), SCHEMA_VERSION);
        let _ = std::fs::remove_dir_all(&dir);
    }
}
