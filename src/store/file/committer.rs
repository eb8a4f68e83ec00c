//! The committer thread: batches of writes, one transaction and one fsync per batch, the
//! indexes and continuations after; retries (reopening the file) while the disk fails.

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::Ordering::Relaxed;
use std::sync::mpsc::{Receiver, RecvTimeoutError, TryRecvError};
use std::time::{Duration, Instant};

use redb::{DatabaseError, Durability, ReadableTable, WriteTransaction};

use super::load::delete_task;
use super::{Counters, EVENTS, FORGET_CHUNK, Handle, Job, OUTBOX, PUSH, TASKS, TURNS};
use crate::model::TaskKey;
use crate::store::codec;
use crate::store::index::{Evicted, Indexes};
use crate::store::{Committed, Delivery, Then, Write};

pub(super) struct Committer {
    pub(super) db: Handle,
    pub(super) path: PathBuf,
    pub(super) cache_bytes: usize,
    pub(super) indexes: Arc<Indexes>,
    pub(super) rx: Receiver<Job>,
    pub(super) counters: Arc<Counters>,
    pub(super) max_batch: usize,
    pub(super) quick_repair: bool,
    /// Evicted tasks whose rows are still to delete, in chunks between batches.
    pub(super) forget: Vec<Evicted>,
}

/// What one batch writes, collected before the transaction so repeated records of one
/// task are written once.
#[derive(Default)]
pub(super) struct Batch {
    pub(super) appends: Vec<(usize, Option<Then>)>,
    pub(super) writes: Vec<Write>,
    pub(super) writes_count: u64,
}

impl Committer {
    pub(super) fn run(mut self) {
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
    pub(super) fn commit(&mut self, batch: Batch) -> bool {
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
    pub(super) fn pause(&self, d: Duration) -> bool {
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
    pub(super) fn reopen(&self) -> std::result::Result<(), DatabaseError> {
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
    pub(super) fn write(
        &self,
        writes: &[Write],
    ) -> std::result::Result<Vec<(usize, Delivery)>, redb::Error> {
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
    pub(super) fn forget_chunk(&mut self) {
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
pub(super) fn begin_write(db: &Handle) -> std::result::Result<WriteTransaction, redb::Error> {
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
pub(super) struct Failure {
    pub(super) since: Instant,
    pub(super) logged: Instant,
    pub(super) last: String,
}

impl Failure {
    const EVERY: Duration = Duration::from_secs(30);

    pub(super) fn note(streak: &mut Option<Self>, error: &str, waiting: u64) {
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
