//! Several nodes as one service: the seam between the runtime and a shared engine.
//!
//! A node alone (no `[cluster]`) has no [`Cluster`]: everything it keeps is its own. With
//! `[cluster] engine = "postgres"`, the store is shared (`store::pg`) and the same object
//! is this node's [`Cluster`]: it holds the node's lease, takes over the tasks of nodes that
//! died (the reaper), claims their webhook deliveries, wakes followers of tasks that run on
//! other nodes, and tells the runtime when one of its own tasks was taken from it. The
//! runtime only calls these verbs; it never speaks SQL. See docs/CLUSTER.md.

use std::sync::Arc;

use dashmap::DashMap;
use futures_util::future::BoxFuture;
use tokio::sync::{Notify, mpsc};

use crate::error::Result;
use crate::model::{TaskEvent, TaskKey, TaskSnapshot};
use crate::store::{Delivery, RecoveredTask};

/// Cluster coordination, implemented by a shared store.
pub(crate) trait Cluster: Send + Sync + 'static {
    /// This node's name.
    fn node_id(&self) -> &str;

    /// This node holds its lease: it may take traffic (`/healthz`). False while it cannot
    /// reach the engine for half a lease (it has stopped its agents: self-fenced).
    fn serving(&self) -> bool;

    /// Takes a task that is not finished from whichever node runs it (or ran it): moves
    /// its fence on, so that node's appends fail from now on, makes this node its runner
    /// and tells the old runner to let go. `None` when the task is finished (or gone).
    fn adopt(&self, key: &TaskKey) -> BoxFuture<'_, Result<Option<RecoveredTask>>>;

    /// A task's record and at most `limit` of its events after `after`, read together (a
    /// follower's read). `None` when the task is gone.
    fn read_after(
        &self,
        key: &TaskKey,
        after: u64,
        limit: usize,
    ) -> BoxFuture<'_, Result<Option<Followed>>>;

    /// A wake-up for a follower of `key`: notified when another node appended to it (a
    /// hint; the follower re-reads the events after its cursor).
    fn watch(&self, key: &TaskKey) -> Watch;

    /// What the cluster asks of this node. Taken once, by the runtime.
    fn signals(&self) -> Option<mpsc::Receiver<Signal>>;

    /// Shares this node's cumulative counters (by name) and returns the sums of every
    /// other node's (live or gone: counters only grow). How often: [`Cluster::tick`].
    fn share(
        &self,
        mine: Vec<(String, i64)>,
    ) -> BoxFuture<'_, Result<std::collections::HashMap<String, i64>>>;

    /// The heartbeat: how often counters are shared.
    fn tick(&self) -> std::time::Duration;

    /// Graceful exit: gives up this node's lease and its claims on deliveries, so the
    /// other nodes take its queued tasks and pending deliveries at once.
    fn leave(&self) -> BoxFuture<'_, ()>;

    /// Counters for `/metrics`.
    fn stats(&self) -> ClusterStats;
}

/// A task as it stands and its events after a cursor.
pub(crate) type Followed = (Arc<TaskSnapshot>, Vec<TaskEvent>);

/// What the cluster asks of the runtime.
pub(crate) enum Signal {
    /// Another node took this task (a cancel or a continuing message arrived there, or
    /// this node's lease lapsed): stop its agent here; its followers follow from the store.
    Fenced(TaskKey),
    /// This node took over a task of a node that died (or of its own previous run).
    Adopted(RecoveredTask),
    /// Deliveries this node claimed (a dead node's, or released by one that left).
    Deliver(Vec<Delivery>),
    /// This node lost the engine for half a lease: stop every agent (the tasks will be
    /// taken over elsewhere).
    SelfFenced,
}

/// Cluster counters.
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct ClusterStats {
    /// Milliseconds since this node last renewed its lease.
    pub lease_age_ms: u64,
    /// Nodes with a fresh lease, this one included.
    pub live_nodes: u64,
    /// Tasks this node took over from dead nodes.
    pub takeovers: u64,
    /// Times this node self-fenced (each time it joined again under a new incarnation).
    pub self_fences: u64,
    /// Tasks taken from this node by others (fenced here).
    pub fenced: u64,
    /// Deliveries this node claimed from others.
    pub claimed_deliveries: u64,
    /// Deliveries waiting in the shared outbox (all nodes).
    pub outbox_depth: u64,
    /// Appends committed to the engine.
    pub appends: u64,
    /// Sum of append latencies (µs) and the slowest one seen, for an average.
    pub append_micros_sum: u64,
    /// The slowest append (µs) since start.
    pub append_micros_max: u64,
    /// Median and 99th percentile of the latest 4096 batches' commit times (µs).
    pub append_micros_p50: u64,
    /// See `append_micros_p50`.
    pub append_micros_p99: u64,
    /// Cross-node follower wake-ups received.
    pub hints: u64,
    /// This node is self-fenced.
    pub self_fenced: bool,
}

/// Followers waiting for hints, by task.
#[derive(Default)]
pub(crate) struct Watchers {
    map: DashMap<uuid::Uuid, (Arc<Notify>, usize)>,
}

impl Watchers {
    pub(crate) fn watch(self: &Arc<Self>, id: uuid::Uuid) -> Watch {
        let notify = {
            let mut entry = self.map.entry(id).or_insert_with(|| (Arc::default(), 0));
            entry.1 += 1;
            entry.0.clone()
        };
        Watch {
            watchers: Some(self.clone()),
            id,
            notify,
        }
    }

    /// Wakes the followers of a task.
    pub(crate) fn wake(&self, id: &uuid::Uuid) -> bool {
        match self.map.get(id) {
            Some(e) => {
                e.0.notify_waiters();
                true
            }
            None => false,
        }
    }

    /// Wakes every follower (after a lost connection: hints may have been missed).
    pub(crate) fn wake_all(&self) {
        for e in &self.map {
            e.0.notify_waiters();
        }
    }
}

/// A follower's wake-up; dropping it unregisters.
pub(crate) struct Watch {
    watchers: Option<Arc<Watchers>>,
    id: uuid::Uuid,
    notify: Arc<Notify>,
}

impl Watch {
    /// A wake-up that is never notified (a node alone: nothing appends elsewhere).
    pub(crate) fn none() -> Self {
        Self {
            watchers: None,
            id: uuid::Uuid::nil(),
            notify: Arc::default(),
        }
    }

    /// The notifier (enable a `notified()` before reading, then await it).
    pub(crate) fn notify(&self) -> &Notify {
        &self.notify
    }
}

impl Drop for Watch {
    fn drop(&mut self) {
        if let Some(w) = &self.watchers {
            w.map.remove_if_mut(&self.id, |_, e| {
                e.1 -= 1;
                e.1 == 0
            });
        }
    }
}
