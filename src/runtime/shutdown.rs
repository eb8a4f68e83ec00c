//! The graceful stop: no new work, queued tasks kept (or handed over), running ones
//! canceled, webhooks drained within the grace, the store closed.

use std::sync::atomic::Ordering::Relaxed;
use std::time::Duration;

use super::{Runtime, this_signals};
use crate::actors::task::TaskMsg;
use crate::config::StoreBackend;

impl Runtime {
    /// Stops taking work, cancels running tasks with reason `shutdown` (so their streams
    /// end with a final `canceled` event), waits up to `grace` for them to end and for
    /// pending webhooks to go out (what is left is logged with its delivery id and
    /// dropped), then stops the actors and closes the store (within what is left of the
    /// grace, at least one second). Returns the writes that never became durable: 0 unless
    /// the store was failing (a full disk, a lost database) when the grace ran out.
    pub async fn shutdown(&self, grace: Duration) -> u64 {
        self.shared.shutting_down.store(true, Relaxed);
        // A durable store keeps tasks that wait for input across the restart.
        let keep_waiting = self.shared.config.store.backend != StoreBackend::Memory
            || self.shared.cluster.is_some();
        // In a cluster, queued tasks are handed to the other nodes.
        let keep_queued = self.shared.cluster.is_some();
        // First no slot goes to a queued task any more: a slot the shutdown frees (by
        // ending a task that works) must not start one while the tasks are being told.
        for agent in self.agents.now().values() {
            agent.scheduler.close();
        }
        self.tell_live(|| TaskMsg::Shutdown {
            keep_waiting,
            keep_queued,
        });
        let deadline = tokio::time::Instant::now() + grace;
        // Ended means published too: a task in its finale has no actor any more, and leaves
        // the live index once its end is durable.
        while (self.shared.metrics.live_tasks.load(Relaxed) > 0 || !self.shared.live.is_empty())
            && tokio::time::Instant::now() < deadline
        {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        self.webhooks
            .drain(deadline.saturating_duration_since(tokio::time::Instant::now()))
            .await;
        self.supervisor.stop(None);
        self.shared.contexts.stop(None);
        let store = self.shared.store.clone();
        let within = deadline
            .saturating_duration_since(tokio::time::Instant::now())
            .max(Duration::from_secs(1));
        // Commits what is queued on a blocking thread, within the grace.
        let unwritten = tokio::task::spawn_blocking(move || store.close(within))
            .await
            .unwrap_or(0);
        if let Some(handle) = this_signals(self).take() {
            handle.abort();
        }
        if let Some(cluster) = &self.shared.cluster {
            // The other nodes take this node's queued tasks and pending deliveries now.
            cluster.leave().await;
        }
        unwritten
    }

    /// True once [`Runtime::shutdown`] began.
    pub fn is_shutting_down(&self) -> bool {
        self.shared.shutting_down.load(Relaxed)
    }
}
