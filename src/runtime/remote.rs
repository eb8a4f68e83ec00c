//! Following a task that runs on another node (cluster): a follower reads the task's
//! events after its cursor from the shared store, sends them in order, and waits for a
//! wake-up (another node appended: a hint) or the safety poll. The cursor only moves
//! forward by one, so a follower can neither skip nor repeat an event; a lost hint costs
//! at most one poll interval.

use std::sync::Arc;
use std::sync::atomic::Ordering::Relaxed;
use std::time::Duration;

use tokio::sync::{mpsc, oneshot};

use crate::actors::Shared;
use crate::cluster::Watch;
use crate::model::{TaskKey, TaskSnapshot};
use crate::runtime::StreamItem;

/// The safety poll of a follower: how long it waits for a hint before reading anyway.
pub(crate) const POLL: Duration = Duration::from_millis(1000);

/// Where a follower's events go.
pub(crate) enum Sink {
    /// A stream: every event, until the one that ends the run.
    Stream(mpsc::Sender<StreamItem>),
    /// A caller waiting for the end of the run: the task as it ends it.
    Final(oneshot::Sender<TaskSnapshot>),
}

impl Sink {
    fn closed(&self) -> bool {
        match self {
            Self::Stream(tx) => tx.is_closed(),
            Self::Final(tx) => tx.is_closed(),
        }
    }
}

/// Spawns a follower of `key` from after event `cursor`.
pub(crate) fn spawn(shared: Arc<Shared>, key: TaskKey, cursor: u64, sink: Sink) {
    shared.metrics.remote_followers.fetch_add(1, Relaxed);
    tokio::spawn(async move {
        follow(&shared, &key, cursor, sink).await;
        shared.metrics.remote_followers.fetch_sub(1, Relaxed);
    });
}

async fn follow(shared: &Arc<Shared>, key: &TaskKey, mut cursor: u64, mut sink: Sink) {
    let watch = shared
        .cluster
        .as_ref()
        .map_or_else(Watch::none, |c| c.watch(key));
    let write_timeout = Duration::from_secs_f64(shared.config.server.write_timeout_seconds);
    loop {
        let notified = watch.notify().notified();
        tokio::pin!(notified);
        notified.as_mut().enable();
        let read = match &shared.cluster {
            Some(cluster) => cluster.read_after(key, cursor).await,
            None => return,
        };
        match read {
            Ok(Some((task, events))) => {
                for event in events {
                    if event.seq != cursor + 1 {
                        // Not the next one (a concurrent eviction?): read again.
                        break;
                    }
                    cursor = event.seq;
                    let ends = event.is_final();
                    match &mut sink {
                        Sink::Stream(tx) => {
                            let item = StreamItem {
                                event: Arc::new(event),
                                task: task.clone(),
                            };
                            // A client that stops reading is dropped like a slow local one.
                            match tokio::time::timeout(write_timeout, tx.send(item)).await {
                                Ok(Ok(())) => {}
                                _ => return,
                            }
                        }
                        Sink::Final(_) => {}
                    }
                    if ends {
                        if let Sink::Final(tx) = sink {
                            let _ = tx.send((*task).clone());
                        }
                        return;
                    }
                }
                if task.status.state.is_terminal() && cursor >= task.seq {
                    // Finished, and its final event was already sent (or evicted).
                    if let Sink::Final(tx) = sink {
                        let _ = tx.send((*task).clone());
                    }
                    return;
                }
            }
            // Gone (evicted): nothing more will come.
            Ok(None) => return,
            Err(_) => {}
        }
        if sink.closed() {
            return;
        }
        tokio::select! {
            () = &mut notified => {}
            () = tokio::time::sleep(POLL) => {}
        }
    }
}
