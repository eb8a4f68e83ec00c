//! `[store]` and `[cluster]`: where tasks are kept, and how nodes share them.

use serde::Deserialize;

/// `[store]`: where tasks, events, conversations, push configurations and the webhook
/// outbox are kept.
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct StoreConfig {
    /// `log` (segment files in a directory, durable: the default), `redb` (one file,
    /// durable) or `memory` (lost on exit).
    pub backend: StoreBackend,
    /// The log's directory or the redb file (created if missing); `None`: the backend's
    /// default ([`StoreConfig::path`]).
    pub path: Option<String>,
    /// Task events written per transaction at most (one fdatasync each).
    pub max_batch: usize,
    /// redb's page cache in MiB.
    pub cache_mib: usize,
    /// Record the allocator state at each commit, so a restart after a crash does not
    /// walk the whole file. Off by default: it roughly doubles the CPU of a commit
    /// (docs/STORE.md), and the walk adds seconds only to a restart after a crash.
    pub quick_repair: bool,
    /// Writes handed to the store and not yet durable, at most; beyond it new tasks are
    /// refused (429) until the disk catches up.
    pub max_pending_writes: u64,
    /// How long, at most, the committer keeps its core awake while a commit waits on the
    /// disk (µs per commit; 0: never). A thread under `SCHED_IDLE` yields in a loop through
    /// the wait, so that the disk's completion finds the core running instead of handed
    /// back to the hypervisor (docs/CONFIG.md). `None` (not set): 1000, or 0 when the
    /// process runs under a CPU quota (a cgroup's `cpu.max` or `cpu.cfs_quota_us`), where
    /// the spinning would be charged to the quota and throttle the real work.
    pub sync_spin_us: Option<u64>,
    /// Start even though some records of the file cannot be read: they are copied to a
    /// file beside the store (`<path>.damaged-<time>.jsonl`) and removed from it. Not a
    /// configuration key: the command line's `--set-aside-damaged` sets it for one start
    /// (an operator's decision, never a standing default).
    #[serde(skip)]
    pub set_aside_damaged: bool,
}

/// Which store backend.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum StoreBackend {
    /// A log of framed records in segment files, durable; read from memory.
    #[default]
    Log,
    /// One redb file, durable.
    Redb,
    /// In memory only.
    Memory,
}

/// `[cluster]`: several a2ad nodes acting as one service through PostgreSQL (docs/CLUSTER.md).
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ClusterConfig {
    /// The shared engine: `postgres`.
    pub engine: ClusterEngine,
    /// The connection URL (`postgres://user:pass@host:port/db`, or key=value pairs).
    pub url: String,
    /// The schema a2ad's tables live in (created if missing).
    #[serde(default = "ClusterConfig::default_schema")]
    pub schema: String,
    /// This node's name (default: generated at start-up).
    #[serde(default)]
    pub node_id: Option<String>,
    /// A node whose heartbeat is older than this is dead: its tasks are taken over.
    #[serde(default = "ClusterConfig::default_lease_ttl_ms")]
    pub lease_ttl_ms: u64,
    /// How often a node renews its lease (and reaps, claims deliveries, polls followers).
    #[serde(default = "ClusterConfig::default_heartbeat_ms")]
    pub heartbeat_ms: u64,
    /// Connections to PostgreSQL for reads and cross-node operations.
    #[serde(default = "ClusterConfig::default_pool_size")]
    pub pool_size: usize,
    /// Committers side by side, each with its own connection and one transaction at a
    /// time; a task's writes always go through the same one.
    #[serde(default = "ClusterConfig::default_commit_lanes")]
    pub commit_lanes: usize,
    /// Followers of tasks another node runs (streams and waiting sends) this node holds at
    /// most; past it new ones are refused as busy.
    #[serde(default = "ClusterConfig::default_max_followers")]
    pub max_followers: usize,
    /// What a working task of a dead node becomes.
    #[serde(default)]
    pub on_node_loss: NodeLoss,
    /// PEM file with the certificate authorities PostgreSQL's certificate must chain to.
    /// Set (or `sslmode=require` in the URL), connections use TLS (rustls); the server's
    /// certificate is verified against these authorities — else the system's — and its name
    /// against the URL's host.
    #[serde(default)]
    pub ca_file: Option<String>,
}

/// Which shared engine.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum ClusterEngine {
    /// PostgreSQL (12 or later).
    Postgres,
}

/// What a working task of a dead node becomes.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum NodeLoss {
    /// `failed` with "node lost".
    #[default]
    Fail,
    /// Run again from its first message, on the node that takes it over — for agents whose
    /// backend declares it can be resumed; the others fail.
    Resume,
}

impl ClusterConfig {
    /// Default lease.
    pub const DEFAULT_LEASE_TTL_MS: u64 = 10_000;
    /// Default heartbeat.
    pub const DEFAULT_HEARTBEAT_MS: u64 = 1_000;
    /// Default pool.
    pub const DEFAULT_POOL_SIZE: usize = 16;
    /// Default `commit_lanes`: one (docs/decisions/one-statement-a-batch-on-postgresql.md).
    pub const DEFAULT_COMMIT_LANES: usize = 1;
    /// Default `max_followers`.
    pub const DEFAULT_MAX_FOLLOWERS: usize = 10_000;

    fn default_schema() -> String {
        "a2ad".into()
    }
    fn default_lease_ttl_ms() -> u64 {
        Self::DEFAULT_LEASE_TTL_MS
    }
    fn default_heartbeat_ms() -> u64 {
        Self::DEFAULT_HEARTBEAT_MS
    }
    fn default_pool_size() -> usize {
        Self::DEFAULT_POOL_SIZE
    }
    fn default_commit_lanes() -> usize {
        Self::DEFAULT_COMMIT_LANES
    }
    fn default_max_followers() -> usize {
        Self::DEFAULT_MAX_FOLLOWERS
    }

    /// A cluster on this PostgreSQL URL with every other setting at its default.
    pub fn postgres(url: impl Into<String>) -> Self {
        Self {
            engine: ClusterEngine::Postgres,
            url: url.into(),
            schema: Self::default_schema(),
            node_id: None,
            lease_ttl_ms: Self::DEFAULT_LEASE_TTL_MS,
            heartbeat_ms: Self::DEFAULT_HEARTBEAT_MS,
            pool_size: Self::DEFAULT_POOL_SIZE,
            commit_lanes: Self::DEFAULT_COMMIT_LANES,
            max_followers: Self::DEFAULT_MAX_FOLLOWERS,
            on_node_loss: NodeLoss::Fail,
            ca_file: None,
        }
    }
}

impl StoreConfig {
    /// Default directory of the log store.
    pub const DEFAULT_LOG_PATH: &'static str = "./a2ad-data/log";
    /// Default file of the redb store.
    pub const DEFAULT_REDB_PATH: &'static str = "./a2ad-data/a2ad.redb";
    /// Default events per transaction.
    pub const DEFAULT_MAX_BATCH: usize = 1024;
    /// Default page cache.
    pub const DEFAULT_CACHE_MIB: usize = 64;
    /// Default bound on writes not yet durable.
    pub const DEFAULT_MAX_PENDING_WRITES: u64 = 200_000;
    /// Default spin per commit (without a CPU quota): 1 ms, several times a commit on a
    /// fast disk.
    pub const DEFAULT_SYNC_SPIN_US: u64 = 1_000;

    /// A memory store (tests, embedders who keep nothing).
    pub fn memory() -> Self {
        Self {
            backend: StoreBackend::Memory,
            ..Self::default()
        }
    }

    /// A redb store in this file.
    pub fn redb(path: impl Into<String>) -> Self {
        Self {
            backend: StoreBackend::Redb,
            path: Some(path.into()),
            ..Self::default()
        }
    }

    /// A log store in this directory.
    pub fn log(path: impl Into<String>) -> Self {
        Self {
            backend: StoreBackend::Log,
            path: Some(path.into()),
            ..Self::default()
        }
    }

    /// Where the store lives: `path`, or the backend's default.
    pub fn path(&self) -> &str {
        match (&self.path, self.backend) {
            (Some(p), _) => p,
            (None, StoreBackend::Redb) => Self::DEFAULT_REDB_PATH,
            (None, _) => Self::DEFAULT_LOG_PATH,
        }
    }
}

impl Default for StoreConfig {
    fn default() -> Self {
        Self {
            backend: StoreBackend::Log,
            path: None,
            max_batch: Self::DEFAULT_MAX_BATCH,
            cache_mib: Self::DEFAULT_CACHE_MIB,
            quick_repair: false,
            max_pending_writes: Self::DEFAULT_MAX_PENDING_WRITES,
            sync_spin_us: None,
            set_aside_damaged: false,
        }
    }
}
