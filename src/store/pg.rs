//! The shared store: everything a2ad keeps, in PostgreSQL, for several nodes acting as one
//! service (`[cluster] engine = "postgres"`). The same object is the node's
//! [`Cluster`]: its lease, the reaper, delivery claims and cross-node wake-ups.
//!
//! - **Appends** go to a committer task with its own connection: each batch is one
//!   transaction, one statement per task event (record, event row and outbox rows together,
//!   checked against the task's fence), one `NOTIFY` with the tasks it touched. A task's
//!   first event creates its row (fence 1, this node its runner); every later one must
//!   carry the fence this node holds, so a node whose task was taken (a cancel elsewhere,
//!   a takeover) cannot append to it any more: its append is *fenced*, acknowledged to
//!   nobody, and the runtime told to stop the task here.
//! - **Reads** use a pool; every read is bounded by [`QUERY_TIMEOUT`].
//! - **The lease loop** (every `heartbeat_ms`) renews this node's lease, self-fences after
//!   half a lease without the engine, takes over the unfinished tasks of dead nodes
//!   (`FOR UPDATE SKIP LOCKED`, fence + 1), claims their pending deliveries lane by lane,
//!   and evicts what outlived the retention (one node per tick, by advisory lock).
//! - **The listener** (its own connection) turns `NOTIFY`s into wake-ups for followers of
//!   tasks that run elsewhere, and into fences for tasks taken from this node.
//!
//! Tables and statements are in docs/CLUSTER.md.

use std::collections::{HashMap, HashSet};
use std::future::Future;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::Relaxed};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use dashmap::DashMap;
use futures_util::future::{BoxFuture, FutureExt as _, try_join_all};
use tokio::sync::mpsc;
use tokio_postgres::{AsyncMessage, NoTls, Row};
use uuid::Uuid;

use super::cluster::{Cluster, ClusterStats, Followed, Signal, Watch, Watchers};
use super::codec;
use super::{
    Committed, Delivery, Durable, ListPage, ListQuery, Orphan, OutboxKey, PageToken, Recovered,
    RecoveredTask, Store, StoreStats, Then, TurnId, Write, delivery_id,
};
use crate::config::{ClusterConfig, Config, NodeLoss};
use crate::error::{Error, Result};
use crate::model::{AgentId, Principal, TaskEvent, TaskId, TaskKey, TaskSnapshot};
use crate::push::{Namespace, PushScope, StoredPushConfig};

/// The schema version this build writes.
pub(crate) const SCHEMA_VERSION: i32 = 1;
/// Bound on every read and every cross-node operation.
const QUERY_TIMEOUT: Duration = Duration::from_secs(5);
/// Bound on one batch's transaction.
const COMMIT_TIMEOUT: Duration = Duration::from_secs(10);
/// Bound on connecting.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(3);
/// Tasks taken over, and delivery lanes claimed, per tick at most.
const REAP_LIMIT: i64 = 200;
/// Finished tasks evicted per statement.
const EVICT_CHUNK: i64 = 2000;
/// A `NOTIFY` payload is kept under PostgreSQL's 8000-byte limit.
const NOTIFY_MAX: usize = 7900;
/// Committers (each with its own connection), side by side.
const LANES: usize = 4;
/// Commit times kept for the append percentiles.
const RECENT: usize = 4096;
/// Signals queued for the runtime at most (the lease loop waits when it is full).
const SIGNALS: usize = 4096;

/// What this node runs, by task: the fence its appends carry.
struct Owned {
    key: TaskKey,
    fence: i64,
}

struct Job {
    writes: Vec<Write>,
    then: Option<Then>,
}

enum Msg {
    Job(Job),
    Close(std::sync::mpsc::Sender<()>),
}

struct Inner {
    cfg: ClusterConfig,
    schema: String,
    node: String,
    incarnation: Mutex<Uuid>,
    pg: tokio_postgres::Config,
    pool: deadpool_postgres::Pool,
    rt: tokio::runtime::Handle,
    /// One committer per lane; a task's writes always go to the same lane (by its id),
    /// so they stay in order, and the lanes commit side by side.
    jobs: Vec<mpsc::UnboundedSender<Msg>>,
    owned: DashMap<Uuid, Owned>,
    watchers: Arc<Watchers>,
    /// Push configurations as this node last decoded them, by id: deliveries of one
    /// configuration share one object, so its bookkeeping (failures in a row, `active`)
    /// accumulates here as on a node alone.
    configs: DashMap<String, Arc<StoredPushConfig>>,
    signals: mpsc::Sender<Signal>,
    signals_rx: Mutex<Option<mpsc::Receiver<Signal>>>,
    retention: Duration,
    rerun_agents: HashSet<String>,
    // Counters.
    backlog: AtomicU64,
    commits: AtomicU64,
    committed_writes: AtomicU64,
    failing: AtomicBool,
    serving: AtomicBool,
    lease_ok: Mutex<Instant>,
    takeovers: AtomicU64,
    fenced: AtomicU64,
    claimed: AtomicU64,
    outbox_depth: AtomicU64,
    live_nodes: AtomicU64,
    finished_tasks: AtomicU64,
    append_sum: AtomicU64,
    append_max: AtomicU64,
    /// The latest batches' commit times (µs), for percentiles.
    append_recent: Mutex<std::collections::VecDeque<u32>>,
    hints: AtomicU64,
    stop: tokio_util::sync::CancellationToken,
}

/// The PostgreSQL store and cluster member.
#[derive(Clone)]
pub(crate) struct PgStore {
    inner: Arc<Inner>,
}

/// A task's row id: the same on every node for the same (principal, agent, task).
pub(crate) fn row_id(key: &TaskKey) -> Uuid {
    const NS: Uuid = Uuid::from_u128(0x5b1e_2a2d_9c1e_4e0b_8a6f_a2ad_0000_0010);
    Uuid::new_v5(
        &NS,
        &parts(&[
            key.principal.as_str(),
            key.agent.as_str(),
            key.task.as_str(),
        ]),
    )
}

/// An owner's id (principal, agent): push configurations are filed under it.
fn owner_id(principal: &Principal, agent: &AgentId) -> Uuid {
    const NS: Uuid = Uuid::from_u128(0x5b1e_2a2d_9c1e_4e0b_8a6f_a2ad_0000_0011);
    Uuid::new_v5(&NS, &parts(&[principal.as_str(), agent.as_str()]))
}

fn parts(items: &[&str]) -> Vec<u8> {
    let mut seed = Vec::with_capacity(64);
    for part in items {
        seed.extend_from_slice(&(part.len() as u32).to_be_bytes());
        seed.extend_from_slice(part.as_bytes());
    }
    seed
}

/// The URL with its password masked (for messages).
fn masked(url: &str) -> String {
    match url::Url::parse(url) {
        Ok(mut u) if u.password().is_some() => {
            let _ = u.set_password(Some("***"));
            u.to_string()
        }
        Ok(u) => u.to_string(),
        Err(_) => "the configured PostgreSQL".into(),
    }
}

fn open_error(cfg: &ClusterConfig, message: impl Into<String>) -> Error {
    Error::Store {
        path: masked(&cfg.url),
        message: message.into(),
    }
}

fn db(e: impl std::fmt::Display) -> Error {
    super::failed(format!("postgres: {e}"))
}

async fn bounded<T>(
    f: impl Future<Output = std::result::Result<T, tokio_postgres::Error>>,
) -> Result<T> {
    match tokio::time::timeout(QUERY_TIMEOUT, f).await {
        Ok(Ok(v)) => Ok(v),
        Ok(Err(e)) => Err(db(e)),
        Err(_) => Err(db("timed out")),
    }
}

/// Connects one dedicated connection, its driver spawned; notifications (if any) go to
/// `notes`.
async fn connect(
    pg: &tokio_postgres::Config,
    notes: Option<mpsc::UnboundedSender<tokio_postgres::Notification>>,
) -> std::result::Result<tokio_postgres::Client, String> {
    let (client, mut conn) = tokio::time::timeout(CONNECT_TIMEOUT, pg.connect(NoTls))
        .await
        .map_err(|_| "connecting timed out".to_string())?
        .map_err(|e| e.to_string())?;
    tokio::spawn(async move {
        let mut messages = futures_util::stream::poll_fn(move |cx| conn.poll_message(cx));
        use futures_util::StreamExt as _;
        while let Some(m) = messages.next().await {
            match m {
                Ok(AsyncMessage::Notification(n)) => {
                    if let Some(tx) = &notes {
                        let _ = tx.send(n);
                    }
                }
                Ok(_) => {}
                Err(e) => {
                    tracing::debug!(error = %e, "postgres connection ended");
                    break;
                }
            }
        }
    });
    Ok(client)
}

// === The schema ===

fn schema_sql(s: &str) -> String {
    format!(
        r#"
CREATE TABLE IF NOT EXISTS {s}.nodes (
  node text PRIMARY KEY, incarnation uuid NOT NULL, heartbeat_at timestamptz NOT NULL,
  started_at timestamptz NOT NULL);
CREATE TABLE IF NOT EXISTS {s}.tasks (
  id uuid PRIMARY KEY, principal text NOT NULL, agent text NOT NULL,
  task text COLLATE "C" NOT NULL, context text NOT NULL, state text NOT NULL,
  terminal boolean NOT NULL, seq bigint NOT NULL, fence bigint NOT NULL, runner uuid,
  runner_node text, status_us bigint NOT NULL, finished_at timestamptz, record bytea NOT NULL);
CREATE INDEX IF NOT EXISTS tasks_owner ON {s}.tasks (principal, agent, status_us DESC, task DESC);
CREATE INDEX IF NOT EXISTS tasks_running ON {s}.tasks (runner) WHERE NOT terminal;
CREATE INDEX IF NOT EXISTS tasks_finished ON {s}.tasks (finished_at) WHERE terminal;
CREATE TABLE IF NOT EXISTS {s}.events (
  task uuid NOT NULL, seq bigint NOT NULL, body bytea NOT NULL, PRIMARY KEY (task, seq));
CREATE TABLE IF NOT EXISTS {s}.push (
  owner uuid NOT NULL, task text, named boolean NOT NULL, id text NOT NULL,
  created_us bigint NOT NULL, body bytea NOT NULL);
CREATE INDEX IF NOT EXISTS push_owner ON {s}.push (owner, task);
CREATE UNIQUE INDEX IF NOT EXISTS push_named ON {s}.push (owner, task, id) WHERE named;
CREATE TABLE IF NOT EXISTS {s}.outbox (
  delivery uuid PRIMARY KEY, task uuid NOT NULL, seq bigint NOT NULL, config text NOT NULL,
  attempt int NOT NULL, due_us bigint, claimed_by uuid, claimed_node text);
CREATE INDEX IF NOT EXISTS outbox_lane ON {s}.outbox (task, config, seq);
CREATE INDEX IF NOT EXISTS outbox_claim ON {s}.outbox (claimed_by);
CREATE UNLOGGED TABLE IF NOT EXISTS {s}.usage (
  incarnation uuid NOT NULL, key text NOT NULL, n bigint NOT NULL, PRIMARY KEY (incarnation, key));
CREATE TABLE IF NOT EXISTS {s}.turns (
  principal text NOT NULL, context text NOT NULL, since bigint NOT NULL, number int NOT NULL,
  at timestamptz NOT NULL DEFAULT now(), body bytea NOT NULL,
  PRIMARY KEY (principal, context, since, number));
"#
    )
}

/// Creates or checks the schema, under an advisory lock so nodes starting together take
/// turns. Refuses a schema written by a newer a2ad.
async fn migrate(client: &tokio_postgres::Client, cfg: &ClusterConfig) -> Result<()> {
    let s = &cfg.schema;
    let lock = format!("a2ad schema {s}");
    let run = async {
        client
            .execute("SELECT pg_advisory_lock(hashtext($1))", &[&lock])
            .await?;
        let result = async {
            client
                .batch_execute(&format!(
                    "CREATE SCHEMA IF NOT EXISTS {s};
                     CREATE TABLE IF NOT EXISTS {s}.meta (id int PRIMARY KEY, version int NOT NULL);"
                ))
                .await?;
            let found: Option<i32> = client
                .query_opt(&format!("SELECT version FROM {s}.meta WHERE id = 1"), &[])
                .await?
                .map(|r| r.get(0));
            Ok::<_, tokio_postgres::Error>(found)
        }
        .await;
        let found = match result {
            Ok(f) => f,
            Err(e) => {
                let _ = client
                    .execute("SELECT pg_advisory_unlock(hashtext($1))", &[&lock])
                    .await;
                return Err(e);
            }
        };
        let outcome = match found {
            Some(v) if v > SCHEMA_VERSION => Ok(Some(v)),
            _ => {
                let r = client
                    .batch_execute(&format!(
                        "{}\nINSERT INTO {s}.meta (id, version) VALUES (1, {SCHEMA_VERSION})
                         ON CONFLICT (id) DO UPDATE SET version = EXCLUDED.version;",
                        schema_sql(s)
                    ))
                    .await;
                r.map(|()| None)
            }
        };
        let _ = client
            .execute("SELECT pg_advisory_unlock(hashtext($1))", &[&lock])
            .await;
        outcome
    };
    match tokio::time::timeout(Duration::from_secs(60), run).await {
        Ok(Ok(None)) => Ok(()),
        Ok(Ok(Some(v))) => Err(open_error(
            cfg,
            format!(
                "schema {s} is version {v}, written by a newer a2ad (this one writes {SCHEMA_VERSION}); upgrade this node"
            ),
        )),
        Ok(Err(e)) => Err(open_error(cfg, format!("cannot create schema {s}: {e}"))),
        Err(_) => Err(open_error(cfg, "creating the schema timed out")),
    }
}

// === impl PgStore ===

impl PgStore {
    /// Connects, creates or checks the schema, registers this node and starts its
    /// committer, listener and lease loop on the current tokio runtime.
    ///
    /// # Errors
    /// [`Error::Store`] when PostgreSQL cannot be reached or the schema is not usable.
    pub(crate) async fn open(
        config: &Config,
        cfg: &ClusterConfig,
        rerun_agents: HashSet<String>,
    ) -> Result<Self> {
        let pg: tokio_postgres::Config = cfg
            .url
            .parse()
            .map_err(|e| open_error(cfg, format!("not a PostgreSQL URL: {e}")))?;
        let mut pg = pg;
        pg.connect_timeout(CONNECT_TIMEOUT);
        pg.application_name("a2ad");
        let setup = connect(&pg, None)
            .await
            .map_err(|e| open_error(cfg, format!("cannot connect: {e}")))?;
        migrate(&setup, cfg).await?;

        let manager = deadpool_postgres::Manager::from_config(
            pg.clone(),
            NoTls,
            deadpool_postgres::ManagerConfig {
                recycling_method: deadpool_postgres::RecyclingMethod::Fast,
            },
        );
        let pool = deadpool_postgres::Pool::builder(manager)
            .max_size(cfg.pool_size)
            .runtime(deadpool_postgres::Runtime::Tokio1)
            .wait_timeout(Some(QUERY_TIMEOUT))
            .create_timeout(Some(CONNECT_TIMEOUT))
            .recycle_timeout(Some(CONNECT_TIMEOUT))
            .build()
            .map_err(|e| open_error(cfg, format!("cannot build the pool: {e}")))?;

        let node = cfg
            .node_id
            .clone()
            .unwrap_or_else(|| format!("node-{}", &Uuid::new_v4().simple().to_string()[..12]));
        let incarnation = Uuid::new_v4();
        let s = &cfg.schema;
        let registered = bounded(setup.execute(
            &format!(
                "INSERT INTO {s}.nodes (node, incarnation, heartbeat_at, started_at)
                 VALUES ($1, $2, now(), now())
                 ON CONFLICT (node) DO UPDATE SET incarnation = EXCLUDED.incarnation,
                   heartbeat_at = now(), started_at = now()"
            ),
            &[&node, &incarnation],
        ))
        .await;
        if let Err(e) = registered {
            return Err(open_error(cfg, format!("cannot register node {node}: {e}")));
        }
        drop(setup);

        let (jobs, lanes): (Vec<_>, Vec<_>) = (0..LANES).map(|_| mpsc::unbounded_channel()).unzip();
        let (signals, signals_rx) = mpsc::channel(SIGNALS);
        let rerun_agents = match cfg.on_node_loss {
            NodeLoss::Fail => HashSet::new(),
            NodeLoss::Resume => rerun_agents,
        };
        let inner = Arc::new(Inner {
            cfg: cfg.clone(),
            schema: cfg.schema.clone(),
            node,
            incarnation: Mutex::new(incarnation),
            pg,
            pool,
            rt: tokio::runtime::Handle::current(),
            jobs,
            owned: DashMap::new(),
            watchers: Arc::default(),
            configs: DashMap::new(),
            signals,
            signals_rx: Mutex::new(Some(signals_rx)),
            retention: Duration::from_secs_f64(config.server.task_retention_seconds),
            rerun_agents,
            backlog: AtomicU64::new(0),
            commits: AtomicU64::new(0),
            committed_writes: AtomicU64::new(0),
            failing: AtomicBool::new(false),
            serving: AtomicBool::new(true),
            lease_ok: Mutex::new(Instant::now()),
            takeovers: AtomicU64::new(0),
            fenced: AtomicU64::new(0),
            claimed: AtomicU64::new(0),
            outbox_depth: AtomicU64::new(0),
            live_nodes: AtomicU64::new(1),
            finished_tasks: AtomicU64::new(0),
            append_sum: AtomicU64::new(0),
            append_max: AtomicU64::new(0),
            append_recent: Mutex::new(std::collections::VecDeque::with_capacity(RECENT)),
            hints: AtomicU64::new(0),
            stop: tokio_util::sync::CancellationToken::new(),
        });
        tracing::info!(node = %inner.node, %incarnation, schema = %inner.schema, "joined the cluster");
        for rx in lanes {
            tokio::spawn(committer(inner.clone(), rx, config.store.max_batch));
        }
        tokio::spawn(listener(inner.clone()));
        tokio::spawn(lease_loop(inner.clone()));
        Ok(Self { inner })
    }

    /// This node's current incarnation.
    fn incarnation(&self) -> Uuid {
        self.inner.incarnation()
    }

    /// Runs `f` on the store's runtime (reads work from any runtime or thread).
    fn run<T: Send + 'static>(
        &self,
        f: impl Future<Output = Result<T>> + Send + 'static,
    ) -> BoxFuture<'static, Result<T>> {
        let handle = self.inner.rt.spawn(f);
        async move { handle.await.map_err(db)? }.boxed()
    }

    /// The unfinished tasks of dead nodes (and of this node's earlier runs), taken over
    /// here: at most [`REAP_LIMIT`] per call. `others`: also those of other nodes.
    pub(crate) async fn reap(&self, others: bool) -> Result<Vec<RecoveredTask>> {
        self.inner.reap(others).await
    }

    /// Claims pending deliveries of dead nodes (lane by lane, in order).
    pub(crate) async fn claim(&self, others: bool) -> Result<Vec<Delivery>> {
        self.inner.claim(others).await
    }

    /// Stops renewing the lease and listening, as if the process had died (tests).
    #[cfg(test)]
    pub(crate) fn halt(&self) {
        self.inner.stop.cancel();
    }

    /// Drops the schema (tests).
    #[cfg(test)]
    pub(crate) async fn drop_schema(&self) -> Result<()> {
        let client = self.inner.client().await?;
        bounded(client.batch_execute(&format!(
            "DROP SCHEMA IF EXISTS {} CASCADE",
            self.inner.schema
        )))
        .await
    }
}

impl Inner {
    /// Hands a job to its lane's committer: the lane of the task it writes (all of a
    /// task's writes, its push configurations and outbox entries go to one lane); lane 0
    /// for writes of no task.
    fn submit(&self, job: Job) {
        let key = job.writes.iter().find_map(|w| match w {
            Write::Task { key, .. }
            | Write::PushRemoveNamed { task: key, .. }
            | Write::OutboxDone(OutboxKey { task: key, .. })
            | Write::OutboxRetry {
                key: OutboxKey { task: key, .. },
                ..
            } => Some(row_id(key)),
            Write::PushSet(c) | Write::PushStats(c) => c.scope.task.as_ref().map(|t| {
                row_id(&TaskKey {
                    principal: c.scope.principal.clone(),
                    agent: c.scope.agent.clone(),
                    task: t.clone(),
                })
            }),
            Write::PushRemove(scope) => scope.task.as_ref().map(|t| {
                row_id(&TaskKey {
                    principal: scope.principal.clone(),
                    agent: scope.agent.clone(),
                    task: t.clone(),
                })
            }),
            Write::Turn { .. } | Write::ForgetContext { .. } => None,
        });
        let lane = key.map_or(0, |id| (id.as_u128() % self.jobs.len() as u128) as usize);
        self.backlog.fetch_add(job.writes.len() as u64, Relaxed);
        if self.jobs[lane].send(Msg::Job(job)).is_err() {
            tracing::error!("the postgres committer has stopped; a write is not kept");
        }
    }

    /// The shared object of a decoded configuration (the same one while its id and
    /// creation time are).
    fn config(&self, decoded: Arc<StoredPushConfig>) -> Arc<StoredPushConfig> {
        if let Some(known) = self.configs.get(&decoded.id)
            && known.created_at == decoded.created_at
            && known.scope == decoded.scope
        {
            return known.clone();
        }
        if self.configs.len() > 100_000 {
            self.configs.clear();
        }
        self.configs.insert(decoded.id.clone(), decoded.clone());
        decoded
    }

    fn incarnation(&self) -> Uuid {
        *self.incarnation.lock().unwrap_or_else(|e| e.into_inner())
    }

    async fn client(&self) -> Result<deadpool_postgres::Object> {
        self.pool.get().await.map_err(db)
    }

    fn ttl(&self) -> Duration {
        Duration::from_millis(self.cfg.lease_ttl_ms)
    }

    /// The decoded record of a row `(principal, agent, task, record)`.
    fn decode_row(row: &Row) -> Option<(TaskKey, TaskSnapshot, TurnId)> {
        let key = TaskKey {
            principal: row.get::<_, &str>(0).into(),
            agent: row.get::<_, &str>(1).into(),
            task: TaskId::new(row.get::<_, &str>(2)),
        };
        let (task, turn) = codec::decode_task(&key, row.get::<_, &[u8]>(3))?;
        Some((key, task, turn))
    }

    async fn task(&self, key: TaskKey) -> Result<Option<Arc<TaskSnapshot>>> {
        let client = self.client().await?;
        let sql = format!(
            "SELECT principal, agent, task, record FROM {}.tasks WHERE id = $1",
            self.schema
        );
        let stmt = bounded(client.prepare_cached(&sql)).await?;
        let row = bounded(client.query_opt(&stmt, &[&row_id(&key)])).await?;
        Ok(row
            .as_ref()
            .and_then(Self::decode_row)
            .filter(|(k, ..)| *k == key)
            .map(|(_, t, _)| Arc::new(t)))
    }

    /// A task's record and its events after `after` (at most `limit` of them, `None`: all),
    /// read in one snapshot.
    async fn record_and_events(
        &self,
        key: &TaskKey,
        after: u64,
        limit: Option<usize>,
    ) -> Result<Option<(TaskSnapshot, TurnId, Vec<TaskEvent>)>> {
        let client = self.client().await?;
        let s = &self.schema;
        let sql = format!(
            "SELECT t.principal, t.agent, t.task, t.record,
               ARRAY(SELECT seq FROM {s}.events e WHERE e.task = t.id AND e.seq > $2 ORDER BY seq LIMIT $3),
               ARRAY(SELECT body FROM {s}.events e WHERE e.task = t.id AND e.seq > $2 ORDER BY seq LIMIT $3)
             FROM {s}.tasks t WHERE t.id = $1"
        );
        let stmt = bounded(client.prepare_cached(&sql)).await?;
        let after = i64::try_from(after).unwrap_or(i64::MAX);
        let limit = limit.map(|n| i64::try_from(n).unwrap_or(i64::MAX));
        let Some(row) = bounded(client.query_opt(&stmt, &[&row_id(key), &after, &limit])).await?
        else {
            return Ok(None);
        };
        let Some((k, task, turn)) = Self::decode_row(&row) else {
            return Err(db("a task record does not decode"));
        };
        if k != *key {
            return Ok(None);
        }
        let seqs: Vec<i64> = row.get(4);
        let bodies: Vec<Vec<u8>> = row.get(5);
        let events = seqs
            .into_iter()
            .zip(bodies)
            .filter_map(|(seq, body)| {
                codec::decode_event(u64::try_from(seq).ok()?, &body, &task.history)
            })
            .collect();
        Ok(Some((task, turn, events)))
    }

    async fn list(&self, q: ListQuery) -> Result<ListPage> {
        let client = self.client().await?;
        let s = &self.schema;
        let filter = "principal = $1 AND agent = $2 AND ($3::text IS NULL OR context = $3)
             AND ($4::text IS NULL OR state = $4) AND ($5::bigint IS NULL OR status_us >= $5)";
        let page_sql = format!(
            "SELECT principal, agent, task, record FROM {s}.tasks WHERE {filter}
               AND ($6::bigint IS NULL OR (status_us, task) < ($6, $7::text))
             ORDER BY status_us DESC, task DESC LIMIT $8"
        );
        let count_sql = format!("SELECT count(*) FROM {s}.tasks WHERE {filter}");
        let (page_stmt, count_stmt) = futures_util::try_join!(
            bounded(client.prepare_cached(&page_sql)),
            bounded(client.prepare_cached(&count_sql))
        )?;
        let context = q.context.as_ref().map(|c| c.as_str().to_string());
        let state = q.state.map(|st| st.as_str().to_string());
        let after = q.status_after.map(|t| t.timestamp_micros());
        let (token_at, token_task) = match &q.after {
            Some(t) => (Some(t.timestamp_micros), Some(t.task.as_str().to_string())),
            None => (None, None),
        };
        let size = q.page_size.max(1);
        let limit = i64::try_from(size).unwrap_or(i64::MAX).saturating_add(1);
        let principal = q.principal.as_str();
        let agent = q.agent.as_str();
        let page_params: [&(dyn tokio_postgres::types::ToSql + Sync); 8] = [
            &principal,
            &agent,
            &context,
            &state,
            &after,
            &token_at,
            &token_task,
            &limit,
        ];
        let count_params: [&(dyn tokio_postgres::types::ToSql + Sync); 5] =
            [&principal, &agent, &context, &state, &after];
        let (rows, count) = futures_util::try_join!(
            bounded(client.query(&page_stmt, &page_params)),
            bounded(client.query_one(&count_stmt, &count_params))
        )?;
        let mut page = ListPage {
            total: usize::try_from(count.get::<_, i64>(0)).unwrap_or(0),
            ..ListPage::default()
        };
        for row in &rows {
            let Some((_, task, _)) = Self::decode_row(row) else {
                continue;
            };
            if page.tasks.len() < size {
                page.tasks.push(Arc::new(task));
            } else {
                page.next = page.tasks.last().map(|t| PageToken::of(t));
            }
        }
        Ok(page)
    }

    async fn push_query(
        &self,
        sql: String,
        params: PushParams,
    ) -> Result<Vec<Arc<StoredPushConfig>>> {
        let client = self.client().await?;
        let stmt = bounded(client.prepare_cached(&sql)).await?;
        let rows = match params {
            PushParams::Owner(o) => bounded(client.query(&stmt, &[&o])).await?,
            PushParams::OwnerTask(o, t) => bounded(client.query(&stmt, &[&o, &t])).await?,
            PushParams::OwnerId(o, id) => bounded(client.query(&stmt, &[&o, &id])).await?,
        };
        Ok(rows
            .iter()
            .filter_map(|r| codec::decode_push(r.get::<_, &[u8]>(0)))
            .map(|c| self.config(c))
            .collect())
    }

    /// Takes a task: fence + 1, this node its runner; tells the old runner. `None` when it
    /// is finished or gone.
    async fn adopt(&self, key: &TaskKey, why: Orphan) -> Result<Option<RecoveredTask>> {
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
    async fn taken(&self, key: &TaskKey, fence: i64, why: Orphan) -> Result<Option<RecoveredTask>> {
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

    async fn reap(&self, others: bool) -> Result<Vec<RecoveredTask>> {
        let client = self.client().await?;
        let s = &self.schema;
        let me = self.incarnation();
        let ttl = self.cfg.lease_ttl_ms as f64;
        // Candidates: unfinished tasks whose runner holds no fresh lease (its node died,
        // left, or restarted under a new incarnation). Each is then adopted on its own.
        let rows = bounded(client.query(
            &format!(
                "SELECT principal, agent, task, runner_node FROM {s}.tasks
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
            let why = if old_node.as_deref() == Some(self.node.as_str()) {
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
    async fn adopt_if_dead(
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

    async fn claim(&self, others: bool) -> Result<Vec<Delivery>> {
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
        let mut out = Vec::new();
        let mut gone = Vec::new();
        for (id, mut items) in by_task {
            items.sort_by_key(|i| i.0);
            let key = self.key_of(id).await?;
            let found = match &key {
                Some(key) => self.record_and_events(key, 0, None).await?,
                None => None,
            };
            let (Some(key), Some((task, _, events))) = (key, found) else {
                gone.push(id);
                continue;
            };
            let task = Arc::new(task);
            let configs = self
                .push_query(
                    format!("SELECT body FROM {s}.push WHERE owner = $1"),
                    PushParams::Owner(owner_id(&key.principal, &key.agent)),
                )
                .await?;
            for (seq, config_id, attempt, due) in items {
                let config = configs.iter().find(|c| {
                    c.id == config_id && c.scope.task.as_ref().is_none_or(|t| *t == key.task)
                });
                let event = events.iter().find(|e| e.seq == seq);
                let outbox = OutboxKey {
                    task: key.clone(),
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

    async fn key_of(&self, id: Uuid) -> Result<Option<TaskKey>> {
        let client = self.client().await?;
        let row = bounded(client.query_opt(
            &format!(
                "SELECT principal, agent, task FROM {}.tasks WHERE id = $1",
                self.schema
            ),
            &[&id],
        ))
        .await?;
        Ok(row.map(|r| TaskKey {
            principal: r.get::<_, &str>(0).into(),
            agent: r.get::<_, &str>(1).into(),
            task: TaskId::new(r.get::<_, &str>(2)),
        }))
    }

    /// Renews the lease; registers a new incarnation when the row is no longer ours.
    async fn heartbeat(&self) -> Result<()> {
        let client = self.client().await?;
        let s = &self.schema;
        let me = self.incarnation();
        let ttl = self.cfg.lease_ttl_ms as f64;
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
                tracing::warn!(node = %self.node, incarnation = %fresh, "lease lost; joined again");
                Ok(())
            }
        }
    }

    /// Stops every agent here: its tasks are (or will be) taken over elsewhere.
    async fn self_fence(&self) {
        if self.serving.swap(false, Relaxed) {
            tracing::error!(node = %self.node, "cannot hold the lease: self-fenced (agents stopped, /healthz failing)");
            self.owned.clear();
            let _ = self.signals.send(Signal::SelfFenced).await;
        }
    }

    /// Evicts finished tasks past the retention (one node per tick).
    async fn evict(&self) -> Result<()> {
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

enum PushParams {
    Owner(Uuid),
    OwnerTask(Uuid, Option<String>),
    OwnerId(Uuid, String),
}

// === The committer ===

/// What one job's writes came to.
enum Outcome {
    Done(Committed),
    /// A task of the job is no longer this node's (its fence moved on).
    Fenced(Vec<TaskKey>),
}

async fn committer(inner: Arc<Inner>, mut rx: mpsc::UnboundedReceiver<Msg>, max_batch: usize) {
    let mut client: Option<(tokio_postgres::Client, Prepared)> = None;
    let mut closing: Option<std::sync::mpsc::Sender<()>> = None;
    while closing.is_none() {
        let Some(first) = rx.recv().await else {
            break;
        };
        // The writes, and apart from them (they are not `Sync`) the continuations.
        let mut batch: Vec<Vec<Write>> = Vec::new();
        let mut thens: Vec<Option<Then>> = Vec::new();
        let mut writes = 0;
        match first {
            Msg::Job(j) => {
                writes += j.writes.len();
                batch.push(j.writes);
                thens.push(j.then);
            }
            Msg::Close(tx) => closing = Some(tx),
        }
        while writes < max_batch && closing.is_none() {
            match rx.try_recv() {
                Ok(Msg::Job(j)) => {
                    writes += j.writes.len();
                    batch.push(j.writes);
                    thens.push(j.then);
                }
                Ok(Msg::Close(tx)) => closing = Some(tx),
                Err(_) => break,
            }
        }
        if batch.is_empty() {
            continue;
        }
        let mut delay = Duration::from_millis(50);
        let outcomes = loop {
            if client.as_ref().is_none_or(|(c, _)| c.is_closed()) {
                client = match connect(&inner.pg, None).await {
                    Ok(c) => {
                        match tokio::time::timeout(CONNECT_TIMEOUT, prepare(&c, &inner.schema))
                            .await
                        {
                            Ok(Ok(p)) => Some((c, p)),
                            _ => None,
                        }
                    }
                    Err(e) => {
                        tracing::warn!(error = %e, "the postgres committer cannot connect");
                        None
                    }
                };
            }
            if let Some((c, p)) = client.as_mut() {
                let started = Instant::now();
                match tokio::time::timeout(COMMIT_TIMEOUT, commit(&inner, c, p, &batch)).await {
                    Ok(Ok(outcomes)) => {
                        let us = u64::try_from(started.elapsed().as_micros()).unwrap_or(u64::MAX);
                        inner.append_sum.fetch_add(us, Relaxed);
                        inner.append_max.fetch_max(us, Relaxed);
                        let mut recent = inner
                            .append_recent
                            .lock()
                            .unwrap_or_else(|e| e.into_inner());
                        if recent.len() == RECENT {
                            recent.pop_front();
                        }
                        recent.push_back(u32::try_from(us).unwrap_or(u32::MAX));
                        break outcomes;
                    }
                    Ok(Err(e)) => {
                        tracing::error!(error = %e, "postgres commit failed; retrying")
                    }
                    Err(_) => tracing::error!("postgres commit timed out; retrying"),
                }
                client = None;
            }
            inner.failing.store(true, Relaxed);
            if inner.stop.is_cancelled() && closing.is_some() {
                // Shutting down with the engine gone: what was not durable is not told.
                break Vec::new();
            }
            tokio::time::sleep(delay).await;
            delay = (delay * 2).min(Duration::from_secs(2));
        };
        inner.failing.store(false, Relaxed);
        inner.commits.fetch_add(1, Relaxed);
        inner.committed_writes.fetch_add(writes as u64, Relaxed);
        inner.backlog.fetch_sub(writes as u64, Relaxed);
        for (then, outcome) in thens.into_iter().zip(outcomes) {
            match outcome {
                Outcome::Done(committed) => {
                    if let Some(then) = then {
                        then(committed);
                    }
                }
                Outcome::Fenced(keys) => {
                    for key in keys {
                        inner.owned.remove(&row_id(&key));
                        inner.fenced.fetch_add(1, Relaxed);
                        if inner.signals.try_send(Signal::Fenced(key)).is_err() {
                            tracing::warn!(
                                "cluster signal queue full: a fenced task is stopped at its next append"
                            );
                        }
                    }
                }
            }
        }
    }
    if let Some(tx) = closing {
        let _ = tx.send(());
    }
}

/// One prepared statement per kind of write, for a connection.
struct Prepared {
    create: tokio_postgres::Statement,
    /// An event: without deliveries (`[0]`, most events: a statement PostgreSQL plans
    /// quickly) and with them (`[1]`, see [`plan_deliveries`]).
    next: [tokio_postgres::Statement; 2],
    /// An event followed by a later one of the same task in the same batch: its record
    /// is superseded before the commit, so only the numbering moves. Indexed as `next`.
    light: [tokio_postgres::Statement; 2],
    /// The other writes' statements, prepared up front so that a batch goes out in one
    /// flight (a statement prepared on the way would reach the server after COMMIT).
    other: Vec<tokio_postgres::Statement>,
    /// One `NOTIFY` per payload.
    notify: tokio_postgres::Statement,
}

/// Which of [`OTHER_SQL`] (and of `Prepared::other`) a write uses.
#[derive(Clone, Copy)]
enum Other {
    TurnPut,
    TurnsForget,
    PushStats,
    PushNamed,
    PushScoped,
    PushRemove,
    PushRemoveNamed,
    OutboxDone,
    OutboxRetry,
}

const _: () = assert!(OTHER_SQL.len() == Other::OutboxRetry as usize + 1);

impl Prepared {
    fn other(&self, which: Other) -> &tokio_postgres::Statement {
        &self.other[which as usize]
    }
}

/// The other writes' statements (`{s}`: the schema), in the order of [`Other`].
const OTHER_SQL: &[&str] = &[
    "INSERT INTO {s}.turns (principal, context, since, number, body)
                             VALUES ($1, $2, $3, $4, $5)
                             ON CONFLICT (principal, context, since, number)
                             DO UPDATE SET body = EXCLUDED.body, at = now()",
    "DELETE FROM {s}.turns WHERE principal = $1 AND context = $2 AND since = $3",
    "UPDATE {s}.push SET body = $5 WHERE owner = $1
                                 AND task IS NOT DISTINCT FROM $2 AND named = $3 AND id = $4",
    "INSERT INTO {s}.push (owner, task, named, id, created_us, body)
                                 VALUES ($1, $2, true, $3, $4, $5)
                                 ON CONFLICT (owner, task, id) WHERE named
                                 DO UPDATE SET body = EXCLUDED.body",
    "WITH d AS (DELETE FROM {s}.push WHERE owner = $1
                                   AND task IS NOT DISTINCT FROM $2 AND NOT named)
                                 INSERT INTO {s}.push (owner, task, named, id, created_us, body)
                                 VALUES ($1, $2, false, $3, $4, $5)",
    "DELETE FROM {s}.push WHERE owner = $1 AND task IS NOT DISTINCT FROM $2 AND NOT named",
    "DELETE FROM {s}.push WHERE owner = $1 AND task = $2 AND named AND id = $3",
    "DELETE FROM {s}.outbox WHERE delivery = $1",
    "UPDATE {s}.outbox SET attempt = $2, due_us = $3 WHERE delivery = $1",
];

/// Prepares the task statements on a committer connection.
async fn prepare(
    client: &tokio_postgres::Client,
    s: &str,
) -> std::result::Result<Prepared, tokio_postgres::Error> {
    Ok(Prepared {
        create: client
            .prepare(&format!(
                "WITH t AS (INSERT INTO {s}.tasks (id, principal, agent, task, context, state, terminal,
                    seq, fence, runner, runner_node, status_us, finished_at, record)
                  VALUES ($1, $2, $3, $4, $5, $6, $7::boolean, 1, 1, $8, $9, $10::bigint,
                          CASE WHEN $7::boolean THEN now() END, $11)
                  ON CONFLICT (id) DO UPDATE SET fence = {s}.tasks.fence
                    WHERE {s}.tasks.runner = $8 AND {s}.tasks.seq = 1 AND {s}.tasks.fence = 1
                  RETURNING id),
                 e AS (INSERT INTO {s}.events (task, seq, body) SELECT id, 1, $12 FROM t
                       ON CONFLICT DO NOTHING),
                 o AS (INSERT INTO {s}.outbox (delivery, task, seq, config, attempt, due_us, claimed_by, claimed_node)
                       SELECT x.d, $1, 1, x.c, 1, NULL, $8, $9 FROM t, unnest($13::uuid[], $14::text[]) AS x(d, c)
                       ON CONFLICT DO NOTHING)
                 SELECT count(*) FROM t"
            ))
            .await?,
        next: append_pair(
            client,
            &format!(
                "WITH t AS (UPDATE {s}.tasks SET context = $2, state = $3, terminal = $4::boolean,
                    seq = $5::bigint, status_us = $6::bigint,
                    finished_at = CASE WHEN $4::boolean THEN now() END, record = $7
                  WHERE id = $1 AND fence = $8::bigint AND (seq = $5::bigint - 1 OR seq = $5::bigint)
                  RETURNING id),
                 e AS (INSERT INTO {s}.events (task, seq, body) SELECT id, $5::bigint, $9 FROM t
                       ON CONFLICT DO NOTHING)"
            ),
            s,
            "$5",
            (["$11", "$12"], ["$10", "$13"]),
        )
        .await?,
        notify: client
            .prepare("SELECT pg_notify($1::text, p) FROM unnest($2::text[]) AS p")
            .await?,
        other: {
            let texts: Vec<String> = OTHER_SQL.iter().map(|q| q.replace("{s}", s)).collect();
            try_join_all(texts.iter().map(|q| client.prepare(q))).await?
        },
        light: append_pair(
            client,
            &format!(
                "WITH t AS (UPDATE {s}.tasks SET seq = $2::bigint
                  WHERE id = $1 AND fence = $3::bigint AND (seq = $2::bigint - 1 OR seq = $2::bigint)
                  RETURNING id),
                 e AS (INSERT INTO {s}.events (task, seq, body) SELECT id, $2::bigint, $4 FROM t
                       ON CONFLICT DO NOTHING)"
            ),
            s,
            "$2",
            (["$6", "$7"], ["$5", "$8"]),
        )
        .await?,
    })
}

/// Commits one batch in one transaction; one outcome per job.
async fn commit(
    inner: &Inner,
    client: &mut tokio_postgres::Client,
    prepared: &Prepared,
    batch: &[Vec<Write>],
) -> std::result::Result<Vec<Outcome>, tokio_postgres::Error> {
    let s = &inner.schema;
    let me = inner.incarnation();

    // The push configurations of the batch's owners, then the batch's own changes to them
    // in order: what each event's deliveries are planned from.
    let owners: Vec<Uuid> = batch
        .iter()
        .flatten()
        .filter_map(|w| match w {
            Write::Task { key, .. } => Some(owner_id(&key.principal, &key.agent)),
            _ => None,
        })
        .collect::<HashSet<_>>()
        .into_iter()
        .collect();
    // The transaction is pipelined by hand: BEGIN and the configurations' read in one
    // flight, then every statement, the NOTIFYs and COMMIT in a second. A statement that
    // fails aborts the transaction (its COMMIT then rolls back) and fails the batch,
    // which is retried on a new connection.
    let tx: &tokio_postgres::Client = client;
    let config_sql = format!("SELECT body FROM {s}.push WHERE owner = ANY($1) ORDER BY created_us");
    let (_, rows) = futures_util::try_join!(tx.batch_execute("BEGIN"), async {
        if owners.is_empty() {
            Ok(Vec::new())
        } else {
            tx.query(&config_sql, &[&owners]).await
        }
    })?;
    let mut configs: Vec<Arc<StoredPushConfig>> = rows
        .iter()
        .filter_map(|r| codec::decode_push(r.get::<_, &[u8]>(0)))
        .map(|c| inner.config(c))
        .collect();

    // Plan every statement first (in order), then send them all at once (pipelined).
    let mut planned: Vec<Planned> = Vec::new();
    let mut plans: Vec<Vec<(usize, Vec<Delivery>, TaskKey)>> = Vec::with_capacity(batch.len());
    let mut touched: Vec<Uuid> = Vec::new();
    for job in batch {
        let mut mine = Vec::new();
        for w in job {
            match w {
                Write::Task {
                    key,
                    task,
                    event,
                    changed,
                    turn,
                } => {
                    let deliveries: Vec<Delivery> = configs
                        .iter()
                        .filter(|c| {
                            c.scope.principal == key.principal
                                && c.scope.agent == key.agent
                                && c.scope.task.as_ref().is_none_or(|t| *t == key.task)
                                && c.config.events.selects(event, *changed)
                        })
                        .map(|config| {
                            let outbox = OutboxKey {
                                task: key.clone(),
                                seq: event.seq,
                                config: config.id.clone(),
                            };
                            Delivery {
                                id: delivery_id(&outbox),
                                key: outbox,
                                config: config.clone(),
                                event: event.clone(),
                                task: task.clone(),
                                attempt: 1,
                                due: None,
                            }
                        })
                        .collect();
                    let id = row_id(key);
                    touched.push(id);
                    let fence = match inner.owned.get(&id) {
                        Some(o) => Some(o.fence),
                        None if event.seq == 1 => {
                            inner.owned.insert(
                                id,
                                Owned {
                                    key: key.clone(),
                                    fence: 1,
                                },
                            );
                            Some(1)
                        }
                        None => None,
                    };
                    mine.push((planned.len(), deliveries.clone(), key.clone()));
                    planned.push(Planned::Task {
                        id,
                        key: key.clone(),
                        task: task.clone(),
                        event: event.clone(),
                        turn: *turn,
                        fence,
                        deliveries: deliveries
                            .iter()
                            .map(|d| (d.id, d.key.config.clone()))
                            .collect(),
                        last: true,
                    });
                }
                Write::PushSet(c) => {
                    match c.namespace {
                        Namespace::Scoped => configs
                            .retain(|o| !(o.namespace == Namespace::Scoped && o.scope == c.scope)),
                        Namespace::Named => configs.retain(|o| {
                            !(o.namespace == Namespace::Named && o.scope == c.scope && o.id == c.id)
                        }),
                    }
                    configs.push(c.clone());
                    inner.configs.insert(c.id.clone(), c.clone());
                    planned.push(Planned::Other(w.clone()));
                }
                Write::PushRemove(scope) => {
                    configs.retain(|o| !(o.namespace == Namespace::Scoped && o.scope == *scope));
                    planned.push(Planned::Other(w.clone()));
                }
                Write::PushRemoveNamed { task, id } => {
                    configs.retain(|o| {
                        !(o.namespace == Namespace::Named
                            && o.id == *id
                            && o.scope.principal == task.principal
                            && o.scope.agent == task.agent
                            && o.scope.task.as_ref() == Some(&task.task))
                    });
                    planned.push(Planned::Other(w.clone()));
                }
                _ => planned.push(Planned::Other(w.clone())),
            }
        }
        plans.push(mine);
    }

    // Only a task's last event of the batch writes its record.
    let mut seen = HashSet::new();
    for p in planned.iter_mut().rev() {
        if let Planned::Task { id, last, .. } = p {
            *last = seen.insert(*id);
        }
    }
    let statements = try_join_all(
        planned
            .iter()
            .map(|p| execute(tx, prepared, p, me, &inner.node)),
    );

    touched.sort_unstable();
    touched.dedup();
    let mut payload = String::new();
    let mut notifies = Vec::new();
    for id in &touched {
        if payload.len() + 33 > NOTIFY_MAX {
            notifies.push(std::mem::take(&mut payload));
        }
        if !payload.is_empty() {
            payload.push(',');
        }
        payload.push_str(&id.simple().to_string());
    }
    if !payload.is_empty() {
        notifies.push(payload);
    }
    let channel = format!("{s}_ev");
    let notify_params: [&(dyn tokio_postgres::types::ToSql + Sync); 2] = [&channel, &notifies];
    let notified = tx.execute(&prepared.notify, &notify_params);
    let (results, _, ()) =
        futures_util::try_join!(statements, notified, tx.batch_execute("COMMIT"))?;

    Ok(plans
        .into_iter()
        .map(|mine| {
            let mut committed = Committed::default();
            let mut fenced = Vec::new();
            for (index, deliveries, key) in mine {
                match &results[index] {
                    Some(waiting) => committed
                        .deliveries
                        .extend(deliveries.into_iter().filter(|d| !waiting.contains(&d.id))),
                    None => fenced.push(key),
                }
            }
            if fenced.is_empty() {
                Outcome::Done(committed)
            } else {
                Outcome::Fenced(fenced)
            }
        })
        .collect())
}

/// An append statement (`head`: its `t` and `e` parts) prepared twice: `[0]` for an event
/// without deliveries (most events: a statement PostgreSQL plans quickly), `[1]` for one
/// that plans them (see [`plan_deliveries`]; `params` name its parameters there).
async fn append_pair(
    client: &tokio_postgres::Client,
    head: &str,
    s: &str,
    seq: &str,
    params: ([&str; 2], [&str; 2]),
) -> std::result::Result<[tokio_postgres::Statement; 2], tokio_postgres::Error> {
    let plain = format!("{head}{}", plan_deliveries(s, seq, None));
    let planned = format!("{head}{}", plan_deliveries(s, seq, Some(params)));
    let (plain, planned) =
        futures_util::try_join!(client.prepare(&plain), client.prepare(&planned))?;
    Ok([plain, planned])
}

/// The end of an append statement (after its `t` and `e` parts): with `deliveries`, it
/// plans the event's deliveries — outbox rows for the task `$1`, event `seq`, deliveries
/// and configurations `[ids, configs]`, claimed by this incarnation and node `[me, node]`
/// — unless the lane (task, configuration) still holds a delivery that is not this
/// incarnation's: one a node that took the lane over holds, one of a dead node nobody
/// claimed yet, or one already waiting so. Such a delivery is inserted unclaimed, and
/// whoever holds (or claims) the lane takes it at its next heartbeat, so a lane's
/// deliveries go out from one node, in order, across a takeover. Answers the append's
/// count and the deliveries left unclaimed.
fn plan_deliveries(s: &str, seq: &str, deliveries: Option<([&str; 2], [&str; 2])>) -> String {
    let Some(([ids, configs], [me, node])) = deliveries else {
        return "\n SELECT (SELECT count(*) FROM t), ARRAY[]::uuid[]".into();
    };
    let held = format!(
        "EXISTS (SELECT 1 FROM {s}.outbox p WHERE p.task = $1 AND p.config = x.c
                   AND p.claimed_by IS DISTINCT FROM {me}::uuid)"
    );
    format!(
        ",
         o AS (INSERT INTO {s}.outbox (delivery, task, seq, config, attempt, due_us, claimed_by, claimed_node)
               SELECT x.d, $1, {seq}::bigint, x.c, 1, NULL,
                      CASE WHEN {held} THEN NULL ELSE {me}::uuid END,
                      CASE WHEN {held} THEN NULL ELSE {node}::text END
               FROM t, unnest({ids}::uuid[], {configs}::text[]) AS x(d, c)
               ON CONFLICT DO NOTHING
               RETURNING delivery, claimed_by)
         SELECT (SELECT count(*) FROM t), ARRAY(SELECT delivery FROM o WHERE claimed_by IS NULL)"
    )
}

/// The outcome of an append: `None` when it was fenced.
fn executed(row: &tokio_postgres::Row) -> Executed {
    (row.get::<_, i64>(0) == 1).then(|| row.get::<_, Vec<Uuid>>(1))
}

/// One statement of a batch.
enum Planned {
    Task {
        id: Uuid,
        key: TaskKey,
        task: Arc<TaskSnapshot>,
        event: Arc<TaskEvent>,
        turn: TurnId,
        /// `None`: this node does not hold the task (its append is fenced).
        fence: Option<i64>,
        deliveries: Vec<(Uuid, String)>,
        /// The task's last event in the batch: it writes the record.
        last: bool,
    },
    Other(Write),
}

/// What one statement did: `None` when a task append was fenced, else the deliveries it
/// planned that wait behind earlier ones of their lane held by another node (see
/// [`plan_deliveries`]): this node does not send them.
type Executed = Option<Vec<Uuid>>;

/// Runs one statement.
async fn execute(
    tx: &tokio_postgres::Client,
    prepared: &Prepared,
    p: &Planned,
    me: Uuid,
    node: &str,
) -> std::result::Result<Executed, tokio_postgres::Error> {
    match p {
        Planned::Task {
            id,
            key,
            task,
            event,
            turn,
            fence,
            deliveries,
            last,
        } => {
            let Some(fence) = fence else {
                return Ok(None);
            };
            let ids: Vec<Uuid> = deliveries.iter().map(|d| d.0).collect();
            let cfgs: Vec<&str> = deliveries.iter().map(|d| d.1.as_str()).collect();
            let seq = i64::try_from(event.seq).unwrap_or(i64::MAX);
            if !*last && event.seq > 1 {
                let body = codec::encode_event(event);
                let row = if ids.is_empty() {
                    tx.query_one(&prepared.light[0], &[id, &seq, fence, &body])
                        .await?
                } else {
                    tx.query_one(
                        &prepared.light[1],
                        &[id, &seq, fence, &body, &me, &ids, &cfgs, &node],
                    )
                    .await?
                };
                return Ok(executed(&row));
            }
            let state = task.status.state;
            let terminal = state.is_terminal();
            let record = codec::encode_task(task, *turn);
            let body = codec::encode_event(event);
            let status_us = task.status.timestamp.timestamp_micros();
            let row = if event.seq == 1 {
                tx.query_one(
                    &prepared.create,
                    &[
                        id,
                        &key.principal.as_str(),
                        &key.agent.as_str(),
                        &key.task.as_str(),
                        &task.context_id.as_str(),
                        &state.as_str(),
                        &terminal,
                        &me,
                        &node,
                        &status_us,
                        &record,
                        &body,
                        &ids,
                        &cfgs,
                    ],
                )
                .await?
            } else {
                let context = task.context_id.as_str();
                let state = state.as_str();
                let first: [&(dyn tokio_postgres::types::ToSql + Sync); 9] = [
                    id, &context, &state, &terminal, &seq, &status_us, &record, fence, &body,
                ];
                if ids.is_empty() {
                    tx.query_one(&prepared.next[0], &first).await?
                } else {
                    let mut all = first.to_vec();
                    all.extend_from_slice(&[&me, &ids, &cfgs, &node]);
                    tx.query_one(&prepared.next[1], &all).await?
                }
            };
            Ok(if event.seq == 1 {
                (row.get::<_, i64>(0) == 1).then(Vec::new)
            } else {
                executed(&row)
            })
        }
        Planned::Other(w) => {
            match w {
                Write::Turn {
                    principal,
                    context,
                    turn,
                    user,
                    reply,
                } => {
                    let body = codec::encode_turn(user, reply.as_deref());
                    let number = i32::try_from(turn.number).unwrap_or(i32::MAX);
                    tx.execute(
                        prepared.other(Other::TurnPut),
                        &[
                            &principal.as_str(),
                            &context.as_str(),
                            &turn.since,
                            &number,
                            &body,
                        ],
                    )
                    .await?;
                }
                Write::ForgetContext {
                    principal,
                    context,
                    since,
                } => {
                    tx.execute(
                        prepared.other(Other::TurnsForget),
                        &[&principal.as_str(), &context.as_str(), since],
                    )
                    .await?;
                }
                Write::PushSet(c) | Write::PushStats(c) => {
                    let owner = owner_id(&c.scope.principal, &c.scope.agent);
                    let task = c.scope.task.as_ref().map(|t| t.as_str().to_string());
                    let named = c.namespace == Namespace::Named;
                    let body = codec::encode_push(c);
                    if matches!(w, Write::PushStats(_)) {
                        tx.execute(
                            prepared.other(Other::PushStats),
                            &[&owner, &task, &named, &c.id, &body],
                        )
                        .await?;
                    } else if named {
                        tx.execute(
                            prepared.other(Other::PushNamed),
                            &[
                                &owner,
                                &task,
                                &c.id,
                                &c.created_at.timestamp_micros(),
                                &body,
                            ],
                        )
                        .await?;
                    } else {
                        tx.execute(
                            prepared.other(Other::PushScoped),
                            &[
                                &owner,
                                &task,
                                &c.id,
                                &c.created_at.timestamp_micros(),
                                &body,
                            ],
                        )
                        .await?;
                    }
                }
                Write::PushRemove(scope) => {
                    let owner = owner_id(&scope.principal, &scope.agent);
                    let task = scope.task.as_ref().map(|t| t.as_str().to_string());
                    tx.execute(prepared.other(Other::PushRemove), &[&owner, &task])
                        .await?;
                }
                Write::PushRemoveNamed { task, id } => {
                    let owner = owner_id(&task.principal, &task.agent);
                    tx.execute(
                        prepared.other(Other::PushRemoveNamed),
                        &[&owner, &task.task.as_str(), id],
                    )
                    .await?;
                }
                Write::OutboxDone(key) => {
                    tx.execute(prepared.other(Other::OutboxDone), &[&delivery_id(key)])
                        .await?;
                }
                Write::OutboxRetry { key, attempt, due } => {
                    let attempt = i32::try_from(*attempt).unwrap_or(i32::MAX);
                    tx.execute(
                        prepared.other(Other::OutboxRetry),
                        &[&delivery_id(key), &attempt, &due.timestamp_micros()],
                    )
                    .await?;
                }
                Write::Task { .. } => {}
            }
            Ok(Some(Vec::new()))
        }
    }
}

// === The listener and the lease loop ===

async fn listener(inner: Arc<Inner>) {
    let s = inner.schema.clone();
    let mut delay = Duration::from_millis(100);
    while !inner.stop.is_cancelled() {
        let (tx, mut rx) = mpsc::unbounded_channel();
        let client = match connect(&inner.pg, Some(tx)).await {
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

async fn lease_loop(inner: Arc<Inner>) {
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

// === impl Store ===

impl Store for PgStore {
    fn append(&self, writes: Vec<Write>, then: Option<Then>) -> Durable {
        self.inner.submit(Job { writes, then });
        Durable::Later
    }

    fn task(&self, key: &TaskKey) -> BoxFuture<'_, Result<Option<Arc<TaskSnapshot>>>> {
        let inner = self.inner.clone();
        let key = key.clone();
        self.run(async move { inner.task(key).await })
    }

    fn task_now(&self, _key: &TaskKey) -> Option<Arc<TaskSnapshot>> {
        // Shared: a task's row is created (uniquely) by its first append.
        None
    }

    fn events(&self, key: &TaskKey, after: u64) -> BoxFuture<'_, Result<Vec<TaskEvent>>> {
        let inner = self.inner.clone();
        let key = key.clone();
        self.run(async move {
            Ok(inner
                .record_and_events(&key, after, None)
                .await?
                .map(|(_, _, e)| e)
                .unwrap_or_default())
        })
    }

    fn list(&self, query: &ListQuery) -> BoxFuture<'_, Result<ListPage>> {
        let inner = self.inner.clone();
        let query = query.clone();
        self.run(async move { inner.list(query).await })
    }

    fn push_scope(
        &self,
        scope: &PushScope,
    ) -> BoxFuture<'_, Result<Option<Arc<StoredPushConfig>>>> {
        let inner = self.inner.clone();
        let owner = owner_id(&scope.principal, &scope.agent);
        let task = scope.task.as_ref().map(|t| t.as_str().to_string());
        let sql = format!(
            "SELECT body FROM {}.push WHERE owner = $1 AND task IS NOT DISTINCT FROM $2 AND NOT named
             ORDER BY created_us DESC LIMIT 1",
            self.inner.schema
        );
        self.run(async move {
            Ok(inner
                .push_query(sql, PushParams::OwnerTask(owner, task))
                .await?
                .into_iter()
                .next())
        })
    }

    fn push_by_id(
        &self,
        principal: &Principal,
        agent: &AgentId,
        id: &str,
    ) -> BoxFuture<'_, Result<Option<Arc<StoredPushConfig>>>> {
        let inner = self.inner.clone();
        let owner = owner_id(principal, agent);
        let sql = format!(
            "SELECT body FROM {}.push WHERE owner = $1 AND id = $2 AND NOT named LIMIT 1",
            self.inner.schema
        );
        let id = id.to_string();
        self.run(async move {
            Ok(inner
                .push_query(sql, PushParams::OwnerId(owner, id))
                .await?
                .into_iter()
                .next())
        })
    }

    fn push_named(&self, task: &TaskKey) -> BoxFuture<'_, Result<Vec<Arc<StoredPushConfig>>>> {
        let inner = self.inner.clone();
        let owner = owner_id(&task.principal, &task.agent);
        let sql = format!(
            "SELECT body FROM {}.push WHERE owner = $1 AND task = $2 AND named ORDER BY created_us, id",
            self.inner.schema
        );
        let t = Some(task.task.as_str().to_string());
        self.run(async move { inner.push_query(sql, PushParams::OwnerTask(owner, t)).await })
    }

    fn push_reserve(&self, _config: &Arc<StoredPushConfig>, _max_per_task: usize) -> Result<()> {
        Ok(())
    }

    fn push_check(
        &self,
        config: &Arc<StoredPushConfig>,
        max_per_task: usize,
    ) -> BoxFuture<'_, Result<()>> {
        if config.namespace == Namespace::Scoped {
            return futures_util::future::ready(Ok(())).boxed();
        }
        let Some(task) = config.scope.task.clone() else {
            return futures_util::future::ready(Err(Error::Internal)).boxed();
        };
        let key = TaskKey {
            principal: config.scope.principal.clone(),
            agent: config.scope.agent.clone(),
            task,
        };
        let id = config.id.clone();
        let named = self.push_named(&key);
        async move {
            let others = named.await?.iter().filter(|c| c.id != id).count();
            if others >= max_per_task {
                return Err(Error::invalid(
                    "id",
                    format!("a task holds at most {max_per_task} push notification configurations"),
                ));
            }
            Ok(())
        }
        .boxed()
    }

    fn conversation(
        &self,
        principal: &Principal,
        context: &crate::model::ContextId,
    ) -> BoxFuture<'_, Result<Option<super::RecoveredContext>>> {
        let inner = self.inner.clone();
        let principal = principal.clone();
        let context = context.clone();
        self.run(async move {
            let s = &inner.schema;
            let client = inner.client().await?;
            let sql = format!(
                "SELECT since, number, body FROM {s}.turns
                 WHERE principal = $1 AND context = $2
                   AND since = (SELECT max(since) FROM {s}.turns WHERE principal = $1 AND context = $2)
                 ORDER BY number"
            );
            let stmt = bounded(client.prepare_cached(&sql)).await?;
            let rows = bounded(client.query(&stmt, &[&principal.as_str(), &context.as_str()])).await?;
            let Some(first) = rows.first() else {
                return Ok(None);
            };
            let since: i64 = first.get(0);
            let turns = rows
                .iter()
                .filter_map(|r| {
                    let number = u32::try_from(r.get::<_, i32>(1)).ok()?;
                    let (user, reply) = codec::decode_turn(r.get::<_, &[u8]>(2))?;
                    Some((number, user, reply))
                })
                .collect();
            Ok(Some(super::RecoveredContext {
                principal,
                context,
                since,
                turns,
            }))
        })
    }

    fn recovered(&self) -> Recovered {
        // Unfinished tasks and pending deliveries are taken over by the lease loop (this
        // node's earlier run's at once, other nodes' once they are dead).
        Recovered::default()
    }

    fn sweep(&self, _now: Instant) {
        // The lease loop evicts (one node per tick).
    }

    fn stats(&self) -> StoreStats {
        let i = &self.inner;
        StoreStats {
            finished_tasks: usize::try_from(i.finished_tasks.load(Relaxed)).unwrap_or(0),
            finished_bytes: 0,
            pending_writes: i.backlog.load(Relaxed),
            commits: i.commits.load(Relaxed),
            committed_writes: i.committed_writes.load(Relaxed),
            file_bytes: 0,
            failing: i.failing.load(Relaxed),
        }
    }

    fn failing(&self) -> bool {
        self.inner.failing.load(Relaxed)
    }

    fn backlog(&self) -> u64 {
        self.inner.backlog.load(Relaxed)
    }

    fn close(&self, within: Duration) -> u64 {
        let (tx, rx) = std::sync::mpsc::channel();
        let sent = self
            .inner
            .jobs
            .iter()
            .filter(|lane| lane.send(Msg::Close(tx.clone())).is_ok())
            .count();
        drop(tx);
        let until = Instant::now() + within.min(COMMIT_TIMEOUT * 2);
        for _ in 0..sent {
            if rx
                .recv_timeout(until.saturating_duration_since(Instant::now()))
                .is_err()
            {
                break;
            }
        }
        self.inner.backlog.load(Relaxed)
    }
}

// === impl Cluster ===

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
