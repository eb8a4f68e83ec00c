//! Storage behind small interfaces: finished-task records and push configurations.
//!
//! The in-memory implementations are the only ones today; a durable embedded store and a
//! shared store for several nodes plug in behind the same traits. Implementations must
//! never block for long: they are called from request handlers and actors (and
//! [`TaskStore::get`] under a live-index guard, see `actors::Runtime::submit`).

use std::collections::VecDeque;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use dashmap::DashMap;
use foldhash::fast::RandomState;

use crate::model::{AgentId, Principal, TaskKey, TaskSnapshot};
use crate::push::{PushScope, StoredPushConfig};

/// A finished task, kept until retention evicts it. Cheap to clone.
#[derive(Clone, Debug)]
pub struct FinishedTask {
    /// The task as it ended; `history[0]` is the user message that created it.
    pub snapshot: Arc<TaskSnapshot>,
}

impl FinishedTask {
    /// The `messageId` that created the task (for idempotent replays); empty when the
    /// record has no history (a task whose actor failed).
    pub fn message_id(&self) -> &str {
        self.snapshot
            .history
            .first()
            .map_or("", |m| m.message_id.as_str())
    }
}

/// Where finished tasks are kept.
pub trait TaskStore: Send + Sync + 'static {
    /// Stores a finished task (replacing any record under that key).
    fn insert(&self, key: TaskKey, task: FinishedTask);
    /// Looks a finished task up.
    fn get(&self, key: &TaskKey) -> Option<FinishedTask>;
    /// Evicts what is older than the retention or over the cap; returns how many went.
    fn evict(&self, now: Instant) -> usize;
    /// Records held.
    fn len(&self) -> usize;
    /// About how many bytes the records hold.
    fn bytes(&self) -> u64;
    /// True when no record is held.
    fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// Where push configurations are kept.
pub trait PushStore: Send + Sync + 'static {
    /// Stores a configuration, replacing the one of the same scope.
    fn set(&self, config: Arc<StoredPushConfig>);
    /// Removes the configuration of exactly this scope.
    fn remove(&self, scope: &PushScope);
    /// The configuration of exactly this scope.
    fn get_scope(&self, scope: &PushScope) -> Option<Arc<StoredPushConfig>>;
    /// A configuration of this principal and agent by id.
    fn get_id(
        &self,
        principal: &Principal,
        agent: &AgentId,
        id: &str,
    ) -> Option<Arc<StoredPushConfig>>;
    /// The configurations that apply to a task: its own and the agent-wide one.
    fn for_task(&self, key: &TaskKey) -> Vec<Arc<StoredPushConfig>>;
    /// True when no configuration is stored at all (the hot path skips webhooks then).
    fn is_empty(&self) -> bool;
}

/// Finished tasks in memory, evicted oldest first.
///
/// Retention is the same for every record, so insertion order is expiry order: a FIFO of
/// keys makes eviction cost what it evicts, never a scan of the whole map. Besides the
/// age, a count cap and a byte budget bound what is kept; both are enforced as records
/// arrive, so no burst can hold more than the budget until the next sweep.
pub struct MemoryTaskStore {
    records: DashMap<TaskKey, FinishedTask, RandomState>,
    /// Keys in insertion order with their expiry and size, plus the bytes held. Guarded by
    /// a std mutex: pushes and pops are short and never await.
    order: Mutex<Order>,
    retention: Duration,
    max_records: usize,
    max_bytes: u64,
}

#[derive(Default)]
struct Order {
    queue: VecDeque<(Instant, TaskKey)>,
    bytes: u64,
}

impl MemoryTaskStore {
    /// A store keeping records for `retention`, at most `max_records` of them and at most
    /// about `max_bytes` bytes of them.
    pub fn new(retention: Duration, max_records: usize, max_bytes: u64) -> Self {
        Self {
            records: DashMap::default(),
            order: Mutex::new(Order::default()),
            retention,
            max_records,
            max_bytes,
        }
    }

    /// About how many bytes the retained records hold.
    pub fn bytes(&self) -> u64 {
        self.lock().bytes
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Order> {
        self.order.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Evicts from the front while `expired` says so or a cap is exceeded.
    fn evict_while(&self, expired: impl Fn(&Instant) -> bool) -> usize {
        let mut evicted = 0;
        loop {
            let key = {
                let mut order = self.lock();
                let over = order.queue.len() > self.max_records || order.bytes > self.max_bytes;
                match order.queue.front() {
                    Some((expires, _)) if over || expired(expires) => {
                        order.queue.pop_front().map(|(_, k)| k)
                    }
                    _ => None,
                }
            };
            let Some(key) = key else { break };
            if let Some((_, gone)) = self.records.remove(&key) {
                let size = gone.snapshot.approx_bytes() as u64;
                let mut order = self.lock();
                order.bytes = order.bytes.saturating_sub(size);
                evicted += 1;
            }
        }
        evicted
    }
}

impl TaskStore for MemoryTaskStore {
    fn insert(&self, key: TaskKey, task: FinishedTask) {
        let expires = Instant::now() + self.retention;
        let size = task.snapshot.approx_bytes() as u64;
        let replaced = self.records.insert(key.clone(), task);
        let over = {
            let mut order = self.lock();
            order.bytes += size;
            if let Some(old) = replaced {
                order.bytes = order
                    .bytes
                    .saturating_sub(old.snapshot.approx_bytes() as u64);
            }
            order.queue.push_back((expires, key));
            order.queue.len() > self.max_records || order.bytes > self.max_bytes
        };
        if over {
            self.evict_while(|_| false);
        }
    }

    fn get(&self, key: &TaskKey) -> Option<FinishedTask> {
        self.records.get(key).map(|r| r.value().clone())
    }

    fn evict(&self, now: Instant) -> usize {
        let evicted = self.evict_while(|expires| *expires <= now);
        if evicted > 0 {
            let mut order = self.lock();
            if order.queue.capacity() > 1024 && order.queue.len() < order.queue.capacity() / 4 {
                order.queue.shrink_to_fit();
            }
            drop(order);
            if self.records.capacity() > 1024 && self.records.len() < self.records.capacity() / 4 {
                self.records.shrink_to_fit();
            }
        }
        evicted
    }

    fn len(&self) -> usize {
        self.records.len()
    }

    fn bytes(&self) -> u64 {
        MemoryTaskStore::bytes(self)
    }
}

/// Push configurations in memory.
#[derive(Default)]
pub struct MemoryPushStore {
    by_scope: DashMap<PushScope, Arc<StoredPushConfig>, RandomState>,
}

impl PushStore for MemoryPushStore {
    fn set(&self, config: Arc<StoredPushConfig>) {
        self.by_scope.insert(config.scope.clone(), config);
    }

    fn remove(&self, scope: &PushScope) {
        self.by_scope.remove(scope);
    }

    fn get_scope(&self, scope: &PushScope) -> Option<Arc<StoredPushConfig>> {
        self.by_scope.get(scope).map(|c| c.value().clone())
    }

    fn get_id(
        &self,
        principal: &Principal,
        agent: &AgentId,
        id: &str,
    ) -> Option<Arc<StoredPushConfig>> {
        self.by_scope
            .iter()
            .find(|c| c.id == id && &c.scope.principal == principal && &c.scope.agent == agent)
            .map(|c| c.value().clone())
    }

    fn is_empty(&self) -> bool {
        self.by_scope.is_empty()
    }

    fn for_task(&self, key: &TaskKey) -> Vec<Arc<StoredPushConfig>> {
        let mut scope = PushScope {
            principal: key.principal.clone(),
            agent: key.agent.clone(),
            task: Some(key.task.clone()),
        };
        let own = self.get_scope(&scope);
        scope.task = None;
        let wide = self.get_scope(&scope);
        own.into_iter().chain(wide).collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::{ContextId, TaskId, TaskState, TaskStatus};

    fn key(n: usize) -> TaskKey {
        TaskKey {
            principal: "p".into(),
            agent: "a".into(),
            task: TaskId::new(n.to_string()),
        }
    }

    fn record() -> FinishedTask {
        let now = chrono::Utc::now();
        FinishedTask {
            snapshot: Arc::new(TaskSnapshot {
                id: "t".into(),
                context_id: ContextId::new("c"),
                status: TaskStatus::new(TaskState::Completed),
                seq: 3,
                created_at: now,
                updated_at: now,
                history: vec![],
                metadata: None,
            }),
        }
    }

    #[test]
    fn records_expire_after_retention_in_insertion_order() {
        let s = MemoryTaskStore::new(Duration::from_secs(10), 100, u64::MAX);
        let t0 = Instant::now();
        s.insert(key(1), record());
        s.insert(key(2), record());
        assert_eq!(s.evict(t0), 0);
        assert_eq!(s.len(), 2);
        assert_eq!(s.evict(t0 + Duration::from_secs(11)), 2);
        assert!(s.get(&key(1)).is_none());
    }

    #[test]
    fn the_cap_evicts_the_oldest_first() {
        let s = MemoryTaskStore::new(Duration::from_secs(1000), 2, u64::MAX);
        for n in 0..5 {
            s.insert(key(n), record());
        }
        assert_eq!(s.len(), 2, "the cap holds as records arrive");
        assert!(s.get(&key(2)).is_none());
        assert!(s.get(&key(3)).is_some() && s.get(&key(4)).is_some());
    }

    #[test]
    fn the_byte_budget_evicts_the_oldest_as_records_arrive() {
        let one = record().snapshot.approx_bytes() as u64;
        let s = MemoryTaskStore::new(Duration::from_secs(1000), 1000, one * 3);
        for n in 0..10 {
            s.insert(key(n), record());
        }
        assert_eq!(s.len(), 3);
        assert!(s.bytes() <= one * 3);
        assert!(s.get(&key(9)).is_some() && s.get(&key(6)).is_none());
    }
}
