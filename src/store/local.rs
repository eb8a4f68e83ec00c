//! [`LocalStore`]: the embedded stores. Reads are served from in-memory indexes (task
//! records with their owner index, push configurations); with a file (`backend = "redb"`)
//! every write also goes to the file's committer, and a task record enters the index only
//! once its event is durable.

use std::sync::{Arc, Mutex};
use std::time::Instant;

use futures_util::future::{BoxFuture, FutureExt as _, ready};

use super::file::Journal;
use super::index::Indexes;
use super::{
    Committed, Durable, ListPage, ListQuery, Recovered, Store, StoreStats, Then, TurnId, Write,
};
use crate::config::{Config, StoreBackend};
use crate::error::Result;
use crate::model::{AgentId, Principal, TaskEvent, TaskKey, TaskSnapshot};
use crate::push::{PushScope, StoredPushConfig};

/// The embedded store: memory alone, or memory in front of a redb file.
pub(crate) struct LocalStore {
    indexes: Arc<Indexes>,
    journal: Option<Journal>,
    recovered: Mutex<Option<Recovered>>,
}

impl LocalStore {
    /// Opens the store the configuration names: for `redb`, opens (or creates) the file,
    /// checks its schema and loads it.
    ///
    /// # Errors
    /// [`crate::Error::Store`] when the file is locked by another process, unreadable, not
    /// an a2ad store, or from an incompatible version: never a silent fresh start.
    pub(crate) fn open(config: &Config) -> Result<Self> {
        let indexes = Arc::new(Indexes::for_config(config));
        let (journal, recovered) = match config.store.backend {
            StoreBackend::Memory => (None, Recovered::default()),
            StoreBackend::Redb | StoreBackend::Log => {
                let (journal, recovered) = Journal::open(config, indexes.clone())?;
                (Some(journal), recovered)
            }
        };
        Ok(Self {
            indexes,
            journal,
            recovered: Mutex::new(Some(recovered)),
        })
    }
}

fn done<T: Send + 'static>(value: T) -> BoxFuture<'static, Result<T>> {
    ready(Ok(value)).boxed()
}

impl Store for LocalStore {
    fn append(&self, writes: Vec<Write>, then: Option<Then>) -> Durable {
        self.indexes.apply_now(&writes);
        if let Some(journal) = &self.journal {
            journal.append(writes, then);
            return Durable::Later;
        }
        let mut committed = Committed::default();
        let mut writes = writes.into_iter().peekable();
        while let Some(w) = writes.next() {
            if let Write::Task {
                key,
                task,
                event,
                changed,
                ..
            } = w
            {
                committed
                    .deliveries
                    .extend(self.indexes.plan(&key, &task, &event, changed));
                // A turn appends its task's records together (submitted, working, the
                // answer): only the last is put, as the log's committer does; the others
                // would be replaced before any reader could tell.
                let replaced =
                    matches!(writes.peek(), Some(Write::Task { key: next, .. }) if *next == key);
                if !replaced {
                    self.indexes.put_task(&key, task, TurnId::default());
                }
            }
        }
        Durable::Now(committed)
    }

    fn task(&self, key: &TaskKey) -> BoxFuture<'_, Result<Option<Arc<TaskSnapshot>>>> {
        done(self.indexes.tasks.get(key))
    }

    fn task_now(&self, key: &TaskKey) -> Option<Arc<TaskSnapshot>> {
        self.indexes.tasks.get(key)
    }

    fn events(&self, key: &TaskKey, after: u64) -> BoxFuture<'_, Result<Vec<TaskEvent>>> {
        match &self.journal {
            Some(journal) => ready(journal.events(key, after)).boxed(),
            None => done(Vec::new()),
        }
    }

    fn list(&self, query: &ListQuery) -> BoxFuture<'_, Result<ListPage>> {
        done(self.indexes.tasks.list(query))
    }

    fn push_scope(
        &self,
        scope: &PushScope,
    ) -> BoxFuture<'_, Result<Option<Arc<StoredPushConfig>>>> {
        done(self.indexes.push.get_scope(scope))
    }

    fn push_by_id(
        &self,
        principal: &Principal,
        agent: &AgentId,
        id: &str,
    ) -> BoxFuture<'_, Result<Option<Arc<StoredPushConfig>>>> {
        done(self.indexes.push.get_id(principal, agent, id))
    }

    fn push_named(&self, task: &TaskKey) -> BoxFuture<'_, Result<Vec<Arc<StoredPushConfig>>>> {
        done(self.indexes.push.list_named(task))
    }

    fn push_reserve(&self, config: &Arc<StoredPushConfig>, max_per_task: usize) -> Result<()> {
        self.indexes.push.set(config.clone(), max_per_task)
    }

    fn commits_later(&self) -> bool {
        self.journal.is_some()
    }

    fn may_deliver(&self) -> bool {
        // Configurations are visible to planning once reserved (`push_reserve`).
        !self.indexes.push.is_empty()
    }

    fn recovered(&self) -> Recovered {
        self.recovered
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .take()
            .unwrap_or_default()
    }

    fn sweep(&self, now: Instant) {
        let evicted = self.indexes.tasks.evict(now);
        for gone in &evicted {
            self.indexes.push.remove_task(&gone.key);
        }
        if let Some(journal) = &self.journal
            && !evicted.is_empty()
        {
            journal.forget(evicted);
        }
    }

    fn stats(&self) -> StoreStats {
        let mut stats = self
            .journal
            .as_ref()
            .map(Journal::stats)
            .unwrap_or_default();
        stats.finished_tasks = self.indexes.tasks.len();
        stats.finished_bytes = self.indexes.tasks.bytes();
        stats
    }

    fn failing(&self) -> bool {
        self.journal.as_ref().is_some_and(Journal::failing)
    }

    fn backlog(&self) -> u64 {
        self.journal.as_ref().map_or(0, Journal::backlog)
    }

    fn close(&self, within: std::time::Duration) -> u64 {
        self.journal.as_ref().map_or(0, |j| j.close(within))
    }
}
