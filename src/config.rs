//! Configuration: plain data read from the TOML file of `CONFIG.md`, with defaults and
//! validation. Parsing is separate from I/O so tests build a `Config` in code.
//!
//! Unknown keys are errors, so a typo never silently falls back to a default.

use std::collections::HashSet;
use std::fmt;
use std::net::SocketAddr;
use std::path::Path;

use serde::Deserialize;

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
    /// Tasks not yet finished, across all agents, at most (admission control).
    pub max_live_tasks: usize,
    /// Open connections at most; further connections wait in the backlog.
    pub max_connections: usize,
    /// Time allowed to send request headers (Slowloris guard).
    pub header_read_timeout_seconds: f64,
    /// Time allowed to send the request body once headers arrived.
    pub body_read_timeout_seconds: f64,
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
    /// `[agents.limits]`
    #[serde(default)]
    pub limits: AgentLimits,
    /// `[agents.echo]`
    #[serde(default)]
    pub echo: EchoConfig,
    /// `[agents.openai]`: required with `backend = "openai"`.
    #[serde(default)]
    pub openai: Option<OpenAiConfig>,
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
}

impl OpenAiConfig {
    /// Default upstream time-out.
    pub const DEFAULT_REQUEST_TIMEOUT_SECONDS: f64 = 120.0;
    /// Default history turns.
    pub const DEFAULT_MAX_HISTORY_TURNS: usize = 20;

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
        }
    }

    fn default_timeout() -> f64 {
        Self::DEFAULT_REQUEST_TIMEOUT_SECONDS
    }

    fn default_history_turns() -> usize {
        Self::DEFAULT_MAX_HISTORY_TURNS
    }

    fn validate(&self, at: &dyn Fn(&str) -> String) -> Result<(), ConfigError> {
        match url::Url::parse(&self.base_url) {
            Ok(u) if matches!(u.scheme(), "http" | "https") && u.host().is_some() => {}
            _ => {
                return Err(ConfigError::key(
                    at("openai.base_url"),
                    format!(
                        "{:?} is not an http(s) URL such as \"http://127.0.0.1:11434/v1\"",
                        self.base_url
                    ),
                ));
            }
        }
        if self.model.is_empty() {
            return Err(ConfigError::key(at("openai.model"), "must not be empty"));
        }
        if let Some(var) = &self.api_key_env
            && std::env::var_os(var).is_none()
        {
            return Err(ConfigError::key(
                at("openai.api_key_env"),
                format!("the environment variable {var:?} is not set"),
            ));
        }
        if let Some(t) = self.temperature
            && !(0.0..=2.0).contains(&t)
        {
            return Err(ConfigError::key(
                at("openai.temperature"),
                "must be from 0 to 2",
            ));
        }
        positive(
            &at("openai.request_timeout_seconds"),
            self.request_timeout_seconds,
        )
    }
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

    /// Reads, parses and validates a TOML file.
    ///
    /// # Errors
    /// A [`ConfigError`] naming the file, and the key or position where there is one.
    pub fn load(path: &Path) -> Result<Self, ConfigError> {
        let file = path.display().to_string();
        let text = std::fs::read_to_string(path).map_err(|e| ConfigError {
            file: Some(file.clone()),
            key: None,
            position: None,
            message: format!("cannot read file: {e}"),
        })?;
        Self::from_toml(&text).map_err(|mut e| {
            e.file = Some(file);
            e
        })
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
        self.server.validate()?;
        if self.webhooks.workers == 0 {
            return Err(ConfigError::key("webhooks.workers", "must be at least 1"));
        }
        if self.webhooks.max_pending_deliveries == 0 {
            return Err(ConfigError::key(
                "webhooks.max_pending_deliveries",
                "must be at least 1",
            ));
        }
        let mut ids = HashSet::new();
        for (i, agent) in self.agents.iter_mut().enumerate() {
            agent.validate(i)?;
            if !ids.insert(agent.id.clone()) {
                return Err(ConfigError::key(
                    format!("agents[{i}].id"),
                    format!("duplicate agent id {:?}", agent.id),
                ));
            }
        }
        let mut keys = HashSet::new();
        for (i, key) in self.api_keys.iter().enumerate() {
            key.validate(i, &ids)?;
            if !keys.insert(key.key.to_ascii_lowercase()) {
                return Err(ConfigError::key(
                    format!("api_keys[{i}].key"),
                    "the same key is configured twice",
                ));
            }
        }
        Ok(self)
    }

    /// The request body cap: `max_body_bytes`, or the largest `max_file_size` × 4/3 + 1 MiB.
    pub fn max_body_bytes(&self) -> u64 {
        self.server.max_body_bytes.unwrap_or_else(|| {
            let largest = self
                .agents
                .iter()
                .map(|a| a.limits.max_file_size)
                .max()
                .unwrap_or(0);
            largest.saturating_mul(4) / 3 + 1024 * 1024
        })
    }

    /// The listen address (a host name such as `localhost` is resolved).
    ///
    /// # Errors
    /// A [`ConfigError`] on `server.listen` when it is not `HOST:PORT`.
    pub fn listen_addr(&self) -> Result<SocketAddr, ConfigError> {
        resolve_listen(&self.server.listen)
    }
}

impl Default for Config {
    /// The built-in configuration: one `echo` agent on 127.0.0.1:8080, no keys (a
    /// development key is generated at start-up).
    fn default() -> Self {
        Self {
            server: ServerConfig::default(),
            webhooks: WebhooksConfig::default(),
            api_keys: Vec::new(),
            agents: vec![AgentConfig::new(Self::DEFAULT_AGENT_ID)],
        }
    }
}

fn resolve_listen(listen: &str) -> Result<SocketAddr, ConfigError> {
    use std::net::ToSocketAddrs as _;
    if let Ok(addr) = listen.parse() {
        return Ok(addr);
    }
    listen
        .to_socket_addrs()
        .ok()
        .and_then(|mut addrs| addrs.next())
        .ok_or_else(|| {
            ConfigError::key(
                "server.listen",
                format!("expected HOST:PORT (e.g. 127.0.0.1:8080), got {listen:?}"),
            )
        })
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

impl ServerConfig {
    /// Default kernel backlog.
    pub const DEFAULT_LISTEN_BACKLOG: u32 = 4096;
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
    /// Default cap on unfinished tasks.
    pub const DEFAULT_MAX_LIVE_TASKS: usize = 100_000;
    /// Default cap on open connections.
    pub const DEFAULT_MAX_CONNECTIONS: usize = 50_000;
    /// Default header read time-out.
    pub const DEFAULT_HEADER_READ_TIMEOUT_SECONDS: f64 = 30.0;
    /// Default body read time-out.
    pub const DEFAULT_BODY_READ_TIMEOUT_SECONDS: f64 = 60.0;
    /// Default internal call bound.
    pub const DEFAULT_ACTOR_CALL_TIMEOUT_SECONDS: f64 = 10.0;
    /// Default shutdown grace.
    pub const DEFAULT_SHUTDOWN_GRACE_SECONDS: f64 = 10.0;
    /// Default conversation turns kept.
    pub const DEFAULT_MAX_CONTEXT_TURNS: usize = 100;
    /// Default cap on conversations.
    pub const DEFAULT_MAX_CONTEXTS: usize = 2_000_000;

    fn validate(&self) -> Result<(), ConfigError> {
        resolve_listen(&self.listen)?;
        positive("server.ping_interval_seconds", self.ping_interval_seconds)?;
        non_negative("server.task_retention_seconds", self.task_retention_seconds)?;
        positive(
            "server.header_read_timeout_seconds",
            self.header_read_timeout_seconds,
        )?;
        positive(
            "server.body_read_timeout_seconds",
            self.body_read_timeout_seconds,
        )?;
        positive(
            "server.actor_call_timeout_seconds",
            self.actor_call_timeout_seconds,
        )?;
        non_negative("server.shutdown_grace_seconds", self.shutdown_grace_seconds)?;
        at_least_one(
            "server.max_subscribers_per_task",
            self.max_subscribers_per_task,
        )?;
        at_least_one("server.stream_buffer", self.stream_buffer)?;
        at_least_one("server.max_live_tasks", self.max_live_tasks)?;
        at_least_one("server.max_connections", self.max_connections)?;
        at_least_one("server.max_contexts", self.max_contexts)?;
        if self.listen_backlog == 0 {
            return Err(ConfigError::key(
                "server.listen_backlog",
                "must be at least 1",
            ));
        }
        if self.max_body_bytes == Some(0) {
            return Err(ConfigError::key(
                "server.max_body_bytes",
                "must be at least 1",
            ));
        }
        Ok(())
    }
}

impl Default for ServerConfig {
    fn default() -> Self {
        Self {
            listen: Config::DEFAULT_LISTEN.to_string(),
            listen_backlog: Self::DEFAULT_LISTEN_BACKLOG,
            max_body_bytes: None,
            ping_interval_seconds: Self::DEFAULT_PING_INTERVAL_SECONDS,
            task_retention_seconds: Self::DEFAULT_TASK_RETENTION_SECONDS,
            max_subscribers_per_task: Self::DEFAULT_MAX_SUBSCRIBERS_PER_TASK,
            stream_buffer: Self::DEFAULT_STREAM_BUFFER,
            max_finished_tasks: Self::DEFAULT_MAX_FINISHED_TASKS,
            max_live_tasks: Self::DEFAULT_MAX_LIVE_TASKS,
            max_connections: Self::DEFAULT_MAX_CONNECTIONS,
            header_read_timeout_seconds: Self::DEFAULT_HEADER_READ_TIMEOUT_SECONDS,
            body_read_timeout_seconds: Self::DEFAULT_BODY_READ_TIMEOUT_SECONDS,
            actor_call_timeout_seconds: Self::DEFAULT_ACTOR_CALL_TIMEOUT_SECONDS,
            shutdown_grace_seconds: Self::DEFAULT_SHUTDOWN_GRACE_SECONDS,
            max_context_turns: Self::DEFAULT_MAX_CONTEXT_TURNS,
            max_contexts: Self::DEFAULT_MAX_CONTEXTS,
        }
    }
}

impl Default for WebhooksConfig {
    fn default() -> Self {
        Self {
            allow_private_networks: false,
            workers: 8,
            max_pending_deliveries: 100_000,
        }
    }
}

// === impl AgentConfig ===

impl AgentConfig {
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
            limits: AgentLimits::default(),
            echo: EchoConfig::default(),
            openai: None,
        }
    }

    /// The display name (the id when none is set).
    pub fn display_name(&self) -> &str {
        self.name.as_deref().unwrap_or(&self.id)
    }

    /// Backends this build knows.
    pub const BACKENDS: &'static [&'static str] = &["echo", "openai"];

    fn validate(&mut self, i: usize) -> Result<(), ConfigError> {
        let at = |k: &str| format!("agents[{i}].{k}");
        if self.id.is_empty() {
            return Err(ConfigError::key(at("id"), "must not be empty"));
        }
        if !self
            .id
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"-._~".contains(&b))
        {
            return Err(ConfigError::key(
                at("id"),
                format!(
                    "{:?} must use only letters, digits, '-', '.', '_' and '~' (it is a URL path segment)",
                    self.id
                ),
            ));
        }
        if !Self::BACKENDS.contains(&self.backend.as_str()) {
            return Err(ConfigError::key(
                at("backend"),
                format!(
                    "unknown backend {:?}; known: {}",
                    self.backend,
                    Self::BACKENDS.join(", ")
                ),
            ));
        }
        match (&self.backend[..], &self.openai) {
            ("openai", None) => {
                return Err(ConfigError::key(
                    at("openai"),
                    "backend \"openai\" needs an [agents.openai] table with base_url and model",
                ));
            }
            ("openai", Some(o)) => o.validate(&at)?,
            (_, Some(_)) => {
                return Err(ConfigError::key(
                    at("openai"),
                    "[agents.openai] is only used with backend = \"openai\"",
                ));
            }
            _ => {}
        }
        let l = &mut self.limits;
        if l.requests_per_minute == 0 {
            return Err(ConfigError::key(
                at("limits.requests_per_minute"),
                "must be at least 1",
            ));
        }
        at_least_one(&at("limits.concurrent_tasks"), l.concurrent_tasks)?;
        at_least_one(&at("limits.max_message_length"), l.max_message_length)?;
        positive(&at("limits.task_timeout_seconds"), l.task_timeout_seconds)?;
        non_negative(&at("limits.sync_wait_seconds"), l.sync_wait_seconds)?;
        for (j, t) in l.supported_types.iter().enumerate() {
            if !is_mime_pattern(t) {
                return Err(ConfigError::key(
                    at(&format!("limits.supported_types[{j}]")),
                    format!("{t:?} is not a MIME type such as \"text/plain\" or \"image/*\""),
                ));
            }
        }
        if l.max_queued_tasks.is_none() {
            l.max_queued_tasks = Some(l.concurrent_tasks.saturating_mul(10));
        }
        Ok(())
    }
}

fn is_mime_pattern(t: &str) -> bool {
    let token = |s: &str| {
        !s.is_empty()
            && s.bytes()
                .all(|b| b.is_ascii_alphanumeric() || b"!#$&-^_.+".contains(&b))
    };
    match t.split_once('/') {
        Some((ty, sub)) => token(ty) && (sub == "*" || token(sub)),
        None => false,
    }
}

impl AgentLimits {
    /// Default requests per minute.
    pub const DEFAULT_REQUESTS_PER_MINUTE: u64 = 600;
    /// Default concurrent tasks.
    pub const DEFAULT_CONCURRENT_TASKS: usize = 16;
    /// Default message length.
    pub const DEFAULT_MAX_MESSAGE_LENGTH: usize = 100_000;
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

    fn validate(&self, i: usize, agent_ids: &HashSet<String>) -> Result<(), ConfigError> {
        let at = |k: &str| format!("api_keys[{i}].{k}");
        if self.name.is_empty() {
            return Err(ConfigError::key(at("name"), "must not be empty"));
        }
        if self.key.is_empty() {
            return Err(ConfigError::key(at("key"), "must not be empty"));
        }
        if let Some(hex) = self.key.strip_prefix("sha256:")
            && (hex.len() != 64 || !hex.bytes().all(|b| b.is_ascii_hexdigit()))
        {
            return Err(ConfigError::key(
                at("key"),
                "a hashed key is \"sha256:\" followed by 64 hex digits",
            ));
        }
        for (j, agent) in self.agents.iter().enumerate() {
            if agent != "*" && !agent_ids.contains(agent) {
                return Err(ConfigError::key(
                    at(&format!("agents[{j}]")),
                    format!("no agent with id {agent:?} is configured"),
                ));
            }
        }
        Ok(())
    }
}

// === impl ConfigError ===

impl ConfigError {
    fn key(key: impl Into<String>, message: impl Into<String>) -> Self {
        Self {
            file: None,
            key: Some(key.into()),
            position: None,
            message: message.into(),
        }
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

fn positive(key: &str, v: f64) -> Result<(), ConfigError> {
    if v.is_finite() && v > 0.0 && v <= MAX_SECONDS {
        Ok(())
    } else {
        Err(ConfigError::key(
            key,
            format!("must be a number greater than 0 and at most {MAX_SECONDS}"),
        ))
    }
}

fn non_negative(key: &str, v: f64) -> Result<(), ConfigError> {
    if v.is_finite() && (0.0..=MAX_SECONDS).contains(&v) {
        Ok(())
    } else {
        Err(ConfigError::key(
            key,
            format!("must be a number from 0 to {MAX_SECONDS}"),
        ))
    }
}

fn at_least_one(key: &str, v: usize) -> Result<(), ConfigError> {
    if v >= 1 {
        Ok(())
    } else {
        Err(ConfigError::key(key, "must be at least 1"))
    }
}

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
mod tests {
    use super::*;

    #[test]
    fn the_documented_example_file_parses_with_its_defaults() {
        let text = r#"
[server]
listen = "127.0.0.1:8080"
listen_backlog = 4096
ping_interval_seconds = 15
task_retention_seconds = 3600
max_subscribers_per_task = 1000

[webhooks]
allow_private_networks = false
workers = 8

[[api_keys]]
name = "alice"
key = "dev-key-alice"
agents = ["*"]

[[agents]]
id = "echo"
name = "Echo"
description = "Replies with what it was sent"
version = "1.0.0"
backend = "echo"
streaming = true
webhooks = true

[agents.limits]
requests_per_minute = 600
concurrent_tasks = 16
max_queued_tasks = 160
max_message_length = 100000
max_file_size = 10485760
supported_types = ["text/plain", "application/json", "application/pdf", "image/*"]
task_timeout_seconds = 300
sync_wait_seconds = 30

[agents.echo]
delay_ms = 0
progress_steps = 0
fail = false
"#;
        let c = Config::from_toml(text).expect("valid");
        assert_eq!(c.agents[0].limits.max_queued(), 160);
        assert_eq!(c.max_body_bytes(), 10_485_760 * 4 / 3 + 1024 * 1024);
        assert_eq!(c.agents[0].display_name(), "Echo");
    }

    #[test]
    fn only_the_agent_id_is_required_and_queue_defaults_to_ten_times_concurrency() {
        let c =
            Config::from_toml("[[agents]]\nid = \"a\"\n[agents.limits]\nconcurrent_tasks = 3\n")
                .expect("valid");
        let a = &c.agents[0];
        assert_eq!(a.display_name(), "a");
        assert_eq!(a.version, "1.0.0");
        assert!(a.streaming && a.webhooks);
        assert_eq!(a.limits.max_queued(), 30);
    }

    #[test]
    fn an_unknown_key_is_named() {
        let e =
            Config::from_toml("[[agents]]\nid = \"a\"\n[agents.limits]\nrpm = 3\n").unwrap_err();
        assert_eq!(e.key.as_deref(), Some("agents[0].limits.rpm"));
        assert!(e.message.contains("rpm"), "{e}");
    }

    #[test]
    fn a_wrong_type_names_the_key() {
        let e = Config::from_toml("[server]\nping_interval_seconds = \"x\"\n").unwrap_err();
        assert_eq!(e.key.as_deref(), Some("server.ping_interval_seconds"));
    }

    #[test]
    fn a_syntax_error_names_line_and_column() {
        let e = Config::from_toml("[server]\nlisten = \n").unwrap_err();
        assert_eq!(e.position.map(|p| p.0), Some(2), "{e}");
    }

    #[test]
    fn semantic_errors_name_the_key() {
        let cases = [
            (
                "[[agents]]\nid = \"a\"\n[[agents]]\nid = \"a\"\n",
                "agents[1].id",
            ),
            (
                "[[agents]]\nid = \"a\"\nbackend = \"gpt\"\n",
                "agents[0].backend",
            ),
            ("[[agents]]\nid = \"a b\"\n", "agents[0].id"),
            ("[server]\nlisten = \"nowhere\"\n", "server.listen"),
            ("[server]\nlisten = \"127.0.0.1\"\n", "server.listen"),
            (
                "[[api_keys]]\nname = \"n\"\nkey = \"sha256:abc\"\n",
                "api_keys[0].key",
            ),
            (
                "[[api_keys]]\nname = \"n\"\nkey = \"k\"\nagents = [\"zzz\"]\n",
                "api_keys[0].agents[0]",
            ),
            (
                "[[agents]]\nid = \"a\"\n[agents.limits]\nconcurrent_tasks = 0\n",
                "agents[0].limits.concurrent_tasks",
            ),
            ("[webhooks]\nworkers = 0\n", "webhooks.workers"),
            (
                "[[agents]]\nid = \"a\"\n[agents.limits]\ntask_timeout_seconds = 1e300\n",
                "agents[0].limits.task_timeout_seconds",
            ),
            (
                "[server]\nping_interval_seconds = 1e20\n",
                "server.ping_interval_seconds",
            ),
        ];
        for (text, key) in cases {
            let e = Config::from_toml(text).expect_err(text);
            assert_eq!(e.key.as_deref(), Some(key), "{text} -> {e}");
        }
    }

    #[test]
    fn an_openai_agent_needs_its_table_and_a_valid_url() {
        let ok = "[[agents]]\nid = \"llm\"\nbackend = \"openai\"\n[agents.openai]\nbase_url = \"http://127.0.0.1:11434/v1\"\nmodel = \"llama3\"\n";
        let c = Config::from_toml(ok).expect("valid");
        let o = c.agents[0].openai.as_ref().expect("openai");
        assert_eq!(o.request_timeout_seconds, 120.0);
        assert_eq!(o.max_history_turns, 20);
        for (text, key) in [
            (
                "[[agents]]\nid = \"llm\"\nbackend = \"openai\"\n",
                "agents[0].openai",
            ),
            (
                "[[agents]]\nid = \"llm\"\nbackend = \"openai\"\n[agents.openai]\nbase_url = \"nope\"\nmodel = \"m\"\n",
                "agents[0].openai.base_url",
            ),
            (
                "[[agents]]\nid = \"llm\"\nbackend = \"openai\"\n[agents.openai]\nbase_url = \"http://x/v1\"\nmodel = \"m\"\napi_key_env = \"A2AD_SURELY_UNSET_VAR\"\n",
                "agents[0].openai.api_key_env",
            ),
            (
                "[[agents]]\nid = \"e\"\n[agents.openai]\nbase_url = \"http://x/v1\"\nmodel = \"m\"\n",
                "agents[0].openai",
            ),
        ] {
            let e = Config::from_toml(text).expect_err(text);
            assert_eq!(e.key.as_deref(), Some(key), "{e}");
        }
    }

    #[test]
    fn listen_accepts_a_host_name() {
        let c = Config::from_toml("[server]\nlisten = \"localhost:0\"\n").expect("valid");
        assert!(c.listen_addr().expect("resolves").ip().is_loopback());
    }

    #[test]
    fn an_empty_file_is_the_built_in_configuration() {
        let c = Config::from_toml("").expect("valid");
        assert_eq!(c.agents.len(), 1);
        assert_eq!(c.agents[0].id, "echo");
        assert_eq!(c.server.listen, "127.0.0.1:8080");
        assert!(c.api_keys.is_empty());
    }

    #[test]
    fn the_message_names_the_file() {
        let e = ConfigError {
            file: Some("a.toml".into()),
            ..ConfigError::key("server.listen", "bad")
        };
        assert_eq!(
            e.to_string(),
            "configuration error in a.toml: key `server.listen`: bad"
        );
    }
}
