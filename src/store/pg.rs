//! The shared store: everything a2ad keeps, in PostgreSQL, for several nodes acting as one
//! service (`[cluster] engine = "postgres"`). The same object is the node's
//! [`Cluster`]: its lease, the reaper, delivery claims and cross-node wake-ups.
//!
//! - **Appends** go to committer tasks (`cluster.commit_lanes`, each with its own
//!   connection; a task's writes always to the same one): each batch is one transaction —
//!   one statement for its task events (a row per task, its events, outbox rows and the
//!   batch's turns from arrays, each task checked against its fence) — and one `NOTIFY`
//!   with the tasks it touched. A task's
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

use std::collections::HashSet;
use std::future::Future;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::Relaxed};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use dashmap::DashMap;
use futures_util::future::{BoxFuture, FutureExt as _};
use tokio::sync::mpsc;
use tokio_postgres::{AsyncMessage, NoTls};
use tokio_postgres_rustls::MakeRustlsConnect;
use uuid::Uuid;

mod commit;
mod listen;
mod reads;
mod schema;
mod statements;
mod takeover;

use super::cluster::{Signal, Watchers};
use super::codec;
use super::{
    Delivery, Durable, ListPage, ListQuery, OutboxKey, Recovered, RecoveredTask, Store, StoreStats,
    Then, Write,
};
use crate::config::{ClusterConfig, Config, NodeLoss};
use crate::error::{Error, Result};
use crate::model::{AgentId, Principal, TaskEvent, TaskKey, TaskSnapshot};
use crate::push::{Namespace, PushScope, StoredPushConfig};
use commit::committer;
use listen::{lease_loop, listener};
use reads::PushParams;
use schema::migrate;

/// The schema version this build writes. 2: records and events of codec/binary.rs's tag 2
/// (extensions, part metadata); version 1's rows still read, and a node of version 1
/// refuses a schema of 2 (upgrade every node before sending content that needs it).
pub(crate) const SCHEMA_VERSION: i32 = 2;
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
/// Commit times kept for the append percentiles.
const RECENT: usize = 4096;
/// Signals queued for the runtime at most (the lease loop waits when it is full).
const SIGNALS: usize = 4096;
/// Retired incarnations remembered (see `Inner::retired`).
const RETIRED: usize = 64;

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
    /// Seals push configurations' secrets (`store/seal.rs`).
    sealer: super::seal::Sealer,
    /// TLS to PostgreSQL, when asked for (`sslmode=require` or `ca_file`).
    tls: Option<MakeRustlsConnect>,
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
    /// Times this node self-fenced.
    self_fences: AtomicU64,
    /// Incarnations this process gave up when it self-fenced (the latest `RETIRED`): their
    /// tasks are taken up as a lost node's, not as a restart's.
    retired: Mutex<std::collections::VecDeque<Uuid>>,
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
    tls: Option<&MakeRustlsConnect>,
    notes: Option<mpsc::UnboundedSender<tokio_postgres::Notification>>,
) -> std::result::Result<tokio_postgres::Client, String> {
    match tls {
        Some(tls) => connect_with(pg, tls.clone(), notes).await,
        None => connect_with(pg, NoTls, notes).await,
    }
}

async fn connect_with<T>(
    pg: &tokio_postgres::Config,
    tls: T,
    notes: Option<mpsc::UnboundedSender<tokio_postgres::Notification>>,
) -> std::result::Result<tokio_postgres::Client, String>
where
    T: tokio_postgres::tls::MakeTlsConnect<tokio_postgres::Socket>,
    T::Stream: Send + 'static,
{
    let (client, mut conn) = tokio::time::timeout(CONNECT_TIMEOUT, pg.connect(tls))
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

/// The TLS connector to PostgreSQL: when the URL says `sslmode=require` or `ca_file` is
/// set (otherwise plain TCP, as before). The server's certificate must chain to the
/// authorities of `ca_file` (else the system's) and name the URL's host.
fn tls_connector(
    pg: &tokio_postgres::Config,
    cfg: &ClusterConfig,
) -> Result<Option<MakeRustlsConnect>> {
    use rustls_pki_types::pem::PemObject as _;
    if cfg.ca_file.is_none() && pg.get_ssl_mode() != tokio_postgres::config::SslMode::Require {
        return Ok(None);
    }
    let mut roots = rustls::RootCertStore::empty();
    match &cfg.ca_file {
        Some(path) => {
            let certs = rustls_pki_types::CertificateDer::pem_file_iter(path)
                .and_then(Iterator::collect::<std::result::Result<Vec<_>, _>>)
                .map_err(|e| {
                    open_error(
                        cfg,
                        format!("cluster.ca_file {path}: cannot read PEM certificates: {e}"),
                    )
                })?;
            if certs.is_empty() {
                return Err(open_error(
                    cfg,
                    format!("cluster.ca_file {path}: holds no PEM certificate"),
                ));
            }
            for cert in certs {
                roots
                    .add(cert)
                    .map_err(|e| open_error(cfg, format!("cluster.ca_file {path}: {e}")))?;
            }
        }
        None => {
            for cert in rustls_native_certs::load_native_certs().certs {
                let _ = roots.add(cert);
            }
        }
    }
    let provider = Arc::new(rustls::crypto::aws_lc_rs::default_provider());
    let config = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(|e| open_error(cfg, e.to_string()))?
        .with_root_certificates(roots)
        .with_no_client_auth();
    Ok(Some(MakeRustlsConnect::new(config)))
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
        let tls = tls_connector(&pg, cfg)?;
        let setup = connect(&pg, tls.as_ref(), None)
            .await
            .map_err(|e| open_error(cfg, format!("cannot connect: {e}")))?;
        migrate(&setup, cfg).await?;
        // Secrets sealed with a key this node does not have: refuse to join (exit 2)
        // rather than serve configurations whose deliveries would go out unsigned. The
        // newest configurations are the ones checked: a wrong key shows in any of them.
        let sealer = super::seal::Sealer::for_config(config);
        let sample = bounded(setup.query(
            &format!(
                "SELECT body FROM {}.push ORDER BY created_us DESC LIMIT 100",
                cfg.schema
            ),
            &[],
        ))
        .await?;
        for row in &sample {
            if let Err(e) = codec::decode_push_checked(row.get::<_, &[u8]>(0), &sealer) {
                return Err(open_error(cfg, e.to_string()));
            }
        }

        let manager_config = deadpool_postgres::ManagerConfig {
            recycling_method: deadpool_postgres::RecyclingMethod::Fast,
        };
        let manager = match &tls {
            Some(tls) => {
                deadpool_postgres::Manager::from_config(pg.clone(), tls.clone(), manager_config)
            }
            None => deadpool_postgres::Manager::from_config(pg.clone(), NoTls, manager_config),
        };
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

        let (jobs, lanes): (Vec<_>, Vec<_>) = (0..cfg.commit_lanes.max(1))
            .map(|_| mpsc::unbounded_channel())
            .unzip();
        let (signals, signals_rx) = mpsc::channel(SIGNALS);
        let rerun_agents = match cfg.on_node_loss {
            NodeLoss::Fail => HashSet::new(),
            NodeLoss::Resume => rerun_agents,
        };
        let inner = Arc::new(Inner {
            cfg: cfg.clone(),
            sealer,
            tls,
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
            retention: config.server.task_retention(),
            rerun_agents,
            backlog: AtomicU64::new(0),
            commits: AtomicU64::new(0),
            committed_writes: AtomicU64::new(0),
            failing: AtomicBool::new(false),
            serving: AtomicBool::new(true),
            lease_ok: Mutex::new(Instant::now()),
            self_fences: AtomicU64::new(0),
            retired: Mutex::default(),
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
                    Some((number, super::TurnMessages::Shared(user, reply)))
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
            commit_micros: i.append_sum.load(Relaxed),
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
