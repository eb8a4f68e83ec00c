//! The listener (`NOTIFY` → followers' wake-ups and fences) and the lease loop.

use std::sync::Arc;
use std::sync::atomic::Ordering::Relaxed;
use std::time::{Duration, Instant};

use tokio::sync::mpsc;
use uuid::Uuid;

use super::{Inner, PgStore, bounded, connect};
use crate::store::cluster::Signal;

pub(super) async fn listener(inner: Arc<Inner>) {
    let s = inner.schema.clone();
    let mut delay = Duration::from_millis(100);
    while !inner.stop.is_cancelled() {
        let (tx, mut rx) = mpsc::unbounded_channel();
        let client = match connect(&inner.pg, inner.tls.as_ref(), Some(tx)).await {
            Ok(c) => c,
            Err(e) => {
                tracing::warn!(error = %e, "postgres listener cannot connect; retrying");
                tokio::select! {
                    () = tokio::time::sleep(delay) => {}
                    () = inner.stop.cancelled() => return,
                }
                delay = (delay * 2).min(Duration::from_secs(2));
                continue;
            }
        };
        if bounded(client.batch_execute(&format!("LISTEN {s}_ev; LISTEN {s}_ctl;")))
            .await
            .is_err()
        {
            continue;
        }
        delay = Duration::from_millis(100);
        // Hints may have been missed while disconnected: every follower re-reads.
        inner.watchers.wake_all();
        loop {
            let note = tokio::select! {
                n = rx.recv() => n,
                () = inner.stop.cancelled() => return,
            };
            let Some(note) = note else {
                break;
            };
            if note.channel().ends_with("_ev") {
                for id in note.payload().split(',') {
                    if let Ok(id) = Uuid::parse_str(id)
                        && inner.watchers.wake(&id)
                    {
                        inner.hints.fetch_add(1, Relaxed);
                    }
                }
            } else if let Some(rest) = note.payload().strip_prefix("fence ") {
                let mut it = rest.split(' ');
                let (Some(runner), Some(task)) = (it.next(), it.next()) else {
                    continue;
                };
                let (Ok(runner), Ok(task)) = (Uuid::parse_str(runner), Uuid::parse_str(task))
                else {
                    continue;
                };
                if runner == inner.incarnation()
                    && let Some((_, owned)) = inner.owned.remove(&task)
                {
                    inner.fenced.fetch_add(1, Relaxed);
                    let _ = inner.signals.send(Signal::Fenced(owned.key)).await;
                }
            }
        }
        tracing::warn!("postgres listener connection lost; reconnecting");
    }
}

pub(super) async fn lease_loop(inner: Arc<Inner>) {
    let tick = Duration::from_millis(inner.cfg.heartbeat_ms);
    let ttl = inner.ttl();
    // The reaper acts on other nodes only once this node has held its lease without a
    // break for a whole TTL: after an engine outage, live nodes get to renew theirs first.
    let mut connected_since = Instant::now();
    let mut last_evict = Instant::now();
    let mut interval = tokio::time::interval(tick);
    interval.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let store = PgStore {
        inner: inner.clone(),
    };
    loop {
        tokio::select! {
            _ = interval.tick() => {}
            () = inner.stop.cancelled() => return,
        }
        match inner.heartbeat().await {
            Ok(()) => {
                *inner.lease_ok.lock().unwrap_or_else(|e| e.into_inner()) = Instant::now();
                if !inner.serving.swap(true, Relaxed) {
                    tracing::info!(node = %inner.node, "lease held again: serving");
                    connected_since = Instant::now();
                }
            }
            Err(e) => {
                tracing::warn!(error = %e, "heartbeat failed");
                connected_since = Instant::now();
                let since = inner
                    .lease_ok
                    .lock()
                    .unwrap_or_else(|e| e.into_inner())
                    .elapsed();
                if since >= ttl / 2 {
                    inner.self_fence().await;
                }
                continue;
            }
        }
        let others = connected_since.elapsed() >= ttl;
        // Deliveries first: a dead node's pending deliveries (a retry waiting for its time)
        // must be in their lanes before its tasks are taken up here and their next events
        // (e.g. `failed`, "node lost") plan deliveries of their own behind them.
        match store.claim(others).await {
            Ok(d) if !d.is_empty() => {
                if inner.signals.send(Signal::Deliver(d)).await.is_err() {
                    return;
                }
            }
            Ok(_) => {}
            Err(e) => tracing::warn!(error = %e, "claiming deliveries failed"),
        }
        match store.reap(others).await {
            Ok(tasks) => {
                for t in tasks {
                    if inner.signals.send(Signal::Adopted(t)).await.is_err() {
                        return;
                    }
                }
            }
            Err(e) => tracing::warn!(error = %e, "reaper failed"),
        }
        if last_evict.elapsed() >= Duration::from_secs(5).max(tick) {
            last_evict = Instant::now();
            if let Err(e) = inner.evict().await {
                tracing::warn!(error = %e, "eviction failed");
            }
        }
    }
}
