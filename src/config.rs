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

mod agents;
mod auth;
mod check;
mod server;
mod store;

pub use agents::{
    A2aConfig, AgentConfig, AgentLimits, ApiKeyConfig, EchoConfig, ExtensionConfig, OpenAiConfig,
    TckConfig,
};
pub(crate) use auth::looks_like_jwt;
pub use auth::{
    AuthConfig, CardSigningConfig, CardsConfig, CertificateConfig, OidcConfig, SecretKeys,
    SecretsConfig, TelemetryConfig,
};
pub use server::{LogConfig, LogFormat, ServerConfig, TlsConfig, UiConfig, WebhooksConfig};
pub use store::{ClusterConfig, ClusterEngine, NodeLoss, StoreBackend, StoreConfig};

/// The whole configuration: read with [`Config::load`] or [`Config::from_toml`], or built
/// in code from [`Config::default`] and checked with [`Config::validated`].
///
/// ```
/// let config = a2ad::Config::from_toml(r#"
///     [server]
///     listen = "127.0.0.1:0"
///
///     [store]
///     backend = "memory"
///
///     [[api_keys]]
///     name = "alice"
///     key = "a-key-of-at-least-16-chars"
///
///     [[agents]]
///     id = "echo"
/// "#)?;
/// assert_eq!(config.agents[0].id, "echo");
/// assert!(a2ad::Config::from_toml("[server]\nlisten = 8080").is_err()); // not a string
/// # Ok::<(), a2ad::config::ConfigError>(())
/// ```
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
    /// `[auth]`: client certificates and OpenID Connect issuers.
    #[serde(default)]
    pub auth: AuthConfig,
    /// `[cards]`: card signing.
    #[serde(default)]
    pub cards: CardsConfig,
    /// `[secrets]`: the key that seals secrets at rest.
    #[serde(default)]
    pub secrets: SecretsConfig,
    /// `[telemetry]`: OpenTelemetry trace export.
    #[serde(default)]
    pub telemetry: TelemetryConfig,
    /// `[ui]`: the inspector at `/ui`.
    #[serde(default)]
    pub ui: UiConfig,
    /// `[log]`
    #[serde(default)]
    pub log: LogConfig,
    /// `[[agents]]`; empty means the built-in `echo` agent.
    #[serde(default)]
    pub agents: Vec<AgentConfig>,
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

    /// Request body bytes all requests together may hold while being read and handled:
    /// `server.max_buffered_body_bytes`, or 256 MiB, or 4 × [`Config::max_body_bytes`] if
    /// larger.
    pub fn max_buffered_body_bytes(&self) -> u64 {
        self.server
            .max_buffered_body_bytes
            .unwrap_or_else(|| (256 << 20).max(self.max_body_bytes().saturating_mul(4)))
    }

    /// As [`Config::max_buffered_body_bytes`], for the requests of one connection:
    /// `server.max_buffered_body_bytes_per_connection`, or 2 × the body cap (never more
    /// than the bound for all).
    pub fn max_buffered_body_bytes_per_connection(&self) -> u64 {
        self.server
            .max_buffered_body_bytes_per_connection
            .unwrap_or_else(|| self.max_body_bytes().saturating_mul(2))
            .min(self.max_buffered_body_bytes())
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
            auth: AuthConfig::default(),
            cards: CardsConfig::default(),
            secrets: SecretsConfig::default(),
            telemetry: TelemetryConfig::default(),
            ui: UiConfig::default(),
            log: LogConfig::default(),
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

// === impl WebhooksConfig ===

// === impl StoreConfig ===

// === impl AgentConfig ===

// === impl OpenAiConfig ===

// === impl AgentLimits ===

// === impl ApiKeyConfig ===

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

    pub(crate) fn key(key: impl Into<String>, message: impl Into<String>) -> Self {
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

#[cfg(test)]
mod tests;
