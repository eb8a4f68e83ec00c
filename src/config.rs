//! Configuration: plain data read from the TOML file of `CONFIG.md`, with defaults and
//! validation. Parsing is separate from I/O so tests build a `Config` in code.
//!
//! Unknown keys are errors, so a typo never silently falls back to a default; every number
//! is range-checked (`config/check.rs`), so no setting can overflow a duration, disable a
//! bound or exhaust memory by accident.

use std::fmt;
use std::net::SocketAddr;
use std::path::Path;
use std::time::Duration;

use serde::Deserialize;

mod check;

/// The whole configuration.
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Config {
    /// `[server]`
    #[serde(default)]
    pub server: ServerConfig,
    /// `[webhooks]`
    #[serde(default)]
    pub webhooks: WebhooksConfig,
    /// `[store]`
    #[serde(default)]
    pub store: StoreConfig,
    /// `[cluster]`: several nodes as one service on a shared PostgreSQL. Absent: this
    /// node runs alone on `[store]`.
    #[serde(default)]
    pub cluster: Option<ClusterConfig>,
    /// `[[api_keys]]`; empty means a development key is generated at start-up.
    #[serde(default)]
    pub api_keys: Vec<ApiKeyConfig>,
    /// `[[agents]]`; empty means the built-in `echo` agent.
    #[serde(default)]
    pub agents: Vec<AgentConfig>,
}

/// `[server]`
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct ServerConfig {
    /// Address to listen on; port 0 picks a free port.
    pub listen: String,
    /// The public base URL (`https://host[:port][/prefix]`) used in agent cards; unset:
    /// `http://` + the request's `Host`.
    pub public_url: Option<String>,
    /// The agent the host-level `/.well-known/agent-card.json` describes (default: the
    /// first agent).
    pub default_agent: Option<String>,
    /// The card shape for a request that names no A2A version: `"1.0"` or `"0.3"`.
    pub card_default_version: String,
    /// Pending connections the kernel queues.
    pub listen_backlog: u32,
    /// Request body cap; default: largest `max_file_size` × 4/3 + 1 MiB.
    pub max_body_bytes: Option<u64>,
    /// Idle time before a `: ping` comment on a stream.
    pub ping_interval_seconds: f64,
    /// How long finished tasks stay queryable.
    pub task_retention_seconds: f64,
    /// Streams per task at most.
    pub max_subscribers_per_task: usize,
    /// Events buffered per stream; a client that falls further behind is dropped.
    pub stream_buffer: usize,
    /// Finished tasks kept at most, whatever their age (oldest evicted first).
    pub max_finished_tasks: usize,
    /// Bytes all retained finished tasks may hold together (oldest evicted first).
    pub max_retained_bytes: u64,
    /// Messages one task's history keeps at most; later progress updates are streamed
    /// but not kept (the reply always is).
    pub max_task_history: usize,
    /// Tasks not yet finished, across all agents, at most (admission control).
    pub max_live_tasks: usize,
    /// Open connections at most; further connections wait in the backlog. Lowered at
    /// start-up to what the process's file-descriptor limit allows.
    pub max_connections: usize,
    /// Time a new connection has to send its first byte.
    pub first_byte_timeout_seconds: f64,
    /// Time an open connection with no request in flight may stay silent (keep-alive).
    pub idle_timeout_seconds: f64,
    /// Time a response write may make no progress before the connection is closed.
    pub write_timeout_seconds: f64,
    /// Time allowed to send request headers once the first byte arrived (Slowloris guard).
    pub header_read_timeout_seconds: f64,
    /// Size of a request's header block at most (HTTP/1.1 and HTTP/2).
    pub max_header_bytes: usize,
    /// Time allowed to send the request body once headers arrived.
    pub body_read_timeout_seconds: f64,
    /// Requests in one JSON-RPC batch at most.
    pub max_batch_size: usize,
    /// Bytes of a batch's answer at most: items whose answers would take it past this are
    /// answered with -32600 instead.
    pub max_batch_response_bytes: usize,
    /// Bytes of the tasks of one ListTasks page at most: a page stops early (with a
    /// `nextPageToken`) rather than pass it; a page always holds at least one task.
    pub max_list_page_bytes: usize,
    /// Concurrent HTTP/2 streams per connection.
    pub http2_max_concurrent_streams: u32,
    /// HTTP/2 keep-alive: a PING after this much silence; no answer within it closes.
    pub http2_keep_alive_seconds: f64,
    /// Bound on every internal actor call.
    pub actor_call_timeout_seconds: f64,
    /// Grace period on shutdown for in-flight requests and streams.
    pub shutdown_grace_seconds: f64,
    /// Turns of a conversation kept for the agent (oldest dropped first).
    pub max_context_turns: usize,
    /// Conversations kept at most, whatever their age (the oldest idle ones go first).
    pub max_contexts: usize,
}

/// `[webhooks]`
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct WebhooksConfig {
    /// Allow loopback and private-range targets; link-local is always refused.
    pub allow_private_networks: bool,
    /// Webhook actors in the pool.
    pub workers: usize,
    /// Deliveries accepted and not finished, at most; beyond it new ones are discarded
    /// (logged and counted).
    pub max_pending_deliveries: usize,
    /// Push configurations addressed by id that one task may hold (official dialects).
    pub max_configs_per_task: usize,
}

/// `[store]`: where tasks, events, conversations, push configurations and the webhook
/// outbox are kept.
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct StoreConfig {
    /// `redb` (one file, durable: the default) or `memory` (lost on exit).
    pub backend: StoreBackend,
    /// The redb file (its directory is created if missing).
    pub path: String,
    /// Task events written per transaction at most (one fdatasync each).
    pub max_batch: usize,
    /// redb's page cache in MiB.
    pub cache_mib: usize,
    /// Record the allocator state at each commit, so a restart after a crash does not
    /// walk the whole file. Off by default: it roughly doubles the CPU of a commit
    /// (docs/PERFORMANCE.md), and the walk adds seconds only to a restart after a crash.
    pub quick_repair: bool,
    /// Writes handed to the store and not yet durable, at most; beyond it new tasks are
    /// refused (429) until the disk catches up.
    pub max_pending_writes: u64,
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
    /// One redb file, durable.
    #[default]
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
    /// Followers of tasks another node runs (streams and waiting sends) this node holds at
    /// most; past it new ones are refused as busy.
    #[serde(default = "ClusterConfig::default_max_followers")]
    pub max_followers: usize,
    /// What a working task of a dead node becomes.
    #[serde(default)]
    pub on_node_loss: NodeLoss,
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
            max_followers: Self::DEFAULT_MAX_FOLLOWERS,
            on_node_loss: NodeLoss::Fail,
        }
    }
}

/// `[[api_keys]]`
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ApiKeyConfig {
    /// The principal that owns what this key creates.
    pub name: String,
    /// Plaintext, or `sha256:<64 hex digits>`.
    pub key: String,
    /// Agent ids this key may use; `*` means all.
    #[serde(default = "default_key_agents")]
    pub agents: Vec<String>,
}

/// `[[agents]]`
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AgentConfig {
    /// The `{agent_id}` in the URL.
    pub id: String,
    /// Display name; defaults to the id.
    pub name: Option<String>,
    /// Description.
    #[serde(default)]
    pub description: String,
    /// Agent version.
    #[serde(default = "default_version")]
    pub version: String,
    /// Backend kind: `echo`.
    #[serde(default = "default_backend")]
    pub backend: String,
    /// Whether `message/stream` and `tasks/resubscribe` are served.
    #[serde(default = "yes")]
    pub streaming: bool,
    /// Whether push notifications can be configured.
    #[serde(default = "yes")]
    pub webhooks: bool,
    /// Whether the public agent card is served (else only the authenticated methods).
    #[serde(default = "yes")]
    pub public_card: bool,
    /// `[agents.limits]`
    #[serde(default)]
    pub limits: AgentLimits,
    /// `[agents.echo]`
    #[serde(default)]
    pub echo: EchoConfig,
    /// `[agents.openai]`: required with `backend = "openai"`.
    #[serde(default)]
    pub openai: Option<OpenAiConfig>,
    /// `[agents.tck]`
    #[serde(default)]
    pub tck: TckConfig,
}

/// `[agents.tck]`: the conformance backend (docs/PROTOCOL.md §10; docs/CONFIG.md).
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct TckConfig {
    /// How long a `test-resubscribe-message-id…` task stays `working`.
    pub long_running_ms: u64,
}

impl TckConfig {
    /// Default time a long-running conformance task works.
    pub const DEFAULT_LONG_RUNNING_MS: u64 = 10_000;
}

impl Default for TckConfig {
    fn default() -> Self {
        Self {
            long_running_ms: Self::DEFAULT_LONG_RUNNING_MS,
        }
    }
}

/// `[agents.openai]`: an OpenAI-compatible Chat Completions upstream.
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct OpenAiConfig {
    /// The API base, e.g. `http://127.0.0.1:11434/v1` (`/chat/completions` is appended).
    pub base_url: String,
    /// The model name.
    pub model: String,
    /// The environment variable holding the upstream API key (none: no `Authorization`).
    #[serde(default)]
    pub api_key_env: Option<String>,
    /// A system message sent first.
    #[serde(default)]
    pub system_prompt: Option<String>,
    /// Sampling temperature (0–2).
    #[serde(default)]
    pub temperature: Option<f64>,
    /// Upper bound on generated tokens.
    #[serde(default)]
    pub max_tokens: Option<u32>,
    /// Bound on one upstream call, from request to the last chunk.
    #[serde(default = "OpenAiConfig::default_timeout")]
    pub request_timeout_seconds: f64,
    /// Earlier turns of the conversation sent as chat history (oldest dropped first).
    #[serde(default = "OpenAiConfig::default_history_turns")]
    pub max_history_turns: usize,
    /// Bytes of one upstream answer at most (a JSON body, or a whole stream); past it the
    /// task fails "upstream answer too large".
    #[serde(default = "OpenAiConfig::default_max_response_bytes")]
    pub max_response_bytes: usize,
}

/// `[agents.limits]`
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct AgentLimits {
    /// Token bucket per principal per agent; the burst is the same figure.
    pub requests_per_minute: u64,
    /// Tasks `working` at once.
    pub concurrent_tasks: usize,
    /// Tasks waiting in `submitted`; default 10 × `concurrent_tasks`.
    pub max_queued_tasks: Option<usize>,
    /// Unicode scalar values over all text parts of a message.
    pub max_message_length: usize,
    /// Parts of one message at most.
    pub max_parts: usize,
    /// Decoded bytes of one file part.
    pub max_file_size: u64,
    /// Accepted MIME types of file parts; `type/*` entries allowed.
    pub supported_types: Vec<String>,
    /// A task still running after this becomes `canceled` with reason `timeout`.
    pub task_timeout_seconds: f64,
    /// How long `message/send` waits for a terminal state.
    pub sync_wait_seconds: f64,
}

/// `[agents.echo]`
#[derive(Clone, Debug, Default, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct EchoConfig {
    /// Time before the reply.
    pub delay_ms: u64,
    /// `working` updates with progress, spread over `delay_ms`.
    pub progress_steps: u32,
    /// Every task ends `failed`.
    pub fail: bool,
}

/// A configuration problem: the file, the key and what is wrong.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConfigError {
    /// The file, when the configuration came from one.
    pub file: Option<String>,
    /// The key path, e.g. `agents[0].limits.concurrent_tasks`.
    pub key: Option<String>,
    /// Line and column (1-based) for syntax errors.
    pub position: Option<(usize, usize)>,
    /// What is wrong.
    pub message: String,
}

// === impl Config ===

impl Config {
    /// Default listen address.
    pub const DEFAULT_LISTEN: &'static str = "127.0.0.1:8080";
    /// Default agent id of the built-in configuration.
    pub const DEFAULT_AGENT_ID: &'static str = "echo";
    /// The request body cap never exceeds this, whatever the file says (1 GiB).
    pub const MAX_BODY_BYTES: u64 = 1 << 30;

    /// Reads, parses and validates a TOML file. A file with no keys at all is refused:
    /// it is almost always the wrong file (run without `--config` for the built-in one).
    ///
    /// # Errors
    /// A [`ConfigError`] naming the file, and the key or position where there is one.
    pub fn load(path: &Path) -> Result<Self, ConfigError> {
        let file = path.display().to_string();
        let with_file = |mut e: ConfigError| {
            e.file = Some(file.clone());
            e
        };
        let text = std::fs::read_to_string(path)
            .map_err(|e| with_file(ConfigError::new(None, format!("cannot read file: {e}"))))?;
        let empty = text
            .parse::<toml::Table>()
            .is_ok_and(|table| table.is_empty());
        if empty {
            return Err(with_file(ConfigError::new(
                None,
                "the file holds no settings; run a2ad without --config to serve the built-in configuration",
            )));
        }
        Self::from_toml(&text).map_err(with_file)
    }

    /// Parses and validates TOML text.
    ///
    /// # Errors
    /// A [`ConfigError`] naming the key or position.
    pub fn from_toml(text: &str) -> Result<Self, ConfigError> {
        let de = toml::Deserializer::parse(text).map_err(|e| toml_error(text, &e, None))?;
        let config: Config = serde_path_to_error::deserialize(de).map_err(|e| {
            let path = e.path().to_string();
            let key = (path != ".").then_some(path);
            toml_error(text, e.inner(), key)
        })?;
        // A backend's options on an agent of another backend are a mistake the typed
        // structure cannot see (the tables have defaults), so look at the text's tables.
        if let Ok(table) = text.parse::<toml::Table>() {
            check::backend_tables(&table, &config)?;
        }
        config.validated()
    }

    /// Fills the defaults that depend on other keys and checks every rule.
    ///
    /// # Errors
    /// A [`ConfigError`] naming the key.
    pub fn validated(mut self) -> Result<Self, ConfigError> {
        if self.agents.is_empty() {
            self.agents.push(AgentConfig::new(Self::DEFAULT_AGENT_ID));
        }
        check::config(&mut self)?;
        Ok(self)
    }

    /// The request body cap: `max_body_bytes`, or the largest `max_file_size` × 4/3 + 1 MiB,
    /// never above [`Config::MAX_BODY_BYTES`].
    pub fn max_body_bytes(&self) -> u64 {
        let cap = self.server.max_body_bytes.unwrap_or_else(|| {
            let largest = self
                .agents
                .iter()
                .map(|a| a.limits.max_file_size)
                .max()
                .unwrap_or(0);
            largest.saturating_mul(4) / 3 + 1024 * 1024
        });
        cap.min(Self::MAX_BODY_BYTES)
    }

    /// The listen address (a host name such as `localhost` is resolved).
    ///
    /// # Errors
    /// A [`ConfigError`] on `server.listen` when it is not `HOST:PORT`.
    pub fn listen_addr(&self) -> Result<SocketAddr, ConfigError> {
        check::resolve_listen(&self.server.listen)
    }
}

impl Default for Config {
    /// The built-in configuration: one `echo` agent on 127.0.0.1:8080, no keys (a
    /// development key is generated at start-up).
    fn default() -> Self {
        Self {
            server: ServerConfig::default(),
            webhooks: WebhooksConfig::default(),
            store: StoreConfig::default(),
            cluster: None,
            api_keys: Vec::new(),
            agents: vec![AgentConfig::new(Self::DEFAULT_AGENT_ID)],
        }
    }
}

fn toml_error(text: &str, e: &toml::de::Error, key: Option<String>) -> ConfigError {
    let position = e.span().map(|span| line_col(text, span.start));
    ConfigError {
        file: None,
        key,
        position,
        message: e.message().trim().to_string(),
    }
}

fn line_col(text: &str, offset: usize) -> (usize, usize) {
    let mut end = offset.min(text.len());
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    let before = &text[..end];
    let line = before.matches('\n').count() + 1;
    let col = before.rsplit('\n').next().map_or(0, |l| l.chars().count()) + 1;
    (line, col)
}

// === impl ServerConfig ===

/// The settings given in seconds, as [`Duration`]s: each converted here, in one place.
impl ServerConfig {
    /// `body_read_timeout_seconds` as a [`Duration`].
    pub fn body_read_timeout(&self) -> Duration {
        seconds(self.body_read_timeout_seconds)
    }

    /// `ping_interval_seconds` as a [`Duration`].
    pub fn ping_interval(&self) -> Duration {
        seconds(self.ping_interval_seconds)
    }

    /// `header_read_timeout_seconds` as a [`Duration`].
    pub fn header_read_timeout(&self) -> Duration {
        seconds(self.header_read_timeout_seconds)
    }

    /// `http2_keep_alive_seconds` as a [`Duration`].
    pub fn http2_keep_alive(&self) -> Duration {
        seconds(self.http2_keep_alive_seconds)
    }

    /// `first_byte_timeout_seconds` as a [`Duration`].
    pub fn first_byte_timeout(&self) -> Duration {
        seconds(self.first_byte_timeout_seconds)
    }

    /// `idle_timeout_seconds` as a [`Duration`].
    pub fn idle_timeout(&self) -> Duration {
        seconds(self.idle_timeout_seconds)
    }

    /// `write_timeout_seconds` as a [`Duration`].
    pub fn write_timeout(&self) -> Duration {
        seconds(self.write_timeout_seconds)
    }

    /// `shutdown_grace_seconds` as a [`Duration`].
    pub fn shutdown_grace(&self) -> Duration {
        seconds(self.shutdown_grace_seconds)
    }

    /// `task_retention_seconds` as a [`Duration`].
    pub fn task_retention(&self) -> Duration {
        seconds(self.task_retention_seconds)
    }

    /// `actor_call_timeout_seconds` as a [`Duration`].
    pub fn actor_call_timeout(&self) -> Duration {
        seconds(self.actor_call_timeout_seconds)
    }
}

/// The settings given in seconds, as [`Duration`]s.
impl AgentLimits {
    /// `task_timeout_seconds` as a [`Duration`].
    pub fn task_timeout(&self) -> Duration {
        seconds(self.task_timeout_seconds)
    }

    /// `sync_wait_seconds` as a [`Duration`].
    pub fn sync_wait(&self) -> Duration {
        seconds(self.sync_wait_seconds)
    }
}

/// A number of seconds as a [`Duration`]: the validated range makes every value fit; a
/// configuration built in code without validation gets 0 for a negative or NaN value and
/// the longest `Duration` for one too large, never a panic.
fn seconds(value: f64) -> Duration {
    if value.is_nan() || value <= 0.0 {
        Duration::ZERO
    } else {
        Duration::try_from_secs_f64(value).unwrap_or(Duration::MAX)
    }
}

impl ServerConfig {
    /// Default kernel backlog.
    pub const DEFAULT_LISTEN_BACKLOG: u32 = 4096;
    /// Default card shape for requests that name no version.
    pub const DEFAULT_CARD_VERSION: &'static str = "1.0";
    /// Default idle time before a `: ping`.
    pub const DEFAULT_PING_INTERVAL_SECONDS: f64 = 15.0;
    /// Default retention of finished tasks.
    pub const DEFAULT_TASK_RETENTION_SECONDS: f64 = 3600.0;
    /// Default stream limit per task.
    pub const DEFAULT_MAX_SUBSCRIBERS_PER_TASK: usize = 1000;
    /// Default per-stream event buffer.
    pub const DEFAULT_STREAM_BUFFER: usize = 1024;
    /// Default cap on retained finished tasks.
    pub const DEFAULT_MAX_FINISHED_TASKS: usize = 2_000_000;
    /// Default byte budget of retained finished tasks (1 GiB).
    pub const DEFAULT_MAX_RETAINED_BYTES: u64 = 1 << 30;
    /// Default cap on a task's kept messages.
    pub const DEFAULT_MAX_TASK_HISTORY: usize = 1000;
    /// Default cap on unfinished tasks.
    pub const DEFAULT_MAX_LIVE_TASKS: usize = 100_000;
    /// Default cap on open connections (lowered to the file-descriptor limit at start-up).
    pub const DEFAULT_MAX_CONNECTIONS: usize = 50_000;
    /// Default time a new connection has to send its first byte.
    pub const DEFAULT_FIRST_BYTE_TIMEOUT_SECONDS: f64 = 10.0;
    /// Default keep-alive idle time.
    pub const DEFAULT_IDLE_TIMEOUT_SECONDS: f64 = 60.0;
    /// Default stalled-write time.
    pub const DEFAULT_WRITE_TIMEOUT_SECONDS: f64 = 30.0;
    /// Default header read time-out.
    pub const DEFAULT_HEADER_READ_TIMEOUT_SECONDS: f64 = 30.0;
    /// Default header block cap (64 KiB).
    pub const DEFAULT_MAX_HEADER_BYTES: usize = 64 * 1024;
    /// Default body read time-out.
    pub const DEFAULT_BODY_READ_TIMEOUT_SECONDS: f64 = 60.0;
    /// Default batch cap.
    pub const DEFAULT_MAX_BATCH_SIZE: usize = 100;
    /// Default HTTP/2 streams per connection.
    pub const DEFAULT_HTTP2_MAX_CONCURRENT_STREAMS: u32 = 256;
    /// Default HTTP/2 keep-alive.
    pub const DEFAULT_HTTP2_KEEP_ALIVE_SECONDS: f64 = 20.0;
    /// Default internal call bound.
    pub const DEFAULT_ACTOR_CALL_TIMEOUT_SECONDS: f64 = 10.0;
    /// Default byte budget of a batch's answer (16 MiB).
    pub const DEFAULT_MAX_BATCH_RESPONSE_BYTES: usize = 16 << 20;
    /// Default byte bound of a ListTasks page (4 MiB).
    pub const DEFAULT_MAX_LIST_PAGE_BYTES: usize = 4 << 20;
    /// Default shutdown grace.
    pub const DEFAULT_SHUTDOWN_GRACE_SECONDS: f64 = 10.0;
    /// Default conversation turns kept.
    pub const DEFAULT_MAX_CONTEXT_TURNS: usize = 100;
    /// Default cap on conversations.
    pub const DEFAULT_MAX_CONTEXTS: usize = 2_000_000;
}

impl Default for ServerConfig {
    fn default() -> Self {
        Self {
            listen: Config::DEFAULT_LISTEN.to_string(),
            public_url: None,
            default_agent: None,
            card_default_version: Self::DEFAULT_CARD_VERSION.to_string(),
            listen_backlog: Self::DEFAULT_LISTEN_BACKLOG,
            max_body_bytes: None,
            ping_interval_seconds: Self::DEFAULT_PING_INTERVAL_SECONDS,
            task_retention_seconds: Self::DEFAULT_TASK_RETENTION_SECONDS,
            max_subscribers_per_task: Self::DEFAULT_MAX_SUBSCRIBERS_PER_TASK,
            stream_buffer: Self::DEFAULT_STREAM_BUFFER,
            max_finished_tasks: Self::DEFAULT_MAX_FINISHED_TASKS,
            max_retained_bytes: Self::DEFAULT_MAX_RETAINED_BYTES,
            max_task_history: Self::DEFAULT_MAX_TASK_HISTORY,
            max_live_tasks: Self::DEFAULT_MAX_LIVE_TASKS,
            max_connections: Self::DEFAULT_MAX_CONNECTIONS,
            first_byte_timeout_seconds: Self::DEFAULT_FIRST_BYTE_TIMEOUT_SECONDS,
            idle_timeout_seconds: Self::DEFAULT_IDLE_TIMEOUT_SECONDS,
            write_timeout_seconds: Self::DEFAULT_WRITE_TIMEOUT_SECONDS,
            header_read_timeout_seconds: Self::DEFAULT_HEADER_READ_TIMEOUT_SECONDS,
            max_header_bytes: Self::DEFAULT_MAX_HEADER_BYTES,
            body_read_timeout_seconds: Self::DEFAULT_BODY_READ_TIMEOUT_SECONDS,
            max_batch_size: Self::DEFAULT_MAX_BATCH_SIZE,
            max_batch_response_bytes: Self::DEFAULT_MAX_BATCH_RESPONSE_BYTES,
            max_list_page_bytes: Self::DEFAULT_MAX_LIST_PAGE_BYTES,
            http2_max_concurrent_streams: Self::DEFAULT_HTTP2_MAX_CONCURRENT_STREAMS,
            http2_keep_alive_seconds: Self::DEFAULT_HTTP2_KEEP_ALIVE_SECONDS,
            actor_call_timeout_seconds: Self::DEFAULT_ACTOR_CALL_TIMEOUT_SECONDS,
            shutdown_grace_seconds: Self::DEFAULT_SHUTDOWN_GRACE_SECONDS,
            max_context_turns: Self::DEFAULT_MAX_CONTEXT_TURNS,
            max_contexts: Self::DEFAULT_MAX_CONTEXTS,
        }
    }
}

// === impl WebhooksConfig ===

impl WebhooksConfig {
    /// Default pool size.
    pub const DEFAULT_WORKERS: usize = 8;
    /// Default cap on pending deliveries.
    pub const DEFAULT_MAX_PENDING_DELIVERIES: usize = 100_000;
    /// Default cap on a task's named configurations.
    pub const DEFAULT_MAX_CONFIGS_PER_TASK: usize = 10;
}

impl Default for WebhooksConfig {
    fn default() -> Self {
        Self {
            allow_private_networks: false,
            workers: Self::DEFAULT_WORKERS,
            max_pending_deliveries: Self::DEFAULT_MAX_PENDING_DELIVERIES,
            max_configs_per_task: Self::DEFAULT_MAX_CONFIGS_PER_TASK,
        }
    }
}

// === impl StoreConfig ===

impl StoreConfig {
    /// Default file.
    pub const DEFAULT_PATH: &'static str = "./a2ad-data/a2ad.redb";
    /// Default events per transaction.
    pub const DEFAULT_MAX_BATCH: usize = 1024;
    /// Default page cache.
    pub const DEFAULT_CACHE_MIB: usize = 64;
    /// Default bound on writes not yet durable.
    pub const DEFAULT_MAX_PENDING_WRITES: u64 = 200_000;

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
            path: path.into(),
            ..Self::default()
        }
    }
}

impl Default for StoreConfig {
    fn default() -> Self {
        Self {
            backend: StoreBackend::Redb,
            path: Self::DEFAULT_PATH.into(),
            max_batch: Self::DEFAULT_MAX_BATCH,
            cache_mib: Self::DEFAULT_CACHE_MIB,
            quick_repair: false,
            max_pending_writes: Self::DEFAULT_MAX_PENDING_WRITES,
            set_aside_damaged: false,
        }
    }
}

// === impl AgentConfig ===

impl AgentConfig {
    /// Backends this build knows.
    pub const BACKENDS: &'static [&'static str] = &["echo", "openai", "tck"];

    /// An agent with every default and the given id.
    pub fn new(id: &str) -> Self {
        Self {
            id: id.to_string(),
            name: None,
            description: String::new(),
            version: default_version(),
            backend: default_backend(),
            streaming: true,
            webhooks: true,
            public_card: true,
            limits: AgentLimits::default(),
            echo: EchoConfig::default(),
            openai: None,
            tck: TckConfig::default(),
        }
    }

    /// The display name (the id when none is set).
    pub fn display_name(&self) -> &str {
        self.name.as_deref().unwrap_or(&self.id)
    }
}

// === impl OpenAiConfig ===

impl OpenAiConfig {
    /// Default upstream time-out.
    pub const DEFAULT_REQUEST_TIMEOUT_SECONDS: f64 = 120.0;
    /// Default history turns.
    pub const DEFAULT_MAX_HISTORY_TURNS: usize = 20;
    /// Default bound on one upstream answer (16 MiB).
    pub const DEFAULT_MAX_RESPONSE_BYTES: usize = 16 << 20;

    /// An upstream at `base_url` serving `model`, every other option at its default.
    pub fn new(base_url: &str, model: &str) -> Self {
        Self {
            base_url: base_url.to_string(),
            model: model.to_string(),
            api_key_env: None,
            system_prompt: None,
            temperature: None,
            max_tokens: None,
            request_timeout_seconds: Self::DEFAULT_REQUEST_TIMEOUT_SECONDS,
            max_history_turns: Self::DEFAULT_MAX_HISTORY_TURNS,
            max_response_bytes: Self::DEFAULT_MAX_RESPONSE_BYTES,
        }
    }

    fn default_max_response_bytes() -> usize {
        Self::DEFAULT_MAX_RESPONSE_BYTES
    }

    fn default_timeout() -> f64 {
        Self::DEFAULT_REQUEST_TIMEOUT_SECONDS
    }

    fn default_history_turns() -> usize {
        Self::DEFAULT_MAX_HISTORY_TURNS
    }
}

// === impl AgentLimits ===

impl AgentLimits {
    /// Default requests per minute.
    pub const DEFAULT_REQUESTS_PER_MINUTE: u64 = 600;
    /// Default concurrent tasks.
    pub const DEFAULT_CONCURRENT_TASKS: usize = 16;
    /// Default message length.
    pub const DEFAULT_MAX_MESSAGE_LENGTH: usize = 100_000;
    /// Default parts per message.
    pub const DEFAULT_MAX_PARTS: usize = 100;
    /// Default file size (10 MiB).
    pub const DEFAULT_MAX_FILE_SIZE: u64 = 10_485_760;
    /// Default task time-out.
    pub const DEFAULT_TASK_TIMEOUT_SECONDS: f64 = 300.0;
    /// Default wait of `message/send`.
    pub const DEFAULT_SYNC_WAIT_SECONDS: f64 = 30.0;

    /// `max_queued_tasks`, with its default resolved.
    pub fn max_queued(&self) -> usize {
        self.max_queued_tasks
            .unwrap_or(self.concurrent_tasks.saturating_mul(10))
    }
}

impl Default for AgentLimits {
    fn default() -> Self {
        Self {
            requests_per_minute: Self::DEFAULT_REQUESTS_PER_MINUTE,
            concurrent_tasks: Self::DEFAULT_CONCURRENT_TASKS,
            max_queued_tasks: None,
            max_message_length: Self::DEFAULT_MAX_MESSAGE_LENGTH,
            max_parts: Self::DEFAULT_MAX_PARTS,
            max_file_size: Self::DEFAULT_MAX_FILE_SIZE,
            supported_types: [
                "text/plain",
                "application/json",
                "application/pdf",
                "image/*",
            ]
            .map(String::from)
            .to_vec(),
            task_timeout_seconds: Self::DEFAULT_TASK_TIMEOUT_SECONDS,
            sync_wait_seconds: Self::DEFAULT_SYNC_WAIT_SECONDS,
        }
    }
}

// === impl ApiKeyConfig ===

impl ApiKeyConfig {
    /// A key for `name` that may use every agent.
    pub fn new(name: &str, key: &str) -> Self {
        Self {
            name: name.to_string(),
            key: key.to_string(),
            agents: default_key_agents(),
        }
    }
}

// === impl ConfigError ===

impl ConfigError {
    fn new(key: Option<String>, message: impl Into<String>) -> Self {
        Self {
            file: None,
            key,
            position: None,
            message: message.into(),
        }
    }

    fn key(key: impl Into<String>, message: impl Into<String>) -> Self {
        Self::new(Some(key.into()), message)
    }
}

impl fmt::Display for ConfigError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("configuration error")?;
        if let Some(file) = &self.file {
            write!(f, " in {file}")?;
        }
        if let Some((line, col)) = self.position {
            write!(f, " at line {line}, column {col}")?;
        }
        if let Some(key) = &self.key {
            write!(f, ": key `{key}`")?;
        }
        write!(f, ": {}", self.message)
    }
}

impl std::error::Error for ConfigError {}

/// Seconds in a configuration are at most this (about 31 years): durations and deadlines
/// built from them can never overflow.
pub const MAX_SECONDS: f64 = 1e9;

fn default_key_agents() -> Vec<String> {
    vec!["*".to_string()]
}

fn default_version() -> String {
    "1.0.0".to_string()
}

fn default_backend() -> String {
    "echo".to_string()
}

fn yes() -> bool {
    true
}

#[cfg(test)]
mod tests;
