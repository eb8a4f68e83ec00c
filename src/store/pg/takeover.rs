//! Tasks and deliveries changing hands: adopting a task (a cancel elsewhere, a takeover),
//! the reaper of dead nodes' tasks, delivery claims, the heartbeat, eviction; and the
//! [`Cluster`] verbs this store offers the runtime.

use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use std::sync::atomic::Ordering::Relaxed;
use std::time::Duration;

use futures_util::future::{BoxFuture, FutureExt as _};
use tokio::sync::mpsc;
use uuid::Uuid;

use super::{
    EVICT_CHUNK, Inner, Job, Owned, PgStore, REAP_LIMIT, RETIRED, bounded, db, owner_id, row_id,
};
use crate::error::Result;
use crate::model::{TaskId, TaskKey};
use crate::push::StoredPushConfig;
use crate::store::cluster::{Cluster, ClusterStats, Followed, Signal, Watch};
use crate::store::codec;
use crate::store::{Delivery, Orphan, OutboxKey, RecoveredTask, Write, delivery_id};

impl Inner {
    /// Takes a task: fence + 1, this node its runner; tells the old runner. `None` when it
    /// is finished or gone.
    pub(super) async fn adopt(&self, key: &TaskKey, why: Orphan) -> Result<Option<RecoveredTask>> {
        let mut client = self.client().await?;
        let s = &self.schema;
        let me = self.incarnation();
        let tx = bounded(client.transaction()).await?;
        let row = bounded(tx.query_opt(
            &format!(
                "WITH old AS (SELECT runner FROM {s}.tasks WHERE id = $1 AND NOT terminal FOR UPDATE)
                 UPDATE {s}.tasks t SET fence = t.fence + 1, runner = $2, runner_node = $3
                 FROM old WHERE t.id = $1
                 RETURNING t.fence, old.runner"
            ),
            &[&row_id(key), &me, &self.node],
        ))
        .await?;
        let Some(row) = row else {
            return Ok(None);
        };
        let fence: i64 = row.get(0);
        let old: Option<Uuid> = row.get(1);
        if let Some(old) = old
            && old != me
        {
            bounded(tx.execute(
                "SELECT pg_notify($1, $2)",
                &[&format!("{s}_ctl"), &format!("fence {old} {}", row_id(key))],
            ))
            .await?;
        }
        bounded(tx.commit()).await?;
        drop(client);
        self.taken(key, fence, why).await
    }

    /// A task this node just took (under `fence`): read back with its events to be run
    /// here, its appends carrying the new fence from now on.
    pub(super) async fn taken(
        &self,
        key: &TaskKey,
        fence: i64,
        why: Orphan,
    ) -> Result<Option<RecoveredTask>> {
        let Some((task, turn, events)) = self.record_and_events(key, 0, None).await? else {
            return Ok(None);
        };
        self.owned.insert(
            row_id(key),
            Owned {
                key: key.clone(),
                fence,
            },
        );
        Ok(Some(RecoveredTask {
            key: key.clone(),
            task: Arc::new(task),
            events: events.into_iter().map(Arc::new).collect(),
            turn,
            why,
        }))
    }

    pub(super) async fn reap(&self, others: bool) -> Result<Vec<RecoveredTask>> {
        let client = self.client().await?;
        let s = &self.schema;
        let me = self.incarnation();
        let ttl = self.cfg.lease_ttl_ms as f64;
        // Candidates: unfinished tasks whose runner holds no fresh lease (its node died,
        // left, or restarted under a new incarnation). Each is then adopted on its own.
        let rows = bounded(client.query(
            &format!(
                "SELECT principal, agent, task, runner_node, runner FROM {s}.tasks
                 WHERE NOT terminal AND runner IS DISTINCT FROM $1
                   AND (runner_node = $2 OR $3)
                   AND (runner IS NULL OR runner NOT IN (SELECT incarnation FROM {s}.nodes
                        WHERE heartbeat_at > now() - $4 * interval '1 millisecond'))
                 LIMIT {REAP_LIMIT}"
            ),
            &[&me, &self.node, &others, &ttl],
        ))
        .await?;
        drop(client);
        let mut taken = Vec::new();
        for row in rows {
            let key = TaskKey {
                principal: row.get::<_, &str>(0).into(),
                agent: row.get::<_, &str>(1).into(),
                task: TaskId::new(row.get::<_, &str>(2)),
            };
            let old_node: Option<String> = row.get(3);
            let runner: Option<Uuid> = row.get(4);
            let retired = runner.is_some_and(|r| {
                self.retired
                    .lock()
                    .unwrap_or_else(|e| e.into_inner())
                    .contains(&r)
            });
            let why = if old_node.as_deref() == Some(self.node.as_str()) && !retired {
                Orphan::Restart
            } else {
                Orphan::NodeLost {
                    rerun: self.rerun_agents.contains(key.agent.as_str()),
                }
            };
            if let Some(t) = self.adopt_if_dead(&key, why, ttl).await? {
                self.takeovers.fetch_add(1, Relaxed);
                taken.push(t);
            }
        }
        Ok(taken)
    }

    /// Adopts a task only if its runner is still dead (another reaper may have been first).
    pub(super) async fn adopt_if_dead(
        &self,
        key: &TaskKey,
        why: Orphan,
        ttl: f64,
    ) -> Result<Option<RecoveredTask>> {
        let client = self.client().await?;
        let s = &self.schema;
        let still = bounded(client.query_opt(
            &format!(
                "SELECT 1 FROM {s}.tasks WHERE id = $1 AND NOT terminal
                   AND (runner IS NULL OR runner NOT IN (SELECT incarnation FROM {s}.nodes
                        WHERE heartbeat_at > now() - $2 * interval '1 millisecond'))
                 FOR UPDATE SKIP LOCKED"
            ),
            &[&row_id(key), &ttl],
        ))
        .await?;
        drop(client);
        if still.is_none() {
            return Ok(None);
        }
        // The check and the adoption are two statements: a reaper that lost the race finds
        // the runner alive (the winner) at the adoption's lock and backs off there.
        let mut client = self.client().await?;
        let me = self.incarnation();
        let tx = bounded(client.transaction()).await?;
        let row = bounded(tx.query_opt(
            &format!(
                "UPDATE {s}.tasks SET fence = fence + 1, runner = $2, runner_node = $3
                 WHERE id = $1 AND NOT terminal
                   AND (runner IS NULL OR runner NOT IN (SELECT incarnation FROM {s}.nodes
                        WHERE heartbeat_at > now() - $4 * interval '1 millisecond'))
                 RETURNING fence"
            ),
            &[&row_id(key), &me, &self.node, &ttl],
        ))
        .await?;
        bounded(tx.commit()).await?;
        drop(client);
        let Some(row) = row else {
            return Ok(None);
        };
        let fence: i64 = row.get(0);
        tracing::info!(task = %key.task, agent = %key.agent, fence, "took over a task of a lost node");
        self.taken(key, fence, why).await
    }

    pub(super) async fn claim(&self, others: bool) -> Result<Vec<Delivery>> {
        let client = self.client().await?;
        let s = &self.schema;
        let me = self.incarnation();
        let ttl = self.cfg.lease_ttl_ms as f64;
        // Whole lanes (task, configuration) whose claimant holds no fresh lease, and the
        // unclaimed rows of lanes no other live node holds (deliveries planned behind a
        // lane another node held: see `plan_deliveries`): the rows of one lane go to one
        // node, in order.
        let rows = bounded(client.query(
            &format!(
                "WITH live AS (SELECT incarnation FROM {s}.nodes
                               WHERE heartbeat_at > now() - $2 * interval '1 millisecond'),
                      lanes AS (SELECT DISTINCT o.task, o.config FROM {s}.outbox o
                               WHERE (o.claimed_by IS NULL OR o.claimed_by NOT IN (SELECT incarnation FROM live))
                                 AND ($3 OR o.claimed_by IS NULL OR o.claimed_node = $4)
                                 AND NOT EXISTS (SELECT 1 FROM {s}.outbox h
                                     WHERE h.task = o.task AND h.config = o.config AND h.claimed_by <> $1
                                       AND h.claimed_by IN (SELECT incarnation FROM live))
                               LIMIT {REAP_LIMIT})
                 UPDATE {s}.outbox o SET claimed_by = $1, claimed_node = $4 FROM lanes l
                 WHERE o.task = l.task AND o.config = l.config
                   AND (o.claimed_by IS NULL OR o.claimed_by NOT IN (SELECT incarnation FROM live))
                 RETURNING o.task, o.seq, o.config, o.attempt, o.due_us"
            ),
            &[&me, &ttl, &others, &self.node],
        ))
        .await?;
        if rows.is_empty() {
            return Ok(Vec::new());
        }
        drop(client);
        // By task: (seq, configuration, attempt, due).
        type Claimed = (u64, String, u32, Option<i64>);
        let mut by_task: HashMap<Uuid, Vec<Claimed>> = HashMap::new();
        for r in &rows {
            by_task.entry(r.get(0)).or_default().push((
                u64::try_from(r.get::<_, i64>(1)).unwrap_or(0),
                r.get(2),
                u32::try_from(r.get::<_, i32>(3)).unwrap_or(1),
                r.get(4),
            ));
        }
        // The claimed rows' tasks, each with only its claimed events, in one query; then
        // the push configurations of their owners, in one more (not three per task).
        let (ids, seqs): (Vec<Uuid>, Vec<i64>) = rows
            .iter()
            .map(|r| (r.get::<_, Uuid>(0), r.get::<_, i64>(1)))
            .unzip();
        let client = self.client().await?;
        let found = bounded(client.query(
            &format!(
                "SELECT t.principal, t.agent, t.task, t.record, t.id,
                   COALESCE(ev.seqs, '{{}}'), COALESCE(ev.bodies, '{{}}')
                 FROM {s}.tasks t
                 LEFT JOIN LATERAL (
                   SELECT array_agg(e.seq ORDER BY e.seq) AS seqs,
                          array_agg(e.body ORDER BY e.seq) AS bodies
                   FROM {s}.events e
                   JOIN unnest($1::uuid[], $2::bigint[]) AS w(task, seq)
                     ON e.task = w.task AND e.seq = w.seq
                   WHERE e.task = t.id) ev ON true
                 WHERE t.id = ANY($1)"
            ),
            &[&ids, &seqs],
        ))
        .await?;
        let mut tasks = HashMap::new();
        for row in &found {
            let Some((key, task, _)) = Self::decode_row(row) else {
                return Err(db("a task record does not decode"));
            };
            let events = Self::decode_events(row, 5, &task);
            tasks.insert(row.get::<_, Uuid>(4), (key, Arc::new(task), events));
        }
        let owners: Vec<Uuid> = tasks
            .values()
            .map(|(key, _, _)| owner_id(&key.principal, &key.agent))
            .collect::<HashSet<_>>()
            .into_iter()
            .collect();
        let mut configs: HashMap<Uuid, Vec<Arc<StoredPushConfig>>> = HashMap::new();
        for row in bounded(client.query(
            &format!("SELECT owner, body FROM {s}.push WHERE owner = ANY($1)"),
            &[&owners],
        ))
        .await?
        {
            if let Some(c) = codec::decode_push(row.get::<_, &[u8]>(1), &self.sealer) {
                configs.entry(row.get(0)).or_default().push(self.config(c));
            }
        }
        drop(client);
        let mut out = Vec::new();
        let mut gone = Vec::new();
        for (id, mut items) in by_task {
            items.sort_by_key(|i| i.0);
            let Some((key, task, events)) = tasks.get(&id) else {
                gone.push(id);
                continue;
            };
            let configs = configs
                .get(&owner_id(&key.principal, &key.agent))
                .map_or(&[][..], Vec::as_slice);
            for (seq, config_id, attempt, due) in items {
                let config = configs.iter().find(|c| {
                    c.id == config_id && c.scope.task.as_ref().is_none_or(|t| *t == key.task)
                });
                let event = events.iter().find(|e| e.seq == seq);
                let outbox = OutboxKey {
                    task: key.clone(),
                    created: task.created_at.timestamp_micros(),
                    seq,
                    config: config_id,
                };
                match (config, event) {
                    (Some(config), Some(event)) => out.push(Delivery {
                        id: delivery_id(&outbox),
                        key: outbox,
                        config: config.clone(),
                        event: Arc::new(event.clone()),
                        task: task.clone(),
                        attempt,
                        due: due.and_then(chrono::DateTime::from_timestamp_micros),
                    }),
                    // Its configuration was removed (or the event evicted): nothing to send.
                    _ => {
                        self.submit(Job {
                            writes: vec![Write::OutboxDone(outbox)],
                            then: None,
                        });
                    }
                }
            }
        }
        if !gone.is_empty() {
            let client = self.client().await?;
            bounded(client.execute(
                &format!("DELETE FROM {s}.outbox WHERE task = ANY($1)"),
                &[&gone],
            ))
            .await?;
        }
        self.claimed.fetch_add(out.len() as u64, Relaxed);
        Ok(out)
    }

    /// Renews the lease; registers a new incarnation when the row is no longer ours.
    pub(super) async fn heartbeat(&self) -> Result<()> {
        let client = self.client().await?;
        let s = &self.schema;
        let me = self.incarnation();
        let ttl = self.cfg.lease_ttl_ms as f64;
        if !self.serving.load(Relaxed) {
            // This incarnation self-fenced: it stopped its agents, so its tasks run nowhere.
            // It is over even though its lease may still look fresh: join again under a new
            // one, and the old one's tasks are taken up (here or elsewhere) as a lost
            // node's.
            {
                let mut retired = self.retired.lock().unwrap_or_else(|e| e.into_inner());
                if retired.len() == RETIRED {
                    retired.pop_front();
                }
                retired.push_back(me);
            }
            return self
                .rejoin(&client, "lease held again after a self-fence")
                .await;
        }
        let row = bounded(client.query_opt(
            &format!(
                "UPDATE {s}.nodes SET heartbeat_at = now() WHERE node = $1 AND incarnation = $2
                 RETURNING (SELECT count(*) FROM {s}.nodes WHERE heartbeat_at > now() - $3 * interval '1 millisecond')"
            ),
            &[&self.node, &me, &ttl],
        ))
        .await?;
        match row {
            Some(r) => {
                self.live_nodes
                    .store(u64::try_from(r.get::<_, i64>(0)).unwrap_or(0), Relaxed);
                Ok(())
            }
            None => {
                // The row is gone or another process took this node id: this incarnation
                // is over. Stop what runs here and join again under a new one.
                self.self_fence().await;
                self.rejoin(&client, "lease lost; joined again").await
            }
        }
    }

    /// Joins the cluster again under a fresh incarnation.
    async fn rejoin(&self, client: &deadpool_postgres::Object, why: &str) -> Result<()> {
        let s = &self.schema;
        let fresh = Uuid::new_v4();
        bounded(client.execute(
            &format!(
                "INSERT INTO {s}.nodes (node, incarnation, heartbeat_at, started_at)
                 VALUES ($1, $2, now(), now())
                 ON CONFLICT (node) DO UPDATE SET incarnation = EXCLUDED.incarnation,
                   heartbeat_at = now(), started_at = now()"
            ),
            &[&self.node, &fresh],
        ))
        .await?;
        *self.incarnation.lock().unwrap_or_else(|e| e.into_inner()) = fresh;
        tracing::warn!(node = %self.node, incarnation = %fresh, "{why}");
        Ok(())
    }

    /// Stops every agent here: its tasks are (or will be) taken over elsewhere.
    pub(super) async fn self_fence(&self) {
        if self.serving.swap(false, Relaxed) {
            self.self_fences.fetch_add(1, Relaxed);
            tracing::error!(node = %self.node, "cannot hold the lease: self-fenced (agents stopped, /healthz failing)");
            self.owned.clear();
            let _ = self.signals.send(Signal::SelfFenced).await;
        }
    }

    /// Evicts finished tasks past the retention (one node per tick).
    pub(super) async fn evict(&self) -> Result<()> {
        let mut client = self.client().await?;
        let s = &self.schema;
        let secs = self.retention.as_secs_f64();
        let tx = bounded(client.transaction()).await?;
        let leader: bool = bounded(tx.query_one(
            "SELECT pg_try_advisory_xact_lock(hashtext($1))",
            &[&format!("a2ad janitor {s}")],
        ))
        .await?
        .get(0);
        if leader {
            let gone = bounded(tx.query(
                &format!(
                    "WITH gone AS (DELETE FROM {s}.tasks WHERE id IN (SELECT id FROM {s}.tasks
                        WHERE terminal AND finished_at < now() - $1 * interval '1 second' LIMIT {EVICT_CHUNK})
                        RETURNING id, principal, agent, task),
                     e AS (DELETE FROM {s}.events WHERE task IN (SELECT id FROM gone)),
                     o AS (DELETE FROM {s}.outbox WHERE task IN (SELECT id FROM gone))
                     SELECT principal, agent, task FROM gone"
                ),
                &[&secs],
            ))
            .await?;
            if !gone.is_empty() {
                let owners: Vec<Uuid> = gone
                    .iter()
                    .map(|r| owner_id(&r.get::<_, &str>(0).into(), &r.get::<_, &str>(1).into()))
                    .collect();
                let tasks: Vec<&str> = gone.iter().map(|r| r.get::<_, &str>(2)).collect();
                bounded(tx.execute(
                    &format!(
                        "DELETE FROM {s}.push p USING unnest($1::uuid[], $2::text[]) AS g(owner, task)
                         WHERE p.owner = g.owner AND p.task = g.task"
                    ),
                    &[&owners, &tasks],
                ))
                .await?;
            }
            bounded(tx.execute(
                &format!(
                    "DELETE FROM {s}.turns WHERE (principal, context, since) IN (
                       SELECT principal, context, since FROM {s}.turns GROUP BY principal, context, since
                       HAVING max(at) < now() - $1 * interval '1 second' LIMIT {EVICT_CHUNK})"
                ),
                &[&secs],
            ))
            .await?;
        }
        let depth: i64 = bounded(tx.query_one(&format!("SELECT count(*) FROM {s}.outbox"), &[]))
            .await?
            .get(0);
        let finished: i64 = bounded(tx.query_one(
            &format!("SELECT count(*) FROM {s}.tasks WHERE terminal"),
            &[],
        ))
        .await?
        .get(0);
        bounded(tx.commit()).await?;
        self.outbox_depth
            .store(u64::try_from(depth).unwrap_or(0), Relaxed);
        self.finished_tasks
            .store(u64::try_from(finished).unwrap_or(0), Relaxed);
        Ok(())
    }
}

impl Cluster for PgStore {
    fn node_id(&self) -> &str {
        &self.inner.node
    }

    fn serving(&self) -> bool {
        self.inner.serving.load(Relaxed)
    }

    fn adopt(&self, key: &TaskKey) -> BoxFuture<'_, Result<Option<RecoveredTask>>> {
        let inner = self.inner.clone();
        let key = key.clone();
        self.run(async move { inner.adopt(&key, Orphan::Held).await })
    }

    fn read_after(
        &self,
        key: &TaskKey,
        after: u64,
        limit: usize,
    ) -> BoxFuture<'_, Result<Option<Followed>>> {
        let inner = self.inner.clone();
        let key = key.clone();
        self.run(async move {
            Ok(inner
                .record_and_events(&key, after, Some(limit))
                .await?
                .map(|(t, _, e)| (Arc::new(t), e)))
        })
    }

    fn watch(&self, key: &TaskKey) -> Watch {
        self.inner.watchers.watch(row_id(key))
    }

    fn signals(&self) -> Option<mpsc::Receiver<Signal>> {
        self.inner
            .signals_rx
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .take()
    }

    fn leave(&self) -> BoxFuture<'_, ()> {
        let inner = self.inner.clone();
        let me = self.incarnation();
        let fut = self.run(async move {
            inner.stop.cancel();
            let client = inner.client().await?;
            let s = &inner.schema;
            bounded(client.execute(
                &format!("UPDATE {s}.outbox SET claimed_by = NULL WHERE claimed_by = $1"),
                &[&me],
            ))
            .await?;
            bounded(client.execute(
                &format!("DELETE FROM {s}.nodes WHERE incarnation = $1"),
                &[&me],
            ))
            .await?;
            tracing::info!(node = %inner.node, "left the cluster");
            Ok(())
        });
        async move {
            if let Err(e) = fut.await {
                tracing::warn!(error = %e, "leaving the cluster failed; the lease will lapse");
            }
        }
        .boxed()
    }

    fn share(&self, mine: Vec<(String, i64)>) -> BoxFuture<'_, Result<HashMap<String, i64>>> {
        let inner = self.inner.clone();
        let me = self.incarnation();
        self.run(async move {
            let s = &inner.schema;
            let client = inner.client().await?;
            let (keys, counts): (Vec<String>, Vec<i64>) = mine.into_iter().unzip();
            bounded(client.execute(
                &format!(
                    "INSERT INTO {s}.usage (incarnation, key, n)
                     SELECT $1, k, n FROM unnest($2::text[], $3::bigint[]) AS u(k, n)
                     ON CONFLICT (incarnation, key) DO UPDATE SET n = EXCLUDED.n"
                ),
                &[&me, &keys, &counts],
            ))
            .await?;
            let rows = bounded(client.query(
                &format!(
                    "SELECT key, sum(n)::bigint FROM {s}.usage WHERE incarnation <> $1 GROUP BY key"
                ),
                &[&me],
            ))
            .await?;
            Ok(rows.iter().map(|r| (r.get(0), r.get(1))).collect())
        })
    }

    fn tick(&self) -> Duration {
        Duration::from_millis(self.inner.cfg.heartbeat_ms)
    }

    fn stats(&self) -> ClusterStats {
        let i = &self.inner;
        let mut recent: Vec<u32> = i
            .append_recent
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .iter()
            .copied()
            .collect();
        recent.sort_unstable();
        let pct = |p: f64| -> u64 {
            if recent.is_empty() {
                return 0;
            }
            let at = ((recent.len() - 1) as f64 * p).round() as usize;
            u64::from(recent[at.min(recent.len() - 1)])
        };
        ClusterStats {
            self_fences: i.self_fences.load(Relaxed),
            append_micros_p50: pct(0.50),
            append_micros_p99: pct(0.99),
            lease_age_ms: u64::try_from(
                i.lease_ok
                    .lock()
                    .unwrap_or_else(|e| e.into_inner())
                    .elapsed()
                    .as_millis(),
            )
            .unwrap_or(u64::MAX),
            live_nodes: i.live_nodes.load(Relaxed),
            takeovers: i.takeovers.load(Relaxed),
            fenced: i.fenced.load(Relaxed),
            claimed_deliveries: i.claimed.load(Relaxed),
            outbox_depth: i.outbox_depth.load(Relaxed),
            appends: i.commits.load(Relaxed),
            append_micros_sum: i.append_sum.load(Relaxed),
            append_micros_max: i.append_max.load(Relaxed),
            hints: i.hints.load(Relaxed),
            self_fenced: !i.serving.load(Relaxed),
        }
    }
}
