//! Following a task that runs on another node (cluster): a follower reads the task's
//! events after its cursor from the shared store, sends them in order, and waits for a
//! wake-up (another node appended: a hint) or the safety poll. The cursor only moves
//! forward by one, so a follower can neither skip nor repeat an event; a lost hint costs
//! at most one poll interval. A read takes at most [`PAGE`] events (a full page is
//! followed by the next read at once), and a node holds at most `cluster.max_followers`
//! followers: past it, new streams and waits on tasks of other nodes are refused as busy.

use std::sync::Arc;
use std::sync::atomic::Ordering::Relaxed;
use std::time::Duration;

use tokio::sync::{mpsc, oneshot};

use crate::actors::Shared;
use crate::error::{Error, Result};
use crate::model::{TaskKey, TaskSnapshot};
use crate::store::cluster::Watch;
use crate::stream::StreamItem;

/// The safety poll of a follower: how long it waits for a hint before reading anyway.
pub(crate) const POLL: Duration = Duration::from_millis(1000);

/// Events a follower reads at most at once.
pub(crate) const PAGE: usize = 256;

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

/// Spawns a follower of `key` from after event `cursor`, if this node holds fewer than
/// `cluster.max_followers`.
///
/// # Errors
/// [`Error::Busy`] when it holds that many.
pub(crate) fn try_spawn(shared: Arc<Shared>, key: TaskKey, cursor: u64, sink: Sink) -> Result<()> {
    let max = shared
        .config
        .cluster
        .as_ref()
        .map_or(usize::MAX, |c| c.max_followers);
    let held = shared.metrics.remote_followers.fetch_add(1, Relaxed);
    if usize::try_from(held).is_ok_and(|held| held >= max) {
        shared.metrics.remote_followers.fetch_sub(1, Relaxed);
        return Err(Error::Busy);
    }
    run(shared, key, cursor, sink);
    Ok(())
}

/// Spawns a follower of `key` from after event `cursor`, whatever the count: for the
/// subscribers a task actor hands over when another node takes its task (they were
/// admitted already).
pub(crate) fn spawn(shared: Arc<Shared>, key: TaskKey, cursor: u64, sink: Sink) {
    shared.metrics.remote_followers.fetch_add(1, Relaxed);
    run(shared, key, cursor, sink);
}

/// Runs a follower already counted in `remote_followers`.
fn run(shared: Arc<Shared>, key: TaskKey, cursor: u64, sink: Sink) {
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
    let write_timeout = shared.config.server.write_timeout();
    loop {
        let notified = watch.notify().notified();
        tokio::pin!(notified);
        notified.as_mut().enable();
        let read = match &shared.cluster {
            Some(cluster) => cluster.read_after(key, cursor, PAGE).await,
            None => return,
        };
        let mut more = false;
        match read {
            Ok(Some((task, events))) => {
                more = events.len() >= PAGE;
                for event in events {
                    if event.seq != cursor + 1 {
                        // Not the next one (a concurrent eviction?): read again.
                        more = false;
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
        if more {
            // A full page: the next one is read at once.
            continue;
        }
        tokio::select! {
            () = &mut notified => {}
            () = tokio::time::sleep(POLL) => {}
        }
    }
}
